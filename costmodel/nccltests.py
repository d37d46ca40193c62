"""Parse nccl-tests output: the stdout table and the ``-J`` JSON report, into typed records.

Both formats give, per size: the collective, ``nbytes`` (nccl-tests' ``size`` column: the larger
buffer, i.e. the total for AllGather/ReduceScatter), the element count and type, the reduction
op and root, and for out-of-place and in-place runs the time (us), algorithm and bus bandwidth
(GB/s) and the number of wrong elements (``None`` when the check was off, ``-c 0``, or when the
version printed a maximum error instead of a count: see :attr:`Result.error`).

What the standard output may look like, all read:

- every column layout nccl-tests printed: the table's own header says which columns a row has
  (no ``root`` or ``redop`` column before 2.10, an ``error`` column before ``#wrong``, ``cputime``
  for ``-C``, per-iteration columns for ``-I 1``, a trailing timestamp), and rows with no header
  in sight are read in the current layout;
- launcher prefixes: Open MPI's ``--tag-output`` (``[1,0]<stdout>:``, also where a chunk of
  another rank's output put it in mid-line), Slurm's ``srun --label`` (``0: ``), Ray's
  ``(head, rank=0, pid=12) ``;
- NCCL's own debug lines (``host:pid:tid [dev] NCCL INFO ...``, with ``NCCL_DEBUG=INFO``), from
  every rank when a launcher merges their outputs. They are taken out before the table is read
  (:func:`split_log`), even where one landed inside a table row (nccl-tests prints a row's first
  columns before it runs that size, and a launcher forwards other ranks' lines in whatever chunks
  it reads): a debug line is recognised by a host name that starts a debug line elsewhere or that
  nccl-tests' ``# Rank .. on HOST`` lines name. What they say is kept in :attr:`Run.log`;
- several runs in one file (:func:`parse_runs`), each with its own header, table and summary;
- a Markdown rendering that ate the leading ``#`` of nccl-tests' comment lines;
- bytes that are not UTF-8 (decoded with replacement characters).

A run that cannot be trusted is an error, never silently half-read (``strict``, the default): a
truncated run (no closing summary, or a row cut short), ``#wrong`` > 0, NCCL ``WARN`` lines, or no
rows at all. ``strict=False`` reads what is there: a run without its summary keeps its rows, a row
cut short is left out, and each such thing is said in :attr:`Run.notes`.

The NCCL configuration a run forced (``NCCL_ALGO``, ``NCCL_PROTO``, ...) is read from the output
itself: NCCL's ``NCCL_X set by environment to V`` lines, ``NCCL_X=V`` lines of an environment dump,
and ``NCCL_X=V`` / ``-x NCCL_X=V`` on the command line printed with the output. Only where the
output says nothing does :func:`run_env` fall back on the file name (:func:`env_from_name`), and
:func:`env_sources` says which keys came from where.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

PROGRAM_COLLECTIVES = {
    "all_reduce_perf": "allreduce",
    "all_gather_perf": "allgather",
    "reduce_scatter_perf": "reducescatter",
    "broadcast_perf": "broadcast",
    "reduce_perf": "reduce",
    "alltoall_perf": "alltoall",
    "alltoallv_perf": "alltoallv",
    "sendrecv_perf": "sendrecv",
    "gather_perf": "gather",
    "scatter_perf": "scatter",
    "hypercube_perf": "hypercube",
}

_ENV_LINE = re.compile(r"NCCL INFO (NCCL_[A-Z0-9_]+) set by environment to (\S+)")
_ENV_MSG = re.compile(r"^(NCCL_[A-Z0-9_]+) set by environment to (\S+)")
# NCCL_X=V printed by the job itself: an environment dump, or the command line that ran
_ENV_DUMP = re.compile(r"^\s*(?:export\s+|declare -x\s+)?(NCCL_[A-Z0-9_]+)=\"?([^\s\"]+)\"?\s*$")
_ENV_ARG = re.compile(r"(?:^|\s)(?:-x\s+|--env\s+|-e\s+)?(NCCL_[A-Z0-9_]+)=\"?([^\s\"]+)\"?")
_WARN_LINE = re.compile(r"NCCL WARN (.*)")
_NUM = re.compile(r"^[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+)?$")
# NCCL's debug line: [timestamp] host:pid:tid [cudaDev] [elapsed] [file:line] NCCL LEVEL message
_LOG_TAIL = r":(\d+):(\d+) \[(-?\d+)\] (?:\S+ ){0,3}?NCCL (INFO|WARN|TRACE|ABORT) ?([^\n]*)\n?"
_LOG_AT_START = re.compile(r"(?m)^(?:\[[^\]\n]{1,64}\] )?([A-Za-z0-9._-]+)" + _LOG_TAIL)
# nccl-tests' per-rank device line (rank 0 prints every rank's); no Group before 2.10
_RANK_LINE = re.compile(r"#\s*Rank\s+(\d+)\s+(?:Group\s+(\d+)\s+)?Pid\s+(\d+)\s+on\s+(\S+)\s+device\s+(\d+)"
                        r"\s+\[[^\]]*\]\s*([^\n]*)")
_LIBRARY = re.compile(r"nccl-library=(\d+)")
_NCCL_VERSION = re.compile(r"NCCL version (\d+\.\d+\.\d+)(?:\+cuda(\d+\.\d+))?")
# nccl-tests' -T: "host: Test timeout (5s) common.cu:523"
# (glued to a row's first columns when it struck while that size ran)
_TEST_TIMEOUT = re.compile(r"(?m)^(?:\s*\d+\s+\d+\s+\S+\s+\S+\s+-?\d+(?=\S))?\s*(\S+): Test timeout \((\d+)s\)")
# launcher prefixes: Open MPI's --tag-output (anywhere: a chunk of another rank may put it mid-line),
# srun --label and Ray's "(name, rank=0, pid=12) " at line starts
_MPI_TAG = re.compile(r"\[\d+,\d+\]<(?:stdout|stderr)>: ?")
_LINE_PREFIX = re.compile(r"(?m)^[ \t]*(?:\d+: |\([^()\n]*\brank=\d+[^()\n]*\) )")
_RANK_HOST = re.compile(r"#?\s*Rank\s+\d+\s+(?:Group\s+\d+\s+)?Pid\s+\d+\s+on\s+(\S+)\s+device")
# the columns before the measurements, as nccl-tests' header names them
_PROGRAM = re.compile(r"\b(" + "|".join(sorted(PROGRAM_COLLECTIVES, key=len, reverse=True)) + r")\b")
# what only a standard output has (a capture may start with a line of JSON-looking chatter)
_STDOUT_MARK = re.compile(r"(?m)^\S*\s*#?\s*(?:nThread \d|Avg bus bandwidth|\s*size\s+count\s)")
_LEAD = ("size", "count", "type", "redop", "root")
_TIME_COLS = ("time", "cputime")
_WRONG_COLS = ("#wrong", "wrong", "error", "#error")
_PER_ITER = ("i_min", "i_max", "i_p99", "i_cv%")


@dataclass(frozen=True)
class LogLine:
    """One NCCL debug line: who printed it (host, process, CUDA device) and what it said."""

    host: str
    pid: int
    dev: int
    level: str
    message: str


@dataclass(frozen=True)
class RankLine:
    """One of nccl-tests' ``#  Rank  0 Group  0 Pid 1234 on host device  0 [..] GPU`` lines."""

    rank: int
    host: str
    pid: int
    device: int
    gpu: str


