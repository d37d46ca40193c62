"""Check P1 of docs/explanation/composer.md: the composer in the full run (``Search``), judged by
net value on judged problems of the experiment (seed stream 2) beside finetune's ``jobs`` and
knowledge gradient per GPU-second as a composer.

    python docs/results/scripts/compose_full_run.py OUT [--problems N] [--draws N] [--composer PATH]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

JUDGE_STREAM = 2
METHODS = ("jobs", "ppo", "kg-jobs")  # --methods adds ei-shape: EI/s on jobs of every band, one candidate per size


def _run(args: tuple[list[int], int, str, tuple[str, ...]]) -> list[dict]:
    idx, draws, composer, methods = args
    from ncclrl.agents.compose import ComposerController, Draw, PerSecond, draw_full
    from ncclrl.agents.compose_train import PolicyComposer
    from ncclrl.agents.problem import Evaluator, platform_measure
    from ncclrl.agents.search import JobController, Search, SearchConfig

    pol = PolicyComposer.load(composer)
    rows = []
    for i in idx:
        problem, oracle, plat, cp = draw_full(np.random.default_rng([JUDGE_STREAM, i]), Draw())
        c = problem.colls[0]
        base = oracle.base[c]
        for d in range(draws):
            for m in methods:
                made = {"ppo": lambda: pol, "kg-jobs": lambda: PerSecond("kg"),
                        "ei-shape": lambda: PerSecond("ei", stop_factor=16.0, shape=(4, 1))}
                ctl = JobController() if m == "jobs" else ComposerController(made[m](), serve_gpu_s=cp.serve_gpu_s)
                ev = Evaluator(problem, platform_measure(plat, np.random.default_rng([i, d, 5])), cp.budget_gpu_s)
                t0 = time.perf_counter()
                res = Search(problem, ev, ctl, SearchConfig()).run()
                t = oracle.time_of(res.decision, c)
                saved = 1.0 - float(np.dot(cp.calls, t)) / float(np.dot(cp.calls, base))
                rows.append({"method": m, "problem_id": i, "problem": cp.name, "family": cp.family, "seed": d,
                             "net_value": 100 * (saved - ev.gpu_s / cp.serve_gpu_s), "saved_pct": 100 * saved,
                             "spent_pct": 100 * ev.gpu_s / cp.serve_gpu_s, "optimum_pct": 100 * cp.optimum(),
                             "jobs": ev.calls, "slower": int((t > 1.01 * base).sum()),
                             "reason": res.reason, "wall_s": time.perf_counter() - t0})
    return rows


def main() -> int:
    from ncclrl.agents.compose import ci95

    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--problems", type=int, default=60)
    ap.add_argument("--draws", type=int, default=2)
    ap.add_argument("--composer", default="agents/pretrained/composer.json")
    ap.add_argument("--methods", default=",".join(METHODS))
    ap.add_argument("--tag", default="full-run", help="name of the output files")
    a = ap.parse_args()
    methods = tuple(a.methods.split(","))
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    with mp.get_context("spawn").Pool(2) as pool:
        parts = pool.map(_run, [(list(range(k, a.problems, 2)), a.draws, a.composer, methods) for k in range(2)])
    df = pd.DataFrame([r for p in parts for r in p])
    df.to_csv(out / f"{a.tag}.csv", index=False)
    per = df.groupby(["method", "problem_id"]).net_value.mean().unstack(0)
    lines = [f"# `python docs/results/scripts/compose_full_run.py {' '.join(sys.argv[1:])}`", "",
             f"{a.problems} judged problems (seed stream {JUDGE_STREAM}) x {a.draws} noise draws through the full "
             f"run, {(time.time() - t0) / 60:.1f} min on 2 cores.", "",
             "| method | net value (points), mean [95%] | jobs | sizes slower (runs with any) | s per run |",
             "| --- | ---: | ---: | ---: | ---: |"]
    for m in per.mean().sort_values(ascending=False).index:
        mu, lo, hi = ci95(per[m].to_numpy())
        sub = df[df.method == m]
        lines.append(f"| {m} | {mu:+.2f} [{lo:+.2f}, {hi:+.2f}] | {sub.jobs.mean():.1f} | {int(sub.slower.sum())} "
                     f"({int((sub.slower > 0).sum())} of {len(sub)}) | {sub.wall_s.mean():.1f} |")
    lines += ["", "| pair | difference, paired [95%] |", "| --- | ---: |"]
    for x, y in [(x, y) for x, y in (("ppo", "jobs"), ("ppo", "kg-jobs"), ("kg-jobs", "jobs"), ("ei-shape", "jobs"),
                                     ("ppo", "ei-shape")) if x in per and y in per]:
        mu, lo, hi = ci95((per[x] - per[y]).to_numpy())
        lines.append(f"| {x} - {y} | {mu:+.2f} [{lo:+.2f}, {hi:+.2f}] |")
    fam = df.groupby(["family", "method"]).net_value.mean().unstack(1)
    lines += ["", "| family | " + " | ".join(fam.columns) + " |", "| --- |" + " ---: |" * len(fam.columns)]
    for f, r in fam.iterrows():
        lines.append(f"| {f} | " + " | ".join(f"{v:+.2f}" for v in r) + " |")
    (out / f"{a.tag}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
