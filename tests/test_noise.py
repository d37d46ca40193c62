"""The between-job noise model (runners/noise.py), checked on synthetic jobs with a known answer
and on the recorded A/A jobs of the 4 x H200 store; job ids in the store; validate judging stored
jobs; the replay's repeated jobs; the tuning run's decision under job-wide shifts and per-sample noise."""

from __future__ import annotations

import hashlib
import importlib.util
import io
from pathlib import Path

import numpy as np
import pytest

from ncclrl.agents.finetune import finetune, sizes_for
from ncclrl.agents.problem import Evaluator, Problem, gpu_s_for_points
from ncclrl.agents.search import JobController, RankController, SearchConfig
from ncclrl.costmodel import nccl as N
from ncclrl.costmodel.noise import compare, pooled_sigma
from ncclrl.costmodel.replica import default_decisions
from ncclrl.costmodel.simulator import Simulator
from ncclrl.costmodel.space import Point
from ncclrl.costmodel.topology import load_topology
from ncclrl.envs.store import Store, job_ids

REPO = Path(__file__).resolve().parent.parent
LIVE = REPO / "data" / "h200x4-2026-11-21" / "store.sqlite"


def jobs(rng, center: float, n_jobs: int, job_sigma: float, n: int = 9, within: float = 0.01) -> list[list[float]]:
    """``n_jobs`` jobs of ``n`` samples: each job shifted by a lognormal job effect."""
    out = []
    for _ in range(n_jobs):
        shift = np.exp(job_sigma * rng.standard_normal())
        out.append((center * shift * (1 + within * rng.standard_normal(n))).tolist())
    return out


def test_pooled_sigma_pools_neighbours_and_counts_repeated_jobs():
    logs = [[[0.0, 0.2]], [[1.0]], [], [[0.0, 0.1, 0.2]], [[5.0, 5.0]]]
    sigma, df = pooled_sigma(logs, window=1)
    # size 1 has no repeat itself; its window (sizes 0-2) has one repeated pair: df 1, sd of (0, .2)
    assert df.tolist() == [1, 1, 2, 3, 3]
    assert sigma[1] == pytest.approx(np.sqrt(0.02))
    assert sigma[4] == pytest.approx(np.sqrt(0.02 / 3))  # (0, .1, .2) and (5, 5) pooled
    sigma0, df0 = pooled_sigma([[[1.0]], [[2.0]]])
    assert df0.tolist() == [0, 0] and sigma0.tolist() == [0.0, 0.0]


@pytest.mark.parametrize("shift, want", [(1.0, "same"), (0.5, "faster"), (2.0, "slower")])
def test_compare_finds_a_real_difference_through_job_noise(shift, want):
    """Job effects of sigma 0.15 (the H200s' mid sizes): 3 jobs per side tell 2x apart, not 1x."""
    rng = np.random.default_rng(1)
    a, b = jobs(rng, 100.0, 3, 0.15), jobs(rng, 100.0 * shift, 3, 0.15)
    sigma, df = pooled_sigma([[np.log([np.median(j) for j in a]), np.log([np.median(j) for j in b])]])
    c = compare(a, b, float(sigma[0]), int(df[0]))
    assert c.verdict == want and c.df == 4
    assert c.ratio_lo < c.ratio < c.ratio_hi


def test_between_job_noise_keeps_a_job_shift_from_being_a_verdict():
    """Two jobs per side, a 25% shift between jobs, five neighbouring sizes each with its own
    shifts (the model's assumption): within-job intervals alone call most A/A comparisons
    different; the between-job model about 5% (the nominal rate) or fewer."""
    rng = np.random.default_rng(0)
    within_only = between = 0
    trials = 200
    for _ in range(trials):
        sides = [(jobs(rng, 50.0, 2, 0.25), jobs(rng, 50.0, 2, 0.25)) for _ in range(5)]
        sigma, df = pooled_sigma([[np.log([np.median(j) for j in a]), np.log([np.median(j) for j in b])]
                                  for a, b in sides])
        a, b = sides[2]
        within_only += compare(a[:1], b[:1], 0.0, 0).verdict != "same"
        between += compare(a, b, float(sigma[2]), int(df[2])).verdict != "same"
    assert within_only / trials > 0.5
    assert between / trials <= 0.08


