"""Parse nccl-tests output: the stdout table and the ``-J`` JSON report, into typed records.

Both formats give, per size: the collective, ``nbytes`` (nccl-tests' ``size`` column: the larger
buffer, i.e. the total for AllGather/ReduceScatter), the element count and type, the reduction
op and root, and for out-of-place and in-place runs the time (us), algorithm and bus bandwidth
(GB/s) and the number of wrong elements (``None`` when the check was off, ``-c 0``).

A run that cannot be trusted is an error, never silently half-read: a truncated run (no closing
lines), ``#wrong`` > 0, NCCL ``WARN`` lines, or no rows at all.

Standard output may carry NCCL's own debug lines (``host:pid:tid [dev] NCCL INFO ...``, with
``NCCL_DEBUG=INFO``), from every rank when a launcher merges their outputs. They are taken out
before the table is read (:func:`split_log`), even where one landed inside a table row (nccl-tests
prints a row's first columns before it runs that size, and a launcher forwards other ranks' lines
in whatever chunks it reads); what they say is kept in :attr:`Run.log`.
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
    "sendrecv_perf": "sendrecv",
    "gather_perf": "gather",
    "scatter_perf": "scatter",
    "hypercube_perf": "hypercube",
}

_ENV_LINE = re.compile(r"NCCL INFO (NCCL_[A-Z0-9_]+) set by environment to (\S+)")
_ENV_MSG = re.compile(r"^(NCCL_[A-Z0-9_]+) set by environment to (\S+)")
_WARN_LINE = re.compile(r"NCCL WARN (.*)")
_NUM = re.compile(r"^[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+)?$")
# NCCL's debug line: [timestamp] host:pid:tid [cudaDev] [elapsed] [file:line] NCCL LEVEL message
_LOG_TAIL = r":(\d+):(\d+) \[(-?\d+)\] (?:\S+ ){0,3}?NCCL (INFO|WARN|TRACE|ABORT) ?([^\n]*)\n?"
_LOG_AT_START = re.compile(r"(?m)^(?:\[[^\]\n]{1,64}\] )?([A-Za-z0-9._-]+)" + _LOG_TAIL)
# nccl-tests' per-rank device line (rank 0 prints every rank's)
_RANK_LINE = re.compile(r"#\s*Rank\s+(\d+)\s+Group\s+(\d+)\s+Pid\s+(\d+)\s+on\s+(\S+)\s+device\s+(\d+)"
                        r"\s+\[[^\]]*\]\s*([^\n]*)")
_LIBRARY = re.compile(r"nccl-library=(\d+)")
_NCCL_VERSION = re.compile(r"NCCL version (\d+\.\d+\.\d+)(?:\+cuda(\d+\.\d+))?")
# nccl-tests' -T: "host: Test timeout (5s) common.cu:523"
# (glued to a row's first columns when it struck while that size ran)
_TEST_TIMEOUT = re.compile(r"(?m)^(?:\s*\d+\s+\d+\s+\S+\s+\S+\s+-?\d+(?=\S))?\s*(\S+): Test timeout \((\d+)s\)")


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


def split_log(text: str) -> tuple[str, list[LogLine]]:
    """``text`` without NCCL's debug lines, and those lines. A debug line that landed inside
    another line (a table row's first columns, a chunk of another rank's output) is cut out and the
    two halves joined again; it is recognised by a host that starts a debug line elsewhere."""
    hosts = {m.group(1) for m in _LOG_AT_START.finditer(text)}
    if not hosts:
        return text, []
    alt = "|".join(re.escape(h) for h in sorted(hosts, key=len, reverse=True))
    head = r"(?:\[[^\]\n]{1,64}\] )?(" + alt + r"):(\d+):(\d+) \[(-?\d+)\] "
    # a message ends at its newline, or where another rank's line was glued on
    anywhere = re.compile(head + r"(?:\S+ ){0,3}?NCCL (INFO|WARN|TRACE|ABORT) ?((?:(?!(?:" + alt +
                          r"):\d+:\d+ \[-?\d+\] )[^\n])*)\n?")
    log = [LogLine(m.group(1), int(m.group(2)), int(m.group(4)), m.group(5), m.group(6).strip())
           for m in anywhere.finditer(text)]
    return anywhere.sub("", text), log


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
    """One out-of-place or in-place measurement."""

    time_us: float
    algbw_gbps: float
    busbw_gbps: float
    wrong: int | None


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
    """A whole nccl-tests run."""

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


def parse_stdout(text: str, source: str = "<stdout>", strict: bool = True) -> Run:
    """Parse nccl-tests' standard output (its table, header and footer); NCCL's debug lines
    anywhere in it are set aside (:func:`split_log`)."""
    collective = ""
    version = ""
    graph = False
    records: list[Record] = []
    env: dict[str, str] = {}
    warnings: list[str] = []
    ranks: set[int] = set()
    library, cuda = library_version(text)
    text, log = split_log(text)
    for ln in log:
        m = _ENV_MSG.match(ln.message)
        if ln.level == "INFO" and m:
            env[m.group(1)] = m.group(2)
        elif ln.level in ("WARN", "ABORT"):
            warnings.append(f"{source}: {ln.host}:{ln.pid} [{ln.dev}]: {ln.message}")
    concluded = False
    avg_seen = False
    for line_no, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line:
            continue
        m = _ENV_LINE.search(line)
        if m:
            env[m.group(1)] = m.group(2)
            continue
        m = _WARN_LINE.search(line)
        if m:
            warnings.append(f"{source}:{line_no}: {m.group(1).strip()}")
            continue
        if line.startswith("#"):
            body = line.lstrip("#").strip()
            if body.startswith("Collective test starting:"):
                collective = _collective_from_program(body.split(":", 1)[1].strip())
            elif body.startswith("Collective test concluded:"):
                concluded = True
            elif body.startswith("nccl-tests version"):
                version = body.split()[2]
            elif body.startswith("Avg bus bandwidth"):
                avg_seen = True
            elif body.startswith("nThread"):
                gm = re.search(r"graph:\s*(\d+)", body)
                graph = bool(gm and int(gm.group(1)))
            elif body.startswith("Rank"):
                rm = re.match(r"Rank\s+(\d+)", body)
                if rm:
                    ranks.add(int(rm.group(1)))
            continue
        toks = line.split()
        if len(toks) < 9 or not toks[0].isdigit() or not toks[1].isdigit():
            continue  # NCCL INFO lines and other chatter
        nbytes, count, dtype, redop, root_tok = int(toks[0]), int(toks[1]), toks[2], toks[3], toks[4]
        root = int(root_tok) if re.fullmatch(r"-?\d+", root_tok) else -1
        rest = toks[5:]
        oop = Result(_number(rest[0], "time", line_no, source), _number(rest[1], "algbw", line_no, source),
                     _number(rest[2], "busbw", line_no, source), _wrong(rest[3], line_no, source))
        ip = None
        if len(rest) >= 8 and _NUM.match(rest[4].replace(",", "")):
            ip = Result(_number(rest[4], "time", line_no, source), _number(rest[5], "algbw", line_no, source),
                        _number(rest[6], "busbw", line_no, source), _wrong(rest[7], line_no, source))
        records.append(Record(collective, nbytes, count, dtype, redop, root, oop, ip, env))
    run = Run(collective=collective, records=records, env=env, nranks=len(ranks), source=source,
              version=version, graph=graph, warnings=warnings, library=library, cuda=cuda,
              ranks=rank_lines(text), log=log)
    if strict:
        _check(run, complete=concluded and avg_seen)
    return run


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


def _check(run: Run, complete: bool) -> None:
    if run.warnings:
        raise NcclTestsError(f"{run.source}: NCCL reported errors: {run.warnings[0]}")
    if not run.records:
        raise NcclTestsError(f"{run.source}: no result rows (did the run start?)")
    if not complete:
        raise NcclTestsError(f"{run.source}: truncated run: last size {run.records[-1].nbytes} B, "
                             "no closing summary (killed, hung or out of time?)")
    for r in run.records:
        for kind, res in (("out-of-place", r.out_of_place), ("in-place", r.in_place)):
            if res is not None and res.wrong:
                raise NcclTestsError(f"{run.source}: {res.wrong} wrong elements ({kind}) at {r.nbytes} B: "
                                     "results are not valid")


def parse_file(path: str | Path, strict: bool = True) -> Run:
    """Parse a stdout capture or a ``-J`` JSON file (chosen by content)."""
    p = Path(path)
    if not p.exists():
        raise NcclTestsError(f"{p}: file not found")
    text = p.read_text(errors="replace")
    if text.lstrip().startswith("{"):
        return parse_json(text, str(p), strict)
    return parse_stdout(text, str(p), strict)


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
