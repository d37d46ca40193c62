"""The nccl-tests backend on CPU: a fake *_perf that prints REAL recorded output (chosen by the
configuration the plugin table asks for) and misbehaves on cue, started as one process (local)
or as the ranks of a real Open MPI job of two emulated nodes on this host (mpirun)."""

from __future__ import annotations

import io
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from ncclrl.costmodel.errors import ConfigError
from ncclrl.costmodel.space import Point
from ncclrl.costmodel.table import fingerprint, format_row
from ncclrl.envs.jobs import TABLE_ENV, LaunchConfig
from ncclrl.envs.measure import measure_whole
from ncclrl.envs.nccltests_backend import NcclTestsBackend, TableWatch
from ncclrl.envs.store import Store
from ncclrl.runners.sweep import parse_args, run_sweep

FAKE = Path(__file__).parent / "fakes" / "fake_perf.py"
MPI_ENV = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}
TOPO = "h200-2x1-sock"


@pytest.fixture
def bindir(tmp_path, h200_data, monkeypatch):
    d = tmp_path / "bin"
    d.mkdir()
    for prog in ("all_reduce_perf", "all_gather_perf", "reduce_scatter_perf", "broadcast_perf", "reduce_perf"):
        shutil.copy(FAKE, d / prog)
        os.chmod(d / prog, 0o755)
    for k in list(os.environ):
        if k.startswith(("FAKE_PERF_", "NCCL_", "NCCLRL_TUNER")):
            monkeypatch.delenv(k)
    monkeypatch.setenv("FAKE_PERF_DATA", str(h200_data / "nccltests_allreduce"))
    for k, v in MPI_ENV.items():
        monkeypatch.setenv(k, v)
    plugin = tmp_path / "libnccl-tuner-ncclrl.so"
    plugin.write_bytes(b"")  # the fake does not load it
    return d, plugin


def mpi(d: Path, plugin: Path, timeout_s: float = 20, **kw) -> NcclTestsBackend:
    """Two nodes of one GPU each, emulated on this host by the real mpirun."""
    assert shutil.which("mpirun"), "Open MPI's mpirun is needed (apt-get install openmpi-bin)"
    return NcclTestsBackend(d, 2, LaunchConfig(kind="mpirun", grace_s=1), plugin, timeout_s, nodes=2,
                            gpus_per_node=1, **kw)


