"""``ncclrl profile``: recorded DDP and FSDP jobs counted exactly as the jobs counted themselves;
NCCL COLL logs parsed into shapes, bytes and calls; the YAML reloads; bad input is one line."""

from __future__ import annotations

import gzip
import json
from collections import Counter
from pathlib import Path

import pytest

from ncclrl.costmodel.errors import ConfigError
from ncclrl.costmodel.profile import build_profile, detect_format, load_profile, repeating_block, repeating_period
from ncclrl.runners.cli import main

DATA = Path(__file__).parent / "data" / "profiles"


def truth_per_step(job: str) -> list[Counter]:
    """Each step's calls (collective, nbytes as NCCL's tuner sees them, dtype) as the job counted them."""
    steps = []
    for rank in (0, 1):
        doc = json.loads((DATA / f"{job}-rank{rank}.truth.json").read_text())
        for calls in doc["calls_by_step"]:
            steps.append(Counter((c["collective"], max(c["in_nelems"], c["out_nelems"]) * c["element_nbytes"],
                                  c["dtype"]) for c in calls))
    return steps


@pytest.mark.parametrize("job", ["ddp", "fsdp"])
def test_recorded_trace_matches_the_jobs_own_count(job):
    prof = build_profile([DATA / f"{job}-rank0.trace.json.gz", DATA / f"{job}-rank1.trace.json.gz"])
    assert prof.steps == 3 and "ProfilerStep" in prof.steps_from
    truth = truth_per_step(job)
    assert all(t == truth[0] for t in truth)  # every step of every rank called the same
    got = {(e.collective, e.nbytes, e.dtype): e.calls_per_step for e in prof.entries}
    assert got == dict(truth[0])
    assert sum(e.nbytes_per_step for e in prof.entries) == sum(n * k for (_c, n, _d), k in truth[0].items())
    assert {(e.nodes, e.ranks, e.overlaps_compute) for e in prof.entries} == {(1, 2, "unknown")}


def test_one_ranks_trace_leaves_the_nodes_unknown():
    prof = build_profile([DATA / "ddp-rank0.trace.json.gz"])
    assert {(e.nodes, e.ranks) for e in prof.entries} == {(0, 2)}


def test_flight_recorder_json_steps_from_the_repeating_pattern():
    prof = build_profile([DATA / "ddp-rank0.fr.json"])
    # 2 warm-up + 3 profiled steps; DDP's first step, before it rebuilds its buckets, does not repeat
    assert prof.steps == 4 and "repeating pattern" in prof.steps_from
    assert {(e.collective, e.nbytes, e.dtype): e.calls_per_step for e in prof.entries} == dict(truth_per_step("ddp")[0])


NCCL_LOG = """\
nodeA:101:101 [0] NCCL INFO comm 0x5500a0 rank 0 nRanks 8 nNodes 2 localRanks 4 localRank 0 MNNVL 0
nodeA:101:101 [0] NCCL INFO comm 0x5500b0 rank 0 nRanks 4 nNodes 1 localRanks 4 localRank 0 MNNVL 0
nodeA:101:101 [0] NCCL INFO ncclCommInitRank comm 0x5500a0 rank 0 nranks 8 cudaDev 0 nvmlDev 0 busId 1000 \
commId 0x1234 - Init COMPLETE
nodeA:101:101 [0] NCCL INFO Broadcast: opCount 0 sendbuff 0x7f00 recvbuff 0x7f00 count 1000 datatype 0 op 0 \
root 0 comm 0x5500a0 [nranks=8] stream 0x99
"""
for step in range(3):
    for i, (op, count, dt, comm, n) in enumerate([
            ("AllReduce", 262144, 7, "0x5500a0", 8), ("AllReduce", 262144, 7, "0x5500a0", 8),
            ("AllReduce", 1024, 9, "0x5500a0", 8), ("AllGather", 4096, 9, "0x5500b0", 4),
            ("ReduceScatter", 4096, 9, "0x5500b0", 4)]):
        opc = {"0x5500a0": 1 + step * 3 + min(i, 2), "0x5500b0": step * 2 + i - 3}[comm]
        NCCL_LOG += (f"nodeA:101:102 [0] NCCL INFO {op}: opCount {opc:x} sendbuff 0x7f10 recvbuff 0x7f20 "
                     f"count {count} datatype {dt} op 0 root 0 comm {comm} [nranks={n}] stream 0x99\n")


