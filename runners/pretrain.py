"""``ncclrl pretrain`` and ``ncclrl export``: importable functions behind thin commands.

``pretrain`` trains a search strategy (:mod:`ncclrl.agents.strategy_train`) over simulated
platforms, from scratch or continuing a given one (``init=shipped``), checks it on platforms drawn
around the target that training never saw, and exports the target's zero-shot table; ``export``
only exports that table, or with ``profile=`` a table for one job's calls (chosen for the time
per step, :func:`ncclrl.agents.export.workload_table`, judged on platform draws it never saw).
The configuration is composed by Hydra from :class:`PretrainConfig` and
the config groups in ``ncclrl/conf`` (``agent/``, ``experiment/``); overrides come from the command
line (``topology=dgx-h100-2n agent.total_timesteps=20000 experiment.families=[socket]``).
"""

from __future__ import annotations

import datetime as _dt
import json
import time
from dataclasses import dataclass, field
from importlib.resources import files
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from omegaconf import DictConfig, OmegaConf

from ncclrl.agents.evaluate import band_report, evaluate_table, s_curve_plot, summary
from ncclrl.agents.export import (
    DOMINANCE,
    HEADROOM,
    OBJECTIVES,
    export_table,
    margin_for,
    online_candidates,
    resolve_shapes,
    simulator_is_calibrated,
    workload_table,
)
from ncclrl.agents.problem import Evaluator, Oracle, Problem, platform_measure
from ncclrl.agents.search import (
    PolicyController,
    RankController,
    Search,
    SearchConfig,
    Space,
    strategy_path,
    zero_shot,
)
from ncclrl.agents.strategy_config import AgentConfig, ExperimentConfig
from ncclrl.agents.suite import stable
from ncclrl.costmodel import nccl as N
from ncclrl.costmodel.errors import ConfigError
from ncclrl.costmodel.platforms import draw_platform
from ncclrl.costmodel.simulator import Simulator
from ncclrl.costmodel.topology import Topology, load_topology
from ncclrl.costmodel.units import format_time_us, plural
from ncclrl.costmodel.workload import (
    DEFAULT_MEM_FRAC,
    Comparison,
    Workload,
    calls_by_size,
    draws,
    load_workload,
    resolve_compute,
    step_costs,
)
from ncclrl.runners.config import Command, compose_config, register

CONF_DIR = Path(str(files("ncclrl.conf")))
CHECK_SEED = 31337  # the stream of the check's platforms: neither training's nor the benchmark's


@dataclass
class ExportSettings:
    """How the target's zero-shot table is built.

    :param margin: a row leaves NCCL's default only if the simulator predicts it faster by more than this
        share (and nccl.conf its defaults only if predicted to gain more per row); null (the default): the
        simulator's measured error, 0.274 uncalibrated, 0.513 calibrated (docs/results/calibration.md)
    :param calibration: whether the simulator is calibrated for the target: auto (it is when the topology
        YAML carries a fitted sim block, as ncclrl calibrate output= writes), none (it is not, whatever the
        YAML says), or the path of a calibrated topology YAML (ncclrl calibrate output=) whose sim block the
        target's simulator runs on
    :param tune_conf: also choose per-process knobs (nccl.conf)
    :param shapes: communicator shapes [nodes, ranks] (NCCL's nNodes, nRanks) to write rows for, e.g.
        [[1,8],[16,16]]; empty: the whole job, plus on several nodes one node of all its GPUs and one rank on
        every node
    """

    margin: float | None = None
    calibration: str = "auto"
    tune_conf: bool = True
    shapes: list[Any] = field(default_factory=list)  # [nodes, nranks] pairs, checked in check()

    def check(self, topo: Topology | None = None) -> None:
        """:param topo: the job's platform the shapes must fit (not checked without it)"""
        if self.margin is not None and not 0 <= self.margin < 1:
            raise ConfigError("export.margin", f"must be in [0, 1) or null (the measured error), got {self.margin}")
        if self.calibration not in ("auto", "none"):
            p = Path(self.calibration)
            if not p.is_file():
                raise ConfigError("export.calibration", f"auto, none or a calibrated topology YAML (ncclrl calibrate "
                                  f"output=); no file {self.calibration!r}")
            if not load_topology(p).sim:
                raise ConfigError("export.calibration", f"{self.calibration} has no sim block: not a calibration")
        if topo is not None:
            try:
                resolve_shapes(topo, self.shapes)
            except ConfigError as e:
                raise ConfigError("export.shapes", str(e).removeprefix("shapes: ")) from None


