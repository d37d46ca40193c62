"""The store and the sweep, on CPU, with fake workers that replay the simulator (and fail on cue)."""

from __future__ import annotations

import io
import sqlite3
from pathlib import Path

import numpy as np
import pytest

from ncclrl.costmodel import nccl as N
from ncclrl.costmodel.errors import ConfigError
from ncclrl.costmodel.noise import summarize
from ncclrl.costmodel.simulator import Configs, Simulator
from ncclrl.costmodel.space import Point, call_configs, knob_grid
from ncclrl.costmodel.topology import load_topology
from ncclrl.envs.backend import Backend
from ncclrl.envs.live import WorkerError, timing_label
from ncclrl.envs.measure import measure_whole
from ncclrl.envs.store import Store
from ncclrl.runners.sweep import parse_args, run_sweep


class FakeWorkers(Backend):
    """Measures with the simulator's noise, one request per size; can fail a request or refuse to start."""

    whole_request = False

    def __init__(self, topo, knobs, timing, timeout_s, fail_on=None, log=None, launch="nccl"):
        super().__init__()
        self.sim = Simulator(topo, seed=1)
        self.timing, self.launch = timing, launch
        self.knobs, self.nccl_version, self.fail_on, self.log = knobs, "2.28.9", fail_on, log
        self.last_modes = []

    def measure(self, points, samples=10, budget_us=2000.0):
        if self.log is not None:
            self.log.append(len(points))
        if self.fail_on and any(p.nbytes == self.fail_on for p in points):
            raise WorkerError("rank 1 failed: NCCL WARN Net : Connection closed by remote peer")
        out = []
        for p in points:
            c = N.COLLECTIVES.index(p.collective)
            if p.algo == "default":
                cfg = self.sim.default_configs(c, [p.nbytes])
            else:
                cfg = Configs.make(c, p.nbytes, N.ALGOS.index(p.algo), N.PROTOS.index(p.proto), p.channels)
            cfg.comm_channels[:] = p.comm_channels
            cfg.socket_nthreads[:] = p.socket_nthreads
            cfg.nsocks_perthread[:] = p.nsocks_perthread
            out.append(self.sim.sample(cfg, samples)[0].tolist())
        self.last_modes = [timing_label(self.launch, self.timing)] * len(points)
        return out



def test_summarize_median_and_interval():
    x = [10.0] * 20 + [11.0] * 20 + [500.0]  # one slow outlier
    med, lo, hi = summarize(x)
    assert 10.0 <= med <= 11.0 and lo <= med <= hi and hi < 20


def test_store_is_durable_and_resumable(tmp_path):
    path = tmp_path / "m.sqlite"
    p = Point("allreduce", 1024, "ring", "ll", 2)
    with Store(path) as s:
        s.add(p, [1.0, 2.0, 3.0], backend="torch", topology="t", nccl_version="2.28.9", timing="graph", tag="sweep")
        assert s.has(p, backend="torch", topology="t", tag="sweep")
        assert not s.has(Point("allreduce", 2048), backend="torch", topology="t", tag="sweep")
    with Store(path) as s:  # reopened: still there
        df = s.frame()
        assert len(df) == 1 and df.samples_us[0] == [1.0, 2.0, 3.0] and df.median_us[0] == 2.0
        out = s.export_csv(tmp_path / "m.csv")
    assert "1 2 3" in out.read_text()


def test_store_write_failure_is_one_line(tmp_path, monkeypatch):
    s = Store(tmp_path / "m.sqlite")
    s.add(Point("allreduce", 8), [1.0], backend="torch", topology="t", nccl_version="x", timing="graph", tag="a")

    class Broken:
        def execute(self, *a, **k):
            raise sqlite3.OperationalError("database or disk is full")

        def commit(self):
            pass

    good = s._db
    s._db = Broken()
    with pytest.raises(ConfigError, match="disk is full.*earlier measurements are kept"):
        s.add(Point("allreduce", 16), [1.0], backend="torch", topology="t", nccl_version="x", timing="graph",
              tag="a")
    s._db = good
    assert s.count() == 1


def sweep_args(tmp_path, **kw):
    args = parse_args(["topology=h200-2x2-sock", "collectives=allreduce", "max_bytes=1M", "grid=full",
                       f"store={tmp_path / 's.sqlite'}", "samples=5"])
    args.update(kw)
    return args


