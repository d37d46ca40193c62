"""What a training job actually calls: a per-step profile of its collectives.

:func:`build_profile` reads what a job left behind and counts, per collective, message size,
communicator shape (nodes x ranks) and data type, the calls per step and the bytes per step, and
whether the calls overlap compute. Three inputs are recognised by their content:

``NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=COLL`` logs
    One line per collective call, printed by ``ncclEnqueueCheck`` (``src/enqueue.cc``, the same
    format from NCCL 2.18 to 2.28)::

        host:pid:tid [dev] NCCL INFO AllReduce: opCount 1a sendbuff 0x.. recvbuff 0x.. count 262144
        datatype 7 op 0 root 0 comm 0x55.. [nranks=8] stream 0x..

    ``count`` is in elements of ``datatype`` (``ncclDataType_t`` in ``nccl.h``: 0 int8, 1 uint8,
    2 int32, 3 uint32, 4 int64, 5 uint64, 6 float16, 7 float32, 8 float64, 9 bfloat16, 10 float8e4m3,
    11 float8e5m2; sizes from ``ncclTypeSize`` in ``src/include/collectives.h``). For AllGather and
    ReduceScatter ``count`` is *per rank* (AllGather: what each rank sends; ReduceScatter: what each
    rank receives). With ``NCCL_DEBUG_SUBSYS=INIT`` too, ``comm 0x.. rank R nRanks N nNodes M
    localRanks L ...`` (``src/init.cc``) gives each communicator's node count; without it the
    nodes are unknown (0). Every process (``host:pid``) is one rank; files may be per rank or merged.

PyTorch profiler Chrome traces (``export_chrome_trace``, ``.json`` or ``.json.gz``)
    Calls come from ``record_param_comms`` events (args ``Collective name``, ``In msg nelems``,
    ``Out msg nelems``, ``dtype``, ``Group size``, ``Process Group Name``) where the trace has them,
    else from the dispatcher's ``c10d::*`` operator events (their ``Input Dims``/``Input type``,
    recorded with ``record_shapes=True``; a CPU trace of a gloo job has only these), outermost
    ones only. Steps are the ``ProfilerStep#N`` spans. The group size is the event's, else the
    trace's ``distributedInfo`` when it lists one process group; nodes are the distinct
    ``host_name`` of the traces given for that group's ranks (0 when not all of them are given).
    Overlap: GPU traces only, where NCCL kernels carry the collective's args: a kernel overlaps
    compute when its time intersects a non-NCCL kernel on another stream. CPU traces: unknown.

PyTorch flight recorder JSON (``torch._C._distributed_c10d._dump_fr_trace_json()``; the
    ``TORCH_NCCL_DEBUG_INFO_TEMP_FILE`` dumps and ``_dump_fr_trace`` are pickles and are refused,
    never loaded). One entry per call the backend ran, with ``input_sizes``, ``output_sizes``,
    ``input_dtypes`` and the process group's ranks in ``pg_config``. The buffer keeps the last
    ``TORCH_FR_BUFFER_SIZE`` calls. It records what the backend ran: gloo, for instance, runs a
    reduce-scatter as an all-reduce and the dump says ``all_reduce``.

``nbytes`` is what NCCL's tuner is asked about, ``nBytes`` of ``getCollInfo``: element size times
``ncclFuncMaxSendRecvCount`` (``src/include/enqueue.h``; ``getAlgoInfo`` in ``src/enqueue.cc``,
NCCL 2.23 to 2.28; ``ncclInfoSetDerived`` in ``src/include/info.h`` multiplies by ``nRanks`` the
same way in 2.18/2.19): ``count * size`` for AllReduce, Broadcast and Reduce, ``count * size *
nranks`` for AllGather (the gathered output) and ReduceScatter (the input being reduced). From
PyTorch's events it is the larger of the input and output messages times the element size, the
same quantity.

Steps: ``ProfilerStep#N`` spans where the trace has them; else ``steps`` given by the user (all
calls divided by it); else, per communicator, the shortest sequence of calls that repeats to the
end of the input at least twice (calls before the first repetition, such as initialisation
broadcasts or DDP's first step before it rebuilds its buckets, are left out and reported). With
several ranks, a key's calls per step is the largest over the ranks (each rank of a communicator
sees every call on it once).
"""

from __future__ import annotations

import gzip
import json
import math
import re
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml

from ncclrl.costmodel.errors import ConfigError