@dataclass
class TargetConfig:
    """Where a table goes.

    :param topology: the target platform: a preset name (``ncclrl topologies``) or a topology YAML path
    :param run_dir: the output folder (default: runs/<date>_<time>)
    :param export: how the zero-shot table is built
    """

    topology: str = "h200-2x2-sock"
    run_dir: str | None = None
    export: ExportSettings = field(default_factory=ExportSettings)

    def check(self) -> None:
        self.export.check(load_topology(self.topology))


@dataclass
class ExportConfig(TargetConfig):
    """Export a platform's zero-shot table (nccl_tuner.csv, .json, nccl.conf: the exact argmin of
    its simulator, nothing measured) with the simulator's report. The table has rows for each
    communicator shape of export.shapes (nodes, ranks: NCCL's nNodes, nRanks), each shape
    simulated on its own; by default the whole job and, on several nodes, one node of all its GPUs
    (tensor-parallel groups) and one rank on every node (data-parallel groups).

    With profile= (a job profile, ncclrl profile -o job.yaml) the table has rows only for the
    collectives, communicator shapes and sizes the job calls (the others keep NCCL's decisions),
    chosen by objective=: step (the default: least predicted time per training step, the
    interference between NCCL's channels and the compute a call overlaps included) or isolated
    (the export's own rows for those calls: least time of each collective alone). The report
    gives, per communicator shape, the predicted time per step saved against NCCL's defaults and
    against the isolated table, with 95% intervals over platforms drawn around the target that the
    choice never saw (table/step_report.csv and .json).

    :param profile: a job profile YAML (ncclrl profile); empty: rows for every size of every shape
    :param objective: with profile=: step (default) or isolated
    :param compute_us_per_call: with profile=: compute (us, as it runs alone) each overlapped call
        overlaps, for profile rows that do not say (their compute_us_per_call)
    :param compute_ratio: with profile=: instead, each overlapped call's compute as a multiple of its
        NCCL-default time on the target (give one of the two; neither: no compute)
    :param mem_frac: with profile=: share 0-1 of that compute bound by HBM bandwidth, for rows that do not say
    :param unknown_overlap: with profile=: share 0-1 of the calls whose overlaps_compute is unknown that
        overlap compute (0: charged in full)
    :param choose_draws: with objective=step: misspecified platforms drawn around the target (seeds
        0..n-1 of stream 1) the step cost is averaged over, with the nominal simulator
    :param judge_draws: with profile=: misspecified platforms drawn around the target (seeds
        100..100+n-1 of stream 0) the report's savings and intervals are over
    :param headroom: with objective=step: an overlapped call counts as hidden only if it stays hidden at
        1 + headroom times its predicted time (0: as predicted)
    :param dominance: with objective=step: a row must cost no more than the isolated table's on every
        platform it is chosen on (false: on their mean)
    """

    profile: str = ""
    objective: str = ""
    compute_us_per_call: float | None = None
    compute_ratio: float | None = None
    mem_frac: float = DEFAULT_MEM_FRAC
    unknown_overlap: float = 0.0
    choose_draws: int = 5
    judge_draws: int = 10
    headroom: float = HEADROOM
    dominance: bool = DOMINANCE

    def check(self) -> None:
        if not self.profile:
            for key, default in (("objective", ""), ("compute_us_per_call", None), ("compute_ratio", None),
                                 ("mem_frac", DEFAULT_MEM_FRAC), ("unknown_overlap", 0.0), ("choose_draws", 5),
                                 ("judge_draws", 10), ("headroom", HEADROOM), ("dominance", DOMINANCE)):
                if getattr(self, key) != default:
                    raise ConfigError(key, "applies to a job's table only: give profile=PATH (ncclrl profile)")
            super().check()
            return
        super().check()
        job_workload(self)


