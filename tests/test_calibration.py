"""The margin rule of the zero-shot table, calibrating the prior before a tuning run, and the
zero-shot table on a public grid's truth."""

from __future__ import annotations

import math
import os
from pathlib import Path

import numpy as np
import pytest

from ncclrl.agents.calibration import calibrate, calibrate_first, prior_errors, prior_is_calibrated
from ncclrl.agents.export import CALIBRATED_MARGIN, UNCALIBRATED_MARGIN, export_table
from ncclrl.agents.finetune import finetune
from ncclrl.agents.problem import Evaluator, Problem, platform_measure
from ncclrl.agents.search import RankController, Search, SearchConfig, Space, zero_shot, zero_shot_within
from ncclrl.costmodel import nccl as N
from ncclrl.costmodel.errors import ConfigError
from ncclrl.costmodel.simulator import SimParams, Simulator
from ncclrl.costmodel.topology import load_topology

REPO = Path(__file__).resolve().parents[1]


def _public() -> Path | None:
    for root in (os.environ.get("NCCLRL_SHARED_DATA"), REPO.parent / "shared" / "data"):
        if root and (Path(root) / "public-grids").is_dir():
            return Path(root)
    return None


def _space(preset: str = "a100-2x4-sock") -> Space:
    topo = load_topology(preset)
    p = Problem.make(topo, [N.ALLREDUCE], 8, 256 << 20, prior=Simulator(topo, SimParams.defaults(topo), seed=0))
    p.knobs = p.knobs[:1]  # NCCL's defaults only: the rule per size
    return Space(p)


def test_margin_rule_keeps_nccl_inside_the_margin_and_takes_the_row_outside():
    sp = _space()
    nc = sp.n_cells
    gain = np.array([sp.prior[sp.default[c]] - sp.prior[sp.members[c]].min() for c in range(nc)])
    assert (gain > 0.05).sum() >= 2 and (gain < 0.6).sum() >= 2, gain  # cells on both sides of the margin below
    margin = 0.2
    thr = -math.log1p(-margin)
    t = zero_shot_within(sp, margin)
    taken = {c for c in range(nc) if gain[c] > thr}
    assert set(t.rows) == taken and 0 < len(taken) < nc
    for c in range(nc):  # outside the margin: the prior's best point; inside: NCCL's choice
        want = sp.members[c][np.argmin(sp.prior[sp.members[c]])] if c in taken else sp.default[c]
        assert t.final[c] == want
    assert set(zero_shot_within(sp, 0.0).rows) == set(zero_shot(sp).rows)  # margin 0: the exact argmin
    assert not zero_shot_within(sp, 0.99).rows
    with pytest.raises(ConfigError, match="margin"):
        zero_shot_within(sp, 1.0)


@pytest.mark.parametrize("preset,calibrated", [("a100-2x4-sock", False), ("h200-2x2-sock", True)])
def test_export_applies_the_measured_margin(preset, calibrated):
    """Without a margin the export takes the measured error: uncalibrated on a preset without a fitted
    sim block, calibrated on one with; a row leaves NCCL's choice only where predicted faster by more."""
    sim = Simulator(load_topology(preset))
    topo = sim.topo
    table = export_table(sim, ["allreduce"], tune_conf=False, shapes=[[topo.nodes, topo.nranks]])
    m = CALIBRATED_MARGIN if calibrated else UNCALIBRATED_MARGIN
    assert table.provenance["margin"] == m and table.provenance["simulator_calibrated"] is calibrated
    for r in table.rows:
        if r.source == "simulator":
            assert r.time_us < (1 - m) * r.default_time_us
    small = export_table(sim, ["allreduce"], tune_conf=False, shapes=[[topo.nodes, topo.nranks]], margin=0.0)
    n_sim = sum(r.source == "simulator" for r in table.rows)
    assert sum(r.source == "simulator" for r in small.rows) > n_sim  # the margin kept NCCL's choice somewhere


