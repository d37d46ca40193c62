"""The one job path (:mod:`ncclrl.envs.jobs`) and what it guarantees a live command: a point far
slower than NCCL's own choice is abandoned and never measured again, a rank that said done and does
not exit is ended, a job ended by a signal or failed by the cluster is charged, and an interrupted
or time-limited run still exports what its measurements support, with the true reason."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

import pytest

from ncclrl.agents.problem import Evaluator, Problem
from ncclrl.costmodel import nccl as N
from ncclrl.costmodel.errors import JobError
from ncclrl.costmodel.space import Point
from ncclrl.costmodel.table import parse_example_rows
from ncclrl.costmodel.topology import load_topology
from ncclrl.envs.jobs import Interrupted, JobOptions, LaunchConfig, ending_on_signals, run_job, run_to_end
from ncclrl.envs.jobs.run import FirstError
from ncclrl.envs.measure import measure_whole
from ncclrl.envs.store import Store
from ncclrl.envs.torch_workers import TableWorkers
from ncclrl.runners.cli import main as cli_main
from ncclrl.runners.finetune import parse_args, run_finetune

REPO = Path(__file__).resolve().parent.parent
LIVE = REPO / "data" / "h200x4-2026-11-21" / "store.sqlite"
ROOT_OK = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}


@pytest.fixture
def plugin(tmp_path):
    p = tmp_path / "libnccl-tuner-ncclrl.so"  # the CPU path checks it is there, never loads it
    p.write_bytes(b"")
    return p


def test_a_point_that_takes_minutes_is_abandoned_and_never_measured_again(plugin, tmp_path, monkeypatch):
    """Tree/LL at 4 KiB crawls (every call 300 s on rank 0; the fault names the job's item 3): the
    job is ended a few seconds after that point's first calls outlast 10x NCCL's own choice at that
    size, the point is stored as too slow (not as a hang after the 120 s timeout), tree/LL at a
    larger size is not measured, what the job had not finished is measured in the next job; a later
    command measures neither again."""
    monkeypatch.setenv("NCCLRL_FAKE_FAULT", "crawl:0:3")
    monkeypatch.setenv("NCCLRL_FAKE_CRAWL_S", "300")
    pts = [Point("allreduce", 1024), Point("allreduce", 1024, "ring", "simple", 1), Point("allreduce", 4096),
           Point("allreduce", 4096, "tree", "ll", 1), Point("allreduce", 8192, "tree", "ll", 1)]
    w = TableWorkers(2, 2, timing="eager", timeout_s=120.0, plugin=plugin, launch="torch",
                     launcher=LaunchConfig(kind="local", grace_s=1.0), device="cpu", too_slow_floor_s=2.0)
    store = Store(tmp_path / "s.sqlite")
    t0 = time.time()
    res = measure_whole(w, pts, store, "h200-2x1-sock", backend="torch", samples=2, tag="t")
    assert time.time() - t0 < 60
    assert res[3] is None and res[4] is None and all(res[i] for i in (0, 1, 2))
    df = store.frame()
    slow = df[(df.algo == "tree") & (df.nbytes == 4096)]
    assert list(slow.status) == ["slow"] and slow.error.iloc[0].startswith("too slow: its first calls had not")
    after = df[(df.algo == "tree") & (df.nbytes == 8192)]
    assert list(after.status) == ["failed"] and "too slow on tree/ll at 4096 B" in after.error.iloc[0]
    assert df.job.nunique() == 2  # the job ended on the slow point, and the one that finished its size
    rows = len(df)
    t0 = time.time()
    again = measure_whole(w, [pts[3], pts[4]], store, "h200-2x1-sock", backend="torch", samples=2, tag="other")
    assert again == [None, None] and time.time() - t0 < 1.0 and len(store.frame()) == rows  # no job, nothing stored


def test_a_point_whose_first_calls_return_but_far_too_slowly_is_dropped_inside_its_job(plugin, tmp_path,
                                                                                       monkeypatch):
    """Its calls take 0.3 s against NCCL's own choice's ~1 ms: three calls, then it is never timed;
    the job goes on and every other point is measured in that same job."""
    monkeypatch.setenv("NCCLRL_FAKE_FAULT", "crawl:0:1")
    monkeypatch.setenv("NCCLRL_FAKE_CRAWL_S", "0.3")
    pts = [Point("allreduce", 1024), Point("allreduce", 1024, "tree", "ll", 1), Point("allreduce", 2048)]
    w = TableWorkers(2, 2, timing="eager", timeout_s=60.0, plugin=plugin, launch="torch",
                     launcher=LaunchConfig(kind="local", grace_s=1.0), device="cpu", too_slow_floor_s=30.0)
    res = w.measure(pts, samples=3)
    assert res[1] is None and res[0] and res[2]
    assert w.failures[1].startswith("too slow: its first calls took") and set(w.failures) == {1}


DONE_AND_HANG = ("import sys, time\n"
                 "for r in range(2):\n"
                 "    print(f'NCCLRL|{r}|done|', flush=True)\n"
                 "time.sleep(300)\n")


def test_ranks_that_said_done_and_do_not_exit_are_ended(tmp_path):
    """A rank stuck in its teardown after reporting done (as NCCL can be with CUDA graphs alive)
    costs the job exit_grace_s, not its timeout: the job ends with everything it reported."""
    t0 = time.time()
    records, _ = run_to_end([([sys.executable, "-c", DONE_AND_HANG], {})], dict(os.environ), tmp_path,
                            timeout_s=120.0, grace_s=1.0, nranks=2)
    assert time.time() - t0 < 20 and sorted(r.rank for r in records if r.kind == "done") == [0, 1]
    end = run_job([([sys.executable, "-c", DONE_AND_HANG], {})], dict(os.environ), tmp_path,
                  JobOptions(timeout_s=120.0, grace_s=1.0, exit_grace_s=0.5), FirstError(1.0, nranks=2))
    assert end.lingered and not end.timed_out and end.wall_s < 15


def test_a_signal_ends_the_job_and_is_raised_once(tmp_path):
    """SIGTERM while a job runs: the job is ended at once, what it reported is kept, and
    run_to_end raises Interrupted with the signal's code; the latch is reset afterwards."""
    prog = "import os, signal, time\nprint('NCCLRL|0|log|up', flush=True)\nos.kill(os.getppid(), signal.SIGTERM)\n" \
           "time.sleep(300)\n"
    t0 = time.time()
    with pytest.raises(Interrupted) as e:
        run_to_end([([sys.executable, "-c", prog], {})], dict(os.environ), tmp_path, timeout_s=120.0, grace_s=1.0)
    assert e.value.code == 128 + signal.SIGTERM and e.value.name == "SIGTERM" and time.time() - t0 < 30
    with ending_on_signals() as latch:
        assert latch.requested is None


def _problem():
    return Problem.make(load_topology("h200-2x2-sock"), [N.ALLREDUCE], 1024, 4096)


@pytest.mark.parametrize("raised, reason", [(Interrupted(signal.SIGINT), "interrupted by SIGINT"),
                                            (JobError("launcher", "rank 3 exited with 9"), "a job failed")])
def test_a_job_ended_by_a_signal_or_failed_by_the_cluster_is_charged_and_stops_the_run(raised, reason):
    def measure(k, pts, samples, tag):
        measure.last_wall_s = 7.0
        raise raised

    measure.live = True
    measure.last_wall_s = None
    problem = _problem()
    ev = Evaluator(problem, measure, 1e6, samples=2)
    out = ev.evaluate(problem.base, [(N.ALLREDUCE, 1024, ("default", "default", 0))])
    assert out == [None] and ev.gpu_s == pytest.approx(7.0 * 4) and ev.remaining == 0
    assert ev.stop_reason.startswith(reason)


def _replay_args(tmp_path, *extra):
    # the recorded samples: a job's answers are also predicted through measure before it starts
    return ["backend=replay", f"replay_store={LIVE}", "replay_noise=recorded", "launch=nccl", "topology=h200-2x2-sock",
            f"store={tmp_path / 'ft.sqlite'}", f"out={tmp_path / 'out'}", *extra]


def _check_exported(out: Path, summary: dict) -> None:
    info = json.loads((out / "finetune.json").read_text())
    assert info["reason"] == summary["reason"]
    parse_example_rows((out / "nccl_tuner.csv").read_text())  # a table the plugin loads
    assert (out / "nccl.conf").exists()
    assert json.loads((out / "summary.json").read_text())["reason"] == summary["reason"]


def test_sigterm_mid_run_still_exports_what_the_measurements_support(tmp_path, monkeypatch):
    """SIGTERM arrives during the run's second job: that job is kept, no further job starts, and the
    run decides, exports its table, nccl.conf and summary.json, says it was interrupted and exits
    143; the same command then resumes from the store to its budget."""
    from ncclrl.envs import replay

    calls, after = [], []
    real = replay.ReplayWorkers.measure

    def measure(self, points, samples=5, **kw):
        (after if calls and calls[-1] == "sent" else calls).append(len(points))
        if len(calls) == 3:  # in the second job (each job's answers are also predicted before it starts)
            os.kill(os.getpid(), signal.SIGTERM)  # the handler only sets the latch: the job ends normally
            calls.append("sent")
        return real(self, points, samples, **kw)

    monkeypatch.setattr(replay.ReplayWorkers, "measure", measure)
    summary = run_finetune(parse_args(_replay_args(tmp_path)))
    assert calls[-1] == "sent" and after == []  # nothing started after the signal
    assert summary["interrupted"] == "SIGTERM" and summary["reason"] == "interrupted by SIGTERM"
    assert summary["jobs"] == 1  # the job the signal came before never started, and is not charged
    _check_exported(tmp_path / "out", summary)
    monkeypatch.setattr(replay.ReplayWorkers, "measure", real)
    again = run_finetune(parse_args(_replay_args(tmp_path)))
    assert again["interrupted"] is None and again["jobs"] > 2 and again["reason"] != summary["reason"]


def test_wall_s_stops_the_run_and_says_so(tmp_path):
    summary = run_finetune(parse_args(_replay_args(tmp_path, "wall_s=0.001")))
    assert summary["reason"] == "wall clock: wall_s=0.001 reached" and summary["jobs"] <= 1
    _check_exported(tmp_path / "out", summary)


@pytest.mark.parametrize("argv", [
    ["sweep", "topology=h200-2x2-sock"],
    ["finetune", "topology=h200-2x2-sock"],
    ["tune", "topology=h200-2x2-sock", "method=random"],
    ["validate", "table={table}", "topology=h200-2x2-sock"],
])
def test_a_live_command_without_gpus_is_one_line_and_leaves_nothing(argv, tmp_path, monkeypatch, capsys):
    """On a machine without GPUs: exit 2, one line naming the key and what to do instead, no
    traceback, and no store, no output folder."""
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # a machine without GPUs, wherever this runs
    monkeypatch.chdir(tmp_path)
    table = tmp_path / "t.csv"
    table.write_text("allreduce,0,max,ring,simple,-1,-1,-1\n")
    argv = [a.format(table=table) for a in argv]
    code = cli_main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "needs 4 CUDA GPUs" in err[0] and "Traceback" not in err[0], err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.csv"]


class _Answer:
    """A backend that answers every point at once (one job) and counts what it was asked."""

    name, launch, nccl_version = "torch", "torch", "2.28.9"

    def __init__(self):
        self.asked, self.failures, self.last_modes, self.provenance = [], {}, [], {}

    def measure(self, points, samples=5, **_kw):
        self.asked += points
        self.failures, self.last_modes = {}, ["eager"] * len(points)
        return [[10.0] * samples for _ in points]


def test_a_slow_or_timed_out_point_holds_back_its_channel_count_only_and_a_hang_every_count(tmp_path):
    """Ring/Simple on 1 channel stored too slow at 64 MiB holds back Ring/Simple on 1 channel at
    128 MiB, not on 8 channels (often NCCL's own best); a hang NCCL named holds back its
    algorithm/protocol at every channel count; NCCL's own choice is never held back."""
    store = Store(tmp_path / "s.sqlite")
    common = dict(backend="torch", topology="t", nccl_version="x", timing="eager", tag="finetune")
    store.add(Point("allreduce", 64 << 20, "ring", "simple", 1), [], status="slow", error="too slow: ...", **common)
    store.add(Point("allreduce", 64 << 20, "tree", "ll", 2), [], status="failed", error="NCCL hung at 64 MiB",
              **common)
    store.add(Point("allreduce", 64 << 20), [], status="timeout", error="timed out: ...", **common)
    pts = [Point("allreduce", 128 << 20, "ring", "simple", 1), Point("allreduce", 128 << 20, "ring", "simple", 8),
           Point("allreduce", 128 << 20, "tree", "ll", 1), Point("allreduce", 128 << 20)]
    w = _Answer()
    res = measure_whole(w, pts, store, "t", backend="torch", samples=2, tag="tune")
    assert [r is not None for r in res] == [False, True, False, True]
    assert w.asked == [pts[1], pts[3]]


@pytest.mark.parametrize("budget, says", [("1s", "pays for no job on h200-2x2-sock"), ("0", "must be a GPU-time > 0"),
                                          ("10M", "M is not a unit of time here")])
def test_a_budget_that_pays_for_nothing_is_one_line_and_writes_nothing(budget, says, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    code = cli_main(["finetune", "backend=replay", f"replay_store={LIVE}", "launch=nccl", "topology=h200-2x2-sock",
                     f"budget={budget}", "store=s.sqlite", "out=o"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and err[0].startswith("ncclrl: error: budget:") and says in err[0], err
    assert list(tmp_path.iterdir()) == []