def test_full_sweep_resumes_without_remeasuring(tmp_path):
    calls = []
    out = io.StringIO()
    r1 = run_sweep(sweep_args(tmp_path), out, lambda *a: FakeWorkers(*a, log=calls))
    assert r1["measured"] > 0 and r1["failed"] == 0
    n = len(calls)
    r2 = run_sweep(sweep_args(tmp_path), io.StringIO(), lambda *a: FakeWorkers(*a, log=calls))
    assert r2["measured"] == 0 and r2["skipped"] == r1["measured"] and len(calls) == n
    text = out.getvalue()
    assert "geometric-mean speedup" in text and "allreduce on h200-2x2-sock" in text
    with Store(tmp_path / "s.sqlite") as s:
        df = s.frame(status="ok")
    # each request measured NCCL's default next to its candidates (interleaving)
    assert (df.groupby(["nbytes", "socket_nthreads", "nsocks_perthread", "comm_channels"])
            .apply(lambda g: (g.algo == "default").any(), include_groups=False).all())
    # the socket knobs win at 1 MiB in the simulated bed, as measured on the real one
    big = df[df.nbytes == (1 << 20)]
    best = big.loc[big.median_us.idxmin()]
    assert best.socket_nthreads > 0


def test_failed_requests_are_stored_and_the_sweep_goes_on(tmp_path, caplog):
    caplog.set_level("INFO")
    r = run_sweep(sweep_args(tmp_path), io.StringIO(), lambda *a: FakeWorkers(*a, fail_on=4096))
    assert r["failed"] > 0 and r["measured"] > 0
    assert "Connection closed" in caplog.text
    with Store(tmp_path / "s.sqlite") as s:
        assert s.count(status="failed") == r["failed"]
    # a rerun retries only what failed
    r2 = run_sweep(sweep_args(tmp_path), io.StringIO(), lambda *a: FakeWorkers(*a))
    assert r2["measured"] == r["failed"]


def test_workers_that_cannot_start(tmp_path, caplog):
    def refuse(*a):
        raise WorkerError("no answer from ranks [0, 1, 2, 3] within 300 s")
    caplog.set_level("INFO")
    r = run_sweep(sweep_args(tmp_path, grid="default"), io.StringIO(), refuse)
    assert r["measured"] == 0 and r["failed"] > 0 and "failed to start" in caplog.text


@pytest.mark.parametrize("available, count", [(False, 0), (True, 1)])
def test_too_few_gpus_is_a_config_error_before_any_job(monkeypatch, available, count):
    """h200-2x1-sock has 2 ranks: no GPU, or one, stops the live backend before it starts a job."""
    import torch

    from ncclrl.envs.torch_workers import TableWorkers

    monkeypatch.setattr(torch.cuda, "is_available", lambda: available)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: count)
    with pytest.raises(ConfigError, match=f"^backend: live measurement needs 2 CUDA GPUs.* sees {count} here"):
        TableWorkers(2, 2)


@pytest.mark.parametrize("command", [["ncclrl", "sweep"],
                                     ["ncclrl", "finetune"],
                                     ["ncclrl", "plugin", "verify",
                                      "data/h200x2-2026-11-22/run1/finetuned/h200-2x1-sock/nccl_tuner.csv",
                                      "topology=h200-2x1-sock"]])
def test_no_gpu_is_one_line_exit_2_and_the_store_keeps_nothing_half_done(tmp_path, command):
    import os
    import subprocess
    import sys

    store = tmp_path / "s.sqlite"
    live = ["backend=torch", "launch=nccl", "topology=h200-2x1-sock", f"store={store}", f"out={tmp_path / 'out'}"]
    live = [] if "plugin" in command else live if "finetune" in command else live[:-1]
    r = subprocess.run([sys.executable, "-m", *command, *live],
                       capture_output=True, text=True, env=dict(os.environ, CUDA_VISIBLE_DEVICES=""),
                       cwd=Path(__file__).resolve().parent.parent, timeout=120)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    key = "launcher" if "plugin" in command else "backend"  # plugin verify has no backend: it runs NCCL itself
    assert r.stderr.strip().splitlines()[-1].startswith(f"ncclrl: error: {key}: live measurement needs 2 CUDA GPUs")
    assert "plugin" not in command or "backend=" not in r.stderr
    if "finetune" in command:  # the check comes before the store opens
        assert not store.exists()
    elif store.exists():
        with Store(store) as s:
            assert s.count() == 0


