"""``ncclrl benchmark``: every tuner on the same problems, space, information and budgets.

    ncclrl benchmark                    # suite=full
    ncclrl benchmark suite=ci workers=1
    ncclrl benchmark -m suite.seeds=[0],[1]    # multirun: one folder per run

Problem sets (:mod:`ncclrl.agents.suite`): ``lofo`` (platforms of a preset family the strategy was
trained without), ``misspecified`` (the same with effects the simulator lacks) and ``replay``
(recorded sweeps of real machines as truth), ``grids`` (public measured grids read from the shared
data folder as truth; skipped, with a one-line reason, where that folder is absent). Each method
tunes each problem through :class:`ncclrl.agents.problem.Evaluator` (every job charged its
GPU-time) under each GPU-time budget and seed; its decision is judged on the problem's truth as
the fraction of the optimum (the best a table plus one ``nccl.conf`` reaches in the space). Writes
``results.csv`` (one row per problem, seed, method and budget, with the GPU-time it spent, its
points and jobs, model evaluations and wall time), ``summary.csv`` (per set, method and budget: the
mean over problems of the median over
seeds, with a 95% bootstrap interval over problems; the reference method's (``ref``) paired
difference to it with its interval; wins and losses over problems) and ``benchmark.png`` into ``out``. Each finished
(problem, seed) is appended to ``out/partial.csv`` at once, and a rerun of the same configuration
resumes from it. The strategies a set
needs are trained into ``strategies`` first (or read from there). The same configuration gives
the same tables whatever ``workers`` is.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from omegaconf import DictConfig, OmegaConf

from ncclrl.agents.baselines import METHODS, Evaluator, make_tuner
from ncclrl.agents.search import PolicyController
from ncclrl.agents.strategy_config import AgentConfig, ExperimentConfig
from ncclrl.agents.suite import SETS, Instance, public_gridded, replayed, simulated
from ncclrl.costmodel import nccl as N
from ncclrl.costmodel.errors import ConfigError
from ncclrl.costmodel.jobcost import DEFAULT_JOB_COST, parse_budget
from ncclrl.costmodel.platforms import FAMILIES, family_of
from ncclrl.costmodel.topology import load_topology
from ncclrl.costmodel.units import parse_bytes
from ncclrl.costmodel.workload import calls_by_size, load_workload
from ncclrl.envs.grids import PUBLIC_GRIDS, public_grid_folder
from ncclrl.runners.config import Command, compose_config, register
from ncclrl.runners.pretrain import CONF_DIR  # noqa: F401  (re-exported for the tests)
from ncclrl.runners.progress import progress
from ncclrl.runners.tune import check_extra

log = logging.getLogger(__name__)
RESULT_COLUMNS = ["suite", "set", "problem", "family", "collective", "seed", "method", "budget", "budget_gpu_s",
                  "sweep_gpu_s", "gpu_s", "points", "jobs", "model_evals", "fraction", "speedup", "optimum", "worst",
                  "slower", "safe_optimum", "safe_fraction", "wall_s"]


@dataclass
class ReplayConfig:
    """A recorded sweep replayed as truth.

    :param store: the store holding the sweep (a path inside the repository or absolute)
    :param topology: the preset the sweep was measured as
    :param launch: how it was measured (nccl or torch)
    :param more_stores: further stores with repeats of the same sweep (pooled with it)
    :param min_jobs: only the knob settings recorded in at least this many jobs per point
    :param name: the problem's name after the topology (``h200-2x2-sock:recorded``)
    """

    store: str = "data/h200x4-2026-11-21/store.sqlite"
    topology: str = "h200-2x2-sock"
    launch: str = "nccl"
    more_stores: list[str] = field(default_factory=list)
    min_jobs: int = 1
    name: str = "recorded"


@dataclass
class SuiteConfig:
    """Which problems, budgets and methods (group suite=).

    :param name: the suite's name (its results folder)
    :param sets: problem sets: lofo, misspecified, replay, grids
    :param families: preset families of the lofo and misspecified sets
    :param platforms: platforms drawn per preset
    :param platform_seed: seed of those draws (training draws from other streams)
    :param collectives: the collectives of the simulated problems
    :param min_bytes: the smallest size of a simulated problem
    :param max_bytes: the largest size of a simulated problem
    :param replays: recorded sweeps replayed as truth (their AllReduce)
    :param grids: set grids: the public measured grids replayed as truth (names of
        ncclrl.envs.grids.PUBLIC_GRIDS), read from NCCLRL_SHARED_DATA (else ../shared/data)/public-grids
    :param seeds: seeds of the tuners' randomness and the measurement noise (>= 5 for a report)
    :param budgets: GPU-time per problem: ``Nsweep`` is N times what one full sweep of the problem costs
        (one job per knob setting, every configuration at every size), else a GPU-time (``600s``, ``10min``)
    :param methods: default, sweep, sweep-race, random, afnfa, tpe, autoccl, zero-shot, bo, ei-per-s,
        ucb-per-s, jobs, confirm, rank, ncclrl, ppo, kg-jobs (afnfa and tpe need the extra: pip install
        "ncclrl[baselines]")
    :param strategy_steps: picks each left-out strategy is trained on, when it is not in ``strategies``
    :param profile: a job profile (ncclrl profile): each simulated problem has the job's sizes of its
        collective and is judged on the job's communication time per step (calls x time), every call
        counted on the preset's whole job; the collectives are the profile's (simulated sets only)
    """

    name: str = "full"
    sets: list[str] = field(default_factory=lambda: list(SETS))
    families: list[str] = field(default_factory=lambda: list(FAMILIES))
    platforms: int = 1
    platform_seed: int = 20261123
    collectives: list[str] = field(default_factory=lambda: ["allreduce"])
    min_bytes: str = "8"
    max_bytes: str = "1G"
    replays: list[ReplayConfig] = field(default_factory=lambda: [
        ReplayConfig(), ReplayConfig("data/h200x2-2026-11-22/store.sqlite", "h200-2x1-sock", "nccl")])
    grids: list[str] = field(default_factory=lambda: list(PUBLIC_GRIDS))
    seeds: list[int] = field(default_factory=lambda: [0, 1, 2, 3, 4])
    budgets: list[str] = field(default_factory=lambda: ["0.1sweep", "0.25sweep", "0.5sweep", "1sweep"])
    methods: list[str] = field(default_factory=lambda: list(METHODS))
    strategy_steps: int = 150_000
    profile: str = ""


@dataclass
class BenchmarkConfig:
    """Every tuner (NCCL's default, exhaustive sweep, random, AFNFA and Optuna TPE warm-started from
    the prior, AutoCCL-style coordinate descent, the prior's zero-shot table, Bayesian optimization
    with the prior, ncclrl with its learner removed, ncclrl) on the same problems under the same
    budgets; writes results.csv, summary.csv and benchmark.png.

    :param suite: the problems, budgets and methods (group suite=full|ci)
    :param strategies: folder of the left-out strategies (without-FAMILY.json); missing ones are trained there
    :param samples: repetitions per evaluation (their median is what a tuner sees)
    :param workers: processes; results do not depend on it
    :param out: the results folder (default: runs/benchmark/<suite name>)
    :param ref: the method every other is compared with, paired by problem (jobs: whole jobs by expected
        improvement per GPU-second; finetune's default is confirm)
    """

    defaults: list[Any] = field(default_factory=lambda: ["_self_", {"suite": "full"}])
    suite: SuiteConfig = field(default_factory=SuiteConfig)
    strategies: str | None = None
    samples: int = 5
    workers: int = 2
    out: str | None = None
    ref: str = "jobs"

    def check(self) -> None:
        check(self)


def compose(overrides: list[str]) -> DictConfig:
    """The benchmark's config with ``overrides``; a bad override is a one-line ``ConfigError``."""
    return compose_config(COMMAND, overrides)


def check(cfg: DictConfig) -> None:
    """Early, one-line errors for every field a run would trip on later."""

    s = cfg.suite
    for key, allowed in (("sets", ", ".join(SETS)), ("methods", ", ".join(METHODS)), ("seeds", "integers"),
                         ("budgets", "GPU-times or Nsweep")):
        if not list(getattr(s, key)):
            raise ConfigError(f"suite.{key}", f"is empty: a benchmark needs at least one; allowed: {allowed}")
    for x in s.sets:
        if x not in SETS:
            raise ConfigError("suite.sets", f"unknown set {x!r}; allowed: {', '.join(SETS)}")
    if cfg.strategies and Path(str(cfg.strategies)).exists() and not Path(str(cfg.strategies)).is_dir():
        raise ConfigError("strategies", f"{cfg.strategies} is a file; give a folder (its without-FAMILY.json "
                          "strategies, trained there when missing)")
    for f in s.families:
        if f not in FAMILIES:
            raise ConfigError("suite.families", f"unknown family {f!r}; allowed: {', '.join(FAMILIES)}")
    for r in s.replays:
        load_topology(str(r.topology))
        if "replay" in s.sets:
            for x in [r.store, *(getattr(r, "more_stores", None) or [])]:
                replay_store(str(x))
        if int(getattr(r, "min_jobs", 1) or 1) < 1:
            raise ConfigError("suite.replays", f"min_jobs must be >= 1, got {r.min_jobs}")
        if r.launch not in ("nccl", "torch"):
            raise ConfigError("suite.replays", f"launch must be nccl or torch, got {r.launch!r}")
    for g in getattr(s, "grids", []):
        if g not in PUBLIC_GRIDS:
            raise ConfigError("suite.grids", f"unknown grid {g!r}; allowed: {', '.join(PUBLIC_GRIDS)}")
    if list(s.sets) == ["grids"] and list(getattr(s, "grids", [])) and not public_grid_folder().is_dir():
        raise ConfigError("suite.sets", f"the grids set alone poses no problem here: the public grids are not at "
                          f"{public_grid_folder()} (set NCCLRL_SHARED_DATA to the folder holding public-grids/), or "
                          f"add another set; allowed: {', '.join(SETS)}")
    for c in s.collectives:
        N.parse_name("suite.collectives", str(c), N.COLLECTIVES)
    for m in s.methods:
        if m not in METHODS:
            raise ConfigError("suite.methods", f"unknown method {m!r}; allowed: {', '.join(METHODS)}")
    check_extra(list(s.methods), "suite.methods")
    for b in s.budgets:
        budget_gpu_s(str(b), 1.0)
    if _profile(s):
        if "replay" in s.sets or "grids" in s.sets:
            raise ConfigError("suite.profile", "applies to the simulated sets (lofo, misspecified): a replayed "
                              "sweep has its own sizes; set suite.sets=[lofo,misspecified]")
        job_sizes(_profile(s), load_topology(FAMILIES[s.families[0]][0]))
    if int(s.platforms) < 1:
        raise ConfigError("suite.platforms", f"must be >= 1, got {s.platforms}")
    if int(s.strategy_steps) < 1:
        raise ConfigError("suite.strategy_steps", f"must be >= 1, got {s.strategy_steps}")
    if not 0 < parse_bytes(s.min_bytes, "suite.min_bytes") <= parse_bytes(s.max_bytes, "suite.max_bytes"):
        raise ConfigError("suite.min_bytes", f"need 0 < min_bytes <= max_bytes, got {s.min_bytes}, {s.max_bytes}")
    if str(getattr(cfg, "ref", "jobs")) not in METHODS:
        raise ConfigError("ref", f"unknown method {cfg.ref!r}; allowed: {', '.join(METHODS)}")
    if int(cfg.workers) < 1:
        raise ConfigError("workers", f"must be >= 1, got {cfg.workers}")
    if int(cfg.samples) < 1:
        raise ConfigError("samples", f"must be >= 1, got {cfg.samples}")


def budget_gpu_s(budget: str, sweep_gpu_s: float) -> float:
    """GPU-seconds of a benchmark budget (:func:`ncclrl.costmodel.jobcost.parse_budget`)."""
    return parse_budget(budget, sweep_gpu_s, "suite.budgets")


# the package's root: the recorded sweeps a suite names relative to it (data/...) are found from any folder
PACKAGE_ROOT = Path(__file__).resolve().parents[1]


def replay_store(path: str) -> Path:
    """A replayed sweep's store: ``path`` as given (absolute, or relative to the working folder),
    else relative to the package (the recorded sweeps of a source checkout); absent: one line."""
    given = Path(path).expanduser()
    for p in (given, PACKAGE_ROOT / given):
        if p.is_file():
            return p
    where = "" if given.is_absolute() else f" (nor under {PACKAGE_ROOT})"
    raise ConfigError("suite.replays", f"no store at {path}{where}: the recorded sweeps come with ncclrl's source, "
                      "not its wheel; name a store (suite.replays=[{store: PATH, topology: PRESET, launch: nccl}]) "
                      "or leave the replay set out (suite.sets=[lofo,misspecified])")


def _profile(suite: Any) -> str:
    """``suite.profile`` of a config, its dataclass or its plain dict ("" when unset)."""
    return str((suite.get("profile") if isinstance(suite, dict) else getattr(suite, "profile", "")) or "")


def job_sizes(path: str, topo: Any) -> dict[str, dict[int, float]]:
    """Calls per step of the profile at ``path`` per collective and bytes, every call moved to
    ``topo``'s whole job (:func:`ncclrl.costmodel.workload.calls_by_size`)."""
    if not Path(path).is_file():
        raise ConfigError("suite.profile", f"file not found: {path}")
    try:
        work = load_workload(path, topology=topo)
    except ConfigError as e:
        raise ConfigError("suite.profile", str(e).split(": ", 1)[1] if e.field == "profile" else str(e)) from None
    return calls_by_size(work, topo.nodes, topo.nranks)


_SAID: set[str] = set()


def tasks(cfg: DictConfig) -> list[dict[str, Any]]:
    """One task per (set, problem, seed): the left-out family names the strategy it uses; with
    ``suite.profile`` the collectives are the profile's and every problem is the job's."""
    s = cfg.suite
    prof = _profile(s)
    if prof:
        colls = sorted({c for f in s.families for p in FAMILIES[f] for c in job_sizes(prof, load_topology(p))},
                       key=N.COLLECTIVES.index)
        tag = "@" + Path(prof).stem
    else:
        colls, tag = [str(c) for c in s.collectives], ""
    out = []
    for st in s.sets:
        if st == "replay":
            probs = [{"set": st, "replay": dict(r), "collective": "allreduce",
                      "problem": f"{r['topology']}:{r.get('name') or 'recorded'}",
                      "family": family_of(r["topology"])} for r in OmegaConf.to_container(s.replays)]
        elif st == "grids":
            probs = [{"set": st, "grid": g, "collective": "allreduce", "problem": f"{g}:grid",
                      "family": PUBLIC_GRIDS[g].family} for g in getattr(s, "grids", [])]
            if probs and not public_grid_folder().is_dir():
                said = f"# set grids skipped: no public grids at {public_grid_folder()} (set NCCLRL_SHARED_DATA)"
                if said not in _SAID:  # once, however often the tasks are listed
                    _SAID.add(said)
                    log.info("%s", said)
                probs = []
        else:
            probs = [{"set": st, "preset": p, "draw": d, "collective": c, "family": f, "problem": f"{p}#{d}:{c}{tag}"}
                     for f in s.families for p in FAMILIES[f] for d in range(int(s.platforms)) for c in colls
                     if not prof or c in job_sizes(prof, load_topology(p))]
        out += [dict(pr, seed=int(seed)) for pr in probs for seed in s.seeds]
    return out


def strategy_path(folder: Path, family: str) -> Path:
    return folder / f"without-{family}.json"


def ensure_strategies(cfg: DictConfig, folder: Path) -> None:
    """Train the left-out strategies the tasks need and ``folder`` lacks."""
    if "ncclrl" not in cfg.suite.methods:
        return
    from ncclrl.agents.strategy_train import train  # PyTorch, only when a strategy is trained

    for fam in sorted({t["family"] for t in tasks(cfg)}):
        path = strategy_path(folder, fam)
        if path.is_file():
            continue
        rest = [f for f in FAMILIES if f != fam]
        log.info("# training the strategy without %s (%d picks)", fam, int(cfg.suite.strategy_steps))
        train(AgentConfig(total_timesteps=int(cfg.suite.strategy_steps)), ExperimentConfig(families=rest),
              log=log.info).save(path)


_CACHE: dict[str, Any] = {}


def instance(task: dict[str, Any], s: dict[str, Any]) -> Instance:
    key = task["problem"] + task["set"]
    if key not in _CACHE:
        if task["set"] == "replay":
            r = task["replay"]
            stores = [str(replay_store(x)) for x in [r["store"], *(r.get("more_stores") or [])]]
            _CACHE[key] = replayed(stores if len(stores) > 1 else stores[0], r["topology"], r["launch"],
                                   task["collective"], min_jobs=int(r.get("min_jobs") or 1))
        elif task["set"] == "grids":
            _CACHE[key] = public_gridded(task["grid"])
            log.info("# %s: NCCL's default: %s", task["grid"], _CACHE[key].problem.default_source)
        else:
            calls = job_sizes(_profile(s), load_topology(task["preset"]))[task["collective"]] \
                if _profile(s) else None
            _CACHE[key] = simulated(task["preset"], task["draw"], task["collective"], int(s["platform_seed"]),
                                    task["set"] == "misspecified", parse_bytes(s["min_bytes"]),
                                    parse_bytes(s["max_bytes"]), calls=calls)
    return _CACHE[key]


def run_task(task: dict[str, Any], cfg: dict[str, Any]) -> list[dict[str, Any]]:
    """Every method and budget on one (problem, seed)."""
    s = cfg["suite"]
    inst = instance(task, s)
    strategy = None
    if "ncclrl" in s["methods"]:
        strategy = PolicyController.load(strategy_path(Path(cfg["strategies"]), task["family"]))
    rows = []
    sweep = inst.oracle.sweep_gpu_s(DEFAULT_JOB_COST, int(cfg["samples"]))
    for method in s["methods"]:
        for budget in s["budgets"]:
            gpu_s = budget_gpu_s(str(budget), sweep)
            ev = Evaluator(inst.problem, inst.measure_for(task["seed"]), gpu_s, samples=int(cfg["samples"]))
            t0 = time.perf_counter()
            decision = make_tuner(method, strategy).tune(inst.problem, ev, task["seed"])
            wall = time.perf_counter() - t0
            if ev.gpu_s > ev.budget + 1e-6:
                raise AssertionError(f"{method} spent {ev.gpu_s} GPU-s of a budget of {ev.budget}")
            v = inst.oracle.score(decision)
            rows.append({"suite": s["name"], "set": task["set"], "problem": task["problem"], "family": task["family"],
                         "collective": task["collective"], "seed": task["seed"], "method": method,
                         "budget": str(budget), "budget_gpu_s": gpu_s, "sweep_gpu_s": sweep, "gpu_s": ev.gpu_s,
                         "points": ev.points, "jobs": ev.calls, "model_evals": ev.model_evals,
                         "fraction": v.fraction, "speedup": v.speedup, "optimum": v.optimum, "worst": v.worst,
                         "slower": v.slower, "safe_optimum": v.safe_optimum, "safe_fraction": v.safe_fraction,
                         "wall_s": wall})
    return rows


def _boot(x: np.ndarray, rng: np.random.Generator, n: int = 2000) -> tuple[float, float]:
    """95% percentile bootstrap interval of the mean of ``x``."""
    if len(x) < 2:
        return float(np.mean(x)), float(np.mean(x))
    m = x[rng.integers(0, len(x), (n, len(x)))].mean(axis=1)
    return float(np.quantile(m, 0.025)), float(np.quantile(m, 0.975))


def summarize(df: pd.DataFrame, ref: str = "jobs") -> pd.DataFrame:
    """Per set, method and budget: the mean over problems of the median over seeds of the fraction
    of the optimum with its 95% bootstrap interval over problems (and of the safe optimum's: the
    best table that leaves no size slower than NCCL's default); ``ref`` minus the method, paired
    by problem, with its interval; the problems ``ref`` wins and loses by more than 0.1 point;
    mean live points, model evaluations and wall time per run."""
    rng = np.random.default_rng(0)
    df = df.assign(saved_pct=100.0 * (1.0 - 1.0 / df["speedup"].astype(float)))
    per = df.groupby(["set", "method", "budget", "problem"], sort=False).agg(
        fraction=("fraction", "median"), saved_pct=("saved_pct", "median"), gpu_s=("gpu_s", "mean"),
        points=("points", "mean"), jobs=("jobs", "mean"), budget_gpu_s=("budget_gpu_s", "mean"),
        model_evals=("model_evals", "mean"), wall_s=("wall_s", "mean"), slower=("slower", "max"),
        worst=("worst", "min"), **({"safe_fraction": ("safe_fraction", "median")} if "safe_fraction" in df else {})
    ).reset_index()
    out = []
    for (st, method, budget), g in per.groupby(["set", "method", "budget"], sort=False):
        g = g.set_index("problem")
        x = g["fraction"].to_numpy()
        lo, hi = _boot(x, rng)
        sv = g["saved_pct"].to_numpy()
        slo, shi = _boot(sv, rng)
        row = {"set": st, "method": method, "budget": budget, "problems": len(g), "fraction": x.mean(),
               "lo": lo, "hi": hi, "saved_pct": sv.mean(), "saved_lo": slo, "saved_hi": shi,
               "budget_gpu_min": g["budget_gpu_s"].mean() / 60, "gpu_min": g["gpu_s"].mean() / 60,
               "points": g["points"].mean(), "jobs": g["jobs"].mean(), "model_evals": g["model_evals"].mean(),
               "slower_max": int(g["slower"].max()), "worst": float(g["worst"].min()),
               "safe_fraction": float(g["safe_fraction"].mean()) if "safe_fraction" in g else float("nan"),
               "wall_s": g["wall_s"].mean()}
        r = per[(per["set"] == st) & (per["method"] == ref) & (per["budget"] == budget)].set_index("problem")
        if len(r) and method != ref:
            d = (r["fraction"] - g["fraction"]).dropna().to_numpy()
            dlo, dhi = _boot(d, rng)
            row.update(diff=d.mean(), diff_lo=dlo, diff_hi=dhi, wins=int((d > 1e-3).sum()),
                       losses=int((d < -1e-3).sum()))
        out.append(row)
    return pd.DataFrame(out)


def method_styles(methods: list[str], ref: str) -> dict[str, dict[str, Any]]:
    """How the benchmark plot draws each method: ``ref`` black, thick, on top (every other is
    compared with it); NCCL's defaults (``default``) dark grey, dash-dotted; the rest in saturated
    colours (none pale), dashed, thin."""
    palette = [f"tab:{c}" for c in ("blue", "orange", "green", "red", "purple", "brown", "pink", "olive", "cyan")] \
        + ["#1b3a6b", "#8c2d04", "#00441b", "#54278f", "#67000d"]
    out, k = {}, 0
    for m in methods:
        if m == ref:
            out[m] = {"color": "black", "fmt": "-o", "ms": 6, "lw": 2.6, "zorder": 5}
        elif m == "default":
            out[m] = {"color": "0.35", "fmt": "-.x", "ms": 5, "lw": 1.2, "zorder": 4}
        else:
            out[m] = {"color": palette[k % len(palette)], "fmt": "--.", "ms": 4, "lw": 0.9, "zorder": 3}
            k += 1
    return out


def plot(s: pd.DataFrame, path: Path, ref: str = "jobs") -> Path:
    """Per set (a column each): the fraction of the optimum against the GPU-minutes budgeted (mean
    over the set's problems, log scale), every method with its 95% interval over problems (top);
    ``ref`` minus each method paired by problem with its 95% interval, a line at 0 (middle; only when
    the summary has the paired differences); and the sizes each method made slower than NCCL's
    defaults (bottom: per method and budget, the most sizes one run left more than 1% slower, and
    the worst per-size speedup of any run, red the lower it is). ``ref`` is drawn black and thickest
    and NCCL's defaults (``default``) dark grey; a budget's methods are spread sideways so their bars
    stay apart. The error bars' line collections carry ``gid`` ``fraction:<method>`` and
    ``diff:<method>``, the slower-size grid's image ``slower:<set>``."""
    from ncclrl.agents.plots import pyplot

    plt = pyplot()
    sets = list(dict.fromkeys(s["set"]))
    methods = list(dict.fromkeys(s["method"]))
    paired = "diff" in s.columns and s["diff"].notna().any()
    nrow = 3 if paired else 2
    ratios = [3.2, 2.6, 0.5 + 0.24 * len(methods)][-nrow:] if paired else [3.2, 0.5 + 0.24 * len(methods)]
    fig, axes = plt.subplots(nrow, len(sets), figsize=(4.8 * len(sets) + 2.4, sum(ratios) + 1.2), squeeze=False,
                             gridspec_kw={"height_ratios": ratios})
    for a in axes[:-1].flat:  # the curves share y per row; the slower-size grid below keeps its own
        a.sharey(axes[0][0] if a in axes[0] else axes[1][0])
    style = method_styles(methods, ref)
    spread = {m: 1.0 + 0.012 * (i - (len(methods) - 1) / 2) for i, m in enumerate(methods)}
    idle = {m for m in methods if (s.loc[s["method"] == m, "points"] == 0).all()}
    for k, st in enumerate(sets):
        sub = s[s["set"] == st]
        at = sub.groupby("budget", sort=False)["budget_gpu_min"].mean()
        ax = axes[0][k]
        for method, g in sub.groupby("method", sort=False):
            g = g.assign(x=[max(at[b], 1e-3) * spread[method] for b in g["budget"]]).sort_values("x")
            st_ = style[method]
            name = "NCCL's defaults (default)" if method == "default" else method
            note = " (reference)" if method == ref else ""
            note += " (measures nothing: flat in budget)" if method in idle else ""
            bars = ax.errorbar(g["x"], g["fraction"], yerr=[g["fraction"] - g["lo"], g["hi"] - g["fraction"]],
                               fmt=st_["fmt"], ms=st_["ms"], lw=st_["lw"], capsize=2, color=st_["color"],
                               zorder=st_["zorder"], label=(method if method != "default" else name) + note)
            bars.lines[2][0].set_gid(f"fraction:{method}")
        n = int(sub["problems"].max())
        rough = " (intervals over so few are rough)" if n < 5 else ""
        ax.set_title(f"{st}: {n} problem{'s' if n != 1 else ''}{rough}", fontsize=10)
        ax.grid(alpha=0.3)
        ax.set_xscale("log")
        if paired:
            dx = axes[1][k]
            for method, g in sub[sub["diff"].notna()].groupby("method", sort=False):
                g = g.assign(x=[max(at[b], 1e-3) * spread[method] for b in g["budget"]]).sort_values("x")
                dx.errorbar(g["x"], g["diff"], yerr=[g["diff"] - g["diff_lo"], g["diff_hi"] - g["diff"]], fmt="o",
                            ms=3, capsize=2, color=style[method]["color"]).lines[2][0].set_gid(f"diff:{method}")
            dx.axhline(0, color="black", lw=1.2, zorder=0)
            dx.grid(alpha=0.3)
            dx.set_xscale("log")
        for a in axes[:-1, k]:
            a.set_xticks(list(at.values), [f"{b}\n{v:.3g}" for b, v in at.items()], fontsize=7)
            a.minorticks_off()
        _slower_grid(axes[-1][k], sub, methods, list(at.index), ref, st)
    axes[0][0].set_ylabel("fraction of the optimum\n(mean over problems of the median\nover seeds, 95% interval)")
    if paired:
        axes[1][0].set_ylabel(f"{ref} minus the method\n(paired by problem, 95% interval;\n> 0: {ref} better)")
    for ax in axes[-2]:
        ax.set_xlabel("budget per problem: GPU-minutes (mean over the set)")
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 0.97), frameon=False)
    fig.suptitle("Every tuner under the same GPU-time budgets (judged on each problem's truth)", fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=130, bbox_inches="tight")
    plt.close(fig)
    return path


