"""The replica's release rules for NCCL 2.31 (and 2.32, modelled as 2.31), against NCCL's logs and sources.

The logs (tests/data/nccl-logs/h200-*-nccl2.3*.log) are rank 0 of 2 x H200 runs without a tuner
plugin: one node x 2 GPUs over NVLink (NVLS off, 24 channels), and 2 emulated nodes x 1 GPU over
loopback sockets (2 channels, ring and tree graphs of 0.6 GB/s per channel, the plain tree pattern).
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import numpy as np
import pytest

from ncclrl.costmodel import nccl as N
from ncclrl.costmodel.replica import (
    LAST_RELEASE,
    build_model,
    default_decisions,
    eligible_mask,
    pick,
    release_model,
    scheduled_channels,
    symmetric_support,
)
from ncclrl.costmodel.topology import load_topology

LOGS = Path(__file__).parent / "data" / "nccl-logs"
REPO = Path(__file__).resolve().parents[1]
LOG = re.compile(r"(\w+)( \[Symmetric\])?: (\d+) Bytes -> "
                 r"(?:Algo (\w+) proto (\w+) channel\{Lo\.\.Hi\}=\{(\d+)\.\.(\d+)\}"
                 r"|Kernel (\w+) nchannels (\d+))")


def _with_version(t, ver, **nccl):
    return t.with_nccl(version=ver, **nccl)


def bed(name: str, ver: str):
    """The topology each log implies."""
    if name == "h200-1x2":
        return _with_version(load_topology(str(REPO / "data/h200x2-2026-11-28/versions/h200-1x2.yaml")), ver)
    t = load_topology("h200-2x1-sock")
    t = dataclasses.replace(t, intra=dataclasses.replace(t.intra, channel_bw_gbps=0.6),
                            net=dataclasses.replace(t.net, channel_bw_gbps=0.6))
    return _with_version(t, ver, tree_pattern="tree")


def _table_rows(path: Path) -> dict[str, list[tuple[float, float]]]:
    """Rank 0's tuning table: collective -> the (latency, bandwidth) pairs of its rows, in order."""
    rows: dict[str, list[tuple[float, float]]] = {}
    for line in path.read_text().splitlines():
        m = re.search(r"INFO +(Broadcast|Reduce|AllGather|ReduceScatter|AllReduce) \|(.*)", line)
        if m:
            pairs = re.findall(r"(-?[\d.]+)/ *(-?[\d.]+)", m[2])
            rows.setdefault(m[1], []).extend((float(a), float(b)) for a, b in pairs)
    return rows


@pytest.mark.parametrize("ver", ["2.30.7", "2.31.0"])
@pytest.mark.parametrize("name", ["h200-1x2", "h200-2x1-sock"])
def test_every_logged_decision(name, ver):
    """Every logged (collective, size): same symmetric flag, algorithm, protocol and channel count."""
    t = bed(name, ver)
    n = ok = 0
    bad = []
    for line in (LOGS / f"{name}-nccl{ver}.log").read_text().splitlines():
        m = LOG.search(line)
        if not m:
            continue
        c = N.COLL_LOG_NAMES[m[1]]
        b = int(m[3])
        d = default_decisions(t, c, [b * t.nranks if c in (N.ALLGATHER, N.REDUCESCATTER) else b])
        got = (bool(d.symmetric[0]), N.ALGOS[d.algo[0]], N.PROTOS[d.proto[0]], int(d.channels[0]))
        want = (bool(m[2]), (m[4] or "").lower(), (m[5] or "").lower(), int(m[7]) - int(m[6]) + 1 if m[6] else -1)
        n += 1
        ok += got == want
        if got != want:
            bad.append((m[0], got))
    assert n == 78
    print(f"{name} NCCL {ver}: {ok}/{n}")
    assert not bad


