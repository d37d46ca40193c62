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
