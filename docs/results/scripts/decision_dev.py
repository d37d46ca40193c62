"""The decision's alpha chosen on development problems only: `jobs` (finetune's default) on the
recorded 2x1 sweep (fresh job noise) and the development suite's misspecified platforms (seed
stream 777, one per preset), seeds 0-2, budgets 0.25, 0.5 and 1 sweep, alpha 0.2 and 0.05.
Criterion (fixed before running): the alpha with the fewest runs leaving a size more than 1%
slower than NCCL's default on the expected truth; on a tie, the higher mean fraction at 0.5 sweep.

    python docs/results/scripts/decision_dev.py 3 OUT.jsonl   # seeds, output (one JSON line per run)
"""
import itertools
import json
import sys
from multiprocessing import Pool

from ncclrl.agents.problem import Evaluator
from ncclrl.agents.search import DecisionConfig, JobController, Search, SearchConfig
from ncclrl.agents.suite import replayed, simulated
from ncclrl.costmodel.jobcost import DEFAULT_JOB_COST
from ncclrl.costmodel.platforms import FAMILIES

CONFIGS = {"a0.2": dict(alpha=0.2), "a0.05": dict(alpha=0.05)}
PRESETS = [p for f in FAMILIES.values() for p in f]

def inst(name):
    if name == "2x1":
        return replayed("data/h200x2-2026-11-22/store.sqlite", "h200-2x1-sock", "nccl", "allreduce")
    return simulated(name, 0, "allreduce", 777, True, 8, 1 << 30)

def task(args):
    name, seed = args
    inst_ = inst(name)
    sweep = inst_.oracle.sweep_gpu_s(DEFAULT_JOB_COST, 5)
    out = []
    for cname, kw in CONFIGS.items():
        for b in (0.25, 0.5, 1.0):
            ev = Evaluator(inst_.problem, inst_.measure_for(seed), b * sweep, samples=5)
            cfg = SearchConfig(decision=DecisionConfig(**kw))
            d = Search(inst_.problem, ev, JobController(), cfg).run().decision
            v = inst_.oracle.score(d)
            out.append(dict(problem=name, seed=seed, config=cname, budget=b, fraction=v.fraction,
                            safe_fraction=v.safe_fraction, slower=v.slower, worst=v.worst, rows=len(d.rows)))
    return out

if __name__ == "__main__":
    probs = ["2x1"] + PRESETS
    seeds = range(int(sys.argv[1]) if len(sys.argv) > 1 else 5)
    with Pool(2) as pool, open(sys.argv[2], "w") as f:
        for res in pool.imap_unordered(task, list(itertools.product(probs, seeds))):
            for r in res:
                f.write(json.dumps(r) + "\n")
            f.flush()
            print(res[0]["problem"], res[0]["seed"], flush=True)
