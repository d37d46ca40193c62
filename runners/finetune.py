"""``ncclrl finetune``: fine-tune a pretrained policy on a live platform under a measurement
budget, guard its decisions, export the table (keys: :class:`FinetuneCommand`; the method:
:mod:`ncclrl.agents.finetune`).

    ncclrl finetune backend=torch topology=h200-2x2-sock budget=230 out=runs/ft

``backend=torch`` measures on the GPUs of this machine (one job per knob setting, our plugin
selecting each configuration); ``backend=replay replay_store=SWEEP.sqlite`` answers every
measurement from an earlier exhaustive sweep instead (the same points, counted the same way; the
sweep measured with ``launch``), which compares fine-tuning with the sweep on its own data.
Every measurement goes to ``store`` (tags ``finetune`` and ``guard``).
"""

from __future__ import annotations

import json
import logging
import sys
import time
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf

from ncclrl.agents.finetune import FinetuneConfig, Finetuner, knob_label, sizes_for, write_outcome
from ncclrl.agents.pretrain import checkpoint_path, load_policy
from ncclrl.costmodel import nccl as N
from ncclrl.costmodel.errors import ConfigError
from ncclrl.costmodel.space import KNOB_FIELDS, Point
from ncclrl.costmodel.table import file_sha256
from ncclrl.costmodel.topology import Topology, load_topology
from ncclrl.costmodel.units import parse_bytes
from ncclrl.envs.live import require_gpus
from ncclrl.envs.measure import measure_whole
from ncclrl.envs.replay import ReplayWorkers, recorded_sweep, replay_knobs, replay_noise
from ncclrl.envs.store import Store
from ncclrl.envs.torch_workers import TableWorkers
from ncclrl.runners.config import Command, parse, register
from ncclrl.runners.progress import progress
from ncclrl.runners.sweep import LiveConfig

logger = logging.getLogger(__name__)
BASE_KNOBS_KEY = "/".join("0" * len(KNOB_FIELDS))  # NCCL's plain defaults, as sweep_reference keys settings


@dataclass
class TunedLiveConfig(LiveConfig):
    """Keys of the commands that tune on a live or replayed platform and export a table.

    :param backend: torch (PyTorch workers on this machine's GPUs) or replay (answers from a recorded sweep)
    :param replay_store: backend=replay: the store holding the exhaustive sweep to replay
    :param out: the folder the table, nccl.conf and the run's summary go to
    :param threads: PyTorch CPU threads for the policy's updates (1 is fastest for these small networks; 0: PyTorch's)
    """

    topology: str = ""
    backend: str = "torch"
    replay_store: str = ""
    out: str = "runs/finetune"
    samples: int = 5
    timing: str = "eager"
    timeout_s: float = 120.0
    store: str = "runs/finetune.sqlite"
    threads: int = 1

    def check(self) -> None:
        if self.threads < 0:
            raise ConfigError("threads", f"must be >= 0 (0: PyTorch's default), got {self.threads}")
        if self.backend not in ("torch", "replay"):
            raise ConfigError("backend", f"unknown value {self.backend!r}; allowed: torch, replay")
        if not self.topology:
            raise ConfigError("topology", "required: the platform the GPUs form (a preset name or YAML)")
        if self.backend == "replay" and not Path(self.replay_store).is_file():
            raise ConfigError("replay_store", f"backend=replay needs an existing sweep store, got "
                              f"{self.replay_store!r}")
        LiveConfig.check(self)


@dataclass
class FinetuneCommand(TunedLiveConfig, FinetuneConfig):
    """Fine-tune a pretrained policy on live (or replayed) measurements under a budget, guard its
    decisions against NCCL's defaults and export the table.

    :param checkpoint: the policy to start from: pretrained (shipped with ncclrl) or a policy.zip path
    """

    checkpoint: str = "pretrained"
    samples: int = 5

    def check(self) -> None:
        TunedLiveConfig.check(self)
        FinetuneConfig.check(self)


