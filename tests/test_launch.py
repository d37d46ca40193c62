"""Jobs across "nodes" through real launchers on localhost: ncclrl's own, Open MPI's ``mpirun`` and
``torchrun --nnodes=2``, two emulated nodes of one rank each (distinct ``NCCL_HOSTID``). The
workers run the CPU path (gloo standing in for NCCL), so everything but the GPU is real: the
launcher, the rendezvous, the environment reaching every rank, the table agreement, timeouts,
dead ranks and preemption."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest

from ncclrl.costmodel.errors import ConfigError
from ncclrl.costmodel.space import Point
from ncclrl.costmodel.topology import dump_topology, load_topology
from ncclrl.envs.jobs import (
    LaunchConfig,
    decode,
    first_node,
    launch_commands,
    parse_record,
    rank_env,
    run_to_end,
)
from ncclrl.envs.store import Store
from ncclrl.envs.torch_workers import TableWorkers

ROOT_OK = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}
KINDS = ["local", "mpirun", "torchrun"]
POINTS = [Point("allreduce", 1024), Point("allreduce", 1024, "ring", "simple", 2), Point("allreduce", 4096),
          Point("allreduce", 4096, "tree", "ll", 1)]


@pytest.fixture(autouse=True)
def _mpi_as_root(monkeypatch):
    for k, v in ROOT_OK.items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("NCCLRL_FAKE_FAULT", raising=False)


@pytest.fixture
def plugin(tmp_path):
    p = tmp_path / "libnccl-tuner-ncclrl.so"  # the CPU path checks it is there, never loads it
    p.write_bytes(b"")
    return p


def workers(kind, plugin, tmp_path, timeout_s=20.0, **kw):
    return TableWorkers(2, 2, timing="eager", timeout_s=timeout_s, plugin=plugin, launch="torch",
                        launcher=LaunchConfig(kind=kind, grace_s=2.0), device="cpu", log_dir=tmp_path / "job", **kw)


# every process these tests start inherits it: workers_alive() counts only this run's processes
SESSION = f"NCCLRL_TEST_SESSION={os.getpid()}-{time.time_ns()}"
os.environ[SESSION.split("=")[0]] = SESSION.split("=")[1]


def workers_alive() -> list[str]:
    """Command lines of this test run's worker processes still running on this host."""
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                mine = SESSION.encode() in (d / "environ").read_bytes().split(b"\0")
            except OSError:
                continue
            if mine and "ncclrl.envs.worker" in cmd and "pytest" not in cmd:
                out.append(cmd)
    return out


def hellos(tmp_path) -> dict[int, dict]:
    out = {}
    for f in (tmp_path / "job").glob("rank*.log"):
        for line in f.read_text().splitlines():
            _, kind, payload = line.split(" ", 2)
            if kind == "hello":
                out[int(f.stem[4:])] = json.loads(payload)
    return out


# -- what each launcher is asked to run -----------------------------------------------------------


