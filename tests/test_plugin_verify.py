"""The GPU verifier's logic (which sizes it calls, what NCCL must log, reading NCCL's log), on a
synthetic log; the GPU run itself is docs/results/plugin.md's evidence."""

from __future__ import annotations

from pathlib import Path

from ncclrl.costmodel import nccl as N
from ncclrl.costmodel.table import parse_example_rows
from ncclrl.costmodel.topology import load_topology
from ncclrl.runners.plugin_verify import MARKER_BYTES, expected, match_log, plan_cases

DOCS = Path(__file__).resolve().parents[1] / "docs" / "results" / "plugin"


def fake_log(cases, answers, nranks):
    lines = ["[0] NCCL INFO AllReduce: 4 Bytes -> Algo RING proto LL channel{Lo..Hi}={0..0}",  # PyTorch's own call
             f"[0] NCCL INFO Broadcast: {MARKER_BYTES} Bytes -> Algo RING proto LL channel{{Lo..Hi}}={{0..0}}"]
    for case, (algo, proto, ch) in zip(cases, answers, strict=True):
        name = {v: k for k, v in N.COLL_LOG_NAMES.items()}[case["coll"]]
        b = case["nbytes"] // nranks if case["coll"] in (N.ALLGATHER, N.REDUCESCATTER) else case["nbytes"]
        lines.append(f"vm:1:1 [0] NCCL INFO {name}: {b} Bytes -> Algo {algo.upper()} proto {proto.upper()} "
                     f"channel{{Lo..Hi}}={{0..{ch - 1}}}")
    return "\n".join(lines)


def test_handmade_table_expectations():
    topo = load_topology("h200-1x4")
    rows = parse_example_rows((DOCS / "table-h200-1x4-handmade.csv").read_text())
    cases = plan_cases(rows, topo, 1 << 30)
    assert {c["row"] for c in cases if c["row"] is not None} == set(range(len(rows)))
    uncovered = [c for c in cases if c["row"] is None]
    assert {N.COLLECTIVES[c["coll"]] for c in uncovered} >= {"reduce", "allreduce"}
    by_row = {}
    for c in cases:
        if c["row"] is not None:
            by_row.setdefault(c["row"], []).append(expected(c, rows, topo, None))
    assert by_row[0][0] == ("tree", "ll", 1)
    assert all(e[:2] == ("ring", "simple") for e in by_row[4])  # NVLS is off: NCCL's own choice
    assert by_row[2][-1] == ("ring", "ll128", 16)
    assert by_row[1][0][2] < 4  # 8 KiB: NCCL's scheduler uses fewer channels than the row asks


def test_match_log_reads_decisions_in_call_order():
    topo = load_topology("h200-1x4")
    rows = parse_example_rows((DOCS / "table-h200-1x4-handmade.csv").read_text())
    cases = plan_cases(rows, topo, 1 << 24)
    answers = [expected(c, rows, topo, None) for c in cases]
    got = match_log(fake_log(cases, answers, topo.nranks), cases, topo.nranks)
    assert got == answers
    wrong = list(answers)
    wrong[3] = ("tree", "simple", 1)
    assert match_log(fake_log(cases, wrong, topo.nranks), cases, topo.nranks)[3] == ("tree", "simple", 1)


def plugin_line(text, applicable, rejected=0, ranks=4, nodes=1):
    from ncclrl.costmodel.table import fingerprint

    rows = sum(1 for line in text.splitlines() if line.strip() and not line.startswith("#"))
    return (f"vm:1:1 [0] NCCL INFO TUNER/ncclrl: table from NCCLRL_TUNER_TABLE_DATA ({len(text.encode())} bytes, "
            f"{rows} rows, fingerprint {fingerprint(text)}): {applicable} for this communicator ({ranks} ranks, "
            f"{nodes} node{'s' if nodes != 1 else ''}), {rejected} rejected; tuner ABI v5")


