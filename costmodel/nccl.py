"""NCCL's enumerations, names and model constants (NCCL 2.28).

The values below are facts read from NCCL's public sources (``src/graph/tuning.cc``,
``src/enqueue.cc``, ``src/include/device.h``) and the tuner ABI. The indices are the ones the
tuner plugin sees, so ``ALGOS[i]`` is algorithm ``i`` of NCCL's cost table.
"""

from __future__ import annotations

import numpy as np

from ncclrl.costmodel.errors import ConfigError

# Collectives, in the order of NCCL's ``ncclFunc_t`` (what the tuner's ``collType`` carries).
COLLECTIVES: tuple[str, ...] = ("broadcast", "reduce", "allgather", "reducescatter", "allreduce")
COLL_INDEX = {name: i for i, name in enumerate(COLLECTIVES)}
BROADCAST, REDUCE, ALLGATHER, REDUCESCATTER, ALLREDUCE = range(5)
# NCCL's own spelling, as in its logs ("AllReduce: 1024 Bytes -> ...").
COLL_LOG_NAMES = {"Broadcast": BROADCAST, "Reduce": REDUCE, "AllGather": ALLGATHER,
                  "ReduceScatter": REDUCESCATTER, "AllReduce": ALLREDUCE}

# Algorithms (NCCL_ALGO_*), 7 since NCCL 2.23.
ALGOS: tuple[str, ...] = ("tree", "ring", "collnet_direct", "collnet_chain", "nvls", "nvls_tree", "pat")
ALGO_INDEX = {name: i for i, name in enumerate(ALGOS)}
TREE, RING, COLLNET_DIRECT, COLLNET_CHAIN, NVLS, NVLS_TREE, PAT = range(7)
NUM_ALGOS = len(ALGOS)

# Protocols (NCCL_PROTO_*).
PROTOS: tuple[str, ...] = ("ll", "ll128", "simple")
PROTO_INDEX = {name: i for i, name in enumerate(PROTOS)}
LL, LL128, SIMPLE = range(3)
NUM_PROTOS = len(PROTOS)

# Hardware classes of NCCL's latency table.
HW_NVLINK, HW_PCI, HW_NET = range(3)

# Compute-capability rows of the constant tables.
COMPCAP_ROWS = {"volta": 0, "ampere": 1, "hopper": 2, "blackwell": 3}

# --- ncclTunerConstants defaults (tuning.cc) -------------------------------------------------
BASE_LAT_US = np.array([
    [6.8, 14.0, 8.4],   # tree
    [6.6, 14.0, 8.4],   # ring
    [0.0, 0.0, 0.0],    # collnet_direct
    [0.0, 0.0, 0.0],    # collnet_chain
    [0.0, 0.0, 0.0],    # nvls
    [0.0, 0.0, 0.0],    # nvls_tree
    [8.0, 8.0, 8.0],    # pat
])
HW_LAT_US = np.array([
    [[0.6, 1.25, 4.0], [0.6, 1.9, 3.4], [0, 0, 3.7], [0, 0, 2.8], [0, 0, 25], [0, 0, 25], [0, 0, 4.0]],
    [[1.0, 1.9, 4.0], [1.0, 2.5, 5.7], [0, 0, 3.7], [0, 0, 2.8], [0, 0, 0], [0, 0, 0], [0, 0, 4.0]],
    [[5.0, 8.5, 14], [2.7, 4.0, 14.0], [0, 0, 31], [0, 0, 30], [0, 0, 18], [0, 0, 20.9], [0, 0, 14]],
])
# [compcap row][nodes index: 1 node, 2 nodes, >2 nodes]
LL_MAX_BW = np.array([[39.0, 39.0, 20.4], [87.7, 22.5, 19.0], [141.0, 45.0, 35.0], [282.0, 90.0, 70.0]])
PER_CH_MAX_RING_LL128_BW = np.array([[20.0] * 3, [20.0] * 3, [36.7] * 3, [73.4, 34.6, 73.4]])
PER_CH_MAX_TREE_LL128_BW = np.array([[20.0] * 3, [20.0] * 3, [36.7, 36.7, 29.0], [55.6, 31.67, 20.0]])
PER_CH_MAX_TREE_BW = np.array([[26.5, 18.5, 10.0], [24.0, 23.6, 17.8], [38.7, 41.4, 36.0], [70.0, 42.8, 24.0]])
PER_CH_MAX_NVLS_TREE_BW = np.array([[26.5, 18.5, 10.0], [24.0, 23.6, 17.8], [0.0, 57.7, 45.5], [0.0, 96.0, 43.8]])
NVLS_EFFICIENCY = np.array([0.0, 0.0, 0.85, 0.74])