def test_rank_comes_from_whichever_launcher_started_the_process():
    assert rank_env({"RANK": "3", "WORLD_SIZE": "8", "LOCAL_RANK": "1"}) == (3, 8, 1)
    assert rank_env({"OMPI_COMM_WORLD_RANK": "5", "OMPI_COMM_WORLD_SIZE": "16",
                     "OMPI_COMM_WORLD_LOCAL_RANK": "5"}) == (5, 16, 5)
    assert rank_env({"SLURM_PROCID": "9", "SLURM_NTASKS": "16", "SLURM_LOCALID": "1"}) == (9, 16, 1)
    stale = {"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "1", "SLURM_PROCID": "9", "SLURM_NTASKS": "16"}
    assert rank_env(stale, kind="srun")[:2] == (9, 16)  # ncclrl itself started by mpirun -np 1
    with pytest.raises(RuntimeError, match="no rank"):
        rank_env({})


def test_first_node_of_a_slurm_node_list():
    assert first_node("gpu[01-04,07],login1") == "gpu01"
    assert first_node("node7,node8") == "node7"
    assert first_node("a-b[3]") == "a-b3"
    assert first_node("rack[1-2]-node[01-04],x") == "rack1-node01" and first_node("node[1-2]-ib") == "node1-ib"


def test_mpirun_spreads_ranks_over_the_hosts_and_forwards_the_job():
    env = {"NCCLRL_JOB": "x", "NCCL_IB_HCA": "mlx5_0"}
    (cmd, e), = launch_commands(LaunchConfig(kind="mpirun", hosts=["n1", "n2"], extra_args="--mca a b"), 2, 8, env)
    assert cmd[:3] == ["mpirun", "-np", "16"]
    assert "n1:8,n2:8" in cmd and "ppr:8:node" in cmd and cmd[cmd.index("--mca"):][:3] == ["--mca", "a", "b"]
    forwarded = {cmd[i + 1] for i, c in enumerate(cmd) if c == "-x"}
    assert {"NCCLRL_JOB", "NCCL_IB_HCA", "MASTER_ADDR", "MASTER_PORT"} <= forwarded
    assert e["MASTER_ADDR"] == "n1"


def test_srun_runs_one_step_of_every_rank_and_ends_it_on_a_failure():
    (cmd, e), = launch_commands(LaunchConfig(kind="srun"), 4, 8, {"NCCLRL_JOB": "x"})
    assert cmd[0] == "srun" and "--ntasks=32" in cmd and "--ntasks-per-node=8" in cmd and "--nodes=4" in cmd
    assert "--kill-on-bad-exit=1" in cmd and "--export=ALL" in cmd
    assert "--gpu-bind=none" in cmd and not any(c.startswith("--gpus-per-task") for c in cmd)  # all node's GPUs
    assert e["MASTER_ADDR"] == ""  # the workers take the allocation's first node


def test_torchrun_starts_remote_agents_with_the_job_on_their_command_line():
    cfg = LaunchConfig(kind="torchrun", hosts=["localhost", "n2"], remote="ssh -o BatchMode=yes {host}", port=29400)
    (here, e0), (there, e1) = launch_commands(cfg, 2, 4, {"NCCLRL_JOB": "abc=", "NCCL_SOCKET_IFNAME": "ib0"})
    # this Python's torchrun on every node, whatever PATH a remote shell has
    assert here[:3] == [sys.executable, "-m", "torch.distributed.run"]
    assert "--nnodes=2" in here and "--nproc-per-node=4" in here
    assert "--rdzv-endpoint=127.0.0.1:29400" in here and e0["NCCLRL_JOB"] == "abc="
    assert there[:4] == ["ssh", "-o", "BatchMode=yes", "n2"] and e1 == {}
    assert "NCCLRL_JOB=abc=" in there and "NCCL_SOCKET_IFNAME=ib0" in there and "torch.distributed.run" in there
    big = {"NCCLRL_JOB": "x" * 80000, "NCCLRL_TUNER_TABLE_DATA": "y" * 80000}  # each fits, together they do not
    with pytest.raises(ConfigError, match="^launcher.remote: the command for n2 is"):
        launch_commands(cfg, 2, 4, big)


def test_mpirun_with_no_hosts_keeps_every_rank_on_this_host():
    """Inside an allocation Open MPI would spread ranks over its nodes, where emulated ranks fail."""
    (cmd, _), = launch_commands(LaunchConfig(kind="mpirun"), 2, 4, {})
    assert cmd[cmd.index("-H") + 1] == "localhost:8"


def test_a_host_list_must_match_the_topology_and_local_stays_local():
    with pytest.raises(ConfigError, match="^launcher.hosts: the topology has 2 nodes, 3 hosts"):
        launch_commands(LaunchConfig(kind="mpirun", hosts=["a", "b", "c"]), 2, 1, {})
    with pytest.raises(ConfigError, match="^launcher.hosts: launcher=local runs on this host only"):
        LaunchConfig(kind="local", hosts=["gpu01"]).check()
    with pytest.raises(ConfigError, match="^launcher.kind: unknown value 'pdsh'"):
        LaunchConfig.of({"kind": "pdsh"})


def test_records_survive_launcher_prefixes():
    r = parse_record("[1,0]<stdout>:NCCLRL|1|result|{\"i\": 0}\n")
    assert r is not None and (r.rank, r.kind, r.payload) == (1, "result", '{"i": 0}')
    assert parse_record("NCCL INFO ring 0") is None


# -- real launches ---------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
def test_a_job_over_two_emulated_nodes_measures_every_point(kind, plugin, tmp_path):
    w = workers(kind, plugin, tmp_path)
    res = w.measure(POINTS, samples=3)
    assert all(r is not None and len(r) == 3 for r in res) and w.failures == {}
    assert w.provenance["launcher"] == kind and w.provenance["ranks_reported"] == 2
    h = hellos(tmp_path)
    assert sorted(h) == [0, 1] and all(x["world"] == 2 for x in h.values())
    assert {x["nccl_env"]["NCCL_HOSTID"] for x in h.values()} == {"ncclrl-node0", "ncclrl-node1"}
    assert h[0]["table"] == h[1]["table"]  # the same table reached both ranks
    assert not workers_alive()


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("fault, timeout_s", [("hang:1:2", 8.0), ("die:0:2", 30.0)])
def test_a_rank_that_hangs_or_dies_ends_the_whole_job(kind, fault, timeout_s, plugin, tmp_path, monkeypatch):
    """A hang ends the job at the timeout, stored as timed out (not as an NCCL hang); a death ends it
    at once, as a failure naming the ranks. Either way what finished before is kept and no rank
    is left running."""
    monkeypatch.setenv("NCCLRL_FAKE_FAULT", fault)
    w = workers(kind, plugin, tmp_path, timeout_s=timeout_s)
    t0 = time.time()
    res = w.measure(POINTS, samples=2)
    assert time.time() - t0 < 25
    assert res[0] is not None and res[1] is not None and res[2] is None
    why = w.failures[2]
    assert list(w.failures) == [2] and "hung" not in why
    assert why.startswith("timed out") if fault.startswith("hang") else ("rank" in why and "timed out" not in why)
    time.sleep(0.5)
    assert not workers_alive()


@pytest.mark.parametrize("kind", ["mpirun", "torchrun"])
@pytest.mark.parametrize("fault, why", [("table", "different tables"), ("plugin", "plugin .* is missing on rank 1")])
def test_ranks_that_disagree_stop_before_any_collective(kind, fault, why, plugin, tmp_path, monkeypatch):
    monkeypatch.setenv("NCCLRL_FAKE_FAULT", f"{fault}:1:-1")
    w = workers(kind, plugin, tmp_path, timeout_s=30.0)
    t0 = time.time()
    with pytest.raises(ConfigError, match=f"^launcher: stopped before any collective: .*{why}"):
        w.measure(POINTS, samples=2)
    assert time.time() - t0 < 25
    assert not any("item" in f.read_text() for f in (tmp_path / "job").glob("rank*.log"))  # no point was reached
    assert not workers_alive()


def test_a_job_of_fewer_ranks_than_the_topology_is_refused(plugin, tmp_path):
    wrapper = tmp_path / "mpirun-one"  # a launcher that starts one rank where the topology has two
    wrapper.write_text("#!/bin/sh\nshift 2\nexec mpirun -np 1 \"$@\"\n")
    wrapper.chmod(0o755)
    w = TableWorkers(2, 2, timing="eager", timeout_s=20.0, plugin=plugin, launch="torch", device="cpu",
                     launcher=LaunchConfig(kind="mpirun", program=str(wrapper), grace_s=1.0), log_dir=tmp_path / "job")
    with pytest.raises(ConfigError, match="the job has 1 ranks, the topology 2"):
        w.measure(POINTS, samples=2)


def test_the_job_reaches_every_rank_in_its_environment(plugin, tmp_path):
    w = workers("mpirun", plugin, tmp_path)
    env = w.job_env(POINTS, [1024, 1040, 4096, 4112], 3, 100.0)
    job = decode(env["NCCLRL_JOB"])
    assert job["nranks"] == 2 and job["gpus_per_node"] == 1 and job["emulate_nodes"]
    assert env["NCCLRL_TUNER_TABLE_DATA"].count("\n") == 2  # the two forced points, NCCL's default has no row
    assert "NCCLRL_TUNER_TABLE" not in env  # never a path: it would be node-local


PREEMPTED = """
import sys
from ncclrl.envs.jobs import LaunchConfig
from ncclrl.envs.torch_workers import TableWorkers
from ncclrl.runners.sweep import parse_args, run_sweep
args = parse_args(sys.argv[2:])
def factory(topo, knobs, timing, timeout_s):
    return TableWorkers(topo.nranks, topo.nodes, knobs, timing="eager", timeout_s=timeout_s, plugin=sys.argv[1],
                        launch="torch", launcher=LaunchConfig(kind="mpirun", grace_s=2.0), device="cpu")
r = run_sweep(args, sys.stdout, factory)
print("MEASURED", r["measured"], "SKIPPED", r["skipped"], "INTERRUPTED", r["interrupted"])
sys.exit(143 if r["interrupted"] == "SIGTERM" else 0)
"""


def test_a_preempted_sweep_keeps_every_finished_job_and_resumes(plugin, tmp_path):
    # two emulated nodes over InfiniBand: two knob settings, so two jobs (a socket network has 14)
    topo = load_topology("h200-2x1-sock")
    dump_topology(replace(topo, net=replace(topo.net, kind="ib")), tmp_path / "ib.yaml")
    store = tmp_path / "store.sqlite"
    script = tmp_path / "sweep.py"
    script.write_text(PREEMPTED)
    argv = [sys.executable, str(script), str(plugin), f"topology={tmp_path / 'ib.yaml'}", "grid=full", "samples=2",
            "min_bytes=1K", "max_bytes=2K", f"store={store}", "timeout_s=20", "launch=torch"]
    env = dict(os.environ, **ROOT_OK)
    p = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 90
    while time.time() < deadline and (not store.exists() or Store(store).count() == 0):
        time.sleep(0.3)  # the first job stored (a job's points are stored together)
    p.send_signal(signal.SIGTERM)
    out, err = p.communicate(timeout=30)
    # 143: SIGTERM during a job (the job is ended, what it finished stored, the tables of what was measured
    # printed, the run says it was interrupted); -15: between two jobs
    assert p.returncode in (143, -15), err[-500:]
    if p.returncode == 143:
        assert "INTERRUPTED SIGTERM" in out
    kept = Store(store).count()
    assert kept > 0
    time.sleep(0.5)
    assert not workers_alive()
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-500:]
    measured = int(done.stdout.split("MEASURED ")[1].split()[0])
    total = Store(store).count()
    assert measured == total - kept > 0  # the rerun measured only what the first run had not stored
    jobs = Store(store).jobs()
    assert set(jobs.launcher) == {"mpirun"}
    # every job that stored a point heard from both ranks, the one SIGTERM ended included
    with_points = jobs[jobs.job.isin(set(Store(store).frame().job))]
    assert len(with_points) >= 2 and (with_points.ranks_reported == 2).all()


