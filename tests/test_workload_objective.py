"""The job's objective (communication time per step: calls x time) in the tuning problem, the
strategy's decision, the baselines' assembly, and ``ncclrl finetune profile=`` replaying the
recorded 4 x H200 sweep (data/h200x4-2026-11-21/store.sqlite)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import yaml

from ncclrl.agents.baselines.base import assemble
from ncclrl.agents.problem import Evaluator, Oracle, Problem, sim_measure
from ncclrl.agents.search import Space, zero_shot
from ncclrl.costmodel import nccl as N
from ncclrl.costmodel.errors import ConfigError
from ncclrl.costmodel.simulator import Simulator
from ncclrl.costmodel.topology import load_topology
from ncclrl.envs.replay import recorded_sweep
from ncclrl.envs.store import Store
from ncclrl.runners.finetune import parse_args, run_finetune

REPO = Path(__file__).resolve().parent.parent
LIVE = REPO / "data" / "h200x4-2026-11-21" / "store.sqlite"
AR = N.COLLECTIVES.index("allreduce")


SIZES = [4096, 256 << 10, 128 << 20]
# a platform whose best knob setting depends on the sizes that count: NCCL's defaults at 256 KiB,
# a raised channel count at 128 MiB
PRESET = "a40-4x8-ib"


def _problem(weights=None, preset=PRESET):
    return Problem(load_topology(preset), [AR], {AR: list(SIZES)}, weights=weights)


def _heavy(j=None):
    return None if j is None else {(AR, s): (1e4 if i == j else 1.0) for i, s in enumerate(SIZES)}


def test_weights_make_the_oracle_score_the_steps_communication_time():
    w = {(AR, 4096): 500.0, (AR, 256 << 10): 3.0, (AR, 128 << 20): 1.0}
    plain, job = _problem(), _problem(w)
    truth = Simulator(job.topo, seed=3)
    d = Oracle(job, truth).best_decision()
    o_job, o_plain = Oracle(job, truth), Oracle(plain, truth)
    t, base = o_job.time_of(d, AR), o_job.base[AR]
    wv = np.array([w[(AR, s)] for s in job.sizes[AR]])
    assert o_job.score(d).speedup == pytest.approx(wv @ base / (wv @ t))
    assert o_plain.score(d).speedup == pytest.approx(np.exp(np.mean(np.log(base / t))))
    assert o_job.score(d).speedup != pytest.approx(o_plain.score(d).speedup)
    with pytest.raises(ConfigError, match="weights"):
        _problem({(AR, 4096): 1.0})  # a size without calls per step


def test_the_zero_shot_knob_setting_maximises_the_weighted_objective():
    """Brute force over knob settings on the prior: the zero-shot choice is the argmax of the
    step's speedup with weights, of the geometric mean without; the example is one where the two differ."""
    picks = {}
    for name, w in (("plain", None), ("mid-heavy", _heavy(1)), ("large-heavy", _heavy(2))):
        sp = Space(_problem(w))
        zs = zero_shot(sp)
        nc = sp.n_cells
        best = []
        for k in range(sp.n_knobs):
            fin = np.array([sp.members[k * nc + c][np.argmin(sp.prior[sp.members[k * nc + c]])] for c in range(nc)])
            t, ref = np.exp(sp.prior[fin]), np.exp(sp.prior[sp.default[:nc]])
            best.append(np.mean(np.log(ref / t)) if w is None else np.log(sp.weights @ ref / (sp.weights @ t)))
        assert zs.knob == int(np.argmax(best)) and zs.gain == pytest.approx(max(best))
        picks[name] = zs.knob
    assert len(set(picks.values())) > 1, picks


class _Exact:
    """A simulated platform answering its noise-free times."""

    def __init__(self, sim):
        self.sim, self.topo = sim, sim.topo

    def sample(self, cfg, n, validate=False):
        return np.repeat(self.sim.time_us(cfg, validate=False)[:, None], n, axis=1)


