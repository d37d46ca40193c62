"""``ncclrl e2e`` on CPUs (gloo stands in for NCCL): two emulated nodes of one rank each, started by
ncclrl itself and by Open MPI's ``mpirun``; DDP and FSDP jobs in ABBA order, every step in the CSV,
each side's ranks handed exactly what their side must hold, bad input one line and exit 2."""

from __future__ import annotations

import csv
import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest

from ncclrl.costmodel.errors import ConfigError
from ncclrl.costmodel.table import CONF_KEYS, fingerprint
from ncclrl.envs.jobs import TABLE_ENV
from ncclrl.runners import e2e
from ncclrl.runners.cli import main

TOPOLOGY = "h200-2x1-sock"  # 2 nodes x 1 GPU: two ranks, nodes emulated on this host
TINY = ["layers=1", "d_model=32", "heads=2", "seq_len=16", "batch=2", "vocab=128", "steps=4", "warmup=1"]
STEPS = 4
LINE = re.compile(r"^(ddp|fsdp): default [\d.]+ ms \[[\d.]+, [\d.]+\], table [\d.]+ ms \[[\d.]+, [\d.]+\], "
                  r"ratio [\d.]+ (?:\[[\d.]+, [\d.]+\]|\[no interval from one round\]): "
                  r"(the table is faster|the table is slower|a tie|undecided)")
ROOT_OK = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}


@pytest.fixture
def inputs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Path]:
    """A table, its nccl.conf and a plugin file (gloo never loads it), with no table or knob in
    the environment the command starts from."""
    for k in (*CONF_KEYS, TABLE_ENV, "NCCLRL_TUNER_TABLE", "NCCL_TUNER_PLUGIN"):
        monkeypatch.delenv(k, raising=False)
    table = tmp_path / "nccl_tuner.csv"
    table.write_text("allreduce,0,65536,ring,ll,2,-1,-1\nallgather,0,4294967295,ring,simple,4,-1,-1\n")
    conf = tmp_path / "nccl.conf"
    conf.write_text("# knobs\nNCCL_BUFFSIZE=2097152\nNCCL_SOCKET_NTHREADS=2\n")
    plugin = tmp_path / "libnccl-tuner-ncclrl.so"
    plugin.write_bytes(b"")
    return {"table": table, "conf": conf, "plugin": plugin, "out": tmp_path / "e2e"}


def _run(inputs: dict[str, Path], *extra: str) -> list[str]:
    return [str(inputs["table"]), f"conf={inputs['conf']}", f"plugin={inputs['plugin']}", f"topology={TOPOLOGY}",
            "device=cpu", f"out={inputs['out']}", "timeout_s=120", *TINY, *extra]