# ncclDataType_t (nccl.h) -> (name, bytes per element), ncclTypeSize (src/include/collectives.h)
NCCL_DTYPES: dict[int, tuple[str, int]] = {
    0: ("int8", 1), 1: ("uint8", 1), 2: ("int32", 4), 3: ("uint32", 4), 4: ("int64", 8), 5: ("uint64", 8),
    6: ("float16", 2), 7: ("float32", 4), 8: ("float64", 8), 9: ("bfloat16", 2), 10: ("float8e4m3", 1),
    11: ("float8e5m2", 1),
}
DTYPE_NBYTES: dict[str, int] = {name: size for name, size in NCCL_DTYPES.values()} | {"bool": 1}

# PyTorch's spellings of a dtype: ScalarType names (record_param_comms, flight recorder), C++ type
# names (the profiler's "Input type"), torch.dtype names
_TORCH_DTYPES: dict[str, str] = {
    "float": "float32", "double": "float64", "half": "float16", "bfloat16": "bfloat16", "long": "int64",
    "int": "int32", "short": "int16", "char": "int8", "byte": "uint8", "bool": "bool",
    "c10::half": "float16", "c10::bfloat16": "bfloat16", "long int": "int64", "signed char": "int8",
    "unsigned char": "uint8", "float32": "float32", "float64": "float64", "float16": "float16", "int64": "int64",
    "int32": "int32", "int8": "int8", "uint8": "uint8", "int16": "int16",
    "c10::float8_e4m3fn": "float8e4m3", "c10::float8_e5m2": "float8e5m2",
    "float8_e4m3fn": "float8e4m3", "float8_e5m2": "float8e5m2",
}
DTYPE_NBYTES["int16"] = 2

OVERLAP_VALUES = ("yes", "no", "partial", "unknown")


def dtype_name(spelling: str) -> str:
    """A data type's name as the profile writes it (``float32``), from any of PyTorch's spellings."""
    s = spelling.strip()
    return _TORCH_DTYPES.get(s.lower(), s.lower() or "unknown")


def collective_name(spelling: str) -> str:
    """``allreduce``, ``allgather``, ``reducescatter``, ``broadcast``, ``reduce``, ``alltoall``, ``send``,
    ``recv``, ``gather``, ``scatter`` or ``barrier`` from NCCL's, c10d's or the profiler's spelling
    (``AllReduce``, ``c10d::_reduce_scatter_base_``, ``nccl:all_gather_into_tensor_coalesced``)."""
    s = spelling.split("::")[-1].split(":")[-1].lower().replace("_", "")
    for name in ("reducescatter", "allreduce", "allgather", "alltoall", "broadcast", "barrier", "reduce",
                 "gather", "scatter", "send", "recv"):
        if name in s:
            return name
    return s or "unknown"


@dataclass
class Call:
    """One collective call as one rank saw it.

    :param collective: the collective's name (:func:`collective_name`)
    :param nbytes: the bytes NCCL's tuner is asked about (``nBytes``; see the module's docstring)
    :param dtype: the data type's name
    :param ranks: ranks of the communicator (0: unknown)
    :param comm: the communicator, unique within the input (``host:pid:0x55..`` or a group name)
    :param rank_id: the rank (process) that made the call
    :param step: the step it belongs to, where the input marks steps
    :param overlap: the call overlaps compute (None: unknown)
    """

    collective: str
    nbytes: int
    dtype: str
    ranks: int
    comm: str
    rank_id: str
    step: int | None = None
    overlap: bool | None = None


@dataclass
class Entry:
    """One row of the profile.

    :param collective: the collective's name
    :param nbytes: bytes per call as NCCL's tuner sees them
    :param nodes: nodes of the communicator (0: unknown)
    :param ranks: ranks of the communicator (0: unknown)
    :param dtype: the data type
    :param calls_per_step: calls per training step
    :param nbytes_per_step: ``calls_per_step * nbytes``
    :param overlaps_compute: yes, no, partial (some calls do) or unknown
    """

    collective: str
    nbytes: int
    nodes: int
    ranks: int
    dtype: str
    calls_per_step: float
    nbytes_per_step: float
    overlaps_compute: str = "unknown"


