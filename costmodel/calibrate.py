"""Fit a topology's simulator parameters to measurements (nccl-tests output).

Each measured row becomes a configuration: NCCL's environment of the run (``NCCL_ALGO``,
``NCCL_PROTO``, ``NCCL_MIN/MAX_NCHANNELS``, ``NCCL_BUFFSIZE``, socket knobs) restricts the
replica's choice exactly as it restricts NCCL's, so the configuration that ran is known for every
size. The fit is a robust (soft-L1) least-squares fit in log time with scipy, over the parameters
the data can identify (the (algorithm, protocol) entries it exercised, the protocols, the network
parameters when it spans nodes).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from ncclrl.costmodel import nccl as N
from ncclrl.costmodel.errors import ConfigError
from ncclrl.costmodel.nccltests import run_env
from ncclrl.costmodel.replica import default_decisions
from ncclrl.costmodel.simulator import Configs, SimParams, Simulator
from ncclrl.costmodel.topology import Topology

SIZE_BANDS = ((0, 64 << 10, "<= 64 KiB"), (64 << 10, 4 << 20, "64 KiB - 4 MiB"), (4 << 20, 1 << 62, "> 4 MiB"))


def parse_nccl_list(value: str, names: tuple[str, ...], coll: int, var: str) -> np.ndarray:
    """Which of ``names`` NCCL's ``NCCL_ALGO``/``NCCL_PROTO`` syntax enables for collective ``coll``:
    ``list``, ``^list`` (all but), and ``func:list;func:list`` per collective."""
    enabled = np.ones(len(names), dtype=bool)
    coll_names = ("broadcast", "reduce", "allgather", "reducescatter", "allreduce")
    for i, part in enumerate(value.split(";")):
        part = part.strip()
        if not part:
            continue
        prefix, _, elems = part.rpartition(":")
        if prefix and prefix.strip().lower() not in coll_names:
            raise ConfigError(var, f"unknown collective prefix {prefix!r}; allowed: {', '.join(coll_names)}")
        if prefix and coll_names.index(prefix.strip().lower()) != coll:
            continue
        if not prefix and i > 0:
            raise ConfigError(var, "only the first entry may lack a collective prefix")
        negate = elems.startswith("^")
        items = [e.strip() for e in elems.lstrip("^").split(",") if e.strip()]
        sel = np.zeros(len(names), dtype=bool)
        for e in items:
            sel[N.parse_name(var, e, names)] = True
        enabled = ~sel if negate else sel
    return enabled


def env_to_config(topo: Topology, coll: int, env: dict[str, str]) -> dict:
    """The allowed mask and per-process knobs an NCCL environment sets."""
    algos = parse_nccl_list(env["NCCL_ALGO"], N.ALGOS, coll, "NCCL_ALGO") if "NCCL_ALGO" in env \
        else np.ones(N.NUM_ALGOS, bool)
    protos = parse_nccl_list(env["NCCL_PROTO"], N.PROTOS, coll, "NCCL_PROTO") if "NCCL_PROTO" in env \
        else np.ones(N.NUM_PROTOS, bool)
    comm = topo.nccl.channels
    if "NCCL_MAX_NCHANNELS" in env:
        comm = min(comm, int(env["NCCL_MAX_NCHANNELS"]))
    if "NCCL_MIN_NCHANNELS" in env:
        comm = max(comm, int(env["NCCL_MIN_NCHANNELS"]))
    comm = int(min(max(comm, 1), N.MAX_CHANNELS))
    return {
        "allowed": algos[:, None] & protos[None, :],
        "comm_channels": comm if comm != topo.nccl.channels else 0,
        "buffsize_bytes": int(env.get("NCCL_BUFFSIZE", 0)),
        "socket_nthreads": int(env.get("NCCL_SOCKET_NTHREADS", 0)),
        "nsocks_perthread": int(env.get("NCCL_NSOCKS_PERTHREAD", 0)),
        "socket_inline_bytes": int(env.get("NCCL_SOCKET_INLINE", 0)),
    }


def measurements_from_runs(topo: Topology, runs: list) -> pd.DataFrame:
    """One row per measured time: the configuration that ran and its ``time_us``."""

    rows = []
    for run in runs:
        if run.collective not in N.COLLECTIVES:
            raise ConfigError("collective", f"{run.source}: {run.collective!r} is not tunable; allowed: "
                              f"{', '.join(N.COLLECTIVES)}")
        if run.nranks and run.nranks != topo.nranks:
            raise ConfigError("topology", f"{run.source} ran on {run.nranks} ranks but {topo.name} has "
                              f"{topo.nranks}; pick the topology the run was made on")
        coll = N.COLLECTIVES.index(run.collective)
        env = run_env(run)
        knobs = env_to_config(topo, coll, env)
        sizes = np.array([r.nbytes for r in run.records], dtype=np.int64)
        keep = sizes > 0
        d = default_decisions(topo, coll, sizes[keep], allowed=knobs["allowed"],
                              comm_channels=knobs["comm_channels"])
        label = Path(run.source).stem
        for j, rec in enumerate(r for r, k in zip(run.records, keep, strict=True) if k):
            for kind, t in zip(("out_of_place", "in_place"), (rec.out_of_place, rec.in_place), strict=True):
                if t is None or not np.isfinite(t.time_us) or t.time_us <= 0:
                    continue
                rows.append({
                    "config": label, "source": run.source, "placement": kind,
                    "collective": run.collective, "nbytes": int(rec.nbytes),
                    "algo": N.ALGOS[d.algo[j]], "proto": N.PROTOS[d.proto[j]], "channels": 0,
                    "comm_channels": knobs["comm_channels"], "buffsize_bytes": knobs["buffsize_bytes"],
                    "socket_nthreads": knobs["socket_nthreads"],
                    "nsocks_perthread": knobs["nsocks_perthread"],
                    "socket_inline_bytes": knobs["socket_inline_bytes"], "time_us": float(t.time_us),
                })
    if not rows:
        raise ConfigError("files", "no usable measurements in the given files")
    return pd.DataFrame(rows)


def configs_from_frame(df: pd.DataFrame) -> Configs:
    return Configs.make(
        [N.COLLECTIVES.index(c) for c in df["collective"]], df["nbytes"].to_numpy(),
        [N.ALGOS.index(a) for a in df["algo"]], [N.PROTOS.index(p) for p in df["proto"]],
        df["channels"].to_numpy(), df.get("comm_channels", 0), df.get("buffsize_bytes", 0),
        df.get("socket_nthreads", 0), df.get("nsocks_perthread", 0), df.get("socket_inline_bytes", 0))


@dataclass
class _Slot:
    key: str
    index: tuple
    lo: float
    hi: float


def _free_parameters(topo: Topology, df: pd.DataFrame, p: SimParams) -> list[_Slot]:
    slots = [_Slot("launch_us", (), 0.1, 200.0), _Slot("overlap_exp", (), 1.0, 50.0),
             _Slot("channel_us", (), 1e-4, 5.0),
             _Slot("contention_exp", (), 1.5, 30.0)]
    pairs = sorted({(N.ALGOS.index(a), N.PROTOS.index(q)) for a, q in zip(df["algo"], df["proto"], strict=True)})
    for a, q in pairs:
        slots.append(_Slot("hop_us", (a, q), 1e-3, 100.0))
        slots.append(_Slot("channel_bw_gbps", (a, q), 0.1, 1000.0))
        slots.append(_Slot("cap_gbps", (a, q), 0.5, 5000.0))
    for a in sorted({a for a, _ in pairs}):
        slots.append(_Slot("fill_steps", (a,), 1e-3, 20.0))
    for q in sorted({q for _, q in pairs}):
        slots.append(_Slot("loop_us", (q,), 1e-4, 20.0))
        if topo.nodes > 1:
            slots.append(_Slot("net_hop_us", (q,), 0.1, 500.0))
    if topo.nodes > 1:
        slots.append(_Slot("flow_bw_gbps", (), 0.05, 500.0))
        if topo.net.kind == "socket":
            slots.append(_Slot("thread_bw_gbps", (), 0.05, 500.0))
            slots.append(_Slot("sock_send_us", (), 0.01, 500.0))
            slots.append(_Slot("sock_thread_us", (), 0.01, 500.0))
    # Start inside the bounds.
    for s in slots:
        v = _get(p, s)
        _set(p, s, float(np.clip(v if v > 0 else s.lo * 10, s.lo * 1.001, s.hi * 0.999)))
    return slots


def _get(p: SimParams, s: _Slot) -> float:
    v = getattr(p, s.key)
    return float(v[s.index]) if s.index else float(v)


def _set(p: SimParams, s: _Slot, value: float) -> None:
    if s.index:
        getattr(p, s.key)[s.index] = value
    else:
        setattr(p, s.key, value)


@dataclass
class FitResult:
    params: SimParams
    n_train: int
    cost: float
    n_params: int


def fit(topo: Topology, df: pd.DataFrame, params: SimParams | None = None, max_nfev: int = 400,
        prior_weight: float = 0.2) -> FitResult:
    """Least-squares fit (log time, soft-L1) of the parameters the measurements identify.

    ``prior_weight`` adds ``w * log(value / start)`` residuals that keep parameters the data
    barely constrains near their physical starting values (instead of drifting to a bound).
    """
    p = (params or SimParams.from_topology(topo)).copy()
    slots = _free_parameters(topo, df, p)
    cfg = configs_from_frame(df)
    cfg.validate(topo)
    y = np.log(df["time_us"].to_numpy())
    sim = Simulator(topo, p)

    x0 = np.log([_get(p, s) for s in slots])
    # Each run (file) gets its own host-overhead factor: a fresh process measured its first sizes
    # up to ~1.5x slower (shared/data README). These nuisance factors keep that warm-up out of the
    # platform's parameters; predictions use the common launch_us.
    runs, run_idx = np.unique(df["source"].to_numpy(), return_inverse=True)
    n_slots = len(slots)
    i_launch = next(i for i, s in enumerate(slots) if s.key == "launch_us")

    def residual(theta: np.ndarray) -> np.ndarray:
        for s, v in zip(slots, np.exp(theta[:n_slots]), strict=True):
            _set(p, s, v)
        p.launch_us = np.exp(theta[i_launch] + theta[n_slots:][run_idx])
        try:
            fit_res = np.log(sim.time_us(cfg, validate=False)) - y
        finally:
            p.launch_us = float(np.exp(theta[i_launch]))
        return np.concatenate([fit_res, prior_weight * (theta[:n_slots] - x0[:n_slots]), theta[n_slots:]])

    x0 = np.concatenate([x0, np.zeros(len(runs))])

    lo = np.concatenate([np.log([s.lo for s in slots]), np.full(len(runs), -1.0)])
    hi = np.concatenate([np.log([s.hi for s in slots]), np.full(len(runs), 1.0)])
    from scipy.optimize import least_squares  # loaded by a fit, not by every command that imports this

    res = least_squares(residual, x0, bounds=(lo, hi), loss="soft_l1", f_scale=0.05, max_nfev=max_nfev,
                        x_scale=1.0)
    residual(res.x)
    p.launch_us = float(np.exp(res.x[i_launch]))
    return FitResult(params=p, n_train=len(df), cost=float(res.cost), n_params=len(slots))


def relative_errors(sim: Simulator, df: pd.DataFrame) -> np.ndarray:
    pred = sim.time_us(configs_from_frame(df))
    meas = df["time_us"].to_numpy()
    return np.abs(pred - meas) / meas


def error_table(sim: Simulator, df: pd.DataFrame) -> pd.DataFrame:
    """Median and 90th-percentile relative error per size band (and overall)."""
    err = relative_errors(sim, df)
    rows = []
    for lo, hi, name in SIZE_BANDS:
        m = (df["nbytes"].to_numpy() > lo) & (df["nbytes"].to_numpy() <= hi)
        if m.any():
            rows.append({"band": name, "rows": int(m.sum()), "median_rel_err": float(np.median(err[m])),
                         "p90_rel_err": float(np.quantile(err[m], 0.9))})
    rows.append({"band": "all", "rows": len(err), "median_rel_err": float(np.median(err)),
                 "p90_rel_err": float(np.quantile(err, 0.9))})
    return pd.DataFrame(rows)


def holdout_split(df: pd.DataFrame, seed: int = 0) -> tuple[pd.DataFrame, pd.DataFrame, list[str]]:
    """Hold whole configurations (files) out of the fit: one per family of configurations that
    share a forced algorithm/protocol (or force none), chosen with ``seed``; families of fewer than
    three configurations stay in the fit so every exercised (algorithm, protocol) is still fitted."""
    rng = np.random.default_rng(seed)
    configs = sorted(df["config"].unique())
    families: dict[str, list[str]] = {}
    for c in configs:
        sub = df[df["config"] == c]
        forced = sub[["algo", "proto"]].drop_duplicates()
        key = f"{forced.iloc[0]['algo']}_{forced.iloc[0]['proto']}" if len(forced) == 1 else "mixed"
        families.setdefault(key, []).append(c)
    held = []
    for key in sorted(families):
        members = families[key]
        if len(members) >= 3:
            held.append(members[int(rng.integers(len(members)))])
    mask = df["config"].isin(held)
    return df[~mask].reset_index(drop=True), df[mask].reset_index(drop=True), held


def measurements_from_store(topo: Topology, frame: pd.DataFrame) -> pd.DataFrame:
    """Rows of the measurement store (``Store.frame``, status ok) as fit rows: NCCL's default
    resolved to the replica's decision under the row's knobs; one nuisance "source" per knob
    setting (each setting ran in its own processes)."""
    df = frame[(frame["status"] == "ok") & (frame["topology"] == topo.name)].copy()
    if df.empty:
        raise ConfigError("store", f"no measurements of {topo.name} in the store")
    df = df[df["collective"].isin(N.COLLECTIVES) & df["median_us"].notna() & (df["median_us"] > 0)]
    knob_cols = ["comm_channels", "buffsize_bytes", "socket_nthreads", "nsocks_perthread", "socket_inline_bytes"]
    if "socket_inline_bytes" not in df:
        df["socket_inline_bytes"] = 0
    df["source"] = df[knob_cols].astype(int).astype(str).agg("/".join, axis=1)
    df["time_us"] = df["median_us"].astype(float)
    algo, proto = df["algo"].to_numpy(dtype=object).copy(), df["proto"].to_numpy(dtype=object).copy()
    for (coll, comm), idx in df.groupby(["collective", "comm_channels"]).groups.items():
        pos = df.index.get_indexer(idx)
        m = df["algo"].to_numpy()[pos] == "default"
        if not m.any():
            continue
        d = default_decisions(topo, N.COLLECTIVES.index(coll), df["nbytes"].to_numpy()[pos][m],
                              comm_channels=int(comm))
        algo[pos[m]] = [N.ALGOS[a] for a in d.algo]
        proto[pos[m]] = [N.PROTOS[p] for p in d.proto]
    df["algo"], df["proto"] = algo, proto
    return df[["source", "collective", "nbytes", "algo", "proto", "channels", *knob_cols, "time_us"]].reset_index(
        drop=True)
