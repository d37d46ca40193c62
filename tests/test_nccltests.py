"""The nccl-tests parser, on the real recorded outputs and on JSON made from them."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from ncclrl.costmodel.nccltests import (
    NcclTestsError,
    env_from_name,
    env_sources,
    library_version,
    parse_file,
    parse_file_runs,
    parse_json,
    parse_runs,
    parse_stdout,
    perf_timeout,
    rank_lines,
    run_env,
    strip_prefixes,
    version_from_code,
)

CORPUS = Path(__file__).resolve().parent / "data" / "nccltests-corpus"


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


# -- the corpus of real outputs (tests/data/nccltests-corpus: SOURCES.csv, expected.csv) -----------


def corpus_expected() -> list[tuple[str, int, int]]:
    with open(CORPUS / "expected.csv", newline="") as f:
        return [(r["file"], int(r["runs"]), int(r["rows"])) for r in csv.DictReader(f)]


def test_corpus_is_sourced():
    files = {p.name for p in CORPUS.glob("*.txt")}
    with open(CORPUS / "SOURCES.csv", newline="") as f:
        sources = {r["file"]: r for r in csv.DictReader(f)}
    assert len(files) >= 60 and files == set(sources) == {f for f, _, _ in corpus_expected()}
    for r in sources.values():
        assert r["repository"].startswith("https://github.com/") and len(r["commit"]) == 40 and r["path"]


@pytest.mark.parametrize("name,runs,rows", corpus_expected(), ids=lambda x: str(x)[:40])
def test_corpus_file_read_with_every_row(name, runs, rows):
    got = parse_file_runs(CORPUS / name, strict=False)
    assert (len(got), sum(len(r.records) for r in got)) == (runs, rows)
    for run in got:
        for rec in run.records:
            assert rec.nbytes >= 0 and rec.count >= 0 and rec.dtype
            assert rec.out_of_place is not None and rec.in_place is not None
            assert rec.out_of_place.time_us >= 0


def test_corpus_rate():
    """The rate benchmarks/parse_corpus.py prints: files read with every row / files."""
    ok = 0
    cases = corpus_expected()
    for name, runs, rows in cases:
        got = parse_file_runs(CORPUS / name, strict=False)
        ok += (len(got), sum(len(r.records) for r in got)) == (runs, rows)
    assert ok / len(cases) >= 0.95


# -- one feature at a time ------------------------------------------------------------------------


def test_mpirun_tag_output_also_mid_line(allreduce_files):
    text = allreduce_files[0].read_text()
    plain = parse_stdout(text)
    tagged = "".join(f"[1,0]<stdout>:{ln}\n" for ln in text.splitlines())
    row = next(ln for ln in tagged.splitlines() if ln.strip().endswith("N/A") and " 4096 " in ln)
    cut = row.index("float") + 5
    tagged = tagged.replace(row, row[:cut] + "[1,0]<stdout>:" + row[cut:])  # another chunk's tag
    run = parse_stdout(tagged)
    assert [(r.nbytes, r.out_of_place, r.in_place) for r in run.records] == \
        [(r.nbytes, r.out_of_place, r.in_place) for r in plain.records]
    assert run.nranks == 4 and run.collective == "allreduce"
    assert strip_prefixes("[1,3]<stderr>:x\n 12: y\n(head, rank=0, pid=38) z\n") == "x\ny\nz\n"


def test_srun_label(allreduce_files):
    text = allreduce_files[0].read_text()
    labelled = "".join(f"{i % 2}: {ln}\n" for i, ln in enumerate(text.splitlines()))
    assert len(parse_stdout(labelled).records) == 28


def test_log_line_after_a_rows_last_digit_known_by_the_rank_lines(allreduce_files):
    """No debug line starts a line, so only the host that nccl-tests' rank lines name (``vm``)
    tells where the row ends and NCCL's line begins."""
    text = allreduce_files[0].read_text()
    row = next(ln for ln in text.splitlines() if ln.strip().startswith("2048 "))
    glued = row + "vm:3093:3100 [2] NCCL INFO Channel 00/0 : 2[2] -> 3[3] via P2P/CUMEM"
    run = parse_stdout(text.replace(row, glued))
    assert len(run.records) == 28 and run.records[8].in_place.wrong is None
    assert [ln.dev for ln in run.log] == [2]


def test_several_runs_in_one_file(allreduce_files, tmp_path):
    a, b = allreduce_files[0], allreduce_files[-1]
    text = ("$ NCCL_ALGO=Tree ./build/all_reduce_perf -b 8 -e 1G\n" + a.read_text() +
            "\nNCCL_PROTO=LL128\n" + b.read_text())
    runs = parse_runs(text)
    assert [len(r.records) for r in runs] == [28, 28]
    assert runs[0].env == {"NCCL_ALGO": "Tree"} and runs[1].env == {"NCCL_PROTO": "LL128"}
    assert all(rec.env == {"NCCL_PROTO": "LL128"} for rec in runs[1].records)
    merged = parse_stdout(text)
    assert len(merged.records) == 56 and len(merged.runs) == 2
    path = tmp_path / "all_reduce__ring_LL.txt"
    path.write_text(text)
    first = parse_file_runs(path)[0]
    # the output says NCCL_ALGO; the file name only adds what the output does not say
    assert run_env(first) == {"NCCL_ALGO": "Tree", "NCCL_PROTO": "LL"}
    assert env_sources(first) == {"NCCL_ALGO": "output", "NCCL_PROTO": "file name"}


