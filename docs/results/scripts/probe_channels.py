"""Probe: under a communicator of 4 channels (NCCL_MIN/MAX_NCHANNELS=4, which 64-256 MiB AllReduce
on h200-2x2-sock needs for >= 4x), does a per-call choice of 2 channels at 8 B-1 MiB run as fast as
the same call under NCCL's own 2-channel communicator? The per-call space of ncclrl's sweep and
fine-tuning offers 0 (NCCL's choice), 1 and the communicator's maximum, so under 4 channels Tree/LL
runs on 1 or 4, and run h200x4-2026-11-22/run2's 4-channel table lost 10-25% at 8-256 B to the 2-channel one.

Both settings have 2 socket threads x 4 sockets and 256 KiB inline (the sweep's best); jobs
alternate A B A B (the machine drifts between jobs). Every sample goes to STORE (tag
``probe-channels``, launch=nccl, eager), a summary CSV to OUT.csv. NRANKS NODES (default 4 2) run
it on another emulated shape of one host (2 2: two "nodes" of one GPU, on a 2-GPU machine; stored
as topology ``h200-2x1-sock``).

    python3 docs/results/scripts/probe_channels.py STORE.sqlite OUT.csv [NRANKS NODES]
"""

from __future__ import annotations

import csv
import sys
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from ncclrl.costmodel import nccl as N  # noqa: E402
from ncclrl.costmodel.noise import summarize
from ncclrl.costmodel.space import (
    Point,  # noqa: E402
    size_grid,  # noqa: E402
)
from ncclrl.costmodel.topology import load_topology  # noqa: E402
from ncclrl.envs.store import Store
from ncclrl.envs.torch_workers import TableWorkers  # noqa: E402

TOPO = "h200-2x2-sock"
SETTINGS = {"4ch": (4, 0, 2, 4, 262144), "2ch": (0, 0, 2, 4, 262144)}
CALLS = {"4ch": [("default", "default", 0), ("tree", "ll", 1), ("tree", "ll", 2), ("tree", "ll", 4)],
         "2ch": [("default", "default", 0), ("tree", "ll", 1), ("tree", "ll", 2)]}


def main() -> int:
    topo = load_topology(TOPO)
    nranks, nodes = (int(sys.argv[3]), int(sys.argv[4])) if len(sys.argv) > 4 else (topo.nranks, topo.nodes)
    name = TOPO if (nranks, nodes) == (topo.nranks, topo.nodes) else f"h200-{nodes}x{nranks // nodes}-sock"
    sizes = size_grid(8, 1 << 20, nranks, N.COLLECTIVES.index("allreduce"))
    store = Store(Path(sys.argv[1]))
    with open(sys.argv[2], "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["job", "setting", "nbytes", "algo", "proto", "channels", "median_us", "ci_lo_us", "ci_hi_us"])
        for job_no, setting in enumerate(["4ch", "2ch", "4ch", "2ch"]):
            kn = SETTINGS[setting]
            pts = [Point("allreduce", s, *c, *kn) for s in sizes for c in CALLS[setting]]
            wk = TableWorkers(nranks, nodes, Point("allreduce", 1, "default", "default", 0, *kn),
                              timing="eager", timeout_s=60, launch="nccl")
            try:
                res = wk.measure(pts, samples=7)
            finally:
                wk.close()
            job = uuid.uuid4().hex[:12]
            for p, r, mode in zip(pts, res, wk.last_modes, strict=True):
                if r:
                    store.add(p, r, backend="torch", topology=name, nccl_version=wk.nccl_version, timing=mode,
                              tag="probe-channels", job=job)
                m = summarize(r) if r else (float("nan"),) * 3
                w.writerow([job_no, setting, p.nbytes, p.algo, p.proto, p.channels, *(round(x, 2) for x in m)])
            f.flush()
            ok = sum(r is not None for r in res)
            print(f"job {job_no} {setting}: {ok}/{len(pts)} points, failures {wk.failures}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
