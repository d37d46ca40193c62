"""Put one method's rows from a run of that method alone in place of a full run's, keeping the full
run's row order, and write results.csv, summary.csv and benchmark.png (run h200x4-2026-11-22/run5: TPE re-run after
its index fix).

    python docs/results/benchmarks/merge_rows.py runs/benchmark/full runs/benchmark/tpe docs/results/benchmarks
"""

import sys
from pathlib import Path

import pandas as pd

from ncclrl.runners.benchmark import plot, print_summary, summarize

KEY = ["platform", "collective", "seed", "method", "budget"]
full_dir, part_dir, out = (Path(a) for a in sys.argv[1:4])
full, part = pd.read_csv(full_dir / "results.csv"), pd.read_csv(part_dir / "results.csv")
methods = set(part["method"])
merged = full[KEY].merge(pd.concat([full[~full["method"].isin(methods)], part]), on=KEY, how="left")
if len(merged) != len(full) or merged["speedup"].isna().any():
    sys.exit(f"the run of {sorted(methods)} does not cover the full run's problems")
merged.to_csv(out / "results.csv", index=False, float_format="%.6g")
s = summarize(merged)
s.to_csv(out / "summary.csv", index=False, float_format="%.6g")
plot(merged, out / "benchmark.png")
print_summary(s)