def strip_prefixes(text: str) -> str:
    """``text`` without launcher prefixes: Open MPI's ``[1,0]<stdout>:`` wherever it is, Slurm's
    ``srun --label`` ``0: `` and Ray's ``(head, rank=0, pid=12) `` at line starts."""
    return _LINE_PREFIX.sub("", _MPI_TAG.sub("", text))


def _log_hosts(text: str) -> set[str]:
    hosts = {m.group(1) for m in _LOG_AT_START.finditer(text)}
    # the hosts nccl-tests names print debug lines too, maybe only glued to something else
    return hosts | {m.group(1) for m in _RANK_HOST.finditer(text)}


def _split_log(text: str) -> tuple[str, list[tuple[int, LogLine]]]:
    """Like :func:`split_log`, each debug line with where it was in the text that is returned."""
    hosts = _log_hosts(text)
    if not hosts:
        return text, []
    alt = "|".join(re.escape(h) for h in sorted(hosts, key=len, reverse=True))
    head = r"(?:\[[^\]\n]{1,64}\] )?(" + alt + r"):(\d+):(\d+) \[(-?\d+)\] "
    # a message ends at its newline, or where another rank's line was glued on
    anywhere = re.compile(head + r"(?:\S+ ){0,3}?NCCL (INFO|WARN|TRACE|ABORT) ?((?:(?!(?:" + alt +
                          r"):\d+:\d+ \[-?\d+\] )[^\n])*)\n?")
    pieces: list[str] = []
    log: list[tuple[int, LogLine]] = []
    at = 0
    size = 0
    for m in anywhere.finditer(text):
        pieces.append(text[at:m.start()])
        size += m.start() - at
        at = m.end()
        if m.group(0).endswith("\n") and _whole_row(text[text.rfind("\n", 0, m.start()) + 1:m.start()]):
            at -= 1  # glued after a row's last column: the row's own line ends there
        log.append((size, LogLine(m.group(1), int(m.group(2)), int(m.group(4)), m.group(5), m.group(6).strip())))
    pieces.append(text[at:])
    return "".join(pieces), log