def test_sock_table_2_31_matches_log():
    """2.31 on 2 nodes x 1 GPU: Ring Broadcast/Reduce hops at the PCI figures (graph typeIntra is not
    NVLink with one GPU per node), Ring's own network latency, LL128 no longer gated over sockets."""
    t = bed("h200-2x1-sock", "2.31.0")
    m = build_model(t)
    rows = _table_rows(LOGS / "h200-2x1-sock-nccl2.31.0.log")
    for name in ("Broadcast", "Reduce", "AllGather", "ReduceScatter", "AllReduce"):
        c = N.COLL_LOG_NAMES[name]
        for a in (N.TREE, N.RING):
            for p in range(3):
                lat, bw = rows[name][a * 3 + p]
                if bw < 0:
                    assert m.bandwidths[c, a, p] == 0
                    continue
                assert (round(m.latencies[c, a, p], 1), round(m.bandwidths[c, a, p], 1)) == (lat, bw), (name, a, p)
    # 2.30 on the same bed: LL128 gated (socket NIC), Broadcast hop at the NET latency
    m30 = build_model(bed("h200-2x1-sock", "2.30.7"))
    assert m30.bandwidths[N.BROADCAST, N.RING, N.LL128] == 0
    assert round(m30.latencies[N.BROADCAST, N.RING, N.LL], 1) == 9.3
    assert round(m.latencies[N.BROADCAST, N.RING, N.LL], 1) == 7.6


def test_release_2_31_and_2_32():
    assert LAST_RELEASE[:2] == (2, 32)
    assert release_model("2.31.0").tuning_v231 and release_model("2.32.1").tuning_v231
    assert release_model("2.32.1").release == (2, 32, 1)
    assert release_model("2.33.0").release == LAST_RELEASE
    for v in ("2.27.7", "2.28.9", "2.29.7", "2.30.7"):
        assert not release_model(v).tuning_v231




def _presets():
    from ncclrl.costmodel.topology import preset_names
    return preset_names()


def test_ring_inter_latency_and_pat_latency_ppn1():
    """ppn == 1: Ring's inter-node hop is hwLat[NET][RING] (2.7/4.0/14) in 2.31, hwLat[NET][TREE] before;
    PAT adds latencyInter once in 2.31 (twice before)."""
    base = load_topology("h200-2x1-sock")
    base = dataclasses.replace(base, net=dataclasses.replace(base.net, latency_us=5.0))
    m30, m31 = build_model(_with_version(base, "2.30.7")), build_model(_with_version(base, "2.31.0"))
    # AllReduce on 2 nodes x 1 GPU: 2 inter steps of (hwLat + latencyInter), Simple twice latencyInter
    ll30 = m30.latencies[N.ALLREDUCE, N.RING, N.LL] - N.BASE_LAT_US[N.RING, N.LL]
    ll31 = m31.latencies[N.ALLREDUCE, N.RING, N.LL] - N.BASE_LAT_US[N.RING, N.LL]
    assert ll30 == pytest.approx(2 * (5.0 + 5.0)) and ll31 == pytest.approx(2 * (2.7 + 5.0))
    if m31.bandwidths[N.ALLGATHER, N.PAT, N.SIMPLE] > 0:
        d = m30.latencies[N.ALLGATHER, N.PAT, N.SIMPLE] - m31.latencies[N.ALLGATHER, N.PAT, N.SIMPLE]
        assert d == pytest.approx(5.0 / 3.5)


def test_tree_bw_min_on_two_nodes():
    """2.31 tree.cc: Tree busBw min(bwInter, bwIntra); 2.30 took bwIntra on 2 nodes."""
    t = load_topology("h200-2x1-sock")
    t = dataclasses.replace(t, intra=dataclasses.replace(t.intra, channel_bw_gbps=2.0),
                            net=dataclasses.replace(t.net, channel_bw_gbps=1.0))
    b30 = build_model(_with_version(t, "2.30.7")).bandwidths[N.ALLREDUCE, N.TREE, N.SIMPLE]
    b31 = build_model(_with_version(t, "2.31.0")).bandwidths[N.ALLREDUCE, N.TREE, N.SIMPLE]
    assert b31 == pytest.approx(b30 / 2)
    # Ring: bwInter on several nodes in 2.31, bwIntra on 2 nodes before
    r30 = build_model(_with_version(t, "2.30.7")).bandwidths[N.ALLREDUCE, N.RING, N.SIMPLE]
    r31 = build_model(_with_version(t, "2.31.0")).bandwidths[N.ALLREDUCE, N.RING, N.SIMPLE]
    assert r31 == pytest.approx(r30 / 2)


def test_nvls_tree_unavailable_in_2_31():
    """2.31: the NVLS Tree model reads comm->graphs[NVLS_TREE], which init.cc never fills."""
    t = load_topology("p5en-2n")
    assert eligible_mask(_with_version(t, "2.30.7"))[N.ALLREDUCE, N.NVLS_TREE, N.SIMPLE]
    for ver in ("2.31.0", "2.32.0"):
        tv = _with_version(t, ver)
        assert not eligible_mask(tv)[N.ALLREDUCE, N.NVLS_TREE, N.SIMPLE]
        assert (default_decisions(tv, N.ALLREDUCE, [1 << 10, 1 << 20, 1 << 30]).algo != N.NVLS_TREE).all()


