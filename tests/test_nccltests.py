"""The nccl-tests parser, on the real recorded outputs and on JSON made from them."""

from __future__ import annotations

import json

import pytest

from ncclrl.costmodel.nccltests import (
    NcclTestsError,
    env_from_name,
    library_version,
    parse_file,
    parse_json,
    parse_stdout,
    perf_timeout,
    rank_lines,
    run_env,
    version_from_code,
)


def test_parses_every_real_file(allreduce_files):
    for f in allreduce_files:
        run = parse_file(f)
        assert run.collective == "allreduce" and run.nranks == 4 and run.version == "2.19.6"
        assert [r.nbytes for r in run.records] == [8 << i for i in range(28)]
        for r in run.records:
            assert r.count * 4 == r.nbytes and r.dtype == "float" and r.redop == "sum"
            assert r.out_of_place.wrong is None  # -c 0: #wrong is N/A
            assert r.out_of_place.time_us > 0 and r.in_place.time_us > 0
            # busBw = algBw * 2(n-1)/n for AllReduce, up to the table's rounding
            if r.out_of_place.algbw_gbps > 1:
                assert r.out_of_place.busbw_gbps == pytest.approx(r.out_of_place.algbw_gbps * 1.5, rel=0.01)


def test_env_from_file_names():
    assert env_from_name("all_reduce__ring_LL128_c8") == {
        "NCCL_ALGO": "ring", "NCCL_PROTO": "LL128", "NCCL_MIN_NCHANNELS": "8", "NCCL_MAX_NCHANNELS": "8"}
    assert env_from_name("all_reduce__buf1048576") == {"NCCL_BUFFSIZE": "1048576"}
    assert env_from_name("all_reduce__default") == {}


def to_json(run, program="./build/all_reduce_perf", env=("NCCL_ALGO=ring", "PATH=/bin")):
    """An nccl-tests -J report (format version 3) carrying the same rows."""
    res = []
    for r in run.records:
        res.append({"size": r.nbytes, "count": r.count, "type": r.dtype, "redop": r.redop, "root": "-1",
                    "out_of_place": {"time": r.out_of_place.time_us, "alg_bw": r.out_of_place.algbw_gbps,
                                     "bus_bw": r.out_of_place.busbw_gbps, "nwrong": None},
                    "in_place": {"time": r.in_place.time_us, "alg_bw": r.in_place.algbw_gbps,
                                 "bus_bw": r.in_place.busbw_gbps, "nwrong": None},
                    "actual_iterations": 20, "experiment_name": ""})
    return {"version": 3, "start_time": "2026-11-01 00:00:00", "args": [program, "-b", "8"], "env": list(env),
            "nccl_version": 22803, "config": {"nthreads": 1, "ngpus": 4, "graph": 0},
            "devices": [{"rank": i} for i in range(4)], "results": res,
            "out_of_bounds": {"count": 0, "okay": True}, "average_bus_bandwidth": {"bandwidth": 1.0},
            "errors": [], "end_time": "2026-11-01 00:01:00"}


def test_json_matches_stdout(allreduce_files, tmp_path):
    run = parse_file(allreduce_files[0])
    path = tmp_path / "r.json"
    path.write_text(json.dumps(to_json(run)))
    jr = parse_file(path)
    assert jr.collective == "allreduce" and jr.nranks == 4
    assert [(r.nbytes, r.out_of_place.time_us, r.in_place.busbw_gbps) for r in jr.records] == \
        [(r.nbytes, r.out_of_place.time_us, r.in_place.busbw_gbps) for r in run.records]
    assert jr.env == {"NCCL_ALGO": "ring"}
    assert run_env(jr)["NCCL_ALGO"] == "ring"


