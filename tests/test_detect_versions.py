"""``ncclrl detect`` on NCCL 2.29 logs, the replica's release rules (2.27-2.30), host names read
from interleaved output, and NCCL's own tuning table as the communicator's model."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from ncclrl.costmodel import nccl as N
from ncclrl.costmodel.detect import _with, agreement, detect, parse_logs, tuning_model
from ncclrl.costmodel.errors import ConfigError
from ncclrl.costmodel.replica import (
    build_model,
    cost_table,
    default_decisions,
    nvls_graph,
    release_model,
    scheduled_channels,
)
from ncclrl.costmodel.topology import load_topology

LOGS = Path(__file__).resolve().parent / "data" / "nccl-logs"
H100_229 = {n: LOGS / f"h100-1x{n}-nccl2.29.2.log" for n in (2, 4, 6)}
HOST = "38dcf168f605"


# -- public NCCL 2.29.2 logs (H100 SXM, one node, NVLS on) -------------------------------------------


@pytest.mark.parametrize("ngpus", [2, 4, 6])
def test_h100_nccl229_decisions_reproduced(ngpus):
    """NCCL chose Ring/Simple at 256 MiB-8 GiB on 2 and 4 GPUs and NVLS on 6: the replica's own
    table (NVLS on its own graph: one channel per GPU) and NCCL's logged table both reproduce
    all 6 logged decisions and their channels."""
    det = detect([H100_229[ngpus]], name=f"h100-1x{ngpus}")
    f, t, ag = det.facts, det.topology, det.agreement
    assert (f.nccl_version, f.nranks, f.nnodes, t.nccl.version) == ("2.29.2", ngpus, 1, "2.29.2")
    assert t.nccl.nvls and t.gpu_arch == "hopper"
    assert ag.model == "tuning table"
    assert (ag.points, ag.algo_proto, ag.channel_points, ag.channels) == (6, 6, 6, 6)
    assert (ag.replica_algo_proto, ag.replica_channels) == (6, 6)
    want = N.NVLS if ngpus == 6 else N.RING
    assert {(d.algo, d.proto) for d in f.decisions} == {(want, N.SIMPLE)}
    assert ag.grid_match == ag.grid_points == 140


def test_h100_nccl229_nvls_entries_match_nccls_table():
    """The replica's NVLS AllReduce/AllGather bandwidths equal what NCCL printed for 2, 4 and 6 GPUs."""
    for ngpus in (2, 4, 6):
        det = detect([H100_229[ngpus]], name="x", search=False)
        rep, log = build_model(det.topology), det.facts.tuning
        for c in (N.ALLREDUCE, N.ALLGATHER, N.REDUCESCATTER):
            assert rep.bandwidths[c, N.NVLS, N.SIMPLE] == pytest.approx(log.bw_gbps[c, N.NVLS, N.SIMPLE], abs=0.051)
            assert rep.latencies[c, N.NVLS, N.SIMPLE] == pytest.approx(log.lat_us[c, N.NVLS, N.SIMPLE], abs=0.051)


def test_nvls_graph_follows_nccls_search():
    base = load_topology("h200-1x4")
    hopper = replace(base, gpu_arch="hopper", nccl=replace(base.nccl, nvls=True))
    got = {n: nvls_graph(replace(hopper, gpus_per_node=n)) for n in (2, 4, 6, 8)}
    # (nGPUs + 1) x speed within 18 x 20.6 GB/s; bwInter raised while below 2 x bwIntra
    assert got == {2: (2, 60.0, 60.0), 4: (4, 60.0, 60.0), 6: (6, 50.0, 60.0), 8: (8, 40.0, 60.0)}
    assert nvls_graph(replace(hopper, intra=replace(hopper.intra, link_bw_gbps=0.1)))[0] == 0


# -- host names --------------------------------------------------------------------------------------


def test_host_names_from_glued_lines():
    """nccl-tests' root column ``-1`` and ``#wrong`` ``0`` run into NCCL's next prefix on one line:
    the host is still 38dcf168f605, not -138dcf168f605 or 038dcf168f605."""
    f = parse_logs([H100_229[4]])
    text = H100_229[4].read_text()
    assert f"-1{HOST}:" in text and f"0{HOST}:" in text
    assert f.hosts == {HOST} and f.nnodes == 1
    assert not any("host name" in n for n in f.notes)


