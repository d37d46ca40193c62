"""How far apart two jobs of one configuration put its geometric mean over the sizes: the noise any
choice between knob settings measured in one job each is made in.

For each topology and collective with recorded validations, NCCL's plain defaults measured in
consecutive validation jobs of one device command (tag ``validate-base``, started within
``span_s`` of each other, every size present in both) are paired; per pair the mean over sizes of
the log ratio of the job medians is one A/A difference of the geometric mean. Prints its standard
deviation and quantiles of its magnitude (as percent), and what independent per-size noise alone
would give (the per-size spread over sqrt(sizes)): the rest is a shift of the whole job.

    python docs/results/scripts/aa_geomean.py data/h200x4-2026-11-21/store.sqlite \
        data/h200x2-2026-11-22/store.sqlite
"""

from __future__ import annotations

import sys
from itertools import pairwise

import numpy as np
import pandas as pd

from ncclrl.costmodel.noise import log_median
from ncclrl.envs.store import Store


def pairs(frame: pd.DataFrame, span_s: float = 600.0) -> pd.DataFrame:
    """Per consecutive pair of full jobs: the mean log ratio over every size and over 64-256 MiB."""
    frame = frame.assign(lm=[log_median(s) for s in frame.samples_us])
    piv = frame.pivot_table(index="job", columns="nbytes", values="lm")
    start = frame.groupby("job").ts.min().sort_values()
    rows = []
    for (a, ta), (b, tb) in pairwise(start.items()):
        if tb - ta <= span_s and piv.loc[a].notna().equals(piv.loc[b].notna()):
            d = (piv.loc[b] - piv.loc[a]).dropna()
            big = d[(d.index >= 64 << 20) & (d.index <= 256 << 20)]
            rows.append({"all": d.mean(), "big": big.mean() if len(big) else np.nan, "per_size_sd": d.std(ddof=1),
                         "sizes": d.size})
    return pd.DataFrame(rows)


def main(paths: list[str]) -> None:
    print("store | topology | collective | sizes | pairs | sd(log) | |A/A| median, 90%, 95% | independent-only sd | "
          "64-256 MiB sd")
    for path in paths:
        with Store(path) as st:
            df = st.frame(tag="validate-base", algo="default", status="ok")
        df = df[df.job != ""]
        for (topo, coll), f in df.groupby(["topology", "collective"]):
            p = pairs(f)
            if len(p) < 5:
                continue
            q = 100 * (np.exp(np.quantile(p["all"].abs(), [0.5, 0.9, 0.95])) - 1)
            indep = p.per_size_sd.mean() / np.sqrt(p.sizes.iloc[0])
            print(f"{path.rsplit('/', 1)[-1]} | {topo} | {coll} | {p.sizes.iloc[0]} | {len(p)} | "
                  f"{p['all'].std(ddof=1):.3f} | {q[0]:.1f}%, {q[1]:.1f}%, {q[2]:.1f}% | {indep:.3f} | "
                  f"{p['big'].std(ddof=1):.3f}")


if __name__ == "__main__":
    main(sys.argv[1:] or ["data/h200x4-2026-11-21/store.sqlite"])
