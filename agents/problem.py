"""A tuning problem, the budgeted evaluator every tuner measures through, and the oracle that
judges a tuner's decision.

The space is the live sweep's (:func:`ncclrl.costmodel.space.knob_grid` x
:func:`ncclrl.costmodel.space.call_configs` plus NCCL's own choice): one per-process knob setting
for the whole table (it goes to ``nccl.conf``), and per (collective, size) one per-call
configuration (a table row) or NCCL's choice. An *evaluation* is one point (knob setting,
collective, size, configuration) measured with ``samples`` repetitions in a *job* (one launch, one
communicator, one knob setting); every tuner pays the GPU-time of every job, NCCL's defaults
included, through the same :class:`Evaluator`, whether it wraps a simulated platform, a replayed
sweep or live GPUs. Every problem carries the *prior*: the
simulator a user starts from (the topology's nominal parameters), which every tuner that can use a
prior gets.
"""

from __future__ import annotations

import math
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from ncclrl.costmodel import nccl as N
from ncclrl.costmodel.errors import ConfigError, JobError
from ncclrl.costmodel.jobcost import DEFAULT_JOB_COST, JobCost
from ncclrl.costmodel.noise import JobNoise, pooled_median, robust_median
from ncclrl.costmodel.platforms import Platform
from ncclrl.costmodel.simulator import Configs, Simulator
from ncclrl.costmodel.space import DEFAULT, Key, Point, call_configs, knob_grid, point_configs, size_grid
from ncclrl.costmodel.topology import Topology
from ncclrl.envs.jobs import Interrupted, stop_requested

# measure(knobs, points, samples, tag) -> samples per point (None: failed); one job per call live
Measure = Callable[[Point, list[Point], int, str], list[list[float] | None]]


@dataclass
class Problem:
    """One tuning problem: a platform, its collectives and sizes, the knob settings to choose from."""

    topo: Topology
    colls: list[int]
    sizes: dict[int, list[int]]
    knobs: list[Point] = field(default_factory=list)
    #: the platform's between-job spread per collective name and size, (sigma, df), when known from
    #: recorded repeated jobs (a replayed platform); tuners that judge across jobs use it
    noise: dict[str, dict[int, tuple[float, int]]] | None = None
    #: the simulator every tuner may use as its prior (default: the topology's nominal parameters)
    prior: Simulator | None = None
    #: points the platform can run (``None``: all); a replayed sweep has only what it recorded
    available: set[tuple[tuple[int, ...], int, int, Key]] | None = None
    #: how many independent jobs each point can be measured in (``None``: any number); a replayed
    #: sweep answers a repeat of a point it recorded once with the same samples
    repeats: dict[tuple[tuple[int, ...], int, int, Key], int] | None = None
    #: a job's calls per step at each (collective, size) (``None``: every size counts alike); given,
    #: the objective is the job's communication time per step, sum of calls x time, not the
    #: geometric mean over sizes (:meth:`log_gain`)
    weights: dict[tuple[int, int], float] | None = None

    def __post_init__(self) -> None:
        if not self.knobs:
            self.knobs = knob_grid(self.topo, "full")
        if any(self.knobs[0].knobs):
            raise ConfigError("knobs", "the first knob setting must be NCCL's defaults (the reference)")
        if self.prior is None:
            self.prior = Simulator(self.topo, seed=0)
        if self.weights is not None:
            bad = [x for x in self.cells() if not (self.weights.get(x, 0.0) > 0 and np.isfinite(self.weights[x]))]
            if bad:
                raise ConfigError("weights", f"calls per step must be a finite number > 0 at every size; "
                                  f"{N.COLLECTIVES[bad[0][0]]} {bad[0][1]} B has {self.weights.get(bad[0])}")

    def cell_weights(self) -> np.ndarray | None:
        """Calls per step of each cell in :meth:`cells` order (``None``: unweighted)."""
        return None if self.weights is None else np.array([self.weights[x] for x in self.cells()], dtype=float)

    def log_gain(self, ref: np.ndarray, t: np.ndarray, where: np.ndarray | None = None) -> float:
        """The objective's gain of times ``t`` over ``ref`` (both per cell in :meth:`cells` order,
        us), in log: the mean log speedup (a geometric mean over sizes), or with :attr:`weights`
        the log speedup of the step's communication time, ``log(sum w ref / sum w t)``; over the
        cells ``where`` is true (default: all)."""
        ref, t = np.asarray(ref, dtype=float), np.asarray(t, dtype=float)
        w = self.cell_weights()
        if where is not None:
            ref, t, w = ref[where], t[where], None if w is None else w[where]
        if not len(ref):
            return 0.0
        if w is None:
            return float(np.mean(np.log(ref / t)))
        return float(np.log(np.dot(w, ref) / np.dot(w, t)))

    @classmethod
    def make(cls, topo: Topology, colls: list[int], min_bytes: int = 8, max_bytes: int = 1 << 30,
             **kw) -> Problem:
        return cls(topo, colls, {c: size_grid(min_bytes, max_bytes, topo.nranks, c) for c in colls}, **kw)

    @property
    def base(self) -> Point:
        return self.knobs[0]

    def space(self, coll: int, k: Point) -> list[Key]:
        """Per-call choices under knob setting ``k``: NCCL's own first, then the sweep's configurations."""
        return [DEFAULT, *call_configs(self.topo, coll, k, "full")]

    def runs(self, k: Point, coll: int, s: int, key: Key) -> bool:
        """Whether the platform can run the point."""
        return self.available is None or (k.knobs, coll, s, key) in self.available

    def cells(self) -> list[tuple[int, int]]:
        """Every (collective, size)."""
        return [(c, s) for c in self.colls for s in self.sizes[c]]

    @property
    def n_cells(self) -> int:
        return sum(len(v) for v in self.sizes.values())

    @property
    def n_points(self) -> int:
        """Size of the whole space: what an exhaustive sweep measures."""
        return sum(1 for k in self.knobs for c in self.colls for s in self.sizes[c] for key in self.space(c, k)
                   if self.runs(k, c, s, key))


