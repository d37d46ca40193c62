"""A replica of NCCL's default decision (releases 2.27 to 2.32): its cost table and its per-call choice.

``ncclTopoTuneModel`` builds, once per communicator, a latency (us) and a bandwidth (GB/s) for
every (collective, algorithm, protocol). Per call, ``ncclTopoGetAlgoTime`` turns them into the
predicted time ``lat * latCount + nBytes / (1000 * bw)``, the smallest non-negative entry wins
(ties: lower algorithm, then lower protocol), then ``topoGetAlgoInfo`` picks the channel and
thread counts, and the scheduler spreads the work over channels in cells of traffic. This module
reproduces all of it from a :class:`~costmodel.topology.Topology`, vectorized over message sizes.

Which release: the topology's ``nccl.version`` selects the constants and rules that differ
between the releases followed (:func:`release_model`); 2.28.9 is the reference, and a version
outside 2.27-2.32 follows the nearest end. What differs:

- 2.27: NVLS bandwidth ``min(bwIntra, bwInter)`` (AllReduce) or ``min(bwIntra (ppn-1)/ppn,
  0.9 bwInter)`` (AllGather/ReduceScatter), NVLS/NVLS Tree bus-to-algorithm ratio 5/6, NVLS Tree
  ``min(bwIntra, bwInter or bwInter/2 beyond 2 nodes)`` with no per-channel cap, NVLS Tree's
  network latency 14 us, and Blackwell's Tree/LL128 caps at twice Hopper's.
- 2.28: NVLS bandwidth ``bwIntra * nvlsEfficiency * (n-1)/n`` (x2 for AllReduce, x(ppn-1)/ppn
  otherwise) capped by ``bwInter``, ratio nRanks/nSteps, per-channel NVLS Tree cap, NVLS Tree
  network latency 20.9 us; Blackwell's Ring/LL128 cap 73.4/34.6/73.4 GB/s (2.28.3: 73.4 x 3)
  and NVLS Tree cap 43.8 beyond 2 nodes (2.28.3: 43.1).
- 2.29: Blackwell's Ring/LL128 cap 34.5/34.6/34.5 (2.29.7: 40 x 3), NVLS Tree AllReduce on
  Blackwell with x86 CPUs takes the Tree correction factors, the Blackwell intra-node search
  speeds gain 45 GB/s, and the scheduler's minimum traffic per channel is 32 KiB (16 KiB before)
  with the per-channel traffic no longer raised to it.
- 2.30: Blackwell's NVLS Tree cap beyond 2 nodes is 80 GB/s.
- 2.31 (2.32 follows it: its tuning sources were not available): see ``ReleaseModel.tuning_v231``;
  symmetric kernels compete on one NVLink node (``Decisions.symmetric``, :func:`symmetric_calls`).

Hopper and older GPUs get the same table from 2.28 to 2.30; the per-call choice
(``updateCollCostTable``, ``topoGetAlgoInfo``) is the same from 2.28 to 2.30.

The NVLS graph of one node is NCCL's search result, not the ring's: one channel per GPU (at most
32), each GPU heads one channel (twice the traffic) and joins the others, so the search settles on
the fastest speed ``s`` of its table with ``(nGPUs + 1) * s`` within the GPU's NVLink bandwidth,
then raises ``bwInter`` step by step while it is below ``2 * bwIntra``.

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
class ReleaseModel:
    """The constants and rules of NCCL's model that differ between the releases the replica follows.

    :param release: the release followed, ``(major, minor, patch)``
    :param per_ch_max_ring_ll128_bw: ``[compcap][nodes index]`` Ring/LL128 per-channel cap, GB/s
    :param per_ch_max_tree_ll128_bw: ``[compcap][nodes index]`` Tree/LL128 per-channel cap, GB/s
    :param per_ch_max_tree_bw: ``[compcap][nodes index]`` Tree AllReduce per-channel cap, GB/s
    :param per_ch_max_nvls_tree_bw: ``[compcap][nodes index]`` NVLS Tree per-channel cap, GB/s
    :param nvls_efficiency_model: 2.28+: NVLS bandwidth through ``nvlsEfficiency``; 2.27: ``min(bwIntra, bwInter)``
    :param nvls_tree_net_lat_us: NVLS Tree's network latency (``hwLat[NET][NVLS_TREE][SIMPLE]``), us
    :param nvls_tree_correction: NVLS Tree AllReduce takes the Tree correction on Blackwell with x86 CPUs
    :param min_traffic_per_channel: the scheduler's minimum traffic per channel, bytes
    :param traffic_floor_per_channel: the scheduler raises a channel's traffic to that minimum (before 2.29)
    :param sm100_intra_speeds: the Blackwell intra-node search speeds, GB/s
    :param tuning_v231: 2.31's tuning rewrite (``src/tuning/*.cc``): Ring's busBw ``bwInter`` on
        several nodes, Ring's inter-node hop ``hwLat[NET][RING]`` with one GPU per node, Broadcast/Reduce
        hops at the intra-node latency, Tree/PAT busBw ``min(bwInter, bwIntra)``, PAT's ``latencyInter``
        once, NVLS Tree never available, LL128 gated only under NCCL_ALGO/NCCL_PROTO, ties to the higher
        ``algo*3+proto``, Ring/Simple 512 threads, symmetric kernels as tuning candidates on one node
    """

    release: tuple[int, int, int]
    per_ch_max_ring_ll128_bw: np.ndarray
    per_ch_max_tree_ll128_bw: np.ndarray
    per_ch_max_tree_bw: np.ndarray
    per_ch_max_nvls_tree_bw: np.ndarray
    nvls_efficiency_model: bool
    nvls_tree_net_lat_us: float
    nvls_tree_correction: bool
    min_traffic_per_channel: int
    traffic_floor_per_channel: bool
    sm100_intra_speeds: tuple[float, ...]
    tuning_v231: bool = False


# 2.32: its ring/tree/nvls/pat/tuning sources were not available, so 2.32.x follows 2.31's rules
FIRST_RELEASE, LAST_RELEASE = (2, 27, 0), (2, 32, 99)
# NCCL's intra-node graph-search speeds (search.cc), GB/s
_SM90_INTRA_SPEEDS = (60.0, 50.0, 40.0, 30.0, 24.0, 20.0, 15.0, 12.0, 11.0, 6.0, 3.0)
_SM100_INTRA_SPEEDS = (90.0, 80.0, 70.0, 60.0, 50.0, 40.0, 30.0, 24.0, 20.0, 19.0, 18.0)
_SM100_INTRA_SPEEDS_229 = (90.0, 80.0, 70.0, 60.0, 50.0, 45.0, 40.0, 30.0, 24.0, 20.0, 19.0, 18.0)
NVLS_MAX_ARITY = 32


def _with_row(table: np.ndarray, row: int, values: tuple[float, float, float]) -> np.ndarray:
    out = np.array(table, dtype=float)
    out[row] = values
    out.setflags(write=False)
    return out


def parse_release(version: str) -> tuple[int, int, int]:
    """``"2.29.2"`` (or ``"2.29.2+cuda12.8"``, ``"2.29"``) -> ``(2, 29, 2)``; one-line error otherwise."""
    head = str(version).split("+")[0].strip()
    parts = head.split(".")
    if len(parts) < 2 or not all(p.isdigit() for p in parts):
        raise ConfigError("nccl.version", f"must look like 2.28.9, got {version!r}")
    major, minor = int(parts[0]), int(parts[1])
    patch = int(parts[2]) if len(parts) == 3 else 0
    return major, minor, patch


@lru_cache(maxsize=32)
def release_model(version: str) -> ReleaseModel:
    """The model of the NCCL release ``version``; versions before 2.27 follow 2.27, after 2.32 follow 2.32
    (2.32 follows 2.31's rules: its tuning sources were not available)."""
    rel = min(max(parse_release(version), FIRST_RELEASE), LAST_RELEASE)
    bw = N.COMPCAP_ROWS["blackwell"]
    ring_ll128 = N.PER_CH_MAX_RING_LL128_BW
    tree_ll128 = N.PER_CH_MAX_TREE_LL128_BW
    tree = N.PER_CH_MAX_TREE_BW
    nvls_tree = N.PER_CH_MAX_NVLS_TREE_BW
    if rel < (2, 28, 0):
        ring_ll128 = _with_row(ring_ll128, bw, (2 * 36.7,) * 3)
        tree_ll128 = _with_row(tree_ll128, bw, (2 * 36.7, 2 * 36.7, 2 * 29.0))
        tree = _with_row(tree, bw, (2 * 38.7, 2 * 41.4, 2 * 36.0))
    elif rel < (2, 28, 7):
        ring_ll128 = _with_row(ring_ll128, bw, (2 * 36.7,) * 3)
        nvls_tree = _with_row(nvls_tree, bw, (0.0, 96.0, 43.1))
    elif rel < (2, 29, 0):
        pass  # 2.28.7 and 2.28.9: NCCL's constants as nccl.py holds them
    elif rel < (2, 29, 7):
        ring_ll128 = _with_row(ring_ll128, bw, (34.5, 34.6, 34.5))
    else:
        ring_ll128 = _with_row(ring_ll128, bw, (40.0, 40.0, 40.0))
        if rel >= (2, 30, 0):
            nvls_tree = _with_row(nvls_tree, bw, (0.0, 96.0, 80.0))
    new = rel >= (2, 29, 0)
    return ReleaseModel(
        release=rel, per_ch_max_ring_ll128_bw=ring_ll128, per_ch_max_tree_ll128_bw=tree_ll128,
        per_ch_max_tree_bw=tree, per_ch_max_nvls_tree_bw=nvls_tree, nvls_efficiency_model=rel >= (2, 28, 0),
        nvls_tree_net_lat_us=14.0 if rel < (2, 28, 0) else float(N.HW_LAT_US[N.HW_NET, N.NVLS_TREE, N.SIMPLE]),
        nvls_tree_correction=new, min_traffic_per_channel=(32 << 10) if new else N.MIN_TRAFFIC_PER_CHANNEL,
        traffic_floor_per_channel=not new, sm100_intra_speeds=_SM100_INTRA_SPEEDS_229 if new else _SM100_INTRA_SPEEDS,
        tuning_v231=rel >= (2, 31, 0))


def nvls_graph(topo: Topology) -> tuple[int, float, float]:
    """NCCL's NVLS graph on one node: ``(channels, bwIntra, bwInter)``; ``(0, 0, 0)`` when the search finds none.

    One channel per GPU (at most 32); each GPU pulls from and pushes to the NVSwitch once per
    channel and twice for the channel it heads, so a speed ``s`` fits when ``(nGPUs + 1) * s`` is
    within the GPU's NVLink bandwidth. ``bwInter`` is then raised while below ``2 * bwIntra``.
    """
    ngpus = topo.gpus_per_node
    if ngpus < 2 or topo.gpu_arch not in ("hopper", "blackwell"):
        return 0, 0.0, 0.0
    speeds = _SM90_INTRA_SPEEDS if topo.gpu_arch == "hopper" else release_model(topo.nccl.version).sm100_intra_speeds
    nch = min(ngpus, NVLS_MAX_ARITY)
    link = topo.intra.links_per_gpu * topo.intra.link_bw_gbps
    total = link * ngpus / (ngpus - 1)
    i = 0
    while i < len(speeds) - 1 and (speeds[i] > link or speeds[i] * nch > total):
        i += 1
    while i < len(speeds) and (ngpus + 1) * speeds[i] > link + 1e-9:
        i += 1
    if i == len(speeds):
        return 0, 0.0, 0.0
    bw_intra = bw_inter = speeds[i]
    while i > 0 and bw_inter < 2 * bw_intra:
        i -= 1
        bw_inter = speeds[i]
    return nch, bw_intra, bw_inter


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


def _v231(topo: Topology) -> bool:
    return release_model(topo.nccl.version).tuning_v231


def ll128_hw_gate(topo: Topology) -> bool:
    """Whether NCCL's LL128 hardware check fails here (``isLL128Enabled``): PCIe inside a node, or a
    socket NIC across nodes. Before 2.31 it always disables LL128; from 2.31 only under NCCL_ALGO/NCCL_PROTO."""
    return topo.intra.fabric == "pcie" or (topo.nodes > 1 and topo.net.kind == "socket")


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
        if algo == N.NVLS_TREE and (topo.nodes == 1 or _v231(topo)):
            # 2.31: the NVLS Tree model reads comm->graphs[NVLS_TREE], which init.cc never fills
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
    if proto == N.LL128 and not _v231(topo):
        # NCCL enables LL128 only over NVLink inside a node (typeIntra <= NVB) and, across nodes,
        # only when the NIC sits near the GPU (typeInter <= PXN); a socket NIC hangs off the CPU.
        if ll128_hw_gate(topo):
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
    rm = release_model(topo.nccl.version)
    per_ch_tree = rm.per_ch_max_tree_bw[cc, idx2]
    per_ch_ring_ll128 = rm.per_ch_max_ring_ll128_bw[cc, idx2]
    per_ch_tree_ll128 = rm.per_ch_max_tree_ll128_bw[cc, idx2]
    per_ch_nvls_tree = rm.per_ch_max_nvls_tree_bw[cc, idx2]
    intra_hw = N.HW_NVLINK if topo.intra.fabric in ("nvswitch", "nvlink") else N.HW_PCI
    hw = intra_hw if nn == 1 else N.HW_NET
    nch = topo.nccl.channels
    bw_intra, bw_inter = topo.intra.channel_bw_gbps, topo.net.channel_bw_gbps
    # one node: NVLS runs on its own graph (one channel per GPU, the search's speeds)
    nvls_nch, nvls_bw_intra, nvls_bw_inter = nvls_graph(topo) if nn == 1 else (topo.nccl.nvls_channels, bw_intra,
                                                                                bw_inter)
    lat_inter_graph = topo.net.latency_us

    bws = np.zeros((5, N.NUM_ALGOS, N.NUM_PROTOS))
    lats = np.zeros((5, N.NUM_ALGOS, N.NUM_PROTOS))
    for coll in range(5):
        nsteps = 2 * (nr - 1) if coll == N.ALLREDUCE else (nr - 1 if coll in (N.ALLGATHER, N.REDUCESCATTER)
                                                           else nr)
        for a in range(N.NUM_ALGOS):
            g_nch = nvls_nch if a in (N.NVLS, N.NVLS_TREE) else nch
            for p in range(N.NUM_PROTOS):
                if not _eligible(topo, coll, a, p):
                    continue
                collnet = a in (N.COLLNET_DIRECT, N.COLLNET_CHAIN)
                bw = bw_intra if (nn <= 2 or collnet) else bw_inter
                if rm.tuning_v231 and nn > 1 and not collnet:
                    # ring.cc: nNodes > 1 ? bwInter : bwIntra; tree.cc/pat.cc: min(bwInter, bwIntra)
                    bw = bw_inter if a == N.RING else (min(bw_intra, bw_inter) if a in (N.TREE, N.PAT) else bw)
                if a in (N.NVLS, N.NVLS_TREE):
                    if g_nch < 2:
                        continue
                    if rm.nvls_efficiency_model:
                        intra_bw = nvls_bw_intra * N.NVLS_EFFICIENCY[cc] * (g_nch - 1) / g_nch
                        intra_bw *= 2.0 if coll == N.ALLREDUCE else (ppn - 1) / ppn
                        inter_bw = nvls_bw_inter * (2 if (nn <= 2 and a == N.NVLS_TREE) else 1)
                        cands = [intra_bw, inter_bw]
                        if a == N.NVLS_TREE:
                            cands.append(per_ch_nvls_tree)
                        bw = min(cands)
                    elif a == N.NVLS:
                        bw = (min(nvls_bw_intra, nvls_bw_inter) if coll == N.ALLREDUCE
                              else min(nvls_bw_intra * (ppn - 1) / ppn, nvls_bw_inter * 0.9))
                    else:
                        bw = min(nvls_bw_intra, nvls_bw_inter if nn <= 2 else nvls_bw_inter / 2)
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
                    if a == N.RING or (a in (N.NVLS, N.NVLS_TREE) and rm.nvls_efficiency_model):
                        bus *= nr / nsteps
                    elif a in (N.NVLS, N.NVLS_TREE):
                        bus *= 5.0 / 6.0
                    else:
                        bus *= 0.5
                bws[coll, a, p] = bus

                lat = N.BASE_LAT_US[a, p]
                intra_lat = N.HW_LAT_US[intra_hw, a, p]
                inter_lat = N.HW_LAT_US[N.HW_NET, N.TREE if ppn == 1 else a, p] + lat_inter_graph
                if rm.tuning_v231 and a in (N.RING, N.PAT):
                    # ring.cc/pat.cc: the algorithm's own network latency, whatever ppn
                    inter_lat = N.HW_LAT_US[N.HW_NET, a, p] + lat_inter_graph
                if a == N.NVLS_TREE and ppn != 1:
                    inter_lat += rm.nvls_tree_net_lat_us - N.HW_LAT_US[N.HW_NET, a, p]
                if p == N.SIMPLE and not (rm.tuning_v231 and a == N.PAT):
                    inter_lat += lat_inter_graph  # 2.31 pat.cc: latencyInter once
                if a == N.RING:
                    # 2.31 ring.cc: Broadcast/Reduce hops at the intra-node latency, even across nodes
                    # (graphs[RING].typeIntra: NVLink only with several GPUs per node, else the PCI figures)
                    bc_hw = (intra_hw if topo.gpus_per_node > 1 else N.HW_PCI) if rm.tuning_v231 else hw
                    hop = N.HW_LAT_US[bc_hw if coll in (N.REDUCE, N.BROADCAST) else hw, a, p]
                    if coll in (N.REDUCE, N.BROADCAST):
                        if topo.nccl.ring_same_channels:
                            lat += hop
                        else:
                            if p == N.SIMPLE:
                                hop = N.HW_LAT_US[bc_hw, N.TREE, p]
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
    if rm.tuning_v231:
        simple_default = N.SIMPLE_MAX_NTHREADS  # tuning_general.cc: always 512
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
        if (release_model(topo.nccl.version).nvls_tree_correction and topo.gpu_arch == "blackwell"
                and topo.cpu_arch == "x86"):
            # 2.29+: NVLS Tree takes the Tree factors too, over 24 sizes (the 24th: 1.0, 1.0, 0.9)
            ok24 = (log_size >= 0) & (log_size < 24)
            corr24 = np.ones((sizes.size, N.NUM_PROTOS))
            table24 = np.concatenate([N.TREE_CORRECTION, N.TREE_CORRECTION[:, -1:]], axis=1)
            corr24[ok24] = table24[:, log_size[ok24]].T
            bw[:, N.NVLS_TREE, :] *= corr24
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
                       comm_channels: np.ndarray | int, nranks: int, version: str = "") -> np.ndarray:
    """Channels a single collective actually runs on after NCCL's scheduler spreads its traffic
    over channels in cells of >= 16 KiB (32 KiB from 2.29; ``scheduleCollTasksToPlan``).

    :param version: the NCCL release whose scheduler to follow; empty: 2.28
    """
    rm = release_model(version or "2.28.9")
    min_traffic = rm.min_traffic_per_channel
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
    if rm.traffic_floor_per_channel:
        tpc = np.maximum(min_traffic, traffic // np.maximum(maxc, 1))
    else:
        tpc = _ceil_div(np.maximum(min_traffic, traffic) // np.maximum(maxc, 1), 16) * 16
    cell = _ceil_div(_ceil_div(min_traffic, tpb), 16) * 16
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
    # 2.31+: the call runs on a symmetric kernel (logged "[Symmetric] ... -> Kernel ..."), not on algo/proto;
    # False everywhere for other releases and platforms
    symmetric: np.ndarray | None = None
    # the symmetric kernel's block count where derived; -1 where not derived or not symmetric
    sym_channels: np.ndarray | None = None


def pick(table: np.ndarray, ties_to_higher: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """Smallest non-negative entry of each (7, 3) table; ties to lower algo, then lower proto.

    :param ties_to_higher: 2.31+: an exact tie goes to the higher ``algo * 3 + proto`` (``tuning.cc``
        walks its list in descending id with a strict ``<``), and a time of 0 is not valid
    """
    if ties_to_higher:
        flat = np.where(table > 0, table, np.inf).reshape(table.shape[0], -1)
        last = flat.shape[1] - 1
        best = last - np.argmin(flat[:, ::-1], axis=1)
    else:
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


def symmetric_support(topo: Topology, win_enable: bool = True) -> bool:
    """2.31+: whether NCCL's symmetric kernels compete on this communicator without registered windows.

    ``symmetricSupport`` (init.cc): all GPUs CUDA P2P, ``NCCL_WIN_ENABLE`` (default 1), cuMem (NCCL's
    default) and one LSA team, i.e. one node here; ``ncclSymkAvailable``: all GPUs direct NVLink.
    """
    return (_v231(topo) and win_enable and topo.nodes == 1 and topo.nranks > 1
            and topo.intra.fabric in ("nvswitch", "nvlink"))


def symmetric_calls(topo: Topology, coll: int, table_bw_only: np.ndarray, win_enable: bool = True) -> np.ndarray:
    """2.31+: which calls run on a symmetric LL kernel, from the general cost table at ``numPipeOps = 0``.

    Unregistered buffers allow only the symmetric LL kernels (``sym_model.cc``), and ``tuning.cc`` falls
    back to the general kernels unless a nested general tuning, computed with ``numPipeOps = 0`` (no
    latency term: the time is ``nBytes / bw``), picks LL. LL's bandwidth is below Simple's, so by default
    that never happens (the 2.31.0 logs on 2 x H200: no ``[Symmetric]`` line without a tuner); it does
    when ``NCCL_PROTO`` leaves only LL, or a tuner plugin makes LL the cheapest.

    :param table_bw_only: ``(n, 7, 3)`` the general table at ``numPipeOps = 0`` with the mask applied
    """
    n = table_bw_only.shape[0]
    if coll not in (N.ALLREDUCE, N.ALLGATHER, N.REDUCESCATTER) or not symmetric_support(topo, win_enable):
        return np.zeros(n, dtype=bool)
    ok = np.any(table_bw_only > 0, axis=(1, 2))
    out = np.zeros(n, dtype=bool)
    if np.any(ok):
        _, p = pick(table_bw_only[ok], ties_to_higher=True)
        out[ok] = p == N.LL
    return out


def default_decisions(topo: Topology, coll: int | str, nbytes: np.ndarray | int | list,
                      num_pipe_ops: int = 1, allowed: np.ndarray | None = None,
                      comm_channels: int = 0, model: NcclModel | None = None,
                      ll128_gate: bool | None = None, win_enable: bool = True) -> Decisions:
    """NCCL's default (algorithm, protocol, channels, threads, chunk) for each size.

    :param allowed: optional ``[algo][proto]`` mask, what ``NCCL_ALGO``/``NCCL_PROTO`` leave enabled
    :param comm_channels: the communicator's channel count when forced (``NCCL_MIN/MAX_NCHANNELS``);
        0 keeps the topology's
    :param model: the communicator's latency/bandwidth table when known (NCCL's own, from its
        ``NCCL_DEBUG_SUBSYS=TUNING`` log); ``None`` builds it from the topology
    :param ll128_gate: 2.31+: apply LL128's hardware check (PCIe, socket NIC), which NCCL runs only when
        NCCL_ALGO/NCCL_PROTO name the collective; ``None``: when ``allowed`` is given. Earlier releases
        always apply it (through :func:`eligible_mask`)
    :param win_enable: ``NCCL_WIN_ENABLE`` (2.31+ symmetric kernels on one node; 0 turns them off)
    """
    if isinstance(coll, str):
        coll = N.parse_name("collective", coll, N.COLLECTIVES)
    if num_pipe_ops < 1:
        raise ConfigError("num_pipe_ops", f"must be >= 1, got {num_pipe_ops}")
    sizes = _as_sizes(nbytes)
    if model is None:
        model = build_model(topo)
    elif model.topo != topo:
        raise ConfigError("model", f"the given model is of topology {model.topo.name}, not {topo.name}")
    table = cost_table(model, coll, sizes, num_pipe_ops)
    v231 = _v231(topo)
    if allowed is not None:
        table[:, ~np.asarray(allowed, dtype=bool)] = -1.0
    if v231 and (allowed is not None if ll128_gate is None else ll128_gate) and ll128_hw_gate(topo):
        table[:, :, N.LL128] = -1.0
    algo, proto = pick(table, ties_to_higher=v231)
    sym = np.zeros(sizes.size, dtype=bool)
    if v231 and symmetric_support(topo, win_enable):
        bw_only = _bw_only_table(model, coll, sizes, table)
        sym = symmetric_calls(topo, coll, bw_only, win_enable)
    comm_ch = comm_channels if comm_channels > 0 else model.channels
    maxc, nt = auto_channels(model, sizes, algo, proto, comm_ch)
    nch = scheduled_channels(coll, sizes, proto, maxc, comm_ch, topo.nranks, topo.nccl.version)
    per_ch = sizes // np.maximum(nch, 1)
    chunk = chunk_bytes(topo, coll, algo, proto, per_ch)
    t = table[np.arange(sizes.size), algo, proto]
    return Decisions(coll=coll, nbytes=sizes, algo=algo, proto=proto, max_channels=maxc, channels=nch,
                     nthreads=nt, chunk_bytes=chunk, time_us=t, table=table, symmetric=sym,
                     sym_channels=np.full(sizes.size, -1, dtype=np.int64))


def _bw_only_table(model: NcclModel, coll: int, sizes: np.ndarray, table: np.ndarray) -> np.ndarray:
    """The nested general tuning of 2.31's symmetric path: ``numPipeOps = 0``, so each valid entry is
    ``nBytes / (1000 bw)``; ``nBytes`` is one rank's bytes (``count * typeSize``, no nRanks factor)."""
    nb = data_bytes(coll, sizes, model.topo.nranks)
    bw = np.broadcast_to(model.bandwidths[coll], table.shape).astype(float)
    if coll == N.ALLREDUCE:
        log_size = np.array([_log2i(s >> 6) if (s >> 6) > 0 else -1 for s in nb])
        ok = (log_size >= 0) & (log_size < 23)
        corr = np.ones((nb.size, N.NUM_PROTOS))
        corr[ok] = N.TREE_CORRECTION[:, log_size[ok]].T
        bw = bw.copy()
        bw[:, N.TREE, :] *= corr
    with np.errstate(divide="ignore", invalid="ignore"):
        t = nb[:, None, None] / (1000.0 * bw)
    return np.where((table >= 0) & (bw > 0), t, -1.0)
