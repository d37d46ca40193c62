"""The benchmark's problem sets, each with the truth a tuner is judged on.

- ``lofo``: platforms drawn around the presets of one family (:data:`ncclrl.costmodel.platforms.FAMILIES`),
  tuned with the strategy trained with that whole family left out;
- ``misspecified``: the same draws with :class:`ncclrl.costmodel.platforms.Quirks` (effects the
  simulator lacks), same strategies;
- ``replay``: recorded exhaustive sweeps of real machines as truth (each point's pooled job
  medians), measured in fresh jobs drawn around it with the noise fitted on the recorded repeated
  jobs (:class:`ncclrl.costmodel.noise.JobNoise`: a shift per job, a residual per point, the
  samples; a new draw per seed and per job); the prior is
  the topology's uncalibrated simulator (what a new user starts from), and the strategy is the
  one trained without the family of the recorded machine;
- ``grids``: measured grids given as files (:mod:`ncclrl.envs.grids`: public nccl-tests grids, NVIDIA's
  example-plugin CSV, a training-step proxy) as truth, each point's pooled job medians, replayed
  the same way; NCCL's default is measured where the grid has it, else logged or the replica's
  prediction (each problem says which); the prior is the topology's uncalibrated simulator.

Every problem's prior is a simulator a user could have before measuring: the preset's nominal
parameters (simulated sets) or the topology's defaults (replays); the truth is never the prior.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ncclrl.agents.problem import Measure, Oracle, Problem, platform_measure, replay_measure
from ncclrl.costmodel import nccl as N
from ncclrl.costmodel.errors import ConfigError
from ncclrl.costmodel.noise import JobNoise, pooled_median
from ncclrl.costmodel.platforms import draw_platform, family_of
from ncclrl.costmodel.simulator import SimParams, Simulator
from ncclrl.costmodel.space import DEFAULT, Key, Point
from ncclrl.costmodel.topology import Topology, load_topology
from ncclrl.envs.grids import PUBLIC_GRIDS, Grid, read_public_grid
from ncclrl.envs.replay import recorded_sweep, replay_knobs

SETS = ("lofo", "misspecified", "replay", "grids")


def stable(*parts: Any) -> int:
    return zlib.crc32("/".join(map(str, parts)).encode())


@dataclass
class Instance:
    """A problem with its truth and a way to measure it afresh for each run."""

    problem: Problem
    oracle: Oracle
    family: str
    measure: Any  # (seed) -> Measure
    noise: str = ""  # where the noise of its replayed jobs comes from

    def measure_for(self, seed: int) -> Measure:
        return self.measure(seed)


def simulated(preset: str, draw: int, coll: str, platform_seed: int, misspecified: bool, min_bytes: int,
              max_bytes: int, calls: dict[int, float] | None = None) -> Instance:
    """A platform drawn around ``preset`` (its seed stream is ``platform_seed``, never a training
    one); ``calls`` (a job's calls per step per size): the problem has those sizes only, and its
    objective is the job's communication time per step."""
    rng = np.random.default_rng([platform_seed, stable(preset), draw, int(misspecified)])
    plat = draw_platform(preset, rng, misspecified)
    c = N.COLLECTIVES.index(coll)
    if calls:
        problem = Problem(plat.topo, [c], {c: sorted(calls)}, weights={(c, s): float(n) for s, n in calls.items()})
    else:
        problem = Problem.make(plat.topo, [c], min_bytes, max_bytes)
    oracle = Oracle(problem, plat)
    base = stable(preset, draw, coll, int(misspecified))
    return Instance(problem, oracle, family_of(preset),
                    lambda seed: platform_measure(plat, np.random.default_rng([base, seed])))


def recorded_points(frame: Any, topo: Topology, colls: list[int]) -> tuple[list[Point], dict[
        tuple[tuple[int, ...], int, int, Key], list[list[float]]]]:
    """A recorded sweep's knob settings (NCCL's defaults first) and, per point of ``colls``, the
    samples of each job that measured it."""
    knobs = replay_knobs(frame, topo)
    by_knobs = {k.knobs for k in knobs}
    names = {N.COLLECTIVES[c]: c for c in colls}
    recorded: dict[tuple[tuple[int, ...], int, int, Key], list[list[float]]] = {}
    for r in frame.itertuples(index=False):
        kn = (int(r.comm_channels), int(r.buffsize_bytes), int(r.socket_nthreads), int(r.nsocks_perthread),
              int(r.socket_inline_bytes))
        if kn in by_knobs and r.collective in names:
            recorded.setdefault((kn, names[r.collective], int(r.nbytes), (r.algo, r.proto, int(r.channels))),
                                []).append(list(r.samples_us))
    return knobs, recorded


def replayed(store: str | Path | list, preset: str, launch: str, coll: str, noise: JobNoise | None = None,
             min_jobs: int = 1) -> Instance:
    """A recorded sweep of ``preset`` in ``store`` (or several stores of the same host, pooled) as
    truth (see the module's docs).

    :param noise: the noise of every replayed job (default: the fit for ``preset`` and ``launch``,
        :meth:`JobNoise.load`, or the pooled one where there is none)
    :param min_jobs: only the knob settings whose points were recorded in at least this many jobs
        (the median over their points): a truth of one recorded job per point is one draw of it
    """
    import pandas as pd

    topo = load_topology(preset)
    c = N.COLLECTIVES.index(coll)
    stores = store if isinstance(store, list | tuple) else [store]
    # the first store holds the sweep; the others may hold only its repeats
    frame = pd.concat([recorded_sweep(x, topo, launch, ("sweep", "sweep-repeat") if not i else ("sweep-repeat",),
                                      status="ok", collective=coll) for i, x in enumerate(stores)])
    knobs, recorded = recorded_points(frame, topo, [c])
    if min_jobs > 1:
        depth = {k.knobs: float(np.median([len(v) for x, v in recorded.items() if x[0] == k.knobs])) for k in knobs}
        knobs = [k for k in knobs if depth[k.knobs] >= min_jobs]
        if not knobs or any(knobs[0].knobs):
            raise ConfigError("replay_store", f"NCCL's defaults were not recorded in {min_jobs} jobs per point")
        keep = {k.knobs for k in knobs}
        recorded = {x: v for x, v in recorded.items() if x[0] in keep}
    sizes = sorted({x[2] for x in recorded})
    prior = Simulator(topo, SimParams.defaults(topo), seed=0)
    # every replayed job is a fresh draw: a point can be measured in any number of independent jobs
    problem = Problem(topo, [c], {c: sizes}, knobs, prior=prior, available=set(recorded))
    times = {}
    for k in knobs:
        keys = problem.space(c, k)
        t = np.full((len(keys), len(sizes)), np.inf)
        for j, key in enumerate(keys):
            for i, s in enumerate(sizes):
                jobs = recorded.get((k.knobs, c, s, key))
                if jobs:
                    t[j, i] = pooled_median(jobs)
        times[(k.knobs, c)] = t
    oracle = Oracle(problem, times=times)  # the expected truth, never one draw of it
    base = stable(preset, coll, "replay")
    noise = JobNoise.load(f"{preset}/{launch}") if noise is None else noise
    return Instance(problem, oracle, family_of(preset),
                    lambda seed: replay_measure(recorded, np.random.default_rng([base, seed]), noise),
                    f"the host's fit ({noise.source})")


@dataclass
class GridProblem(Problem):
    """A problem over a measured grid: per knob setting and collective, its space is NCCL's own
    choice and the configurations the grid measured (channel counts included), nothing else.

    :param grid_keys: per (knob setting, collective), the grid's configurations, NCCL's default first
    :param grid: the grid itself (its recorded jobs, as :class:`ncclrl.envs.grids.GridWorkers` answers them)
    """

    grid_keys: dict[tuple[tuple[int, ...], int], list[Key]] = field(default_factory=dict)
    grid: Grid | None = None

    @property
    def default_source(self) -> str:
        """How NCCL's default was obtained (:attr:`ncclrl.envs.grids.Grid.default_source`)."""
        return self.grid.default_source if self.grid is not None else ""

    def space(self, coll: int, k: Point) -> list[Key]:
        return self.grid_keys.get((k.knobs, coll), [DEFAULT])


def grid_noise(grid: Grid, source: str = "") -> JobNoise | None:
    """The grid's own run-to-run noise (:func:`ncclrl.costmodel.noise.fit`): each configuration
    measured over the same sizes in several jobs (the i-th recorded job of every size of a
    configuration is one job: the files list a job's sizes together); ``None`` where no
    configuration was measured in 2 or more jobs over 5 or more sizes."""
    import pandas as pd

    from ncclrl.costmodel.noise import fit

    rows = [{"group": (x[0], x[1], x[3]), "job": j, "point": x[3], "nbytes": x[2], "samples_us": s}
            for x, jobs in grid.recorded.items() if len(jobs) > 1 for j, s in enumerate(jobs)]
    if not rows:
        return None
    try:
        return fit(pd.DataFrame(rows), min_points=3, source=source).noise
    except ConfigError:
        return None


def gridded(grid: Grid, topo: Topology, family: str, name: str = "grid", noise: JobNoise | None = None,
            noise_source: str = "") -> Instance:
    """A measured grid (:func:`ncclrl.envs.grids.read_grid`) as a benchmark problem: truth is each
    point's pooled job medians, and every replayed job draws fresh noise around it: ``noise``, else
    the grid's own (:func:`grid_noise`), else the fitted job noise of the topology's H200 host
    (:class:`ncclrl.costmodel.noise.JobNoise`; ``Instance.noise`` says which); the prior is the
    topology's uncalibrated simulator."""
    prior = Simulator(topo, SimParams.defaults(topo), seed=0)
    keys = {(k.knobs, c): grid.keys(k.knobs, c) for k in grid.knobs for c in grid.colls}
    problem = GridProblem(topo, list(grid.colls), {c: list(grid.sizes[c]) for c in grid.colls}, list(grid.knobs),
                          prior=prior, available=set(grid.recorded), grid_keys=keys, grid=grid)
    times = {}
    for k in grid.knobs:
        for c in grid.colls:
            ks, sizes = problem.space(c, k), grid.sizes[c]
            t = np.full((len(ks), len(sizes)), np.inf)
            for j, key in enumerate(ks):
                for i, s in enumerate(sizes):
                    jobs = grid.recorded.get((k.knobs, c, s, key))
                    if jobs:
                        t[j, i] = pooled_median(jobs)
            times[(k.knobs, c)] = t
    oracle = Oracle(problem, times=times)
    base = stable(name, "grid")
    recorded = grid.recorded
    if noise is None:
        noise = grid_noise(grid, f"{name}: its own repeated runs")
        noise_source = f"{name}'s own repeated runs" if noise is not None else ""
    if noise is None:
        noise = JobNoise.load(f"{topo.name}/nccl")
        noise_source = f"no repeats in {name}: the H200 hosts' fit ({noise.source})"
    return Instance(problem, oracle, family,
                    lambda seed: replay_measure(recorded, np.random.default_rng([base, seed]), noise), noise_source)


def public_gridded(name: str, root: str | Path | None = None) -> Instance:
    """The public grid ``name`` (:data:`ncclrl.envs.grids.PUBLIC_GRIDS`) as a benchmark problem."""
    g = PUBLIC_GRIDS.get(name)
    topo = load_topology(g.topology if g else name)
    grid = read_public_grid(name, topo, root)
    noise, source = grid_noise(grid), f"{name}'s own repeated runs"
    if noise is None and g is not None:  # a grid with no repeats of its own: a sibling's of the same machines
        for other, h in PUBLIC_GRIDS.items():
            if other != name and h.folder == g.folder and h.platform == g.platform and h.files == g.files:
                noise = grid_noise(read_public_grid(other, load_topology(h.topology), root))
                if noise is not None:
                    source = f"no repeats in {name}: {other}'s repeated runs (the same machines and files)"
                    break
    return gridded(grid, topo, g.family if g else "", name, noise, source if noise is not None else "")