def test_plugin_verify_runs_its_jobs_through_the_launcher(plugin, tmp_path, capsys):
    """Both of the verifier's jobs go through mpirun over two emulated nodes and come back: the
    cases' timings on the table's and on a table-less communicator, and rank 0's NCCL output (on
    CPUs there is no NCCL log, so every decision reads "missing": the GPU run checks those)."""
    from ncclrl.runners.plugin_verify import verify

    table = tmp_path / "t.csv"
    table.write_text("allreduce,0,65536,ring,ll,2,-1,-1\n")
    rc = verify(str(table), "h200-2x1-sock", tmp_path / "pv", max_bytes=1 << 16, iters=2, plugin=str(plugin),
                launcher=LaunchConfig(kind="mpirun", grace_s=2.0), device="cpu")
    report = json.loads((tmp_path / "pv" / "verify.json").read_text())
    timed = [c for c in report["cases"] if c["row"] is None]
    assert rc == 1 and timed and all(c["time_us"] > 0 and c["default_time_us"] > 0 for c in timed)
    assert (tmp_path / "pv" / "nccl-plugin" / "nccl-rank0.log").read_text().startswith("$ mpirun")
    assert not workers_alive()


def test_records_glued_by_a_launcher_are_all_found():
    """Open MPI forwarding many ranks can glue one rank's line onto another's, or NCCL's output onto
    a record: each record is still read, a result's JSON whole."""
    from ncclrl.envs.jobs import parse_records, payload_json

    recs, rest = parse_records('[1,1]<stdout>:NCCLRL|1|item|3NCCLRL|0|result|{"i": 2, "s": [1.5], "m": "graph"}'
                               "vm:1:1 [0] NCCL INFO Channel 00\n")
    assert [(r.rank, r.kind) for r in recs] == [(1, "item"), (0, "result")] and recs[0].payload == "3"
    assert payload_json(recs[1].payload) == {"i": 2, "s": [1.5], "m": "graph"}
    assert rest == "[1,1]<stdout>:"
    assert parse_records("vm:1:1 [0] NCCL INFO NCCLRL|x|y")[0] == []


