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
    LAST_RELEASE,
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
    assert release_model("2.26.2").release == (2, 27, 0) and release_model("2.30.9").release == (2, 30, 9)
    assert release_model("9.99.0").release == LAST_RELEASE >= (2, 30, 99)
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


# -- our NCCL 2.30.7 and 2.31.0 (dev 86fa684d) logs on 2 x H200: ncclrl plugin verify's default job -----------

H200 = {(v, bed): LOGS / f"{bed}-nccl{v}.log" for v in ("2.30.7", "2.31.0") for bed in ("h200-1x2", "h200-2x1-sock")}
# (nodes, coll channels, Input/Best pairs, of them on the symmetric path, enqueue lines, enabled table entries)
H200_FACTS = {("2.30.7", "h200-1x2"): (1, 24, 0, 0, 0, 18), ("2.30.7", "h200-2x1-sock"): (2, 2, 0, 0, 0, 14),
              ("2.31.0", "h200-1x2"): (1, 24, 130, 26, 78, 18), ("2.31.0", "h200-2x1-sock"): (2, 2, 78, 0, 78, 20)}


@pytest.mark.parametrize("key", sorted(H200))
def test_h200_nccl230_231_parse(key):
    """78 per-call lines each; 2.31's table (no Max NThreads row, -1.0 and 0.0 entries) is read whole,
    its Input/Best tuning lines are paired, and no symmetric kernel ran (every symmetric attempt fell back)."""
    version, _ = key
    f = parse_logs([H200[key]])
    nodes, ch, ntun, nsym, nenq, enabled = H200_FACTS[key]
    assert (f.nccl_version, f.nranks, f.nnodes, f.channels) == (version, 2, nodes, ch)
    assert (f.decision_lines, f.symmetric_lines, len(f.decisions)) == (78, 0, 78)
    assert all(d.source == "call" and not d.symmetric and d.coll >= 0 for d in f.decisions)
    assert f.tuning is not None and f.tuning.complete
    assert int(f.tuning.seen.sum()) == 5 * 7 and int((f.tuning.bw_gbps > 0).sum()) == enabled
    assert (f.tuning.bw_gbps >= 0).all() and (f.tuning.lat_us >= 0).all()  # -1.0/-1.0 kept as disabled
    assert len(f.tunings) == ntun and f.tuning_enqueue_lines == nenq and f.tuning_masks_unreadable == 0
    assert sum(1 for t in f.tunings if t.symmetric_mask and not t.nested) == nsym
    assert not any(t.sym_kernel for t in f.tunings)
    if version == "2.31.0":
        assert f.tuning.bw_gbps[N.ALLREDUCE, N.RING, N.SIMPLE] > 0
        assert f.tuning.bw_gbps[N.BROADCAST, N.TREE].max() == 0  # printed -1.0/-1.0
        # the last Best tuning of each call group states what the per-call line states
        assert [(d.coll, d.log_nbytes, d.algo, d.proto) for d in f.tuning_decisions] == \
            [(d.coll, d.log_nbytes, d.algo, d.proto) for d in f.decisions]


@pytest.mark.parametrize("key", sorted(H200))
def test_h200_nccl230_231_agreement(key):
    """With NCCL's logged table the replica's per-call choice reproduces >= 98% of the 78 decisions
    and their channels; the replica's own table is measured beside it."""
    ag = detect([H200[key]], name="x").agreement
    assert ag.model == "tuning table" and ag.points == 78 and ag.sym_points == 0
    assert ag.algo_proto >= 0.98 * ag.points and ag.channels >= 0.98 * ag.channel_points
    assert ag.replica_algo_proto >= 0.9 * ag.points
    assert ag.compared.startswith(f"NCCL {key[0]}: 78 distinct") and "78 general, 0 symmetric" in ag.compared


def test_h200_nccl231_other_ranks_compare_best_tuning(tmp_path):
    """A 2.31 log without per-call lines (what ranks other than 0 print): the last Best tuning of each
    call group is the decision, said so in a note; it agrees as the per-call lines do."""
    text = H200[("2.31.0", "h200-1x2")].read_text()
    p = tmp_path / "rank1.log"
    p.write_text("\n".join(ln for ln in text.splitlines() if "Bytes -> Algo" not in ln) + "\n")
    f = parse_logs([p])
    assert f.decision_lines == 0 and len(f.decisions) == 78
    assert all(d.source == "tuning" and d.max_channels >= 1 for d in f.decisions)
    assert any("last 'Best tuning' of each call group" in n for n in f.notes)
    ag = detect([p], name="x").agreement
    assert ag.points == 78 and ag.algo_proto >= 0.98 * 78 and "no per-call lines" in ag.compared


