"""Replays with fresh job noise: ``finetune backend=replay`` answers every replayed job with a new
draw of the host's fitted job noise around each point's recorded truth (the recording that ships
with ncclrl when no store is named), measures its table afresh, and compares strategies on the same
replay."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from ncclrl.costmodel.noise import JobNoise, pooled_median
from ncclrl.costmodel.space import Point
from ncclrl.costmodel.topology import load_topology
from ncclrl.envs.replay import ReplayWorkers, recorded_sweep, shipped_recording, shipped_recordings
from ncclrl.runners.finetune import parse_args, run_finetune
from ncclrl.runners.live import replay_validation

REPO = Path(__file__).resolve().parent.parent
TOPO = load_topology("h200-2x2-sock")


@pytest.fixture(scope="module")
def sweep():
    return recorded_sweep("", TOPO, "nccl", ("sweep", "sweep-repeat"), status="ok")


def test_the_shipped_recording_is_the_repository_s_2x2_sweep(sweep):
    assert "h200-2x2-sock" in shipped_recordings()
    assert set(sweep.tag) == {"sweep", "sweep-repeat"} and set(sweep.collective) == {"allreduce"}
    ref = recorded_sweep(REPO / "data" / "h200x4-2026-11-21" / "store.sqlite", TOPO, "nccl", ("sweep",), status="ok")
    assert len(sweep[sweep.tag == "sweep"]) == len(ref)
    with pytest.raises(Exception, match="^replay_store: no recording of h200-1x4 ships with ncclrl"):
        shipped_recording("h200-1x4")


def _point(sweep, nbytes: int) -> Point:
    r = sweep[(sweep.nbytes == nbytes) & (sweep.algo == "ring") & (sweep.proto == "simple")].iloc[0]
    return Point("allreduce", nbytes, "ring", "simple", int(r.channels))


def test_fresh_jobs_differ_and_centre_on_the_pooled_recorded_median(sweep):
    p = _point(sweep, 1 << 20)
    noise = JobNoise.load("h200-2x2-sock/nccl")
    w = ReplayWorkers(sweep, p, noise=noise, rng=np.random.default_rng(1))
    jobs = [w.measure([p], samples=5)[0] for _ in range(400)]
    assert len({tuple(j) for j in jobs}) == 400  # a point measured again is a new job
    key = ("allreduce", p.nbytes, p.algo, p.proto, p.channels, *p.knobs)
    truth = pooled_median(w._by[key])
    centre = np.exp(np.mean([np.log(np.median(j)) for j in jobs]))
    assert abs(np.log(centre / truth)) < 0.05
    again = ReplayWorkers(sweep, p, noise=noise, rng=np.random.default_rng(1)).measure([p], samples=5)[0]
    assert again == jobs[0]  # a seed replays the same draws
    recorded = ReplayWorkers(sweep, p)  # the recorded samples, in order
    assert recorded.measure([p])[0] == w._by[key][0]
    assert recorded.expected([p], samples=3)[0] == [truth] * 3


def test_a_table_that_is_nccl_s_choice_saves_nothing_measured_afresh(sweep):
    sizes = {4: sorted(set(int(s) for s in sweep.nbytes))}
    noise = JobNoise.load("h200-2x2-sock/nccl")
    none = replay_validation(sweep, TOPO, noise, 0, Point("allreduce", 0), [],
                             sizes, 5, jobs=10)
    assert none["saved_lo"] < 0 < none["saved_hi"] and not any(r["row"] for r in none["per_size"])
    # a row that the recording shows much slower is measured slower
    s = 64 << 20
    slow = sweep[(sweep.nbytes == s) & (sweep.algo == "ring") & (sweep.proto == "ll")]
    row = {"collective": "allreduce", "nbytes": s, "key": ("ring", "ll", int(slow.channels.iloc[0]))}
    got = replay_validation(sweep, TOPO, noise, 0, Point("allreduce", 0), [row],
                            sizes, 5, jobs=10)
    assert got["worst_size"]["nbytes"] == s and got["worst_size"]["hi"] < 1 and got["saved_hi"] < 0


def test_finetune_on_the_shipped_recording_keeps_rows_and_measures_them_afresh(tmp_path, capsys):
    args = parse_args(["backend=replay", "topology=h200-2x2-sock", f"store={tmp_path / 'ft.sqlite'}",
                       f"out={tmp_path / 'out'}", "compare=[ppo]"])
    summary = run_finetune(args)
    out = capsys.readouterr().out
    assert summary["rows"] > 0 and summary["speedup_on_sweep"] > 1.1 and summary["sizes_slower_on_sweep"] == 0
    check = summary["replay_check"]
    assert check["jobs"] == 10 and check["saved_lo"] > 0
    assert "measured afresh" in out and "GPU-time spent" in out and "strategy=ppo on the same replay" in out
    assert "ppo" in summary["compare"] and (tmp_path / "out" / "compare-ppo" / "nccl_tuner.csv").is_file()
    assert Path(summary["paths"]["plot"]).stat().st_size > 10_000 and f"per size: {summary['paths']['plot']}" in out
    # a new noise seed is a new replay
    args2 = parse_args(["backend=replay", "topology=h200-2x2-sock", f"store={tmp_path / 'ft2.sqlite'}",
                        f"out={tmp_path / 'out2'}", "replay_seed=7"])
    assert run_finetune(args2)["replay_check"]["saved"] != check["saved"]


def test_the_recorded_samples_confirm_nothing_and_a_bad_replay_key_is_one_line(tmp_path):
    args = parse_args(["backend=replay", "topology=h200-2x2-sock", f"store={tmp_path / 'ft.sqlite'}",
                       f"out={tmp_path / 'out'}", "replay_noise=recorded"])
    summary = run_finetune(args)
    assert "replay_check" not in summary and summary["sizes_slower_on_sweep"] == 0
    for argv, key in ((["topology=h200-1x4"], "replay_store"), (["replay_noise=fresch"], "replay_noise"),
                      (["compare=[ppo]", "backend=torch"], "compare"), (["compare=[nope]"], "compare")):
        p = subprocess.run([sys.executable, "-m", "ncclrl", "finetune", "backend=replay", "topology=h200-2x2-sock",
                            f"out={tmp_path / 'bad'}", f"store={tmp_path / 'bad.sqlite'}", *argv],
                           capture_output=True, text=True, cwd=tmp_path)
        assert p.returncode == 2 and p.stderr.startswith(f"ncclrl: error: {key}:"), p.stderr
        assert p.stderr.count("\n") == 1 and not (tmp_path / "bad").exists() and not (tmp_path / "bad.sqlite").exists()
    assert json.loads((tmp_path / "out" / "summary.json").read_text())["rows"] == summary["rows"]


def test_a_strategy_s_weights_given_for_the_strategy_load_through_the_json_beside_them(tmp_path):
    from ncclrl.agents.search import SHIPPED, PolicyController, strategy_path
    from ncclrl.costmodel.errors import ConfigError

    shipped = strategy_path(SHIPPED)
    a = PolicyController.load(shipped.with_suffix(".npz"))
    assert a.meta == PolicyController.load(shipped).meta
    lone = tmp_path / "lone.npz"
    lone.write_bytes(shipped.with_suffix(".npz").read_bytes())
    with pytest.raises(ConfigError, match="^strategy: .*holds a strategy's weights"):
        PolicyController.load(lone)


def test_a_store_of_re_recorded_sweeps_alone_replays_and_one_without_any_sweep_is_refused():
    from ncclrl.costmodel.errors import ConfigError

    root = Path(__file__).resolve().parents[1] / "data" / "h200x4-2026-11-28"
    topo = load_topology("h200-4x1-sock")
    rows = recorded_sweep(root / "knobs" / "4x1.sqlite", topo, "nccl", ("sweep", "sweep-repeat"), status="ok")
    assert len(rows) > 1000 and set(rows.tag) == {"sweep-repeat"}
    with pytest.raises(ConfigError, match="no sweep of h200-4x1-sock"):
        recorded_sweep(root / "repeats" / "sweep.sqlite", topo, "nccl", ("sweep", "sweep-repeat"))