def job_workload(cfg: Any) -> Workload:
    """The job of ``cfg.profile`` on ``cfg.topology`` (unknown node counts resolved on it), its
    settings checked; compute per call not yet resolved (:func:`resolve_compute`). Every problem is
    one :class:`ConfigError` line naming the key."""
    if cfg.objective not in ("", *OBJECTIVES):
        raise ConfigError("objective", f"allowed: {', '.join(OBJECTIVES)}; got {cfg.objective!r}")
    for key, lo, hi in (("compute_us_per_call", 0.0, None), ("compute_ratio", 0.0, None), ("mem_frac", 0.0, 1.0),
                        ("unknown_overlap", 0.0, 1.0), ("headroom", 0.0, None)):
        v = cfg[key] if isinstance(cfg, DictConfig) else getattr(cfg, key)
        if v is not None and not (np.isfinite(v) and v >= lo and (hi is None or v <= hi)):
            bounds = f">= {lo:g}" + (f" and <= {hi:g}" if hi is not None else "")
            raise ConfigError(key, f"must be a number {bounds}, got {v}")
    if cfg.compute_us_per_call is not None and cfg.compute_ratio is not None:
        raise ConfigError("compute_ratio", "give compute_us_per_call or compute_ratio, not both")
    if int(cfg.choose_draws) < 0:
        raise ConfigError("choose_draws", f"must be >= 0, got {cfg.choose_draws}")
    if int(cfg.judge_draws) < 2:
        raise ConfigError("judge_draws", f"must be >= 2 (an interval needs two draws), got {cfg.judge_draws}")
    path = Path(str(cfg.profile))
    if not path.is_file():
        raise ConfigError("profile", f"file not found: {path}")
    topo = load_topology(cfg.topology)
    try:
        w = load_workload(path, cfg.compute_us_per_call, cfg.compute_ratio, float(cfg.mem_frac),
                          float(cfg.unknown_overlap), topology=topo)
    except ConfigError as e:
        raise (e if e.field == "profile" else ConfigError("profile", str(e))) from None
    for nodes, ranks in dict.fromkeys((c.nodes, c.ranks) for c in w.calls):
        try:
            topo.shape(nodes, ranks)
        except ConfigError as e:
            raise ConfigError("profile", f"{path}: calls on {nodes} node(s) x {ranks} ranks do not fit "
                              f"{topo.name}: {str(e).split(': ', 1)[-1]}") from None
    return w


@dataclass
class PretrainConfig(ExportConfig):
    """Train a search strategy on simulated platforms, check it on platforms drawn around the
    target, and export the target's zero-shot table. With profile= (a job profile) the strategy
    trains on the job's problems (experiment.profile: its sizes and calls per step, judged on its
    communication time per step), is checked on them, and the table is the job's (the keys of
    ncclrl export profile=: objective, compute_ratio, ...).

    :param agent: MaskablePPO's settings and budget (group agent=)
    :param experiment: what the strategy trains on (group experiment=)
    :param init: empty: train from scratch; shipped or a strategy.json: continue training that strategy
    :param check_platforms: platforms drawn around the target (half of them misspecified) the new
        strategy, the model's ranking and the zero-shot table are compared on (0: no check)
    :param check_budget: live points of each checked tuning run
    """

    defaults: list[Any] = field(default_factory=lambda: ["_self_", {"agent": "maskable_ppo"},
                                                         {"experiment": "default"}])
    agent: AgentConfig = field(default_factory=AgentConfig)
    experiment: ExperimentConfig = field(default_factory=ExperimentConfig)
    init: str = ""
    check_platforms: int = 6
    check_budget: int = 200

    def check(self) -> None:
        super().check()
        self.agent.check()
        if self.profile and not self.experiment.profile:
            self.experiment.profile = self.profile
        self.experiment.check()
        if not self.agent.ent_coef >= 0:
            raise ConfigError("agent.ent_coef", f"must be a number >= 0 (0: no entropy bonus), got "
                              f"{self.agent.ent_coef}")
        if self.init:
            load_init(self.init)
        if self.check_platforms < 0:
            raise ConfigError("check_platforms", f"must be >= 0, got {self.check_platforms}")
        if self.check_budget < 1:
            raise ConfigError("check_budget", f"must be >= 1, got {self.check_budget}")


def load_init(init: str) -> PolicyController:
    """The strategy ``init=`` names, read (one line naming ``init`` if it is none)."""
    path = strategy_path(init)
    if not path.is_file():
        raise ConfigError("init", f"no strategy at {path}; use shipped, a strategy.json, or nothing (from scratch)")
    try:
        return PolicyController.load(path)
    except ConfigError as e:
        from ncclrl.agents.compose_train import is_composer

        if is_composer(path):
            raise ConfigError("init", f"{path} is a job composer (ncclrl composer writes it, finetune strategy= runs "
                              "it); init takes a per-point strategy: shipped, or a strategy.json ncclrl pretrain "
                              "wrote") from None
        raise ConfigError("init", str(e).split(": ", 1)[1]) from None


