"""What a training job actually calls: a per-step profile of its collectives.

:func:`build_profile` reads what a job left behind and counts, per collective, message size,
communicator shape (nodes x ranks) and data type, the calls per step and the bytes per step, and
whether the calls overlap compute. Four inputs are recognised by their content:

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

ncclrl tuner plugin request logs (``NCCLRL_TUNER_REQUEST_LOG=PREFIX``; ``plugin/README.md``)
    One file per tuner context, that is one rank's view of one communicator, named
    ``PREFIX.HOST.PID.N.csv`` and written at the communicator's destroy. It lists every
    ``getCollInfo`` request of that communicator in order, exactly what NCCL asked the tuner.
    Format 1, recognised by its first line; ``#`` header lines ``# key: value``, then a CSV::

        # ncclrl-tuner-request-log: 1
        # host: nodeA
        # pid: 4242
        # context: 0
        # comm_id: 0x00000000000004d2
        # tuner_abi: 5
        # nnodes: 2
        # nranks: 8
        # requests: 130
        # recorded: 100
        # max_records: 100
        # dropped: 30
        # dropped_unkeyed: 0
        # dropped_count: allreduce,1048576,30
        collective,nbytes,nnodes,nranks
        allreduce,1048576,2,8

    Header: ``ncclrl-tuner-request-log`` the format version (1); ``host`` the host name (characters
    other than letters, digits, ``.``, ``-`` and ``_`` written as ``_``), ``pid`` the process,
    ``context`` ``N`` of the file name (the process's logging contexts numbered from 0 in init
    order); ``comm_id`` the communicator's id as 16 hex digits (tuner ABI v5 and later; ``unknown``
    before); ``tuner_abi`` the ABI version NCCL loaded; ``nnodes``, ``nranks`` the communicator's
    shape; ``requests`` every ``getCollInfo`` call; ``recorded`` the rows below; ``max_records`` the
    cap on rows (``NCCLRL_TUNER_REQUEST_LOG_MAX``); ``dropped`` the requests past the cap
    (``requests - recorded``), counted but not ordered; ``dropped_unkeyed`` those of them counted
    without their collective and size (past 32768 distinct ones, or out of memory); then one
    ``dropped_count: COLLECTIVE,NBYTES,COUNT`` per collective and size past the cap, sorted by
    collective number then size. Unknown header keys are ignored. Rows, one per request in order:
    ``collective`` (``broadcast``, ``reduce``, ``allgather``, ``reducescatter``, ``allreduce``, or
    ``colltypeK`` for a ``collType`` K outside 0-4; 255 stands for any outside 0-254), ``nbytes``
    (``nBytes`` of the request, bytes), ``nnodes``, ``nranks`` (the communicator's). The tuner is not
    told the data type: ``dtype`` is ``unknown``, ``nbytes`` exact. Nodes come from ``nnodes``.
    Files of one process with the same ``comm_id`` are different ranks of it (one process driving
    several GPUs); otherwise a process is one rank.

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
sees every call on it once). A request log's requests past its cap have no order: with ``steps``
given they count (from ``dropped_count``), else they are left out, like every call after the last
whole repetition, and reported. A request log cut by its cap ends mid-step, where a few equal calls
in a row would pass for a repetition: there the block must also repeat over at least half of the
recorded requests.
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
    :param count: the calls it stands for (a request log's count past its cap; else 1)
    """

    collective: str
    nbytes: int
    dtype: str
    ranks: int
    comm: str
    rank_id: str
    step: int | None = None
    overlap: bool | None = None
    count: int = 1


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
    """``nccl-log``, ``chrome-trace``, ``flight-recorder`` or ``request-log`` from the file's content;
    anything else (an empty file, a pickle, an unknown JSON) is a :class:`ConfigError`."""
    path = Path(path)
    data = _read_bytes(path)
    return _format_of(path, data)


