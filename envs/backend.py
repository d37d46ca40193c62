"""The one interface every backend implements: the simulator now, live NCCL later.

A backend times batches of configurations on one platform. The environment only talks to this
interface, so the same environment and agent run on the simulator or on real GPUs.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import numpy as np

from ncclrl.costmodel.simulator import Configs, Simulator
from ncclrl.costmodel.topology import Topology, load_topology


@runtime_checkable
class Backend(Protocol):
    """Times NCCL configurations on one platform."""

    name: str

    @property
    def topology(self) -> Topology: ...

    def measure(self, configs: Configs, n_samples: int = 1) -> np.ndarray:
        """Measured times (us), shape ``(len(configs), n_samples)``."""
        ...

    def expected(self, configs: Configs) -> np.ndarray | None:
        """Noise-free times if the backend knows them (a simulator does), else ``None``."""
        ...


class SimBackend:
    """The simulator as a backend, optionally re-drawn around its preset (domain randomization).

    :param topology: preset name, YAML path or :class:`Topology`
    :param noise: measure with the simulator's noise (``True``) or return expected times
    :param seed: seed of the noise
    """

    name = "sim"

    def __init__(self, topology: Topology | str, noise: bool = True, seed: int | None = 0,
                 simulator: Simulator | None = None) -> None:
        self.sim = simulator if simulator is not None else Simulator(load_topology(topology), seed=seed)
        self.noise = noise
        self._base = self.sim

    @property
    def topology(self) -> Topology:
        return self.sim.topo

    def measure(self, configs: Configs, n_samples: int = 1) -> np.ndarray:
        if self.noise:
            return self.sim.sample(configs, n_samples)
        return np.repeat(self.sim.time_us(configs)[:, None], n_samples, axis=1)

    def expected(self, configs: Configs) -> np.ndarray:
        return self.sim.time_us(configs)

    def randomize(self, rng: np.random.Generator, scale: float = 1.0) -> None:
        """Draw a new platform around the preset (keeps the noise generator)."""
        self.sim = self._base.randomized(rng, scale)
        self.sim.rng = self._base.rng

    def reset_platform(self) -> None:
        self.sim = self._base
