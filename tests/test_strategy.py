"""The tuning run: its model, its one decision rule, the zero-shot table, the shipped format of a
strategy, and the training environment."""

from __future__ import annotations

import math

import numpy as np
import pytest

from ncclrl.agents.problem import Evaluator, Oracle, Problem, platform_measure
from ncclrl.agents.strategy import (
    N_FEATURES,
    DecisionConfig,
    Model,
    ModelConfig,
    PolicyController,
    RankController,
    Search,
    SearchConfig,
    Space,
    decide,
    zero_shot,
)
from ncclrl.costmodel import nccl as N
from ncclrl.costmodel.errors import ConfigError
from ncclrl.costmodel.platforms import Platform, Quirks, draw_platform
from ncclrl.costmodel.simulator import Simulator
from ncclrl.costmodel.topology import load_topology


def problem(name: str = "h200-2x2-sock") -> Problem:
    return Problem(load_topology(name), [N.ALLREDUCE], {N.ALLREDUCE: [64, 4096, 1 << 18, 1 << 22, 1 << 26]})


def test_zero_shot_is_the_exact_argmin_of_the_prior():
    sp = Space(problem())
    t = zero_shot(sp)
    nc = sp.n_cells
    best = max(range(sp.n_knobs), key=lambda k: np.mean(
        [sp.prior[sp.default[c]] - sp.prior[sp.members[k * nc + c]].min() for c in range(nc)]))
    assert t.knob == best
    for c in range(nc):
        i = t.final[c]
        assert sp.prior[i] == sp.prior[sp.members[best * nc + c]].min()


def test_model_moves_towards_measurements_and_grows_certain():
    sp = Space(problem())
    m = Model(sp, ModelConfig())
    prior_sd = m.std.copy()
    n = np.zeros(sp.size, dtype=np.int64)
    i = int(sp.default[0])
    n[i] = 3
    y = np.zeros(sp.size)
    y[i] = sp.prior[i] + 0.5  # measured 65% slower than the prior says
    m.fit(n, y)
    assert sp.prior[i] + 0.3 < m.mean[i] < sp.prior[i] + 0.5
    assert m.std[i] < 0.5 * prior_sd[i]
    # the correction carries over to the points that share its features, less than fully
    same = (sp.cell == sp.cell[i]) & (sp.knob == sp.knob[i]) & ~sp.is_default
    assert (m.mean[same] > sp.prior[same]).all()


def fitted(delta_log: float, n_meas: int, knob_jobs: int = 3):
    """A space where one row under NCCL's defaults at cell 0 measured ``delta_log`` faster than
    NCCL's choice, ``n_meas`` times each."""
    sp = Space(problem())
    m = Model(sp, ModelConfig(noise_sigma=0.05))
    n = np.zeros(sp.size, dtype=np.int64)
    y = np.zeros(sp.size)
    d = int(sp.default[0])
    r = int(sp.members[0][~sp.is_default[sp.members[0]]][0])
    n[d] = n[r] = n_meas
    y[d], y[r] = 5.0, 5.0 - delta_log
    m.fit(n, y)
    jobs = [set(range(knob_jobs))] + [set() for _ in range(sp.n_knobs - 1)]
    return sp, m, n, jobs, r


def test_decision_keeps_a_row_only_when_shown_delta_faster():
    cfg = DecisionConfig(delta=0.02, alpha=0.1)
    sp, m, n, jobs, r = fitted(0.3, 5)
    assert decide(sp, m, n, jobs, cfg).rows == {0: r}
    sp, m, n, jobs, r = fitted(0.01, 5)  # 1% faster: below delta
    assert decide(sp, m, n, jobs, cfg).rows == {}
    sp, m, n, jobs, r = fitted(0.06, 1)  # 6% once each: not sure enough
    t = decide(sp, m, n, jobs, cfg)
    assert t.rows == {} and t.knob == 0