_SYM_LINES = [
    "h:1:1 [0] NCCL INFO NCCL version 2.31.0a7+cuda13.0",
    "h:1:1 [0] NCCL INFO comm 0x1 rank 0 nRanks 2 nNodes 1 localRanks 2 localRank 0 MNNVL 0",
    "h:1:1 [0] NCCL INFO Input: { .comm = 0x1, .tuningMask = 111111111111111111000000000000000000000, .func = "
    "AllReduce, .redOp = 0, .devRedop = 0, .dataType = 7, .nBytes = 1024, .numPipesOps = 0, .count = 1, "
    ".countMax = 256, .nWorks = 1, .winRegType = 0, .regBuff = 0 }",
    "h:1:1 [0] NCCL INFO Input: { .comm = 0x1, .tuningMask = 111111111111111111111, .func = AllReduce, .redOp = 0, "
    ".devRedop = 0, .dataType = 7, .nBytes = 1024, .numPipesOps = 0, .count = 1, .countMax = 256, .nWorks = 1, "
    ".winRegType = 0, .regBuff = 0 }",
    "h:1:1 [0] NCCL INFO Best tuning { .id = 3, .valid = 1, timeUs = 0.000000,  .algo = RING, .proto = LL, "
    ".symKernelId = Unknown, nChannels = 1, maxChannels = 1, nWarps = 3, forced = 0 }",
    "h:1:1 [0] NCCL INFO Best tuning { .id = 21, .valid = 1, timeUs = 5.138077,  .algo = Unknown, .proto = Unknown, "
    ".symKernelId = AllReduce_AGxLL_R, nChannels = 1, maxChannels = -1, nWarps = 16, forced = 0 }",
    "h:1:1 [0] NCCL INFO AllReduce [Symmetric]: 4 Bytes -> Kernel AllReduce_AGxLL_R nchannels 1 nthreads 512 nWorks 1",
    # glibc < 2.35 prints %lb as is; the fields after it are then shifted
    "h:1:1 [0] NCCL INFO Input: { .comm = 0x1, .tuningMask = %lb, .func = \x01\x02, .redOp = 4242, .devRedop = 0, "
    ".dataType = 77, .nBytes = garbage, .numPipesOps = 1, .count = , .countMax = 0 }",
    "h:1:1 [0] NCCL INFO Best tuning { .id = 5, .valid = 1, timeUs = nan,  .algo = RING, .proto = SIMPLE, "
    ".symKernelId = Unknown, nChannels = 24, maxChannels = 24, nWarps = 17, forced = 0 }",
    "h:1:1 [0] NCCL INFO Best tuning, algorithm, RING, protocol, SIMPLE",
    "h:1:1 [0] NCCL INFO AllReduce: 4194304 Bytes -> Algo RING proto SIMPLE channel{Lo..Hi}={0..23}",
    "h:1:1 [0] NCCL INFO AllReduce: 8 Bytes -> Algo FUTURE_ALGO proto LL channel{Lo..Hi}={0..0}",
    "h:1:1 [0] NCCL INFO Best tuning { .id = 5, .valid",
    "h:1:1 [0] NCCL INFO Input: {",
    "h:1:1 [0] NCCL INFO     AllReduce |    -1.0/  -1.0 |     0.0/   0.0 |    11.4/ 240.0 |",
]


def test_symmetric_and_malformed_tuning_lines(tmp_path):
    p = tmp_path / "sym.log"
    p.write_text("\n".join(_SYM_LINES) + "\n")
    f = parse_logs([p])
    assert f.symmetric_lines == 1 and f.decision_lines == 2
    sym = [d for d in f.decisions if d.symmetric]
    assert [(d.coll, d.log_nbytes, d.kernel, d.channels, d.algo) for d in sym] == \
        [(N.ALLREDUCE, 4, "AllReduce_AGxLL_R", 1, -1)]
    assert len(f.decisions) == 2 and any("FUTURE_ALGO" in n for n in f.notes)  # unknown name: kept out
    assert f.tuning_masks_unreadable == 2 and any("%lb" in n for n in f.notes)  # %lb and the cut line
    outer = [t for t in f.tunings if not t.nested]
    assert [t.sym_kernel for t in outer] == ["AllReduce_AGxLL_R", "", ""]  # the cut Best line: a third
    assert outer[0].symmetric_mask and outer[0].log_nbytes == 4 and outer[0].nchannels == 1
    assert outer[1].mask is None and outer[1].coll == -1 and outer[1].log_nbytes == -1
    # the symmetric group's decision; the garbled group's names no collective and is left out
    assert [(d.symmetric, d.kernel, d.log_nbytes) for d in f.tuning_decisions] == [(True, "AllReduce_AGxLL_R", 4)]