def test_host_names_prefixes_and_glued_only(tmp_path):
    lines = [
        "[1,0]<stdout>:node-a:11:12 [0] NCCL INFO NCCL version 2.29.2+cuda12.8",
        "[rank1]:node-b:21:22 [0] NCCL INFO comm 0x1 rank 1 nRanks 2 nNodes 2 localRanks 1 localRank 0 MNNVL 0",
        "[2026-05-05 06:16:47] node-a:11:12 [0] NCCL INFO comm 0x2 rank 0 nRanks 2 nNodes 2 localRanks 1 "
        "localRank 0 MNNVL 0",
        "   1048576   262144  float  sum  -1node-b:21:21 [0] NCCL INFO AllReduce: 1048576 Bytes -> Algo RING "
        "proto LL channel{Lo..Hi}={0..1}",
    ]
    p = tmp_path / "mixed.log"
    p.write_text("\n".join(lines) + "\n")
    f = parse_logs([p])
    assert f.hosts == {"node-a", "node-b"}
    assert len(f.decisions) == 1 and f.decisions[0].log_nbytes == 1048576
    # no host ever starts a line: the glued token is kept without what no host name starts with
    q = tmp_path / "glued.log"
    q.write_text("   8   2  float  sum  -1gpu7:5:5 [0] NCCL INFO AllReduce: 8 Bytes -> Algo RING proto LL\n")
    g = parse_logs([q])
    assert g.hosts == {"1gpu7"} and any("'1gpu7'" in n for n in g.notes)


# -- NCCL's own tuning table as the communicator's model ---------------------------------------------


def test_tuning_table_model_gives_nccls_numbers():
    f = parse_logs([H100_229[6]])
    topo = detect([H100_229[6]], name="x", search=False).topology
    model = tuning_model(topo, f)
    assert np.array_equal(model.bandwidths, f.tuning.bw_gbps) and np.array_equal(model.latencies, f.tuning.lat_us)
    sizes = np.array([1 << 20, 256 << 20])
    dec = default_decisions(topo, N.ALLREDUCE, sizes, model=model)
    bw, lat = f.tuning.bw_gbps[N.ALLREDUCE], f.tuning.lat_us[N.ALLREDUCE]
    for i, s in enumerate(sizes):  # NCCL's predicted time of its own table's winner
        a, p = dec.algo[i], dec.proto[i]
        assert dec.time_us[i] == pytest.approx(lat[a, p] + s / (1000 * bw[a, p]))
    assert np.array_equal(cost_table(model, N.ALLREDUCE, sizes), dec.table)
    with pytest.raises(ConfigError, match="model"):
        default_decisions(replace(topo, gpus_per_node=4), N.ALLREDUCE, sizes, model=model)


def test_tuning_table_decides_where_the_constants_do_not():
    """With a per-channel bandwidth the log contradicts, the replica's own table picks Ring where
    NCCL picked NVLS; NCCL's logged table still reproduces every decision."""
    f = parse_logs([H100_229[6]])
    topo = detect([H100_229[6]], name="x", search=False).topology
    wrong = _with(topo, intra={"channel_bw_gbps": 60.0})
    ag = agreement(wrong, f)
    assert ag.model == "tuning table" and (ag.algo_proto, ag.channels) == (6, 6)
    assert ag.replica_algo_proto == 0
    assert any("replica ring/simple" in m for m in ag.mismatches)


def test_tuning_table_rows_between_other_threads_lines(tmp_path):
    """Another thread's line (``threadThresholds 8/8/64 | ...``) between the table's rows."""
    lines = H100_229[4].read_text().splitlines()
    at = next(i for i, ln in enumerate(lines) if "NCCL INFO  Max NThreads" in ln) + 1
    lines.insert(at, f"{HOST}:1391:1402 [3] NCCL INFO threadThresholds 8/8/64 | 32/8/64 | 512 | 512")
    p = tmp_path / "interleaved.log"
    p.write_text("\n".join(lines) + "\n")
    f = parse_logs([p])
    assert f.tuning is not None and f.tuning.complete
    assert f.tuning.bw_gbps[N.ALLREDUCE, N.RING, N.SIMPLE] == 240.0


# -- release rules ------------------------------------------------------------------------------------


