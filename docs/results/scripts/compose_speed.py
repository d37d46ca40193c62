"""Time one decision of the shipped composer (observation + network, numpy) after a run's first
job, on 10 judged problems (seed stream 2), 20 decisions each.

    python docs/results/scripts/compose_speed.py
"""

from __future__ import annotations

import time

import numpy as np

from ncclrl.agents.compose import FIRST, ComposeRun, draw_problems
from ncclrl.agents.compose_train import PolicyComposer, composer_path


def main() -> None:
    pol = PolicyComposer.load(composer_path("shipped"))
    per = []
    for p in draw_problems(10, 2):
        run = ComposeRun(p, np.random.default_rng(0))
        run.step(FIRST)
        t0 = time.perf_counter()
        for _ in range(20):
            pol.act(run)
        per.append((time.perf_counter() - t0) / 20)
    print(f"ms per decision: median {1000 * np.median(per):.2f}, max {1000 * max(per):.2f}")


if __name__ == "__main__":
    main()
