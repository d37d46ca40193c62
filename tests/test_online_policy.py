"""The online policies (agents/online.py): plans the plugin can run, commits that find a faster arm
and never a slower one, the registry, the shipped learned policy and its environment."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

from ncclrl.agents.online import (
    CATASTROPHIC,
    MAX_ARMS,
    MAX_SLOTS,
    POLICIES,
    SHIPPED_POLICY,
    ArmStats,
    BucketState,
    Commit,
    Plan,
    PPOPolicy,
    active_arms,
    apply_action,
    catastrophic,
    control_plan,
    faster_than_incumbent,
    make_policy,
    observe,
    safe_best,
)
from ncclrl.agents.online_sim import (
    BucketRun,
    OnlineExploreEnv,
    OnlineProblem,
    SimConfig,
    draw_problems,
    run_episode,
)
from ncclrl.costmodel.errors import ConfigError
from ncclrl.costmodel.noise import JobNoise
from ncclrl.costmodel.workload import Choice

NO_NOISE = SimConfig(shift_sd=0.0)


def _problem(times: list[float], steps: int = 2000, calls_per_step: int = 4) -> OnlineProblem:
    """A noise-free bucket whose arms take ``times`` (us) per call."""
    t = np.asarray(times, dtype=float)
    arms = [Choice("ring", "simple", i) for i in range(len(t))]
    return OnlineProblem("h200-1x4", "ddp", "allreduce", 1 << 20, calls_per_step, steps, False, arms, t, t,
                         t * 1.1, 0, "model", JobNoise.zero())


def _policies():
    return [make_policy(n) for n in POLICIES]


def test_make_policy_rejects_an_unknown_name_and_names_the_allowed():
    with pytest.raises(ConfigError, match="round-robin"):
        make_policy("greedy")
    assert SHIPPED_POLICY in POLICIES


@pytest.mark.parametrize("name", POLICIES)
def test_plans_use_valid_arms_and_fit_the_slots(name):
    pol = make_policy(name)
    rng = np.random.default_rng(0)
    for p in draw_problems(3, 9, "ddp", False) + draw_problems(3, 9, "fsdp", True):
        for slots in (4, 16):
            v = pol.first(p.n_arms, tuple(p.prior_us), slots, rng)
            state = BucketState(tuple(ArmStats(0, float("nan"), float("nan")) for _ in p.arms),
                                tuple(p.prior_us), 0, 0, slots)
            for r in range(12):
                if isinstance(v, Commit):
                    assert 0 <= v.arm < p.n_arms
                    break
                assert isinstance(v, Plan) and 1 <= len(v.slots) <= slots
                assert all(0 <= a < p.n_arms for a in v.slots)
                # the round's evidence: each arm's calls at a noisy time around its prior
                arms = list(state.arms)
                for a in set(v.slots):
                    k = v.slots.count(a)
                    n = arms[a].n + k
                    arms[a] = ArmStats(n, float(p.meas_us[a] * (1 + 0.01 * rng.standard_normal())),
                                       float(0.05 * p.meas_us[a]))
                state = replace(state, arms=tuple(arms), rounds=r + 1, calls=state.calls + len(v.slots) + 4)
                v = pol.decide(state, rng)


@pytest.mark.parametrize("name", POLICIES)
def test_a_faster_arm_is_found_within_bounded_rounds(name):
    prob = _problem([100.0, 110.0, 70.0, 105.0, 120.0])
    r = run_episode(prob, make_policy(name), seed=1, cfg=NO_NOISE)
    assert r["committed"] == 2
    assert r["commit_rounds"] <= 16


@pytest.mark.parametrize("name", POLICIES)
def test_no_alternative_is_committed_when_all_are_slower(name):
    for seed in range(3):
        prob = _problem([100.0, 101.0, 110.0, 130.0, 150.0, 300.0])
        r = run_episode(prob, make_policy(name), seed=seed, cfg=SimConfig())
        assert r["committed"] in (0, -1)
        assert not r["slower_commit"]


def test_noisy_slower_arms_are_never_committed():
    """With the fitted heavy-tailed noise, alternatives 3% slower than arm 0 are never committed."""
    prob = replace(_problem([100.0, 103.0, 103.0, 103.0]), noise=JobNoise.load().scaled(resid=0.0))
    for name in POLICIES:
        for seed in range(10):
            assert run_episode(prob, make_policy(name), seed=seed)["committed"] in (0, -1), (name, seed)


def test_shipped_ppo_weights_load_and_act_deterministically():
    pol = make_policy("ppo", horizon_calls=8000)
    assert isinstance(pol, PPOPolicy)
    st = BucketState((ArmStats(4, 100.0, 3.0), ArmStats(4, 90.0, 3.0), ArmStats(4, 130.0, 5.0)),
                     (100.0, 95.0, 120.0), 1, 24, 16)
    obs = observe(st, 8000)
    assert obs.shape == (pol.layers[0][0].shape[0],) and np.all(np.abs(obs) <= 1)
    a = [pol.decide(st, np.random.default_rng(i)) for i in range(3)]
    assert a[0] == a[1] == a[2]
    assert a[0] == make_policy("ppo", horizon_calls=8000).decide(st, np.random.default_rng(5))


def test_env_passes_check_env_and_masks_actions():
    env = OnlineExploreEnv(draw_problems(2, 9, "ddp", False) + draw_problems(2, 9, "fsdp", True))
    check_env(env, skip_render_check=True)
    env.reset(seed=0)
    m = env.action_masks()
    assert m.dtype == bool and m.shape == (4,) and m[2] and m[3]


# -- arm 0 the control, catastrophic arms, the share rule ------------------------------------------

class _Evidence:
    """Per arm, the timed calls' sums, as the coordinator aggregates them (n, mean, sd, max)."""

    def __init__(self, samples: list[list[float]]) -> None:
        self.x = [list(map(float, s)) for s in samples]

    def add(self, arm: int, values) -> None:
        self.x[arm].extend(float(v) for v in values)

    def state(self, rounds: int, slots: int = 16) -> BucketState:
        arms = tuple(ArmStats(len(s), float(np.mean(s)) if s else float("nan"),
                              float(np.std(s, ddof=1)) if len(s) > 1 else float("nan"),
                              float(max(s)) if s else float("nan")) for s in self.x)
        return BucketState(arms, tuple([float("nan")] * len(arms)), rounds, 20 * rounds, slots)


