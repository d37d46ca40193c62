"""The ``ncclrl`` command line: ``ncclrl COMMAND [key=value ...] [-m]``.

Every command takes Hydra overrides against its structured config (:mod:`ncclrl.runners.config`);
``ncclrl COMMAND --help`` lists its keys with their defaults. Bad input is one line on stderr
(``ncclrl: error: KEY: ...``) and exit code 2, never a traceback.
"""

from __future__ import annotations

import csv
import importlib
import io
import re
import sys
import textwrap
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from ncclrl import __version__
from ncclrl.costmodel import nccl as N
from ncclrl.costmodel.errors import ConfigError, JobError
from ncclrl.costmodel.replica import default_decisions
from ncclrl.costmodel.simulator import Configs, SimParams, Simulator
from ncclrl.costmodel.topology import dump_topology, load_topology, preset_names
from ncclrl.costmodel.units import parse_bytes
from ncclrl.runners.config import MAX_BYTES, Command, command_help, composed_yaml, register, run_command

# Every module a command needs is imported when that command runs: pandas, scipy, PyTorch and the
# learning stack load only for the commands that use them (``ncclrl --help`` imports no command).


def _size_grid(lo: int, hi: int) -> np.ndarray:
    if hi < lo:
        raise ConfigError("max_bytes", f"must be >= min_bytes ({lo}), got {hi}")
    sizes = []
    s = lo
    while s <= hi:
        sizes.append(s)
        s *= 2
    return np.array(sizes, dtype=np.int64)


# -- decisions ----------------------------------------------------------------------------------


@dataclass
class DecisionsConfig:
    """NCCL's default decision per power-of-two size, from the replica of NCCL 2.28's cost model, as
    CSV ``collective,nbytes,algo,proto,channels``.

    :param topology: the platform: a preset name (``ncclrl topologies``) or a topology YAML path
    :param collective: broadcast, reduce, allgather, reducescatter, allreduce, or all
    :param min_bytes: the smallest size
    :param max_bytes: the largest size
    :param num_pipe_ops: operations NCCL aggregates into one launch (grouped calls)
    :param full: also print threads, chunk size and NCCL's predicted time
    """

    topology: str = "h200-1x4"
    collective: str = "all"
    min_bytes: str = "8"
    max_bytes: str = "1G"
    num_pipe_ops: int = 1
    full: bool = False


def cmd_decisions(cfg) -> int:
    topo = load_topology(cfg.topology)
    colls = list(N.COLLECTIVES) if cfg.collective == "all" else [
        N.COLLECTIVES[N.parse_name("collective", cfg.collective, N.COLLECTIVES)]]
    sizes = _size_grid(parse_bytes(cfg.min_bytes, "min_bytes"), parse_bytes(cfg.max_bytes, "max_bytes"))
    out = csv.writer(sys.stdout, lineterminator="\n")
    header = ["collective", "nbytes", "algo", "proto", "channels"]
    if cfg.full:
        header += ["nthreads", "chunk_bytes", "time_us"]
    out.writerow(header)
    for c in colls:
        d = default_decisions(topo, c, sizes, num_pipe_ops=cfg.num_pipe_ops)
        for i in range(sizes.size):
            row = [c, int(sizes[i]), N.ALGOS[d.algo[i]], N.PROTOS[d.proto[i]], int(d.channels[i])]
            if cfg.full:
                row += [int(d.nthreads[i]), int(d.chunk_bytes[i]), f"{d.time_us[i]:.3f}"]
            out.writerow(row)
    return 0


# -- predict ------------------------------------------------------------------------------------


@dataclass
class PredictConfig:
    """Reads CSV ``collective,nbytes,algo,proto,channels`` (channels 0: NCCL's choice; optional
    ``comm_channels,buffsize_bytes,socket_nthreads,nsocks_perthread``) on stdin and writes it back
    with the simulator's ``time_us``; a ``time_us`` column already there is kept as
    ``measured_time_us`` with a ``rel_err``.

    :param topology: the platform: a preset name or a topology YAML path
    :param noise: one noisy sample per row instead of the expected time
    :param seed: seed of the noise
    """

    topology: str = "h200-1x4"
    noise: bool = False
    seed: int = 0


