"""``ncclrl finetune``: a tuning run on a live platform under a GPU-time budget: a screen, then
confirmation of its leaders, then knob settings with what is left (``strategy=confirm``, the
default), in whole jobs by expected improvement (``strategy=jobs``) or with a learned per-point
strategy, exporting the table the measurements support (keys: :class:`FinetuneCommand`;
the method: :mod:`ncclrl.agents.finetune`, :mod:`ncclrl.agents.search`).

    ncclrl finetune backend=torch topology=h200-2x2-sock budget=0.5sweep out=runs/ft

``backend=torch`` measures on the GPUs of this machine (each job one knob setting, our plugin
selecting each configuration); ``backend=replay replay_store=SWEEP.sqlite`` answers every
measurement from an earlier exhaustive sweep instead (the same points, counted the same way; the
sweep measured with ``launch``), which compares fine-tuning with the sweep on its own data;
``backend=replay grid=FILE`` (or ``grid=[FILE,...]``) answers from a measured grid given as files
instead (nccl-tests outputs under forced configurations, NVIDIA's example-plugin CSV, ...:
:mod:`ncclrl.envs.grids`), NCCL's default from ``grid_default``. Every measurement goes to ``store``
(tag ``finetune``) as soon as its job ends.
"""

from __future__ import annotations

import json
import logging
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from omegaconf import DictConfig, OmegaConf

from ncclrl.agents.calibration import CALIBRATE
from ncclrl.agents.compose import ComposerController
from ncclrl.agents.compose_train import PolicyComposer, composer_path, is_composer
from ncclrl.agents.finetune import finetune, knob_label, write_outcome
from ncclrl.agents.plots import plot_table_change, size_changes
from ncclrl.agents.problem import Evaluator, predicted_sweep_gpu_s
from ncclrl.agents.search import (
    ConfirmConfig,
    ConfirmController,
    JobController,
    PolicyController,
    SearchConfig,
    strategy_path,
)
from ncclrl.agents.stopping import PolicyStopper, StopController
from ncclrl.agents.stopping.policy import SHIPPED as STOPPER
from ncclrl.agents.stopping.policy import is_stopper
from ncclrl.agents.suite import Instance
from ncclrl.costmodel import nccl as N
from ncclrl.costmodel.errors import ConfigError
from ncclrl.costmodel.jobcost import format_gpu_s, parse_budget
from ncclrl.costmodel.table import file_sha256
from ncclrl.costmodel.topology import load_topology
from ncclrl.costmodel.units import format_bytes, format_time_us, plural
from ncclrl.envs.jobs import ending_on_signals, stop_requested
from ncclrl.envs.replay import replay_job_noise
from ncclrl.envs.store import Store
from ncclrl.runners.config import Command, parse, register
from ncclrl.runners.live import (
    SWEEP_BANDS,
    TunedLiveConfig,
    check_budget,
    check_launch,
    check_load,
    exit_code,
    grid_reference,
    job_calls,
    live_problem,
    load_tag,
    make_measure,
    replay_validation,
    sizes_on_sweep,
    sweep_reference,
    table_speedup_on_sweep,
)
from ncclrl.runners.progress import progress

#: the strategies built into finetune (a strategy can also be a path to a trained one's JSON)
BUILT_IN = ("confirm", "confirm-ppo", "jobs", "ppo")
logger = logging.getLogger(__name__)


