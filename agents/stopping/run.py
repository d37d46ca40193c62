"""One tuning run of a problem with its truth, judged by net value; the problems runs are played on."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Protocol

import numpy as np

from ncclrl.agents.problem import Evaluator, Measure, Oracle, Problem, platform_measure, predicted_sweep_gpu_s
from ncclrl.agents.search import Search, SearchConfig
from ncclrl.agents.search.confirm import ConfirmConfig, ConfirmController


class TuningProblem(Protocol):
    """A problem with its truth, its budget and the GPU-time its table serves (the calibrated
    generator's problems, :mod:`ncclrl.agents.generator`, and the replays below)."""

    problem: Problem
    oracle: Oracle
    calls: np.ndarray
    budget_gpu_s: float
    serve_gpu_s: float
    name: str
    family: str

    def measure(self, seed: int) -> Measure: ...


@dataclass
class SimulatedProblem:
    """A problem of the uncalibrated generator (:func:`ncclrl.agents.compose.draw_full`): a simulated
    platform measures it."""

    problem: Problem
    oracle: Oracle
    calls: np.ndarray
    budget_gpu_s: float
    serve_gpu_s: float
    name: str
    family: str
    platform: Any
    key: int = 0

    def measure(self, seed: int) -> Measure:
        return platform_measure(self.platform, np.random.default_rng([self.key, int(seed), 5]))

    @classmethod
    def draw(cls, stream: int, i: int, draw=None) -> SimulatedProblem:
        from ncclrl.agents.compose import Draw, draw_full

        problem, oracle, plat, cp = draw_full(np.random.default_rng([stream, i]), draw or Draw())
        return cls(problem, oracle, cp.calls, cp.budget_gpu_s, cp.serve_gpu_s, cp.name, cp.family, plat,
                   cp.noise_key)


@dataclass
class ReplayProblem:
    """A recorded sweep or grid (:class:`ncclrl.agents.suite.Instance`) at a budget and horizon, in
    full sweeps' GPU-time on its truth; each seed draws fresh job noise around the truth."""

    instance: Any
    budget_sweeps: float
    horizon_sweeps: float

    def __post_init__(self) -> None:
        inst = self.instance
        self.problem, self.oracle, self.family = inst.problem, inst.oracle, inst.family
        c = self.problem.colls[0]
        sizes = self.problem.sizes[c]
        w = self.problem.weights
        self.calls = np.array([w.get((c, s), 1.0) for s in sizes]) if w else np.ones(len(sizes))
        sweep = self.oracle.sweep_gpu_s(Evaluator(self.problem, None, 1.0).cost, 5)
        self.budget_gpu_s = self.budget_sweeps * sweep
        self.serve_gpu_s = self.horizon_sweeps * sweep
        self.name = f"{getattr(inst, 'name', '') or self.problem.topo.name}"

    def measure(self, seed: int) -> Measure:
        return self.instance.measure_for(int(seed))


@dataclass
class RunResult:
    """How one run ended, judged on the problem's truth."""

    net_value: float  # points: 100 x (saved - spent / served)
    saved_pct: float  # of the step's communication time, calls-weighted, at the truth
    spent_pct: float  # tuning GPU-time in percent of the served GPU-time
    gpu_s: float
    jobs: int
    slower: int  # sizes more than 1% slower than NCCL's plain default
    knob: int
    rows: int
    reason: str
    choices: str = ""


def horizon_sweeps(tp: TuningProblem) -> float:
    """The problem's served GPU-time in the prior's predicted sweeps (what ``horizon=`` is in finetune)."""
    ev = Evaluator(tp.problem, None, 1.0)
    return tp.serve_gpu_s / predicted_sweep_gpu_s(tp.problem, ev.samples, ev.cost)


def rule_config(tp: TuningProblem, pay_factor: float = 1.0, base: ConfirmConfig | None = None) -> ConfirmConfig:
    """finetune's default settings with the problem's horizon (and a pay factor)."""
    return replace(base or ConfirmConfig(), horizon_sweeps=horizon_sweeps(tp), pay_factor=pay_factor)


def judge(tp: TuningProblem, search: Search, reason: str, choices: str = "") -> RunResult:
    """The run's table on the truth: net value, saved share, sizes slower."""
    t = search.table
    d = search.space.decision(t.knob, t.rows)
    c = tp.problem.colls[0]
    times = tp.oracle.time_of(d, c)
    base = tp.oracle.base[c]
    saved = 1.0 - float(np.dot(tp.calls, times)) / float(np.dot(tp.calls, base))
    spent = search.ev.gpu_s / tp.serve_gpu_s
    return RunResult(100 * (saved - spent), 100 * saved, 100 * spent, float(search.ev.gpu_s), int(search.ev.calls),
                     int((times > 1.01 * base).sum()), int(t.knob), len(t.rows), reason, choices)


def run_once(tp: TuningProblem, controller: ConfirmController, seed: int) -> RunResult:
    """One run of ``controller`` on ``tp`` with job-noise seed ``seed`` (the same seed: the same
    noise for every controller on this problem; each problem draws its own)."""
    ev = Evaluator(tp.problem, tp.measure(seed), tp.budget_gpu_s)
    search = Search(tp.problem, ev, controller, SearchConfig())
    res = search.run_jobs()
    choices = "".join("scCe"[a] for a in getattr(controller, "choices", []))
    return judge(tp, search, res.reason, choices)
