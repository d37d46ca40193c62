"""A fine-tuning decision step's time: per round of a tuning run, the model's refit and the
decision (``Search.refit``), and per pick, the shortlist's features and the strategy's scores
(``Search.observe`` + the controller), on the recorded h200-2x2-sock sweep replayed (14 knob
settings x 26 sizes, 4,876 points) and on a 16-node simulated platform.

    python benchmarks/bench_strategy.py [--budget 250] [--strategy shipped]

Pins BLAS/OpenMP to one thread; prints the median and the worst of each, in milliseconds.
"""

from __future__ import annotations

import os

for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(var, "1")

import argparse  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402

from ncclrl.agents.problem import Evaluator  # noqa: E402
from ncclrl.agents.search import PolicyController, Search, SearchConfig, strategy_path  # noqa: E402
from ncclrl.agents.suite import replayed, simulated  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--budget", type=int, default=250)
    ap.add_argument("--strategy", default="shipped")
    a = ap.parse_args()
    ctl = PolicyController.load(strategy_path(a.strategy))
    cases = [("h200-2x2-sock replay", replayed("data/h200x4-2026-11-21/store.sqlite", "h200-2x2-sock", "nccl",
                                               "allreduce")),
             ("dgx-h100-16n simulated", simulated("dgx-h100-16n", 0, "allreduce", 1, False, 8, 1 << 30))]
    print(f"{'problem':<24} {'points':>7} {'refit+decide ms (median/max)':>30} {'pick ms (median/max)':>22}")
    for name, inst in cases:
        s = Search(inst.problem, Evaluator(inst.problem, inst.measure_for(0), a.budget), ctl, SearchConfig())
        refit, pick = [], []
        orig = s.refit

        def timed_refit(orig=orig, refit=refit):
            t0 = time.perf_counter()
            orig()
            refit.append(time.perf_counter() - t0)

        s.refit = timed_refit
        s.start()
        while s.ev.remaining - len(s.pending) > 0:
            t0 = time.perf_counter()
            short, f = s.observe()
            if not len(short):
                break
            choice = int(np.argmax(ctl.scores(f)))
            pick.append(time.perf_counter() - t0)
            if not s.act(choice):
                break
        s.flush()
        r, p = 1e3 * np.array(refit), 1e3 * np.array(pick)
        print(f"{name:<24} {s.space.size:>7} {np.median(r):>14.1f} / {r.max():>6.1f}      "
              f"{np.median(p):>9.2f} / {p.max():>6.2f}")


if __name__ == "__main__":
    main()
