"""The figures of README.md, from the stores of this folder.

    python data/h200x4-2026-11-28/knobs/summarize.py [4x1 2x2 1x4]

Per point (knob setting, size, per-call configuration), its time is the geometric mean of its
jobs' medians (``ncclrl.costmodel.noise.pooled_median``) over the jobs that measured it (status
``ok``). Per size, the reference is NCCL's own choice under NCCL's defaults. Printed per bed:

- rows stored by status, jobs and rounds per knob setting;
- per setting, the geometric mean over sizes of the reference over the setting's best point at the
  size (its NCCL choice included), and how many sizes that setting wins overall;
- per size band, the geometric mean (and range) over its sizes of the reference over the best point
  of any setting, and the settings that win there;
- NCCL's own choice against the configuration the replica says it chooses, forced, per size band;
- the job-to-job spread: the pooled sd of a point's log job medians, over points measured in 2 or
  more jobs, per size band.

The best of many noisy points is biased low (the winner's curse): with 1-3 jobs per point, gains
of a few percent are within the noise.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

from ncclrl.costmodel import nccl as N
from ncclrl.costmodel.noise import pooled_median
from ncclrl.costmodel.replica import default_decisions
from ncclrl.costmodel.topology import load_topology
from ncclrl.envs.store import open_readonly

HERE = Path(__file__).resolve().parent
TOPO = {"4x1": "h200-4x1-sock", "2x2": "h200-2x2-sock", "1x4": "h200-1x4"}
KNOBS = ["comm_channels", "buffsize_bytes", "socket_nthreads", "nsocks_perthread", "socket_inline_bytes"]
BANDS = [("<= 64 KiB", 0, 64 << 10), ("<= 1 MiB", 64 << 10, 1 << 20), ("< 64 MiB", 1 << 20, (64 << 20) - 1),
         (">= 64 MiB", (64 << 20) - 1, 1 << 40)]


def label(k: tuple) -> str:
    ch, buf, nt, ns, inl = k
    parts = ([f"{ch} ch"] if ch else []) + ([f"buff {buf >> 20} MiB"] if buf else []) + (
        [f"{nt}x{ns} sockets"] if nt or ns else []) + (["inline 256K"] if inl else [])
    return ", ".join(parts) or "defaults"


def band_of(n: int) -> str:
    return next(b for b, lo, hi in BANDS if lo < n <= hi)


def own_vs_forced(pts, ref, topo: str) -> dict[str, float]:
    """Per size band, the geometric mean of NCCL's own choice's time over that of the configuration
    the replica says NCCL chooses, forced."""
    sizes = np.array(ref.index, dtype=np.int64)
    d = default_decisions(load_topology(topo), "allreduce", sizes)
    r = {}
    for i, n in enumerate(sizes):
        a, p, ch = N.ALGOS[d.algo[i]], N.PROTOS[d.proto[i]], int(d.channels[i])
        key = (n, (a, p, ch)) if (n, (a, p, ch)) in pts.index else (n, (a, p, 0))
        if key in pts.index:
            r.setdefault(band_of(int(n)), []).append(np.log(ref[n] / pts[key]))
    return {b: float(np.exp(np.mean(v))) for b, v in r.items()}


def summarize(bed: str) -> None:
    with open_readonly(HERE / f"{bed}.sqlite") as st:
        f = st.frame(topology=TOPO[bed], tag="sweep-repeat")
    f["setting"] = list(map(tuple, f[KNOBS].astype(int).to_numpy()))
    f["config"] = list(zip(f.algo, f.proto, f.channels.astype(int), strict=True))
    print(f"== {bed} ({TOPO[bed]}): {len(f)} rows, " + ", ".join(f"{s} {n}" for s, n in f.status.value_counts().items())
          + f"; {f.job.nunique()} job ids")
    ok = f[f.status == "ok"]
    pts = ok.groupby(["setting", "nbytes", "config"]).median_us.agg(lambda m: pooled_median([[x] for x in m]))
    jobs = ok.groupby(["setting", "nbytes", "config"]).size()
    dflt = (0, 0, 0, 0, 0)
    ref = pts.xs(dflt, level="setting").xs(("default", "default", 0), level="config")
    best = pts.groupby(["setting", "nbytes"]).min()
    overall = best.groupby("nbytes").min()
    winner = best[best.eq(overall.reindex(best.index.get_level_values("nbytes")).to_numpy())]
    wins = winner.reset_index().groupby("setting").size()
    print("setting | jobs per point (min-max) | rows slow | geo-mean speedup of its best point over NCCL's defaults"
          " | sizes won")
    for s in sorted(best.index.get_level_values("setting").unique(), key=lambda k: (k != dflt, k)):
        b = best.xs(s, level="setting")
        common = b.index.intersection(ref.index)
        sp = float(np.exp(np.mean(np.log(ref[common] / b[common]))))
        j = jobs.xs(s, level="setting")
        slow = int(((f.setting == s) & (f.status != "ok")).sum())
        print(f"{label(s)} | {j.min()}-{j.max()} | {slow} | {sp:.2f}x over {len(common)} sizes | {int(wins.get(s, 0))}")
    sp = ref / overall.reindex(ref.index)
    print("band | sizes | best setting + configuration over NCCL's defaults: geo-mean (range) | settings winning")
    for name, lo, hi in BANDS:
        m = (sp.index > lo) & (sp.index <= hi)
        w = winner.reset_index()
        w = w[(w.nbytes > lo) & (w.nbytes <= hi)].setting.value_counts()
        print(f"{name} | {m.sum()} | {np.exp(np.mean(np.log(sp[m]))):.2f}x ({sp[m].min():.2f}-{sp[m].max():.2f}x) | "
              + "; ".join(f"{label(k)} {v}" for k, v in w.items()))
    print("per size: size | NCCL's defaults us | best us | speedup | setting | configuration")
    for n in ref.index:
        s, c = next((s, c) for (s, nb, c), v in pts.items() if nb == n and v == overall[n])
        print(f"{n} | {ref[n]:.1f} | {overall[n]:.1f} | {ref[n] / overall[n]:.2f}x | {label(s)} | "
              + "/".join(map(str, c)))
    same = own_vs_forced(pts.xs(dflt, level="setting"), ref, TOPO[bed])
    print("NCCL's own choice over the same configuration forced (the replica's algorithm, protocol and channels;"
          " channels 0 where its count is not in the grid), under NCCL's defaults, geo-mean per band: "
          + "; ".join(f"{b} {v:.2f}x" for b, v in same.items()))
    y = ok.assign(y=np.log(ok.median_us)).groupby(["setting", "nbytes", "config"]).y
    var, dof = y.var(ddof=1), y.count() - 1
    rep = var[dof > 0].reset_index().assign(df=dof[dof > 0].to_numpy())
    rep["band"] = rep.nbytes.map(band_of)
    print("job-to-job sd of a point's log median, pooled (points with >= 2 jobs):")
    for name, _lo, _hi in BANDS:
        r = rep[rep.band == name]
        if len(r):
            sd = np.sqrt((r.y * r.df).sum() / r.df.sum())
            print(f"  {name}: {100 * sd:.1f}% over {len(r)} points")
    print()


if __name__ == "__main__":
    for b in sys.argv[1:] or list(TOPO):
        summarize(b)
