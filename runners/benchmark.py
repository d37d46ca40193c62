"""``ncclrl benchmark``: every tuner on the same simulated problems, space and budgets.

    ncclrl benchmark                    # suite=full
    ncclrl benchmark suite=ci workers=1
    ncclrl benchmark -m suite.seeds=[0],[1]    # multirun: one folder per run

A *problem* is one held-out platform (a preset's simulator parameters drawn afresh, with a seed
stream pretraining never used) and one collective over its sizes. Each method tunes it through
:class:`ncclrl.agents.baselines.base.Evaluator` (noisy simulated measurements, every point counted)
under each budget; its decision is judged on the platform's noise-free times: geometric-mean
speedup over NCCL's plain default and the fraction of the optimum (the best a table plus one
``nccl.conf`` can reach in the space). Writes ``results.csv`` (one row per problem, seed,
method, budget), ``summary.csv`` and plots into ``out``; the same configuration gives the same
tables whatever ``workers`` is.
"""

from __future__ import annotations

import logging
import os
import time
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from omegaconf import DictConfig, OmegaConf

from ncclrl.agents.baselines import METHODS, Evaluator, Oracle, Problem, make_tuner, sim_measure
from ncclrl.agents.pretrain import checkpoint_path, load_policy
from ncclrl.costmodel import nccl as N
from ncclrl.costmodel.errors import ConfigError
from ncclrl.costmodel.noise import geomean
from ncclrl.costmodel.simulator import Simulator
from ncclrl.costmodel.topology import load_topology
from ncclrl.costmodel.units import parse_bytes
from ncclrl.runners.config import Command, compose_config, register
from ncclrl.runners.pretrain import CONF_DIR  # noqa: F401  (re-exported for the tests)
from ncclrl.runners.progress import progress

log = logging.getLogger(__name__)
RESULT_COLUMNS = ["suite", "preset", "platform", "collective", "seed", "method", "budget", "used", "calls",
                  "speedup", "optimum", "fraction", "worst", "wall_s"]


@dataclass
class SuiteConfig:
    """Which problems, budgets and methods (group suite=).

    :param name: the suite's name (its results folder)
    :param topologies: presets the held-out platforms are drawn around
    :param platforms: held-out platforms per preset: simulator parameters drawn around it
    :param platform_seed: seed of those draws (pretraining draws from seed * 1000 + rank, never this)
    :param randomize_scale: 1 = the full bounds of the simulator's RANDOMIZATION
    :param collectives: the collectives of the problems
    :param min_bytes: the smallest size of a problem
    :param max_bytes: the largest size of a problem
    :param seeds: seeds of the tuners' randomness and the measurement noise
    :param budgets: evaluations per (platform, collective), over all its sizes
    :param methods: default, exhaustive, random, afnfa, tpe, autoccl, ncclrl-pretrained, ncclrl
    """

    name: str = "full"
    topologies: list[str] = field(default_factory=lambda: [
        "h200-1x4", "h200-2x2-sock", "dgx-h100-2n", "dgx-h100-16n", "a100-16x4-ib", "a40-4x8-ib", "v100-2x8-eth"])
    platforms: int = 2
    platform_seed: int = 20261121
    randomize_scale: float = 1.0
    collectives: list[str] = field(default_factory=lambda: ["allreduce", "allgather", "reducescatter", "broadcast"])
    min_bytes: str = "8"
    max_bytes: str = "1G"
    seeds: list[int] = field(default_factory=lambda: [0, 1])
    budgets: list[int] = field(default_factory=lambda: [50, 200, 1000, 5000])
    methods: list[str] = field(default_factory=lambda: list(METHODS))


@dataclass
class BenchmarkConfig:
    """Every tuner (NCCL's default, exhaustive sweep, random, AFNFA, Optuna TPE, AutoCCL-style
    coordinate descent, ncclrl pretrained and fine-tuned) on held-out simulated platforms under
    the same budgets; writes results.csv, summary.csv and benchmark.png.

    :param suite: the problems, budgets and methods (group suite=full|ci)
    :param checkpoint: the policy ncclrl starts from: pretrained (shipped with ncclrl) or a policy.zip path
    :param samples: repetitions per evaluation (their median is what a tuner sees)
    :param ppo_steps: ncclrl: PPO steps on the refit model per fine-tuning round
    :param rounds: ncclrl: most fine-tuning search rounds
    :param verify: ncclrl: most extra guard jobs for the rows the guard dropped (0: none)
    :param workers: processes; results do not depend on it
    :param out: the results folder (default: runs/benchmark/<suite name>)
    """

    defaults: list[Any] = field(default_factory=lambda: ["_self_", {"suite": "full"}])
    suite: SuiteConfig = field(default_factory=SuiteConfig)
    checkpoint: str = "pretrained"
    samples: int = 5
    ppo_steps: int = 0
    rounds: int = 8
    verify: int = 32
    workers: int = 2
    out: str | None = None

    def check(self) -> None:
        check(self)