@dataclass
class Profile:
    """A job's collectives per step.

    :param entries: one per (collective, nbytes, nodes, ranks, dtype)
    :param steps: the steps the counts are averaged over (the largest over communicators)
    :param steps_from: how the steps were found
    :param inputs: each input file with its format
    :param notes: what was left out or could not be known
    """

    entries: list[Entry]
    steps: int
    steps_from: str
    inputs: list[dict[str, str]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def by_key(self) -> dict[tuple[str, int, int, int, str], Entry]:
        return {(e.collective, e.nbytes, e.nodes, e.ranks, e.dtype): e for e in self.entries}


# -- reading -------------------------------------------------------------------------------------


def _read_bytes(path: Path) -> bytes:
    try:
        data = path.read_bytes()
    except OSError as e:
        raise ConfigError("inputs", f"cannot read {path}: {e.strerror}") from None
    if data[:2] == b"\x1f\x8b":
        try:
            data = gzip.decompress(data)
        except (OSError, EOFError) as e:
            raise ConfigError("inputs", f"{path}: broken gzip file ({e})") from None
    return data


def detect_format(path: str | Path) -> str:
    """``nccl-log``, ``chrome-trace`` or ``flight-recorder`` from the file's content; anything else
    (an empty file, a pickle, an unknown JSON) is a :class:`ConfigError`."""
    path = Path(path)
    data = _read_bytes(path)
    return _format_of(path, data)


def _format_of(path: Path, data: bytes) -> str:
    if not data.strip():
        raise ConfigError("inputs", f"{path} is empty")
    if data[:1] == b"\x80":
        raise ConfigError("inputs", f"{path} is a pickle (a flight recorder dump?); pickles are never loaded: "
                                    "dump JSON with torch._C._distributed_c10d._dump_fr_trace_json()")
    head = data.lstrip()[:1]
    if head in (b"{", b"["):
        try:
            doc = json.loads(data)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise ConfigError("inputs", f"{path}: not valid JSON ({e.msg} at line {e.lineno})"
                              if isinstance(e, json.JSONDecodeError) else f"{path}: not UTF-8 JSON") from None
        if isinstance(doc, dict) and "traceEvents" in doc:
            return "chrome-trace"
        if isinstance(doc, dict) and "entries" in doc and "pg_config" in doc:
            return "flight-recorder"
        raise ConfigError("inputs", f"{path}: JSON but neither a profiler Chrome trace (traceEvents) nor a "
                                    "flight recorder dump (entries, pg_config)")
    text = data.decode("utf-8", errors="replace")
    if _COLL_RE.search(text):
        return "nccl-log"
    if " NCCL INFO " in text:
        raise ConfigError("inputs", f"{path}: an NCCL log without collective lines; record it with "
                                    "NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=COLL")
    raise ConfigError("inputs", f"{path}: unknown format; expected an NCCL_DEBUG=INFO COLL log, a profiler "
                                "Chrome trace (.json/.json.gz) or a flight recorder JSON dump")


_PREFIX = r"(?:(?P<host>[^\s:]+):(?P<pid>\d+):(?P<tid>\d+) \[[^\]]*\] )?NCCL INFO "
_COLL_RE = re.compile(
    _PREFIX + r"(?P<op>\w+): opCount (?P<opcount>[0-9a-fA-F]+) sendbuff \S+ recvbuff \S+ count (?P<count>\d+) "
    r"datatype (?P<dtype>\d+) op (?P<redop>\d+) root (?P<root>-?\d+) comm (?P<comm>\S+) \[nranks=(?P<nranks>\d+)\]")
_INIT_RE = re.compile(_PREFIX + r".*?comm (?P<comm>\S+) rank (?P<rank>\d+) nRanks (?P<nranks>\d+) "
                      r"nNodes (?P<nnodes>\d+)")


def _nccl_log_calls(path: Path, text: str) -> tuple[list[Call], dict[str, int], list[str]]:
    """Calls in ``opCount`` order per communicator, the nodes of each communicator, notes."""
    calls: list[tuple[str, int, Call]] = []
    nodes: dict[str, int] = {}
    notes: list[str] = []
    for line in text.splitlines():
        m = _COLL_RE.search(line)
        if m is None:
            m = _INIT_RE.search(line)
            if m is not None:
                nodes[f"{m['host'] or path.name}:{m['pid'] or 0}:{m['comm']}"] = int(m["nnodes"])
            continue
        proc = f"{m['host'] or path.name}:{m['pid'] or 0}"
        code = int(m["dtype"])
        if code not in NCCL_DTYPES:
            raise ConfigError("inputs", f"{path}: datatype {code} is not one of NCCL's (0-11): {line.strip()[:120]}")
        dname, size = NCCL_DTYPES[code]
        coll = collective_name(m["op"])
        nranks = int(m["nranks"])
        count = int(m["count"])
        nbytes = count * size * (nranks if coll in ("allgather", "reducescatter") else 1)
        comm = f"{proc}:{m['comm']}"
        calls.append((comm, int(m["opcount"], 16), Call(coll, nbytes, dname, nranks, comm, proc)))
    calls.sort(key=lambda c: (c[0], c[1]))
    return [c for _, _, c in calls], nodes, notes


def _numel(dims: Any) -> int:
    """Elements of a shape (``[2, 3]``) or of a list of shapes (``[[4], [5]]``)."""
    if isinstance(dims, list) and dims and all(isinstance(d, list) for d in dims):
        return sum(_numel(d) for d in dims)
    if isinstance(dims, list):
        return math.prod(int(d) for d in dims)
    return 0


# c10d operators whose first argument is the output and second the input; the others work in place
_OUT_IN_OPS = {"_allgather_base_", "_reduce_scatter_base_", "allgather_", "reduce_scatter_",
               "allgather_into_tensor_coalesced_", "reduce_scatter_tensor_coalesced_", "allgather_coalesced_",
               "alltoall_base_", "alltoall_"}
_NOT_DATA = {"barrier", "monitored_barrier_"}


def _trace_calls(path: Path, doc: dict[str, Any]) -> tuple[list[Call], dict[str, Any], list[str]]:
    """Calls of one rank's Chrome trace (with ``step`` from ProfilerStep spans), and the trace's
    ``{rank, host, groups: {name: size}, steps: n}``."""
    events = [e for e in doc.get("traceEvents", []) if isinstance(e, dict) and e.get("ph") == "X"]
    dist = doc.get("distributedInfo") or {}
    rank = dist.get("rank", path.name)
    rank_id = f"rank{rank}"
    groups = {str(g.get("pg_name")): int(g.get("pg_size", 0)) for g in dist.get("pg_config") or []}
    only_size = next(iter(groups.values())) if len(groups) == 1 else 0
    steps = sorted((float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0)), int(e["name"].split("#")[1]))
                   for e in events if str(e.get("name", "")).startswith("ProfilerStep#")
                   and e["name"].split("#")[1].isdigit())
    notes: list[str] = []

    def step_of(ts: float) -> int | None:
        for lo, hi, n in steps:
            if lo <= ts < hi:
                return n
        return None

    calls: list[Call] = []
    comms = [e for e in events if e.get("name") == "record_param_comms" and "Collective name" in (e.get("args") or {})]
    if comms:
        for e in sorted(comms, key=lambda e: e["ts"]):
            a = e["args"]
            coll = collective_name(str(a["Collective name"]))
            if coll in ("barrier", "unknown") or coll == "":
                continue
            dt = dtype_name(str(a.get("dtype", "")))
            nelems = max(int(a.get("In msg nelems", 0) or 0), int(a.get("Out msg nelems", 0) or 0))
            size = int(a.get("Group size", 0) or 0) or only_size
            group = str(a.get("Process Group Name", "") or "")
            calls.append(Call(coll, nelems * DTYPE_NBYTES.get(dt, 0), dt, size, group or "default", rank_id,
                              step_of(float(e["ts"]))))
    else:
        ops = sorted((e for e in events if str(e.get("name", "")).startswith("c10d::")),
                     key=lambda e: (e.get("tid"), float(e["ts"]), -float(e.get("dur", 0))))
        outer: list[dict[str, Any]] = []
        end: dict[Any, float] = {}
        for e in ops:  # keep the outermost c10d operator of each nest (the dispatcher records it twice)
            key = (e.get("pid"), e.get("tid"))
            if float(e["ts"]) < end.get(key, -1.0):
                continue
            end[key] = float(e["ts"]) + float(e.get("dur", 0))
            outer.append(e)
        # dtype of a TensorList operator (allreduce_): the backend's own event with the same elements
        backend_dtype: dict[int, str] = {}
        for e in events:
            a = e.get("args") or {}
            if re.match(r"^(gloo|nccl|ucc|mpi|xccl):", str(e.get("name", ""))) and a.get("Input Dims"):
                types = a.get("Input type") or []
                if types and types[0] not in ("", "TensorList", "GenericList"):
                    backend_dtype.setdefault(_numel(a["Input Dims"][0]), dtype_name(types[0]))
        if outer and not dist.get("pg_config"):
            notes.append(f"{path.name}: no distributedInfo; the communicators' sizes are unknown")
        if len(groups) > 1:
            notes.append(f"{path.name}: {len(groups)} process groups and no record_param_comms events: "
                         "the communicators' sizes are unknown")
        for e in sorted(outer, key=lambda e: float(e["ts"])):
            op = e["name"].split("::", 1)[1]
            coll = collective_name(op)
            if op in _NOT_DATA or coll == "barrier":
                continue
            a = e.get("args") or {}
            dims = a.get("Input Dims")
            if dims is None:
                raise ConfigError("inputs", f"{path}: c10d operator events without Input Dims; record the trace "
                                            "with torch.profiler.profile(record_shapes=True)")
            types = a.get("Input type") or []
            out_i, in_i = (0, 1) if op in _OUT_IN_OPS else (0, 0)
            in_n, out_n = _numel(dims[in_i]), _numel(dims[out_i])
            t = types[in_i] if in_i < len(types) else ""
            dt = dtype_name(t) if t not in ("", "TensorList", "GenericList") else backend_dtype.get(in_n, "unknown")
            calls.append(Call(coll, max(in_n, out_n) * DTYPE_NBYTES.get(dt, 0), dt, only_size, "default", rank_id,
                              step_of(float(e["ts"]))))
    # overlap, from GPU kernels that carry their collective's args (GPU traces only)
    kernels = [e for e in events if e.get("cat") == "kernel"]
    comm_k = [e for e in kernels if "Collective name" in (e.get("args") or {})]
    if comm_k:
        compute = [(float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0)), e.get("tid")) for e in kernels
                   if "Collective name" not in (e.get("args") or {}) and "nccl" not in str(e.get("name", "")).lower()]
        seen: dict[tuple[str, int, str], list[bool]] = defaultdict(list)
        for e in comm_k:
            a = e["args"]
            lo, hi = float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0))
            dt = dtype_name(str(a.get("dtype", "")))
            nelems = max(int(a.get("In msg nelems", 0) or 0), int(a.get("Out msg nelems", 0) or 0))
            seen[(collective_name(str(a["Collective name"])), nelems * DTYPE_NBYTES.get(dt, 0), dt)].append(
                any(c_lo < hi and lo < c_hi and tid != e.get("tid") for c_lo, c_hi, tid in compute))
        for c in calls:
            flags = seen.get((c.collective, c.nbytes, c.dtype))
            if flags:
                c.overlap = flags.pop(0) if len(flags) > 1 else flags[0]
    info = {"rank": rank, "host": doc.get("host_name", ""), "groups": groups, "steps": len(steps)}
    return calls, info, notes