def leftovers(d: Path) -> list[str]:
    """Processes still running a binary of ``d`` (the fake ranks), from /proc."""
    out = []
    for p in Path("/proc").iterdir():
        if not p.name.isdigit():
            continue
        try:
            cmd = (p / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state = (p / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if str(d) in cmd and state != "Z":
            out.append(f"{p.name}: {cmd}")
    return out


def no_leftovers(d: Path) -> None:
    end = time.time() + 3  # the ranks' own exit after SIGTERM/SIGKILL
    while leftovers(d) and time.time() < end:
        time.sleep(0.1)
    assert not leftovers(d), leftovers(d)


POINTS = [Point("allreduce", 8), Point("allreduce", 1 << 30), Point("allreduce", 1 << 30, "ring", "ll128", 8),
          Point("allreduce", 1 << 20, "tree", "ll", 0)]


# ---- one process (launcher=local) ----

def test_measures_the_recorded_times(bindir):
    d, plugin = bindir
    b = NcclTestsBackend(d, 4, plugin=plugin, timeout_s=30)
    res = b.measure(POINTS, samples=2)
    assert res[0] == [36.96, 36.96] and res[1] == [4528.45, 4528.45]  # all_reduce__default.txt
    assert res[2] == [10947.8, 10947.8]  # all_reduce__ring_LL128_c8.txt at 1 GiB
    assert res[3] == [29.18, 29.18]      # all_reduce__tree_LL.txt at 1 MiB
    assert not b.failures
    # the NCCL that ran (nccl-library=22803), not nccl-tests' own version (2.19.6)
    assert b.nccl_version == "2.28.3" and b.provenance["nccl_version"] == "2.28.3"
    pv = b.provenance
    assert pv["ranks_reported"] == 4 and pv["gpus"] == ["NVIDIA H200"] and pv["launcher"] == "local"
    assert pv["cuda"] == ["12.8"] and pv["driver"] == [] and len(pv["hosts"]) == 1
    assert pv["nccl_env"]["NCCL_DEBUG"] == "INFO" and "-g 4" in pv["command"] and "-T 15" in pv["command"]


@pytest.mark.parametrize("mode,needle", [("fail", "Connection closed"), ("warn", "out of memory"),
                                         ("wrong", "wrong elements"), ("truncate", "truncated"),
                                         ("ttimeout", "timed out: nccl-tests' -T 15 s expired")])
def test_faults_are_reported_per_point(bindir, monkeypatch, mode, needle):
    d, plugin = bindir
    monkeypatch.setenv("FAKE_PERF_MODE", mode)
    b = NcclTestsBackend(d, 4, plugin=plugin, timeout_s=30)
    res = b.measure(POINTS[:2], samples=1)
    assert res == [None, None] and all(needle in m for m in b.failures.values()), b.failures


def test_a_hanging_configuration_times_out_alone(bindir, monkeypatch):
    d, plugin = bindir
    monkeypatch.setenv("FAKE_PERF_HANG_ON", "tree_LL")
    b = NcclTestsBackend(d, 4, plugin=plugin, timeout_s=1.5, configs_per_job=0,
                         launcher=LaunchConfig(grace_s=0.5))
    res = b.measure(POINTS, samples=2)
    assert res[3] is None and b.failures[3].startswith("timed out after 2 s") and "hung" not in b.failures[3]
    assert res[0] is not None and res[2] is not None
    no_leftovers(d)


def test_a_job_covers_configs_per_job(bindir):
    d, plugin = bindir
    b = NcclTestsBackend(d, 4, plugin=plugin, timeout_s=30, configs_per_job=2)
    res = b.measure(POINTS, samples=1)
    assert res[0] and res[1] and res[2] and res[3] is None and 3 not in b.failures  # left for the next job


def test_the_users_nccl_debug_is_kept(bindir, monkeypatch):
    d, plugin = bindir
    monkeypatch.setenv("NCCL_DEBUG", "WARN")
    b = NcclTestsBackend(d, 4, plugin=plugin, timeout_s=30)
    env, check = b.rank_env(POINTS[2], "x\n")
    assert env["NCCL_DEBUG"] == "WARN" and "NCCL_DEBUG_SUBSYS" not in env and not check
    assert b.measure(POINTS[2:3], samples=1)[0] == [10947.8]  # measured, the table unchecked
    monkeypatch.setenv("NCCL_DEBUG", "INFO")
    env, check = b.rank_env(POINTS[2], "x\n")
    assert env["NCCL_DEBUG_SUBSYS"] == "INIT,BOOTSTRAP,ENV,TUNING" and check
    monkeypatch.setenv("NCCL_DEBUG_SUBSYS", "^TUNING")
    assert not b.rank_env(POINTS[2], "x\n")[1]


def test_table_watch_reads_the_plugins_lines():
    line = ("{h}:{p}:{p} [{d}] NCCL INFO TUNER/ncclrl: table from {src} (33 bytes, 1 rows, fingerprint {fp}): 1 for "
            "this communicator (2 ranks, 2 nodes), 0 rejected; tuner ABI v5")
    w = TableWatch(2, "a6a7f82d84110c64")
    w.add([line.format(h="n1", p=7, d=0, src=TABLE_ENV, fp="a6a7f82d84110c64")])
    assert w.verdict(final=False) == ""
    assert w.verdict(final=True).startswith("ranks disagree on the table: 1 of 2 ranks logged")
    w.add(["n2:9:9 [0] NCCL INFO TUNER/ncclrl: no table at nccl_tuner.conf (No such file or directory): NCCL's own"])
    assert "n2:9 GPU 0 loaded no table" in w.verdict(final=False)
    w = TableWatch(2, "a6a7f82d84110c64")
    w.add([line.format(h=h, p=7, d=0, src="/tmp/t.csv", fp="00000000000000ff") for h in ("n1", "n2")])
    assert "every rank loaded 00000000000000ff (from /tmp/t.csv), not the table sent" in w.verdict(final=False)


# ---- command lines ----

def test_command_lines_per_launcher(bindir, monkeypatch):
    d, plugin = bindir
    monkeypatch.setenv("NCCL_IB_HCA", "mlx5_0")
    monkeypatch.setenv("NCCLRL_TUNER_TABLE", "/stale/table.csv")
    binary, args = d / "all_reduce_perf", ["-b", "8"]
    cfg = LaunchConfig(kind="mpirun", hosts=["n1", "n2"], extra_args="--mca btl_tcp_if_include ib0")
    b = NcclTestsBackend(d, 8, cfg, plugin, nodes=2, gpus_per_node=4, nvls="off")
    env, check = b.rank_env(Point("allreduce", 8, "ring", "simple", 0, 4), "t\n")
    assert env[TABLE_ENV] == "t\n" and env["NCCL_TUNER_PLUGIN"] == str(plugin.resolve()) and check
    assert env["NCCL_IB_HCA"] == "mlx5_0" and env["NCCL_NVLS_ENABLE"] == "0" and env["NCCL_MIN_NCHANNELS"] == "4"
    assert "NCCLRL_TUNER_TABLE" not in env and "NCCL_SOCKET_IFNAME" not in env
    cmd = b.command(binary, args, env)
    assert cmd[:8] == ["mpirun", "--bind-to", "none", "-np", "8", "-H", "n1:4,n2:4", "--map-by"]
    assert cmd[8] == "ppr:4:node" and cmd[-6:] == ["btl_tcp_if_include", "ib0", str(binary), "-b", "8", "-g", "1"][-6:]
    assert {cmd[i + 1] for i, c in enumerate(cmd) if c == "-x"} == set(env)
    assert NcclTestsBackend(d, 8, cfg, plugin, nodes=2, gpus_per_node=4).rank_env(POINTS[0], None)[0][
        "NCCL_TUNER_PLUGIN"] == "none"

    srun = NcclTestsBackend(d, 8, LaunchConfig(kind="srun", mpi="pmi2", extra_args="-p gpu"), plugin, nodes=2,
                            gpus_per_node=4)
    assert srun.command(binary, args, env) == [
        "srun", "--nodes=2", "--ntasks=8", "--ntasks-per-node=4", "--mpi=pmi2", "--kill-on-bad-exit=1",
        "--export=ALL", "--gpu-bind=none", "-p", "gpu", str(binary), "-b", "8", "-g", "1"]

    local = NcclTestsBackend(d, 4, "local", plugin)
    assert local.command(binary, args, env) == [str(binary), "-b", "8", "-g", "4"]

    emu = mpi(d, plugin)
    env, _ = emu.rank_env(POINTS[0], None)
    assert env["NCCL_SOCKET_IFNAME"] == "lo"
    cmd = emu.command(binary, args, env)
    ctx = cmd.index(":")
    assert cmd[ctx - 6:ctx] == ["NCCL_HOSTID=ncclrl-node0", str(binary), "-b", "8", "-g", "1"]
    assert cmd[ctx + 1:] == ["-np", "1", "-x", "NCCL_HOSTID=ncclrl-node1", str(binary), "-b", "8", "-g", "1"]


def test_bad_configuration(tmp_path, bindir):
    d, plugin = bindir
    with pytest.raises(ConfigError, match="nccltests.binary_dir"):
        NcclTestsBackend(tmp_path / "nope", 4)
    with pytest.raises(ConfigError, match="launcher.kind"):
        NcclTestsBackend(d, 4, "pbs")
    with pytest.raises(ConfigError, match="use mpirun|launcher=mpirun or launcher=srun"):
        NcclTestsBackend(d, 4, "torchrun")
    with pytest.raises(ConfigError, match="one node; for 2 nodes use launcher=mpirun"):
        NcclTestsBackend(d, 2, "local", nodes=2)
    with pytest.raises(ConfigError, match="3 hosts given"):
        NcclTestsBackend(d, 2, LaunchConfig(kind="mpirun", hosts=["a", "b", "c"]), nodes=2)
    with pytest.raises(ConfigError, match="topology"):
        NcclTestsBackend(d, 4, "mpirun", nodes=2, gpus_per_node=1)
    with pytest.raises(ConfigError, match="nvls"):
        NcclTestsBackend(d, 4, nvls="on")
    with pytest.raises(ConfigError, match="nccltests_dir"):
        parse_args(["topology=h200-1x4", "backend=nccl-tests"])
    (tmp_path / "empty").mkdir()
    b = NcclTestsBackend(tmp_path / "empty", 4)
    with pytest.raises(ConfigError, match="missing or not executable"):
        b.measure([Point("allreduce", 8)], samples=1)


def test_sweep_through_nccltests_into_the_store(bindir, tmp_path, monkeypatch):
    d, plugin = bindir
    monkeypatch.setattr("ncclrl.envs.live.PLUGIN", plugin)
    args = parse_args(["backend=nccl-tests", f"nccltests_dir={d}", "topology=h200-1x4", "collectives=allreduce",
                       "max_bytes=1M", "grid=full", f"store={tmp_path / 's.sqlite'}", "samples=1", "timeout_s=30"])
    out = io.StringIO()
    r = run_sweep(args, out)
    assert r["failed"] == 0 and r["measured"] > 0
    with Store(tmp_path / "s.sqlite") as s:
        assert s.count(backend="nccl-tests", status="ok") == r["measured"]
        jobs = s.jobs()
    assert set(jobs.nccl_version) == {"2.28.3"} and set(jobs.launcher) == {"local"}
    assert "allreduce on h200-1x4" in out.getvalue()
    assert run_sweep(args, io.StringIO())["measured"] == 0  # resumes: nothing left to measure


# ---- two nodes under the real mpirun ----

def test_mpirun_two_nodes(bindir, tmp_path):
    d, plugin = bindir
    b = mpi(d, plugin, log_dir=tmp_path / "logs", configs_per_job=0)
    res = b.measure(POINTS, samples=2)
    assert not b.failures, b.failures
    assert res[0] == [36.96, 36.96] and res[2] == [10947.8, 10947.8] and res[3] == [29.18, 29.18]
    pv = b.provenance
    assert pv["ranks_reported"] == 2 and pv["launcher"] == "mpirun" and pv["nccl_version"] == "2.28.3"
    # no hosts given: both emulated nodes run on localhost, oversubscribed
    assert pv["command"].startswith("mpirun --bind-to none -H localhost:2 --oversubscribe")
    assert " : -np 1 " in pv["command"]
    assert pv["nccl_env"]["NCCL_SOCKET_IFNAME"] == "lo"
    logs = [p.read_text() for p in (tmp_path / "logs").glob("*/launcher.log")]
    assert len(logs) == 6  # 3 configurations x 2 samples
    # each emulated node had its own host identity; every rank of a forced launch logged the table sent
    assert all("NCCL_HOSTID set by environment to ncclrl-node0" in t and
               "NCCL_HOSTID set by environment to ncclrl-node1" in t for t in logs)
    fp = fingerprint(format_row("allreduce", 0, "max", "ring", "ll128", 8) + "\n")
    forced = [t for t in logs if fp in t]
    assert len(forced) == 2 and all(t.count(f"fingerprint {fp})") == 2 for t in forced)
    no_leftovers(d)


def test_mpirun_a_rank_that_hangs(bindir, tmp_path, monkeypatch):
    d, plugin = bindir
    monkeypatch.setenv("FAKE_PERF_HANG_RANK", "1")
    b = mpi(d, plugin, timeout_s=2)
    pts = [Point("allreduce", 1024, "ring", "ll", 0), Point("allreduce", 1 << 20, "ring", "ll", 0)]
    with Store(tmp_path / "s.sqlite") as s:
        t0 = time.time()
        res = measure_whole(b, pts, s, TOPO, backend="nccl-tests", samples=1, tag="t")
        took = time.time() - t0
        df = s.frame()
    assert res == [None, None] and took < 8
    assert set(df.status) == {"timeout"} and all(e.startswith("timed out after 2 s") for e in df.error)
    assert not any("hung" in e for e in df.error)
    no_leftovers(d)


def test_mpirun_a_rank_that_dies(bindir, monkeypatch):
    d, plugin = bindir
    monkeypatch.setenv("FAKE_PERF_DIE_RANK", "1")
    b = mpi(d, plugin)
    t0 = time.time()
    res = b.measure(POINTS[:1], samples=1)
    assert res == [None] and time.time() - t0 < 10
    why = b.failures[0]
    assert why.startswith("exit ") and "rank 1" in why and "signal 9" in why, why
    no_leftovers(d)


def test_mpirun_ranks_disagree_on_the_table(bindir, monkeypatch):
    d, plugin = bindir
    monkeypatch.setenv("FAKE_PERF_TABLE_RANK", "1")
    b = mpi(d, plugin, timeout_s=30)
    t0 = time.time()
    res = b.measure(POINTS[1:3], samples=1)
    assert time.time() - t0 < 8  # stopped when the lines came, not at the timeout
    assert res[0] == [4528.45] and res[1] is None  # NCCL's default forces no table
    fp = fingerprint(format_row("allreduce", 0, "max", "ring", "ll128", 8) + "\n")
    assert b.failures[1].startswith("ranks disagree on the table: ") and f"sent {fp}" in b.failures[1]
    no_leftovers(d)


def test_mpirun_a_rank_without_the_plugin(bindir, tmp_path, monkeypatch):
    d, plugin = bindir
    monkeypatch.setenv("FAKE_PERF_PLAIN_RANK", "1")
    b = mpi(d, plugin, timeout_s=2)
    with Store(tmp_path / "s.sqlite") as s:
        res = measure_whole(b, POINTS[2:3], s, TOPO, backend="nccl-tests", samples=1, tag="t")
        df = s.frame()
    assert res == [None] and list(df.status) == ["failed"]
    assert df.error[0].startswith("ranks disagree on the table: 1 of 2 ranks logged"), df.error[0]
    no_leftovers(d)


@pytest.mark.parametrize("alone", ["1", "interleave"])
def test_mpirun_one_rank_output_for_two_ranks(bindir, monkeypatch, alone):
    """A build without MPI=1: every process runs alone and prints a run of its own, one after the
    other or interleaved line by line (the header of one inside the other's table)."""
    d, plugin = bindir
    monkeypatch.setenv("FAKE_PERF_NO_MPI", alone)
    b = mpi(d, plugin)
    assert b.measure(POINTS[:1], samples=1) == [None]
    assert b.failures[0].startswith("the job ran 1 rank, the topology has 2"), b.failures[0]


DRIVER = textwrap.dedent("""
    import sys
    from ncclrl.costmodel.space import Point
    from ncclrl.envs.jobs import LaunchConfig
    from ncclrl.envs.measure import measure_whole
    from ncclrl.envs.nccltests_backend import NcclTestsBackend, TableWatch
    from ncclrl.envs.store import Store

    bindir, plugin, path = sys.argv[1:4]
    points = [Point("allreduce", s, a, p, c) for a, p, c in [("default", "default", 0), ("ring", "ll", 0),
              ("ring", "ll128", 0), ("tree", "ll", 0), ("tree", "simple", 0), ("ring", "simple", 0)]
              for s in (1024, 1 << 20)]
    store = Store(path)
    todo = [p for p in points if not store.has(p, backend="nccl-tests", topology="h200-2x1-sock", tag="sweep")]
    print("todo", len(todo), flush=True)
    b = NcclTestsBackend(bindir, 2, LaunchConfig(kind="mpirun", grace_s=1), plugin, 20, nodes=2, gpus_per_node=1,
                         configs_per_job=2)
    measure_whole(b, todo, store, "h200-2x1-sock", backend="nccl-tests", samples=1, tag="sweep")
    print("done", flush=True)
""")


def test_preempted_sweep_keeps_finished_jobs_and_resumes(bindir, tmp_path):
    d, plugin = bindir
    script, path = tmp_path / "drive.py", tmp_path / "s.sqlite"
    script.write_text(DRIVER)
    env = dict(os.environ, FAKE_PERF_SLEEP="0.6")
    cmd = [sys.executable, str(script), str(d), str(plugin), str(path)]

    def stored() -> int:
        if not path.exists():
            return 0
        with sqlite3.connect(path) as db:
            try:
                return db.execute("SELECT COUNT(*) FROM measurements").fetchone()[0]
            except sqlite3.OperationalError:
                return 0

    p = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, text=True)
    end = time.time() + 30
    while stored() == 0 and time.time() < end and p.poll() is None:
        time.sleep(0.05)
    time.sleep(0.3)  # into the second job's first launch
    p.send_signal(signal.SIGTERM)
    out, _ = p.communicate(timeout=20)
    assert p.returncode in (128 + signal.SIGTERM, -signal.SIGTERM) and "done" not in out, out  # preempted
    no_leftovers(d)
    before = stored()
    assert 4 <= before < 12  # the first job (2 configurations x 2 sizes) is in the store, not all
    again = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60)
    assert again.returncode == 0 and f"todo {12 - before}" in again.stdout, again.stdout + again.stderr
    with sqlite3.connect(path) as db:
        rows = db.execute("SELECT collective, nbytes, algo, proto, COUNT(*), MIN(status) FROM measurements "
                          "GROUP BY 1, 2, 3, 4").fetchall()
    assert len(rows) == 12 and all(r[4] == 1 and r[5] == "ok" for r in rows)  # nothing measured twice
    no_leftovers(d)