def _whole_row(head: str) -> bool:
    """Whether a line's text before a glued debug line is a table row with all its columns (the
    fewest any layout has is 11); nccl-tests prints a row in parts: 5 columns, then 4, then 4."""
    toks = head.split()
    return len(toks) >= 11 and toks[0].isdigit() and toks[1].isdigit() and (
        toks[-1] == "N/A" or _NUM.match(toks[-1].rstrip("*")) is not None)


def split_log(text: str) -> tuple[str, list[LogLine]]:
    """``text`` without NCCL's debug lines, and those lines. A debug line that landed inside
    another line (a table row's first columns, a chunk of another rank's output) is cut out and the
    two halves joined again; it is recognised by a host that starts a debug line elsewhere, or
    that nccl-tests' rank lines name."""
    clean, log = _split_log(text)
    return clean, [ln for _, ln in log]


def rank_lines(text: str) -> list[RankLine]:
    """nccl-tests' per-rank device lines, in the order printed."""
    return [RankLine(int(m.group(1)), m.group(4), int(m.group(3)), int(m.group(5)), m.group(6).strip())
            for m in _RANK_LINE.finditer(text)]


def version_from_code(code: int) -> str:
    """``NCCL_VERSION_CODE`` as ``major.minor.patch`` (22809 -> 2.28.9; before 2.9: 2708 -> 2.7.8)."""
    if code >= 10000:
        return f"{code // 10000}.{code % 10000 // 100}.{code % 100}"
    return f"{code // 1000}.{code % 1000 // 100}.{code % 100}"


def library_version(text: str) -> tuple[str, str]:
    """The NCCL that ran and the CUDA it was built for, as the output says: NCCL's own ``NCCL
    version 2.28.9+cuda12.8`` line, else nccl-tests' ``nccl-library=22809``; ``""`` when unsaid."""
    m = _NCCL_VERSION.search(text)
    if m:
        return m.group(1), m.group(2) or ""
    m = _LIBRARY.search(text)
    return (version_from_code(int(m.group(1))), "") if m else ("", "")


def perf_timeout(text: str) -> tuple[str, int] | None:
    """``(host, seconds)`` when nccl-tests' own ``-T`` timeout ended the run."""
    m = _TEST_TIMEOUT.search(text)
    return (m.group(1), int(m.group(2))) if m else None


class NcclTestsError(ValueError):
    """A file that is not a complete, correct nccl-tests run."""


@dataclass(frozen=True)
class Result:
    """One out-of-place or in-place measurement. ``error`` is the maximum error that nccl-tests
    printed before it counted wrong elements (its ``error`` column, e.g. ``2e-07``)."""

    time_us: float
    algbw_gbps: float
    busbw_gbps: float
    wrong: int | None
    error: float | None = None


