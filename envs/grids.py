"""Measured grids given as files, read as replay truths.

A *grid* is a set of measurements of one platform under forced configurations: one time (or a few)
per (collective, size, configuration) per run. :func:`read_grid` reads one from files of these
formats, told apart by their content:

* nccl-tests outputs (stdout captures or ``-J`` JSON, :mod:`ncclrl.costmodel.nccltests`), one
  configuration per run, read from the output itself (NCCL's ``set by environment`` lines, an
  environment dump, the command line) or else from the file name (``ncclrl parse`` says which):
  ``NCCL_ALGO`` and ``NCCL_PROTO`` each naming one value force a per-call configuration (NCCL's own
  channel count), neither is NCCL's default; ``NCCL_MIN/MAX_NCHANNELS``, ``NCCL_BUFFSIZE`` and the
  socket variables make the run's knob setting. A run's samples are its out-of-place and in-place
  times; several runs of one configuration are several jobs;
* nccl-tests rows flattened to CSV without a header, ``source,size_B,oop_time_us,oop_algbw,
  oop_busbw,ip_time_us,ip_algbw,ip_busbw,nodes,algo,proto`` (a public nightly grid's format): the
  rows of the platform's node count, one job per ``source`` (one nccl-tests output);
* the benchmark CSV of NVIDIA's example tuner plugin's helper script (``collective,size_bytes,
  algorithm,protocol,channels,nodes,ranks,pipeOps,regBuff,cost_metric,bandwidth_gbps,latency_us``):
  the rows whose ``nodes``/``ranks`` match the platform (or are -1), ``latency_us`` as the time,
  ``channels`` -1 as NCCL's own count; one job per row;
* a training-step proxy CSV (``platform,topology_nodes_x_gpus,mode,size_label,config,
  iter_time_ms,...``: a matrix product and one AllReduce per step, ms): the rows of the platform's
  ``NxG`` shape and the chosen ``mode``, ``config`` ``auto`` as NCCL's default, ``algo_proto``
  forced. Its times are a step's, not the collective's alone.

Where the grid has no unforced run, NCCL's default at each size is taken from ``default``: a run
of NCCL's defaults (an nccl-tests output with nothing forced, or a CSV whose first two columns are
bytes and NCCL's time in us), an ``NCCL_DEBUG=INFO`` log with NCCL's per-call decisions
(:mod:`ncclrl.costmodel.detect`: each size's logged algorithm and protocol, timed by the grid's
forced run of that choice), or the replica of NCCL's decision for the topology
(:mod:`ncclrl.costmodel.replica`, a prediction, timed the same way). :attr:`Grid.default_source`
says which. A size where NCCL's default is not known is left out, and said in :attr:`Grid.notes`.

:class:`GridWorkers` answers measurements from a grid as the replay backend does from a store.
"""

from __future__ import annotations

import contextlib
import csv
import io
import math
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ncclrl.costmodel import nccl as N
from ncclrl.costmodel.calibrate import env_to_config
from ncclrl.costmodel.detect import parse_logs
from ncclrl.costmodel.errors import ConfigError
from ncclrl.costmodel.nccltests import NcclTestsError, env_sources, parse_file_runs, read_text, run_env
from ncclrl.costmodel.replica import default_decisions
from ncclrl.costmodel.space import DEFAULT, KNOB_FIELDS, Key, Point
from ncclrl.costmodel.topology import Topology
from ncclrl.costmodel.units import parse_bytes, plural
from ncclrl.envs.backend import Backend

PointKey = tuple[tuple[int, ...], int, int, Key]  # (knobs, collective index, nbytes, (algo, proto, channels))
BASE_KNOBS: tuple[int, ...] = (0,) * len(KNOB_FIELDS)
NVIDIA_COLUMNS = ("collective", "size_bytes", "algorithm", "protocol", "channels", "nodes", "ranks")
STEP_COLUMNS = ("platform", "topology_nodes_x_gpus", "mode", "size_label", "config", "iter_time_ms")
FORMATS = ("nccl-tests", "nccl-tests rows CSV", "NVIDIA example-plugin CSV", "training-step proxy CSV")


def shared_data_dir() -> Path:
    """The shared recorded data: ``NCCLRL_SHARED_DATA``, else ``../shared/data`` beside the checkout."""
    env = os.environ.get("NCCLRL_SHARED_DATA")
    return Path(env) if env else Path(__file__).resolve().parents[2] / "shared" / "data"


