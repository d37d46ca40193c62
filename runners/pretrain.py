"""``ncclrl pretrain`` and ``ncclrl export``: importable functions behind thin commands.

``pretrain`` trains a search strategy (:mod:`ncclrl.agents.strategy_train`) over simulated
platforms, from scratch or continuing a given one (``init=shipped``), checks it on platforms drawn
around the target that training never saw, and exports the target's zero-shot table; ``export``
only exports that table. The configuration is composed by Hydra from :class:`PretrainConfig` and
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
from ncclrl.agents.export import export_table, resolve_shapes
from ncclrl.agents.problem import Evaluator, Oracle, Problem, platform_measure
from ncclrl.agents.strategy import (
    PolicyController,
    RankController,
    Search,
    SearchConfig,
    Space,
    strategy_path,
    zero_shot,
)
from ncclrl.agents.strategy_train import AgentConfig, ExperimentConfig
from ncclrl.agents.strategy_train import train as train_strategy
from ncclrl.agents.suite import stable
from ncclrl.costmodel import nccl as N
from ncclrl.costmodel.errors import ConfigError
from ncclrl.costmodel.platforms import draw_platform
from ncclrl.costmodel.simulator import Simulator
from ncclrl.costmodel.topology import Topology, load_topology
from ncclrl.runners.config import Command, compose_config, register

CONF_DIR = Path(str(files("ncclrl.conf")))
CHECK_SEED = 31337  # the stream of the check's platforms: neither training's nor the benchmark's


@dataclass
class ExportSettings:
    """How the target's zero-shot table is built.

    :param margin: a row leaves NCCL's default only if the simulator predicts it faster by more than this
    :param tune_conf: also choose per-process knobs (nccl.conf)
    :param shapes: communicator shapes [nodes, ranks] (NCCL's nNodes, nRanks) to write rows for, e.g.
        [[1,8],[16,16]]; empty: the whole job, plus on several nodes one node of all its GPUs and one rank on
        every node
    """

    margin: float = 0.01
    tune_conf: bool = True
    shapes: list[Any] = field(default_factory=list)  # [nodes, nranks] pairs, checked in check()

    def check(self, topo: Topology | None = None) -> None:
        """:param topo: the job's platform the shapes must fit (not checked without it)"""
        if not 0 <= self.margin < 1:
            raise ConfigError("export.margin", f"must be in [0, 1), got {self.margin}")
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
    (tensor-parallel groups) and one rank on every node (data-parallel groups)."""


@dataclass
class PretrainConfig(TargetConfig):
    """Train a search strategy on simulated platforms, check it on platforms drawn around the
    target, and export the target's zero-shot table.

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
        self.experiment.check()
        if self.init and not strategy_path(self.init).is_file():
            raise ConfigError("init", f"no strategy at {strategy_path(self.init)}; use shipped, a strategy.json, "
                              "or nothing (from scratch)")
        if self.check_platforms < 0:
            raise ConfigError("check_platforms", f"must be >= 0, got {self.check_platforms}")
        if self.check_budget < 1:
            raise ConfigError("check_budget", f"must be >= 1, got {self.check_budget}")


def compose(overrides: list[str]) -> DictConfig:
    """The pretraining config with ``overrides`` (what ``ncclrl pretrain`` composes)."""
    return compose_config(PRETRAIN, overrides)


def target_topology(cfg: DictConfig) -> Topology:
    return load_topology(cfg.topology)


def agent_config(cfg: DictConfig) -> AgentConfig:
    return OmegaConf.to_object(cfg.agent)


def experiment_config(cfg: DictConfig) -> ExperimentConfig:
    return OmegaConf.to_object(cfg.experiment)


def _run_dir(cfg: DictConfig) -> Path:
    if cfg.get("run_dir"):
        return Path(cfg.run_dir)
    return Path("runs") / _dt.datetime.now().strftime("%Y-%m-%d_%H-%M-%S")


def check_strategy(strategy: PolicyController, target: Topology, platforms: int, budget: int,
                   seed: int = CHECK_SEED) -> dict[str, Any]:
    """Tuning runs on ``platforms`` platforms drawn around ``target`` (every other one
    misspecified; AllReduce, 8 B - 1 GiB) with ``strategy``, with the model's ranking in its place,
    and the zero-shot table: the fraction of each platform's optimum each reaches."""
    out: dict[str, list[float]] = {"strategy": [], "rank": [], "zero-shot": []}
    for i in range(platforms):
        rng = np.random.default_rng([seed, stable(target.name), i])
        plat = draw_platform(target.name, rng, bool(i % 2))
        problem = Problem.make(plat.topo, [N.ALLREDUCE])  # the prior: the target's nominal simulator
        oracle = Oracle(problem, plat)
        for name, ctl in (("strategy", strategy), ("rank", RankController())):
            ev = Evaluator(problem, platform_measure(plat, np.random.default_rng([seed, i, 1])), budget)
            out[name].append(oracle.score(Search(problem, ev, ctl, SearchConfig()).run().decision).fraction)
        space = Space(problem)
        zs = zero_shot(space)
        out["zero-shot"].append(oracle.score(space.decision(zs.knob, zs.rows)).fraction)
    return {k: [round(x, 4) for x in v] for k, v in out.items()}


def train(cfg: DictConfig) -> dict[str, Any]:
    """Train the strategy, check it, export the target's zero-shot table; return the summary."""
    target = target_topology(cfg)
    run_dir = _run_dir(cfg)
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.yaml").write_text(OmegaConf.to_yaml(cfg))
    init = PolicyController.load(strategy_path(cfg.init)) if cfg.init else None
    t0 = time.perf_counter()
    strategy = train_strategy(agent_config(cfg), experiment_config(cfg), init=init, log=lambda _m: None)
    train_s = time.perf_counter() - t0
    path = strategy.save(run_dir / "strategy.json")
    result = export_and_report(target, run_dir, cfg)
    result.update(pretrain_seconds=train_s, strategy=str(path), init=str(cfg.init or "scratch"))
    if cfg.check_platforms:
        chk = check_strategy(strategy, target, int(cfg.check_platforms), int(cfg.check_budget))
        result["check"] = chk
        print(f"\nstrategy check: {cfg.check_platforms} platforms drawn around {target.name} (every other one "
              f"misspecified), AllReduce, {cfg.check_budget} live points each; fraction of the optimum, mean:")
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
    table = export_table(sim, margin=float(cfg.export.margin), tune_conf=bool(cfg.export.tune_conf),
                         provenance={"method": "zero-shot"}, shapes=shapes)
    paths = table.write(run_dir / "table")
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
    report = _format_report(first_sim.topo, bands, s, table.conf, paths, plot, export_s, per_shape,
                            len(table.rows))
    (run_dir / "report.txt").write_text(report)
    print(report)
    return {"summary": s, "shapes": per_shape, "export_seconds": export_s, "nccl_conf": table.conf,
            "run_dir": str(run_dir), "rows": len(table.rows)}


def _format_report(target: Topology, bands: pd.DataFrame, s: dict[str, float], conf: dict[str, int],
                   paths: dict[str, Path], plot: Path, export_s: float, per_shape: dict[str, dict[str, float]],
                   nrows: int) -> str:
    knobs = " ".join(f"{k}={v}" for k, v in sorted(conf.items())) or "(nothing: NCCL's defaults are best)"
    lines = [f"ncclrl: table for {target.name} ({target.nodes} nodes x {target.gpus_per_node} GPUs), predicted by "
             "the simulator", f"nccl.conf: {knobs}",
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
    """``ncclrl export topology=...``: the platform's zero-shot table."""
    run_dir = _run_dir(cfg)
    run_dir.mkdir(parents=True, exist_ok=True)
    export_and_report(target_topology(cfg), run_dir, cfg)
    return 0


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
                 "export a platform's zero-shot table (the exact argmin of its simulator)", out_key="run_dir")
register(PRETRAIN)
register(EXPORT)
