"""How much one seed says on the known-optimum problem of tests/test_baselines.py: each tuner with a
third of the space on the noise-free synthetic platform (its optimum under 4 channels x 4 threads x
4 sockets + inline), fraction of the optimum for seeds 0-4, and the same on the platform where only
NCCL's own algorithm at 2 channels under 4 reaches the optimum (``CountWins``).

    python docs/results/benchmarks/known_optimum_seeds.py
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))

from test_baselines import CountWins, Synthetic, small_problem  # noqa: E402

from ncclrl.agents.baselines import Evaluator, Judge, make_tuner, sim_measure  # noqa: E402

problem = small_problem()
for plat in (Synthetic(problem.topo), CountWins(problem.topo)):
    judge = Judge(problem, plat)
    for method in ("random", "afnfa", "tpe", "autoccl"):
        got = []
        for seed in range(5):
            ev = Evaluator(problem, sim_measure(plat), problem.n_points // 3)
            got.append(judge.judge(make_tuner(method).tune(problem, ev, seed=seed)).fraction)
        print(f"{type(plat).__name__:>9} {method:>8}: " + " ".join(f"{f:.3f}" for f in got))
