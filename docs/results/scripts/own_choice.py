"""Where a fine-tuned table runs NCCL's own choice under its knob setting (no row for the size), how
that choice fared against NCCL's plain defaults in every validation in the store.

Each validated table is found by the 12-hex-digit sha256 in its validation's tag among the
committed ``data/**/nccl_tuner.csv``; its ``nccl.conf`` gives the knob setting. Per table and
size, ``validate measure=0`` pools all its rounds (both sides' jobs, the between-job interval).
Prints, per knob setting and size, how many tables ran NCCL's own choice there, the geometric mean of
their pooled speedups, and how many were judged slower or faster.

    python docs/results/scripts/own_choice.py data/h200x4-2026-11-21/store.sqlite h200-2x2-sock
"""

from __future__ import annotations

import hashlib
import os
import sqlite3
import sys
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd

from ncclrl.costmodel.table import lookup, parse_example_rows
from ncclrl.costmodel.topology import Topology, load_topology
from ncclrl.runners.validate import parse_args, run_validate

LIVE = Path(__file__).resolve().parent


def tables() -> dict[str, Path]:
    return {hashlib.sha256(p.read_bytes()).hexdigest()[:12]: p for p in LIVE.rglob("nccl_tuner.csv")}


def uncovered(table: Path, sizes: list[int], topo: Topology) -> list[int]:
    """The AllReduce sizes where the plugin finds no row of ``table``: NCCL's own choice runs."""
    rows = parse_example_rows(table.read_text())
    return [s for s in sizes if lookup(rows, "allreduce", s, topo.nodes, topo.nranks) is None]


def main(store: str, topology: str) -> None:
    with sqlite3.connect(store) as con:
        tags = [t for (t,) in con.execute("select distinct tag from measurements where topology = ? and collective = "
                                          "'allreduce' and tag like 'validate-tuned:%' and timing like 'nccl-%'",
                                          (topology,))]
    known, out, topo = tables(), [], load_topology(topology)
    for tag in tags:
        sha = tag.split(":", 1)[1]
        if sha not in known:
            continue
        t = known[sha]
        conf = (t.parent / "nccl.conf").read_text().split() if (t.parent / "nccl.conf").exists() else []
        setting = " ".join(c.replace("NCCL_", "") for c in conf if not c.startswith("NCCL_MAX")) or "defaults"
        with tempfile.TemporaryDirectory() as d, open(os.devnull, "w") as quiet:
            v = run_validate(parse_args([f"table={t}", f"conf={t.parent / 'nccl.conf'}", "measure=0",
                                         f"topology={topology}", f"store={store}", f"out={d}/v.csv"]),
                             out=quiet)
        for s in uncovered(t, sorted(v.nbytes), topo):
            r = v[v.nbytes == s].iloc[0]
            out.append({"setting": setting, "nbytes": s, "table": str(t.parent.relative_to(LIVE)),
                        "speedup": r.speedup, "verdict": r.verdict, "jobs": r.jobs})
    f = pd.DataFrame(out)
    g = f.groupby(["setting", "nbytes"]).agg(tables=("table", "count"),
                                               speedup=("speedup", lambda x: float(np.exp(np.log(x).mean()))),
                                               slower=("verdict", lambda x: int((x == "slower").sum())),
                                               faster=("verdict", lambda x: int((x == "faster").sum())))
    pd.set_option("display.width", 200)
    print(g.round(2).to_string())


if __name__ == "__main__":
    main(*(sys.argv[1:3] if len(sys.argv) > 2 else ["data/h200x4-2026-11-21/store.sqlite", "h200-2x2-sock"]))
