"""Whether a tuning run should let the strategy stop before its budget is spent, judged on the
development suite (conf/suite/dev.yaml) with the benchmark's left-out strategies: every problem,
seeds 0-2, budgets 50/200/1000, with and without the stop.

    python docs/results/scripts/choose_stop.py docs/results/benchmarks/strategies > docs/results/stop.txt

The argument is the folder of the left-out strategies (without-FAMILY.json).
"""

import sys
from pathlib import Path

import numpy as np
from omegaconf import OmegaConf

from ncclrl.agents.baselines.ncclrl import SearchTuner
from ncclrl.agents.problem import Evaluator
from ncclrl.agents.search import PolicyController, SearchConfig
from ncclrl.runners.benchmark import compose, instance, tasks


def main(folder: Path) -> None:
    cfg = compose(["suite=dev"])
    suite = OmegaConf.to_container(cfg.suite, resolve=True)
    probs = list({t["set"] + t["problem"]: t for t in tasks(cfg)}.values())
    got: dict[bool, list[float]] = {True: [], False: []}
    used: dict[bool, list[int]] = {True: [], False: []}
    for t in probs:
        inst = instance(t, suite)
        ctl = PolicyController.load(folder / f"without-{t['family']}.json")
        for allow in (True, False):
            for b in suite["budgets"]:
                for seed in (0, 1, 2):
                    ev = Evaluator(inst.problem, inst.measure_for(seed), b)
                    d = SearchTuner(ctl, "ncclrl", SearchConfig(allow_stop=allow)).tune(inst.problem, ev, seed)
                    got[allow].append(inst.oracle.score(d).fraction)
                    used[allow].append(ev.used / b)
    print(f"# the development suite: {len(probs)} problems, budgets {suite['budgets']}, seeds 0-2; "
          f"strategies from {folder}")
    print("# allow_stop  mean fraction of the optimum  mean share of the budget used")
    for allow in (True, False):
        print(f"{str(allow):<11} {np.mean(got[allow]):.4f} {np.mean(used[allow]):.3f}")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
