"""Measured grids given as files as replay truths (:mod:`ncclrl.envs.grids`): each accepted format,
NCCL's default from each source, sizes above 4 GiB kept, the replay commands and the public grids."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import numpy as np
import pytest

from ncclrl.agents.baselines import Evaluator, make_tuner
from ncclrl.agents.suite import gridded, public_gridded
from ncclrl.costmodel import nccl as N
from ncclrl.costmodel.detect import parse_logs
from ncclrl.costmodel.errors import ConfigError
from ncclrl.costmodel.jobcost import DEFAULT_JOB_COST
from ncclrl.costmodel.nccltests import parse_file
from ncclrl.costmodel.replica import default_decisions
from ncclrl.costmodel.space import DEFAULT, Point
from ncclrl.costmodel.table import MAX_BYTES, Table
from ncclrl.costmodel.topology import load_topology
from ncclrl.envs.grids import BASE_KNOBS, PUBLIC_GRIDS, GridWorkers, file_format, public_grid_folder, read_grid
from ncclrl.runners.cli import main

REPO = Path(__file__).resolve().parents[1]
CORPUS = REPO / "tests" / "data" / "nccltests-corpus"
AR = N.ALLREDUCE
GIB = 1 << 30


@pytest.fixture(scope="module")
def h200():
    return load_topology("h200-1x4")


@pytest.fixture(scope="module")
def forced(allreduce_files) -> list[Path]:
    """The recorded runs that force an algorithm and a protocol, nothing else."""
    return [f for f in allreduce_files if f.stem.count("_") == 4 and "_c" not in f.stem[-4:]]


def test_nccltests_outputs_give_one_configuration_per_file_and_their_times(allreduce_files, h200):
    g = read_grid(allreduce_files, h200)
    assert g.formats == ["nccl-tests"] and g.default_source.startswith("measured: NCCL's unforced runs")
    assert {("ring", "ll", 0), ("tree", "simple", 0), ("ring", "ll128", 0)} <= set(g.configurations())
    # NCCL_MIN/MAX_NCHANNELS=8 and NCCL_BUFFSIZE are knob settings, NCCL's plain defaults first
    comm = [k.comm_channels for k in g.knobs]
    assert g.knobs[0].knobs == BASE_KNOBS and {1, 8, 32} <= set(comm)
    assert any(k.buffsize_bytes == 1 << 20 for k in g.knobs)
    f = next(f for f in allreduce_files if f.stem.endswith("__ring_LL_c8"))
    run = parse_file(f)
    k8 = next(k for k in g.knobs if k.comm_channels == 8 and not k.buffsize_bytes)
    rec = next(r for r in run.records if r.nbytes == 1 << 20)
    assert g.recorded[(k8.knobs, AR, 1 << 20, ("ring", "ll", 0))] == [rec.times_us]
    base = parse_file(next(f for f in allreduce_files if f.stem.endswith("__default")))
    assert g.sizes[AR] == sorted(r.nbytes for r in base.records)
    assert any("file name" in n for n in g.notes)  # these outputs do not print what they forced


def test_a_partly_forced_run_or_an_unnamed_collective_is_refused_in_one_line(allreduce_files, h200, tmp_path):
    # a real output whose name forces NCCL_ALGO=ring alone: the protocol (NCCL's, per size) is unknown
    src = next(f for f in allreduce_files if f.stem.endswith("__ring_LL"))
    part = tmp_path / "all_reduce__ring.txt"
    part.write_bytes(src.read_bytes())
    with pytest.raises(ConfigError) as e:
        read_grid([part], h200)
    assert e.value.field == "grid" and "NCCL_ALGO='ring'" in str(e.value) and "\n" not in str(e.value)
    # a real output of NCCL's defaults alone is no grid
    with pytest.raises(ConfigError, match="no forced configuration"):
        read_grid([CORPUS / "oracle-quick--oci-hpc-oke-docs-running-nccl-rccl-tests-from-slurm-operator--1.txt"],
                  load_topology("h200-2x2-sock"))  # its 4 ranks ran on 2 hosts
    # a real output that does not say which collective it ran
    with pytest.raises(ConfigError, match="is not tunable"):
        read_grid([CORPUS / "cci-moc--all-reduce-roce-1gpu-log.txt"], load_topology("h200-2x1-sock"))


def test_a_run_of_one_process_on_one_node_is_refused_on_a_platform_of_smaller_nodes(allreduce_files, tmp_path):
    """The recorded runs drove 4 GPUs from one process (one node): 2 nodes x 2 GPUs has as many ranks,
    but not a node that holds them; one line naming the run's process."""
    with pytest.raises(ConfigError) as e:
        read_grid(allreduce_files, load_topology("h200-2x2-sock"))
    assert e.value.field == "grid" and "ran 4 ranks in one process" in str(e.value)
    assert "h200-2x2-sock has 2 GPUs per node" in str(e.value) and "\n" not in str(e.value)
    grid = f"grid=[{','.join(map(str, allreduce_files))}]"
    assert main(["finetune", "backend=replay", "topology=h200-2x2-sock", grid, f"store={tmp_path / 'ft.sqlite'}",
                 f"out={tmp_path / 'ft'}"]) == 2
    assert not list(tmp_path.iterdir())  # no store, no folder
    # the same run printed by four processes on two hosts: more hosts than the one node of h200-1x4
    src = next(f for f in allreduce_files if f.stem.endswith("__default"))
    text = re.sub(r"#  Rank  (\d) Group  0 Pid +\d+ on +vm",
                  lambda m: f"#  Rank  {m[1]} Group  0 Pid   {100 + int(m[1])} on   host{int(m[1]) // 2}",
                  src.read_text())
    two = tmp_path / "all_reduce__two_hosts.txt"
    two.write_text(text)
    assert "host1" in text
    with pytest.raises(ConfigError, match="ran on 2 hosts .* but h200-1x4 has 1 node;"):
        read_grid([two], load_topology("h200-1x4"))


