"""``ncclrl tune``: run one of the benchmark's tuners on a live (or replayed) platform under a
measurement budget and export its table, as ``ncclrl finetune`` does for ncclrl:

    ncclrl tune method=afnfa backend=torch topology=h200-2x2-sock budget=5min wall_s=240 out=runs/afnfa

``budget`` is GPU-time (``600s``, ``10min``, or ``Nsweep``); ``wall_s`` (0: none) stops new
measurements after that many seconds, whatever is left of ``budget``.

Every measurement goes to ``store`` (tag ``tune:<method>``); ``ncclrl validate`` then measures the
exported ``nccl_tuner.csv`` + ``nccl.conf`` afresh through the plugin. ``backend=replay
replay_store=SWEEP.sqlite`` answers from a recorded sweep instead, the one measured with ``launch``;
the space is then the points it recorded (the same problem ``ncclrl finetune`` replays);
``backend=replay grid=FILE`` answers from a measured grid given as files, as ``ncclrl finetune`` does.
"""

from __future__ import annotations

import importlib
import json
import logging
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from ncclrl.agents.baselines import METHODS, Evaluator, make_tuner
from ncclrl.agents.finetune import Outcome, write_outcome
from ncclrl.agents.plots import plot_table_change, size_changes
from ncclrl.agents.problem import predicted_sweep_gpu_s
from ncclrl.agents.search import PolicyController, strategy_path
from ncclrl.agents.suite import Instance
from ncclrl.costmodel import nccl as N
from ncclrl.costmodel.errors import ConfigError
from ncclrl.costmodel.jobcost import format_gpu_s, parse_budget
from ncclrl.costmodel.topology import load_topology
from ncclrl.costmodel.units import plural
from ncclrl.envs.jobs import ending_on_signals, stop_requested
from ncclrl.envs.replay import replay_noise
from ncclrl.envs.store import Store
from ncclrl.runners.config import Command, parse, register
from ncclrl.runners.live import (
    TunedLiveConfig,
    check_budget,
    check_launch,
    exit_code,
    grid_reference,
    live_problem,
    make_measure,
    sizes_on_sweep,
    sweep_reference,
    table_speedup_on_sweep,
)
from ncclrl.runners.progress import progress

log = logging.getLogger(__name__)

# the tuners that need the extra ``ncclrl[baselines]``, and the modules they import
EXTRA_METHODS = {"afnfa": ("sklearn",), "tpe": ("optuna",)}


def check_extra(methods: list[str], key: str) -> None:
    """The modules the ``methods`` need import, checked before anything is written or trained (one
    line naming the extra otherwise)."""
    for m in methods:
        for module in EXTRA_METHODS.get(str(m), ()):
            try:
                importlib.import_module(module)
            except ImportError:
                raise ConfigError(key, f"method {m} needs {module}, which is not installed: "
                                  'pip install "ncclrl[baselines]"; or choose another method') from None


@dataclass
class TuneCommand(TunedLiveConfig):
    """Run one of the benchmark's tuners on a live (or replayed) platform under a measurement
    budget and export its table, as ``ncclrl finetune`` does for ncclrl.

    :param method: the tuner: default, sweep, sweep-race, random, afnfa, tpe, autoccl, zero-shot, bo,
        ei-per-s, ucb-per-s, jobs, confirm, rank, ncclrl, ppo, kg-jobs (afnfa and tpe need the extra: pip install
        "ncclrl[baselines]")
    :param budget: GPU-time allowed: a GPU-time (``600s``, ``10min``) or ``Nsweep``, N times what one full
        sweep of the space is predicted to cost
    :param seed: the tuner's seed
    :param wall_s: no new measurement after this many seconds (0: no limit), whatever is left of budget
    :param strategy: method ncclrl: the search strategy (shipped: installed with ncclrl, or a strategy.json path)
    """

    method: str = ""
    budget: str = "0.5sweep"
    seed: int = 0
    wall_s: float = 0.0
    strategy: str = "shipped"
    out: str = "runs/tune"
    store: str = "runs/tune.sqlite"

    def check(self) -> None:
        if self.method not in METHODS:
            raise ConfigError("method", f"unknown value {self.method!r}; allowed: {', '.join(METHODS)}")
        super().check()
        check_extra([self.method], "method")
        parse_budget(self.budget, 1.0)
        for k in ("seed", "wall_s"):
            if getattr(self, k) < 0:
                raise ConfigError(k, f"must be >= 0, got {getattr(self, k)}")
        if self.method == "ncclrl":
            load_strategy(self.strategy)  # read now: a file that is no strategy is said before anything is written


def load_strategy(name: str) -> PolicyController:
    """Method ncclrl's strategy (``shipped`` or a strategy.json), one line naming ``strategy`` if it is none."""
    if not strategy_path(name).is_file():
        raise ConfigError("strategy", f"method ncclrl needs strategy=PATH/strategy.json (or shipped), got {name!r}")
    return PolicyController.load(strategy_path(name))


def parse_args(argv: list[str]) -> DictConfig:
    """The command's config from ``key=value`` overrides (what ``ncclrl tune`` composes)."""
    return parse(COMMAND, argv)


def main_tune(args: DictConfig) -> int:
    if args["backend"] == "torch":  # no GPUs or the wrong hosts: one line, before the store is touched
        check_launch(args, load_topology(args["topology"]), "backend=replay with a recorded sweep (replay_store=) "
                     "or grid (grid=)")
    return exit_code(run_tune(args))