def compose(overrides: list[str]) -> DictConfig:
    """The benchmark's config with ``overrides``; a bad override is a one-line ``ConfigError``."""
    return compose_config(COMMAND, overrides)


def check(cfg: DictConfig) -> None:
    """Early, one-line errors for every field a run would trip on later."""

    s = cfg.suite
    for t in s.topologies:
        load_topology(str(t))
    for c in s.collectives:
        N.parse_name("suite.collectives", str(c), N.COLLECTIVES)
    for m in s.methods:
        if m not in METHODS:
            raise ConfigError("suite.methods", f"unknown method {m!r}; allowed: {', '.join(METHODS)}")
    for b in s.budgets:
        if not isinstance(b, int) or b < 0:
            raise ConfigError("suite.budgets", f"budgets are whole numbers >= 0, got {b!r}")
    if int(s.platforms) < 1:
        raise ConfigError("suite.platforms", f"must be >= 1, got {s.platforms}")
    if not 0 < parse_bytes(s.min_bytes, "suite.min_bytes") <= parse_bytes(s.max_bytes, "suite.max_bytes"):
        raise ConfigError("suite.min_bytes", f"need 0 < min_bytes <= max_bytes, got {s.min_bytes}, {s.max_bytes}")
    if int(cfg.workers) < 1:
        raise ConfigError("workers", f"must be >= 1, got {cfg.workers}")
    if int(cfg.samples) < 1:
        raise ConfigError("samples", f"must be >= 1, got {cfg.samples}")
    if int(cfg.rounds) < 1:
        raise ConfigError("rounds", f"must be >= 1, got {cfg.rounds}")
    if int(cfg.verify) < 0:
        raise ConfigError("verify", f"must be >= 0, got {cfg.verify}")
    if any(m.startswith("ncclrl") for m in s.methods) and not checkpoint_path(cfg.checkpoint).is_file():
        raise ConfigError("checkpoint", f"no policy at {cfg.checkpoint!r}; pass checkpoint=PATH/policy.zip or "
                          "drop the ncclrl methods from suite.methods")


def _stable(*parts: Any) -> int:
    return zlib.crc32("/".join(map(str, parts)).encode())


def tasks(cfg: DictConfig) -> list[dict[str, Any]]:
    s = cfg.suite
    return [{"preset": str(t), "draw": d, "collective": str(c), "seed": int(seed)}
            for t in s.topologies for d in range(int(s.platforms)) for c in s.collectives for seed in s.seeds]


_MODEL: dict[str, Any] = {}


def _model(path: str, fresh: bool):

    if fresh or path not in _MODEL:
        _MODEL[path] = load_policy(checkpoint_path(path))
    return _MODEL[path]


def run_task(task: dict[str, Any], cfg: dict[str, Any]) -> list[dict[str, Any]]:
    """Every method and budget on one (platform, collective, seed)."""
    import torch

    torch.set_num_threads(1)
    s = cfg["suite"]
    topo = load_topology(task["preset"])
    coll = N.COLLECTIVES.index(task["collective"])
    problem = Problem.make(topo, [coll], parse_bytes(s["min_bytes"]), parse_bytes(s["max_bytes"]))
    rng = np.random.default_rng([int(s["platform_seed"]), _stable(task["preset"]), task["draw"]])
    truth = Simulator(topo).randomized(rng, float(s["randomize_scale"]))
    oracle = Oracle(problem, truth)
    rows = []
    for method in s["methods"]:
        for budget in s["budgets"]:
            noise = _stable(task["preset"], task["draw"], task["collective"], task["seed"], method, budget)
            ev = Evaluator(problem, sim_measure(Simulator(topo, truth.params, seed=noise)), int(budget),
                           samples=int(cfg["samples"]))
            kwargs = {"ppo_steps": int(cfg["ppo_steps"]), "rounds": int(cfg["rounds"]),
                      "verify": int(cfg["verify"])} if method == "ncclrl" else {}
            model = _model(cfg["checkpoint"], fresh=int(cfg["ppo_steps"]) > 0) if method.startswith("ncclrl") \
                else None
            t0 = time.perf_counter()
            decision = make_tuner(method, model, **kwargs).tune(problem, ev, task["seed"])
            wall = time.perf_counter() - t0
            if ev.used > ev.budget:
                raise AssertionError(f"{method} used {ev.used} evaluations of a budget of {ev.budget}")
            v = oracle.score(decision)
            rows.append({"suite": s["name"], "preset": task["preset"],
                         "platform": f"{task['preset']}#{task['draw']}", "collective": task["collective"],
                         "seed": task["seed"], "method": method, "budget": int(budget), "used": ev.used,
                         "calls": ev.calls, "speedup": v.speedup, "optimum": v.optimum, "fraction": v.fraction,
                         "worst": v.worst, "wall_s": wall})
    return rows


