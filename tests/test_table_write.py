"""Tables written whole: nccl_tuner.csv, nccl.conf and the JSON of one write go together, and a
write that dies midway is never read as a table (Table.write, check_unit)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from ncclrl.costmodel import table as T
from ncclrl.costmodel.errors import ConfigError
from ncclrl.costmodel.table import MANIFEST, Row, Table, check_unit, fingerprint


def table(channels: int, knob: int) -> Table:
    return Table(None, [Row("allreduce", 0, T.MAX_BYTES, "ring", "simple", channels)], {"NCCL_BUFFSIZE": knob})


def test_a_write_is_whole_and_listed(tmp_path):
    paths = table(4, 1 << 20).write(tmp_path)
    doc = check_unit(paths["csv"])
    assert doc["state"] == "complete" and doc["fingerprint"] == fingerprint(paths["csv"].read_bytes())
    assert set(doc["files"]) == {"nccl_tuner.csv", "nccl.conf", "nccl_tuner.json"}
    back = Table.read(paths["csv"])
    assert back.rows[0].channels == 4 and back.conf == {"NCCL_BUFFSIZE": 1 << 20}
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


@pytest.mark.parametrize("fail_before", ["nccl_tuner.json", "nccl_tuner.csv", MANIFEST])
def test_a_failure_between_files_leaves_no_mixed_table(tmp_path, monkeypatch, fail_before):
    """An old write, then a new one that fails after nccl.conf (or later): the folder holds the new
    conf beside the old table, and every reader refuses it instead of taking the mix for a table."""
    table(4, 1 << 20).write(tmp_path)
    real = T._replace_file
    seen = []

    def failing(path, data):
        if path.name == fail_before and path.name in seen or (path.name == fail_before != MANIFEST):
            raise OSError("disk full")
        seen.append(path.name)
        real(path, data)

    monkeypatch.setattr(T, "_replace_file", failing)
    with pytest.raises(OSError):
        table(8, 2 << 20).write(tmp_path)
    monkeypatch.setattr(T, "_replace_file", real)
    assert (tmp_path / "nccl.conf").read_text() == "NCCL_BUFFSIZE=2097152\n"  # the new conf is in place...
    with pytest.raises(ConfigError, match="did not finish"):  # ...and nobody reads the folder as a table
        Table.read(tmp_path / "nccl_tuner.csv")
    with pytest.raises(ConfigError, match="did not finish"):
        check_unit(tmp_path / "nccl.conf")
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]
    table(8, 2 << 20).write(tmp_path)  # writing again mends it
    assert Table.read(tmp_path / "nccl_tuner.csv").rows[0].channels == 8


def test_a_writer_killed_midway(tmp_path):
    """A process killed (SIGKILL) right after it renamed nccl.conf into place: the folder is refused."""
    table(4, 1 << 20).write(tmp_path)
    code = textwrap.dedent(f"""
        import os, signal
        from ncclrl.costmodel import table as T
        real = T._replace_file
        def dying(path, data):
            real(path, data)
            if path.name == "nccl.conf":
                os.kill(os.getpid(), signal.SIGKILL)
        T._replace_file = dying
        T.Table(None, [T.Row("allreduce", 0, T.MAX_BYTES, "tree", "ll", 2)], {{"NCCL_BUFFSIZE": 4096}}).write(
            T.Path({str(tmp_path)!r}))
    """)
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert p.returncode == -9, p.stderr
    assert json.loads((tmp_path / MANIFEST).read_text())["state"] == "writing"
    assert "ring" in (tmp_path / "nccl_tuner.csv").read_text()  # the old table, whole, beside the new conf
    with pytest.raises(ConfigError, match="did not finish"):
        Table.read(tmp_path / "nccl_tuner.csv")


def test_a_file_changed_after_the_write_is_named(tmp_path):
    paths = table(4, 1 << 20).write(tmp_path)
    paths["conf"].write_text("NCCL_BUFFSIZE=4096\n")  # another run's conf copied in
    with pytest.raises(ConfigError, match="nccl.conf changed after the table was written"):
        Table.read(paths["csv"])
    os.unlink(tmp_path / MANIFEST)  # no manifest: files as they are (tables written by hand)
    assert Table.read(paths["csv"]).conf == {"NCCL_BUFFSIZE": 4096}


# ---- the NCCL releases a table means the same on ----------------------------------------------------------


def test_a_rows_channels_capped_from_2_31_as_the_real_log_shows():
    """NCCL 2.31.0 on 2 nodes x 1 GPU ran a ring/ll row of 2 channels at 8188 B on 1 channel (its own
    count: tests/data/verify); 2.30 ran the row's 2. Sizes where NCCL's scheduler spreads no wider are
    no cap (ring/simple/2 at 8 KiB runs on one channel on either release)."""
    from ncclrl.costmodel.topology import load_topology

    topo = load_topology("h200-2x1-sock")
    assert T.channels_capped(topo, "allreduce", 8188, "ring", "ll", 2) == 1
    assert T.channels_capped(topo, "allreduce", 8188, "ring", "ll", 2, version="2.30.7") is None
    assert T.channels_capped(topo, "allreduce", 8192, "ring", "simple", 2) is None
    assert T.channels_capped(topo, "allreduce", 1 << 20, "ring", "simple", 2) is None


def test_a_table_names_the_releases_it_means_the_same_on(tmp_path):
    """Written for h200-2x1-sock: a row NCCL 2.31+ caps makes the table valid for 2.27-2.30, in the CSV
    (a line the plugin reads) and in the manifest; without such a row, every release the replica follows."""
    from ncclrl.costmodel.table import NCCL_VERSIONS_MARK, nccl_versions
    from ncclrl.costmodel.topology import load_topology

    topo = load_topology("h200-2x1-sock")
    capped = Table(topo, [Row("allreduce", 0, 8191, "ring", "ll", 2, nnodes=2, nranks=2)])
    plain = Table(topo, [Row("allreduce", 65536, 1 << 20, "ring", "simple", 2, nnodes=2, nranks=2)])
    assert nccl_versions(capped) == {"versions": "2.27-2.30", "made_for": "2.28.9", "capped_rows": [1],
                                     "ll128_rows": []}
    assert nccl_versions(plain)["versions"] == "2.27-2.32"
    paths = capped.write(tmp_path / "a")
    text = paths["csv"].read_text()
    assert f"{NCCL_VERSIONS_MARK}2.27-2.30" in text.splitlines()[1] and "ask for more channels" in text
    assert check_unit(paths["csv"])["nccl"]["versions"] == "2.27-2.30"
    paths = plain.write(tmp_path / "b")
    assert f"{NCCL_VERSIONS_MARK}2.27-2.32" in paths["csv"].read_text()
    assert check_unit(paths["csv"])["nccl"]["capped_rows"] == []


def test_a_row_for_any_shape_is_judged_on_every_shape_and_ll128_over_sockets_from_2_31():
    """A row for any communicator shape is capped on a sub-communicator it applies to (here the 1-node
    group of h200-2x2-sock: 24 channels would be NCCL's on 2 nodes too, so only its own shape decides); a
    table made for 2.31 whose rows force LL128 over sockets means the same from 2.31 on only."""
    from ncclrl.costmodel.table import nccl_versions
    from ncclrl.costmodel.topology import load_topology

    topo = load_topology("h200-2x2-sock")
    anyshape = Table(topo, [Row("allreduce", 0, 8191, "ring", "ll", 2)], cover=[(1, 2)])
    assert nccl_versions(anyshape)["capped_rows"] == [1]
    made_231 = topo.with_nccl(version="2.31.0")
    ll128 = Table(made_231, [Row("allreduce", 65536, 1 << 20, "ring", "ll128", 2, nnodes=2, nranks=4)])
    v = nccl_versions(ll128)
    assert v["ll128_rows"] == [1] and v["versions"] == "2.31-2.32"
    both = Table(made_231, [*ll128.rows, Row("allreduce", 0, 8191, "ring", "ll", 2, nnodes=2, nranks=4)])
    v = nccl_versions(both)
    assert v["versions"] == "" and v["capped_rows"] == [2] and v["ll128_rows"] == [1]
    assert "no NCCL release runs every row as written" in both.csv_text("", v)