def compose(overrides: list[str]) -> DictConfig:
    """The pretraining config with ``overrides`` (what ``ncclrl pretrain`` composes)."""
    return compose_config(PRETRAIN, overrides)


def target_topology(cfg: DictConfig) -> Topology:
    """The target; with ``export.calibration=FILE`` its simulator runs on that calibration's parameters."""
    topo = load_topology(cfg.topology)
    cal = str(cfg.get("export", {}).get("calibration", "auto") or "auto")
    if cal not in ("auto", "none"):
        topo = topo.with_sim(load_topology(cal).sim)
    return topo


def export_margin(cfg: DictConfig, sim: Simulator) -> tuple[float, bool]:
    """The export's margin and whether it counts the simulator as calibrated (``export.margin`` when set)."""
    calibrated = simulator_is_calibrated(sim) and str(cfg.export.get("calibration", "auto")) != "none"
    m = cfg.export.get("margin")
    return (margin_for(calibrated) if m is None else float(m)), calibrated


def agent_config(cfg: DictConfig) -> AgentConfig:
    return OmegaConf.to_object(cfg.agent)


def experiment_config(cfg: DictConfig) -> ExperimentConfig:
    """What the strategy trains on; ``profile=`` is its ``experiment.profile`` unless that is set."""
    exp = OmegaConf.to_object(cfg.experiment)
    if cfg.get("profile") and not exp.profile:
        exp.profile = str(cfg.profile)
    return exp


def _run_dir(cfg: DictConfig) -> Path:
    if cfg.get("run_dir"):
        return Path(cfg.run_dir)
    return Path("runs") / _dt.datetime.now().strftime("%Y-%m-%d_%H-%M-%S")


def check_strategy(strategy: PolicyController, target: Topology, platforms: int, budget: int,
                   seed: int = CHECK_SEED, job: Workload | None = None) -> dict[str, Any]:
    """Tuning runs on ``platforms`` platforms drawn around ``target`` (every other one
    misspecified; AllReduce, 8 B - 1 GiB, or with ``job`` each of its collectives at its sizes,
    judged on its communication time per step) with ``strategy``, with the model's ranking in its
    place, and the zero-shot table: the fraction of each platform's optimum each reaches (with a
    job, the mean over its collectives)."""
    out: dict[str, list[float]] = {"strategy": [], "rank": [], "zero-shot": []}
    for i in range(platforms):
        rng = np.random.default_rng([seed, stable(target.name), i])
        plat = draw_platform(target.name, rng, bool(i % 2))
        if job is None:  # the prior: the target's nominal simulator
            problems = [Problem.make(plat.topo, [N.ALLREDUCE])]
        else:
            calls = calls_by_size(job, plat.topo.nodes, plat.topo.nranks)
            problems = [Problem(plat.topo, [c], {c: sorted(calls[n])}, weights={(c, b): k for b, k in calls[n].items()})
                        for n in sorted(calls, key=N.COLLECTIVES.index) for c in [N.COLLECTIVES.index(n)]]
        got: dict[str, list[float]] = {k: [] for k in out}
        for j, problem in enumerate(problems):
            oracle = Oracle(problem, plat)
            for name, ctl in (("strategy", strategy), ("rank", RankController())):
                ev = Evaluator(problem, platform_measure(plat, np.random.default_rng([seed, i, 1, j])), 1e12,
                               max_points=budget)
                got[name].append(oracle.score(Search(problem, ev, ctl, SearchConfig()).run().decision).fraction)
            space = Space(problem)
            zs = zero_shot(space)
            got["zero-shot"].append(oracle.score(space.decision(zs.knob, zs.rows)).fraction)
        for k, v in got.items():
            out[k].append(float(np.mean(v)))
    return {k: [round(x, 4) for x in v] for k, v in out.items()}