def test_a_job_too_large_for_the_environment_is_refused(plugin, tmp_path):
    pts = [Point("allreduce", 16 * (i + 1)) for i in range(6000)]  # NCCL's defaults: the table is empty
    w = workers("local", plugin, tmp_path)
    assert len(w.job_env(pts[:1000], [p.nbytes for p in pts[:1000]], 3, 100.0)["NCCLRL_JOB"]) < 131072
    with pytest.raises(ConfigError, match="^points: 6000 points make a job of .* bytes"):
        w.job_env(pts, [p.nbytes for p in pts], 3, 100.0)


def test_a_compute_load_runs_beside_every_sample(plugin, tmp_path):
    """load=gemm: each rank runs matrix products beside the collective while a sample is timed and
    reports their slowdown per sample against their time alone; without it no slowdown is kept."""
    w = workers("local", plugin, tmp_path, load="gemm", load_n=256)
    pts = [Point("allreduce", 4096), Point("allreduce", 4096, "ring", "simple", 1)]
    res = w.measure(pts, samples=3, budget_us=2000.0)
    assert all(r is not None and len(r) == 3 for r in res), w.failures
    assert len(w.last_slowdowns) == 2 and all(len(s) == 3 and all(x > 0 for x in s) for s in w.last_slowdowns)
    logs = "".join(f.read_text() for f in (tmp_path / "job").glob("rank*.log"))
    assert "compute load: 256 x 256 float32 products" in logs
    plain = workers("local", plugin, tmp_path / "plain")
    plain.measure(pts[:1], samples=2)
    assert plain.last_slowdowns == [None]