# Tree AllReduce correction factor per protocol for log2(nBytes/64) in 0..22.
TREE_CORRECTION = np.array([
    [1.0, 1.0, 1.0, 1.0, .9, .8, .7, .7, .7, .7, .6, .5, .4, .4, .5, .6, .7, .8, .9, 1.0, 1.0, 1.0, 1.0],
    [1.0, 1.0, 1.0, 1.0, 1.0, .9, .8, .8, .8, .7, .6, .6, .6, .6, .6, .6, .8, .9, .9, .9, .9, 1.0, 1.0],
    [.9, .9, .9, .9, .9, .9, .9, .8, .7, .6, .6, .5, .5, .5, .5, .6, .7, .8, .7, .7, .8, .9, .9],
])

# --- threads, thresholds, buffers (device.h, comm.h, init.cc) --------------------------------
WARP_SIZE = 32
MAX_NTHREADS = 640
SIMPLE_MAX_NTHREADS = 512
LL_MAX_NTHREADS = 512
LL128_MAX_NTHREADS = 640
THREAD_THRESHOLD = np.array([8, 8, 64])  # LL, LL128, Simple; Ring LL is multiplied by nRanks
PCI_BW_GBPS = 12.0
NCCL_STEPS = 8
MAX_CHANNELS = 64
MIN_TRAFFIC_PER_CHANNEL = 16 << 10
DEFAULT_BUFFSIZE_BYTES = np.array([8 * 512 * 8 * 16, 120 * 640 * 8 * 8, 1 << 22])  # LL, LL128, Simple
PROTO_GRAIN_BYTES = np.array([16, 1920, 512])  # what NCCL aligns chunks down to
MAX_DEV_WORK_BATCH_COLLS = 16  # only matters for numPipeOps > 1 on Tree

# Chunk steps per collective for Ring/Simple (collectives.h): NCCL_STEPS/2, or 1 for Broadcast/Reduce.
RING_SIMPLE_CHUNK_STEPS = np.array([1, 1, NCCL_STEPS // 2, NCCL_STEPS // 2, NCCL_STEPS // 2])

# --- nccl-tests' bus bandwidth factors -------------------------------------------------------


def bus_factor(coll: int | np.ndarray, nranks: int) -> np.ndarray:
    """nccl-tests' busBw/algBw: 2(n-1)/n AllReduce, (n-1)/n AllGather/ReduceScatter, 1 otherwise."""
    coll = np.asarray(coll)
    n = float(nranks)
    return np.where(coll == ALLREDUCE, 2 * (n - 1) / n,
                    np.where((coll == ALLGATHER) | (coll == REDUCESCATTER), (n - 1) / n, 1.0))


def parse_name(kind: str, value: str, names: tuple[str, ...]) -> int:
    """Index of ``value`` in ``names`` (case-insensitive), or a one-line ``ConfigError``."""
    key = str(value).strip().lower().replace("-", "_")
    aliases = {"nvlstree": "nvls_tree", "collnetdirect": "collnet_direct", "collnetchain": "collnet_chain",
               "all_reduce": "allreduce", "all_gather": "allgather", "reduce_scatter": "reducescatter"}
    key = aliases.get(key, key)
    if key in names:
        return names.index(key)
    raise ConfigError(kind, f"unknown value {value!r}; allowed: {', '.join(names)}")