def run_tune(args: DictConfig) -> dict[str, Any]:
    """Run ``ncclrl tune``; SIGINT or SIGTERM end the job in flight, then the tuner decides on what was
    measured, the table is written and the summary says it was interrupted."""
    with ending_on_signals():
        summary = _run_tune(args)
        late = stop_requested(acknowledge=True)  # came after the run's last look, while it decided or wrote
        if late and not summary.get("interrupted"):
            summary["interrupted"] = signal.Signals(late).name
            (Path(args["out"]) / "summary.json").write_text(json.dumps(summary, indent=1))
    return summary


def _run_tune(args: DictConfig) -> dict[str, Any]:
    topo = load_topology(args["topology"])
    colls = [N.parse_name("collectives", c, N.COLLECTIVES) for c in args["collectives"]]
    problem, sweep = live_problem(args, topo, colls)  # replayed: the points the recorded sweep covered
    if sweep is not None and not isinstance(sweep, Instance):
        problem.noise = replay_noise(args["replay_store"], topo, args["launch"], colls, problem.sizes)
    budget = parse_budget(args["budget"], predicted_sweep_gpu_s(problem, int(args["samples"])))
    check_budget(budget, problem, int(args["samples"]), str(args["budget"]))  # before the store is made
    strategy = load_strategy(args["strategy"]) if args["method"] == "ncclrl" else None
    store = Store(Path(args["store"]))
    tag = f"tune:{args['method']}"
    t0 = time.time()
    with progress(f"tune {args['method']} (GPU-s)", budget) as bar:
        measure = make_measure(args, topo, store, None, sweep)
        ev = Evaluator(problem, measure, budget, samples=int(args["samples"]), tag=tag,
                       wall_s=float(args["wall_s"]) or None)
        ev.on_job = bar.advance
        d = make_tuner(args["method"], strategy).tune(problem, ev, int(args["seed"]))
    wall = time.time() - t0
    rows = [{"collective": N.COLLECTIVES[c], "nbytes": s, "key": key} for (c, s), key in sorted(d.rows.items())]
    res = Outcome(conf=d.conf, rows=rows, measured=ev.points, rounds=ev.calls)
    prov = {"method": args["method"], "args": OmegaConf.to_container(args), "nccl_version": topo.nccl.version,
            "wall_s": round(wall, 1), "jobs": ev.calls}
    paths = write_outcome(res, topo, problem.sizes, Path(args["out"]), prov, title=f"{args['method']} table")
    env = " ".join(f"{k}={v}" for k, v in d.conf.env().items()) or "NCCL defaults"
    # the run's report on stdout (the progress went to stderr)
    print(f"# {args['method']} on {topo.name}: {plural(ev.points, 'measurement')} in {plural(ev.calls, 'job')}, "
          f"{format_gpu_s(ev.gpu_s)} of a budget of {format_gpu_s(ev.budget)}, {wall:.0f} s; knobs: {env}; "
          f"{plural(len(rows), 'row')} -> {paths['csv']}", flush=True)
    summary = {"method": args["method"], "measured": ev.points, "jobs": ev.calls, "gpu_s": round(ev.gpu_s, 1),
               "budget_gpu_s": round(ev.budget, 1), "wall_s": wall, "rows": len(rows), "conf": d.conf.env(),
               "reason": ev.stop_reason or "the tuner stopped",
               "interrupted": signal.Signals(ev.interrupted).name if ev.interrupted else None,
               "failure": ev.failure or None}
    if ev.interrupted or ev.failure:
        log.warning("# %s: the table, nccl.conf and summary.json hold what the tuner decided on the measurements so "
                    "far; the same command resumes from the store %s", ev.stop_reason, args["store"])
    per: list[dict] = []  # per size on the recorded sweep's own data, when it replays one
    if isinstance(sweep, Instance):
        summary.update(grid_reference(sweep, d.conf, rows))
        print("# " + summary.pop("report"), flush=True)
    elif sweep is not None:
        ref = sweep_reference(sweep, topo, problem.sizes)
        got = table_speedup_on_sweep(ref, d.conf, rows, problem.sizes)
        summary.update(sweep_points=ref["points"], optimum=ref["optimum"], speedup_on_sweep=got,
                       fraction=got / ref["optimum"])
        per = sizes_on_sweep(ref, d.conf, rows, problem.sizes)
        print(f"# on the sweep's own data: {got:.3f}x vs the sweep optimum {ref['optimum']:.3f}x "
              f"({100 * got / ref['optimum']:.1f}%), with {ev.points} of {plural(ref['points'], 'measurement')}",
              flush=True)
    changed = [(r["collective"], r["nbytes"]) for r in rows]
    plot = plot_table_change(size_changes(per or rows, problem.sizes, changed), Path(args["out"]) / "table_change.png",
                             f"ncclrl tune method={args['method']} on {topo.name}: the exported table per size",
                             "the recorded sweep's own data" if per else
                             "the tuner keeps no per-size evidence: measure the table with ncclrl validate").path
    summary["plot"] = str(plot)
    print(f"# per size: {plot} (the table's speedup over NCCL's defaults; slower sizes in red)", flush=True)
    (Path(args["out"]) / "summary.json").write_text(json.dumps(summary, indent=1))
    return summary



COMMAND = Command("tune", TuneCommand, main_tune,
                  "run one benchmark tuner on live (or replayed) measurements under a budget, export its table",
                  out_key="out")
register(COMMAND)
