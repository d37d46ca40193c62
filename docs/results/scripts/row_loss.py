"""Where an exported table loses against the exhaustive sweep, judged on the sweep's own data:
per size, the speedup over NCCL's plain default of the table's row (NCCL's choice where it has
none) under the table's knob setting, next to the best measured configuration under that setting.
The geometric means split the loss to the sweep's optimum into the setting's share (its best over
the optimum) and the rows' share (the table over its setting's best).

    python docs/results/scripts/row_loss.py STORE TOPOLOGY TABLE_DIR   # TABLE_DIR: nccl_tuner.csv + nccl.conf

CPU only; reads the store's direct-call sweep (tag ``sweep``, ``launch=nccl``). Run from the repository root.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

from ncclrl.costmodel.space import KNOB_FIELDS
from ncclrl.costmodel.table import parse_example_rows, read_conf
from ncclrl.envs.store import Store


def main(store: str, topology: str, table_dir: str) -> None:
    import pandas as pd

    with Store(Path(store)) as st:
        f = st.frame("nccl", topology=topology, tag="sweep", status="ok")
    knob_cols = list(KNOB_FIELDS)
    d = Path(table_dir)
    knobs = list(read_conf(d / "nccl.conf").knobs)
    under = f[(f[knob_cols] == knobs).all(axis=1)].groupby(["nbytes", "algo", "proto", "channels"]).median_us.median()
    plain = f[(f[knob_cols] == 0).all(axis=1) & (f.algo == "default")].groupby("nbytes").median_us.median()
    all_best = f.groupby(knob_cols + ["nbytes"]).median_us.min()
    rows = parse_example_rows((d / "nccl_tuner.csv").read_text())
    out = []
    for s in plain.index:
        r = next((r for r in rows if r["min_bytes"] <= s <= r["max_bytes"]), None)
        key = ("default", "default", 0) if r is None else (r["algo"], r["proto"], max(r["channels"], 0))
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
        sys.exit("usage: python docs/results/scripts/row_loss.py STORE TOPOLOGY TABLE_DIR")
    main(*sys.argv[1:])