def test_nccl_coll_log_two_communicators(tmp_path):
    log = tmp_path / "rank0.log"
    log.write_text(NCCL_LOG + "nodeA:101:101 [0] NCCL INFO Channel 00/02 : 0 1 2 3\n")
    assert detect_format(log) == "nccl-log"
    prof = build_profile([log])
    got = {(e.collective, e.nbytes, e.nodes, e.ranks, e.dtype): (e.calls_per_step, e.nbytes_per_step)
           for e in prof.entries}
    assert got == {
        ("allreduce", 262144 * 4, 2, 8, "float32"): (2, 2 * 262144 * 4),
        ("allreduce", 1024 * 2, 2, 8, "bfloat16"): (1, 2048),
        ("allgather", 4096 * 2 * 4, 1, 4, "bfloat16"): (1, 4096 * 2 * 4),  # tuner's nBytes: count * size * nranks
        ("reducescatter", 4096 * 2 * 4, 1, 4, "bfloat16"): (1, 4096 * 2 * 4),
    }
    assert prof.steps == 3 and "repeating pattern" in prof.steps_from
    assert any("1 calls outside" in n for n in prof.notes)  # the init broadcast
    # steps given: every call counts, divided by them
    given = build_profile([log], steps=3)
    assert "steps=3 (given)" in given.steps_from
    assert given.by_key()[("broadcast", 1000, 2, 8, "int8")].calls_per_step == pytest.approx(1 / 3)


def test_repeating_period():
    assert repeating_period(list("xabcabcab")) == (1, 3)
    assert repeating_period(list("abcd")) is None
    assert repeating_period(list("aaaa")) == (0, 1)
    # a step ending in equal calls: the block covering the most calls wins over the shortest one
    assert repeating_period(list("aabaabaa")) == (0, 3)
    assert repeating_period(list("aabaabaa"), min_cover=0.5) == (0, 3)
    assert repeating_period(list("abcabcabcaa"), min_cover=0.9) is None


def test_repeating_block_leaves_a_teardown_out():
    """Init calls before, 4 steps of 6 calls, a closing barrier and gather after: the steps are
    found, and the calls at either end are left out."""
    seq = ["b1", "b2", "first"] + list("uvwxyz") * 4 + ["barrier", "gather"]
    assert repeating_block(seq) == (3, 6, 27)
    assert repeating_period(seq) is None  # with nothing left out at the end, no block repeats
    assert repeating_block(seq, max_tail=1) is None  # two calls at the end: more than allowed


def test_cli_writes_yaml_that_reloads(tmp_path, capsys):
    out = tmp_path / "job-profile.yaml"
    assert main(["profile", str(DATA / "fsdp-rank0.trace.json.gz"), str(DATA / "fsdp-rank1.trace.json.gz"),
                 "-o", str(out)]) == 0
    assert "reducescatter" in capsys.readouterr().out
    back = load_profile(out)
    assert back.by_key() == build_profile([DATA / "fsdp-rank0.trace.json.gz",
                                           DATA / "fsdp-rank1.trace.json.gz"]).by_key()
    assert back.steps == 3


def _bad(tmp_path: Path, name: str, data: bytes) -> Path:
    p = tmp_path / name
    p.write_bytes(data)
    return p


