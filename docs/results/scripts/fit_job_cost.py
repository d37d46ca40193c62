"""Fit ncclrl.costmodel.jobcost.JobCost on the recorded stores' job timestamps.

Each job's rows are stored together as it ends, so on a host that ran jobs back to back the gap
between two jobs' timestamps is the second job's wall time (launch, setup, measuring, teardown).
Gaps over 120 s (a pause between commands) are left out. The fit is robust least squares
(soft-L1) of gap = launch_s + n_points * point_s + work_factor * busy_s, busy_s from the samples
as the workers take them (JobCost.busy_us).

    python docs/results/scripts/fit_job_cost.py            # prints the fit, per store and pooled
"""

from __future__ import annotations

import json
import sqlite3
import sys
from pathlib import Path

import numpy as np
import pandas as pd
from scipy.optimize import least_squares

from ncclrl.costmodel.jobcost import JobCost

ROOT = Path(__file__).resolve().parents[3]
STORES = ["data/h200x4-2026-11-21/store.sqlite", "data/h200x2-2026-11-22/store.sqlite"]


def jobs(path: Path) -> pd.DataFrame:
    con = sqlite3.connect(f"file:{path}?mode=ro&immutable=1", uri=True)
    df = pd.read_sql("select ts, job, tag, samples_us from measurements where job != ''", con)
    con.close()
    probe = JobCost(launch_s=0, point_s=0, work_factor=1)

    def busy(x: str) -> float:
        s = json.loads(x) if x else []
        return float(probe.busy_us(np.median(s), len(s))) / 1e6 if s else 0.0

    df["busy_s"] = df["samples_us"].map(busy)
    g = df.groupby("job").agg(ts=("ts", "max"), n=("ts", "size"), busy_s=("busy_s", "sum"), tag=("tag", "first"))
    g = g.sort_values("ts")
    g["gap_s"] = g["ts"].diff()
    return g[g["gap_s"] < 120].assign(store=str(path.parent.name))


def fit(g: pd.DataFrame) -> tuple[np.ndarray, float]:
    X = np.c_[np.ones(len(g)), g["n"], g["busy_s"]]
    y = g["gap_s"].to_numpy()
    r = least_squares(lambda th: X @ th - y, x0=[5.0, 0.03, 1.0], loss="soft_l1", f_scale=1.0, bounds=(0, np.inf))
    rel = np.median(np.abs(X @ r.x - y) / y)
    return r.x, float(rel)


def main() -> int:
    all_ = pd.concat([jobs(ROOT / s) for s in STORES])
    print(f"{'data':<28} {'jobs':>5} {'launch_s':>9} {'point_s':>8} {'work_factor':>11} {'median |rel err|':>16}")
    for name, g in [*all_.groupby("store"), ("pooled", all_)]:
        th, rel = fit(g)
        print(f"{name:<28} {len(g):>5} {th[0]:>9.2f} {th[1]:>8.3f} {th[2]:>11.2f} {rel:>16.3f}")
    sweeps = all_[all_["tag"].str.startswith("sweep")]
    th, rel = fit(sweeps)
    print(f"{'sweep jobs only':<28} {len(sweeps):>5} {th[0]:>9.2f} {th[1]:>8.3f} {th[2]:>11.2f} {rel:>16.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
