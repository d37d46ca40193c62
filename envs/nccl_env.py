"""The NCCL tuning environment."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from ncclrl.costmodel import nccl as N
from ncclrl.costmodel.errors import ConfigError
from ncclrl.costmodel.replica import default_decisions
from ncclrl.envs import spaces as S
from ncclrl.envs.sim import SimBackend


class NcclTuneEnv(gym.Env):
    """
    ## Description

    Choose how NCCL runs one collective call. Each episode is one decision context: a platform
    (backend), a collective (broadcast, reduce, allgather, reducescatter, allreduce) and a message
    size. The agent picks an algorithm, a protocol, a channel count and a chunk size; the backend
    times that configuration and NCCL's default for the same call.

    ## Action Space

    ``Discrete(N_ACTIONS)``: a flat index over (algorithm x protocol x channels x chunk factor),
    see :mod:`ncclrl.envs.spaces`. ``action_masks()`` marks what is valid for the current context (NCCL
    can run the algorithm/protocol there, the channel count fits the communicator, chunk factors
    only with Simple); invalid actions are never sampled by MaskablePPO and are rejected by
    :meth:`step` with a zero-reward, flagged step.

    ## Observation Space

    ``Box(0, 1, (OBS_DIM,), float32)``: the collective (one-hot), log2 of the size scaled to [0, 1]
    over 1 B .. 4 GiB, topology features (nodes, GPUs per node, ranks, GPU architecture, fabric,
    network, CPU vendor, bandwidths, NCCL's channel count), NCCL's default algorithm and protocol,
    and NCCL's own predicted cost table, normalized. Field names: ``ncclrl.envs.spaces.OBS_FIELDS``.

    ## Rewards

    ``log(t_default / t_chosen)``: 0 means as good as NCCL's default, positive is faster (+0.69 is
    2x faster), negative slower.

    ## Episode End

    After one step (``terminated=True``).

    ## Arguments

    * ``backends``: backends (or topology preset names, made into simulator backends) to draw
      platforms from;
    * ``collectives``: names to draw from (default: all five);
    * ``min_bytes``/``max_bytes``: size range, drawn log-uniformly as powers of two;
    * ``randomize``: probability that a new platform draw is randomized around the backend's
      preset rather than the preset itself (domain randomization; simulator backends only);
      ``randomize_scale`` shrinks the bounds; a draw lasts ``platform_episodes`` episodes of that
      backend (the simulator's times for every action are tabulated once per draw);
    * ``noise``: simulator backends time with noise (default) or return expected times;
    * ``samples``: measurements per configuration (the reward uses their median);
    * ``with_optimum``: also compute the exhaustive optimum (``info["regret"]``).

    ## Version History

    * v0: initial version.
    """

    metadata = {"render_modes": []}

    def __init__(self, backends: Sequence[SimBackend | str] = ("h200-1x4",), collectives: Sequence[str] | None = None,
                 min_bytes: int = 8, max_bytes: int = 1 << 30, randomize: float = 0.0, randomize_scale: float = 1.0,
                 noise: bool = True, samples: int = 1, with_optimum: bool = False,
                 platform_episodes: int = 32) -> None:
        super().__init__()
        if not backends:
            raise ConfigError("backends", "need at least one backend or topology preset")
        self.backends: list[SimBackend] = [SimBackend(b, noise=noise) if isinstance(b, str) else b for b in backends]
        names = collectives or N.COLLECTIVES
        self.collectives = [N.parse_name("collective", c, N.COLLECTIVES) for c in names]
        if min_bytes < 1 or max_bytes < min_bytes:
            raise ConfigError("min_bytes", f"need 1 <= min_bytes <= max_bytes, got {min_bytes}, {max_bytes}")
        if not 0.0 <= randomize <= 1.0:
            raise ConfigError("randomize", f"must be a probability in [0, 1], got {randomize}")
        if samples < 1:
            raise ConfigError("samples", f"must be >= 1, got {samples}")
        self.log2_lo = int(np.ceil(np.log2(min_bytes)))
        self.log2_hi = int(np.floor(np.log2(max_bytes)))
        self.randomize = randomize
        if platform_episodes < 1:
            raise ConfigError("platform_episodes", f"must be >= 1, got {platform_episodes}")
        self.platform_episodes = platform_episodes
        self._sizes = 1 << np.arange(self.log2_lo, self.log2_hi + 1, dtype=np.int64)
        self._obs_cache: dict[tuple[int, int], np.ndarray] = {}
        self._mask_cache: dict[tuple[int, int], np.ndarray] = {}
        self._default_cache: dict[tuple[int, int], np.ndarray] = {}
        self._table_cache: dict[tuple[int, int], tuple[np.ndarray, np.ndarray]] = {}
        self._platform_age = [platform_episodes] * len(self.backends)
        self.randomize_scale = randomize_scale
        self.samples = samples
        self.with_optimum = with_optimum
        self.action_space = spaces.Discrete(S.N_ACTIONS)
        self.observation_space = spaces.Box(0.0, 1.0, (S.OBS_DIM,), np.float32)
        self._ctx: tuple[int, int, int] | None = None
        self._mask = np.ones(S.N_ACTIONS, dtype=bool)
        self._obs = np.zeros(S.OBS_DIM, np.float32)

    # -- gymnasium API ----------------------------------------------------------------------
    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        if seed is not None:
            for i, b in enumerate(self.backends):
                if isinstance(b, SimBackend):
                    b.sim.rng = np.random.default_rng([seed, i])
                    b._base.rng = b.sim.rng
        options = options or {}
        bi = int(options.get("backend", self.np_random.integers(len(self.backends))))
        backend = self.backends[bi]
        if isinstance(backend, SimBackend):
            if self._platform_age[bi] >= self.platform_episodes:
                if self.randomize > 0 and self.np_random.random() < self.randomize:
                    backend.randomize(self.np_random, self.randomize_scale)
                else:
                    backend.reset_platform()
                self._platform_age[bi] = 0
                for key in [k for k in self._table_cache if k[0] == bi]:
                    del self._table_cache[key]
            self._platform_age[bi] += 1
        coll = int(options.get("collective", self.collectives[self.np_random.integers(len(self.collectives))]))
        if "nbytes" in options:
            nbytes = int(options["nbytes"])
            if nbytes < 1 or nbytes & (nbytes - 1):
                raise ConfigError("nbytes", f"contexts are powers of two, got {nbytes}")
        else:
            nbytes = int(self._sizes[self.np_random.integers(self._sizes.size)])
        self._ctx = (bi, coll, nbytes)
        topo = backend.topology
        self._mask = self._masks(bi, coll)
        self._obs = self._observation(bi, coll, nbytes)
        return self._obs.copy(), {"topology": topo.name, "collective": N.COLLECTIVES[coll], "nbytes": nbytes}

    # -- caches (the topology NCCL sees never changes for a backend; only simulator draws do) --
    def _masks(self, bi: int, coll: int) -> np.ndarray:
        key = (bi, coll)
        if key not in self._mask_cache:
            self._mask_cache[key] = S.action_mask(self.backends[bi].topology, coll)
        return self._mask_cache[key]

    def _observation(self, bi: int, coll: int, nbytes: int) -> np.ndarray:
        key = (bi, coll)
        if key not in self._obs_cache:
            self._obs_cache[key] = S.observations(self.backends[bi].topology, coll, self._sizes)
            d = default_decisions(self.backends[bi].topology, coll, self._sizes)
            self._default_cache[key] = np.array([S.encode(a, p, 0) for a, p in zip(d.algo, d.proto, strict=True)])
        i = int(np.log2(nbytes)) - self.log2_lo
        if 0 <= i < self._sizes.size:
            return self._obs_cache[key][i]
        return S.observations(self.backends[bi].topology, coll, np.array([nbytes]))[0]

    def _default_action(self, bi: int, coll: int, nbytes: int) -> int:
        i = int(np.log2(nbytes)) - self.log2_lo
        if (bi, coll) in self._default_cache and 0 <= i < self._sizes.size:
            return int(self._default_cache[(bi, coll)][i])
        d = default_decisions(self.backends[bi].topology, coll, [nbytes])
        return S.encode(int(d.algo[0]), int(d.proto[0]), 0)

    def _table(self, bi: int, coll: int) -> tuple[np.ndarray, np.ndarray]:
        """Expected time and latency part of every valid action at every size (current draw)."""
        key = (bi, coll)
        if key not in self._table_cache:
            sim = self.backends[bi].sim
            valid = np.flatnonzero(self._masks(bi, coll))
            cfg = S.configs_for(coll, self._sizes[:, None], valid[None, :])
            t, lat = sim.times_and_latency(cfg, validate=False)
            full_t = np.full((self._sizes.size, S.N_ACTIONS), np.inf)
            full_l = np.zeros((self._sizes.size, S.N_ACTIONS))
            full_t[:, valid] = t.reshape(self._sizes.size, valid.size)
            full_l[:, valid] = lat.reshape(self._sizes.size, valid.size)
            self._table_cache[key] = (full_t, full_l)
        return self._table_cache[key]

    def action_masks(self) -> np.ndarray:
        return self._mask.copy()

    def step(self, action):
        if self._ctx is None:
            raise RuntimeError("call reset() before step()")
        bi, coll, nbytes = self._ctx
        backend = self.backends[bi]
        a = int(action)
        info: dict[str, Any] = {"backend": backend.name, "topology": backend.topology.name,
                                "collective": N.COLLECTIVES[coll], "nbytes": nbytes}
        if not self._mask[a]:
            info["invalid_action"] = True
            return self._obs.copy(), 0.0, True, False, info
        da = self._default_action(bi, coll, nbytes)
        i = int(np.log2(nbytes)) - self.log2_lo
        tabulated = isinstance(backend, SimBackend) and 0 <= i < self._sizes.size
        if tabulated:
            table_t, table_l = self._table(bi, coll)
            exp = table_t[i, [da, a]]
            samples = backend.sim.add_noise(exp, table_l[i, [da, a]], self.samples) if backend.noise else exp[:, None]
            t = np.median(samples, axis=1)
        else:
            both = S.configs_for(coll, nbytes, np.array([da, a]))
            t = np.median(backend.time_configs(both, self.samples), axis=1)
            exp = backend.expected(both)
        reward = float(np.log(t[0] / t[1]))
        dd = S.decode(da)
        info.update(decision=S.decode(a).describe(), time_us=float(t[1]), default_time_us=float(t[0]),
                    default={"algo": N.ALGOS[dd.algo], "proto": N.PROTOS[dd.proto]}, invalid_action=False)
        if self.with_optimum and exp is not None:
            if tabulated:
                best = float(table_t[i].min())
            else:
                best = float(backend.expected(S.configs_for(coll, nbytes, np.flatnonzero(self._mask))).min())
            info["optimum_time_us"] = best
            info["regret"] = float(np.log(exp[1] / best))
            info["expected_speedup"] = float(exp[0] / exp[1])
        return self._obs.copy(), reward, True, False, info
