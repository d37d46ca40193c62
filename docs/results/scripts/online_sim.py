"""The online-exploration study (docs/results/online-sim.md): tune the baselines on seed stream 1,
train the PPO policy with 5 seeds on stream 1 (2 at a time), judge every policy on stream 2, write
the CSVs to docs/results/online-sim/ and the shipped weights (seed 0) to agents/pretrained/.

    python docs/results/scripts/online_sim.py [--out docs/results/online-sim] [--train 300] [--judge 300]
        [--draws 4] [--steps 150000] [--seeds 5] [--runs runs/online-sim] [--ship]

``--weights A.json [B.json ...]`` judges those PPO weights (as seeds 0, 1, ...) instead of training
any: the baselines' tuning and judging and those weights' judged numbers, in about a minute
(``--weights agents/pretrained/online_policy.json``: the shipped seed 0). The criteria then cover
only the seeds judged.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import time
from pathlib import Path

import pandas as pd

from ncclrl.agents.online import POLICIES, Commit, OnlinePolicy, PPOPolicy, make_policy, policy_path
from ncclrl.agents.online_sim import PROFILES, SimConfig, TrainConfig, draw_problems, run_episode, train
from ncclrl.costmodel.workload import t_interval

TRAIN_STREAM, JUDGE_STREAM = 1, 2
CELLS = [(p, i) for p in PROFILES for i in (False, True)]
GRIDS = {"round-robin": [{"rounds": r} for r in (1, 2, 3, 4, 6, 8, 12, 16)],
         "halving": [{"rounds_per_stage": r} for r in (1, 2, 3, 4)],
         "thompson": [{"cap_rounds": c, "draws": 1000, "p_best": q} for c in (4, 16, 48) for q in (0.9, 0.95)]}
BASELINES = ("round-robin", "halving", "thompson")


class Fixed(OnlinePolicy):
    """A reference: commit one arm from the first call (``default``: NCCL's default arm)."""

    def __init__(self, name: str, arm: int | str) -> None:
        self.name, self.arm = name, arm

    def first(self, n_arms, prior_us, slots, rng):
        return Commit(self.arm)

    def decide(self, state, rng):
        return Commit(0)


def problems(stream: int, n: int):
    return {c: draw_problems(n, stream, c[0], c[1]) for c in CELLS}


def evaluate(pol: OnlinePolicy, probs, draws: int, stream: int) -> pd.DataFrame:
    rows = []
    for (prof, inter), ps in probs.items():
        for i, p in enumerate(ps):
            for d in range(draws):
                if isinstance(pol, Fixed) and pol.arm == "default":
                    r = run_episode(p, Fixed("nccl-default", p.default_arm), stream * 100_000 + i * 16 + d)
                else:
                    r = run_episode(p, pol, stream * 100_000 + i * 16 + d)
                rows.append({"profile": prof, "interference": inter, "problem": i, "draw": d, **r})
    return pd.DataFrame(rows)


def _train(args: tuple[int, int, int, str, str, str]) -> str:
    seed, n_train, steps, paired, paired_kw, out = args
    os.environ["OMP_NUM_THREADS"] = "1"
    import torch

    torch.set_num_threads(1)
    probs = [p for ps in problems(TRAIN_STREAM, n_train).values() for p in ps]
    pol = train(probs, TrainConfig(total_timesteps=steps, seed=seed, paired=paired), SimConfig(),
                json.loads(paired_kw))
    return str(pol.save(Path(out) / f"ppo-seed{seed}.json"))


def summarize(df: pd.DataFrame) -> dict[str, float]:
    per = df.groupby(["profile", "interference", "problem"]).agg(
        rel_static=("rel_static", "mean"), rel_default=("rel_default", "mean"),
        slower_commit=("slower_commit", "mean"), slower_total=("slower_total", "mean"),
        commit_frac=("commit_frac", "mean"), commit_rounds=("commit_rounds", "mean"))
    out: dict[str, float] = {"problems": len(per), "runs": len(df)}
    for col in ("rel_static", "rel_default", "commit_rounds", "commit_frac"):
        m, lo, hi = t_interval(per[col].to_numpy())
        out |= {col: m, f"{col}_lo": lo, f"{col}_hi": hi}
    out |= {"slower_commit": float(df.slower_commit.mean()), "slower_total": float(df.slower_total.mean()),
            "ratio_of_sums_static": float(df.total_us.sum() / (df.total_us / df.rel_static).sum())}
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="docs/results/online-sim")
    ap.add_argument("--runs", default="runs/online-sim")
    ap.add_argument("--train", type=int, default=300, help="training problems per cell (stream 1)")
    ap.add_argument("--tune", type=int, default=150, help="tuning problems per cell (stream 1)")
    ap.add_argument("--judge", type=int, default=300, help="judged problems per cell (stream 2)")
    ap.add_argument("--draws", type=int, default=4)
    ap.add_argument("--steps", type=int, default=150_000)
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--ship", action="store_true", help="write seed 0's weights to agents/pretrained/")
    ap.add_argument("--weights", nargs="+", default=None,
                    help="judge these PPO weights (seeds 0, 1, ...) instead of training")
    a = ap.parse_args()
    if a.weights and a.ship:
        ap.error("--ship writes trained weights; --weights trains none")
    out, runs = Path(a.out), Path(a.runs)
    out.mkdir(parents=True, exist_ok=True)
    if not a.weights:
        runs.mkdir(parents=True, exist_ok=True)
    t0 = time.time()

    # 1. tune the baselines on the training stream
    tune = problems(TRAIN_STREAM, a.tune)
    rows = []
    for name, grid in GRIDS.items():
        for kw in grid:
            s = summarize(evaluate(make_policy(name, **kw), tune, 2, TRAIN_STREAM))
            rows.append({"policy": name, "params": json.dumps(kw), **s})
            print(f"tune {name} {kw}: {s['rel_static']:.4f} slower {s['slower_commit']:.4f}", flush=True)
    tuned = pd.DataFrame(rows)
    tuned.to_csv(out / "tuning.csv", index=False, float_format="%.5g")
    best_kw = {n: json.loads(tuned[tuned.policy == n].sort_values("rel_static").iloc[0].params) for n in BASELINES}
    paired = min(BASELINES, key=lambda n: float(tuned[(tuned.policy == n)].rel_static.min()))
    print(f"# tuned {best_kw}; paired baseline {paired} ({time.time() - t0:.0f} s)", flush=True)

    # 2. train PPO, 2 seeds at a time (or judge the weights given)
    if a.weights:
        paths, a.seeds = list(a.weights), len(a.weights)
        print(f"# not trained: judging {paths} as seeds 0..{a.seeds - 1}", flush=True)
    else:
        jobs = [(s, a.train, a.steps, paired, json.dumps(best_kw[paired]), str(runs)) for s in range(a.seeds)]
        with mp.get_context("spawn").Pool(2) as pool:
            paths = pool.map(_train, jobs)
        print(f"# trained {len(paths)} seeds ({time.time() - t0:.0f} s)", flush=True)
    if a.ship:
        PPOPolicy.load(paths[0]).save(policy_path())

    # 3. judge on stream 2
    judge = problems(JUDGE_STREAM, a.judge)
    pols: dict[str, OnlinePolicy] = {n: make_policy(n, **best_kw[n]) for n in BASELINES}
    pols |= {f"ppo-seed{s}": PPOPolicy.load(p) for s, p in enumerate(paths)}
    pols |= {"static": Fixed("static", 0), "nccl-default": Fixed("nccl-default", "default")}
    res = {name: evaluate(pol, judge, a.draws, JUDGE_STREAM) for name, pol in pols.items()}
    summ = []
    for name, df in res.items():
        summ.append({"policy": name, "cell": "pooled", **summarize(df)})
        for (prof, inter), g in df.groupby(["profile", "interference"]):
            summ.append({"policy": name, "cell": f"{prof}/{'interference' if inter else 'isolated'}", **summarize(g)})
    oracle = res["static"].assign(rel_static=lambda d: d.oracle_vs_static)
    summ.append({"policy": "oracle", "cell": "pooled", **summarize(oracle)})
    pd.DataFrame(summ).to_csv(out / "summary.csv", index=False, float_format="%.5g")

    # 4. the criteria
    key = ["profile", "interference", "problem"]
    per = {n: df.groupby(key).rel_static.mean() for n, df in res.items()}
    best = min(BASELINES, key=lambda n: float(per[n].mean()))
    crit = []
    for s in range(a.seeds):
        n = f"ppo-seed{s}"
        for cell, sel in [("pooled", slice(None))] + [(f"{p}/{'interference' if i else 'isolated'}", (p, i))
                                                      for p, i in CELLS]:
            diff = (per[n] - per[best])
            d = diff if cell == "pooled" else diff.loc[sel]
            m, lo, hi = t_interval(d.to_numpy())
            slow = float(res[n].slower_commit.mean() - res[best].slower_commit.mean())
            crit.append({"seed": s, "cell": cell, "best_baseline": best, "diff": m, "diff_lo": lo, "diff_hi": hi,
                         "slower_commit_excess": slow,
                         "pass": bool(m < 0 and hi < 0 and slow <= 0.005) if cell == "pooled" else None})
    crit = pd.DataFrame(crit)
    crit.to_csv(out / "criteria.csv", index=False, float_format="%.5g")
    ok = bool(crit[crit.cell == "pooled"]["pass"].all())
    print(crit[crit.cell == "pooled"].to_string(index=False))
    print(f"# best baseline {best}; success over the {a.seeds} seed(s) judged: {ok}; "
          f"ship {'ppo' if ok else best} ({time.time() - t0:.0f} s)")
    assert set(BASELINES) | {"ppo"} == set(POLICIES)


if __name__ == "__main__":
    main()