def run_verify(tmp_path, monkeypatch, text, max_bytes, line=None, wrong=None, iters=20, slow=None):
    """verify() end to end with NCCL's side faked: the job's log holds the plugin's line and, per
    case, the decision expected of it (or ``wrong`` at the case of that index)."""
    import ncclrl.runners.plugin_verify as pv

    topo = load_topology("h200-1x4")
    table = tmp_path / "t.csv"
    table.write_text(text)
    lib = tmp_path / "lib.so"
    lib.write_bytes(b"")
    rows = parse_example_rows(text)

    def fake_job(cases, env, topo_, iters, out, tag, launcher, device="cuda"):
        answers = [expected(c, rows, topo, None) for c in cases]
        if wrong is not None and tag == "plugin":
            answers[wrong] = ("tree", "simple", 1)
        log = fake_log(cases, answers, topo.nranks)
        if tag == "plugin":
            log = (line if line is not None else plugin_line(text, len(rows))) + "\n" + log
        first = next(i for i, c in enumerate(cases) if c["row"] is None)
        times = [None if c["row"] is not None else 100.0 * (slow if slow and i == first else 1.0)
                 for i, c in enumerate(cases)]
        base = [None if c["row"] is not None else 100.0 for c in cases]
        return {"times_us": times, "base_times_us": base, "log": log, "log_path": "x"}

    monkeypatch.setattr(pv, "run_job", fake_job)
    rc = pv.verify(str(table), "h200-1x4", tmp_path / "pv", max_bytes=max_bytes, iters=iters, plugin=str(lib),
                   device="cpu")
    import json

    return rc, json.loads((tmp_path / "pv" / "verify.json").read_text())


TABLE = "allreduce,0,8191,tree,ll,1,1,4\nallreduce,16777216,268435455,ring,simple,8,1,4\n"


def test_verify_passes_only_when_every_row_ran_as_written(tmp_path, monkeypatch, capsys):
    rc, report = run_verify(tmp_path, monkeypatch, TABLE, 1 << 30)
    assert rc == 0 and report["rows_untested"] == [] and report["load_problems"] == []
    assert all(c["ok"] for c in report["cases"]) and report["plugin_loaded"]["applicable"] == 2
    assert "2 of 2 rows called" in capsys.readouterr().out
    rc, report = run_verify(tmp_path, monkeypatch, TABLE, 1 << 30, wrong=0)  # one call NCCL ran otherwise
    assert rc == 1 and not report["cases"][0]["ok"]


def test_a_slower_uncovered_size_is_listed_and_the_verdict_is_the_logged_decision(tmp_path, monkeypatch, capsys):
    """An uncovered size 2x slower on the table's communicator, with the decision NCCL logged the same on
    both, is listed, not failed (the same decision differed up to 1.25x at 20 calls over real sockets);
    a size whose logged decision differs fails whatever its time."""
    rc, report = run_verify(tmp_path, monkeypatch, TABLE, 1 << 30, slow=2.0)
    out = capsys.readouterr().out
    assert rc == 0 and [c["time_ratio"] for c in report["cases"] if c.get("slower")] == [2.0]
    assert "1 at least 1.10x and 2 us slower" in out and "not the table's" in out
    rc, report = run_verify(tmp_path, monkeypatch, TABLE, 1 << 30, wrong=0)
    assert rc == 1


def test_a_row_beyond_max_bytes_fails_the_verdict(tmp_path, monkeypatch, capsys):
    rc, report = run_verify(tmp_path, monkeypatch, TABLE, 1 << 20)
    assert rc == 1 and report["rows_untested"] == [2]
    assert "row 2: allreduce 16777216-268435455: not called" in capsys.readouterr().out


