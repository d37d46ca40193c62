"""A fine-tuned table judged per size on the recorded h200-2x2-sock sweep it was tuned on (the
sweep's own medians, as ``ncclrl finetune`` counts ``speedup_on_sweep``): its slowest size, the
sizes slower than NCCL's defaults, the size bands; and, for reference, per knob setting the best
table the sweep allows and its slowest size.

    python docs/results/scripts/decision_on_sweep.py OUT        # OUT: a finetune out= folder
"""

import json
import sys
from pathlib import Path

from ncclrl.costmodel import nccl as N
from ncclrl.costmodel.space import Point
from ncclrl.costmodel.topology import load_topology
from ncclrl.runners.finetune import parse_args
from ncclrl.runners.live import (
    SWEEP_BANDS,
    live_problem,
    sizes_on_sweep,
    sweep_reference,
    table_speedup_on_sweep,
)

ENV = {"NCCL_MIN_NCHANNELS": "comm_channels", "NCCL_BUFFSIZE": "buffsize_bytes",
       "NCCL_SOCKET_NTHREADS": "socket_nthreads", "NCCL_NSOCKS_PERTHREAD": "nsocks_perthread",
       "NCCL_SOCKET_INLINE": "socket_inline_bytes"}

info = json.loads(Path(sys.argv[1], "finetune.json").read_text())
topo = load_topology("h200-2x2-sock")
args = parse_args(["backend=replay", "replay_store=data/h200x4-2026-11-21/store.sqlite", "launch=nccl",
                   "topology=h200-2x2-sock"])
problem, sweep = live_problem(args, topo, [N.ALLREDUCE])
ref = sweep_reference(sweep, topo, problem.sizes)
conf = Point("allreduce", 1, **{ENV[k]: int(v) for k, v in info["conf"].items() if k in ENV})
rows = [dict(r, key=tuple(int(x) if x.isdigit() else x for x in r["key"].split("/"))) for r in info["rows"]]
per = sizes_on_sweep(ref, conf, rows, problem.sizes)
got = table_speedup_on_sweep(ref, conf, rows, problem.sizes)
print(f"table: {len(rows)} rows, conf {info['conf'] or 'NCCL defaults'}: {got:.3f}x NCCL's defaults on the sweep, "
      f"{got / ref['optimum']:.3f} of its optimum ({ref['optimum']:.3f}x)")
w = min(per, key=lambda r: r["speedup"])
print(f"slowest size: {w['nbytes']} B {w['speedup']:.3f}x; sizes slower than NCCL's defaults: "
      + (", ".join(f"{r['nbytes']} B {r['speedup']:.3f}x" for r in per if r["speedup"] < 1) or "none"))
for name, lo, hi in SWEEP_BANDS:
    x = table_speedup_on_sweep(ref, conf, rows, problem.sizes, lo, hi)
    print(f"band {name}: " + ("no size" if x is None else f"{x:.3f}x"))
print("per knob setting, the best table the sweep allows (geometric mean, fraction of the optimum, slowest size):")
med = ref["_med"]
for k, g in sorted(ref["per_conf"].items(), key=lambda x: -x[1]):
    worst = min(med[("allreduce", s, "default", "default", 0, "0/0/0/0/0")]
                / min(v for (c, n, *_r, kk), v in med.items() if c == "allreduce" and n == s and kk == k)
                for s in problem.sizes[N.ALLREDUCE])
    print(f"  {k:<16} {g:.3f}x {g / ref['optimum']:.3f} slowest {worst:.3f}x")
