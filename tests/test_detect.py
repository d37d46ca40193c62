"""``ncclrl detect``: real NCCL INFO logs to a topology whose replica reproduces NCCL's decisions."""

from __future__ import annotations

import csv
import io
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from ncclrl.costmodel import nccl as N
from ncclrl.costmodel.detect import agreement, detect, parse_logs
from ncclrl.costmodel.errors import ConfigError
from ncclrl.costmodel.replica import build_model
from ncclrl.costmodel.topology import dump_topology, load_topology
from ncclrl.runners.cli import main

REPO = Path(__file__).resolve().parents[1]
H200X2 = [REPO / "data" / "h200x2-2026-11-22" / "run1" / "nccl-info" / f"vm.{pid}.log" for pid in (624, 625)]
A800 = REPO / "tests" / "data" / "nccl-logs" / "a800-2x8-roce-nccl2.10.log"


@pytest.fixture(scope="module")
def h200x4_log(h200_data: Path) -> Path:
    return h200_data / "nccl_decisions_1node_4gpu.log"


def run(capsys, monkeypatch, argv, stdin=None):
    if stdin is not None:
        monkeypatch.setattr(sys, "stdin", io.StringIO(stdin))
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


# -- what the logs state -----------------------------------------------------------------------------


def test_h200x4_decision_log_facts(h200x4_log):
    f = parse_logs([h200x4_log])
    assert (f.nccl_version, f.nranks, f.nnodes, f.local_ranks) == ("2.28.9", 4, 1, 4)
    assert (f.channels, f.collnet_channels, f.nvls_channels, f.p2p_channels) == (24, 24, 0, 32)
    assert f.gpu_model is None and f.gpu_arch is None  # the log does not name the GPU: no guess
    assert f.tuning is None and f.net_kind is None and not f.hosts
    assert f.decision_lines == 101 and len({(d.coll, d.log_nbytes) for d in f.decisions}) == 101
    ar_4m = next(d for d in f.decisions if d.coll == N.ALLREDUCE and d.log_nbytes == 4194304)
    assert (ar_4m.algo, ar_4m.proto, ar_4m.channels) == (N.RING, N.LL128, 24)


def test_h200x2_info_logs_facts():
    f = parse_logs(H200X2)
    assert (f.nccl_version, f.nranks, f.nnodes, f.local_ranks, f.channels) == ("2.28.9", 2, 2, 1, 2)
    assert f.hosts == {"vm"}  # two emulated nodes on one host (NCCL_HOSTID)
    assert any("2 node(s) on 1 host" in n for n in f.notes)
    assert f.network == "Socket" and f.net_kind == "socket" and f.nics == {"Socket": ["lo:127.0.0.1<0>"]}
    assert f.nics_per_node == 1 and f.transports == {"NET/Socket": 8}
    assert f.gpu_model is None and f.gpu_arch == "hopper" and "18 x 20.6" in f.gpu_arch_source
    assert (f.nvlink_bw_gbps, f.nvlink_peer, f.cpu_vendor, f.cpu_arch) == (370.8, "NVS", "intel", "x86")
    assert f.rings == {0: [0, 1], 1: [0, 1]} and f.trees_per_rank == 2
    ring = next(g for g in f.graphs if g.pattern == 4)
    tree = next(g for g in f.graphs if g.pattern in (1, 2, 3))
    assert (ring.nchannels, ring.bw_intra_gbps, ring.bw_inter_gbps, ring.same_channels) == (1, 1.2, 1.2, True)
    assert (tree.pattern, tree.bw_intra_gbps, tree.bw_inter_gbps) == (3, 2.4, 1.2)
    assert f.tuner_plugin == "ncclrl"
    t = f.tuning
    assert t is not None and t.complete
    assert (t.lat_us[N.ALLREDUCE, N.RING, N.SIMPLE], t.bw_gbps[N.ALLREDUCE, N.RING, N.SIMPLE]) == (36.4, 1.2)
    assert (t.lat_us[N.ALLREDUCE, N.TREE, N.LL], t.bw_gbps[N.ALLREDUCE, N.TREE, N.LL]) == (16.8, 0.2)
    assert t.bw_gbps[N.ALLGATHER, N.PAT, N.SIMPLE] == 1.8 and t.bw_gbps[N.ALLREDUCE, N.RING, N.LL128] == 0.0
    assert not t.bw_gbps[:, N.NVLS:N.PAT].any() and not t.bw_gbps[:, N.COLLNET_DIRECT:N.NVLS].any()
    assert f.decision_lines == 89 and {(d.coll, d.log_nbytes) for d in f.decisions} == {(N.ALLREDUCE, 4),
                                                                                        (N.ALLREDUCE, 8)}