def test_missing_summary_and_a_cut_row(allreduce_files):
    lines = allreduce_files[0].read_text().splitlines()
    rows = [i for i, ln in enumerate(lines) if ln.strip().endswith("N/A")]
    text = "\n".join(lines[: rows[9] + 1])  # 10 rows, no summary
    run = parse_stdout(text, strict=False)
    assert len(run.records) == 10 and "no closing summary" in run.notes[0]
    cut = text + "\n" + lines[rows[10]][:60]  # nccl-tests had printed the next row's first columns
    run = parse_stdout(cut, strict=False)
    assert len(run.records) == 10 and any("row cut short" in n for n in run.notes)
    with pytest.raises(NcclTestsError, match="row cut short"):
        parse_stdout(cut + "\n" + "\n".join(lines[rows[-1] + 1:]))  # even with the summary after it


OLD_ALLGATHER = """\
# nThread 1 nGpus 8 minBytes 1 maxBytes 8589934592 step: 2(factor) warmup iters: 5 iters: 20 validation: 0
#   Rank  0 Pid 112372 on localhost device  0 [0x00] A100-SXM4-40GB
#                                             out-of-place                       in-place
#       size         count    type     time   algbw   busbw  error     time   algbw   busbw  error
#        (B)    (elements)             (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)
        1024            32   float    35.38    0.03    0.03    N/A    34.53    0.03    0.03    N/A
        2048            64   float    34.67    0.06    0.05  2e-07    34.91    0.06    0.05  0e+00
# Out of bounds values : 0 OK
# Avg bus bandwidth    : 58.2651
"""


def test_old_layouts():
    """Before nccl-tests 2.10: no root (and for AllGather no redop) column, a maximum error in
    place of #wrong; AlltoAll printed its redop blank; Broadcast printed root but no redop."""
    run = parse_stdout(OLD_ALLGATHER)
    assert [(r.nbytes, r.count, r.dtype, r.redop, r.root) for r in run.records] == \
        [(1024, 32, "float", "", -1), (2048, 64, "float", "", -1)]
    assert run.records[1].out_of_place.error == 2e-07 and run.records[1].out_of_place.wrong is None
    assert run.records[0].in_place.time_us == 34.53 and run.nranks == 1
    blank = OLD_ALLGATHER.replace("type     time", "type   redop     time")
    assert len(parse_stdout(blank).records) == 2
    bcast = OLD_ALLGATHER.replace("type     time", "type    root     time").replace(
        "float    3", "float       3    3")
    assert [r.root for r in parse_stdout(bcast).records] == [3, 3]


def test_newest_columns_per_iteration_timestamp_cputime():
    head = ("#       size         count      type   redop    root  cputime   algbw   busbw  #wrong    i_min    i_max"
            "    i_p99    i_cv%  cputime   algbw   busbw  #wrong    i_min    i_max    i_p99    i_cv%    timestamp\n")
    row = ("        1024           256     float     sum      -1    34.71    0.03    0.04       0    30.10    40.20"
           "    39.90     5.10    34.27    0.03    0.04       0    30.00    41.00    40.00     6.00"
           "  2026-01-02 03:04:05\n")
    run = parse_stdout("# nThread 1 nGpus 4\n" + head + row + "# Avg bus bandwidth    : 0.04\n")
    (rec,) = run.records
    assert rec.out_of_place.time_us == 34.71 and rec.in_place.time_us == 34.27 and rec.in_place.busbw_gbps == 0.04
    assert rec.in_place.wrong == 0


def test_markdown_rendering_without_hashes():
    name = "dstackai--dstack-mkdocs-docs-examples-clusters-lambda--1.txt"
    run = parse_file(CORPUS / name)
    assert run.collective == "allreduce" and run.version == "2.17.6" and len(run.records) == 29


def test_not_utf8_and_json_looking_chatter(allreduce_files, tmp_path):
    data = allreduce_files[0].read_bytes().replace(b"NVIDIA H200", b"NVIDIA H200 \xff\xfe", 1)
    path = tmp_path / "latin.txt"
    path.write_bytes(b"{'launcher': 'mine'}\n" + data)
    run = parse_file(path)
    assert len(run.records) == 28 and "\ufffd" in run.ranks[0].gpu


def test_environment_printed_by_the_job(allreduce_files):
    text = allreduce_files[0].read_text()
    cmd = "mpirun -np 4 -x NCCL_DEBUG=INFO -x NCCL_PROTO=Simple ./build/all_reduce_perf -b 8 -e 1G\n"
    dump = "NCCL_MIN_NCHANNELS=4\nexport NCCL_ALGO=Ring\n"
    run = parse_stdout(cmd + dump + text)
    assert run.env == {"NCCL_DEBUG": "INFO", "NCCL_PROTO": "Simple", "NCCL_MIN_NCHANNELS": "4", "NCCL_ALGO": "Ring"}
    assert run.records[0].env == run.env
    assert env_sources(run) == dict.fromkeys(run.env, "output")