def _format_of(path: Path, data: bytes) -> str:
    if not data.strip():
        raise ConfigError("inputs", f"{path} is empty")
    if data[:1] == b"\x80":
        raise ConfigError("inputs", f"{path} is a pickle (a flight recorder dump?); pickles are never loaded: "
                                    "dump JSON with torch._C._distributed_c10d._dump_fr_trace_json()")
    if data.startswith(REQUEST_LOG_MAGIC.encode()):
        return "request-log"
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
        if isinstance(doc, dict) and "pg_config" in doc and "version" in doc and doc["pg_config"]:
            raise ConfigError("inputs", f"no collective calls in {path} (a flight recorder dump of "
                                        f"{len(doc['pg_config'])} process group(s) with no entries)")
        if isinstance(doc, dict) and "pg_config" in doc and "version" in doc:
            raise ConfigError("inputs", f"{path}: a flight recorder dump with no entries: the recorder was off; "
                                        "set TORCH_FR_BUFFER_SIZE (TORCH_NCCL_TRACE_BUFFER_SIZE on older torch) "
                                        "to the calls to keep, e.g. 2000, before the job starts")
        raise ConfigError("inputs", f"{path}: JSON but neither a profiler Chrome trace (traceEvents) nor a "
                                    "flight recorder dump (entries, pg_config)")
    text = data.decode("utf-8", errors="replace")
    if _COLL_RE.search(text):
        return "nccl-log"
    if " NCCL INFO " in text:
        raise ConfigError("inputs", f"{path}: an NCCL log without collective lines; record it with "
                                    "NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=COLL")
    raise ConfigError("inputs", f"{path}: unknown format; expected an NCCL_DEBUG=INFO COLL log, a profiler "
                                "Chrome trace (.json/.json.gz), a flight recorder JSON dump or an ncclrl tuner "
                                "request log")


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


REQUEST_LOG_MAGIC = "# ncclrl-tuner-request-log:"
REQUEST_LOG_FORMAT = 1
REQUEST_LOG_COLUMNS = "collective,nbytes,nnodes,nranks"
_REQUEST_LOG_NEEDS = ("host", "pid", "context", "comm_id", "nnodes", "nranks", "requests", "recorded", "dropped",
                      "dropped_unkeyed")


@dataclass
class RequestLog:
    """One request log file (see the module's docstring).

    :param header: its ``# key: value`` lines (``dropped_count`` apart)
    :param calls: its requests in order
    :param past_cap: one call per collective and size past the cap, ``count`` its requests
    :param comm: the communicator as the profile names it (``host:pid:ctxN``)
    :param nnodes: the communicator's nodes
    """

    header: dict[str, str]
    calls: list[Call]
    past_cap: list[Call]
    comm: str
    nnodes: int


def _int_field(path: Path, where: str, value: str) -> int:
    try:
        v = int(value)
    except ValueError:
        v = -1
    if v < 0:
        raise ConfigError("inputs", f"{path}: {where}: expected a whole number >= 0, got {value!r}")
    return v


