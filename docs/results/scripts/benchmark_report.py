"""The tables of docs/results/benchmarks.md from a benchmark's results.csv.

    python docs/results/scripts/benchmark_report.py docs/results/benchmarks

Prints (Markdown): per set and budget, ncclrl's fraction of the optimum and its paired difference
to every other method with the 95% interval (a lead whose interval holds 0 is a tie); the
ablation (ncclrl against the same run with the learner replaced by the model's ranking); the
recorded sweeps replayed, per seed; and how many points ncclrl reaches 95% of the 2x2 sweep's
optimum with.
"""

import sys
from pathlib import Path

import pandas as pd

from ncclrl.runners.benchmark import summarize


def fmt(x, lo, hi, sign=False):
    f = "{:+.3f}" if sign else "{:.3f}"
    return f"{f.format(x)} [{f.format(lo)}, {f.format(hi)}]"


def main(folder: Path) -> None:
    df = pd.read_csv(folder / "results.csv")
    s = summarize(df)
    methods = [m for m in dict.fromkeys(s["method"]) if m != "ncclrl"]
    print("### ncclrl against every method (ncclrl minus the method, paired by problem)\n")
    for st in dict.fromkeys(s["set"]):
        g = s[s["set"] == st]
        n = int(g["problems"].iloc[0])
        if n == 1:
            print(f"**{st}** (1 problem: no interval over problems; the per-seed table below has the spread)\n")
        else:
            print(f"**{st}** ({n} problems)\n")
        print("| method | " + " | ".join(f"budget {b}" for b in sorted(set(g["budget"]))) + " |")
        print("| --- |" + " --- |" * len(set(g["budget"])))
        row = [fmt(r.fraction, r.lo, r.hi) for r in g[g["method"] == "ncclrl"].sort_values("budget").itertuples()]
        print("| ncclrl (fraction of the optimum) | " + " | ".join(row) + " |")
        for m in methods:
            rows = g[g["method"] == m].sort_values("budget")
            cells = [f"{fmt(r.diff, r.diff_lo, r.diff_hi, True)} {int(r.wins)}/{int(r.losses)}"
                     for r in rows.itertuples()]
            print(f"| {m} | " + " | ".join(cells) + " |")
        print()
    print("### The recorded sweeps replayed, per seed (fraction of the sweep's optimum; live points used)\n")
    rep = df[df["set"] == "replay"]
    for prob, g in rep.groupby("problem", sort=False):
        print(f"**{prob}**\n")
        seeds = sorted(set(g["seed"]))
        print("| method | budget | " + " | ".join(f"seed {x}" for x in seeds) + " | median | used |")
        print("| --- | --- |" + " --- |" * (len(seeds) + 2))
        for (m, b), h in g.groupby(["method", "budget"], sort=False):
            h = h.set_index("seed")
            print(f"| {m} | {b} | " + " | ".join(f"{h.loc[x, 'fraction']:.3f}" for x in seeds) +
                  f" | {h['fraction'].median():.3f} | {h['used'].mean():.0f} |")
        print()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
