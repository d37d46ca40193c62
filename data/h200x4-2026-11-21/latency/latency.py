"""NCCL's default AllReduce S-curve on h200-1x4 four ways through our PyTorch workers (calls
through torch.distributed or straight to NCCL, eager or in CUDA graphs) and through the user's
nccl-tests (plain and ``-G``, one process driving 4 GPUs and 4 threads of one GPU each), in one
window: the 8 B latency goal of docs/live.md compares like with like.

    python3 docs/live/latency/latency.py OUT_DIR [NCCLTESTS_DIR]

Order: nccl-tests, our 4 variants, nccl-tests again (the machine drifts). Every sample of ours
goes to OUT_DIR/store.sqlite (tag ``latency:<launch>-<timing>``); nccl-tests' outputs are kept as
text. Writes OUT_DIR/latency.csv (variant, nbytes, time_us: the median over samples or launches).
"""

from __future__ import annotations

import subprocess
import sys
import time
import uuid
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from runners.live_common import NCCL_PREFIX, SAFE_ENV  # noqa: E402
from runners.nccltests import parse_stdout  # noqa: E402
from runners.store import Point, Store  # noqa: E402
from runners.table_backend import TableWorkers  # noqa: E402

from costmodel import nccl as N  # noqa: E402
from costmodel.topology import load_topology  # noqa: E402
from runners.sweep import size_grid  # noqa: E402

TOPO = "h200-1x4"
MAX_BYTES = 256 << 20


def nccltests(binary_dir: Path, out: Path, name: str, args: list[str]) -> list[dict]:
    import os

    cmd = [str(binary_dir / "all_reduce_perf"), "-b", "8", "-e", str(MAX_BYTES), "-f", "2", "-c", "0", *args]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=dict(os.environ, **SAFE_ENV))
    (out / f"nccltests-{name}.txt").write_text(" ".join(cmd) + "\n" + p.stdout + p.stderr)
    run = parse_stdout(p.stdout, source=name)
    print(f"# nccl-tests {name}: exit {p.returncode}, {len(run.records)} sizes, NCCL {run.version}", flush=True)
    return [{"variant": f"nccl-tests {name}", "nbytes": r.nbytes, "time_us": r.out_of_place.time_us}
            for r in run.records if r.out_of_place is not None]


def ours(out: Path, store: Store, launch: str, timing: str, samples: int = 9) -> list[dict]:
    topo = load_topology(TOPO)
    points = [Point("allreduce", s) for s in size_grid(8, MAX_BYTES, topo.nranks, N.ALLREDUCE)]
    logs = out / f"logs-{launch}-{timing}"
    w = TableWorkers(topo.nranks, topo.nodes, None, timing=timing, timeout_s=60, log_dir=logs, launch=launch)
    t0 = time.time()
    res = w.measure(points, samples=samples)
    job, rows = uuid.uuid4().hex[:12], []
    for p, smp, mode in zip(points, res, w.last_modes, strict=True):
        if smp is None:
            continue
        store.add(p, smp, backend="torch", topology=TOPO, nccl_version=w.nccl_version, timing=mode,
                  tag=f"latency:{launch}-{timing}", job=job)
        rows.append({"variant": f"ours {launch}-{mode.removeprefix(NCCL_PREFIX)}", "nbytes": p.nbytes,
                     "time_us": float(np.median(smp))})
    print(f"# ours launch={launch} timing={timing}: {len(rows)}/{len(points)} sizes, {time.time() - t0:.0f} s, "
          f"modes {sorted(set(w.last_modes))}, failures {w.failures}", flush=True)
    return rows


def main() -> int:
    import pandas as pd

    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    nt = Path(sys.argv[2]) if len(sys.argv) > 2 else None
    store = Store(out / "store.sqlite")
    rows: list[dict] = []
    nt_runs = {"g4": ["-g", "4"], "g4-G": ["-g", "4", "-G", "10"], "t4": ["-t", "4", "-g", "1"],
               "t4-G": ["-t", "4", "-g", "1", "-G", "10"]}
    if nt:
        for name, a in nt_runs.items():
            rows += nccltests(nt, out, name, a)
    for launch, timing in (("torch", "eager"), ("nccl", "eager"), ("torch", "graph"), ("nccl", "graph")):
        rows += ours(out, store, launch, timing)
    if nt:
        for name, a in nt_runs.items():
            rows += nccltests(nt, out, name + "-again", a)
    df = pd.DataFrame(rows)
    df.to_csv(out / "latency.csv", index=False)
    wide = df.pivot_table(index="nbytes", columns="variant", values="time_us")
    with pd.option_context("display.width", 250, "display.max_columns", 30):
        print(wide.round(1).to_string())
    return 0


if __name__ == "__main__":
    sys.exit(main())
