"""The ``ncclrl`` command line.

Every command turns bad input into one line on stderr (``ncclrl: error: FIELD: ...``) and exit
code 2, never a traceback.
"""

from __future__ import annotations

import argparse
import csv
import io
import re
import sys
from pathlib import Path
from typing import NoReturn

import numpy as np

from costmodel import nccl as N
from costmodel.errors import ConfigError

_SUFFIX = {"": 1, "b": 1, "k": 1 << 10, "kb": 1 << 10, "kib": 1 << 10, "m": 1 << 20, "mb": 1 << 20,
           "mib": 1 << 20, "g": 1 << 30, "gb": 1 << 30, "gib": 1 << 30, "t": 1 << 40, "tib": 1 << 40}


def parse_bytes(text: str, field: str = "nbytes") -> int:
    """``8``, ``64K``, ``1M``, ``4GiB`` -> bytes; zero, negative or fractional sizes are errors."""
    m = re.fullmatch(r"\s*([+-]?\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*", str(text))
    if not m or m.group(2).lower() not in _SUFFIX:
        raise ConfigError(field, f"not a size: {text!r}; use a whole number of bytes with an optional "
                          "K, M or G suffix")
    value = float(m.group(1)) * _SUFFIX[m.group(2).lower()]
    if value != int(value):
        raise ConfigError(field, f"must be a whole number of bytes, got {text!r}")
    if value <= 0:
        raise ConfigError(field, f"must be > 0, got {text!r}")
    return int(value)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\n")


def _size_grid(lo: int, hi: int) -> np.ndarray:
    if hi < lo:
        raise ConfigError("max_bytes", f"must be >= min_bytes ({lo}), got {hi}")
    sizes = []
    s = lo
    while s <= hi:
        sizes.append(s)
        s *= 2
    return np.array(sizes, dtype=np.int64)


# -- commands -----------------------------------------------------------------------------------


def cmd_decisions(args: argparse.Namespace) -> int:
    from costmodel.replica import default_decisions
    from costmodel.topology import load_topology

    topo = load_topology(args.topology)
    colls = list(N.COLLECTIVES) if args.collective == "all" else [
        N.COLLECTIVES[N.parse_name("collective", args.collective, N.COLLECTIVES)]]
    sizes = _size_grid(parse_bytes(args.min_bytes, "min_bytes"), parse_bytes(args.max_bytes, "max_bytes"))
    out = csv.writer(sys.stdout, lineterminator="\n")
    header = ["collective", "nbytes", "algo", "proto", "channels"]
    if args.full:
        header += ["nthreads", "chunk_bytes", "time_us"]
    out.writerow(header)
    for c in colls:
        d = default_decisions(topo, c, sizes, num_pipe_ops=args.num_pipe_ops)
        for i in range(sizes.size):
            row = [c, int(sizes[i]), N.ALGOS[d.algo[i]], N.PROTOS[d.proto[i]], int(d.channels[i])]
            if args.full:
                row += [int(d.nthreads[i]), int(d.chunk_bytes[i]), f"{d.time_us[i]:.3f}"]
            out.writerow(row)
    return 0


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


def _int_field(row: dict[str, str], key: str, line: int) -> int:
    v = row.get(key, "") or "0"
    if not re.fullmatch(r"\d+", v):
        raise ConfigError(f"line {line}: {key}", f"must be a whole number >= 0, got {v!r}")
    return int(v)


def cmd_predict(args: argparse.Namespace) -> int:
    from costmodel.simulator import Configs, Simulator

    sim = Simulator(args.topology, seed=args.seed)
    header, rows = _read_csv_rows(sys.stdin)
    cols = {k: [] for k in ("coll", "nbytes", "algo", "proto", "channels", "comm_channels", "buffsize_bytes",
                            "socket_nthreads", "nsocks_perthread")}
    for row in rows:
        line = row["_line"]
        cols["coll"].append(N.parse_name(f"line {line}: collective", row["collective"], N.COLLECTIVES))
        cols["nbytes"].append(parse_bytes(row["nbytes"], f"line {line}: nbytes"))
        cols["algo"].append(N.parse_name(f"line {line}: algo", row["algo"], N.ALGOS))
        cols["proto"].append(N.parse_name(f"line {line}: proto", row["proto"], N.PROTOS))
        for key in ("channels", "comm_channels", "buffsize_bytes", "socket_nthreads", "nsocks_perthread"):
            cols[key].append(_int_field(row, key, line))
    cfg = Configs.make(**cols)
    times = sim.sample(cfg)[:, 0] if args.noise else sim.time_us(cfg)
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


