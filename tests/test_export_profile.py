"""``ncclrl export profile=...``: a table for one job's calls. Rows only for the (collective,
communicator shape, bytes) keys the job calls; ``objective=isolated`` is today's export at those
keys; ``objective=step`` never costs more than it where chosen; the report's savings have
intervals over draws the choice never saw; bad keys are one line and write nothing."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from ncclrl.agents.export import workload_table
from ncclrl.costmodel.profile import build_profile, dump_profile
from ncclrl.costmodel.simulator import Simulator
from ncclrl.costmodel.table import Table, lookup, parse_example_rows
from ncclrl.costmodel.workload import draws, load_workload, resolve_compute, step_cost
from ncclrl.runners.cli import main

PROFILES = Path(__file__).parent / "data" / "profiles"

# a job on dgx-h100-2n's three default shapes (the whole job, one node, one rank per node): the
# 1x8 and 2x16 rows give no node count (0), resolved from the ranks as workload.py does
JOB = """\
kind: ncclrl-job-profile
version: 1
steps: 1
collectives:
- {collective: allgather, nbytes: 1048576, nodes: 0, ranks: 8, dtype: bfloat16, calls_per_step: 24,
   overlaps_compute: "yes"}
- {collective: reducescatter, nbytes: 1048576, nodes: 0, ranks: 8, dtype: bfloat16, calls_per_step: 24,
   overlaps_compute: "yes"}
- {collective: allreduce, nbytes: 33554432, nodes: 2, ranks: 2, dtype: bfloat16, calls_per_step: 4,
   overlaps_compute: partial, compute_us_per_call: 500}
- {collective: allreduce, nbytes: 4, nodes: 0, ranks: 16, dtype: float32, calls_per_step: 2, overlaps_compute: "no"}
- {collective: alltoall, nbytes: 4096, nodes: 2, ranks: 16, dtype: float32, calls_per_step: 2, overlaps_compute: "no"}
"""
KEYS = {("allgather", 1, 8, 1048576), ("reducescatter", 1, 8, 1048576), ("allreduce", 2, 2, 33554432),
        ("allreduce", 2, 16, 4)}


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    path = tmp_path_factory.mktemp("job") / "job.yaml"
    path.write_text(JOB)
    return path


@pytest.fixture(scope="module")
def fsdp(tmp_path_factory):
    """The recorded 2-rank FSDP job's profile, as ``ncclrl profile`` writes it."""
    path = tmp_path_factory.mktemp("fsdp") / "fsdp.yaml"
    dump_profile(build_profile(sorted(PROFILES.glob("fsdp-rank*.trace.json.gz"))), path)
    return path


@pytest.fixture(scope="module")
def today(tmp_path_factory):
    """Today's export of dgx-h100-2n (its default shapes are the job's three)."""
    out = tmp_path_factory.mktemp("today")
    assert main(["export", "topology=dgx-h100-2n", f"run_dir={out}"]) == 0
    return Table.read(out / "table" / "nccl_tuner.json")


def rows_of(run_dir: Path) -> list[dict]:
    return parse_example_rows((run_dir / "table" / "nccl_tuner.csv").read_text())


@pytest.mark.parametrize("objective", ["step", "isolated"])
def test_rows_only_for_the_jobs_keys(tmp_path, job, objective, capsys):
    out = tmp_path / objective
    assert main(["export", "topology=dgx-h100-2n", f"profile={job}", f"objective={objective}",
                 "compute_us_per_call=200", "judge_draws=4", "choose_draws=2", f"run_dir={out}"]) == 0
    rows = rows_of(out)
    assert all(r["channels"] >= 1 and r["algo"] != "-1" for r in rows)  # explicit everywhere
    table = Table.read(out / "table" / "nccl_tuner.json")
    decided = [r for r in table.rows if r.source != "nccl-default"]
    assert {(r.collective, r.nnodes, r.nranks, r.min_bytes) for r in decided} <= KEYS
    assert all(r.min_bytes == r.max_bytes for r in decided)  # the table's own decisions: one key's size each
    assert all(table.lookup(c, b, n, k) is not None for c, n, k, b in KEYS)
    # a size the job never calls, a collective it never calls on a shape: NCCL's own choice, written out
    assert table.lookup("allreduce", 33554433, 2, 2).source == "nccl-default"
    assert table.lookup("allgather", 1048576, 2, 16).source == "nccl-default"
    assert table.lookup("allreduce", 8, 1, 4) is None  # a shape the job never calls: no row
    assert table.provenance["objective"] == objective and table.provenance["keys"] == 4
    printed = capsys.readouterr().out
    assert "alltoall 4096 B x 2/step left out" in printed