def _calibration():
    spec = importlib.util.spec_from_file_location("aa", REPO / "docs" / "results" / "noise" / "aa_calibration.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_recorded_a_a_validations_are_judged_the_same_by_the_between_job_model():
    """The committed H200 store: 4 jobs of NCCL's defaults at a time as A/A validations (2 rounds),
    every third of them (the script judges all): within-job intervals of one job each call about
    half of the sizes different, the pooled samples a fifth, the between-job model under 5%."""
    out = _calibration().main(str(LIVE), every=3)
    assert len(out) >= 300
    rate = {rule: float((out[rule] != "same").mean()) for rule in ("one_job_each", "pooled_samples", "between_job")}
    assert rate["one_job_each"] > 0.3
    assert rate["between_job"] <= 0.05 and rate["between_job"] < rate["pooled_samples"]


def test_store_job_ids_are_inferred_for_old_rows():
    """Rows from before job ids: a validation's jobs are recovered from the timestamps (2 base jobs
    per validation, a job per measured collective set of 25-77 points)."""
    with Store(LIVE, readonly=True) as s:
        df = s.frame(tag="validate-base", status="ok")
    old = df[df.job == ""].copy()
    old["job"] = job_ids(old)
    sizes = old.groupby("job").size()
    assert len(sizes) == 24 and set(sizes) <= {26, 51, 77}
    new = df[df.job != ""]
    assert len(new) and (job_ids(new) == new.job).all()  # ids the store has are kept


def test_validate_from_the_store_repeats_the_live_report(tmp_path):
    """``measure=0`` judges the jobs an earlier validation stored: the same report, no workers."""
    from test_sweep_store import FakeTableWorkers

    from ncclrl.runners.validate import parse_args, run_validate

    table = tmp_path / "t.csv"
    table.write_text("allreduce,0,max,ring,simple,2,-1,-1\n")
    sim = Simulator("h200-2x2-sock", seed=0)
    common = [f"table={table}", "topology=h200-2x2-sock", "max_bytes=1M", f"store={tmp_path / 's.sqlite'}"]
    live = run_validate(parse_args(common + ["rounds=3"]), out=io.StringIO(),
                        workers_factory=lambda k, t: FakeTableWorkers(k, t, sim))
    again = run_validate(parse_args(common + ["measure=0"]), out=io.StringIO(),
                         workers_factory=lambda k, t: pytest.fail("measure=0 must not start workers"))
    assert (live[["nbytes", "verdict", "jobs"]] == again[["nbytes", "verdict", "jobs"]]).all().all()
    for col in ("speedup", "speedup_lo", "speedup_hi"):  # the store keeps samples to 4 decimals
        assert np.allclose(live[col], again[col], rtol=1e-4)
    assert set(again.jobs) == {3}
    with pytest.raises(Exception, match="measure"):  # jobs timed through torch.distributed are never paired
        run_validate(parse_args(common + ["measure=0", "launch=torch"]), out=io.StringIO())
    with pytest.raises(Exception, match="measure"):
        other = tmp_path / "other.csv"
        other.write_text("allreduce,0,max,tree,ll,2,-1,-1\n")
        run_validate(parse_args([f"table={other}"] + common[1:] + ["measure=0"]), out=io.StringIO())


def test_stored_a_a_validation_on_the_h200s():
    """The A/A table (no rows) validated on the H200s: every size "same" on h200-2x2-sock (3
    rounds), at most 2 of 26 different on h200-1x4 (9 rounds in three windows pooled: 0); with
    NCCL called directly (3 rounds each), every size "same" on both."""
    from ncclrl.runners.validate import parse_args, run_validate

    table = REPO / "docs" / "results" / "noise" / "aa_table.csv"
    assert hashlib.sha256(table.read_bytes()).hexdigest()[:12] == "ccd1ca9cdf15"
    for topo, launch, most in (("h200-2x2-sock", "torch", 0), ("h200-1x4", "torch", 2), ("h200-2x2-sock", "nccl", 0),
                               ("h200-1x4", "nccl", 0)):
        df = run_validate(parse_args([f"table={table}", f"topology={topo}", f"store={LIVE}", "measure=0",
                                      f"launch={launch}"]),
                          out=io.StringIO())
        assert len(df) == 26 and (df.verdict != "same").sum() <= most


def test_replay_gives_a_repeated_point_the_next_recorded_job():
    from ncclrl.envs.replay import ReplayWorkers

    with Store(LIVE, readonly=True) as s:
        frame = s.frame(topology="h200-2x2-sock", status="ok", collective="allreduce", nbytes=1024, algo="default",
                        comm_channels=0, socket_nthreads=0, nsocks_perthread=0, socket_inline_bytes=0)
    frame = frame[frame.tag.isin(["sweep", "sweep-repeat"])]
    first = frame.samples_us.tolist()
    assert len(first) >= 2
    seen: dict = {}
    p = Point("allreduce", 1024)
    got = [ReplayWorkers(frame, Point("allreduce", 1), seen).measure([p])[0] for _ in range(len(first) + 1)]
    assert got[: len(first)] == first and got[-1] == first[0]


def _platform_with_job_shifts(sim, fast_knobs, job_sigma: float, seed: int):
    """The simulator's times with a lognormal shift per job (shared by all its points) and 2% noise
    per sample; under ``fast_knobs`` every call is 2x faster than under NCCL's defaults."""
    rng = np.random.default_rng(seed)

    def measure(knobs, points, samples, tag):
        shift = float(np.exp(job_sigma * rng.standard_normal()))
        out = []
        for p in points:
            c = N.COLLECTIVES.index(p.collective)
            t = float(sim.time_us(sim.default_configs(c, [p.nbytes]))[0])
            if knobs.knobs == fast_knobs:
                t /= 2.0
            out.append((t * shift * (1 + 0.02 * rng.standard_normal(samples))).tolist())
        return out

    return measure


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_setting_faster_everywhere_is_exported_through_job_wide_shifts(seed):
    """A knob setting 2x faster at every size, jobs shifted by 25% (sigma) as on the H200s: a
    tuning run in whole jobs (finetune's default) finds it and the decision exports it."""
    topo = load_topology("h200-2x2-sock")
    problem = Problem.make(topo, [N.ALLREDUCE], 8, 1 << 20)
    fast = problem.knobs[3].knobs
    ev = Evaluator(problem, _platform_with_job_shifts(Simulator(topo, seed=0), fast, 0.25, seed),
                   gpu_s_for_points(problem, 400))
    out, run = finetune(problem, ev, JobController(), SearchConfig())
    assert out.conf.knobs == fast and run.table.knob_prob > 0.9
    assert ev.gpu_s <= ev.budget + 1e-9


def _runs_nccls_choice(topo, p: Point) -> bool:
    """Whether ``p`` runs NCCL's own choice (NCCL's choice, or the replica's algorithm, protocol
    and channel count forced explicitly)."""
    if p.is_default:
        return True
    d = default_decisions(topo, p.collective, [p.nbytes], comm_channels=p.comm_channels)
    comm = p.comm_channels or topo.nccl.channels
    return ((p.algo, p.proto) == (N.ALGOS[int(d.algo[0])], N.PROTOS[int(d.proto[0])])
            and (p.channels == 0 or min(p.channels, comm) == int(d.max_channels[0])))


def _rows_faster_by(factor: float, seed: int = 0):
    """Every per-call configuration ``factor`` x NCCL's choice (the one that runs NCCL's own
    choice explicitly: 1 x), the same under every knob setting; 6% noise per sample."""
    sim = Simulator("h200-2x2-sock", seed=0)
    rng = np.random.default_rng(seed)

    def measure(knobs, points, samples, tag):
        out = []
        for p in points:
            t = float(sim.time_us(sim.default_configs(N.COLLECTIVES.index(p.collective), [p.nbytes]))[0])
            t *= 1.0 if _runs_nccls_choice(sim.topo, p) else factor
            out.append((t * (1 + 0.06 * rng.standard_normal(samples))).tolist())
        return out

    return measure


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("factor", [0.92, 1.0, 1.05])
def test_the_decision_keeps_rows_truly_faster_and_never_rows_truly_slower(factor, seed):
    """Rows truly 8% faster: with budget to measure them and NCCL's choice next to them, nearly all
    (85%) are kept. Rows truly 5% slower: none. Rows that tie: few, the best of each size's
    measured candidates held to Sidak's level (at most ``alpha`` per size; 2-4 of 18 sizes here);
    a tie costs nothing. NCCL's knob defaults only, so that the budget goes to the rows."""
    topo = load_topology("h200-2x2-sock")
    problem = Problem.make(topo, [N.ALLREDUCE], 8, 1 << 20)
    problem.knobs = problem.knobs[:1]
    n = problem.n_cells
    ev = Evaluator(problem, _rows_faster_by(factor, seed), gpu_s_for_points(problem, 600))
    out, run = finetune(problem, ev, RankController(), SearchConfig())
    assert ev.gpu_s <= ev.budget + 1e-9
    if factor < 1:
        assert len(out.rows) >= 0.85 * n
    elif factor > 1:
        assert not out.rows
    else:
        assert len(out.rows) <= 0.3 * n


def test_aa_noise_groups_jobs_by_time_and_recovers_a_known_spread():
    """Jobs minutes apart form a group; the spread between groups (a shift of a whole command,
    hours apart) is not counted. With sigma 0.2 between jobs of a group, the estimate is close."""
    import pandas as pd

    from ncclrl.costmodel.noise import aa_noise

    rng = np.random.default_rng(0)
    rows, sizes = [], [8, 16, 32]
    for g, shift in enumerate([0.0, 1.0, -1.0]):  # three commands hours apart, far apart in level
        for j in range(20):
            e = rng.normal(0.0, 0.2)
            for s in sizes:
                rows.append({"job": f"g{g}j{j}", "ts": g * 10_000.0 + 30.0 * j, "nbytes": s,
                             "samples_us": list(np.exp(3.0 + shift + e + rng.normal(0, 0.01, 5)))})
    n = aa_noise(pd.DataFrame(rows), sizes)
    assert all(0.15 < sig < 0.25 and df == 3 * 3 * 19 for sig, df in n.values())
    assert aa_noise(pd.DataFrame(rows).iloc[:0], sizes) == {s: (0.0, 0) for s in sizes}


def test_replay_judges_with_the_spread_of_the_recorded_validations():
    """The committed store holds many validations of NCCL's plain defaults on h200-2x2-sock with
    both launches: replay takes the between-job spread from them (a replayed run's repeats are the
    same samples again); a tuner that judges across jobs (``ncclrl tune``) gets it as the problem's noise."""
    from ncclrl.envs.replay import replay_noise

    topo = load_topology("h200-2x2-sock")
    sizes = sizes_for(topo, [N.ALLREDUCE], 8, 256 << 20)
    for launch in ("nccl", "torch"):
        n = replay_noise(LIVE, topo, launch, [N.ALLREDUCE], sizes)["allreduce"]
        assert set(n) == set(sizes[N.ALLREDUCE]) and all(0.05 < sig < 0.6 and df > 50 for sig, df in n.values())
    assert replay_noise(LIVE, topo, "nccl", [N.BROADCAST], sizes_for(topo, [N.BROADCAST], 8, 1 << 20)) is None