def test_baselines_assemble_the_knob_setting_of_the_weighted_objective():
    """With every point measured, assemble's knob setting is the argmax of the weighted objective
    over the measured medians, which differs from the geometric mean's on this example."""
    got = {}
    for name, w in (("plain", None), ("mid-heavy", _heavy(1)), ("large-heavy", _heavy(2))):
        p = _problem(w)
        ev = Evaluator(p, sim_measure(_Exact(Simulator(p.topo, seed=5))), 10 ** 6, samples=1)
        for k in p.knobs:
            ev.evaluate(k, [(c, s, key) for c, s in p.cells() for key in p.space(c, k)])
        best = Oracle(p, Simulator(p.topo, seed=5)).optimum_conf
        got[name] = assemble(p, ev).conf
        assert got[name] == best
    assert len({k.knobs for k in got.values()}) > 1


def _doc(*rows: dict) -> str:
    return yaml.safe_dump({"kind": "ncclrl-job-profile", "collectives": list(rows)})


def _profile(path: Path) -> Path:
    rows = [{"collective": "allreduce", "nbytes": 4096, "nodes": 2, "ranks": 4, "calls_per_step": 100},
            {"collective": "allreduce", "nbytes": 64 << 20, "nodes": 2, "ranks": 4, "calls_per_step": 2},
            {"collective": "allreduce", "nbytes": 1 << 20, "nodes": 2, "ranks": 4, "calls_per_step": 10},
            {"collective": "allgather", "nbytes": 1 << 20, "nodes": 1, "ranks": 2, "calls_per_step": 10}]
    path.write_text(_doc(*rows))
    return path


def test_finetune_with_a_profile_measures_only_the_jobs_sizes_and_reports_the_step_saving(tmp_path):
    prof = _profile(tmp_path / "job.yaml")
    args = parse_args(["backend=replay", f"replay_store={LIVE}", "launch=nccl", "topology=h200-2x2-sock",
                       f"store={tmp_path / 'ft.sqlite'}", f"out={tmp_path / 'out'}", f"profile={prof}", "budget=120"])
    summary = run_finetune(args)
    with Store(tmp_path / "ft.sqlite") as s:
        df = s.frame()
    assert set(zip(df.collective, df.nbytes, strict=True)) <= {("allreduce", 4096), ("allreduce", 64 << 20),
                                                   ("allreduce", 1 << 20)}
    assert 0 < summary["measured"] <= 120 and len(df) == summary["measured"]
    st = summary["step"]
    assert st["saved_lo"] <= st["saved_us_per_step"] <= st["saved_hi"]
    assert st["nccl_us_per_step"] > 0 and any("1 node(s) x 2 ranks" in n for n in summary["profile_notes"])
    info = json.loads((tmp_path / "out" / "finetune.json").read_text())
    # every row the run decided covers one size the job calls, on the whole job's communicator; every
    # other size and collective states NCCL's own choice
    decided = [r for r in info["table_rows"] if r["source"] != "nccl-default"]
    assert {(r["nnodes"], r["nranks"]) for r in info["table_rows"]} == {(2, 4)}
    for r in decided:
        assert r["min_bytes"] == r["max_bytes"] and (r["collective"], r["min_bytes"]) in \
            {("allreduce", 4096), ("allreduce", 64 << 20), ("allreduce", 1 << 20)}
    # the speedup on the sweep's own data is the step's: sum of calls x time, by hand from its pooled medians
    env = {k: int(v) for k, v in info["conf"].items()}
    knobs = "/".join(str(env.get(v, 0)) for v in ("NCCL_MIN_NCHANNELS", "NCCL_BUFFSIZE", "NCCL_SOCKET_NTHREADS",
                                                  "NCCL_NSOCKS_PERTHREAD", "NCCL_SOCKET_INLINE"))
    sweep = recorded_sweep(LIVE, load_topology("h200-2x2-sock"), "nccl", ("sweep", "sweep-repeat"), status="ok")
    kk = sweep[["comm_channels", "buffsize_bytes", "socket_nthreads", "nsocks_perthread",
                "socket_inline_bytes"]].astype(int).astype(str).agg("/".join, axis=1)
    logs: dict[tuple, list[float]] = {}  # a point's truth: the geometric mean of its recorded jobs' medians
    for r, k in zip(sweep.itertuples(index=False), kk, strict=True):
        logs.setdefault((r.collective, int(r.nbytes), r.algo, r.proto, int(r.channels), k), []).append(
            float(np.log(np.median(r.samples_us))))
    med = {x: float(np.exp(np.mean(v))) for x, v in logs.items()}
    rows = {(r["collective"], r["nbytes"]): r["key"].split("/") for r in info["rows"]}
    calls = {("allreduce", 4096): 100, ("allreduce", 64 << 20): 2, ("allreduce", 1 << 20): 10}
    base = sum(n * med[(c, s, "default", "default", 0, "0/0/0/0/0")] for (c, s), n in calls.items())
    tuned = 0.0
    for (c, s), n in calls.items():
        a, p, ch = rows.get((c, s), ("default", "default", "0"))
        tuned += n * med[(c, s, a, p, int(ch), knobs)]
    assert summary["speedup_on_sweep"] == pytest.approx(base / tuned)
    assert summary["fraction"] <= 1.0 + 1e-9


