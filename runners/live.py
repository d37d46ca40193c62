"""What every live command shares: the keys of a live run (:class:`LiveConfig`), the workers it
measures with, the check that it can run before anything is written, and what the tuning commands
(``finetune``, ``tune``) share: their keys (:class:`TunedLiveConfig`), the problem a run tunes,
its measuring callable over the store (resumable) and the yardsticks of a replayed run. Commands
import their wiring from here, never from each other (an import-linter contract)."""

from __future__ import annotations

import logging
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from omegaconf import DictConfig, OmegaConf

from ncclrl.agents.finetune import sizes_for
from ncclrl.agents.problem import Decision, Problem
from ncclrl.agents.suite import Instance, gridded, recorded_points
from ncclrl.costmodel import nccl as N
from ncclrl.costmodel.errors import ConfigError
from ncclrl.costmodel.noise import pooled_median
from ncclrl.costmodel.space import KNOB_FIELDS, Point
from ncclrl.costmodel.topology import Topology, load_topology
from ncclrl.costmodel.units import parse_bytes
from ncclrl.costmodel.workload import load_workload
from ncclrl.envs.grids import PUBLIC_GRIDS, GridWorkers, read_grid, read_public_grid
from ncclrl.envs.jobs import LaunchConfig
from ncclrl.envs.live import LAUNCHES, require_gpus
from ncclrl.envs.measure import measure_whole
from ncclrl.envs.replay import ReplayWorkers, recorded_sweep, replay_job_noise, shipped_recording, shipped_recordings
from ncclrl.envs.store import Store
from ncclrl.envs.torch_workers import LOADS, NVLS, TableWorkers

log = logging.getLogger(__name__)
logger = log


@dataclass
class LiveConfig:
    """Keys every live command shares.

    :param topology: the platform the GPUs form: a preset name (``ncclrl topologies``) or a YAML path
    :param collectives: the collectives to measure, a list (``[allreduce,allgather]``)
    :param min_bytes: the smallest size (8, 64K, 1M, ...)
    :param max_bytes: the largest size
    :param samples: timed calls per point in a job; the job's median is what counts
    :param timing: eager (calls issued one by one, as a training step issues them) or graph (captured in a
        CUDA graph: the kernels' time without the launch cost); sweep, finetune and validate share their
        defaults for timing, samples and timeout_s, so their measurements of one point compare
    :param timeout_s: a job that makes no progress for this many seconds (>= 1) is stopped, its point recorded as
        hung
    :param store: the SQLite measurement store every measurement goes to (resumable)
    :param launch: how the PyTorch workers issue collectives: nccl (NCCL called directly) or torch
        (torch.distributed)
    :param launcher: how a job's processes start on the cluster (group launcher=: local, torchrun,
        srun, mpirun; then launcher.hosts=[...], launcher.extra_args=...)
    :param nvls: as-is (NVLink SHARP as your environment has it) or off (NCCL_NVLS_ENABLE=0 for every job)
    :param log_dir: keep each job's per-rank records and the launcher's output here (empty: not kept)
    :param too_slow: a configuration whose first calls take this many times NCCL's own choice at the same
        size (measured in the same job) is abandoned for the job and stored as too slow; it, and its
        algorithm/protocol on that channel count at larger sizes under the same knobs, are never
        measured again (0: off)
    """

    defaults: list[Any] = field(default_factory=lambda: ["_self_", {"launcher": "local"}])

    topology: str = ""
    collectives: list[str] = field(default_factory=lambda: ["allreduce"])
    min_bytes: str = "8"
    max_bytes: str = "256M"
    samples: int = 5
    timing: str = "eager"
    timeout_s: float = 120.0
    store: str = "runs/store.sqlite"
    launch: str = "nccl"
    launcher: LaunchConfig = field(default_factory=LaunchConfig)
    nvls: str = "as-is"
    log_dir: str = ""
    too_slow: float = 10.0

    def check(self) -> None:
        self.launcher.check()
        if not (self.too_slow == 0 or self.too_slow > 1):
            raise ConfigError("too_slow", f"must be 0 (off) or a factor > 1, got {self.too_slow}")
        if self.nvls not in NVLS:
            raise ConfigError("nvls", f"unknown value {self.nvls!r}; allowed: {', '.join(NVLS)}")
        for c in self.collectives:
            N.parse_name("collectives", c, N.COLLECTIVES)
        if not self.collectives:
            raise ConfigError("collectives", f"needs at least one of {', '.join(N.COLLECTIVES)}")
        lo, hi = parse_bytes(self.min_bytes, "min_bytes"), parse_bytes(self.max_bytes, "max_bytes")
        if hi < lo:
            raise ConfigError("max_bytes", f"must be >= min_bytes ({self.min_bytes}), got {self.max_bytes}")
        if self.timing not in ("graph", "eager"):
            raise ConfigError("timing", f"unknown value {self.timing!r}; allowed: graph, eager")
        if self.launch not in LAUNCHES:
            raise ConfigError("launch", f"unknown value {self.launch!r}; allowed: torch (torch.distributed calls), "
                              "nccl (NCCL called directly from the workers)")
        if self.samples < 1:
            raise ConfigError("samples", f"must be >= 1, got {self.samples}")
        if self.timeout_s <= 0:
            raise ConfigError("timeout_s", f"must be > 0, got {self.timeout_s}")
        if not self.topology:
            raise ConfigError("topology", "required: the platform the GPUs form (a preset name from ncclrl topologies, "
                              "or a topology YAML)")


