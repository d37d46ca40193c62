"""A replica of NCCL 2.28's default decision: its cost table and its per-call choice.

``ncclTopoTuneModel`` builds, once per communicator, a latency (us) and a bandwidth (GB/s) for
every (collective, algorithm, protocol). Per call, ``ncclTopoGetAlgoTime`` turns them into the
predicted time ``lat * latCount + nBytes / (1000 * bw)``, the smallest non-negative entry wins
(ties: lower algorithm, then lower protocol), then ``topoGetAlgoInfo`` picks the channel and
thread counts, and the scheduler spreads the work over channels in cells of >= 16 KiB of
traffic. This module reproduces all of it from a :class:`~costmodel.topology.Topology`,
vectorized over message sizes.

Sizes (``nbytes``) follow the tuner's convention: the larger of the send and receive buffers,
i.e. the total for AllGather/ReduceScatter, as in nccl-tests' ``size`` column.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from ncclrl.costmodel import nccl as N
from ncclrl.costmodel.errors import ConfigError
from ncclrl.costmodel.topology import Topology


@dataclass(frozen=True)
class NcclModel:
    """NCCL's per-communicator tuning state for one topology.

    :param bandwidths: ``[coll][algo][proto]`` algorithm bandwidth, GB/s (0 = disabled)
    :param latencies: ``[coll][algo][proto]`` latency, us
    :param max_threads: ``[algo][proto]`` threads per CTA
    :param thread_thresholds: ``[algo][proto]`` bytes per thread before more channels/threads
    """

    topo: Topology
    bandwidths: np.ndarray
    latencies: np.ndarray
    max_threads: np.ndarray
    thread_thresholds: np.ndarray

    @property
    def channels(self) -> int:
        return self.topo.nccl.channels


def _eligible(topo: Topology, coll: int, algo: int, proto: int) -> bool:
    """Whether NCCL would ever consider (coll, algo, proto) on this topology."""
    if coll in (N.BROADCAST, N.REDUCE) and algo != N.RING:
        return False
    if coll in (N.ALLGATHER, N.REDUCESCATTER) and algo not in (N.PAT, N.RING, N.NVLS, N.COLLNET_DIRECT):
        return False
    if coll == N.ALLREDUCE and algo == N.PAT:
        return False
    if algo in (N.NVLS, N.NVLS_TREE, N.PAT, N.COLLNET_DIRECT, N.COLLNET_CHAIN) and proto != N.SIMPLE:
        return False
    if algo == N.PAT and not pat_enabled(topo):
        return False
    if algo in (N.NVLS, N.NVLS_TREE):
        if not topo.nccl.nvls:
            return False
        if algo == N.NVLS_TREE and topo.nodes == 1:
            return False
        if algo == N.NVLS and topo.nodes > 1 and not topo.nccl.collnet:
            return False
    if algo in (N.COLLNET_DIRECT, N.COLLNET_CHAIN):
        if not topo.nccl.collnet or topo.nodes == 1:
            return False
        if algo == N.COLLNET_DIRECT and topo.intra.fabric != "nvswitch":
            return False
        if coll in (N.ALLGATHER, N.REDUCESCATTER) and topo.nodes > 1:
            return False
    if proto == N.LL128:
        # NCCL enables LL128 only over NVLink inside a node (typeIntra <= NVB) and, across nodes,
        # only when the NIC sits near the GPU (typeInter <= PXN); a socket NIC hangs off the CPU.
        if topo.intra.fabric == "pcie" or (topo.nodes > 1 and topo.net.kind == "socket"):
            return False
    return True


def pat_enabled(topo: Topology) -> bool:
    """NCCL enables PAT only with one GPU per node (and a host-driven network)."""
    return topo.nodes == topo.nranks and topo.nranks > 1


def check_algo_allowed(topo: Topology, coll: int, algo: int, proto: int) -> None:
    """One-line error for a configuration this topology cannot run (PAT with several GPUs per
    node, NVLS Tree on one node, ...)."""
    if _eligible(topo, coll, algo, proto):
        return
    allowed = sorted({f"{N.ALGOS[a]}/{N.PROTOS[p]}" for a in range(N.NUM_ALGOS) for p in range(N.NUM_PROTOS)
                      if _eligible(topo, coll, a, p)})
    raise ConfigError("algorithm", f"{N.ALGOS[algo]}/{N.PROTOS[proto]} is not possible for "
                      f"{N.COLLECTIVES[coll]} on {topo.name} ({topo.nodes} nodes x {topo.ppn} GPUs); "
                      f"allowed: {', '.join(allowed)}")


@lru_cache(maxsize=256)
def _eligible_mask_cached(topo: Topology) -> np.ndarray:
    m = np.zeros((len(N.COLLECTIVES), N.NUM_ALGOS, N.NUM_PROTOS), dtype=bool)
    for c in range(len(N.COLLECTIVES)):
        for a in range(N.NUM_ALGOS):
            for p in range(N.NUM_PROTOS):
                m[c, a, p] = _eligible(topo, c, a, p)
    m.setflags(write=False)
    return m


def eligible_mask(topo: Topology) -> np.ndarray:
    """``[coll][algo][proto]`` booleans: what NCCL can run on this topology (read-only, cached)."""
    return _eligible_mask_cached(topo)


def _net_overhead_us(topo: Topology) -> float:
    if topo.cpu_arch == "x86" and topo.cpu_vendor == "amd":
        return 2.0
    return 1.0


@lru_cache(maxsize=256)
def build_model(topo: Topology) -> NcclModel:
    """``ncclTopoTuneModel``: latencies and bandwidths for every (coll, algo, proto)."""
    nn, nr = topo.nodes, topo.nranks
    ppn = nr / nn
    cc = topo.compcap_row
    idx2 = topo.nodes_index
    if nn == 1:
        idx1 = cc
    else:
        idx1 = 1 if topo.cpu_vendor in ("amd", "mixed") else 0
    ll_max_bw = N.LL_MAX_BW[idx1, idx2]
    per_ch_tree = N.PER_CH_MAX_TREE_BW[cc, idx2]
    per_ch_ring_ll128 = N.PER_CH_MAX_RING_LL128_BW[cc, idx2]
    per_ch_tree_ll128 = N.PER_CH_MAX_TREE_LL128_BW[cc, idx2]
    per_ch_nvls_tree = N.PER_CH_MAX_NVLS_TREE_BW[cc, idx2]
    intra_hw = N.HW_NVLINK if topo.intra.fabric in ("nvswitch", "nvlink") else N.HW_PCI
    hw = intra_hw if nn == 1 else N.HW_NET
    nch = topo.nccl.channels
    bw_intra, bw_inter = topo.intra.channel_bw_gbps, topo.net.channel_bw_gbps
    lat_inter_graph = topo.net.latency_us

    bws = np.zeros((5, N.NUM_ALGOS, N.NUM_PROTOS))
    lats = np.zeros((5, N.NUM_ALGOS, N.NUM_PROTOS))
    for coll in range(5):
        nsteps = 2 * (nr - 1) if coll == N.ALLREDUCE else (nr - 1 if coll in (N.ALLGATHER, N.REDUCESCATTER)
                                                           else nr)
        for a in range(N.NUM_ALGOS):
            g_nch = topo.nccl.nvls_channels if a in (N.NVLS, N.NVLS_TREE) else nch
            for p in range(N.NUM_PROTOS):
                if not _eligible(topo, coll, a, p):
                    continue
                collnet = a in (N.COLLNET_DIRECT, N.COLLNET_CHAIN)
                bw = bw_intra if (nn <= 2 or collnet) else bw_inter
                if a in (N.NVLS, N.NVLS_TREE):
                    if g_nch < 2:
                        continue
                    intra_bw = bw_intra * N.NVLS_EFFICIENCY[cc] * (g_nch - 1) / g_nch
                    intra_bw *= 2.0 if coll == N.ALLREDUCE else (ppn - 1) / ppn
                    inter_bw = bw_inter * (2 if (nn <= 2 and a == N.NVLS_TREE) else 1)
                    cands = [intra_bw, inter_bw if nn > 1 else intra_bw]
                    if a == N.NVLS_TREE:
                        cands.append(per_ch_nvls_tree)
                    bw = min(cands)
                bus = g_nch * bw
                if a == N.RING and p == N.LL:
                    bus = min(ll_max_bw, bus * 0.5)
                if a == N.RING and p == N.LL128:
                    bus = min(bus * 0.92, g_nch * per_ch_ring_ll128)
                if a == N.TREE and coll == N.ALLREDUCE:
                    bus = min(bus * 0.92, g_nch * per_ch_tree)
                if a == N.TREE and p == N.LL:
                    bus = min(bus / 3.8, ll_max_bw)
                if a == N.TREE and p == N.LL128:
                    bus = min(bus * (7.0 / 9.0 if nn == 1 else 120.0 / 128.0), g_nch * per_ch_tree_ll128)
                if a == N.TREE and topo.nccl.tree_pattern == "tree":
                    bus *= 0.85
                if a == N.PAT:
                    bus *= 0.75
                if a == N.COLLNET_DIRECT:
                    if coll in (N.ALLGATHER, N.REDUCESCATTER):
                        bus = ppn * min(bw_intra, bw_inter * 0.9)
                    else:
                        factor = ppn / g_nch
                        factor -= (factor - 1) / 2
                        bus /= factor
                        if topo.gpu_arch in ("hopper", "blackwell"):
                            bus *= 0.85
                if not (a != N.RING and coll in (N.ALLGATHER, N.REDUCESCATTER)):
                    if a in (N.RING, N.NVLS, N.NVLS_TREE):
                        bus *= nr / nsteps
                    else:
                        bus *= 0.5
                bws[coll, a, p] = bus

                lat = N.BASE_LAT_US[a, p]
                intra_lat = N.HW_LAT_US[intra_hw, a, p]
                inter_lat = N.HW_LAT_US[N.HW_NET, N.TREE if ppn == 1 else a, p] + lat_inter_graph
                if p == N.SIMPLE:
                    inter_lat += lat_inter_graph
                if a == N.RING:
                    hop = N.HW_LAT_US[hw, a, p]
                    if coll in (N.REDUCE, N.BROADCAST):
                        if topo.nccl.ring_same_channels:
                            lat += hop
                        else:
                            if p == N.SIMPLE:
                                hop = N.HW_LAT_US[hw, N.TREE, p]
                            lat += nsteps * hop
                    else:
                        net_overhead = 0.0
                        if nn > 1:
                            net_overhead = _net_overhead_us(topo) * (3 if p == N.SIMPLE else 1)
                        intra_lat = max(intra_lat, net_overhead)
                        n_inter = 0 if nn == 1 else (2 * (nn - 1) if coll == N.ALLREDUCE else nn - 1)
                        lat += (nsteps - n_inter) * intra_lat + n_inter * inter_lat
                elif a == N.TREE:
                    if coll == N.ALLREDUCE:
                        lat += 2 * ((nr // nn - 1) * intra_lat + _log2i(nn) * inter_lat)
                elif a == N.COLLNET_DIRECT:
                    lat += 2 * (min(1, nr // nn - 1) * intra_lat + (nr // nn - 1) * 0.4) + inter_lat
                elif a == N.COLLNET_CHAIN:
                    lat += 2 * (nr // nn - 1) * intra_lat + inter_lat
                elif a == N.NVLS:
                    lat = intra_lat + (inter_lat if nn > 1 else 0.0)
                elif a == N.NVLS_TREE:
                    lat += intra_lat + 2 * _log2i(nn) * inter_lat
                elif a == N.PAT and coll in (N.ALLGATHER, N.REDUCESCATTER):
                    lat += _log2i(nn) * (inter_lat / 3.5) + nr * 2.8
                lats[coll, a, p] = lat

    max_threads = np.zeros((N.NUM_ALGOS, N.NUM_PROTOS), dtype=np.int64)
    simple_default = 256 if bw_intra * nch <= N.PCI_BW_GBPS else N.SIMPLE_MAX_NTHREADS
    max_threads[:, N.SIMPLE] = N.MAX_NTHREADS
    max_threads[N.RING, N.SIMPLE] = simple_default
    max_threads[N.TREE, N.SIMPLE] = N.SIMPLE_MAX_NTHREADS
    max_threads[N.PAT, N.SIMPLE] = N.SIMPLE_MAX_NTHREADS
    max_threads[:, N.LL] = N.LL_MAX_NTHREADS
    max_threads[:, N.LL128] = N.LL128_MAX_NTHREADS
    thr = np.tile(N.THREAD_THRESHOLD, (N.NUM_ALGOS, 1)).astype(np.int64)
    thr[N.RING, N.LL] *= nr
    thr[N.COLLNET_DIRECT, N.SIMPLE] = 512
    thr[N.COLLNET_CHAIN, N.SIMPLE] = 512
    return NcclModel(topo=topo, bandwidths=bws, latencies=lats, max_threads=max_threads,
                     thread_thresholds=thr)


def _ceil_div(a, b):
    return -(-a // b)


def _log2i(n: int) -> int:
    return int(n).bit_length() - 1


def _as_sizes(nbytes: np.ndarray | int | list) -> np.ndarray:
    arr = np.atleast_1d(np.asarray(nbytes))
    if arr.dtype.kind == "f":
        if not np.all(np.isfinite(arr)) or not np.all(arr == np.floor(arr)):
            raise ConfigError("nbytes", "must be whole numbers of bytes")
        arr = arr.astype(np.int64)
    if arr.dtype.kind not in "iu":
        raise ConfigError("nbytes", f"must be whole numbers of bytes, got dtype {arr.dtype}")
    if np.any(arr <= 0):
        raise ConfigError("nbytes", f"must be > 0, got {int(arr[arr <= 0][0])}")
    return arr.astype(np.int64)


def cost_table(model: NcclModel, coll: int, nbytes: np.ndarray | int, num_pipe_ops: int = 1) -> np.ndarray:
    """``updateCollCostTable``: predicted time (us) per size, shape ``(len(nbytes), 7, 3)``; -1 = disabled."""
    sizes = _as_sizes(nbytes)
    bw = np.broadcast_to(model.bandwidths[coll], (sizes.size, N.NUM_ALGOS, N.NUM_PROTOS)).copy()
    lat = np.broadcast_to(model.latencies[coll], bw.shape).copy()
    if coll == N.ALLREDUCE:
        log_size = np.array([_log2i(s >> 6) if (s >> 6) > 0 else -1 for s in sizes])
        ok = (log_size >= 0) & (log_size < 23)
        corr = np.ones((sizes.size, N.NUM_PROTOS))
        corr[ok] = N.TREE_CORRECTION[:, log_size[ok]].T
        bw[:, N.TREE, :] *= corr
        topo = model.topo
        if topo.nodes > 1:
            plateau = sizes // (model.channels * topo.nranks) >= 64
            factor = 1.9 if topo.gpu_arch == "volta" else 1.4
            lat[plateau, N.RING, N.SIMPLE] *= factor
    lat_count = np.full((N.NUM_ALGOS, 1), -(-num_pipe_ops // N.MAX_DEV_WORK_BATCH_COLLS), dtype=float)
    lat_count[N.RING] = num_pipe_ops
    with np.errstate(divide="ignore", invalid="ignore"):
        t = lat * lat_count + sizes[:, None, None] / (1000.0 * bw)
    t[bw == 0] = -1.0
    return t


def auto_channels(model: NcclModel, nbytes: np.ndarray, algo: np.ndarray, proto: np.ndarray,
                  comm_channels: np.ndarray | int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """``topoGetAlgoInfo``'s per-call channel and thread counts (Ring/Tree/PAT; NVLS uses its own)."""
    nbytes = np.asarray(nbytes, dtype=np.int64)
    algo = np.asarray(algo, dtype=np.int64)
    proto = np.asarray(proto, dtype=np.int64)
    nc_comm = np.asarray(model.channels if comm_channels is None else comm_channels, dtype=np.int64)
    nc_comm = np.where(nc_comm > 0, nc_comm, model.channels)
    nt = model.max_threads[algo, proto]
    thr = model.thread_thresholds[algo, proto]
    nc = np.clip(nbytes // (nt * thr), 1, nc_comm)
    is_nvls = (algo == N.NVLS) | (algo == N.NVLS_TREE)
    nc = np.where(is_nvls, model.topo.nccl.nvls_channels, nc)
    # Threads: halve while the work per thread is below the threshold (multiples of 128 only).
    for _ in range(4):
        shrink = (nbytes < nc * nt * thr) & (nt % 128 == 0) & ~is_nvls & (algo != N.COLLNET_DIRECT)
        nt = np.where(shrink, nt // 2, nt)
    nt = np.where(proto == N.SIMPLE, nt + np.where(algo == N.RING, N.WARP_SIZE,
                                                   np.where(algo == N.TREE, 4 * N.WARP_SIZE, 0)), nt)
    nt = np.maximum(nt, 3 * N.WARP_SIZE)
    nt = np.where((algo == N.TREE) | (algo == N.PAT), N.MAX_NTHREADS, nt)
    return nc, nt


def data_bytes(coll: np.ndarray | int, nbytes: np.ndarray, nranks: int) -> np.ndarray:
    """Bytes of one rank's ``count`` (what NCCL logs): nbytes / nRanks for AllGather/ReduceScatter."""
    coll = np.asarray(coll)
    return np.where((coll == N.ALLGATHER) | (coll == N.REDUCESCATTER), nbytes // nranks, nbytes)


def scheduled_channels(coll: np.ndarray | int, nbytes: np.ndarray, proto: np.ndarray, max_channels: np.ndarray,
                       comm_channels: np.ndarray | int, nranks: int) -> np.ndarray:
    """Channels a single collective actually runs on after NCCL's scheduler spreads its traffic
    over channels in cells of >= 16 KiB (``scheduleCollTasksToPlan``)."""
    coll = np.asarray(coll, dtype=np.int64)
    nbytes = np.asarray(nbytes, dtype=np.int64)
    proto = np.asarray(proto, dtype=np.int64)
    comm_ch = np.asarray(comm_channels, dtype=np.int64)
    maxc = np.minimum(np.asarray(max_channels, dtype=np.int64), comm_ch)
    dbytes = data_bytes(coll, nbytes, nranks)
    tpb = np.where(coll == N.ALLREDUCE, 2,
                   np.where((coll == N.ALLGATHER) | (coll == N.REDUCESCATTER), nranks, 1)).astype(np.int64)
    tpb = np.where(proto == N.LL, tpb * 4, tpb)
    traffic = dbytes * tpb
    tpc = np.maximum(N.MIN_TRAFFIC_PER_CHANNEL, traffic // np.maximum(maxc, 1))
    cell = _ceil_div(_ceil_div(N.MIN_TRAFFIC_PER_CHANNEL, tpb), 16) * 16
    cells = _ceil_div(dbytes, cell)
    per_cell = cell * tpb
    cpc = np.maximum(np.minimum(cells, _ceil_div(tpc, per_cell)), 1)
    lo = np.where(comm_ch == 1, cells, np.minimum(cells, _ceil_div(tpc, per_cell)))
    rest = cells - lo
    nch = (lo > 0).astype(np.int64) + rest // cpc + (rest % cpc > 0)
    return np.minimum(np.maximum(nch, 1), comm_ch)


@dataclass(frozen=True)
class Decisions:
    """NCCL's default choice for a vector of sizes (arrays of equal length)."""

    coll: int
    nbytes: np.ndarray
    algo: np.ndarray
    proto: np.ndarray
    max_channels: np.ndarray  # nMaxChannels from topoGetAlgoInfo
    channels: np.ndarray      # channels the call runs on (NCCL's log: Hi - Lo + 1)
    nthreads: np.ndarray
    chunk_bytes: np.ndarray
    time_us: np.ndarray       # NCCL's predicted time of its choice
    table: np.ndarray         # the full cost table, (n, 7, 3)


def pick(table: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Smallest non-negative entry of each (7, 3) table; ties to lower algo, then lower proto."""
    flat = np.where(table >= 0, table, np.inf).reshape(table.shape[0], -1)
    best = np.argmin(flat, axis=1)
    if np.any(~np.isfinite(flat[np.arange(flat.shape[0]), best])):
        raise ConfigError("algorithm", "no algorithm/protocol is enabled for this collective")
    return best // N.NUM_PROTOS, best % N.NUM_PROTOS


def chunk_bytes(topo: Topology, coll: np.ndarray | int, algo: np.ndarray, proto: np.ndarray,
                channel_bytes: np.ndarray, buffsize_bytes: np.ndarray | int = 0) -> np.ndarray:
    """``calcCollChunking``'s chunk size for one channel carrying ``channel_bytes`` (global bytes).

    ``buffsize_bytes`` > 0 replaces the Simple protocol's buffer (``NCCL_BUFFSIZE``).
    """
    algo = np.asarray(algo, dtype=np.int64)
    proto = np.asarray(proto, dtype=np.int64)
    coll = np.broadcast_to(np.asarray(coll, dtype=np.int64), algo.shape)
    buff = np.broadcast_to(N.DEFAULT_BUFFSIZE_BYTES[proto], algo.shape).copy()
    bs = np.broadcast_to(np.asarray(buffsize_bytes, dtype=np.int64), algo.shape)
    buff = np.where((proto == N.SIMPLE) & (bs > 0), bs, buff)
    step = buff // N.NCCL_STEPS
    steps = np.where((proto == N.SIMPLE) & (algo == N.RING), N.RING_SIMPLE_CHUNK_STEPS[coll], 1)
    chunk = step * steps
    chunk = np.where(proto == N.LL, chunk // 2, chunk)
    chunk = np.where(proto == N.LL128, (chunk // 16) * 15, chunk)
    cb = np.broadcast_to(np.asarray(channel_bytes, dtype=np.int64), algo.shape)
    # Tree/LL128 shrinks its chunk for small per-channel sizes (only those entries are touched).
    nn, ppn = topo.nodes, topo.nranks / topo.nodes
    nsteps_ll128 = 1 + _log2i(nn) + 0.1 * ppn
    idx = np.flatnonzero((algo == N.TREE) & (proto == N.LL128))
    if idx.size:
        ck, b = chunk[idx].copy(), cb[idx]
        for limit, floor in ((nsteps_ll128 * 64 / ppn, 131072), (nsteps_ll128 * 16 / ppn, 32768)):
            for _ in range(8):
                ck = np.where((b // np.maximum(ck, 1) < limit) & (ck > floor), ck // 2, ck)
        chunk[idx] = ck
    idx = np.flatnonzero(algo == N.PAT)
    if idx.size:
        ck, b = chunk[idx].copy(), cb[idx]
        lim = np.where(coll[idx] == N.ALLGATHER, 32, 16)
        for _ in range(8):
            ck = np.where((ck * lim > b) & (ck > 65536), ck // 2, ck)
        chunk[idx] = ck
    grain = N.PROTO_GRAIN_BYTES[proto]
    return (chunk // grain) * grain


def default_decisions(topo: Topology, coll: int | str, nbytes: np.ndarray | int | list,
                      num_pipe_ops: int = 1, allowed: np.ndarray | None = None,
                      comm_channels: int = 0) -> Decisions:
    """NCCL's default (algorithm, protocol, channels, threads, chunk) for each size.

    :param allowed: optional ``[algo][proto]`` mask, what ``NCCL_ALGO``/``NCCL_PROTO`` leave enabled
    :param comm_channels: the communicator's channel count when forced (``NCCL_MIN/MAX_NCHANNELS``);
        0 keeps the topology's
    """
    if isinstance(coll, str):
        coll = N.parse_name("collective", coll, N.COLLECTIVES)
    if num_pipe_ops < 1:
        raise ConfigError("num_pipe_ops", f"must be >= 1, got {num_pipe_ops}")
    sizes = _as_sizes(nbytes)
    model = build_model(topo)
    table = cost_table(model, coll, sizes, num_pipe_ops)
    if allowed is not None:
        table[:, ~np.asarray(allowed, dtype=bool)] = -1.0
    algo, proto = pick(table)
    comm_ch = comm_channels if comm_channels > 0 else model.channels
    maxc, nt = auto_channels(model, sizes, algo, proto, comm_ch)
    nch = scheduled_channels(coll, sizes, proto, maxc, comm_ch, topo.nranks)
    per_ch = sizes // np.maximum(nch, 1)
    chunk = chunk_bytes(topo, coll, algo, proto, per_ch)
    t = table[np.arange(sizes.size), algo, proto]
    return Decisions(coll=coll, nbytes=sizes, algo=algo, proto=proto, max_channels=maxc, channels=nch,
                     nthreads=nt, chunk_bytes=chunk, time_us=t, table=table)