def test_the_plugin_must_say_it_loaded_the_whole_table(tmp_path, monkeypatch):
    for line, why in ((plugin_line(TABLE, 1, rejected=1), "rejected 1 rows"),
                      (plugin_line(TABLE + "\n", 2), "fingerprint"),
                      (plugin_line(TABLE, 2, ranks=2, nodes=2), "2 ranks on 2 nodes"),
                      ("", "logged no table")):
        rc, report = run_verify(tmp_path, monkeypatch, TABLE, 1 << 30, line=line)
        assert rc == 1 and any(why in p for p in report["load_problems"]), (why, report["load_problems"])


def test_a_row_marked_as_nccls_choice_must_be_left_to_nccl_and_its_prediction_is_judged(tmp_path, monkeypatch,
                                                                                         capsys):
    """A row marked as NCCL's choice: the plugin must not load it (NCCL decides that size), and the
    report says whether the row's prediction was NCCL's real choice. NCCL choosing tree/simple/1
    there (the faked log) passes, with the prediction called wrong; the plugin applying the marked
    row fails."""
    marked = TABLE + "#ncclrl:nccl-choice\nallreduce,8192,16777215,ring,ll,2,1,4\n"
    rows = parse_example_rows(marked)
    assert [r["nccl_choice"] for r in rows] == [False, False, True]
    case = {"row": 2, "coll": N.ALLREDUCE, "nbytes": 8192}
    assert expected(case, rows, load_topology("h200-1x4"), ("tree", "simple", 1)) == ("tree", "simple", 1)
    assert expected(case, rows, load_topology("h200-1x4"), ("tree", "simple", 1), as_row=True)[:2] == ("ring", "ll")
    rc, report = run_verify(tmp_path, monkeypatch, marked, 1 << 30, line=plugin_line(marked, 2))
    assert rc == 0 and report["load_problems"] == []
    out = capsys.readouterr().out
    assert "row 3: allreduce 8192-16777215 ring/ll/2" in out and "marked as NCCL's choice: left to NCCL" in out
    rc, report = run_verify(tmp_path, monkeypatch, marked, 1 << 30, line=plugin_line(marked, 3))
    assert rc == 1 and any("the table has 2 it must apply" in p for p in report["load_problems"])


# ---- NCCL releases: real logs of both jobs, replayed into verify() -------------------------------------------

REAL = Path(__file__).resolve().parent / "data" / "verify"


def recorded_logs(stem: str) -> dict[str, str]:
    """Both jobs' rank-0 logs of a recorded verify run: with the plugin (``REAL``) and without
    (the same run's default job, ``tests/data/nccl-logs``)."""
    import gzip

    return {"plugin": gzip.decompress((REAL / f"{stem}-plugin.log.gz").read_bytes()).decode(),
            "default": (REAL.parent / "nccl-logs" / f"{stem}.log").read_text()}


def replay_verify(tmp_path, monkeypatch, logs: dict[str, str], topology: str):
    """verify() with each job's NCCL log replayed from ``logs`` (tag -> text)."""
    import json

    import ncclrl.runners.plugin_verify as pv

    def recorded_job(cases, env, topo_, iters, out, tag, launcher, device="cuda"):
        return {"times_us": [None] * len(cases), "base_times_us": [None] * len(cases), "log": logs[tag],
                "log_path": "x"}

    monkeypatch.setattr(pv, "run_job", recorded_job)
    lib = tmp_path / "lib.so"
    lib.write_bytes(b"")
    rc = pv.verify(str(REAL / "table-handmade.csv"), topology, tmp_path / "pv", max_bytes=256 << 20, iters=0,
                   plugin=str(lib), device="cpu")
    return rc, json.loads((tmp_path / "pv" / "verify.json").read_text())