def _real_run() -> _Evidence:
    """The 4-GPU run's bucket as the coordinator saw it when halving committed arm 0: arm 0 four
    calls, one of them catastrophic (``a0=1699.9us/n4``), arm 2 twenty calls 2.7x faster
    (``a2=635.1us/n20``), arms 1 and 3 halved out after their first four."""
    rng = np.random.default_rng(4)
    a2 = 635.1 + 25.0 * rng.standard_normal(20)
    a2 += 635.1 - a2.mean()
    return _Evidence([[1150.0, 1200.0, 1250.0, 3199.6], [1500.0, 1480.0, 1530.0, 1510.0], list(a2),
                      [1800.0, 1790.0, 1820.0, 1805.0]])


def test_arm_stats_max_us_is_the_last_field_and_defaults_to_nan():
    from dataclasses import fields

    assert [f.name for f in fields(ArmStats)][-1] == "max_us"
    assert math.isnan(ArmStats(3, 100.0, 2.0).max_us)


def test_the_real_runs_evidence_reproduces_the_cause():
    """The cause: arm 0's four calls (one catastrophic: sd 1000 us) leave the commit test without
    power, though arm 2's mean is 2.7x lower; the same test passes with arm 0 sampled like arm 2."""
    ev = _real_run()
    st = ev.state(rounds=4)
    assert st.arms[0].mean_us == pytest.approx(1699.9) and st.arms[2].mean_us == pytest.approx(635.1)
    assert not faster_than_incumbent(st, 2)
    ev.add(0, 1200.0 + 50.0 * np.random.default_rng(0).standard_normal(16))
    assert faster_than_incumbent(ev.state(rounds=5), 2)