def _slower_grid(ax, sub: pd.DataFrame, methods: list[str], budgets: list[str], ref: str, st: str) -> None:
    """Per method (rows) and budget (columns): the most sizes one run made more than 1% slower than
    NCCL's defaults, and the worst per-size speedup of any run, the cell redder the lower it is."""
    worst = np.full((len(methods), len(budgets)), np.nan)
    slower = np.full((len(methods), len(budgets)), -1)
    for r in sub.itertuples(index=False):
        i, j = methods.index(r.method), budgets.index(r.budget)
        worst[i, j], slower[i, j] = float(r.worst), int(r.slower_max)
    shade = np.clip((1.0 - np.nan_to_num(worst, nan=1.0)) / 0.75, 0.0, 1.0)  # 1x white .. 0.25x full red
    ax.imshow(shade, cmap="Reds", vmin=0.0, vmax=1.25, aspect="auto").set_gid(f"slower:{st}")
    for i in range(len(methods)):
        for j in range(len(budgets)):
            if slower[i, j] < 0:
                continue
            text = "0" if slower[i, j] == 0 and worst[i, j] >= 0.99 else f"{slower[i, j]}, worst {worst[i, j]:.2f}x"
            ax.text(j, i, text, ha="center", va="center", fontsize=7,
                    color="white" if shade[i, j] > 0.8 else "black",
                    fontweight="bold" if methods[i] == ref else "normal")
    ax.set_xticks(range(len(budgets)), budgets, fontsize=7)
    ax.set_yticks(range(len(methods)), methods, fontsize=7)
    for t in ax.get_yticklabels():
        if t.get_text() == ref:
            t.set_fontweight("bold")
    ax.tick_params(length=0)
    ax.set_xlabel("budget per problem (sweeps of the problem)")
    ax.set_title("sizes made > 1% slower than NCCL's defaults (most in one run)\n"
                 "and the worst size's speedup (any run); 0: none slower", fontsize=8)


