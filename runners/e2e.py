"""``ncclrl e2e``: does a table make a training step faster? Train a small transformer (random
weights, random tokens) with DDP and with FSDP on the topology's ranks, with NCCL's defaults and
with the table + ``nccl.conf``, and compare the step times (keys: :class:`E2EConfig`).

    ncclrl e2e nccl_tuner.csv conf=nccl.conf topology=h200-2x2-sock launcher=srun

Each side runs ``rounds`` jobs in the order default, table, table, default, ... (ABBA), so both
sides see the same machine drift and neither always runs first. Every job is one launch of
:mod:`ncclrl.envs.e2e_worker` through the launcher that trains with DDP, then with FSDP (a fresh
model each); rank 0 reports the slowest rank's time of each timed step. Per side and mode the
step time is the geometric mean over its jobs of each job's median step, with a 95% interval from
a bootstrap that resamples jobs, then steps within each job. The ratio (table / default) is the
geometric mean of each round's ratio of its two jobs' median steps, which is exactly the table's
step time over the default's, so the ratio always points the way the two step times do; its 95%
interval is a t interval (df = rounds - 1) of the rounds' mean log ratio, so jobs are the unit and
the drift between rounds cancels. On simulated runs with
both sides the same it called a tie a win or a loss in 2-6% of the runs (5% expected), where the
job-and-step bootstrap did so in up to 14% with 3 rounds (``benchmarks/e2e_interval_coverage.py``). The table's side is
faster when the ratio's interval lies below 1, slower when it lies above 1, else it is a tie.

``device=cpu`` runs the same jobs on CPUs with gloo (tests; the timings say nothing about NCCL).
"""

from __future__ import annotations

import csv
import json
import logging
import os
import socket
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from omegaconf import DictConfig, OmegaConf

from ncclrl.agents.plots import job_center, plot_step_times
from ncclrl.costmodel.errors import ConfigError, JobError
from ncclrl.costmodel.table import CONF_KEYS, fingerprint, parse_example_rows, read_conf_env
from ncclrl.costmodel.topology import load_topology
from ncclrl.envs.jobs import (
    JOB_ENV,
    MAX_ENV_BYTES,
    TABLE_ENV,
    JobOptions,
    JobSpec,
    LaunchConfig,
    base_env,
    encode,
    job_folder,
    payload_json,
    run_to_end,
    start_coordinator,
    stop_coordinator,
    user_env,
)
from ncclrl.envs.live import plugin_library, require_gpus
from ncclrl.runners.config import Command, register

log = logging.getLogger(__name__)

MODES = ("ddp", "fsdp", "both")
SIDES = ("default", "table")
ONLINE = "online"
DEVICES = ("cuda", "cpu")
DTYPES = ("float32", "bfloat16")
WORKER = "ncclrl.envs.e2e_worker"
N_BOOT = 2000