def test_public_a800_roce_log_facts():
    f = parse_logs([A800])
    assert (f.nccl_version, f.nranks, f.nnodes, f.channels) == ("2.10.3", 16, 2, 2)
    assert f.hosts == {"nodea", "nodeb"}
    assert (f.gpu_model, f.gpu_arch) == ("A800-SXM4-80GB", "ampere")
    assert f.net_kind == "roce" and f.nics == {"IB": ["mlx5_6:1/RoCE"]} and f.nics_per_node == 1
    assert f.transports["NET/IB/GDRDMA"] == 3 and f.transports["P2P/direct pointer/read"] == 6
    assert f.rings[0] == [0, 7, 6, 5, 12, 11, 10, 9, 8, 15, 14, 13, 4, 3, 2, 1]
    assert f.trees_per_rank == 2 and f.collnet_support is False
    assert f.env["NCCL_IB_GID_INDEX"] == "3" and not f.decisions and f.tuning is None


def test_prefixes_and_merged_processes(tmp_path):
    """torch's [rankN]: and mpirun's [1,0]<stdout>: prefixes, two processes merged into one file."""
    log = tmp_path / "merged.log"
    log.write_text(
        "[1,0]<stdout>:hostA:11:11 [0] NCCL INFO NCCL version 2.21.5+cuda12.4\n"
        "[1,0]<stdout>:hostA:11:20 [0] NCCL INFO comm 0x1 rank 0 nRanks 16 nNodes 2 localRanks 8 localRank 0 MNNVL 0\n"
        "[rank8]:hostB:12:21 [0] NCCL INFO comm 0x2 rank 8 nRanks 16 nNodes 2 localRanks 8 localRank 0 MNNVL 0\n"
        "[1,0]<stdout>:hostA:11:20 [0] NCCL INFO NET/IB : Using [0]mlx5_0:1/IB [1]mlx5_3:1/IB [RO]; "
        "OOB eth0:10.0.0.1<0>\n"
        "[1,0]<stdout>:hostA:11:20 [0] NCCL INFO Using network IB\n"
        "[1,0]<stdout>:hostA:11:20 [0] NCCL INFO 16 coll channels, 16 collnet channels, 16 nvls channels, "
        "32 p2p channels, 2 p2p channels per peer\n"
        "[rank8]:hostB:12:21 [0] NCCL INFO Channel 00/0 : 0[0] -> 8[0] [receive] via NET/IB/1/GDRDMA\n"
        "[rank8]:hostB:12:21 [0] NCCL INFO NCCL_SOCKET_NTHREADS set by environment to 4.\n"
        "[rank8]:hostB:12:12 [0] NCCL INFO AllReduce: 1048576 Bytes -> Algo NVLS proto SIMPLE channel{Lo..Hi}={0..15}\n"
        "[rank8]:hostB:12:12 [0] NCCL INFO 4 Bytes -> Algo 0 proto 0 time 25.200462\n")
    f = parse_logs([log])
    assert (f.nccl_version, f.nranks, f.nnodes, f.hosts) == ("2.21.5", 16, 2, {"hostA", "hostB"})
    assert f.net_kind == "ib" and f.nics_per_node == 2 and f.transports == {"NET/IB/GDRDMA": 1}
    assert (f.channels, f.nvls_channels, f.socket_nthreads) == (16, 16, 4)
    assert [(d.coll, d.algo, d.proto, d.channels) for d in f.decisions] == [(N.ALLREDUCE, N.NVLS, N.SIMPLE, 16),
                                                                            (-1, N.TREE, N.LL, 0)]
    assert any("do not name their collective" in n for n in f.notes)


# -- the topology and the replica's agreement ------------------------------------------------------------