@dataclass
class Decision:
    """What a tuner returns: one knob setting (``nccl.conf``) and table rows; a (collective,
    size) without a row keeps NCCL's choice."""

    conf: Point
    rows: dict[tuple[int, int], Key] = field(default_factory=dict)

    def key(self, coll: int, s: int) -> Key:
        return self.rows.get((coll, s), DEFAULT)


class BudgetExhausted(Exception):
    """Raised by :meth:`Evaluator.evaluate` when a request finds no budget left at all."""


class Evaluator:
    """The only way a tuner measures: charges every job its GPU-time against ``budget_gpu_s``
    (and, live, the time against ``wall_s``: no request starts after it), keeps every job's median
    per point, and counts the model evaluations a tuner reports (:meth:`count_model`).

    A job's GPU-time is its wall time times the problem's GPUs: on a simulated or replayed platform
    the job cost model's (:class:`ncclrl.costmodel.jobcost.JobCost`, from the samples the job
    took), live the wall time the measuring callable reports (``measure.last_wall_s``; a job answered
    from a store is charged the model's). A request is one job; it keeps the longest prefix of its
    points that the budget left pays for (the rest answer ``None``, uncharged), chosen before the
    job starts: on the times a replay will answer (``measure.predict``), live on the prior's
    predicted times. When not even the job's launch and
    first point fit, the budget is spent: :attr:`remaining` is 0 from then on. A live job is chosen
    on predicted times (the prior's, scaled by how the points measured so far compare with it), so
    a live run can end past its budget by what the last job's prediction missed; ``gpu_s`` always
    says what was spent.

    :param problem: what is measured
    :param measure: the measuring callable (one call is one job)
    :param budget_gpu_s: GPU-seconds allowed in all, NCCL's defaults included
    :param samples: repetitions per point (their median is what a tuner sees)
    :param tag: the store's tag of the measurements
    :param wall_s: no job starts after this many seconds (``None``: no limit)
    :param cost: the job cost model (default: the fitted one)
    :param max_points: at most this many points in all, whatever GPU-time is left (``None``: no cap;
        simulated training draws its budgets in points)
    """

    def __init__(self, problem: Problem, measure: Measure, budget_gpu_s: float, samples: int = 5,
                 tag: str = "benchmark", wall_s: float | None = None, cost: JobCost | None = None,
                 max_points: int | None = None):
        if not (np.isfinite(budget_gpu_s) and budget_gpu_s >= 0):
            raise ConfigError("budget", f"must be a finite GPU-time >= 0, got {budget_gpu_s}")
        if max_points is not None and max_points < 0:
            raise ConfigError("max_points", f"must be >= 0, got {max_points}")
        self.max_points = max_points
        self._log_ratio: list[float] = []  # log(measured / prior) of the points measured so far
        self.problem, self._measure, self.samples, self.tag = problem, measure, samples, tag
        self.budget = float(budget_gpu_s)
        self.cost = cost or DEFAULT_JOB_COST
        self.nranks = int(problem.topo.nranks)
        self.gpu_s = 0.0  # GPU-seconds charged
        self.points = 0  # points measured
        self.calls = 0  # jobs run
        self.model_evals = 0
        self._spent = False
        self._point_est: float | None = None
        #: called with the GPU-seconds of each job as it is charged (a progress bar's advance)
        self.on_job: Callable[[float], None] | None = None
        #: per point, every job's median (us) and the job's number
        self.jobs: dict[tuple[tuple[int, ...], int, int, Key], list[tuple[int, float]]] = {}
        self.deadline = None if wall_s is None else time.monotonic() + wall_s
        self.wall_s = wall_s
        #: why no further job starts ("" while the run may go on): the budget, the wall clock, a
        #: signal, a failed job
        self.stop_reason = ""
        self.interrupted: int | None = None  # the stop signal that ended the run, if any
        self.failure = ""  # the failed job's one line, if a job failed

    @property
    def remaining(self) -> float:
        """GPU-seconds left: 0 once the budget is spent, the wall-clock limit (if any) is reached, a
        stop signal came or a job failed (:attr:`stop_reason` says which)."""
        if not self.stop_reason:
            if self._spent:
                self.stop_reason = "budget spent" if self.calls else "budget too small: not one job fits in it"
            elif self.deadline is not None and time.monotonic() > self.deadline:
                self.stop_reason = f"wall clock: wall_s={self.wall_s:g} reached"
            elif stop_requested():
                self.interrupted = stop_requested(acknowledge=True)
                self.stop_reason = f"interrupted by {signal.Signals(self.interrupted).name}"
        if self.stop_reason:
            return 0.0
        if self.max_points is not None and self.points >= self.max_points:
            return 0.0
        return max(self.budget - self.gpu_s, 0.0)

    def _call(self, k: Point, pts: list[Point], samples: int, tag: str) -> list[list[float] | None] | None:
        """One job through the measuring callable; ``None`` when a stop signal ended it or the
        cluster failed it (:attr:`stop_reason` then says so; what the job finished is in the store)."""
        try:
            return list(self._measure(k, pts, samples, tag))
        except Interrupted as e:
            self.interrupted, self.stop_reason = e.signum, f"interrupted by {e.name}"
        except JobError as e:
            self.failure = str(e)
            self.stop_reason = f"a job failed: {' '.join(str(e).split())[:300]}"
        return None

    def count_model(self, n: int) -> None:
        """Record ``n`` evaluations of a model (a prediction of one point's time)."""
        self.model_evals += int(n)

    def measured(self, k: Point, coll: int, s: int, key: Key) -> float | None:
        """The geometric mean of the point's job medians (``None``: never measured)."""
        v = self.jobs.get((k.knobs, coll, s, key))
        return float(np.exp(np.mean(np.log([m for _, m in v])))) if v else None

    # -- planning: what the budget left is worth in points ---------------------------------------
    def point_gpu_s(self) -> float:
        """GPU-seconds a point costs on average, its job's launch not included: from the jobs run
        so far, else from the prior's times of NCCL's defaults at every size (a planning figure;
        :meth:`evaluate` charges what jobs really cost)."""
        if self.points:
            return max(self.gpu_s - self.calls * self.cost.launch_s * self.nranks, 0.0) / self.points
        if self._point_est is None:
            t = self.prior_times(self.problem.base, [(c, s, DEFAULT) for c, s in self.problem.cells()])
            self._point_est = float(np.mean(self.cost.point_wall_s(t, self.samples))) * self.nranks
        return self._point_est

    def points_left(self, pending: int = 0, jobs: int = 1) -> int:
        """About how many more points the budget left pays for, in ``jobs`` more jobs, beyond
        ``pending`` points already chosen (a planning figure)."""
        left = self.remaining - jobs * self.cost.launch_s * self.nranks
        n = int(left / max(self.point_gpu_s(), 1e-12))
        if self.max_points is not None:
            n = min(n, self.max_points - self.points)
        return max(n - pending, 0)

    def budget_points(self) -> int:
        """About how many points the whole budget pays for, one job per problem-sized batch."""
        per_job = self.problem.n_cells
        per_point = self.point_gpu_s() + self.cost.launch_s * self.nranks / max(per_job, 1)
        n = int(self.budget / max(per_point, 1e-12))
        return n if self.max_points is None else min(n, self.max_points)

    def prior_times(self, k: Point, items: list[tuple[int, int, Key]]) -> np.ndarray:
        """The prior's predicted time (us) of each (collective, size, configuration) under ``k``."""
        out = np.empty(len(items))
        by: dict[int, list[int]] = {}
        for i, (c, _s, _key) in enumerate(items):
            by.setdefault(c, []).append(i)
        for c, idx in by.items():
            cfg = point_configs(self.problem.topo, k, c, np.array([items[i][1] for i in idx]),
                                [items[i][2] for i in idx])
            out[idx] = self.problem.prior.time_us(cfg, validate=False)
        return out

    # -- measuring ---------------------------------------------------------------------------------
    def evaluate(self, k: Point, items: list[tuple[int, int, Key]], samples: int | None = None) -> list[float | None]:
        """Median time (us) of each (collective, size, configuration) under knob setting ``k``, in one
        job of ``samples`` timed calls per point (default: the evaluator's)."""
        if not items:
            return []
        if self.remaining <= 0:
            raise BudgetExhausted
        res = self._run(k, [Point(N.COLLECTIVES[c], s, *key, *k.knobs) for c, s, key in items],
                        samples or self.samples)
        return [robust_median(r) if r else None for r in res]

    def _fits(self, point_cost_gpu_s: np.ndarray) -> int:
        """How many of the points (in order) one job can measure within the budget left."""
        launch = self.cost.launch_s * self.nranks
        cum = launch + np.cumsum(point_cost_gpu_s)
        return int(np.searchsorted(cum, self.remaining + 1e-9, side="right"))

    def _run(self, k: Point, pts: list[Point], samples: int, tag: str | None = None) -> list[list[float] | None]:
        """Measure what the budget leaves of ``pts`` in one job (the rest answer ``None``), charge
        it, keep medians."""
        if not pts or self.remaining <= 0:
            return [None] * len(pts)
        if self.max_points is not None:
            pts_all, pts = pts, pts[: max(self.max_points - self.points, 0)]
        else:
            pts_all = pts
        live = bool(getattr(self._measure, "live", False))
        items = [(N.COLLECTIVES.index(p.collective), p.nbytes, (p.algo, p.proto, p.channels)) for p in pts]
        prior = self.prior_times(k, items)
        if live:  # choose the prefix before the job starts, on predicted times
            predict = getattr(self._measure, "predict", None)
            if predict is not None:  # a replay knows what its job will answer: the times it is charged for
                t = np.array([robust_median(r) if r else np.nan for r in predict(k, pts, samples, tag or self.tag)])
                est = np.where(np.isnan(t), prior, t)
            else:
                scale = float(np.exp(np.median(self._log_ratio))) if self._log_ratio else 1.0
                est = prior * scale
            n = self._fits(self.cost.point_wall_s(est, samples) * self.nranks)
            if n == 0:
                self._spent = True
                return [None] * len(pts_all)
            take = pts[:n]
            got = self._call(k, take, samples, tag or self.tag)
            if got is None:  # a signal or a failed job: the GPU-time it took is charged
                wall = getattr(self._measure, "last_wall_s", None)
                if wall is not None:
                    self.gpu_s += float(wall) * self.nranks
                    self.calls += 1
                return [None] * len(pts_all)
            res = got
        else:
            got = self._call(k, pts, samples, tag or self.tag)
            if got is None:
                return [None] * len(pts_all)
            res = got
            t = np.array([robust_median(r) if r else np.nan for r in res])
            t = np.where(np.isnan(t), prior, t)  # a failed point costs what the prior says it would have
            n = self._fits(self.cost.point_wall_s(t, samples) * self.nranks)
            if n == 0:
                self._spent = True
                return [None] * len(pts_all)
            take, res = pts[:n], res[:n]
        wall = getattr(self._measure, "last_wall_s", None) if live else None
        before = self.gpu_s
        if wall is not None:
            self.gpu_s += float(wall) * self.nranks
        else:
            t = np.array([robust_median(r) if r else np.nan for r in res])
            # a point that answered nothing (held back, failed) costs what the job was cut on
            t = np.where(np.isnan(t), (est if live else prior)[: len(take)], t)
            self.gpu_s += self.cost.job_gpu_s(t, samples, self.nranks)
        self.points += len(take)
        self.calls += 1
        if self.on_job is not None:
            self.on_job(self.gpu_s - before)
        for p, r, tp in zip(take, res, prior, strict=False):
            if r:
                self._log_ratio.append(float(np.log(max(robust_median(r), 1e-9) / max(tp, 1e-9))))
                key = (p.algo, p.proto, p.channels)
                self.jobs.setdefault((k.knobs, N.COLLECTIVES.index(p.collective), p.nbytes, key), []).append(
                    (self.calls, robust_median(r)))
        return list(res) + [None] * (len(pts_all) - len(take))

    def measure_fn(self) -> Measure:
        """The evaluator as a ``measure`` callable, still charged and cut to the budget."""
        return self._run


