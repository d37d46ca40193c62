"""The online policies (agents/online.py): plans the plugin can run, commits that find a faster arm
and never a slower one, the registry, the shipped learned policy and its environment."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

from ncclrl.agents.online import (
    POLICIES,
    SHIPPED_POLICY,
    ArmStats,
    BucketState,
    Commit,
    Plan,
    PPOPolicy,
    make_policy,
    observe,
)
from ncclrl.agents.online_sim import OnlineExploreEnv, OnlineProblem, SimConfig, draw_problems, run_episode
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
