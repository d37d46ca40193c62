"""The replay backend: answers measurements from a recorded sweep in the store."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ncclrl.costmodel import nccl as N
from ncclrl.costmodel.errors import ConfigError
from ncclrl.costmodel.noise import aa_noise
from ncclrl.costmodel.space import KNOB_FIELDS, Point, knob_grid
from ncclrl.costmodel.topology import Topology
from ncclrl.envs.backend import Backend
from ncclrl.envs.live import launch_of
from ncclrl.envs.store import job_ids, open_readonly


class ReplayWorkers(Backend):
    """Answers from a recorded sweep: each point's stored samples (the sweep's sample count); a
    point measured again gets the next recorded job of it (the sweep's, then its repeat's, then
    round again), so repeated jobs differ as they did on the machine; a point the sweep did not
    measure is a failure, like a configuration NCCL could not run. ``seen`` counts the requests
    per point across the jobs of one run (share it between them)."""

    name = "replay"

    def __init__(self, frame, knobs: Point, seen: dict[tuple, int] | None = None) -> None:
        super().__init__()
        self.knobs = knobs
        self.nccl_version = str(frame["nccl_version"].iloc[0]) if len(frame) else "?"
        self._by: dict[tuple, list[list[float]]] = {}
        for r in frame.itertuples(index=False):  # in the frame's order: a point's first job first
            self._by.setdefault((r.collective, int(r.nbytes), r.algo, r.proto, int(r.channels),
                                 *(int(getattr(r, f)) for f in KNOB_FIELDS)), []).append(list(r.samples_us))
        self._timing = str(frame["timing"].iloc[0]) if len(frame) else "eager"
        self.seen = {} if seen is None else seen

    def measure(self, points: list[Point], samples: int = 5) -> list[list[float] | None]:
        out = []
        self.failures = {}
        for i, p in enumerate(points):
            key = (p.collective, int(p.nbytes), p.algo, p.proto, int(p.channels), *map(int, p.knobs))
            jobs = self._by.get(key)
            v = None
            if jobs:
                n = self.seen.get(key, 0)
                self.seen[key] = n + 1
                v = jobs[n % len(jobs)]
            else:
                self.failures[i] = "not in the replayed sweep"
            out.append(v)
        self.last_modes = [self._timing] * len(points)
        return out



def recorded_sweep(path: str | Path, topo: Topology, launch: str, tags: tuple[str, ...] = ("sweep",),
                   **where: Any):
    """The rows of the exhaustive sweep of ``topo`` in the store at ``path`` measured with ``launch``
    (tags in ``tags``, in that order); a one-line error when there is none, naming the launches
    the store has."""
    import pandas as pd

    with open_readonly(path) as rs:  # read only: the recorded file never changes
        frames = [rs.frame(launch, topology=topo.name, tag=t, **where) for t in tags]
        if frames[0].empty:

            have = sorted({launch_of(t) for t in rs.frame(topology=topo.name, tag=tags[0]).timing})
            hint = f"; it has launch={' and launch='.join(have)}" if have else ""
            raise ConfigError("replay_store", f"no sweep of {topo.name} measured with launch={launch} in {path}{hint}")
    return pd.concat(frames)


def replay_noise(path: str | Path, topo: Topology, launch: str, colls: list[int],
                 sizes: dict[int, list[int]]) -> dict[str, dict[int, tuple[float, int]]] | None:
    """The between-job spread a replay judges with: from the store's recorded validations (NCCL's
    plain defaults in many jobs, :func:`ncclrl.costmodel.noise.aa_noise`), per collective; ``None`` when the
    store has no repeated job of them. A replayed run's own repeats are not independent jobs: a
    point the sweep measured once answers every repeat with the same samples."""

    out = {}
    with open_readonly(path) as rs:  # read only: the recorded file never changes
        for c in colls:
            f = rs.frame(launch, topology=topo.name, tag="validate-base", status="ok", collective=N.COLLECTIVES[c])
            if f.empty:
                continue
            f["job"] = job_ids(f)
            n = aa_noise(f, sizes[c])
            if any(df for _s, df in n.values()):
                out[N.COLLECTIVES[c]] = n
    return out or None


def replay_knobs(frame, topo: Topology) -> list[Point]:
    """The knob settings of the full grid that a recorded sweep measured (NCCL's defaults first):
    replaying fine-tunes over the space the sweep covered."""
    have = {tuple(int(v) for v in row) for row in frame[list(KNOB_FIELDS)].drop_duplicates().itertuples(index=False)}
    knobs = [k for k in knob_grid(topo, "full") if k.knobs in have]
    if not knobs or any(knobs[0].knobs):
        raise ConfigError("replay_store", f"the sweep of {topo.name} has no run under NCCL's defaults")
    return knobs