def test_json_truncated(allreduce_files):
    text = json.dumps(to_json(parse_file(allreduce_files[0])))
    with pytest.raises(NcclTestsError, match="truncated"):
        parse_json(text[: len(text) // 2])
    doc = to_json(parse_file(allreduce_files[0]))
    del doc["end_time"]
    with pytest.raises(NcclTestsError, match="truncated"):
        parse_json(json.dumps(doc))


def test_json_wrong_elements(allreduce_files):
    doc = to_json(parse_file(allreduce_files[0]))
    doc["results"][3]["in_place"]["nwrong"] = 12
    with pytest.raises(NcclTestsError, match="12 wrong elements"):
        parse_json(json.dumps(doc))


def test_stdout_truncated(allreduce_files):
    lines = allreduce_files[0].read_text().splitlines()
    cut = "\n".join(lines[:25])
    with pytest.raises(NcclTestsError, match="truncated run"):
        parse_stdout(cut)
    assert parse_stdout(cut, strict=False).records  # readable on request


def test_stdout_wrong_elements(allreduce_files):
    text = allreduce_files[0].read_text()
    row = next(ln for ln in text.splitlines() if ln.strip().startswith("1024 "))
    bad = row.replace("N/A", "3", 1)
    with pytest.raises(NcclTestsError, match="3 wrong elements"):
        parse_stdout(text.replace(row, bad))


def test_stdout_warn_lines(allreduce_files):
    text = allreduce_files[0].read_text()
    text = text.replace("#\n# Using devices", "vm:1885:1885 [0] NCCL WARN Cuda failure 'out of memory'\n"
                        "#\n# Using devices", 1)
    with pytest.raises(NcclTestsError, match="out of memory"):
        parse_stdout(text)


def test_no_rows():
    with pytest.raises(NcclTestsError, match="no result rows"):
        parse_stdout("# nccl-tests version 2.19.6\n# Collective test starting: all_reduce_perf\n")


def test_tolerates_number_formats_and_chatter(allreduce_files):
    text = allreduce_files[0].read_text()
    row = next(ln for ln in text.splitlines() if ln.strip().startswith("1073741824 "))
    toks = row.split()
    toks[5] = "4.52027e+03"
    toks[6] = "2,376.00"
    text = text.replace(row, "  ".join(toks) + "\nvm:1:1 [0] NCCL INFO NCCL_PROTO set by environment to LL")
    run = parse_stdout(text)
    last = run.records[-1]
    assert last.out_of_place.time_us == pytest.approx(4520.27) and last.out_of_place.algbw_gbps == 2376.0
    assert run.env == {"NCCL_PROTO": "LL"}


def test_not_a_number_is_an_error(allreduce_files):
    text = allreduce_files[0].read_text()
    row = next(ln for ln in text.splitlines() if ln.strip().startswith("2048 "))
    toks = row.split()
    toks[5] = "fast"
    with pytest.raises(NcclTestsError, match="time: not a number"):
        parse_stdout(text.replace(row, "  ".join(toks)))


def test_nccl_debug_lines_inside_the_table_are_set_aside(allreduce_files):
    """NCCL INFO lines of every rank, where a launcher's merged output puts them: at line starts,
    glued after a row's first columns (nccl-tests prints them before it runs the size), in the
    middle of a number, or glued to another rank's unfinished line."""
    text = allreduce_files[0].read_text()
    plain = parse_stdout(text)
    row = next(ln for ln in text.splitlines() if ln.strip().startswith("1024 "))
    cut = row.index("-1") + 2
    glued = (row[:cut] + "vm:12:13 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P\n"
             "[2026-11-21 10:00:00] vm:14:15 [1] misc/socket.cc:50 NCCL WARN oops\n" + row[cut:cut + 7] +
             "vm:14:15 [1] NCCL INFO comm 0x1 rank 1 nranks 2 - Destroy COMPLETE\n" + row[cut + 7:])
    head = ("vm:14:15 [1] NCCL INFO NCCL version 2.28.9+cuda12.8vm:12:13 [0] NCCL INFO NCCL_PROTO set by "
            "environment to LL\n\n")
    run = parse_stdout(head + text.replace(row, glued), strict=False)
    assert [(r.nbytes, r.out_of_place, r.in_place) for r in run.records] == \
        [(r.nbytes, r.out_of_place, r.in_place) for r in plain.records]
    assert run.env == {"NCCL_PROTO": "LL"} and run.library == "2.28.9" and run.cuda == "12.8"
    assert [(x.pid, x.dev, x.level) for x in run.log] == [(14, 1, "INFO"), (12, 0, "INFO"), (12, 0, "INFO"),
                                                          (14, 1, "WARN"), (14, 1, "INFO")]
    assert run.warnings and "oops" in run.warnings[0]
    with pytest.raises(NcclTestsError, match="oops"):
        parse_stdout(head + text.replace(row, glued))


def test_rank_lines_and_versions(allreduce_files):
    text = allreduce_files[0].read_text()
    ranks = rank_lines(text)
    assert [(r.rank, r.host, r.device, r.gpu) for r in ranks] == [(i, "vm", i, "NVIDIA H200") for i in range(4)]
    assert parse_stdout(text).ranks == ranks
    # nccl-tests' own version is 2.19.6; the library that ran is 2.28.3 (nccl-library=22803)
    assert library_version(text) == ("2.28.3", "") and parse_stdout(text).library == "2.28.3"
    assert version_from_code(22809) == "2.28.9" and version_from_code(2708) == "2.7.8"
    assert perf_timeout("  8  2  float  sum  -1node07: Test timeout (60s) common.cu:523") == ("node07", 60)
    assert perf_timeout(text) is None
