"""Onboard a cluster from its own ``NCCL_DEBUG=INFO`` output.

:func:`parse_logs` reads the INFO lines of any NCCL job (one file per process, or one merged file;
prefixes such as ``host:pid:tid [dev]``, ``[rank0]:`` or mpirun's ``[1,0]<stdout>:`` are fine) and
keeps what they state: NCCL version, GPUs, ranks, nodes, channels, NVLS/CollNet, the network and
its NICs, rings and trees, the graph search's per-channel bandwidths, socket knobs, and, with
``NCCL_DEBUG_SUBSYS=TUNING``, NCCL's latency/bandwidth table and its per-call decisions.

NCCL 2.31+ (the tuning refactor) prints, besides the per-call lines of rank 0, an ``Input: {...}`` and a
``Best tuning {...}`` line for every tuning computation of every rank, and ``Best tuning, algorithm, X,
protocol, Y`` from the enqueue path; its table has no ``Max NThreads`` row and prints ``-1.0/-1.0``
(disabled) and ``0.0/0.0`` (model off) entries. Symmetric-kernel calls
(``AllReduce [Symmetric]: 4 Bytes -> Kernel AllReduce_AGxLL_R nchannels 1 ...``) are decisions too.

Where the log names no GPU (model, compute capability, NVLink figure), the architecture is inferred from
the per-compute-capability constants NCCL's tuning table shows (:func:`infer_arch_from_table`).

:func:`detect` turns those facts into a :class:`~ncclrl.costmodel.topology.Topology`: it starts
from the nearest shipped preset, sets every field the log determines, fits the per-channel
bandwidths the log leaves free to NCCL's own tuning table and logged decisions, and measures how
many of NCCL's logged decisions the replica (:mod:`ncclrl.costmodel.replica`) reproduces. When the
log holds NCCL's tuning table, that table is the communicator's model for the comparison
(:func:`tuning_model`); the replica's own table is measured beside it.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from ncclrl.costmodel import nccl as N
from ncclrl.costmodel.errors import ConfigError
from ncclrl.costmodel.replica import (
    FIRST_RELEASE,
    LAST_RELEASE,
    NcclModel,
    build_model,
    cost_table,
    default_decisions,
    parse_release,
    pick,
    release_model,
)
from ncclrl.costmodel.topology import Topology, load_topology, preset_names

# -- what NCCL's log lines look like ----------------------------------------------------------------

_MSG = re.compile(r"NCCL (INFO|WARN) ?(.*)$")
_PROC = re.compile(r"([A-Za-z0-9_.\-]+):(\d+):(\d+) \[(\d+)\] NCCL (?:INFO|WARN)")
_RANK_PREFIX = re.compile(r"^\s*\[(\d+)\] NCCL (?:INFO|WARN)")
VERSION_LINE = re.compile(r"NCCL version (\d+\.\d+\.\d+)")
_TESTS_DEVICE = re.compile(r"#\s+Rank\s+(\d+)\s+(?:Group\s+\d+\s+)?Pid\s+\d+\s+on\s+(\S+)\s+device\s+\d+\s+"
                           r"\[[^\]]*\]\s+(.+?)\s*$")
_COMM = re.compile(r"\bcomm (0x[0-9a-f]+) rank (\d+) nRanks (\d+) nNodes (\d+) localRanks (\d+) localRank (\d+)")
_INIT = re.compile(r"\bcomm (0x[0-9a-f]+) rank (\d+) nranks (\d+) cudaDev (\d+)"
                   r"(?: nvmlDev \d+)?(?: busId ([0-9a-f]+))?")
_CHANNELS = re.compile(r"^(\d+) coll channels, (?:(\d+) collnet channels, )?(?:(\d+) nvls channels, )?"
                       r"(\d+) p2p channels")
_DECISION = re.compile(r"(?:(\w+): )?(\d+) Bytes -> Algo (\w+) proto (\w+)"
                       r"(?: channel\{Lo\.\.Hi\}=\{(\d+)\.\.(\d+)\})?(?: time ([\d.]+))?")
_ENV = re.compile(r"^(NCCL_[A-Z0-9_]+) set by environment to (.*?)\.?\s*$")
_NET_USING = re.compile(r"^NET/(\w+)\s*: Using (.*)$")
_NIC = re.compile(r"\[(\d+)\]([^\s\[\];]+)")
_NETWORK = re.compile(r"^Using network (.+?)\s*$")
_VIA = re.compile(r"^(?:Channel|Ring) (\d+)(?:/\d+)? : (\d+)\[[0-9a-f]+\] -> (\d+)\[[0-9a-f]+\]"
                  r"(?: \[(send|receive)\])? via (\S+(?: \w+)*(?:/\S+)?)")
_RING = re.compile(r"^Channel (\d+)/(\d+) :\s+((?:\d+\s*)+)$")
_TREES = re.compile(r"^Trees (.*)$")
_PATTERN = re.compile(r"^Pattern (\d+), crossNic (\d+), nChannels (\d+), bw ([\d.]+)/([\d.]+), "
                      r"type (\w+)/(\w+), sameChannels (\d+)")
_SOCKETS = re.compile(r"NET/Socket\s*: Using (\d+) threads and (\d+) sockets per thread")
_CPU = re.compile(r"\bCPU/\S+ \((\d+)/(\d+)/(\d+)\)")
_GPU_NODE = re.compile(r"^\+ PCI\[[\d.]+\] - GPU/(\S+) \((\d+)\)")
_NVL = re.compile(r"^\+ NVL\[([\d.]+)\] - (GPU|NVS)/")
_NET_NODE = re.compile(r"^\+ NET\[([\d.]+)\] - NET/")
_SM = re.compile(r"\bsm[=_ ]\"?(\d{2,3})\b")
_TUNER = re.compile(r"TUNER/Plugin: Using (\S+)")
_TABLE_VALUES = re.compile(r"(-?\d+(?:\.\d*)?)/\s*(-?\d+(?:\.\d*)?)")
SYM_DECISION = re.compile(r"(\w+) \[Symmetric\]: (\d+) Bytes -> Kernel (\S+) nchannels (\d+)")
# 2.31+: "Input: { .comm = 0x.., .tuningMask = 1111.., .func = AllReduce, ... }" (every rank, every tuning
# computation), "Best tuning { .id = 5, .valid = 1, timeUs = 23.4,  .algo = RING, ... }" (its result), and
# "Best tuning, algorithm, RING, protocol, SIMPLE" (the enqueue path's choice for one call group)
_TUNING_INPUT = re.compile(r"^Input: \{(.*)\}?\s*$")
_TUNING_BEST = re.compile(r"^Best tuning \{(.*)\}?\s*$")
_TUNING_ENQUEUE = re.compile(r"^Best tuning, algorithm, (\w+), protocol, (\w+)")
_KV = re.compile(r"\.?(\w+) = ([^,{}]*)")
# ncclDataType_t sizes, bytes (0 int8 .. 9 bfloat16, 10/11 fp8 e4m3/e5m2)
_DTYPE_BYTES = {0: 1, 1: 1, 2: 4, 3: 4, 4: 8, 5: 8, 6: 2, 7: 4, 8: 8, 9: 2, 10: 1, 11: 1}
_GENERAL_MASK_BITS = 21  # tuning ids 0..20: algo*3+proto; 21..38 the symmetric kernels
# what may come before a host:pid:tid prefix at the start of a line: [rank0]:, [1,0]<stdout>:, [timestamp]
_LEAD = re.compile(r"^(?:\s|:|\[[^\]]*\]|<\w+>)*$")

# NCCL_TOPO_PATTERN_*: 1 balanced tree, 2 split tree, 3 tree, 4 ring, 5 NVLS, 6 CollNet direct
_TREE_PATTERNS = {1: "balanced", 2: "split", 3: "tree"}
_RING_PATTERN = 4
# NCCL_TOPO_CPU_ARCH_* and NCCL_TOPO_CPU_VENDOR_* in the topology dump's "CPU/... (arch/vendor/model)"
_CPU_ARCHS = {1: "x86", 2: "power", 3: "arm"}
_CPU_VENDORS = {1: "intel", 2: "amd", 3: "intel", 4: "mixed"}  # 3 = Zhaoxin: NCCL's model treats it as Intel
# NCCL's NVLink bandwidth per link as its topology search counts it (topo.h, SMxx_NVLINK_BW), GB/s
_NVLINK_BW = {"hopper": 20.6, "blackwell": 40.1}
_SM_ARCHS = {7: "volta", 8: "ampere", 9: "hopper", 10: "blackwell", 12: "blackwell"}
# GPU product names, as nccl-tests' "Using devices" header or NVML print them, to their architecture
_MODEL_ARCHS = ((r"\b(GB|B)\d{3}\b|RTX PRO 6000", "blackwell"), (r"\b(GH|H)\d{2,3}\b", "hopper"),
                (r"\bA\d{2,4}\b|RTX A\d{4}|A\d{3}-", "ampere"), (r"\bV100\b", "volta"))
# NCCL's network plugin names to the topology schema's net.kind
_NET_KINDS = {"ib": "ib", "ibext": "ib", "socket": "socket", "ofi": "ofi", "aws libfabric": "ofi"}


@dataclass(frozen=True)
class LoggedDecision:
    """One per-call decision line (``AllReduce: 1048576 Bytes -> Algo RING proto LL channel{Lo..Hi}={0..23}``).

    :param coll: index into :data:`ncclrl.costmodel.nccl.COLLECTIVES`; -1 when the line does not name it
    :param log_nbytes: the bytes NCCL logged (one rank's buffer: AllGather/ReduceScatter log total / nRanks)
    :param algo: algorithm index
    :param proto: protocol index
    :param channels: channels the call ran on (Hi - Lo + 1, or a symmetric kernel's ``nchannels``); 0 when the
        line does not say
    :param symmetric: a symmetric kernel ran the call (``AllReduce [Symmetric]: ...``); algo and proto are -1
    :param kernel: the symmetric kernel's name (``AllReduce_AGxLL_R``)
    :param source: ``"call"`` (a per-call line) or ``"tuning"`` (2.31+: the last ``Best tuning`` of a call
        group, used where the log has no per-call lines)
    :param max_channels: ``"tuning"`` decisions: the ``nChannels`` NCCL's tuning states (before its scheduler)
    """

    coll: int
    log_nbytes: int
    algo: int
    proto: int
    channels: int
    symmetric: bool = False
    kernel: str = ""
    source: str = "call"
    max_channels: int = 0


@dataclass(frozen=True)
class TuningCompute:
    """One NCCL 2.31+ tuning computation: an ``Input: {...}`` line and its ``Best tuning {...}`` line.

    Fields the line does not print (or prints as garbage) are -1 / ``""`` / ``None``.

    :param mask: ``.tuningMask`` (``None`` when it is not binary: ``%lb`` needs glibc >= 2.35)
    :param symmetric_mask: the computation considered symmetric kernels only (mask bits 21+); ``None`` unknown
    :param nested: computed inside another computation (the symmetric path's general fallback check)
    :param nbytes: ``.nBytes`` as NCCL passes it (AllGather/ReduceScatter: all ranks' bytes on the general path)
    :param log_nbytes: one rank's bytes (``count`` x the type's size), the per-call lines' convention; -1 unknown
    """

    proc: str
    coll: int
    mask: int | None
    symmetric_mask: bool | None
    nbytes: int
    log_nbytes: int
    num_pipe_ops: int
    id: int
    valid: int
    time_us: float
    algo: int
    proto: int
    sym_kernel: str
    nchannels: int
    max_channels: int
    nwarps: int
    forced: int
    nested: bool


@dataclass(frozen=True)
class GraphSearch:
    """One ``Pattern P, crossNic C, nChannels N, bw I/E, type TI/TE, sameChannels S`` line of NCCL's graph search.

    :param pattern: NCCL_TOPO_PATTERN_* (4 ring; 1, 2, 3 trees; 5 NVLS; 6 CollNet direct)
    :param nchannels: channels the search found (before NCCL duplicates them)
    :param bw_intra_gbps: per-channel intra-node bandwidth (``bwIntra``), GB/s
    :param bw_inter_gbps: per-channel inter-node bandwidth (``bwInter``), GB/s
    :param same_channels: the graph's ``sameChannels``
    """

    pattern: int
    nchannels: int
    bw_intra_gbps: float
    bw_inter_gbps: float
    type_intra: str
    type_inter: str
    same_channels: bool


@dataclass
class TuningTable:
    """NCCL's per-communicator cost model as printed at init with ``NCCL_DEBUG_SUBSYS=TUNING``.

    :param lat_us: ``[coll][algo][proto]`` latency, us
    :param bw_gbps: ``[coll][algo][proto]`` bandwidth, GB/s (0 = disabled); printed to 0.1 GB/s. NCCL 2.31+
        prints disabled entries as ``-1.0/-1.0`` (kept as 0/0) and models it did not run as ``0.0/0.0``
    :param seen: which ``[coll][algo]`` entries the log printed
    """

    lat_us: np.ndarray = field(default_factory=lambda: np.zeros((5, N.NUM_ALGOS, N.NUM_PROTOS)))
    bw_gbps: np.ndarray = field(default_factory=lambda: np.zeros((5, N.NUM_ALGOS, N.NUM_PROTOS)))
    seen: np.ndarray = field(default_factory=lambda: np.zeros((5, N.NUM_ALGOS), dtype=bool))

    @property
    def complete(self) -> bool:
        return bool(self.seen[:, (N.TREE, N.RING)].all())


@dataclass
class LogFacts:
    """What a set of NCCL INFO logs states. ``None`` is "the log does not say"."""

    files: list[str] = field(default_factory=list)
    nccl_lines: int = 0
    nccl_version: str | None = None
    gpu_model: str | None = None
    gpu_arch: str | None = None
    gpu_arch_source: str = ""
    gpu_arch_unknown: str = ""  # why the log does not determine the architecture (no model, NVLink or table)
    hosts: set[str] = field(default_factory=set)
    glued_hosts: set[str] = field(default_factory=set)  # mid-line prefixes no known host name ends
    nranks: int | None = None
    nnodes: int | None = None
    local_ranks: int | None = None
    max_rank_seen: int = -1
    channels: int | None = None
    channel_counts: Counter = field(default_factory=Counter)
    collnet_channels: int | None = None
    nvls_channels: int | None = None
    p2p_channels: int | None = None
    network: str | None = None
    nics: dict[str, list[str]] = field(default_factory=dict)  # plugin -> NIC names (with /IB, /RoCE)
    nic_bw_gbps: float | None = None
    transports: Counter = field(default_factory=Counter)
    rings: dict[int, list[int]] = field(default_factory=dict)
    trees_per_rank: int | None = None
    graphs: list[GraphSearch] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    socket_nthreads: int | None = None
    nsocks_perthread: int | None = None
    cpu_arch: str | None = None
    cpu_vendor: str | None = None
    nvlink_bw_gbps: float | None = None  # one GPU's NVLink total as NCCL's topology dump counts it
    nvlink_peer: str | None = None       # "NVS" (through NVSwitch) or "GPU" (point-to-point)
    topo_dump: bool = False
    tuner_plugin: str | None = None
    collnet_support: bool | None = None
    nvls_support: bool | None = None
    tuning: TuningTable | None = None
    decision_lines: int = 0
    symmetric_lines: int = 0
    decisions: list[LoggedDecision] = field(default_factory=list)
    tunings: list[TuningCompute] = field(default_factory=list)  # 2.31+ Input/Best tuning pairs
    tuning_enqueue_lines: int = 0      # 2.31+ "Best tuning, algorithm, X, protocol, Y"
    tuning_decisions: list[LoggedDecision] = field(default_factory=list)  # last Best tuning of each call group
    tuning_masks_unreadable: int = 0   # Input lines whose tuningMask is not binary (%lb on old glibc)
    notes: list[str] = field(default_factory=list)

    @property
    def net_kind(self) -> str | None:
        """``ib``, ``roce``, ``socket``, ``ofi``, or ``None`` when the log names no network."""
        name = (self.network or "").lower()
        base = re.sub(r"(_v\d+)$", "", name)
        kind = _NET_KINDS.get(base)
        if kind is None and self.transports:
            nets = [t.split("/")[1].lower() for t in self.transports if t.startswith("NET/")]
            if nets:
                kind = _NET_KINDS.get(re.sub(r"(ext)?(_v\d+)?$", "", nets[0]))
        if kind == "ib":
            nics = self.nics.get("IB", [])
            if nics and all(n.endswith("/RoCE") for n in nics):
                return "roce"
        return kind

    @property
    def nics_per_node(self) -> int | None:
        kind = self.net_kind
        if kind in ("ib", "roce"):
            return len(self.nics.get("IB", [])) or None
        if kind == "socket":
            return len(self.nics.get("Socket", [])) or None
        if kind == "ofi":
            return max((len(v) for k, v in self.nics.items() if k not in ("IB", "Socket")), default=0) or None
        return None


def _strip_prefix(line: str) -> str:
    m = _MSG.search(line)
    return m.group(2).rstrip() if m else ""


def _set_max(cur: int | None, v: int) -> int:
    return v if cur is None else max(cur, v)


def _parse_table_row(facts: LogFacts, state: dict, tstate: dict, msg: str, ctx: int | None) -> bool:
    """One line of the tuning table; True when it was one. The table of the largest communicator
    (``ctx``: its nRanks) is kept, the first one printed of that size. ``tstate`` is the printing
    thread's own (other threads' lines may fall between a table's rows)."""
    cells = [c.strip() for c in msg.split("|")]
    if len(cells) < 3:
        return False
    head = cells[0]
    if head in ("Algorithm", "Latency/AlgBw"):
        cols = []
        if head == "Algorithm":
            for name in cells[1:]:
                if name:
                    a = N.parse_name("tuning table algorithm", _ALGO_ALIASES.get(name.lower(), name), N.ALGOS)
                    cols += [(a, p) for p in range(N.NUM_PROTOS)]
        else:  # NCCL <= 2.17: one header of Algo/Proto pairs
            for cell in cells[1:]:
                if "/" in cell:
                    an, pn = (s.strip() for s in cell.split("/"))
                    a = N.parse_name("tuning table algorithm", _ALGO_ALIASES.get(an.lower(), an), N.ALGOS)
                    cols.append((a, N.parse_name("tuning table protocol", pn, N.PROTOS)))
        rank = -1 if ctx is None else ctx
        if facts.tuning is None or rank > state.get("table_rank", -2):
            facts.tuning = TuningTable()
            state["table_rank"] = rank
        keep = rank == state["table_rank"] and not facts.tuning.seen[:, [a for a, _ in cols]].any()
        tstate["cols"] = cols if keep else []
        return True
    if head in N.COLL_LOG_NAMES and tstate.get("cols") is not None and facts.tuning is not None:
        c = N.COLL_LOG_NAMES[head]
        vals = [_TABLE_VALUES.fullmatch(x.strip()) for x in cells[1:] if x.strip()]
        for (a, p), m in zip(tstate["cols"], vals, strict=False):
            if m is None:
                continue
            lat, bw = float(m.group(1)), float(m.group(2))
            if lat < 0 or bw < 0:  # 2.31+: -1.0/-1.0 is an entry NCCL disabled
                lat = bw = 0.0
            facts.tuning.lat_us[c, a, p] = lat
            facts.tuning.bw_gbps[c, a, p] = bw
            facts.tuning.seen[c, a] = True
        return True
    return head in ("Protocol", "Max NThreads")


_ALGO_ALIASES = {"collnet": "collnet_direct", "collnetdirect": "collnet_direct", "collnetchain": "collnet_chain",
                 "nvlstree": "nvls_tree"}


def _host_of(facts: LogFacts, token: str, at_line_start: bool) -> str:
    """The host name of a ``host:pid:tid [dev] NCCL`` prefix. At the start of a line the token is the
    host; a prefix in mid-line follows output another writer left without its newline (nccl-tests'
    ``root`` column ``-1`` or ``#wrong`` ``0`` glued to ``38dcf168f605``), so its token is the
    longest host name already seen that ends it, or, when none is, the token as read (kept apart
    until the end of the log, see ``_conclude``)."""
    if at_line_start:
        facts.hosts.add(token)
        return token
    known = [h for h in facts.hosts if token.endswith(h)]
    if known:
        return max(known, key=len)
    facts.glued_hosts.add(token)
    return token


def _parse_text(facts: LogFacts, text: str, source: str) -> None:
    state: dict = {}
    threads: dict[str, dict] = {}
    comm_nranks: dict[str, int] = {}
    gpu_nvl: dict[str, float] = {}
    cur_gpu: str | None = None
    for raw in text.splitlines():
        line = raw.rstrip()
        m = VERSION_LINE.search(line)
        if m and facts.nccl_version is None:
            facts.nccl_version = m.group(1)
        m = _TESTS_DEVICE.search(line)
        if m:  # nccl-tests' "Using devices" header names the GPU and the host of each rank
            facts.max_rank_seen = max(facts.max_rank_seen, int(m.group(1)))
            facts.hosts.add(m.group(2))
            if facts.gpu_model is None:
                facts.gpu_model = re.sub(r"^NVIDIA\s+", "", m.group(3))
            continue
        if "NCCL INFO" not in line and "NCCL WARN" not in line:
            continue
        facts.nccl_lines += 1
        pm = _PROC.search(line)
        proc, thread = source, source
        if pm:
            host = _host_of(facts, pm.group(1), _LEAD.match(line[:pm.start()]) is not None)
            proc = f"{source}:{host}:{pm.group(2)}"
            thread = f"{proc}:{pm.group(3)}"
        else:
            rm = _RANK_PREFIX.match(line)
            if rm:
                thread = f"{source}:[{rm.group(1)}]"
        tstate = threads.setdefault(thread, {})
        msg = _strip_prefix(line)
        stripped = msg.strip()
        if "|" in msg and _parse_table_row(facts, state, tstate, stripped, comm_nranks.get(proc)):
            continue
        tstate["cols"] = None
        if (m := _COMM.search(msg)) is not None:
            nr, nn, lr = int(m.group(3)), int(m.group(4)), int(m.group(5))
            comm_nranks[proc] = nr
            if facts.nranks is None or nr >= facts.nranks:
                facts.nnodes = nn if facts.nranks != nr else max(facts.nnodes or 0, nn)
                facts.local_ranks = lr if facts.nranks != nr else max(facts.local_ranks or 0, lr)
                facts.nranks = nr
            facts.max_rank_seen = max(facts.max_rank_seen, int(m.group(2)))
            continue
        if (m := _INIT.search(msg)) is not None:
            nr = int(m.group(3))
            comm_nranks[proc] = nr
            if facts.nranks is None or nr > facts.nranks:
                facts.nranks = nr
                facts.nnodes = facts.local_ranks = None
            facts.max_rank_seen = max(facts.max_rank_seen, int(m.group(2)))
            continue
        if (m := _CHANNELS.match(stripped)) is not None:
            ctx = comm_nranks.get(proc)
            facts.channel_counts[(ctx, int(m.group(1)))] += 1
            if m.group(2) is not None:
                facts.collnet_channels = int(m.group(2))
            if m.group(3) is not None:
                facts.nvls_channels = _set_max(facts.nvls_channels, int(m.group(3)))
            facts.p2p_channels = int(m.group(4))
            continue
        if stripped.startswith(("Input: {", "Best tuning")) and _parse_tuning_line(facts, tstate, stripped, proc):
            continue
        if (m := SYM_DECISION.search(msg)) is not None:
            facts.symmetric_lines += 1
            facts.decisions.append(LoggedDecision(N.COLL_LOG_NAMES.get(m.group(1), -1), int(m.group(2)), -1, -1,
                                                  int(m.group(4)), symmetric=True, kernel=m.group(3)))
            continue
        if (m := _DECISION.search(msg)) is not None:
            facts.decision_lines += 1
            name = m.group(1)
            coll = N.COLL_LOG_NAMES.get(name, -1) if name else -1
            algo_s, proto_s = m.group(3), m.group(4)
            algo = _algo_proto_index(algo_s, N.ALGOS)
            proto = _algo_proto_index(proto_s, N.PROTOS)
            ch = int(m.group(6)) - int(m.group(5)) + 1 if m.group(5) is not None else 0
            if algo < 0 or proto < 0:
                state["unknown_names"] = state.get("unknown_names", 0) + 1
                if state["unknown_names"] == 1:
                    facts.notes.append(f"a decision line names an algorithm/protocol the replica does not know "
                                       f"({algo_s}/{proto_s}); such lines are not compared")
                continue
            facts.decisions.append(LoggedDecision(coll, int(m.group(2)), algo, proto, ch))
            continue
        if (m := _ENV.match(stripped)) is not None:
            facts.env[m.group(1)] = m.group(2).strip()
            continue
        if (m := _SOCKETS.search(msg)) is not None:
            facts.socket_nthreads, facts.nsocks_perthread = int(m.group(1)), int(m.group(2))
            continue
        if (m := _NET_USING.match(stripped)) is not None:
            nics = [n for _, n in _NIC.findall(m.group(2).split(";")[0])]
            if nics:
                facts.nics[m.group(1)] = nics
            continue
        if (m := _NETWORK.match(stripped)) is not None:
            facts.network = m.group(1)
            continue
        if (m := _VIA.match(stripped)) is not None:
            facts.max_rank_seen = max(facts.max_rank_seen, int(m.group(2)), int(m.group(3)))
            via = re.sub(r"/\d+(?=/|$)", "", m.group(5))  # drop the NIC index: NET/IB/0/GDRDMA -> NET/IB/GDRDMA
            facts.transports[via] += 1
            continue
        if (m := _RING.match(stripped)) is not None:
            order = [int(x) for x in m.group(3).split()]
            facts.rings[int(m.group(1))] = order
            facts.max_rank_seen = max(facts.max_rank_seen, max(order))
            continue
        if (m := _TREES.match(stripped)) is not None:
            facts.trees_per_rank = _set_max(facts.trees_per_rank, len(re.findall(r"\[\d+\]", m.group(1))))
            continue
        if (m := _PATTERN.match(stripped)) is not None:
            facts.graphs.append(GraphSearch(int(m.group(1)), int(m.group(3)), float(m.group(4)), float(m.group(5)),
                                            m.group(6), m.group(7), m.group(8) == "1"))
            continue
        if (m := _TUNER.search(msg)) is not None:
            facts.tuner_plugin = m.group(1)
            continue
        low = msg.lower()
        if "collnet is not supported" in low or "collnet disabled" in low:
            facts.collnet_support = False
        if "nvls multicast support is not available" in low:
            facts.nvls_support = False
        elif "nvls multicast support is available" in low:
            facts.nvls_support = True
        if "=== System" in msg:
            facts.topo_dump = True
        if (m := _CPU.search(stripped)) is not None and stripped.startswith("CPU/"):
            arch = _CPU_ARCHS.get(int(m.group(1)))
            vendor = "arm" if arch == "arm" else _CPU_VENDORS.get(int(m.group(2)))
            if facts.cpu_vendor not in (None, vendor):
                vendor = "mixed"
            facts.cpu_arch, facts.cpu_vendor = arch or facts.cpu_arch, vendor or facts.cpu_vendor
            cur_gpu = None
            continue
        if (m := _GPU_NODE.match(stripped)) is not None:
            cur_gpu = f"{proc}:{m.group(1)}"
            gpu_nvl.setdefault(cur_gpu, 0.0)
            continue
        if (m := _NVL.match(stripped)) is not None and cur_gpu is not None:
            gpu_nvl[cur_gpu] += float(m.group(1))
            facts.nvlink_peer = m.group(2)
            continue
        if (m := _NET_NODE.match(stripped)) is not None:
            facts.nic_bw_gbps = _set_max(facts.nic_bw_gbps, float(m.group(1)))  # type: ignore[arg-type]
            continue
        if stripped.startswith("+ PCI") or stripped.startswith("====="):
            cur_gpu = None
        if (m := _SM.search(msg)) is not None and facts.gpu_arch is None:
            major = int(m.group(1)) // 10
            if major in _SM_ARCHS:
                facts.gpu_arch, facts.gpu_arch_source = _SM_ARCHS[major], f"compute capability sm_{m.group(1)}"
    if gpu_nvl:
        facts.nvlink_bw_gbps = max(facts.nvlink_bw_gbps or 0.0, max(gpu_nvl.values()))


def _algo_proto_index(value: str, names: tuple[str, ...]) -> int:
    """Index of a logged algorithm/protocol (a name or a number); -1 when unknown (``Unknown``, a newer name)."""
    if value.isdigit():
        return int(value) if int(value) < len(names) else -1
    try:
        return N.parse_name("logged name", _ALGO_ALIASES.get(value.lower(), value), names)
    except ConfigError:
        return -1


def _int_field(kv: dict[str, str], key: str) -> int:
    v = kv.get(key, "")
    try:
        return int(v, 16) if v.lower().startswith("0x") else int(v)
    except ValueError:
        return -1


def _parse_tuning_line(facts: LogFacts, tstate: dict, msg: str, proc: str) -> bool:
    """One NCCL 2.31+ ``Input: {...}``, ``Best tuning {...}`` or ``Best tuning, algorithm, ...`` line; True when
    it was one. Inputs and results nest (the symmetric path computes a general tuning inside its own), so
    each thread keeps a stack of open inputs; the outer computations of one call group run until the enqueue
    path's ``Best tuning, algorithm`` line, or until a symmetric kernel is chosen: that is the group's final
    decision (``facts.tuning_decisions``)."""
    stack: list[dict] = tstate.setdefault("tuning_stack", [])
    group: list[TuningCompute] = tstate.setdefault("tuning_group", [])
    if (m := _TUNING_ENQUEUE.match(msg)) is not None:
        facts.tuning_enqueue_lines += 1
        algo, proto = _algo_proto_index(m.group(1), N.ALGOS), _algo_proto_index(m.group(2), N.PROTOS)
        if group:
            last = group[-1]
            if last.coll >= 0 and last.log_nbytes > 0 and algo >= 0 and proto >= 0:
                facts.tuning_decisions.append(LoggedDecision(last.coll, last.log_nbytes, algo, proto, 0,
                                                             source="tuning", max_channels=max(last.nchannels, 0)))
        group.clear()
        return True
    if (m := _TUNING_INPUT.match(msg)) is not None:
        kv = {k: v.strip() for k, v in _KV.findall(m.group(1))}
        mask_s = kv.get("tuningMask", "")
        mask = int(mask_s, 2) if mask_s and len(mask_s) <= 64 and set(mask_s) <= {"0", "1"} else None
        if mask is None:
            facts.tuning_masks_unreadable += 1
        low = (1 << _GENERAL_MASK_BITS) - 1
        kv["_mask"] = mask  # type: ignore[assignment]
        kv["_sym"] = None if mask is None else bool(mask >> _GENERAL_MASK_BITS) and not mask & low  # type: ignore
        stack.append(kv)
        return True
    if (m := _TUNING_BEST.match(msg)) is not None:
        best = {k: v.strip() for k, v in _KV.findall(m.group(1))}
        inp = stack.pop() if stack else {}
        nested = bool(stack)
        count, dtype = _int_field(inp, "count"), _int_field(inp, "dataType")
        size = _DTYPE_BYTES.get(dtype, 0)
        try:
            time_us = float(best.get("timeUs", "nan"))
        except ValueError:
            time_us = float("nan")
        sym_kernel = best.get("symKernelId", "")
        if sym_kernel.lower() in ("unknown", "(null)", "none", "-1"):
            sym_kernel = ""
        rec = TuningCompute(
            proc=proc, coll=N.COLL_LOG_NAMES.get(str(inp.get("func", "")), -1), mask=inp.get("_mask"),  # type: ignore
            symmetric_mask=inp.get("_sym"), nbytes=_int_field(inp, "nBytes"),  # type: ignore[arg-type]
            log_nbytes=count * size if count >= 0 and size else -1, num_pipe_ops=_int_field(inp, "numPipesOps"),
            id=_int_field(best, "id"), valid=_int_field(best, "valid"), time_us=time_us,
            algo=_algo_proto_index(best.get("algo", ""), N.ALGOS),
            proto=_algo_proto_index(best.get("proto", ""), N.PROTOS), sym_kernel=sym_kernel,
            nchannels=_int_field(best, "nChannels"), max_channels=_int_field(best, "maxChannels"),
            nwarps=_int_field(best, "nWarps"), forced=_int_field(best, "forced"), nested=nested)
        facts.tunings.append(rec)
        if not nested:
            group.append(rec)
            if sym_kernel:
                if rec.coll >= 0 and rec.log_nbytes > 0:
                    facts.tuning_decisions.append(LoggedDecision(
                        rec.coll, rec.log_nbytes, -1, -1, max(rec.nchannels, 0), symmetric=True, kernel=sym_kernel,
                        source="tuning", max_channels=max(rec.nchannels, 0)))
                group.clear()
        return True
    return False


def parse_logs(paths: list[str | Path]) -> LogFacts:
    """Read NCCL INFO logs (one per process, or merged) into :class:`LogFacts`.

    :param paths: the log files
    """
    facts = LogFacts(files=[str(p) for p in paths])
    for p in paths:
        path = Path(p)
        if not path.is_file():
            raise ConfigError("logs", f"no such file: {p}")
        text = path.read_bytes().decode("utf-8", errors="replace")
        _parse_text(facts, text, path.name)
    if facts.nccl_lines == 0:
        raise ConfigError("logs", f"no 'NCCL INFO' lines in {', '.join(Path(p).name for p in paths)}; "
                          "run the job with NCCL_DEBUG=INFO (and NCCL_DEBUG_SUBSYS=INIT,ENV,NET,GRAPH,TUNING "
                          "for the tuning table and the decisions)")
    _conclude(facts)
    return facts


def _conclude(facts: LogFacts) -> None:
    """Derive what follows from several lines together."""
    if facts.nranks is None and facts.max_rank_seen >= 0:
        facts.nranks = facts.max_rank_seen + 1
        facts.notes.append(f"no 'nRanks' line: {facts.nranks} ranks from the highest rank the log mentions")
    # channels of the main (largest) communicator
    if facts.channel_counts:
        main = [(ctx, ch) for (ctx, ch) in facts.channel_counts if ctx in (None, facts.nranks)]
        pool = main or list(facts.channel_counts)
        counts = Counter({ch: facts.channel_counts[(ctx, ch)] for ctx, ch in pool})
        facts.channels = counts.most_common(1)[0][0]
        if len(counts) > 1:
            facts.notes.append(f"communicators logged different channel counts {sorted(counts)}; "
                               f"took {facts.channels} (the most frequent)")
    # a mid-line prefix whose token no host seen at a line start ends: keep it, without the
    # characters no host name starts with
    for tok in sorted(facts.glued_hosts):
        if not any(tok.endswith(h) for h in facts.hosts):
            facts.hosts.add(tok.lstrip("-."))
            facts.notes.append(f"host name {tok.lstrip('-.')!r} read from a line another writer had not ended; "
                               "it may carry that writer's last characters")
    if facts.nnodes is None and facts.nranks:
        if facts.hosts and facts.nranks % len(facts.hosts) == 0:
            facts.nnodes = len(facts.hosts)
            facts.notes.append(f"no 'nNodes' line: {facts.nnodes} nodes from the distinct host names")
        elif facts.local_ranks:
            facts.nnodes = max(1, facts.nranks // facts.local_ranks)
    if facts.nnodes and facts.hosts and len(facts.hosts) != facts.nnodes:
        facts.notes.append(f"NCCL counted {facts.nnodes} node(s) on {len(facts.hosts)} host name(s) "
                           f"({', '.join(sorted(facts.hosts))}): NCCL_HOSTID or containers split or merge hosts")
    # GPU architecture: from the model name, else from NCCL's per-link NVLink figure
    if facts.gpu_model and facts.gpu_arch is None:
        for pat, arch in _MODEL_ARCHS:
            if re.search(pat, facts.gpu_model):
                facts.gpu_arch, facts.gpu_arch_source = arch, f"GPU model {facts.gpu_model}"
                break
    if facts.gpu_arch is None and facts.nvlink_bw_gbps:
        for arch, per_link in _NVLINK_BW.items():
            links = facts.nvlink_bw_gbps / per_link
            if abs(links - round(links)) < 0.02 and round(links) >= 1:
                facts.gpu_arch = arch
                facts.gpu_arch_source = (f"NVLink {facts.nvlink_bw_gbps:g} GB/s per GPU = {round(links)} x "
                                         f"{per_link} GB/s, NCCL's {arch} per-link figure")
                break
    if facts.tuning is not None and not facts.tuning.complete:
        facts.notes.append("the tuning table is incomplete (Tree/Ring rows missing); not used")
        facts.tuning = None
    if facts.gpu_arch is None and facts.tuning is not None:
        arch, why = infer_arch_from_table(facts)
        if arch:
            facts.gpu_arch, facts.gpu_arch_source = arch, f"inferred from NCCL's tuning table: {why}"
        else:
            facts.gpu_arch_unknown = f"NCCL's tuning table does not determine it: {why}"
    if facts.tuner_plugin:
        facts.notes.append(f"a tuner plugin ({facts.tuner_plugin}) was loaded: logged decisions are NCCL's "
                           "defaults only where it left them alone")
    forced = [k for k in ("NCCL_ALGO", "NCCL_PROTO", "NCCL_MIN_NCHANNELS", "NCCL_MAX_NCHANNELS", "NCCL_MIN_CTAS",
                          "NCCL_MAX_CTAS") if k in facts.env]
    if forced:
        facts.notes.append("set by environment, shaping NCCL's choices: "
                           + ", ".join(f"{k}={facts.env[k]}" for k in forced))
    if facts.socket_nthreads is None and "NCCL_SOCKET_NTHREADS" in facts.env:
        facts.socket_nthreads = _int_or_none(facts.env["NCCL_SOCKET_NTHREADS"])
    if facts.nsocks_perthread is None and "NCCL_NSOCKS_PERTHREAD" in facts.env:
        facts.nsocks_perthread = _int_or_none(facts.env["NCCL_NSOCKS_PERTHREAD"])
    if facts.nccl_version:
        rel = parse_release(facts.nccl_version)
        if not FIRST_RELEASE <= rel <= LAST_RELEASE:
            end = ".".join(map(str, (FIRST_RELEASE if rel < FIRST_RELEASE else LAST_RELEASE)[:2]))
            span = f"{'.'.join(map(str, FIRST_RELEASE[:2]))} to {'.'.join(map(str, LAST_RELEASE[:2]))}"
            facts.notes.append(f"NCCL {facts.nccl_version}: the replica follows NCCL {span}; this version is "
                               f"modelled as {end}, so its agreement need not be exact")
    if facts.tunings:
        nsym = sum(1 for t in facts.tunings if not t.nested and t.symmetric_mask)
        kept = sum(1 for t in facts.tunings if not t.nested and t.sym_kernel)
        facts.notes.append(f"{len(facts.tunings)} tuning computations (Input/Best tuning pairs, NCCL 2.31+) read: "
                           f"{nsym} on the symmetric path, {kept} of them kept a symmetric kernel; "
                           f"{facts.tuning_enqueue_lines} enqueue choices ('Best tuning, algorithm')")
        if facts.tuning_masks_unreadable:
            facts.notes.append(f"{facts.tuning_masks_unreadable} Input line(s) print no binary tuningMask (%lb needs "
                               "glibc >= 2.35); the fields after it may be shifted there")
    if facts.decision_lines + facts.symmetric_lines == 0 and facts.tuning_decisions:
        facts.decisions = list(facts.tuning_decisions)
        facts.notes.append(f"no per-call decision lines (only rank 0 prints them): compared the last 'Best tuning' "
                           f"of each call group instead ({len(facts.tuning_decisions)} groups; their channels are "
                           "NCCL's nChannels before its scheduler)")
    elif facts.tuning_decisions:
        facts.notes.append("the per-call lines are the final decisions; the 'Best tuning' lines are not compared")
    unnamed = sum(1 for d in facts.decisions if d.coll < 0)
    if unnamed:
        facts.notes.append(f"{unnamed} decision line(s) do not name their collective (NCCL < 2.20 format); "
                           "not compared")


_ARCH_NAMES = {row: arch for arch, row in N.COMPCAP_ROWS.items()}


def _caps_matching(bus: float, caps: np.ndarray, nch: int, tol: float) -> set[str]:
    """The architectures whose per-channel cap ``caps[row]`` times some graph channel count (1..nch) is ``bus``."""
    out = set()
    for row, cap in enumerate(caps):
        if cap <= 0:
            continue
        k = round(bus / cap)
        if 1 <= k <= nch and abs(bus - k * cap) <= tol:
            out.add(_ARCH_NAMES[row])
    return out


def infer_arch_from_table(facts: LogFacts) -> tuple[str | None, str]:
    """The GPU architecture (compute-capability row of NCCL's constants) that NCCL's logged tuning table
    shows, and how; ``(None, why not)`` when no per-architecture constant binds there.

    - Ring/LL on one node: ``min(llMaxBw, busBw / 2)``, llMaxBw per compute capability (39, 87.7, 141,
      282 GB/s); binding where Ring/Simple's bus bandwidth is over twice the Ring/LL figure: decisive.
    - Tree AllReduce (``min(0.92 busBw, nChannels x perChMaxTreeBw)``) and Ring/LL128 (``min(0.92 busBw,
      nChannels x perChMaxRingLL128Bw)``): a bus bandwidth that is a whole number of channels times one
      architecture's cap supports that architecture.

    Inferred where the checks that match agree on one architecture and the decisive one, or two, match.
    """
    tab, nr = facts.tuning, facts.nranks or 0
    nn, nch = facts.nnodes or 1, facts.channels or 0
    if tab is None or nr < 2 or nch < 1:
        return None, "no complete table with its rank and channel counts"
    try:
        rm = release_model(facts.nccl_version or "2.28.9")
    except ConfigError:
        rm = release_model("2.28.9")
    idx2 = 0 if nn == 1 else (1 if nn == 2 else 2)
    bw = tab.bw_gbps
    decisive, found = False, []  # (architectures, sentence)

    def ratio(c: int) -> float:
        return nr / (2 * (nr - 1) if c == N.ALLREDUCE else (nr - 1 if c in (N.ALLGATHER, N.REDUCESCATTER) else nr))

    if nn == 1:
        for c in (N.BROADCAST, N.REDUCE, N.ALLGATHER, N.REDUCESCATTER, N.ALLREDUCE):
            ll, simple = bw[c, N.RING, N.LL], bw[c, N.RING, N.SIMPLE]
            if ll <= 0 or simple <= 0:
                continue
            v, bus = ll / ratio(c), simple / ratio(c)
            if bus / 2 <= v + 0.2:  # not capped: says nothing
                continue
            rows = {_ARCH_NAMES[r] for r in range(N.LL_MAX_BW.shape[0]) if abs(N.LL_MAX_BW[r, 0] - v) <= 0.1}
            if rows:
                decisive = True
                found.append((rows, f"Ring/LL {N.COLLECTIVES[c]} {ll:g} GB/s, under half of Ring/Simple's {simple:g}: "
                                    f"capped at {v:g} GB/s, {'/'.join(sorted(rows))}'s llMaxBw on one node"))
                break
    tree = bw[N.ALLREDUCE, N.TREE, N.SIMPLE]
    if tree > 0:
        for factor, how in ((0.5, ""), (0.5 * 0.85, ", tree pattern")):
            bus = tree / factor
            rows = _caps_matching(bus, rm.per_ch_max_tree_bw[:, idx2], nch, 0.06 / factor)
            if rows:
                k = round(bus / rm.per_ch_max_tree_bw[N.COMPCAP_ROWS[min(rows)], idx2])
                found.append((rows, f"Tree/Simple AllReduce {tree:g} GB/s = {k} channels x "
                                    f"{rm.per_ch_max_tree_bw[N.COMPCAP_ROWS[min(rows)], idx2]:g} GB/s{how}, "
                                    f"{'/'.join(sorted(rows))}'s per-channel Tree cap"))
                break
    ring128 = bw[N.ALLREDUCE, N.RING, N.LL128]
    if ring128 > 0:
        bus = ring128 / ratio(N.ALLREDUCE)
        rows = _caps_matching(bus, rm.per_ch_max_ring_ll128_bw[:, idx2], nch, 0.06 / ratio(N.ALLREDUCE))
        if rows and len(rows) < len(N.COMPCAP_ROWS):
            cap = rm.per_ch_max_ring_ll128_bw[N.COMPCAP_ROWS[min(rows)], idx2]
            found.append((rows, f"Ring/LL128 AllReduce {ring128:g} GB/s = {round(bus / cap)} channels x {cap:g} GB/s, "
                                f"{'/'.join(sorted(rows))}'s per-channel Ring/LL128 cap"))
    if not found:
        return None, ("no per-compute-capability constant binds there (Ring/LL under llMaxBw"
                      + (" or more than one node" if nn > 1 else "") + ", Tree and Ring/LL128 under their caps)")
    common = set.intersection(*(rows for rows, _ in found))
    if len(common) == 1 and (decisive or len(found) >= 2):
        return common.pop(), "; ".join(text for _, text in found)
    if len(common) != 1:
        return None, "its constants point to different architectures: " + "; ".join(text for _, text in found)
    return None, "only one cap matches, which a per-channel bandwidth can match by chance: " + found[0][1]


def _int_or_none(s: str) -> int | None:
    return int(s) if s.strip().isdigit() else None


# -- from facts to a topology ----------------------------------------------------------------------


def _graph(facts: LogFacts, patterns: tuple[int, ...]) -> GraphSearch | None:
    return next((g for g in facts.graphs if g.pattern in patterns), None)


def nearest_preset(facts: LogFacts) -> tuple[str, str]:
    """The shipped preset closest to what the log states, and why (same GPU arch, fabric and network
    kind first, then the shape: nodes, GPUs per node, channels)."""
    best, best_score, why = "", -1.0, ""
    fabric = _fabric(facts)
    kind = facts.net_kind
    multi = (facts.nnodes or 1) > 1
    for name in preset_names():
        t = load_topology(name)
        score, parts = 0.0, []
        if facts.gpu_arch and t.gpu_arch == facts.gpu_arch:
            score, parts = score + 8, parts + [f"arch {t.gpu_arch}"]
        if fabric and t.intra.fabric == fabric:
            score, parts = score + 4, parts + [f"fabric {fabric}"]
        tkind = t.net.kind if t.nodes > 1 else "none"
        want = ({"ofi": "ib"}.get(kind or "", kind) if multi else "none")
        if want and tkind == want:
            score, parts = score + 6, parts + [f"network {tkind}"]
        elif want in ("ib", "roce") and tkind in ("ib", "roce"):
            score, parts = score + 5, parts + [f"network {tkind} (RDMA like {want})"]
        if facts.nnodes and t.nodes == facts.nnodes:
            score, parts = score + 1, parts + ["nodes"]
        if facts.nranks and facts.nnodes and t.gpus_per_node == facts.nranks // facts.nnodes:
            score, parts = score + 1, parts + ["GPUs per node"]
        if facts.channels and t.nccl.channels == facts.channels:
            score, parts = score + 0.5, parts + ["channels"]
        if facts.gpu_model and t.gpu_model and t.gpu_model.lower() in facts.gpu_model.lower():
            score, parts = score + 0.5, parts + [f"GPU {t.gpu_model}"]
        if "test bed" in (t.description or ""):  # a preset for testing ncclrl itself, never a cluster's nearest
            score -= 0.25
        if score > best_score:
            best, best_score, why = name, score, ", ".join(parts) or "no field in common"
    return best, why


def _fabric(facts: LogFacts) -> str | None:
    if facts.nvlink_peer == "NVS":
        return "nvswitch"
    if facts.nvlink_peer == "GPU":
        return "nvlink"
    if facts.topo_dump and facts.nvlink_bw_gbps is None:
        return "pcie"
    return None


@dataclass
class Detected:
    """The outcome of :func:`detect`.

    :param topology: the topology written (validated by :func:`load_topology`'s rules)
    :param preset: the preset it started from, and why that one
    :param filled: field -> where its value comes from ("log: ...", "preset", "fit: ...")
    :param agreement: see :class:`Agreement`
    """

    facts: LogFacts
    topology: Topology
    preset: str
    preset_reason: str
    filled: dict[str, str]
    agreement: Agreement
    searched: str = ""


@dataclass
class Agreement:
    """How far the replica reproduces what NCCL logged.

    :param points: distinct logged (collective, size) decisions compared
    :param algo_proto: of them, those whose algorithm and protocol the replica reproduces
    :param channel_points: those that logged a channel range
    :param channels: of them, those whose channel count the replica reproduces
    :param table_entries: enabled entries of NCCL's tuning table (either side) compared
    :param table_match: of them, those the replica's cost model matches to the log's rounding
    :param grid_points: (collective, size) points of 8 B .. 1 GiB where NCCL's table implies a choice
    :param grid_match: of them, those the replica picks the same algorithm and protocol for
    :param model: the latency/bandwidth table ``algo_proto`` and ``channels`` were computed with:
        ``"tuning table"`` (NCCL's own, printed in the log) or ``"replica"`` (built from the topology)
    :param replica_algo_proto: decisions reproduced with the replica's own table (= ``algo_proto``
        when ``model`` is ``"replica"``)
    :param replica_channels: channel counts reproduced with the replica's own table
    :param sym_points: of ``points``, the logged symmetric-kernel decisions; reproduced (in ``algo_proto``)
        where the replica's decision says ``symmetric`` at that (collective, size). A general decision is
        reproduced only where the replica does not say symmetric there.
    :param sym_match: symmetric decisions reproduced with ``model``'s table
    :param replica_sym_match: symmetric decisions reproduced with the replica's own table
    :param replica_says_symmetric: the replica's decisions carry a ``symmetric`` field (``False``: every
        symmetric decision counts as not reproduced)
    :param compared: one sentence: which of the log's decisions were compared, and from which lines
    """

    points: int = 0
    algo_proto: int = 0
    channel_points: int = 0
    channels: int = 0
    conflicts: int = 0
    mismatches: list[str] = field(default_factory=list)
    table_entries: int = 0
    table_match: int = 0
    grid_points: int = 0
    grid_match: int = 0
    model: str = "replica"
    replica_algo_proto: int = 0
    replica_channels: int = 0
    sym_points: int = 0
    sym_match: int = 0
    replica_sym_match: int = 0
    replica_says_symmetric: bool = True
    compared: str = ""

    @property
    def algo_proto_frac(self) -> float | None:
        return self.algo_proto / self.points if self.points else None

    @property
    def channels_frac(self) -> float | None:
        return self.channels / self.channel_points if self.channel_points else None

    def score(self) -> tuple[int, int, int, int]:
        """What the search of the free per-channel bandwidths maximizes: the replica's own agreement."""
        return (self.replica_algo_proto, self.grid_match, self.replica_channels, self.table_match)


def _allowed_mask(facts: LogFacts) -> np.ndarray | None:
    """``[algo][proto]`` mask from ``NCCL_ALGO``/``NCCL_PROTO`` set by environment (plain lists, ``^`` negation)."""
    mask = np.ones((N.NUM_ALGOS, N.NUM_PROTOS), dtype=bool)
    used = False
    for key, names, axis in (("NCCL_ALGO", N.ALGOS, 0), ("NCCL_PROTO", N.PROTOS, 1)):
        v = facts.env.get(key)
        if not v or ":" in v or ";" in v:
            continue
        neg = v.startswith("^")
        try:
            idx = [N.parse_name(key, _ALGO_ALIASES.get(s.strip().lower(), s.strip()), names)
                   for s in v.lstrip("^").split(",") if s.strip()]
        except ConfigError:
            continue
        sel = np.zeros(len(names), dtype=bool)
        sel[idx] = True
        sel = ~sel if neg else sel
        mask &= sel[:, None] if axis == 0 else sel[None, :]
        used = True
    return mask if used else None


_GRID = 2 ** np.arange(3, 31)


def agreement(topo: Topology, facts: LogFacts) -> Agreement:
    """Compare the replica on ``topo`` with NCCL's logged decisions and tuning table."""
    ag = Agreement()
    allowed = _allowed_mask(facts)
    seen: dict[tuple[int, int], LoggedDecision] = {}
    for d in facts.decisions:
        if d.coll < 0:
            continue
        key = (d.coll, d.log_nbytes)
        if key in seen and seen[key] != d:
            ag.conflicts += 1
            continue
        seen[key] = d
    by_coll: dict[int, list[LoggedDecision]] = {}
    for (c, _), d in sorted(seen.items()):
        by_coll.setdefault(c, []).append(d)
    ag.compared = _compared(facts, len(seen))
    logged = tuning_model(topo, facts)
    for label, model in (("replica", None), ("tuning table", logged)):
        if label == "tuning table" and model is None:
            continue
        points = ap = ch_points = ch = sym_points = sym_ok = 0
        misses = []
        for c, rows in by_coll.items():
            nbytes = np.array([d.log_nbytes * (topo.nranks if c in (N.ALLGATHER, N.REDUCESCATTER) else 1)
                               for d in rows], dtype=np.int64)
            nbytes = np.maximum(nbytes, 1)
            dec = default_decisions(topo, c, nbytes, allowed=allowed, model=model)
            sym = getattr(dec, "symmetric", None)
            if not hasattr(dec, "symmetric"):  # a replica without the field: no symmetric decision reproduced
                ag.replica_says_symmetric = False
            elif sym is None:  # the field, unset: no call runs on a symmetric kernel
                sym = np.zeros(nbytes.shape, dtype=bool)
            if sym is not None:
                sym = np.broadcast_to(np.asarray(sym, dtype=bool), nbytes.shape)
            for i, d in enumerate(rows):
                says_sym = bool(sym[i]) if sym is not None else False
                points += 1
                ch_ok = True
                if d.symmetric:  # a symmetric kernel ran it: reproduced where the replica says symmetric
                    ok = says_sym
                    sym_points += 1
                    sym_ok += ok
                else:
                    ok = (int(dec.algo[i]), int(dec.proto[i])) == (d.algo, d.proto) and not says_sym
                    if d.source == "tuning" and d.max_channels:  # NCCL's nChannels before its scheduler
                        ch_points += 1
                        ch_ok = int(dec.max_channels[i]) == d.max_channels
                        ch += ch_ok
                    elif d.channels:
                        ch_points += 1
                        ch_ok = int(dec.channels[i]) == d.channels
                        ch += ch_ok
                ap += ok
                if not (ok and ch_ok):
                    nccl = (f"symmetric {d.kernel}/{d.channels}ch" if d.symmetric else
                            f"{N.ALGOS[d.algo]}/{N.PROTOS[d.proto]}" + (f"/{d.channels}ch" if d.channels else ""))
                    rep = ("symmetric" if says_sym else
                           f"{N.ALGOS[dec.algo[i]]}/{N.PROTOS[dec.proto[i]]}/{int(dec.channels[i])}ch")
                    if d.symmetric and sym is None:
                        rep += " (the replica does not say symmetric)"
                    misses.append(f"{N.COLLECTIVES[c]} {d.log_nbytes} B: NCCL {nccl}, {label} {rep}")
        ag.points, ag.channel_points = points, ch_points
        ag.algo_proto, ag.channels, ag.model = ap, ch, label
        ag.sym_points, ag.sym_match = sym_points, sym_ok
        if label == "replica":
            ag.replica_algo_proto, ag.replica_channels, ag.replica_sym_match = ap, ch, sym_ok
            ag.mismatches = misses
        else:
            ag.mismatches = misses + ag.mismatches
    if facts.tuning is not None:
        rep = build_model(topo)
        log_bw, log_lat = facts.tuning.bw_gbps, facts.tuning.lat_us
        rep_bw = rep.bandwidths.copy()
        if allowed is not None:
            rep_bw[:, ~allowed] = 0.0
        for c in range(5):
            for a in range(N.NUM_ALGOS):
                if not facts.tuning.seen[c, a]:
                    continue
                for p in range(N.NUM_PROTOS):
                    lon, ron = log_bw[c, a, p] > 0, rep_bw[c, a, p] >= 0.05
                    if not (lon or ron):
                        continue
                    ag.table_entries += 1
                    ag.table_match += bool(lon and ron and abs(rep_bw[c, a, p] - log_bw[c, a, p]) <= 0.051 + 1e-3 *
                                           log_bw[c, a, p] and abs(rep.latencies[c, a, p] - log_lat[c, a, p]) <= 0.051)
        logged = tuning_model(topo, facts)
        for c in range(5):
            if not facts.tuning.seen[c].any() or not (log_bw[c] > 0).any():
                continue
            ta, tp = pick(cost_table(logged, c, _GRID))
            dec = default_decisions(topo, c, _GRID, allowed=allowed)
            ag.grid_points += _GRID.size
            ag.grid_match += int(np.sum((ta == dec.algo) & (tp == dec.proto)))
    return ag


def _compared(facts: LogFacts, distinct: int) -> str:
    """Which of the log's decisions :func:`agreement` compares, in one sentence."""
    ver = f"NCCL {facts.nccl_version or '(version not logged)'}"
    named = [d for d in facts.decisions if d.coll >= 0]
    nsym = sum(1 for d in named if d.symmetric)
    if not named:
        return f"{ver}: no decision naming its collective in the log"
    if named[0].source == "tuning":
        src = "the last 'Best tuning' of each call group (no per-call lines in the log)"
    else:
        src = "the per-call lines"
    out = (f"{ver}: {distinct} distinct (collective, size) decisions from {src}, of {len(named)} logged "
           f"({len(named) - nsym} general, {nsym} symmetric-kernel)")
    if facts.tunings and named[0].source == "call":
        out += f"; {len(facts.tunings)} Input/Best tuning pairs read, not compared"
    return out


def tuning_model(topo: Topology, facts: LogFacts) -> NcclModel | None:
    """NCCL's own latency/bandwidth table for ``topo``'s communicator, from the log's
    ``NCCL_DEBUG_SUBSYS=TUNING`` print (threads and thresholds from the replica); ``None`` when the
    log has no complete table. With it, the replica's per-call choice reproduces NCCL's predicted
    times for that communicator (to the print's 0.1 rounding)."""
    if facts.tuning is None:
        return None
    rep = build_model(topo)
    return NcclModel(topo=topo, bandwidths=facts.tuning.bw_gbps.copy(), latencies=facts.tuning.lat_us.copy(),
                     max_threads=rep.max_threads, thread_thresholds=rep.thread_thresholds)


def _with(topo: Topology, **kw: dict) -> Topology:
    """``topo`` with nested fields replaced: ``_with(t, intra={"channel_bw_gbps": 1.0})``."""
    top = {}
    for k, v in kw.items():
        if isinstance(v, dict):
            top[k] = replace(getattr(topo, k), **v)
        else:
            top[k] = v
    return replace(topo, **top)


def apply_facts(base: Topology, facts: LogFacts, name: str) -> tuple[Topology, dict[str, str]]:
    """``base`` with every field the log determines set from it; also where each field comes from."""
    filled: dict[str, str] = {}
    t = replace(base, name=name)

    def put(key: str, source: str, **kw: dict) -> None:
        nonlocal t
        t = _with(t, **kw)
        filled[key] = source

    if facts.gpu_model:
        put("gpu.model", "log", gpu_model=facts.gpu_model)
    else:
        put("gpu.model", "not in the log: unknown", gpu_model="unknown")
    if facts.gpu_arch:
        src = facts.gpu_arch_source
        put("gpu.arch", src if src.startswith("inferred") else f"log ({src})", gpu_arch=facts.gpu_arch)
    if facts.nranks and facts.nnodes:
        if facts.nranks % facts.nnodes:
            raise ConfigError("logs", f"{facts.nranks} ranks do not split evenly over {facts.nnodes} nodes; "
                              "pass the logs of one communicator")
        put("nodes", "log (nNodes / hosts)", nodes=facts.nnodes)
        put("gpus_per_node", "log (nRanks / nNodes)", gpus_per_node=facts.nranks // facts.nnodes)
    elif facts.nranks:
        put("gpus_per_node", "log (nRanks, one node assumed: no node count in the log)",
            nodes=1, gpus_per_node=facts.nranks)
    if facts.cpu_vendor:
        put("cpu.vendor", "log (topology dump)", cpu_vendor=facts.cpu_vendor)
    if facts.cpu_arch:
        put("cpu.arch", "log (topology dump)", cpu_arch=facts.cpu_arch)
    if facts.nccl_version:
        put("nccl.version", "log", nccl={"version": facts.nccl_version})
    if facts.channels:
        put("nccl.channels", "log (coll channels)", nccl={"channels": facts.channels})
    if facts.nvls_channels is not None:
        on = facts.nvls_channels > 0 and t.gpu_arch in ("hopper", "blackwell")
        kw = {"nvls": on} | ({"nvls_channels": facts.nvls_channels} if on else {})
        put("nccl.nvls", f"log ({facts.nvls_channels} nvls channels)", nccl=kw)
        if on:
            filled["nccl.nvls_channels"] = "log (nvls channels)"
    elif facts.nvls_support is False:
        put("nccl.nvls", "log (NVLS multicast not available)", nccl={"nvls": False})
    if facts.tuning is not None:
        collnet = bool((facts.tuning.bw_gbps[:, (N.COLLNET_DIRECT, N.COLLNET_CHAIN)] > 0).any())
        put("nccl.collnet", "log (tuning table)", nccl={"collnet": collnet})
    elif facts.collnet_support is False:
        put("nccl.collnet", "log (CollNet not supported)", nccl={"collnet": False})
    elif facts.nvls_channels is not None:
        put("nccl.collnet", "log (no CollNet network named)", nccl={"collnet": False})
    fabric = _fabric(facts)
    if fabric:
        intra = {"fabric": fabric}
        arch = t.gpu_arch
        if fabric == "pcie":
            intra["links_per_gpu"] = 0
        elif facts.nvlink_bw_gbps and arch in _NVLINK_BW:
            intra["links_per_gpu"] = round(facts.nvlink_bw_gbps / _NVLINK_BW[arch])
            intra["link_bw_gbps"] = _NVLINK_BW[arch]
        put("intra.fabric", "log (topology dump)", intra=intra)
        for k in ("links_per_gpu", "link_bw_gbps"):
            if k in intra:
                filled[f"intra.{k}"] = "log (topology dump's NVLink total / NCCL's per-link figure)"
    ring = _graph(facts, (_RING_PATTERN,))
    tree = _graph(facts, tuple(_TREE_PATTERNS))
    if tree is not None:
        put("nccl.tree_pattern", f"log (tree graph: pattern {tree.pattern})",
            nccl={"tree_pattern": _TREE_PATTERNS[tree.pattern]})
    if ring is not None:
        put("nccl.ring_same_channels", "log (ring graph: sameChannels)",
            nccl={"ring_same_channels": ring.same_channels})
        # the replica multiplies the per-channel figure by the communicator's channels; NCCL's tuning
        # multiplies the graph's own (before duplication): keep the product
        ch = t.nccl.channels
        put("intra.channel_bw_gbps",
            f"log (ring graph: {ring.nchannels} x {ring.bw_intra_gbps:g} GB/s over {ch} channels)",
            intra={"channel_bw_gbps": round(ring.nchannels * ring.bw_intra_gbps / ch, 4)})
        if t.nodes > 1:
            put("net.channel_bw_gbps", f"log (ring graph: {ring.nchannels} x {ring.bw_inter_gbps:g} GB/s over {ch} "
                "channels)", net={"channel_bw_gbps": round(ring.nchannels * ring.bw_inter_gbps / ch, 4)})
    if t.nodes > 1:
        kind = facts.net_kind
        if kind:
            put("net.kind", "log" if kind != "ofi" else "log (OFI plugin; the schema's ib stands for it)",
                net={"kind": "ib" if kind == "ofi" else kind})
        elif t.net.kind == "none":
            raise ConfigError("logs", f"{t.nodes} nodes but the log names no network (NET/IB, NET/Socket, ...); "
                              "pass a log with NCCL_DEBUG_SUBSYS=INIT,NET")
        nics = facts.nics_per_node
        if nics:
            put("net.nics_per_node", "log (NICs NCCL uses)", net={"nics_per_node": nics})
        elif t.net.nics_per_node <= 0:
            put("net.nics_per_node", "no NIC list in the log: 1", net={"nics_per_node": 1})
        if t.net.nic_bw_gbps <= 0:
            bw = facts.nic_bw_gbps or 12.5
            put("net.nic_bw_gbps", "log (topology dump)" if facts.nic_bw_gbps else "not in the log: 12.5 (100 Gb/s)",
                net={"nic_bw_gbps": bw})
        if t.net.channel_bw_gbps <= 0:
            put("net.channel_bw_gbps", "not in the log: the intra-node figure", net={"channel_bw_gbps":
                                                                                      t.intra.channel_bw_gbps})
    else:
        put("net.kind", "log (one node)", net={"kind": "none"})
    if facts.socket_nthreads:
        put("nccl.socket_nthreads", "log", nccl={"socket_nthreads": facts.socket_nthreads})
    if facts.nsocks_perthread:
        put("nccl.nsocks_perthread", "log", nccl={"nsocks_perthread": facts.nsocks_perthread})
    return t, filled


def _candidates(v: float, extra: list[float]) -> list[float]:
    base = [v * 2 ** (k / 4) for k in range(-12, 13)] if v > 0 else []
    return sorted({round(x, 4) for x in base + [e for e in extra if e > 0]})


def _table_bw_candidates(facts: LogFacts, topo: Topology) -> list[float]:
    """Per-channel bandwidths that make the replica's Ring/Simple and Tree/Simple entries equal NCCL's."""
    if facts.tuning is None:
        return []
    nr, ch = topo.nranks, topo.nccl.channels
    out = []
    for c in range(5):
        bw = facts.tuning.bw_gbps[c, N.RING, N.SIMPLE]
        if bw > 0:
            nsteps = 2 * (nr - 1) if c == N.ALLREDUCE else (nr - 1 if c in (N.ALLGATHER, N.REDUCESCATTER) else nr)
            out.append(bw * nsteps / nr / ch)
    tb = facts.tuning.bw_gbps[N.ALLREDUCE, N.TREE, N.SIMPLE]
    if tb > 0:
        for f in (0.5 * 0.92, 0.5 * 0.92 * 0.85):
            out.append(tb / f / ch)
    return out


def fit_free_fields(topo: Topology, facts: LogFacts, filled: dict[str, str]) -> tuple[Topology, Agreement, str]:
    """Search the per-channel bandwidths (and the tree pattern, when the log does not fix it) for the
    best agreement with NCCL's logged decisions, then its tuning table; returns the best topology,
    its agreement and a sentence saying what was searched ("" when nothing changed)."""
    best, best_ag = topo, agreement(topo, facts)
    if best_ag.points == best_ag.replica_algo_proto and best_ag.table_entries == best_ag.table_match \
            and best_ag.grid_points == best_ag.grid_match:
        return best, best_ag, ""
    # the inter-node figure matters beyond 2 nodes, and from 2.31 on 2 (ring.cc: Ring's busBw is bwInter,
    # tree.cc/pat.cc: min(bwInter, bwIntra))
    net_free = topo.nodes > 2 or (topo.nodes > 1 and release_model(topo.nccl.version).tuning_v231)
    fields = ["intra.channel_bw_gbps"] + (["net.channel_bw_gbps"] if net_free else [])
    patterns = [topo.nccl.tree_pattern] if "nccl.tree_pattern" in filled else ["balanced", "tree"]
    extra = _table_bw_candidates(facts, topo)
    intra_c = _candidates(topo.intra.channel_bw_gbps, extra)
    net_c = _candidates(topo.net.channel_bw_gbps, extra) if net_free else [topo.net.channel_bw_gbps]
    n_tried = 0
    for pat in patterns:  # one coordinate at a time: the intra-node figure, then the inter-node one
        start = _with(topo, nccl={"tree_pattern": pat})
        for key, values in (("intra", intra_c), ("net", net_c)):
            if len(values) < 2 and key == "net":
                continue
            for v in values:
                cand = _with(best if best.nccl.tree_pattern == pat else start, **{key: {"channel_bw_gbps": v}})
                ag = agreement(cand, facts)
                n_tried += 1
                if ag.score() > best_ag.score():
                    best, best_ag = cand, ag
    if best is topo:
        return best, best_ag, (f"searched {n_tried} values of the per-channel bandwidths the log leaves free: "
                               "none agreed better than the values the log gives")
    changed = [f for f in fields if _get(best, f) != _get(topo, f)]
    if best.nccl.tree_pattern != topo.nccl.tree_pattern:
        changed.append("nccl.tree_pattern")
    for f in changed:
        filled[f] = "fit: searched to match NCCL's logged decisions and tuning table"
    what = ", ".join(f"{f}={_get(best, f)}" for f in changed)
    return best, best_ag, (f"searched {n_tried} values of "
                           f"{', '.join(fields + (['nccl.tree_pattern'] if len(patterns) > 1 else []))} "
                           f"for the best agreement: {what}")


def _get(topo: Topology, dotted: str):
    obj = topo
    for part in dotted.split("."):
        obj = getattr(obj, part)
    return obj


def detect(paths: list[str | Path], name: str = "detected", preset: str = "", search: bool = True) -> Detected:
    """Parse NCCL INFO logs, build the topology they describe and measure the replica's agreement.

    :param paths: the log files
    :param name: the topology's name
    :param preset: start from this preset (name or YAML path); empty: the nearest shipped one
    :param search: search the per-channel bandwidths the log leaves free for the best agreement
    """
    facts = parse_logs(paths)
    if facts.nranks is None:
        raise ConfigError("logs", "the log states no rank count (no 'comm ... nRanks' or 'Init COMPLETE' line, "
                          "no rings); run the job with NCCL_DEBUG=INFO")
    if preset:
        base, reason = load_topology(preset), "given"
        pname = preset
    else:
        pname, reason = nearest_preset(facts)
        base = load_topology(pname)
    topo, filled = apply_facts(base, facts, name)
    searched = ""
    if search:
        topo, ag, searched = fit_free_fields(topo, facts, filled)
    else:
        ag = agreement(topo, facts)
    topo = replace(topo, description=_description(facts, pname, ag, searched))
    return Detected(facts=facts, topology=topo, preset=pname, preset_reason=reason, filled=filled, agreement=ag,
                    searched=searched)


def _frac(k: int, n: int) -> str:
    return f"{k}/{n} ({100.0 * k / n:.1f}%)" if n else "n/a (none logged)"


def _description(facts: LogFacts, preset: str, ag: Agreement, searched: str) -> str:
    gpu = facts.gpu_model or "GPU model not in the log"
    parts = [f"detected from NCCL {facts.nccl_version or '(version not logged)'} INFO logs "
             f"({', '.join(Path(f).name for f in facts.files)[:300]}): {facts.nnodes or '?'} node(s) x "
             f"{(facts.nranks or 0) // max(facts.nnodes or 1, 1)} GPU(s), {gpu}, "
             f"{facts.net_kind or 'no'} network, {facts.channels or '?'} coll channels",
             f"started from preset {preset}"]
    if ag.points:
        parts.append(f"replica reproduces {_frac(ag.replica_algo_proto, ag.points)} of NCCL's logged algo+proto "
                     f"decisions, channels {_frac(ag.replica_channels, ag.channel_points)}")
        if ag.model == "tuning table":
            parts.append(f"with NCCL's own tuning table from the log: {_frac(ag.algo_proto, ag.points)}, "
                         f"channels {_frac(ag.channels, ag.channel_points)}")
    if ag.grid_points:
        parts.append(f"{_frac(ag.grid_match, ag.grid_points)} of the choices NCCL's tuning table implies")
    if searched:
        parts.append(searched)
    parts.append("the sim block is the preset's until ncclrl calibrate fits it")
    return "; ".join(parts)


# -- report ----------------------------------------------------------------------------------------


def report(det: Detected) -> list[str]:
    """What :func:`detect` found, one line a fact, for the command line."""
    f, t, ag = det.facts, det.topology, det.agreement
    out = [f"# NCCL INFO lines read: {f.nccl_lines} from {len(f.files)} file(s)",
           f"nccl_version: {f.nccl_version or 'not in the log'}",
           f"gpu_model: {f.gpu_model or 'unknown (the log does not name the GPU)'}",
           f"gpu_arch: {f.gpu_arch + ' (' + f.gpu_arch_source + ')' if f.gpu_arch else 'not in the log'}"
           + (f" ({f.gpu_arch_unknown}; {t.gpu_arch} from the preset)" if not f.gpu_arch and f.gpu_arch_unknown
              else ""),
           f"ranks: {f.nranks}",
           f"nodes: {f.nnodes if f.nnodes is not None else 'not in the log'}"
           + (f" (hosts: {', '.join(sorted(f.hosts))})" if f.hosts else ""),
           f"gpus_per_node: {t.gpus_per_node}",
           f"coll_channels: {f.channels if f.channels is not None else 'not in the log'}"
           + (f" (collnet {f.collnet_channels}, nvls {f.nvls_channels}, p2p {f.p2p_channels})"
              if f.p2p_channels is not None else ""),
           f"nvls: {t.nccl.nvls} ({det.filled['nccl.nvls']})" if "nccl.nvls" in det.filled
           else "nvls: not in the log",
           f"collnet: {t.nccl.collnet} ({det.filled['nccl.collnet']})" if "nccl.collnet" in det.filled
           else "collnet: not in the log",
           f"network: {f.network or 'not named'} -> net.kind {f.net_kind or 'none'}",
           f"nics: {'; '.join(f'{k}: ' + ' '.join(v) for k, v in f.nics.items()) or 'none listed'}",
           f"transports: {', '.join(f'{k} x{v}' for k, v in f.transports.most_common()) or 'none logged'}",
           f"intra_fabric: {_fabric(f) or 'not in the log'}"
           + (f" (NVLink {f.nvlink_bw_gbps:g} GB/s per GPU)" if f.nvlink_bw_gbps else ""),
           f"cpu: {f.cpu_vendor or '?'} / {f.cpu_arch or '?'}",
           f"rings: {len(f.rings)} logged" + (f", ring 0: {' '.join(map(str, f.rings[min(f.rings)]))}"
                                               if f.rings else ""),
           f"trees per rank: {f.trees_per_rank if f.trees_per_rank is not None else 'not in the log'}"]
    for g in f.graphs:
        kind = "ring" if g.pattern == _RING_PATTERN else _TREE_PATTERNS.get(g.pattern, f"pattern {g.pattern}")
        out.append(f"graph {kind}: {g.nchannels} channel(s) x {g.bw_intra_gbps:g}/{g.bw_inter_gbps:g} GB/s "
                   f"(intra/inter), type {g.type_intra}/{g.type_inter}, sameChannels {int(g.same_channels)}")
    out.append(f"socket knobs: NCCL_SOCKET_NTHREADS={f.socket_nthreads or 'default'} "
               f"NCCL_NSOCKS_PERTHREAD={f.nsocks_perthread or 'default'}")
    out.append(f"tuning table: {'yes' if f.tuning is not None else 'not in the log (NCCL_DEBUG_SUBSYS=TUNING)'}")
    named = sum(1 for d in f.decisions if d.coll >= 0)
    out.append(f"decision lines: {f.decision_lines} ({named} naming their collective)"
               + (f", symmetric-kernel lines: {f.symmetric_lines}" if f.symmetric_lines else "")
               + (f", tuning computations (2.31+): {len(f.tunings)}" if f.tunings else ""))
    for n in f.notes:
        out.append(f"# note: {n}")
    out.append(f"# started from preset {det.preset} ({det.preset_reason})")
    for k, v in det.filled.items():
        out.append(f"#   {k} = {_get_field(t, k)}  <- {v}")
    kept = [k for k in _SCHEMA_FIELDS if k not in det.filled]
    out.append(f"#   kept from the preset (the log does not fix them): {', '.join(kept)}")
    if det.searched:
        out.append(f"# {det.searched}")
    src = "NCCL's own tuning table from the log" if ag.model == "tuning table" else "the replica's table"
    if ag.compared:
        out.append(f"# compared: {ag.compared}")
    out.append(f"agreement algo+proto: {_frac(ag.algo_proto, ag.points)} distinct (collective, size) decisions "
               f"(with {src})")
    if ag.sym_points:
        out.append(f"agreement symmetric-kernel decisions: {_frac(ag.sym_match, ag.sym_points)} (with {src})"
                   + ("" if ag.replica_says_symmetric else
                      "; the replica's decisions carry no 'symmetric' field, so none is reproduced"))
    out.append(f"agreement channels: {_frac(ag.channels, ag.channel_points)}")
    if ag.model == "tuning table":
        out.append(f"agreement with the replica's own table: algo+proto {_frac(ag.replica_algo_proto, ag.points)}, "
                   f"channels {_frac(ag.replica_channels, ag.channel_points)}")
    if ag.conflicts:
        out.append(f"# {ag.conflicts} logged decision(s) disagree with another for the same (collective, size); "
                   "compared the first")
    if f.tuning is not None:
        out.append(f"agreement tuning table: {_frac(ag.table_match, ag.table_entries)} enabled entries "
                   "(latency and bandwidth to the log's 0.1 rounding)")
        out.append(f"agreement with the choices NCCL's table implies (8 B .. 1 GiB): "
                   f"{_frac(ag.grid_match, ag.grid_points)}")
    for m in ag.mismatches[:20]:
        out.append(f"#   differs: {m}")
    return out


_SCHEMA_FIELDS = ("gpu.arch", "cpu.vendor", "cpu.arch", "intra.fabric", "intra.links_per_gpu", "intra.link_bw_gbps",
                  "intra.channel_bw_gbps", "intra.bus_bw_gbps", "net.kind", "net.nics_per_node", "net.nic_bw_gbps",
                  "net.nic_latency_us", "net.channel_bw_gbps", "net.latency_us", "nccl.tree_pattern",
                  "nccl.ring_same_channels", "nccl.nvls", "nccl.collnet", "nccl.socket_nthreads",
                  "nccl.nsocks_perthread", "nccl.nvls_channels", "sim")


def _get_field(topo: Topology, key: str):
    aliases = {"gpu.model": "gpu_model", "gpu.arch": "gpu_arch", "cpu.vendor": "cpu_vendor", "cpu.arch": "cpu_arch"}
    return _get(topo, aliases.get(key, key))