def launcher_of(args: DictConfig) -> LaunchConfig:
    """The command's launcher (``launcher=`` group), checked."""
    node = args.get("launcher") if hasattr(args, "get") else None
    if isinstance(node, DictConfig):
        node = OmegaConf.to_container(node)
    return LaunchConfig.of(node)


def live_workers(args: DictConfig, topo: Topology, knobs: Point, *, timing: str | None = None,
                 timeout_s: float | None = None, table: str | Path | None = None) -> TableWorkers:
    """The PyTorch workers of a live command: the topology's nodes and ranks, started by its launcher."""
    return TableWorkers(topo.nranks, topo.nodes, knobs, timing=timing or args["timing"],
                        timeout_s=float(timeout_s if timeout_s is not None else args["timeout_s"]),
                        launch=args["launch"], launcher=launcher_of(args), nvls=args.get("nvls", "as-is"),
                        log_dir=args.get("log_dir") or None, table=table, load=args.get("load", "none"),
                        load_n=int(args.get("load_n", 4096)), too_slow=float(args.get("too_slow", 10.0)))


def check_load(load: str, load_n: int, backend: str) -> None:
    """The ``load`` and ``load_n`` keys of a live command, checked against its ``backend``."""
    if load not in LOADS:
        raise ConfigError("load", f"unknown value {load!r}; allowed: {', '.join(LOADS)}")
    if load != "none" and backend != "torch":
        raise ConfigError("load", "a compute load runs in the PyTorch workers only: backend=torch")
    if not 16 <= load_n <= 65536:
        raise ConfigError("load_n", f"must be 16 to 65536, got {load_n}")


def load_tag(args: DictConfig, tag: str | None = None) -> str:
    """The tag a command stores under: ``tag`` (default: the ``tag`` key), plus ``+gemmN`` under a
    compute load, so that loaded and isolated timings never pool."""
    load = args.get("load", "none") if hasattr(args, "get") else "none"
    return (tag or args["tag"]) + (f"+{load}{int(args.get('load_n', 4096))}" if load != "none" else "")


def check_launch(args: DictConfig, topo: Topology, instead: str = "", key: str = "backend") -> None:
    """The one check every live command runs before anything is written (no store, no output
    folder): a local launch needs every GPU here; a cluster launch one host per node when hosts are
    named. ``instead``: what the command can do without GPUs, for the error's hint (empty: nothing);
    ``key``: the key the error names."""
    launcher = launcher_of(args)
    if launcher.kind == "local":
        require_gpus(launcher.gpus_needed(topo.nranks), key, instead)
    elif launcher.hosts and len(launcher.hosts) != topo.nodes:
        raise ConfigError("launcher.hosts", f"{topo.name} has {topo.nodes} nodes, {len(launcher.hosts)} hosts given")


BASE_KNOBS_KEY = "/".join("0" * len(KNOB_FIELDS))  # NCCL's plain defaults, as sweep_reference keys settings