def predicted_sweep_gpu_s(problem: Problem, samples: int = 5, cost: JobCost | None = None) -> float:
    """GPU-seconds of one full sweep of ``problem`` at the prior's times (a prediction: what a
    budget of ``Nsweep`` is a multiple of before anything is measured)."""
    oracle = Oracle(problem, problem.prior)
    for k in problem.knobs:
        for c in problem.colls:
            keys, t = problem.space(c, k), oracle.times[(k.knobs, c)]
            for j, key in enumerate(keys):
                for i, s in enumerate(problem.sizes[c]):
                    if not problem.runs(k, c, s, key):
                        t[j, i] = np.inf
    return oracle.sweep_gpu_s(cost or DEFAULT_JOB_COST, samples)


def gpu_s_for_points(problem: Problem, n_points: int, samples: int = 5, points_per_job: int = 8,
                     cost: JobCost | None = None) -> float:
    """The GPU-time ``n_points`` points cost in jobs of ``points_per_job`` points at the prior's times of
    NCCL's defaults (a budget stated in points, as simulated training draws it, turned into GPU-time)."""
    ev = Evaluator(problem, lambda *_a: [], 0.0, samples=samples, cost=cost)
    jobs = math.ceil(max(n_points, 0) / max(points_per_job, 1))
    return n_points * ev.point_gpu_s() + jobs * ev.cost.launch_s * ev.nranks