def test_the_default_from_a_run_of_nccls_defaults(forced, allreduce_files, h200):
    dflt = next(f for f in allreduce_files if f.stem.endswith("__default"))
    g = read_grid(forced, h200, [str(dflt)])
    assert g.default_source == f"measured: NCCL's defaults run in {dflt.name}"
    rec = {r.nbytes: r.times_us for r in parse_file(dflt).records}
    assert all(g.recorded[(BASE_KNOBS, AR, s, DEFAULT)] == [rec[s]] for s in g.sizes[AR])


def test_the_default_from_nccls_log_is_its_logged_choice_timed_by_the_grid(forced, h200_data, h200):
    log = h200_data / "nccl_decisions_1node_4gpu.log"
    g = read_grid(forced, h200, [str(log)])
    assert g.default_source.startswith("NCCL's logged decisions in nccl_decisions_1node_4gpu.log")
    logged = {d.log_nbytes: (N.ALGOS[d.algo], N.PROTOS[d.proto], 0) for d in parse_logs([log]).decisions
              if d.coll == AR}
    assert set(g.sizes[AR]) == set(logged) & {x[2] for x in g.recorded}
    for s in g.sizes[AR]:
        assert g.recorded[(BASE_KNOBS, AR, s, DEFAULT)] == g.recorded[(BASE_KNOBS, AR, s, logged[s])]
    assert any("left out, NCCL's default unknown" in n for n in g.notes)  # sizes the log never called