def _read_csv_rows(stream: io.TextIOBase) -> tuple[list[str], list[dict[str, str]]]:
    text = stream.read()
    lines = [ln for ln in text.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
    if not lines:
        raise ConfigError("stdin", "no CSV rows; expected collective,nbytes,algo,proto,channels")
    first = [c.strip() for c in lines[0].split(",")]
    if "collective" in first:
        header, body = first, lines[1:]
    else:
        header, body = ["collective", "nbytes", "algo", "proto", "channels"], lines
    for need in ("collective", "nbytes", "algo", "proto"):
        if need not in header:
            raise ConfigError("stdin", f"missing column {need!r}; expected collective,nbytes,algo,proto,channels")
    rows = []
    for i, row in enumerate(csv.reader(body), 2 if header is first else 1):
        if len(row) != len(header):
            raise ConfigError(f"line {i}", f"has {len(row)} fields, expected {len(header)} ({','.join(header)})")
        rows.append(dict(zip(header, (v.strip() for v in row), strict=True), _line=str(i)))
    return header, rows


# the largest channel count or thread count a row may give (NCCL's fields are 32-bit)
MAX_FIELD = (1 << 31) - 1


def _int_field(row: dict[str, str], key: str, line: str) -> int:
    v = row.get(key, "") or "0"
    top = MAX_BYTES if key.endswith("_bytes") else MAX_FIELD
    if not re.fullmatch(r"\d+", v) or int(v) > top:
        raise ConfigError(f"line {line}: {key}", f"must be a whole number from 0 to {top}, got {v!r}")
    return int(v)


def _size_field(text: str, field_: str) -> int:
    n = parse_bytes(text, field_)
    if n > MAX_BYTES:
        raise ConfigError(field_, f"{text} is beyond the largest size; allowed: a whole number of bytes from 1 to "
                          f"2^62 ({MAX_BYTES}), with an optional K, M or G suffix")
    return n


def cmd_predict(cfg) -> int:
    sim = Simulator(cfg.topology, seed=cfg.seed)
    header, rows = _read_csv_rows(sys.stdin)
    cols: dict[str, list] = {k: [] for k in ("coll", "nbytes", "algo", "proto", "channels", "comm_channels",
                                             "buffsize_bytes", "socket_nthreads", "nsocks_perthread")}
    for row in rows:
        line = row["_line"]
        cols["coll"].append(N.parse_name(f"line {line}: collective", row["collective"], N.COLLECTIVES))
        cols["nbytes"].append(_size_field(row["nbytes"], f"line {line}: nbytes"))
        cols["algo"].append(N.parse_name(f"line {line}: algo", row["algo"], N.ALGOS))
        cols["proto"].append(N.parse_name(f"line {line}: proto", row["proto"], N.PROTOS))
        for key in ("channels", "comm_channels", "buffsize_bytes", "socket_nthreads", "nsocks_perthread"):
            cols[key].append(_int_field(row, key, line))
    configs = Configs.make(**cols)
    times = sim.sample(configs)[:, 0] if cfg.noise else sim.time_us(configs)
    measured = "time_us" in header
    out_header = [("measured_time_us" if h == "time_us" else h) for h in header] + ["time_us"]
    if measured:
        out_header.append("rel_err")
    w = csv.writer(sys.stdout, lineterminator="\n")
    w.writerow(out_header)
    for row, t in zip(rows, times, strict=True):
        vals = [row[h] for h in header] + [f"{t:.3f}"]
        if measured:
            try:
                m = float(row["time_us"])
                vals.append(f"{(t - m) / m:.4f}")
            except ValueError:
                vals.append("")
        w.writerow(vals)
    return 0


def _check_files(key: str, paths) -> None:
    """Every path a file to read, before any is read (a folder or a missing file: one line naming the key)."""
    for f in paths:
        if Path(f).is_dir():
            raise ConfigError(key, f"{f} is a folder; name the files in it ({f}/*.txt)")
        if not Path(f).is_file():
            raise ConfigError(key, f"no such file: {f}")


# -- calibrate ----------------------------------------------------------------------------------


@dataclass
class CalibrateConfig:
    """Fit a topology's simulator to measurements (nccl-tests outputs, or a measurement store),
    report the error on configurations held out of the fit per size band, and write a calibrated
    preset usable wherever a preset name is.

    :param files: nccl-tests stdout captures or ``-J`` JSON files (or use ``store``)
    :param store: fit to the measurements of this store (sweep, finetune, validate) instead
    :param topology: the preset name or YAML path to start from
    :param output: write the calibrated preset (YAML) here
    :param seed: seed of the held-out split
    :param holdout: report the error on held-out configurations before the final fit
    :param from_defaults: start from topology-derived defaults instead of the preset's simulator block
    """

    files: list[str] = field(default_factory=list)
    store: str | None = None
    topology: str = "h200-1x4"
    output: str | None = None
    seed: int = 0
    holdout: bool = True
    from_defaults: bool = False


def cmd_calibrate(cfg) -> int:
    import pandas as pd

    from ncclrl.costmodel.calibrate import (
        error_table,
        fit,
        holdout_split,
        measurements_from_runs,
        measurements_from_store,
    )
    from ncclrl.costmodel.nccltests import parse_file
    from ncclrl.envs.store import open_readonly

    topo = load_topology(cfg.topology)
    if bool(cfg.files) == bool(cfg.store):
        raise ConfigError("files", "give nccl-tests files (ncclrl calibrate FILE...) or store=STORE, one of them")
    if cfg.store:
        if not Path(cfg.store).is_file():
            raise ConfigError("store", f"no such file: {cfg.store}")
        with open_readonly(cfg.store) as st:  # read only: the store's files never change, an old schema is read as is
            df = measurements_from_store(topo, st.frame())
        # a store's rows are points, not files: one configuration (algo/proto/channels/knobs) per "config"
        df["config"] = df[["algo", "proto", "channels", "source"]].astype(str).agg("_".join, axis=1)
        sources = [f"store {Path(cfg.store).name}"]
    else:
        _check_files("files", cfg.files)
        df = measurements_from_runs(topo, [parse_file(f) for f in cfg.files])
        sources = [Path(f).name for f in cfg.files]
    start = SimParams.defaults(topo) if cfg.from_defaults else SimParams.from_topology(topo)
    pd.set_option("display.width", 120)

    def table(sim: Simulator, rows) -> str:
        return error_table(sim, rows).to_string(index=False, float_format=lambda v: f"{v:.3f}")

    if cfg.holdout:
        train, test, held = holdout_split(df, seed=cfg.seed)
        if held:
            res = fit(topo, train, start)
            sim = Simulator(topo, res.params)
            print(f"# held out of the fit ({len(held)} configurations): {', '.join(held)}")
            print(f"# fit on {len(train)} rows, {res.n_params} parameters")
            print("# error on the rows used by the fit:")
            print(table(sim, train))
            print("# error on held-out configurations:")
            print(table(sim, test))
        else:
            print("# too few configurations per family to hold any out; fitting on all")
    res = fit(topo, df, start)
    sim = Simulator(topo, res.params)
    print(f"# final fit on all {len(df)} rows:")
    print(table(sim, df))
    if cfg.output:
        new = topo.with_sim(res.params.to_dict(), name=Path(cfg.output).stem)
        new = replace(new, description=f"{topo.description} -- calibrated from {', '.join(sources)}"[:2000])
        dump_topology(new, cfg.output)
        print(f"# wrote {cfg.output}")
    return 0


# -- topologies, parse ---------------------------------------------------------------------------


@dataclass
class TopologiesConfig:
    """The platform presets shipped with ncclrl, as CSV (any of them, or a topology YAML path, is
    what ``topology=`` takes)."""


def cmd_topologies(cfg) -> int:
    w = csv.writer(sys.stdout, lineterminator="\n")
    w.writerow(["name", "nodes", "gpus_per_node", "gpu", "fabric", "network", "channels", "description"])
    for name in preset_names():
        t = load_topology(name)
        w.writerow([name, t.nodes, t.gpus_per_node, t.gpu_model, t.intra.fabric, t.net.kind, t.nccl.channels,
                    t.description])
    return 0


@dataclass
class ParseConfig:
    """nccl-tests outputs (stdout captures or ``-J`` JSON) to tidy CSV on stdout.

    Reads what launchers and versions print: every table layout nccl-tests has had, the prefixes
    of mpirun's tag-output and srun's label options, NCCL debug lines interleaved (even inside a row),
    several runs per file (the ``run`` column counts them), bytes that are not UTF-8. The ``env``
    column is the NCCL configuration the run printed (NCCL's ``set by environment`` lines, an
    environment dump, the command line), else the one the file name gives; ``env_from`` says which.

    :param files: the files to read
    :param lenient: accept runs cut short (no closing summary: rows kept; a row cut short: left out),
        with a warning on stderr for each; false: such a run is an error
    """

    files: list[str] = field(default_factory=list)
    lenient: bool = True


def cmd_parse(cfg) -> int:
    from ncclrl.costmodel.nccltests import env_sources, parse_file_runs, run_env

    if not cfg.files:
        raise ConfigError("files", "no files given: ncclrl parse FILE...")
    _check_files("files", cfg.files)
    w = csv.writer(sys.stdout, lineterminator="\n")
    w.writerow(["source", "collective", "nbytes", "count", "dtype", "placement", "time_us", "algbw_gbps",
                "busbw_gbps", "wrong", "env", "run", "env_from"])
    for f in cfg.files:
        for i, run in enumerate(parse_file_runs(f, strict=not cfg.lenient)):
            for note in run.notes:
                print(f"warning: {note}", file=sys.stderr)
            env = ";".join(f"{k}={v}" for k, v in sorted(run_env(run).items()))
            env_from = "+".join(sorted(set(env_sources(run).values()), reverse=True))
            for r in run.records:
                for kind, res in (("out_of_place", r.out_of_place), ("in_place", r.in_place)):
                    if res is not None:
                        w.writerow([Path(f).name, r.collective, r.nbytes, r.count, r.dtype, kind, res.time_us,
                                    res.algbw_gbps, res.busbw_gbps, "" if res.wrong is None else res.wrong, env,
                                    i, env_from])
    return 0


# -- detect -------------------------------------------------------------------------------------


@dataclass
class DetectConfig:
    """Onboard a cluster from its own NCCL logs: read the ``NCCL_DEBUG=INFO`` output of any NCCL job
    (one file per process, or merged), print what it states (NCCL version, GPUs, ranks, nodes,
    channels, network, NICs, rings, trees, and with ``NCCL_DEBUG_SUBSYS=INIT,ENV,NET,GRAPH,TUNING``
    NCCL's tuning table and per-call decisions), build the topology it describes from the nearest
    preset, and report how many of NCCL's logged decisions the replica reproduces. The YAML is
    written only once everything succeeded.

    :param logs: NCCL_DEBUG=INFO outputs of one communicator's processes
    :param output: write the detected topology (YAML) here (``-o FILE`` works too); empty: only print
    :param preset: start from this preset name or YAML path instead of the nearest shipped preset
    :param name: the topology's name (empty: the output file's stem, else ``detected``)
    :param search: search the per-channel bandwidths the log leaves free for the best agreement
    """

    logs: list[str] = field(default_factory=list)
    output: str | None = None
    preset: str = ""
    name: str = ""
    search: bool = True

    def __post_init__(self) -> None:
        self.check()

    def check(self) -> None:
        if not self.logs:
            raise ConfigError("logs", "no log given: ncclrl detect LOG... [-o my-cluster.yaml]")
        for f in self.logs:
            if not Path(f).is_file():
                raise ConfigError("logs", f"no such file: {f}")
        if self.output and not str(self.output).endswith((".yaml", ".yml")):
            raise ConfigError("output", f"must end with .yaml or .yml, got {self.output!r}")
        if self.output and not Path(self.output).resolve().parent.is_dir():
            raise ConfigError("output", f"no such folder: {Path(self.output).parent}")
        if self.preset:
            try:
                load_topology(self.preset)
            except ConfigError as e:
                raise ConfigError("preset", str(e).split(": ", 1)[1]) from None
        if self.name and not re.fullmatch(r"[\w.\-]+", self.name):
            raise ConfigError("name", f"letters, digits, '.', '_' and '-' only, got {self.name!r}")


def _output_flag(argv: list[str]) -> list[str]:
    """``-o FILE`` / ``--output FILE`` as ``output=FILE``."""
    out, i = [], 0
    while i < len(argv):
        a = argv[i]
        if a in ("-o", "--output"):
            if i + 1 >= len(argv):
                raise ConfigError("output", f"{a} needs a file name: -o my-cluster.yaml")
            out.append(f"output={argv[i + 1]}")
            i += 2
            continue
        out.append(a)
        i += 1
    return out


def cmd_detect(cfg) -> int:
    from ncclrl.costmodel.detect import detect, report

    name = cfg.name or (Path(cfg.output).stem if cfg.output else "detected")
    det = detect(list(cfg.logs), name=name, preset=cfg.preset, search=cfg.search)
    for line in report(det):
        print(line)
    if cfg.output:
        out = Path(cfg.output)
        tmp = out.with_name(f".{out.stem}.detect-tmp.yaml")
        try:
            dump_topology(det.topology, tmp)
            load_topology(tmp)  # what every topology= reads, checked before the file appears
            head = "".join(f"# {ln}\n" for ln in textwrap.wrap(det.topology.description, 98))
            tmp.write_text(head + tmp.read_text())
            tmp.replace(out)
        finally:
            tmp.unlink(missing_ok=True)
        print(f"# wrote {out}")
    return 0


# -- plugin -------------------------------------------------------------------------------------


@dataclass
class PluginBuildConfig:
    """Compile ncclrl's NCCL tuner plugin (C11, libc only) from the sources shipped with ncclrl and
    print the library's path; the live commands load it from there.

    :param out: the folder to build into (empty: $NCCLRL_PLUGIN_DIR, else ~/.cache/ncclrl/plugin)
    """

    out: str = ""


def cmd_plugin_build(cfg) -> int:
    from ncclrl.envs.live import PLUGIN_DIR, build_plugin

    print(build_plugin(cfg.out or PLUGIN_DIR))
    return 0


PLUGIN_BUILD = Command("plugin build", PluginBuildConfig, cmd_plugin_build, "build the NCCL tuner plugin")
DECISIONS = Command("decisions", DecisionsConfig, cmd_decisions,
                    "NCCL's default decision per size (replica of NCCL 2.28)")
PREDICT = Command("predict", PredictConfig, cmd_predict, "the simulator's time_us for CSV rows on stdin")
CALIBRATE = Command("calibrate", CalibrateConfig, cmd_calibrate,
                    "fit a topology's simulator to nccl-tests outputs or a store", positional="files")
TOPOLOGIES = Command("topologies", TopologiesConfig, cmd_topologies, "list the platform presets")
PARSE = Command("parse", ParseConfig, cmd_parse, "nccl-tests outputs to CSV", positional="files")
DETECT = Command("detect", DetectConfig, cmd_detect, "onboard a cluster from its NCCL_DEBUG=INFO logs: a topology YAML",
                 positional="logs")


@dataclass(frozen=True)
class Entry:
    """A command as the program knows it before importing its module.

    :param name: what the user types
    :param module: the module whose attribute ``attr`` is the command (its schema and what it runs)
    :param attr: that attribute's name
    :param summary: its line in ``ncclrl --help``, the command's own summary (tests/test_cli.py checks)
    :param required: the keys whose default is empty and that the command refuses empty; ``--help``
        marks them (tests/test_cli.py runs each empty and expects it refused)
    :param example: a command line ``--help`` shows (tests/test_cli.py parses each)
    """

    name: str
    module: str
    attr: str
    summary: str
    required: tuple[str, ...] = ()
    example: str = ""


HERE = "ncclrl.runners.cli"
ENTRIES: list[Entry] = [
    Entry("pretrain", "ncclrl.runners.pretrain", "PRETRAIN",
          "train a search strategy in simulation, check it around the target, export the target's zero-shot table",
          example="ncclrl pretrain topology=h200-2x2-sock run_dir=runs/pretrain"),
    Entry("export", "ncclrl.runners.pretrain", "EXPORT",
          "export a platform's zero-shot table (the exact argmin of its simulator), or a job's (profile=)",
          example="ncclrl export topology=h200-1x4 run_dir=runs/table"),
    Entry("finetune", "ncclrl.runners.finetune", "COMMAND",
          "tune on live (or replayed) measurements under a GPU-time budget, export the table",
          required=("topology",), example="ncclrl finetune topology=h200-2x2-sock budget=0.5sweep out=runs/ft"),
    Entry("tune", "ncclrl.runners.tune", "COMMAND",
          "run one benchmark tuner on live (or replayed) measurements under a budget, export its table",
          required=("method", "topology"),
          example="ncclrl tune method=random topology=h200-2x2-sock budget=0.5sweep out=runs/random"),
    Entry("sweep", "ncclrl.runners.sweep", "COMMAND",
          "measure configurations on live GPUs into the measurement store (resumable)", required=("topology",),
          example="ncclrl sweep topology=h200-2x2-sock collectives=[allreduce] max_bytes=256M grid=full"),
    Entry("validate", "ncclrl.runners.validate", "COMMAND",
          "measure a table afresh through the plugin against NCCL's defaults, per size a verdict",
          required=("table", "topology"), example="ncclrl validate runs/ft/nccl_tuner.csv topology=h200-2x2-sock"),
    Entry("benchmark", "ncclrl.runners.benchmark", "COMMAND",
          "every tuner on the same problems (left-out families, misspecified, real replays) under the same budgets",
          example="ncclrl benchmark suite=ci workers=1"),
    Entry("show", "ncclrl.runners.show", "COMMAND", "print a table (CSV or JSON) back; draw its decision map",
          required=("table",), example="ncclrl show runs/ft/nccl_tuner.csv plot=map.png"),
    Entry("composer", "ncclrl.runners.composer", "COMMAND",
          "train the PPO job composer (finetune strategy=ppo) in simulation, judge it on unseen problems",
          example="ncclrl composer run_dir=runs/composer"),
    Entry("coordinator", "ncclrl.runners.coordinator.command", "COMMAND",
          "serve the plugin's online mode: every rank's timings in, one verdict per round out",
          example="ncclrl coordinator host=0.0.0.0 port=29555 secret_file=job.secret"),
    Entry("plugin build", HERE, "PLUGIN_BUILD", "build the NCCL tuner plugin",
          example="ncclrl plugin build out=build/plugin"),
    Entry("plugin verify", "ncclrl.runners.plugin_verify", "COMMAND",
          "check on GPUs, from NCCL's own log, that NCCL runs what a table says", required=("table", "topology"),
          example="ncclrl plugin verify runs/ft/nccl_tuner.csv topology=h200-2x2-sock"),
    Entry("e2e", "ncclrl.runners.e2e", "COMMAND",
          "train a small transformer (DDP, FSDP) with NCCL's defaults and with a table: step times and ratio",
          required=("table", "topology"), example="ncclrl e2e runs/ft/nccl_tuner.csv topology=h200-2x2-sock"),
    Entry("decisions", HERE, "DECISIONS", "NCCL's default decision per size (replica of NCCL 2.28)",
          example="ncclrl decisions topology=h200-2x2-sock collective=allreduce max_bytes=64M"),
    Entry("predict", HERE, "PREDICT", "the simulator's time_us for CSV rows on stdin",
          example="ncclrl predict topology=h200-2x2-sock < rows.csv"),
    Entry("calibrate", HERE, "CALIBRATE", "fit a topology's simulator to nccl-tests outputs or a store",
          example="ncclrl calibrate all_reduce.txt all_gather.txt topology=h200-2x2-sock output=my-cluster.yaml"),
    Entry("topologies", HERE, "TOPOLOGIES", "list the platform presets", example="ncclrl topologies"),
    Entry("parse", HERE, "PARSE", "nccl-tests outputs to CSV", required=("files",),
          example="ncclrl parse all_reduce.txt all_gather.txt"),
    Entry("detect", HERE, "DETECT", "onboard a cluster from its NCCL_DEBUG=INFO logs: a topology YAML",
          required=("logs",), example="ncclrl detect rank0.log rank1.log -o my-cluster.yaml"),
    Entry("profile", "ncclrl.runners.profile", "COMMAND",
          "what a training job calls per step, from NCCL logs, PyTorch traces or plugin logs: a profile YAML",
          required=("inputs",), example="ncclrl profile rank0.trace.json.gz -o job-profile.yaml"),
]
ENTRY = {e.name: e for e in ENTRIES}


def load(name: str) -> Command:
    """The command ``name``, its module imported (and its schema registered with Hydra), with what
    ``--help`` shows beside its keys: the required ones and an example."""
    e = ENTRY[name]
    if e.module == HERE:  # this module, also when it runs as python -m ncclrl.runners.cli
        cmd = globals()[e.attr]
    else:
        cmd = getattr(importlib.import_module(e.module), e.attr)
    register(cmd)
    return replace(cmd, required=e.required, example=e.example)


def __getattr__(name: str):
    """``COMMANDS`` and ``BY_NAME`` (every command, each module imported) on first use."""
    if name == "COMMANDS":
        globals()["COMMANDS"] = [load(e.name) for e in ENTRIES]
        return globals()["COMMANDS"]
    if name == "BY_NAME":
        globals()["BY_NAME"] = {c.name: c for c in __getattr__("COMMANDS")}
        return globals()["BY_NAME"]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def usage() -> str:
    lines = [f"usage: ncclrl COMMAND [key=value ...] [-m]   (ncclrl {__version__})", "",
             "Learn how NCCL should run each collective on your cluster.", "", "commands:"]
    lines += [f"  {e.name:<15} {e.summary}" for e in ENTRIES]
    lines += ["", "ncclrl COMMAND --help lists a command's keys and their defaults."]
    return "\n".join(lines)


def command_argv(name: str, argv: list[str]) -> list[str]:
    """A command's arguments as its parser reads them: ``-o FILE`` is ``output=FILE`` where the
    command writes one file (detect, profile)."""
    return _output_flag(argv) if name in ("detect", "profile") else list(argv)


def _cfg_flag(argv: list[str]) -> tuple[list[str], str | None]:
    """``--cfg job`` (``--cfg=job``, ``-c job``) taken out of ``argv``: the arguments left and the
    value given (None: no such flag)."""
    out, value, i = [], None, 0
    while i < len(argv):
        a = argv[i]
        if a in ("--cfg", "-c"):
            if i + 1 >= len(argv):
                raise ConfigError(a, "needs a value: --cfg job prints the composed config")
            value, i = argv[i + 1], i + 2
            continue
        if a.startswith("--cfg="):
            value = a.split("=", 1)[1]
        else:
            out.append(a)
        i += 1
    if value is not None and value != "job":
        raise ConfigError("--cfg", f"allowed: job (print the composed config as YAML and run nothing), got {value!r}")
    return out, value


def _raised(e: BaseException, module: str, name: str) -> bool:
    """Whether ``e`` is ``module.name``; a module never imported raised none of its own."""
    mod = sys.modules.get(module)
    return mod is not None and isinstance(e, getattr(mod, name))


def _error(e: BaseException) -> None:
    print("ncclrl: error: " + " ".join(str(e).split()), file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(usage())
        return 0 if argv else 2
    if argv[0] in ("-V", "--version"):
        print(f"ncclrl {__version__}")
        return 0
    name = argv[0]
    if name == "plugin":
        if len(argv) >= 2 and argv[1] in ("-h", "--help", "help"):
            print("usage: ncclrl plugin build|verify [key=value ...]\n\ncommands:")
            for e in (ENTRY["plugin build"], ENTRY["plugin verify"]):
                print(f"  {e.name:<15} {e.summary}")
            print("\nncclrl plugin build --help, ncclrl plugin verify --help list their keys.")
            return 0
        if len(argv) < 2 or argv[1] not in ("build", "verify"):
            print("ncclrl: error: plugin: allowed: build, verify (ncclrl plugin build | ncclrl plugin verify TABLE "
                  "topology=...)", file=sys.stderr)
            return 2
        name, rest = f"plugin {argv[1]}", argv[2:]
    else:
        rest = argv[1:]
    if name not in ENTRY:
        print(f"ncclrl: error: command: unknown {name!r}; allowed: {', '.join(ENTRY)}", file=sys.stderr)
        return 2
    try:
        rest, cfg_flag = _cfg_flag(command_argv(name, rest))
    except ConfigError as e:
        _error(e)
        return 2
    cmd = load(name)
    try:
        if any(a in ("-h", "--help") for a in rest):
            print(command_help(cmd))
            return 0
        if cfg_flag:
            print(composed_yaml(cmd, rest))
            return 0
        return run_command(cmd, rest)
    except JobError as e:  # the cluster's doing, not the user's input
        _error(e)
        return 1
    except ConfigError as e:
        _error(e)
        return 2
    except BrokenPipeError:
        return 0
    except ValueError as e:
        if _raised(e, "ncclrl.costmodel.nccltests", "NcclTestsError"):  # a file that is not an nccl-tests run
            _error(e)
            return 2
        raise
    except SystemExit as e:
        if _raised(e, "ncclrl.envs.jobs.run", "Interrupted"):  # the job in flight was ended; its measurements kept
            print(f"ncclrl: interrupted by {e.name}; what was measured is in the store, and the same command resumes",
                  file=sys.stderr)
            return int(e.code)
        raise
    except KeyboardInterrupt:
        print("ncclrl: interrupted; what was measured is in the store, and the same command resumes",
              file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
