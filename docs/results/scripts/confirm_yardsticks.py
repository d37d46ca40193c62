"""The yardsticks of docs/results/confirm.md: each problem's replay noise and its source; the 2x2
socket host's truth as first recorded and as re-recorded (with its uncertainty: the optimum and safe
optimum over bootstrap draws of the recorded jobs); and whether a configuration's job residual
persists across repeats inside one job.

    python docs/results/scripts/confirm_yardsticks.py
"""

from __future__ import annotations

import json
import sqlite3
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from ncclrl.agents.problem import Oracle
from ncclrl.agents.suite import public_gridded, replayed
from ncclrl.costmodel.noise import pooled_median, robust_median
from ncclrl.envs.grids import PUBLIC_GRIDS, public_grid_folder

ROOT = Path(__file__).resolve().parents[3]
OLD = ROOT / "data" / "h200x4-2026-11-21" / "store.sqlite"
NEW = ROOT / "data" / "h200x4-2026-11-28" / "repeats" / "sweep.sqlite"
IN_JOB = ROOT / "data" / "h200x4-2026-11-28" / "repeats" / "in-job.sqlite"


def noise_line(name: str, inst) -> str:
    m = inst.measure_for(0)
    noise = next(c.cell_contents for c in m.__closure__ if type(c.cell_contents).__name__ == "JobNoise")
    r = noise.resid_sds
    return (f"| {name} | {inst.noise} | {noise.shift_sd:.3f} | {r[0]:.3f} / {r[3]:.3f} / {r[-1]:.3f} | "
            f"{noise.resid_df:.2f} |")


Interval = tuple[float, float]


def truth_interval(store, min_jobs: int, draws: int = 200) -> tuple[float, float, Interval, Interval]:
    """The optimum and safe optimum, and their 2.5-97.5% over bootstrap draws of each point's jobs."""
    inst = replayed(store, "h200-2x2-sock", "nccl", "allreduce", min_jobs=min_jobs)
    p = inst.problem
    from ncclrl.agents.suite import recorded_points
    from ncclrl.costmodel.topology import load_topology
    from ncclrl.envs.replay import recorded_sweep

    topo = load_topology("h200-2x2-sock")
    stores = store if isinstance(store, list) else [store]
    frame = pd.concat([recorded_sweep(x, topo, "nccl", ("sweep", "sweep-repeat") if not i else ("sweep-repeat",),
                                      status="ok", collective="allreduce") for i, x in enumerate(stores)])
    _, recorded = recorded_points(frame, topo, p.colls)
    rng = np.random.default_rng(0)
    c = p.colls[0]
    opt, safe = [], []
    for _ in range(draws):
        times = {}
        for k in p.knobs:
            keys = p.space(c, k)
            t = np.full((len(keys), len(p.sizes[c])), np.inf)
            for j, key in enumerate(keys):
                for i, s in enumerate(p.sizes[c]):
                    jobs = recorded.get((k.knobs, c, s, key))
                    if jobs:
                        t[j, i] = pooled_median([jobs[x] for x in rng.integers(0, len(jobs), len(jobs))])
            times[(k.knobs, c)] = t
        o = Oracle(p, times=times)
        opt.append(o.optimum)
        safe.append(o.safe_optimum)
    q = lambda v: (float(np.percentile(v, 2.5)), float(np.percentile(v, 97.5)))  # noqa: E731
    return inst.oracle.optimum, inst.oracle.safe_optimum, q(opt), q(safe)


def in_job() -> list[str]:
    d = pd.read_sql("select job, nbytes, algo, proto, channels, samples_us from measurements order by id",
                    sqlite3.connect(IN_JOB))
    d["y"] = [np.log(robust_median(json.loads(s))) for s in d.samples_us]
    d["cfg"] = d.algo + "/" + d.proto + "/" + d.channels.astype(str)
    d["rep"] = d.groupby(["job", "nbytes", "cfg"]).cumcount()
    p = d.pivot_table(index=["nbytes", "cfg"], columns=["job", "rep"], values="y")
    for col in p.columns:  # the (job, size) effect every configuration of a size shares, taken out
        p[col] = p[col] - p[col].groupby(level=0).transform("mean")
    jobs = sorted(d.job.unique())
    out = ["| sizes | pairs | sd of a repeat in the same job | sd of the job's own residual | share that persists |",
           "| --- | --- | --- | --- | --- |"]
    for lo, hi, label in ((0, 1 << 16, "8 B - 32 KiB"), (1 << 16, 1 << 22, "64 KiB - 2 MiB"),
                          (1 << 22, 1 << 29, "4 - 256 MiB")):
        sel = (p.index.get_level_values(0) >= lo) & (p.index.get_level_values(0) < hi)
        w = np.concatenate([(p[(j, 0)] - p[(j, 1)]).to_numpy()[sel] for j in jobs])
        w = w[np.isfinite(w)]
        m = [((p[(j, 0)] + p[(j, 1)]) / 2).to_numpy()[sel] for j in jobs]
        dd = (m[0] - m[1])
        dd = dd[np.isfinite(dd)]
        sw2 = float(np.var(w)) / 2
        se2 = max(float(np.var(dd)) / 2 - sw2 / 2, 0.0)
        out.append(f"| {label} | {len(dd)} | {np.sqrt(sw2):.3f} | {np.sqrt(se2):.3f} | {se2 / (se2 + sw2):.2f} |")
    return out