def _check_outputs(inputs: dict[str, Path], stdout: str, rounds: int) -> dict:
    lines = [ln for ln in stdout.splitlines() if ln.strip()]
    assert [LINE.match(ln).group(1) for ln in lines] == ["ddp", "fsdp"], stdout
    with open(inputs["out"] / "steps.csv") as f:
        rows = list(csv.DictReader(f))
    summary = json.loads((inputs["out"] / "summary.json").read_text())
    want_fp = fingerprint(inputs["table"].read_text())
    assert summary["table_fingerprint"] == want_fp
    for mode in ("ddp", "fsdp"):
        mine = [r for r in rows if r["mode"] == mode]
        assert len(mine) == rounds * 2 * STEPS
        assert all(float(r["step_time_ms"]) > 0 for r in mine)
        order = [s for _, s in sorted({(int(r["job"]), r["side"]) for r in mine})]
        assert order == e2e.job_order(rounds) == (["default", "table", "table", "default"] * rounds)[:2 * rounds]
        s = summary["modes"][mode]
        for side in ("default", "table"):
            assert s[side]["ci_lo_ms"] <= s[side]["step_time_ms"] <= s[side]["ci_hi_ms"]
            assert s[side]["jobs"] == rounds and s[side]["steps"] == rounds * STEPS
        # the ratio is the geometric mean of the rounds' ratios of job medians, inside its interval
        per_round = [t / d for d, t in zip(s["default"]["job_medians_ms"], s["table"]["job_medians_ms"], strict=True)]
        assert s["ratio"]["value"] == pytest.approx(float(np.exp(np.mean(np.log(per_round)))))
        if rounds > 1:
            assert s["ratio"]["ci_lo"] <= s["ratio"]["value"] <= s["ratio"]["ci_hi"]
        else:
            assert s["ratio"]["ci_lo"] is None and s["verdict"] == "undecided"
    # what every rank of every job said it received: the table and knobs on the table's side only
    assert [j["side"] for j in summary["jobs"]] == e2e.job_order(rounds)  # each job trains both modes
    for job in summary["jobs"]:
        ranks = job["received"]
        assert sorted(ranks) == ["0", "1"]
        for got in ranks.values():
            if job["side"] == "table":
                assert got["table"] == want_fp
                assert got["knobs"] == {"NCCL_BUFFSIZE": "2097152", "NCCL_SOCKET_NTHREADS": "2"}
                assert got["plugin"] == str(inputs["plugin"].resolve())
            else:
                assert got == dict(got, table="", knobs={}, plugin="none")
    return summary


def test_local_launcher_runs_ddp_and_fsdp_in_abba_order(inputs, capsys) -> None:
    assert main(["e2e", *_run(inputs, "rounds=2")]) == 0
    out = capsys.readouterr().out
    print(out)  # the command's report, for the record (pytest -s)
    summary = _check_outputs(inputs, out, rounds=2)
    assert summary["launcher"] == "local" and summary["nranks"] == 2
    assert (inputs["out"] / "steps.png").stat().st_size > 0  # the step times, plotted


@pytest.mark.skipif(shutil.which("mpirun") is None, reason="Open MPI's mpirun is not installed")
def test_mpirun_launcher_runs_both_modes(inputs, capsys, monkeypatch) -> None:
    for k, v in ROOT_OK.items():
        monkeypatch.setenv(k, v)
    assert main(["e2e", *_run(inputs, "rounds=1", "launcher=mpirun", "launcher.grace_s=2")]) == 0
    out = capsys.readouterr().out
    print(out)
    summary = _check_outputs(inputs, out, rounds=1)
    assert summary["launcher"] == "mpirun"


def test_a_rank_without_the_table_stops_the_run(inputs) -> None:
    cfg = e2e.E2EConfig(table=str(inputs["table"]), conf=str(inputs["conf"]), plugin=str(inputs["plugin"]),
                        topology=TOPOLOGY, device="cpu")
    run = e2e.E2E(cfg)
    good = {"table": run.table_fp, "knobs": run.knobs, "plugin": run.plugin, "plugin_found": True}
    run.check_received("table", {0: good, 1: dict(good)})
    with pytest.raises(ConfigError, match="rank 1 received table ''"):
        run.check_received("table", {0: good, 1: dict(good, table="")})
    with pytest.raises(ConfigError, match="rank 0 received"):
        run.check_received("default", {0: good, 1: good})
    with pytest.raises(ConfigError, match=r"ranks \[1\] never reported"):
        run.check_received("default", {0: {"table": "", "knobs": {}, "plugin": "none"}})


def test_the_summary_of_identical_sides_is_a_tie() -> None:
    jobs = [[10.0, 10.2, 9.9, 10.1], [10.3, 10.0, 10.1, 9.8]]
    s = e2e.summarize(jobs, jobs[::-1])
    assert s["verdict"] == "tie" and s["ratio"]["ci_lo"] <= 1.0 <= s["ratio"]["ci_hi"]
    faster = e2e.summarize(jobs, [[x * 0.8 for x in j] for j in jobs])
    assert faster["verdict"] == "faster" and faster["ratio"]["ci_hi"] < 1.0
    assert e2e.report_line("ddp", faster).startswith("ddp: default 10.1 ms")