@pytest.mark.parametrize("argv,field", [(["grid=huge"], "grid"), (["backend=mpi"], "backend"),
                                        (["colour=red"], "colour"), (["topology"], "sweep"), ([], "topology")])
def test_bad_sweep_arguments(argv, field):
    with pytest.raises(ConfigError, match=field):
        parse_args(argv if field in ("topology", "colour", "sweep") else ["topology=h200-1x4", *argv])


def test_point_env():
    p = Point("allreduce", 8, comm_channels=4, socket_nthreads=2, nsocks_perthread=4)
    assert p.env() == {"NCCL_MIN_NCHANNELS": "4", "NCCL_MAX_NCHANNELS": "4", "NCCL_SOCKET_NTHREADS": "2",
                       "NCCL_NSOCKS_PERTHREAD": "4"}
    assert np.isnan(summarize([])[0])


def test_the_multi_communicator_design_that_hung_is_gone(tmp_path):
    with pytest.raises(ConfigError, match="allowed: torch, nccl-tests"):
        parse_args(["topology=h200-2x2-sock", "backend=torch-multi"])


def test_whole_request_workers_get_every_point_of_a_setting_at_once(tmp_path):
    calls = []

    class Whole(FakeWorkers):
        whole_request = True

    r = run_sweep(sweep_args(tmp_path), io.StringIO(), lambda *a: Whole(*a, log=calls))
    n_settings = len(knob_grid(load_topology("h200-2x2-sock"), "full"))
    assert r["failed"] == 0 and len(calls) == n_settings == 14 and sum(calls) == r["measured"]  # one job per setting


def test_table_backend_shifts_sizes_and_writes_one_row_per_point():
    from ncclrl.costmodel.table import lookup, parse_example_rows
    from ncclrl.envs.torch_workers import shifted_sizes, table_rows

    pts = [Point("allreduce", 1024), Point("allreduce", 1024, "tree", "ll", 2),
           Point("allreduce", 1024, "ring", "simple", 0), Point("allgather", 1024, "default", "default", 4),
           Point("allreduce", 4096)]
    sizes = shifted_sizes(pts, 4)
    assert sizes == [1024, 1040, 1056, 1024, 4096]
    rows = parse_example_rows(table_rows(pts, sizes))
    assert len(rows) == 3  # NCCL's default points have no row
    assert lookup(rows, "allreduce", 1040, 1, 4)["algo"] == "tree"
    assert lookup(rows, "allreduce", 1056, 1, 4)["channels"] == -1
    assert lookup(rows, "allreduce", 1024, 1, 4) is None and lookup(rows, "allreduce", 1048, 1, 4) is None
    assert lookup(rows, "allgather", 1024, 1, 4)["algo"] == "-1"


def test_shifted_sizes_never_put_a_point_on_another_points_size():
    """At 8-64 B the shifts of one size reach the next sizes: each point still runs at a size of
    its own, NCCL's default at its exact size, and the plugin accepts every row (no overlap)."""
    from ncclrl.costmodel.table import parse_example_rows
    from ncclrl.envs.torch_workers import shifted_sizes, table_rows

    topo = load_topology("h200-1x4")
    configs = call_configs(topo, 0, Point("allreduce", 1), "full")
    assert len(configs) >= 6  # with NCCL's default, 7+ points per size: the shifts pass the next size
    for nranks in (1, 2, 3, 4):
        pts = [Point("allreduce", s, a, pr, c) for s in (8, 16, 32, 48, 64)
               for a, pr, c in [("default", "default", 0), *configs]]
        sizes = shifted_sizes(pts, nranks)
        assert len(set(sizes)) == len(sizes)
        assert all((s - p.nbytes) % 16 == 0 for p, s in zip(pts, sizes, strict=True))  # whole elements
        assert all(s == p.nbytes for p, s in zip(pts, sizes, strict=True) if p.is_default)
        rows = parse_example_rows(table_rows(pts, sizes))
        spans = sorted((r["min_bytes"], r["max_bytes"]) for r in rows)
        assert all(a[1] < b[0] for a, b in zip(spans, spans[1:], strict=False))
        ag = [Point("allgather", 64 * nranks, "ring", "simple", c) for c in (1, 2, 4)]
        assert all(x % (4 * nranks) == 0 for x in shifted_sizes(ag, nranks))  # divisible over the ranks


