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


def replayed(store: str | Path, preset: str, launch: str, coll: str, noise: JobNoise | None = None) -> Instance:
    """A recorded sweep of ``preset`` in ``store`` as truth (see the module's docs).

    :param noise: the noise of every replayed job (default: the fit for ``preset`` and ``launch``,
        :meth:`JobNoise.load`, or the pooled one where there is none)
    """
    topo = load_topology(preset)
    c = N.COLLECTIVES.index(coll)
    frame = recorded_sweep(store, topo, launch, ("sweep", "sweep-repeat"), status="ok", collective=coll)
    knobs, recorded = recorded_points(frame, topo, [c])
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
                    lambda seed: replay_measure(recorded, np.random.default_rng([base, seed]), noise))


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


def gridded(grid: Grid, topo: Topology, family: str, name: str = "grid") -> Instance:
    """A measured grid (:func:`ncclrl.envs.grids.read_grid`) as a benchmark problem: truth is each
    point's pooled job medians, and every replayed job draws fresh noise around it (the fitted job
    noise of the topology, else the pooled fit: :class:`ncclrl.costmodel.noise.JobNoise`); the prior
    is the topology's uncalibrated simulator."""
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
    noise = JobNoise.load(f"{topo.name}/nccl")
    return Instance(problem, oracle, family,
                    lambda seed: replay_measure(recorded, np.random.default_rng([base, seed]), noise))


def public_gridded(name: str, root: str | Path | None = None) -> Instance:
    """The public grid ``name`` (:data:`ncclrl.envs.grids.PUBLIC_GRIDS`) as a benchmark problem."""
    g = PUBLIC_GRIDS.get(name)
    topo = load_topology(g.topology if g else name)
    return gridded(read_public_grid(name, topo, root), topo, g.family, name)