@pytest.mark.parametrize("method", e2e.RATIO_METHODS)
def test_the_printed_step_times_point_the_way_the_ratio_does(method) -> None:
    """Pooled medians and the geometric mean of the rounds' ratios can point opposite ways (here the
    pooled medians say 14.95 against 14.5 ms, the rounds 1.025): each side's printed step time is
    the one its ratio is made of, so the ratio is exactly the table's over the default's."""
    default = [[10.0, 10.1, 9.9, 10.0], [20.0, 20.2, 19.8, 20.0]]
    table = [[14.5, 14.4, 14.6, 14.5], [14.5, 14.6, 14.4, 14.5]]
    s = e2e.summarize(default, table, method=method, n_boot=200)
    d, t, r = s["default"], s["table"], s["ratio"]
    assert r["value"] == pytest.approx(t["step_time_ms"] / d["step_time_ms"])
    assert (r["value"] > 1) == (t["step_time_ms"] > d["step_time_ms"])
    assert d["ci_lo_ms"] <= d["step_time_ms"] <= d["ci_hi_ms"]
    assert d["pooled_ms"] == pytest.approx(14.95) and t["pooled_ms"] == pytest.approx(14.5)
    if method == "paired-t":  # the geometric mean of the jobs' median steps: sqrt(10 * 20)
        assert d["step_time_ms"] == pytest.approx(np.sqrt(200.0)) and r["value"] > 1
    m = re.match(r"ddp: default ([\d.]+) ms .*, table ([\d.]+) ms .*, ratio ([\d.]+) ", e2e.report_line("ddp", s))
    a, b, ratio = (float(x) for x in m.groups())
    assert (ratio > 1) == (b > a)


@pytest.mark.parametrize(("args", "key"), [
    (["mode=both,ddp"], "mode"),
    (["mode=zero"], "mode"),
    (["heads=3"], "heads"),
    (["dtype=bfloat16"], "dtype"),
    (["steps=0"], "steps"),
    (["device=tpu"], "device"),
    (["launcher=pbs"], "launcher"),
    (["layerz=2"], "layerz"),
    (["topology=nowhere-9x9"], "topology"),
])
def test_bad_input_is_one_line_and_exit_2(inputs, capsys, args, key) -> None:
    assert main(["e2e", *_run(inputs, *args)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith(f"ncclrl: error: {key}"), err


def test_a_missing_table_or_a_bad_conf_is_one_line(inputs, capsys, tmp_path) -> None:
    assert main(["e2e", "topology=h200-2x1-sock", "device=cpu"]) == 2
    assert capsys.readouterr().err.startswith("ncclrl: error: table: required")
    bad = tmp_path / "bad.conf"
    bad.write_text("NCCL_ALGO=ring\n")
    assert main(["e2e", *_run(inputs, f"conf={bad}")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "unknown setting 'NCCL_ALGO'" in err



def test_the_ratio_interval_holds_its_level_on_simulated_a_a_runs():
    """Both sides the same, 3 rounds, jobs spread 8% apart and steps 3%: the rounds' t interval calls
    a tie a win or a loss at most about 5% of the time (binomial slack for 300 runs), where the
    job-and-step bootstrap does so clearly more often."""
    rng = np.random.default_rng(1)
    wrong = {"paired-t": 0, "bootstrap": 0}
    for _ in range(300):
        sides = ([], [])
        for side in e2e.job_order(3):
            sides[side == "table"].append(np.exp(rng.normal(0, 0.08) + rng.normal(0, 0.03, 20)) * 10)
        for m in wrong:
            wrong[m] += e2e.summarize(*sides, method=m, n_boot=200)["verdict"] != "tie"
    assert wrong["paired-t"] <= 0.08 * 300 and wrong["bootstrap"] >= 0.09 * 300, wrong
