"""The simulator as a backend: noisy samples of any configuration from a seeded generator,
optionally on a platform re-drawn around its preset (domain randomization)."""

from __future__ import annotations

import numpy as np

from ncclrl.costmodel import nccl as N
from ncclrl.costmodel.simulator import Configs, Simulator
from ncclrl.costmodel.space import Point, point_configs
from ncclrl.costmodel.topology import Topology, load_topology
from ncclrl.envs.backend import Backend


class SimBackend(Backend):
    """The simulator behind the :class:`Backend` interface, and behind the Gymnasium environment
    (which times whole arrays of configurations at once: :meth:`time_configs`, :meth:`expected`).

    :param topology: preset name, YAML path or :class:`Topology`
    :param noise: measure with the simulator's noise (``True``) or return expected times
    :param seed: seed of the noise
    :param simulator: a simulator to use instead of one built from ``topology``
    """

    name = "sim"

    def __init__(self, topology: Topology | str, noise: bool = True, seed: int | None = 0,
                 simulator: Simulator | None = None) -> None:
        super().__init__()
        self.sim = simulator if simulator is not None else Simulator(load_topology(topology), seed=seed)
        self.noise = noise
        self._base = self.sim
        self.nccl_version = self.sim.topo.nccl.version

    @property
    def topology(self) -> Topology:
        return self.sim.topo

    def measure(self, points: list[Point], samples: int = 5) -> list[list[float] | None]:
        out: list[list[float] | None] = [None] * len(points)
        groups: dict[tuple, list[int]] = {}
        for i, p in enumerate(points):
            groups.setdefault((p.knobs, p.collective), []).append(i)
        for (_knobs, coll), idx in groups.items():
            k = points[idx[0]]
            cfg = point_configs(self.topology, k, N.COLLECTIVES.index(coll), np.array([points[i].nbytes for i in idx]),
                                [(points[i].algo, points[i].proto, points[i].channels) for i in idx])
            t = self.time_configs(cfg, samples)
            for j, i in enumerate(idx):
                out[i] = [float(x) for x in t[j]]
        self.failures, self.last_modes = {}, ["sim"] * len(points)
        return out

    def time_configs(self, configs: Configs, n_samples: int = 1) -> np.ndarray:
        """Times (us) of an array of configurations, shape ``(len(configs), n_samples)``."""
        if self.noise:
            return self.sim.sample(configs, n_samples)
        return np.repeat(self.sim.time_us(configs)[:, None], n_samples, axis=1)

    def expected(self, configs: Configs) -> np.ndarray:
        """Noise-free times (us) of an array of configurations."""
        return self.sim.time_us(configs)

    def randomize(self, rng: np.random.Generator, scale: float = 1.0) -> None:
        """Draw a new platform around the preset (keeps the noise generator)."""
        self.sim = self._base.randomized(rng, scale)
        self.sim.rng = self._base.rng

    def reset_platform(self) -> None:
        self.sim = self._base