@dataclass
class E2EConfig:
    """Train a small transformer (random weights, synthetic tokens) with DDP and FSDP on the
    topology's ranks, with NCCL's defaults and with a table + nccl.conf, in alternating jobs
    (default, table, table, default, ...), and report each side's step time and the ratio
    table/default with 95% bootstrap intervals.

    :param table: the table (nccl_tuner.csv), handed to every rank of the table's jobs with the plugin
    :param conf: its nccl.conf (KEY=VALUE knobs set as written in the table's jobs, a channel range
        NCCL_MIN_NCHANNELS < NCCL_MAX_NCHANNELS too; empty: none)
    :param topology: the platform the jobs run on: a preset name or a topology YAML path (its nodes
        and GPUs per node make the job)
    :param plugin: the tuner plugin library (default: the one ncclrl plugin build makes, built if
        missing; the same path on every node)
    :param mode: ddp, fsdp or both (every job trains with DDP, then with FSDP, a fresh model each)
    :param layers: transformer blocks
    :param d_model: model width
    :param heads: attention heads (divides d_model)
    :param seq_len: tokens per sequence
    :param batch: sequences per rank per step
    :param vocab: vocabulary size (embedding and output head)
    :param steps: timed steps per job
    :param warmup: steps per job before the timed ones (not timed)
    :param dtype: float32, or bfloat16 (device=cuda only)
    :param rounds: jobs per side (2 or more for an interval of the ratio; more rounds narrow it)
    :param seed: seed of the weights and the data (the same in every job)
    :param out: folder for steps.csv (every timed step of every job) and summary.json
    :param online: a third side: the plugin's online mode (tuner and profiler, NCCLRL_TUNER_MODE=online)
        explores the table's row, NCCL's choice and the model's alternatives inside each job and keeps
        what the coordinator this command starts agrees (compared on the mean step, exploration included)
    :param online_policy: the coordinator's exploration policy (empty: the shipped one)
    :param online_host: the address the ranks reach the coordinator at (empty: 127.0.0.1 when every
        rank runs on this host, else this host's name)
    :param timeout_s: a job that makes no progress for this many seconds (>= 1) is ended (the command fails)
    :param device: cuda (NCCL) or cpu (gloo: checks the launch path; the timings say nothing about NCCL)
    :param launcher: how a job's processes start (group launcher=: local, torchrun, srun, mpirun)
    """

    defaults: list[Any] = field(default_factory=lambda: ["_self_", {"launcher": "local"}])

    table: str = ""
    conf: str = ""
    topology: str = ""
    plugin: str | None = None
    mode: str = "both"
    layers: int = 2
    d_model: int = 128
    heads: int = 4
    seq_len: int = 64
    batch: int = 4
    vocab: int = 1024
    steps: int = 20
    warmup: int = 3
    dtype: str = "float32"
    rounds: int = 5
    seed: int = 0
    out: str = "e2e"
    online: bool = False
    online_policy: str = ""
    online_host: str = ""
    timeout_s: float = 300.0
    device: str = "cuda"
    launcher: LaunchConfig = field(default_factory=LaunchConfig)

    def check(self) -> None:
        from ncclrl.agents.online import POLICIES

        self.launcher.check()
        if self.online_policy not in ("", "shipped", *POLICIES):
            raise ConfigError("online_policy", f"unknown policy {self.online_policy!r}; allowed: "
                              f"{', '.join(POLICIES)}, shipped (or empty: the shipped one)")
        for k in ("table", "conf"):
            if getattr(self, k) and not Path(getattr(self, k)).is_file():
                raise ConfigError(k, f"no such file: {getattr(self, k)}")
        if self.topology:
            load_topology(self.topology)
        for k, allowed in (("mode", MODES), ("device", DEVICES), ("dtype", DTYPES)):
            if getattr(self, k) not in allowed:
                raise ConfigError(k, f"unknown value {getattr(self, k)!r}; allowed: {', '.join(allowed)}")
        if self.dtype != "float32" and self.device == "cpu":
            raise ConfigError("dtype", f"{self.dtype} is for device=cuda; allowed on cpu: float32")
        for k in ("layers", "d_model", "heads", "seq_len", "batch", "vocab", "steps", "rounds"):
            if getattr(self, k) < 1:
                raise ConfigError(k, f"must be a whole number >= 1, got {getattr(self, k)}")
        if self.warmup < 0:
            raise ConfigError("warmup", f"must be a whole number >= 0, got {self.warmup}")
        if self.d_model % self.heads:
            raise ConfigError("heads", f"must divide d_model ({self.d_model}), got {self.heads}")
        if self.timeout_s <= 0:
            raise ConfigError("timeout_s", f"must be > 0, got {self.timeout_s}")


def job_order(rounds: int, sides: tuple[str, ...] = SIDES) -> list[str]:
    """The sides' jobs in running order: default, table, table, default, default, table, ... (with a
    third side: default, table, online, online, table, default, ...)"""
    out: list[str] = []
    for r in range(rounds):
        out += list(sides) if r % 2 == 0 else list(reversed(sides))
    return out


STATS = {"median": np.median, "mean": np.mean}


def bootstrap_median(jobs: list[np.ndarray], rng: np.random.Generator, n_boot: int = N_BOOT,
                     stat: str = "median", per_job: bool = False) -> np.ndarray:
    """``n_boot`` bootstrap replicates of the median (or ``stat``) of all steps (``per_job``: of the
    geometric mean over the jobs of each job's ``stat``): each resamples the jobs (with
    replacement), then the steps within each chosen job."""
    f = STATS[stat]
    out = np.empty(n_boot)
    for b in range(n_boot):
        pick = rng.integers(0, len(jobs), len(jobs))
        steps = [rng.choice(jobs[j], jobs[j].size) for j in pick]
        out[b] = job_center(steps, stat) if per_job else f(np.concatenate(steps))
    return out


