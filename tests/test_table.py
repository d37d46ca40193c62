"""The one tuned-table type: written as CSV + nccl.conf + JSON, read back from either, matched as
the plugins match (first row wins, nNodes/nRanks -1 match any)."""

from __future__ import annotations

import pytest

from ncclrl.costmodel.errors import ConfigError
from ncclrl.costmodel.table import MAX_BYTES, Row, Table, lookup, parse_example_rows, read_conf
from ncclrl.costmodel.topology import load_topology


@pytest.fixture
def table():
    topo = load_topology("h200-2x2-sock")
    rows = [Row("allreduce", 0, 4095, "tree", "ll", 2, source="measured", default_time_us=30.0, time_us=20.0,
                nnodes=2, nranks=4),
            Row("allreduce", 4096, MAX_BYTES, "default", "default", 0, nnodes=2, nranks=4),
            Row("allgather", 0, MAX_BYTES, "ring", "simple", 8)]
    return Table(topo, rows, {"NCCL_SOCKET_NTHREADS": 4, "NCCL_NSOCKS_PERTHREAD": 4}, {"seed": 3}, title="t")


def test_write_and_read_back_csv_and_json(table, tmp_path):
    paths = table.write(tmp_path)
    csv = paths["csv"].read_text()
    assert csv.startswith("# t for h200-2x2-sock (2 nodes, 4 ranks)")
    assert ",-1,-1,-1,2,4" not in csv and ",-1,-1,0,2,4" not in csv  # NCCL's choice is written out
    from_csv = Table.read(paths["csv"])
    fields = [(r.collective, r.min_bytes, r.max_bytes, r.algo, r.proto, r.channels, r.nnodes, r.nranks)
              for r in from_csv.rows]
    assert fields == [(r.collective, r.min_bytes, r.max_bytes, r.algo, r.proto, r.channels, r.nnodes, r.nranks)
                      for r in table.rows]  # the table holds what was written
    assert fields[0] == ("allreduce", 0, 4095, "tree", "ll", 2, 2, 4) and fields[-1][-2:] == (-1, -1)
    assert from_csv.conf == table.conf  # the nccl.conf beside it
    assert read_conf(paths["conf"]).knobs == (0, 0, 4, 4, 0)
    from_json = Table.read(paths["json"])
    assert from_json.rows == table.rows and from_json.provenance == {"seed": 3}


def test_lookup_matches_the_plugins_rules(table, tmp_path):
    raw = parse_example_rows(table.write(tmp_path)["csv"].read_text())
    for coll, nbytes, nodes, nranks in [("allreduce", 8, 2, 4), ("allreduce", 4096, 2, 4), ("allreduce", 8, 1, 4),
                                        ("allgather", 1 << 20, 1, 8), ("broadcast", 8, 2, 4)]:
        got, want = table.lookup(coll, nbytes, nodes, nranks), lookup(raw, coll, nbytes, nodes, nranks)
        assert (got is None) == (want is None)
        if got is not None:
            assert (got.min_bytes, got.max_bytes) == (want["min_bytes"], want["max_bytes"])
    assert table.lookup("allreduce", 8, 1, 4) is None  # a row for 2 nodes does not match 1


@pytest.mark.parametrize("text, suffix", [("{not json", ".json"), ('{"rows": [{"x": 1}]}', ".json"),
                                          ("allreduce,0,8,ring\n", ".csv")])
def test_a_file_that_is_no_table_is_one_line(tmp_path, text, suffix):
    p = tmp_path / f"t{suffix}"
    p.write_text(text)
    with pytest.raises(ConfigError) as e:
        Table.read(p)
    assert e.value.field == "table" and "\n" not in str(e.value)


