"""The public measured grids as benchmark problems: what each is and what it allows.

    NCCLRL_SHARED_DATA=/path/to/shared/data python docs/results/scripts/public_grids.py
    NCCLRL_SHARED_DATA=/path/to/shared/data python docs/results/scripts/public_grids.py --tuners

Per grid of ``ncclrl.envs.grids.PUBLIC_GRIDS``: its source, the preset, what was forced, the sizes,
where NCCL's default comes from, and the problem it becomes (cells, configurations, points, the
oracle's optimum speedup over NCCL's default and the best single configuration's). Then, on the p5en
grid at 8 and 16 nodes, where NCCL's own default was measured (on another date): NCCL's default
timed through the replica's choice against the measured one, per size.

``--tuners``: the benchmark's tuners that need no training (and ncclrl with its shipped strategy,
which was trained on the presets of the three families, never on these platforms) on each problem
at budgets 50 and 200, seeds 0-4: the median over seeds of the fraction of the optimum reached.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from ncclrl.agents.suite import gridded, public_gridded
from ncclrl.costmodel import nccl as N
from ncclrl.costmodel.replica import default_decisions
from ncclrl.costmodel.space import DEFAULT
from ncclrl.costmodel.topology import load_topology
from ncclrl.envs.grids import BASE_KNOBS, PUBLIC_GRIDS, public_grid_folder, read_grid


def human(n: int) -> str:
    for unit, k in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << k and n % (1 << k) == 0:
            return f"{n >> k} {unit}"
    return f"{n} B"


def med(jobs: list[list[float]]) -> float:
    return float(np.exp(np.mean([np.log(np.median(j)) for j in jobs])))


def main() -> None:
    root = public_grid_folder()
    print(f"public grids read from {root}\n")
    print("| problem | preset | source | forced | sizes | NCCL's default | cells | configurations | points | "
          "optimum | best single configuration | cells > 4 GiB | cells where NCCL's default takes > 2x the best |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for name, pg in PUBLIC_GRIDS.items():
        inst = public_gridded(name)
        p, o = inst.problem, inst.oracle
        c = p.colls[0]
        sizes = p.sizes[c]
        src = (root / pg.folder / "SOURCE.txt").read_text().split("\n", 1)[0].split(":", 1)[1].strip().split()[0]
        confs = p.grid.configurations()
        forced = ", ".join(sorted({f"{a}/{q}" for a, q, _ in confs}))
        t = o.times[(p.base.knobs, c)]
        single = max(float(np.exp(np.mean(np.log(t[0] / row)))) for row in t[1:] if np.isfinite(row).all()) \
            if any(np.isfinite(row).all() for row in t[1:]) else float("nan")
        big = sum(s > (1 << 32) - 1 for s in sizes)
        best = t.min(axis=0)
        slow = [f"{human(s)} ({t[0, i] / best[i]:.1f}x)" for i, s in enumerate(sizes) if t[0, i] > 2 * best[i]]
        print(f"| {name} | {pg.topology} | {src} | {forced} | {len(sizes)}: {human(sizes[0])} - {human(sizes[-1])} | "
              f"{p.default_source} | {p.n_cells} | {len(confs)} | {p.n_points} | {o.optimum:.3f}x | {single:.3f}x | "
              f"{big} | {', '.join(slow) or 'none'} |")
    print("\nNCCL's default at 8 and 16 nodes on p5en: measured (tuner_comparison, another date and NCCL version) "
          "against the replica's choice timed by the nightly grid's forced run of it")
    d = root / PUBLIC_GRIDS["p5en-16n"].folder
    for n in (8, 16):
        topo = replace(load_topology("p5en-16n"), nodes=n, name=f"p5en-{n}n")
        files = [d / f for f in PUBLIC_GRIDS["p5en-16n"].files]
        m = read_grid(files, topo, [str(d / f"tuner_comparison_allreduce_{n}nodes_0x0.csv")])
        r = read_grid(files, topo, "replica")
        rows = []
        for s in m.sizes[4]:
            x = (BASE_KNOBS, 4, s, DEFAULT)
            if x in r.recorded:
                dd = default_decisions(topo, 4, [s])
                key = (N.ALGOS[dd.algo[0]], N.PROTOS[dd.proto[0]])
                rows.append((s, med(m.recorded[x]), med(r.recorded[x]), key))
        ratio = np.array([b / a for _, a, b, _ in rows])
        geo = np.exp(np.mean(np.log(ratio)))
        print(f"\n{n} nodes: {len(rows)} sizes; replica-timed / measured: geometric mean {geo:.3f}, "
              f"median {np.median(ratio):.3f}; sizes off by more than 1.5x: "
              + ", ".join(f"{human(s)} ({k[0]}/{k[1]}: {b:.0f} us vs {a:.0f} us)" for s, a, b, k in rows
                          if not 1 / 1.5 < b / a < 1.5))
        mi = gridded(m, topo, "infiniband")
        print(f"{n} nodes, measured default: {mi.problem.n_cells} cells, optimum {mi.oracle.optimum:.3f}x")
        # the same with the preset's other channel estimate: 16 channels of twice the bandwidth
        t16 = replace(topo, nccl=replace(topo.nccl, channels=16),
                      intra=replace(topo.intra, channel_bw_gbps=2 * topo.intra.channel_bw_gbps),
                      net=replace(topo.net, channel_bw_gbps=2 * topo.net.channel_bw_gbps))
        r16 = read_grid(files, t16, "replica")
        x16 = [med(r16.recorded[x]) / med(m.recorded[x]) for s in m.sizes[4]
               if (x := (BASE_KNOBS, 4, s, DEFAULT)) in r16.recorded]
        print(f"{n} nodes with 16 channels in the preset: replica-timed / measured: geometric mean "
              f"{np.exp(np.mean(np.log(x16))):.3f}, median {np.median(x16):.3f}")


def tuners(budgets: tuple[float, ...] = (0.5, 1.0, 2.0), seeds: range = range(5)) -> None:
    """Each tuner on each grid at budgets in sweeps (the grid's full sweep's GPU-time): the median
    over seeds of the share of the safe optimum (log speedup over the safe optimum's) and the runs
    that left a size more than 1% slower."""
    from ncclrl.agents.baselines import Evaluator, make_tuner
    from ncclrl.agents.search import PolicyController, strategy_path
    from ncclrl.costmodel.jobcost import DEFAULT_JOB_COST

    strategy = PolicyController.load(strategy_path("shipped"))
    methods = ("default", "zero-shot", "random", "autoccl", "sweep", "sweep-race", "rank", "ncclrl", "jobs",
               "confirm")
    print("| problem | budget (sweeps) | " + " | ".join(methods) + " |")
    print("| --- | --- | " + " | ".join("---" for _ in methods) + " |")
    for name in PUBLIC_GRIDS:
        inst = public_gridded(name)
        sweep = inst.oracle.sweep_gpu_s(DEFAULT_JOB_COST, 5)
        for b in budgets:
            cells = []
            for m in methods:
                f, slow = [], 0
                for seed in seeds:
                    ev = Evaluator(inst.problem, inst.measure_for(seed), b * sweep, samples=5)
                    v = inst.oracle.score(make_tuner(m, strategy).tune(inst.problem, ev, seed))
                    f.append(np.log(v.speedup) / np.log(v.safe_optimum))
                    slow += v.slower > 0
                cells.append(f"{np.median(f):.2f}" + (f" ({slow} slower)" if slow else ""))
            print(f"| {name} | {b:g} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    import sys

    tuners() if "--tuners" in sys.argv else main()