@dataclass
class Grid:
    """A measured grid as replay truth: every recorded job per point, NCCL's default included.

    :param recorded: per point ``(knobs, collective, nbytes, key)``, each job's samples (us)
    :param knobs: the knob settings measured, NCCL's defaults first
    :param colls: the collectives, in NCCL's order
    :param sizes: per collective, the sizes where NCCL's default is known (the problem's cells)
    :param default_source: how NCCL's default was obtained (measured, logged, or the replica's prediction)
    :param formats: the formats read
    :param sources: the files read
    :param notes: what was left out and why
    """

    recorded: dict[PointKey, list[list[float]]]
    knobs: list[Point]
    colls: list[int]
    sizes: dict[int, list[int]]
    default_source: str
    formats: list[str] = field(default_factory=list)
    sources: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def configurations(self) -> list[Key]:
        """The per-call configurations the grid measured (NCCL's default left out)."""
        return sorted({x[3] for x in self.recorded if x[3] != DEFAULT})

    def keys(self, knobs: tuple[int, ...], coll: int) -> list[Key]:
        """NCCL's default first, then every configuration measured under ``knobs`` for ``coll``."""
        return [DEFAULT, *sorted({x[3] for x in self.recorded if x[0] == knobs and x[1] == coll and x[3] != DEFAULT})]

    @property
    def n_cells(self) -> int:
        return sum(len(v) for v in self.sizes.values())


# -- reading the formats ---------------------------------------------------------------------------

@dataclass
class _Raw:
    """What the files measured: per point, the jobs (each a list of samples)."""

    points: dict[PointKey, list[list[float]]] = field(default_factory=dict)
    formats: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def add(self, x: PointKey, samples: list[float]) -> None:
        s = [float(v) for v in samples if math.isfinite(v) and v > 0]
        if s:
            self.points.setdefault(x, []).append(s)

    def said(self, fmt: str) -> None:
        if fmt not in self.formats:
            self.formats.append(fmt)


def _head(path: Path) -> str:
    with open(path, "rb") as f:
        return f.read(4096).decode("utf-8", errors="replace").lstrip("\ufeff")


def _csv_rows(path: Path) -> list[list[str]]:
    return [r for r in csv.reader(io.StringIO(read_text(path))) if r and any(c.strip() for c in r)]


def _first_line(head: str) -> str:
    return next((ln.strip() for ln in head.splitlines() if ln.strip() and not ln.startswith("#")), "")


