"""Screen, confirm, then explore (finetune's default): the screen selects, confirmation tests."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from ncclrl.agents.baselines import make_tuner
from ncclrl.agents.problem import Evaluator, Oracle, Problem
from ncclrl.agents.search import ConfirmConfig, ConfirmController, Search, SearchConfig, Space, paired_test
from ncclrl.agents.search.model import _point_index
from ncclrl.agents.suite import grid_noise, gridded, replayed
from ncclrl.costmodel import nccl as N
from ncclrl.costmodel.errors import ConfigError
from ncclrl.costmodel.jobcost import DEFAULT_JOB_COST
from ncclrl.costmodel.noise import JobNoise
from ncclrl.costmodel.topology import load_topology
from ncclrl.envs.grids import read_grid

ROOT = Path(__file__).resolve().parents[1]
STORE = ROOT / "data" / "h200x4-2026-11-21" / "store.sqlite"


def small_problem() -> tuple[Problem, Space]:
    topo = load_topology("h200-2x2-sock")
    c = N.COLLECTIVES.index("allreduce")
    p = Problem(topo, [c], {c: [1 << 12, 1 << 14, 1 << 16, 1 << 18]})
    return p, Space(p)


def truth_measure(sp: Space, truth: np.ndarray, rng: np.random.Generator, sd: float = 0.03, lucky=None):
    """Each call one job: the truth times a job shift and a residual per point; ``lucky(job, i)``
    scales a point's time in one job."""
    at = _point_index(sp)
    calls = [0]

    def measure(k, pts, samples, tag):
        calls[0] += 1
        shift = rng.normal(0, sd)
        out = []
        for p in pts:
            i = at[(k.knobs, N.COLLECTIVES.index(p.collective), p.nbytes, (p.algo, p.proto, p.channels))]
            t = truth[i] * math.exp(shift + rng.normal(0, sd)) * (lucky(calls[0], i) if lucky else 1.0)
            out.append([t] * samples)
        return out

    return measure


def test_a_leader_lucky_in_the_screen_is_refuted_by_confirmation():
    p, sp = small_problem()
    truth = np.exp(sp.prior)
    c = 1
    d = int(sp.default[c])
    slow = [int(i) for i in sp.members[c] if i != d and truth[i] > 1.3 * truth[d]][0]  # truly 30% slower
    # the screen (job 1) measures it 3x faster than NCCL's choice: a lucky draw
    lucky = lambda job, i: (truth[d] / truth[slow]) / 3 if (job == 1 and i == slow) else 1.0  # noqa: E731
    ev = Evaluator(p, truth_measure(sp, truth, np.random.default_rng(0), lucky=lucky), 1e6)
    ctl = ConfirmController(ConfirmConfig(explore=False))
    res = Search(p, ev, ctl, SearchConfig()).run()
    base = ctl.phases[0]
    assert slow in base.leaders[c], "the screen selected the lucky candidate"
    assert base.decided[slow] == "refuted"
    assert res.table.rows.get(c) != slow
    assert len(base.confirm) >= 2


def test_a_leader_truly_faster_is_confirmed_and_its_evidence_kept():
    p, sp = small_problem()
    truth = np.exp(sp.prior)
    c = 2
    d = int(sp.default[c])
    fast = [int(i) for i in sp.members[c] if i != d][0]
    truth[fast] = truth[d] / 1.5  # truly 1.5x faster than NCCL's choice, every other point as predicted
    ev = Evaluator(p, truth_measure(sp, truth, np.random.default_rng(1)), 1e6)
    ctl = ConfirmController(ConfirmConfig(explore=False))
    res = Search(p, ev, ctl, SearchConfig()).run()
    assert res.table.rows.get(c) == fast
    e = ctl.evidence[c]
    assert e["confirm_jobs"] >= 2 and e["screen_job"] == 1 and e["p_value"] < 0.05
    assert abs(math.log(e["paired_gain"]) - math.log(1.5)) < 0.1


