"""``ncclrl validate``: measure an exported table afresh, through the tuner plugin, against NCCL's
defaults, and say per size whether it is faster, the same or slower.

    ncclrl validate table=nccl_tuner.csv conf=nccl.conf topology=h200-2x2-sock collectives=allreduce

Jobs alternate between NCCL's defaults (no table, no knobs) and the tuned setting (the table
loaded by our plugin, the ``nccl.conf`` knobs as the process environment), ``rounds`` times each,
so both see the same machine drift; no training measurement is reused. Every sample goes to the
store (tags ``validate-base`` and ``validate-tuned``); the report pools a point's samples over the
rounds and gives the median, its 95% bootstrap interval, the speedup and a verdict: ``faster``
(the intervals do not overlap, tuned below), ``slower`` (the other way) or ``same``.
"""

from __future__ import annotations

import hashlib
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from costmodel import nccl as N
from costmodel.errors import ConfigError
from costmodel.topology import load_topology
from runners.store import Point, Store, summarize
from runners.sweep import measure_whole, parse_kv, script_main, size_grid

DEFAULTS: dict[str, str] = {"table": "", "conf": "", "topology": "", "collectives": "allreduce",
                            "min_bytes": "8", "max_bytes": "256M", "rounds": "2", "samples": "5",
                            "timing": "eager", "timeout_s": "300", "store": "runs/validate.sqlite", "out": ""}
CONF_KEYS = {"NCCL_MIN_NCHANNELS": "comm_channels", "NCCL_MAX_NCHANNELS": "comm_channels",
             "NCCL_BUFFSIZE": "buffsize_bytes", "NCCL_SOCKET_NTHREADS": "socket_nthreads",
             "NCCL_NSOCKS_PERTHREAD": "nsocks_perthread", "NCCL_SOCKET_INLINE": "socket_inline_bytes"}


def parse_args(argv: list[str]) -> dict[str, str]:
    args = parse_kv(argv, DEFAULTS, "validate")
    for k in ("table", "topology"):
        if not args[k]:
            raise ConfigError(k, "required (validate table=nccl_tuner.csv topology=PRESET [conf=nccl.conf])")
    for k in ("table", "conf"):
        if args[k] and not Path(args[k]).is_file():
            raise ConfigError(k, f"no such file: {args[k]}")
    if args["timing"] not in ("graph", "eager"):
        raise ConfigError("timing", f"unknown value {args['timing']!r}; allowed: graph, eager")
    for k in ("rounds", "samples"):
        if not args[k].isdigit() or int(args[k]) < 1:
            raise ConfigError(k, f"must be a whole number >= 1, got {args[k]!r}")
    return args


