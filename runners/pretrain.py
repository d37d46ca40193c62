"""``ncclrl pretrain`` and ``ncclrl export``: an importable :func:`train` behind a thin command.

The configuration is composed by Hydra from the schema :class:`PretrainConfig` and the config
groups in ``ncclrl/conf`` (``agent/``, ``experiment/``); overrides come from the command line
(``topology=dgx-h100-2n agent.total_timesteps=50000 agent.seed=1``).
"""

from __future__ import annotations

import datetime as _dt
import json
import time
from dataclasses import dataclass, field
from importlib.resources import files
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf

from ncclrl.agents.evaluate import band_report, evaluate_table, s_curve_plot, summary
from ncclrl.agents.export import export_table
from ncclrl.agents.pretrain import AgentConfig, checkpoint_path, load_policy, pretrain
from ncclrl.costmodel import nccl as N
from ncclrl.costmodel.errors import ConfigError
from ncclrl.costmodel.simulator import Simulator
from ncclrl.costmodel.table import file_sha256
from ncclrl.costmodel.topology import Topology, load_topology
from ncclrl.costmodel.units import parse_bytes
from ncclrl.runners.config import Command, compose_config, register

CONF_DIR = Path(str(files("ncclrl.conf")))


@dataclass
class ExperimentConfig:
    """What to pretrain on.

    :param pretrain_topologies: the presets platforms are drawn around (domain randomization)
    :param randomize: share of platform draws randomized around their preset (the rest: the preset itself)
    :param randomize_scale: 1 = the full bounds of the simulator's RANDOMIZATION
    :param noise: rewards from noisy simulated measurements, as on real machines
    :param collectives: the collectives episodes draw from
    :param min_bytes: the smallest size episodes draw
    :param max_bytes: the largest size episodes draw
    """

    pretrain_topologies: list[str] = field(default_factory=lambda: [
        "h200-1x4", "h200-2x2-sock", "dgx-h100-2n", "dgx-h100-16n", "v100-2x8-eth", "a40-4x8-ib", "a100-16x4-ib"])
    randomize: float = 0.75
    randomize_scale: float = 1.0
    noise: bool = True
    collectives: list[str] = field(default_factory=lambda: list(N.COLLECTIVES))
    min_bytes: str = "8"
    max_bytes: str = "1G"


@dataclass
class ExportSettings:
    """How a policy becomes a table.

    :param margin: a row leaves NCCL's default only if the simulator predicts it faster by more than this
    :param tune_conf: also choose per-process knobs (nccl.conf)
    :param top_k: time the policy's k best-scored actions per size in the simulator and keep the fastest
    """

    margin: float = 0.01
    tune_conf: bool = True
    top_k: int = 16


@dataclass
class TargetConfig:
    """Where a policy's table goes.

    :param topology: the target platform: a preset name (``ncclrl topologies``) or a topology YAML path
    :param run_dir: the output folder (default: runs/<date>_<time>)
    :param export: how the policy becomes a table
    :param threads: PyTorch CPU threads (1 is fastest for these small networks; 0: PyTorch's default)
    """

    topology: str = "h200-2x2-sock"
    run_dir: str | None = None
    export: ExportSettings = field(default_factory=ExportSettings)
    threads: int = 1

    def check(self) -> None:
        load_topology(self.topology)
        if self.threads < 0:
            raise ConfigError("threads", f"must be >= 0 (0: PyTorch's default), got {self.threads}")


@dataclass
class ExportConfig(TargetConfig):
    """Export a trained policy's table (nccl_tuner.csv, .json, nccl.conf) for a platform, with the
    simulator's report, without retraining.

    :param checkpoint: the policy: pretrained (shipped with ncclrl) or a policy.zip path
    """

    checkpoint: str = "pretrained"


@dataclass
class PretrainConfig(TargetConfig):
    """Pretrain a MaskablePPO policy on simulated platforms drawn around every preset, evaluate it
    on the target platform and export its table.

    :param agent: MaskablePPO's settings and budget (group agent=)
    :param experiment: what to pretrain on (group experiment=)
    :param progress_bar: show a progress bar while training
    """

    defaults: list[Any] = field(default_factory=lambda: ["_self_", {"agent": "maskable_ppo"},
                                                         {"experiment": "default"}])
    agent: AgentConfig = field(default_factory=AgentConfig)
    experiment: ExperimentConfig = field(default_factory=ExperimentConfig)
    progress_bar: bool = True

    def check(self) -> None:
        super().check()
        self.agent.check()
        for t in self.experiment.pretrain_topologies:
            load_topology(t)
        for c in self.experiment.collectives:
            N.parse_name("experiment.collectives", c, N.COLLECTIVES)
        lo = parse_bytes(self.experiment.min_bytes, "experiment.min_bytes")
        if parse_bytes(self.experiment.max_bytes, "experiment.max_bytes") < lo:
            raise ConfigError("experiment.max_bytes", "must be >= experiment.min_bytes")