def test_paired_test_cancels_the_job_and_size_effect():
    """Two configurations at one size share every job's shift: a shift of 50% that moves both
    leaves their difference, and the test, untouched."""
    p, sp = small_problem()
    d = int(sp.default[0])
    i = [int(x) for x in sp.members[0] if x != d][0]
    rng = np.random.default_rng(3)
    jobs_of = {d: {}, i: {}}
    for j in range(2, 6):
        shift = math.exp(rng.normal(0, 0.5))
        jobs_of[d][j] = 100.0 * shift
        jobs_of[i][j] = 80.0 * shift * math.exp(rng.normal(0, 0.01))
    t = paired_test(sp, jobs_of, [(i, d)], {2, 3, 4, 5}, math.log(1.01), ConfirmConfig(sd_prior=0.02))[(i, d)]
    assert t.jobs == 4 and t.wins == 4
    assert abs(t.gain - math.log(100 / 80)) < 0.02
    assert t.passes(math.log(1.01), 0.05)
    # the screen's job (1) is never part of the test
    jobs_of[i][1], jobs_of[d][1] = 1.0, 1000.0
    t1 = paired_test(sp, jobs_of, [(i, d)], {2, 3, 4, 5}, math.log(1.01), ConfirmConfig(sd_prior=0.02))[(i, d)]
    assert t1.gain == t.gain


def test_a_horizon_that_cannot_repay_the_screen_measures_nothing():
    p, sp = small_problem()
    ev = Evaluator(p, truth_measure(sp, np.exp(sp.prior), np.random.default_rng(0)), 1e6)
    ctl = ConfirmController(ConfirmConfig(horizon_sweeps=0.01))
    res = Search(p, ev, ctl, SearchConfig()).run()
    assert ev.calls == 0 and not res.table.rows
    assert "horizon does not pay" in res.reason


def test_settings_are_checked_when_constructed():
    with pytest.raises(ConfigError, match="confirm.leaders"):
        ConfirmController(ConfirmConfig(leaders=0))
    with pytest.raises(ConfigError, match="confirm.max_confirm_jobs"):
        ConfirmController(ConfirmConfig(max_confirm_jobs=1))


def test_share_does_not_fall_with_more_budget_on_the_recorded_host():
    """The expected share of the safe optimum (over seeds) never falls as the budget grows: the
    correction runs over a size's leaders, not over everything ever measured."""
    inst = replayed(STORE, "h200-2x2-sock", "nccl", "allreduce")
    o = inst.oracle
    sweep = o.sweep_gpu_s(DEFAULT_JOB_COST, 5)
    shares = []
    for b in (0.1, 0.25, 0.5, 1.0):
        s = []
        for seed in range(3):
            ev = Evaluator(inst.problem, inst.measure_for(seed), b * sweep, samples=5)
            v = o.score(make_tuner("confirm").tune(inst.problem, ev, seed))
            assert ev.gpu_s <= b * sweep + 1e-6
            assert v.slower == 0
            s.append(math.log(v.speedup) / math.log(v.safe_optimum))
        shares.append(float(np.mean(s)))
    assert shares[-1] > 0.5
    assert all(b >= a - 0.02 for a, b in zip(shares, shares[1:], strict=False)), shares


def _write_grid(path: Path, runs: int, sd: float, seed: int = 0) -> None:
    """An nccl-tests rows CSV of one 2-node grid: ring/simple and tree/ll, ``runs`` jobs each over
    12 sizes, every job's times the truth times a residual of sd ``sd`` per point."""
    rng = np.random.default_rng(seed)
    lines = []
    for algo, proto, base in (("ring", "simple", 40.0), ("tree", "ll", 30.0)):
        for r in range(runs):
            src = f"jobouts/2_nodes/all_reduce_perf-2-{algo}-{proto}/slurmout_{r}.txt"
            for k in range(13, 25):
                t = (base + 2 ** k / 2e4) * math.exp(rng.normal(0, sd))
                ip = t * math.exp(rng.normal(0, sd / 4))
                lines.append(f"{src},{2 ** k},{t:.3f},0,0,{ip:.3f},0,0,2,{algo},{proto}")
    path.write_text("\n".join(lines) + "\n")