def parse_args(argv: list[str]) -> DictConfig:
    """The command's config from ``key=value`` overrides (what ``ncclrl finetune`` composes)."""
    return parse(COMMAND, argv)


def finetune_config(args: DictConfig) -> FinetuneConfig:
    """The method's settings out of the command's keys (declared once, in :class:`FinetuneConfig`)."""
    return FinetuneConfig(**{f.name: args[f.name] for f in fields(FinetuneConfig)})


def main_finetune(args: DictConfig) -> int:
    run_finetune(args.checkpoint, args)
    return 0


def make_measure(args: DictConfig, topo: Topology, store: Store, bar=None):
    """``measure(knobs, points, samples, tag)`` over the chosen backend; every point is stored (and
    counted on ``bar``, a progress bar)."""
    replay, seen = None, {}
    if args["backend"] == "replay":  # the sweep's jobs, then its repeat's (a point measured again)
        replay = recorded_sweep(args["replay_store"], topo, args["launch"], ("sweep", "sweep-repeat"), status="ok")

    def measure(knobs: Point, points: list[Point], samples: int, tag: str) -> list[list[float] | None]:
        if replay is not None:
            w = ReplayWorkers(replay, knobs, seen)
        else:

            w = TableWorkers(topo.nranks, topo.nodes, knobs, timing=args["timing"], timeout_s=float(args["timeout_s"]),
                             launch=args["launch"])
        res = measure_whole(w, points, store, topo.name, backend=args["backend"], samples=samples, tag=tag)
        if bar is not None:
            bar.advance(len(points))
        return res

    return measure


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


def run_finetune(checkpoint: str, args: DictConfig, out=sys.stdout) -> dict[str, Any]:

    topo = load_topology(args["topology"])
    colls = [N.parse_name("collectives", c, N.COLLECTIVES) for c in args["collectives"]]
    lo, hi = parse_bytes(args["min_bytes"], "min_bytes"), parse_bytes(args["max_bytes"], "max_bytes")
    cfg = finetune_config(args)
    cfg.check()
    if args["backend"] == "torch":  # before the policy loads and the store opens

        require_gpus(topo.nranks)
    if args["threads"]:
        torch.set_num_threads(int(args["threads"]))
    model = load_policy(checkpoint)
    model.set_random_seed(cfg.seed)
    sizes = sizes_for(topo, colls, lo, hi)
    store = Store(Path(args["store"]))

    def log(msg: str) -> None:
        logger.info(msg)

    t0 = time.time()
    knobs, noise = None, None
    if args["backend"] == "replay":
        knobs = replay_knobs(recorded_sweep(args["replay_store"], topo, args["launch"], status="ok"), topo)
        noise = replay_noise(args["replay_store"], topo, args["launch"], colls, sizes)
        log("# replay: the guard judges with the between-job spread of the store's validations" if noise else
            "# replay: the store has no validations to take the between-job spread from; the run's own repeats")
    with progress("finetune", cfg.budget) as bar:
        ft = Finetuner(topo, colls, sizes, model, make_measure(args, topo, store, bar), cfg, log=log, knobs=knobs,
                       noise_prior=noise)
        if cfg.budget < ft.reserve + ft.n_sizes:
            raise ConfigError("budget", f"{cfg.budget} points cannot cover {ft.n_sizes} sizes: the guard alone "
                              f"reserves {ft.reserve}; use at least {ft.reserve + 2 * ft.n_sizes}")
        res = ft.run()
    out_dir = Path(args["out"])
    prov = {"checkpoint": str(checkpoint), "policy_sha256": file_sha256(checkpoint_path(checkpoint)),
            "args": OmegaConf.to_container(args),
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


COMMAND = Command("finetune", FinetuneCommand, main_finetune,
                  "fine-tune a policy on live (or replayed) measurements under a budget, guard it, export the table",
                  out_key="out")
register(COMMAND)
