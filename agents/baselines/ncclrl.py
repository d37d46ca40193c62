"""ncclrl in the benchmark: the zero-shot table (the prior's exact argmin, no measurement) and
tuning runs (:class:`ncclrl.agents.strategy.Search`) that differ only in what picks the next point:
the learned strategy (``ncclrl``), the model's ranking (``rank``: the learner removed),
expected improvement (``bo``: Bayesian optimization with the same prior and model), and the same
per GPU-second the measurement costs (``ei-per-s``, ``ucb-per-s``: cost-aware Bayesian optimization),
and whole jobs composed by expected improvement per GPU-second (``jobs``)."""

from __future__ import annotations

from ncclrl.agents.problem import Decision, Evaluator, Problem
from ncclrl.agents.strategy import (
    Controller,
    EIController,
    JobController,
    PerGpuSecondController,
    PolicyController,
    RankController,
    Search,
    SearchConfig,
    Space,
    zero_shot,
)


class ZeroShot:
    """The exact argmin of the problem's prior (:func:`ncclrl.agents.strategy.zero_shot`); measures nothing."""

    name = "zero-shot"

    def tune(self, problem: Problem, ev: Evaluator, seed: int) -> Decision:
        space = Space(problem)
        ev.count_model(space.size)
        t = zero_shot(space)
        return space.decision(t.knob, t.rows)


class SearchTuner:
    """A tuning run of ``controller`` under the evaluator's budget.

    :param controller: what picks the next point
    :param name: the method's name in the benchmark
    :param search: the run's settings
    """

    def __init__(self, controller: Controller, name: str, search: SearchConfig | None = None) -> None:
        self.controller, self.name, self.search = controller, name, search or SearchConfig()

    def tune(self, problem: Problem, ev: Evaluator, seed: int) -> Decision:
        return Search(problem, ev, self.controller, self.search).run().decision


def search_tuner(name: str, strategy: PolicyController | None = None,
                 search: SearchConfig | None = None) -> SearchTuner:
    """``ncclrl`` (needs ``strategy``), ``rank``, ``bo``, ``ei-per-s``, ``ucb-per-s`` or ``jobs``."""
    ctl = {"rank": RankController, "bo": EIController, "ei-per-s": lambda: PerGpuSecondController("ei"),
           "ucb-per-s": lambda: PerGpuSecondController("ucb"), "jobs": JobController}.get(name)
    return SearchTuner(ctl() if ctl else strategy, name, search)
