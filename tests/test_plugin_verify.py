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