@dataclass(frozen=True)
class Record:
    """One row of an nccl-tests table."""

    collective: str
    nbytes: int
    count: int
    dtype: str
    redop: str
    root: int
    out_of_place: Result | None
    in_place: Result | None
    env: dict[str, str] = field(default_factory=dict, compare=False)

    @property
    def times_us(self) -> list[float]:
        return [r.time_us for r in (self.out_of_place, self.in_place) if r is not None]


@dataclass
class Run:
    """A whole nccl-tests run (or, from :func:`parse_stdout` on a file of several, all of them:
    see :attr:`runs`)."""

    collective: str
    records: list[Record]
    env: dict[str, str]
    nranks: int
    source: str
    version: str = ""
    graph: bool = False
    warnings: list[str] = field(default_factory=list)
    library: str = ""  # the NCCL that ran (``version`` is nccl-tests')
    cuda: str = ""
    ranks: list[RankLine] = field(default_factory=list)
    log: list[LogLine] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # what the parser had to allow for (strict=False)
    runs: list[Run] = field(default_factory=list, repr=False)  # the runs of a file of several


def _number(tok: str, what: str, line_no: int, source: str) -> float:
    t = tok.strip().replace(",", "")
    if t.upper() in ("N/A", "NA", "-"):
        return math.nan
    if _NUM.match(t):
        return float(t)
    if t.lower() in ("nan", "inf", "-inf"):
        return float(t)
    raise NcclTestsError(f"{source}:{line_no}: {what}: not a number: {tok!r}")


def _wrong(tok: str, line_no: int, source: str) -> int | None:
    v = _number(tok, "#wrong", line_no, source)
    if math.isnan(v):
        return None
    return int(v)


def _collective_from_program(program: str) -> str:
    name = Path(program).name
    return PROGRAM_COLLECTIVES.get(name, name.removesuffix("_perf"))


@dataclass(frozen=True)
class _Layout:
    """Which columns a table row has, from the table's header."""

    lead: tuple[str, ...] = _LEAD
    time: str = "time"
    wrong: str = "#wrong"  # or "error": a maximum error, not a count
    per_iter: bool = False

    @property
    def group(self) -> int:
        return 4 + 4 * self.per_iter


_DEFAULT_LAYOUT = _Layout()


def _header_layout(toks: list[str]) -> _Layout | None:
    """The layout a column-header line (``size count type redop root time algbw ...``) names."""
    if len(toks) < 6 or toks[0] != "size" or toks[1] != "count":
        return None
    first = next((i for i, t in enumerate(toks) if t in _TIME_COLS), None)
    if first is None or first < 2 or not set(toks[:first]) <= set(_LEAD):
        return None
    rest = toks[first:]
    if len(rest) < 4 or rest[1:3] != ["algbw", "busbw"] or rest[3] not in _WRONG_COLS:
        return None
    return _Layout(tuple(toks[:first]), rest[0], "error" if "error" in rest[3] else "#wrong",
                   rest[4:8] == list(_PER_ITER))


@dataclass
class _Draft:
    """A run while it is read."""

    start: int
    collective: str = ""
    version: str = ""
    graph: bool = False
    layout: _Layout | None = None
    headed: bool = False  # nccl-tests' opening lines were seen
    records: list[Record] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    ranks: set[int] = field(default_factory=set)
    rank_lines: list[RankLine] = field(default_factory=list)
    avg_seen: bool = False
    concluded: bool = False
    cut: str = ""
    end: int = -1

    @property
    def tabled(self) -> bool:
        return self.layout is not None or bool(self.records)

    @property
    def complete(self) -> bool:
        return self.avg_seen or self.concluded