def read_conf(path: str | Path) -> Point:
    """The per-process knobs of an ``nccl.conf`` (KEY=VALUE lines, ``#`` comments) as a Point."""
    knobs: dict[str, int] = {}
    for ln, line in enumerate(Path(path).read_text().splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        key, sep, value = line.partition("=")
        key, value = key.strip(), value.strip()
        if not sep or key not in CONF_KEYS:
            raise ConfigError(f"{path}:{ln}", f"unknown setting {key!r}; allowed: {', '.join(CONF_KEYS)}")
        if not value.isdigit() or int(value) < 1:
            raise ConfigError(f"{path}:{ln}:{key}", f"must be a whole number >= 1, got {value!r}")
        knobs[CONF_KEYS[key]] = int(value)
    return Point("allreduce", 1, **knobs)


def verdict(base: list[float], tuned: list[float]) -> dict[str, Any]:
    b, blo, bhi = summarize(base)
    t, tlo, thi = summarize(tuned)
    v = "faster" if thi < blo else ("slower" if tlo > bhi else "same")
    return {"base_us": b, "base_lo_us": blo, "base_hi_us": bhi, "tuned_us": t, "tuned_lo_us": tlo,
            "tuned_hi_us": thi, "speedup": b / t, "verdict": v}


def run_validate(args: dict[str, str], out=sys.stdout, workers_factory=None):
    """Alternate base and tuned jobs; returns the per-size report as a DataFrame."""
    import pandas as pd

    from runners.cli import parse_bytes

    topo = load_topology(args["topology"])
    colls = [N.parse_name("collectives", c, N.COLLECTIVES) for c in args["collectives"].split(",") if c]
    lo, hi = parse_bytes(args["min_bytes"], "min_bytes"), parse_bytes(args["max_bytes"], "max_bytes")
    knobs = read_conf(args["conf"]) if args["conf"] else Point("allreduce", 1)
    table = Path(args["table"])
    digest = hashlib.sha256(table.read_bytes()).hexdigest()[:12]
    if workers_factory is None:
        from runners.table_backend import TableWorkers

        def workers_factory(knobs, table):
            return TableWorkers(topo.nranks, topo.nodes, knobs, timing=args["timing"],
                                timeout_s=float(args["timeout_s"]), table=table)

    points = [Point(N.COLLECTIVES[c], s) for c in colls for s in size_grid(lo, hi, topo.nranks, c)]
    store = Store(Path(args["store"]))
    pooled: dict[str, list[list[float]]] = {"base": [[] for _ in points], "tuned": [[] for _ in points]}
    t0 = time.time()
    for r in range(int(args["rounds"])):
        for which, kn, tab in (("base", None, None), ("tuned", knobs, table)):
            w = workers_factory(kn, tab)
            stored = [replace(kn, collective=p.collective, nbytes=p.nbytes) if kn else p for p in points]
            tag = "validate-base" if which == "base" else f"validate-tuned:{digest}"
            res = measure_whole(w, stored, store, topo.name, backend="torch", samples=int(args["samples"]), tag=tag,
                                out=out)
            done = 0
            for i, smp in enumerate(res):
                if smp:
                    pooled[which][i] += list(smp)
                    done += 1
            print(f"# round {r + 1}: {which}: {done}/{len(points)} points, {time.time() - t0:.0f} s", file=out,
                  flush=True)
    rows = []
    for i, p in enumerate(points):
        if not pooled["base"][i] or not pooled["tuned"][i]:
            continue
        c = N.COLLECTIVES.index(p.collective)
        v = verdict(pooled["base"][i], pooled["tuned"][i])
        bf = float(N.bus_factor(c, topo.nranks))
        rows.append({"topology": topo.name, "collective": p.collective, "nbytes": p.nbytes, **v,
                     "base_busbw_gbps": p.nbytes * bf / v["base_us"] / 1e3,
                     "tuned_busbw_gbps": p.nbytes * bf / v["tuned_us"] / 1e3, "table_sha256_12": digest})
    df = pd.DataFrame(rows)
    print_report(df, out)
    if args["out"]:
        df.to_csv(args["out"], index=False)
        if not df.empty:
            plot_scurves(df, Path(args["out"]).with_suffix(".png"), f"{table.name}: fresh measurement, {topo.name}")
    return df


def print_report(df, out=sys.stdout) -> None:
    if df.empty:
        print("# nothing measured", file=out)
        return
    for coll, g in df.groupby("collective", sort=False):
        print(f"\n# {coll}: NCCL defaults vs table (median us [95% CI], pooled over rounds)", file=out)
        print(f"{'nbytes':>10} {'base_us':>22} {'tuned_us':>22} {'speedup':>8}  verdict", file=out)
        for _, r in g.iterrows():
            print(f"{r['nbytes']:>10} {r.base_us:>9.1f} [{r.base_lo_us:>5.1f}-{r.base_hi_us:<5.1f}] "
                  f"{r.tuned_us:>9.1f} [{r.tuned_lo_us:>5.1f}-{r.tuned_hi_us:<5.1f}] {r.speedup:>7.2f}x  {r.verdict}",
                  file=out)
        gm = float(np.exp(np.mean(np.log(g.speedup))))
        big = g[(g.nbytes >= 64 << 20) & (g.nbytes <= 256 << 20)]
        gm_big = f", {float(np.exp(np.mean(np.log(big.speedup)))):.2f}x at 64-256 MiB" if len(big) else ""
        print(f"# {coll}: geometric-mean speedup {gm:.2f}x over {len(g)} sizes{gm_big}; "
              f"{int((g.verdict == 'faster').sum())} faster, {int((g.verdict == 'slower').sum())} slower", file=out)


def plot_scurves(df, path: str | Path, title: str = "") -> Path:
    """Bus bandwidth vs size, NCCL's defaults and the table, one panel per collective."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colls = list(dict.fromkeys(df["collective"]))
    fig, axes = plt.subplots(1, len(colls), figsize=(5 * len(colls), 3.8), squeeze=False)
    for ax, coll in zip(axes[0], colls, strict=True):
        g = df[df["collective"] == coll].sort_values("nbytes")
        ax.plot(g["nbytes"], g["base_busbw_gbps"], "o-", ms=3, label="NCCL defaults")
        ax.plot(g["nbytes"], g["tuned_busbw_gbps"], "s-", ms=3, label="table + nccl.conf")
        slower = g[g["verdict"] == "slower"]
        ax.plot(slower["nbytes"], slower["tuned_busbw_gbps"], "rx", ms=8, label="slower (95% CI)")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("size (bytes)")
        ax.set_ylabel("bus bandwidth (GB/s)")
        ax.set_title(f"{coll} {g['topology'].iloc[0]}")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return Path(path)


def main(argv: list[str] | None = None) -> int:
    return script_main(run_validate, parse_args, argv)


if __name__ == "__main__":
    sys.exit(main())
