"""Tables that both tuner plugins read the same way: every command that writes a table covers every
size of every collective of every communicator shape it names, with explicit algorithm, protocol
and channels (NCCL's own choice, from the replica, where nothing was decided); ncclrl's plugin (its
own code, through the table checker) and NVIDIA's example plugin (its rules, emulated) then make
the same decision at every size; ``ncclrl show`` prints shapes, exact bytes and where rows come from."""

from __future__ import annotations

import json
import random
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from ncclrl.costmodel import nccl as N
from ncclrl.costmodel.errors import ConfigError
from ncclrl.costmodel.replica import auto_channels, build_model, default_decisions
from ncclrl.costmodel.table import (
    MAX_BYTES,
    NCCL_OWN,
    Row,
    Table,
    check_text,
    example_decision,
    parse_example_rows,
    plugin_checker,
    plugin_decision,
    replica_pieces,
)
from ncclrl.costmodel.topology import load_topology
from ncclrl.runners.cli import main

REPO = Path(__file__).resolve().parents[1]
LIVE = REPO / "data" / "h200x4-2026-11-21" / "store.sqlite"
REPLAY = ["backend=replay", f"replay_store={LIVE}", "launch=nccl", "topology=h200-2x2-sock"]
JOB = """\
kind: ncclrl-job-profile
version: 1
steps: 1
collectives:
- {collective: allreduce, nbytes: 1048576, nodes: 2, ranks: 4, dtype: bfloat16, calls_per_step: 4,
   overlaps_compute: "no"}
- {collective: allgather, nbytes: 65536, nodes: 1, ranks: 2, dtype: bfloat16, calls_per_step: 2,
   overlaps_compute: "no"}
"""


@pytest.fixture(scope="module")
def checker(tmp_path_factory) -> Path:
    return plugin_checker(tmp_path_factory.mktemp("checker"))


def named_shapes(rows: list[dict]) -> list[tuple[int, int]]:
    return list(dict.fromkeys((r["nNodes"], r["nRanks"]) for r in rows if r["nNodes"] != -1 and r["nRanks"] != -1))


def assert_complete(text: str) -> None:
    """Every size 0 .. MAX_BYTES of every collective of every shape the rows name is covered once,
    by a row with an explicit algorithm, protocol and channel count."""
    rows = parse_example_rows(text)
    assert rows and named_shapes(rows)
    for nodes, nranks in named_shapes(rows):
        for coll in N.COLLECTIVES:
            lane = sorted((r for r in rows if r["collective"] == coll and r["nNodes"] in (-1, nodes) and
                           r["nRanks"] in (-1, nranks)), key=lambda r: r["min_bytes"])
            where = (coll, nodes, nranks)
            assert lane and lane[0]["min_bytes"] == 0 and lane[-1]["max_bytes"] == MAX_BYTES, where
            for a, b in zip(lane, lane[1:], strict=False):
                assert b["min_bytes"] == a["max_bytes"] + 1, (where, a, b)  # no gap, no overlap
            for r in lane:
                assert r["channels"] >= 1 and r["algo"] in N.ALGOS and r["proto"] in N.PROTOS, (where, r)


def comm_channels(topo, conf: dict) -> int:
    ch = topo.nccl.channels
    if conf.get("NCCL_MAX_NCHANNELS"):
        ch = min(ch, conf["NCCL_MAX_NCHANNELS"])
    return max(ch, conf.get("NCCL_MIN_NCHANNELS", 0))