def file_format(path: str | Path) -> str:
    """Which of :data:`FORMATS` a grid file is, from its content."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError("grid", f"no such file: {p}")
    first = _first_line(_head(p))
    cells = [c.strip() for c in first.split(",")]
    if tuple(cells[:len(NVIDIA_COLUMNS)]) == NVIDIA_COLUMNS:
        return FORMATS[2]
    if tuple(cells[:len(STEP_COLUMNS)]) == STEP_COLUMNS:
        return FORMATS[3]
    if len(cells) == 11 and cells[1].isdigit() and cells[8].isdigit():
        return FORMATS[1]
    return FORMATS[0]


def _key(algo: str, proto: str, channels: int, where: str) -> Key:
    a = N.ALGOS[N.parse_name(f"{where}: algorithm", algo, N.ALGOS)]
    p = N.PROTOS[N.parse_name(f"{where}: protocol", proto, N.PROTOS)]
    return (a, p, max(int(channels), 0))


def _knobs(cfg: dict) -> tuple[int, ...]:
    return tuple(int(cfg[f]) for f in KNOB_FIELDS)


def _run_point(topo: Topology, coll: int, env: dict[str, str], where: str) -> tuple[tuple[int, ...], Key]:
    """The knob setting and per-call configuration an NCCL environment forces."""
    cfg = env_to_config(topo, coll, env)
    allowed = np.asarray(cfg["allowed"], dtype=bool)
    algos, protos = np.flatnonzero(allowed.any(axis=1)), np.flatnonzero(allowed.any(axis=0))
    if allowed.all():
        return _knobs(cfg), DEFAULT
    if len(algos) == 1 and len(protos) == 1:
        return _knobs(cfg), (N.ALGOS[algos[0]], N.PROTOS[protos[0]], 0)
    raise ConfigError("grid", f"{where}: NCCL_ALGO={env.get('NCCL_ALGO', '')!r} NCCL_PROTO="
                      f"{env.get('NCCL_PROTO', '')!r}: a grid point forces one algorithm and one protocol, "
                      "or neither (NCCL's default)")


def _read_nccltests(path: Path, topo: Topology, raw: _Raw) -> None:
    try:
        runs = parse_file_runs(path, strict=False)
    except NcclTestsError as e:
        raise ConfigError("grid", str(e)) from None
    for run in runs:
        raw.notes += run.notes
        if not run.records:
            continue
        if run.collective not in N.COLLECTIVES:
            raise ConfigError("grid", f"{path}: {run.collective!r} is not tunable; allowed: {', '.join(N.COLLECTIVES)}")
        if run.nranks and run.nranks != topo.nranks:
            raise ConfigError("grid", f"{path} ran on {run.nranks} ranks but {topo.name} has {topo.nranks}; "
                              "pick the topology the run was made on")
        _check_placement(path, run, topo)
        coll = N.COLLECTIVES.index(run.collective)
        env = run_env(run)
        knobs, key = _run_point(topo, coll, env, str(path))
        if "file name" in env_sources(run).values():
            raw.notes.append(f"{path.name}: configuration read from the file name (the output does not print it)")
        for r in run.records:
            raw.add((knobs, coll, int(r.nbytes), key), r.times_us)
    raw.said(FORMATS[0])


def _check_placement(path: Path, run, topo: Topology) -> None:
    """The ranks a run lists (host, process) fit ``topo``: no more hosts than its nodes, and no process
    driving more GPUs than a node has (a process runs on one node). Several nodes emulated on one host
    (``NCCL_HOSTID``) pass: each process drives a node's GPUs at most."""
    hosts = sorted({r.host for r in run.ranks})
    if len(hosts) > topo.nodes:
        raise ConfigError("grid", f"{path} ran on {len(hosts)} hosts ({', '.join(hosts[:4])}) but {topo.name} has "
                          f"{plural(topo.nodes, 'node')}; pick the topology the run was made on")
    per_process: dict[tuple[str, int], int] = {}
    for r in run.ranks:
        per_process[(r.host, r.pid)] = per_process.get((r.host, r.pid), 0) + 1
    if per_process and max(per_process.values()) > topo.gpus_per_node:
        (host, pid), n = max(per_process.items(), key=lambda x: x[1])
        raise ConfigError("grid", f"{path} ran {n} ranks in one process (pid {pid} on {host}), so on one node of "
                          f"{n} or more GPUs, but {topo.name} has {topo.gpus_per_node} GPUs per node; pick the "
                          "topology the run was made on")


def _read_rows_csv(path: Path, topo: Topology, raw: _Raw) -> None:
    jobs: dict[tuple[str, PointKey], list[float]] = {}
    for i, r in enumerate(_csv_rows(path), 1):
        if len(r) != 11:
            raise ConfigError("grid", f"{path}:{i}: {len(r)} columns; this format has 11 (source,size_B,"
                              "oop_time_us,oop_algbw,oop_busbw,ip_time_us,ip_algbw,ip_busbw,nodes,algo,proto)")
        try:
            nodes, nbytes = int(r[8]), int(r[1])
        except ValueError:
            raise ConfigError("grid", f"{path}:{i}: size_B and nodes must be whole numbers, got {r[1]!r}, "
                              f"{r[8]!r}") from None
        if nodes != topo.nodes:
            continue
        x = (BASE_KNOBS, N.ALLREDUCE if "all_reduce" in r[0] or "allreduce" in r[0] else
             _coll_from_source(r[0], path, i), nbytes, _key(r[9], r[10], 0, f"{path}:{i}"))
        jobs.setdefault((r[0], x), []).extend(_floats(r[2], r[5]))
    if not jobs:
        raise ConfigError("grid", f"{path}: no rows for {topo.nodes} nodes ({topo.name})")
    for (_src, x), s in jobs.items():
        raw.add(x, s)
    raw.said(FORMATS[1])


def _coll_from_source(src: str, path: Path, line: int) -> int:
    for name in ("all_gather", "reduce_scatter", "broadcast", "reduce"):
        if name in src:
            return N.parse_name("collective", name, N.COLLECTIVES)
    raise ConfigError("grid", f"{path}:{line}: the source {src!r} names no collective")


