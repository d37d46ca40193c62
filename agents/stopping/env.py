"""The stopping agent's environment (``ncclrl/ConfirmStop-v0``).

Description
    One episode is one finetune run (:class:`StopController`, the full run) on a problem drawn from
    a pool, with a fresh job-noise seed. The default run's first screen is the rule's; before every
    later job the agent chooses among stop, confirm, confirm x4 and explore.
Action space
    ``Discrete(4)`` (:data:`ACTIONS`), with :meth:`ConfirmStopEnv.action_masks` (sb3-contrib's
    MaskablePPO): stop is always valid; the others where the budget left pays for their job.
Observation space
    ``Box(-inf, inf, (N_FEATURES,))``: :data:`FEATURES`.
Rewards
    0 until the run ends; then its net value (points) minus the rule's (the default
    :class:`ConfirmController`) on the same problem and noise seed (0 without a run of the rule
    where every choice was the rule's: the run is then the rule's).
Episode end
    The agent stops, or no job is left (budget, leaders, knob settings).
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

from ncclrl.agents.problem import Evaluator
from ncclrl.agents.search import Search, SearchConfig
from ncclrl.agents.search.confirm import ConfirmController
from ncclrl.agents.stopping.controller import ACTIONS, N_FEATURES, STOP, StopController
from ncclrl.agents.stopping.run import TuningProblem, judge, rule_config, run_once


class ConfirmStopEnv(gym.Env):
    """See the module's docs.

    :param problems: the pool episodes draw from (uniformly)
    :param paired: subtract the rule's net value on the same problem and noise at the end
    """

    metadata: dict[str, Any] = {"render_modes": []}

    def __init__(self, problems: list[TuningProblem], paired: bool = True) -> None:
        if not problems:
            raise ValueError("problems: at least one")
        self.problems, self.paired = problems, paired
        self.observation_space = gym.spaces.Box(-np.inf, np.inf, (N_FEATURES,), np.float64)
        self.action_space = gym.spaces.Discrete(len(ACTIONS))
        self._mask = np.ones(len(ACTIONS), dtype=bool)
        self.index, self.noise_seed = 0, 0

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        # a run where the agent never acts (the rule declined, the screen found nothing) teaches nothing
        for _ in range(50):
            self.index = int(self.np_random.integers(len(self.problems)))
            self.noise_seed = int(self.np_random.integers(1 << 31))
            tp = self.problems[self.index]
            self.ctl = StopController(rule_config(tp))
            self.search = Search(tp.problem, Evaluator(tp.problem, tp.measure(self.noise_seed), tp.budget_gpu_s),
                                 self.ctl, SearchConfig())
            self.reason = ""
            obs = self._advance()
            if not self.reason:
                break
        return obs, {}

    def _advance(self) -> np.ndarray:
        """Run jobs until the policy's next choice is due or the run has ended (:attr:`reason` set)."""
        s, ctl = self.search, self.ctl
        while True:
            if s.ev.remaining <= 0:
                self.reason = s.ev.stop_reason or "budget spent"
                return np.zeros(N_FEATURES)
            if ctl.decision_due(s):
                obs, self._mask = ctl.observe(s)
                if self._mask[STOP + 1:].any():
                    return obs
                self.reason = "nothing left to run"
                return obs
            job = ctl.next_job(s)
            if not job:
                self.reason = ctl.stop_reason or "the rule stopped"
                return np.zeros(N_FEATURES)
            s.pending = job
            s.flush()

    def action_masks(self) -> np.ndarray:
        return self._mask.copy()

    def step(self, action: int):
        s, ctl = self.search, self.ctl
        if not self.reason:
            ctl.action = int(action)
            job = ctl.next_job(s)
            if job:
                s.pending = job
                s.flush()
                obs = self._advance()
            else:
                self.reason, obs = ctl.stop_reason, np.zeros(N_FEATURES)
        else:
            obs = np.zeros(N_FEATURES)
        if not self.reason:
            return obs, 0.0, False, False, {}
        tp = self.problems[self.index]
        mine = judge(tp, s, self.reason)
        info: dict[str, Any] = {"net_value": mine.net_value}
        reward = mine.net_value
        if self.paired:
            # a run that took the rule's choice every time is the rule's run (the same noise seed)
            ref = run_once(tp, ConfirmController(rule_config(tp)), self.noise_seed).net_value if ctl.departed \
                else mine.net_value
            info["rule"] = ref
            reward -= ref
        return obs, float(reward), True, False, info


if "ncclrl/ConfirmStop-v0" not in gym.registry:
    gym.register(id="ncclrl/ConfirmStop-v0", entry_point="ncclrl.agents.stopping.env:ConfirmStopEnv")