def test_isolated_objective_is_todays_export_at_the_jobs_keys(tmp_path, job, today):
    out = tmp_path / "iso"
    assert main(["export", "topology=dgx-h100-2n", f"profile={job}", "objective=isolated", "judge_draws=3",
                 f"run_dir={out}"]) == 0
    mine = Table.read(out / "table" / "nccl_tuner.json")
    assert mine.conf == today.conf
    for coll, nodes, ranks, nbytes in KEYS:
        a, b = mine.lookup(coll, nbytes, nodes, ranks), today.lookup(coll, nbytes, nodes, ranks)
        assert (a.algo, a.proto, a.channels, a.source) == (b.algo, b.proto, b.channels, b.source), (coll, nbytes)
    rep = json.loads((out / "table" / "step_report.json").read_text())
    assert all(r["saved_vs_isolated_us"] == 0 and r["vs_isolated"] == "tie" for r in rep["shapes"])


def test_step_table_never_costs_more_than_isolated_where_chosen(job):
    sim = Simulator("dgx-h100-2n")
    w = resolve_compute(load_workload(job, compute_us_per_call=200.0, topology=sim.topo), sim)
    chosen_on = draws("dgx-h100-2n", range(2), True, stream=1)
    res = workload_table(sim, w, "step", choose_on=chosen_on)
    iso = workload_table(sim, w, "isolated")
    assert iso.table.conf == res.isolated.conf
    where = [sim, *chosen_on]
    mean = lambda t: np.mean([step_cost(p, w, t) for p in where])  # noqa: E731
    assert mean(res.table) <= mean(iso.table) * (1 + 1e-12)
    assert mean(res.table) < mean(iso.table)  # overlapped calls: fewer channels pay here
    for p in where:  # the rows written (explicit channels) cost what the choices cost
        assert step_cost(p, w, res.table) == pytest.approx(step_cost(p, w, res.choices, res.table.conf), rel=1e-12)


def test_the_safety_rule_reaches_the_choice_and_the_provenance(tmp_path, job):
    """headroom= and dominance= go to the choice (headroom 0 without dominance: the plain least
    step cost; the default rule keeps at least as many rows at the isolated choice) and are recorded."""
    sim = Simulator("dgx-h100-2n")
    w = resolve_compute(load_workload(job, compute_us_per_call=60.0, topology=sim.topo), sim)
    chosen_on = draws("dgx-h100-2n", range(2), True, stream=1)
    plain = workload_table(sim, w, "step", choose_on=chosen_on, headroom=0.0, dominance=False)
    safe = workload_table(sim, w, "step", choose_on=chosen_on)
    same = lambda r: sum(r.choices[k] == r.isolated_choices[k] for k in r.choices)  # noqa: E731
    assert same(safe) >= same(plain) and safe.choices != plain.choices
    assert safe.table.provenance["headroom"] == 1.0 and safe.table.provenance["dominance"] is True
    assert plain.table.provenance["headroom"] == 0.0
    out = tmp_path / "plain"
    assert main(["export", "topology=dgx-h100-2n", f"profile={job}", "compute_us_per_call=60", "headroom=0",
                 "dominance=false", "judge_draws=2", f"run_dir={out}"]) == 0
    rep = json.loads((out / "table" / "step_report.json").read_text())
    assert rep["settings"]["headroom"] == 0.0 and rep["settings"]["dominance"] is False


