"""Probe: does NCCL_SOCKET_INLINE (data up to this size rides with the control message on the
proxy thread instead of the socket helper threads) remove the small-message penalty of
NCCL_SOCKET_NTHREADS/NCCL_NSOCKS_PERTHREAD on h200-2x2-sock? NCCL's default call per size,
one job per (inline, knob setting), NCCL's plain defaults first and last. Writes a CSV.

    python3 docs/live/probe_socket_inline.py OUT.csv
"""

import csv
import os
import sys

from runners.store import Point, summarize
from runners.table_backend import TableWorkers

from costmodel import nccl as N
from costmodel.topology import load_topology
from runners.sweep import size_grid


def main() -> None:
    topo = load_topology("h200-2x2-sock")
    sizes = size_grid(8, 256 << 20, topo.nranks, N.COLLECTIVES.index("allreduce"))
    runs = [(0, (0, 0, 0, 0))]
    for inline in (0, 65536, 262144):
        runs += [(inline, (0, 0, 2, 2)), (inline, (4, 0, 2, 2))]
    runs += [(65536, (0, 0, 0, 0)), (0, (0, 0, 0, 0))]
    with open(sys.argv[1], "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["job", "socket_inline_bytes", "comm_channels", "buffsize_bytes", "socket_nthreads",
                    "nsocks_perthread", "nbytes", "median_us", "ci_lo_us", "ci_hi_us"])
        for job, (inline, kn) in enumerate(runs):
            if inline:
                os.environ["NCCL_SOCKET_INLINE"] = str(inline)
            else:
                os.environ.pop("NCCL_SOCKET_INLINE", None)
            k = Point("allreduce", 1, "default", "default", 0, *kn)
            wk = TableWorkers(topo.nranks, topo.nodes, k, timing="eager", timeout_s=90)
            try:
                res = wk.measure([Point("allreduce", s, "default", "default", 0, *kn) for s in sizes], samples=5)
            finally:
                wk.close()
            for s, r in zip(sizes, res, strict=True):
                m = summarize(r) if r else (float("nan"),) * 3
                w.writerow([job, inline, *kn, s, *(round(x, 2) for x in m)])
            f.flush()
            print(f"job {job} inline={inline} knobs={kn}: {sum(r is not None for r in res)}/{len(sizes)}", flush=True)


if __name__ == "__main__":
    main()