class HangingWholeWorkers(FakeWorkers):
    """One job per call; NCCL 'hangs' on one configuration: points before it are measured, it is
    reported, the rest is left for the next job (what ncclrl.envs.torch_workers does)."""

    whole_request = True

    def __init__(self, *a, hang=("tree", "ll", 1), jobs=None, lose_size=False, **k):
        super().__init__(*a, **k)
        self.hang, self.jobs, self.lose_size = hang, jobs, lose_size

    def measure(self, points, samples=10, budget_us=2000.0):
        self.jobs.append(len(points))
        self.failures = {}
        stop = next((i for i, p in enumerate(points) if (p.algo, p.proto, p.channels) == self.hang), None)
        end = stop
        if stop is not None and self.lose_size:  # as a real job: the hung size's samples are lost
            end = next(i for i, p in enumerate(points) if p.nbytes == points[stop].nbytes)
        done = super().measure(points[:end] if end is not None else points, samples)
        out = done + [None] * (len(points) - len(done))
        if stop is not None:
            self.failures[stop] = "no answer within 150 s (NCCL hung?); workers killed"
        return out


def _hang_at_1k_and_2k(tmp_path, hang: tuple[str, str, int]):
    """The whole space at 1 and 2 KiB under 4 channels x 2 x 4 sockets, measured with
    ``after_hang="skip"`` by workers that hang on ``hang``: (points, results, workers)."""
    topo = load_topology("h200-2x2-sock")
    knobs = knob_grid(topo, "full")[1]
    pts = [Point("allreduce", s, *key, *knobs.knobs) for s in (1024, 2048)
           for key in [("default", "default", 0)] + call_configs(topo, N.ALLREDUCE, knobs, "full")]
    w = HangingWholeWorkers(topo, knobs, "eager", 15, hang=hang, jobs=[], lose_size=True)
    with Store(tmp_path / "s.sqlite") as s:
        res = measure_whole(w, pts, s, topo.name, backend="torch", samples=3, tag="sweep",
                            after_hang="skip")
    return pts, res, w


def test_a_hang_of_nccls_own_algorithm_at_its_count_never_skips_nccls_default(tmp_path):
    """NCCL's own algorithm at NCCL's channel count hangs at 1 KiB under a raised count: at 2 KiB
    it is not measured, NCCL's own choice (the reference) is."""
    pts, res, _ = _hang_at_1k_and_2k(tmp_path, ("default", "default", 2))
    got = {(p.nbytes, p.algo, p.channels) for p, r in zip(pts, res, strict=True) if r is not None}
    assert (2048, "default", 0) in got and (2048, "default", 2) not in got and (1024, "default", 0) in got


def test_a_hanging_configuration_costs_one_point_not_the_sweep(tmp_path, caplog):
    caplog.set_level("INFO")
    jobs = []
    out = io.StringIO()
    args = sweep_args(tmp_path, grid="full", max_bytes="4K", after_hang="retry")
    r = run_sweep(args, out, lambda *a: HangingWholeWorkers(*a, jobs=jobs))
    with Store(tmp_path / "s.sqlite") as s:
        bad = s.frame(status="failed")
        good = s.frame(status="ok")
    hung = set(zip(bad.algo, bad.proto, bad.channels, strict=True))
    assert len(bad) == r["failed"] > 0 and hung == {("tree", "ll", 1)}
    assert "NCCL hung" in caplog.text and len(good) == r["measured"] > 0
    assert r["measured"] + r["failed"] == sum(1 for _ in good.itertuples()) + len(bad)
    assert len(jobs) > 7  # the jobs after a hang carried on without the hung point
    # a rerun retries the hangs, and measures nothing else but NCCL's default next to them
    with Store(tmp_path / "s.sqlite") as s:
        n_ok = s.count(status="ok")
    r2 = run_sweep(args, io.StringIO(), lambda *a: HangingWholeWorkers(*a, jobs=jobs))
    with Store(tmp_path / "s.sqlite") as s:
        new = s.frame(status="ok").iloc[n_ok:]
    assert r2["failed"] == r["failed"] and len(new) == r2["measured"] > 0 and (new.algo == "default").all()


