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
    configuration per size has the best geometric-mean speedup over NCCL's measured plain default
    (a size with nothing measured under the setting counts as no change), with per size its best
    measured configuration as the row, where that beats NCCL's choice under the setting (or NCCL's
    choice was not measured)."""
    best_conf, best_score, best_rows = problem.base, -np.inf, {}
    for k in problem.knobs:
        score, rows, seen = 0.0, {}, False
        for c, s in problem.cells():
            got = {key: m for key in problem.space(c, k) if (m := ev.measured(k, c, s, key)) is not None}
            if not got:
                continue
            seen = True
            key = min(got, key=got.get)
            if key != DEFAULT:
                rows[(c, s)] = key
            ref = ev.measured(problem.base, c, s, DEFAULT)
            if ref:
                score += float(np.log(ref / got[key]))
        if (seen or k is problem.base) and score > best_score + 1e-12:
            best_conf, best_score, best_rows = k, score, rows
    return Decision(best_conf, best_rows)