@pytest.mark.parametrize(("kw", "key"), [({"load": "fft"}, "load"), ({"load": "gemm", "load_n": 8}, "load_n")])
def test_a_bad_load_is_refused(plugin, tmp_path, kw, key):
    with pytest.raises(ConfigError, match=f"^{key}"):
        workers("local", plugin, tmp_path, **kw)


def test_a_sweep_under_load_stores_apart_with_the_compute_slowdown(plugin, tmp_path, monkeypatch):
    """sweep load=gemm: the workers get the load from the command's keys, the points are stored
    under TAG+gemmN (never pooled with isolated timings) with the load's slowdown per sample."""
    import functools

    from ncclrl.runners import live, sweep

    monkeypatch.setattr(live, "TableWorkers", functools.partial(TableWorkers, device="cpu", plugin=plugin))
    store = tmp_path / "store.sqlite"
    common = ["topology=h200-2x1-sock", "min_bytes=1K", "max_bytes=2K", "samples=2", f"store={store}",
              "launch=torch", "timing=eager", "timeout_s=30"]
    sweep.run_sweep(sweep.parse_args([*common, "load=gemm", "load_n=256"]), io.StringIO())
    sweep.run_sweep(sweep.parse_args(common), io.StringIO())
    f = Store(store).frame(status="ok")
    loaded, alone = f[f.tag == "sweep+gemm256"], f[f.tag == "sweep"]
    assert len(loaded) == len(alone) == 2  # NCCL's default at 1 KiB and 2 KiB, each run
    assert all(len(s) == 2 and all(x > 0 for x in s) for s in loaded.compute_slowdown)
    assert alone.compute_slowdown.isna().all()
    with pytest.raises(ConfigError, match="^load"):
        sweep.parse_args([*common, "load=gemm", "backend=nccl-tests", "nccltests_dir=/tmp"])