def train(cfg: DictConfig) -> dict[str, Any]:
    """Train the strategy, check it, export the target's zero-shot table; return the summary."""
    target = target_topology(cfg)
    init = load_init(cfg.init) if cfg.init else None  # before anything is written
    run_dir = _run_dir(cfg)
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.yaml").write_text(OmegaConf.to_yaml(cfg))
    t0 = time.perf_counter()
    exp = experiment_config(cfg)
    from ncclrl.agents.strategy_train import train as train_strategy  # PyTorch, only when training

    strategy = train_strategy(agent_config(cfg), exp, init=init, log=lambda _m: None,
                              tensorboard_dir=str(run_dir / "tensorboard"))
    train_s = time.perf_counter() - t0
    path = strategy.save(run_dir / "strategy.json")
    if cfg.profile:
        doc = export_for_job(cfg)
        result = {"shapes": doc["shapes"], "nccl_conf": doc["nccl_conf"], "export_seconds": doc["export_seconds"],
                  "run_dir": str(run_dir), "rows": len(doc["keys"]), "profile": str(cfg.profile)}
    else:
        result = export_and_report(target, run_dir, cfg)
    result.update(pretrain_seconds=train_s, strategy=str(path), init=str(cfg.init or "scratch"))
    if cfg.check_platforms:
        job = exp.job()
        chk = check_strategy(strategy, target, int(cfg.check_platforms), int(cfg.check_budget), job=job)
        result["check"] = chk
        what = f"the job's collectives at its sizes ({exp.profile}), objective its communication time per " \
               "step" if job is not None else "AllReduce"
        print(f"\nstrategy check: {cfg.check_platforms} platforms drawn around {target.name} (every other one "
              f"misspecified), {what}, {cfg.check_budget} live points each; fraction of the optimum, mean:")
        for k, v in chk.items():
            print(f"  {k:<10} {np.mean(v):.3f}  (" + " ".join(f"{x:.3f}" for x in v) + ")")
    (run_dir / "summary.json").write_text(json.dumps(result, indent=1, default=float))
    return result


def export_and_report(target: Topology, run_dir: Path, cfg: DictConfig) -> dict[str, Any]:
    """Export the target's zero-shot table into ``run_dir/table``, judge it in the simulator per
    communicator shape (``evaluation.csv``: one block per shape), and report the first shape (the
    whole job by default) in full, the others in one line each."""
    sim = Simulator(target)
    t0 = time.perf_counter()
    shapes = [list(x) for x in cfg.export.get("shapes") or []]
    margin, calibrated = export_margin(cfg, sim)
    table = export_table(sim, margin=margin, tune_conf=bool(cfg.export.tune_conf),
                         provenance={"method": "zero-shot",
                                     "margin_rule": "calibrated" if calibrated else "uncalibrated"}, shapes=shapes)
    paths = table.write(run_dir / "table")
    cand = run_dir / "table" / "nccl_online_candidates.csv"  # the online mode's alternatives (predictions)
    cand.write_text("\n".join(online_candidates(sim)) + "\n")
    export_s = time.perf_counter() - t0
    frames, per_shape = [], {}
    for nodes, nranks in table.provenance["shapes"]:
        shape_sim = sim if (nodes, nranks) == (target.nodes, target.nranks) else \
            Simulator(target.shape(nodes, nranks), params=sim.params)
        df = evaluate_table(table.for_shape(nodes, nranks), shape_sim)
        df.insert(0, "nranks", nranks)
        df.insert(0, "nodes", nodes)
        frames.append((shape_sim, df))
        per_shape[f"{nodes}x{nranks}"] = summary(df)
    pd.concat([df for _, df in frames], ignore_index=True).to_csv(run_dir / "evaluation.csv", index=False)
    first_sim, first = frames[0]
    s = summary(first)
    bands = band_report(first)
    plot = s_curve_plot(first, first_sim, run_dir / "s_curve.png")
    rule = (f"margin rule: a row leaves NCCL's choice only where predicted faster by more than {100 * margin:.1f}% "
            f"(the simulator {'calibrated' if calibrated else 'uncalibrated'} for {target.name}"
            f"{'' if cfg.export.get('margin') is not None else ': its measured error'})")
    report = _format_report(first_sim.topo, bands, s, table.conf, paths, plot, export_s, per_shape,
                            len(table.rows), rule)
    (run_dir / "report.txt").write_text(report)
    print(report)
    return {"summary": s, "shapes": per_shape, "export_seconds": export_s, "nccl_conf": table.conf,
            "run_dir": str(run_dir), "rows": len(table.rows)}