def compose(overrides: list[str]) -> DictConfig:
    """The pretraining config with ``overrides`` (what ``ncclrl pretrain`` composes)."""
    return compose_config(PRETRAIN, overrides)


def target_topology(cfg: DictConfig) -> Topology:
    return load_topology(cfg.topology)


def agent_config(cfg: DictConfig) -> AgentConfig:
    return OmegaConf.to_object(cfg.agent)


def _threads(cfg: DictConfig) -> None:
    if cfg.threads:
        torch.set_num_threads(int(cfg.threads))


def _run_dir(cfg: DictConfig) -> Path:
    if cfg.get("run_dir"):
        return Path(cfg.run_dir)
    return Path("runs") / _dt.datetime.now().strftime("%Y-%m-%d_%H-%M-%S")


def train(cfg: DictConfig) -> dict[str, Any]:
    """Pretrain in simulation, evaluate on the target, export its table; return the summary."""
    _threads(cfg)
    target = target_topology(cfg)
    exp = cfg.experiment
    topologies = [str(t) for t in exp.pretrain_topologies]
    run_dir = _run_dir(cfg)
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.yaml").write_text(OmegaConf.to_yaml(cfg))
    t0 = time.perf_counter()
    model = pretrain(topologies, agent_config(cfg), run_dir, randomize=float(exp.randomize),
                     randomize_scale=float(exp.randomize_scale), noise=bool(exp.noise),
                     collectives=list(exp.collectives), min_bytes=parse_bytes(exp.min_bytes, "experiment.min_bytes"),
                     max_bytes=parse_bytes(exp.max_bytes, "experiment.max_bytes"), progress_bar=bool(cfg.progress_bar))
    train_s = time.perf_counter() - t0
    result = export_and_report(model, target, run_dir, cfg, policy_path=run_dir / "policy.zip",
                               seed=int(cfg.agent.seed))
    result.update(pretrain_seconds=train_s, pretrain_topologies=topologies)
    (run_dir / "summary.json").write_text(json.dumps(result, indent=1, default=float))
    return result


def export_and_report(model, target: Topology, run_dir: Path, cfg: DictConfig, policy_path: Path,
                      seed: int | None = None) -> dict[str, Any]:
    sim = Simulator(target)
    t0 = time.perf_counter()
    table = export_table(model, sim, margin=float(cfg.export.margin), tune_conf=bool(cfg.export.tune_conf),
                         top_k=int(cfg.export.top_k),
                         provenance={"policy_sha256": file_sha256(policy_path), "seed": seed,
                                     "checkpoint": str(policy_path)})
    paths = table.write(run_dir / "table")
    export_s = time.perf_counter() - t0
    df = evaluate_table(table, sim)
    df.to_csv(run_dir / "evaluation.csv", index=False)
    s = summary(df)
    bands = band_report(df)
    plot = s_curve_plot(df, sim, run_dir / "s_curve.png")
    report = _format_report(target, bands, s, table.conf, paths, plot, export_s)
    (run_dir / "report.txt").write_text(report)
    print(report)
    return {"summary": s, "export_seconds": export_s, "nccl_conf": table.conf,
            "run_dir": str(run_dir), "rows": len(table.rows)}


def _format_report(target, bands, s, conf, paths, plot, export_s) -> str:
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
              f"worst size {s['worst_vs_default']:.3f}x",
              f"wrote {paths['csv']}, {paths['json'].name}, {paths['conf'].name}, {plot.name} "
              f"(export {export_s:.2f} s)"]
    return "\n".join(lines)


def cmd_export(cfg: DictConfig) -> int:
    """``ncclrl export checkpoint=P topology=...``: export for another platform without retraining."""
    _threads(cfg)
    model = load_policy(cfg.checkpoint)
    run_dir = _run_dir(cfg)
    run_dir.mkdir(parents=True, exist_ok=True)
    export_and_report(model, target_topology(cfg), run_dir, cfg, policy_path=checkpoint_path(cfg.checkpoint))
    return 0


def seconds(x: float) -> str:
    return f"{x:.1f} s" if x < 120 else f"{x / 60:.1f} min"


def main_pretrain(cfg: DictConfig) -> int:
    res = train(cfg)
    print(f"pretraining took {seconds(res['pretrain_seconds'])}; run folder: {res['run_dir']}")
    return 0


PRETRAIN = Command("pretrain", PretrainConfig, main_pretrain,
                   "pretrain in simulation, evaluate on the target platform, export its table", out_key="run_dir")
EXPORT = Command("export", ExportConfig, cmd_export,
                 "export a trained policy's table for a platform, without retraining", out_key="run_dir")
register(PRETRAIN)
register(EXPORT)