def _floats(*cells: str) -> list[float]:
    out = []
    for c in cells:
        with contextlib.suppress(ValueError):
            out.append(float(c))
    return out


def _read_nvidia(path: Path, topo: Topology, raw: _Raw) -> None:
    rows = _csv_rows(path)
    head = [c.strip() for c in rows[0]]
    if "latency_us" not in head:
        raise ConfigError("grid", f"{path}: no latency_us column; NVIDIA's CSV needs it as the time")
    at = {c: head.index(c) for c in (*NVIDIA_COLUMNS, "latency_us")}
    kept = skipped = 0
    for i, r in enumerate(rows[1:], 2):
        where = f"{path}:{i}"
        get = {c: (r[j].strip() if j < len(r) else "") for c, j in at.items()}
        try:
            nodes, ranks, ch = int(get["nodes"]), int(get["ranks"]), int(get["channels"])
            nbytes = int(get["size_bytes"])
        except ValueError:
            raise ConfigError("grid", f"{where}: nodes, ranks, channels and size_bytes must be whole numbers") from None
        if nodes not in (-1, topo.nodes) or ranks not in (-1, topo.nranks):
            continue
        try:
            t = float(get["latency_us"])
        except ValueError:
            t = math.nan
        if not (math.isfinite(t) and t > 0):
            skipped += 1  # as the helper script does: a row without a usable time
            continue
        coll = N.parse_name(f"{where}: collective", get["collective"], N.COLLECTIVES)
        raw.add((BASE_KNOBS, coll, nbytes, _key(get["algorithm"], get["protocol"], ch, where)), [t])
        kept += 1
    if not kept:
        raise ConfigError("grid", f"{path}: no row for {topo.nodes} nodes x {topo.nranks} ranks ({topo.name})")
    if skipped:
        raw.notes.append(f"{path.name}: {skipped} rows without a finite latency_us > 0 left out")
    raw.said(FORMATS[2])


def _read_step_proxy(path: Path, topo: Topology, raw: _Raw, mode: str, platform: str) -> None:
    rows = _csv_rows(path)
    head = [c.strip() for c in rows[0]]
    at = {c: head.index(c) for c in STEP_COLUMNS}
    shape = f"{topo.nodes}x{topo.gpus_per_node}"
    kept = 0
    for i, r in enumerate(rows[1:], 2):
        get = {c: r[j].strip() for c, j in at.items()}
        if get["topology_nodes_x_gpus"] != shape or get["mode"] != mode or platform not in get["platform"]:
            continue
        nbytes = parse_bytes(get["size_label"], f"{path}:{i}: size_label")
        cfg = get["config"].lower()
        if cfg != "auto" and "_" not in cfg:
            raise ConfigError("grid", f"{path}:{i}: config {cfg!r}: auto or ALGO_PROTO (ring_simple, tree_ll, ...)")
        key = DEFAULT if cfg == "auto" else _key(*cfg.split("_", 1), 0, f"{path}:{i}")
        t = _floats(get["iter_time_ms"])
        if not t:
            raise ConfigError("grid", f"{path}:{i}: iter_time_ms {get['iter_time_ms']!r} is not a number")
        raw.add((BASE_KNOBS, N.ALLREDUCE, nbytes, key), [1000.0 * t[0]])
        kept += 1
    if not kept:
        raise ConfigError("grid", f"{path}: no rows for shape {shape}, mode {mode!r}, platform {platform!r}")
    raw.said(FORMATS[3])


def read_points(paths: list[str | Path], topo: Topology, mode: str = "sequential", platform: str = "") -> _Raw:
    raw = _Raw()
    for p in map(Path, paths):
        fmt = file_format(p)
        if fmt == FORMATS[0]:
            _read_nccltests(p, topo, raw)
        elif fmt == FORMATS[1]:
            _read_rows_csv(p, topo, raw)
        elif fmt == FORMATS[2]:
            _read_nvidia(p, topo, raw)
        else:
            _read_step_proxy(p, topo, raw, mode, platform)
    if not raw.points:
        raise ConfigError("grid", f"no measurements in {', '.join(map(str, paths))}")
    return raw


# -- NCCL's default ------------------------------------------------------------------------------

