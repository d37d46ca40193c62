"""``ncclrl tune``: run one of the benchmark's tuners on a live (or replayed) platform under a
measurement budget and export its table, as ``ncclrl finetune`` does for ncclrl:

    ncclrl tune method=afnfa backend=torch topology=h200-2x2-sock budget=473 wall_s=240 out=runs/afnfa

``budget`` counts measured points; ``wall_s`` (0: none) stops new measurements after that many
seconds, whatever is left of ``budget``.

Every measurement goes to ``store`` (tag ``tune:<method>``); ``ncclrl validate`` then measures the
exported ``nccl_tuner.csv`` + ``nccl.conf`` afresh through the plugin. ``backend=replay
replay_store=SWEEP.sqlite`` answers from a recorded sweep instead, the one measured with ``launch`` (a
point it lacks is a failure).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

from costmodel import nccl as N
from costmodel.errors import ConfigError
from costmodel.topology import load_topology
from runners.store import Store
from runners.sweep import parse_kv, script_main

DEFAULTS: dict[str, str] = {"method": "", "backend": "torch", "topology": "", "collectives": "allreduce",
                            "min_bytes": "8", "max_bytes": "256M", "budget": "200", "samples": "5", "seed": "0",
                            "checkpoint": "", "store": "runs/tune.sqlite", "replay_store": "", "out": "runs/tune",
                            "timing": "eager", "timeout_s": "120", "wall_s": "0", "launch": "nccl"}


def parse_args(argv: list[str]) -> dict[str, str]:
    from agents.baselines import METHODS
    from runners.finetune import check_backend_args

    args = parse_kv(argv, DEFAULTS, "tune")
    if args["method"] not in METHODS:
        raise ConfigError("method", f"unknown value {args['method']!r}; allowed: {', '.join(METHODS)}")
    check_backend_args(args)
    for k in ("budget", "samples", "seed", "wall_s"):
        if not args[k].isdigit():
            raise ConfigError(k, f"must be a whole number >= 0, got {args[k]!r}")
    if args["method"].startswith("ncclrl") and not Path(args["checkpoint"]).is_file():
        raise ConfigError("checkpoint", f"method {args['method']} needs checkpoint=PATH/policy.zip, "
                          f"got {args['checkpoint']!r}")
    return args


def run_tune(args: dict[str, str], out=sys.stdout) -> dict[str, Any]:
    from agents.baselines import Evaluator, Problem, make_tuner
    from agents.finetune import Outcome, write_outcome
    from runners.cli import parse_bytes
    from runners.finetune import make_measure

    topo = load_topology(args["topology"])
    colls = [N.parse_name("collectives", c, N.COLLECTIVES) for c in args["collectives"].split(",") if c]
    problem = Problem.make(topo, colls, parse_bytes(args["min_bytes"], "min_bytes"),
                           parse_bytes(args["max_bytes"], "max_bytes"))
    sweep = None
    if args["backend"] == "replay":  # the space the recorded sweep covered
        from runners.finetune import recorded_sweep, replay_knobs, replay_noise

        sweep = recorded_sweep(args["replay_store"], topo, args["launch"])
        problem = Problem(topo, colls, problem.sizes, replay_knobs(sweep[sweep.status == "ok"], topo),
                          noise=replay_noise(args["replay_store"], topo, args["launch"], colls, problem.sizes))
    store = Store(Path(args["store"]))
    measure = make_measure(args, topo, store, out)
    tag = f"tune:{args['method']}"
    ev = Evaluator(problem, lambda k, pts, n, _tag: measure(k, pts, n, tag), int(args["budget"]),
                   samples=int(args["samples"]), tag=tag, wall_s=float(args["wall_s"]) or None)
    model = None
    if args["method"].startswith("ncclrl"):
        from agents.pretrain import load_policy

        model = load_policy(args["checkpoint"])
    t0 = time.time()
    d = make_tuner(args["method"], model).tune(problem, ev, int(args["seed"]))
    wall = time.time() - t0
    rows = [{"collective": N.COLLECTIVES[c], "nbytes": s, "key": key} for (c, s), key in sorted(d.rows.items())]
    res = Outcome(conf=d.conf, rows=rows, measured=ev.used, rounds=ev.calls)
    prov = {"method": args["method"], "args": args, "nccl_version": topo.nccl.version, "wall_s": round(wall, 1),
            "jobs": ev.calls}
    paths = write_outcome(res, topo, problem.sizes, Path(args["out"]), prov, title=f"{args['method']} table")
    env = " ".join(f"{k}={v}" for k, v in d.conf.env().items()) or "NCCL defaults"
    print(f"# {args['method']} on {topo.name}: {ev.used} measurements of {ev.budget} in {ev.calls} jobs, "
          f"{wall:.0f} s; knobs: {env}; {len(rows)} rows -> {paths['csv']}", file=out, flush=True)
    summary = {"method": args["method"], "measured": ev.used, "jobs": ev.calls, "wall_s": wall, "rows": len(rows),
               "conf": d.conf.env()}
    if sweep is not None:
        from runners.finetune import sweep_reference, table_speedup_on_sweep

        ref = sweep_reference(sweep, topo, problem.sizes)
        got = table_speedup_on_sweep(ref, d.conf, rows, problem.sizes)
        summary.update(sweep_points=ref["points"], optimum=ref["optimum"], speedup_on_sweep=got,
                       fraction=got / ref["optimum"])
        print(f"# on the sweep's own data: {got:.3f}x vs the sweep optimum {ref['optimum']:.3f}x "
              f"({100 * got / ref['optimum']:.1f}%), with {ev.used} of {ref['points']} measurements", file=out)
    (Path(args["out"]) / "summary.json").write_text(json.dumps(summary, indent=1))
    return summary


def main(argv: list[str] | None = None) -> int:
    return script_main(run_tune, parse_args, argv)


if __name__ == "__main__":
    sys.exit(main())