def test_sigterm_during_a_read_is_acted_on_between_reads_and_only_once():
    """SIGTERM while a job's records are being taken must not cut the batch (a batch cut at its
    first record lost the ranks' hellos while later results were stored): it is latched, raised
    at the next check, not again when the block ends, and raised at the end if nobody checked."""
    from ncclrl.envs.jobs import Interrupted, ending_on_signals

    kept = []
    with pytest.raises(Interrupted) as e, ending_on_signals() as latch:
        os.kill(os.getpid(), signal.SIGTERM)
        for i in range(20000):  # the handler runs here, between two bytecodes
            kept.append(i)
        latch.check()
    assert len(kept) == 20000 and e.value.code == 128 + signal.SIGTERM
    with ending_on_signals() as latch:
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.05)
        assert latch.handled() and not latch.handled()
    with pytest.raises(Interrupted), ending_on_signals():
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.05)
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL or callable(signal.getsignal(signal.SIGTERM))


# -- processes that leave the job, ranks that fail at their start ---------------------------------

ORPHAN_RANK = r'''
import os, sys, time
rank = int(os.environ["OMPI_COMM_WORLD_RANK"])
how, marker = sys.argv[1], sys.argv[2]
if rank == 1 and os.fork() == 0:  # a daemon: a session of its own, its parent gone, stdio closed
    os.setsid()
    if os.fork() == 0:
        fd = os.open(os.devnull, os.O_RDWR)
        for i in range(3):
            os.dup2(fd, i)
        os.execv(sys.executable, [sys.executable, "-c", "import time; time.sleep(300)", marker])
    os._exit(0)
if rank == 1:
    os.wait()
if how == "hangs" and rank == 0:
    time.sleep(300)
print(f"NCCLRL|{rank}|done|{{}}", flush=True)
'''


def processes_with(marker: str) -> list[int]:
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if marker.encode() in (d / "cmdline").read_bytes():
                    out.append(int(d.name))
            except OSError:
                continue
    return out


@pytest.mark.parametrize("how", ["ends", "hangs"])
def test_a_daemon_a_rank_started_is_ended_with_its_job(how, tmp_path):
    """Under mpirun, rank 1 starts a daemon (double fork, its own session, reparented away from the
    rank): it is ended with the job, whether the job ends well or is ended at its timeout. The
    daemon carries the job's token in its environment, which no new session or parent drops."""
    from ncclrl.envs.jobs import run_to_end

    marker = f"ncclrl-test-daemon-{tmp_path.name}"
    cmd = ["mpirun", "-np", "2", "-H", "localhost:2", "--oversubscribe", "--bind-to", "none", sys.executable, "-c",
           ORPHAN_RANK, how, marker]
    try:
        if how == "ends":
            records, _ = run_to_end([(cmd, {})], dict(os.environ), tmp_path, timeout_s=30.0, grace_s=2.0)
            assert sorted(r.rank for r in records if r.kind == "done") == [0, 1]
        else:
            with pytest.raises(ConfigError, match="timed out"):
                run_to_end([(cmd, {})], dict(os.environ), tmp_path, timeout_s=6.0, grace_s=2.0)
        time.sleep(0.3)
        assert processes_with(marker) == []
    finally:
        for pid in processes_with(marker):
            os.kill(pid, signal.SIGKILL)


@pytest.mark.parametrize("kind", KINDS)
def test_a_rank_that_fails_at_its_start_ends_the_job_at_once(kind, plugin, tmp_path, monkeypatch):
    """Rank 1 exits with 9 before the ranks meet: the job ends within seconds, stored as failed with
    that rank's exit code, not as timed out (torchrun's other agent waited for it until the timeout)."""
    monkeypatch.setenv("NCCLRL_FAKE_FAULT", "die:1:-1")
    w = workers(kind, plugin, tmp_path, timeout_s=60.0)
    t0 = time.time()
    res = w.measure(POINTS[:2], samples=2)
    assert time.time() - t0 < 40
    assert res == [None, None]
    why = w.failures[0]
    assert why.startswith("rank 1 exited with 9") and "timed out" not in why, why
    time.sleep(0.5)
    assert not workers_alive()