@pytest.mark.parametrize("name", ["round-robin", "halving", "thompson"])
def test_the_real_run_does_not_commit_arm_0_and_ends_in_arm_2(name):
    """From the real run's evidence, no Commit(0) while rounds remain: arm 0 keeps being run against
    arm 2 (in every plan) until the commit test passes, then Commit(2)."""
    pol = make_policy(name)
    ev = _real_run()
    rng = np.random.default_rng(1)
    truth = {0: (1200.0, 50.0), 1: (1500.0, 20.0), 2: (635.1, 25.0), 3: (1800.0, 20.0)}
    for rnd in range(4, 30):
        v = pol.decide(ev.state(rounds=rnd), rng)
        if isinstance(v, Commit):
            break
        assert 0 in v.slots
        for a in set(v.slots):
            m, s = truth[a]
            ev.add(a, m + s * rng.standard_normal(v.slots.count(a)))
    assert v == Commit(2), (name, rnd)
    assert rnd <= 8


def test_at_the_cap_arm_0_is_committed_when_the_test_never_passes():
    pol = make_policy("halving")
    st = _real_run().state(rounds=pol.max_rounds)
    assert pol.decide(st, np.random.default_rng(0)) == Commit(0)
    assert make_policy("round-robin").decide(st, np.random.default_rng(0)) == Commit(0)


def _with_max(arms: list[tuple[int, float, float, float]]) -> BucketState:
    return BucketState(tuple(ArmStats(*a) for a in arms), tuple([float("nan")] * len(arms)), 1, 20, 16)


def test_catastrophic_arms_are_the_ones_with_a_call_above_k_times_arm_0_and_never_arm_0():
    st = _with_max([(6, 100.0, 30.0, 900.0), (1, 450.0, float("nan"), 450.0), (5, 90.0, 3.0, 399.0),
                    (5, 95.0, 60.0, 401.0)])
    assert catastrophic(st) == {1, 3}
    assert CATASTROPHIC == 4.0
    assert active_arms(st) == [0, 2]  # arm 2 is the only alternative at the top count left
    unknown = _with_max([(6, 100.0, 3.0, float("nan")), (6, 5000.0, 3.0, float("nan"))])
    assert catastrophic(unknown) == set()  # max_us unknown: nothing dropped on this ground
    no_a0 = _with_max([(0, float("nan"), float("nan"), float("nan")), (2, 5000.0, 3.0, 6000.0)])
    assert catastrophic(no_a0) == set()


@pytest.mark.parametrize("name", POLICIES)
def test_a_catastrophic_arm_is_dropped_after_one_sample(name):
    """An alternative whose one timed call took 10x arm 0's mean is in no later plan and never
    committed, under every policy (ppo through apply_action)."""
    pol = make_policy(name)
    # arm 1 one call, 10x; arm 2 clearly faster than arm 0 (so exploring goes on), arm 3 like arm 0
    st = _with_max([(6, 100.0, 2.0, 103.0), (1, 1000.0, float("nan"), 1000.0), (6, 80.0, 2.0, 83.0),
                    (6, 100.0, 2.0, 104.0)])
    for seed in range(20):
        v = pol.decide(replace(st, rounds=1 + seed % 3), np.random.default_rng(seed))
        assert v != Commit(1)
        if isinstance(v, Plan):
            assert 1 not in v.slots and 0 in v.slots
    for action in (0, 1):
        v = apply_action(st, action)
        assert isinstance(v, Plan) and 1 not in v.slots and 0 in v.slots
    assert safe_best(replace(st, arms=(st.arms[0], ArmStats(8, 50.0, 1.0, 1000.0)) + st.arms[2:])) == Commit(2)


@pytest.mark.parametrize("name", POLICIES)
def test_in_the_simulator_a_catastrophic_arm_gets_no_call_after_the_first_round(name):
    prob = _problem([100.0, 1000.0, 90.0, 105.0])
    run = BucketRun(prob, seed=0, cfg=NO_NOISE)
    pol = make_policy(name)
    rng = np.random.default_rng(0)
    v = pol.first(prob.n_arms, tuple(prob.prior_us), NO_NOISE.slots, rng)
    run.apply(v)
    first = int(run.n[1])
    assert first >= 1
    while not run.done:
        st = run.state()
        assert catastrophic(st) == {1}
        v = pol.decide(st, rng) if run.rounds < NO_NOISE.max_rounds else safe_best(st)
        run.apply(v)
    assert run.n[1] == first and run.committed != 1


