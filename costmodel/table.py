"""Tuner tables in NVIDIA's example-plugin CSV format: reading and matching, as the plugins do.

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


@dataclass
class Row:
    collective: str
    min_bytes: int
    max_bytes: int
    algo: str
    proto: str
    channels: int
    chunk_factor: float
    source: str  # "policy" or "nccl-default"
    default_time_us: float
    time_us: float


@dataclass
class Table:
    topology: Topology
    rows: list[Row]
    conf: dict[str, int] = field(default_factory=dict)
    provenance: dict[str, Any] = field(default_factory=dict)


def file_sha256(path: str | Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def write_table(table: Table, out_dir: Path) -> dict[str, Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    topo = table.topology
    csv_path = out_dir / "nccl_tuner.csv"
    lines = [f"# ncclrl table for {topo.name} ({topo.nodes} nodes, {topo.nranks} ranks), NCCL {topo.nccl.version}",
             "# collective,min_bytes,max_bytes,algorithm,protocol,channels,nNodes,nRanks"]
    for r in table.rows:
        lines.append(f"{r.collective},{r.min_bytes},{r.max_bytes},{r.algo},{r.proto},{r.channels},"
                     f"{topo.nodes},{topo.nranks}")
    csv_path.write_text("\n".join(lines) + "\n")
    json_path = out_dir / "nccl_tuner.json"
    json_path.write_text(json.dumps({"provenance": table.provenance, "nccl_conf": table.conf,
                                     "rows": [r.__dict__ for r in table.rows]}, indent=1))
    conf_path = out_dir / "nccl.conf"
    conf_path.write_text("".join(f"{k}={v}\n" for k, v in sorted(table.conf.items())))
    return {"csv": csv_path, "json": json_path, "conf": conf_path}


CONF_KEYS = {"NCCL_MIN_NCHANNELS": "comm_channels", "NCCL_MAX_NCHANNELS": "comm_channels",
             "NCCL_BUFFSIZE": "buffsize_bytes", "NCCL_SOCKET_NTHREADS": "socket_nthreads",
             "NCCL_NSOCKS_PERTHREAD": "nsocks_perthread", "NCCL_SOCKET_INLINE": "socket_inline_bytes"}


def read_conf(path: str | Path) -> Point:
    """The per-process knobs of an ``nccl.conf`` (KEY=VALUE lines, ``#`` comments) as a Point."""
    knobs: dict[str, int] = {}
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
        knobs[CONF_KEYS[key]] = int(value)
    return Point("allreduce", 1, **knobs)
