"""The tables of docs/results/confirm.md from ``ncclrl benchmark suite=confirm``'s results.csv.

    ncclrl benchmark suite=confirm out=runs/confirm
    python docs/results/scripts/confirm_report.py runs/confirm/results.csv

Share = log speedup of the exported table / log speedup of the safe optimum (the best table with no
size more than 1% slower than NCCL's plain default on the expected truth); per (problem, method,
budget): its mean over seeds with a 95% t interval, the share of the optimum, the GPU-time spent
(in sweeps), the runs that left a size more than 1% slower, the worst size over every run.
"""

from __future__ import annotations

import sys

import numpy as np
import pandas as pd
from scipy.stats import t


def ci(x: np.ndarray) -> tuple[float, float, float]:
    m = float(np.mean(x))
    if len(x) < 2:
        return m, m, m
    h = float(t.ppf(0.975, len(x) - 1) * np.std(x, ddof=1) / np.sqrt(len(x)))
    return m, m - h, m + h


def plot(r: pd.DataFrame, methods: list[str], out: str = "docs/results/plots/confirm-share.png") -> None:
    """Share of the safe optimum against the GPU-time each method used, one panel per problem."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    probs = list(dict.fromkeys(r.problem))
    cols = 4
    rows = (len(probs) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(4 * cols, 3.2 * rows), squeeze=False)
    for ax, prob in zip(axes.ravel(), probs, strict=False):
        g = r[r.problem == prob]
        for m in methods:
            x = g[g.method == m].groupby("budget").agg(sweeps=("sweeps", "mean"), share=("share", "mean"),
                                                      slow=("slower", lambda v: (v > 0).mean()))
            x = x.sort_values("sweeps")
            ax.plot(x.sweeps, x.share, marker="o", label=m)
            for _, row in x[x.slow > 0].iterrows():
                ax.annotate(f"{row.slow:.0%}", (row.sweeps, row.share), fontsize=6, color="red")
        ax.axhline(1.0, color="gray", lw=0.5)
        ax.set_title(prob, fontsize=8)
        ax.set_xlabel("GPU-time used (sweeps)", fontsize=7)
        ax.set_ylabel("share of the safe optimum", fontsize=7)
    for ax in axes.ravel()[len(probs):]:
        ax.axis("off")
    axes[0, 0].legend(fontsize=7)
    fig.suptitle("red: share of runs leaving a size > 1% slower", fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=110)


def main(path: str) -> int:
    r = pd.read_csv(path)
    r["share"] = np.where(r.safe_optimum > 1, np.log(r.speedup) / np.log(r.safe_optimum), np.nan)
    r["share_opt"] = np.log(r.speedup) / np.log(r.optimum)
    r["sweeps"] = r.gpu_s / r.sweep_gpu_s
    order = {b: float(b.replace("sweep", "")) for b in r.budget.unique()}
    methods = [m for m in ("confirm", "jobs", "sweep-race", "sweep") if m in set(r.method)]
    for prob, g in r.groupby("problem", sort=False):
        seeds = g.seed.nunique()
        print(f"\n### {prob}\n")
        print(f"safe optimum {g.safe_optimum.iloc[0]:.3f}x, optimum {g.optimum.iloc[0]:.3f}x; {seeds} seeds\n")
        print("| budget | method | share of the safe optimum [95%] | share of the optimum | GPU-time used (sweeps) "
              "| runs with a size > 1% slower | worst size |")
        print("| --- | --- | --- | --- | --- | --- | --- |")
        for b in sorted(g.budget.unique(), key=order.get):
            for m in methods:
                x = g[(g.budget == b) & (g.method == m)]
                if x.empty:
                    continue
                s, lo, hi = ci(x.share.to_numpy())
                print(f"| {b} | {m} | {s:.2f} [{lo:.2f}, {hi:.2f}] | {x.share_opt.mean():.2f} | {x.sweeps.mean():.2f} "
                      f"| {int((x.slower > 0).sum())}/{len(x)} | {x.worst.min():.3f} |")
    print("\n### All problems\n")
    print("| budget | method | mean share of the safe optimum | runs with a size > 1% slower "
          "| runs with a size < 0.95x |")
    print("| --- | --- | --- | --- | --- |")
    for b in sorted(r.budget.unique(), key=order.get):
        for m in methods:
            x = r[(r.budget == b) & (r.method == m)]
            print(f"| {b} | {m} | {x.share.mean():.2f} | {int((x.slower > 0).sum())}/{len(x)} "
                  f"| {int((x.worst < 0.95).sum())}/{len(x)} |")
    plot(r, methods)
    w = r[r.method == "confirm"].groupby("problem").wall_s.max()
    print(f"\nconfirm's longest run: {w.max():.1f} s ({w.idxmax()})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "runs/confirm/results.csv"))