@dataclass
class FinetuneCommand(TunedLiveConfig):
    """Fine-tune: a tuning run of the search strategy on live (or replayed) measurements under a
    budget; export the table and ``nccl.conf`` the measurements support, with the evidence per row.

    :param budget: GPU-time allowed in all, NCCL's defaults included: a GPU-time (``600s``, ``10min``,
        ``1.5h``: a job's wall time times its GPUs) or ``Nsweep``, N times what one full sweep of the
        space is predicted to cost (``0.5sweep``: half of it)
    :param wall_s: no new measurement after this many seconds (0: no limit), whatever is left of budget
    :param strategy: the search strategy: confirm (a screening job, knob settings in pairs of jobs, then
        jobs confirming each size's leaders beside NCCL's choice; the table keeps a row only where the
        confirmation jobs alone show it delta faster: docs/explanation/confirm.md), jobs (whole jobs by
        expected improvement per GPU-second), confirm-ppo (confirm's screen, then the learned stopping agent
        installed with ncclrl choosing each job: confirm, explore a knob setting or stop;
        docs/explanation/stopping.md), ppo (the PPO job composer installed with ncclrl: which job next, and
        when to stop), shipped (the learned per-point strategy installed with ncclrl), or a strategy.json,
        composer.json or stopper.json
    :param horizon: strategy=confirm: the GPU-time the exported table will serve in these collectives (a
        GPU-time, or ``Nsweep``); a job runs only while its expected gain over that horizon pays for it, and a
        horizon that cannot repay a screen and two confirmation jobs measures nothing
    :param confirm: strategy=confirm's settings: confirm.leaders, confirm.screen_samples, confirm.confirm_samples,
        confirm.max_confirm_jobs, confirm.explore, ... (confirm.horizon_sweeps comes from horizon)
    :param serve_steps: strategy=ppo: training steps the exported table will serve; each job's GPU-time is
        weighed against the step time it may save over them (one call per size per step, or the profile's)
    :param search: the run's settings: search.round_points, search.decision.delta, search.decision.alpha, ...
    :param profile: a job profile (ncclrl profile): measure only the collectives and sizes the job calls
        on the whole job's communicator, for its communication time per step (calls x time), and report
        the time per step saved; collectives, min_bytes and max_bytes then come from the profile
    :param load: none, or gemm: every sample runs beside matrix products on each GPU, so the run tunes the
        collectives' times under compute (stored under tag finetune+gemmN with the products' slowdown;
        backend=torch)
    :param load_n: load=gemm: the products' size (load_n x load_n, bfloat16); size it like your model's
    :param compare: backend=replay: strategies to run after this one on the same replay, with the same budget
        and noise seed (``[ppo]``: the learned job composer; ``[jobs]``), each judged as this run is; their
        tables and stores go to ``out/compare-STRATEGY``
    :param calibrate: off (the default): the prior as given; auto: on a platform the prior was not
        calibrated for (the topology carries no fitted sim block), the first job measures NCCL's defaults at
        every size and the prior is calibrated on it before the search; on: always (on the public grids it
        lowered the run's result: docs/results/calibration.md)
    """

    budget: str = "0.5sweep"
    wall_s: float = 0.0
    strategy: str = "confirm"
    horizon: str = "100sweep"
    confirm: ConfirmConfig = field(default_factory=ConfirmConfig)
    serve_steps: float = 100_000.0
    search: SearchConfig = field(default_factory=SearchConfig)
    profile: str = ""
    load: str = "none"
    load_n: int = 4096
    calibrate: str = "off"
    compare: list[str] = field(default_factory=list)

    def check(self) -> None:
        TunedLiveConfig.check(self)
        for other in self.compare:
            if self.backend != "replay" or self.grid:
                raise ConfigError("compare", "strategies are compared on a replayed recording: set backend=replay "
                                  "(without grid=)")
            if other not in BUILT_IN and not strategy_path(other).is_file():
                raise ConfigError("compare", f"no strategy {other!r}; allowed: {', '.join(BUILT_IN)}, shipped, or a "
                                  "strategy.json, composer.json or stopper.json")
        if self.calibrate not in CALIBRATE:
            raise ConfigError("calibrate", f"allowed: {', '.join(CALIBRATE)}; got {self.calibrate!r}")
        check_load(self.load, self.load_n, self.backend)
        parse_budget(self.budget, 1.0)
        if self.wall_s < 0:
            raise ConfigError("wall_s", f"must be >= 0, got {self.wall_s}")
        try:
            self.search.check()
        except ConfigError as e:  # named as the user writes it
            raise ConfigError(f"search.{e.field}", str(e).split(": ", 1)[1]) from None
        parse_budget(self.horizon, 1.0, "horizon")
        self.confirm.check()
        if self.strategy not in BUILT_IN and not strategy_path(self.strategy).is_file():
            raise ConfigError("strategy", f"no strategy at {strategy_path(self.strategy)}; use {', '.join(BUILT_IN)}, "
                              "shipped, or a strategy.json, composer.json or stopper.json")
        if not self.serve_steps > 0:
            raise ConfigError("serve_steps", f"must be > 0, got {self.serve_steps}")
        if self.profile:
            job_calls(self.profile, load_topology(self.topology))


#: fresh replayed jobs that measure a replayed run's table afresh against NCCL's defaults
REPLAY_CHECK_JOBS = 10


