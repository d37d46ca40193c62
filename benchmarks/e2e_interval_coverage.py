"""How often does ``ncclrl e2e`` call a tie a win? The ratio's interval, judged on simulated
A/A runs (both sides the same) and on runs with a true difference.

Each simulated run has ``rounds`` jobs per side in ``e2e``'s order (default, table, table,
default, ...). A job's step times are ``exp(drift(t) + job + step)``: a machine drift that moves
linearly over the run, a per-job offset (normal, ``job_sd``: clocks, placement, allocator), and
per-step noise (normal, ``step_sd``) with 5% of steps 1.5-3x slower (outliers). The table side is
``effect`` times the default. For each method, over ``--reps`` runs, it prints how often the
verdict is ``faster`` or ``slower`` (A/A: the false verdict rate, target <= 5%; with an effect: the
power).

Methods:

* ``bootstrap``: the hierarchical bootstrap (jobs, then steps within a job) of the ratio of medians;
* ``paired-t``: a t interval (df = rounds - 1) of the mean over rounds of the log ratio of the two
  jobs of one round (each job's median step), exponentiated.

    python benchmarks/e2e_interval_coverage.py --reps 300
"""

from __future__ import annotations

import argparse
import itertools

import numpy as np

from ncclrl.runners import e2e


def simulate(rng: np.random.Generator, rounds: int, steps: int, job_sd: float, step_sd: float, drift: float,
             effect: float) -> tuple[list[np.ndarray], list[np.ndarray]]:
    order = e2e.job_order(rounds)
    sides: dict[str, list[np.ndarray]] = {"default": [], "table": []}
    for n, side in enumerate(order):
        level = drift * n / max(1, len(order) - 1) + rng.normal(0.0, job_sd)
        t = np.exp(level + rng.normal(0.0, step_sd, steps)) * 10.0
        slow = rng.random(steps) < 0.05
        t[slow] *= rng.uniform(1.5, 3.0, slow.sum())
        if side == "table":
            t *= effect
        sides[side].append(t)
    return sides["default"], sides["table"]


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    p.add_argument("--reps", type=int, default=300)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)
    print("| rounds | job_sd | drift | effect | method | faster | slower | tie |")
    print("|---|---|---|---|---|---|---|---|")
    for rounds, job_sd, drift, effect in itertools.product((3, 5, 8), (0.02, 0.08), (0.0, 0.1), (1.0, 0.9)):
        rng = np.random.default_rng(a.seed)
        counts = {m: {"faster": 0, "slower": 0, "tie": 0} for m in e2e.RATIO_METHODS}
        for _ in range(a.reps):
            d, t = simulate(rng, rounds, a.steps, job_sd, 0.03, drift, effect)
            for m in e2e.RATIO_METHODS:
                counts[m][e2e.summarize(d, t, method=m, n_boot=400)["verdict"]] += 1
        for m, c in counts.items():
            print(f"| {rounds} | {job_sd} | {drift} | {effect} | {m} | {c['faster'] / a.reps:.3f} | "
                  f"{c['slower'] / a.reps:.3f} | {c['tie'] / a.reps:.3f} |")


if __name__ == "__main__":
    main()