def _format_report(target: Topology, bands: pd.DataFrame, s: dict[str, float], conf: dict[str, int],
                   paths: dict[str, Path], plot: Path, export_s: float, per_shape: dict[str, dict[str, float]],
                   nrows: int, rule: str = "") -> str:
    knobs = " ".join(f"{k}={v}" for k, v in sorted(conf.items())) or "(nothing: NCCL's defaults are best)"
    shape = f"{plural(target.nodes, 'node')} x {plural(target.gpus_per_node, 'GPU')}"
    lines = [f"ncclrl: table for {target.name} ({shape}), predicted by the simulator", *([rule] if rule else []),
             f"nccl.conf: {knobs}",
             "speedup: table + nccl.conf over NCCL's defaults; regret: against the exhaustive per-call optimum "
             "under the same nccl.conf", ""]
    lines.append(f"{'collective':<14} {'sizes':<16} {'NCCL default':<18} {'ncclrl':<18} {'speedup':>8} {'regret':>7}")
    for _, r in bands.iterrows():
        lines.append(f"{r.collective:<14} {r.band:<16} {r.nccl:<18} {r.ours:<18} {r.speedup:>7.2f}x "
                     f"{100 * r.regret:>6.1f}%")
    lines += ["",
              f"geometric-mean speedup over NCCL's default, 8 B - 1 GiB: {s['geomean_speedup']:.3f}x "
              f"(exhaustive optimum {s['optimum_geomean_speedup']:.3f}x: {100 * s['fraction_of_optimum']:.1f}% of it); "
              f"worst size {s['worst_vs_default']:.3f}x"]
    if len(per_shape) > 1:
        lines += ["", "communicator shapes in the table (nNodes x nRanks; same measures, every collective):"]
        for name, x in per_shape.items():
            lines.append(f"  {name:<10} geometric-mean speedup {x['geomean_speedup']:.3f}x (optimum "
                         f"{x['optimum_geomean_speedup']:.3f}x), worst size {x['worst_vs_default']:.3f}x")
    lines += ["", f"wrote {paths['csv']} ({nrows} rows), {paths['json'].name}, {paths['conf'].name}, {plot.name} "
              f"(export {export_s:.2f} s)"]
    return "\n".join(lines)


def cmd_export(cfg: DictConfig) -> int:
    """``ncclrl export topology=...``: the platform's zero-shot table (``profile=``: the job's table)."""
    if cfg.get("profile"):
        export_for_job(cfg)
        return 0
    run_dir = _run_dir(cfg)
    run_dir.mkdir(parents=True, exist_ok=True)
    export_and_report(target_topology(cfg), run_dir, cfg)
    return 0


CHOOSE_STREAM, JUDGE_STREAM, JUDGE_SEED0 = 1, 0, 100  # the streams of the choosing and the judging draws


