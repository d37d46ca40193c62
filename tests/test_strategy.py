"""The tuning run: its model, its one decision rule, the zero-shot table, the shipped format of a
strategy, and the training environment."""

from __future__ import annotations

import math

import numpy as np
import pytest

from ncclrl.agents.problem import Evaluator, Oracle, Problem, gpu_s_for_points, platform_measure
from ncclrl.agents.search import (
    N_FEATURES,
    DecisionConfig,
    Measurements,
    Model,
    ModelConfig,
    Noise,
    PolicyController,
    RankController,
    Search,
    SearchConfig,
    Space,
    decide,
    fit_noise,
    same_as_nccl,
    zero_shot,
)
from ncclrl.costmodel import nccl as N
from ncclrl.costmodel.errors import ConfigError
from ncclrl.costmodel.platforms import Platform, Quirks, draw_platform
from ncclrl.costmodel.replica import default_decisions
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


class _Jobs:
    """Job medians fed to the decision as a run records them (point, job number, log time)."""

    def __init__(self) -> None:
        self.point: list[int] = []
        self.job: list[int] = []
        self.y: list[float] = []

    def add(self, job: int, i: int, y: float) -> None:
        self.point.append(int(i))
        self.job.append(job)
        self.y.append(float(y))

    def obs(self) -> Measurements:
        return Measurements(np.array(self.point, np.int64), np.array(self.job, np.int64), np.array(self.y))


def decided(sp: Space, jobs: _Jobs, cfg: DecisionConfig, noise: Noise | None = None):
    m = Model(sp, ModelConfig())
    obs = jobs.obs()
    n = np.bincount(obs.point, minlength=sp.size)
    ybar = np.where(n > 0, np.bincount(obs.point, obs.y, minlength=sp.size) / np.maximum(n, 1), 0.0)
    m.fit(n, ybar, noise or fit_noise(obs, ModelConfig()))
    return decide(sp, m, obs, cfg), m


def a_row(sp: Space, c: int = 0, knob: int = 0) -> int:
    """A point at cell ``c`` that is not NCCL's own choice."""
    mem = sp.members[knob * sp.n_cells + c]
    return int(mem[~same_as_nccl(sp)[mem]][0])


NOISE = Noise(point_sd=0.03, job_sd=0.1)


def test_decision_keeps_a_row_measured_faster_in_its_job_and_refuses_a_tie():
    """One row, measured in the same jobs as NCCL's choice: 30% faster in 3 jobs is kept, a tie
    (and 1% faster, below delta) is not, whatever the jobs' shifts."""
    sp = Space(problem())
    d, r = int(sp.default[0]), a_row(sp)
    cfg = DecisionConfig(delta=0.02, alpha=0.1)
    for gain, kept in ((0.3, True), (0.0, False), (0.01, False)):
        jobs = _Jobs()
        for j, shift in enumerate((0.0, 0.25, -0.2)):
            jobs.add(j, d, 5.0 + shift)
            jobs.add(j, r, 5.0 + shift - gain)
        t, _ = decided(sp, jobs, cfg, NOISE)
        assert (t.rows == {0: r}) is kept, (gain, t.rows)
        if kept:
            assert t.prob[0] > 0.9 and t.speedup(0)[1] > 1.2


def test_a_row_compared_across_jobs_pays_for_the_job_shift():
    """The same 8% gain: kept when the row and NCCL's choice share their jobs, refused when each
    was measured in jobs of its own (a job's shift, sd 0.1, does not cancel)."""
    sp = Space(problem())
    d, r = int(sp.default[0]), a_row(sp)
    cfg = DecisionConfig(delta=0.01, alpha=0.2)
    paired, apart = _Jobs(), _Jobs()
    for j in range(2):
        paired.add(j, d, 5.0)
        paired.add(j, r, 4.92)
        apart.add(j, d, 5.0)
        apart.add(10 + j, r, 4.92)
    assert decided(sp, paired, cfg, NOISE)[0].rows == {0: r}
    assert decided(sp, apart, cfg, NOISE)[0].rows == {}


