"""Every plot in docs/results/plots/ that ncclrl's plotting functions draw from data in this
repository (no GPU; about a minute on 2 cores). Run from the repository root:

    python docs/results/scripts/make_plots.py            # writes into docs/results/plots/
    python docs/results/scripts/make_plots.py OUT_DIR    # or elsewhere

Each plot, its source and the function drawing it is printed, one line each.
"""

from __future__ import annotations

import json
import sys
import tarfile
import tempfile
from pathlib import Path

import pandas as pd

from ncclrl.agents.evaluate import evaluate_table, s_curve_plot
from ncclrl.agents.export import export_table
from ncclrl.agents.finetune import sizes_for
from ncclrl.agents.plots import (
    changes_from_evaluation,
    changes_from_validation,
    plot_composer_curves,
    plot_step_times,
    plot_table_change,
    size_changes,
)
from ncclrl.costmodel import nccl as N
from ncclrl.costmodel.simulator import Simulator
from ncclrl.costmodel.topology import load_topology
from ncclrl.costmodel.units import parse_bytes
from ncclrl.runners.benchmark import plot as benchmark_plot

DATA = Path("data")
RESULTS = Path("docs/results")


def said(path: Path, what: str) -> None:
    print(f"{path}: {what}")


def per_side(val: pd.DataFrame) -> str:
    """How many jobs per side a validate report pooled: ``3``, or ``3-5`` where sizes differ."""
    lo, hi = int(val["jobs"].min()), int(val["jobs"].max())
    return f"{lo}" if lo == hi else f"{lo}-{hi}"


def unpack(archive: Path, into: Path, *members: str) -> Path:
    """``members`` of a recorded run's archive into ``into``."""
    with tarfile.open(archive) as t:
        for m in members:
            t.extract(m, into, filter="data")
    return into


def s_curve(out: Path, topology: str) -> None:
    """The zero-shot table as ``ncclrl export`` / ``pretrain`` writes it, judged by the simulator."""
    sim = Simulator(topology)
    table = export_table(sim)
    df = evaluate_table(table.for_shape(sim.topo.nodes, sim.topo.nranks), sim)
    p = s_curve_plot(df, sim, out / f"s-curve-{topology}.png")
    said(p, f"predicted S-curves of the zero-shot table for {topology} (agents.evaluate.s_curve_plot)")
    ar = df[df["collective"] == "allreduce"]
    s = plot_table_change(changes_from_evaluation(ar), out / f"table-change-predicted-{topology}.png",
                          f"ncclrl export topology={topology}: the zero-shot table per size",
                          "the simulator's times for the table + nccl.conf and for NCCL's defaults")
    said(s.path, f"predicted per-size change, allreduce: {len(s.slower)} sizes predicted slower")


def finetune_change(out: Path, tmp: Path) -> None:
    """finetune's own evidence (each changed row's confirmation jobs) and validate's fresh jobs, on
    4 x H200 as 2 nodes x 2 GPUs (data/h200x4-2026-11-28, part 2)."""
    root = unpack(DATA / "h200x4-2026-11-28" / "part2.tar.gz", tmp / "part2", "./ft/finetune.json",
                  "./ft/nccl_tuner.csv", "./val.csv")
    ft = json.loads((root / "ft" / "finetune.json").read_text())
    args = ft["provenance"]["args"]
    topo = load_topology(ft["topology"])
    colls = [N.parse_name("collectives", c, N.COLLECTIVES) for c in args["collectives"]]
    sizes = sizes_for(topo, colls, parse_bytes(str(args["min_bytes"])), parse_bytes(str(args["max_bytes"])))
    s = plot_table_change(size_changes(ft["rows"], sizes), out / "table-change-finetune-h200-2x2-sock.png",
                          f"ncclrl finetune on {topo.name} (4 x H200, NCCL {ft['provenance']['nccl_version']}): "
                          f"the exported table per size",
                          "each changed row's confirmation jobs, paired with NCCL's choice (finetune.json)")
    said(s.path, f"finetune's per-size evidence: {s.collectives['allreduce']['changed']} sizes changed")
    val = pd.read_csv(root / "val.csv")
    s = plot_table_change(changes_from_validation(val, (root / "ft" / "nccl_tuner.csv").read_text(), topo.nodes,
                                                  topo.nranks),
                          out / "table-change-validate-h200-2x2-sock.png",
                          f"ncclrl validate of that table on {topo.name}", f"fresh jobs, {per_side(val)} per side")
    said(s.path, f"validate's fresh jobs: {len(s.slower)} sizes slower")


def tune_change(out: Path) -> None:
    """A ``tune method=afnfa`` table (data/h200x4-2026-11-21/run5), judged from the validation jobs
    stored for it."""
    table = DATA / "h200x4-2026-11-21" / "run5" / "bench" / "afnfa" / "nccl_tuner.csv"
    val = pd.read_csv(DATA / "h200x4-2026-11-21" / "noise" / "rejudged" / "bench-afnfa-run5.csv")
    topo = load_topology(str(val["topology"].iloc[0]))
    s = plot_table_change(changes_from_validation(val, table.read_text(), topo.nodes, topo.nranks),
                          out / "table-change-tune-afnfa.png",
                          f"ncclrl tune method=afnfa on {topo.name} (4 x H200): the exported table per size",
                          f"stored validation jobs, {per_side(val)} per side")
    said(s.path, f"tune afnfa, validated: {len(s.slower)} sizes slower")


def benchmarks(out: Path) -> None:
    """The benchmark of docs/results/benchmarks (its summary.csv, as ``ncclrl benchmark`` wrote it)."""
    src = RESULTS / "benchmarks"
    ref = next((ln.split(":", 1)[1].strip() for ln in (src / "config.yaml").read_text().splitlines()
                if ln.startswith("ref:")), "jobs")
    p = benchmark_plot(pd.read_csv(src / "summary.csv"), out / "benchmark.png", ref)
    said(p, f"the benchmark of {src} (runners.benchmark.plot, reference {ref})")


def e2e(out: Path, tmp: Path) -> None:
    root = unpack(DATA / "h200x4-2026-11-28" / "part3.tar.gz", tmp / "part3", "./e2e/steps.csv",
                  "./e2e/summary.json")
    for folder, name, title in (
            (root / "e2e", "e2e-steps-h200-2x2-sock.png",
             "ncclrl e2e on h200-2x2-sock (4 x H200, DDP, d_model=512): finetune's table against NCCL's defaults"),
            (DATA / "h100x1-jobs-2026-11-24" / "second-run" / "e2e-large", "e2e-steps-h100-one-rank.png",
             "ncclrl e2e on one H100 (one rank: NCCL runs no algorithm, both sides should tie)")):
        summary = json.loads((folder / "summary.json").read_text())
        r = plot_step_times(pd.read_csv(folder / "steps.csv"), out / name, summary["modes"], title)
        said(r["path"], "e2e step times: " + "; ".join(f"{m} ratio {v['ratio']:.3f}" for m, v in r.items()
                                                         if m != "path"))


def composer(out: Path) -> None:
    r = plot_composer_curves(RESULTS / "composer" / "tensorboard", out / "composer-curves.png")
    said(r["path"], "the job composer's training curves (docs/results/composer/tensorboard)")


def main(argv: list[str]) -> int:
    out = Path(argv[0]) if argv else RESULTS / "plots"
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as t:
        tmp = Path(t)
        s_curve(out, "a100-2x4-sock")
        finetune_change(out, tmp)
        tune_change(out)
        benchmarks(out)
        e2e(out, tmp)
        composer(out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