def export_for_job(cfg: DictConfig) -> dict[str, Any]:
    """``ncclrl export profile=...``: rows only for the job's calls, chosen by ``cfg.objective``,
    judged per communicator shape on draws the choice never saw; everything is computed before
    anything is written."""
    target = target_topology(cfg)
    t0 = time.perf_counter()
    raw = job_workload(cfg)
    sim = Simulator(target)
    work = resolve_compute(raw, sim)  # the job's compute: fixed once, on the nominal platform
    objective = str(cfg.objective or "step")
    choose_seeds = list(range(int(cfg.choose_draws))) if objective == "step" else []
    judge_seeds = list(range(JUDGE_SEED0, JUDGE_SEED0 + int(cfg.judge_draws)))
    chosen_on = draws(str(cfg.topology), choose_seeds, True, stream=CHOOSE_STREAM)
    margin, _calibrated = export_margin(cfg, sim)
    res = workload_table(sim, work, objective, margin=margin, tune_conf=bool(cfg.export.tune_conf),
                         choose_on=chosen_on,
                         provenance={"method": f"workload-{objective}", "profile": str(cfg.profile)},
                         headroom=float(cfg.headroom), dominance=bool(cfg.dominance))
    judged = draws(str(cfg.topology), judge_seeds, True, stream=JUDGE_STREAM)
    tables = {"nccl": ({}, {}), "isolated": (res.isolated_choices, dict(res.isolated.conf)),
              "table": (res.choices, dict(res.table.conf))}
    keys = work.call_keys()
    per_draw = {name: [] for name in tables}  # name -> per draw: key -> cost per step (us)
    for plat in judged:
        for name, (choices, conf) in tables.items():
            per_draw[name].append(step_costs(plat, work, choices, conf))
    shapes = list(dict.fromkeys((k[1], k[2]) for k in keys))
    groups = {f"{n}x{r}": [k for k in keys if (k[1], k[2]) == (n, r)] for n, r in shapes}
    if len(groups) > 1:
        groups["all"] = keys
    summary_rows = []
    for gname, gkeys in groups.items():
        cmp = Comparison({name: [sum(d[k] for k in gkeys) for d in per_draw[name]] for name in tables})
        row: dict[str, Any] = {"shape": gname, "keys": len(gkeys), "draws": len(judged)}
        for name in tables:
            row[f"{name}_us"], row[f"{name}_lo"], row[f"{name}_hi"] = cmp.interval(name)
        for base in ("nccl", "isolated"):
            m, lo, hi = cmp.saving(base, "table")
            row.update({f"saved_vs_{base}_us": m, f"saved_vs_{base}_lo": lo, f"saved_vs_{base}_hi": hi,
                        f"vs_{base}": {"wins": "faster", "loses": "slower"}.get(cmp.verdict(base, "table"), "tie")})
        summary_rows.append(row)
    key_rows = []
    for k in keys:
        calls = [c for c in work.calls if c.key == k]
        key_rows.append({"collective": k[0], "nodes": k[1], "ranks": k[2], "nbytes": k[3],
                         "calls_per_step": sum(c.calls_per_step for c in calls),
                         "overlap": max(c.overlap for c in calls),
                         "compute_us_per_call": max((c.compute_us_per_call for c in calls if c.overlap > 0),
                                                    default=0.0),
                         "isolated": str(res.isolated_choices[k]), "table": str(res.choices[k]),
                         "row": res.table.lookup(k[0], k[3], k[1], k[2]).line()})
    export_s = time.perf_counter() - t0
    settings = {"topology": target.name, "profile": str(cfg.profile), "objective": objective,
                "margin": margin, "tune_conf": bool(cfg.export.tune_conf),
                "compute_us_per_call": cfg.compute_us_per_call, "compute_ratio": cfg.compute_ratio,
                "mem_frac": float(cfg.mem_frac), "unknown_overlap": float(cfg.unknown_overlap),
                "headroom": float(cfg.headroom), "dominance": bool(cfg.dominance),
                "chosen_on": {"nominal": True, "misspecified_seeds": choose_seeds, "stream": CHOOSE_STREAM},
                "judged_on": {"misspecified_seeds": judge_seeds, "stream": JUDGE_STREAM},
                "compute_us_per_step": work.compute_us_per_step(), "notes": list(work.notes)}
    report = _format_job_report(target, cfg, res, work, settings, summary_rows, key_rows)
    # all computed: now write
    run_dir = _run_dir(cfg)
    paths = res.table.write(run_dir / "table")
    pd.DataFrame(summary_rows).to_csv(run_dir / "table" / "step_report.csv", index=False, float_format="%.6g")
    doc = {"settings": settings, "shapes": summary_rows, "keys": key_rows, "nccl_conf": res.table.conf,
           "isolated_nccl_conf": res.isolated.conf, "export_seconds": export_s}
    (run_dir / "table" / "step_report.json").write_text(json.dumps(doc, indent=1, default=float))
    report += (f"\nwrote {paths['csv']} ({len(res.table.rows)} rows), {paths['json'].name}, {paths['conf'].name}, "
               f"step_report.csv, step_report.json (export {export_s:.2f} s)")
    (run_dir / "report.txt").write_text(report + "\n")
    print(report)
    return doc


def _us(m: float, lo: float, hi: float) -> str:
    return f"{format_time_us(m)} [{format_time_us(lo)}, {format_time_us(hi)}]"


