"""``ncclrl finetune``: a tuning run on a live platform under a GPU-time budget, in whole jobs
(``strategy=jobs``, the default) or with a learned per-point strategy, exporting the table the
measurements support (keys: :class:`FinetuneCommand`;
the method: :mod:`ncclrl.agents.finetune`, :mod:`ncclrl.agents.strategy`).

    ncclrl finetune backend=torch topology=h200-2x2-sock budget=0.5sweep out=runs/ft

``backend=torch`` measures on the GPUs of this machine (each job one knob setting, our plugin
selecting each configuration); ``backend=replay replay_store=SWEEP.sqlite`` answers every
measurement from an earlier exhaustive sweep instead (the same points, counted the same way; the
sweep measured with ``launch``), which compares fine-tuning with the sweep on its own data;
``backend=replay grid=FILE`` (or ``grid=[FILE,...]``) answers from a measured grid given as files
instead (nccl-tests outputs under forced configurations, NVIDIA's example-plugin CSV, ...:
:mod:`ncclrl.envs.grids`), NCCL's default from ``grid_default``. Every measurement goes to ``store``
(tag ``finetune``) as soon as its job ends.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from omegaconf import DictConfig, OmegaConf

from ncclrl.agents.calibration import CALIBRATE
from ncclrl.agents.compose import ComposerController
from ncclrl.agents.compose_train import PolicyComposer, composer_path, is_composer
from ncclrl.agents.finetune import finetune, knob_label, sizes_for, write_outcome
from ncclrl.agents.problem import Decision, Evaluator, Problem, predicted_sweep_gpu_s
from ncclrl.agents.strategy import JobController, PolicyController, SearchConfig, strategy_path
from ncclrl.agents.suite import Instance, gridded, recorded_points
from ncclrl.costmodel import nccl as N
from ncclrl.costmodel.errors import ConfigError
from ncclrl.costmodel.jobcost import format_gpu_s, parse_budget
from ncclrl.costmodel.space import KNOB_FIELDS, Point
from ncclrl.costmodel.table import file_sha256
from ncclrl.costmodel.topology import Topology, load_topology
from ncclrl.costmodel.units import parse_bytes
from ncclrl.costmodel.workload import load_workload
from ncclrl.envs.grids import PUBLIC_GRIDS, GridWorkers, read_grid, read_public_grid
from ncclrl.envs.live import TIMEOUT
from ncclrl.envs.measure import measure_whole
from ncclrl.envs.replay import ReplayWorkers, recorded_sweep
from ncclrl.envs.store import Store
from ncclrl.runners.config import Command, parse, register
from ncclrl.runners.progress import progress
from ncclrl.runners.sweep import LiveConfig, check_launch, check_load, live_workers, load_tag

logger = logging.getLogger(__name__)
BASE_KNOBS_KEY = "/".join("0" * len(KNOB_FIELDS))  # NCCL's plain defaults, as sweep_reference keys settings


@dataclass
class TunedLiveConfig(LiveConfig):
    """Keys of the commands that tune on a live or replayed platform and export a table.

    :param backend: torch (PyTorch workers on this machine's GPUs) or replay (answers from a recorded sweep)
    :param replay_store: backend=replay: the store holding the exhaustive sweep to replay
    :param grid: backend=replay: a measured grid to replay instead of a store: its files (nccl-tests
        outputs under forced configurations, NVIDIA's example-plugin CSV, nccl-tests rows as CSV, a
        training-step proxy CSV) or the name of a public grid in the shared data; the grid's own
        collectives and sizes are tuned (collectives, min_bytes and max_bytes do not apply)
    :param grid_default: grid=: NCCL's default where the grid has no unforced run: auto (the grid's
        unforced runs, else the replica), replica (NCCL's decision as the replica predicts it), or
        files: a run of NCCL's defaults (nccl-tests output, or a CSV of bytes then time in us) or
        NCCL_DEBUG=INFO logs with NCCL's per-call decisions
    :param out: the folder the table, nccl.conf and the run's summary go to
    """

    topology: str = ""
    backend: str = "torch"
    replay_store: str = ""
    grid: list[str] = field(default_factory=list)
    grid_default: list[str] = field(default_factory=lambda: ["auto"])
    out: str = "runs/finetune"
    samples: int = 5
    timing: str = "eager"
    timeout_s: float = 120.0
    store: str = "runs/finetune.sqlite"

    def check(self) -> None:
        if self.backend not in ("torch", "replay"):
            raise ConfigError("backend", f"unknown value {self.backend!r}; allowed: torch, replay")
        if not self.topology:
            raise ConfigError("topology", "required: the platform the GPUs form (a preset name or YAML)")
        if self.grid and self.backend != "replay":
            raise ConfigError("grid", "a measured grid is replayed: set backend=replay")
        if self.grid and self.replay_store:
            raise ConfigError("grid", "give a grid or replay_store=, not both")
        if self.backend == "replay" and not self.grid and not Path(self.replay_store).is_file():
            raise ConfigError("replay_store", f"backend=replay needs an existing sweep store (or grid=FILE), got "
                              f"{self.replay_store!r}")
        if self.grid:
            grid_instance(self.grid, self.grid_default, load_topology(self.topology))
        LiveConfig.check(self)


@dataclass
class FinetuneCommand(TunedLiveConfig):
    """Fine-tune: a tuning run of the search strategy on live (or replayed) measurements under a
    budget; export the table and ``nccl.conf`` the measurements support, with the evidence per row.

    :param budget: GPU-time allowed in all, NCCL's defaults included: a GPU-time (``600s``, ``10min``,
        ``1.5h``: a job's wall time times its GPUs) or ``Nsweep``, N times what one full sweep of the
        space is predicted to cost (``0.5sweep``: half of it)
    :param wall_s: no new measurement after this many seconds (0: no limit), whatever is left of budget
    :param strategy: the search strategy: jobs (whole jobs by expected improvement per GPU-second), ppo (the
        PPO job composer installed with ncclrl: which job next, and when to stop), shipped (the learned
        per-point strategy installed with ncclrl), or a strategy.json or composer.json that ncclrl pretrain wrote
    :param serve_steps: strategy=ppo: training steps the exported table will serve; each job's GPU-time is
        weighed against the step time it may save over them (one call per size per step, or the profile's)
    :param search: the run's settings: search.round_points, search.decision.delta, search.decision.alpha, ...
    :param profile: a job profile (ncclrl profile): measure only the collectives and sizes the job calls
        on the whole job's communicator, for its communication time per step (calls x time), and report
        the time per step saved; collectives, min_bytes and max_bytes then come from the profile
    :param load: none, or gemm: every sample runs beside matrix products on each GPU, so the run tunes the
        collectives' times under compute (stored under tag finetune+gemmN with the products' slowdown;
        backend=torch)
    :param load_n: load=gemm: the products' size (load_n x load_n, bfloat16); size it like your model's
    :param calibrate: off (the default): the prior as given; auto: on a platform the prior was not
        calibrated for (the topology carries no fitted sim block), the first job measures NCCL's defaults at
        every size and the prior is calibrated on it before the search; on: always (on the public grids it
        lowered the run's result: docs/results/calibration.md)
    """

    budget: str = "0.5sweep"
    wall_s: float = 0.0
    strategy: str = "jobs"
    serve_steps: float = 100_000.0
    search: SearchConfig = field(default_factory=SearchConfig)
    profile: str = ""
    load: str = "none"
    load_n: int = 4096
    calibrate: str = "off"

    def check(self) -> None:
        TunedLiveConfig.check(self)
        if self.calibrate not in CALIBRATE:
            raise ConfigError("calibrate", f"allowed: {', '.join(CALIBRATE)}; got {self.calibrate!r}")
        check_load(self.load, self.load_n, self.backend)
        parse_budget(self.budget, 1.0)
        if self.wall_s < 0:
            raise ConfigError("wall_s", f"must be >= 0, got {self.wall_s}")
        try:
            self.search.check()
        except ConfigError as e:  # named as the user writes it
            raise ConfigError(f"search.{e.field}", str(e).split(": ", 1)[1]) from None
        if self.strategy not in ("jobs", "ppo") and not strategy_path(self.strategy).is_file():
            raise ConfigError("strategy", f"no strategy at {strategy_path(self.strategy)}; use jobs, ppo, shipped "
                              "or the strategy.json or composer.json that ncclrl pretrain wrote")
        if not self.serve_steps > 0:
            raise ConfigError("serve_steps", f"must be > 0, got {self.serve_steps}")
        if self.profile:
            job_calls(self.profile, load_topology(self.topology))


def parse_args(argv: list[str]) -> DictConfig:
    """The command's config from ``key=value`` overrides (what ``ncclrl finetune`` composes)."""
    return parse(COMMAND, argv)


def main_finetune(args: DictConfig) -> int:
    run_finetune(args)
    return 0


def job_calls(path: str, topo: Topology) -> tuple[dict[tuple[int, int], float], list[str]]:
    """Calls per step of the profile at ``path`` per (collective, bytes) on the whole job's
    communicator (``topo``'s nodes x ranks), and notes on the calls left out (other communicators:
    a live job measures its own; ``ncclrl export profile=`` tables those from the simulator)."""
    if not Path(path).is_file():
        raise ConfigError("profile", f"file not found: {path}")
    try:
        work = load_workload(path, topology=topo)
    except ConfigError as e:
        raise (e if e.field == "profile" else ConfigError("profile", str(e))) from None
    weights: dict[tuple[int, int], float] = {}
    left: dict[tuple[int, int], float] = {}
    for c in work.calls:
        whole = (c.nodes, c.ranks) == (topo.nodes, topo.nranks)
        into = weights if whole else left
        k = (N.COLLECTIVES.index(c.collective), c.nbytes) if whole else (c.nodes, c.ranks)
        into[k] = into.get(k, 0.0) + c.calls_per_step
    if not weights:
        raise ConfigError("profile", f"{path}: no call on the whole job's communicator ({topo.nodes} node(s) x "
                          f"{topo.nranks} ranks of {topo.name}); a live job measures that one, ncclrl export "
                          "profile= tables the others")
    notes = list(work.notes) + [f"calls on {n} node(s) x {r} ranks ({cps:g}/step) left out: not the whole job's "
                                "communicator (ncclrl export profile= tables them)" for (n, r), cps in left.items()]
    return weights, notes


_GRIDS: dict[tuple, Instance] = {}


def grid_instance(files: list[str], default: list[str], topo: Topology) -> Instance:
    """The measured grid of ``files`` (or the public grid a name names) on ``topo`` as a problem,
    NCCL's default from ``default``; read once per process."""
    key = (tuple(map(str, files)), tuple(map(str, default)), topo.name)
    if key not in _GRIDS:
        files, default = [str(f) for f in files], [str(d) for d in default] or ["auto"]
        if len(files) == 1 and files[0] in PUBLIC_GRIDS and not Path(files[0]).exists():
            pg = PUBLIC_GRIDS[files[0]]
            if pg.topology != topo.name:
                raise ConfigError("topology", f"the public grid {files[0]} was measured on {pg.topology}, "
                                  f"got {topo.name}")
            grid = read_public_grid(files[0], topo)
        else:
            missing = [f for f in files if not Path(f).is_file()]
            if missing:
                raise ConfigError("grid", f"no such file: {missing[0]}; give grid files or a public grid name: "
                                  f"{', '.join(PUBLIC_GRIDS)}")
            grid = read_grid(files, topo, default)
        _GRIDS[key] = gridded(grid, topo, topo.name, "/".join(files))
    return _GRIDS[key]


def live_problem(args: DictConfig, topo: Topology, colls: list[int],
                 weights: dict[tuple[int, int], float] | None = None) -> tuple[Problem, Any]:
    """The problem a live run tunes: every knob setting and per-call configuration of the sweep's
    space at the sizes of ``min_bytes``..``max_bytes``, or with ``weights`` (calls per step per
    (collective, bytes): a job's) at those sizes only, for the job's time per step; replayed, the
    recorded sweep's settings and points (and the sweep itself, else ``None``)."""
    if weights is not None:
        sizes = {c: sorted(s for cc, s in weights if cc == c) for c in colls}
    else:
        sizes = sizes_for(topo, colls, parse_bytes(args["min_bytes"], "min_bytes"),
                          parse_bytes(args["max_bytes"], "max_bytes"))
    if args["backend"] != "replay":
        return Problem(topo, colls, sizes, weights=weights), None
    if args.get("grid"):
        if weights is not None:
            raise ConfigError("profile", "a measured grid (grid=) is tuned at its own sizes; leave profile= out")
        inst = grid_instance(list(args["grid"]), list(args.get("grid_default") or ["auto"]), topo)
        return inst.problem, inst
    sweep = recorded_sweep(args["replay_store"], topo, args["launch"], ("sweep", "sweep-repeat"), status="ok")
    knobs, recorded = recorded_points(sweep, topo, colls)
    missing = [(N.COLLECTIVES[c], s) for c in colls for s in sizes[c]
               if (knobs[0].knobs, c, s, ("default", "default", 0)) not in recorded]
    if missing:
        fix = ("a profile's sizes must be sizes the sweep measured" if weights is not None
               else "set min_bytes/max_bytes/collectives to what it measured")
        raise ConfigError("replay_store", f"the sweep lacks NCCL's defaults at {len(missing)} sizes, e.g. "
                          f"{missing[0][0]} {missing[0][1]} B; {fix}")
    return Problem(topo, colls, sizes, knobs, available=set(recorded),
                   repeats={x: len(v) for x, v in recorded.items()}, weights=weights), sweep


def make_measure(args: DictConfig, topo: Topology, store: Store, bar=None, sweep=None):
    """``measure(knobs, points, samples, tag)`` over the chosen backend; every point is stored (and
    counted on ``bar``, a progress bar). Replayed, ``sweep`` is the recorded sweep when the caller
    has read it already (:func:`live_problem`).

    Resuming: what ``store`` already holds for this topology and backend is taken first, in the
    order it was stored (per tag and point: the n-th request of a point gets its n-th stored row),
    so the same command after an interruption repeats the run's decisions without measuring again
    and measures from where it stopped; a stored timeout is measured again."""
    replay, seen = sweep, {}
    live = args["backend"] != "replay"
    if args["backend"] == "replay" and args.get("grid"):
        replay = grid_instance(list(args["grid"]), list(args.get("grid_default") or ["auto"]), topo)
    if args["backend"] == "replay" and replay is None:  # the sweep's jobs, then its repeat's (a point measured again)
        replay = recorded_sweep(args["replay_store"], topo, args["launch"], ("sweep", "sweep-repeat"), status="ok")
    journal = stored_journal(store, topo.name, args["backend"])
    reused = [0]

    def measure(knobs: Point, points: list[Point], samples: int, tag: str) -> list[list[float] | None]:
        got: list[Any] = []
        for p in points:
            key = point_key(p)
            rows = journal.get((tag, key))
            got.append(rows.pop(0) if rows else MISSING)
            if got[-1] is not MISSING and got[-1] is not None:
                seen[key] = seen.get(key, 0) + 1  # as the replay would have counted it
        todo = [i for i, g in enumerate(got) if g is MISSING]
        if len(todo) < len(points):
            if not reused[0]:
                logger.info("# resuming from %s: measurements this run stored before are reused, not measured "
                            "again", store.path)
            reused[0] += len(points) - len(todo)
        measure.last_wall_s = None  # a job answered from the store is charged the job cost model's
        if todo:
            if isinstance(replay, Instance):
                w = GridWorkers(replay.problem.grid, knobs, seen)
            else:
                w = ReplayWorkers(replay, knobs, seen) if replay is not None else live_workers(args, topo, knobs)
            t0 = time.monotonic()
            res = measure_whole(w, [points[i] for i in todo], store, topo.name, backend=args["backend"],
                                samples=samples, tag=tag)
            if live:
                measure.last_wall_s = time.monotonic() - t0
            for i, r in zip(todo, res, strict=True):
                got[i] = r
        if bar is not None:
            bar.advance(len(points))
        return got

    # every job is stored as it ends, replayed ones too: the evaluator picks a job's points before it
    # starts (never measuring what it would not count), and charges a live job its wall time
    measure.live = True
    measure.last_wall_s = None
    return measure


MISSING = object()


def point_key(p: Point) -> tuple:
    return (p.collective, int(p.nbytes), p.algo, p.proto, int(p.channels), *map(int, p.knobs))


def stored_journal(store: Store, topology: str, backend: str) -> dict[tuple, list[list[float] | None]]:
    """Per (tag, point), the store's rows for ``topology`` and ``backend`` in the order they were
    stored: the samples of an ``ok`` row, ``None`` for a failure; timeouts (and points skipped
    after one) are left out, so that they are measured again."""
    df = store.frame(topology=topology, backend=backend)
    out: dict[tuple, list[list[float] | None]] = {}
    for r in df.itertuples(index=False):
        err = str(r.error or "")
        if r.status == "timeout" or (r.status != "ok" and TIMEOUT in err):
            continue
        key = (r.collective, int(r.nbytes), r.algo, r.proto, int(r.channels),
               *(int(getattr(r, f)) for f in KNOB_FIELDS))
        out.setdefault((r.tag, key), []).append(list(r.samples_us) if r.status == "ok" else None)
    return out


def _gain(pairs: list[tuple[float, float, float]]) -> float | None:
    """Speedup from (weight, base time, time) per size: the geometric mean of base/time when every
    weight is ``nan`` (sizes count alike), else the step's, sum w base / sum w time."""
    if not pairs:
        return None
    w, b, t = (np.array(x, dtype=float) for x in zip(*pairs, strict=True))
    if np.isnan(w).all():
        return float(np.exp(np.mean(np.log(b / t))))
    return float(np.dot(w, b) / np.dot(w, t))


def sweep_reference(frame, topo: Topology, sizes: dict[int, list[int]],
                    weights: dict[tuple[int, int], float] | None = None) -> dict[str, Any]:
    """From an exhaustive sweep: per knob setting, the speedup of the best per-call configuration
    per size over NCCL's plain default (geometric mean over sizes; with ``weights``, a job's calls
    per step, of its communication time per step); the best setting is the optimum a table plus an
    nccl.conf can reach in that space."""
    df = frame[frame.status == "ok"]
    key = df[list(KNOB_FIELDS)].astype(int).astype(str).agg("/".join, axis=1)
    med = {(r.collective, int(r.nbytes), r.algo, r.proto, int(r.channels), k): float(r.median_us)
           for r, k in zip(df.itertuples(index=False), key, strict=True)}
    out: dict[str, Any] = {"per_conf": {}, "points": int(len(df)), "_weights": weights}
    for k in sorted(set(key)):
        pairs = []
        for c, ss in sizes.items():
            for s in ss:
                base = med.get((N.COLLECTIVES[c], s, "default", "default", 0, BASE_KNOBS_KEY))
                vals = [v for (cc, n, *_rest, kk), v in med.items() if cc == N.COLLECTIVES[c] and n == s and kk == k]
                if base and vals:
                    pairs.append((weights[(c, s)] if weights else np.nan, base, min(vals)))
        if pairs:
            out["per_conf"][k] = _gain(pairs)
    out["optimum"] = max(out["per_conf"].values())
    out["optimum_conf"] = max(out["per_conf"], key=out["per_conf"].get)
    out["_med"] = med
    return out


def table_speedup_on_sweep(ref: dict[str, Any], conf: Point, rows: list[dict], sizes: dict[int, list[int]],
                           lo: int = 0, hi: int | None = None) -> float | None:
    """Speedup the fine-tuned table + conf would have had in the sweep's own data (as
    :func:`sweep_reference` counts it), over the sizes in [``lo``, ``hi``] (``None`` when the sweep
    has none there)."""
    med, k, weights = ref["_med"], "/".join(map(str, conf.knobs)), ref["_weights"]
    by = {(r["collective"], r["nbytes"]): r["key"] for r in rows}
    pairs = []
    for c, ss in sizes.items():
        for s in ss:
            if s < lo or (hi is not None and s > hi):
                continue
            name = N.COLLECTIVES[c]
            base = med.get((name, s, "default", "default", 0, BASE_KNOBS_KEY))
            t = med.get((name, s, *by.get((name, s), ("default", "default", 0)), k))
            if base and t:
                pairs.append((weights[(c, s)] if weights else np.nan, base, t))
    return _gain(pairs)


def grid_reference(inst: Instance, conf: Point, rows: list[dict]) -> dict[str, Any]:
    """How a table + knob setting does on a replayed grid's own truth (its pooled medians): the
    speedup over NCCL's default, the optimum the grid allows, and where NCCL's default came from."""
    d = Decision(conf, {(N.COLLECTIVES.index(r["collective"]), int(r["nbytes"])): tuple(r["key"]) for r in rows})
    v = inst.oracle.score(d)
    p = inst.problem
    logger.info("# on the grid's own data: %.3fx vs the grid optimum %.3fx (%.1f%%), %d cells, %d points; NCCL's "
                "default: %s", v.speedup, v.optimum, 100 * v.fraction, p.n_cells, p.n_points, p.default_source)
    return {"grid_points": p.n_points, "grid_cells": p.n_cells, "optimum": v.optimum, "speedup_on_grid": v.speedup,
            "fraction": v.fraction, "default_source": p.default_source}


#: size bands the table is judged in on a sweep's own data: (name, lowest bytes, highest bytes or None)
SWEEP_BANDS = (("below 64 KiB", 0, (64 << 10) - 1), ("64 KiB-64 MiB", 64 << 10, (64 << 20) - 1),
               ("64-256 MiB", 64 << 20, 256 << 20), ("above 256 MiB", (256 << 20) + 1, None))


def sizes_on_sweep(ref: dict[str, Any], conf: Point, rows: list[dict], sizes: dict[int, list[int]]) -> list[dict]:
    """Per size, the speedup the table + conf would have had in the sweep's own data over NCCL's
    plain default (sizes the sweep lacks left out)."""
    out = []
    for c, ss in sizes.items():
        for s in ss:
            x = table_speedup_on_sweep(ref, conf, [r for r in rows if (r["collective"], r["nbytes"]) ==
                                                   (N.COLLECTIVES[c], s)], {c: [s]})
            if x is not None:
                out.append({"collective": N.COLLECTIVES[c], "nbytes": int(s), "speedup": round(x, 4)})
    return out


def run_finetune(args: DictConfig, out=sys.stdout) -> dict[str, Any]:
    """Run ``ncclrl finetune``; returns (and writes to ``out/summary.json``) what it did."""
    topo = load_topology(args["topology"])
    weights, notes = job_calls(str(args["profile"]), topo) if args.get("profile") else (None, [])
    colls = sorted({c for c, _ in weights}) if weights is not None else \
        [N.parse_name("collectives", c, N.COLLECTIVES) for c in args["collectives"]]
    for n in notes:
        logger.info("# profile: %s", n)
    cfg: SearchConfig = OmegaConf.to_object(args["search"]) if isinstance(args["search"], DictConfig) \
        else args["search"]
    cfg.check()
    if args["backend"] == "torch":  # before the store opens
        check_launch(args, topo)
    jobs = args["strategy"] == "jobs"
    spath = None if jobs else \
        composer_path("shipped") if args["strategy"] == "ppo" else strategy_path(args["strategy"])
    if jobs:
        controller = JobController()
    elif is_composer(spath):
        controller = ComposerController(PolicyComposer.load(spath), serve_steps=float(args.get("serve_steps", 1e5)))
    else:
        controller = PolicyController.load(spath)
    problem, sweep = live_problem(args, topo, colls, weights)
    store = Store(Path(args["store"]))
    t0 = time.time()
    budget = parse_budget(args["budget"], predicted_sweep_gpu_s(problem, int(args["samples"])))
    with progress("finetune (GPU-s)", budget) as bar:
        measure = make_measure(args, topo, store, None, sweep)
        ev = Evaluator(problem, measure, budget, samples=int(args["samples"]),
                       tag=load_tag(args, "finetune"), wall_s=float(args["wall_s"]) or None)
        ev.on_job = bar.advance
        res, run = finetune(problem, ev, controller, cfg, log=logger.info,
                            calibrate=str(args.get("calibrate", "off")))
    wall = time.time() - t0
    out_dir = Path(args["out"])
    prov = {"strategy": "jobs" if jobs else str(spath), "strategy_sha256": None if jobs else file_sha256(spath),
            "args": OmegaConf.to_container(args) if isinstance(args, DictConfig) else dict(args),
            "nccl_version": topo.nccl.version, "wall_s": round(wall, 1)}
    paths = write_outcome(res, topo, problem.sizes, out_dir, prov, exact=weights is not None)
    logger.info("# fine-tuned %s %s: %s; %d measurements in %d jobs, %s of a budget of %s, %.0f s; knobs: %s; "
                "%d rows -> %s", topo.name, ",".join(N.COLLECTIVES[c] for c in colls), res.reason, res.measured,
                ev.calls, format_gpu_s(ev.gpu_s), format_gpu_s(ev.budget), wall, knob_label(res.conf), len(res.rows),
                paths["csv"])
    ev_ = res.evidence
    summary: dict[str, Any] = {"reason": res.reason, "measured": res.measured, "jobs": ev.calls,
                               "gpu_s": round(ev.gpu_s, 1), "budget_gpu_s": round(ev.budget, 1),
                               "wall_s": round(wall, 1), "rows": len(res.rows), "conf": res.conf.env(),
                               "paths": {k: str(v) for k, v in paths.items()}, "noise": ev_["noise"],
                               "worst_size": ev_["worst_size"], "slower_sizes": ev_["slower_sizes"]}
    nz = ev_["noise"]
    logger.info("# noise fitted on %d repeated measurements over %d jobs: a job's shift sd %.3f, a point's sd %.3f "
                "(log time)%s", nz["dof"], nz["jobs"], nz["job_sd"], nz["point_sd"],
                "" if nz["fitted"] else " -- no repeated measurement: the prior's guesses (search.model.job_sigma, "
                "search.model.noise_sigma)")
    w = ev_["worst_size"]
    if w is not None:
        logger.info("# worst size of this table, measured: %s %d B %.3fx NCCL's defaults [95%% interval %.3f, %.3f]; "
                    "%d size(s) slower beyond their interval", w["collective"], w["nbytes"], w["speedup"], w["lo"],
                    w["hi"], len(ev_["slower_sizes"]))
    if ev_["sizes_unmeasured"]:
        logger.info("# %d size(s) where NCCL's plain default was never measured: no speedup known there (they keep "
                    "NCCL's choice)", ev_["sizes_unmeasured"])
    if weights is not None:
        st = res.evidence["step"]
        summary.update(profile=str(args["profile"]), profile_notes=notes, step=st)
        logger.info("# the job's communication per step, predicted from the run's measurements: NCCL's defaults "
                    "%.4g us, this table %.4g us: %.4g us saved [95%% interval %.4g, %.4g] (%.2f%%)",
                    st["nccl_us_per_step"], st["table_us_per_step"], st["saved_us_per_step"], st["saved_lo"],
                    st["saved_hi"], st["saved_pct"])
    if isinstance(sweep, Instance):
        summary.update(grid_reference(sweep, res.conf, res.rows))
    elif sweep is not None:
        ref = sweep_reference(sweep, topo, problem.sizes, weights)
        got = table_speedup_on_sweep(ref, res.conf, res.rows, problem.sizes)
        zs, space = run.zs, run.space
        zrows = [{"collective": N.COLLECTIVES[space.cells[c][0]], "nbytes": space.cells[c][1], "key": space.keys[i]}
                 for c, i in zs.rows.items()]
        zgot = table_speedup_on_sweep(ref, problem.knobs[zs.knob], zrows, problem.sizes)
        big = table_speedup_on_sweep(ref, res.conf, res.rows, problem.sizes, 64 << 20, 256 << 20)
        bands = {name: table_speedup_on_sweep(ref, res.conf, res.rows, problem.sizes, lo, hi)
                 for name, lo, hi in SWEEP_BANDS}
        per_size = sizes_on_sweep(ref, res.conf, res.rows, problem.sizes)
        summary.update(sweep_points=ref["points"], optimum=ref["optimum"], optimum_conf=ref["optimum_conf"],
                       speedup_on_sweep=got, fraction=got / ref["optimum"], zero_shot_fraction=zgot / ref["optimum"],
                       speedup_on_sweep_64_256MiB=big, speedup_on_sweep_bands=bands,
                       worst_size_on_sweep=min(per_size, key=lambda r: r["speedup"]) if per_size else None,
                       sizes_slower_on_sweep=sum(r["speedup"] < 1 for r in per_size))
        logger.info("# on the sweep's own data: %.3fx vs the sweep optimum %.3fx (%.1f%%; the zero-shot table "
                    "%.1f%%), with %d of %d measurements (%.1f%%)", got, ref["optimum"], 100 * got / ref["optimum"],
                    100 * zgot / ref["optimum"], res.measured, ref["points"], 100 * res.measured / ref["points"])
        for name, x in bands.items():
            if x is not None and x < 1:
                logger.warning("# SLOWER than NCCL's defaults on the sweep's own data at %s: %.3fx", name, x)
        if summary["worst_size_on_sweep"] is not None:
            w = summary["worst_size_on_sweep"]
            logger.info("# worst size on the sweep's own data: %s %d B %.3fx; %d size(s) slower than NCCL's defaults "
                        "there", w["collective"], w["nbytes"], w["speedup"], summary["sizes_slower_on_sweep"])
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=1, default=str))
    return summary


COMMAND = Command("finetune", FinetuneCommand, main_finetune,
                  "tune on live (or replayed) measurements under a GPU-time budget, export the table",
                  out_key="out")
register(COMMAND)