def assert_filled_rows_are_nccls_choice(doc: dict, topo) -> int:
    """Rows the JSON marks as NCCL's choice state the replica's decision at their ends and middle."""
    filled = [r for r in doc.get("table_rows", doc["rows"]) if r["source"] == "nccl-default"]
    for r in filled:
        shape = topo.shape(r["nnodes"], r["nranks"])
        sizes = sorted({max(r["min_bytes"], 1), r["max_bytes"], (r["min_bytes"] + r["max_bytes"]) // 2 or 1})
        d = default_decisions(shape, r["collective"], sizes, comm_channels=comm_channels(shape, doc["nccl_conf"]))
        got = {(N.ALGOS[a], N.PROTOS[p], int(c)) for a, p, c in zip(d.algo, d.proto, d.max_channels, strict=True)}
        assert got == {(r["algo"], r["proto"], r["channels"])}, r
    return len(filled)


# -- the replica's decisions, cut exactly -----------------------------------------------------------

@pytest.mark.parametrize("topology, shape, comm", [("h200-1x4", (1, 4), 0), ("h200-2x2-sock", (2, 4), 0),
                                                   ("dgx-h100-2n", (2, 16), 32), ("dgx-h100-2n", (1, 8), 0)])
def test_replica_pieces_are_ncclrls_choice_at_every_size(topology, shape, comm):
    """Each piece holds the replica's decision at both ends, one byte past each end differs, and
    random sizes (log-uniform and uniform) land in the piece that states their decision."""
    topo = load_topology(topology).shape(*shape)
    rng = np.random.default_rng(1)
    for coll in N.COLLECTIVES:
        pieces = replica_pieces(topo, coll, 0, MAX_BYTES, comm_channels=comm)
        assert pieces[0][0] == 0 and pieces[-1][1] == MAX_BYTES
        assert all(b[0] == a[1] + 1 for a, b in zip(pieces, pieces[1:], strict=False))
        ends = sorted({s for lo, hi, *_ in pieces for s in (lo, hi, lo - 1, hi + 1) if 1 <= s <= MAX_BYTES})
        sizes = np.unique(np.concatenate([ends, rng.integers(1, MAX_BYTES, 3000),
                                          (2.0 ** rng.uniform(0, 32, 3000)).astype(np.int64)]))
        d = default_decisions(topo, coll, sizes, comm_channels=comm)
        starts = np.array([p[0] for p in pieces])
        at = np.searchsorted(starts, sizes, side="right") - 1
        for i, s in enumerate(sizes):
            _, _, a, p, ch = pieces[at[i]]
            assert (a, p, ch) == (N.ALGOS[d.algo[i]], N.PROTOS[d.proto[i]], int(d.max_channels[i])), (coll, int(s))
        # a forced algorithm keeping NCCL's channel count: the count NCCL picks for that algorithm
        forced = replica_pieces(topo, coll, 1000, 1 << 26, "ring", "simple", 0, comm)
        s = np.array([lo for lo, *_ in forced] + [hi for _, hi, *_ in forced])
        ch, _ = auto_channels(build_model(topo), s, np.full(s.shape, N.RING), np.full(s.shape, N.SIMPLE),
                              comm or topo.nccl.channels)
        assert list(ch) == [c for *_, c in forced] * 2


# -- completion ------------------------------------------------------------------------------------

def test_complete_fills_gaps_and_states_nccls_channels():
    """Gaps, a row keeping NCCL's channels and a row keeping NCCL's algorithm become rows both
    plugins read alike; decided rows stay as they are; collectives the rows never name are covered."""
    topo = load_topology("h200-2x2-sock")
    rows = [Row("allreduce", 0, 255, "tree", "ll", 2, nnodes=2, nranks=4),
            Row("allreduce", 512, 4095, "ring", "ll", -1, nnodes=2, nranks=4),  # NCCL's channels
            Row("allreduce", 131072, 1 << 20, "default", "default", 2, nnodes=2, nranks=4)]  # NCCL's algorithm
    table = Table(topo, rows, {}, title="t")
    done = table.complete()
    assert_complete(done.csv_text())
    assert done.rows[0] == rows[0]
    for r in done.rows:  # NCCL's choice exactly where no row decided
        inside = any(r.collective == o.collective and o.min_bytes <= r.min_bytes <= o.max_bytes for o in rows)
        assert (r.source == "nccl-default") != inside, r
    d = default_decisions(topo, "allreduce", [256, 511, 4096, 131071, (1 << 20) + 1, MAX_BYTES])
    for i, s in enumerate(d.nbytes):
        r = done.lookup("allreduce", int(s), 2, 4)
        assert (r.algo, r.proto, r.channels, r.source) == \
            (N.ALGOS[d.algo[i]], N.PROTOS[d.proto[i]], int(d.max_channels[i]), "nccl-default")
    ring = auto_channels(build_model(topo), np.array([512, 4095]), np.array([N.RING] * 2), np.array([N.LL] * 2))[0]
    assert [done.lookup("allreduce", s, 2, 4).channels for s in (512, 4095)] == list(ring)
    mid = default_decisions(topo, "allreduce", [131072, 1 << 20])
    assert [(done.lookup("allreduce", s, 2, 4).algo, done.lookup("allreduce", s, 2, 4).channels)
            for s in (131072, 1 << 20)] == [(N.ALGOS[a], 2) for a in mid.algo]
    assert [r.line() for r in done.complete().rows] == [r.line() for r in done.rows]  # once is enough


@pytest.mark.parametrize("table, says", [
    (Table(None, [Row("allreduce", 0, 1000, "ring", "ll", 2)]), "leave allreduce 1001..4294967295"),
    (Table(load_topology("h200-2x2-sock"), [Row("allreduce", 0, MAX_BYTES, "ring", "ll", -1)]), "differ by"),
    (Table(None, [Row("allreduce", 0, 1000, "ring", "ll", 2, nnodes=2, nranks=4)]), "no topology"),
    (Table(load_topology("h200-2x2-sock"), [Row("allreduce", 0, 1000, "ring", "ll", 2, nnodes=4, nranks=8)]),
     "4 nodes x 8 ranks"),
    (Table(load_topology("h200-2x2-sock"), [Row("allreduce", 0, 1000, "ring", "ll", 2, nnodes=2, nranks=4),
                                            Row("allreduce", 1000, 2000, "ring", "ll", 2, nnodes=2, nranks=4)]),
     "overlap"),
    (Table(load_topology("h200-2x2-sock"), [Row("alltoall", 0, 10, "ring", "ll", 2, nnodes=2, nranks=4)]),
     "unknown collective")])
def test_a_table_that_cannot_be_completed_is_refused_in_one_line_and_not_written(tmp_path, table, says):
    with pytest.raises(ConfigError, match=says) as e:
        table.write(tmp_path / "out")
    assert "\n" not in str(e.value) and not (tmp_path / "out").exists()


# -- both plugins, one reading ---------------------------------------------------------------------

def probe_sizes(rows: list[dict], rng: random.Random) -> list[int]:
    """Every row boundary and one byte either side, the points between, powers of two +-1, random sizes."""
    sizes = {0, 1, MAX_BYTES}
    for r in rows:
        lo, hi = r["min_bytes"], r["max_bytes"]
        sizes.update({lo - 1, lo, lo + 1, (lo + hi) // 2, hi - 1, hi, hi + 1})
        sizes.update(rng.randint(lo, hi) for _ in range(2))
    sizes.update(v + e for k in range(33) for v in (1 << k,) for e in (-1, 0, 1))
    return sorted(s for s in sizes if 0 <= s <= MAX_BYTES)


def disagreements(text: str, checker: Path, shapes: list[tuple[int, int]]) -> list[tuple]:
    """Where ncclrl's plugin (its own code) and NVIDIA's example plugin (its rules) decide differently,
    but for sizes whose row is marked as NCCL's choice: there ncclrl's plugin must leave the call to
    NCCL (its real choice) while the example plugin runs the row (the replica's prediction of it)."""
    check = check_text(text, checker)
    assert check.ok, [v.message for v in check.rejected] or check.refused
    rows = parse_example_rows(text)
    rng = random.Random(0)
    out = []
    for coll in N.COLLECTIVES:  # (each collective's rows alone: the same first match, faster)
        mine = [r for r in rows if r["collective"] == coll]
        sub = replace(check, verdicts=[v for v in check.verdicts if v.accepted and v.row[0] == coll])
        sizes = probe_sizes(mine, rng)
        for nodes, nranks in shapes:
            for s in sizes:
                ours = plugin_decision(sub, coll, s, nodes, nranks)
                theirs = example_decision(mine, coll, s, nodes, nranks)
                row = next((r for r in mine if r["min_bytes"] <= s <= r["max_bytes"] and r["nNodes"] in (-1, nodes)
                            and r["nRanks"] in (-1, nranks)), None)
                if row is not None and row["nccl_choice"]:
                    theirs = (NCCL_OWN, NCCL_OWN, 0)
                if ours != theirs:
                    out.append((coll, nodes, nranks, s, ours, theirs))
    return out


@pytest.fixture(scope="module")
def written(tmp_path_factory) -> dict[str, Path]:
    """A table from every command that writes one (the folder it wrote): ``ncclrl export`` and
    ``ncclrl pretrain`` write :func:`export_table`'s table, ``ncclrl export profile=`` writes
    :func:`workload_table`'s (each through ``Table.write``, as those commands do, without their
    reports); ``ncclrl finetune`` and ``ncclrl tune`` run whole, on the recorded sweep."""
    from ncclrl.agents.export import export_table, workload_table
    from ncclrl.costmodel.simulator import Simulator
    from ncclrl.costmodel.workload import load_workload, resolve_compute

    root = tmp_path_factory.mktemp("written")
    export_table(Simulator("h200-1x4")).write(root / "export")
    job = root / "job.yaml"
    job.write_text(JOB)
    sim = Simulator("h200-2x2-sock")
    work = resolve_compute(load_workload(job, compute_us_per_call=100.0, topology=sim.topo), sim)
    workload_table(sim, work, "step").table.write(root / "export-profile")
    for name, argv in {"finetune": ["finetune", "budget=150"], "tune": ["tune", "method=random", "seed=1", "budget=30"]
                       }.items():
        assert main([*argv, *REPLAY, f"store={root / name}.sqlite", f"out={root / name}"]) == 0, name
    return {name: root / name for name in ("export", "export-profile", "finetune", "tune")}


@pytest.mark.parametrize("command", ["export", "export-profile", "finetune", "tune"])
def test_every_writing_command_covers_every_size_explicitly(written, command):
    """No gap and no channel count left to NCCL in any table a command writes; the rows it marks as
    NCCL's choice state the replica's decision for their sizes."""
    folder = written[command]
    assert_complete((folder / "nccl_tuner.csv").read_text())
    doc = json.loads(next(p for p in folder.glob("*.json") if p.name in ("nccl_tuner.json", "finetune.json"))
                     .read_text())
    topo = load_topology(doc["provenance"].get("topology") or doc["topology"])
    assert assert_filled_rows_are_nccls_choice(doc, topo) > 0


@pytest.mark.parametrize("command", ["export", "export-profile", "finetune", "tune"])
def test_both_plugins_decide_alike_on_every_written_table(written, checker, command):
    text = (written[command] / "nccl_tuner.csv").read_text()
    shapes = named_shapes(parse_example_rows(text))
    assert disagreements(text, checker, shapes) == []


def test_both_plugins_decide_alike_on_a_completed_hand_made_table(checker, tmp_path):
    """A table with gaps, NCCL's channels and NCCL's algorithm on two shapes reads two ways as it
    is, and one way once written."""
    topo = load_topology("h200-2x2-sock")
    rows = []
    for nodes, nranks in ((2, 4), (1, 2)):
        rows += [Row("allreduce", 256, 511, "tree", "ll", 2, nnodes=nodes, nranks=nranks),
                 Row("allreduce", 4096, 131072, "ring", "ll128", -1, nnodes=nodes, nranks=nranks),
                 Row("allgather", 1 << 20, 1 << 30, "default", "default", 2, nnodes=nodes, nranks=nranks)]
    rows.append(Row("broadcast", 0, MAX_BYTES, "ring", "simple", 2))  # any shape, explicit
    table = Table(topo, rows, {"NCCL_MIN_NCHANNELS": 4})
    shapes = [(2, 4), (1, 2)]
    before = disagreements(table.csv_text(), checker, shapes)
    kinds = {(ours[2], theirs[2]) for *_, ours, theirs in before}
    assert (0, 1) in kinds  # a gap or a -1 row: NCCL's channels under ours, one channel under theirs
    assert any(ours[0] == "nccl" and theirs[0] == "ring" for *_, ours, theirs in before)  # -1 algorithm
    path = table.write(tmp_path)["csv"]
    assert disagreements(path.read_text(), checker, shapes) == []
    assert_complete(path.read_text())


def test_the_example_plugins_rules():
    """First match wins, inclusive ranges, one channel preset, -1 channels keep it, 0 hands it back,
    unknown names parse as ring/simple, long lines are dropped, filters on numPipeOps/regBuff."""
    text = "\n".join(["allreduce,0,100,tree,ll,4,-1,-1", "allreduce,50,200,ring,simple,8,-1,-1",
                      "allreduce,201,300,-1,-1,-1,-1,-1", "allreduce,301,400,Tree,LL,0,-1,-1",
                      "allgather,0,10,ring,ll,3,2,4", "allgather,0,10,ring,ll,5,-1,-1,2",
                      "reduce," + "0" * 250 + ",10,ring,ll,6,-1,-1"])
    rows = parse_example_rows(text)
    assert len(rows) == 6
    assert example_decision(rows, "allreduce", 100, 1, 2) == ("tree", "ll", 4)
    assert example_decision(rows, "allreduce", 101, 1, 2) == ("ring", "simple", 8)
    assert example_decision(rows, "allreduce", 250, 1, 2) == ("ring", "simple", 1)
    assert example_decision(rows, "allreduce", 350, 1, 2) == ("ring", "simple", 0)
    assert example_decision(rows, "allreduce", 401, 1, 2) == ("nccl", "nccl", 1)
    assert example_decision(rows, "allgather", 5, 2, 4) == ("ring", "ll", 3)
    assert example_decision(rows, "allgather", 5, 1, 4) == ("nccl", "nccl", 1)
    assert example_decision(rows, "allgather", 5, 1, 4, num_pipe_ops=2) == ("ring", "ll", 5)
    assert example_decision(rows, "reduce", 5, 1, 4) == ("nccl", "nccl", 1)


# -- ncclrl show -----------------------------------------------------------------------------------

def test_show_prints_shapes_exact_bytes_and_where_rows_come_from(written, checker, capsys, monkeypatch):
    from ncclrl.runners.show import show

    monkeypatch.setenv("NCCLRL_PLUGIN_DIR", str(checker.parent))
    folder = written["tune"]
    assert show(str(folder / "nccl_tuner.csv")) == 0
    out = capsys.readouterr().out.splitlines()
    head = next(i for i, line in enumerate(out) if line.startswith("collective"))
    assert out[head].split()[:8] == ["collective", "nodes", "ranks", "min_bytes", "max_bytes", "algorithm",
                                     "protocol", "channels"]
    body = out[head + 1:]
    doc = json.loads((folder / "finetune.json").read_text())
    assert len(body) == len(doc["table_rows"])
    for line, r in zip(body, doc["table_rows"], strict=True):
        f = line.split()
        assert f[:3] == [r["collective"], str(r["nnodes"]), str(r["nranks"])]
        assert int(f[3]) == r["min_bytes"] and str(r["max_bytes"]) in f
        assert f[-1] in ("nccl", "tuned") or f[-2] in ("nccl", "tuned")
        assert ("nccl" in f) == (r["source"] == "nccl-default")
    assert any(" 4294967295 " in line + " " for line in body) and not any("GiB" in line and "4294967295" in line
                                                                         for line in body)


def test_show_names_units_only_when_exact():
    from ncclrl.runners.show import _bytes, _human

    assert [_bytes(n) for n in (0, 8191, 8192, 6144, 1536 << 10, MAX_BYTES, 1 << 32)] == \
        ["0", "8191", "8192 (8 KiB)", "6144 (6 KiB)", "1572864 (1536 KiB)", "4294967295", "4294967296 (4 GiB)"]
    assert _human(8191) == "8191 B" and _human(3 << 30) == "3 GiB"


def test_show_warns_where_the_plugins_differ(checker, tmp_path, capsys, monkeypatch):
    from ncclrl.runners.show import show

    monkeypatch.setenv("NCCLRL_PLUGIN_DIR", str(checker.parent))
    path = tmp_path / "nccl_tuner.csv"
    path.write_text("allreduce,0,255,ring,ll,2,2,4\nallreduce,512,max,-1,-1,4,2,4\n")
    assert show(str(path)) == 0
    out = capsys.readouterr().out
    assert "not covered" in out and "allreduce on 2 nodes x 4 ranks 256..511" in out and "ONE" in out
    assert "broadcast on 2 nodes x 4 ranks 0..4294967295" in out
    assert "1 row(s) leave the algorithm/protocol or channels to NCCL" in out
    assert "NCCL's" in out and " ?" in out  # no JSON beside it: origin unknown