def _check_plan(v: Plan, slots: int) -> None:
    c = np.bincount(v.slots)
    assert 1 <= len(v.slots) <= slots
    assert c[0] >= math.ceil(len(v.slots) / 3), v.slots  # arm 0's share: at least a third
    assert c[0] >= c[1:].max(initial=0), v.slots  # and no alternative more than arm 0


@pytest.mark.parametrize("name", POLICIES)
def test_arm_0_is_in_every_plan_of_every_policy_with_its_share(name):
    """Every plan every policy makes in simulated jobs (noisy, with interference) holds arm 0 at
    least a third of its slots and at least as often as any alternative."""
    pol = make_policy(name)
    plans = 0
    for slots in (4, 16):
        cfg = SimConfig(slots=slots)
        for i, p in enumerate(draw_problems(6, 9, "ddp", False, cfg) + draw_problems(6, 9, "fsdp", True, cfg)):
            run = BucketRun(p, seed=i, cfg=cfg)
            rng = np.random.default_rng(i)
            v = pol.first(p.n_arms, tuple(float(x) for x in p.prior_us), slots, rng)
            while not run.done:
                if isinstance(v, Plan):
                    _check_plan(v, slots)
                    plans += 1
                run.apply(v)
                if not run.done:
                    v = pol.decide(run.state(), rng) if run.rounds < cfg.max_rounds else safe_best(run.state())
    assert plans > 25  # the plans were exercised


@pytest.mark.parametrize("slots", range(2, MAX_SLOTS + 1))
def test_control_plan_keeps_the_share_rule_and_splits_the_rest_equally(slots):
    for k in range(1, MAX_ARMS):
        v = control_plan(range(1, k + 1), slots)
        assert len(v.slots) == slots
        _check_plan(v, slots)
        c = np.bincount(v.slots)[1:]
        assert len(set(c[c > 0])) == 1  # the alternatives planned get the same calls
        assert (c > 0).sum() == min(k, slots - math.ceil(slots / 3))
    assert control_plan([], slots) == Plan((0,) * slots)


def test_one_slot_has_no_room_for_exploring():
    for name in POLICIES:
        assert make_policy(name).first(3, (1.0, 1.0, 1.0), 1, np.random.default_rng(0)) == Commit(0)


@pytest.mark.parametrize("name", POLICIES)
def test_an_alternative_slower_than_arm_0_is_never_committed(name):
    """Property over random states (fixed seed): a commit of an alternative always has the commit
    test passing and no catastrophic call behind it; an alternative whose mean is not below arm 0's
    is never committed."""
    pol = make_policy(name)
    rng = np.random.default_rng(2026)
    commits = 0
    for _ in range(400):
        k = int(rng.integers(2, MAX_ARMS + 1))
        n = rng.integers(0, 40, k)
        n[0] = max(n[0], 1)
        mean = 100.0 * np.exp(rng.normal(0.0, 0.3, k))
        sd = mean * np.exp(rng.uniform(np.log(0.005), np.log(0.5), k))
        mx = mean * np.exp(rng.uniform(0.0, 2.0, k))
        arms = tuple(ArmStats(int(n[i]), float(mean[i]) if n[i] else float("nan"),
                              float(sd[i]) if n[i] > 1 else float("nan"),
                              float(mx[i]) if n[i] and rng.random() < 0.7 else float("nan")) for i in range(k))
        st = BucketState(arms, tuple(float(x) for x in mean * np.exp(rng.normal(0, 0.2, k))),
                         int(rng.integers(1, 60)), int(rng.integers(0, 5000)), int(rng.choice([4, 16, 64])))
        v = pol.decide(st, np.random.default_rng(int(rng.integers(1 << 30))))
        if isinstance(v, Plan):
            _check_plan(v, st.slots)
        elif v.arm:
            commits += 1
            assert faster_than_incumbent(st, v.arm), (st, v)
            assert st.arms[v.arm].mean_us < st.arms[0].mean_us and v.arm not in catastrophic(st)
    assert commits > 0  # the property was exercised