def test_a_grid_is_replayed_with_its_own_noise(tmp_path):
    topo = load_topology("p5en-2n")
    f = tmp_path / "grid.csv"
    _write_grid(f, runs=4, sd=0.05)
    grid = read_grid([f], topo, "replica")
    noise = grid_noise(grid)
    assert noise is not None
    # the fitted per-point residual is the file's (0.05), not the H200 hosts' (0.13-0.23)
    assert 0.02 < float(np.median(noise.resid_sds)) < 0.09
    inst = gridded(grid, topo, "infiniband", "synthetic")
    assert "own repeated runs" in inst.noise
    # replayed jobs scatter about the truth as the grid's own runs did
    key = next(x for x in grid.recorded if x[3] != ("default", "default", 0))
    from ncclrl.costmodel.space import Point

    m = inst.measure_for(0)
    p = Point("allreduce", key[2], *key[3])
    logs = [math.log(np.median(m(inst.problem.base, [p], 5, "t")[0])) for _ in range(200)]
    assert 0.02 < float(np.std(logs)) < 0.09
    # a grid with one run per point falls back, and says so
    g1 = tmp_path / "one.csv"
    _write_grid(g1, runs=1, sd=0.05)
    one = read_grid([g1], topo, "replica")
    assert grid_noise(one) is None
    inst1 = gridded(one, topo, "infiniband", "single")
    assert inst1.noise.startswith("no repeats in single")
    assert JobNoise.load("p5en-2n/nccl").source in inst1.noise


def test_the_rerecorded_host_is_a_replay_of_its_repeated_settings_only():
    store2 = ROOT / "data" / "h200x4-2026-11-28" / "repeats" / "sweep.sqlite"
    inst = replayed([STORE, store2], "h200-2x2-sock", "nccl", "allreduce", min_jobs=3)
    knobs = [k.env() for k in inst.problem.knobs]
    assert knobs[0] == {} and len(knobs) == 3
    assert isinstance(inst.oracle, Oracle) and inst.oracle.safe_optimum > 1.0
    with pytest.raises(ConfigError, match="replay_store"):
        replayed([STORE, store2], "h200-2x2-sock", "nccl", "allreduce", min_jobs=50)


def test_a_twin_measured_faster_than_nccls_own_choice_is_exported_and_named():
    """A row forcing what the replica says NCCL picks is a candidate like any other: confirmed
    faster than NCCL's own choice, it is exported, and its evidence says the two disagree."""
    from ncclrl.agents.search.model import same_as_nccl

    p, sp = small_problem()
    same = same_as_nccl(sp)
    truth = np.exp(sp.prior)
    c, twin = next((int(sp.cell[i]), int(i)) for i in range(sp.size)
                   if same[i] and not sp.is_default[i] and sp.knob[i] == 0)
    d = int(sp.default[c])
    truth[twin] = truth[d] / 1.4  # NCCL's own choice runs slower than the configuration it should be
    for i in sp.members[c]:  # nothing else at that size comes close
        if int(i) not in (d, twin):
            truth[i] = max(truth[i], truth[d])
    ev = Evaluator(p, truth_measure(sp, truth, np.random.default_rng(2)), 1e6)
    ctl = ConfirmController(ConfirmConfig(explore=False))
    res = Search(p, ev, ctl, SearchConfig()).run()
    assert res.table.rows.get(c) == twin
    assert "twin" in ctl.evidence[c]


def test_a_knob_setting_faster_at_every_size_is_accepted_and_exported_with_what_its_pairs_ran():
    """A setting truly 1.5x faster than NCCL's defaults at every size passes its pairs, and the
    exported table runs, at every size, the point those pairs measured (a twin included)."""
    from ncclrl.costmodel.space import knob_grid

    topo = load_topology("h200-2x2-sock")
    c = N.COLLECTIVES.index("allreduce")
    p = Problem(topo, [c], {c: [1 << 12, 1 << 14, 1 << 16, 1 << 18]}, knob_grid(topo, "full")[:2])
    sp = Space(p)
    truth = np.exp(sp.prior)
    nc = sp.n_cells
    for cell in range(nc):
        d0 = int(sp.default[cell])
        for i in sp.members[nc + cell]:  # knob setting 1: every point 1.5x faster than NCCL's plain default
            truth[i] = truth[d0] / 1.5 * (1.0 if sp.is_default[i] else 1.2)
    ev = Evaluator(p, truth_measure(sp, truth, np.random.default_rng(4), sd=0.02), 1e6)
    ctl = ConfirmController()
    res = Search(p, ev, ctl, SearchConfig()).run()
    ph = next(x for x in ctl.phases if x.knob == 1)
    assert ph.verdict == "accepted" and res.table.knob == 1
    assert ctl.knob_evidence["1"]["pairs"] >= ctl.cfg.knob_pairs
    # every size runs the point the setting's pairs measured, as an explicit row where it is not NCCL's own
    for cell in range(nc):
        i = int(res.table.final[cell])
        assert i == ph.table[cell]
        assert (cell in res.table.rows) == (not sp.is_default[i])