def test_a_job_that_hands_its_table_gets_no_deployment_variables(tmp_path, monkeypatch):
    """A deployment's NCCLRL_TUNER_TABLE_FINGERPRINT, NCCLRL_TUNER_TABLE or NCCL_TUNER_CONFIG_FILE
    exported in the user's shell never reach a job that hands its own table (an empty one: NCCL's
    defaults): the plugin would read the deployment's file, or fail the job's init on the
    fingerprint; a job without a table of its own keeps them."""
    from ncclrl.envs.jobs import OTHER_TABLE_ENV, TABLE_ENV, run_to_end

    deploy = {"NCCLRL_TUNER_TABLE_FINGERPRINT": "0123456789abcdef", "NCCLRL_TUNER_TABLE": "/shared/t.csv",
              "NCCL_TUNER_CONFIG_FILE": "/shared/t.csv"}
    for k, v in deploy.items():
        monkeypatch.setenv(k, v)
    (cmd, env), = launch_commands(LaunchConfig(kind="mpirun"), 1, 2, {TABLE_ENV: "", **deploy, "NCCL_DEBUG": "INFO"})
    assert not set(OTHER_TABLE_ENV) & set(env) and not set(OTHER_TABLE_ENV) & set(cmd) and "NCCL_DEBUG" in cmd
    show = (f"import os; print('NCCLRL|0|done|' + ','.join(sorted(k for k in os.environ if k in {OTHER_TABLE_ENV!r})),"
            " flush=True)")
    for job_env, want in (({TABLE_ENV: ""}, ""), ({}, ",".join(sorted(OTHER_TABLE_ENV)))):
        records, _ = run_to_end([([sys.executable, "-c", show], job_env)], dict(os.environ), tmp_path, timeout_s=30)
        assert [r.payload for r in records if r.kind == "done"] == [want]


@pytest.mark.parametrize("rank,local,visible,emulated,share,gpu", [
    (1, 1, 8, False, False, 1),   # one host's ranks: the local rank
    (3, 1, 4, True, False, 3),    # every node emulated here (local ranks repeat per node): the global rank
    (1, 0, 1, True, False, 0),    # a task that sees one GPU takes it
    (1, 0, 8, True, True, 0),     # share_gpu: every rank on the first GPU
    (5, 5, 8, True, True, 0),
])
def test_each_rank_takes_its_gpu(rank, local, visible, emulated, share, gpu):
    from ncclrl.envs.jobs import rank_gpu

    assert rank_gpu(rank, local, visible, emulated, share) == gpu


def test_share_gpu_needs_every_node_on_this_host():
    for cfg in (LaunchConfig(kind="local", share_gpu=True), LaunchConfig(kind="torchrun", share_gpu=True),
                LaunchConfig(kind="mpirun", hosts=["localhost", "127.0.0.1"], share_gpu=True)):
        cfg.check()
        assert cfg.gpus_needed(2) == 1
    assert LaunchConfig(kind="local").gpus_needed(2) == 2
    for cfg in (LaunchConfig(kind="srun", share_gpu=True), LaunchConfig(kind="local", share_gpu="yes"),
                LaunchConfig(kind="mpirun", hosts=["a", "b"], share_gpu=True)):
        with pytest.raises(ConfigError, match="launcher.share_gpu"):
            cfg.check()


def test_a_two_node_job_on_one_gpu_starts_with_share_gpu(plugin, monkeypatch):
    """The loopback preset on a machine of one GPU: refused without share_gpu (one GPU per rank),
    accepted with it; its two ranks are two nodes (their own NCCL_HOSTID) handed share_gpu."""
    import torch

    from ncclrl.envs.jobs import JOB_ENV, decode
    from ncclrl.runners.sweep import check_launch, parse_args

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    topo = load_topology("h100-2x1-loopback")
    assert (topo.nodes, topo.gpus_per_node) == (2, 1)
    with pytest.raises(ConfigError, match="needs 2 CUDA GPUs"):
        check_launch(parse_args([f"topology={topo.name}"]), topo)
    args = parse_args([f"topology={topo.name}", "launcher.share_gpu=true"])
    check_launch(args, topo)
    w = TableWorkers(topo.nranks, topo.nodes, plugin=str(plugin), launcher=LaunchConfig(kind="local", share_gpu=True),
                     device="cuda")
    job = decode(w.job_env([], [], 1, 100.0)[JOB_ENV])
    assert job["share_gpu"] is True and job["emulate_nodes"] is True and job["gpus_per_node"] == 1
    cmds = launch_commands(w.launcher, topo.nodes, topo.gpus_per_node, {})
    assert [(e["RANK"], e["GROUP_RANK"], e["LOCAL_RANK"]) for _c, e in cmds] == [("0", "0", "0"), ("1", "1", "0")]