def test_h200x4_replica_reproduces_every_logged_decision(h200x4_log):
    """Measured: 101/101 algorithm+protocol and 101/101 channel counts (from the nearest preset, h200-1x4)."""
    det = detect([h200x4_log], name="h200x4")
    ag = det.agreement
    assert det.preset == "h200-1x4"
    assert (ag.points, ag.algo_proto) == (101, 101)
    assert (ag.channel_points, ag.channels) == (101, 101)
    t = det.topology
    assert (t.nodes, t.gpus_per_node, t.nccl.channels, t.nccl.version, t.net.kind) == (1, 4, 24, "2.28.9", "none")
    assert t.gpu_model == "unknown" and det.filled["gpu.model"].startswith("not in the log")
    assert "101/101" in t.description


def test_agreement_sees_a_wrong_topology(h200x4_log):
    """The measure can fail: 12 channels instead of NCCL's 24 breaks the channel counts."""
    det = detect([h200x4_log], name="h200x4", search=False)
    wrong = replace(det.topology, nccl=replace(det.topology.nccl, channels=12))
    ag = agreement(wrong, det.facts)
    assert ag.channels < ag.channel_points and ag.mismatches


@pytest.mark.parametrize("start_bw_gbps", [3.0, 40.0])
def test_search_recovers_the_free_bandwidth(h200x4_log, tmp_path, start_bw_gbps):
    """From a preset whose per-channel bandwidth is wrong (measured: 91/101 and 98/101 algo+proto),
    the search over the free bandwidth reaches 101/101 and says so in the description."""
    t = load_topology("h200-1x4")
    start = tmp_path / "start.yaml"
    dump_topology(replace(t, intra=replace(t.intra, channel_bw_gbps=start_bw_gbps)), start)
    before = detect([h200x4_log], preset=str(start), search=False).agreement
    det = detect([h200x4_log], preset=str(start))
    assert before.algo_proto < 101
    assert (det.agreement.algo_proto, det.agreement.channels) == (101, 101)
    assert det.filled["intra.channel_bw_gbps"].startswith("fit:") and "searched" in det.topology.description


def test_h200x2_topology_from_graph_and_tuning_table():
    """Ring graph 1 x 1.2 GB/s becomes 0.6 GB/s over 2 coll channels: NCCL's Ring bandwidths
    exactly. Tree and PAT use NCCL's tree graph (2.4 GB/s), which the schema's one intra-node
    per-channel figure cannot also hold: measured 10/14 table entries, 138/140 implied choices."""
    det = detect(H200X2, name="h200x2")
    t, ag = det.topology, det.agreement
    assert det.preset == "h200-2x1-sock"
    assert (t.nodes, t.gpus_per_node, t.nccl.channels, t.net.kind, t.net.nics_per_node) == (2, 1, 2, "socket", 1)
    assert (t.gpu_arch, t.intra.fabric, t.intra.links_per_gpu, t.nccl.tree_pattern) == ("hopper", "nvswitch", 18,
                                                                                          "tree")
    assert t.intra.channel_bw_gbps == pytest.approx(0.6) and t.net.channel_bw_gbps == pytest.approx(0.6)
    bw = build_model(t).bandwidths
    assert bw[N.ALLREDUCE, N.RING, N.SIMPLE] == pytest.approx(det.facts.tuning.bw_gbps[N.ALLREDUCE, N.RING,
                                                                                        N.SIMPLE])
    assert (ag.points, ag.algo_proto, ag.channel_points, ag.channels) == (2, 2, 2, 2)
    assert (ag.table_entries, ag.table_match) == (14, 10)
    assert ag.grid_points == 140 and ag.grid_match >= 138
    assert "none agreed better" in det.searched


def test_public_a800_topology():
    det = detect([A800], name="a800")
    t = det.topology
    assert (t.gpu_arch, t.gpu_model, t.nodes, t.gpus_per_node, t.net.kind, t.nccl.version) == (
        "ampere", "A800-SXM4-80GB", 2, 8, "roce", "2.10.3")
    assert t.nccl.collnet is False and det.agreement.points == 0


def test_h100_one_rank_log_recorded_with_the_launchers():
    """NCCL 2.28.9 on one H100, one rank: what the log states, and no decision to agree with."""
    det = detect([REPO / "data/h100x1-2026-11-24/h100-nccl-info.log"], name="h100")
    f, t = det.facts, det.topology
    assert (f.nccl_version, f.nranks, f.nnodes, f.channels) == ("2.28.9", 1, 1, 64)
    assert (t.nodes, t.gpus_per_node, t.nccl.channels, t.nccl.nvls) == (1, 1, 64, False)
    assert det.agreement.points == 0 and t.gpu_model == "unknown"