def test_the_default_from_the_replica_is_its_predicted_choice(forced, h200_data, h200):
    g = read_grid(forced, h200, "replica")
    assert "replica" in g.default_source and "prediction" in g.default_source
    sizes = np.array(g.sizes[AR])
    d = default_decisions(h200, AR, sizes)
    for s, a, p in zip(sizes, d.algo, d.proto, strict=True):
        assert g.recorded[(BASE_KNOBS, AR, int(s), DEFAULT)] == \
            g.recorded[(BASE_KNOBS, AR, int(s), (N.ALGOS[a], N.PROTOS[p], 0))]
    # the replica agrees with NCCL's logged decisions on this machine: the same truth where both exist
    logged = read_grid(forced, h200, [str(h200_data / "nccl_decisions_1node_4gpu.log")])
    for s in logged.sizes[AR]:
        assert logged.recorded[(BASE_KNOBS, AR, s, DEFAULT)] == g.recorded[(BASE_KNOBS, AR, s, DEFAULT)]


NVIDIA_CSV = ("collective,size_bytes,algorithm,protocol,channels,nodes,ranks,pipeOps,regBuff,cost_metric,"
              "bandwidth_gbps,latency_us\n") + """allreduce,1048576,ring,simple,-1,2,16,-1,-1,0,80.0,120.0
allreduce,1048576,tree,ll128,8,2,16,-1,-1,0,90.0,100.0
allreduce,1048576,ring,simple,-1,2,16,-1,-1,0,79.0,124.0
allreduce,1048576,tree,simple,4,1,8,-1,-1,0,99.0,10.0
allreduce,8589934592,ring,simple,-1,-1,-1,-1,-1,0,350.0,48000.0
allreduce,8589934592,tree,ll128,8,2,16,-1,-1,0,300.0,56000.0
allreduce,8589934592,nvls_tree,simple,16,2,16,-1,-1,0,,
"""


def _nvidia(tmp_path: Path) -> tuple[Path, Path]:
    csv = tmp_path / "perf.csv"
    csv.write_text(NVIDIA_CSV)
    dflt = tmp_path / "nccl_default.csv"
    dflt.write_text("nbytes,time_us\n1048576,130.0\n8589934592,47000.0\n")
    return csv, dflt


def test_nvidia_csv_rows_of_the_platform_with_their_channels_and_a_size_above_4_gib(tmp_path):
    csv, dflt = _nvidia(tmp_path)
    topo = load_topology("dgx-h100-2n")
    assert file_format(csv) == "NVIDIA example-plugin CSV"
    g = read_grid([csv], topo, [str(dflt)])
    assert g.sizes[AR] == [1 << 20, 8 * GIB]  # 8 GiB kept
    assert g.configurations() == [("ring", "simple", 0), ("tree", "ll128", 8)]  # the 1-node row left out
    assert g.recorded[(BASE_KNOBS, AR, 1 << 20, ("ring", "simple", 0))] == [[120.0], [124.0]]  # two rows, two jobs
    assert g.recorded[(BASE_KNOBS, AR, 8 * GIB, DEFAULT)] == [[47000.0]]
    assert any("without a finite latency_us" in n for n in g.notes)
    inst = gridded(g, topo, "infiniband")
    assert inst.problem.space(AR, inst.problem.base) == [DEFAULT, ("ring", "simple", 0), ("tree", "ll128", 8)]
    # truth: pooled medians; the optimum takes tree/ll128/8 at 1 MiB (130 -> 100) and keeps NCCL's at 8 GiB
    assert inst.oracle.optimum == pytest.approx(np.sqrt(130.0 / 100.0 * 1.0))
    best = inst.oracle.best_decision()
    assert best.rows == {(AR, 1 << 20): ("tree", "ll128", 8)}


def test_grid_workers_answer_each_job_in_turn_and_fail_what_the_grid_lacks(tmp_path):
    csv, dflt = _nvidia(tmp_path)
    g = read_grid([csv], load_topology("dgx-h100-2n"), [str(dflt)])
    w = GridWorkers(g, g.knobs[0])
    p = Point("allreduce", 1 << 20, "ring", "simple", 0)
    q = Point("allreduce", 1 << 20, "ring", "ll", 0)
    assert [w.measure([p])[0] for _ in range(3)] == [[120.0], [124.0], [120.0]]
    assert w.measure([q]) == [None] and w.failures == {0: "not in the replayed grid"}