def test_after_a_hang_the_sweep_skips_that_algorithm_at_larger_sizes_and_does_not_retry(tmp_path):
    """after_hang=skip (the default): NCCL hangs on Tree/LL with 1 channel at the smallest size;
    every Tree/LL point of that setting at that size and above is stored as failed without a job of
    its own, so a hang costs one job per knob setting; a rerun does not retry them."""
    jobs = []
    out = io.StringIO()
    args = sweep_args(tmp_path, grid="full", max_bytes="4K")
    r = run_sweep(args, out, lambda *a: HangingWholeWorkers(*a, jobs=jobs))
    settings = len(knob_grid(load_topology("h200-2x2-sock"), "full"))
    with Store(tmp_path / "s.sqlite") as s:
        bad = s.frame(status="failed")
        good = s.frame(status="ok")
    assert set(zip(bad.algo, bad.proto, strict=True)) == {("tree", "ll")} and len(bad) == r["failed"]
    assert bad.error.str.contains("NCCL hung").all() and (bad.error.str.startswith("not measured")).sum() > 0
    tl = good[(good.algo == "tree") & (good.proto == "ll")]  # only those the job ran before the hang
    assert set(zip(tl.nbytes, tl.channels, strict=True)) == {(good.nbytes.min(), 0)} and len(good) == r["measured"]
    assert len(jobs) == 2 * settings  # one hang per setting, then one job for the rest
    r2 = run_sweep(args, io.StringIO(), lambda *a: HangingWholeWorkers(*a, jobs=jobs))
    assert r2["measured"] == 0 and r2["failed"] == 0 and len(jobs) == 2 * settings


@pytest.mark.parametrize("name,knob_index,extra", [("h200-2x2-sock", 0, None), ("h200-2x2-sock", 1, 2),
                                                   ("h200-2x2-sock", 2, None), ("h200-1x4", 1, 24)])
def test_raised_channels_add_nccls_own_algorithm_at_its_count(name, knob_index, extra):
    """Under a setting that raises the communicator's channels, the space also holds NCCL's own
    algorithm and protocol at NCCL's channel count (last); elsewhere it does not."""
    topo = load_topology(name)
    k = knob_grid(topo, "full")[knob_index]
    space = call_configs(topo, N.ALLREDUCE, k, "full")
    own = [key for key in space if key[0] == "default"]
    assert own == ([("default", "default", extra)] if extra else [])
    assert not own or space[-1] == own[0]
    assert (k.comm_channels > topo.nccl.channels) == bool(extra)


def test_after_a_hang_the_points_the_job_ran_before_it_are_measured_again(tmp_path):
    """The real job loses the whole size it hung at; of the hung algorithm/protocol, the points
    before the hung one at that size (warmed by the job: they ran) are measured in the next job,
    those after it and at larger sizes are not."""
    args = sweep_args(tmp_path, grid="default", max_bytes="4K")
    pts, res, w = _hang_at_1k_and_2k(tmp_path, ("ring", "simple", 1))
    got = {(p.nbytes, p.algo, p.proto, p.channels) for p, r in zip(pts, res, strict=True) if r is not None}
    rs = sorted((n, ch) for n, a, q, ch in got if (a, q) == ("ring", "simple"))
    assert rs == [(1024, 0)]  # ran before the hung 1-channel point; the 4-channel one and 2 KiB not
    assert (1024, "tree", "simple", 4) in got and (2048, "tree", "ll", 1) in got  # other configurations
    assert len(w.jobs) == 2 and args["after_hang"] == "skip"


def test_wall_s_stops_starting_jobs_and_a_rerun_measures_the_rest(tmp_path, monkeypatch, caplog):
    caplog.set_level("INFO")
    import ncclrl.runners.sweep as sweep

    clock = [0.0]
    monkeypatch.setattr(sweep.time, "time", lambda: clock[0])

    def factory(*a):
        clock[0] += 100.0  # each knob setting's job takes 100 s
        return FakeWorkers(*a)

    args = sweep_args(tmp_path, wall_s="250", max_bytes="64K")
    out = io.StringIO()
    r = run_sweep(args, out, factory)
    assert r["left"] > 0 and r["measured"] > 0 and "wall_s=250 reached" in caplog.text
    with Store(tmp_path / "s.sqlite") as s:
        n = s.count()
    assert n == r["measured"]  # what was left is not stored as failed
    r2 = run_sweep(sweep_args(tmp_path, max_bytes="64K"), io.StringIO(), factory)
    assert r2["measured"] >= r["left"] and r2["left"] == 0 and r2["failed"] == 0


