"""The ncclrl command line: outputs, and one-line errors with exit code 2 for bad input."""

from __future__ import annotations

import csv
import io
import shlex
import subprocess
import sys

import pytest
import yaml

from ncclrl.costmodel.units import parse_bytes
from ncclrl.runners import cli
from ncclrl.runners.cli import main
from ncclrl.runners.config import _keys, _type_name, command_help, compose_config, parse


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


# -- the command registry, required keys, examples ------------------------------------------------

@pytest.mark.parametrize("entry", cli.ENTRIES, ids=lambda e: e.name)
def test_the_registry_is_each_command_s_own(entry):
    """``ncclrl --help`` lists each command by the registry without importing it: its name and summary
    are the command's own."""
    cmd = cli.load(entry.name)
    assert (cmd.name, cmd.summary) == (entry.name, entry.summary)
    assert cmd.required == entry.required and cmd.example == entry.example
    assert f"  {entry.name:<15} {entry.summary}" in cli.usage()


def test_commands_lists_every_command_in_order():
    assert [c.name for c in cli.COMMANDS] == [e.name for e in cli.ENTRIES] == list(cli.BY_NAME)


def _value(key: str, tmp_path) -> str:
    """A valid value of a required key."""
    if key in ("table", "files", "logs", "inputs"):
        path = tmp_path / "input.txt"
        path.write_text("")
        return f"[{path}]" if key != "table" else str(path)
    return {"topology": "h200-1x4", "method": "random"}[key]


REQUIRED = [(e.name, k) for e in cli.ENTRIES for k in e.required]


@pytest.mark.parametrize("name,key", REQUIRED, ids=[f"{n}:{k}" for n, k in REQUIRED])
def test_a_required_key_is_refused_empty(name, key, capsys, monkeypatch, tmp_path):
    """Each key --help marks required is refused when empty (the others given): exit 2, one line naming it,
    nothing written."""
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    cmd = cli.load(name)
    argv = [f"{k}={_value(k, tmp_path)}" for k in cmd.required if k != key]
    argv.append(f"{key}=[]" if _type_name(_keys(cmd.schema)[key]) == "list" else f"{key}=")
    code, out, err = run(capsys, monkeypatch, [*name.split(), *argv])
    assert code == 2 and out == "", err
    assert err.startswith(f"ncclrl: error: {key}: ") and err.count("\n") == 1, err
    assert list(work.iterdir()) == []


@pytest.mark.parametrize("entry", cli.ENTRIES, ids=lambda e: e.name)
def test_the_required_keys_are_enough_and_marked(entry, tmp_path):
    """Given its required keys (no more), a command composes and passes its checks: a key that became
    required is listed; --help marks exactly those keys."""
    cmd = cli.load(entry.name)
    compose_config(cmd, [f"{k}={_value(k, tmp_path)}" for k in entry.required])
    text = command_help(cmd)
    marked = {line.split()[0].split("=")[0] for line in text.splitlines() if "(required)" in line}
    assert marked == set(entry.required)


@pytest.mark.parametrize("entry", cli.ENTRIES, ids=lambda e: e.name)
def test_every_example_parses(entry, monkeypatch, tmp_path):
    """The example --help shows is a valid command line (parsed and checked, not run); the files it
    reads are made empty."""
    monkeypatch.chdir(tmp_path)
    words = shlex.split(entry.example)
    words = words[:next((i for i, w in enumerate(words) if w in ("<", ">", "|")), len(words))]
    n = len(entry.name.split())
    assert words[0] == "ncclrl" and words[1:1 + n] == entry.name.split(), entry.example
    rest = words[1 + n:]
    for i, w in enumerate(rest):
        if "=" not in w and not w.startswith("-") and (i == 0 or rest[i - 1] not in ("-o", "--output")):
            (tmp_path / w).parent.mkdir(parents=True, exist_ok=True)
            (tmp_path / w).write_text("")
    parse(cli.load(entry.name), cli.command_argv(entry.name, rest))
    assert f"example: {entry.example}" in command_help(cli.load(entry.name))


# -- --cfg job, --key=value ---------------------------------------------------------------------------