def _source(args: DictConfig, topo) -> str:
    if args["backend"] != "replay":
        return f"measured on this machine's GPUs (backend={args['backend']})"
    if args.get("grid"):
        return f"replayed from the measured grid {', '.join(map(str, args['grid']))}"
    store = args["replay_store"] or f"the recording of {topo.name} that ships with ncclrl"
    if args.get("replay_noise", "fresh") == "fresh":
        return (f"replayed from {store}, every job a fresh draw of the host's job noise "
                f"(replay_seed={args['replay_seed']})")
    return f"replayed from {store}, the recorded jobs' own samples"


def _first_job_gpu_s(problem, controller, cfg: SearchConfig, samples: int) -> tuple[float, str]:
    """The predicted GPU-time (the prior's times) of the strategy's first job, and what it measures:
    confirm's screen, the composer's NCCL's defaults with every configuration, else the first round
    (NCCL's defaults at every size beside the zero-shot rows)."""
    from ncclrl.agents.search.confirm import job_gpu_s
    from ncclrl.agents.search.run import Search

    ev = Evaluator(problem, lambda *_a: [], 0.0, samples=samples)
    search = Search(problem, ev, None, cfg)
    sp = search.space
    if isinstance(controller, ConfirmController):
        idx, n, what = controller._screen_points(search, 0), controller.cfg.screen_samples, "the screening job"
    elif isinstance(controller, ComposerController):
        idx, n, what = [int(i) for i in np.flatnonzero(sp.knob == 0)], samples, \
            "NCCL's defaults with every configuration"
    else:
        search.start = lambda: None  # the first round's points, not measured
        first = [int(i) for i in sp.default[: sp.n_cells]] + [int(i) for i in search.zs.rows.values()]
        idx, n, what = [i for i in dict.fromkeys(first) if i >= 0], samples, "the first round"
    return job_gpu_s(search, idx, n), what


def _share(speedup: float, optimum: float) -> float:
    """The share of the best table's gain a table reaches: log speedup over log optimum."""
    return float(np.log(speedup) / np.log(optimum)) if optimum > 1 else 1.0


def _fingerprint(paths: dict[str, Path]) -> str:
    """The table's fingerprint, from the manifest written beside it (what the plugin checks)."""
    return json.loads((paths["csv"].parent / "nccl_tuner.manifest").read_text())["fingerprint"]


def _strategy_name(name: str) -> str:
    return {"ppo": "the learned job composer", "jobs": "whole jobs by expected improvement",
            "confirm": "screen, confirm, explore", "shipped": "the learned per-point strategy",
            "confirm-ppo": "screen, then the learned stopping agent"}.get(name, name)


def _compare(args: DictConfig, other: str) -> dict[str, Any]:
    """``other`` run on the same replay, budget and noise seed, its report on stderr: what it reached."""
    import copy

    sub = copy.deepcopy(args)
    folder = Path(args["out"]) / f"compare-{Path(other).stem if other.endswith('.json') else other}"
    sub.strategy, sub.compare, sub.out, sub.store = other, [], str(folder), str(folder / "measurements.sqlite")
    folder.mkdir(parents=True, exist_ok=True)
    quiet = logging.getLogger("ncclrl")
    level = quiet.level
    quiet.setLevel(logging.WARNING)
    try:
        import io

        got = _run_finetune(sub, io.StringIO())
    finally:
        quiet.setLevel(level)
    return got


def parse_args(argv: list[str]) -> DictConfig:
    """The command's config from ``key=value`` overrides (what ``ncclrl finetune`` composes)."""
    return parse(COMMAND, argv)


def main_finetune(args: DictConfig) -> int:
    return exit_code(run_finetune(args))


def run_finetune(args: DictConfig, out=None) -> dict[str, Any]:
    """Run ``ncclrl finetune``; returns (and writes to ``out/summary.json``) what it did. SIGINT or
    SIGTERM at any point ends the job in flight (what it finished is stored); the run then decides
    and writes what its measurements support, and the summary says it was interrupted."""
    with ending_on_signals():
        summary = _run_finetune(args, out)
        late = stop_requested(acknowledge=True)  # came after the run's last look, while it decided or wrote
        if late and not summary.get("interrupted"):
            summary["interrupted"] = signal.Signals(late).name
            (Path(args["out"]) / "summary.json").write_text(json.dumps(summary, indent=1, default=str))
    return summary