def _row(toks: list[str], layout: _Layout, line_no: int, source: str, collective: str,
         env: dict[str, str]) -> Record | None:
    """A table row in ``layout``; ``None`` when it is cut short (only its first columns)."""
    g = layout.group
    names = layout.lead
    if "redop" in names and len(toks) == len(names) + 2 * g - 1 and _NUM.match(toks[names.index("redop")]):
        names = tuple(n for n in names if n != "redop")  # printed blank (AlltoAll before 2.10)
    lead = dict(zip(names, toks, strict=False))
    rest = toks[len(names):]
    if len(rest) < 2 * g:
        return None

    def result(vals: list[str]) -> Result:
        t, a, b = (_number(v, w, line_no, source) for v, w in zip(vals[:3], ("time", "algbw", "busbw"),
                                                                   strict=True))
        if layout.wrong == "error":
            e = _number(vals[3].rstrip("*"), "error", line_no, source)
            return Result(t, a, b, None, None if math.isnan(e) else e)
        return Result(t, a, b, _wrong(vals[3], line_no, source))

    root_tok = lead.get("root", "-1")
    root = int(root_tok) if re.fullmatch(r"-?\d+", root_tok) else -1
    return Record(collective, int(toks[0]), int(toks[1]), lead.get("type", ""), lead.get("redop", ""), root,
                  result(rest[:g]), result(rest[g:2 * g]), env)


def _row_start(toks: list[str], layout: _Layout) -> bool:
    """Whether a line starts like a table row of ``layout``: size and count, then the type."""
    if len(toks) < 3 or not toks[0].isdigit() or not toks[1].isdigit():
        return False
    n = len(layout.lead)
    if len(toks) >= n:
        lead = dict(zip(layout.lead, toks, strict=False))
        if "type" in lead and not re.fullmatch(r"[A-Za-z][A-Za-z0-9_]*", lead["type"]):
            return False
        if "root" in lead and not re.fullmatch(r"-?\d+", lead["root"]):
            return False
        return "redop" not in lead or re.fullmatch(r"[A-Za-z][A-Za-z0-9_]*|[\d.]+", lead["redop"]) is not None
    return re.fullmatch(r"[A-Za-z][A-Za-z0-9_]*", toks[2]) is not None


def _env_from_line(line: str) -> list[tuple[str, str]]:
    m = _ENV_DUMP.match(line)
    if m:
        return [(m.group(1), m.group(2))]
    if "_perf" in line or "mpirun" in line or "srun" in line:  # a command line printed with the output
        return [(m.group(1), m.group(2)) for m in _ENV_ARG.finditer(line)]
    return []


