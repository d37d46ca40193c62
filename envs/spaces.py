"""Action and observation layouts shared by the environment, the agent and the exporter.

Action: one flat ``Discrete`` index over (algorithm, protocol, channels, chunk), so that masks
are exact (sb3-contrib masks each dimension of a MultiDiscrete independently, which cannot say
"PAT only with Simple"). Observation: a bounded, normalized context vector that describes the
collective, the size and the platform, so one policy can serve many platforms.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ncclrl.costmodel import nccl as N
from ncclrl.costmodel.errors import ConfigError
from ncclrl.costmodel.replica import build_model, cost_table, default_decisions, eligible_mask
from ncclrl.costmodel.simulator import Configs
from ncclrl.costmodel.topology import CPU_VENDORS, FABRICS, GPU_ARCHS, NETWORKS, Topology

# channels: 0 = keep NCCL's own per-call choice
CHANNEL_CHOICES = np.array([0, 1, 2, 4, 8, 12, 16, 24, 32, 48, 64])
# chunk: a factor on NCCL's Simple chunk (0 = NCCL's); LL/LL128 chunks are fixed by the protocol
CHUNK_FACTORS = np.array([0.0, 0.25, 0.5, 2.0])
N_ACTIONS = N.NUM_ALGOS * N.NUM_PROTOS * CHANNEL_CHOICES.size * CHUNK_FACTORS.size

LOG2_MIN_BYTES, LOG2_MAX_BYTES = 0, 32  # sizes 1 B .. 4 GiB map to [0, 1]
OBS_VERSION = 1


@dataclass(frozen=True)
class Action:
    algo: int
    proto: int
    channels: int
    chunk_factor: float

    def describe(self) -> dict:
        return {"algo": N.ALGOS[self.algo], "proto": N.PROTOS[self.proto], "channels": int(self.channels),
                "chunk_factor": float(self.chunk_factor)}


def decode(index: int | np.ndarray) -> Action:
    i = int(index)
    chunk = i % CHUNK_FACTORS.size
    i //= CHUNK_FACTORS.size
    ch = i % CHANNEL_CHOICES.size
    i //= CHANNEL_CHOICES.size
    proto = i % N.NUM_PROTOS
    algo = i // N.NUM_PROTOS
    return Action(algo, proto, int(CHANNEL_CHOICES[ch]), float(CHUNK_FACTORS[chunk]))


def decode_all() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(algo, proto, channels, chunk_factor) arrays for every action index."""
    idx = np.arange(N_ACTIONS)
    chunk = idx % CHUNK_FACTORS.size
    rest = idx // CHUNK_FACTORS.size
    ch = rest % CHANNEL_CHOICES.size
    rest //= CHANNEL_CHOICES.size
    return rest // N.NUM_PROTOS, rest % N.NUM_PROTOS, CHANNEL_CHOICES[ch], CHUNK_FACTORS[chunk]


def encode(algo: int, proto: int, channels: int, chunk_factor: float = 0.0) -> int:
    ch = int(np.flatnonzero(channels == CHANNEL_CHOICES)[0])
    ck = int(np.flatnonzero(np.isclose(CHUNK_FACTORS, chunk_factor))[0])
    return ((algo * N.NUM_PROTOS + proto) * CHANNEL_CHOICES.size + ch) * CHUNK_FACTORS.size + ck


_ALGO, _PROTO, _CH, _CHUNK = decode_all()


def action_mask(topo: Topology, coll: int) -> np.ndarray:
    """Valid actions for a collective on a topology: NCCL can run the (algorithm, protocol), the
    channel count fits the communicator, chunk factors only for Simple."""
    ok = eligible_mask(topo)[coll, _ALGO, _PROTO]
    ok &= topo.nccl.channels >= _CH
    ok &= (_CHUNK == 0) | (_PROTO == N.SIMPLE)
    return ok


def buffsize_for(chunk_factor: np.ndarray) -> np.ndarray:
    """The ``NCCL_BUFFSIZE`` that gives Simple that chunk factor (0 = NCCL's default)."""
    return np.where(chunk_factor > 0, (N.DEFAULT_BUFFSIZE_BYTES[N.SIMPLE] * chunk_factor).astype(np.int64), 0)


def configs_for(coll: int, nbytes: np.ndarray | int, actions: np.ndarray) -> Configs:
    a = np.asarray(actions, dtype=np.int64)
    return Configs.make(coll, nbytes, _ALGO[a], _PROTO[a], _CH[a], 0, buffsize_for(_CHUNK[a]))


# -- observations --------------------------------------------------------------------------------