def test_a_sweep_with_the_other_launch_measures_again(tmp_path):
    """Resuming pairs measurements of one launch only: a direct-call sweep does not count the points
    a torch.distributed sweep stored."""
    r1 = run_sweep(sweep_args(tmp_path, grid="default", launch="torch"), io.StringIO(),
                   lambda *a: FakeWorkers(*a, launch="torch"))
    r2 = run_sweep(sweep_args(tmp_path, grid="default"), io.StringIO(), lambda *a: FakeWorkers(*a))
    r3 = run_sweep(sweep_args(tmp_path, grid="default"), io.StringIO(), lambda *a: FakeWorkers(*a))
    assert r1["measured"] == r2["measured"] > 0 and r2["skipped"] == 0 and r3["measured"] == 0


def test_job_records_keep_finished_sizes_and_name_the_stuck_point(tmp_path):
    from ncclrl.envs.jobs import parse_record
    from ncclrl.envs.torch_workers import JobRecords

    lines = ['NCCLRL|0|hello|{"host": "a", "gpu": "H200", "world": 2}', '[1,1]<stdout>:NCCLRL|1|hello|{"host": "b"}',
             "NCCLRL|0|item|0", "NCCLRL|1|item|0", "NCCLRL|0|item|1", "NCCLRL|1|item|1",
             'NCCLRL|0|result|{"i": 0, "s": [1.0, 2.0], "m": "graph"}',
             'NCCLRL|0|result|{"i": 1, "s": [3.0, 5.0], "m": "eager"}',
             "NCCLRL|0|item|2", "NCCLRL|1|item|2", "NCCLRL|0|item|3",
             'NCCLRL|0|result|{"i": 2, "s": [1',  # cut by a kill
             "NCCL INFO not a record"]
    seen = JobRecords(2, 4, tmp_path)
    seen.add([r for r in map(parse_record, lines) if r is not None])
    seen.close()
    assert seen.results[:2] == [[1.0, 2.0], [3.0, 5.0]] and seen.results[2:] == [None, None]
    assert seen.modes[:2] == ["graph", "eager"]
    assert seen.stuck() == 2  # rank 1 never got past point 2
    assert sorted(seen.hellos) == [0, 1] and (tmp_path / "rank1.log").exists()


class FakeTableWorkers(Backend):
    """What ``ncclrl validate`` drives: NCCL's default (no table) or an exported table under knobs,
    replayed by the simulator; the table makes AllReduce 2x faster at 1 MiB and slower at 8 B."""

    def __init__(self, knobs, table, sim, launch="nccl"):
        super().__init__()
        self.knobs, self.table, self.sim, self.launch = knobs, table, sim, launch
        self.nccl_version, self.last_modes, self.failures = "2.28.9", [], {}

    def measure(self, points, samples=5):
        rng = np.random.default_rng(len(points) + (0 if self.table is None else 1))
        out = []
        for p in points:
            t = float(self.sim.time_us(self.sim.default_configs(N.COLLECTIVES.index(p.collective), [p.nbytes]))[0])
            if self.table is not None:
                t = t / 2 if p.nbytes == 1 << 20 else (t * 1.5 if p.nbytes == 8 else t)
            out.append((t * (1 + 0.01 * rng.standard_normal(samples))).tolist())
        self.last_modes = [timing_label(self.launch, "eager")] * len(points)
        return out