RATIO_METHODS = ("paired-t", "bootstrap")


def paired_t_ratio(default_jobs: list[np.ndarray], table_jobs: list[np.ndarray],
                   stat: str = "median") -> tuple[float, float | None, float | None]:
    """95% interval of the table/default ratio from the rounds: per round, the log ratio of its
    table job's median step to its default job's; a t interval (df = rounds - 1) of their mean,
    exponentiated. Jobs are the unit, and a round's two jobs run next to each other, so the
    machine's drift cancels. Returns the geometric mean of the rounds' ratios and the interval;
    one round gives no interval: ``(ratio, None, None)``."""
    f = STATS[stat]
    d = np.array([np.log(f(t) / f(a)) for a, t in zip(default_jobs, table_jobs, strict=True)])
    if d.size < 2:
        return float(np.exp(d.mean())), None, None
    from scipy.stats import t as student_t  # loaded by the verdict, not by every command

    half = float(student_t.ppf(0.975, d.size - 1)) * float(d.std(ddof=1)) / np.sqrt(d.size)
    return float(np.exp(d.mean())), float(np.exp(d.mean() - half)), float(np.exp(d.mean() + half))


def summarize(default_jobs: list[list[float]], table_jobs: list[list[float]], seed: int = 0,
              method: str = "paired-t", n_boot: int = N_BOOT, stat: str = "median") -> dict[str, Any]:
    """Each side's step time (ms) with its 95% interval (bootstrap: jobs, then steps), the ratio
    table/default with its own (``method``: ``paired-t`` over the rounds, or ``bootstrap``), and the
    verdict: ``faster`` (interval below 1), ``slower`` (above 1), ``tie``, or ``undecided`` (one
    round). A side's step time is what its ratio is made of, so the ratio is exactly the table's
    over the default's: under ``paired-t`` the geometric mean over its jobs of each job's median
    step (the ratio: the geometric mean of the rounds' ratios), under ``bootstrap`` the median of
    all its steps (the ratio: of the pooled medians). ``pooled_ms`` is the median of all its steps
    under either. ``stat="mean"`` compares mean steps instead (a job's total time: every step,
    slow ones included)."""
    rng = np.random.default_rng(seed)
    f = STATS[stat]
    a = [np.asarray(j, float) for j in default_jobs]
    b = [np.asarray(j, float) for j in table_jobs]
    per_job = method == "paired-t"
    boot_a = bootstrap_median(a, rng, n_boot, stat, per_job)
    boot_b = bootstrap_median(b, rng, n_boot, stat, per_job)

    def side(boot: np.ndarray, jobs: list[np.ndarray]) -> dict[str, Any]:
        lo, hi = np.percentile(boot, [2.5, 97.5])
        pooled = float(f(np.concatenate(jobs)))
        return {"step_time_ms": job_center(jobs, stat) if per_job else pooled, "ci_lo_ms": float(lo),
                "ci_hi_ms": float(hi), "pooled_ms": pooled, "jobs": len(jobs), "steps": int(sum(j.size for j in jobs)),
                "job_medians_ms": [float(np.median(j)) for j in jobs]}

    sa, sb = side(boot_a, a), side(boot_b, b)
    if per_job:
        value, lo, hi = paired_t_ratio(a, b, stat)
    else:
        value = sb["step_time_ms"] / sa["step_time_ms"]
        lo, hi = (float(x) for x in np.percentile(boot_b / boot_a, [2.5, 97.5]))
    verdict = "undecided" if lo is None else "faster" if hi < 1.0 else "slower" if lo > 1.0 else "tie"
    return {"default": sa, "table": sb,
            "ratio": {"value": value, "ci_lo": lo, "ci_hi": hi, "method": method}, "verdict": verdict, "stat": stat}