def test_decision_needs_the_knob_setting_to_beat_defaults_across_jobs():
    """A knob setting measured 3% better everywhere in one job is not kept when one job shifts by
    job_sigma = 5%; 30% better is."""
    pr = problem()
    sp = Space(pr)
    for gain, kept in ((0.03, False), (0.3, True)):
        n = np.zeros(sp.size, dtype=np.int64)
        y = np.zeros(sp.size)
        k = 1
        for c in range(sp.n_cells):
            d0, dk = sp.default[c], sp.default[k * sp.n_cells + c]
            n[d0] = n[dk] = 9
            y[d0], y[dk] = sp.prior[d0], sp.prior[d0] - gain
        m = Model(sp, ModelConfig())
        m.fit(n, y)
        jobs = [{1}, {2}] + [set() for _ in range(sp.n_knobs - 2)]
        t = decide(sp, m, n, jobs, DecisionConfig(delta=0.02, alpha=0.1, job_sigma=0.05))
        assert (t.knob == k) is kept, (gain, t.knob, t.knob_prob)


@pytest.mark.parametrize("budget", [10, 60, 200])
def test_search_spends_at_most_its_budget_and_says_why_it_stopped(budget):
    pr = problem()
    plat = draw_platform("h200-2x2-sock", np.random.default_rng(3), True)
    ev = Evaluator(pr, platform_measure(plat, np.random.default_rng(0)), budget)
    res = Search(pr, ev, RankController(), SearchConfig()).run()
    assert ev.used <= budget and res.measured == ev.used
    assert res.reason in ("budget spent", "nothing left to measure")
    assert res.decision.conf in pr.knobs
    assert Oracle(pr, plat).score(res.decision).fraction <= 1 + 1e-9


def test_a_stopping_strategy_stops():
    class Stop:
        name = "stop"

        def scores(self, f):
            s = np.zeros(len(f))
            s[-1] = 1
            return s

    pr = problem()
    ev = Evaluator(pr, platform_measure(Simulator(pr.topo), np.random.default_rng(0)), 500)
    res = Search(pr, ev, Stop(), SearchConfig()).run()
    assert res.reason.startswith("the strategy stopped") and ev.used < 500


def test_strategy_round_trips_without_pickle(tmp_path):
    rng = np.random.default_rng(1)
    layers = [(rng.normal(size=(N_FEATURES, 8)), rng.normal(size=8)), (rng.normal(size=(8, 1)), rng.normal(size=1))]
    p = PolicyController(layers, {"trained": {"note": "test"}}).save(tmp_path / "s.json")
    q = PolicyController.load(p)
    f = rng.normal(size=(5, N_FEATURES))
    assert np.allclose(q.scores(f), PolicyController(layers, {}).scores(f))
    with np.load(tmp_path / "s.npz", allow_pickle=False) as z:
        assert all(z[k].dtype != object for k in z.files)
    (tmp_path / "bad.json").write_text('{"format": "something else"}')
    with pytest.raises(ConfigError) as e:
        PolicyController.load(tmp_path / "bad.json")
    assert e.value.field == "strategy" and "\n" not in str(e.value)


def test_quirks_are_effects_the_simulator_lacks():
    topo = load_topology("h200-2x2-sock")
    sim = Simulator(topo)
    pr = Problem.make(topo, [N.ALLREDUCE])
    plain = Oracle(pr, Platform(sim))
    odd = Oracle(pr, Platform(sim, Quirks(5)))
    k = (0, 0, 0, 0, 0)
    ratio = np.log(odd.times[(k, N.ALLREDUCE)] / plain.times[(k, N.ALLREDUCE)])
    assert 0.05 < float(np.abs(ratio).mean()) < 0.6
    again = Oracle(pr, Platform(sim, Quirks(5)))
    assert np.array_equal(again.times[(k, N.ALLREDUCE)], odd.times[(k, N.ALLREDUCE)])


def test_training_env_passes_gymnasium_checks():
    from gymnasium.utils.env_checker import check_env

    from ncclrl.agents.strategy_train import StrategyConfig, StrategyEnv

    env = StrategyEnv(StrategyConfig(families=["nvlink"], max_budget=80))
    check_env(env, skip_render_check=True)
    obs, info = env.reset(seed=0)
    total, done = 0.0, False
    while not done:
        mask = env.action_masks()
        obs, r, done, _, info = env.step(int(np.flatnonzero(mask)[0]))
        total += r
    assert 0 < info["fraction"] <= 1 + 1e-9 and info["used"] <= info["budget"]
    assert math.isfinite(total)