def _format_job_report(target: Topology, cfg: DictConfig, res: Any, work: Workload, settings: dict[str, Any],
                       summary_rows: list[dict[str, Any]], key_rows: list[dict[str, Any]]) -> str:
    obj = settings["objective"]
    if cfg.compute_ratio is not None:
        comp = f"{cfg.compute_ratio:g}x the call's NCCL-default time (compute_ratio)"
    elif cfg.compute_us_per_call is not None:
        comp = f"{format_time_us(cfg.compute_us_per_call)} (compute_us_per_call)"
    else:
        comp = "the profile's compute_us_per_call, else none"
    ch = settings["chosen_on"]["misspecified_seeds"]
    js = settings["judged_on"]["misspecified_seeds"]
    rule = (f"; a call counts as hidden only if hidden at {1 + settings['headroom']:g}x its predicted time"
            if settings["headroom"] else "") + ("; no row dearer than the isolated table's on any of these platforms"
                                                 if settings["dominance"] else "")
    chosen = ("the nominal simulator" + (f" + {len(ch)} misspecified draws (seeds {ch[0]}-{ch[-1]}, stream "
                                          f"{CHOOSE_STREAM}), costs averaged" if ch else "") + rule) \
        if obj == "step" else "the nominal simulator (isolated times)"
    knobs = " ".join(f"{k}={v}" for k, v in sorted(res.table.conf.items())) or "(nothing)"
    iso_knobs = " ".join(f"{k}={v}" for k, v in sorted(res.isolated.conf.items())) or "(nothing)"
    lines = [f"ncclrl: table for the job {work.name} on {target.name} ({plural(target.nodes, 'node')} x "
             f"{plural(target.gpus_per_node, 'GPU')}), objective {obj}, predicted by the simulator",
             f"profile: {cfg.profile}: {len(key_rows)} (collective, shape, bytes) keys; compute per overlapped call: "
             f"{comp}, {100 * float(cfg.mem_frac):g}% HBM-bound; unknown overlap counted as "
             f"{float(cfg.unknown_overlap):g}",
             f"chosen on: {chosen}",
             f"judged on: {len(js)} misspecified draws (seeds {js[0]}-{js[-1]}, stream {JUDGE_STREAM}) the choice "
             "never saw",
             f"nccl.conf: {knobs} (the isolated table's: {iso_knobs})"]
    lines += [f"note: {n}" for n in work.notes]
    if not any(c.overlap > 0 and c.compute_us_per_call > 0 for c in work.calls):
        lines.append("note: no call overlaps compute (give unknown_overlap= and compute_ratio= or "
                     "compute_us_per_call=): the step objective is the isolated one")
    lines += ["", "rows (algorithm/protocol/channels; nccl: NCCL's decision), isolated table and this one:",
              f"{'shape':<7} {'collective':<14} {'bytes':>11} {'calls/step':>10} {'overlap':>7} {'compute':>10} "
              f"{'isolated':<18} {'this table':<18}"]
    for r in key_rows:
        lines.append(f"{r['nodes']}x{r['ranks']:<5} {r['collective']:<14} {r['nbytes']:>11} {r['calls_per_step']:>10g} "
                     f"{r['overlap']:>7.2f} {format_time_us(r['compute_us_per_call']):>10} {r['isolated']:<18} "
                     f"{r['table']:<18}")
    lines += ["", "predicted communication cost per step (exposed communication + compute slowdown; a step is "
              f"{format_time_us(work.compute_us_per_step())} of compute + this): mean [95% interval] over the judging "
              "draws;",
              "saved = the other table's cost - this table's, paired per draw (faster/slower: the interval excludes 0)",
              f"{'shape':<7} {'keys':>4} {'NCCL default':>28} {'isolated':>28} {'this table':>28} "
              f"{'saved vs NCCL default':>36} {'saved vs isolated':>36}"]
    for r in summary_rows:
        sn = f"{_us(r['saved_vs_nccl_us'], r['saved_vs_nccl_lo'], r['saved_vs_nccl_hi'])} {r['vs_nccl']}"
        si = f"{_us(r['saved_vs_isolated_us'], r['saved_vs_isolated_lo'], r['saved_vs_isolated_hi'])} " \
             f"{r['vs_isolated']}"
        lines.append(f"{r['shape']:<7} {r['keys']:>4} {_us(r['nccl_us'], r['nccl_lo'], r['nccl_hi']):>28} "
                     f"{_us(r['isolated_us'], r['isolated_lo'], r['isolated_hi']):>28} "
                     f"{_us(r['table_us'], r['table_lo'], r['table_hi']):>28} {sn:>36} {si:>36}")
    return "\n".join(lines)


def seconds(x: float) -> str:
    return f"{x:.1f} s" if x < 120 else f"{x / 60:.1f} min"


def main_pretrain(cfg: DictConfig) -> int:
    res = train(cfg)
    print(f"training the strategy took {seconds(res['pretrain_seconds'])}; it is {res['strategy']} "
          f"(ncclrl finetune strategy={res['strategy']})")
    return 0


PRETRAIN = Command("pretrain", PretrainConfig, main_pretrain,
                   "train a search strategy in simulation, check it around the target, export the target's "
                   "zero-shot table", out_key="run_dir")
EXPORT = Command("export", ExportConfig, cmd_export,
                 "export a platform's zero-shot table (the exact argmin of its simulator), or a job's (profile=)",
                 out_key="run_dir")
register(PRETRAIN)
register(EXPORT)