def test_nccl_2_31_caps_a_rows_channels_and_verify_names_those_rows(tmp_path, monkeypatch, capsys):
    """NCCL 2.31.0 on 2 nodes x 1 GPU: a row's channels are min(row, NCCL's own count). Every call ran
    as the 2.31 rules say, and the rows that ask for more than NCCL lets a plugin give are named."""
    rc, report = replay_verify(tmp_path, monkeypatch, recorded_logs("h200-2x1-sock-nccl2.31.0"), "h200-2x1-sock")
    out = capsys.readouterr().out
    assert rc == 0 and report["nccl_version"] == "2.31.0" and all(c["ok"] for c in report["cases"])
    capped = [c for c in report["cases"] if "capped_at" in c]
    assert {c["row"] + 1 for c in capped} == {1}  # ring/ll/2 at 8188 B: NCCL's own count there is 1
    assert capped[0]["nbytes"] == 8188 and capped[0]["nccl_logged"] == "ring/ll/1"
    assert "from 2.31 a plugin's channels cap NCCL's own per-call count, here 1; the row asks 2" in out
    assert "the communicator has 2" in out  # rows asking more than the communicator's 2 channels
    assert "cannot run as written at some size (named above): 1, 3, 4, 5, 6, 7" in out
    # 2.31 no longer checks LL128 on a socket network: tree/ll128 ran as the row says (2.30 left it to NCCL)
    row2 = [c for c in report["cases"] if c["row"] == 1]
    assert [c["nccl_logged"] for c in row2] == ["tree/ll128/1", "tree/ll128/2", "tree/ll128/2"]


def test_the_same_logs_read_under_2_30_rules_fail(tmp_path, monkeypatch):
    """The rules follow the release the log states: with the version line changed to 2.30.7 the same
    decisions contradict the 2.30 rules (channels replace NCCL's count, LL128 off on sockets)."""
    logs = {tag: text.replace("NCCL version 2.31.0", "NCCL version 2.30.7")
            for tag, text in recorded_logs("h200-2x1-sock-nccl2.31.0").items()}
    rc, report = replay_verify(tmp_path, monkeypatch, logs, "h200-2x1-sock")
    assert rc == 1 and report["nccl_version"] == "2.30.7"
    assert {c["row"] + 1 for c in report["cases"] if not c["ok"]} >= {1, 2}


def test_nccl_2_30_on_nvlink_runs_every_row_as_its_scheduler_spreads_it(tmp_path, monkeypatch, capsys):
    """NCCL 2.30.7, 1 node x 2 GPUs (topology file at 2.28.9: the log's release decides): a row's channels
    replace NCCL's count, its 2.29+ scheduler spreads 32 KiB cells; only the 32-channel row is named."""
    rc, report = replay_verify(tmp_path, monkeypatch, recorded_logs("h200-1x2-nccl2.30.7"), str(REAL / "h200-1x2.yaml"))
    out = capsys.readouterr().out
    assert rc == 0 and report["nccl_version"] == "2.30.7"
    assert [c["nccl_logged"] for c in report["cases"] if c["row"] == 1] == ["tree/ll128/1", "tree/ll128/2",
                                                                            "tree/ll128/8"]
    assert "the row asks 32 channels, the communicator has 24" in out
    assert "(named above): 5" in out and "capped_at" not in json_text(report)


def json_text(report) -> str:
    import json

    return json.dumps(report)


def test_symmetric_kernel_lines_are_read_as_decisions():
    cases = [{"row": 0, "coll": N.ALLREDUCE, "nbytes": 4}, {"row": 0, "coll": N.ALLGATHER, "nbytes": 2048}]
    marker = f"vm:1:1 [0] NCCL INFO Broadcast: {MARKER_BYTES} Bytes -> Algo RING proto LL channel{{Lo..Hi}}={{0..0}}"
    log = "\n".join([marker,
                     "vm:1:1 [0] NCCL INFO AllReduce [Symmetric]: 4 Bytes -> Kernel AllReduce_AGxLL_R nchannels 1 "
                     "nthreads 512 nWorks 1",
                     "vm:1:1 [0] NCCL INFO AllGather [Symmetric]: 1024 Bytes -> Kernel AllGather_LL nchannels 9 "
                     "nthreads 512 nWorks 1"])
    assert match_log(log, cases, 2) == [("symmetric", "AllReduce_AGxLL_R", 1), ("symmetric", "AllGather_LL", 9)]