def test_validate_alternates_jobs_stores_everything_and_gives_verdicts(tmp_path):
    from ncclrl.costmodel.table import read_conf
    from ncclrl.runners.validate import parse_args, run_validate

    table = tmp_path / "t.csv"
    table.write_text("allreduce,0,max,ring,simple,2,-1,-1\n")
    conf = tmp_path / "nccl.conf"
    conf.write_text("# knobs\nNCCL_SOCKET_NTHREADS=2\nNCCL_NSOCKS_PERTHREAD=4\nNCCL_SOCKET_INLINE=262144\n")
    assert read_conf(conf).knobs == (0, 0, 2, 4, 262144)
    sim, calls = Simulator("h200-2x2-sock", seed=0), []

    def factory(knobs, tab):
        calls.append((knobs.knobs if knobs else None, tab))
        return FakeTableWorkers(knobs, tab, sim)

    args = parse_args([f"table={table}", f"conf={conf}", "topology=h200-2x2-sock", "max_bytes=4M",
                       f"store={tmp_path / 's.sqlite'}", "rounds=2", f"out={tmp_path / 'v.csv'}"])
    df = run_validate(args, out=io.StringIO(), workers_factory=factory)
    assert [c[1] is None for c in calls] == [True, True, False, False, True]  # warm-up, then base/tuned ABBA
    assert calls[2][0] == (0, 0, 2, 4, 262144)
    v = df.set_index("nbytes")
    assert v.loc[1 << 20, "verdict"] == "faster" and v.loc[8, "verdict"] == "slower"
    assert v.loc[1 << 20, "speedup"] == pytest.approx(2.0, rel=0.05)
    assert v.loc[4096, "verdict"] == "same"
    with Store(tmp_path / "s.sqlite") as s:  # every job's samples are kept: 2 rounds x 2 settings x sizes
        assert s.count() == 5 * len(df) and s.count(tag="validate-warmup") == len(df)
        frame = s.frame()
        tuned = frame[frame.tag.str.startswith("validate-tuned:")]
        assert set(tuned.socket_nthreads) == {2} and set(tuned.algo) == {"default"}
        assert frame.job.nunique() == 5 and frame.groupby("job").tag.nunique().max() == 1  # one id per job
    assert (tmp_path / "v.csv").exists()


def test_validate_offers_measure_false_only_where_the_store_holds_this_tables_validation(tmp_path, monkeypatch):
    """Without GPUs, validate's hint (measure=false) is given only when it would work; out= says where
    the report went; a store that is not there is the one line said (no progress line before it)."""
    import ncclrl.runners.validate as V

    table = tmp_path / "t.csv"
    table.write_text("allreduce,0,max,ring,simple,2,-1,-1\n")
    common = [f"table={table}", "topology=h200-2x2-sock", "max_bytes=64K", f"store={tmp_path / 's.sqlite'}"]
    offered = []
    monkeypatch.setattr(V, "check_launch", lambda args, topo, instead="", key="": offered.append(instead))
    monkeypatch.setattr(V, "run_validate", lambda args: None)
    V.main_validate(V.parse_args(common))
    assert offered == [""] and not (tmp_path / "s.sqlite").exists()  # no store: nothing to judge instead
    sim = Simulator("h200-2x2-sock", seed=0)
    out = io.StringIO()
    monkeypatch.undo()
    V.run_validate(V.parse_args(common + ["rounds=2", f"out={tmp_path / 'v.csv'}"]), out=out,
                   workers_factory=lambda k, t: FakeTableWorkers(k, t, sim))
    assert out.getvalue().rstrip().endswith(f"# wrote {tmp_path / 'v.csv'} and {tmp_path / 'v.png'}")
    monkeypatch.setattr(V, "check_launch", lambda args, topo, instead="", key="": offered.append(instead))
    monkeypatch.setattr(V, "run_validate", lambda args: None)
    V.main_validate(V.parse_args(common))
    assert offered[-1].startswith("measure=false")
    table.write_text("allreduce,0,max,tree,simple,2,-1,-1\n")  # another table: no earlier validation of it
    V.main_validate(V.parse_args(common))
    assert offered[-1] == ""


