"""Judge a table on a simulated platform: speedup over NCCL's default, fraction of the optimum."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from ncclrl.costmodel import nccl as N
from ncclrl.costmodel.noise import geomean
from ncclrl.costmodel.replica import default_decisions
from ncclrl.costmodel.simulator import Configs, Simulator
from ncclrl.costmodel.table import Table
from ncclrl.envs import spaces as S

EVAL_SIZES = 1 << np.arange(3, 31, dtype=np.int64)  # 8 B .. 1 GiB
BANDS = ((0, 64 << 10, "8 B - 64 KiB"), (64 << 10, 4 << 20, "64 KiB - 4 MiB"), (4 << 20, 1 << 62, "4 MiB - 1 GiB"))


def optimum(sim: Simulator, coll: int, sizes: np.ndarray, conf: dict[str, int] | None = None
            ) -> tuple[np.ndarray, np.ndarray]:
    """Exhaustive per-call optimum over every valid action, under the per-process knobs ``conf``
    (``NCCL_MIN_NCHANNELS``, socket threads/sockets; a chunk action overrides ``NCCL_BUFFSIZE``)."""
    conf = conf or {}
    valid = np.flatnonzero(S.action_mask(sim.topo, coll))
    cfg = S.configs_for(coll, sizes[:, None], valid[None, :])
    cfg.comm_channels[:] = conf.get("NCCL_MIN_NCHANNELS", 0)
    cfg.buffsize_bytes[cfg.buffsize_bytes == 0] = conf.get("NCCL_BUFFSIZE", 0)
    cfg.socket_nthreads[:] = conf.get("NCCL_SOCKET_NTHREADS", 0)
    cfg.nsocks_perthread[:] = conf.get("NCCL_NSOCKS_PERTHREAD", 0)
    cfg.socket_inline_bytes[:] = conf.get("NCCL_SOCKET_INLINE", 0)
    t = sim.time_us(cfg, validate=False).reshape(sizes.size, -1)
    return t.min(axis=1), valid[np.argmin(t, axis=1)]


def evaluate_table(table: Table, sim: Simulator, collectives: list[str] | None = None,
                   sizes: np.ndarray = EVAL_SIZES, use_conf: bool = True) -> pd.DataFrame:
    """One row per (collective, size): NCCL default, table and optimum times (noise-free)."""
    conf = table.conf if use_conf else {}
    out = []
    for name in collectives or sorted({r.collective for r in table.rows}, key=N.COLLECTIVES.index):
        c = N.COLLECTIVES.index(name)
        d = default_decisions(sim.topo, c, sizes)
        t_def = sim.time_us(Configs.make(c, sizes, d.algo, d.proto, 0))
        rows = [r for r in table.rows if r.collective == name]
        algo, proto, ch = [], [], []
        for s in sizes:
            r = next(r for r in rows if r.min_bytes <= s <= r.max_bytes)
            algo.append(N.ALGOS.index(r.algo))
            proto.append(N.PROTOS.index(r.proto))
            ch.append(r.channels)
        t_tab = sim.time_us(Configs.make(c, sizes, algo, proto, ch, conf.get("NCCL_MIN_NCHANNELS", 0),
                                         conf.get("NCCL_BUFFSIZE", 0), conf.get("NCCL_SOCKET_NTHREADS", 0),
                                         conf.get("NCCL_NSOCKS_PERTHREAD", 0)))
        t_opt, a_opt = optimum(sim, c, sizes, conf)
        for i, s in enumerate(sizes):
            o = S.decode(a_opt[i])
            out.append({"collective": name, "nbytes": int(s),
                        "nccl": f"{N.ALGOS[d.algo[i]]}/{N.PROTOS[d.proto[i]]}/{int(d.channels[i])}",
                        "ours": f"{N.ALGOS[algo[i]]}/{N.PROTOS[proto[i]]}/{ch[i]}",
                        "optimum": f"{N.ALGOS[o.algo]}/{N.PROTOS[o.proto]}/{o.channels}",
                        "default_time_us": float(t_def[i]), "time_us": float(t_tab[i]),
                        "optimum_time_us": float(t_opt[i])})
    df = pd.DataFrame(out)
    df["speedup"] = df["default_time_us"] / df["time_us"]
    df["optimum_speedup"] = df["default_time_us"] / df["optimum_time_us"]
    return df


def summary(df: pd.DataFrame) -> dict[str, float]:
    g = geomean(df["speedup"])
    go = geomean(df["optimum_speedup"])
    return {"geomean_speedup": g, "optimum_geomean_speedup": go, "fraction_of_optimum": g / go,
            "worst_vs_default": float(df["speedup"].min()), "n": len(df)}


def band_report(df: pd.DataFrame) -> pd.DataFrame:
    rows = []
    for name in df["collective"].unique():
        sub = df[df["collective"] == name]
        for lo, hi, band in BANDS:
            b = sub[(sub["nbytes"] > lo) & (sub["nbytes"] <= hi)] if lo else sub[sub["nbytes"] <= hi]
            if b.empty:
                continue
            rows.append({"collective": name, "band": band,
                         "nccl": b["nccl"].mode().iloc[0], "ours": b["ours"].mode().iloc[0],
                         "speedup": geomean(b["speedup"]),
                         "regret": float(np.mean(np.log(b["time_us"] / b["optimum_time_us"])))})
    return pd.DataFrame(rows)


def s_curve_plot(df: pd.DataFrame, sim: Simulator, path: Path) -> Path:
    """The table's S-curves as the simulator predicts them, per collective: bus bandwidth of NCCL's
    defaults, the table and the optimum, and the table's speedup with the sizes predicted slower
    (:func:`ncclrl.agents.plots.plot_s_curve`)."""
    from ncclrl.agents.plots import plot_s_curve

    return plot_s_curve(df, sim.topo.name, sim.topo.nranks, path)["path"]