def p5en_default() -> list[str]:
    """The p5en default run (another date and NCCL version) against the nightly grid's forced runs
    at 8 and 16 nodes: the ratio to the grid's fastest configuration, and which is nearest."""
    import csv
    from collections import defaultdict

    base = public_grid_folder() / "aws-p5en-nightly-algo-proto"
    rows = list(csv.reader((base / "nccl-tests-all_reduce_0x0_perf.csv").read_text().splitlines()))
    out = ["| nodes | bytes | default, other date (us) | grid's fastest (us) | ratio | nearest configuration |",
           "| --- | --- | --- | --- | --- | --- |"]
    for nodes in (8, 16):
        forced = defaultdict(list)
        for r in rows:
            if int(r[8]) == nodes:
                forced[(int(r[1]), f"{r[9]}/{r[10]}")].append(float(r[2]))
        dflt = {}
        text = (base / f"tuner_comparison_allreduce_{nodes}nodes_0x0.csv").read_text()
        for r in list(csv.reader(text.splitlines()))[1:]:
            try:
                dflt[int(r[0])] = float(r[1])
            except ValueError:
                continue
        for s in (8192, 16384, 32768, 65536, 131072, 1 << 20, 1 << 24, 1 << 28):
            f = {k[1]: float(np.median(v)) for k, v in forced.items() if k[0] == s}
            if not f or s not in dflt:
                continue
            best = min(f, key=f.get)
            near = min(f, key=lambda k: abs(np.log(f[k] / dflt[s])))
            out.append(f"| {nodes} | {s} | {dflt[s]:.1f} | {best} {f[best]:.1f} | {dflt[s] / f[best]:.2f} | "
                       f"{near} {f[near]:.1f} |")
    return out


def main() -> int:
    print("## Replay noise per problem\n")
    print("| problem | noise of its replayed jobs | job shift sd | residual sd 8 B / 32 KiB / 1 GiB "
          "| residual tail (t dof) |")
    print("| --- | --- | --- | --- | --- |")
    print(noise_line("h200-2x2-sock:recorded", replayed(OLD, "h200-2x2-sock", "nccl", "allreduce")))
    re = replayed([OLD, NEW], "h200-2x2-sock", "nccl", "allreduce", min_jobs=3)
    print(noise_line("h200-2x2-sock:rerecorded", re))
    if public_grid_folder().is_dir():
        for g in PUBLIC_GRIDS:
            print(noise_line(f"{g}:grid", public_gridded(g)))
    print("\n## The 2x2 socket host's truth\n")
    print("| truth | knob settings | optimum [95% over the recorded jobs] | safe optimum [95%] |")
    print("| --- | --- | --- | --- |")
    for label, store, mj in (("as first recorded (most points one job)", OLD, 1),
                             ("re-recorded, >= 3 jobs per point, both dates", [OLD, NEW], 3)):
        o, s, qo, qs = truth_interval(store, mj)
        n = len(replayed(store, "h200-2x2-sock", "nccl", "allreduce", min_jobs=mj).problem.knobs)
        print(f"| {label} | {n} | {o:.3f}x [{qo[0]:.3f}, {qo[1]:.3f}] | {s:.3f}x [{qs[0]:.3f}, {qs[1]:.3f}] |")
    if public_grid_folder().is_dir():
        print("\n## p5en: NCCL's default run of another date against the grid's forced runs\n")
        print("\n".join(p5en_default()))
    print("\n## Repeats inside one job (2 jobs, NCCL's defaults, every other size, each point twice)\n")
    print("\n".join(in_job()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