def test_symmetric_decisions_count(monkeypatch):
    """A symmetric-kernel decision is reproduced where the replica's decision says ``symmetric`` at that
    (collective, size); a general one only where it does not. No ``symmetric`` field: none reproduced."""
    import types

    from ncclrl.costmodel import detect as D

    f = parse_logs([H200[("2.31.0", "h200-1x2")]])
    topo = detect([H200[("2.31.0", "h200-1x2")]], name="x", search=False).topology
    small = next(d for d in f.decisions if d.coll == N.ALLREDUCE and d.log_nbytes == 4)
    f.decisions[f.decisions.index(small)] = replace(small, algo=-1, proto=-1, symmetric=True,
                                                    kernel="AllReduce_AGxLL_R")
    real = D.default_decisions

    def with_sym(flag):
        def dd(*a, **kw):
            dec = real(*a, **kw)
            ns = types.SimpleNamespace(**{k: getattr(dec, k) for k in dec.__dataclass_fields__})
            if flag is not None:
                ns.symmetric = (ns.nbytes <= 4) & flag if ns.coll == N.ALLREDUCE else np.zeros(ns.nbytes.shape, bool)
            elif hasattr(ns, "symmetric"):
                del ns.symmetric
            return ns
        return dd

    monkeypatch.setattr(D, "default_decisions", with_sym(True))
    ag = agreement(topo, f)
    assert (ag.sym_points, ag.sym_match, ag.replica_sym_match, ag.points) == (1, 1, 1, 78)
    assert ag.replica_says_symmetric and ag.algo_proto == 78
    monkeypatch.setattr(D, "default_decisions", with_sym(None))
    ag = agreement(topo, f)
    assert (ag.sym_points, ag.sym_match, ag.replica_says_symmetric, ag.algo_proto) == (1, 0, False, 77)
    assert any("does not say symmetric" in m for m in ag.mismatches)
    # the replica saying symmetric where NCCL ran a general kernel is a miss
    f.decisions[f.decisions.index(replace(small, algo=-1, proto=-1, symmetric=True,
                                          kernel="AllReduce_AGxLL_R"))] = small
    monkeypatch.setattr(D, "default_decisions", with_sym(True))
    ag = agreement(topo, f)
    assert ag.sym_points == 0 and ag.algo_proto == 77


# -- 2 x H200, NCCL 2.28.9 to 2.31.0: the GPU architecture from NCCL's tuning table ------------------

H200_ALL = {(v, bed): LOGS / f"{bed}-nccl{v}.log" for v in ("2.28.9", "2.29.7", "2.30.7", "2.31.0")
            for bed in ("h200-1x2", "h200-2x1-sock")}


@pytest.mark.parametrize("version", ["2.28.9", "2.29.7", "2.30.7", "2.31.0"])
def test_h200_one_node_arch_inferred_from_tuning_table(version):
    """The log names no GPU; one node's Ring/LL (141 GB/s, under half of Ring/Simple's 360) is Hopper's
    llMaxBw, and Tree/Simple AllReduce 232.2 GB/s is 12 channels x Hopper's 38.7 GB/s Tree cap: detect
    says so and starts from the Hopper one-node preset."""
    from ncclrl.costmodel.detect import report

    det = detect([H200_ALL[(version, "h200-1x2")]], name="x")
    f = det.facts
    assert f.gpu_model is None and f.gpu_arch == "hopper"
    assert f.gpu_arch_source.startswith("inferred from NCCL's tuning table: ")
    assert "llMaxBw" in f.gpu_arch_source and "12 channels x 38.7 GB/s" in f.gpu_arch_source
    assert det.preset == "h200-1x4" and det.topology.gpu_arch == "hopper"
    assert det.filled["gpu.arch"].startswith("inferred from NCCL's tuning table")
    assert any(line.startswith("gpu_arch: hopper (inferred from NCCL's tuning table: ") for line in report(det))