@pytest.mark.parametrize("name, data, words", [
    ("empty.log", b"", "is empty"),
    ("notes.txt", b"hello\n", "unknown format"),
    ("other.json", b'{"a": 1}', "neither"),
    ("fr.pkl", b"\x80\x04\x95", "pickle"),
    ("init-only.log", b"h:1:1 [0] NCCL INFO NET/Socket : Using eth0\n", "NCCL_DEBUG_SUBSYS=COLL"),
    ("bad.json.gz", gzip.compress(b"{not json"), "not valid JSON"),
])
def test_bad_input_is_one_line_exit_2(tmp_path, capsys, name, data, words):
    p = _bad(tmp_path, name, data)
    with pytest.raises(ConfigError):
        build_profile([p])
    assert main(["profile", str(p), "-o", str(tmp_path / "p.yaml")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("ncclrl: error: inputs:") and words in err
    assert not (tmp_path / "p.yaml").exists()


def test_missing_input_and_output_flag(tmp_path, capsys):
    assert main(["profile"]) == 2
    assert main(["profile", str(tmp_path / "nope.log")]) == 2
    assert main(["profile", str(DATA / "ddp-rank0.fr.json"), "-o"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 3 and all(line.startswith("ncclrl: error:") for line in err)


def test_an_empty_flight_recorder_dump_says_the_recorder_was_off(tmp_path):
    # what torch 2.11 wrote on a GPU when the NCCL recorder had no buffer
    f = tmp_path / "rank0.fr.json"
    f.write_text('{"comm_lib_version":"","nccl_comm_state":{},"pg_config":{},"pg_status":{},"version":"2.10"}')
    with pytest.raises(ConfigError, match="no entries: the recorder was off; set TORCH_FR_BUFFER_SIZE"):
        build_profile([f])

    # FSDP on one rank: the recorder was on, the job called no collective
    f.write_text('{"comm_lib_version":"2.28.9","nccl_comm_state":{},"pg_config":{"0":{"desc":"default_pg",'
                 '"name":"0","ranks":"[0]"}},"pg_status":{},"version":"2.10"}')
    with pytest.raises(ConfigError, match=r"no collective calls in .*1 process group\(s\) with no entries"):
        build_profile([f])


GPU = DATA / "h100-1gpu"  # one H100, NCCL 2.28.9, torch 2.11: data/h100x1-jobs-2026-11-24/run2.sh


@pytest.mark.parametrize("source", ["trace.json.gz", "fr.json", "nccl.log"])
def test_recorded_nccl_job_on_a_gpu_matches_the_jobs_own_count(source):
    """DDP on one GPU through NCCL: the profiler trace, NCCL's flight recorder and NCCL's COLL log
    each give the job's own count per step; the log's init broadcasts, DDP's first step (before it
    rebuilds its buckets) and the closing barrier are left out."""
    doc = json.loads((GPU / "ddp-rank0.truth.json").read_text())
    truth = [Counter((c["collective"], max(c["in_nelems"], c["out_nelems"]) * c["element_nbytes"], c["dtype"])
                     for c in calls) for calls in doc["calls_by_step"]]
    assert all(t == truth[0] for t in truth) and sum(truth[0].values()) == 6
    prof = build_profile([GPU / f"ddp-rank0.{source}"])
    assert {(e.collective, e.nbytes, e.dtype): e.calls_per_step for e in prof.entries} == dict(truth[0])
    if source == "nccl.log":
        assert prof.steps == 4 and {(e.nodes, e.ranks) for e in prof.entries} == {(1, 1)}
        assert any("6 before, 1 after" in n for n in prof.notes)


def test_fsdp_on_one_gpu_calls_no_collective():
    assert json.loads((GPU / "fsdp-rank0.truth.json").read_text())["calls_by_step"] == [[], [], []]
    for f in ("fsdp-rank0.trace.json.gz", "fsdp-rank0.fr.json"):
        with pytest.raises(ConfigError, match="no collective calls"):
            build_profile([GPU / f])
    # NCCL's log holds only the closing barrier, which no step pattern can tell apart
    prof = build_profile([GPU / "fsdp-rank0.nccl.log"])
    assert [(e.collective, e.nbytes, e.calls_per_step) for e in prof.entries] == [("allreduce", 4, 1)]
    assert any("no repeating pattern" in n for n in prof.notes)
