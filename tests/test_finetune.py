"""``ncclrl finetune`` on CPU: a tuning run of the shipped strategy replaying the exhaustive sweep
we measured on the 4 x H200 box (data/h200x4-2026-11-21/store.sqlite), its budget, its store,
its stop reason and its bad input."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from ncclrl.agents.finetune import finetune
from ncclrl.agents.problem import Evaluator, Problem, gpu_s_for_points, sim_measure
from ncclrl.agents.search import FEATURES, SHIPPED, PolicyController, SearchConfig, strategy_path
from ncclrl.costmodel import nccl as N
from ncclrl.costmodel.errors import ConfigError
from ncclrl.costmodel.simulator import Simulator
from ncclrl.costmodel.space import Point
from ncclrl.costmodel.topology import load_topology
from ncclrl.envs.store import Store
from ncclrl.runners.finetune import parse_args, run_finetune

REPO = Path(__file__).resolve().parent.parent
LIVE = REPO / "data" / "h200x4-2026-11-21" / "store.sqlite"
REASONS = ("budget spent", "nothing left to measure", "the strategy stopped: no candidate worth its measurement",
           "every leader decided", "the screen found no leader", "no confirmation job pays",
           "the budget left cannot", "no knob setting left", "every knob setting explored", "the leaders had their")


def test_the_shipped_strategy_loads_without_pickle_and_knows_these_features():
    ctl = PolicyController.load(strategy_path(SHIPPED))
    assert ctl.meta["features"] == list(FEATURES) and ctl.meta["trained"]["agent"]["total_timesteps"] > 0
    f = np.zeros((5, len(FEATURES)))
    assert np.isfinite(ctl.scores(f)).all()


def test_finetune_cli_replaying_the_h200_sweep(tmp_path):
    """The defaults on the recorded 2x2 sweep: within budget, every measurement in the store at
    once, a stated stop reason, each row with the evidence it was kept on."""
    args = parse_args(["backend=replay", f"replay_store={LIVE}", "launch=nccl", "topology=h200-2x2-sock",
                       f"store={tmp_path / 'ft.sqlite'}", f"out={tmp_path / 'out'}"])
    summary = run_finetune(args)
    # the last job is chosen on predicted times: it may end past the budget by what they missed
    assert summary["gpu_s"] <= 1.1 * summary["budget_gpu_s"] and summary["reason"].startswith(REASONS)
    info = json.loads((tmp_path / "out" / "finetune.json").read_text())
    assert info["reason"] == summary["reason"] and info["measured"] == summary["measured"]
    alpha = args.search.decision.alpha
    assert all(r["prob"] > 1 - alpha for r in info["rows"])
    assert all(r["time_us"] < r["nccl_time_us"] for r in info["rows"] if r["nccl_time_us"])
    with Store(tmp_path / "ft.sqlite") as s:
        assert s.count() == summary["measured"] == s.count(tag="finetune")
    assert (tmp_path / "out" / "nccl_tuner.csv").read_text().startswith("# ncclrl fine-tuned table")
    # the table on the sweep's own data (each replayed job a fresh draw around it): no size slower
    # than NCCL's defaults
    assert summary["sizes_slower_on_sweep"] == 0 and summary["speedup_on_sweep"] >= 1.0


class _Stop:
    name = "stop"

    def scores(self, feats):
        s = np.zeros(len(feats))
        s[-1] = 1.0
        return s


class _Count:
    """A platform with a known answer that counts the points of every job."""

    def __init__(self, topo):
        self.sim, self.jobs = Simulator(topo, seed=0), []
        self.topo = topo

    def sample(self, cfg, n, validate=False):
        self.jobs.append(len(cfg.nbytes))
        return np.repeat(self.sim.time_us(cfg, validate=False)[:, None], n, axis=1)


@pytest.mark.parametrize("budget", [30, 120])
def test_a_strategy_that_stops_ends_the_run_after_the_first_round(budget):
    """With ``allow_stop``; by default the run spends its whole budget whatever the strategy says."""
    topo = load_topology("h200-1x4")
    problem = Problem.make(topo, [N.ALLREDUCE], 8, 1 << 24)
    plat = _Count(topo)
    gpu_s = gpu_s_for_points(problem, budget)
    full = Evaluator(problem, sim_measure(_Count(topo)), gpu_s)
    spent = finetune(problem, full, _Stop(), SearchConfig())[0]
    assert full.remaining < full.point_gpu_s() + full.cost.launch_s * full.nranks  # spent what it could
    ev = Evaluator(problem, sim_measure(plat), gpu_s)
    out, run = finetune(problem, ev, _Stop(), SearchConfig(allow_stop=True))
    assert len(run.history) == 1 and out.measured == ev.points == run.history[0]["measured"] == sum(plat.jobs)
    assert out.measured >= problem.n_cells and spent.measured > out.measured  # NCCL's defaults at every size first
    assert out.reason == REASONS[2]


@pytest.mark.parametrize("argv, field", [(["topology=h200-1x4", "backend=cuda"], "backend"),
                                         (["backend=torch"], "topology"),
                                         (["topology=h200-1x4", "backend=replay", "replay_store=/nope.sqlite"],
                                          "replay_store"),
                                         (["topology=h200-1x4", "budget=lots"], "budget"),
                                         (["topology=h200-1x4", "budget=-1"], "budget"),
                                         (["topology=h200-1x4", "search.round_points=0"], "search.round_points"),
                                         (["topology=h200-1x4", "search.model.local_sigma=0"],
                                          "search.model.local_sigma"),
                                         (["topology=h200-1x4", "strategy=/nope.json"], "strategy"),
                                         (["topology=h200-1x4", "speed=11"], "speed")])
def test_finetune_bad_arguments_name_the_field(argv, field):
    with pytest.raises(ConfigError) as e:
        parse_args(argv)
    assert str(e.value).startswith(field)


def test_a_replay_missing_sizes_is_one_line(tmp_path):
    args = parse_args(["backend=replay", f"replay_store={LIVE}", "launch=nccl", "topology=h200-2x2-sock",
                       "max_bytes=1G", f"store={tmp_path / 'ft.sqlite'}", f"out={tmp_path / 'out'}"])
    with pytest.raises(ConfigError, match="^replay_store: the sweep lacks NCCL's defaults"):
        run_finetune(args)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("launch", ["torch", "nccl"])
def test_replay_takes_the_sweep_of_its_launch_only(tmp_path, launch):
    """A store can hold sweeps of both launches: replay takes the one measured with ``launch``
    (never a mix of the two timings), and without one names the launches the store has."""
    from ncclrl.envs.live import timing_label
    from ncclrl.envs.replay import recorded_sweep

    path = tmp_path / "s.sqlite"
    with Store(path) as s:
        for lc, t in (("torch", 50.0), ("torch", 51.0), ("nccl", 10.0)):
            s.add(Point("allreduce", 8), [t], backend="torch", topology="h200-2x2-sock", nccl_version="2.28.9",
                  timing=timing_label(lc, "eager"), tag="sweep")
    topo = load_topology("h200-2x2-sock")
    df = recorded_sweep(path, topo, launch)
    assert len(df) == (2 if launch == "torch" else 1) and set(df.timing) == {timing_label(launch, "eager")}
    with Store(path) as s:
        s._db.execute("DELETE FROM measurements WHERE timing=?", (timing_label(launch, "eager"),))
        s._db.commit()
    other = "nccl" if launch == "torch" else "torch"
    with pytest.raises(ConfigError, match=f"launch={launch} .* it has launch={other}"):
        recorded_sweep(path, topo, launch)
