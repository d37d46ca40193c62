"""The stopping agent's experiment (docs/explanation/stopping.md): train, tune the rule's pay factor
on training problems, judge on unseen problems, and replay recorded hosts and grids.

    python docs/results/scripts/stopping_experiment.py train OUT --seed 0
    python docs/results/scripts/stopping_experiment.py tune-rule OUT
    python docs/results/scripts/stopping_experiment.py judge OUT --agents OUT/stopper-seed0.json,OUT/stopper-seed1.json
    python docs/results/scripts/stopping_experiment.py replays OUT --agents ...
    python docs/results/scripts/stopping_experiment.py curves OUT   # OUT/tb -> OUT/training.png

Training problems: the calibrated generator's seed stream 1; judged problems: stream 2. Every
run's job noise comes from its own problem's stream and draw (``measure(seed)``); the methods on
one problem and draw share it.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

TRAIN_STREAM, JUDGE_STREAM = 1, 2
N_TRAIN, N_TUNE, N_JUDGE = 600, 150, 300
FACTORS = (0.25, 0.5, 1.0, 2.0, 4.0, 8.0)


def _controller(method: str, tp, agents: dict):
    from ncclrl.agents.search.confirm import ConfirmController
    from ncclrl.agents.stopping import StopController, rule_config

    if method.startswith("rule"):
        f = float(method.split("x", 1)[1]) if "x" in method else 1.0
        return ConfirmController(rule_config(tp, pay_factor=f))
    return StopController(rule_config(tp), policy=agents[method])


def _work(args) -> list[dict]:
    from dataclasses import asdict

    from ncclrl.agents.generator import calibrated_problems
    from ncclrl.agents.stopping import PolicyStopper, run_once

    stream, idx, draws, methods, agent_paths = args
    agents = {m: PolicyStopper.load(p) for m, p in agent_paths.items()}
    probs = calibrated_problems(max(idx) + 1, stream)
    rows = []
    for i in idx:
        tp = probs[i]
        for d in range(draws):
            for m in methods:
                r = run_once(tp, _controller(m, tp, agents), d)
                rows.append({"method": m, "problem_id": i, "problem": tp.name, "family": tp.family, "draw": d,
                             "serve_gpu_s": tp.serve_gpu_s, "optimum_pct": 100 * tp.optimum(), **asdict(r)})
    return rows


def _pool_map(fn, jobs, procs):
    if procs == 1:
        return [fn(j) for j in jobs]
    with mp.get_context("spawn").Pool(procs) as pool:
        return pool.map(fn, jobs)


def ci95(x) -> tuple[float, float, float]:
    from ncclrl.agents.compose import ci95 as c

    return c(np.asarray(x, dtype=float))


def paired_table(df: pd.DataFrame, ref: str) -> list[str]:
    per = df.groupby(["method", "problem_id"]).net_value.mean().unstack(0)
    lines = [f"| method | net value (points), mean [95%] | lead over `{ref}` [95%] | jobs "
             "| sizes slower (runs with any) |",
             "| --- | ---: | ---: | ---: | ---: |"]
    for m in per.mean().sort_values(ascending=False).index:
        mu, lo, hi = ci95(per[m])
        dm, dlo, dhi = ci95(per[m] - per[ref])
        sub = df[df.method == m]
        lines.append(f"| `{m}` | {mu:+.2f} [{lo:+.2f}, {hi:+.2f}] | {dm:+.2f} [{dlo:+.2f}, {dhi:+.2f}] | "
                     f"{sub.jobs.mean():.1f} | {sub.slower.mean():.2f} ({100 * (sub.slower > 0).mean():.0f}%) |")
    return lines


def cmd_train(a) -> int:
    from ncclrl.agents.generator import calibrated_problems
    from ncclrl.agents.stopping.train import StopTrainConfig, train

    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    probs = calibrated_problems(N_TRAIN, TRAIN_STREAM)
    cfg = StopTrainConfig(seed=a.seed, tensorboard=str(out / "tb"))
    pol = train(probs, cfg)
    pol.save(out / f"stopper-seed{a.seed}.json")
    return 0


def cmd_tune_rule(a) -> int:
    out = Path(a.out)
    methods = tuple(f"rule x{f:g}" if f != 1.0 else "rule" for f in FACTORS)
    jobs = [(TRAIN_STREAM, list(range(k, N_TUNE, a.procs)), 2, methods, {}) for k in range(a.procs)]
    t0 = time.time()
    df = pd.DataFrame([r for p in _pool_map(_work, jobs, a.procs) for r in p])
    df.to_csv(out / "tune-rule.csv", index=False)
    per = df.groupby("method").net_value.mean()
    best = per.idxmax()
    lines = [f"# `python docs/results/scripts/stopping_experiment.py {' '.join(sys.argv[1:])}`", "",
             f"The rule's pay factor on {N_TUNE} training problems (stream {TRAIN_STREAM}) x 2 draws, "
             f"{(time.time() - t0) / 60:.1f} min. Chosen: `{best}`.", "", *paired_table(df, "rule")]
    (out / "tune-rule.md").write_text("\n".join(lines) + "\n")
    (out / "tuned-rule.json").write_text(json.dumps({"method": best}) + "\n")
    print("\n".join(lines))
    return 0


def _agents(a) -> dict[str, str]:
    return {f"ppo seed {k}": p for k, p in enumerate(x for x in a.agents.split(",") if x)}


def cmd_judge(a) -> int:
    out = Path(a.out)
    tuned = json.loads((out / "tuned-rule.json").read_text())["method"]
    agents = _agents(a)
    methods = tuple(dict.fromkeys(["rule", tuned, *agents]))
    jobs = [(JUDGE_STREAM, list(range(k, N_JUDGE, a.procs)), a.draws, methods, agents) for k in range(a.procs)]
    t0 = time.time()
    df = pd.DataFrame([r for p in _pool_map(_work, jobs, a.procs) for r in p])
    df.to_csv(out / "judge.csv", index=False)
    lines = [f"# `python docs/results/scripts/stopping_experiment.py {' '.join(sys.argv[1:])}`", "",
             f"{N_JUDGE} judged problems (stream {JUDGE_STREAM}, never trained on) x {a.draws} noise draws, "
             f"{(time.time() - t0) / 60:.1f} min on {a.procs} cores.", "", *paired_table(df, "rule"), ""]
    if tuned != "rule":
        lines += [f"Against the tuned rule (`{tuned}`):", "", *paired_table(df, tuned), ""]
    per = df.groupby(["method", "problem_id"]).net_value.mean().unstack(0)
    fam = df.groupby(["family", "problem_id"]).size().reset_index()[["family", "problem_id"]].set_index("problem_id")
    lines += ["Lead over `rule` per family (points, mean [95%], problems):", "",
              "| family | " + " | ".join(f"`{m}`" for m in agents) + " |", "| --- |" + " ---: |" * len(agents)]
    for f, grp in fam.groupby("family"):
        ids = grp.index
        cells = []
        for m in agents:
            mu, lo, hi = ci95((per[m] - per["rule"]).loc[ids])
            cells.append(f"{mu:+.2f} [{lo:+.2f}, {hi:+.2f}] ({len(ids)})")
        lines.append(f"| {f} | " + " | ".join(cells) + " |")
    (out / "judge.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


def _replay_work(args) -> list[dict]:
    from dataclasses import asdict

    from ncclrl.agents.stopping import PolicyStopper, ReplayProblem, run_once

    names, methods, agent_paths, seeds = args
    agents = {m: PolicyStopper.load(p) for m, p in agent_paths.items()}
    rows = []
    for name in names:
        inst = _instance(name)
        for b in (0.25, 0.5, 1.0):
            for h in (10.0, 100.0):
                tp = ReplayProblem(inst, b, h)
                for s in range(seeds):
                    for m in methods:
                        r = run_once(tp, _controller(m, tp, agents), s)
                        rows.append({"recording": name, "budget_sweeps": b, "horizon_sweeps": h, "seed": s,
                                     "method": m, **asdict(r)})
    return rows


def _instance(name: str):
    from ncclrl.agents.stopping.replays import recorded_instance

    return recorded_instance(name)


def cmd_replays(a) -> int:
    from ncclrl.agents.stopping.replays import RECORDINGS, available

    out = Path(a.out)
    agents = _agents(a)
    methods = ("rule", *agents)
    names = [n for n in RECORDINGS if available(n)]
    jobs = [(names[k::a.procs], methods, agents, 5) for k in range(a.procs)]
    t0 = time.time()
    df = pd.DataFrame([r for p in _pool_map(_replay_work, jobs, a.procs) for r in p])
    df.to_csv(out / "replays.csv", index=False)
    lines = [f"# `python docs/results/scripts/stopping_experiment.py {' '.join(sys.argv[1:])}`", "",
             f"Fresh-noise replays of {len(names)} recordings x budgets 0.25/0.5/1 sweep x horizons 10/100 sweeps x "
             f"5 seeds, {(time.time() - t0) / 60:.1f} min. Per (recording, budget, horizon): the agent's net value "
             "minus the rule's, mean over seeds [95%]; **below** marks an interval wholly below 0.", "",
             "| recording | budget | horizon | rule | " + " | ".join(f"`{m}` lead" for m in agents) + " |",
             "| --- | ---: | ---: | ---: |" + " ---: |" * len(agents)]
    below = dict.fromkeys(agents, 0)
    for (rec, b, h), g in df.groupby(["recording", "budget_sweeps", "horizon_sweeps"], sort=False):
        rule = g[g.method == "rule"].set_index("seed").net_value
        cells = []
        for m in agents:
            d = g[g.method == m].set_index("seed").net_value - rule
            mu, lo, hi = ci95(d)
            bad = hi < 0
            below[m] += int(bad)
            cells.append(f"{mu:+.2f} [{lo:+.2f}, {hi:+.2f}]" + (" **below**" if bad else ""))
        lines.append(f"| {rec} | {b:g} | {h:g} | {rule.mean():+.2f} | " + " | ".join(cells) + " |")
    lines += ["", "Cells wholly below the rule: " + ", ".join(f"`{m}` {n}" for m, n in below.items()) + "."]
    (out / "replays.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


def cmd_curves(a) -> int:
    from ncclrl.agents.plots import STOP_TAGS, plot_composer_curves

    out = Path(a.out)
    res = plot_composer_curves(out / "tb", out / "training.png", tags=STOP_TAGS, xlabel="training decisions",
                               title="PPO stopping agent, training on the calibrated generator's problems (thin: "
                                     "each logged mean; thick: running mean of 9)")
    print(json.dumps(res["runs"], indent=1))
    return 0


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("what", choices=("train", "tune-rule", "judge", "replays", "curves"))
    ap.add_argument("out")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--agents", default="")
    ap.add_argument("--draws", type=int, default=5)
    ap.add_argument("--procs", type=int, default=2)
    a = ap.parse_args()
    Path(a.out).mkdir(parents=True, exist_ok=True)
    return {"train": cmd_train, "tune-rule": cmd_tune_rule, "judge": cmd_judge, "replays": cmd_replays,
            "curves": cmd_curves}[a.what](a)


if __name__ == "__main__":
    sys.exit(main())