def _flight_recorder_calls(path: Path, doc: dict[str, Any]) -> tuple[list[Call], list[str]]:
    groups: dict[str, int] = {}
    for name, g in (doc.get("pg_config") or {}).items():
        ranks = g.get("ranks", "[]")
        try:
            groups[str(name)] = len(json.loads(ranks) if isinstance(ranks, str) else ranks)
        except json.JSONDecodeError:
            groups[str(name)] = 0
    calls: list[Call] = []
    notes: list[str] = []
    for e in doc.get("entries") or []:
        if e.get("is_p2p"):
            continue
        coll = collective_name(str(e.get("profiling_name", "")))
        if coll in ("barrier", "unknown"):
            continue
        dts = e.get("input_dtypes") or e.get("output_dtypes") or [""]
        dt = dtype_name(str(dts[0]))
        nelems = max(_numel(e.get("input_sizes") or []), _numel(e.get("output_sizes") or []))
        pg = e.get("process_group") or ["", ""]
        size = groups.get(str(pg[0]), 0) or (next(iter(groups.values())) if len(groups) == 1 else 0)
        calls.append(Call(coll, nelems * DTYPE_NBYTES.get(dt, 0), dt, size, f"{path.name}:{pg[0]}", path.name))
    if not calls:
        notes.append(f"{path.name}: the flight recorder dump has no collective entries")
    return calls, notes