def read_request_log(path: str | Path, text: str | None = None) -> RequestLog:
    """Read one request log written by the tuner plugin; a malformed one is a :class:`ConfigError`
    naming the line."""
    path = Path(path)
    if text is None:
        text = _read_bytes(path).decode("utf-8", errors="replace")
    lines = text.splitlines()
    if not lines or not lines[0].startswith(REQUEST_LOG_MAGIC):
        raise ConfigError("inputs", f"{path}: not an ncclrl tuner request log (first line {REQUEST_LOG_MAGIC} N)")
    version = lines[0][len(REQUEST_LOG_MAGIC):].strip()
    if version != str(REQUEST_LOG_FORMAT):
        raise ConfigError("inputs", f"{path}: request log format {version!r}; this ncclrl reads format "
                                    f"{REQUEST_LOG_FORMAT}")
    header: dict[str, str] = {}
    counted: list[tuple[str, int, int]] = []
    body = len(lines)
    for i, line in enumerate(lines[1:], start=2):
        if not line.startswith("#"):
            body = i - 1
            break
        key, sep, value = line[1:].partition(":")
        key, value = key.strip(), value.strip()
        if not sep:
            raise ConfigError("inputs", f"{path}:{i}: header line without 'key: value': {line[:80]!r}")
        if key == "dropped_count":
            parts = value.split(",")
            if len(parts) != 3:
                raise ConfigError("inputs", f"{path}:{i}: dropped_count: expected COLLECTIVE,NBYTES,COUNT, "
                                            f"got {value!r}")
            counted.append((parts[0], _int_field(path, f"line {i}", parts[1]), _int_field(path, f"line {i}", parts[2])))
        else:
            header[key] = value
    missing = [k for k in _REQUEST_LOG_NEEDS if k not in header]
    if missing:
        raise ConfigError("inputs", f"{path}: request log header without {', '.join(missing)}")
    nums = {k: _int_field(path, k, header[k]) for k in ("pid", "context", "nnodes", "nranks", "requests", "recorded",
                                                        "dropped", "dropped_unkeyed")}
    if body >= len(lines) or lines[body].strip() != REQUEST_LOG_COLUMNS:
        raise ConfigError("inputs", f"{path}:{body + 1}: expected the columns line {REQUEST_LOG_COLUMNS}")
    comm = f"{header['host']}:{nums['pid']}:ctx{nums['context']}"
    rank_id = f"{header['host']}:{nums['pid']}"
    calls: list[Call] = []
    for i, line in enumerate(lines[body + 1:], start=body + 2):
        if not line.strip():
            continue
        parts = line.split(",")
        if len(parts) != 4:
            raise ConfigError("inputs", f"{path}:{i}: expected {REQUEST_LOG_COLUMNS}, got {line[:80]!r}")
        nbytes, _nodes, ranks = (_int_field(path, f"line {i}", v) for v in parts[1:])
        calls.append(Call(collective_name(parts[0]), nbytes, "unknown", ranks, comm, rank_id))
    if len(calls) != nums["recorded"]:
        raise ConfigError("inputs", f"{path}: {len(calls)} requests, its header says recorded: {nums['recorded']} "
                                    "(a truncated copy?)")
    if nums["requests"] != nums["recorded"] + nums["dropped"] or \
            sum(c for _, _, c in counted) + nums["dropped_unkeyed"] != nums["dropped"]:
        raise ConfigError("inputs", f"{path}: its counts disagree (requests {nums['requests']}, recorded "
                                    f"{nums['recorded']}, dropped {nums['dropped']} of which "
                                    f"{nums['dropped_unkeyed']} unkeyed, dropped_count lines)")
    past = [Call(collective_name(c), n, "unknown", nums["nranks"], comm, rank_id, count=k) for c, n, k in counted]
    return RequestLog(header, calls, past, comm, nums["nnodes"])


def _request_log_rank_ids(logs: list[RequestLog]) -> None:
    """Files of one process with the same known ``comm_id`` are ranks of that communicator driven by
    one process: the k-th of them (in context order) is rank ``host:pid#k``."""
    seen: dict[tuple[str, str, str], int] = defaultdict(int)
    for log in sorted(logs, key=lambda x: (x.header["host"], x.header["pid"], int(x.header["context"]))):
        comm_id = log.header["comm_id"]
        if comm_id == "unknown":
            continue
        key = (log.header["host"], log.header["pid"], comm_id)
        k = seen[key]
        seen[key] += 1
        if k:
            for c in log.calls + log.past_cap:
                c.rank_id = f"{c.rank_id}#{k}"


# -- steps ---------------------------------------------------------------------------------------


MAX_TAIL = 16  # calls after the last step (a closing barrier, a teardown) that may be left out