def test_finetune_profile_errors_are_one_line(tmp_path):
    bad = tmp_path / "other.yaml"
    bad.write_text(_doc({"collective": "allreduce", "nbytes": 4096, "nodes": 1, "ranks": 2, "calls_per_step": 1}))
    with pytest.raises(ConfigError, match="^profile: .*no call on the whole job's communicator"):
        parse_args(["backend=replay", f"replay_store={LIVE}", "topology=h200-2x2-sock", f"profile={bad}"])
    with pytest.raises(ConfigError, match="^profile: file not found"):
        parse_args(["backend=replay", f"replay_store={LIVE}", "topology=h200-2x2-sock",
                    f"profile={tmp_path / 'none.yaml'}"])
    odd = tmp_path / "odd.yaml"
    odd.write_text(_doc({"collective": "allreduce", "nbytes": 5000, "nodes": 2, "ranks": 4, "calls_per_step": 1}))
    with pytest.raises(ConfigError, match="^replay_store: .*a profile's sizes must be sizes the sweep measured"):
        run_finetune(parse_args(["backend=replay", f"replay_store={LIVE}", "topology=h200-2x2-sock",
                                 f"profile={odd}", f"store={tmp_path / 's.sqlite'}", f"out={tmp_path / 'o'}"]))


def test_benchmark_with_a_profile_poses_the_jobs_problems_and_reports_the_step(tmp_path, capsys):
    from ncclrl.runners.benchmark import benchmark, check, compose, instance, tasks

    prof = _profile(tmp_path / "job.yaml")
    over = ["suite=ci", "workers=1", "suite.sets=[lofo]", "suite.families=[socket]", "suite.budgets=[40]",
            "suite.seeds=[0]", "suite.methods=[default,sweep,zero-shot]", f"suite.profile={prof}",
            f"out={tmp_path / 'b'}"]
    cfg = compose(over)
    ts = tasks(cfg)
    assert {t["collective"] for t in ts} == {"allreduce", "allgather"}  # the profile's, not suite.collectives
    for t in ts:  # every call on the preset's whole job; allgather's bytes in whole elements per rank
        inst = instance(t, cfg.suite)
        c = inst.problem.colls[0]
        if t["collective"] == "allreduce":
            assert inst.problem.sizes[c] == [4096, 1 << 20, 64 << 20]
            assert inst.problem.weights == {(c, 4096): 100.0, (c, 1 << 20): 10.0, (c, 64 << 20): 2.0}
        else:
            assert len(inst.problem.sizes[c]) == 1 and inst.problem.weights[(c, inst.problem.sizes[c][0])] == 10.0
    df = benchmark(cfg)
    assert (df[df.method == "default"].speedup == 1).all() and (df.fraction <= 1 + 1e-9).all()
    out = capsys.readouterr().out
    assert "saved_%: the job's communication time per step saved against NCCL's defaults" in out
    with pytest.raises(ConfigError, match="^suite.profile: applies to the simulated sets"):
        check(compose([*over[:2], "suite.sets=[lofo,replay]", f"suite.profile={prof}"]))