# -- steps ---------------------------------------------------------------------------------------


def repeating_period(seq: list[Any]) -> tuple[int, int] | None:
    """``(offset, period)`` of the shortest block of ``seq`` that repeats, back to back, from ``offset``
    to the end (a last, partial repetition allowed) at least twice; None when nothing repeats."""
    n = len(seq)
    for p in range(1, n // 2 + 1):
        last_mismatch = -1
        for i in range(n - p):
            if seq[i] != seq[i + p]:
                last_mismatch = i
        offset = last_mismatch + 1
        if n - offset >= 2 * p:
            return offset, p
    return None


# -- the profile ---------------------------------------------------------------------------------


def build_profile(paths: list[str | Path], steps: int = 0) -> Profile:
    """The profile of the job whose logs, traces or flight recorder dumps are ``paths``.

    :param paths: input files, any mix of the three formats (see the module's docstring)
    :param steps: the job's steps covered by the inputs; 0: find them (ProfilerStep spans, else the
        repeating pattern of calls per communicator)
    """
    if not paths:
        raise ConfigError("inputs", "no input given: ncclrl profile INPUT... -o job-profile.yaml")
    if steps < 0:
        raise ConfigError("steps", f"must be >= 0, got {steps}")
    inputs: list[dict[str, str]] = []
    notes: list[str] = []
    # per source (a rank's stream of calls): its calls, whether they carry steps
    stepped: list[Call] = []
    unstepped: list[Call] = []
    comm_nodes: dict[str, int] = {}
    traces: list[dict[str, Any]] = []
    for p in map(Path, paths):
        data = _read_bytes(p)
        fmt = _format_of(p, data)
        inputs.append({"path": str(p), "format": fmt})
        if fmt == "nccl-log":
            calls, nodes, n = _nccl_log_calls(p, data.decode("utf-8", errors="replace"))
            comm_nodes.update(nodes)
            unstepped += calls
        elif fmt == "chrome-trace":
            calls, info, n = _trace_calls(p, json.loads(data))
            traces.append(info | {"calls": calls})
            (stepped if info["steps"] else unstepped).extend(calls)
        else:
            calls, n = _flight_recorder_calls(p, json.loads(data))
            unstepped += calls
        notes += n
    if not stepped and not unstepped:
        raise ConfigError("inputs", "no collective calls in " + ", ".join(str(p) for p in paths))
    # nodes of a trace's group: distinct hosts when every rank of the group left a trace
    if traces:
        hosts = {str(t["rank"]): t["host"] for t in traces}
        for t in traces:
            for c in t["calls"]:
                if c.ranks and len(hosts) >= c.ranks and all(hosts.values()):
                    comm_nodes[c.comm + "@trace"] = len(set(hosts.values()))
    # calls per step, per rank and key
    per_rank: dict[tuple[str, tuple], float] = defaultdict(float)
    overlap: dict[tuple, list[bool | None]] = defaultdict(list)
    step_counts: list[int] = []
    how: set[str] = set()

    def key_of(c: Call) -> tuple[str, int, int, int, str]:
        nodes = comm_nodes.get(c.comm, comm_nodes.get(c.comm + "@trace", 0))
        return (c.collective, c.nbytes, nodes, c.ranks, c.dtype)

    if stepped:
        by_rank: dict[str, list[Call]] = defaultdict(list)
        for c in stepped:
            by_rank[c.rank_id].append(c)
        for rank_id, cs in by_rank.items():
            if steps:
                n_steps = steps
                how.add(f"steps={steps} (given)")
            else:
                n_steps = len({c.step for c in cs if c.step is not None}) or 1
                outside = sum(c.step is None for c in cs)
                if outside:
                    notes.append(f"{rank_id}: {outside} calls outside the ProfilerStep spans left out")
                cs = [c for c in cs if c.step is not None]
                how.add("ProfilerStep spans of the traces")
            step_counts.append(n_steps)
            for c in cs:
                per_rank[(rank_id, key_of(c))] += 1 / n_steps
                overlap[key_of(c)].append(c.overlap)
    if unstepped:
        by_comm: dict[str, list[Call]] = defaultdict(list)
        for c in unstepped:
            by_comm[c.comm].append(c)
        for comm, cs in by_comm.items():
            if steps:
                n_steps, body = steps, cs
                how.add(f"steps={steps} (given)")
            else:
                found = repeating_period([(c.collective, c.nbytes, c.dtype) for c in cs])
                if found is None:
                    n_steps, body = 1, cs
                    notes.append(f"{comm}: {len(cs)} calls with no repeating pattern, counted as one step")
                else:
                    offset, period = found
                    n_steps = (len(cs) - offset) // period
                    body = cs[offset:offset + n_steps * period]
                    left = len(cs) - len(body)
                    if left:
                        notes.append(f"{comm}: {left} calls outside the {n_steps} repeating steps left out "
                                     f"({offset} before, {len(cs) - offset - len(body)} after)")
                how.add("the repeating pattern of calls per communicator")
            step_counts.append(n_steps)
            for c in body:
                per_rank[(c.rank_id, key_of(c))] += 1 / n_steps
                overlap[key_of(c)].append(c.overlap)
    best: dict[tuple, float] = {}
    for (_rank, key), v in per_rank.items():
        best[key] = max(best.get(key, 0.0), v)
    entries = []
    for key in sorted(best, key=lambda k: (k[0], k[3], k[1], k[4])):
        coll, nbytes, nodes, ranks, dt = key
        flags = overlap[key]
        if any(f is None for f in flags) or not flags:
            ov = "unknown"
        else:
            ov = "yes" if all(flags) else "no" if not any(flags) else "partial"
        cps = round(best[key], 6)
        entries.append(Entry(coll, nbytes, nodes, ranks, dt, cps, round(cps * nbytes, 3), ov))
    if any(e.dtype == "unknown" for e in entries):
        notes.append("some calls' data type is unknown (their bytes are 0)")
    return Profile(entries, max(step_counts), "; ".join(sorted(how)), inputs, notes)


# -- YAML ----------------------------------------------------------------------------------------


def _num(v: float) -> int | float:
    return int(v) if float(v).is_integer() else v


def dump_profile(profile: Profile, path: str | Path) -> None:
    """Write ``profile`` as YAML (``collectives``: one mapping per entry)."""
    doc = {
        "kind": "ncclrl-job-profile", "version": 1, "steps": profile.steps, "steps_from": profile.steps_from,
        "inputs": profile.inputs, "notes": profile.notes,
        "collectives": [asdict(e) | {"calls_per_step": _num(e.calls_per_step),
                                     "nbytes_per_step": _num(e.nbytes_per_step)} for e in profile.entries],
    }
    head = ("# ncclrl job profile: per collective, bytes per call as NCCL's tuner sees them (nbytes), communicator\n"
            "# nodes x ranks (0: unknown), data type, calls and bytes per training step, overlap with compute\n")
    Path(path).write_text(head + yaml.safe_dump(doc, sort_keys=False, width=120))


def load_profile(path: str | Path) -> Profile:
    """Read a profile written by :func:`dump_profile`; a malformed one is a :class:`ConfigError`."""
    try:
        doc = yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError) as e:
        raise ConfigError("profile", f"cannot read {path}: {e}") from None
    if not isinstance(doc, dict) or doc.get("kind") != "ncclrl-job-profile":
        raise ConfigError("profile", f"{path} is not an ncclrl job profile (kind: ncclrl-job-profile)")
    entries = []
    for i, row in enumerate(doc.get("collectives") or []):
        try:
            e = Entry(**row)
        except TypeError as err:
            raise ConfigError("profile", f"{path}: collectives[{i}]: {err}") from None
        if e.overlaps_compute not in OVERLAP_VALUES:
            raise ConfigError("profile", f"{path}: collectives[{i}].overlaps_compute: {e.overlaps_compute!r}")
        entries.append(e)
    return Profile(entries, int(doc.get("steps", 0)), str(doc.get("steps_from", "")),
                   list(doc.get("inputs") or []), list(doc.get("notes") or []))


def summary(profile: Profile) -> list[str]:
    """Lines for the terminal: one per entry, largest bytes per step first."""
    lines = [f"# {len(profile.entries)} collectives, {profile.steps} steps ({profile.steps_from})",
             "collective,nbytes,nodes,ranks,dtype,calls_per_step,nbytes_per_step,overlaps_compute"]
    for e in sorted(profile.entries, key=lambda e: -e.nbytes_per_step):
        lines.append(f"{e.collective},{e.nbytes},{e.nodes},{e.ranks},{e.dtype},{_num(e.calls_per_step)},"
                     f"{_num(e.nbytes_per_step)},{e.overlaps_compute}")
    lines += [f"# note: {n}" for n in profile.notes]
    return lines


__all__ = ["Call", "Entry", "Profile", "build_profile", "collective_name", "detect_format",
           "dtype_name", "dump_profile", "load_profile", "repeating_period", "summary"]
