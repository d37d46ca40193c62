"""The stopping agent's controller: finetune's default run (:class:`ConfirmController`) whose every
job after the first screen is chosen by a policy among stop, confirm, confirm with more repeats and
explore (docs/explanation/stopping.md)."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from ncclrl.agents.search.confirm import ConfirmConfig, ConfirmController, Phase

#: the agent's choices, in action order
ACTIONS = ("stop", "confirm", "confirm x4", "explore")
STOP, CONFIRM, CONFIRM_X4, EXPLORE = range(len(ACTIONS))
#: timed calls per point of a confirmation job, per confirming action
REPEATS = {CONFIRM: 2, CONFIRM_X4: 4}

#: what the agent observes, in order (all read from a live run's state)
FEATURES = (
    "log10 horizon in predicted sweeps", "spent / budget", "log2 (1 + confirmation jobs the budget left pays)",
    "spent / horizon x 100", "rule: stop", "rule: confirm", "rule: explore",
    "confirmation job possible", "log (value / cost) of the next confirmation job / 5", "sizes with open leaders / 10",
    "confirmation jobs asked / their limit", "knob job possible", "log (value / cost) of the next knob job / 5",
    "a knob setting in its pairs", "its pairs / 10", "its measured gain x 10", "its p-value",
    "knob settings left / all", "the table's measured gain x 10", "sizes confirmed / sizes",
    "leaders refuted / leaders",
    "the screen's open gain x 10",
)
N_FEATURES = len(FEATURES)

Policy = Callable[[np.ndarray, np.ndarray], int]


def _lr(value: float, cost: float) -> float:
    """log(value / cost), clipped to [-5, 5], over 5."""
    return float(np.clip(math.log(max(value, 1e-9) / max(cost, 1e-9)), -5.0, 5.0)) / 5.0


class StopController(ConfirmController):
    """:class:`ConfirmController` with a policy choosing each job after the first screen.

    :param cfg: the run's settings (the horizon included)
    :param policy: ``(observation, mask) -> action`` (:data:`ACTIONS`); ``None``: the action is set
        from outside before each :meth:`next_job` (:attr:`action`, as a training environment does)
    """

    name = "ppo"

    def __init__(self, cfg: ConfirmConfig | None = None, policy: Policy | None = None) -> None:
        super().__init__(cfg)
        self.policy = policy
        self.action: int | None = None
        self.choices: list[int] = []  # the actions taken, in order
        self.departed = False  # whether an action differed from the rule's choice (else the run is the rule's)
        self.rule_choice = STOP

    def fresh(self) -> StopController:
        return StopController(self.cfg, self.policy)

    # -- when the policy acts ----------------------------------------------------------------------
    def decision_due(self, search) -> bool:
        """Whether the next job is the policy's: the first screen has run."""
        return bool(self.phases) and self.phases[0].screen > 0

    def _mid_pairs(self) -> Phase | None:
        ph = self.phases[-1]
        return ph if ph.knob and ph.screen and not ph.verdict else None

    def observe(self, search) -> tuple[np.ndarray, np.ndarray]:
        """The observation (:data:`FEATURES`) and the mask of valid actions, before the next job."""
        cfg, sp, ev = self.cfg, search.space, search.ev
        base = self.phases[0]
        horizon = self._horizon_gpu_s(search)
        x = np.zeros(N_FEATURES)
        mask = np.zeros(len(ACTIONS), dtype=bool)
        mask[STOP] = True
        x[0] = math.log10(max(cfg.horizon_sweeps, 1e-3)) / 2
        x[1] = ev.gpu_s / max(ev.budget, 1e-9)
        x[3] = 100 * ev.gpu_s / max(horizon, 1e-9)
        # the next confirmation job, before the horizon is weighed
        c_idx, c_value, c_cost = [], 0.0, 0.0
        if base.asked < cfg.max_confirm_jobs:
            c_idx, c_value, _ = self.confirm_plan(search, base, mark=False)
        if c_idx:
            c_cost = self._cost(search, c_idx, REPEATS[CONFIRM])
            mask[CONFIRM] = True
            mask[CONFIRM_X4] = self._cost(search, c_idx, REPEATS[CONFIRM_X4]) <= ev.remaining
            x[2] = math.log2(1 + ev.remaining / max(c_cost, 1e-9)) / 4
            x[7] = 1.0
            x[8] = _lr((1 - math.exp(-c_value)) * horizon, c_cost)
        open_sizes = sum(1 for ls in base.leaders.values() if any(i not in base.decided for i in ls))
        x[9] = open_sizes / 10
        x[10] = base.asked / cfg.max_confirm_jobs
        # the next knob job: the pairs of the setting under test, or a new setting's screen
        mid = self._mid_pairs()
        k_value, k_cost, k_pays = 0.0, 0.0, False
        if mid is not None:
            n = len(self._pair_diffs(search, mid))
            ev_k = self.knob_evidence.get(str(mid.knob), {})
            gain = math.log(ev_k.get("gain", 1.0))
            k_cost = self._cost(search, sorted(set(mid.table.values())), cfg.confirm_samples)
            k_value = (1 - math.exp(-max(gain, 0.0))) * horizon * 0.5
            mask[EXPLORE] = 2 * k_cost <= ev.remaining
            k_pays = True  # the rule finishes a setting it started
            x[13], x[14], x[15], x[16] = 1.0, n / 10, float(np.clip(10 * gain, -5, 5)), ev_k.get("p_value", 1.0)
        elif cfg.explore and sp.n_knobs > 1:
            plan = self.explore_plan(search)
            if not isinstance(plan, str):
                _, _, k_cost, k_value = plan
                mask[EXPLORE] = k_cost <= ev.remaining
                k_pays = mask[EXPLORE] and k_value >= cfg.pay_factor * k_cost and not self._explored
        if mask[EXPLORE]:
            x[11] = 1.0
            x[12] = _lr(k_value, k_cost)
        tried = {p.knob for p in self.phases}
        x[17] = (sp.n_knobs - len(tried)) / max(sp.n_knobs - 1, 1) if sp.n_knobs > 1 else 0.0
        x[18] = float(np.clip(10 * self._table_gain(search, base), -5, 5))
        x[19] = len(self._rows_of(search, base)) / sp.n_cells
        n_lead = sum(len(ls) for ls in base.leaders.values())
        x[20] = sum(1 for v in base.decided.values() if v == "refuted") / max(n_lead, 1)
        sens = sp.sensitivity(search.model.mean[sp.default[: sp.n_cells]])
        jobs = self._jobs_of(search)
        open_gain = 0.0
        for c, ls in base.leaders.items():
            d = int(sp.default[c])
            got = [math.log(jobs[d][base.screen]) - math.log(jobs[i][base.screen]) for i in ls
                   if i not in base.decided and base.screen in jobs.get(i, {}) and base.screen in jobs.get(d, {})]
            if got:
                open_gain += sens[c] * max(got)
        x[21] = float(np.clip(10 * open_gain, -5, 5))
        # what the rule would run now
        if k_pays or mid is not None:
            rule = EXPLORE
        elif c_idx and (1 - math.exp(-c_value)) * horizon >= cfg.pay_factor * c_cost:
            rule = CONFIRM
        else:
            rule = STOP
        x[4 + (STOP, CONFIRM, EXPLORE).index(rule)] = 1.0
        self.rule_choice = rule
        return x, mask

    # -- the jobs ----------------------------------------------------------------------------------
    def next_job(self, search) -> list[int]:
        if not self.decision_due(search):
            return super().next_job(search)  # the first screen (or the rule's refusal to start) is the rule's
        self._record(search)
        self.stop_reason = ""
        obs, mask = self.observe(search)
        a = int(self.action if self.policy is None else self.policy(obs, mask))
        self.action = None
        if not 0 <= a < len(ACTIONS) or not mask[a]:
            a = STOP
        self.choices.append(a)
        self.departed |= a != self.rule_choice
        base = self.phases[0]
        if a == EXPLORE:
            job = self._explore(search, pay=False)
            if job:
                return job
        elif a in REPEATS:
            mid = self._mid_pairs()
            if mid is not None:
                mid.verdict = "refused: left for confirmation before its pairs were done"
            job = self._confirm_points(search, base, pay=False)
            if job:
                base.asked += 1
                return self._ask(search, "confirm", 0, job, REPEATS[a])
        if not self.stop_reason:
            self.stop_reason = ("the policy stopped" if a == STOP
                                else f"the policy's {ACTIONS[a]} job found nothing to run")
        return []
