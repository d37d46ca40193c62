"""The job composer's experiment (docs/explanation/composer.md): train the PPO composer on seed
stream 1 with 2 training seeds, judge it and every baseline on 300 problems of seed stream 2 x 5
noise draws, and write the per-run results, the summary against the pre-registered criteria and
the shipped-candidate weights.

    python docs/results/scripts/compose_experiment.py OUT [--train N] [--judge N] [--steps N] [--draws N]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import sys
import time
from dataclasses import asdict
from pathlib import Path

import pandas as pd

from ncclrl.agents.compose import BASELINES, ci95, draw_problems, play

TRAIN_STREAM, JUDGE_STREAM = 1, 2
CRITERION_BASELINES = ("nccl", "ei/s", "ucb/s", "kg/s", "sweep-race", "jobs")


def _train(args: tuple[int, int, int, str, int, bool, str]) -> str:
    seed, n_train, steps, out, reweight, macros, paired = args
    os.environ["OMP_NUM_THREADS"] = "1"
    from ncclrl.agents.compose_train import TrainConfig, train

    problems = draw_problems(n_train, TRAIN_STREAM)
    cfg = TrainConfig(total_timesteps=steps, seed=seed, tensorboard=str(Path(out) / "tensorboard"),
                      reweight_every=reweight, macros=macros, paired=paired)
    pol = train(problems, cfg, log=lambda m: print(f"[seed {seed}] {m}", flush=True))
    return str(pol.save(Path(out) / f"composer-seed{seed}.json"))


def _judge(args: tuple[list[int], int, int, list[str], str]) -> list[dict]:
    idx, n_judge, draws, policies, out = args
    from ncclrl.agents.compose_train import PolicyComposer

    problems = draw_problems(n_judge, JUDGE_STREAM)
    pols = {Path(p).stem.replace("composer-", "ppo-"): PolicyComposer.load(p) for p in policies}
    rows = []
    for i in idx:
        for d in range(draws):
            for make in BASELINES.values():
                rows.append({**asdict(play(problems[i], make(), d)), "problem_id": i})
            for name, pol in pols.items():
                o = asdict(play(problems[i], pol, d))
                o["method"] = name
                rows.append({**o, "problem_id": i})
    return rows


def summarize(df: pd.DataFrame) -> list[str]:
    per = df.groupby(["method", "problem_id"]).net_value.mean().unstack(0)
    means = per.mean().sort_values(ascending=False)
    lines = ["| method | net value (points), mean [95%] | jobs | sizes slower (runs with any) |",
             "| --- | ---: | ---: | ---: |"]
    for m in means.index:
        mu, lo, hi = ci95(per[m].to_numpy())
        sub = df[df.method == m]
        lines.append(f"| {m} | {mu:+.2f} [{lo:+.2f}, {hi:+.2f}] | {sub.jobs.mean():.1f} | "
                     f"{int(sub.slower.sum())} ({int((sub.slower > 0).sum())} of {len(sub)}) |")
    best = max(CRITERION_BASELINES, key=lambda m: per[m].mean())
    lines += ["", f"Best baseline on the judged set: **{best}** ({per[best].mean():+.2f}).", "",
              "| agent | minus best baseline, paired [95%] | criterion (> +0.5 and interval above 0) |",
              "| --- | ---: | --- |"]
    for m in [c for c in per.columns if c.startswith("ppo")]:
        mu, lo, hi = ci95((per[m] - per[best]).to_numpy())
        ok = mu > 0.5 and lo > 0
        lines.append(f"| {m} | {mu:+.2f} [{lo:+.2f}, {hi:+.2f}] | {'met' if ok else 'not met'} |")
        for b in CRITERION_BASELINES:
            mu, lo, hi = ci95((per[m] - per[b]).to_numpy())
            lines.append(f"| {m} vs {b} | {mu:+.2f} [{lo:+.2f}, {hi:+.2f}] | |")
    fam = df.groupby(["family", "method"]).net_value.mean().unstack(1)
    lines += ["", "Mean net value per family (points):", "", "| family | " + " | ".join(fam.columns) + " |",
              "| --- |" + " ---: |" * len(fam.columns)]
    for f, r in fam.iterrows():
        lines.append(f"| {f} | " + " | ".join(f"{v:+.2f}" for v in r) + " |")
    return lines


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--train", type=int, default=600, help="training problems (seed stream 1)")
    ap.add_argument("--judge", type=int, default=300, help="judged problems (seed stream 2)")
    ap.add_argument("--steps", type=int, default=80_000, help="PPO steps per training seed")
    ap.add_argument("--draws", type=int, default=5, help="noise draws per judged problem")
    ap.add_argument("--seeds", type=int, default=2, help="training seeds")
    ap.add_argument("--reweight", type=int, default=0, help="episodes between reweighting towards trailing problems")
    ap.add_argument("--macros", action="store_true", help="the agent chooses among the macros (design B)")
    ap.add_argument("--paired", default="sweep-race", help="baseline paired with each training episode")
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    ctx = mp.get_context("spawn")
    with ctx.Pool(2) as pool:
        policies = pool.map(_train, [(s, a.train, a.steps, str(out), a.reweight, a.macros, a.paired)
                                     for s in range(a.seeds)])
    t_train = time.time() - t0
    chunks = [list(range(i, a.judge, 2)) for i in range(2)]
    with ctx.Pool(2) as pool:
        parts = pool.map(_judge, [(c, a.judge, a.draws, policies, str(out)) for c in chunks])
    df = pd.DataFrame([r for p in parts for r in p])
    df.to_csv(out / "results.csv", index=False)
    lines = [f"# `python docs/results/scripts/compose_experiment.py {' '.join(sys.argv[1:])}`", "",
             f"Training: {a.seeds} seeds x {a.steps} steps on {a.train} problems (seed stream {TRAIN_STREAM}), "
             f"{t_train / 60:.1f} min on 2 cores; judged: {a.judge} problems (seed stream {JUDGE_STREAM}) x "
             f"{a.draws} noise draws, {(time.time() - t0 - t_train) / 60:.1f} min.", "", *summarize(df)]
    (out / "summary.md").write_text("\n".join(lines) + "\n")
    (out / "meta.json").write_text(json.dumps(vars(a), indent=1) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
