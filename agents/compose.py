"""Composing tuning jobs under a GPU-time budget, judged by the user's net value.

A tuning run pays for jobs (one launch, one communicator, one knob setting), and what it earns is
the step time its exported table saves over the steps the table will serve. This module is that
trade in a form small enough to train a policy on and to race every baseline against on the same
problems and noise draws:

- :class:`ComposeProblem`: every point of a tuning problem (knob setting x per-call configuration
  x size) with the prior simulator's log time and the truth's, the job's calls per step at each
  size, the job cost model, the job noise of the platform, the GPU-time budget and the
  communication GPU-time the table will serve (``serve_gpu_s``).
- :class:`ComposeRun`: one run. Each step composes the next job from an :class:`Action` (knob
  setting, size band, candidates per size filled by the model's optimistic ranking; NCCL's choice
  at every size of the job always beside them) or stops. A model (prior + a shared offset per knob
  setting, band and algorithm/protocol + each point's own misfit) guides; the decision reads the
  measurements only and mirrors :func:`ncclrl.agents.search.decide`: a row needs its point
  measured in ``min_jobs`` jobs and a within-job comparison with NCCL's choice that clears
  ``delta`` with probability ``(1 - alpha)^(1/m)`` (Sidak over the ``m`` measured candidates of
  its size); a knob setting needs every size of its table measured in ``min_jobs`` jobs, no size
  measured slower than NCCL's plain default by ``delta``, and a gain over NCCL's table clearing
  ``delta`` with the Sidak-corrected probability across settings.
- The value of a run (:meth:`ComposeRun.net_value`), in points: 100 x (the fraction of the served
  steps' communication time the exported table saves on the expected truth - the tuning GPU-time
  over ``serve_gpu_s``). NCCL's defaults, never tuned, score 0.
- Composers (:data:`BASELINES`): expected improvement, upper confidence bound and knowledge
  gradient per predicted GPU-second, sweep-then-race, random composition, never tuning. Every one
  that can stop stops when no job's expected value (its acquisition x ``serve_gpu_s``) exceeds its
  predicted GPU-time.

What this form leaves out (the full run, :class:`ncclrl.agents.search.Search`, has them): the
noise is the fitted model's shape known to the decision rather than refitted each job; the model is
a hierarchical offset per group rather than the Bayesian linear correction over features.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from functools import cached_property

import numpy as np
from scipy.special import ndtr, ndtri

from ncclrl.agents.problem import Oracle, Problem
from ncclrl.agents.search import Space, same_as_nccl
from ncclrl.costmodel import nccl as N
from ncclrl.costmodel.errors import ConfigError
from ncclrl.costmodel.jobcost import DEFAULT_JOB_COST, JobCost, format_gpu_s
from ncclrl.costmodel.noise import JobNoise
from ncclrl.costmodel.platforms import FAMILIES, Platform, Quirks, draw_platform, family_of
from ncclrl.costmodel.space import Point, knob_grid, size_grid

#: size bands by upper bound (bytes, inclusive): latency-bound, small, mid, >= 64 MiB
BAND_EDGES = (64 << 10, 1 << 20, (64 << 20) - 1)
N_BANDS = len(BAND_EDGES) + 1
BAND_NAMES = ("<=64KiB", "<=1MiB", "<64MiB", ">=64MiB")
#: band choices of an action: every band, or one
BAND_CHOICES = N_BANDS + 1
#: candidates per size an action asks for (0: every candidate measured fewer than max_repeats times)
CANDIDATES = (1, 2, 4, 0)
#: knob settings an action can name (the policy's fixed width)
MAX_KNOBS = 16
N_ACTIONS = 1 + MAX_KNOBS * BAND_CHOICES * len(CANDIDATES)
STOP = 0


def band_of(nbytes: np.ndarray) -> np.ndarray:
    return np.searchsorted(np.asarray(BAND_EDGES), np.asarray(nbytes), side="left")


@dataclass(frozen=True)
class Action:
    """One job: knob setting ``knob``; ``band`` (0..3, or :data:`N_BANDS` for every band); per size
    the ``candidates`` best by the model's optimistic gain (0: all left), NCCL's choice beside them."""

    knob: int
    band: int
    candidates: int

    @property
    def index(self) -> int:
        return 1 + (self.knob * BAND_CHOICES + self.band) * len(CANDIDATES) + CANDIDATES.index(self.candidates)

    @classmethod
    def of(cls, index: int) -> Action:
        if not 1 <= index < N_ACTIONS:
            raise ConfigError("action", f"must be in 1..{N_ACTIONS - 1} (0 is stop), got {index}")
        i = index - 1
        c = i % len(CANDIDATES)
        i //= len(CANDIDATES)
        return cls(i // BAND_CHOICES, i % BAND_CHOICES, CANDIDATES[c])


#: every run's first job: NCCL's defaults at every size with every configuration under them
FIRST = Action(0, N_BANDS, 0)


@dataclass(frozen=True)
class ComposeConfig:
    """The decision's and the model's settings of a composed run.

    :param delta: a row or setting must be this much faster (relative) than NCCL's choice
    :param alpha: probability bound of the decision (Sidak-corrected per size and across settings)
    :param min_jobs: jobs a point must be measured in before it can be exported
    :param max_repeats: most jobs one point is measured in
    :param group_sigma: prior sd (log) of the offset shared by a knob setting, band and algorithm/protocol
    :param local_sigma: prior sd (log) of a point's own misfit
    :param job_sigma: the job shift's sd (log) the decision assumes
    :param max_jobs: most jobs a run composes
    :param samples: samples per point in a job
    """

    delta: float = 0.01
    alpha: float = 0.05
    min_jobs: int = 2
    max_repeats: int = 3
    group_sigma: float = 0.15
    local_sigma: float = 0.1
    job_sigma: float = 0.085
    max_jobs: int = 24
    samples: int = 5

    def __post_init__(self) -> None:
        if not 0 <= self.delta < 1:
            raise ConfigError("compose.delta", f"must be in [0, 1), got {self.delta}")
        if not 0 < self.alpha < 1:
            raise ConfigError("compose.alpha", f"must be in (0, 1), got {self.alpha}")
        for name in ("min_jobs", "max_repeats", "max_jobs", "samples"):
            if getattr(self, name) < 1:
                raise ConfigError(f"compose.{name}", f"must be >= 1, got {getattr(self, name)}")
        for name in ("group_sigma", "local_sigma", "job_sigma"):
            if not getattr(self, name) > 0:
                raise ConfigError(f"compose.{name}", f"must be > 0, got {getattr(self, name)}")


@dataclass
class ComposeProblem:
    """Every point of a tuning problem as flat arrays (see the module's docs).

    :param knob: per point, its knob setting (0: NCCL's defaults)
    :param cell: per point, its size (index into ``nbytes``)
    :param pair: per point, its algorithm/protocol pair's index (NCCL's choice: -1)
    :param prior: per point, the prior's log time (us)
    :param truth: per point, the expected log time (us)
    :param nccl: per (knob, size), NCCL's choice's point (-1: it cannot run there)
    :param candidate: per point, whether it can be a row (not NCCL's choice, nor the same configuration)
    :param nbytes: per size, its bytes
    :param calls: per size, the job's calls per step
    :param nranks: GPUs of a job
    :param budget_gpu_s: GPU-time the run may spend
    :param serve_gpu_s: communication GPU-time of the steps the exported table will serve, at NCCL's defaults
    :param noise: the platform's job noise
    :param cost: the job cost model
    :param name: what the problem is
    :param family: the platform family
    """

    knob: np.ndarray
    cell: np.ndarray
    pair: np.ndarray
    prior: np.ndarray
    truth: np.ndarray
    nccl: np.ndarray
    candidate: np.ndarray
    nbytes: np.ndarray
    calls: np.ndarray
    nranks: int
    budget_gpu_s: float
    serve_gpu_s: float
    noise: JobNoise
    cost: JobCost = DEFAULT_JOB_COST
    name: str = ""
    family: str = ""
    n_knobs: int = field(init=False)
    n_cells: int = field(init=False)
    band: np.ndarray = field(init=False)
    space_index: np.ndarray | None = field(init=False, default=None)

    def __post_init__(self) -> None:
        self.n_knobs = int(self.knob.max()) + 1
        self.n_cells = len(self.nbytes)
        if self.n_knobs > MAX_KNOBS:
            raise ConfigError("knobs", f"at most {MAX_KNOBS} knob settings, got {self.n_knobs}")
        if self.nccl.shape != (self.n_knobs, self.n_cells) or (self.nccl[0] < 0).any():
            raise ConfigError("problem", "NCCL's plain default must be a point at every size")
        if not (self.budget_gpu_s >= 0 and self.serve_gpu_s > 0):
            raise ConfigError("serve_gpu_s", f"budget >= 0 and served GPU-time > 0, got {self.budget_gpu_s}, "
                              f"{self.serve_gpu_s}")
        self.band = band_of(self.nbytes)

    @property
    def size(self) -> int:
        return len(self.knob)

    @cached_property
    def noise_key(self) -> int:
        """This problem's part of its runs' noise seeds (from its name, truth and calls): two problems
        judged with the same draw number get independent job noise; every method on one problem and
        draw gets the same (common random numbers per problem, never across problems)."""
        h = hashlib.blake2b(digest_size=8)
        for part in (self.name.encode(), np.ascontiguousarray(self.truth).tobytes(),
                     np.ascontiguousarray(self.calls).tobytes()):
            h.update(part)
        return int.from_bytes(h.digest(), "little") >> 1

    def sweep_gpu_s(self) -> float:
        """GPU-time of one full sweep on the expected truth: one job per knob setting, every point."""
        return float(sum(self.cost.job_gpu_s(np.exp(self.truth[self.knob == k]), 5, self.nranks)
                         for k in range(self.n_knobs)))

    def base_us(self) -> float:
        """Communication time per step at NCCL's plain defaults (us, expected truth)."""
        return float(np.dot(self.calls, np.exp(self.truth[self.nccl[0]])))

    def optimum(self) -> float:
        """Fraction of the step's communication time the best table saves (expected truth)."""
        best = 0.0
        base = np.exp(self.truth[self.nccl[0]])
        for k in range(self.n_knobs):
            t = np.full(self.n_cells, np.inf)
            at = self.knob == k
            np.minimum.at(t, self.cell[at], np.exp(self.truth[at]))
            best = max(best, 1.0 - float(np.dot(self.calls, t)) / float(np.dot(self.calls, base)))
        return best

    @classmethod
    def from_space(cls, sp: Space, truth: np.ndarray | None, noise: JobNoise, budget_gpu_s: float,
                   serve_gpu_s: float, calls: np.ndarray | None = None, name: str = "", family: str = "",
                   cost: JobCost = DEFAULT_JOB_COST) -> ComposeProblem:
        """Every point of a :class:`ncclrl.agents.search.Space` (``truth``: per point, its expected
        log time; ``None`` live, where only measurements know it: the prior stands in and no net
        value is scored). ``space_index`` maps each point back to ``sp``'s."""
        same = same_as_nccl(sp)
        truth = sp.prior.copy() if truth is None else np.asarray(truth, dtype=float)
        pairs = sorted({(k[0], k[1]) for k in sp.keys if k[0] != "default"})
        pair = np.array([-1 if k[0] == "default" else pairs.index((k[0], k[1])) for k in sp.keys])
        ok = np.isfinite(truth)
        if not ok[sp.default[: sp.n_cells]].all():
            raise ConfigError("problem", "NCCL's plain default must be measured at every size")
        keep = np.flatnonzero(ok)
        new = np.full(sp.size, -1)
        new[keep] = np.arange(len(keep))
        nccl = np.where(sp.default >= 0, new[np.maximum(sp.default, 0)], -1).reshape(sp.n_knobs, sp.n_cells)
        if calls is None:
            calls = sp.weights if sp.weights is not None else np.ones(sp.n_cells)
        out = cls(sp.knob[keep], sp.cell[keep], pair[keep], sp.prior[keep], truth[keep], nccl, (~same)[keep],
                  np.array([s for _, s in sp.cells], dtype=np.int64), np.asarray(calls, dtype=float),
                  int(sp.problem.topo.nranks), float(budget_gpu_s), float(serve_gpu_s), noise, cost, name, family)
        out.space_index = keep
        return out

    @classmethod
    def from_problem(cls, problem: Problem, oracle: Oracle, noise: JobNoise, budget_gpu_s: float,
                     serve_gpu_s: float, calls: np.ndarray | None = None, name: str = "",
                     family: str = "") -> ComposeProblem:
        """A problem (:class:`ncclrl.agents.problem.Problem`) with its truth (``oracle``)."""
        sp = Space(problem)
        truth = np.empty(sp.size)
        for ki, k in enumerate(problem.knobs):
            for c in problem.colls:
                keys, sizes = problem.space(c, k), problem.sizes[c]
                tab = oracle.times[(k.knobs, c)]
                for i in np.flatnonzero(sp.knob == ki):
                    cc, s = sp.cells[sp.cell[i]]
                    if cc == c:
                        truth[i] = math.log(tab[keys.index(sp.keys[i]), sizes.index(s)])
        return cls.from_space(sp, truth, noise, budget_gpu_s, serve_gpu_s, calls, name, family)


def wide_knobs(topo) -> list[Point]:
    """Knob settings of a training problem: the sweep's (:func:`ncclrl.costmodel.space.knob_grid`),
    and where that has only channel counts (no socket network), each also at half and twice NCCL's
    4 MiB buffer (``NCCL_BUFFSIZE``)."""
    ks = knob_grid(topo, "full")
    if len(ks) > 2:
        return ks
    return [replace(k, buffsize_bytes=b) for b in (0, 2 << 20, 8 << 20) for k in ks]


@dataclass(frozen=True)
class Draw:
    """How training and judged problems are drawn.

    :param families: platform families (:data:`ncclrl.costmodel.platforms.FAMILIES`)
    :param misspecified: share of platforms with effects the simulator lacks
    :param strength: range of those effects' strength (1: :class:`ncclrl.costmodel.platforms.Quirks`' own)
    :param collectives: collectives drawn from
    :param horizon: range (log-uniform) of the served communication GPU-time, in full sweeps' GPU-time
    :param budget: range of the budget, in full sweeps' GPU-time
    :param calls_sigma: sd of log calls per step of each size (0: every size called alike)
    :param min_bytes: smallest size
    :param max_bytes: largest size
    """

    families: tuple[str, ...] = tuple(FAMILIES)
    misspecified: float = 0.5
    strength: tuple[float, float] = (1.0, 3.0)
    collectives: tuple[str, ...] = ("allreduce", "allgather", "reducescatter")
    horizon: tuple[float, float] = (3.0, 300.0)
    budget: tuple[float, float] = (0.25, 1.0)
    calls_sigma: float = 2.0
    min_bytes: int = 64
    max_bytes: int = 1 << 30

    def __post_init__(self) -> None:
        for f in self.families:
            if f not in FAMILIES:
                raise ConfigError("families", f"unknown family {f!r}; allowed: {', '.join(FAMILIES)}")
        if not 0 <= self.misspecified <= 1:
            raise ConfigError("misspecified", f"must be in [0, 1], got {self.misspecified}")
        if not 0 < self.horizon[0] <= self.horizon[1] or not 0 < self.budget[0] <= self.budget[1]:
            raise ConfigError("horizon", "horizon and budget ranges must be 0 < low <= high")


def draw_full(rng: np.random.Generator, draw: Draw) -> tuple[Problem, Oracle, Platform, ComposeProblem]:
    """One problem (see :func:`draw_problem`) as the full run sees it too: the
    :class:`ncclrl.agents.problem.Problem` (its calls per step as the objective's weights), its
    oracle, the platform that measures it, and the problem of the fast model."""
    presets = [p for f in draw.families for p in FAMILIES[f]]
    preset = presets[int(rng.integers(len(presets)))]
    mis = bool(rng.random() < draw.misspecified)
    plat = draw_platform(preset, rng, False)
    if mis:
        plat.quirks = Quirks(int(rng.integers(1 << 31)), float(rng.uniform(*draw.strength)))
    coll = N.COLLECTIVES.index(draw.collectives[int(rng.integers(len(draw.collectives)))])
    sizes = size_grid(draw.min_bytes, draw.max_bytes, plat.topo.nranks, coll)
    calls = np.exp(draw.calls_sigma * rng.standard_normal(len(sizes)))
    problem = Problem(plat.topo, [coll], {coll: sizes}, wide_knobs(plat.topo),
                      weights={(coll, s): float(w) for s, w in zip(sizes, calls, strict=True)})
    oracle = Oracle(problem, plat)
    noise = replace(plat.noise if plat.noise is not None else JobNoise.load(), shift_sd=plat.job_sigma)
    out = ComposeProblem.from_problem(problem, oracle, noise, 1.0, 1.0, calls,
                                      f"{preset}/{N.COLLECTIVES[coll]}/{'mis' if mis else 'nom'}", family_of(preset))
    sweep = out.sweep_gpu_s()
    out.budget_gpu_s = sweep * float(rng.uniform(*draw.budget))
    out.serve_gpu_s = sweep * float(np.exp(rng.uniform(*np.log(draw.horizon))))
    return problem, oracle, plat, out


def draw_problem(rng: np.random.Generator, draw: Draw) -> ComposeProblem:
    """One problem: a preset of ``draw.families``, its platform drawn (misspecified with probability
    ``draw.misspecified``, quirks of a strength drawn in ``draw.strength``) with the fitted job
    noise around it, a collective, calls per step per size, a budget and a served GPU-time."""
    return draw_full(rng, draw)[3]


def draw_problems(n: int, seed: int, draw: Draw | None = None) -> list[ComposeProblem]:
    """``n`` problems from seed stream ``seed`` (training and judged sets use disjoint streams)."""
    draw = draw or Draw()
    return [draw_problem(np.random.default_rng([seed, i]), draw) for i in range(n)]


# -- one run -----------------------------------------------------------------------------------


class ComposeRun:
    """One composed tuning run on ``problem`` with job noise drawn from ``rng`` (module docs).

    :param problem: the problem
    :param rng: the run's noise draws
    :param cfg: decision and model settings
    """

    def __init__(self, problem: ComposeProblem, rng: np.random.Generator, cfg: ComposeConfig | None = None) -> None:
        self.p, self.rng, self.cfg = problem, rng, cfg or ComposeConfig()
        p = problem
        self.n = np.zeros(p.size, dtype=np.int64)  # jobs each point was measured in
        self.ysum = np.zeros(p.size)  # sum of its job medians (log)
        self.dsum = np.zeros(p.size)  # sum of (its median - NCCL's choice's in the same job)
        self.jobs = np.zeros(p.n_knobs, dtype=np.int64)  # jobs per knob setting
        self.spent_gpu_s = 0.0
        self.history: list[dict] = []
        self.done = False
        self.point_sd = np.maximum(p.noise.resid_sd(p.nbytes[p.cell]), 1e-3)  # the decision's per-point sd
        self.thr = math.log1p(self.cfg.delta)
        # groups of the model's shared offset: (knob, band, pair)
        n_pairs = int(p.pair.max()) + 2
        self.group = (p.knob * N_BANDS + p.band[p.cell]) * n_pairs + (p.pair + 1)
        self.n_groups = p.n_knobs * N_BANDS * n_pairs
        # the prior's predicted gain of each point over NCCL's plain default at its size
        self.prior_gain = p.prior[p.nccl[0][p.cell]] - p.prior
        self.share = p.calls * np.exp(p.prior[p.nccl[0]])
        self.share = self.share / self.share.sum()  # each size's share of the step (prior, NCCL's defaults)
        self.table_knob, self.rows = 0, np.full(p.n_cells, -1)
        self.refresh()

    # -- measuring -----------------------------------------------------------------------------
    def points_of(self, a: Action) -> np.ndarray:
        """The job an action composes: per size of its band(s) under its knob setting, NCCL's
        choice and the ``candidates`` best by optimistic gain among those measured fewer than
        ``max_repeats`` times (empty when the action names no such size)."""
        p = self.p
        if a.knob >= p.n_knobs:
            return np.empty(0, np.int64)
        cells = np.flatnonzero((p.band == a.band) | (a.band == N_BANDS))
        cells = cells[p.nccl[a.knob, cells] >= 0]
        if not len(cells):
            return np.empty(0, np.int64)
        rank = self.rank
        sel = (p.knob == a.knob) & np.isin(p.cell, cells) & p.candidate & (self.n < self.cfg.max_repeats)
        if a.candidates:
            sel &= rank < a.candidates
        return np.concatenate([p.nccl[a.knob, cells], np.flatnonzero(sel)])

    def measure(self, idx: np.ndarray) -> bool:
        """Run one job of points ``idx`` (NCCL's choice at each of its sizes among them); ``False``
        when the budget left does not pay for it (nothing is run then)."""
        p = self.p
        t = np.exp(p.truth[idx])
        gpu_s = p.cost.job_gpu_s(t, self.cfg.samples, p.nranks)
        if self.spent_gpu_s + gpu_s > p.budget_gpu_s or len(self.history) >= self.cfg.max_jobs:
            return False
        y = p.truth[idx] + p.noise.draw_shift(self.rng) + p.noise.draw_resid(p.nbytes[p.cell[idx]], self.rng)
        self.record(idx, y, gpu_s)
        return True

    def record(self, idx: np.ndarray, y: np.ndarray, gpu_s: float) -> None:
        """One job's medians ``y`` (log us) of points ``idx`` (one knob setting), charged ``gpu_s``.
        Each point is compared with NCCL's choice at its size in the same job, or, where the job
        lacks it, with that choice's mean so far (its own comparison left out when never measured)."""
        p = self.p
        idx, y = np.asarray(idx, dtype=np.int64), np.asarray(y, dtype=float)
        self.spent_gpu_s += gpu_s
        k = int(p.knob[idx[0]])
        ref = {int(p.cell[i]): float(v) for i, v in zip(idx, y, strict=True) if i == p.nccl[k, p.cell[i]]}
        d = p.nccl[k, p.cell[idx]]
        prev = np.where(self.n[d] > 0, self.ysum[d] / np.maximum(self.n[d], 1), y)
        self.n[idx] += 1
        self.ysum[idx] += y
        self.dsum[idx] += y - np.array([ref.get(int(c), pv) for c, pv in zip(p.cell[idx], prev, strict=True)])
        self.jobs[k] += 1
        self.history.append({"knob": k, "points": len(idx), "gpu_s": gpu_s})
        self.refresh()

    def step(self, a: Action | None) -> bool:
        """Take action ``a`` (``None``: stop). Returns whether the run goes on."""
        if a is None or self.done:
            self.done = True
            return False
        idx = self.points_of(a)
        if not len(idx) or not self.measure(idx):
            self.done = True
            return False
        return True

    # -- the model -----------------------------------------------------------------------------
    def refresh(self) -> None:
        """Refit the model and decide again."""
        self.fit()
        self.decide()
        # the optimistic ranking of each (knob, size)'s candidates that actions fill jobs with
        p = self.p
        score = np.where(p.candidate & (self.n < self.cfg.max_repeats), self.mean + self.std, -np.inf)
        key = p.knob * p.n_cells + p.cell
        order = np.lexsort((-score, key))
        rank = np.empty(p.size, dtype=np.int64)
        starts = np.searchsorted(key[order], key[order], side="left")
        rank[order] = np.arange(p.size) - starts
        self.rank = rank

    def observed_gain(self) -> tuple[np.ndarray, np.ndarray]:
        """Per measured point, its measured log speedup over NCCL's plain default at its size and its
        variance: within its job against NCCL's choice under its setting, plus (another setting)
        that choice against NCCL's plain default across jobs."""
        p, cfg = self.p, self.cfg
        n = np.maximum(self.n, 1)
        sd2 = self.point_sd ** 2
        pair = -self.dsum / n  # vs NCCL's choice under the point's setting, in the same jobs
        pair_var = 2 * sd2 / n
        d = p.nccl[p.knob, p.cell]
        d0 = p.nccl[0][p.cell]
        nd, n0 = np.maximum(self.n[d], 1), np.maximum(self.n[d0], 1)
        across = self.ysum[d0] / n0 - self.ysum[d] / nd
        jk, j0 = np.maximum(self.jobs[p.knob], 1), max(self.jobs[0], 1)
        across_var = sd2 * (1 / nd + 1 / n0) + cfg.job_sigma ** 2 * (1 / jk + 1 / j0)
        other = p.knob > 0
        gain = pair + np.where(other, across, 0.0)
        var = pair_var + np.where(other, across_var, 0.0)
        is_nccl = d == np.arange(p.size)  # NCCL's choice under a setting: across jobs only
        gain = np.where(is_nccl, np.where(other, across, 0.0), gain)
        var = np.where(is_nccl, np.where(other, across_var, 1e-12), var)
        ok = (self.n > 0) & ((d >= 0) & (self.n[np.maximum(d, 0)] > 0)) & ((~other) | (self.n[d0] > 0))
        return np.where(ok, gain, np.nan), np.where(ok, var, np.nan)

    def fit(self) -> None:
        """Posterior mean and sd of each point's log speedup over NCCL's plain default at its size:
        prior gain + the group's offset + the point's own misfit, each Gaussian, with the measured
        points' observed gains (:meth:`observed_gain`)."""
        cfg = self.cfg
        g, v = self.observed_gain()
        ok = np.isfinite(g)
        r = np.where(ok, g - self.prior_gain, 0.0)
        w = np.where(ok, 1.0 / (cfg.local_sigma ** 2 + np.where(ok, v, 1.0)), 0.0)
        prec = 1.0 / cfg.group_sigma ** 2 + np.bincount(self.group, w, self.n_groups)
        off = np.bincount(self.group, w * r, self.n_groups) / prec
        b, bv = off[self.group], 1.0 / prec[self.group]
        m0, v0 = self.prior_gain + b, cfg.local_sigma ** 2 + bv
        vv = np.where(ok, v, np.inf)
        post_v = 1.0 / (1.0 / v0 + np.where(ok, 1.0 / vv, 0.0))
        self.mean = post_v * (m0 / v0 + np.where(ok, g / np.where(ok, vv, 1.0), 0.0))
        self.std = np.sqrt(post_v)
        d0 = self.p.nccl[0]
        self.mean[d0], self.std[d0] = 0.0, 1e-9  # NCCL's plain default is the reference itself
        self._obs = (g, v)

    # -- the decision --------------------------------------------------------------------------
    def decide(self) -> None:
        """The table the measurements support (module docs): ``table_knob``, ``rows`` (per size, the
        row's point, -1 for NCCL's choice) and ``final`` (per size, the point the table runs)."""
        p, cfg = self.p, self.cfg
        g, v = self._obs
        sd2 = self.point_sd ** 2
        nc = p.n_cells
        best = (0, np.full(nc, -1), 0.0)
        share = self.share
        tables = {}
        for k in range(p.n_knobs):
            at = (p.knob == k) & p.candidate & (self.n > 0)
            m = np.bincount(p.cell[at], minlength=nc)  # measured candidates per size (Sidak)
            conf = at & (self.n >= cfg.min_jobs)
            z = -self.dsum / np.maximum(self.n, 1)  # within-job gain over NCCL's choice under k
            s = np.sqrt(2 * sd2 / np.maximum(self.n, 1))
            prob = ndtr((z - self.thr) / s)
            need = (1 - cfg.alpha) ** (1 / np.maximum(m[p.cell], 1))
            ok = conf & (prob > need) & (p.nccl[k, p.cell] >= 0)
            rows = np.full(nc, -1)
            bestz = np.full(nc, -np.inf)
            for i in np.flatnonzero(ok):
                c = p.cell[i]
                if z[i] > bestz[c]:
                    bestz[c], rows[c] = z[i], i
            tables[k] = rows
            if k == 0:
                best = (0, rows, 0.0)
                continue
            final = np.where(rows >= 0, rows, p.nccl[k])
            if (final < 0).any() or (self.n[final] < cfg.min_jobs).any() or (self.n[p.nccl[0]] < 1).any():
                continue
            cg, cv = g[final], v[final]
            if not np.isfinite(cg).all() or (cg < -self.thr).any():
                continue
            base_rows = tables[0]
            g0 = np.where(base_rows >= 0, g[np.maximum(base_rows, 0)], 0.0)
            v0 = np.where(base_rows >= 0, v[np.maximum(base_rows, 0)], 0.0)
            diff = float(np.dot(share, cg - g0))
            var = float(np.dot(share ** 2, cv + v0))
            var += cfg.job_sigma ** 2 * (1 / self.jobs[k] + 1 / max(self.jobs[0], 1))
            pk = float(ndtr((diff - self.thr) / math.sqrt(var)))
            if pk > (1 - cfg.alpha) ** (1 / max(p.n_knobs - 1, 1)) and diff > best[2]:
                best = (k, rows, diff)
        self.table_knob, self.rows = best[0], best[1]
        self.final = np.where(self.rows >= 0, self.rows, p.nccl[self.table_knob])

    # -- value -----------------------------------------------------------------------------------
    def saved_fraction(self) -> float:
        """Fraction of the step's communication time the current table saves (expected truth)."""
        p = self.p
        base = np.exp(p.truth[p.nccl[0]])
        return 1.0 - float(np.dot(p.calls, np.exp(p.truth[self.final]))) / float(np.dot(p.calls, base))

    def slower(self) -> int:
        """Sizes the current table runs more than ``delta`` slower than NCCL's plain default (truth)."""
        p = self.p
        return int((p.truth[self.final] - p.truth[p.nccl[0]] > self.thr).sum())

    def net_value(self) -> float:
        """The run's value so far, in points (module docs)."""
        return 100.0 * (self.saved_fraction() - self.spent_gpu_s / self.p.serve_gpu_s)

    def table_gain(self) -> float:
        """The current table's gain as the model sees it: share-weighted posterior log speedup."""
        return float(np.dot(self.share, self.mean[self.final]))

    # -- what composers read -------------------------------------------------------------------
    def job_sums(self, w: np.ndarray) -> np.ndarray:
        """Per action (flat, stop first), the sum of ``w`` (one value per point) over the points of
        the job it composes (:meth:`points_of`); 0 for knob settings the problem lacks."""
        p = self.p
        nk = p.n_knobs
        elig = p.candidate & (self.n < self.cfg.max_repeats)
        kb = p.knob * N_BANDS + p.band[p.cell]
        ncw = np.where(p.nccl >= 0, w[np.maximum(p.nccl, 0)], 0.0)  # NCCL's choice at each size
        base = np.stack([ncw[:, p.band == b].sum(axis=1) for b in range(N_BANDS)], axis=1)
        out = np.zeros((MAX_KNOBS, BAND_CHOICES, len(CANDIDATES)))
        for j, c in enumerate(CANDIDATES):
            m = elig & (self.rank < c) if c else elig
            per = np.bincount(kb[m], w[m], nk * N_BANDS).reshape(nk, N_BANDS) + base
            out[:nk, :N_BANDS, j] = per
            out[:nk, N_BANDS, j] = per.sum(axis=1)
        return np.concatenate([[0.0], out.ravel()])

    def job_costs(self) -> tuple[np.ndarray, np.ndarray]:
        """Per action, the predicted GPU-time of its job (inf: no job) and its number of points
        (cached until the next job)."""
        key = len(self.history)
        if getattr(self, "_costs_key", None) != key:
            p = self.p
            t = np.exp(p.prior[p.nccl[0]][p.cell] - self.mean)  # the model's times
            count = self.job_sums(np.ones(p.size))
            wall = self.job_sums(p.cost.point_wall_s(t, self.cfg.samples))
            cost = np.where(count > 0, (p.cost.launch_s + wall) * p.nranks, np.inf)
            cost[STOP] = 0.0
            self._costs, self._count, self._costs_key = cost, count, key
        return self._costs, self._count

    def valid(self) -> np.ndarray:
        """Per action, whether it composes a job the budget left is predicted to pay for (stop always)."""
        ok = np.zeros(N_ACTIONS, dtype=bool)
        ok[STOP] = True
        if self.done or len(self.history) >= self.cfg.max_jobs:
            return ok
        cost, count = self.job_costs()
        ok[1:] = (count[1:] > 0) & (cost[1:] <= self.p.budget_gpu_s - self.spent_gpu_s)
        if not self.history:  # the first job: NCCL's defaults with every configuration under them
            first = FIRST.index
            ok[1:] = False
            ok[first] = cost[first] <= self.p.budget_gpu_s
        return ok

    def improvement(self) -> np.ndarray:
        """Per point, its posterior mean gain over what the current table runs at its size."""
        return self.mean - self.mean[self.final][self.p.cell]


# -- composers ---------------------------------------------------------------------------------


def _ei(mu: np.ndarray, sd: np.ndarray) -> np.ndarray:
    sd = np.maximum(sd, 1e-9)
    z = mu / sd
    return sd * np.exp(-0.5 * z * z) / math.sqrt(2 * math.pi) + mu * ndtr(z)


class Composer:
    """Chooses each next job of a :class:`ComposeRun` (``None``: stop)."""

    name = "composer"

    def reset(self, run: ComposeRun, rng: np.random.Generator) -> None:
        self.rng = rng

    def act(self, run: ComposeRun) -> Action | None:
        raise NotImplementedError


class NeverTune(Composer):
    """NCCL's defaults: measures nothing."""

    name = "nccl"

    def act(self, run: ComposeRun) -> Action | None:
        return None


class RandomCompose(Composer):
    """A valid job drawn uniformly, until the budget or the job limit ends the run."""

    name = "random"

    def act(self, run: ComposeRun) -> Action | None:
        if not run.history:
            return FIRST
        ok = np.flatnonzero(run.valid()[1:]) + 1
        return Action.of(int(self.rng.choice(ok))) if len(ok) else None


class PerSecond(Composer):
    """The job with the most acquisition per predicted GPU-second; stops when no job's acquisition
    x ``serve_gpu_s`` exceeds its predicted GPU-time.

    :param acquisition: ``ei`` (expected improvement), ``ucb`` (gain + ``beta`` sd, floored at 0)
        or ``kg`` (knowledge gradient of one more paired measurement)
    :param beta: ucb's weight of the posterior sd
    :param stop_factor: a job must be expected to return this many times its GPU-time
    :param shape: only jobs of this (band, candidates per size) (``None``: any)
    """

    def __init__(self, acquisition: str = "ei", beta: float = 2.0, stop_factor: float = 1.0,
                 shape: tuple[int, int] | None = None) -> None:
        if acquisition not in ("ei", "ucb", "kg"):
            raise ConfigError("acquisition", f"unknown {acquisition!r}; allowed: ei, ucb, kg")
        if not (beta >= 0 and stop_factor > 0):
            raise ConfigError("stop_factor", f"beta >= 0 and stop_factor > 0, got {beta}, {stop_factor}")
        self.acquisition, self.beta, self.stop_factor = acquisition, float(beta), float(stop_factor)
        self.shape = shape
        self.name = f"{acquisition}/s" if shape is None else f"{acquisition}/s@{shape[0]},{shape[1]}"

    def point_value(self, run: ComposeRun) -> np.ndarray:
        """Per point, its acquisition as a fraction of the step's communication time."""
        p = run.p
        imp = run.improvement()
        if self.acquisition == "ei":
            v = _ei(imp, run.std)
        elif self.acquisition == "ucb":
            v = np.maximum(imp + self.beta * run.std, 0.0)
        else:  # one more paired job median: how far it moves the posterior
            s2 = run.std ** 2
            sig = s2 / np.sqrt(s2 + 2 * run.point_sd ** 2)
            best = np.full(p.n_cells, -np.inf)
            np.maximum.at(best, p.cell, np.where(p.candidate, run.mean, -np.inf))
            best = np.maximum(best, run.mean[run.final])
            v = _ei(run.mean - best[p.cell], sig)
        v = np.where(p.candidate | (np.arange(p.size) == p.nccl[p.knob, p.cell]), v, 0.0)
        return v * run.share[p.cell]

    def rates(self, run: ComposeRun, stop: bool = True) -> np.ndarray:
        """Per action, its acquisition per predicted GPU-second (-inf: not valid; stop: the rate a
        job must beat, ``stop_factor`` served GPU-seconds per GPU-second spent; -inf without ``stop``)."""
        cost, _ = run.job_costs()
        r = np.where(run.valid(), run.job_sums(self.point_value(run)) / np.where(cost > 0, cost, 1.0), -np.inf)
        r[STOP] = self.stop_factor / run.p.serve_gpu_s if stop else -np.inf
        if self.shape is not None and run.history:
            keep = np.zeros(N_ACTIONS, dtype=bool)
            keep[STOP] = True
            keep[[Action(k, *self.shape).index for k in range(run.p.n_knobs)]] = True
            r = np.where(keep, r, -np.inf)
        return r

    def act(self, run: ComposeRun) -> Action | None:
        return self.choose(run, stop=True)

    def choose(self, run: ComposeRun, stop: bool = True) -> Action | None:
        """The job worth most per GPU-second; with ``stop``, ``None`` when none is worth its GPU-time
        (without, ``None`` only when no job is valid)."""
        if not run.history:  # every tuning run starts with NCCL's defaults and their configurations
            return FIRST
        r = self.rates(run, stop)
        i = int(np.argmax(r))
        return None if i == STOP or not np.isfinite(r[i]) else Action.of(i)


class SweepRace(PerSecond):
    """Sweep-then-race (finetune's ``jobs``): after the first job, while a knob setting is unmeasured
    and its sweep is worth its GPU-time, sweep the one whose whole job is worth most per GPU-second;
    then race: the job over every size worth most per GPU-second among the candidate counts. NCCL's
    plain defaults are re-measured whenever the setting raced has more jobs. Stops as
    :class:`PerSecond` does."""

    def __init__(self, stop_factor: float = 1.0) -> None:
        super().__init__("ei", stop_factor=stop_factor)
        self.name = "sweep-race"

    def choose(self, run: ComposeRun, stop: bool = True) -> Action | None:
        if not run.history:  # every tuning run starts with NCCL's defaults and their configurations
            return FIRST
        r = self.rates(run, stop)
        whole = np.zeros(N_ACTIONS, dtype=bool)  # every job measures NCCL's choice at every size
        whole[[Action(k, N_BANDS, c).index for k in range(run.p.n_knobs) for c in CANDIDATES]] = True
        whole[STOP] = True
        r = np.where(whole, r, -np.inf)
        unswept = [k for k in range(run.p.n_knobs) if run.jobs[k] == 0]
        sweeps = [Action(k, N_BANDS, 0).index for k in unswept]
        if sweeps and r[sweeps].max() > r[STOP]:  # whole sweeps of unmeasured settings while one is worth it
            keep = np.zeros(N_ACTIONS, dtype=bool)
            keep[sweeps] = True
            r = np.where(keep, r, -np.inf)
            unswept = [k for k in unswept if r[Action(k, N_BANDS, 0).index] > -np.inf]
        else:
            unswept = []
        i = int(np.argmax(r))
        if i == STOP or not np.isfinite(r[i]):
            return None
        best = Action.of(i)
        if best.knob and not unswept and run.jobs[0] < run.jobs[best.knob]:
            alt = Action(0, best.band, best.candidates)
            if run.valid()[alt.index]:
                return alt
        return best


class JobsRule(PerSecond):
    """finetune's ``jobs`` (:meth:`ncclrl.agents.search.Search.compose_job`) as a composer: after
    the first job, per knob setting either its whole sweep (never measured) or a race over every size
    (1, 2 or 4 leading candidates per size), all competing by expected improvement per GPU-second;
    NCCL's plain defaults re-measured whenever the setting raced has more jobs. Unlike
    :class:`SweepRace`, a race of a measured setting may come before the sweep of another. Stops as
    :class:`PerSecond` does."""

    def __init__(self, stop_factor: float = 1.0) -> None:
        super().__init__("ei", stop_factor=stop_factor)
        self.name = "jobs"

    def choose(self, run: ComposeRun, stop: bool = True) -> Action | None:
        if not run.history:
            return FIRST
        r = self.rates(run, stop)
        keep = np.zeros(N_ACTIONS, dtype=bool)
        keep[STOP] = True
        for k in range(run.p.n_knobs):
            if run.jobs[k] == 0:
                keep[Action(k, N_BANDS, 0).index] = True
            else:
                keep[[Action(k, N_BANDS, c).index for c in (1, 2, 4)]] = True
        r = np.where(keep, r, -np.inf)
        i = int(np.argmax(r))
        if i == STOP or not np.isfinite(r[i]):
            return None
        best = Action.of(i)
        if best.knob and best.candidates and run.jobs[0] < run.jobs[best.knob]:
            alt = Action(0, best.band, best.candidates)
            if run.valid()[alt.index]:
                return alt
        return best


BASELINES: dict[str, Callable[[], Composer]] = {
    "nccl": NeverTune,
    "random": RandomCompose,
    "ei/s": lambda: PerSecond("ei"),
    "ucb/s": lambda: PerSecond("ucb"),
    "kg/s": lambda: PerSecond("kg"),
    "sweep-race": SweepRace,
    "jobs": JobsRule,
}


@dataclass
class Outcome:
    """What one run ended with."""

    method: str
    problem: str
    family: str
    seed: int
    net_value: float  # points
    saved_pct: float
    spent_pct: float  # tuning GPU-time, in percent of the served GPU-time
    optimum_pct: float
    jobs: int
    slower: int
    knob: int
    rows: int


def play(problem: ComposeProblem, composer: Composer, seed: int, cfg: ComposeConfig | None = None,
         noise_seed: int | None = None) -> Outcome:
    """One run of ``composer`` on ``problem``; the noise of run ``seed`` is the same for every
    composer on this problem (common random numbers) and independent of every other problem's
    (:attr:`ComposeProblem.noise_key`)."""
    run = ComposeRun(problem, np.random.default_rng([seed if noise_seed is None else noise_seed, 7,
                                                     problem.noise_key]), cfg)
    composer.reset(run, np.random.default_rng([seed, 11]))
    while run.step(composer.act(run)):
        pass
    return Outcome(composer.name, problem.name, problem.family, seed, run.net_value(),
                   100 * run.saved_fraction(), 100 * run.spent_gpu_s / problem.serve_gpu_s,
                   100 * problem.optimum(), len(run.history), run.slower(), run.table_knob,
                   int((run.rows >= 0).sum()))


def ci95(x: np.ndarray, n_boot: int = 4000, seed: int = 0) -> tuple[float, float, float]:
    """Mean and its 95% interval (t interval; bootstrap agrees on these sample sizes)."""
    x = np.asarray(x, dtype=float)
    m = float(x.mean())
    if len(x) < 2:
        return m, m, m
    h = float(-ndtri(0.025)) * float(x.std(ddof=1)) / math.sqrt(len(x))
    return m, m - h, m + h


# -- a composer driving the full run ----------------------------------------------------------


class ComposerController:
    """A :class:`Composer` choosing each job of a full tuning run (:class:`ncclrl.agents.search.Search`,
    its ``run_jobs``): a :class:`ComposeRun` over the run's space follows every job the run
    measured (its medians, its GPU-time), the composer picks the next job on it or stops, and the
    run measures that job; what is exported is the full run's decision
    (:func:`ncclrl.agents.search.decide`), not the follower's.

    :param composer: what picks the jobs
    :param serve_steps: steps the exported table will serve; with the step's communication time at
        the prior's times of NCCL's defaults (the profile's calls x time, or one call per size) and
        the job's GPUs, the GPU-time a job's cost is weighed against
    :param serve_sweeps: instead, that GPU-time in full sweeps' predicted GPU-time
    :param serve_gpu_s: instead, that GPU-time itself
    :param noise: the job noise the follower's decision assumes (default: the fitted pooled model)
    """

    composes_jobs = True

    def __init__(self, composer: Composer, serve_steps: float = 0.0, serve_sweeps: float = 0.0,
                 serve_gpu_s: float = 0.0, noise: JobNoise | None = None) -> None:
        given = [x for x in (serve_steps, serve_sweeps, serve_gpu_s) if x]
        if len(given) != 1 or not given[0] > 0:
            raise ConfigError("serve_steps", f"give one of serve_steps, serve_sweeps, serve_gpu_s > 0; got "
                              f"{serve_steps}, {serve_sweeps}, {serve_gpu_s}")
        self.composer, self.serve_steps, self.serve_sweeps = composer, float(serve_steps), float(serve_sweeps)
        self.serve_gpu_s = float(serve_gpu_s)
        self.noise = noise or JobNoise.load()
        self.name = composer.name
        self.run: ComposeRun | None = None
        self.synced = 0

    def follower(self, search) -> ComposeRun:
        if self.run is None:
            sp = search.space
            calls = sp.weights if sp.weights is not None else np.ones(sp.n_cells)
            step_us = float(np.dot(calls, np.exp(sp.prior[sp.default[: sp.n_cells]])))
            serve = self.serve_steps * step_us * 1e-6 * sp.problem.topo.nranks
            p = ComposeProblem.from_space(sp, None, self.noise, search.ev.budget, max(serve, 1e-9), calls,
                                          cost=search.ev.cost)
            if self.serve_sweeps:
                p.serve_gpu_s = self.serve_sweeps * p.sweep_gpu_s()  # the prior's times stand in for the truth
            elif self.serve_gpu_s:
                p.serve_gpu_s = self.serve_gpu_s
            dc = search.cfg.decision
            cfg = ComposeConfig(delta=dc.delta, alpha=dc.alpha, min_jobs=dc.min_jobs,
                                max_repeats=search.cfg.max_repeats, samples=search.ev.samples)
            self.run = ComposeRun(p, np.random.default_rng(0), cfg)
            self.composer.reset(self.run, np.random.default_rng(0))
            self.at = np.full(sp.size, -1)
            self.at[p.space_index] = np.arange(len(p.space_index))
        return self.run

    def sync(self, search) -> None:
        """Feed the follower every job the run measured since the last call."""
        from ncclrl.agents.search import measurements

        run = self.follower(search)
        obs = measurements(search.space, search.ev)
        for j in sorted(set(obs.job[obs.job > self.synced].tolist())):
            at = obs.job == j
            idx = self.at[obs.point[at]]
            ok = idx >= 0
            if ok.any():
                run.record(idx[ok], obs.y[at][ok], 0.0)
        self.synced = int(search.ev.calls)
        run.spent_gpu_s = float(search.ev.gpu_s)

    def why_stopped(self) -> str:
        """Why the composer stopped: its job limit, a budget that pays for no first job (NCCL's defaults
        with every configuration) or no further one, or its own choice."""
        run = self.run
        if len(run.history) >= run.cfg.max_jobs:
            return f"the composer's limit of {run.cfg.max_jobs} jobs"
        if not run.valid()[1:].any():
            if not run.history:
                return (f"the budget ({format_gpu_s(run.p.budget_gpu_s)}) pays for no first job: NCCL's defaults "
                        f"with every configuration cost about {format_gpu_s(run.job_costs()[0][FIRST.index])}")
            return "budget spent"  # what is left pays for no further job (as every strategy says it)
        return "the composer stopped: no job worth its GPU-time against the steps served"

    def next_job(self, search) -> list[int]:
        """The run's next job as space indices (NCCL's choice at each of its sizes first); empty: stop
        (:attr:`stop_reason` says why)."""
        self.sync(search)
        a = self.composer.act(self.run)
        if a is None:
            self.stop_reason = self.why_stopped()
            return []
        return [int(self.run.p.space_index[i]) for i in self.run.points_of(a)]