def benchmark(cfg: DictConfig) -> pd.DataFrame:
    """Run the suite of ``cfg``; returns the results table."""
    from concurrent.futures import ProcessPoolExecutor

    check(cfg)
    out = Path(str(cfg.out or f"runs/benchmark/{cfg.suite.name}"))
    out.mkdir(parents=True, exist_ok=True)
    folder = Path(str(cfg.strategies or out / "strategies"))
    t0 = time.time()
    ensure_strategies(cfg, folder)
    plain = OmegaConf.to_container(cfg, resolve=True)
    plain["strategies"] = str(folder)
    todo = tasks(cfg)
    # each finished task is appended to partial.csv at once; a rerun with the same configuration skips them
    part = out / "partial.csv"
    stamp = OmegaConf.to_yaml({k: v for k, v in OmegaConf.to_container(cfg).items() if k != "workers"})  # results
    # do not depend on workers: a rerun with more of them resumes
    if (out / "partial.yaml").is_file() and (out / "partial.yaml").read_text() != stamp:
        part.unlink(missing_ok=True)
    (out / "partial.yaml").write_text(stamp)
    have = pd.read_csv(part) if part.is_file() and part.stat().st_size else pd.DataFrame(columns=RESULT_COLUMNS)
    done_keys = set(zip(have["set"], have["problem"], have["seed"].astype(int), strict=True))
    rows: list[dict[str, Any]] = have.to_dict("records")
    todo = [t for t in todo if (t["set"], t["problem"], t["seed"]) not in done_keys]
    if done_keys:
        log.info("# %d tasks already in %s; %d to run", len(done_keys), part, len(todo))

    def done(i: int, t: dict[str, Any], r: list[dict[str, Any]]) -> None:
        pd.DataFrame(r, columns=RESULT_COLUMNS).to_csv(part, mode="a", header=not part.is_file() or
                                                       not part.stat().st_size, index=False)
        log.info("# %d/%d %s %s seed %d: %.0f s", i + 1, len(todo), t["set"], t["problem"], t["seed"], time.time() - t0)
        bar.advance()

    with progress("benchmark", len(todo)) as bar:
        if int(cfg.workers) == 1:
            for i, t in enumerate(todo):
                r = run_task(t, plain)
                rows += r
                done(i, t, r)
        else:
            os.environ.setdefault("OMP_NUM_THREADS", "1")
            with ProcessPoolExecutor(int(cfg.workers)) as pool:
                for i, r in enumerate(pool.map(run_task, todo, [plain] * len(todo))):
                    rows += r
                    done(i, todo[i], r)
    order = {(t["set"], t["problem"], t["seed"]): i for i, t in enumerate(tasks(cfg))}
    df = pd.DataFrame(rows, columns=RESULT_COLUMNS)
    df["_o"] = [order[(a, b, int(c))] for a, b, c in zip(df["set"], df["problem"], df["seed"], strict=True)]
    df = df.sort_values("_o", kind="stable").drop(columns="_o").reset_index(drop=True)
    df.to_csv(out / "results.csv", index=False, float_format="%.6g")
    part.unlink(missing_ok=True)
    (out / "partial.yaml").unlink(missing_ok=True)
    if df.empty:
        log.info("# no results: the suite's sets posed no problem here")
        return df
    s = summarize(df, str(cfg.ref))
    s.to_csv(out / "summary.csv", index=False, float_format="%.6g")
    plot(s, out / "benchmark.png", str(cfg.ref))
    OmegaConf.save(cfg, out / "config.yaml")
    print_summary(s, step=bool(_profile(cfg.suite)), ref=str(cfg.ref))
    log.info("# %d results in %.0f s -> %s/results.csv, summary.csv, benchmark.png", len(df), time.time() - t0, out)
    return df