def test_no_rank_count_is_an_error(tmp_path):
    log = tmp_path / "r.log"
    log.write_text("h:1:1 [0] NCCL INFO NCCL version 2.28.9+cuda13.0\n")
    with pytest.raises(ConfigError, match="logs: the log states no rank count"):
        detect([log])


# -- the command --------------------------------------------------------------------------------------


def test_cli_writes_a_yaml_every_command_accepts(capsys, monkeypatch, tmp_path):
    out_yaml = tmp_path / "my-cluster.yaml"
    code, out, err = run(capsys, monkeypatch, ["detect", *H200X2, "-o", out_yaml])
    assert code == 0, err
    assert "ranks: 2" in out and "agreement algo+proto: 2/2 (100.0%)" in out and "agreement channels: 2/2" in out
    assert out.rstrip().endswith(f"# wrote {out_yaml}")
    assert not list(tmp_path.glob(".*tmp*"))
    topo = load_topology(out_yaml)
    assert topo.name == "my-cluster" and (topo.nodes, topo.gpus_per_node, topo.nccl.channels) == (2, 1, 2)
    assert out_yaml.read_text().startswith("# detected from NCCL 2.28.9")

    code, out, err = run(capsys, monkeypatch, ["decisions", f"topology={out_yaml}", "collective=allreduce",
                                               "max_bytes=64"])
    rows = list(csv.DictReader(io.StringIO(out)))
    assert code == 0 and [(r["algo"], r["proto"], r["channels"]) for r in rows[:1]] == [("ring", "ll", "1")]
    code, out, err = run(capsys, monkeypatch, ["predict", f"topology={out_yaml}"],
                         "collective,nbytes,algo,proto,channels\nallreduce,1M,ring,simple,0\n")
    assert code == 0 and float(list(csv.DictReader(io.StringIO(out)))[0]["time_us"]) > 0
    code, out, err = run(capsys, monkeypatch, ["export", f"topology={out_yaml}", f"run_dir={tmp_path / 'run'}"])
    assert code == 0, err
    assert (tmp_path / "run" / "table" / "nccl_tuner.csv").is_file()


def test_cli_h200x4_agreement_printed(capsys, monkeypatch, tmp_path, h200x4_log):
    code, out, _ = run(capsys, monkeypatch, ["detect", h200x4_log, f"output={tmp_path / 'x4.yaml'}"])
    assert code == 0
    assert "agreement algo+proto: 101/101 (100.0%)" in out and "agreement channels: 101/101 (100.0%)" in out
    assert "gpu_model: unknown" in out
    assert np.isclose(load_topology(tmp_path / "x4.yaml").intra.channel_bw_gbps, 15.0)


@pytest.mark.parametrize("content", ["", "this is not an NCCL log\n", "\x00\x01\x02 binary"])
def test_malformed_log_is_exit_2_one_line_nothing_written(capsys, monkeypatch, tmp_path, content):
    log = tmp_path / "bad.log"
    log.write_text(content)
    out_yaml = tmp_path / "out.yaml"
    code, out, err = run(capsys, monkeypatch, ["detect", log, "-o", out_yaml])
    assert code == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and err.startswith("ncclrl: error: logs: no 'NCCL INFO' lines")
    assert list(tmp_path.iterdir()) == [log]


@pytest.mark.parametrize("argv,key", [
    (["detect"], "logs"),
    (["detect", "no-such.log"], "logs"),
    (["detect", A800, "-o"], "output"),
    (["detect", A800, "output=out.txt"], "output"),
    (["detect", A800, "preset=h999"], "preset"),
    (["detect", A800, "name=a b"], "name"),
    (["detect", A800, "search=maybe"], "search"),
])
def test_bad_input_is_one_line(capsys, monkeypatch, tmp_path, argv, key):
    monkeypatch.chdir(tmp_path)
    code, out, err = run(capsys, monkeypatch, argv)
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1
    assert err.startswith(f"ncclrl: error: {key}"), err
    assert list(tmp_path.iterdir()) == []
