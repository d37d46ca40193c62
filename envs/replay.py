"""The replay backend: answers measurements from a recorded sweep in the store."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from ncclrl.costmodel import nccl as N
from ncclrl.costmodel.errors import ConfigError
from ncclrl.costmodel.noise import JobNoise, aa_noise, pooled_median
from ncclrl.costmodel.space import KNOB_FIELDS, Point, knob_grid
from ncclrl.costmodel.topology import Topology
from ncclrl.envs.backend import Backend
from ncclrl.envs.live import launch_of
from ncclrl.envs.store import job_ids, open_readonly


class ReplayWorkers(Backend):
    """Answers from a recorded sweep, one of two ways.

    With ``noise`` (``replay_noise=fresh``, what ``finetune`` and ``tune`` replay by default), every
    job is a fresh draw around the recorded truth: each point's pooled median over its recorded jobs
    (:func:`ncclrl.costmodel.noise.pooled_median`), one job shift for the job, a residual per point
    and ``samples`` samples (:meth:`JobNoise.draw_job`, from ``rng``), so a point measured again is
    an independent job, as on the machine. Without (``replay_noise=recorded``), a point gets its
    stored samples; measured again, the next recorded job of it (the sweep's, then its repeat's,
    then round again), so a point the sweep measured once answers every repeat with the same
    samples. A point the sweep did not measure is a failure, like a configuration NCCL could not
    run. ``seen`` counts the requests per point across the jobs of one run (share it between them)."""

    name = "replay"

    def __init__(self, frame, knobs: Point, seen: dict[tuple, int] | None = None, noise: JobNoise | None = None,
                 rng: np.random.Generator | None = None) -> None:
        super().__init__()
        self.knobs = knobs
        self.nccl_version = str(frame["nccl_version"].iloc[0]) if len(frame) else "?"
        self._by: dict[tuple, list[list[float]]] = {}
        for r in frame.itertuples(index=False):  # in the frame's order: a point's first job first
            self._by.setdefault((r.collective, int(r.nbytes), r.algo, r.proto, int(r.channels),
                                 *(int(getattr(r, f)) for f in KNOB_FIELDS)), []).append(list(r.samples_us))
        self._timing = str(frame["timing"].iloc[0]) if len(frame) else "eager"
        self.seen = {} if seen is None else seen
        self.noise = noise
        self.rng = rng if rng is not None else np.random.default_rng(0)

    def truth_us(self, key: tuple) -> float | None:
        """A point's expected time: the pooled median of its recorded jobs (None: not recorded)."""
        jobs = self._by.get(key)
        return pooled_median(jobs) if jobs else None

    def measure(self, points: list[Point], samples: int = 5) -> list[list[float] | None]:
        out: list[list[float] | None] = []
        self.failures = {}
        keys = [(p.collective, int(p.nbytes), p.algo, p.proto, int(p.channels), *map(int, p.knobs)) for p in points]
        for i, key in enumerate(keys):
            jobs = self._by.get(key)
            v = None
            if jobs:
                n = self.seen.get(key, 0)
                self.seen[key] = n + 1
                v = jobs[n % len(jobs)]
            else:
                self.failures[i] = "not in the replayed sweep"
            out.append(v)
        if self.noise is not None:
            have = [i for i, v in enumerate(out) if v is not None]
            if have:
                t = self.noise.draw_job([self.truth_us(keys[i]) for i in have], [points[i].nbytes for i in have],
                                        samples, self.rng)
                for j, i in enumerate(have):
                    out[i] = [float(x) for x in t[j]]
        self.last_modes = [self._timing] * len(points)
        return out

    def expected(self, points: list[Point], samples: int = 5) -> list[list[float] | None]:
        """What a fresh job would answer on average (each point's truth, ``samples`` times), drawing
        and counting nothing: what a replayed job will cost, before it runs."""
        out: list[list[float] | None] = []
        for p in points:
            t = self.truth_us((p.collective, int(p.nbytes), p.algo, p.proto, int(p.channels), *map(int, p.knobs)))
            out.append(None if t is None else [t] * samples)
        return out


def replay_job_noise(topo: Topology, launch: str) -> JobNoise:
    """The job noise a fresh replay of ``topo``'s recording draws: the fit for that host and launch
    (``conf/noise/job_noise.yaml``), else the pooled fit."""
    return JobNoise.load(f"{topo.name}/{launch}")


RECORDINGS = Path(__file__).with_name("recordings")


def shipped_recordings() -> list[str]:
    """The topologies whose recorded sweep ships with ncclrl (``envs/recordings``)."""
    return sorted(p.name.removesuffix(".sqlite.gz") for p in RECORDINGS.glob("*.sqlite.gz"))


_UNPACKED: dict[str, Path] = {}


def shipped_recording(topology: str) -> Path:
    """The store of the recorded sweep of ``topology`` that ships with ncclrl, unpacked once per
    process into a private temporary folder (removed at exit); a one-line error naming the ones that
    ship when there is none."""
    import atexit
    import gzip
    import shutil
    import tempfile

    src = RECORDINGS / f"{topology}.sqlite.gz"
    if not src.is_file():
        have = ", ".join(shipped_recordings()) or "none"
        raise ConfigError("replay_store", f"no recording of {topology} ships with ncclrl (it ships: {have}); name a "
                          "store of a recorded sweep (replay_store=PATH) or a grid (grid=FILE)")
    if topology not in _UNPACKED:
        folder = Path(tempfile.mkdtemp(prefix="ncclrl-recording-"))
        atexit.register(shutil.rmtree, folder, True)
        dst = folder / f"{topology}.sqlite"
        with gzip.open(src, "rb") as f, open(dst, "wb") as g:
            shutil.copyfileobj(f, g)
        _UNPACKED[topology] = dst
    return _UNPACKED[topology]


def recorded_sweep(path: str | Path, topo: Topology, launch: str, tags: tuple[str, ...] = ("sweep",),
                   **where: Any):
    """The rows of the exhaustive sweep of ``topo`` in the store at ``path`` (empty: the recording that
    ships with ncclrl, :func:`shipped_recording`) measured with ``launch`` (tags in ``tags``, in that
    order); a one-line error when there is none, naming the launches the store has."""
    import pandas as pd

    path = path or shipped_recording(topo.name)
    with open_readonly(path) as rs:  # read only: the recorded file never changes
        frames = [rs.frame(launch, topology=topo.name, tag=t, **where) for t in tags]
        if all(f.empty for f in frames):  # a store of re-recorded sweeps alone is a sweep too

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
    path = path or shipped_recording(topo.name)
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