def test_decision_refuses_a_row_never_measured():
    """A point the model predicts far faster (its features measured 40% faster at every other
    size) but never measured itself stays NCCL's choice."""
    sp = Space(problem())
    jobs = _Jobs()
    key = sp.keys[a_row(sp, 1)]
    for j in (1, 2):
        for c in range(1, sp.n_cells):
            d = int(sp.default[c])
            r = next(i for i in sp.members[c] if sp.keys[i] == key)
            jobs.add(j, d, sp.prior[d])
            jobs.add(j, r, sp.prior[d] - 0.4)
        jobs.add(j, int(sp.default[0]), sp.prior[sp.default[0]])
    t, m = decided(sp, jobs, DecisionConfig(), NOISE)
    r0 = next(i for i in sp.members[0] if sp.keys[i] == key)
    assert m.mean[r0] < m.mean[sp.default[0]] - 0.2  # the model predicts it much faster
    assert 0 not in t.rows and t.final[0] == sp.default[0]
    assert set(t.rows) == set(range(1, sp.n_cells))


def test_a_row_forcing_nccls_own_choice_is_nccls_default():
    """The explicit configuration NCCL picks by itself (the replica's algorithm, protocol and
    channel count) is NCCL's default: measured 30% 'faster' it is no row; every other explicit
    configuration is not NCCL's choice."""
    sp = Space(problem())
    same = same_as_nccl(sp)
    for c in range(sp.n_cells):
        coll, s = sp.cells[c]
        dd = default_decisions(sp.problem.topo, coll, [s])
        own = (N.ALGOS[int(dd.algo[0])], N.PROTOS[int(dd.proto[0])], 0)
        i = next(i for i in sp.members[c] if sp.keys[i] == own)
        assert same[i] and not sp.is_default[i]
        other = [j for j in sp.members[c] if sp.keys[j][:2] != own[:2] and not sp.is_default[j]]
        assert not same[other].any()
        jobs = _Jobs()
        for j in range(3):
            jobs.add(j, sp.default[c], 5.0)
            jobs.add(j, i, 4.7)
        t, _ = decided(sp, jobs, DecisionConfig(), NOISE)
        assert t.rows == {} and t.final[c] == sp.default[c]
    assert 0 not in zero_shot(sp).rows or not same[zero_shot(sp).rows[0]]


@pytest.mark.parametrize("seed", [0, 1])
def test_fitted_noise_recovers_a_known_job_shift(seed):
    """40 jobs of 6 points each (a point in 4 jobs): a job shift of sd 0.12 and a per-point sd of
    0.04 are recovered within 30%; with no repeated measurement the prior's guesses stand."""
    rng = np.random.default_rng(seed)
    mu = rng.normal(5, 1, 60)
    pt, job, y = [], [], []
    for j in range(40):
        b = 0.12 * rng.standard_normal()
        for i in rng.choice(60, 6, replace=False):
            pt.append(i)
            job.append(j)
            y.append(mu[i] + b + 0.04 * rng.standard_normal())
    cfg = ModelConfig()
    nz = fit_noise(Measurements(np.array(pt), np.array(job), np.array(y)), cfg)
    assert nz.dof > 100 and nz.jobs == 40
    assert abs(nz.job_sd / 0.12 - 1) < 0.3 and abs(nz.point_sd / 0.04 - 1) < 0.3, nz
    once = fit_noise(Measurements(np.arange(5), np.zeros(5, np.int64), np.zeros(5)), cfg)
    assert (once.point_sd, once.job_sd, once.dof) == (cfg.noise_sigma, cfg.job_sigma, 0)


def test_decision_needs_the_knob_setting_to_beat_defaults_across_jobs():
    """A knob setting measured 3% better at every size (two jobs each side) is not kept when a
    job's shift has sd 5%; 30% better is; 30% better with one size unmeasured is not, nor with
    one size measured 5% slower (a setting that wins on the whole but loses at a size), nor 30%
    better in one job each side (one job's word)."""
    pr = problem()
    sp = Space(pr)
    k = 1
    for gain, skip, lose, n_jobs, kept in ((0.03, None, None, 2, False), (0.3, None, None, 2, True),
                                           (0.3, 2, None, 2, False), (0.3, None, 2, 2, False),
                                           (0.3, None, None, 1, False)):
        jobs = _Jobs()
        for j in range(n_jobs):
            for c in range(sp.n_cells):
                d0, dk = sp.default[c], sp.default[k * sp.n_cells + c]
                jobs.add(10 + j, d0, sp.prior[d0])
                if c != skip:
                    jobs.add(20 + j, dk, sp.prior[d0] - (-0.05 if c == lose else gain))
        t, _ = decided(sp, jobs, DecisionConfig(delta=0.02, alpha=0.1), Noise(0.02, 0.05))
        assert (t.knob == k) is kept, (gain, skip, lose, n_jobs, t.knob, t.knob_prob)


