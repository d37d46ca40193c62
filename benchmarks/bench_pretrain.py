"""The main job's goals, measured: pretraining time, export time, and the exported tables'
geometric-mean speedup over NCCL's default against the simulator's exhaustive optimum, on every
preset and on a preset held out of pretraining.

    python benchmarks/bench_pretrain.py [--timesteps 200000] [--seed 0] [--out runs/bench]

Prints a Markdown table (what docs/results/pretrain.md holds).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from ncclrl.agents.evaluate import evaluate_table, summary
from ncclrl.agents.export import export_table
from ncclrl.agents.pretrain import AgentConfig, pretrain
from ncclrl.costmodel.simulator import Simulator
from ncclrl.costmodel.topology import preset_names

HELD_OUT = "a100-16x4-ib"


def run(topologies: list[str], steps: int, seed: int, out: Path):
    t0 = time.perf_counter()
    model = pretrain(topologies, AgentConfig(total_timesteps=steps, seed=seed), out, randomize=0.75,
                     progress_bar=False)
    return model, time.perf_counter() - t0


def rows_for(model, targets: list[str], label: str) -> list[str]:
    lines = []
    for name in targets:
        sim = Simulator(name)
        for tune_conf in (False, True):
            t0 = time.perf_counter()
            table = export_table(model, sim, tune_conf=tune_conf, top_k=16)
            dt = time.perf_counter() - t0
            s = summary(evaluate_table(table, sim))
            t1 = export_table(model, sim, tune_conf=tune_conf, top_k=1)
            s1 = summary(evaluate_table(t1, sim))
            conf = " ".join(f"{k}={v}" for k, v in sorted(table.conf.items())) or "-"
            lines.append(f"| {name} | {label} | {'yes' if tune_conf else 'no'} | {s['geomean_speedup']:.3f}x | "
                         f"{s['optimum_geomean_speedup']:.3f}x | {100 * s['fraction_of_optimum']:.1f}% | "
                         f"{100 * s1['fraction_of_optimum']:.1f}% | {s['worst_vs_default']:.3f}x | {dt:.2f} s | "
                         f"{conf} |")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--timesteps", type=int, default=200_000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="runs/bench")
    args = ap.parse_args()
    out = Path(args.out)
    presets = preset_names()
    model, t_all = run(presets, args.timesteps, args.seed, out / "all")
    held = [p for p in presets if p != HELD_OUT]
    model_h, t_held = run(held, args.timesteps, args.seed, out / "holdout")
    print(f"pretraining, {args.timesteps:,} steps, seed {args.seed}: {t_all / 60:.2f} min on all presets, "
          f"{t_held / 60:.2f} min without {HELD_OUT}\n")
    print("| target | pretrained on | nccl.conf | speedup | optimum | fraction of optimum (top-16) | "
          "fraction (policy alone) | worst size | export | knobs |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for line in rows_for(model, presets, "all presets"):
        print(line)
    for line in rows_for(model_h, [HELD_OUT], f"all but {HELD_OUT}"):
        print(line)


if __name__ == "__main__":
    main()