def test_release_model_versions():
    bw = N.COMPCAP_ROWS["blackwell"]
    ring_ll128 = {v: tuple(release_model(v).per_ch_max_ring_ll128_bw[bw]) for v in
                  ("2.27.7", "2.28.3", "2.28.9", "2.29.2", "2.29.7", "2.30.7")}
    assert ring_ll128 == {"2.27.7": (73.4, 73.4, 73.4), "2.28.3": (73.4, 73.4, 73.4), "2.28.9": (73.4, 34.6, 73.4),
                          "2.29.2": (34.5, 34.6, 34.5), "2.29.7": (40.0, 40.0, 40.0), "2.30.7": (40.0, 40.0, 40.0)}
    assert release_model("2.30.7").per_ch_max_nvls_tree_bw[bw, 2] == 80.0
    assert release_model("2.29.7").per_ch_max_nvls_tree_bw[bw, 2] == 43.8
    assert release_model("2.26.2").release == (2, 27, 0) and release_model("2.31.1").release == (2, 30, 99)
    assert release_model("2.29.2+cuda12.8").min_traffic_per_channel == 32 << 10
    assert release_model("2.28.9").min_traffic_per_channel == 16 << 10
    # Hopper's table is the same from 2.28 to 2.30
    for table in ("per_ch_max_ring_ll128_bw", "per_ch_max_tree_bw", "per_ch_max_nvls_tree_bw"):
        rows = {tuple(getattr(release_model(v), table)[N.COMPCAP_ROWS["hopper"]]) for v in ("2.28.9", "2.30.7")}
        assert len(rows) == 1
    with pytest.raises(ConfigError, match="nccl.version"):
        release_model("2.x")


def test_blackwell_ring_ll128_follows_the_release():
    t = load_topology("h200-1x4")
    bw = replace(t, gpu_arch="blackwell", intra=replace(t.intra, channel_bw_gbps=60.0))
    got = {v: build_model(replace(bw, nccl=replace(bw.nccl, version=v))).bandwidths[N.ALLREDUCE, N.RING, N.LL128]
           for v in ("2.28.9", "2.29.2", "2.29.7")}
    ch, nr = bw.nccl.channels, bw.nranks
    ratio = nr / (2 * (nr - 1))
    assert got["2.28.9"] == pytest.approx(ch * 60.0 * 0.92 * ratio)  # below the 73.4 cap
    assert got["2.29.2"] == pytest.approx(ch * 34.5 * ratio)
    assert got["2.29.7"] == pytest.approx(ch * 40.0 * ratio)


def test_scheduler_cells_from_229():
    """32 KiB cells from 2.29: a 16 KiB AllReduce runs on one channel, on two before."""
    sizes = np.array([16 << 10, 1 << 20])
    simple = np.full(sizes.shape, N.SIMPLE)
    old = scheduled_channels(N.ALLREDUCE, sizes, simple, np.full(sizes.shape, 24), 24, 4, "2.28.9")
    new = scheduled_channels(N.ALLREDUCE, sizes, simple, np.full(sizes.shape, 24), 24, 4, "2.29.2")
    assert tuple(old) == (2, 22) and tuple(new) == (1, 22)
    assert tuple(scheduled_channels(N.ALLREDUCE, sizes, simple, np.full(sizes.shape, 24), 24, 4)) == tuple(old)


def test_search_fits_the_replica_when_nccls_table_already_agrees():
    """NCCL's table reproduces every decision whatever the topology; the search of the free
    per-channel bandwidth still runs for the replica's own table (started 4x off, it gets back)."""
    f = parse_logs([H100_229[6]])
    from ncclrl.costmodel.detect import apply_facts, fit_free_fields, nearest_preset

    topo, filled = apply_facts(load_topology(nearest_preset(f)[0]), f, "x")
    off = _with(topo, intra={"channel_bw_gbps": 60.0})
    best, ag, searched = fit_free_fields(off, f, filled)
    assert searched and ag.replica_algo_proto == 6 and ag.table_match == ag.table_entries
    assert best.intra.channel_bw_gbps != 60.0


def test_nvls_bandwidth_of_227():
    """2.27: NVLS AllReduce ``nChannels * min(bwIntra, bwInter) * 5/6``, AllGather without the ratio."""
    det = detect([H100_229[4]], name="x", search=False)
    t = replace(det.topology, nccl=replace(det.topology.nccl, version="2.27.7"))
    m = build_model(t)
    assert m.bandwidths[N.ALLREDUCE, N.NVLS, N.SIMPLE] == pytest.approx(4 * 60.0 * 5 / 6)
    assert m.bandwidths[N.ALLGATHER, N.NVLS, N.SIMPLE] == pytest.approx(4 * min(60.0 * 3 / 4, 60.0 * 0.9))