def cmd_calibrate(args: argparse.Namespace) -> int:
    import pandas as pd

    from costmodel.calibrate import error_table, fit, holdout_split, measurements_from_runs
    from costmodel.simulator import SimParams, Simulator
    from costmodel.topology import dump_topology, load_topology
    from runners.nccltests import parse_file

    topo = load_topology(args.topology)
    if bool(args.files) == bool(args.store):
        raise ConfigError("calibrate", "give nccl-tests FILES or --store STORE (one of them)")
    if args.store:
        from costmodel.calibrate import measurements_from_store
        from runners.store import Store

        if not Path(args.store).is_file():
            raise ConfigError("store", f"no such file: {args.store}")
        with Store(Path(args.store)) as st:
            df = measurements_from_store(topo, st.frame())
        # a store's rows are points, not files: one configuration (algo/proto/channels/knobs) per "config"
        df["config"] = df[["algo", "proto", "channels", "source"]].astype(str).agg("_".join, axis=1)
        sources = [f"store {Path(args.store).name}"]
    else:
        df = measurements_from_runs(topo, [parse_file(f) for f in args.files])
        sources = [Path(f).name for f in args.files]
    start = SimParams.defaults(topo) if args.from_defaults else SimParams.from_topology(topo)
    pd.set_option("display.width", 120)
    if not args.no_holdout:
        train, test, held = holdout_split(df, seed=args.seed)
        if held:
            res = fit(topo, train, start)
            sim = Simulator(topo, res.params)
            print(f"# held out of the fit ({len(held)} configurations): {', '.join(held)}")
            print(f"# fit on {len(train)} rows, {res.n_params} parameters")
            print("# error on the rows used by the fit:")
            print(error_table(sim, train).to_string(index=False, float_format=lambda v: f"{v:.3f}"))
            print("# error on held-out configurations:")
            print(error_table(sim, test).to_string(index=False, float_format=lambda v: f"{v:.3f}"))
        else:
            print("# too few configurations per family to hold any out; fitting on all")
    res = fit(topo, df, start)
    sim = Simulator(topo, res.params)
    print(f"# final fit on all {len(df)} rows:")
    print(error_table(sim, df).to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    if args.output:
        name = Path(args.output).stem
        new = topo.with_sim(res.params.to_dict(), name=name)
        from dataclasses import replace

        new = replace(new, description=f"{topo.description} -- calibrated from {', '.join(sources)}"[:2000])
        dump_topology(new, args.output)
        print(f"# wrote {args.output}")
    return 0


def cmd_topologies(args: argparse.Namespace) -> int:
    from costmodel.topology import load_topology, preset_names

    w = csv.writer(sys.stdout, lineterminator="\n")
    w.writerow(["name", "nodes", "gpus_per_node", "gpu", "fabric", "network", "channels", "description"])
    for name in preset_names():
        t = load_topology(name)
        w.writerow([name, t.nodes, t.gpus_per_node, t.gpu_model, t.intra.fabric, t.net.kind, t.nccl.channels,
                    t.description])
    return 0


def cmd_parse(args: argparse.Namespace) -> int:
    from runners.nccltests import parse_file, run_env

    w = csv.writer(sys.stdout, lineterminator="\n")
    w.writerow(["source", "collective", "nbytes", "count", "dtype", "placement", "time_us", "algbw_gbps",
                "busbw_gbps", "wrong", "env"])
    for f in args.files:
        run = parse_file(f, strict=not args.lenient)
        env = ";".join(f"{k}={v}" for k, v in sorted(run_env(run).items()))
        for r in run.records:
            for kind, res in (("out_of_place", r.out_of_place), ("in_place", r.in_place)):
                if res is not None:
                    w.writerow([Path(f).name, r.collective, r.nbytes, r.count, r.dtype, kind, res.time_us,
                                res.algbw_gbps, res.busbw_gbps, "" if res.wrong is None else res.wrong, env])
    return 0


def cmd_pretrain(args: argparse.Namespace) -> int:
    from runners.pretrain import main_pretrain

    return main_pretrain(args.overrides)


def cmd_benchmark(args: argparse.Namespace) -> int:
    from runners.benchmark import main_benchmark

    return main_benchmark(args.overrides)


def cmd_export(args: argparse.Namespace) -> int:
    from runners.pretrain import cmd_export as run_export

    run_export(args.checkpoint, args.overrides)
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    from runners.show import show

    return show(args.table, args.plot)


def cmd_plugin(args: argparse.Namespace) -> int:
    import subprocess

    plugin_dir = Path(__file__).resolve().parent.parent / "plugin"
    if args.action == "build":
        p = subprocess.run(["make", "--no-print-directory", "-C", str(plugin_dir)], capture_output=True, text=True)
        if p.returncode != 0:
            last = (p.stderr or p.stdout).strip().splitlines()[-1:] or ["make failed"]
            raise ConfigError("plugin", f"build failed: {last[0]}")
        print(plugin_dir / "build" / "libnccl-tuner-ncclrl.so")
        return 0
    if not args.table or not args.topology:
        raise ConfigError("plugin verify", "needs TABLE and --topology (the platform the job runs on)")
    from runners.plugin_verify import verify

    return verify(args.table, args.topology, Path(args.out), args.max_bytes, args.iters, args.plugin)


def cmd_sweep(args: argparse.Namespace) -> int:
    from runners.sweep import parse_args, run_sweep

    run_sweep(parse_args(args.args))
    return 0


def cmd_finetune(args: argparse.Namespace) -> int:
    from runners.finetune import parse_args, run_finetune

    run_finetune(args.checkpoint, parse_args(args.args))
    return 0


def cmd_tune(args: argparse.Namespace) -> int:
    from runners.tune import parse_args, run_tune

    run_tune(parse_args(args.args))
    return 0


def cmd_validate(args: argparse.Namespace) -> int:
    from runners.validate import parse_args, run_validate

    run_validate(parse_args(args.args))
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="ncclrl", description="Learn how NCCL should run each collective on your cluster.")
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)

    pt = sub.add_parser("pretrain", help="pretrain in simulation, evaluate on the target, export its table "
                        "(Hydra overrides, e.g. topology=dgx-h100-2n agent.total_timesteps=50000)")
    pt.add_argument("overrides", nargs="*", help="Hydra overrides key=value")
    pt.set_defaults(func=cmd_pretrain)

    bm = sub.add_parser("benchmark", help="every tuner (NCCL default, exhaustive, random, AFNFA, TPE, AutoCCL, "
                        "ncclrl) on held-out simulated platforms under the same budgets (Hydra overrides, e.g. "
                        "suite=ci workers=1)")
    bm.add_argument("overrides", nargs="*", help="Hydra overrides key=value (conf/benchmark.yaml)")
    bm.set_defaults(func=cmd_benchmark)

    ex = sub.add_parser("export", help="export a pretrained policy's table for a platform, without retraining")
    ex.add_argument("--checkpoint", required=True, help="policy.zip from a pretraining run")
    ex.add_argument("overrides", nargs="*", help="Hydra overrides, e.g. topology=h200-1x4 run_dir=out/")
    ex.set_defaults(func=cmd_export)

    sh = sub.add_parser("show", help="print an exported table (CSV or JSON) and draw its decision map")
    sh.add_argument("table", help="nccl_tuner.csv or nccl_tuner.json")
    sh.add_argument("--plot", help="write the decision map to this PNG")
    sh.set_defaults(func=cmd_show)

    pl = sub.add_parser("plugin", help="build our NCCL tuner plugin, or verify a table with it on GPUs")
    pl.add_argument("action", choices=["build", "verify"])
    pl.add_argument("table", nargs="?", help="verify: the table (nccl_tuner.csv)")
    pl.add_argument("--topology", help="verify: the platform the job runs on (preset or YAML)")
    pl.add_argument("--out", default="plugin-verify", help="verify: folder for NCCL logs and verify.json")
    pl.add_argument("--max-bytes", type=int, default=1 << 30)
    pl.add_argument("--iters", type=int, default=20)
    pl.add_argument("--plugin", help="verify: path to the .so (default: plugin/build/)")
    pl.set_defaults(func=cmd_plugin)

    sw = sub.add_parser("sweep", help="measure configurations on live GPUs into the store (key=value args: "
                        "backend= topology= collectives= min_bytes= max_bytes= grid=default|full store= samples=)")
    sw.add_argument("args", nargs="*")
    sw.set_defaults(func=cmd_sweep)

    ft = sub.add_parser("finetune", help="fine-tune a pretrained policy on live measurements under a budget, "
                        "guard and export (key=value args: backend=torch|replay topology= collectives= budget= ...)")
    ft.add_argument("--checkpoint", required=True, help="policy.zip from a pretraining run")
    ft.add_argument("args", nargs="*")
    ft.set_defaults(func=cmd_finetune)

    tu = sub.add_parser("tune", help="run a benchmark tuner (method=exhaustive|random|afnfa|tpe|autoccl|ncclrl...) "
                        "on live measurements under a budget and export its table (key=value args)")
    tu.add_argument("args", nargs="*")
    tu.set_defaults(func=cmd_tune)

    va = sub.add_parser("validate", help="measure an exported table afresh through the plugin against NCCL's "
                        "defaults (key=value args: table= conf= topology= collectives= rounds= samples= out=)")
    va.add_argument("args", nargs="*")
    va.set_defaults(func=cmd_validate)

    d = sub.add_parser("decisions", help="NCCL's default decision per size (replica of NCCL 2.28)")
    d.add_argument("--topology", required=True, help="preset name or YAML path")
    d.add_argument("--collective", required=True, help=f"{', '.join(N.COLLECTIVES)} or all")
    d.add_argument("--min-bytes", default="8")
    d.add_argument("--max-bytes", default="1G")
    d.add_argument("--num-pipe-ops", type=int, default=1)
    d.add_argument("--full", action="store_true", help="also print threads, chunk and NCCL's predicted time")
    d.set_defaults(func=cmd_decisions)

    pr = sub.add_parser("predict", help="simulated time_us for CSV rows collective,nbytes,algo,proto,channels "
                        "on stdin")
    pr.add_argument("--topology", required=True, help="preset name or YAML path")
    pr.add_argument("--noise", action="store_true", help="one noisy sample instead of the expected time")
    pr.add_argument("--seed", type=int, default=0)
    pr.set_defaults(func=cmd_predict)

    c = sub.add_parser("calibrate", help="fit a topology's simulator to nccl-tests output files")
    c.add_argument("files", nargs="*", help="nccl-tests stdout captures or -J JSON files")
    c.add_argument("--store", help="fit to the measurements of this store (ncclrl sweep/finetune/validate) "
                   "instead of nccl-tests files")
    c.add_argument("--topology", required=True, help="preset name or YAML path to start from")
    c.add_argument("-o", "--output", help="write the calibrated preset here (usable as --topology)")
    c.add_argument("--seed", type=int, default=0, help="seed of the held-out split")
    c.add_argument("--no-holdout", action="store_true", help="skip the held-out evaluation")
    c.add_argument("--from-defaults", action="store_true",
                   help="start from topology-derived defaults instead of the preset's sim block")
    c.set_defaults(func=cmd_calibrate)

    t = sub.add_parser("topologies", help="list the topology presets")
    t.set_defaults(func=cmd_topologies)

    pa = sub.add_parser("parse", help="nccl-tests output files to CSV")
    pa.add_argument("files", nargs="+")
    pa.add_argument("--lenient", action="store_true", help="accept truncated runs")
    pa.set_defaults(func=cmd_parse)
    return p


def main(argv: list[str] | None = None) -> int:
    from runners.nccltests import NcclTestsError

    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except (ConfigError, NcclTestsError) as e:
        print(f"ncclrl: error: {e}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