def test_finetune_replays_a_grid_file_and_tables_sizes_above_4_gib(tmp_path, monkeypatch):
    csv, dflt = _nvidia(tmp_path)
    monkeypatch.setenv("NCCLRL_PROGRESS", "0")
    out = tmp_path / "out"
    code = main(["finetune", "backend=replay", "topology=dgx-h100-2n", f"grid={csv}", f"grid_default={dflt}",
                 "budget=1sweep", f"out={out}", f"store={tmp_path / 'ft.sqlite'}"])
    assert code == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["grid_cells"] == 2 and summary["default_source"].startswith("measured")
    assert summary["speedup_on_grid"] <= summary["optimum"] + 1e-9
    table = Table.read(out / "nccl_tuner.csv")
    assert all(r.min_bytes <= r.max_bytes for r in table.rows)
    last = max(table.rows, key=lambda r: r.max_bytes) if table.rows else None
    assert last is None or last.max_bytes >= MAX_BYTES


@pytest.mark.parametrize("argv, field", [
    (["grid=/nonexistent.csv"], "grid"),
    (["grid=/nonexistent.csv", "backend=torch"], "grid"),
    (["grid=GRID", "grid_default=/no/log.txt"], "default"),
])
def test_bad_grid_arguments_are_one_line_exit_2(tmp_path, capsys, argv, field):
    csv, _ = _nvidia(tmp_path)
    argv = [a.replace("GRID", str(csv)) for a in argv]
    code = main(["tune", "method=random", "backend=replay", "topology=dgx-h100-2n", *argv, f"out={tmp_path}/o"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and err.count("\n") == 0 and f"error: {field}" in err


def _public() -> Path | None:
    for root in (os.environ.get("NCCLRL_SHARED_DATA"), REPO.parent / "shared" / "data"):
        if root and (Path(root) / "public-grids").is_dir():
            return Path(root)
    return None


@pytest.mark.public_grids
def test_the_public_grids_become_problems():
    root = _public()
    assert public_grid_folder(root).is_dir()
    p16 = public_gridded("p5en-16n", root)
    assert p16.problem.default_source.startswith("measured: NCCL's defaults run in tuner_comparison")
    assert p16.problem.n_cells == 36 and 1.0 < p16.oracle.optimum < 1.5
    p2 = public_gridded("p5en-2n", root)
    assert "replica" in p2.problem.default_source and p2.problem.n_cells == 69
    assert max(p2.problem.sizes[AR]) == 16 * GIB  # above 4 GiB, tunable
    assert len(p2.problem.space(AR, p2.problem.base)) == 8  # NCCL's + 7 forced algorithm x protocol pairs
    step = public_gridded("a100-2x4-step", root)
    assert step.problem.default_source.startswith("measured") and step.problem.n_cells == 6
    budget = 0.3 * p2.oracle.sweep_gpu_s(DEFAULT_JOB_COST, 5)
    ev = Evaluator(p2.problem, p2.measure_for(0), budget)
    d = make_tuner("random", None).tune(p2.problem, ev, 0)
    assert 0 < ev.gpu_s <= budget and p2.oracle.score(d).speedup > 0
    assert set(PUBLIC_GRIDS) >= {"p5en-2n", "p5en-16n", "p5en-128n"}


def test_the_benchmark_grids_set_skips_in_one_line_without_the_shared_folder(tmp_path, monkeypatch, caplog):
    from ncclrl.runners.benchmark import benchmark, check, compose, tasks

    monkeypatch.chdir(REPO)  # the suite's replay stores are named from the repository's root
    cfg = compose(["suite=grids", "suite.seeds=[0]"])
    check(cfg)
    monkeypatch.setenv("NCCLRL_SHARED_DATA", str(tmp_path))
    with caplog.at_level("INFO"):
        assert tasks(cfg) == [] and tasks(cfg) == []
    said = [r.getMessage() for r in caplog.records if "grids skipped" in r.getMessage()]
    assert len(said) == 1 and str(tmp_path / "public-grids") in said[0] and "\n" not in said[0]
    # the grids set alone, without the grids, poses no problem: refused before anything runs
    with pytest.raises(ConfigError, match="grids set alone poses no problem here"):
        benchmark(compose(["suite=grids", "suite.seeds=[0]", "suite.methods=[default]", "workers=1",
                           f"out={tmp_path / 'b'}"]))
    assert not (tmp_path / "b").exists()
    with pytest.raises(ConfigError) as e:
        check(compose(["suite=grids", "suite.grids=[p5en-3n]"]))
    assert e.value.field == "suite.grids" and "p5en-16n" in str(e.value)


@pytest.mark.public_grids
def test_the_benchmark_grids_set_poses_each_public_grid(monkeypatch):
    from ncclrl.runners.benchmark import compose, instance, tasks

    monkeypatch.setenv("NCCLRL_SHARED_DATA", str(_public()))
    ts = tasks(compose(["suite=grids", "suite.seeds=[0]"]))
    assert [t["grid"] for t in ts] == list(PUBLIC_GRIDS)
    assert {t["family"] for t in ts} <= {"infiniband", "nvlink", "socket"}
    inst = instance(ts[1], {})
    assert inst.problem.grid is not None and inst.family == "infiniband"


def test_a_tuned_row_above_4_gib_is_written_as_a_row_that_covers_it(tmp_path):
    from ncclrl.agents.finetune import Outcome, write_outcome

    topo = load_topology("dgx-h100-2n")
    sizes = {AR: [1 << 20, 8 * GIB, 16 * GIB]}
    rows = [{"collective": "allreduce", "nbytes": s, "key": ("tree", "ll128", 8)} for s in (8 * GIB, 16 * GIB)]
    write_outcome(Outcome(conf=Point("allreduce", 1), rows=rows, measured=3, rounds=1), topo, sizes, tmp_path, {})
    table = Table.read(tmp_path / "nccl_tuner.csv")
    above = [(r.min_bytes, r.max_bytes) for r in table.rows if r.collective == "allreduce" and r.max_bytes > MAX_BYTES]
    assert above == [(8 * GIB, 16 * GIB - 1), (16 * GIB, 16 * GIB)]
    assert table.lookup("allreduce", 12 * GIB, 2, 16).algo == "tree"
    below = table.lookup("allreduce", 2 * GIB, 2, 16)  # below: NCCL's own choice, written out with its channels
    assert below is not None and below.channels > 0 and (below.algo, below.proto) != ("tree", "ll128")


@pytest.mark.parametrize("text, says", [
    ("all_reduce_perf-2/a.txt,8192,79.0,0.1,0.2,79.2,0.1,0.2,2,ring,simple\nall_reduce_perf-2/a.txt,16K,81.0,0.2,0.4,79.0,0.2,0.4,2,ring,simple\n",
     "size_B and nodes must be whole numbers"),
    ("all_reduce_perf-2/a.txt,8192,79.0,0.1,0.2,79.2,0.1,0.2,2,ring,fast\n", "protocol"),
    ("a.txt,8192,79.0,0.1,0.2,79.2,0.1,0.2,2,ring,simple\n", "names no collective"),
])
def test_a_malformed_rows_csv_is_one_line(tmp_path, text, says):
    f = tmp_path / "rows.csv"
    f.write_text(text)
    with pytest.raises(ConfigError) as e:
        read_grid([f], load_topology("p5en-2n"))
    assert says in str(e.value) and "\n" not in str(e.value) and f"{f}:" in str(e.value)
