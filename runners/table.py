"""Tuner tables in NVIDIA's example-plugin CSV format: reading and matching, as the plugins do.

Light on purpose (no numpy, no gymnasium): the GPU-side verifier imports it.
"""

from __future__ import annotations

from typing import Any


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