def report_line(mode: str, s: dict[str, Any], names: tuple[str, str] = SIDES) -> str:
    """``ddp: default 12.3 ms [12.1, 12.6], table 11.8 ms [11.6, 12.0], ratio 0.96 [0.94, 0.98]: ...``
    (``names``: the two sides compared, base first)"""
    d, t, r = s["default"], s["table"], s["ratio"]
    a, b = names
    who = "the table" if b == "table" else f"the {b} mode"
    verdict = {"faster": f"{who} is faster (the interval lies below 1)",
               "slower": f"{who} is slower (the interval lies above 1)",
               "tie": "a tie (the interval contains 1)",
               "undecided": "undecided (one round per side gives no interval)"}[s["verdict"]]
    what = " (mean steps)" if s.get("stat") == "mean" else ""
    return (f"{mode}{what}: {a} {d['step_time_ms']:.1f} ms [{d['ci_lo_ms']:.1f}, {d['ci_hi_ms']:.1f}], "
            f"{b} {t['step_time_ms']:.1f} ms [{t['ci_lo_ms']:.1f}, {t['ci_hi_ms']:.1f}], "
            f"ratio {r['value']:.2f} " + (f"[{r['ci_lo']:.2f}, {r['ci_hi']:.2f}]" if r["ci_lo"] is not None
                                          else "[no interval from one round]") + f": {verdict}")


class E2E:
    """The jobs of one ``ncclrl e2e`` run: what each side's ranks are handed, one job at a time.

    :param cfg: the checked config
    """

    def __init__(self, cfg: E2EConfig) -> None:
        for k in ("table", "topology"):  # required to run (the help composes without them)
            if not getattr(cfg, k):
                raise ConfigError(k, "required (ncclrl e2e TABLE topology=PRESET [conf=nccl.conf])")
        self.cfg = cfg
        self.topo = load_topology(cfg.topology)
        self.launcher = cfg.launcher
        if self.launcher.kind == "local" and cfg.device == "cuda":
            require_gpus(self.launcher.gpus_needed(self.topo.nranks), "device", "use device=cpu to check the launch "
                         "path (gloo; its timings say nothing about NCCL)")
        self.table_text = Path(cfg.table).read_text()
        try:
            parse_example_rows(self.table_text)
        except ValueError as e:
            raise ConfigError("table", f"{cfg.table}: not a table (nccl_tuner.csv): {e}") from None
        if len(self.table_text.encode()) > MAX_ENV_BYTES:
            raise ConfigError("table", f"{len(self.table_text.encode())} bytes: more than one environment variable "
                              f"holds ({MAX_ENV_BYTES})")
        self.knobs = {k: str(v) for k, v in read_conf_env(cfg.conf).items()} if cfg.conf else {}
        self.plugin = str(plugin_library(cfg.plugin))
        self.table_fp = fingerprint(self.table_text)
        self.sides: tuple[str, ...] = SIDES + ((ONLINE,) if cfg.online else ())
        self.coordinator = ""  # HOST:PORT of the online side's coordinator, once started
        self.secret_file = ""  # the file holding its secret (mode 0600; every rank reads it)
        self.candidates = ""
        if cfg.online:
            from ncclrl.agents.export import online_candidates
            from ncclrl.costmodel.simulator import Simulator

            self.candidates = "\n".join(online_candidates(Simulator(self.topo))) + "\n"

    def side_env(self, side: str) -> dict[str, str]:
        """What the ranks of one side are handed on top of the user's NCCL_* environment: the table,
        the plugin and the knobs, or ``NCCL_TUNER_PLUGIN=none`` alone."""
        env = user_env()
        if side in ("table", ONLINE):
            env.update({"NCCL_TUNER_PLUGIN": self.plugin, TABLE_ENV: self.table_text, **self.knobs})
        if side == ONLINE:
            env.update({"NCCL_PROFILER_PLUGIN": self.plugin, "NCCLRL_TUNER_MODE": "online",
                        "NCCLRL_ONLINE_COORD": self.coordinator, "NCCLRL_ONLINE_SECRET_FILE": self.secret_file,
                        "NCCLRL_ONLINE_CANDIDATES_DATA": self.candidates})
        elif side == "default":
            env["NCCL_TUNER_PLUGIN"] = "none"
        return env

    def job(self, modes: list[str], side: str) -> dict[str, Any]:
        c, t = self.cfg, self.topo
        return {"modes": modes, "side": side, "layers": c.layers, "d_model": c.d_model, "heads": c.heads,
                "seq_len": c.seq_len, "batch": c.batch, "vocab": c.vocab, "dtype": c.dtype, "steps": c.steps,
                "warmup": c.warmup, "seed": c.seed, "device": c.device, "timeout_s": c.timeout_s,
                "nranks": t.nranks, "gpus_per_node": t.gpus_per_node, "kind": self.launcher.kind,
                "emulate_nodes": self.launcher.emulated and t.nodes > 1, "share_gpu": self.launcher.share_gpu,
                "local_world": t.nranks if self.launcher.emulated else t.gpus_per_node}

    def run_job(self, modes: list[str], side: str, log_dir: Path) -> dict[str, Any]:
        """One job to its end: rank 0's step times per mode and what every rank said it received."""
        spec = JobSpec(self.launcher, self.topo.nodes, self.topo.gpus_per_node,
                       dict(self.side_env(side), **{JOB_ENV: encode(self.job(modes, side))}), module=WORKER,
                       options=JobOptions(timeout_s=self.cfg.timeout_s, grace_s=self.launcher.grace_s))
        log_dir.mkdir(parents=True, exist_ok=True)
        records, _ = run_to_end(spec.commands(), base_env(), log_dir, self.cfg.timeout_s, self.launcher.grace_s,
                                spec.nranks)
        hellos = {r.rank: payload_json(r.payload) for r in records if r.kind == "hello"}
        steps = [payload_json(r.payload) for r in records if r.kind == "steps" and r.rank == 0]
        by_mode = {s["mode"]: [float(x) for x in s["step_time_ms"]] for s in steps}
        if sorted(by_mode) != sorted(modes) or any(len(v) != self.cfg.steps for v in by_mode.values()):
            raise JobError("launcher", f"{side} job: rank 0 reported step times for {sorted(by_mode)}, "
                              f"expected {self.cfg.steps} steps of each of {', '.join(modes)}")
        self.check_received(side, hellos)
        return {"step_time_ms": by_mode,
                "received": {str(r): {k: h.get(k) for k in ("table", "knobs", "plugin", "host")}
                             for r, h in sorted(hellos.items())}}

    def check_received(self, side: str, hellos: dict[int, dict]) -> None:
        """Every rank of the job said hello, and holds what its side must: the table (by
        fingerprint), the knobs and the plugin, or none of them."""
        missing = sorted(set(range(self.topo.nranks)) - set(hellos))
        if missing:
            raise JobError("launcher", f"{side} job: ranks {missing} never reported")
        want_fp = self.table_fp if side != "default" else ""
        want_plugin = self.plugin if side != "default" else "none"
        user = {k: v for k, v in os.environ.items() if k in CONF_KEYS}  # the user's own, on both sides
        want_knobs = dict(user, **self.knobs) if side != "default" else user
        for r, h in sorted(hellos.items()):
            if h.get("table") != want_fp or h.get("plugin") != want_plugin or h.get("knobs") != want_knobs:
                raise JobError("launcher", f"{side} job: rank {r} received table {h.get('table')!r}, "
                                  f"plugin {h.get('plugin')!r}, knobs {h.get('knobs')}; expected table {want_fp!r}, "
                                  f"plugin {want_plugin!r}, knobs {want_knobs}")
            if not h.get("plugin_found", True):
                raise ConfigError("plugin", f"{self.plugin} is missing on {h.get('host')} (rank {r}): build it at "
                                  "the same path on every node (ncclrl plugin build)")


