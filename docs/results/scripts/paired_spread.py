"""How far a row's same-job ratio to NCCL's choice moves between jobs (run h200x4-2026-11-22/run3).

For every job tagged ``guard`` in a store (recorded re-measurements of rows next to NCCL's
choice), the log ratio of NCCL's choice to each row measured next to it (same job, same knob
setting, same size); for each (setting, size, row) seen in two jobs or more,
the spread of that ratio between jobs, pooled per size.

usage: python docs/results/scripts/paired_spread.py STORE TOPOLOGY
"""

from __future__ import annotations

import sys
from collections import defaultdict

import numpy as np

from ncclrl.costmodel.space import KNOB_FIELDS
from ncclrl.envs.store import Store

DEFAULT = ("default", "default", 0)


def main(store: str, topology: str) -> None:
    with Store(store) as s:
        f = s.frame(topology=topology, tag="guard", status="ok")
    by: dict[tuple, dict[tuple, float]] = defaultdict(dict)
    for r in f.itertuples(index=False):
        knobs = tuple(int(getattr(r, k)) for k in KNOB_FIELDS)
        by[(r.job, r.collective, int(r.nbytes), knobs)][(r.algo, r.proto, int(r.channels))] = float(r.median_us)
    pairs: dict[tuple, list[float]] = defaultdict(list)
    for (_job, coll, n, knobs), d in by.items():
        if DEFAULT in d:
            for key, m in d.items():
                if key != DEFAULT:
                    pairs[(coll, n, knobs, key)].append(float(np.log(d[DEFAULT] / m)))
    rep = {k: np.array(v) for k, v in pairs.items() if len(v) >= 2}
    print(f"# {topology}: {len(pairs)} (setting, size, row) pairs in guard jobs, {len(rep)} in two jobs or more")
    ss: dict[tuple, list[float]] = defaultdict(lambda: [0.0, 0])
    for (coll, n, _k, _key), v in rep.items():
        ss[(coll, n)][0] += float(((v - v.mean()) ** 2).sum())
        ss[(coll, n)][1] += v.size - 1
    print("collective,nbytes,sigma_pair_log,df")
    for (coll, n), (sq, df) in sorted(ss.items()):
        print(f"{coll},{n},{np.sqrt(sq / df):.3f},{df}")


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__.strip().splitlines()[-1])
    main(sys.argv[1], sys.argv[2])
