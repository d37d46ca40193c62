"""Tuned tables: NVIDIA's example-plugin CSV format (read and matched as the plugins do), the
one table type ncclrl writes and reads (:class:`Table`: CSV, JSON, ``nccl.conf``).

Light on purpose (no numpy, no gymnasium): the GPU-side verifier imports it.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
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

    def write(self, out_dir: Path, json_name: str = "nccl_tuner.json", extra: dict[str, Any] | None = None,
              ) -> dict[str, Path]:
        """``nccl_tuner.csv``, ``nccl.conf`` and the JSON (``extra`` added to it) into ``out_dir``."""
        out_dir.mkdir(parents=True, exist_ok=True)
        topo = self.topology
        where = f" for {topo.name} ({topo.nodes} nodes, {topo.nranks} ranks), NCCL {topo.nccl.version}" if topo else ""
        paths = {"csv": out_dir / "nccl_tuner.csv", "json": out_dir / json_name, "conf": out_dir / "nccl.conf"}
        shapes = self.shapes()
        named = "" if len(shapes) < 2 else "\n# communicator shapes (nNodes x nRanks): " + \
            ", ".join(f"{n}x{r}" for n, r in shapes)
        lines = [f"# {self.title}{where}{named}", CSV_HEADER] + [r.line() for r in self.rows]
        paths["csv"].write_text("\n".join(lines) + "\n")
        paths["json"].write_text(json.dumps({"provenance": self.provenance, "nccl_conf": self.conf,
                                             "rows": [dict(r.__dict__) for r in self.rows], **(extra or {})},
                                            indent=1, default=str))
        paths["conf"].write_text("".join(f"{k}={v}\n" for k, v in sorted(self.conf.items())))
        return paths

    @classmethod
    def read(cls, path: str | Path, topology: Topology | None = None) -> Table:
        """A table from ``nccl_tuner.csv`` (with the ``nccl.conf`` beside it, if any) or from its
        JSON; a file that is neither is a one-line :class:`ConfigError`."""
        path = Path(path)
        if not path.is_file():
            raise ConfigError("table", f"file not found: {path}")
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
    """An ``nccl.conf`` (KEY=VALUE lines, ``#`` comments) as NCCL variable -> value; a key ncclrl
    does not set, or a value that is not a whole number >= 1, is a one-line :class:`ConfigError`."""
    env: dict[str, int] = {}
    for ln, line in enumerate(Path(path).read_text().splitlines(), 1):
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
    """The per-process knobs of an ``nccl.conf`` as a knob setting."""
    return Point("allreduce", 1, **{CONF_KEYS[k]: v for k, v in read_conf_env(path).items()})
