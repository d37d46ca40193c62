"""Check A2 of docs/explanation/composer.md: each baseline composer's stop factor (and UCB's beta)
chosen on training problems (seed stream 1), then judged on the experiment's 300 problems x 5 noise
draws (seed stream 2) beside the agents' results there (paired by problem and draw).

    python docs/results/scripts/compose_tuned_baselines.py EXPERIMENT_DIR [--choose N] [--judge N] [--draws N]
        [--shape B,C]

With ``--shape 4,1`` (check A3) EI, UCB and KG per GPU-second compose only jobs of every band with the
leading candidate per size, and the result goes to shape-baselines.md.
"""

from __future__ import annotations

import argparse
import itertools
import multiprocessing as mp
import sys
from pathlib import Path

import pandas as pd

from ncclrl.agents.compose import PerSecond, SweepRace, ci95, draw_problems, play

FACTORS = (0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0)
BETAS = (0.5, 1.0, 2.0)


SHAPE: tuple[int, int] | None = None  # --shape: every baseline only composes jobs of this (band, candidates)


def make(name: str, factor: float, beta: float):
    if name == "sweep-race":
        return SweepRace(stop_factor=factor)
    return PerSecond(name.split("/")[0], beta=beta, stop_factor=factor, shape=SHAPE)


def settings() -> list[tuple[str, float, float]]:
    out = []
    for name in ("ei/s", "kg/s") if SHAPE else ("ei/s", "kg/s", "sweep-race"):
        out += [(name, f, 2.0) for f in FACTORS]
    out += [("ucb/s", f, b) for f, b in itertools.product(FACTORS, BETAS)]
    return out


def _score(args: tuple[int, int, int, int, list[tuple[str, float, float]], tuple | None]) -> list[dict]:
    global SHAPE
    stream, n, draws, part, todo, SHAPE = args
    problems = draw_problems(n, stream)
    rows = []
    for i in range(part, n, 2):
        for d in range(draws):
            for name, f, b in todo:
                o = play(problems[i], make(name, f, b), d)
                rows.append({"method": name, "factor": f, "beta": b, "problem_id": i, "seed": d,
                             "net_value": o.net_value, "slower": o.slower, "jobs": o.jobs})
    return rows


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("experiment")
    ap.add_argument("--choose", type=int, default=150)
    ap.add_argument("--judge", type=int, default=300)
    ap.add_argument("--draws", type=int, default=5)
    ap.add_argument("--shape", default="", help="BAND,CANDIDATES: the baselines compose only such jobs (4,1: every "
                    "band, the leading candidate per size)")
    a = ap.parse_args()
    shape = tuple(int(x) for x in a.shape.split(",")) if a.shape else None
    out = Path(a.experiment)
    ctx = mp.get_context("spawn")
    with ctx.Pool(2) as pool:
        todo = [x for x in settings() if not shape or x[0] != "sweep-race"]
        parts = pool.map(_score, [(1, a.choose, 2, k, todo, shape) for k in range(2)])
    dev = pd.DataFrame([r for p in parts for r in p])
    mean = dev.groupby(["method", "factor", "beta"]).net_value.mean()
    chosen = [(m, *mean[m].idxmax()) for m in ("ei/s", "kg/s", "ucb/s") + (() if shape else ("sweep-race",))]
    lines = [f"# `python docs/results/scripts/compose_tuned_baselines.py {' '.join(sys.argv[1:])}`", "",
             f"Chosen on {a.choose} training problems (seed stream 1) x 2 draws (mean net value, points):", "",
             "| baseline | stop factor | beta | chosen on training problems | at the defaults (1, 2) |",
             "| --- | ---: | ---: | ---: | ---: |"]
    for m, f, b in chosen:
        lines.append(f"| {m} | {f} | {b} | {mean[(m, f, b)]:+.2f} | {mean[(m, 1.0, 2.0)]:+.2f} |")
    with ctx.Pool(2) as pool:
        parts = pool.map(_score, [(2, a.judge, a.draws, k, chosen, shape) for k in range(2)])
    judged = pd.DataFrame([r for p in parts for r in p])
    judged["method"] = judged.method + ("@" + a.shape if shape else "") + "*"
    exp = pd.read_csv(out / "results.csv.gz" if (out / "results.csv.gz").exists() else out / "results.csv")
    both = pd.concat([exp[["method", "problem_id", "seed", "net_value", "slower", "jobs"]],
                      judged[["method", "problem_id", "seed", "net_value", "slower", "jobs"]]])
    per = both.groupby(["method", "problem_id"]).net_value.mean().unstack(0)
    tuned = [c for c in per.columns if c.endswith("*")]
    best = max(tuned, key=lambda m: per[m].mean())
    lines += ["", f"Judged on {a.judge} problems (seed stream 2) x {a.draws} draws; * = tuned:", "",
              "| method | net value, mean [95%] | sizes slower (runs with any) |", "| --- | ---: | ---: |"]
    for m in per.mean().sort_values(ascending=False).index:
        mu, lo, hi = ci95(per[m].to_numpy())
        sub = both[both.method == m]
        lines.append(f"| {m} | {mu:+.2f} [{lo:+.2f}, {hi:+.2f}] | {int(sub.slower.sum())} "
                     f"({int((sub.slower > 0).sum())} of {len(sub)}) |")
    lines += ["", f"Best tuned baseline: **{best}**.", "",
              "| agent | minus best tuned baseline, paired [95%] | criterion (> +0.5, interval above 0) |",
              "| --- | ---: | --- |"]
    for m in [c for c in per.columns if c.startswith("ppo")]:
        mu, lo, hi = ci95((per[m] - per[best]).to_numpy())
        lines.append(f"| {m} | {mu:+.2f} [{lo:+.2f}, {hi:+.2f}] | {'met' if mu > 0.5 and lo > 0 else 'not met'} |")
    (out / ("shape-baselines.md" if shape else "tuned-baselines.md")).write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
