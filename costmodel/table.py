"""Tuned tables: NVIDIA's example-plugin CSV format (read and matched as the plugins do), the
one table type ncclrl writes and reads (:class:`Table`: CSV, JSON, ``nccl.conf``).

Light on purpose (no numpy, no gymnasium): the GPU-side verifier imports it.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import tempfile
from dataclasses import dataclass, field
from importlib.resources import files
from pathlib import Path
from typing import Any

from ncclrl.costmodel.errors import ConfigError
from ncclrl.costmodel.space import Point
from ncclrl.costmodel.topology import Topology


def format_row(collective: str, min_bytes: int | str, max_bytes: int | str, algo: str, proto: str, channels: int,
               nnodes: int = -1, nranks: int = -1) -> str:
    """One line in that format: NCCL's own algorithm and protocol (``algo == "default"``) as
    ``-1,-1``, a channel count <= 0 (NCCL's per-call choice) as ``-1``."""
    a, p = ("-1", "-1") if algo == "default" else (algo, proto)
    return f"{collective},{min_bytes},{max_bytes},{a},{p},{channels if channels > 0 else -1},{nnodes},{nranks}"


def parse_example_rows(text: str) -> list[dict[str, Any]]:
    """Rows as NVIDIA's example plugin reads them (first match wins; lines > 256 chars dropped)."""
    rows = []
    for line in text.splitlines():
        if len(line) > 256 or not line.strip() or line.lstrip().startswith("#"):
            continue
        f = [x.strip() for x in line.split(",")]
        if len(f) < 8:
            raise ValueError(f"too few fields: {line!r}")
        rows.append({"collective": f[0], "min_bytes": int(f[1]), "max_bytes": int(f[2]), "algo": f[3],
                     "proto": f[4], "channels": int(f[5]), "nNodes": int(f[6]), "nRanks": int(f[7])})
    return rows


def lookup(rows: list[dict[str, Any]], collective: str, nbytes: int, nodes: int, nranks: int) -> dict | None:
    for r in rows:
        if r["collective"] == collective and r["min_bytes"] <= nbytes <= r["max_bytes"] and \
                r["nNodes"] in (-1, nodes) and r["nRanks"] in (-1, nranks):
            return r
    return None


# Every rank of a job must apply the same table byte for byte (ranks that decide differently hang
# NCCL); ranks compare this fingerprint of the text they were handed, and the plugin logs the same.
FNV_OFFSET, FNV_PRIME, MASK64 = 0xCBF29CE484222325, 0x100000001B3, (1 << 64) - 1


def fingerprint(text: str | bytes) -> str:
    """FNV-1a (64-bit) of a table's bytes as 16 lowercase hex digits; the plugin computes the same."""
    h = FNV_OFFSET
    for b in text.encode() if isinstance(text, str) else text:
        h = ((h ^ b) * FNV_PRIME) & MASK64
    return f"{h:016x}"


MAX_BYTES = 4294967295  # the last row of a table runs to 4 GiB - 1
CSV_HEADER = "# collective,min_bytes,max_bytes,algorithm,protocol,channels,nNodes,nRanks"


@dataclass
class Row:
    """One row of a tuned table: NCCL runs ``collective`` calls of ``min_bytes``..``max_bytes``
    (inclusive) with this algorithm, protocol and channel count (``default``/``-1``: NCCL's
    own), on communicators of ``nnodes`` nodes and ``nranks`` ranks (-1: any).

    :param source: where the decision comes from: simulator (the zero-shot table), nccl-default, measured
    :param chunk_factor: the policy's chunk factor (0: NCCL's chunk size)
    :param default_time_us: predicted or measured time of NCCL's default at ``min_bytes`` (if known)
    :param time_us: predicted or measured time of this row's decision at ``min_bytes`` (if known)
    """

    collective: str
    min_bytes: int
    max_bytes: int
    algo: str
    proto: str
    channels: int
    chunk_factor: float = 0.0
    source: str = "measured"
    default_time_us: float | None = None
    time_us: float | None = None
    nnodes: int = -1
    nranks: int = -1

    def line(self) -> str:
        return format_row(self.collective, self.min_bytes, self.max_bytes, self.algo, self.proto, self.channels,
                          self.nnodes, self.nranks)


@dataclass
class Table:
    """A tuned table: its rows (``nccl_tuner.csv``), the per-process knobs it needs
    (``nccl.conf``), and where it comes from (the JSON next to them). The one type every producer
    (export, fine-tuning, the baseline tuners) writes and every reader (show, validate, plugin
    verify) reads; rows match as both plugins match them (:meth:`lookup`: the first row wins).

    :param topology: the platform the table is for (rows name its nodes and ranks when written)
    :param rows: the rows, in order
    :param conf: ``nccl.conf``: NCCL variable -> value
    :param provenance: what made the table (written into the JSON)
    :param title: the CSV's first comment line
    """

    topology: Topology | None
    rows: list[Row]
    conf: dict[str, int] = field(default_factory=dict)
    provenance: dict[str, Any] = field(default_factory=dict)
    title: str = "ncclrl table"

    def lookup(self, collective: str, nbytes: int, nodes: int = -1, nranks: int = -1) -> Row | None:
        """The row a communicator of ``nodes`` nodes and ``nranks`` ranks applies to a call of
        ``nbytes``: the first that matches, as both plugins pick it (None: NCCL decides)."""
        for r in self.rows:
            if r.collective == collective and r.min_bytes <= nbytes <= r.max_bytes and \
                    r.nnodes in (-1, nodes) and r.nranks in (-1, nranks):
                return r
        return None

    def shapes(self) -> list[tuple[int, int]]:
        """The communicator shapes ``(nnodes, nranks)`` the rows name, in the order they first
        appear (-1: any)."""
        return list(dict.fromkeys((r.nnodes, r.nranks) for r in self.rows))

    def for_shape(self, nodes: int, nranks: int) -> Table:
        """The rows a communicator of ``nodes`` nodes and ``nranks`` ranks can match (its own and
        those for any shape), in order, with the same ``nccl.conf``, provenance and topology.

        :param nodes: the communicator's node count (NCCL's ``nNodes``)
        :param nranks: the communicator's rank count (NCCL's ``nRanks``)
        """
        rows = [r for r in self.rows if r.nnodes in (-1, nodes) and r.nranks in (-1, nranks)]
        return Table(self.topology, rows, dict(self.conf), dict(self.provenance), self.title)

    def csv_text(self, where: str = "") -> str:
        """The ``nccl_tuner.csv`` text of the rows (a title comment, the header, one row a line)."""
        shapes = self.shapes()
        named = "" if len(shapes) < 2 else "\n# communicator shapes (nNodes x nRanks): " + \
            ", ".join(f"{n}x{r}" for n, r in shapes)
        lines = [f"# {self.title}{where}{named}", CSV_HEADER] + [r.line() for r in self.rows]
        return "\n".join(lines) + "\n"

    def write(self, out_dir: Path, json_name: str = "nccl_tuner.json", extra: dict[str, Any] | None = None,
              ) -> dict[str, Path]:
        """``nccl_tuner.csv``, ``nccl.conf`` and the JSON (``extra`` added to it) into ``out_dir``,
        as one unit (:func:`write_unit`): a reader never sees half a file, and :func:`check_unit`
        (run by :meth:`read`) tells a table beside another write's ``nccl.conf`` from a whole one."""
        out_dir = Path(out_dir)
        topo = self.topology
        where = f" for {topo.name} ({topo.nodes} nodes, {topo.nranks} ranks), NCCL {topo.nccl.version}" if topo else ""
        doc = json.dumps({"provenance": self.provenance, "nccl_conf": self.conf,
                          "rows": [dict(r.__dict__) for r in self.rows], **(extra or {})}, indent=1, default=str)
        conf = "".join(f"{k}={v}\n" for k, v in sorted(self.conf.items()))
        written = write_unit(out_dir, {"nccl.conf": conf, json_name: doc, "nccl_tuner.csv": self.csv_text(where)})
        return {"csv": written["nccl_tuner.csv"], "json": written[json_name], "conf": written["nccl.conf"]}

    @classmethod
    def read(cls, path: str | Path, topology: Topology | None = None) -> Table:
        """A table from ``nccl_tuner.csv`` (with the ``nccl.conf`` beside it, if any) or from its
        JSON; a file that is neither is a one-line :class:`ConfigError`."""
        path = Path(path)
        if not path.is_file():
            raise ConfigError("table", f"file not found: {path}")
        check_unit(path)
        text = path.read_text()
        if path.suffix == ".json":
            try:
                doc = json.loads(text)
                fields_ = set(Row.__dataclass_fields__)
                rows = [Row(**{k: v for k, v in r.items() if k in fields_}) for r in doc["rows"]]
            except (json.JSONDecodeError, KeyError, TypeError) as e:
                raise ConfigError("table", f"{path} is not an ncclrl JSON table ({type(e).__name__}: {e})") from None
            return cls(topology, rows, dict(doc.get("nccl_conf", {})), dict(doc.get("provenance", {})))
        try:
            raw = parse_example_rows(text)
        except ValueError as e:
            raise ConfigError("table", f"{path}: {e}") from None
        rows = [Row(r["collective"], r["min_bytes"], r["max_bytes"], r["algo"], r["proto"], r["channels"],
                    nnodes=r["nNodes"], nranks=r["nRanks"]) for r in raw]
        conf_path = path.with_name("nccl.conf")
        return cls(topology, rows, read_conf_env(conf_path) if conf_path.is_file() else {})


def file_sha256(path: str | Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


CONF_KEYS = {"NCCL_MIN_NCHANNELS": "comm_channels", "NCCL_MAX_NCHANNELS": "comm_channels",
             "NCCL_BUFFSIZE": "buffsize_bytes", "NCCL_SOCKET_NTHREADS": "socket_nthreads",
             "NCCL_NSOCKS_PERTHREAD": "nsocks_perthread", "NCCL_SOCKET_INLINE": "socket_inline_bytes"}


def read_conf_env(path: str | Path) -> dict[str, int]:
    """An ``nccl.conf`` (KEY=VALUE lines, ``#`` comments) as NCCL variable -> value, every variable
    as written (``NCCL_MIN_NCHANNELS`` and ``NCCL_MAX_NCHANNELS`` each); a file that is not UTF-8
    text, a key ncclrl does not set, or a value that is not a whole number >= 1, is a one-line
    :class:`ConfigError` naming the file."""
    env: dict[str, int] = {}
    try:
        text = Path(path).read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise ConfigError(str(path), f"not UTF-8 text (byte {e.object[e.start]:#04x} at offset {e.start}); an "
                          "nccl.conf holds KEY=VALUE lines in ASCII") from None
    except OSError as e:
        raise ConfigError(str(path), f"cannot read: {e.strerror}") from None
    for ln, line in enumerate(text.splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        key, sep, value = line.partition("=")
        key, value = key.strip(), value.strip()
        if not sep or key not in CONF_KEYS:
            raise ConfigError(f"{path}:{ln}", f"unknown setting {key!r}; allowed: {', '.join(CONF_KEYS)}")
        if not value.isdigit() or int(value) < 1:
            raise ConfigError(f"{path}:{ln}:{key}", f"must be a whole number >= 1, got {value!r}")
        env[key] = int(value)
    return env


def read_conf(path: str | Path) -> Point:
    """The per-process knobs of an ``nccl.conf`` as a knob setting. A knob setting holds one channel
    count per communicator (``NCCL_MIN_NCHANNELS`` = ``NCCL_MAX_NCHANNELS``, what ncclrl writes), so
    both bounds given and different (a range, within which NCCL picks) is a one-line
    :class:`ConfigError`; one bound alone is taken as that count."""
    env = read_conf_env(path)
    lo, hi = env.get("NCCL_MIN_NCHANNELS"), env.get("NCCL_MAX_NCHANNELS")
    if lo is not None and hi is not None and lo != hi:
        raise ConfigError(f"{path}:NCCL_MIN_NCHANNELS", f"NCCL_MIN_NCHANNELS={lo} and NCCL_MAX_NCHANNELS={hi} are a "
                          "range, within which NCCL picks the channel count; ncclrl measures one count per "
                          "communicator (both set to it): set both to one value")
    return Point("allreduce", 1, **{CONF_KEYS[k]: v for k, v in env.items()})


# -- tables written whole ----------------------------------------------------------------------------

MANIFEST = "nccl_tuner.manifest"  # beside the files a table write produced: their fingerprints
MANIFEST_FORMAT = 1


def _replace_file(path: Path, data: bytes) -> None:
    """``path`` holds ``data`` or what it held before, never part of it: a temporary file in the same
    folder, flushed to disk, renamed over ``path``."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_unit(out_dir: Path, texts: dict[str, str]) -> dict[str, Path]:
    """Write the files ``texts`` (name -> content) into ``out_dir`` as one unit, in the order given
    (a table: ``nccl.conf`` first, ``nccl_tuner.csv`` last). First :data:`MANIFEST` is replaced by one
    that says a write is under way, then each file goes to a temporary name and is renamed into place,
    then the manifest is replaced by one naming every file's fingerprint (:func:`fingerprint`) and
    size. A writer that dies midway leaves the "writing" manifest, or files whose fingerprints differ
    from the manifest's: :func:`check_unit` refuses both, so no reader takes a table with another
    write's ``nccl.conf`` for a whole one.

    :param out_dir: the folder (created if needed)
    :param texts: file name -> text
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    data = {name: text.encode() for name, text in texts.items()}
    _replace_file(out_dir / MANIFEST, json.dumps({"format": MANIFEST_FORMAT, "state": "writing",
                                                  "files": sorted(data)}, indent=1).encode() + b"\n")
    for name, blob in data.items():
        _replace_file(out_dir / name, blob)
    files_ = {name: {"fingerprint": fingerprint(blob), "bytes": len(blob)} for name, blob in data.items()}
    table = files_.get("nccl_tuner.csv", {}).get("fingerprint")
    _replace_file(out_dir / MANIFEST, json.dumps({"format": MANIFEST_FORMAT, "state": "complete",
                                                  "fingerprint": table, "files": files_}, indent=1).encode() + b"\n")
    return {name: out_dir / name for name in data}


def check_unit(path: str | Path) -> dict[str, Any] | None:
    """Whether the files of the table write that ``path`` (a table file, or its folder) belongs to
    are whole and of one write: ``None`` when the folder has no :data:`MANIFEST` (written by hand, or
    before manifests), else the manifest; a write that did not finish, or a listed file whose bytes
    differ from what that write put there, is a one-line :class:`ConfigError`."""
    path = Path(path)
    folder = path if path.is_dir() else path.parent
    man = folder / MANIFEST
    if not man.is_file():
        return None
    try:
        doc = json.loads(man.read_text())
        state, listed = doc["state"], doc["files"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ConfigError("table", f"{man} is unreadable ({type(e).__name__}): the table's files may come from "
                          "different writes; write the table again") from None
    if state != "complete":
        raise ConfigError("table", f"{folder}: a write of this table did not finish ({MANIFEST} says {state!r}): "
                          "its files may mix two writes; write the table again")
    for name, meta in listed.items():
        f = folder / name
        if not f.is_file():
            raise ConfigError("table", f"{f} is missing: {MANIFEST} lists it (fingerprint {meta['fingerprint']})")
        got = fingerprint(f.read_bytes())
        if got != meta["fingerprint"]:
            raise ConfigError("table", f"{f} changed after the table was written (fingerprint {got}, {MANIFEST} "
                              f"says {meta['fingerprint']}): it no longer goes with the other files of that write; "
                              f"write the table again (or delete {MANIFEST} to use the files as they are)")
    return doc


# -- the plugin's own reading of a table --------------------------------------------------------------

CHECKER = "ncclrl-table-check"


@dataclass
class RowVerdict:
    """What the plugin does with one line of a table: ``accepted`` (``row`` holds its fields as the
    plugin read them: collective, min_bytes, max_bytes, algorithm, protocol, channels (-1: NCCL's),
    nNodes, nRanks, numPipeOps, regBuff, chunk_bytes) or rejected (``message``: its WARN)."""

    line: int
    accepted: bool
    message: str = ""
    row: tuple | None = None


@dataclass
class TableCheck:
    """A table as the plugin reads it (:func:`check_table`).

    :param source: the file checked
    :param size: its bytes
    :param fingerprint: FNV-1a of its bytes (the plugin's INFO line)
    :param rows: well-formed rows (every communicator shape)
    :param refused: why the plugin refuses the whole table (NCCL decides everything), or ""
    :param verdicts: per row or rejected line, in line order
    :param shapes: the communicator shapes checked, ``(nNodes, nRanks, rows loaded)`` (-1: a value no row names)
    """

    source: str
    size: int = 0
    fingerprint: str = ""
    rows: int = 0
    refused: str = ""
    verdicts: list[RowVerdict] = field(default_factory=list)
    shapes: list[tuple[int, int, int]] = field(default_factory=list)

    @property
    def rejected(self) -> list[RowVerdict]:
        return [v for v in self.verdicts if not v.accepted]

    @property
    def accepted(self) -> list[RowVerdict]:
        return [v for v in self.verdicts if v.accepted]

    @property
    def ok(self) -> bool:
        """The plugin loads every row (nothing refused, nothing rejected)."""
        return not self.refused and not self.rejected

    def summary(self) -> str:
        if self.refused:
            return f"plugin check: refused whole, NCCL decides everything: {self.refused}"
        return (f"plugin check: {self.size} bytes, fingerprint {self.fingerprint}, {len(self.accepted)} rows load, "
                f"{len(self.rejected)} rejected")


def plugin_checker(build_dir: str | Path | None = None) -> Path:
    """The program that reads a table with the plugin's own code (``plugin/table_check.c`` compiled
    with ``ncclrl_tuner.c``), built from the installed sources into ``build_dir`` (default: where
    ``ncclrl plugin build`` puts the plugin, ``$NCCLRL_PLUGIN_DIR`` or ``~/.cache/ncclrl/plugin``)
    when missing or older than its sources; a failed build is a one-line :class:`ConfigError`."""
    src = Path(str(files("ncclrl") / "plugin"))
    out = Path(build_dir or os.environ.get("NCCLRL_PLUGIN_DIR", "~/.cache/ncclrl/plugin")).expanduser().resolve()
    out.mkdir(parents=True, exist_ok=True)
    try:
        p = subprocess.run(["make", "--no-print-directory", "-C", str(src), f"BUILD={out}", str(out / CHECKER)],
                           capture_output=True, text=True, timeout=300)
    except (OSError, subprocess.SubprocessError) as e:
        raise ConfigError("plugin", f"cannot build the table checker ({e}): it needs make and a C compiler") from None
    if p.returncode != 0:
        last = (p.stderr or p.stdout).strip().splitlines()[-1:] or ["make failed"]
        raise ConfigError("plugin", f"building the table checker failed: {last[0]}")
    return out / CHECKER


def check_table(path: str | Path, checker: str | Path | None = None) -> TableCheck:
    """Read the table file ``path`` with the plugin's own code (:func:`plugin_checker`): the same
    file checks (a regular file, at most 16 MiB, no NUL byte), parser and per-communicator rules
    (overlaps, filter limit) for every communicator shape the table can meet. Nothing is
    re-implemented here, so what this reports is what NCCL's ranks will load.

    :param path: the CSV table
    :param checker: the checker program (default: :func:`plugin_checker`)
    """
    prog = Path(checker) if checker else plugin_checker()
    try:
        p = subprocess.run([str(prog), str(path)], capture_output=True, text=True, timeout=120, errors="replace")
    except (OSError, subprocess.SubprocessError) as e:
        raise ConfigError("plugin", f"the table checker failed on {path}: {e}") from None
    lines = p.stdout.splitlines()
    if p.returncode != 0 or not lines or lines[0] != f"{CHECKER}\t1":
        raise ConfigError("plugin", f"the table checker failed on {path}: {(p.stderr or p.stdout).strip()[:200]}")
    out = TableCheck(str(path))
    for line in lines[1:]:
        kind, _, rest = line.partition("\t")
        f = rest.split("\t")
        if kind == "table":
            out.size, out.fingerprint, out.rows = int(f[0]), f[1], int(f[2])
        elif kind == "refused":
            out.refused = rest
        elif kind == "shape":
            out.shapes.append((int(f[0]), int(f[1]), int(f[2])))
        elif kind == "accepted":
            row = (f[1], int(f[2]), int(f[3]), f[4], f[5], *map(int, f[6:12]))
            out.verdicts.append(RowVerdict(int(f[0]), True, "", row))
        elif kind == "rejected":
            out.verdicts.append(RowVerdict(int(f[0]), False, rest.partition("\t")[2]))
    return out


def check_text(text: str | bytes, checker: str | Path | None = None) -> TableCheck:
    """:func:`check_table` on a table's text (through a temporary file)."""
    with tempfile.TemporaryDirectory(prefix="ncclrl-check-") as d:
        path = Path(d) / "nccl_tuner.csv"
        path.write_bytes(text.encode() if isinstance(text, str) else text)
        res = check_table(path, checker)
    res.source = "<text>"
    res.refused = res.refused.replace(str(path), "the table")
    return res