OBS_FIELDS = (
    [f"coll_{c}" for c in N.COLLECTIVES]
    + ["log2_nbytes"]
    + ["log2_nodes", "log2_gpus_per_node", "log2_nranks"]
    + [f"arch_{a}" for a in GPU_ARCHS]
    + [f"fabric_{f}" for f in FABRICS]
    + [f"net_{n}" for n in NETWORKS]
    + [f"cpu_{v}" for v in CPU_VENDORS]
    + ["intra_bus_gbps", "intra_channel_gbps", "net_node_gbps", "net_channel_gbps", "net_latency_us",
       "nccl_channels", "socket_flows"]
    + [f"nccl_default_{a}" for a in N.ALGOS] + [f"nccl_default_{p}" for p in N.PROTOS]
    + [f"nccl_cost_{a}_{p}" for a in N.ALGOS for p in N.PROTOS]
)
OBS_DIM = len(OBS_FIELDS)


def _log_scale(x: float, lo: float, hi: float) -> float:
    return float(np.clip((np.log2(max(x, 1e-9)) - lo) / (hi - lo), 0.0, 1.0))


# What the observation can encode; a platform beyond it is refused, not silently clipped.
LIMITS = {"nodes": 4096, "gpus_per_node": 64, "nranks": 65536}


def check_representable(topo: Topology) -> None:
    for key, hi in LIMITS.items():
        v = getattr(topo, key)
        if v > hi:
            raise ConfigError("topology", f"{topo.name} has {v} {key}; the policy's observation encodes at most {hi} "
                              f"(nodes <= {LIMITS['nodes']}, GPUs per node <= {LIMITS['gpus_per_node']})")


def topology_features(topo: Topology) -> np.ndarray:
    check_representable(topo)
    f = [_log_scale(topo.nodes, 0, 12), _log_scale(topo.gpus_per_node, 0, 6), _log_scale(topo.nranks, 0, 16)]
    f += [float(topo.gpu_arch == a) for a in GPU_ARCHS]
    f += [float(topo.intra.fabric == x) for x in FABRICS]
    f += [float(topo.net.kind == x) for x in NETWORKS]
    f += [float(topo.cpu_vendor == v) for v in CPU_VENDORS]
    f += [_log_scale(topo.intra.ceiling_gbps, 0, 12), _log_scale(topo.intra.channel_bw_gbps, -2, 8),
          _log_scale(topo.net.nics_per_node * topo.net.nic_bw_gbps + 1e-3, -2, 12),
          _log_scale(topo.net.channel_bw_gbps + 1e-3, -2, 8), _log_scale(topo.net.nic_latency_us + 1e-3, -2, 8),
          _log_scale(topo.nccl.channels, 0, 6),
          _log_scale(topo.nccl.socket_nthreads * topo.nccl.nsocks_perthread if topo.net.kind == "socket" else 1,
                     0, 6)]
    return np.array(f, dtype=np.float32)


def observations(topo: Topology, coll: int, nbytes: np.ndarray) -> np.ndarray:
    """Observation rows for sizes of one collective on one topology, shape ``(n, OBS_DIM)``."""
    nbytes = np.atleast_1d(np.asarray(nbytes, dtype=np.int64))
    n = nbytes.size
    onehot = np.zeros((n, len(N.COLLECTIVES)), np.float32)
    onehot[:, coll] = 1.0
    size = np.clip((np.log2(nbytes) - LOG2_MIN_BYTES) / (LOG2_MAX_BYTES - LOG2_MIN_BYTES), 0, 1)[:, None]
    topo_f = np.broadcast_to(topology_features(topo), (n, len(topology_features(topo))))
    d = default_decisions(topo, coll, nbytes)
    dalgo = np.zeros((n, N.NUM_ALGOS), np.float32)
    dalgo[np.arange(n), d.algo] = 1
    dproto = np.zeros((n, N.NUM_PROTOS), np.float32)
    dproto[np.arange(n), d.proto] = 1
    table = cost_table(build_model(topo), coll, nbytes)
    best = np.where(table >= 0, table, np.inf).reshape(n, -1).min(axis=1)
    rel = np.where(table >= 0, np.log2(np.maximum(table, 1e-9) / best[:, None, None]), 8.0)
    cost = 1.0 - np.clip(rel / 8.0, 0, 1)  # 1 = NCCL's best guess, 0 = >= 256x slower or disabled
    obs = np.concatenate([onehot, size, topo_f, dalgo, dproto, cost.reshape(n, -1)], axis=1)
    return obs.astype(np.float32)
