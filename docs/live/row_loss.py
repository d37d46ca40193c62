"""Where an exported table loses against the exhaustive sweep, judged on the sweep's own data:
per size, the speedup over NCCL's plain default of the table's row (NCCL's choice where it has
none) under the table's knob setting, next to the best measured configuration under that setting.
The geometric means split the loss to the sweep's optimum into the setting's share (its best over
the optimum) and the rows' share (the table over its setting's best).

    python docs/live/row_loss.py STORE TOPOLOGY TABLE_DIR   # TABLE_DIR: nccl_tuner.csv + nccl.conf

CPU only; reads the store's direct-call sweep (tag ``sweep``, timing ``nccl-*``).
"""

from __future__ import annotations

import sqlite3
import sys
from pathlib import Path

import numpy as np
import pandas as pd

KNOBS = ("NCCL_MAX_NCHANNELS", "NCCL_SOCKET_NTHREADS", "NCCL_NSOCKS_PERTHREAD", "NCCL_SOCKET_INLINE")


def main(store: str, topology: str, table_dir: str) -> None:
    with sqlite3.connect(store) as c:
        f = pd.read_sql("select nbytes, algo, proto, channels, comm_channels, socket_nthreads, nsocks_perthread, "
                        "socket_inline_bytes, median_us from measurements where tag = 'sweep' and status = 'ok' "
                        "and topology = ? and timing like 'nccl-%'", c, params=(topology,))
    knob_cols = ["comm_channels", "socket_nthreads", "nsocks_perthread", "socket_inline_bytes"]
    d = Path(table_dir)
    conf = dict(line.split("=", 1) for line in (d / "nccl.conf").read_text().split())
    knobs = [int(conf.get(k, 0)) for k in KNOBS]
    under = f[(f[knob_cols] == knobs).all(axis=1)].groupby(["nbytes", "algo", "proto", "channels"]).median_us.median()
    plain = f[(f[knob_cols] == 0).all(axis=1) & (f.algo == "default")].groupby("nbytes").median_us.median()
    all_best = f.groupby(knob_cols + ["nbytes"]).median_us.min()
    rows = [r.split(",") for r in (d / "nccl_tuner.csv").read_text().splitlines() if r and not r.startswith("#")]
    out = []
    for s in plain.index:
        r = next((r for r in rows if int(r[1]) <= s <= int(r[2])), None)
        key = ("default", "default", 0) if r is None else (r[3], r[4], 0 if r[5] == "-1" else int(r[5]))
        at = under.xs(s)
        out.append({"nbytes": s, "row": "/".join(map(str, key)), "speedup": plain[s] / at.get(key, np.nan),
                    "best_under_setting": "/".join(map(str, at.idxmin())), "best_speedup": plain[s] / at.min()})
    t = pd.DataFrame(out)
    print(t.round(2).to_string(index=False))
    opt = all_best.unstack("nbytes").apply(lambda x: np.log(plain / x).mean(), axis=1).max()

    def gm(x):
        return float(np.exp(np.log(x).mean()))

    print(f"# table {gm(t.speedup):.3f}x; best under its setting {gm(t.best_speedup):.3f}x; sweep optimum "
          f"{np.exp(opt):.3f}x: rows {gm(t.speedup) / gm(t.best_speedup):.1%} of their setting's best, setting "
          f"{gm(t.best_speedup) / np.exp(opt):.1%} of the optimum")


if __name__ == "__main__":
    if len(sys.argv) != 4:
        sys.exit("usage: python docs/live/row_loss.py STORE TOPOLOGY TABLE_DIR")
    main(*sys.argv[1:])