def repeating_block(seq: list[Any], min_cover: float = 0.0, max_tail: int = MAX_TAIL) -> tuple[int, int, int] | None:
    """``(offset, period, end)`` of the block of ``seq`` that repeats back to back from ``offset`` to
    ``end`` at least twice and covers the most calls in whole repetitions; ``end`` leaves out at
    most ``max_tail`` calls at the end (and fewer than one period). Ties go to the fewest calls left
    at the end, then the shortest period. The block covers at least ``min_cover`` of ``seq`` (a
    share, 0 to 1). None when nothing repeats."""
    n = len(seq)
    best: tuple[int, int, int, int] | None = None  # (covered, -tail, -period, offset)
    for tail in range(min(max_tail, n // 3) + 1):
        m = n - tail
        found: list[tuple[int, int]] = []  # (period, covered) found at this end
        for p in range(1, m // 2 + 1):
            if tail >= p or any(p % q == 0 and c >= 2 * p for q, c in found):
                continue  # a multiple of a period already found covers no more
            i = m - p - 1  # the last i with seq[i] != seq[i + p], from the end
            while i >= 0 and seq[i] == seq[i + p]:
                i -= 1
            offset = i + 1
            covered = (m - offset) // p * p
            if covered >= 2 * p and covered >= min_cover * n:
                found.append((p, covered))
                key = (covered, -tail, -p, offset)
                if best is None or key > best:
                    best = key
    if best is None:
        return None
    covered, tail, p, offset = best[0], -best[1], -best[2], best[3]
    # the repetitions end where the last whole one ends
    return offset, p, offset + covered


def repeating_period(seq: list[Any], min_cover: float = 0.0) -> tuple[int, int] | None:
    """``(offset, period)`` of :func:`repeating_block` with no calls left out at the end."""
    found = repeating_block(seq, min_cover, max_tail=0)
    return None if found is None else found[:2]


# -- the profile ---------------------------------------------------------------------------------


def build_profile(paths: list[str | Path], steps: int = 0) -> Profile:
    """The profile of the job whose logs, traces or flight recorder dumps are ``paths``.

    :param paths: input files, any mix of the four formats (see the module's docstring)
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
    request_logs: list[RequestLog] = []
    capped: set[str] = set()  # communicators whose request log stops at its cap, mid-step
    for p in map(Path, paths):
        data = _read_bytes(p)
        fmt = _format_of(p, data)
        inputs.append({"path": str(p), "format": fmt})
        if fmt == "nccl-log":
            calls, nodes, n = _nccl_log_calls(p, data.decode("utf-8", errors="replace"))
            comm_nodes.update(nodes)
            unstepped += calls
        elif fmt == "request-log":
            log = read_request_log(p, data.decode("utf-8", errors="replace"))
            request_logs.append(log)
            comm_nodes[log.comm] = log.nnodes
            unstepped += log.calls
            n = []
            dropped, unkeyed = int(log.header["dropped"]), int(log.header["dropped_unkeyed"])
            if dropped:
                capped.add(log.comm)
            if dropped and steps:
                unstepped += log.past_cap
                n.append(f"{p.name}: {dropped} requests past its cap of {log.header['max_records']} counted from "
                         f"their totals" + (f", {unkeyed} of them without a size left out" if unkeyed else ""))
            elif dropped:
                n.append(f"{p.name}: {dropped} requests past its cap of {log.header['max_records']} have no order: "
                         "left out of the steps (give steps=N to count them)")
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
    if request_logs:
        _request_log_rank_ids(request_logs)
        notes.append(f"{len(request_logs)} request log(s): the tuner is not told the data type (dtype unknown, "
                     "nbytes exact)")
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
                per_rank[(rank_id, key_of(c))] += c.count / n_steps
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
                # a capped request log ends mid-step: nothing may be left out at its end
                found = repeating_block([(c.collective, c.nbytes, c.dtype) for c in cs],
                                        min_cover=0.5 if comm in capped else 0.0,
                                        max_tail=0 if comm in capped else MAX_TAIL)
                if found is None:
                    n_steps, body = 1, cs
                    notes.append(f"{comm}: {len(cs)} calls with no repeating pattern, counted as one step")
                else:
                    offset, period, end = found
                    n_steps = (end - offset) // period
                    body = cs[offset:end]
                    left = len(cs) - len(body)
                    if left:
                        notes.append(f"{comm}: {left} calls outside the {n_steps} repeating steps left out "
                                     f"({offset} before, {len(cs) - offset - len(body)} after)")
                how.add("the repeating pattern of calls per communicator")
            step_counts.append(n_steps)
            for c in body:
                per_rank[(c.rank_id, key_of(c))] += c.count / n_steps
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
    if any(e.dtype == "unknown" and e.nbytes == 0 for e in entries):
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


def profile_document(path: str | Path) -> dict[str, Any]:
    """The YAML document of a profile file, checked to be one (``kind: ncclrl-job-profile``)."""
    try:
        doc = yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError) as e:
        raise ConfigError("profile", f"cannot read {path}: {e}") from None
    if not isinstance(doc, dict) or doc.get("kind") != "ncclrl-job-profile":
        raise ConfigError("profile", f"{path} is not an ncclrl job profile (kind: ncclrl-job-profile)")
    return doc


def load_profile(path: str | Path) -> Profile:
    """Read a profile written by :func:`dump_profile`; a malformed one is a :class:`ConfigError`."""
    doc = profile_document(path)
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


__all__ = ["Call", "Entry", "Profile", "RequestLog", "build_profile", "collective_name", "detect_format", "dtype_name",
           "dump_profile", "load_profile", "profile_document", "read_request_log", "repeating_block",
           "repeating_period", "summary"]