def test_ll128_gate_only_when_forced():
    t31 = bed("h200-2x1-sock", "2.31.0")
    assert eligible_mask(t31)[N.ALLREDUCE, N.RING, N.LL128]
    assert not eligible_mask(bed("h200-2x1-sock", "2.30.7"))[N.ALLREDUCE, N.RING, N.LL128]
    allowed = np.ones((N.NUM_ALGOS, N.NUM_PROTOS), bool)
    allowed[:, N.SIMPLE] = False  # NCCL_PROTO=LL,LL128
    d = default_decisions(t31, N.ALLREDUCE, [1 << 24], allowed=allowed)
    assert d.proto[0] == N.LL  # the hardware gate applies under NCCL_PROTO
    d = default_decisions(t31, N.ALLREDUCE, [1 << 24], allowed=allowed, ll128_gate=False)
    assert d.proto[0] == N.LL128


def test_ties_and_ring_simple_threads():
    table = np.full((1, N.NUM_ALGOS, N.NUM_PROTOS), -1.0)
    table[0, N.TREE, N.SIMPLE] = table[0, N.RING, N.SIMPLE] = 3.0
    assert pick(table) == (N.TREE, N.SIMPLE)
    assert tuple(int(x[0]) for x in pick(table, ties_to_higher=True)) == (N.RING, N.SIMPLE)
    t = bed("h200-2x1-sock", "2.30.7")  # 2 channels x 0.6 GB/s <= PCI bandwidth: 256 threads before 2.31
    assert build_model(t).max_threads[N.RING, N.SIMPLE] == 256
    assert build_model(bed("h200-2x1-sock", "2.31.0")).max_threads[N.RING, N.SIMPLE] == 512


def test_symmetric_kernels_2_31():
    """2.31 on one NVLink node: symmetric LL kernels replace the general choice only where a nested
    general tuning with numPipeOps = 0 (bandwidth only) picks LL; by default Simple always wins there
    (the logs without a plugin have no [Symmetric] line), with NCCL_PROTO=LL it is LL."""
    t31, t30 = bed("h200-1x2", "2.31.0"), bed("h200-1x2", "2.30.7")
    assert symmetric_support(t31) and not symmetric_support(t30)
    assert not symmetric_support(t31, win_enable=False)
    assert not symmetric_support(bed("h200-2x1-sock", "2.31.0"))
    sizes = [4, 4096, 1 << 20, 1 << 28]
    for c in (N.ALLREDUCE, N.ALLGATHER, N.REDUCESCATTER, N.BROADCAST):
        assert not default_decisions(t31, c, sizes).symmetric.any()
        assert not default_decisions(t30, c, sizes).symmetric.any()
    only_ll = np.zeros((N.NUM_ALGOS, N.NUM_PROTOS), bool)
    only_ll[:, N.LL] = True
    assert default_decisions(t31, N.ALLREDUCE, sizes, allowed=only_ll).symmetric.all()
    assert not default_decisions(t31, N.ALLREDUCE, sizes, allowed=only_ll, win_enable=False).symmetric.any()
    assert not default_decisions(t31, N.BROADCAST, sizes, allowed=only_ll).symmetric.any()
    assert not default_decisions(t30, N.ALLREDUCE, sizes, allowed=only_ll).symmetric.any()


def test_forced_tree_ll128_channels_follow_the_release_scheduler():
    """NCCL 2.30.7 on 1 x 2 H200, Tree/LL128 forced with NCCL's own channel count: the log shows 2
    channels at 32768 B and 8 at 131068 B (32 KiB cells from 2.29); 2.28's scheduler gives 4 and 16."""
    only = np.zeros((N.NUM_ALGOS, N.NUM_PROTOS), bool)
    only[N.TREE, N.LL128] = True
    for ver, want in (("2.30.7", [1, 2, 8]), ("2.31.0", [1, 2, 8]), ("2.28.9", [1, 4, 16])):
        d = default_decisions(bed("h200-1x2", ver), N.ALLREDUCE, [8192, 32768, 131068], allowed=only)
        assert d.channels.tolist() == want, ver
        assert scheduled_channels(N.ALLREDUCE, d.nbytes, d.proto, d.max_channels, 24, 2, ver).tolist() == want
