"""``ncclrl pretrain`` and ``ncclrl export``: an importable ``train(cfg)`` behind a thin command.

The configuration is composed by Hydra from ``conf/`` (defaults list in ``conf/config.yaml``);
overrides come from the command line (``topology=dgx-h100-2n agent.total_timesteps=50000``).
"""

from __future__ import annotations

import datetime as _dt
import json
import time
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from costmodel.errors import ConfigError
from costmodel.topology import Topology, load_topology, topology_from_dict

CONF_DIR = Path(__file__).resolve().parent.parent / "conf"


def compose(overrides: list[str], config_name: str = "config") -> DictConfig:
    """Compose the configuration; a bad override is a one-line ``ConfigError``."""
    from hydra import compose as h_compose
    from hydra import initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    try:
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            return h_compose(config_name=config_name, overrides=list(overrides))
    except (HydraException, OmegaConfBaseException) as e:
        msg = " ".join(str(e).split())
        groups = GROUPS.get(config_name, ())
        raise ConfigError("overrides", f"{msg} (groups: {', '.join(f'{g}={_options(g)}' for g in groups)})") from None


# the config groups of each primary config in conf/
GROUPS = {"config": ("topology", "agent", "backend", "experiment"), "benchmark": ("suite",)}


def _options(group: str) -> str:
    return "|".join(sorted(p.stem for p in (CONF_DIR / group).glob("*.yaml")))


def target_topology(cfg: DictConfig) -> Topology:
    d = OmegaConf.to_container(cfg.topology, resolve=True)
    if isinstance(d, str):
        return load_topology(d)
    return topology_from_dict(d)


def _agent_config(cfg: DictConfig, seed: int):
    from agents.pretrain import AgentConfig

    a = cfg.agent
    known = {"total_timesteps", "n_envs", "n_steps", "batch_size", "n_epochs", "learning_rate", "ent_coef",
             "net_arch", "device", "checkpoint_every"}
    for k in a:
        if k not in known:
            raise ConfigError(f"agent.{k}", f"unknown setting; allowed: {', '.join(sorted(known))}")
    return AgentConfig(total_timesteps=int(a.total_timesteps), n_envs=int(a.n_envs), n_steps=int(a.n_steps),
                       batch_size=int(a.batch_size), n_epochs=int(a.n_epochs), learning_rate=float(a.learning_rate),
                       ent_coef=float(a.ent_coef), net_arch=list(a.net_arch), seed=seed, device=str(a.device))


def _run_dir(cfg: DictConfig) -> Path:
    if cfg.get("run_dir"):
        return Path(cfg.run_dir)
    return Path("runs") / _dt.datetime.now().strftime("%Y-%m-%d_%H-%M-%S")


def train(cfg: DictConfig) -> dict[str, Any]:
    """Pretrain in simulation, evaluate on the target, export its table; return the summary."""
    from agents.pretrain import pretrain

    if cfg.backend.kind != "sim":
        raise ConfigError("backend.kind", f"pretraining runs on the simulator; allowed: sim, got {cfg.backend.kind}")
    target = target_topology(cfg)
    exp = cfg.experiment
    topologies = [str(t) for t in exp.pretrain_topologies]
    for t in topologies:
        load_topology(t)
    run_dir = _run_dir(cfg)
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.yaml").write_text(OmegaConf.to_yaml(cfg))
    agent_cfg = _agent_config(cfg, int(cfg.seed))
    t0 = time.perf_counter()
    model = pretrain(topologies, agent_cfg, run_dir, randomize=float(exp.randomize),
                     randomize_scale=float(exp.randomize_scale), noise=bool(cfg.backend.noise),
                     collectives=list(exp.collectives), min_bytes=int(exp.min_bytes), max_bytes=int(exp.max_bytes),
                     progress_bar=bool(cfg.progress_bar), checkpoint_every=int(cfg.agent.checkpoint_every))
    train_s = time.perf_counter() - t0
    result = export_and_report(model, target, run_dir, cfg, policy_path=run_dir / "policy.zip")
    result.update(pretrain_seconds=train_s, pretrain_topologies=topologies)
    (run_dir / "summary.json").write_text(json.dumps(result, indent=1, default=float))
    return result


def export_and_report(model, target: Topology, run_dir: Path, cfg: DictConfig, policy_path: Path) -> dict[str, Any]:
    from costmodel.simulator import Simulator
    from runners.evaluate import band_report, evaluate_table, s_curve_plot, summary
    from runners.export import export_table, file_sha256, write_table

    sim = Simulator(target)
    t0 = time.perf_counter()
    table = export_table(model, sim, margin=float(cfg.export.margin), tune_conf=bool(cfg.export.tune_conf),
                         top_k=int(cfg.export.top_k),
                         provenance={"policy_sha256": file_sha256(policy_path), "seed": int(cfg.seed),
                                     "checkpoint": str(policy_path)})
    paths = write_table(table, run_dir / "table")
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


def cmd_export(checkpoint: str, overrides: list[str]) -> dict[str, Any]:
    """``ncclrl export --checkpoint P topology=...``: export for another platform without retraining."""
    from agents.pretrain import load_policy

    cfg = compose(overrides)
    model = load_policy(checkpoint)
    target = target_topology(cfg)
    run_dir = _run_dir(cfg)
    run_dir.mkdir(parents=True, exist_ok=True)
    return export_and_report(model, target, run_dir, cfg, policy_path=Path(checkpoint))


def seconds(x: float) -> str:
    return f"{x:.1f} s" if x < 120 else f"{x / 60:.1f} min"


def main_pretrain(overrides: list[str]) -> int:
    cfg = compose(overrides)
    res = train(cfg)
    print(f"pretraining took {seconds(res['pretrain_seconds'])}; run folder: {res['run_dir']}")
    return 0