def _read_runs(text: str, source: str) -> tuple[list[_Draft], list[tuple[int, LogLine]], str]:
    """The runs of a standard output, as drafts, with NCCL's debug lines (each with where it was)
    and the text without them."""
    text = strip_prefixes(text.replace("\r\n", "\n").replace("\r", "\n").lstrip("\ufeff"))
    text, log = _split_log(text)
    drafts: list[_Draft] = []
    cur: _Draft | None = None
    pending: dict[str, str] = {}  # environment printed before the run it belongs to
    program = ""  # a program named before the run it belongs to (a command line)
    layout = _DEFAULT_LAYOUT
    at = 0
    for line_no, raw in enumerate(text.split("\n"), 1):
        pos, at = at, at + len(raw) + 1
        line = raw.strip()
        if not line:
            continue
        m = _ENV_LINE.search(line)
        if m:
            (cur.env if cur is not None and not cur.complete else pending)[m.group(1)] = m.group(2)
            continue
        m = _WARN_LINE.search(line)
        if m:
            w = f"{source}:{line_no}: {m.group(1).strip()}"
            (cur.warnings if cur is not None else drafts[-1].warnings if drafts else []).append(w)
            continue
        body = line.lstrip("#").strip()
        toks = body.split()
        starts = body.startswith(("nccl-tests version", "Collective test starting:", "nThread "))
        new_layout = _header_layout(toks) if toks and toks[0] == "size" else None
        if starts or new_layout is not None:
            if cur is None or cur.tabled or cur.complete or (new_layout is not None and cur.layout is not None):
                cur = _Draft(pos, collective=_collective_from_program(program) if program else "")
                drafts.append(cur)
                cur.env.update(pending)
                pending, program = {}, ""
            if new_layout is not None:
                cur.layout = layout = new_layout
                continue
            cur.headed = True
            if body.startswith("Collective test starting:"):
                cur.collective = _collective_from_program(body.split(":", 1)[1].strip())
            elif body.startswith("nccl-tests version"):
                cur.version = body.split()[2]
            else:
                gm = re.search(r"graph:\s*(\d+)", body)
                cur.graph = bool(gm and int(gm.group(1)))
            continue
        if cur is not None and body.startswith("Avg bus bandwidth"):
            cur.avg_seen = True
            cur.end = pos
            continue
        if cur is not None and body.startswith("Collective test concluded:"):
            cur.concluded = True
            cur.end = pos
            if not cur.collective:
                cur.collective = _collective_from_program(body.split(":", 1)[1].strip())
            continue
        if line.startswith("#") or body.startswith("Rank "):
            rm = re.match(r"Rank\s+(\d+)\s", body)
            if rm and cur is not None:
                cur.ranks.add(int(rm.group(1)))
            continue
        pm = _PROGRAM.search(line)
        if pm and not _row_start(toks, layout):
            if cur is not None and not cur.tabled and not cur.complete:
                cur.collective = cur.collective or _collective_from_program(pm.group(1))
            else:
                program = pm.group(1)
        env = _env_from_line(line)
        if env:
            target = cur.env if cur is not None and not cur.tabled and not cur.complete else pending
            target.update(env)
            continue
        if not _row_start(toks, layout):
            continue  # chatter: the launcher's, the shell's, a Markdown page's
        if cur is None or cur.complete:
            # rows with no header in sight: a table shown without its opening lines
            cur = _Draft(pos, collective=_collective_from_program(program) if program else "")
            drafts.append(cur)
            cur.env.update(pending)
            pending, program = {}, ""
        rec = _row(toks, layout, line_no, source, cur.collective, cur.env)
        if rec is None:
            cur.cut = f"{source}:{line_no}: row cut short: {line!r}"
            cur.notes.append(f"{cur.cut} (left out)")
            continue
        cur.records.append(rec)
        cur.end = pos
    if pending and drafts:
        for k, v in pending.items():
            drafts[-1].env.setdefault(k, v)
    return drafts, log, text


def _finish(d: _Draft, text: str, log: list[LogLine], source: str, library: str, cuda: str) -> Run:
    for ln in log:
        m = _ENV_MSG.match(ln.message)
        if ln.level == "INFO" and m:
            d.env[m.group(1)] = m.group(2)
        elif ln.level in ("WARN", "ABORT"):
            d.warnings.append(f"{source}: {ln.host}:{ln.pid} [{ln.dev}]: {ln.message}")
    records = [Record(d.collective, r.nbytes, r.count, r.dtype, r.redop, r.root, r.out_of_place, r.in_place,
                      d.env) for r in d.records]
    if d.tabled and not d.complete:
        last = f"last size {records[-1].nbytes} B, " if records else ""
        d.notes.append(f"{source}: no closing summary ({last}killed, hung, out of time, or an excerpt?): "
                       f"{len(records)} rows kept")
    if not d.tabled:
        d.notes.append(f"{source}: a run that printed no table")
    return Run(collective=d.collective, records=records, env=d.env, nranks=len(d.ranks), source=source,
               version=d.version, graph=d.graph, warnings=d.warnings, library=library, cuda=cuda,
               ranks=rank_lines(text), log=log, notes=d.notes)