def _run_finetune(args: DictConfig, out=None) -> dict[str, Any]:
    topo = load_topology(args["topology"])
    weights, notes = job_calls(str(args["profile"]), topo) if args.get("profile") else (None, [])
    colls = sorted({c for c, _ in weights}) if weights is not None else \
        [N.parse_name("collectives", c, N.COLLECTIVES) for c in args["collectives"]]
    for n in notes:
        logger.info("# profile: %s", n)
    cfg: SearchConfig = OmegaConf.to_object(args["search"]) if isinstance(args["search"], DictConfig) \
        else args["search"]
    cfg.check()
    if args["backend"] == "torch":  # before the store opens
        check_launch(args, topo, "backend=replay with a recorded sweep (replay_store=) or grid (grid=)")
    jobs = args["strategy"] in ("jobs", "confirm")  # built in: no strategy file
    spath = None if jobs else composer_path("shipped") if args["strategy"] == "ppo" else \
        STOPPER if args["strategy"] == "confirm-ppo" else strategy_path(args["strategy"])
    if args["strategy"] == "confirm" or is_stopper(spath):
        ccfg: ConfirmConfig = OmegaConf.to_object(args["confirm"]) if isinstance(args["confirm"], DictConfig) \
            else args["confirm"]
        controller = ConfirmController(ccfg) if spath is None else StopController(ccfg, PolicyStopper.load(spath))
    elif jobs:
        controller = JobController()
    elif is_composer(spath):
        controller = ComposerController(PolicyComposer.load(spath), serve_steps=float(args.get("serve_steps", 1e5)))
    else:
        controller = PolicyController.load(spath)
    problem, sweep = live_problem(args, topo, colls, weights)
    sweep_gpu_s = predicted_sweep_gpu_s(problem, int(args["samples"]))
    budget = parse_budget(args["budget"], sweep_gpu_s)
    if isinstance(controller, ConfirmController):
        horizon = parse_budget(args.get("horizon", "100sweep"), sweep_gpu_s, "horizon")
        controller.cfg.horizon_sweeps = horizon / sweep_gpu_s
    check_budget(budget, problem, int(args["samples"]), str(args["budget"]))  # before the store is made
    first, what = _first_job_gpu_s(problem, controller, cfg, int(args["samples"]))
    if budget < first:
        raise ConfigError("budget", f"{args['budget']} ({format_gpu_s(budget)}) pays for no first job of "
                          f"strategy={args['strategy']} on {topo.name}: {what} costs about {format_gpu_s(first)} "
                          "(predicted); allowed: a larger GPU-time or Nsweep")
    store = Store(Path(args["store"]))
    t0 = time.time()
    with progress("finetune (GPU-s)", budget) as bar:
        measure = make_measure(args, topo, store, None, sweep)
        ev = Evaluator(problem, measure, budget, samples=int(args["samples"]),
                       tag=load_tag(args, "finetune"), wall_s=float(args["wall_s"]) or None)
        ev.on_job = bar.advance
        res, run = finetune(problem, ev, controller, cfg, log=logger.info,
                            calibrate=str(args.get("calibrate", "off")))
    wall = time.time() - t0
    out_dir = Path(args["out"])
    prov = {"strategy": str(args["strategy"]) if jobs else str(spath),
            "strategy_sha256": None if jobs else file_sha256(spath),
            "args": OmegaConf.to_container(args) if isinstance(args, DictConfig) else dict(args),
            "nccl_version": topo.nccl.version, "wall_s": round(wall, 1)}
    paths = write_outcome(res, topo, problem.sizes, out_dir, prov, exact=weights is not None)
    ev_ = res.evidence
    summary: dict[str, Any] = {"reason": res.reason, "measured": res.measured, "jobs": ev.calls,
                               "gpu_s": round(ev.gpu_s, 1), "budget_gpu_s": round(ev.budget, 1),
                               "wall_s": round(wall, 1), "rows": len(res.rows), "conf": res.conf.env(),
                               "paths": {k: str(v) for k, v in paths.items()}, "noise": ev_["noise"],
                               "worst_size": ev_["worst_size"], "slower_sizes": ev_["slower_sizes"],
                               "interrupted": signal.Signals(ev.interrupted).name if ev.interrupted else None,
                               "failure": ev.failure or None}
    names = ",".join(N.COLLECTIVES[c] for c in colls)
    report = [f"ncclrl finetune: {topo.name} {names}, strategy={args['strategy']}, {_source(args, topo)}",
              f"stopped: {res.reason}",
              f"GPU-time spent: {format_gpu_s(ev.gpu_s)} in {plural(ev.calls, 'job')} ({res.measured} measurements) of "
              f"a budget of {format_gpu_s(ev.budget)}; {wall:.0f} s of wall time here",
              f"table: {paths['csv']}: {plural(len(res.rows), 'row')} replacing NCCL's choice; knob setting: "
              f"{knob_label(res.conf)} ({paths['conf']})",
              f"deploy on every rank: NCCLRL_TUNER_TABLE={paths['csv'].resolve()} "
              f"NCCLRL_TUNER_TABLE_FINGERPRINT={_fingerprint(paths)} NCCL_CONF_FILE={paths['conf'].resolve()}"]
    if ev.interrupted or ev.failure:
        logger.warning("# %s: the table, nccl.conf and summary.json hold what the measurements so far support; "
                       "the same command resumes from the store %s", res.reason, args["store"])
    nz = ev_["noise"]
    if "phases" in ev_:  # screen, confirm: each row's own paired test; the model's noise played no part
        report.append("evidence: each row was tested on its confirmation jobs alone, paired with NCCL's choice in "
                      "each (finetune.json: rows[].confirmation; knob settings: evidence.phases)")
    else:
        report.append(f"noise fitted on {nz['dof']} repeated measurements over {plural(nz['jobs'], 'job')}: a job's "
                      f"shift sd {nz['job_sd']:.3f}, a point's sd {nz['point_sd']:.3f} (log time)"
                      + ("" if nz["fitted"] else " -- no repeated measurement: the prior's guesses "
                         "(search.model.job_sigma, search.model.noise_sigma)"))
    w = ev_["worst_size"]
    if w is not None:
        report.append(f"worst size in the run's own jobs: {w['collective']} {format_bytes(w['nbytes'])} "
                      f"{w['speedup']:.3f}x NCCL's defaults [95% interval {w['lo']:.3f}, {w['hi']:.3f}]; "
                      f"{plural(len(ev_['slower_sizes']), 'size')} slower beyond their interval")
    twins = [r for r in res.rows if "twin" in r.get("confirmation", {})]
    if twins:
        report.append(f"{plural(len(twins), 'row')} force what the replica says NCCL picks, yet measured faster than "
                      f"NCCL's own choice in their confirmation jobs (e.g. {twins[0]['collective']} "
                      f"{format_bytes(twins[0]['nbytes'])} {'/'.join(map(str, twins[0]['key']))}): the replica and "
                      "NCCL's decision differ there (finetune.json: rows[].confirmation.twin)")
    if ev_["sizes_unmeasured"]:
        report.append(f"{plural(ev_['sizes_unmeasured'], 'size')} where NCCL's plain default was never measured: no "
                      "speedup known there (they keep NCCL's choice)")
    if weights is not None:
        st = res.evidence["step"]
        summary.update(profile=str(args["profile"]), profile_notes=notes, step=st)
        report.append(f"the job's communication per step, predicted from the run's measurements: NCCL's defaults "
                      f"{format_time_us(st['nccl_us_per_step'])}, this table {format_time_us(st['table_us_per_step'])}"
                      f": {format_time_us(st['saved_us_per_step'])} saved [95% interval "
                      f"{format_time_us(st['saved_lo'])}, {format_time_us(st['saved_hi'])}] ({st['saved_pct']:.2f}%)")
    if isinstance(sweep, Instance):
        summary.update(grid_reference(sweep, res.conf, res.rows))
        report.append(summary.pop("report"))
    elif sweep is not None:
        ref = sweep_reference(sweep, topo, problem.sizes, weights)
        got = table_speedup_on_sweep(ref, res.conf, res.rows, problem.sizes)
        zs, space = run.zs, run.space
        zrows = [{"collective": N.COLLECTIVES[space.cells[c][0]], "nbytes": space.cells[c][1], "key": space.keys[i]}
                 for c, i in zs.rows.items()]
        zgot = table_speedup_on_sweep(ref, problem.knobs[zs.knob], zrows, problem.sizes)
        big = table_speedup_on_sweep(ref, res.conf, res.rows, problem.sizes, 64 << 20, 256 << 20)
        bands = {name: table_speedup_on_sweep(ref, res.conf, res.rows, problem.sizes, lo, hi)
                 for name, lo, hi in SWEEP_BANDS}
        per_size = sizes_on_sweep(ref, res.conf, res.rows, problem.sizes)
        summary.update(sweep_points=ref["points"], optimum=ref["optimum"], optimum_conf=ref["optimum_conf"],
                       speedup_on_sweep=got, fraction=got / ref["optimum"], zero_shot_fraction=zgot / ref["optimum"],
                       speedup_on_sweep_64_256MiB=big, speedup_on_sweep_bands=bands,
                       worst_size_on_sweep=min(per_size, key=lambda r: r["speedup"]) if per_size else None,
                       sizes_slower_on_sweep=sum(r["speedup"] < 1 for r in per_size))
        if args.get("replay_noise", "fresh") == "fresh":
            check = replay_validation(sweep, topo, replay_job_noise(topo, args["launch"]), int(args["replay_seed"]),
                                      res.conf, res.rows, problem.sizes, int(args["samples"]), REPLAY_CHECK_JOBS,
                                      weights)
            if check:
                summary["replay_check"] = check
                rowed = [r for r in check["per_size"] if r["row"]]
                cw = min(rowed, key=lambda r: r["speedup"]) if rowed else None
                per = "its calls per step" if weights is not None else "one call per size"
                report.append(
                    f"measured afresh ({REPLAY_CHECK_JOBS} new replayed jobs, each timing NCCL's defaults and the "
                    f"table at every size, as ncclrl validate does on GPUs): {100 * check['saved']:.1f}% of the "
                    f"communication time saved [95% interval {100 * check['saved_lo']:.1f}, "
                    f"{100 * check['saved_hi']:.1f}] at {per}; "
                    + (f"worst row {cw['collective']} {format_bytes(cw['nbytes'])} {cw['speedup']:.3f}x [95% interval "
                       f"{cw['lo']:.3f}, {cw['hi']:.3f}]; " if cw else "no row; ")
                    + f"{plural(len(check['slower_sizes']), 'size')} slower beyond their interval")
        summary.update(share=_share(got, ref["optimum"]), zero_shot_share=_share(zgot, ref["optimum"]))
        report.append(f"on the recording's truth (each point's pooled recorded median): {got:.3f}x NCCL's defaults "
                      f"({'its communication time per step' if weights is not None else 'geometric mean over sizes'}): "
                      f"{100 * summary['share']:.1f}% of the gain of the best table + "
                      f"nccl.conf ({ref['optimum']:.3f}x); the simulator's zero-shot table "
                      f"{100 * summary['zero_shot_share']:.1f}%; "
                      f"{res.measured} of the sweep's {ref['points']} measurements "
                      f"({100 * res.measured / ref['points']:.1f}%)")
        for name, x in bands.items():
            if x is not None and x < 1:
                logger.warning("# SLOWER than NCCL's defaults on the recording's truth at %s: %.3fx", name, x)
        if summary["worst_size_on_sweep"] is not None:
            w = summary["worst_size_on_sweep"]
            report.append(f"worst size on the recording's truth: {w['collective']} {format_bytes(w['nbytes'])} "
                          f"{w['speedup']:.3f}x; {plural(summary['sizes_slower_on_sweep'], 'size')} slower than "
                          "NCCL's defaults there")
    for other in list(args.get("compare") or []):
        summary.setdefault("compare", {})[other] = got_ = _compare(args, other)
        report.append(f"strategy={other} on the same replay, budget and noise seed ({_strategy_name(other)}): "
                      + (f"{got_['speedup_on_sweep']:.3f}x on the truth ({100 * got_['share']:.1f}% of the best's "
                         "gain), " if got_.get("speedup_on_sweep") is not None else "")
                      + f"{plural(got_['rows'], 'row')}, {format_gpu_s(got_['gpu_s'])} in {plural(got_['jobs'], 'job')}"
                      + (f"; measured afresh {100 * got_['replay_check']['saved']:.1f}% saved"
                         if got_.get("replay_check") else ""))
    check = summary.get("replay_check")
    changes, source = (size_changes(check["per_size"]), f"{REPLAY_CHECK_JOBS} new replayed jobs") if check else \
        (size_changes(res.rows, problem.sizes), "each row's speedup over NCCL's defaults in its jobs (finetune.json)")
    plot = plot_table_change(changes, out_dir / "table_change.png",
                             f"ncclrl finetune on {topo.name}: the exported table per size", source).path
    summary["paths"]["plot"] = str(plot)
    report.append(f"per size: {plot} (the table's speedup over NCCL's defaults; slower sizes in red)")
    print("\n".join(report), file=out or sys.stdout, flush=True)
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=1, default=str))
    return summary


COMMAND = Command("finetune", FinetuneCommand, main_finetune,
                  "tune on live (or replayed) measurements under a GPU-time budget, export the table",
                  out_key="out")
register(COMMAND)