# -- measured platforms -------------------------------------------------------------------------

def _measure_with(topo: Topology, run: Callable[[Point, Configs, int], np.ndarray]) -> Measure:
    """``measure`` from ``run(knobs, configs, samples)``, called once per collective of a request."""

    def measure(k: Point, pts: list[Point], samples: int, tag: str) -> list[list[float] | None]:
        out: list[list[float] | None] = [None] * len(pts)
        by: dict[int, list[int]] = {}
        for i, p in enumerate(pts):
            by.setdefault(N.COLLECTIVES.index(p.collective), []).append(i)
        for c, idx in by.items():
            cfg = point_configs(topo, k, c, np.array([pts[i].nbytes for i in idx]),
                                [(pts[i].algo, pts[i].proto, pts[i].channels) for i in idx])
            t = run(k, cfg, samples)
            for j, i in enumerate(idx):
                out[i] = [float(x) for x in t[j]]
        return out

    return measure


def platform_measure(platform: Platform | Simulator, rng: np.random.Generator) -> Measure:
    """``measure`` over a simulated platform: each call is one job (:meth:`Platform.job`)."""
    if isinstance(platform, Simulator):
        platform = Platform(platform, None, 0.0)
    return _measure_with(platform.topo, lambda _k, cfg, n: platform.job(cfg, n, rng))