def parse_runs(text: str, source: str = "<stdout>", strict: bool = True) -> list[Run]:
    """Every run in nccl-tests' standard output, in order (a file may hold several: a script that
    ran one test after another, ranks that each ran alone). NCCL's debug lines anywhere in it are
    set aside (:func:`split_log`) and handed to the run they were printed in."""
    library, cuda = library_version(text)
    drafts, log, clean = _read_runs(text, source)
    bounds = [d.start for d in drafts[1:]]
    runs = []
    for i, d in enumerate(drafts):
        lo = d.start if i else -1
        hi = bounds[i] if i < len(bounds) else len(clean) + 1
        mine = [ln for at, ln in log if (lo <= at or i == 0) and at < hi]
        part = clean[d.start:hi] if i else clean[:hi]
        runs.append(_finish(d, part, mine, source, library, cuda))
    if strict:
        if not any(r.records for r in runs):
            _check(runs[0] if runs else Run("", [], {}, 0, source), complete=True, cut="")
        for r, d in zip(runs, drafts, strict=True):
            _check(r, complete=d.complete, cut=d.cut)
    tabled = [r for r, d in zip(runs, drafts, strict=True) if d.tabled]
    if tabled and len(tabled) < len(runs):  # a run that stopped before its table: said, not returned
        said = [n for r, d in zip(runs, drafts, strict=True) if not d.tabled for n in r.notes]
        tabled[0].notes.extend(said)
        runs = tabled
    if not runs:
        run = Run("", [], {}, 0, source, library=library, cuda=cuda, log=[ln for _, ln in log])
        run.notes.append(f"{source}: no result rows")
        runs = [run]
    return runs


def merge_runs(runs: list[Run]) -> Run:
    """One :class:`Run` holding every row of ``runs`` (each row keeps its collective and
    environment); the runs themselves in :attr:`Run.runs`."""
    if len(runs) == 1:
        return runs[0]
    first = runs[0]
    colls = {r.collective for r in runs if r.records}
    ranks = [x for r in runs for x in r.ranks]
    return Run(collective=colls.pop() if len(colls) == 1 else first.collective,
               records=[rec for r in runs for rec in r.records], env=first.env,
               nranks=max(r.nranks for r in runs), source=first.source, version=first.version,
               graph=first.graph, warnings=[w for r in runs for w in r.warnings], library=first.library,
               cuda=first.cuda, ranks=ranks, log=[ln for r in runs for ln in r.log],
               notes=[n for r in runs for n in r.notes], runs=list(runs))


def parse_stdout(text: str, source: str = "<stdout>", strict: bool = True) -> Run:
    """Parse nccl-tests' standard output (its table, header and footer); NCCL's debug lines
    anywhere in it are set aside (:func:`split_log`). A file of several runs gives them all as one
    :class:`Run` (see :func:`parse_runs` for each on its own)."""
    return merge_runs(parse_runs(text, source, strict))


def parse_json(text: str, source: str = "<json>", strict: bool = True) -> Run:
    """Parse the ``-J`` JSON report (nccl-tests >= 2.17)."""
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as e:
        raise NcclTestsError(f"{source}: truncated or malformed JSON ({e.msg} at line {e.lineno})") from None
    if not isinstance(doc, dict):
        raise NcclTestsError(f"{source}: not an nccl-tests JSON report")
    args = doc.get("args") or [""]
    collective = _collective_from_program(str(args[0]))
    env = {}
    for item in doc.get("env") or []:
        if isinstance(item, str) and item.startswith("NCCL_") and "=" in item:
            k, v = item.split("=", 1)
            env[k] = v
    records = []
    for i, row in enumerate(doc.get("results") or []):
        def result(key: str, row: dict = row, i: int = i) -> Result | None:
            r = row.get(key)
            if r is None:
                return None
            t = r.get("time", r.get("cpu_time"))
            vals = []
            for name, v in (("time", t), ("alg_bw", r.get("alg_bw")), ("bus_bw", r.get("bus_bw"))):
                if isinstance(v, str):
                    v = _number(v, name, i + 1, source)
                if v is None:
                    raise NcclTestsError(f"{source}: results[{i}].{key}.{name} missing")
                vals.append(float(v))
            w = r.get("nwrong")
            return Result(vals[0], vals[1], vals[2], None if w is None else int(float(w)))
        root = row.get("root", -1)
        root = int(root) if isinstance(root, (int, float)) or (isinstance(root, str) and
                                                               re.fullmatch(r"-?\d+", root)) else -1
        records.append(Record(collective, int(row["size"]), int(row["count"]), str(row.get("type", "")),
                              str(row.get("redop", "")), root, result("out_of_place"), result("in_place"),
                              env))
    cfg = doc.get("config") or {}
    devices = doc.get("devices") or []
    errors = [str(e) for e in doc.get("errors") or []]
    run = Run(collective=collective, records=records, env=env, nranks=len(devices), source=source,
              version=str(doc.get("version", "")), graph=bool(cfg.get("graph", 0)), warnings=errors)
    if strict:
        _check(run, complete="end_time" in doc and "results" in doc)
    return run


