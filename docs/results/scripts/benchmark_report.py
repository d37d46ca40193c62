"""The tables of docs/results/benchmarks.md from one or more benchmark folders' results.csv.

    python docs/results/scripts/benchmark_report.py OUT FOLDER [FOLDER ...]

Reads every FOLDER's results.csv (runs of the same suite over different methods, e.g. the
black-box tuners and the tuning runs), writes the union to OUT (results.csv, summary.csv,
benchmark.png: fraction of the optimum against GPU-minutes, every method) and prints (Markdown):

* per set and budget, every method's fraction of the optimum [95% interval over problems], the
  GPU-minutes it spent, and ``jobs`` (finetune's default) minus the method, paired by problem;
* the issue-level goals per replayed problem (recorded hosts and public grids), medians over
  seeds: sizes left slower than NCCL's default (any seed), ``jobs`` at half a sweep's GPU-time
  against the sweep at a whole one, ``jobs`` at a whole sweep against 0.95;
* the learner's ablation: ``ncclrl`` (the PPO strategy) minus ``rank`` (the same run, the
  learner replaced by the model's ranking).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pandas as pd

from ncclrl.runners.benchmark import plot, summarize

REF = "jobs"


def fmt(x: float, lo: float, hi: float, sign: bool = False) -> str:
    f = "{:+.3f}" if sign else "{:.3f}"
    return f"{f.format(x)} [{f.format(lo)}, {f.format(hi)}]"


def budget_order(df: pd.DataFrame) -> list[str]:
    return list(df.groupby("budget")["budget_gpu_s"].mean().sort_values().index)


def main(out: Path, folders: list[Path]) -> None:
    df = pd.concat([pd.read_csv(f / "results.csv") for f in folders], ignore_index=True)
    df = df.drop_duplicates(subset=["set", "problem", "seed", "method", "budget"], keep="last")
    out.mkdir(parents=True, exist_ok=True)
    df.to_csv(out / "results.csv", index=False, float_format="%.6g")
    s = summarize(df, REF)
    s.to_csv(out / "summary.csv", index=False, float_format="%.6g")
    plot(s, out / "benchmark.png", REF)
    budgets = budget_order(df)

    print(f"### Every method, and `{REF}` minus the method (paired by problem)\n")
    for st in dict.fromkeys(s["set"]):
        g = s[s["set"] == st]
        n = int(g["problems"].max())
        print(f"**{st}** ({n} problem{'s' if n != 1 else ''}; mean over problems of the median over seeds)\n")
        print("| method | budget | GPU-min | jobs run | fraction of the optimum | " + REF + " minus it | "
              "sizes >1% slower (most in a run) | worst size |")
        print("| --- | --- | ---: | ---: | --- | --- | ---: | ---: |")
        for m in dict.fromkeys(g["method"]):
            for b in budgets:
                r = g[(g["method"] == m) & (g["budget"] == b)]
                if not len(r):
                    continue
                r = r.iloc[0]
                no_diff = m == REF or pd.isna(r.get("diff", np.nan))
                d = "" if no_diff else fmt(r["diff"], r["diff_lo"], r["diff_hi"], True)
                print(f"| {m} | {b} | {r['gpu_min']:.1f} | {r['jobs']:.1f} | {fmt(r['fraction'], r['lo'], r['hi'])} | "
                      f"{d} | {int(r['slower_max'])} | {r['worst']:.3f} |")
        print()

    print("### The goals on real truths (replayed hosts and public grids), medians over seeds\n")
    real = df[df["set"].isin(["replay", "grids"])]
    if len(real):
        print(f"| problem | {REF} sizes >1% slower (most in a seed) | {REF} @ 0.5 sweep | sweep @ 1 sweep | "
              f"{REF} @ 1 sweep | sweep-race @ 1 sweep |")
        print("| --- | ---: | ---: | ---: | ---: | ---: |")
        for p, g in real.groupby("problem", sort=False):
            def med(m: str, b: str, g=g) -> str:
                x = g[(g["method"] == m) & (g["budget"] == b)]["fraction"]
                return f"{x.median():.3f}" if len(x) else "-"
            slow = g[g["method"] == REF]["slower"]
            most = int(slow.max()) if len(slow) else "-"
            print(f"| {p} | {most} | {med(REF, '0.5sweep')} | {med('sweep', '1sweep')} | {med(REF, '1sweep')} | "
                  f"{med('sweep-race', '1sweep')} |")
        print()

    if {"ncclrl", "rank"} <= set(df["method"]):
        print("### The learner's ablation: ncclrl (PPO strategy) minus rank (the learner removed)\n")
        print("| set | budget | ncclrl | rank | ncclrl minus rank |")
        print("| --- | --- | --- | --- | --- |")
        rng = np.random.default_rng(0)
        per = df.groupby(["set", "method", "budget", "problem"])["fraction"].median()
        for st in dict.fromkeys(df["set"]):
            for b in budgets:
                try:
                    a, r = per.loc[(st, "ncclrl", b)], per.loc[(st, "rank", b)]
                except KeyError:
                    continue
                d = (a - r).dropna().to_numpy()
                boot = d[rng.integers(0, len(d), (2000, len(d)))].mean(axis=1) if len(d) > 1 else np.array([d.mean()])
                print(f"| {st} | {b} | {a.mean():.3f} | {r.mean():.3f} | "
                      f"{fmt(d.mean(), np.quantile(boot, 0.025), np.quantile(boot, 0.975), True)} |")
        print()


if __name__ == "__main__":
    main(Path(sys.argv[1]), [Path(x) for x in sys.argv[2:]])