def _default_file_kind(path: Path) -> str:
    """``run`` (a measured run of NCCL's defaults), ``table`` (bytes, time_us CSV) or ``log``."""
    cells = [c.strip() for c in _first_line(_head(path)).split(",")]
    if len(cells) >= 2 and not cells[0].replace(".", "").isdigit() and any(
            w in cells[0].lower() for w in ("byte", "size", "msg")):
        return "table"
    text = read_text(path)
    if "Bytes -> Algo" in text and "NCCL INFO" in text:
        try:
            runs = parse_file_runs(path, strict=False)
        except NcclTestsError:
            runs = []
        if not any(r.records for r in runs):
            return "log"
    return "run"


def _measured_default(paths: list[Path], topo: Topology, colls: list[int]) -> tuple[dict, str]:
    out: dict[PointKey, list[list[float]]] = {}
    for p in paths:
        kind = _default_file_kind(p)
        if kind == "table":
            rows = _csv_rows(p)
            for i, r in enumerate(rows[1:], 2):
                try:
                    nbytes, t = int(float(r[0])), float(r[1])
                except (ValueError, IndexError):
                    raise ConfigError("default", f"{p}:{i}: expected bytes then NCCL's time in us") from None
                if math.isfinite(t) and t > 0:
                    for c in colls:
                        out.setdefault((BASE_KNOBS, c, nbytes, DEFAULT), []).append([t])
        elif kind == "run":
            raw = _Raw()
            _read_nccltests(p, topo, raw)
            bad = [x for x in raw.points if x[3] != DEFAULT or x[0] != BASE_KNOBS]
            if bad:
                raise ConfigError("default", f"{p}: not a run of NCCL's defaults (it forces {bad[0][3]} "
                                  f"knobs {bad[0][0]})")
            for x, jobs in raw.points.items():
                out.setdefault(x, []).extend(jobs)
        else:
            raise ConfigError("default", f"{p}: an NCCL log; give logs alone (default=LOG...)")
    return out, f"measured: NCCL's defaults run in {', '.join(p.name for p in paths)}"


def _logged_choices(paths: list[Path], topo: Topology) -> dict[tuple[int, int], Key]:
    facts = parse_logs(paths)
    if not facts.decisions:
        raise ConfigError("default", f"no per-call decision lines in {', '.join(p.name for p in paths)}; log with "
                          "NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=TUNING")
    if facts.nranks and facts.nranks != topo.nranks:
        raise ConfigError("default", f"the log's communicator has {facts.nranks} ranks, {topo.name} has {topo.nranks}")
    out: dict[tuple[int, int], Key] = {}
    for d in facts.decisions:
        if d.coll < 0:
            continue
        nbytes = d.log_nbytes * (topo.nranks if d.coll in (N.ALLGATHER, N.REDUCESCATTER) else 1)
        out.setdefault((d.coll, nbytes), (N.ALGOS[d.algo], N.PROTOS[d.proto], 0))
    return out


def _mapped_default(raw: _Raw, choice: dict[tuple[int, int], Key] | None, topo: Topology) -> dict:
    """NCCL's default at each measured size as the grid's forced run of NCCL's choice (logged, or
    the replica's when ``choice`` is ``None``)."""
    out: dict[PointKey, list[list[float]]] = {}
    by: dict[tuple[tuple[int, ...], int], set[int]] = {}
    for k, c, s, _key in raw.points:
        by.setdefault((k, c), set()).add(s)
    for (k, c), ss in by.items():
        sizes = sorted(ss)
        if choice is None:
            d = default_decisions(topo, c, np.array(sizes, dtype=np.int64), comm_channels=k[0])
            keys = {s: (N.ALGOS[a], N.PROTOS[p], 0) for s, a, p in zip(sizes, d.algo, d.proto, strict=True)}
        elif k == BASE_KNOBS:
            keys = {s: choice[(c, s)] for s in sizes if (c, s) in choice}
        else:
            continue
        for s, key in keys.items():
            jobs = raw.points.get((k, c, s, key))
            if jobs:
                out[(k, c, s, DEFAULT)] = jobs
    return out