def run_e2e(cfg: E2EConfig, out=None) -> dict[str, Any]:
    """Every job, in ABBA order (each trains every mode); writes ``steps.csv``, ``summary.json`` and
    ``steps.png`` under ``cfg.out`` and one line per mode to ``out`` (default: standard output). Returns the summary."""
    out = sys.stdout if out is None else out
    e2e = E2E(cfg)
    modes = ["ddp", "fsdp"] if cfg.mode == "both" else [cfg.mode]
    out_dir = Path(cfg.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    rows: list[dict[str, Any]] = []
    summary: dict[str, Any] = {
        "topology": e2e.topo.name, "nranks": e2e.topo.nranks, "table": str(cfg.table),
        "table_fingerprint": e2e.table_fp, "conf": str(cfg.conf), "knobs": e2e.knobs, "plugin": e2e.plugin,
        "device": cfg.device, "launcher": e2e.launcher.kind,
        "model": {k: getattr(cfg, k) for k in ("layers", "d_model", "heads", "seq_len", "batch", "vocab", "dtype")},
        "steps": cfg.steps, "warmup": cfg.warmup, "rounds": cfg.rounds, "jobs": [], "modes": {}}
    t0 = time.time()
    by_side: dict[str, dict[str, list[list[float]]]] = {s: {m: [] for m in modes} for s in e2e.sides}
    order = job_order(cfg.rounds, e2e.sides)
    with job_folder("e2e") as tmp, OnlineCoordinator(cfg, e2e, out_dir) as coord:
        e2e.coordinator, e2e.secret_file = coord.address, coord.secret_file
        for n, side in enumerate(order):
            log.info("# job %d of %d: %s (%s)", n + 1, len(order), side, ", ".join(modes))
            res = e2e.run_job(modes, side, Path(tmp) / f"job{n}")
            summary["jobs"].append({"job": n, "round": n // len(e2e.sides), "side": side, "received": res["received"],
                                    "median_step_time_ms": {m: float(np.median(v))
                                                            for m, v in res["step_time_ms"].items()}})
            for mode in modes:
                by_side[side][mode].append(res["step_time_ms"][mode])
                rows += [{"mode": mode, "job": n, "round": n // len(e2e.sides), "side": side, "step": k,
                          "step_time_ms": ms}
                         for k, ms in enumerate(res["step_time_ms"][mode])]
    rows.sort(key=lambda r: (modes.index(r["mode"]), r["job"], r["step"]))
    for mode in modes:
        summary["modes"][mode] = summarize(by_side["default"][mode], by_side["table"][mode], seed=cfg.seed)
        print(report_line(mode, summary["modes"][mode]), file=out, flush=True)
        if cfg.online:  # on the mean step: the exploration's slow steps count
            for base in SIDES:
                key = f"{ONLINE}/{base}"
                summary.setdefault("online", {}).setdefault(mode, {})[key] = s = summarize(
                    by_side[base][mode], by_side[ONLINE][mode], seed=cfg.seed, stat="mean")
                print(report_line(mode, s, (base, ONLINE)), file=out, flush=True)
    with open(out_dir / "steps.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=["mode", "job", "round", "side", "step", "step_time_ms"],
                           lineterminator="\n")
        w.writeheader()
        w.writerows(rows)
    summary["wall_s"] = round(time.time() - t0, 1)
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=1))
    plot = plot_step_times(rows, out_dir / "steps.png", summary["modes"],
                           f"e2e on {e2e.topo.name} ({cfg.device}): step times per job, NCCL's defaults against "
                           f"{Path(cfg.table).name} (measured)")["path"]
    log.info("# %d jobs in %.0f s; every step in %s, the summary in %s, the step times plotted in %s",
             len(summary["jobs"]), summary["wall_s"], out_dir / "steps.csv", out_dir / "summary.json", plot)
    return summary