def test_report_prints_the_saving_with_its_interval(tmp_path, fsdp, capsys):
    out = tmp_path / "fsdp"
    assert main(["export", "topology=h200-1x4", f"profile={fsdp}", "compute_ratio=2", "unknown_overlap=1",
                 f"run_dir={out}"]) == 0
    printed = capsys.readouterr().out
    assert "judged on: 10 misspecified draws (seeds 100-109, stream 0)" in printed
    assert "chosen on: the nominal simulator + 5 misspecified draws (seeds 0-4, stream 1)" in printed
    num = r"-?[\d.]+ (?:us|ms|s)"  # a time as people read it (format_time_us): never 4.317e+04 us

    def us(text: str) -> float:
        value, unit = text.split()
        return float(value) * {"us": 1.0, "ms": 1e3, "s": 1e6}[unit]

    line = next(ln for ln in printed.splitlines() if ln.startswith("1x2 ") and "[" in ln)  # the shape's saving
    cells = re.findall(rf"({num}) \[({num}), ({num})\]", line)
    assert len(cells) == 5 and "e+" not in line  # NCCL default, isolated, this table, saved vs each
    for m, lo, hi in map(lambda c: tuple(map(us, c)), cells):
        assert lo <= m <= hi  # (three significant digits each)
    rep = json.loads((out / "table" / "step_report.json").read_text())
    s = rep["shapes"][0]
    assert s["shape"] == "1x2" and s["draws"] == 10
    assert s["saved_vs_nccl_us"] == pytest.approx(s["nccl_us"] - s["table_us"])
    assert s["saved_vs_isolated_lo"] < s["saved_vs_isolated_us"] < s["saved_vs_isolated_hi"]
    assert set(rep["settings"]["judged_on"]["misspecified_seeds"]).isdisjoint(
        rep["settings"]["chosen_on"]["misspecified_seeds"]) or \
        rep["settings"]["judged_on"]["stream"] != rep["settings"]["chosen_on"]["stream"]
    csv = (out / "table" / "step_report.csv").read_text().splitlines()
    assert csv[0].startswith("shape,keys,draws,nccl_us") and csv[1].startswith("1x2,4,10,")
    assert (out / "report.txt").read_text().startswith("ncclrl: table for the job fsdp on h200-1x4")


def test_a_profile_of_unknown_nodes_resolves_as_the_workload_does(tmp_path, job):
    topo = Simulator("dgx-h100-2n").topo
    w = load_workload(job, topology=topo)
    assert set(w.call_keys()) == KEYS  # 8 ranks: one node; 16 ranks: both nodes
    out = tmp_path / "resolved"
    assert main(["export", "topology=dgx-h100-2n", f"profile={job}", "objective=isolated", "judge_draws=2",
                 f"run_dir={out}"]) == 0
    rows = rows_of(out)
    assert {(r["nNodes"], r["nRanks"]) for r in rows} == {(n, k) for _, n, k, _ in w.call_keys()}
    assert all(lookup(rows, c, b, n, k) is not None for c, n, k, b in w.call_keys())


@pytest.mark.parametrize("args,needle", [
    (["objective=fast"], "objective: allowed: step, isolated; got 'fast'"),
    (["compute_ratio=2", "compute_us_per_call=10"], "compute_ratio: give compute_us_per_call or compute_ratio"),
    (["mem_frac=1.5"], "mem_frac: must be a number >= 0 and <= 1"),
    (["unknown_overlap=-0.1"], "unknown_overlap: must be a number >= 0 and <= 1"),
    (["compute_ratio=-1"], "compute_ratio: must be a number >= 0"),
    (["compute_us_per_call=abc"], "compute_us_per_call"),
    (["judge_draws=1"], "judge_draws: must be >= 2"),
    (["choose_draws=-1"], "choose_draws: must be >= 0"),
    (["profile=/nonexistent/job.yaml"], "profile: file not found"),
    (["topology=h200-1x4"], "profile: "),  # the job's 16-rank calls do not fit 4 GPUs
    (["NOPROFILE", "objective=step"], "objective: applies to a job's table only: give profile=PATH"),
    (["NOPROFILE", "compute_ratio=2"], "compute_ratio: applies to a job's table only"),
    (["headroom=-0.5"], "headroom: must be a number >= 0"),
    (["NOPROFILE", "headroom=0"], "headroom: applies to a job's table only"),
    (["NOPROFILE", "dominance=false"], "dominance: applies to a job's table only"),
])
def test_bad_keys_exit_2_with_one_line_and_write_nothing(tmp_path, job, capsys, args, needle):
    out = tmp_path / "never"
    base = ["export", "topology=dgx-h100-2n", f"run_dir={out}"]
    if args[0] == "NOPROFILE":
        args = args[1:]
    elif not any(a.startswith("profile=") for a in args):
        base.append(f"profile={job}")
    code = main([*base, *args])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and needle in err, err
    assert not out.exists()


def test_a_profile_that_is_not_one_is_one_line(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("kind: something-else\n")
    assert main(["export", f"profile={bad}", f"run_dir={tmp_path / 'x'}"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "profile: " in err and "not an ncclrl job profile" in err
    assert not (tmp_path / "x").exists()