def _check(run: Run, complete: bool, cut: str = "") -> None:
    if run.warnings:
        raise NcclTestsError(f"{run.source}: NCCL reported errors: {run.warnings[0]}")
    if not run.records:
        raise NcclTestsError(f"{run.source}: no result rows (did the run start?)")
    if cut or not complete:
        raise NcclTestsError(f"{run.source}: truncated run: last size {run.records[-1].nbytes} B, "
                             + (f"then {cut.split(': ', 1)[1]}" if cut else "no closing summary")
                             + " (killed, hung or out of time? lenient reading keeps the rows)")
    for r in run.records:
        for kind, res in (("out-of-place", r.out_of_place), ("in-place", r.in_place)):
            if res is not None and res.wrong:
                raise NcclTestsError(f"{run.source}: {res.wrong} wrong elements ({kind}) at {r.nbytes} B: "
                                     "results are not valid")


def read_text(path: str | Path) -> str:
    """A file's text; bytes that are not UTF-8 become replacement characters."""
    p = Path(path)
    if not p.exists():
        raise NcclTestsError(f"{p}: file not found")
    return p.read_bytes().decode("utf-8", errors="replace")


def parse_file_runs(path: str | Path, strict: bool = True) -> list[Run]:
    """Every run in a stdout capture (:func:`parse_runs`), or the one of a ``-J`` JSON file."""
    text = read_text(path)
    if text.lstrip("\ufeff \t\r\n").startswith("{") and not _STDOUT_MARK.search(text):
        return [parse_json(text.lstrip("\ufeff"), str(path), strict)]
    return parse_runs(text, str(path), strict)


def parse_file(path: str | Path, strict: bool = True) -> Run:
    """Parse a stdout capture or a ``-J`` JSON file (chosen by content); a capture of several runs
    gives them all as one :class:`Run` (:func:`parse_file_runs` gives each)."""
    return merge_runs(parse_file_runs(path, strict))


def env_from_name(stem: str) -> dict[str, str]:
    """The environment our shared data names a file by (``<program>__<config>``, see
    ``shared/data/h200x4-nccl2.28/README.md``): ``ring_LL_c8`` -> NCCL_ALGO=ring, NCCL_PROTO=LL,
    NCCL_MIN/MAX_NCHANNELS=8; ``c4`` -> channels only; ``buf1048576`` -> NCCL_BUFFSIZE."""
    if "__" not in stem:
        return {}
    cfg = stem.split("__", 1)[1]
    env: dict[str, str] = {}
    parts = cfg.split("_")
    i = 0
    if parts and parts[0].lower() in ("ring", "tree", "pat", "nvls", "nvlstree", "collnetdirect",
                                      "collnetchain"):
        env["NCCL_ALGO"] = parts[0]
        i = 1
        if len(parts) > 1 and parts[1].lower() in ("ll", "ll128", "simple"):
            env["NCCL_PROTO"] = parts[1]
            i = 2
    for part in parts[i:]:
        if re.fullmatch(r"c\d+", part):
            env["NCCL_MIN_NCHANNELS"] = env["NCCL_MAX_NCHANNELS"] = part[1:]
        elif re.fullmatch(r"buf\d+", part):
            env["NCCL_BUFFSIZE"] = part[3:]
    return env


def run_env(run: Run) -> dict[str, Any]:
    """The run's NCCL environment: what the output says, else what its file name says."""
    env = dict(env_from_name(Path(run.source).stem))
    env.update(run.env)
    return env


def env_sources(run: Run) -> dict[str, str]:
    """Where each key of :func:`run_env` came from: ``"output"`` (the run printed it) or
    ``"file name"`` (the fallback, :func:`env_from_name`)."""
    return {k: "output" if k in run.env else "file name" for k in run_env(run)}