def sim_measure(sim) -> Measure:
    """``measure`` over anything with ``topo`` and ``sample(cfg, n, validate=False)`` (a simulator,
    a synthetic platform in the tests), with no job effect."""
    return _measure_with(sim.topo, lambda _k, cfg, n: sim.sample(cfg, n, validate=False))


def replay_measure(recorded: dict[tuple[tuple[int, ...], int, int, Key], list[list[float]]],
                   rng: np.random.Generator, noise: JobNoise | None = None) -> Measure:
    """``measure`` answering from a recorded sweep with fresh noise: each call is one new job around
    the recorded truth (each point's pooled median over its recorded jobs,
    :func:`ncclrl.costmodel.noise.pooled_median`): one job shift for the call, a residual per
    point and the samples (:meth:`JobNoise.draw_job`), all drawn from ``rng``, so no two jobs, and
    no two seeds, measure alike; a point never recorded fails.

    :param noise: the job noise (default: the pooled fit, :meth:`JobNoise.load`;
        :meth:`JobNoise.zero`: every job measures the truth)
    """
    return truth_measure({x: pooled_median(v) for x, v in recorded.items() if v}, rng, noise)


def truth_measure(truth: dict[tuple[tuple[int, ...], int, int, Key], float], rng: np.random.Generator,
                  noise: JobNoise | None = None) -> Measure:
    """``measure`` drawing each call as one new job around ``truth`` (per point, its expected median,
    us), as :func:`replay_measure` does around a recording's pooled medians."""
    noise = JobNoise.load() if noise is None else noise

    def measure(k: Point, pts: list[Point], samples: int, tag: str) -> list[list[float] | None]:
        keys = [(k.knobs, N.COLLECTIVES.index(p.collective), p.nbytes, (p.algo, p.proto, p.channels)) for p in pts]
        have = [i for i, x in enumerate(keys) if x in truth]
        out: list[list[float] | None] = [None] * len(pts)
        if have:
            t = noise.draw_job([truth[keys[i]] for i in have], [pts[i].nbytes for i in have], samples, rng)
            for j, i in enumerate(have):
                out[i] = [float(v) for v in t[j]]
        return out

    return measure