@pytest.mark.parametrize("flag", [["--cfg", "job"], ["--cfg=job"], ["-c", "job"]], ids=" ".join)
def test_cfg_job_prints_the_composed_config_and_runs_nothing(flag, capsys, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    code, out, err = run(capsys, monkeypatch, ["composer", *flag, "run_dir=runs/c", "train.total_timesteps=64"])
    cfg = yaml.safe_load(out)
    assert code == 0 and err == "" and cfg["run_dir"] == "runs/c" and cfg["train"]["total_timesteps"] == 64
    assert list(tmp_path.iterdir()) == []


def test_cfg_job_with_multirun_prints_each_job(capsys, monkeypatch):
    code, out, _ = run(capsys, monkeypatch, ["decisions", "--cfg", "job", "-m", "collective=allreduce,allgather"])
    docs = list(yaml.safe_load_all(out))
    assert code == 0 and [d["collective"] for d in docs] == ["allreduce", "allgather"]


def test_gnu_style_key_is_the_key(capsys, monkeypatch):
    argv = ["collective=allreduce", "max_bytes=4K"]
    _, want, _ = run(capsys, monkeypatch, ["decisions", "topology=h200-2x2-sock", *argv])
    code, got, _ = run(capsys, monkeypatch, ["decisions", "--topology=h200-2x2-sock", *argv])
    assert code == 0 and got == want and got.count("\n") == 11  # a header and 8 B to 4K


@pytest.mark.parametrize("argv,key", [
    (["decisions", "--cfg", "hydra"], "--cfg"),
    (["decisions", "--cfg=all"], "--cfg"),
    (["decisions", "--cfg"], "--cfg"),
    (["decisions", "--nosuch=1"], "--nosuch=1"),
    (["decisions", "--topology", "h200-1x4"], "--topology"),
    (["decisions", "-x"], "-x"),
    (["decisions", "full"], "full"),
    (["decisions", "~topology"], "topology"),
    (["decisions", "~nosuch"], "nosuch"),
    (["decisions", "topology==h200-1x4"], "topology"),
    (["decisions", "collective=[allreduce"], "collective"),
    (["decisions", "collective=allreduce]"], "collective"),
    (["decisions", "topology='h200-1x4"], "topology"),
    (["decisions", "topology={a"], "topology"),
    (["decisions", "min_bytes=int(abc)"], "min_bytes"),
    (["decisions", "topology=???"], "topology"),
    (["decisions", "topology=" + "x" * 300], "topology"),
    (["plugin", "build", "out=" + "x" * 300], "out"),
    (["predict", "noise=maybe"], "noise"),
    (["predict", "noise=[true]"], "noise"),
    (["calibrate", "files=???"], "files"),
    (["detect", "logs=[[a]]"], "logs"),
    (["detect", "logs={a:1}"], "logs"),
    (["profile", "inputs={}"], "inputs"),
    (["parse", "files=[a,[b]]"], "files"),
    (["parse", "."], "files"),
    (["calibrate", ".", "topology=h200-1x4"], "files"),
    (["sweep", "launcher.nosuch=1"], "launcher.nosuch"),
    (["sweep", "launcher=[local]"], "launcher"),
    (["decisions", "collective.x=1"], "collective.x"),
    (["decisions", "+topology=h200-1x4"], "topology"),
    (["decisions", "num_pipe_ops=[1]"], "num_pipe_ops"),
    (["decisions", "num_pipe_ops="], "num_pipe_ops"),
])
def test_bad_shapes_are_one_line_naming_the_key(argv, key, capsys, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    code, out, err = run(capsys, monkeypatch, argv)
    assert code == 2 and out == "", err
    assert err.startswith(f"ncclrl: error: {key}: ") and err.count("\n") == 1 and "Traceback" not in err, err
    assert list(tmp_path.iterdir()) == []


def test_predict_reads_its_noise_key(capsys, monkeypatch):
    """predict's noise= is a key, though ncclrl's configs have a noise group."""
    rows = "allreduce,4M,ring,simple,0\n" * 3
    code, out, _ = run(capsys, monkeypatch, ["predict", "topology=h200-1x4", "noise=true", "seed=1"], rows)
    times = [r.split(",")[-1] for r in out.splitlines()[1:]]
    assert code == 0 and len(set(times)) == 3
    code, out, _ = run(capsys, monkeypatch, ["predict", "topology=h200-1x4", "noise=false"], rows)
    assert code == 0 and len({r.split(",")[-1] for r in out.splitlines()[1:]}) == 1
