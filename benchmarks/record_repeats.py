"""Re-record a host's sweep with several jobs per point, and measure whether a configuration's job
residual persists across repeats inside one job.

    python benchmarks/record_repeats.py sweep store=S.sqlite topology=h200-2x2-sock rounds=3 \
        settings='[{},{socket_inline_bytes:262144}]' [wall_s=480]
    python benchmarks/record_repeats.py in-job store=R.sqlite topology=h200-2x2-sock jobs=2 repeats=2 [every=2]

``sweep``: ``rounds`` rounds; each round measures every point (NCCL's default and every per-call
configuration of the full grid, every size from min_bytes to max_bytes) of each knob setting in
``settings``, one job per setting, stored at once under tag ``sweep-repeat`` (the tag a replay
reads). Rounds go round the settings, so a run stopped by ``wall_s`` leaves each setting measured
about as often.

``in-job``: ``jobs`` jobs of NCCL's default knob setting; in each, every point of every
``every``-th size is measured ``repeats`` times (the repeats run at the size plus 16 bytes times
the repeat: one job cannot force two configurations at one size), stored under tag ``in-job``; the
store's ``job`` column and the rows' order tell the repeats apart. ``ncclrl`` analyses both
(docs/results/confirm.md).

Every other ``key=value`` is a live command's (topology, samples, timing, launch, launcher, ...).
"""

from __future__ import annotations

import json
import logging
import sys
import time
from pathlib import Path

from ncclrl.costmodel import nccl as N
from ncclrl.costmodel.space import Point, call_configs, size_grid
from ncclrl.costmodel.topology import load_topology
from ncclrl.costmodel.units import parse_bytes
from ncclrl.envs.measure import measure_whole
from ncclrl.envs.store import Store
from ncclrl.runners.live import check_launch, live_workers
from ncclrl.runners.sweep import parse_args

KNOBS = ("comm_channels", "buffsize_bytes", "socket_nthreads", "nsocks_perthread", "socket_inline_bytes")


def knob_point(d: dict) -> Point:
    bad = sorted(set(d) - set(KNOBS))
    if bad:
        raise SystemExit(f"settings: unknown knob {bad[0]!r}; allowed: {', '.join(KNOBS)}")
    return Point("allreduce", 1, **{k: int(v) for k, v in d.items()})


def points_of(topo, knobs: Point, colls: list[int], lo: int, hi: int, every: int = 1) -> list[Point]:
    out = []
    for c in colls:
        for s in size_grid(lo, hi, topo.nranks, c)[::every]:
            out += [Point(N.COLLECTIVES[c], s, *key, *knobs.knobs)
                    for key in [("default", "default", 0)] + call_configs(topo, c, knobs, "full")]
    return out


def main(argv: list[str]) -> int:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    mode, rest = argv[0], argv[1:]
    own = {a.split("=", 1)[0]: a.split("=", 1)[1] for a in rest
           if a.split("=", 1)[0] in ("rounds", "settings", "jobs", "repeats", "every")}
    args = parse_args([a for a in rest if a.split("=", 1)[0] not in own] + ["grid=full"])
    topo = load_topology(args["topology"])
    check_launch(args, topo)
    colls = [N.COLLECTIVES.index(c) for c in args["collectives"]]
    lo, hi = parse_bytes(args["min_bytes"]), parse_bytes(args["max_bytes"])
    store = Store(Path(args["store"]))
    deadline = time.time() + float(args["wall_s"]) if float(args["wall_s"]) else None
    jobs = []
    if mode == "sweep":
        import yaml

        settings = [knob_point(d or {}) for d in yaml.safe_load(own.get("settings", "[{}]"))]
        plan = [(r, k) for r in range(int(own.get("rounds", 3))) for k in settings]
        tag = "sweep-repeat"
    elif mode == "in-job":
        plan = [(r, Point("allreduce", 1)) for r in range(int(own.get("jobs", 2)))]
        tag = "in-job"
    else:
        raise SystemExit(f"mode: unknown {mode!r}; allowed: sweep, in-job")
    for r, knobs in plan:
        if deadline is not None and time.time() > deadline:
            logging.info("# wall_s reached: %d of %d jobs ran", len(jobs), len(plan))
            break
        if mode == "sweep":
            pts = points_of(topo, knobs, colls, lo, hi)
        else:
            one = points_of(topo, knobs, colls, lo, hi, int(own.get("every", 2)))
            pts = [p for _ in range(int(own.get("repeats", 2))) for p in one]
        workers = live_workers(args, topo, knobs, timing=args["timing"], timeout_s=float(args["timeout_s"]))
        t0 = time.time()
        try:
            res = measure_whole(workers, pts, store, topo.name, backend="torch", samples=int(args["samples"]),
                                tag=tag, after_hang="retry", deadline=deadline)
        finally:
            workers.close()
        jobs.append({"round": r, "knobs": knobs.env(), "points": len(pts), "measured": sum(x is not None for x in res),
                     "wall_s": round(time.time() - t0, 1)})
        logging.info("# %s", json.dumps(jobs[-1]))
    print(json.dumps({"mode": mode, "jobs": jobs}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