def _far_platform(seed: int = 6):
    topo = load_topology("a100-2x4-sock")
    prior = Simulator(topo, SimParams.defaults(topo), seed=0)
    truth = prior.randomized(np.random.default_rng(seed))
    problem = Problem.make(topo, [N.ALLREDUCE], 8, 256 << 20, prior=prior)
    problem.knobs = problem.knobs[:4]
    return problem, truth


def test_calibrating_on_the_first_job_brings_the_prior_to_the_platform():
    """A platform drawn far from the nominal prior: after the first job (NCCL's defaults at every size)
    the calibrated prior's median |log error| on the measured sizes is below 0.05 (from above 0.2), the
    run keeps that job's measurements, and its space runs on the calibrated prior."""
    problem, truth = _far_platform()
    assert not prior_is_calibrated(problem)
    ev = Evaluator(problem, platform_measure(truth, np.random.default_rng(0)), 1e6, samples=5)
    search = Search(problem, ev, RankController(), SearchConfig())
    info = calibrate_first(search)
    assert ev.calls == 1 and info["points"] == problem.n_cells
    assert info["median_log_err_before"] > 0.2 and info["median_log_err_after"] < 0.05, info
    assert search.problem.prior is not problem.prior and search.space.problem is search.problem
    sp = search.space
    assert (search.n[sp.default[: sp.n_cells]] == 1).all() and search.n.sum() == sp.n_cells
    again = Space(search.problem)
    np.testing.assert_allclose(sp.prior, again.prior)
    assert not np.allclose(sp.prior, Space(problem).prior)


def test_calibration_reduces_the_error_on_sizes_it_was_fitted_on_only_from_measurements():
    problem, truth = _far_platform(seed=4)
    cells = problem.cells()
    from ncclrl.costmodel.space import DEFAULT, point_configs

    t = truth.time_us(point_configs(problem.topo, problem.base, N.ALLREDUCE, np.array([s for _, s in cells]),
                                    [DEFAULT] * len(cells)))
    curve = {(problem.base.knobs, c, s, DEFAULT): float(x) for (c, s), x in zip(cells, t, strict=True)}
    before = prior_errors(problem, curve)["log_err"].median()
    after = prior_errors(calibrate(problem, curve), curve)["log_err"].median()
    assert after < 0.05 < 0.25 < before
    with pytest.raises(ConfigError, match="calibrate"):
        calibrate(problem, {})


def test_finetune_calibrates_first_when_asked_and_records_it():
    problem, truth = _far_platform()
    ev = Evaluator(problem, platform_measure(truth, np.random.default_rng(1)), 400.0, samples=5)
    out, search = finetune(problem, ev, RankController(), SearchConfig(), calibrate="auto")
    cal = out.evidence["calibration"]
    assert cal["points"] == problem.n_cells and cal["median_log_err_after"] < cal["median_log_err_before"]
    assert search.problem.prior is not problem.prior
    ev2 = Evaluator(problem, platform_measure(truth, np.random.default_rng(1)), 400.0, samples=5)
    out2, search2 = finetune(problem, ev2, RankController(), SearchConfig(), calibrate="off")
    assert "calibration" not in out2.evidence and search2.problem.prior is problem.prior
    with pytest.raises(ConfigError, match="calibrate"):
        finetune(problem, ev2, RankController(), SearchConfig(), calibrate="yes")


def test_a_calibrated_preset_is_not_calibrated_again():
    topo = load_topology("h200-2x2-sock")
    assert prior_is_calibrated(Problem.make(topo, [N.ALLREDUCE], 8, 1 << 20))
    assert not prior_is_calibrated(Problem.make(topo, [N.ALLREDUCE], 8, 1 << 20,
                                                prior=Simulator(topo, SimParams.defaults(topo), seed=0)))