def test_a_row_needs_a_second_job_and_answers_for_every_candidate_measured():
    """A row measured 40% faster in one job is not exported; confirmed in a second job it is.
    5.5% faster in both jobs is kept when it is the only candidate measured at its size, and not
    when 9 others were measured there once (it was picked as the best of 10)."""
    sp = Space(problem())
    d, r = int(sp.default[0]), a_row(sp)
    cfg = DecisionConfig(delta=0.01, alpha=0.1)
    for n_jobs, kept in ((1, False), (2, True)):
        jobs = _Jobs()
        for j in range(n_jobs):
            jobs.add(j, d, 5.0)
            jobs.add(j, r, 4.6)
        assert (decided(sp, jobs, cfg, NOISE)[0].rows == {0: r}) is kept, n_jobs
    others = [int(i) for i in sp.members[0] if i not in (d, r) and not same_as_nccl(sp)[i]]
    assert len(others) == 9
    for crowd, kept in (([], True), (others, False)):
        jobs = _Jobs()
        for j in range(2):
            jobs.add(j, d, 5.0)
            jobs.add(j, r, 5.0 - 0.055)
        for i in crowd:
            jobs.add(0, i, 5.05)
        assert (decided(sp, jobs, cfg, NOISE)[0].rows == {0: r}) is kept, len(crowd)


@pytest.mark.parametrize("budget", [10, 60, 200])
def test_search_spends_at_most_its_budget_and_says_why_it_stopped(budget):
    pr = problem()
    plat = draw_platform("h200-2x2-sock", np.random.default_rng(3), True)
    ev = Evaluator(pr, platform_measure(plat, np.random.default_rng(0)), gpu_s_for_points(pr, budget))
    res = Search(pr, ev, RankController(), SearchConfig()).run()
    assert ev.gpu_s <= ev.budget + 1e-9 and res.measured == ev.points
    assert res.reason in ("budget spent", "nothing left to measure")
    assert res.decision.conf in pr.knobs
    assert Oracle(pr, plat).score(res.decision).fraction <= 1 + 1e-9


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
    import gymnasium as gym
    from gymnasium.utils.env_checker import check_env

    from ncclrl.agents.strategy_train import ExperimentConfig, StrategyEnv

    env = StrategyEnv(ExperimentConfig(families=["nvlink"], max_budget=80))
    check_env(env, skip_render_check=True)
    made = gym.make("ncclrl/Strategy-v0", cfg=ExperimentConfig(families=["nvlink"], max_budget=80))
    assert made.unwrapped.action_space == env.action_space
    obs, info = env.reset(seed=0)
    total, done = 0.0, False
    while not done:
        mask = env.action_masks()
        obs, r, done, _, info = env.step(int(np.flatnonzero(mask)[0]))
        total += r
    assert 0 < info["fraction"] <= 1 + 1e-9 and info["used"] <= info["budget"]
    assert math.isfinite(total)


@pytest.mark.xfail(strict=True, reason="the measured-only decision keeps 0-2 rows at 60 points: the search measures "
                   "rows in jobs without NCCL's choice (no within-job pair) and never again, so few rows are shown "
                   "faster; random search exports its best measured points untested")
def test_a_briefly_trained_strategy_beats_random_search_on_a_small_family():
    """The learned strategy, trained 2,048 picks on the nvlink family, against random search with
    the same budget (60 live points) on 5 misspecified platforms of that family it never saw: it
    reaches a higher fraction of the optimum by at least 0.05 on average and on at least 4 of the
    5 platforms. (Random search has no prior: this is the floor a learner must clear.)"""
    from ncclrl.agents.baselines import make_tuner
    from ncclrl.agents.strategy_train import AgentConfig, ExperimentConfig, train

    ctl = train(AgentConfig(total_timesteps=2048, n_envs=2, n_steps=256, batch_size=256, seed=3),
                ExperimentConfig(families=["nvlink"], collectives=["allreduce"], min_budget=40, max_budget=100),
                log=lambda _m: None)
    gaps = []
    for seed in range(5):
        rng = np.random.default_rng([4242, seed])  # not a training stream
        plat = draw_platform("h200-1x4", rng, True)
        pr = Problem.make(plat.topo, [N.ALLREDUCE], 8, 1 << 28)
        oracle = Oracle(pr, plat)
        got = {}
        for name in ("ncclrl", "random"):
            ev = Evaluator(pr, platform_measure(plat, np.random.default_rng([seed, 1])), 1e12, max_points=60)
            got[name] = oracle.score(make_tuner(name, ctl).tune(pr, ev, seed)).fraction
        gaps.append(got["ncclrl"] - got["random"])
    assert np.mean(gaps) >= 0.05 and sum(g > 0 for g in gaps) >= 4, gaps