# -- judging decisions ------------------------------------------------------------------------------

@dataclass
class Verdict:
    """A decision judged on a platform's expected times."""

    speedup: float  # geometric mean over sizes, over NCCL's plain default
    optimum: float  # the best a table + one knob setting can reach in the space
    worst: float  # the worst per-size speedup
    slower: int = 0  # sizes more than 1% slower than NCCL's plain default
    #: the best a table reaches that leaves no size more than 1% slower than NCCL's plain default
    safe_optimum: float = float("nan")

    @property
    def fraction(self) -> float:
        return self.speedup / self.optimum

    @property
    def safe_fraction(self) -> float:
        """The speedup against the safe optimum (above 1: the table gains by making some size slower)."""
        return self.speedup / self.safe_optimum


class Oracle:
    """What the benchmark scores decisions with: the expected time of every point of a problem
    (a simulated platform's noise-free times, or a replayed sweep's pooled medians; a point the
    platform cannot run is infinitely slow), computed once."""

    def __init__(self, problem: Problem, truth: Platform | Simulator | None = None,
                 times: dict[tuple[tuple[int, ...], int], np.ndarray] | None = None) -> None:
        self.problem = problem
        self.times: dict[tuple[tuple[int, ...], int], np.ndarray] = {}  # (knobs, coll) -> [key, size]
        for k in problem.knobs:
            for c in problem.colls:
                if times is not None:
                    self.times[(k.knobs, c)] = times[(k.knobs, c)]
                    continue
                sizes = np.asarray(problem.sizes[c], dtype=np.int64)
                keys = problem.space(c, k)
                cfg = point_configs(problem.topo, k, c, np.repeat(sizes, len(keys)), keys * sizes.size)
                self.times[(k.knobs, c)] = truth.time_us(cfg, validate=False).reshape(sizes.size, len(keys)).T
        self.base = {c: self.times[(problem.base.knobs, c)][0] for c in problem.colls}
        best = [{c: self.times[(k.knobs, c)].min(axis=0) for c in problem.colls} for k in problem.knobs]
        per_conf = [self._geo(b) for b in best]
        self.optimum = float(max(per_conf))
        self.optimum_conf = problem.knobs[int(np.argmax(per_conf))]
        # the best table that leaves no size more than 1% slower than NCCL's plain default: a knob
        # setting whose best point at some size is slower than that cannot be exported safely
        safe = [g for g, b in zip(per_conf, best, strict=True)
                if all((b[c] <= 1.01 * self.base[c]).all() for c in problem.colls)]
        self.safe_optimum = float(max(safe))

    def _geo(self, t: dict[int, np.ndarray]) -> float:
        """Speedup over NCCL's plain defaults: geometric mean over sizes, or of the step's
        communication time when the problem has weights (:meth:`Problem.log_gain`)."""
        cols = self.problem.colls
        return float(np.exp(self.problem.log_gain(np.concatenate([self.base[c] for c in cols]),
                                                  np.concatenate([t[c] for c in cols]))))

    def time_of(self, d: Decision, coll: int) -> np.ndarray:
        keys = self.problem.space(coll, d.conf)
        tab = self.times.get((d.conf.knobs, coll))
        if tab is None:
            raise ConfigError("conf", f"knob setting {d.conf.knobs} is not in the problem's space")
        return np.array([tab[keys.index(d.key(coll, s)), i] for i, s in enumerate(self.problem.sizes[coll])])

    def score(self, d: Decision) -> Verdict:
        t = {c: self.time_of(d, c) for c in self.problem.colls}
        worst = min(float((self.base[c] / t[c]).min()) for c in self.problem.colls)
        slower = sum(int((t[c] > 1.01 * self.base[c]).sum()) for c in self.problem.colls)
        return Verdict(self._geo(t), self.optimum, worst, slower, self.safe_optimum)

    def sweep_gpu_s(self, cost: JobCost, samples: int) -> float:
        """GPU-seconds of one full sweep at the expected times: one job per knob setting, every
        point the platform runs (NCCL's choice included) at every size."""
        total = 0.0
        for k in self.problem.knobs:
            t = np.concatenate([self.times[(k.knobs, c)].ravel() for c in self.problem.colls])
            t = t[np.isfinite(t)]
            if t.size:
                total += cost.job_gpu_s(t, samples, self.problem.topo.nranks)
        return total

    def best_decision(self) -> Decision:
        """The optimum as a decision (what an exhaustive noise-free sweep would export)."""
        k = self.optimum_conf
        rows = {}
        for c in self.problem.colls:
            keys = self.problem.space(c, k)
            j = self.times[(k.knobs, c)].argmin(axis=0)
            rows.update({(c, s): keys[j[i]] for i, s in enumerate(self.problem.sizes[c]) if j[i] != 0})
        return Decision(k, rows)