@pytest.fixture
def shaped():
    """One table for three communicator shapes of a 2-node x 2-GPU job, each with its own rows."""
    topo = load_topology("h200-2x2-sock")
    rows = []
    for (nodes, nranks), (algo, proto, ch) in {(2, 4): ("tree", "simple", 2), (1, 2): ("ring", "ll", 4),
                                               (2, 2): ("ring", "ll128", 6)}.items():
        rows += [Row("allreduce", 0, 65535, algo, proto, ch, nnodes=nodes, nranks=nranks),
                 Row("allreduce", 65536, MAX_BYTES, "ring", "simple", ch + 1, nnodes=nodes, nranks=nranks)]
    rows.append(Row("allgather", 0, MAX_BYTES, "ring", "simple", 3))  # any shape
    return Table(topo, rows, {"NCCL_MIN_NCHANNELS": 8}, {"shapes": [[2, 4], [1, 2], [2, 2]]})


def test_several_shapes_round_trip_and_each_shape_finds_its_rows(shaped, tmp_path):
    paths = shaped.write(tmp_path)
    csv = paths["csv"].read_text()
    assert "# communicator shapes (nNodes x nRanks): 2x4, 1x2, 2x2, -1x-1" in csv.splitlines()[1]
    raw = parse_example_rows(csv)
    for back in (Table.read(paths["csv"]), Table.read(paths["json"])):
        assert [(r.collective, r.min_bytes, r.max_bytes, r.algo, r.proto, r.channels, r.nnodes, r.nranks)
                for r in back.rows] == \
            [(r.collective, r.min_bytes, r.max_bytes, r.algo, r.proto, r.channels, r.nnodes, r.nranks)
             for r in shaped.rows]
        assert back.shapes() == [(2, 4), (1, 2), (2, 2), (-1, -1)] and back.conf == {"NCCL_MIN_NCHANNELS": 8}
    want = {(2, 4): ("tree", 2, 3), (1, 2): ("ring", 4, 5), (2, 2): ("ring", 6, 7)}
    for (nodes, nranks), (algo, small_ch, large_ch) in want.items():
        small = shaped.lookup("allreduce", 100, nodes, nranks)
        large = shaped.lookup("allreduce", 1 << 20, nodes, nranks)
        assert (small.nnodes, small.nranks, small.algo, small.channels) == (nodes, nranks, algo, small_ch)
        assert (large.nnodes, large.nranks, large.channels) == (nodes, nranks, large_ch)
        for nbytes in (0, 100, 65535, 65536, MAX_BYTES):
            mine = shaped.lookup("allreduce", nbytes, nodes, nranks)
            theirs = lookup(raw, "allreduce", nbytes, nodes, nranks)
            assert (mine.nnodes, mine.nranks, mine.min_bytes, mine.channels) == \
                (theirs["nNodes"], theirs["nRanks"], theirs["min_bytes"], theirs["channels"])
        sub = shaped.for_shape(nodes, nranks)
        assert {(r.nnodes, r.nranks) for r in sub.rows} == {(nodes, nranks), (-1, -1)}
        assert len([r for r in sub.rows if r.collective in ("allreduce", "allgather")]) == 3
        assert sub.conf == shaped.conf and sub.lookup("allgather", 5, nodes, nranks).channels == 3
    for nodes, nranks in ((1, 4), (4, 8), (2, 8)):  # shapes without rows: NCCL decides (AllGather: any shape)
        assert shaped.lookup("allreduce", 100, nodes, nranks) is None
        assert lookup(raw, "allreduce", 100, nodes, nranks) is None
        assert shaped.for_shape(nodes, nranks).shapes() == [(-1, -1)]


def test_a_one_node_tables_header_counts_in_the_singular(tmp_path):
    from ncclrl.costmodel.table import TableCheck

    topo = load_topology("h200-1x4")
    paths = Table(topo, [Row("allreduce", 0, MAX_BYTES, "ring", "simple", 2)], {}, {}, title="t").write(tmp_path)
    assert paths["csv"].read_text().startswith("# t for h200-1x4 (1 node, 4 ranks), NCCL ")
    check = TableCheck("t.csv", size=10, fingerprint="0" * 16)
    assert "0 rows load, 0 rejected" in check.summary()