def print_summary(s: pd.DataFrame, step: bool = False, ref: str = "jobs") -> None:
    """The summary as text; ``step``: the problems are a job's (the objective is its communication
    time per step, and saved_% is the share of it saved against NCCL's defaults)."""
    what = "the job's communication time per step" if step else "time, geometric mean over sizes"
    print("# fraction of the optimum: mean over problems of the median over seeds [95% interval];")
    print(f"# saved_%: {what} saved against NCCL's defaults, the same mean [95% interval];")
    print(f"# {ref} minus the method, paired by problem [95% interval], problems won/lost by {ref}")
    print("# slower: the most sizes one run left more than 1% slower than NCCL's default (any problem, seed);")
    print("# worst: the worst per-size speedup over NCCL's default of any run")
    print(f"{'set':>12} {'method':>10} {'budget':>9} {'GPU-min':>8} {'points':>7} {'jobs':>5} {'fraction':>22} "
          f"{'saved_%':>22} {ref + ' - method':>24} {'w/l':>6} {'slower':>6} {'worst':>6} {'wall_s':>6}")
    for r in s.itertuples(index=False):
        diff = "" if pd.isna(getattr(r, "diff", np.nan)) else f"{r.diff:+.3f} [{r.diff_lo:+.3f}, {r.diff_hi:+.3f}]"
        wl = "" if pd.isna(getattr(r, "wins", np.nan)) else f"{int(r.wins)}/{int(r.losses)}"
        saved = f"{r.saved_pct:>7.2f} [{r.saved_lo:.2f}, {r.saved_hi:.2f}]"
        print(f"{r.set:>12} {r.method:>10} {r.budget:>9} {r.gpu_min:>8.2f} {r.points:>7.0f} {r.jobs:>5.1f} "
              f"{r.fraction:>8.3f} [{r.lo:.3f}, {r.hi:.3f}] {saved:>22} {diff:>24} {wl:>6} {r.slower_max:>6d} "
              f"{r.worst:>6.3f} {r.wall_s:>6.2f}")


def main_benchmark(cfg: DictConfig) -> int:
    benchmark(cfg)
    return 0


COMMAND = Command("benchmark", BenchmarkConfig, main_benchmark,
                  "every tuner on the same problems (left-out families, misspecified, real replays) under the "
                  "same budgets", out_key="out")
register(COMMAND)
