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

from omegaconf import DictConfig, OmegaConf

from ncclrl.agents.calibration import CALIBRATE
from ncclrl.agents.compose import ComposerController
from ncclrl.agents.compose_train import PolicyComposer, composer_path, is_composer
from ncclrl.agents.finetune import finetune, knob_label, write_outcome
from ncclrl.agents.problem import Evaluator, predicted_sweep_gpu_s
from ncclrl.agents.search import (
    ConfirmConfig,
    ConfirmController,
    JobController,
    PolicyController,
    SearchConfig,
    strategy_path,
)
from ncclrl.agents.suite import Instance
from ncclrl.costmodel import nccl as N
from ncclrl.costmodel.errors import ConfigError
from ncclrl.costmodel.jobcost import format_gpu_s, parse_budget
from ncclrl.costmodel.table import file_sha256
from ncclrl.costmodel.topology import load_topology
from ncclrl.envs.jobs import ending_on_signals, stop_requested
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
    sizes_on_sweep,
    sweep_reference,
    table_speedup_on_sweep,
)
from ncclrl.runners.progress import progress

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
        expected improvement per GPU-second), ppo (the
        PPO job composer installed with ncclrl: which job next, and when to stop), shipped (the learned
        per-point strategy installed with ncclrl), or a strategy.json or composer.json that ncclrl pretrain wrote
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

    def check(self) -> None:
        TunedLiveConfig.check(self)
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
        if self.strategy not in ("confirm", "jobs", "ppo") and not strategy_path(self.strategy).is_file():
            raise ConfigError("strategy", f"no strategy at {strategy_path(self.strategy)}; use confirm, jobs, ppo, "
                              "shipped "
                              "or the strategy.json or composer.json that ncclrl pretrain wrote")
        if not self.serve_steps > 0:
            raise ConfigError("serve_steps", f"must be > 0, got {self.serve_steps}")
        if self.profile:
            job_calls(self.profile, load_topology(self.topology))


def parse_args(argv: list[str]) -> DictConfig:
    """The command's config from ``key=value`` overrides (what ``ncclrl finetune`` composes)."""
    return parse(COMMAND, argv)


def main_finetune(args: DictConfig) -> int:
    return exit_code(run_finetune(args))


def run_finetune(args: DictConfig, out=sys.stdout) -> dict[str, Any]:
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


def _run_finetune(args: DictConfig, out=sys.stdout) -> dict[str, Any]:
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
    spath = None if jobs else \
        composer_path("shipped") if args["strategy"] == "ppo" else strategy_path(args["strategy"])
    if args["strategy"] == "confirm":
        ccfg: ConfirmConfig = OmegaConf.to_object(args["confirm"]) if isinstance(args["confirm"], DictConfig) \
            else args["confirm"]
        controller = ConfirmController(ccfg)
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
    logger.info("# fine-tuned %s %s: %s; %d measurements in %d jobs, %s of a budget of %s, %.0f s; knobs: %s; "
                "%d rows -> %s", topo.name, ",".join(N.COLLECTIVES[c] for c in colls), res.reason, res.measured,
                ev.calls, format_gpu_s(ev.gpu_s), format_gpu_s(ev.budget), wall, knob_label(res.conf), len(res.rows),
                paths["csv"])
    ev_ = res.evidence
    summary: dict[str, Any] = {"reason": res.reason, "measured": res.measured, "jobs": ev.calls,
                               "gpu_s": round(ev.gpu_s, 1), "budget_gpu_s": round(ev.budget, 1),
                               "wall_s": round(wall, 1), "rows": len(res.rows), "conf": res.conf.env(),
                               "paths": {k: str(v) for k, v in paths.items()}, "noise": ev_["noise"],
                               "worst_size": ev_["worst_size"], "slower_sizes": ev_["slower_sizes"],
                               "interrupted": signal.Signals(ev.interrupted).name if ev.interrupted else None,
                               "failure": ev.failure or None}
    if ev.interrupted or ev.failure:
        logger.warning("# %s: the table, nccl.conf and summary.json hold what the measurements so far support; "
                       "the same command resumes from the store %s", res.reason, args["store"])
    nz = ev_["noise"]
    if "phases" in ev_:  # screen, confirm: each row's own paired test; the model's noise played no part
        logger.info("# each row was tested on its confirmation jobs alone, paired with NCCL's choice in each "
                    "(finetune.json: rows[].confirmation; knob settings: evidence.phases)")
    else:
        logger.info("# noise fitted on %d repeated measurements over %d jobs: a job's shift sd %.3f, a point's sd %.3f "
                    "(log time)%s", nz["dof"], nz["jobs"], nz["job_sd"], nz["point_sd"],
                    "" if nz["fitted"] else " -- no repeated measurement: the prior's guesses (search.model.job_sigma, "
                    "search.model.noise_sigma)")
    w = ev_["worst_size"]
    if w is not None:
        logger.info("# worst size of this table, measured: %s %d B %.3fx NCCL's defaults [95%% interval %.3f, %.3f]; "
                    "%d size(s) slower beyond their interval", w["collective"], w["nbytes"], w["speedup"], w["lo"],
                    w["hi"], len(ev_["slower_sizes"]))
    twins = [r for r in res.rows if "twin" in r.get("confirmation", {})]
    if twins:
        logger.info("# %d row(s) force what the replica says NCCL picks, yet measured faster than NCCL's own choice in "
                    "their confirmation jobs (e.g. %s %d B %s): the replica and NCCL's decision differ there "
                    "(finetune.json: rows[].confirmation.twin)", len(twins), twins[0]["collective"],
                    twins[0]["nbytes"], "/".join(map(str, twins[0]["key"])))
    if ev_["sizes_unmeasured"]:
        logger.info("# %d size(s) where NCCL's plain default was never measured: no speedup known there (they keep "
                    "NCCL's choice)", ev_["sizes_unmeasured"])
    if weights is not None:
        st = res.evidence["step"]
        summary.update(profile=str(args["profile"]), profile_notes=notes, step=st)
        logger.info("# the job's communication per step, predicted from the run's measurements: NCCL's defaults "
                    "%.4g us, this table %.4g us: %.4g us saved [95%% interval %.4g, %.4g] (%.2f%%)",
                    st["nccl_us_per_step"], st["table_us_per_step"], st["saved_us_per_step"], st["saved_lo"],
                    st["saved_hi"], st["saved_pct"])
    if isinstance(sweep, Instance):
        summary.update(grid_reference(sweep, res.conf, res.rows))
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
        logger.info("# on the sweep's own data: %.3fx vs the sweep optimum %.3fx (%.1f%%; the zero-shot table "
                    "%.1f%%), with %d of %d measurements (%.1f%%)", got, ref["optimum"], 100 * got / ref["optimum"],
                    100 * zgot / ref["optimum"], res.measured, ref["points"], 100 * res.measured / ref["points"])
        for name, x in bands.items():
            if x is not None and x < 1:
                logger.warning("# SLOWER than NCCL's defaults on the sweep's own data at %s: %.3fx", name, x)
        if summary["worst_size_on_sweep"] is not None:
            w = summary["worst_size_on_sweep"]
            logger.info("# worst size on the sweep's own data: %s %d B %.3fx; %d size(s) slower than NCCL's defaults "
                        "there", w["collective"], w["nbytes"], w["speedup"], summary["sizes_slower_on_sweep"])
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=1, default=str))
    return summary


COMMAND = Command("finetune", FinetuneCommand, main_finetune,
                  "tune on live (or replayed) measurements under a GPU-time budget, export the table",
                  out_key="out")
register(COMMAND)