class OnlineCoordinator:
    """The online side's ``ncclrl coordinator``, a process of this host for the whole run (nothing
    without ``online=true``); its verdicts go to ``out/coordinator.jsonl``.

    :param cfg: the run's config
    :param e2e: the run (its launcher says whether every rank runs on this host)
    :param out_dir: the run's output folder
    """

    def __init__(self, cfg: E2EConfig, e2e: E2E, out_dir: Path) -> None:
        self.cfg, self.e2e, self.out_dir = cfg, e2e, out_dir
        self.proc = None  # the coordinator's process, once started
        self.address = ""
        self.secret_file = ""

    def __enter__(self) -> OnlineCoordinator:
        if not self.cfg.online:
            return self
        here = self.e2e.launcher.kind == "local" or self.e2e.launcher.emulated
        host = self.cfg.online_host or ("127.0.0.1" if here else socket.getfqdn())
        keys = [f"host={host}", f"log={self.out_dir.resolve() / 'coordinator.jsonl'}"]  # only where the ranks reach it
        if self.cfg.online_policy:
            keys.append(f"policy={self.cfg.online_policy}")
        self.proc, port, secret = start_coordinator(self.out_dir, keys, self.out_dir / "coordinator.log")
        self.address = f"{host}:{port}"
        self.secret_file = str(secret)
        log.info("# online side: coordinator at %s, verdicts in %s", self.address, self.out_dir / "coordinator.jsonl")
        return self

    def __exit__(self, *exc: object) -> None:
        stop_coordinator(self.proc)


def main_e2e(cfg: DictConfig) -> int:
    run_e2e(OmegaConf.to_object(cfg))
    return 0


COMMAND = Command("e2e", E2EConfig, main_e2e,
                  "train a small transformer (DDP, FSDP) with NCCL's defaults and with a table: step times and ratio",
                  positional="table", out_key="out")
register(COMMAND)