REFUSING_WORKER = """
import os, sys, time
rank = int(os.environ["RANK"])
if rank == 1:  # what a rank whose plugin refuses the job's table prints, then it stops
    print("NCCL WARN ncclrl tuner: table has fingerprint 00000000000000aa, not the 00000000000000bb expected",
          flush=True)
    raise RuntimeError("ncclCommInitRank failed: the tuner plugin refused the table (fingerprint differs)")
time.sleep(float(os.environ.get("HOLD_S", "0")))
"""


@pytest.mark.parametrize("kind", ["torchrun", "local"])
@pytest.mark.parametrize("hold_s", [0.0, 30.0])
def test_a_rank_stopped_under_torchrun_is_named_in_one_line_without_torchruns_traceback(kind, hold_s, tmp_path):
    """A rank that stops the job (an uncaught error, no record) under a real torchrun of two nodes
    (or ncclrl's own launcher): the user reads that rank, its exit code and its own last error line,
    never torchrun's traceback or ChildFailedError dump, whether the other rank had ended (its agent
    ends well) or still runs (it is ended, and not named as failed: under torchrun its agent prints
    a SignalException traceback); launcher.log keeps the raw output."""
    (tmp_path / "refusing_worker.py").write_text(REFUSING_WORKER)
    env = {"PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]), "HOLD_S": str(hold_s)}
    cmds = launch_commands(LaunchConfig(kind=kind), 2, 1, env, module="refusing_worker")
    t0 = time.time()
    with pytest.raises(ConfigError) as e:
        run_to_end(cmds, dict(os.environ), tmp_path, timeout_s=60.0, grace_s=1.0)
    assert time.time() - t0 < 25
    why = str(e.value)
    assert why == ("launcher: rank 1 exited with 1: RuntimeError: ncclCommInitRank failed: the tuner plugin "
                   "refused the table (fingerprint differs)"), why
    raw = (tmp_path / "launcher.log").read_text()
    assert "Traceback" in raw and "RuntimeError" in raw  # the raw output is kept
    if kind == "torchrun":
        assert "ChildFailedError" in raw and raw.count("Traceback") >= 2  # the rank's and torchrun's


TORCHRUN_TWO_FAILED = """\
NCCL WARN ncclrl tuner: table has fingerprint 00000000000000aa, not the 00000000000000bb expected
E1125 06:32:35.529000 4587 site-packages/torch/distributed/elastic/multiprocessing/api.py:1002] failed (exitcode: 1) \
local_rank: 0 (pid: 4614) of binary: /usr/bin/python
Traceback (most recent call last):
  File "<frozen runpy>", line 198, in _run_module_as_main
  File "/x/site-packages/torch/distributed/run.py", line 1032, in <module>
    main()
  File "/x/site-packages/torch/distributed/launcher/api.py", line 383, in launch_agent
    raise ChildFailedError(
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
ncclrl.envs.worker FAILED
------------------------------------------------------------
Failures:
[1]:
  time      : 2026-11-25_06:32:35
  host      : localhost
  rank      : 3 (local_rank: 1)
  exitcode  : -9 (pid: 4615)
  error_file: <N/A>
  traceback : Signal 9 (SIGKILL) received by PID 4615
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-11-25_06:32:35
  host      : localhost
  rank      : 2 (local_rank: 0)
  exitcode  : 1 (pid: 4614)
  error_file: <N/A>
  traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html
============================================================
"""


def test_torchruns_summary_names_every_failed_rank_and_its_traceback_is_not_the_ranks_words():
    """Both entries of a node's failure summary are failed ranks with their codes; the agent's
    traceback (its frames and ChildFailedError) is never taken for a rank's error line."""
    from ncclrl.envs.jobs import LauncherOutput, exit_words

    out = LauncherOutput()
    for line in TORCHRUN_TWO_FAILED.splitlines():
        out.add(line)
    assert out.failed == [(3, -9), (2, 1)]
    assert out.last_error.startswith("NCCL WARN ncclrl tuner: table has fingerprint")
    assert exit_words(-9) == "was killed by SIGKILL" and exit_words(2) == "exited with 2"
