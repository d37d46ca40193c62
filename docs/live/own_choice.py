"""Where a fine-tuned table runs NCCL's own choice under its knob setting (no row for the size), how
that choice fared against NCCL's plain defaults in every validation in the store.

Each validated table is found by the 12-hex-digit sha256 in its validation's tag among the
committed ``docs/live/**/nccl_tuner.csv``; its ``nccl.conf`` gives the knob setting. Per table and
size, ``validate measure=0`` pools all its rounds (both sides' jobs, the between-job interval).
Prints, per knob setting and size, how many tables ran NCCL's own choice there, the geometric mean of
their pooled speedups, and how many were judged slower or faster.

    python docs/live/own_choice.py docs/live/h200x4-2026-11-21.sqlite h200-2x2-sock
"""

from __future__ import annotations

import hashlib
import io
import sqlite3
import sys
from contextlib import redirect_stdout
from pathlib import Path

import numpy as np
import pandas as pd

from runners.validate import main as validate_main

LIVE = Path(__file__).resolve().parent


def tables() -> dict[str, Path]:
    return {hashlib.sha256(p.read_bytes()).hexdigest()[:12]: p for p in LIVE.rglob("nccl_tuner.csv")}


def uncovered(table: Path, sizes: list[int]) -> list[int]:
    rows = [ln.split(",") for ln in table.read_text().splitlines() if ln and not ln.startswith("#")]
    lo_hi = [(int(r[1]), int(r[2])) for r in rows if r[0] == "allreduce"]
    return [s for s in sizes if not any(lo <= s <= hi for lo, hi in lo_hi)]


def main(store: str, topology: str) -> None:
    with sqlite3.connect(store) as con:
        tags = [t for (t,) in con.execute("select distinct tag from measurements where topology = ? and collective = "
                                          "'allreduce' and tag like 'validate-tuned:%' and timing like 'nccl-%'",
                                          (topology,))]
    known, out = tables(), []
    for tag in tags:
        sha = tag.split(":", 1)[1]
        if sha not in known:
            continue
        t = known[sha]
        conf = (t.parent / "nccl.conf").read_text().split() if (t.parent / "nccl.conf").exists() else []
        setting = " ".join(c.replace("NCCL_", "") for c in conf if not c.startswith("NCCL_MAX")) or "defaults"
        csv = Path("/tmp") / f"own-choice-{sha}.csv"
        with redirect_stdout(io.StringIO()):
            validate_main([f"table={t}", f"conf={t.parent / 'nccl.conf'}", "measure=0", f"topology={topology}",
                           f"store={store}", f"out={csv}"])
        v = pd.read_csv(csv)
        for s in uncovered(t, sorted(v.nbytes)):
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
    main(*(sys.argv[1:3] if len(sys.argv) > 2 else ["docs/live/h200x4-2026-11-21.sqlite", "h200-2x2-sock"]))