def read_grid(paths: list[str | Path], topo: Topology, default: str | list[str] = "auto",
              mode: str = "sequential", platform: str = "", default_note: str = "") -> Grid:
    """A grid of ``topo`` from the files at ``paths`` (see the module's docs).

    :param paths: the grid's files (formats told apart by content)
    :param topo: the platform they were measured on (its nodes and ranks select rows)
    :param default: where NCCL's default comes from: ``auto`` (the grid's unforced runs, else the
        replica), ``replica``, or files: runs of NCCL's defaults (nccl-tests outputs, a bytes,time_us
        CSV) or NCCL_DEBUG=INFO logs with per-call decisions
    :param mode: training-step proxy CSV: ``sequential`` or ``overlap``
    :param platform: training-step proxy CSV: keep rows whose platform contains this text
    :param default_note: said after the default's source (e.g. "another date than the grid")
    """
    if not paths:
        raise ConfigError("grid", "no files given")
    raw = read_points(paths, topo, mode, platform)
    defaults = [str(d) for d in ([default] if isinstance(default, str) else default) if str(d)]
    if not defaults:
        defaults = ["auto"]
    measured = {x: v for x, v in raw.points.items() if x[3] == DEFAULT}
    grid_points = {x: v for x, v in raw.points.items() if x[3] != DEFAULT}
    if not grid_points:
        raise ConfigError("grid", f"no forced configuration in {', '.join(map(str, paths))}: only NCCL's defaults; "
                          "a grid needs runs that force NCCL_ALGO and NCCL_PROTO (or a CSV of configurations)")
    if defaults == ["auto"] and any(x[0] == BASE_KNOBS for x in measured):
        src = f"measured: NCCL's unforced runs in the grid ({len(measured)} points)"
        dflt = measured
    elif defaults in (["auto"], ["replica"]):
        src = (f"replica of NCCL {topo.nccl.version}'s decision for {topo.name} (a prediction), timed by the grid's "
               "forced run of that choice")
        dflt = _mapped_default(_Raw(grid_points), None, topo)
    else:
        files = [Path(d) for d in defaults]
        for f in files:
            if not f.is_file():
                raise ConfigError("default", f"no such file: {f}; allowed: auto, replica, or files")
        kinds = {_default_file_kind(f) for f in files}
        if kinds == {"log"}:
            choice = _logged_choices(files, topo)
            dflt = _mapped_default(_Raw(grid_points), choice, topo)
            src = (f"NCCL's logged decisions in {', '.join(f.name for f in files)}, timed by the grid's forced "
                   "run of that choice")
        elif "log" in kinds:
            raise ConfigError("default", "give either NCCL logs or runs of NCCL's defaults, not both")
        else:
            dflt, src = _measured_default(files, topo, sorted({x[1] for x in grid_points}))
    if default_note:
        src = f"{src} ({default_note})"
    recorded = dict(grid_points)
    recorded.update(dflt)
    colls = sorted({x[1] for x in grid_points} | {x[1] for x in dflt if x[0] == BASE_KNOBS})
    sizes: dict[int, list[int]] = {}
    notes = list(raw.notes)
    for c in colls:
        have = {x[2] for x in grid_points if x[1] == c}
        known = {x[2] for x in recorded if x[1] == c and x[0] == BASE_KNOBS and x[3] == DEFAULT}
        sizes[c] = sorted(have & known)
        lost = sorted(have - known)
        if lost:
            notes.append(f"{N.COLLECTIVES[c]}: {len(lost)} measured sizes left out, NCCL's default unknown there "
                         f"(e.g. {lost[0]} B)")
        extra = sorted(known - have)
        if extra:
            notes.append(f"{N.COLLECTIVES[c]}: {len(extra)} sizes of NCCL's default have no forced run; left out")
    colls = [c for c in colls if sizes[c]]
    if not colls:
        raise ConfigError("default", f"NCCL's default ({src}) is known at none of the grid's sizes")
    keep = {(c, s) for c in colls for s in sizes[c]}
    recorded = {x: v for x, v in recorded.items() if (x[1], x[2]) in keep}
    knob_set = sorted({x[0] for x in recorded}, key=lambda k: (k != BASE_KNOBS, k))
    if knob_set[0] != BASE_KNOBS:
        raise ConfigError("grid", "no run under NCCL's default knob settings")
    knobs = [Point("allreduce", 1, **dict(zip(KNOB_FIELDS, k, strict=True))) for k in knob_set]
    return Grid(recorded, knobs, colls, sizes, src, raw.formats, [str(p) for p in paths], notes)


# -- answering measurements ------------------------------------------------------------------------