@pytest.mark.public_grids
def test_zero_shot_on_a_public_grid_is_not_below_nccls_default(monkeypatch):
    """a100-2x4-step: the zero-shot table under the margin rule, uncalibrated and calibrated on one
    measured S-curve (NCCL's measured default), is not below NCCL's default on the grid's truth."""
    from ncclrl.agents.suite import public_gridded

    monkeypatch.setenv("NCCLRL_SHARED_DATA", str(_public()))
    inst = public_gridded("a100-2x4-step")
    p, o = inst.problem, inst.oracle
    sp = Space(p)
    t = zero_shot_within(sp, UNCALIBRATED_MARGIN)
    assert o.score(sp.decision(t.knob, t.rows)).speedup >= 1.0
    ev = Evaluator(p, inst.measure_for(0), 1e12)
    items = [(c, s, ("default", "default", 0)) for c, s in p.cells()]
    curve = {(p.base.knobs, c, s, k): m for (c, s, k), m in zip(items, ev.evaluate(p.base, items), strict=True)}
    cp = calibrate(p, curve)
    csp = Space(cp)
    t = zero_shot_within(csp, CALIBRATED_MARGIN)
    assert o.score(csp.decision(t.knob, t.rows)).speedup >= 1.0


def test_export_counts_a_given_calibration_and_bad_keys_are_one_line(tmp_path, capsys):
    """export.calibration=FILE runs the target on that calibrated YAML's sim block with the calibrated
    margin; a missing file, or a YAML without a sim block, is refused in one line naming the key."""
    import json

    from ncclrl.costmodel.topology import dump_topology
    from ncclrl.runners.cli import main

    cal = tmp_path / "a100-cal.yaml"
    topo = load_topology("a100-2x4-sock")
    dump_topology(topo.with_sim({"launch_us": 12.0}, name="a100-cal"), cal)
    out = tmp_path / "run"
    assert main(["export", "topology=a100-2x4-sock", f"export.calibration={cal}", "export.tune_conf=false",
                 "export.shapes=[[2,8]]", f"run_dir={out}"]) == 0
    assert "more than 51.3% (the simulator calibrated for a100-2x4-sock" in capsys.readouterr().out
    prov = json.loads((out / "table" / "nccl_tuner.json").read_text())["provenance"]
    assert prov["margin"] == CALIBRATED_MARGIN and prov["simulator_calibrated"] is True
    from omegaconf import OmegaConf

    from ncclrl.runners.pretrain import export_margin

    cal_sim = Simulator(topo.with_sim({"launch_us": 12.0}))
    for value, margin in (("auto", CALIBRATED_MARGIN), ("none", UNCALIBRATED_MARGIN)):
        cfg = OmegaConf.create({"export": {"margin": None, "calibration": value}})
        assert export_margin(cfg, cal_sim) == (margin, value == "auto")
    cfg = OmegaConf.create({"export": {"margin": 0.05, "calibration": "auto"}})
    assert export_margin(cfg, Simulator(topo)) == (0.05, False)
    plain = tmp_path / "plain.yaml"
    dump_topology(topo, plain)
    for value in (str(tmp_path / "nope.yaml"), str(plain)):
        assert main(["export", f"export.calibration={value}", f"run_dir={tmp_path / 'bad'}"]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "error: export.calibration: " in err, err
    assert not (tmp_path / "bad").exists()


def test_finetune_calibrate_key(tmp_path):
    from ncclrl.runners.finetune import parse_args

    with pytest.raises(ConfigError, match="^calibrate"):
        parse_args(["topology=h200-1x4", "calibrate=yes"])


@pytest.mark.public_grids
def test_finetune_on_a_public_grid_calibrates_first(tmp_path, monkeypatch):
    import json

    from ncclrl.runners.finetune import parse_args, run_finetune

    monkeypatch.setenv("NCCLRL_SHARED_DATA", str(_public()))
    # a whole sweep's GPU-time: the calibrating first job (NCCL's defaults at every size) fits in it
    args = parse_args(["backend=replay", "topology=a100-2x4-sock", "grid=a100-2x4-step", "budget=1sweep",
                       "calibrate=auto", f"store={tmp_path / 'ft.sqlite'}", f"out={tmp_path / 'out'}"])
    run_finetune(args)
    cal = json.loads((tmp_path / "out" / "finetune.json").read_text())["evidence"]["calibration"]
    assert cal["points"] == 6 and cal["median_log_err_after"] < cal["median_log_err_before"]
