"""``ncclrl finetune``: a tuning run of the shipped search strategy on a live platform under a
measurement budget, exporting the table the measurements support (keys: :class:`FinetuneCommand`;
the method: :mod:`ncclrl.agents.finetune`, :mod:`ncclrl.agents.strategy`).

    ncclrl finetune backend=torch topology=h200-2x2-sock budget=250 out=runs/ft

``backend=torch`` measures on the GPUs of this machine (one job per knob setting and round, our
plugin selecting each configuration); ``backend=replay replay_store=SWEEP.sqlite`` answers every
measurement from an earlier exhaustive sweep instead (the same points, counted the same way; the
sweep measured with ``launch``), which compares fine-tuning with the sweep on its own data. Every
measurement goes to ``store`` (tag ``finetune``) as soon as its job ends.
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

from ncclrl.agents.finetune import finetune, knob_label, sizes_for, write_outcome
from ncclrl.agents.problem import Evaluator, Problem
from ncclrl.agents.strategy import PolicyController, SearchConfig, strategy_path
from ncclrl.agents.suite import recorded_points
from ncclrl.costmodel import nccl as N
from ncclrl.costmodel.errors import ConfigError
from ncclrl.costmodel.space import KNOB_FIELDS, Point
from ncclrl.costmodel.table import file_sha256
from ncclrl.costmodel.topology import Topology, load_topology
from ncclrl.costmodel.units import parse_bytes
from ncclrl.costmodel.workload import load_workload
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
    :param out: the folder the table, nccl.conf and the run's summary go to
    """

    topology: str = ""
    backend: str = "torch"
    replay_store: str = ""
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
        if self.backend == "replay" and not Path(self.replay_store).is_file():
            raise ConfigError("replay_store", f"backend=replay needs an existing sweep store, got "
                              f"{self.replay_store!r}")
        LiveConfig.check(self)


@dataclass
class FinetuneCommand(TunedLiveConfig):
    """Fine-tune: a tuning run of the search strategy on live (or replayed) measurements under a
    budget; export the table and ``nccl.conf`` the measurements support, with the evidence per row.

    :param budget: measured points allowed in all, NCCL's defaults included
    :param wall_s: no new measurement after this many seconds (0: no limit), whatever is left of budget
    :param strategy: the search strategy: shipped (installed with ncclrl) or a strategy.json path
    :param search: the run's settings: search.round_points, search.decision.delta, search.decision.alpha, ...
    :param profile: a job profile (ncclrl profile): measure only the collectives and sizes the job calls
        on the whole job's communicator, for its communication time per step (calls x time), and report
        the time per step saved; collectives, min_bytes and max_bytes then come from the profile
    :param load: none, or gemm: every sample runs beside matrix products on each GPU, so the run tunes the
        collectives' times under compute (stored under tag finetune+gemmN with the products' slowdown;
        backend=torch)
    :param load_n: load=gemm: the products' size (load_n x load_n, bfloat16); size it like your model's
    """

    budget: int = 250
    wall_s: float = 0.0
    strategy: str = "shipped"
    search: SearchConfig = field(default_factory=SearchConfig)
    profile: str = ""
    load: str = "none"
    load_n: int = 4096

    def check(self) -> None:
        TunedLiveConfig.check(self)
        check_load(self.load, self.load_n, self.backend)
        for k in ("budget", "wall_s"):
            if getattr(self, k) < 0:
                raise ConfigError(k, f"must be >= 0, got {getattr(self, k)}")
        try:
            self.search.check()
        except ConfigError as e:  # named as the user writes it
            raise ConfigError(f"search.{e.field}", str(e).split(": ", 1)[1]) from None
        if not strategy_path(self.strategy).is_file():
            raise ConfigError("strategy", f"no strategy at {strategy_path(self.strategy)}; use shipped or the "
                              "strategy.json that ncclrl pretrain wrote")
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
        if todo:
            w = ReplayWorkers(replay, knobs, seen) if replay is not None else live_workers(args, topo, knobs)
            res = measure_whole(w, [points[i] for i in todo], store, topo.name, backend=args["backend"],
                                samples=samples, tag=tag)
            for i, r in zip(todo, res, strict=True):
                got[i] = r
        if bar is not None:
            bar.advance(len(points))
        return got

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
    spath = strategy_path(args["strategy"])
    controller = PolicyController.load(spath)
    problem, sweep = live_problem(args, topo, colls, weights)
    store = Store(Path(args["store"]))
    t0 = time.time()
    with progress("finetune", int(args["budget"])) as bar:
        measure = make_measure(args, topo, store, bar, sweep)
        ev = Evaluator(problem, measure, int(args["budget"]), samples=int(args["samples"]),
                       tag=load_tag(args, "finetune"), wall_s=float(args["wall_s"]) or None)
        res, run = finetune(problem, ev, controller, cfg, log=logger.info)
    wall = time.time() - t0
    out_dir = Path(args["out"])
    prov = {"strategy": str(spath), "strategy_sha256": file_sha256(spath),
            "args": OmegaConf.to_container(args) if isinstance(args, DictConfig) else dict(args),
            "nccl_version": topo.nccl.version, "wall_s": round(wall, 1)}
    paths = write_outcome(res, topo, problem.sizes, out_dir, prov, exact=weights is not None)
    logger.info("# fine-tuned %s %s: %s; %d measurements in %d jobs, %.0f s; knobs: %s; %d rows -> %s", topo.name,
                ",".join(N.COLLECTIVES[c] for c in colls), res.reason, res.measured, ev.calls, wall,
                knob_label(res.conf), len(res.rows), paths["csv"])
    ev_ = res.evidence
    summary: dict[str, Any] = {"reason": res.reason, "measured": res.measured, "jobs": ev.calls,
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
    if sweep is not None:
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
                  "tune on live (or replayed) measurements with the shipped search strategy, export the table",
                  out_key="out")
register(COMMAND)
