"""The ncclrl command line: outputs, and one-line errors with exit code 2 for bad input."""

from __future__ import annotations

import csv
import io
import subprocess
import sys

import pytest
import yaml

from ncclrl.costmodel.units import parse_bytes
from ncclrl.runners.cli import main


def run(capsys, monkeypatch, argv, stdin=None):
    if stdin is not None:
        monkeypatch.setattr(sys, "stdin", io.StringIO(stdin))
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def test_decisions_csv(capsys, monkeypatch):
    code, out, _ = run(capsys, monkeypatch, ["decisions", "topology=h200-1x4", "collective=allreduce",
                                             "min_bytes=8", "max_bytes=1G"])
    rows = list(csv.DictReader(io.StringIO(out)))
    assert code == 0 and list(rows[0]) == ["collective", "nbytes", "algo", "proto", "channels"]
    assert len(rows) == 28 and rows[0]["nbytes"] == "8" and rows[-1]["nbytes"] == str(1 << 30)
    assert (rows[0]["algo"], rows[0]["proto"], rows[0]["channels"]) == ("ring", "ll", "1")
    assert (rows[-1]["algo"], rows[-1]["proto"], rows[-1]["channels"]) == ("ring", "simple", "24")


def test_decisions_all_collectives(capsys, monkeypatch):
    code, out, _ = run(capsys, monkeypatch, ["decisions", "topology=dgx-h100-2n", "collective=all",
                                             "max_bytes=1M", "full=true"])
    rows = list(csv.DictReader(io.StringIO(out)))
    assert code == 0 and {r["collective"] for r in rows} == {"broadcast", "reduce", "allgather",
                                                              "reducescatter", "allreduce"}
    assert all(float(r["time_us"]) > 0 for r in rows)


def test_predict_roundtrip_and_measured_column(capsys, monkeypatch):
    src = "collective,nbytes,algo,proto,channels,time_us\nallreduce,1048576,ring,ll128,0,27.08\n" \
          "allreduce,1G,ring,simple,8,8462.22\n"
    code, out, _ = run(capsys, monkeypatch, ["predict", "topology=h200-1x4"], src)
    rows = list(csv.DictReader(io.StringIO(out)))
    assert code == 0 and len(rows) == 2
    assert rows[0]["measured_time_us"] == "27.08" and abs(float(rows[0]["rel_err"])) < 0.3
    assert float(rows[1]["time_us"]) > 10 * float(rows[0]["time_us"])


def test_predict_without_header(capsys, monkeypatch):
    code, out, _ = run(capsys, monkeypatch, ["predict", "topology=h200-1x4"], "allreduce,8,tree,ll,0\n")
    assert code == 0 and out.splitlines()[0].endswith(",time_us")


@pytest.mark.parametrize("argv,stdin,field", [
    (["decisions", "topology=h999", "collective=allreduce"], None, "topology"),
    (["decisions", "topology=h200-1x4", "collective=alltoall"], None, "collective"),
    (["decisions", "topology=h200-1x4", "collective=allreduce", "min_bytes=0"], None,
     "min_bytes"),
    (["decisions", "topology=h200-1x4", "collective=allreduce", "max_bytes=1.5"], None,
     "max_bytes"),
    (["predict", "topology=h200-1x4"], "allreduce,8,ring,LL512,0\n", "line 1: proto"),
    (["predict", "topology=h200-1x4"], "allreduce,-8,ring,ll,0\n", "line 1: nbytes"),
    (["predict", "topology=h200-1x4"], "allreduce,8,pat,simple,0\n", "algorithm"),
    (["predict", "topology=h200-1x4"], "allgather,8,nvls_tree,simple,0\n", "algorithm"),
    (["predict", "topology=h200-1x4"], "allreduce,8,ring,ll\n", "line 1"),
    (["predict", "topology=h200-1x4"], "collective,nbytes\nallreduce,8\n", "stdin: missing column 'algo'"),
    (["sweep", "launch=mpi"], None, "launch"),
    (["finetune", "topology=h200-1x4", "timing=graphs"], None, "timing"),
    (["finetune", "topology=h200-1x4", "search.decision.alpha=abc"], None, "search.decision.alpha"),
    (["finetune", "topology=h200-1x4", "search.decision.alpha=0.7"], None, "search.decision.alpha"),
    (["finetune", "topology=h200-1x4", "strategy=/nope/strategy.json"], None, "strategy"),
    (["tune", "method=random", "topology=h200-1x4", "launch=ctypes"], None, "launch"),
])
def test_bad_input_is_one_line(capsys, monkeypatch, argv, stdin, field):
    code, out, err = run(capsys, monkeypatch, argv, stdin)
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith(f"ncclrl: error: {field}"), err


def test_malformed_yaml_topology(capsys, monkeypatch, tmp_path):
    bad = tmp_path / "t.yaml"
    bad.write_text("nodes: [1\n")
    code, _, err = run(capsys, monkeypatch, ["decisions", f"topology={bad}", "collective=allreduce"])
    assert code == 2 and "malformed YAML" in err and err.count("\n") == 1


def test_calibrate_writes_a_usable_preset(capsys, monkeypatch, tmp_path, allreduce_files):
    out_yaml = tmp_path / "mybox.yaml"
    code, out, _ = run(capsys, monkeypatch, ["calibrate", *map(str, allreduce_files), "topology=h200-1x4",
                                             "from_defaults=true", f"output={out_yaml}"])
    assert code == 0 and "held-out" in out and out_yaml.exists()
    assert yaml.safe_load(out_yaml.read_text())["name"] == "mybox"
    code, out, _ = run(capsys, monkeypatch, ["predict", f"topology={out_yaml}"], "allreduce,8,ring,ll,0\n")
    assert code == 0 and 15 < float(out.splitlines()[1].split(",")[-1]) < 40


def test_calibrate_rejects_bad_runs(capsys, monkeypatch, tmp_path, allreduce_files):
    cut = tmp_path / "cut.txt"
    cut.write_text("\n".join(allreduce_files[0].read_text().splitlines()[:22]))
    code, _, err = run(capsys, monkeypatch, ["calibrate", str(cut), "topology=h200-1x4"])
    assert code == 2 and "truncated run" in err


def test_console_script_has_no_traceback():
    p = subprocess.run([sys.executable, "-m", "ncclrl.runners.cli", "decisions", "topology=h200-1x4",
                        "collective=bogus"], capture_output=True, text=True)
    assert p.returncode == 2 and "Traceback" not in p.stderr and p.stderr.count("\n") == 1


@pytest.mark.parametrize("text,value", [("8", 8), ("64K", 65536), ("1M", 1 << 20), ("4GiB", 4 << 30),
                                        ("1.5K", 1536)])
def test_parse_bytes(text, value):
    assert parse_bytes(text) == value
