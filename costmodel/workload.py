"""Tune for the user's job: the communication cost of a training step, interference included.

A job's profile (:mod:`ncclrl.costmodel.profile`) lists its collectives per step: collective,
bytes, communicator shape (nodes x ranks), calls per step, and whether they overlap compute. A
table chosen on isolated times (what ``ncclrl export`` does) picks, per call, the configuration
that finishes the collective first, usually on every channel it can get. In a job, a call that
overlaps compute trades: each channel is a CTA on an SM the compute kernels lack, and its HBM
traffic competes with theirs, while the compute slows the collective down
(:meth:`ncclrl.costmodel.simulator.Simulator.interference`).

The objective, per step and per communicator shape::

    cost = sum over calls of calls_per_step x (overlap x cost_overlapped + (1 - overlap) x t_isolated)

where ``cost_overlapped = max(t_loaded - compute_us, t_loaded x (1 - compute_rate))`` is what the call
adds beyond the compute it overlaps: the exposed communication when it outlasts the compute, else
the compute's slowdown. The time of a step is the job's compute plus this cost.

The compute a call overlaps is an explicit input, never guessed from the profile (``ncclrl
profile`` cannot see it on CPU traces):

* a profile row may carry ``compute_us_per_call`` (us of compute, as it runs alone, overlapping
  each overlapped call) and ``compute_mem_frac`` (the share 0-1 of that compute bound by HBM
  bandwidth); :func:`load_workload` reads them (``ncclrl profile`` does not write them);
* else :func:`load_workload`'s ``compute_us_per_call`` (one figure for every overlapped call), or
  ``compute_ratio`` (the compute per call as a multiple of the call's time under NCCL's default on
  the platform the workload is resolved on, :func:`resolve_compute`);
* ``overlaps_compute``: ``yes`` 1, ``partial`` 0.5, ``no`` 0, ``unknown`` as ``unknown_overlap``
  says (default 0: an unknown call is charged in full, as today).

:func:`choose` picks, per (collective, nodes, ranks, bytes), the configuration of least isolated
time (today's choice) and the one of least objective (the workload's); :func:`compare` judges
tables on platform draws with a 95% interval.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from ncclrl.costmodel import nccl as N
from ncclrl.costmodel.errors import ConfigError
from ncclrl.costmodel.platforms import Platform, Quirks, draw_platform
from ncclrl.costmodel.profile import DTYPE_NBYTES, profile_document
from ncclrl.costmodel.replica import default_decisions, eligible_mask
from ncclrl.costmodel.simulator import Configs, Simulator
from ncclrl.costmodel.table import Table
from ncclrl.costmodel.topology import Topology, load_topology

#: the per-call channel counts tried (0: NCCL's own count for the algorithm and protocol), capped
#: by the communicator's channels; the same list the tuning environment's actions use
CHANNEL_CHOICES = (0, 1, 2, 4, 8, 12, 16, 24, 32, 48, 64)
OVERLAP_SHARE = {"yes": 1.0, "partial": 0.5, "no": 0.0}
#: assumed share of overlapped compute bound by HBM bandwidth when nothing says (training steps mix
#: GEMMs, SM-bound, with normalisation, activation and optimizer kernels, memory-bound)
DEFAULT_MEM_FRAC = 0.3

Key = tuple[str, int, int, int]  # (collective, nodes, ranks, nbytes): what a table row can tell apart


@dataclass(frozen=True)
class Choice:
    """How a call runs: NCCL's own (``default``) or a forced algorithm and protocol, on
    ``channels`` channels (0: NCCL's per-call count)."""

    algo: str = "default"
    proto: str = "default"
    channels: int = 0

    def __str__(self) -> str:
        return "nccl" if self.algo == "default" and not self.channels else f"{self.algo}/{self.proto}/{self.channels}"


NCCL_DEFAULT = Choice()


@dataclass
class WorkCall:
    """One profile row, with the compute it overlaps.

    :param collective: broadcast, reduce, allgather, reducescatter or allreduce
    :param nbytes: bytes per call as NCCL's tuner sees them
    :param nodes: nodes of the communicator
    :param ranks: ranks of the communicator
    :param calls_per_step: calls per training step
    :param overlap: share 0-1 of the calls that overlap compute
    :param compute_us_per_call: compute (us, as it runs alone) each overlapped call overlaps
    :param mem_frac: share 0-1 of that compute bound by HBM bandwidth
    :param dtype: the data type (bookkeeping)
    """

    collective: str
    nbytes: int
    nodes: int
    ranks: int
    calls_per_step: float
    overlap: float = 0.0
    compute_us_per_call: float = 0.0
    mem_frac: float = DEFAULT_MEM_FRAC
    dtype: str = "unknown"

    @property
    def key(self) -> Key:
        return (self.collective, self.nodes, self.ranks, self.nbytes)


@dataclass
class Workload:
    """A job's collectives per step.

    :param calls: the rows
    :param name: for reports
    :param other_compute_us: compute per step no collective overlaps (us), for the step's time
    :param compute_ratio: when set, :func:`resolve_compute` derives each overlapped call's compute
        from it (a multiple of the call's NCCL-default time)
    :param notes: rows left out and why
    """

    calls: list[WorkCall]
    name: str = "job"
    other_compute_us: float = 0.0
    compute_ratio: float | None = None
    notes: list[str] = field(default_factory=list)

    def call_keys(self) -> list[Key]:
        return list(dict.fromkeys(c.key for c in self.calls))

    def compute_us_per_step(self) -> float:
        """All compute of a step (us, as it runs alone): the overlapped and the rest."""
        return self.other_compute_us + sum(c.calls_per_step * c.overlap * c.compute_us_per_call for c in self.calls)


# -- reading ---------------------------------------------------------------------------------


def _number(where: str, v: Any, lo: float = 0.0, hi: float | None = None) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not np.isfinite(v) or v < lo or \
            (hi is not None and v > hi):
        bounds = f">= {lo}" + (f" and <= {hi}" if hi is not None else "")
        raise ConfigError(where, f"must be a number {bounds}, got {v!r}")
    return float(v)


def load_workload(path: str | Path, compute_us_per_call: float | None = None, compute_ratio: float | None = None,
                  mem_frac: float = DEFAULT_MEM_FRAC, unknown_overlap: float = 0.0,
                  other_compute_us: float = 0.0, topology: Topology | str | None = None) -> Workload:
    """A workload from a profile YAML (what ``ncclrl profile`` writes, rows optionally extended with
    ``compute_us_per_call`` and ``compute_mem_frac``).

    :param compute_us_per_call: compute overlapping each overlapped call (us) for rows that do not say
    :param compute_ratio: instead, compute per overlapped call as a multiple of its NCCL-default time
        (resolved by :func:`resolve_compute`); give at most one of the two
    :param mem_frac: HBM-bound share of the compute for rows that do not say
    :param unknown_overlap: overlap share 0-1 of rows whose ``overlaps_compute`` is ``unknown``
    :param other_compute_us: compute per step no collective overlaps (us)
    :param topology: resolves rows whose node count is unknown (0): one node when the ranks fit in
        one, else the ranks spread over whole nodes
    """
    if compute_us_per_call is not None and compute_ratio is not None:
        raise ConfigError("compute", "give compute_us_per_call or compute_ratio, not both")
    doc = profile_document(path)
    topo = load_topology(topology) if topology is not None else None
    mem = _number("mem_frac", mem_frac, 0.0, 1.0)
    unk = _number("unknown_overlap", unknown_overlap, 0.0, 1.0)
    calls: list[WorkCall] = []
    notes: list[str] = []
    for i, row in enumerate(doc.get("collectives") or []):
        where = f"{path}: collectives[{i}]"
        if not isinstance(row, dict):
            raise ConfigError(where, "must be a mapping")
        try:
            coll, nbytes = str(row["collective"]), int(row["nbytes"])
            nodes, ranks = int(row["nodes"]), int(row["ranks"])
            cps = _number(f"{where}.calls_per_step", row["calls_per_step"])
        except (KeyError, TypeError, ValueError) as e:
            raise ConfigError(where, f"needs collective, nbytes, nodes, ranks, calls_per_step ({e})") from None
        ov = str(row.get("overlaps_compute", "unknown"))
        if ov not in (*OVERLAP_SHARE, "unknown"):
            raise ConfigError(f"{where}.overlaps_compute", f"yes, no, partial or unknown, got {ov!r}")
        if coll not in N.COLLECTIVES:
            notes.append(f"{coll} {nbytes} B x {cps:g}/step left out: the tuner decides only "
                         + ", ".join(N.COLLECTIVES))
            continue
        if ranks < 2 or nbytes <= 0:
            notes.append(f"{coll} {nbytes} B on {ranks} rank(s) left out: nothing to tune")
            continue
        if nodes <= 0:
            if topo is None:
                raise ConfigError(f"{where}.nodes", "unknown (0); give the topology to resolve it")
            nodes = 1 if ranks <= topo.gpus_per_node else -(-ranks // topo.gpus_per_node)
        c_us = row.get("compute_us_per_call", compute_us_per_call)
        calls.append(WorkCall(
            coll, nbytes, nodes, ranks, cps, OVERLAP_SHARE.get(ov, unk),
            _number(f"{where}.compute_us_per_call", c_us) if c_us is not None else 0.0,
            _number(f"{where}.compute_mem_frac", row.get("compute_mem_frac", mem), 0.0, 1.0),
            str(row.get("dtype", "unknown"))))
    if not calls:
        raise ConfigError("profile", f"{path}: no collective the tuner decides")
    return Workload(calls, Path(path).stem, _number("other_compute_us", other_compute_us), compute_ratio, notes)


def rescale(workload: Workload, nodes: int, ranks: int, bytes_factor: float = 1.0) -> Workload:
    """The same calls on a communicator of ``nodes`` x ``ranks`` (every row), each call's bytes
    times ``bytes_factor``, rounded up to whole elements (whole elements per rank for AllGather and
    ReduceScatter, whose bytes count every rank's part)."""
    out = []
    for c in workload.calls:
        elem = DTYPE_NBYTES.get(c.dtype, 1) or 1
        q = elem * (ranks if c.collective in ("allgather", "reducescatter") else 1)
        nb = max(q, int(-(-round(c.nbytes * bytes_factor) // q) * q))
        out.append(replace(c, nodes=nodes, ranks=ranks, nbytes=nb))
    return replace(workload, calls=out, notes=list(workload.notes))


def calls_by_size(workload: Workload, nodes: int, ranks: int) -> dict[str, dict[int, float]]:
    """Calls per step per collective and bytes, every call moved to a communicator of ``nodes`` x
    ``ranks`` (:func:`rescale`): the job as one tuning problem per collective on that communicator."""
    out: dict[str, dict[int, float]] = {}
    for c in rescale(workload, nodes, ranks).calls:
        at = out.setdefault(c.collective, {})
        at[c.nbytes] = at.get(c.nbytes, 0.0) + c.calls_per_step
    return out


# -- the platform a workload runs on ------------------------------------------------------------


class Target:
    """Where a workload is timed: a simulator, or a platform (a simulator with effects beyond it),
    each communicator shape simulated with the platform's parameters (:meth:`Topology.shape`)."""

    def __init__(self, where: Simulator | Platform | Topology | str) -> None:
        if isinstance(where, Platform):
            self.sim, self.quirks = where.sim, where.quirks
        elif isinstance(where, Simulator):
            self.sim, self.quirks = where, None
        else:
            self.sim, self.quirks = Simulator(load_topology(where)), None
        self.topo = self.sim.topo
        self._shapes: dict[tuple[int, int], Simulator] = {}

    def shape(self, nodes: int, ranks: int) -> Simulator:
        if (nodes, ranks) not in self._shapes:
            t = self.topo
            self._shapes[(nodes, ranks)] = self.sim if (nodes, ranks) == (t.nodes, t.nranks) else \
                Simulator(t.shape(nodes, ranks), params=self.sim.params)
        return self._shapes[(nodes, ranks)]

    def iso_us(self, sim: Simulator, cfg: Configs) -> np.ndarray:
        t = sim.time_us(cfg, validate=False)
        return t * np.exp(self.quirks.offset(cfg)) if isinstance(self.quirks, Quirks) else t


def _configs(sim: Simulator, coll: int, nbytes: np.ndarray, choices: Sequence[Choice],
             conf: Mapping[str, int] | None = None) -> Configs:
    """Simulator configurations of (size, choice) pairs; ``conf`` the per-process knobs (nccl.conf)."""
    conf = conf or {}
    nbytes = np.asarray(nbytes, dtype=np.int64)
    comm = int(conf.get("NCCL_MIN_NCHANNELS", 0))
    algo = np.empty(nbytes.size, np.int64)
    proto = np.empty(nbytes.size, np.int64)
    is_def = np.array([c.algo == "default" for c in choices])
    if is_def.any():
        d = default_decisions(sim.topo, coll, nbytes[is_def], comm_channels=comm)
        algo[is_def], proto[is_def] = d.algo, d.proto
    for i, c in enumerate(choices):
        if c.algo != "default":
            algo[i] = N.parse_name("algorithm", c.algo, N.ALGOS)
            proto[i] = N.parse_name("protocol", c.proto, N.PROTOS)
    ch = np.array([c.channels for c in choices], dtype=np.int64)
    return Configs.make(coll, nbytes, algo, proto, ch, comm, conf.get("NCCL_BUFFSIZE", 0),
                        conf.get("NCCL_SOCKET_NTHREADS", 0), conf.get("NCCL_NSOCKS_PERTHREAD", 0),
                        conf.get("NCCL_SOCKET_INLINE", 0))


def _per_call(target: Target, calls: Sequence[WorkCall], cfg: Configs, sim: Simulator) -> tuple[np.ndarray, np.ndarray]:
    """Per (call, configuration) entry: the isolated time and what it costs a step (both per call)."""
    t_iso = target.iso_us(sim, cfg)
    ov = np.array([c.overlap for c in calls])
    comp = np.array([c.compute_us_per_call for c in calls])
    mem = np.array([c.mem_frac for c in calls])
    inter = sim.interference(cfg, comp, mem, t_iso_us=t_iso, validate=False)
    return t_iso, ov * inter.cost_us + (1.0 - ov) * t_iso


def candidates(topo: Topology, collective: str, comm_channels: int = 0) -> list[Choice]:
    """NCCL's default, then every (algorithm, protocol) NCCL can run for the collective on ``topo``
    at each of :data:`CHANNEL_CHOICES` that fits the communicator's channels."""
    coll = N.parse_name("collective", collective, N.COLLECTIVES)
    m = eligible_mask(topo)[coll]
    comm = comm_channels or topo.nccl.channels
    out = [NCCL_DEFAULT]
    for a in range(N.NUM_ALGOS):
        for p in range(N.NUM_PROTOS):
            if m[a, p]:
                out += [Choice(N.ALGOS[a], N.PROTOS[p], ch) for ch in CHANNEL_CHOICES if ch <= comm]
    return out


# -- the objective --------------------------------------------------------------------------------


def resolve_compute(workload: Workload, where: Simulator | Platform | Topology | str,
                    ratio: float | None = None) -> Workload:
    """The workload with each overlapped call's compute set to ``ratio`` (default: the workload's
    ``compute_ratio``) times the call's isolated time under NCCL's default on ``where``; unchanged
    when neither is set. Resolve once, on the platform the tables are chosen on, and keep the result:
    the job's compute does not change with the platform's NCCL."""
    ratio = workload.compute_ratio if ratio is None else ratio
    if ratio is None:
        return workload
    _number("compute_ratio", ratio)
    target = Target(where)
    out = []
    for c in workload.calls:
        sim = target.shape(c.nodes, c.ranks)
        coll = N.parse_name("collective", c.collective, N.COLLECTIVES)
        t = float(target.iso_us(sim, _configs(sim, coll, np.array([c.nbytes]), [NCCL_DEFAULT]))[0])
        out.append(replace(c, compute_us_per_call=ratio * t if c.overlap > 0 else c.compute_us_per_call))
    return replace(workload, calls=out, compute_ratio=None, notes=list(workload.notes))


Choices = Mapping[Key, Choice]


def table_choices(table: Table, workload: Workload) -> dict[Key, Choice]:
    """What ``table`` runs for each of the workload's keys (no row: NCCL's default)."""
    out: dict[Key, Choice] = {}
    for key in workload.call_keys():
        coll, nodes, ranks, nbytes = key
        row = table.lookup(coll, nbytes, nodes, ranks)
        out[key] = NCCL_DEFAULT if row is None else Choice(row.algo, row.proto if row.algo != "default" else "default",
                                                           max(int(row.channels), 0))
    return out


def step_costs(where: Simulator | Platform | Target | Topology | str, workload: Workload,
               choices: Choices | Table | None = None, conf: Mapping[str, int] | None = None,
               interference: bool = True) -> dict[Key, float]:
    """Per key, what its calls cost one step (us): calls per step x (overlap x cost under the
    overlapped compute + the rest at the isolated time); ``interference=False``: calls per step x
    isolated time (what a table chosen in isolation optimizes).

    :param choices: per key, how it runs (missing: NCCL's default); a :class:`Table` is looked up
        as the plugin would (its ``nccl.conf`` applied unless ``conf`` is given)
    :param conf: per-process knobs (``nccl.conf`` variables) the job runs with
    """
    target = where if isinstance(where, Target) else Target(where)
    if isinstance(choices, Table):
        conf = dict(choices.conf) if conf is None else conf
        choices = table_choices(choices, workload)
    choices = choices or {}
    by_key: dict[Key, list[WorkCall]] = {}
    for c in workload.calls:
        by_key.setdefault(c.key, []).append(c)
    out: dict[Key, float] = {}
    for key, calls in by_key.items():
        coll, nodes, ranks, nbytes = key
        sim = target.shape(nodes, ranks)
        ch = choices.get(key, NCCL_DEFAULT)
        cfg = _configs(sim, N.parse_name("collective", coll, N.COLLECTIVES), np.full(len(calls), nbytes),
                       [ch] * len(calls), conf)
        t_iso, cost = _per_call(target, calls, cfg, sim)
        per = cost if interference else t_iso
        out[key] = float(sum(c.calls_per_step * float(x) for c, x in zip(calls, per, strict=True)))
    return out


def step_cost(where: Simulator | Platform | Target | Topology | str, workload: Workload,
              choices: Choices | Table | None = None, conf: Mapping[str, int] | None = None,
              interference: bool = True) -> float:
    """The step's communication cost (us): the sum of :func:`step_costs`."""
    return float(sum(step_costs(where, workload, choices, conf, interference).values()))


def step_time(where: Simulator | Platform | Target | Topology | str, workload: Workload,
              choices: Choices | Table | None = None, conf: Mapping[str, int] | None = None) -> float:
    """A step's time (us): all its compute plus the communication cost (:func:`step_cost`)."""
    return workload.compute_us_per_step() + step_cost(where, workload, choices, conf)


@dataclass
class Picks:
    """Per key: the isolated choice (least isolated time, today's), the workload's (least
    objective), and each one's predicted cost per step (us) on the platform they were chosen on."""

    isolated: dict[Key, Choice]
    aware: dict[Key, Choice]
    isolated_cost: dict[Key, float]
    aware_cost: dict[Key, float]
    default_cost: dict[Key, float]


def _combine(per_platform: np.ndarray, aggregate: str | float) -> np.ndarray:
    """Per candidate, its costs on the platforms (rows) combined: ``mean``, ``max``, or a quantile
    0-1 (linear interpolation between platforms)."""
    if aggregate == "mean":
        return per_platform.mean(axis=0)
    if aggregate == "max":
        return per_platform.max(axis=0)
    return np.quantile(per_platform, float(aggregate), axis=0)


def _stressed_cost(target: Target, calls: Sequence[WorkCall], cfg: Configs, sim: Simulator,
                   factor: float) -> np.ndarray:
    """Per (call, configuration) entry, what it costs a step (as :func:`_per_call`) when every isolated
    time is ``factor`` times the platform's: a call hidden under its compute by a thin margin comes
    out exposed."""
    t_iso = target.iso_us(sim, cfg) * factor
    ov = np.array([c.overlap for c in calls])
    comp = np.array([c.compute_us_per_call for c in calls])
    mem = np.array([c.mem_frac for c in calls])
    inter = sim.interference(cfg, comp, mem, t_iso_us=t_iso, validate=False)
    return ov * inter.cost_us + (1.0 - ov) * t_iso


def choose(where: Simulator | Platform | Target | Topology | str | Sequence[Simulator | Platform | Target],
           workload: Workload, margin: float = 0.01, conf: Mapping[str, int] | None = None,
           aggregate: str | float = "mean", headroom: float = 0.0, dominance: bool = False) -> Picks:
    """Per key of the workload, every candidate (:func:`candidates`) timed on ``where`` (one platform,
    or several: a choice made on several draws, their costs combined by ``aggregate``: ``mean``,
    ``max`` for the candidate whose worst platform is best, or a number in (0, 1]: that quantile of
    the platforms' costs):

    * isolated: least isolated time; NCCL's default kept unless the best is faster by more than
      ``margin`` (the rule ``ncclrl export`` applies);
    * aware: among the candidates that cost no more than the isolated choice (their combined
      objective; with ``dominance``, on every platform of ``where``), the one of least objective
      (calls per step x cost under the overlapped compute); NCCL's default kept unless the best
      beats it by more than ``margin``. The aware choice never costs more than the isolated one on
      ``where``.

    :param headroom: ``h`` >= 0: the aware choice ranks candidates by their objective with every
        isolated time inflated by ``1 + h``, so that a call counts as hidden only if it would still
        be hidden that much slower (the platform slower than the simulator for that configuration);
        0: the objective as is. The constraint above uses the plain objective.
    :param dominance: the aware choice must cost no more than the isolated choice on each platform
        of ``where``, not only combined; the isolated choice always qualifies.

    The costs in the result (``isolated_cost``, ``aware_cost``, ``default_cost``) are the plain
    objective, combined by ``aggregate``.
    """
    if not 0 <= margin < 1:
        raise ConfigError("margin", f"must be in [0, 1), got {margin}")
    if aggregate not in ("mean", "max"):
        q = aggregate if isinstance(aggregate, (int, float)) and not isinstance(aggregate, bool) else None
        if q is None or not 0 < q <= 1:
            raise ConfigError("aggregate", f"mean, max or a quantile in (0, 1], got {aggregate!r}")
    if not (np.isfinite(headroom) and headroom >= 0):
        raise ConfigError("headroom", f"must be >= 0, got {headroom}")
    many = isinstance(where, Sequence) and not isinstance(where, str)
    targets = [w if isinstance(w, Target) else Target(w) for w in (where if many else [where])]
    if not targets:
        raise ConfigError("where", "no platform to choose on")
    comm = int((conf or {}).get("NCCL_MIN_NCHANNELS", 0))
    by_key: dict[Key, list[WorkCall]] = {}
    for c in workload.calls:
        by_key.setdefault(c.key, []).append(c)
    iso_pick, aware_pick, iso_cost, aware_cost, def_cost = {}, {}, {}, {}, {}
    for key, calls in by_key.items():
        coll, nodes, ranks, nbytes = key
        cands = candidates(targets[0].shape(nodes, ranks).topo, coll, comm)
        nc, nk = len(cands), len(calls)
        w = np.tile([c.calls_per_step for c in calls], nc)
        isos, objs, stressed = [], [], []
        for target in targets:
            sim = target.shape(nodes, ranks)
            # entries: candidate-major, one per (candidate, call)
            cfg = _configs(sim, N.parse_name("collective", coll, N.COLLECTIVES), np.full(nc * nk, nbytes),
                           [ch for ch in cands for _ in range(nk)], conf)
            t_iso, cost = _per_call(target, calls * nc, cfg, sim)
            isos.append((w * t_iso).reshape(nc, nk).sum(axis=1))
            objs.append((w * cost).reshape(nc, nk).sum(axis=1))
            if headroom > 0:
                st = _stressed_cost(target, calls * nc, cfg, sim, 1.0 + headroom)
                stressed.append((w * st).reshape(nc, nk).sum(axis=1))
        per_obj = np.array(objs)  # (platforms, candidates)
        iso, obj = _combine(np.array(isos), aggregate), _combine(per_obj, aggregate)
        rank = _combine(np.array(stressed), aggregate) if headroom > 0 else obj
        i = int(np.argmin(iso))
        i = i if iso[i] < iso[0] * (1.0 - margin) else 0  # candidate 0 is NCCL's default
        ok = obj <= obj[i]
        if dominance:
            ok &= np.all(per_obj <= per_obj[:, i:i + 1], axis=0)
        ok[i] = True
        j = int(np.argmin(np.where(ok, rank, np.inf)))
        if ok[0] and not rank[j] < rank[0] * (1.0 - margin):
            j = 0
        iso_pick[key], aware_pick[key] = cands[i], cands[j]
        iso_cost[key], aware_cost[key], def_cost[key] = float(obj[i]), float(obj[j]), float(obj[0])
    return Picks(iso_pick, aware_pick, iso_cost, aware_cost, def_cost)


# -- judging on platform draws ---------------------------------------------------------------------


def t_interval(x: Sequence[float], level: float = 0.95) -> tuple[float, float, float]:
    """Mean and a two-sided Student-t interval of the mean (a single value: no width)."""
    x = np.asarray(x, dtype=float)
    m = float(x.mean())
    if x.size < 2:
        return m, m, m
    from scipy.stats import t

    h = float(t.ppf(0.5 + level / 2, x.size - 1) * x.std(ddof=1) / np.sqrt(x.size))
    return m, m - h, m + h


def draws(preset: str, seeds: Sequence[int], misspecified: bool = True, stream: int = 0) -> list[Platform]:
    """Platforms drawn around ``preset`` (:func:`draw_platform`), one per seed, from a stream named by
    the preset and ``stream``: the same seeds give the same platforms."""
    tag = zlib.crc32(preset.encode())
    return [draw_platform(preset, np.random.default_rng([stream, tag, int(s)]), misspecified) for s in seeds]


@dataclass
class Comparison:
    """Step costs (us) of named tables on each platform draw, and their differences.

    :param costs: table name -> cost per step on each draw
    """

    costs: dict[str, list[float]]

    def interval(self, name: str) -> tuple[float, float, float]:
        return t_interval(self.costs[name])

    def saving(self, base: str, other: str) -> tuple[float, float, float]:
        """Per-step time ``other`` saves over ``base`` (us, positive: ``other`` is faster): mean and
        95% interval of the paired differences over the draws."""
        return t_interval(np.subtract(self.costs[base], self.costs[other]))

    def verdict(self, base: str, other: str) -> str:
        """``wins``/``loses`` when the 95% interval of the saving excludes 0, else ``tie``."""
        _m, lo, hi = self.saving(base, other)
        return "wins" if lo > 0 else "loses" if hi < 0 else "tie"


def compare(platforms: Sequence[Simulator | Platform], workload: Workload,
            tables: Mapping[str, Choices | Table | Callable[[Target], Choices]],
            conf: Mapping[str, Mapping[str, int] | None] | None = None) -> Comparison:
    """Each table's step cost (:func:`step_cost`) on each platform.

    :param tables: name -> choices (or a table, or a function of the platform giving choices: e.g.
        the best possible on that platform)
    :param conf: name -> the per-process knobs that table runs with
    """
    costs: dict[str, list[float]] = {name: [] for name in tables}
    for plat in platforms:
        target = Target(plat)
        for name, ch in tables.items():
            choices = ch(target) if callable(ch) else ch
            costs[name].append(step_cost(target, workload, choices, (conf or {}).get(name)))
    return Comparison(costs)


def predicted_saving(preset: str | Topology, workload: Workload, base: Choices | Table, other: Choices | Table,
                     seeds: Sequence[int] = tuple(range(100, 110)), misspecified: bool = True,
                     ) -> tuple[float, float, float]:
    """Per-step time (us) ``other`` saves over ``base`` on platforms drawn around ``preset`` (seeds
    other than those a table was chosen on): mean and 95% interval over the draws."""
    name = preset if isinstance(preset, str) else preset.name
    plats = draws(name, seeds, misspecified)
    return compare(plats, workload, {"base": base, "other": other}).saving("base", "other")


__all__ = ["CHANNEL_CHOICES", "Choice", "Comparison", "NCCL_DEFAULT", "Picks", "Target", "WorkCall", "Workload",
           "candidates", "choose", "compare", "draws", "load_workload", "predicted_saving", "rescale",
           "resolve_compute", "step_cost", "step_costs", "step_time", "t_interval", "table_choices"]