@pytest.mark.parametrize("version", ["2.28.9", "2.29.7", "2.30.7", "2.31.0"])
def test_h200_socket_arch_not_determined_by_tuning_table(version):
    """Across 2 nodes over a socket no per-compute-capability constant binds (0.6-2.4 GB/s entries):
    the architecture stays unknown, said so, and comes from the preset."""
    from ncclrl.costmodel.detect import report

    det = detect([H200_ALL[(version, "h200-2x1-sock")]], name="x")
    f = det.facts
    assert f.gpu_arch is None and "does not determine it" in f.gpu_arch_unknown
    assert det.preset == "h200-2x1-sock" and det.topology.gpu_arch == "hopper"
    line = next(ln for ln in report(det) if ln.startswith("gpu_arch:"))
    assert "not in the log" in line and "hopper from the preset" in line


@pytest.mark.parametrize("arch", ["volta", "ampere", "hopper", "blackwell"])
def test_arch_inferred_from_the_replicas_own_table(arch):
    """A table built by the replica for each architecture (one node of 8, caps binding) gives that architecture back."""
    from ncclrl.costmodel.detect import LogFacts, TuningTable, infer_arch_from_table

    base = load_topology("h200-1x4")
    t = replace(base, gpu_arch=arch, gpus_per_node=8, intra=replace(base.intra, channel_bw_gbps=40.0),
                nccl=replace(base.nccl, version="2.30.7", nvls=False, channels=16))
    m = build_model(t)
    seen = np.zeros((5, N.NUM_ALGOS), dtype=bool)
    seen[:, :] = True
    f = LogFacts(nranks=8, nnodes=1, channels=16, nccl_version="2.30.7",
                 tuning=TuningTable(lat_us=np.round(m.latencies, 1), bw_gbps=np.round(m.bandwidths, 1), seen=seen))
    got, why = infer_arch_from_table(f)
    assert got == arch, why
    # across nodes llMaxBw follows the CPU vendor, and 0.5 GB/s channels leave every cap unbound
    slow = replace(t, nodes=2, gpus_per_node=1, intra=replace(t.intra, channel_bw_gbps=0.5),
                   net=replace(t.net, kind="socket", nics_per_node=1, nic_bw_gbps=25.0, channel_bw_gbps=0.5))
    ms = build_model(slow)
    g = LogFacts(nranks=2, nnodes=2, channels=16, nccl_version="2.30.7",
                 tuning=TuningTable(lat_us=np.round(ms.latencies, 1), bw_gbps=np.round(ms.bandwidths, 1), seen=seen))
    assert infer_arch_from_table(g)[0] is None


@pytest.mark.parametrize("key", sorted(H200_ALL))
def test_h200_agreement_floors_all_releases(key):
    """NCCL's logged table reproduces all 78 decisions and their channels on every release and bed; the
    replica's own table (Hopper inferred, the per-channel bandwidths fitted: from 2.31 the inter-node one
    on 2 nodes too, Ring's busBw being bwInter there) reproduces >= 98% of them."""
    ag = detect([H200_ALL[key]], name="x").agreement
    assert ag.model == "tuning table" and ag.points == 78
    assert ag.algo_proto == ag.points and ag.channels == ag.channel_points == 78
    assert ag.replica_algo_proto >= 0.98 * ag.points and ag.replica_channels >= 0.98 * ag.channel_points
    assert ag.grid_match >= 0.98 * ag.grid_points


def test_h200_nccl231_socket_fits_the_inter_node_bandwidth():
    """2.31 Ring on 2 nodes runs at bwInter: the fit sets net.channel_bw_gbps to the log's 0.6 GB/s per channel,
    Broadcast/Reduce 8 KiB go Ring/Simple as NCCL's did, and every enabled table entry matches."""
    det = detect([H200_ALL[("2.31.0", "h200-2x1-sock")]], name="x")
    ag = det.agreement
    assert det.topology.net.channel_bw_gbps == pytest.approx(0.6)
    assert "net.channel_bw_gbps" in det.searched
    assert ag.replica_algo_proto == 78 and ag.table_match == ag.table_entries == 20
    assert not any("8192 B" in m for m in ag.mismatches)