def summarize(df: pd.DataFrame) -> pd.DataFrame:
    """Per method and budget: geometric means over problems and seeds of the speedup and of the
    fraction of the optimum, the worst fraction, mean evaluations used, total wall time."""
    g = df.groupby(["method", "budget"], sort=False)
    out = pd.DataFrame({
        "speedup": g["speedup"].apply(geomean),
        "fraction": g["fraction"].apply(geomean),
        "worst_fraction": g["fraction"].min(),
        "used": g["used"].mean(),
        "problems": g.size(),
        "wall_s": g["wall_s"].sum(),
    }).reset_index()
    return out


def plot(df: pd.DataFrame, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    s = summarize(df)
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for method, g in s.groupby("method", sort=False):
        g = g.sort_values("budget")
        style = "-o" if method.startswith("ncclrl") else "--."
        axes[0].plot(g["used"].clip(lower=1), g["fraction"], style, label=method)
        axes[1].plot(g["budget"], g["speedup"], style, label=method)
    axes[0].set_xlabel("evaluations used (mean per problem)")
    axes[0].set_ylabel("fraction of the optimum (geo. mean)")
    axes[1].set_xlabel("budget (evaluations per problem)")
    axes[1].set_ylabel("speedup over NCCL default (geo. mean)")
    for ax in axes:
        ax.set_xscale("log")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle(f"ncclrl benchmark: {df['platform'].nunique()} held-out platforms, "
                 f"{df['collective'].nunique()} collectives, {df['seed'].nunique()} seeds")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def benchmark(cfg: DictConfig) -> pd.DataFrame:
    """Run the suite of ``cfg`` (conf/benchmark.yaml); returns the results table."""
    from concurrent.futures import ProcessPoolExecutor

    check(cfg)
    out = Path(str(cfg.out or f"runs/benchmark/{cfg.suite.name}"))
    out.mkdir(parents=True, exist_ok=True)
    plain = OmegaConf.to_container(cfg, resolve=True)
    todo = tasks(cfg)
    t0 = time.time()
    rows: list[dict[str, Any]] = []

    def done(i: int, t: dict[str, Any]) -> None:
        log.info("# %d/%d %s#%d %s seed %d: %.0f s", i + 1, len(todo), t["preset"], t["draw"], t["collective"],
                 t["seed"], time.time() - t0)
        bar.advance()

    with progress("benchmark", len(todo)) as bar:
        if int(cfg.workers) == 1:
            for i, t in enumerate(todo):
                rows += run_task(t, plain)
                done(i, t)
        else:
            os.environ.setdefault("OMP_NUM_THREADS", "1")
            with ProcessPoolExecutor(int(cfg.workers)) as pool:
                for i, r in enumerate(pool.map(run_task, todo, [plain] * len(todo))):
                    rows += r
                    done(i, todo[i])
    df = pd.DataFrame(rows, columns=RESULT_COLUMNS)
    df.to_csv(out / "results.csv", index=False, float_format="%.6g")
    s = summarize(df)
    s.to_csv(out / "summary.csv", index=False, float_format="%.6g")
    plot(df, out / "benchmark.png")
    OmegaConf.save(cfg, out / "config.yaml")
    print_summary(s)
    log.info("# %d results in %.0f s -> %s/results.csv, summary.csv, benchmark.png", len(df), time.time() - t0, out)
    return df


def print_summary(s: pd.DataFrame) -> None:
    print("# fraction of the optimum (geometric mean over problems); speedup over NCCL's default")
    print(f"{'method':>18} {'budget':>7} {'used':>7} {'fraction':>9} {'worst':>6} {'speedup':>8} {'wall_s':>7}")
    for r in s.itertuples(index=False):
        print(f"{r.method:>18} {r.budget:>7} {r.used:>7.0f} {r.fraction:>9.3f} {r.worst_fraction:>6.2f} "
              f"{r.speedup:>8.3f} {r.wall_s:>7.1f}")


def main_benchmark(cfg: DictConfig) -> int:
    benchmark(cfg)
    return 0


COMMAND = Command("benchmark", BenchmarkConfig, main_benchmark,
                  "every tuner on held-out simulated platforms under the same budgets", out_key="out")
register(COMMAND)
