"""``ncclrl finetune``: fine-tune a pretrained policy on a live platform under a measurement
budget, guard its decisions, export the table (see :mod:`agents.finetune`).

    ncclrl finetune --checkpoint runs/main/policy.zip backend=torch topology=h200-2x2-sock budget=230

``backend=torch`` measures on the GPUs of this machine (one job per knob setting, our plugin
selecting each configuration); ``backend=replay replay_store=SWEEP.sqlite`` answers every
measurement from an earlier exhaustive sweep instead (the same points, counted the same way; the
sweep measured with ``launch``), which
is how the budget study in docs/live.md compares fine-tuning with the sweep. Every measurement goes
to ``store`` (tags ``finetune`` and ``guard``).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from costmodel import nccl as N
from costmodel.errors import ConfigError
from costmodel.topology import Topology, load_topology
from runners.store import KNOB_FIELDS, Point, Store
from runners.sweep import check_timing, knob_grid, measure_whole, parse_kv

DEFAULTS: dict[str, str] = {"backend": "torch", "topology": "", "collectives": "allreduce", "min_bytes": "8",
                            "max_bytes": "256M", "budget": "200", "wall_s": "1800", "rounds": "3",
                            "confs_per_round": "2", "probe_every": "4", "per_size": "1", "samples": "5",
                            "guard_samples": "9", "guard_confs": "2", "verify": "8", "verify_reserve": "3",
                            "tie_pct": "10", "rows_on_ties": "true",
                            "ppo_steps": "8192", "seed": "0", "store": "runs/finetune.sqlite",
                            "replay_store": "",
                            "out": "runs/finetune", "timing": "eager", "timeout_s": "120", "launch": "nccl"}
BASE_KNOBS_KEY = "/".join("0" * len(KNOB_FIELDS))  # NCCL's plain defaults, as sweep_reference keys settings
INTS = ("budget", "rounds", "confs_per_round", "probe_every", "per_size", "samples", "guard_samples", "guard_confs",
        "verify", "verify_reserve", "ppo_steps", "seed")


def check_backend_args(args: dict[str, str]) -> None:
    """The checks ``finetune`` and ``tune`` share: backend, topology, the replayed store."""
    if args["backend"] not in ("torch", "replay"):
        raise ConfigError("backend", f"unknown value {args['backend']!r}; allowed: torch, replay")
    if not args["topology"]:
        raise ConfigError("topology", "required: the platform the GPUs form (a preset name or YAML)")
    if args["backend"] == "replay" and not Path(args["replay_store"]).is_file():
        raise ConfigError("replay_store", f"backend=replay needs an existing sweep store, got {args['replay_store']!r}")
    check_timing(args)


def parse_args(argv: list[str]) -> dict[str, str]:
    args = parse_kv(argv, DEFAULTS, "finetune")
    check_backend_args(args)
    for k in INTS:
        if not args[k].lstrip("-").isdigit():
            raise ConfigError(k, f"must be a whole number, got {args[k]!r}")
    try:
        float(args["tie_pct"])
    except ValueError:
        raise ConfigError("tie_pct", f"must be a number of percent in [0, 100), got {args['tie_pct']!r}") from None
    if args["rows_on_ties"] not in ("true", "false"):
        raise ConfigError("rows_on_ties", f"unknown value {args['rows_on_ties']!r}; allowed: true, false")
    return args


class ReplayWorkers:
    """Answers from a recorded sweep: each point's stored samples (the sweep's sample count); a
    point measured again gets the next recorded job of it (the sweep's, then its repeat's, then
    round again), so repeated jobs differ as they did on the machine; a point the sweep did not
    measure is a failure, like a configuration NCCL could not run. ``seen`` counts the requests
    per point across the jobs of one run (share it between them)."""

    whole_request = True

    def __init__(self, frame, knobs: Point, seen: dict[tuple, int] | None = None) -> None:
        self.knobs, self.failures, self.last_modes = knobs, {}, []
        self.nccl_version = str(frame["nccl_version"].iloc[0]) if len(frame) else "?"
        self._by: dict[tuple, list[list[float]]] = {}
        for r in frame.itertuples(index=False):  # in the frame's order: a point's first job first
            self._by.setdefault((r.collective, int(r.nbytes), r.algo, r.proto, int(r.channels),
                                 *(int(getattr(r, f)) for f in KNOB_FIELDS)), []).append(list(r.samples_us))
        self._timing = str(frame["timing"].iloc[0]) if len(frame) else "eager"
        self.seen = {} if seen is None else seen

    def measure(self, points: list[Point], samples: int = 5) -> list[list[float] | None]:
        out = []
        self.failures = {}
        for i, p in enumerate(points):
            key = (p.collective, int(p.nbytes), p.algo, p.proto, int(p.channels), *map(int, p.knobs))
            jobs = self._by.get(key)
            v = None
            if jobs:
                n = self.seen.get(key, 0)
                self.seen[key] = n + 1
                v = jobs[n % len(jobs)]
            else:
                self.failures[i] = "not in the replayed sweep"
            out.append(v)
        self.last_modes = [self._timing] * len(points)
        return out

    def close(self) -> None:
        pass


def recorded_sweep(path: str | Path, topo: Topology, launch: str, tags: tuple[str, ...] = ("sweep",),
                   **where: Any):
    """The rows of the exhaustive sweep of ``topo`` in the store at ``path`` measured with ``launch``
    (tags in ``tags``, in that order); a one-line error when there is none, naming the launches
    the store has."""
    import pandas as pd

    with Store(Path(path)) as rs:
        frames = [rs.frame(launch, topology=topo.name, tag=t, **where) for t in tags]
        if frames[0].empty:
            from runners.live_common import launch_of

            have = sorted({launch_of(t) for t in rs.frame(topology=topo.name, tag=tags[0]).timing})
            hint = f"; it has launch={' and launch='.join(have)}" if have else ""
            raise ConfigError("replay_store", f"no sweep of {topo.name} measured with launch={launch} in {path}{hint}")
    return pd.concat(frames)


def replay_noise(path: str | Path, topo: Topology, launch: str, colls: list[int],
                 sizes: dict[int, list[int]]) -> dict[str, dict[int, tuple[float, int]]] | None:
    """The between-job spread a replay judges with: from the store's recorded validations (NCCL's
    plain defaults in many jobs, :func:`runners.noise.aa_noise`), per collective; ``None`` when the
    store has no repeated job of them. A replayed run's own repeats are not independent jobs: a
    point the sweep measured once answers every repeat with the same samples."""
    from runners.noise import aa_noise
    from runners.store import job_ids

    out = {}
    with Store(Path(path)) as rs:
        for c in colls:
            f = rs.frame(launch, topology=topo.name, tag="validate-base", status="ok", collective=N.COLLECTIVES[c])
            if f.empty:
                continue
            f["job"] = job_ids(f)
            n = aa_noise(f, sizes[c])
            if any(df for _s, df in n.values()):
                out[N.COLLECTIVES[c]] = n
    return out or None


def make_measure(args: dict[str, str], topo: Topology, store: Store, out=sys.stdout):
    """``measure(knobs, points, samples, tag)`` over the chosen backend; every point is stored."""
    replay, seen = None, {}
    if args["backend"] == "replay":  # the sweep's jobs, then its repeat's (a point measured again)
        replay = recorded_sweep(args["replay_store"], topo, args["launch"], ("sweep", "sweep-repeat"), status="ok")

    def measure(knobs: Point, points: list[Point], samples: int, tag: str) -> list[list[float] | None]:
        if replay is not None:
            w = ReplayWorkers(replay, knobs, seen)
        else:
            from runners.table_backend import TableWorkers

            w = TableWorkers(topo.nranks, topo.nodes, knobs, timing=args["timing"], timeout_s=float(args["timeout_s"]),
                             launch=args["launch"])
        return measure_whole(w, points, store, topo.name, backend=args["backend"], samples=samples, tag=tag,
                             out=out)

    return measure


def replay_knobs(frame, topo: Topology) -> list[Point]:
    """The knob settings of the full grid that a recorded sweep measured (NCCL's defaults first):
    replaying fine-tunes over the space the sweep covered."""
    have = {tuple(int(v) for v in row) for row in frame[list(KNOB_FIELDS)].drop_duplicates().itertuples(index=False)}
    knobs = [k for k in knob_grid(topo, "full") if k.knobs in have]
    if not knobs or any(knobs[0].knobs):
        raise ConfigError("replay_store", f"the sweep of {topo.name} has no run under NCCL's defaults")
    return knobs


def sweep_reference(frame, topo: Topology, sizes: dict[int, list[int]]) -> dict[str, Any]:
    """From an exhaustive sweep: per knob setting, the geometric-mean speedup of the best per-call
    configuration per size over NCCL's plain default; the best setting is the optimum a table plus
    an nccl.conf can reach in that space."""
    df = frame[frame.status == "ok"]
    key = df[list(KNOB_FIELDS)].astype(int).astype(str).agg("/".join, axis=1)
    med = {(r.collective, int(r.nbytes), r.algo, r.proto, int(r.channels), k): float(r.median_us)
           for r, k in zip(df.itertuples(index=False), key, strict=True)}
    out: dict[str, Any] = {"per_conf": {}, "points": int(len(df))}
    for k in sorted(set(key)):
        logs = []
        for c, ss in sizes.items():
            for s in ss:
                base = med.get((N.COLLECTIVES[c], s, "default", "default", 0, BASE_KNOBS_KEY))
                vals = [v for (cc, n, *_rest, kk), v in med.items() if cc == N.COLLECTIVES[c] and n == s and kk == k]
                if base and vals:
                    logs.append(np.log(base / min(vals)))
        if logs:
            out["per_conf"][k] = float(np.exp(np.mean(logs)))
    out["optimum"] = max(out["per_conf"].values())
    out["optimum_conf"] = max(out["per_conf"], key=out["per_conf"].get)
    out["_med"] = med
    return out


def table_speedup_on_sweep(ref: dict[str, Any], conf: Point, rows: list[dict], sizes: dict[int, list[int]],
                           lo: int = 0, hi: int | None = None) -> float | None:
    """Geometric-mean speedup the fine-tuned table + conf would have had in the sweep's own data, over
    the sizes in [``lo``, ``hi``] (``None`` when the sweep has none there)."""
    med, k = ref["_med"], "/".join(map(str, conf.knobs))
    by = {(r["collective"], r["nbytes"]): r["key"] for r in rows}
    logs = []
    for c, ss in sizes.items():
        for s in ss:
            if s < lo or (hi is not None and s > hi):
                continue
            name = N.COLLECTIVES[c]
            base = med.get((name, s, "default", "default", 0, BASE_KNOBS_KEY))
            t = med.get((name, s, *by.get((name, s), ("default", "default", 0)), k))
            if base and t:
                logs.append(np.log(base / t))
    return float(np.exp(np.mean(logs))) if logs else None


def run_finetune(checkpoint: str, args: dict[str, str], out=sys.stdout) -> dict[str, Any]:
    from agents.finetune import FinetuneConfig, Finetuner, knob_label, sizes_for, write_outcome
    from agents.pretrain import load_policy
    from runners.cli import parse_bytes
    from runners.export import file_sha256

    topo = load_topology(args["topology"])
    colls = [N.parse_name("collectives", c, N.COLLECTIVES) for c in args["collectives"].split(",") if c]
    lo, hi = parse_bytes(args["min_bytes"], "min_bytes"), parse_bytes(args["max_bytes"], "max_bytes")
    cfg = FinetuneConfig(budget=int(args["budget"]), wall_s=float(args["wall_s"]), rounds=int(args["rounds"]),
                         confs_per_round=int(args["confs_per_round"]),
                         probe_every=int(args["probe_every"]), per_size=int(args["per_size"]),
                         samples=int(args["samples"]), guard_samples=int(args["guard_samples"]),
                         guard_confs=int(args["guard_confs"]), verify=int(args["verify"]),
                         verify_reserve=int(args["verify_reserve"]), ppo_steps=int(args["ppo_steps"]),
                         tie_pct=float(args["tie_pct"]), rows_on_ties=args["rows_on_ties"] == "true",
                         seed=int(args["seed"]))
    cfg.check()
    if args["backend"] == "torch":  # before the policy loads and the store opens
        from runners.live_common import require_gpus

        require_gpus(topo.nranks)
    model = load_policy(checkpoint)
    model.set_random_seed(cfg.seed)
    sizes = sizes_for(topo, colls, lo, hi)
    store = Store(Path(args["store"]))

    def log(msg: str) -> None:
        print(msg, file=out, flush=True)

    t0 = time.time()
    knobs, noise = None, None
    if args["backend"] == "replay":
        knobs = replay_knobs(recorded_sweep(args["replay_store"], topo, args["launch"], status="ok"), topo)
        noise = replay_noise(args["replay_store"], topo, args["launch"], colls, sizes)
        log("# replay: the guard judges with the between-job spread of the store's validations" if noise else
            "# replay: the store has no validations to take the between-job spread from; the run's own repeats")
    ft = Finetuner(topo, colls, sizes, model, make_measure(args, topo, store, out), cfg, log=log, knobs=knobs,
                   noise_prior=noise)
    if cfg.budget < ft.reserve + ft.n_sizes:
        raise ConfigError("budget", f"{cfg.budget} points cannot cover {ft.n_sizes} sizes: the guard alone "
                          f"reserves {ft.reserve}; use at least {ft.reserve + 2 * ft.n_sizes}")
    res = ft.run()
    out_dir = Path(args["out"])
    prov = {"checkpoint": str(checkpoint), "policy_sha256": file_sha256(checkpoint), "args": args,
            "nccl_version": topo.nccl.version, "wall_s": round(time.time() - t0, 1)}
    paths = write_outcome(res, topo, sizes, out_dir, prov)
    model.save(str(out_dir / "policy.zip"))
    log(f"# fine-tuned {topo.name} {','.join(N.COLLECTIVES[c] for c in colls)}: {res.measured} measurements in "
        f"{res.rounds} rounds, {time.time() - t0:.0f} s; knobs: {knob_label(res.conf)}; {len(res.rows)} rows kept by "
        f"the guard of {sum(1 for g in res.guard if g['nbytes'] and g['knobs'] == knob_label(res.conf))} checked")
    summary: dict[str, Any] = {"measured": res.measured, "rows": len(res.rows), "conf": res.conf.env(),
                               "paths": {k: str(v) for k, v in paths.items()}}
    if args["backend"] == "replay":
        one = {"collective": N.COLLECTIVES[colls[0]]} if len(colls) == 1 else {}
        ref = sweep_reference(recorded_sweep(args["replay_store"], topo, args["launch"], **one), topo, sizes)
        got = table_speedup_on_sweep(ref, res.conf, res.rows, sizes)
        big = table_speedup_on_sweep(ref, res.conf, res.rows, sizes, 64 << 20, 256 << 20)
        summary.update(sweep_points=ref["points"], optimum=ref["optimum"], optimum_conf=ref["optimum_conf"],
                       speedup_on_sweep=got, fraction=got / ref["optimum"], speedup_on_sweep_64_256MiB=big)
        log(f"# on the sweep's own data: {got:.3f}x vs the sweep optimum {ref['optimum']:.3f}x "
            f"({100 * got / ref['optimum']:.1f}%), with {res.measured} of {ref['points']} measurements "
            f"({100 * res.measured / ref['points']:.1f}%)" + (f"; {big:.2f}x at 64-256 MiB" if big else ""))
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=1, default=str))
    return summary
