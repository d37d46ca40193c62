"""ncclrl in the benchmark: the zero-shot table (the prior's exact argmin, no measurement) and
tuning runs (:class:`ncclrl.agents.search.Search`) that differ only in what picks the next point:
the learned strategy (``ncclrl``), the model's ranking (``rank``: the learner removed),
expected improvement (``bo``: Bayesian optimization with the same prior and model), and the same
per GPU-second the measurement costs (``ei-per-s``, ``ucb-per-s``: cost-aware Bayesian optimization),
whole jobs composed by expected improvement per GPU-second (``jobs``), a screen, confirmation of
its leaders and knob settings explored with what is left (``confirm``, finetune's default), and whole jobs chosen by a
job composer (:mod:`ncclrl.agents.compose`) following the run: the shipped PPO composer (``ppo``) and
knowledge gradient per GPU-second (``kg-jobs``), each weighing a job against 100 sweeps' GPU-time
served."""

from __future__ import annotations

from collections.abc import Callable

from ncclrl.agents.compose import Composer, ComposerController, PerSecond
from ncclrl.agents.problem import Decision, Evaluator, Problem
from ncclrl.agents.search import (
    ConfirmController,
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
    """The exact argmin of the problem's prior (:func:`ncclrl.agents.search.zero_shot`); measures nothing."""

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
        fresh = getattr(self.controller, "fresh", None)  # a controller that keeps a run's state: a new one per run
        return Search(problem, ev, fresh() if fresh else self.controller, self.search).run().decision


def search_tuner(name: str, strategy: PolicyController | None = None,
                 search: SearchConfig | None = None) -> SearchTuner:
    """``ncclrl`` (needs ``strategy``), ``rank``, ``bo``, ``ei-per-s``, ``ucb-per-s``, ``jobs`` or
    ``confirm`` (screen, confirm, then explore: finetune's default)."""
    ctl = {"rank": RankController, "bo": EIController, "ei-per-s": lambda: PerGpuSecondController("ei"),
           "ucb-per-s": lambda: PerGpuSecondController("ucb"), "jobs": JobController,
           "confirm": ConfirmController}.get(name)
    return SearchTuner(ctl() if ctl else strategy, name, search)


#: the served GPU-time a composer in the benchmark weighs each job against, in full sweeps
BENCHMARK_SERVE_SWEEPS = 100.0


class ComposerTuner:
    """A tuning run whose jobs a composer picks (:class:`ncclrl.agents.compose.ComposerController`),
    a fresh one per run.

    :param make: makes the composer
    :param name: the method's name in the benchmark
    :param serve_sweeps: served GPU-time, in full sweeps' predicted GPU-time
    :param search: the run's settings
    """

    def __init__(self, make: Callable[[], Composer], name: str, serve_sweeps: float = BENCHMARK_SERVE_SWEEPS,
                 search: SearchConfig | None = None) -> None:
        self.make, self.name, self.serve_sweeps, self.search = make, name, serve_sweeps, search or SearchConfig()

    def tune(self, problem: Problem, ev: Evaluator, seed: int) -> Decision:
        ctl = ComposerController(self.make(), serve_sweeps=self.serve_sweeps)
        return Search(problem, ev, ctl, self.search).run().decision


def composer_tuner(name: str, search: SearchConfig | None = None) -> ComposerTuner:
    """``ppo`` (the shipped composer) or ``kg-jobs`` (knowledge gradient per GPU-second)."""
    if name == "ppo":
        from ncclrl.agents.compose_train import PolicyComposer, composer_path

        pol = PolicyComposer.load(composer_path("shipped"))
        return ComposerTuner(lambda: pol, name, search=search)
    return ComposerTuner(lambda: PerSecond("kg"), name, search=search)