@dataclass
class TunedLiveConfig(LiveConfig):
    """Keys of the commands that tune on a live or replayed platform and export a table.

    :param backend: torch (PyTorch workers on this machine's GPUs) or replay (answers from a recorded sweep)
    :param replay_store: backend=replay: the store holding the exhaustive sweep to replay (empty: the
        recording of the topology that ships with ncclrl, where there is one: h200-2x2-sock)
    :param replay_noise: backend=replay with a store: fresh (every replayed job a fresh draw of the host's
        fitted job noise around each point's recorded truth, so a point measured again is an independent
        job) or recorded (the recorded jobs' own samples, in their order: a point recorded once answers
        every repeat alike)
    :param replay_seed: backend=replay, replay_noise=fresh: the seed of the replayed jobs' noise
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

    backend: str = "torch"
    replay_store: str = ""
    replay_noise: str = "fresh"
    replay_seed: int = 0
    grid: list[str] = field(default_factory=list)
    grid_default: list[str] = field(default_factory=lambda: ["auto"])
    out: str = "runs/finetune"
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
        if self.replay_noise not in ("fresh", "recorded"):
            raise ConfigError("replay_noise", f"allowed: fresh, recorded; got {self.replay_noise!r}")
        if self.replay_seed < 0:
            raise ConfigError("replay_seed", f"must be >= 0, got {self.replay_seed}")
        if self.backend == "replay" and not self.grid:
            if not self.replay_store:
                shipped_recording(load_topology(self.topology).name)
            elif not Path(self.replay_store).is_file():
                raise ConfigError("replay_store", f"no store at {self.replay_store!r}: name a store of a recorded "
                                  f"sweep, or leave replay_store= empty for the recording that ships with ncclrl "
                                  f"({', '.join(shipped_recordings())})")
        if self.grid:
            grid_instance(self.grid, self.grid_default, load_topology(self.topology))
        LiveConfig.check(self)


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
    # replayed with fresh noise a point can be measured in any number of jobs; with the recorded
    # samples only in as many as were recorded (the next repeat would answer alike)
    fresh = args.get("replay_noise", "fresh") == "fresh"
    return Problem(topo, colls, sizes, knobs, available=set(recorded),
                   repeats=None if fresh else {x: len(v) for x, v in recorded.items()}, weights=weights), sweep


def make_measure(args: DictConfig, topo: Topology, store: Store, bar=None, sweep=None):
    """``measure(knobs, points, samples, tag)`` over the chosen backend; every point is stored (and
    counted on ``bar``, a progress bar). Replayed, ``sweep`` is the recorded sweep when the caller
    has read it already (:func:`live_problem`).

    Resuming: what ``store`` already holds for this topology and backend is taken first, in the
    order it was stored (per tag and point: the n-th request of a point gets its n-th stored row),
    so the same command after an interruption repeats the run's decisions without measuring again
    and measures from where it stopped; a stored timeout or too-slow point answers None, as it did."""
    replay, seen = sweep, {}
    live = args["backend"] != "replay"
    if args["backend"] == "replay" and args.get("grid"):
        replay = grid_instance(list(args["grid"]), list(args.get("grid_default") or ["auto"]), topo)
    if args["backend"] == "replay" and replay is None:  # the sweep's jobs, then its repeat's (a point measured again)
        replay = recorded_sweep(args["replay_store"], topo, args["launch"], ("sweep", "sweep-repeat"), status="ok")
    journal = stored_journal(store, topo.name, args["backend"])
    reused = [0]
    noise = rng = None
    if not live and not isinstance(replay, Instance) and args.get("replay_noise", "fresh") == "fresh":
        noise = replay_job_noise(topo, args["launch"])
        # one stream per run: the n-th replayed job of a seed draws the same noise, a new seed new noise
        rng = np.random.default_rng([int(args.get("replay_seed", 0)), 0x6e63636c])
        logger.info("# replaying %s with fresh job noise (%s, seed %d) around each point's recorded truth",
                    args["replay_store"] or f"the recording of {topo.name} that ships with ncclrl",
                    noise.source, int(args.get("replay_seed", 0)))

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
                w = ReplayWorkers(replay, knobs, seen, noise, rng) if replay is not None \
                    else live_workers(args, topo, knobs)
            t0 = time.monotonic()
            try:
                res = measure_whole(w, [points[i] for i in todo], store, topo.name, backend=args["backend"],
                                    samples=samples, tag=tag)
            finally:  # a job ended by a signal or failed by the cluster is charged what it took, too
                if live:
                    measure.last_wall_s = time.monotonic() - t0
            for i, r in zip(todo, res, strict=True):
                got[i] = r
        if bar is not None:
            bar.advance(len(points))
        return got

    def predict(knobs: Point, points: list[Point], samples: int, tag: str) -> list[list[float] | None]:
        """What a replayed job of ``points`` would answer (the store's rows first), without measuring
        or counting: the evaluator cuts the job to the prefix the budget pays for before it starts."""
        got: list[Any] = [journal[(tag, point_key(p))][0] if journal.get((tag, point_key(p))) else MISSING
                          for p in points]  # a job's points are distinct: a stored row is its first
        todo = [i for i, g in enumerate(got) if g is MISSING]
        if todo:
            if isinstance(replay, Instance):
                got_ = GridWorkers(replay.problem.grid, knobs, dict(seen)).measure([points[i] for i in todo],
                                                                                   samples=samples)
            elif noise is not None:  # a fresh job answers around the truth: its cost, without drawing
                got_ = ReplayWorkers(replay, knobs).expected([points[i] for i in todo], samples=samples)
            else:
                got_ = ReplayWorkers(replay, knobs, dict(seen)).measure([points[i] for i in todo], samples=samples)
            for i, r in zip(todo, got_, strict=True):
                got[i] = r
        return got

    # every job is stored as it ends, replayed ones too: the evaluator picks a job's points before it
    # starts (never measuring what it would not count), and charges a live job its wall time; a
    # replay's job is cut on the times it will answer, so it never costs more than what is left
    if not live:
        measure.predict = predict
    measure.live = True
    measure.last_wall_s = None
    return measure


MISSING = object()


def point_key(p: Point) -> tuple:
    return (p.collective, int(p.nbytes), p.algo, p.proto, int(p.channels), *map(int, p.knobs))


def stored_journal(store: Store, topology: str, backend: str) -> dict[tuple, list[list[float] | None]]:
    """Per (tag, point), the store's rows for ``topology`` and ``backend`` in the order they were
    stored: the samples of an ``ok`` row, ``None`` for a failure, a timeout or a point abandoned as
    too slow (never measured again: the run resumes with the same answers it had)."""
    df = store.frame(topology=topology, backend=backend)
    out: dict[tuple, list[list[float] | None]] = {}
    for r in df.itertuples(index=False):
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
    # a point's truth: the geometric mean of its recorded jobs' medians, as a fresh replay draws around
    jobs: dict[tuple, list[list[float]]] = {}
    for r, k in zip(df.itertuples(index=False), key, strict=True):
        jobs.setdefault((r.collective, int(r.nbytes), r.algo, r.proto, int(r.channels), k), []).append(r.samples_us)
    med = {x: pooled_median(v) for x, v in jobs.items()}
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
    speedup over NCCL's default, the optimum the grid allows, where NCCL's default came from, and
    ``report``, that as one line for the command's report."""
    d = Decision(conf, {(N.COLLECTIVES.index(r["collective"]), int(r["nbytes"])): tuple(r["key"]) for r in rows})
    v = inst.oracle.score(d)
    p = inst.problem
    line = (f"on the grid's own data: {v.speedup:.3f}x vs the grid optimum {v.optimum:.3f}x ({100 * v.fraction:.1f}%), "
            f"{p.n_cells} cells, {p.n_points} points; NCCL's default: {p.default_source}")
    return {"grid_points": p.n_points, "grid_cells": p.n_cells, "optimum": v.optimum, "speedup_on_grid": v.speedup,
            "fraction": v.fraction, "default_source": p.default_source, "report": line}


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


def check_budget(budget_gpu_s: float, problem: Problem, samples: int, text: str) -> None:
    """A budget that pays for no job at all is bad input: one line, before anything is written. The
    smallest job is one launch and one point of NCCL's defaults, at the prior's times."""
    from ncclrl.agents.problem import Evaluator
    from ncclrl.costmodel.jobcost import format_gpu_s

    ev = Evaluator(problem, lambda *_a: [], 0.0, samples=samples)
    smallest = ev.cost.launch_s * ev.nranks + ev.point_gpu_s()
    if budget_gpu_s < smallest:
        raise ConfigError("budget", f"{text} ({format_gpu_s(budget_gpu_s)}) pays for no job on {problem.topo.name}: "
                          f"one job costs at least about {format_gpu_s(smallest)} (its launch on {ev.nranks} GPUs "
                          "and one point); allowed: a larger GPU-time or Nsweep")


def exit_code(summary: dict[str, Any]) -> int:
    """A run stopped by a signal exits ``128 + signum`` and one failed by the cluster 1, after
    writing everything its measurements support; else 0."""
    if summary.get("interrupted"):
        return 128 + int(getattr(signal.Signals, summary["interrupted"]))
    return 1 if summary.get("failure") else 0


def replay_validation(sweep, topo: Topology, noise, seed: int, conf: Point, rows: list[dict],
                      sizes: dict[int, list[int]], samples: int, jobs: int = 10,
                      weights: dict[tuple[int, int], float] | None = None) -> dict[str, Any]:
    """The exported table measured afresh on a replay, as ``ncclrl validate`` measures it on GPUs:
    ``jobs`` fresh replayed jobs, each measuring NCCL's plain defaults and the table (+ its knob
    setting) at every size, ``samples`` calls per point; per size the speedup of the table (the
    geometric mean over jobs of the ratio of job medians) with its 95% Student-t interval, and the
    share of communication time saved (one call per size, or the profile's calls: ``weights``) with
    its interval over jobs. Its noise stream is its own: it changes nothing the run drew."""
    from scipy import stats

    truth = ReplayWorkers(sweep, conf)
    base_knobs = (0,) * len(KNOB_FIELDS)
    by = {(r["collective"], int(r["nbytes"])): tuple(r["key"]) for r in rows}
    cells = [(c, s) for c in sorted(sizes) for s in sizes[c]]
    base_t, tab_t, keep = [], [], []
    for c, s in cells:
        name = N.COLLECTIVES[c]
        b = truth.truth_us((name, s, "default", "default", 0, *base_knobs))
        t = truth.truth_us((name, s, *by.get((name, s), ("default", "default", 0)), *map(int, conf.knobs)))
        if b is not None and t is not None:
            base_t.append(b)
            tab_t.append(t)
            keep.append((c, s))
    if not keep:
        return {}
    nb = np.array([s for _c, s in keep], dtype=float)
    w = np.array([weights[x] if weights else 1.0 for x in keep])
    rng = np.random.default_rng([int(seed), 0x76616C])
    same_job = not any(conf.knobs)  # one job measures both when the table keeps NCCL's knob defaults
    logr = np.empty((jobs, len(keep)))
    saved = np.empty(jobs)
    for j in range(jobs):
        if same_job:
            x = noise.draw_job(np.r_[base_t, tab_t], np.r_[nb, nb], samples, rng)
            b, t = x[: len(keep)], x[len(keep):]
        else:
            b = noise.draw_job(base_t, nb, samples, rng)
            t = noise.draw_job(tab_t, nb, samples, rng)
        mb, mt = np.median(b, axis=1), np.median(t, axis=1)
        logr[j] = np.log(mb) - np.log(mt)
        saved[j] = 1.0 - float(np.dot(w, mt) / np.dot(w, mb))
    q = float(stats.t.ppf(0.975, jobs - 1))
    m, se = logr.mean(axis=0), logr.std(axis=0, ddof=1) / np.sqrt(jobs)
    per_size = [{"collective": N.COLLECTIVES[c], "nbytes": int(s), "speedup": float(np.exp(m[i])),
                 "lo": float(np.exp(m[i] - q * se[i])), "hi": float(np.exp(m[i] + q * se[i])),
                 "row": (N.COLLECTIVES[c], int(s)) in by}
                for i, (c, s) in enumerate(keep)]
    sm, ss = float(saved.mean()), float(saved.std(ddof=1) / np.sqrt(jobs))
    worst = min(per_size, key=lambda r: r["speedup"])
    return {"jobs": jobs, "samples": samples, "saved": sm, "saved_lo": sm - q * ss, "saved_hi": sm + q * ss,
            "worst_size": worst, "slower_sizes": [r for r in per_size if r["hi"] < 1.0], "per_size": per_size,
            "weighted": weights is not None}
