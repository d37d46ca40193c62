"""The stopping agent: its controller reproduces finetune's default run when it follows the rule,
stays within the budget whatever it chooses, its environment's reward is its lead over the rule, and
its weights round-trip."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

from ncclrl.agents.search.confirm import ConfirmConfig, ConfirmController
from ncclrl.agents.stopping import (
    ACTIONS,
    N_FEATURES,
    PolicyStopper,
    SimulatedProblem,
    StopController,
    rule_config,
    run_once,
)
from ncclrl.agents.stopping.controller import CONFIRM, EXPLORE, STOP
from ncclrl.agents.stopping.env import ConfirmStopEnv
from ncclrl.costmodel.errors import ConfigError


@pytest.fixture(scope="module")
def problems():
    return [SimulatedProblem.draw(1, i) for i in (0, 2, 3, 5, 6, 10)]


def follow_the_rule(obs: np.ndarray, mask: np.ndarray) -> int:
    a = (STOP, CONFIRM, EXPLORE)[int(np.argmax(obs[4:7]))]
    return a if mask[a] else STOP


def test_following_the_rules_choice_reproduces_the_default_run(problems):
    for tp in problems:
        rule = run_once(tp, ConfirmController(rule_config(tp)), 3)
        agent = run_once(tp, StopController(rule_config(tp), policy=follow_the_rule), 3)
        assert agent.net_value == pytest.approx(rule.net_value, abs=1e-9), tp.name
        assert (agent.knob, agent.rows) == (rule.knob, rule.rows)
    assert any(set(agent.choices) - {"s"} for tp in problems
               for agent in [run_once(tp, StopController(rule_config(tp), policy=follow_the_rule), 3)])


def test_stopping_after_the_screen_measures_the_screen_only(problems):
    for tp in problems:
        r = run_once(tp, StopController(rule_config(tp), policy=lambda o, m: STOP), 0)
        assert r.jobs <= 1 and r.rows == 0 and r.knob == 0
        assert r.net_value == pytest.approx(-r.spent_pct)


def test_any_choice_stays_within_the_budget_and_exports_no_unsupported_knob(problems):
    rng = np.random.default_rng(0)
    for tp in problems:
        for seed in range(2):
            r = run_once(tp, StopController(rule_config(tp), policy=lambda o, m: int(rng.choice(np.flatnonzero(m)))),
                         seed)
            assert r.gpu_s <= tp.budget_gpu_s * (1 + 1e-9)


def test_each_problem_draws_its_own_noise_and_one_seed_repeats(problems):
    a = problems[2]
    b = replace(a, key=a.key + 1)  # the same problem under another problem's key
    x = run_once(a, ConfirmController(rule_config(a)), 1)
    assert x.jobs > 2
    assert run_once(a, ConfirmController(rule_config(a)), 1) == x
    assert run_once(b, ConfirmController(rule_config(b)), 1).gpu_s != x.gpu_s


def test_the_environment_passes_gymnasiums_checks_and_pays_the_lead_over_the_rule(problems):
    env = ConfirmStopEnv(problems)
    check_env(env, skip_render_check=True)
    obs, _ = env.reset(seed=1)
    assert obs.shape == (N_FEATURES,)
    done, total = False, 0.0
    while not done:  # following the rule: a lead of exactly 0
        obs, r, done, _, info = env.step(follow_the_rule(obs, env.action_masks()))
        total += r
    assert total == pytest.approx(0.0, abs=1e-9) and not env.ctl.departed
    tp = problems[env.index]  # the rule's own run on that problem and noise: the same net value
    assert run_once(tp, ConfirmController(rule_config(tp)), env.noise_seed).net_value == pytest.approx(
        info["net_value"], abs=1e-9)
    env.reset(seed=2)
    _, r, done, _, info = env.step(STOP)
    assert done and r == pytest.approx(info["net_value"] - info["rule"])


def test_a_larger_pay_factor_never_runs_more_jobs(problems):
    for tp in problems[:3]:
        base = run_once(tp, ConfirmController(rule_config(tp)), 0)
        strict = run_once(tp, ConfirmController(rule_config(tp, pay_factor=8.0)), 0)
        assert strict.jobs <= base.jobs
    with pytest.raises(ConfigError, match="confirm.pay_factor"):
        ConfirmController(replace(ConfirmConfig(), pay_factor=0.0))


def test_a_saved_stopper_loads_and_acts_the_same(tmp_path):
    rng = np.random.default_rng(0)
    layers = [(rng.normal(size=(N_FEATURES, 8)), rng.normal(size=8)), (rng.normal(size=(8, len(ACTIONS))),
                                                                        rng.normal(size=len(ACTIONS)))]
    p = PolicyStopper(layers, {"note": "test"})
    path = p.save(tmp_path / "s.json")
    q = PolicyStopper.load(path)
    x, m = rng.normal(size=N_FEATURES), np.array([True, False, True, True])
    assert q(x, m) == p(x, m) and m[q(x, m)]
    with pytest.raises(ConfigError, match="stopper"):
        PolicyStopper([(rng.normal(size=(3, 8)), rng.normal(size=8))] + layers[1:], {})


def test_finetune_runs_a_stopping_agent_from_its_json_on_the_shipped_recording(tmp_path):
    import json

    from ncclrl.runners.finetune import parse_args, run_finetune

    rng = np.random.default_rng(1)
    layers = [(rng.normal(size=(N_FEATURES, 8)), rng.normal(size=8)),
              (rng.normal(size=(8, len(ACTIONS))), rng.normal(size=len(ACTIONS)))]
    path = PolicyStopper(layers, {"note": "random weights"}).save(tmp_path / "stopper.json")
    args = parse_args(["backend=replay", "topology=h200-2x2-sock", f"strategy={path}", "budget=0.5sweep",
                       f"store={tmp_path / 'ft.sqlite'}", f"out={tmp_path / 'out'}"])
    summary = run_finetune(args)
    assert summary["gpu_s"] <= summary["budget_gpu_s"] * (1 + 1e-9) and summary["jobs"] >= 1
    info = json.loads((tmp_path / "out" / "finetune.json").read_text())
    assert info["provenance"]["strategy"] == str(path) and info["provenance"]["strategy_sha256"]
    assert summary["sizes_slower_on_sweep"] == 0


def test_finetune_runs_the_installed_stopping_agent(tmp_path):
    from ncclrl.runners.finetune import parse_args, run_finetune

    args = parse_args(["backend=replay", "topology=h200-2x2-sock", "strategy=confirm-ppo", "budget=0.5sweep",
                       f"store={tmp_path / 'ft.sqlite'}", f"out={tmp_path / 'out'}"])
    summary = run_finetune(args)
    assert summary["gpu_s"] <= summary["budget_gpu_s"] * (1 + 1e-9) and summary["jobs"] >= 1
    assert summary["sizes_slower_on_sweep"] == 0
    assert PolicyStopper.load().meta["train"]["seed"] == 0