def test_the_training_env_and_pretrain_take_a_profile(tmp_path):
    """Episodes are the job's problems (its sizes and calls per step on the drawn platform's whole
    job); pretrain with profile= trains on them, checks the strategy on them and exports the job's table."""
    from gymnasium.utils.env_checker import check_env

    from ncclrl.agents.strategy_train import ExperimentConfig, StrategyEnv
    from ncclrl.runners.cli import main

    prof = tmp_path / "job.yaml"
    prof.write_text(_doc({"collective": "allreduce", "nbytes": 4096, "nodes": 0, "ranks": 4, "calls_per_step": 50},
                         {"collective": "allreduce", "nbytes": 8 << 20, "nodes": 0, "ranks": 4, "calls_per_step": 3},
                         {"collective": "reducescatter", "nbytes": 1 << 20, "nodes": 0, "ranks": 4,
                          "calls_per_step": 6}))
    env = StrategyEnv(ExperimentConfig(families=["nvlink"], max_budget=60, profile=str(prof)))
    check_env(env, skip_render_check=True)
    for seed in range(6):
        env.reset(seed=seed)
        p = env.search.problem
        c = p.colls[0]
        assert p.weights is not None and set(p.weights) == {(c, s) for s in p.sizes[c]}
        assert N.COLLECTIVES[c] in ("allreduce", "reducescatter") and len(p.sizes[c]) in (1, 2)
    with pytest.raises(ConfigError, match="^experiment.profile: file not found"):
        ExperimentConfig(profile=str(tmp_path / "none.yaml")).check()
    run = tmp_path / "run"
    assert main(["pretrain", "topology=h200-1x4", f"profile={prof}", "agent.total_timesteps=256", "agent.n_envs=1",
                 "agent.n_steps=128", "agent.batch_size=128", "experiment.families=[nvlink]",
                 "experiment.max_budget=60", "check_platforms=2", "check_budget=40", f"run_dir={run}"]) == 0
    s = json.loads((run / "summary.json").read_text())
    assert s["profile"] == str(prof) and len(s["check"]["strategy"]) == 2
    rep = json.loads((run / "table" / "step_report.json").read_text())
    assert {k["collective"] for k in rep["keys"]} == {"allreduce", "reducescatter"}
    assert "objective step" in (run / "report.txt").read_text()


def test_finetune_under_a_compute_load_measures_beside_it_and_stores_apart(tmp_path, monkeypatch):
    """load=gemm reaches every job's workers, and its points are stored under finetune+gemmN with
    the load's slowdown, apart from isolated timings; off the PyTorch workers it is one line."""
    from test_sweep_store import FakeWorkers

    import ncclrl.runners.finetune as F

    seen = []

    class Loaded(FakeWorkers):
        whole_request = True

        def measure(self, points, samples=10, budget_us=2000.0):
            self.failures = {}
            out = super().measure(points, samples)
            self.last_slowdowns = [[1.25] * samples for _ in points]
            return out

    def live(args, topo, knobs, **_kw):
        seen.append((args["load"], int(args["load_n"])))
        return Loaded(topo, knobs, "eager", 10)

    from ncclrl.runners import live as L

    monkeypatch.setattr(L, "live_workers", live)
    monkeypatch.setattr(F, "check_launch", lambda *_a: None)
    prof = _profile(tmp_path / "job.yaml")
    args = F.parse_args(["backend=torch", "topology=h200-2x2-sock", "load=gemm", "load_n=64", f"profile={prof}",
                         "budget=40", f"store={tmp_path / 'ft.sqlite'}", f"out={tmp_path / 'out'}"])
    F.run_finetune(args)
    with Store(tmp_path / "ft.sqlite") as s:
        df = s.frame()
    assert len(df) and set(df.tag) == {"finetune+gemm64"} and set(seen) == {("gemm", 64)}
    # one slowdown per sample: the screen times each point once, confirmation jobs twice
    assert all(len(s) in (1, 2) and np.allclose(s, 1.25) for s in df.compute_slowdown)
    with pytest.raises(ConfigError, match="^load: a compute load runs in the PyTorch workers only"):
        F.parse_args(["backend=replay", f"replay_store={LIVE}", "topology=h200-2x2-sock", "load=gemm"])