def test_validate_from_a_missing_store_is_one_line(tmp_path, capsys):
    from ncclrl.runners.cli import main

    table = tmp_path / "t.csv"
    table.write_text("allreduce,0,max,ring,simple,2,-1,-1\n")
    assert main(["validate", str(table), "topology=h200-2x2-sock", "measure=false",
                 f"store={tmp_path / 'none.sqlite'}"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("ncclrl: error: store:") and err.count("\n") == 1, err
    assert not (tmp_path / "none.sqlite").exists()


@pytest.mark.parametrize("argv, field", [(["topology=h200-1x4"], "table"),
                                         (["table=/nonexistent.csv", "topology=h200-1x4"], "table"),
                                         (["table=README.md", "topology=h200-1x4", "rounds=0"], "rounds"),
                                         (["table=README.md", "topology=h200-1x4", "color=red"], "color")])
def test_validate_bad_arguments_name_the_field(argv, field):
    from ncclrl.runners.validate import parse_args

    with pytest.raises(ConfigError) as e:
        parse_args(argv)
    assert str(e.value).startswith(field)


def test_read_conf_rejects_unknown_settings(tmp_path):
    from ncclrl.costmodel.table import read_conf

    f = tmp_path / "nccl.conf"
    f.write_text("NCCL_SOCKET_NTHREADS=2\nNCCL_ALGO=ring\n")
    with pytest.raises(ConfigError, match="nccl.conf:2"):
        read_conf(f)


def test_a_store_from_before_the_inline_knob_opens_and_resumes(tmp_path):
    """Stores written before NCCL_SOCKET_INLINE joined the knobs gain the column (NCCL's default, 0)
    and keep every row; the knob is part of a point's identity from then on."""
    path = tmp_path / "old.sqlite"
    db = sqlite3.connect(path)
    old = (
        "CREATE TABLE measurements (id INTEGER PRIMARY KEY, ts REAL NOT NULL, host TEXT NOT NULL, backend TEXT NOT"
        " NULL, topology TEXT NOT NULL, nccl_version TEXT NOT NULL, collective TEXT NOT NULL, nbytes INTEGER NOT"
        " NULL, algo TEXT NOT NULL, proto TEXT NOT NULL, channels INTEGER NOT NULL, comm_channels INTEGER NOT NULL,"
        " buffsize_bytes INTEGER NOT NULL, socket_nthreads INTEGER NOT NULL, nsocks_perthread INTEGER NOT NULL,"
        " timing TEXT NOT NULL, tag TEXT NOT NULL, status TEXT NOT NULL, samples_us TEXT NOT NULL, median_us REAL,"
        " ci_lo_us REAL, ci_hi_us REAL, error TEXT)")
    db.execute(old)
    db.execute("INSERT INTO measurements VALUES (1, 0, 'h', 'torch', 'h200-2x2-sock', '2.28.9', 'allreduce', 64,"
               " 'default', 'default', 0, 0, 0, 2, 2, 'eager', 'sweep', 'ok', '[10.0]', 10, 10, 10, NULL)")
    db.commit()
    db.close()
    p = Point("allreduce", 64, socket_nthreads=2, nsocks_perthread=2)
    with Store(path) as s:
        assert s.has(p, backend="torch", topology="h200-2x2-sock", tag="sweep")
        inline = Point("allreduce", 64, socket_nthreads=2, nsocks_perthread=2, socket_inline_bytes=1 << 18)
        assert not s.has(inline, backend="torch", topology="h200-2x2-sock", tag="sweep")
        s.add(inline, [5.0], backend="torch", topology="h200-2x2-sock", nccl_version="2.28.9", timing="eager",
              tag="sweep")
        df = s.frame()
    assert df["socket_inline_bytes"].tolist() == [0, 1 << 18]
    assert inline.env()["NCCL_SOCKET_INLINE"] == "262144"


def test_a_job_preempted_before_its_first_point_stores_no_point_and_ends_the_run(tmp_path):
    """SIGTERM ended the job before it finished any point: nothing is stored as failed (the
    resumed run measures those points), only the job itself, and the run ends with Interrupted;
    a preempted job that finished points stores those."""
    from ncclrl.envs.jobs import Interrupted

    topo = load_topology("h200-2x2-sock")
    knobs = knob_grid(topo, "full")[0]
    pts = [Point("allreduce", s) for s in (1024, 2048, 4096)]

    class Preempted(FakeWorkers):
        whole_request = True

        def __init__(self, *a, finished=0, **k):
            super().__init__(*a, **k)
            self.finished = finished

        def measure(self, points, samples=10, budget_us=2000.0):
            self.failures, self.terminated = {}, True
            done = super().measure(points[: self.finished], samples)
            return done + [None] * (len(points) - len(done))

    for finished in (0, 2):
        with Store(tmp_path / f"s{finished}.sqlite") as s:
            with pytest.raises(Interrupted):
                measure_whole(Preempted(topo, knobs, "eager", 15, finished=finished), pts, s, topo.name,
                              backend="torch", samples=3, tag="sweep")
            df = s.frame()
            assert len(s.jobs()) == 1 and len(df) == finished and (df.status == "ok").all()