class GridWorkers(Backend):
    """Answers from a grid: a point's recorded jobs in turn (a point measured again gets the next,
    round again after the last); a point the grid does not have fails, like a configuration NCCL
    could not run. ``seen`` counts requests per point across the jobs of one run (share it)."""

    name = "replay"

    def __init__(self, grid: Grid, knobs: Point, seen: dict[PointKey, int] | None = None) -> None:
        super().__init__()
        self.grid, self.knobs = grid, knobs
        self.seen = {} if seen is None else seen

    def measure(self, points: list[Point], samples: int = 5) -> list[list[float] | None]:
        out: list[list[float] | None] = []
        self.failures = {}
        for i, p in enumerate(points):
            x = (tuple(map(int, p.knobs)), N.COLLECTIVES.index(p.collective), int(p.nbytes),
                 (p.algo, p.proto, int(p.channels)))
            jobs = self.grid.recorded.get(x)
            if not jobs:
                self.failures[i] = "not in the replayed grid"
                out.append(None)
                continue
            n = self.seen.get(x, 0)
            self.seen[x] = n + 1
            out.append(list(jobs[n % len(jobs)]))
        self.last_modes = ["eager"] * len(points)
        return out


# -- the public grids ------------------------------------------------------------------------------

@dataclass(frozen=True)
class PublicGrid:
    """A public measured grid in the shared data folder, as a benchmark problem.

    :param folder: its folder under ``public-grids``
    :param files: the grid's files in it
    :param topology: the preset it was measured on
    :param family: the preset family whose left-out strategy tunes it
    :param default: NCCL's default: ``auto``, ``replica`` or files in the folder
    :param default_note: said with the default's source
    :param mode: training-step proxy CSV: the mode
    :param platform: training-step proxy CSV: the platform
    :param what: what a time is
    """

    folder: str
    files: tuple[str, ...]
    topology: str
    family: str
    default: tuple[str, ...] = ("auto",)
    default_note: str = ""
    mode: str = "sequential"
    platform: str = ""
    what: str = "nccl-tests time per call (us)"


_P5EN = "aws-p5en-nightly-algo-proto"
_P5EN_FILES = ("nccl-tests-all_reduce_0x0_perf.csv",)
_CS244C = "cs244c-bandit-nccl-a100-g5"
_STEP = "a training-step proxy: one 4096x4096 fp32 matrix product and one AllReduce per step (us per step)"
PUBLIC_GRIDS: dict[str, PublicGrid] = {
    "p5en-2n": PublicGrid(_P5EN, _P5EN_FILES, "p5en-2n", "infiniband", ("replica",)),
    "p5en-16n": PublicGrid(_P5EN, _P5EN_FILES, "p5en-16n", "infiniband",
                           ("tuner_comparison_allreduce_16nodes_0x0.csv",),
                           "NCCL's own tuner measured on another date and NCCL version than the grid"),
    "p5en-128n": PublicGrid(_P5EN, _P5EN_FILES, "p5en-128n", "infiniband", ("replica",)),
    "a100-1x8-step": PublicGrid(_CS244C, ("transcribed_iteration_times_ms.csv",), "a100-1x8-nvswitch", "nvlink",
                                platform="A100", what=_STEP),
    "a100-2x4-step": PublicGrid(_CS244C, ("transcribed_iteration_times_ms.csv",), "a100-2x4-sock", "socket",
                                platform="A100", what=_STEP),
    "a100-4x2-step": PublicGrid(_CS244C, ("transcribed_iteration_times_ms.csv",), "a100-4x2-sock", "socket",
                                platform="A100", what=_STEP),
}


def public_grid_folder(root: str | Path | None = None) -> Path:
    """The public grids' folder: ``root/public-grids`` (default :func:`shared_data_dir`)."""
    return Path(root or shared_data_dir()) / "public-grids"


def read_public_grid(name: str, topo: Topology, root: str | Path | None = None) -> Grid:
    """The public grid ``name`` (:data:`PUBLIC_GRIDS`) read from the shared data folder."""
    if name not in PUBLIC_GRIDS:
        raise ConfigError("grids", f"unknown grid {name!r}; allowed: {', '.join(PUBLIC_GRIDS)}")
    g = PUBLIC_GRIDS[name]
    d = public_grid_folder(root) / g.folder
    if not d.is_dir():
        raise ConfigError("grids", f"no folder {d}; set NCCLRL_SHARED_DATA to the shared data folder")
    default: list[str] = [x if x in ("auto", "replica") else str(d / x) for x in g.default]
    return read_grid([d / f for f in g.files], topo, default, mode=g.mode, platform=g.platform,
                     default_note=g.default_note)
