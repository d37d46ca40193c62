"""End to end: a tiny `ncclrl pretrain`, the exported table's coverage and rules, bad input."""

from __future__ import annotations

import json

import numpy as np
import pytest

from ncclrl.agents.export import MAX_BYTES, export_table
from ncclrl.costmodel import nccl as N
from ncclrl.costmodel.simulator import Simulator
from ncclrl.costmodel.table import lookup, parse_example_rows
from ncclrl.runners.cli import main

TINY = ["agent.total_timesteps=2048", "agent.n_envs=4", "agent.n_steps=256", "agent.batch_size=256",
        "progress_bar=false", "experiment.pretrain_topologies=[h200-1x4,h200-2x2-sock]"]


@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("run")
    code = main(["pretrain", *TINY, f"run_dir={run_dir}"])
    assert code == 0
    return run_dir


def test_pretrain_smoke_leaves_a_complete_run_folder(smoke_run):
    for name in ("policy.zip", "config.yaml", "report.txt", "summary.json", "s_curve.png", "evaluation.csv",
                 "table/nccl_tuner.csv", "table/nccl_tuner.json", "table/nccl.conf"):
        assert (smoke_run / name).exists(), name
    assert list((smoke_run / "tb").rglob("events.out.tfevents*"))
    s = json.loads((smoke_run / "summary.json").read_text())["summary"]
    assert s["worst_vs_default"] >= 0.99  # never worse than NCCL's default by more than 1%


def test_export_covers_every_size_of_every_collective(smoke_run):
    text = (smoke_run / "table" / "nccl_tuner.csv").read_text()
    rows = parse_example_rows(text)
    assert all(len(line) <= 256 for line in text.splitlines())
    assert all(r["channels"] >= 1 for r in rows)  # never -1: the example plugin would run 1 channel
    for coll in N.COLLECTIVES:
        mine = sorted((r for r in rows if r["collective"] == coll), key=lambda r: r["min_bytes"])
        assert mine[0]["min_bytes"] == 0 and mine[-1]["max_bytes"] == MAX_BYTES
        for a, b in zip(mine, mine[1:], strict=False):
            assert b["min_bytes"] == a["max_bytes"] + 1  # no gaps, no overlaps
        for s in [0, 1, 7, 8, 4095, 4096, 1 << 20, (1 << 30) + 5, MAX_BYTES]:
            assert lookup(rows, coll, s, 2, 4) is not None
    assert all(r["nNodes"] == 2 and r["nRanks"] == 4 for r in rows)  # target h200-2x2-sock
    assert all(r["algo"] in N.ALGOS and r["proto"] in N.PROTOS for r in rows)


def test_export_for_another_platform_and_show(smoke_run, tmp_path, capsys):
    out = tmp_path / "dgx"
    code = main(["export", f"checkpoint={smoke_run / 'policy.zip'}", "topology=dgx-h100-2n", f"run_dir={out}"])
    assert code == 0
    rows = parse_example_rows((out / "table" / "nccl_tuner.csv").read_text())
    assert {(r["nNodes"], r["nRanks"]) for r in rows} == {(2, 16)}
    capsys.readouterr()
    assert main(["show", str(out / "table" / "nccl_tuner.json"), f"plot={tmp_path / 'map.png'}"]) == 0
    shown = capsys.readouterr().out
    assert "allreduce" in shown and (tmp_path / "map.png").exists()


def test_guard_keeps_nccl_default_when_not_faster(smoke_run):
    from ncclrl.agents.pretrain import load_policy

    sim = Simulator("h200-1x4")
    table = export_table(load_policy(smoke_run / "policy.zip"), sim, tune_conf=False)
    from ncclrl.agents.evaluate import evaluate_table
    df = evaluate_table(table, sim)
    assert df["speedup"].min() >= 0.99
    assert all(r.source in ("policy", "nccl-default") for r in table.rows)


@pytest.mark.parametrize("argv,needle", [
    (["pretrain", "topology=h300-9x9"], "topology: unknown preset"),
    (["pretrain", "agent.nonsense=3"], "agent.nonsense"),
    (["pretrain", "agent.batch_size=300", "agent.n_envs=2", "agent.n_steps=100", "agent.total_timesteps=10"],
     "agent.batch_size"),
    (["pretrain", "backend.kind=nccl-tests"], "backend.kind"),
])
def test_bad_overrides_are_one_line(capsys, argv, needle):
    code = main(argv)
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and needle in err, err


def test_checkpoint_from_another_layout(tmp_path, capsys):
    from sb3_contrib import MaskablePPO
    from sb3_contrib.common.envs import InvalidActionEnvDiscrete

    other = MaskablePPO("MlpPolicy", InvalidActionEnvDiscrete(dim=20, n_invalid_actions=10), n_steps=64)
    other.save(str(tmp_path / "other.zip"))
    code = main(["export", f"checkpoint={tmp_path / 'other.zip'}", f"run_dir={tmp_path / 'x'}"])
    err = capsys.readouterr().err
    assert code == 2 and "retrain" in err and err.count("\n") == 1
    (tmp_path / "junk.zip").write_bytes(b"not a zip")
    assert main(["export", f"checkpoint={tmp_path / 'junk.zip'}"]) == 2


def test_policy_decisions_are_deterministic(smoke_run):
    from ncclrl.agents.export import _decide
    from ncclrl.agents.pretrain import load_policy
    from ncclrl.costmodel.topology import load_topology

    m = load_policy(smoke_run / "policy.zip")
    sizes = 1 << np.arange(0, 32, dtype=np.int64)
    a = _decide(m, load_topology("h200-1x4"), N.ALLREDUCE, sizes)
    b = _decide(load_policy(smoke_run / "policy.zip"), load_topology("h200-1x4"), N.ALLREDUCE, sizes)
    assert np.array_equal(a, b)
