"""What every tuner of the benchmark shares besides the problem and the evaluator
(:mod:`ncclrl.agents.problem`): the tuner interface, NCCL's defaults measured first, and the table a
black-box tuner's measurements support."""

from __future__ import annotations

from typing import Protocol

import numpy as np

from ncclrl.agents.problem import (  # noqa: F401  (the tuners' vocabulary, in one place)
    BudgetExhausted,
    Decision,
    Evaluator,
    Measure,
    Oracle,
    Problem,
    Verdict,
    platform_measure,
    replay_measure,
    sim_measure,
)
from ncclrl.costmodel.space import DEFAULT, Key, Point  # noqa: F401


class Tuner(Protocol):
    """A tuner: spends at most the evaluator's budget, returns a decision."""

    name: str

    def tune(self, problem: Problem, ev: Evaluator, seed: int) -> Decision: ...


# -- shared steps ------------------------------------------------------------------------------

def measure_defaults(problem: Problem, ev: Evaluator) -> None:
    """NCCL's plain defaults at every size (the reference each tuner compares against)."""
    todo = [(c, s, DEFAULT) for c, s in problem.cells() if ev.measured(problem.base, c, s, DEFAULT) is None]
    if todo and ev.remaining > 0:
        ev.evaluate(problem.base, todo)


def assemble(problem: Problem, ev: Evaluator) -> Decision:
    """The table a black-box tuner's measurements support: the knob setting whose best measured
    configuration per size gains most over NCCL's measured plain default in the problem's objective
    (:meth:`Problem.log_gain`: geometric mean over sizes, or the step's communication time with
    weights; a size with nothing measured under the setting counts as no change), with per size its
    best measured configuration as the row, where that beats NCCL's choice under the setting (or
    NCCL's choice was not measured)."""
    cells = problem.cells()
    refs = np.array([ev.measured(problem.base, c, s, DEFAULT) or np.nan for c, s in cells])
    known = np.isfinite(refs)
    best_conf, best_score, best_rows = problem.base, -np.inf, {}
    for k in problem.knobs:
        rows, seen, t = {}, False, refs.copy()
        for i, (c, s) in enumerate(cells):
            got = {key: m for key in problem.space(c, k) if (m := ev.measured(k, c, s, key)) is not None}
            if not got:
                continue
            seen = True
            key = min(got, key=got.get)
            if key != DEFAULT:
                rows[(c, s)] = key
            t[i] = got[key]
        score = problem.log_gain(refs, t, where=known)
        if (seen or k is problem.base) and score > best_score + 1e-12:
            best_conf, best_score, best_rows = k, score, rows
    return Decision(best_conf, best_rows)


