"""The search strategy of a tuning run: what to measure next, when to stop, and what the
measurements support.

A tuning run (:class:`Search`) works over every point of a problem (:class:`Space`: knob setting x
per-call configuration x collective x size). Three parts, each replaceable:

1. **The model** (:class:`Model`): the prior simulator's log time plus a Bayesian linear
   correction learned from the measurements (features: algorithm/protocol, channel level, knob
   setting, and their trends over size), plus each point's own misfit. Every point gets a posterior
   mean and standard deviation of its log time; a measured point is pulled towards its
   measurements. With no measurement this is the prior.
2. **The controller** picks the next point to measure from a shortlist of candidates, each
   described by :data:`FEATURES` (its predicted gain over the best known point of its cell and
   over the current table, its uncertainty and expected improvement, its knob setting's
   potential and coverage, whether NCCL's choice next to it is measured, the budget left), or
   stops. :class:`PolicyController` is the learned strategy (a PPO-trained network scoring each
   candidate alike, shipped as weights + JSON); :class:`RankController` ranks by the model's
   predicted gain (the learner removed); :class:`EIController` by expected improvement (Bayesian
   optimization with the same prior and model).
3. **The decision** (:func:`decide`), one rule for rows and knob settings, on measured points
   only: a row replaces NCCL's choice, and a knob setting NCCL's defaults, only where the points
   are measured and, from the measurements alone (:func:`estimate`: job medians, each job's
   shift a random effect, within-job pairs compared within their job), the probability that it
   is at least ``delta`` faster exceeds ``1 - alpha`` (:class:`DecisionConfig`). The noise is the
   run's own (:func:`fit_noise`: REML over its repeated measurements, with a stated prior).

Points are picked one at a time and measured in rounds of ``round_points`` (one job per knob
setting in the round), after which the model is refit and the decision redone. The first round is
fixed: NCCL's plain defaults at every size, then the zero-shot table (:func:`zero_shot`, the exact
argmin of the prior) next to NCCL's choice under its knob setting.
"""

from __future__ import annotations

import json
import math
import time
import zipfile
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from ncclrl.agents import mlp
from ncclrl.agents.problem import BudgetExhausted, Decision, Evaluator, Problem
from ncclrl.costmodel.errors import ConfigError
from ncclrl.costmodel.jobcost import format_gpu_s
from ncclrl.costmodel.space import DEFAULT, Key, point_configs

FEATURES = ("gain", "std", "ei", "gain_vs_table", "in_table_knob", "knob_potential", "knob_coverage",
            "is_default", "times_measured", "default_measured", "is_cell_row", "row_confidence",
            "budget_left", "log_budget", "size_pos", "is_stop")
N_FEATURES = len(FEATURES)
GAIN_SCALE = 10.0  # log-time gains are given to the controller in tenths (0.1 in log -> 1.0)


def _phi(z: np.ndarray) -> np.ndarray:
    return np.exp(-0.5 * z * z) / math.sqrt(2 * math.pi)


def _cdf(z: np.ndarray | float) -> np.ndarray:
    from scipy.special import ndtr

    return ndtr(z)


# -- the space ---------------------------------------------------------------------------------


class Space:
    """Every point of ``problem`` the platform can run, as flat arrays, with the prior's log time."""

    def __init__(self, problem: Problem) -> None:
        self.problem = problem
        cells = problem.cells()
        self.n_cells = len(cells)
        at = {x: i for i, x in enumerate(cells)}
        knob, cell, keys, prior = [], [], [], []
        for ki, k in enumerate(problem.knobs):
            for c in problem.colls:
                sizes = problem.sizes[c]
                space = problem.space(c, k)
                cfg = point_configs(problem.topo, k, c, np.repeat(sizes, len(space)), space * len(sizes))
                t = problem.prior.time_us(cfg, validate=False).reshape(len(sizes), len(space))
                for i, s in enumerate(sizes):
                    for j, key in enumerate(space):
                        if problem.runs(k, c, s, key):
                            knob.append(ki)
                            cell.append(at[(c, s)])
                            keys.append(key)
                            prior.append(float(np.log(t[i, j])))
        self.cells = cells
        self.knob = np.asarray(knob, dtype=np.int64)
        self.cell = np.asarray(cell, dtype=np.int64)
        self.keys: list[Key] = keys
        self.prior = np.asarray(prior)
        self.is_default = np.array([k == DEFAULT for k in keys])
        self.n_knobs = len(problem.knobs)
        self.size = len(keys)
        # per (knob, cell): its candidates and NCCL's choice among them (-1: NCCL's choice cannot run)
        self.group = self.knob * self.n_cells + self.cell
        self.members: list[np.ndarray] = [np.empty(0, np.int64)] * (self.n_knobs * self.n_cells)
        order = np.argsort(self.group, kind="stable")
        bounds = np.searchsorted(self.group[order], np.arange(self.n_knobs * self.n_cells + 1))
        for g in range(self.n_knobs * self.n_cells):
            self.members[g] = order[bounds[g]:bounds[g + 1]]
        self.default = np.full(self.n_knobs * self.n_cells, -1, dtype=np.int64)
        self.default[self.group[self.is_default]] = np.flatnonzero(self.is_default)
        if (self.default[: self.n_cells] < 0).any():
            raise ConfigError("problem", "NCCL's plain default must be measurable at every size")
        self.default_of = self.default[self.group]  # NCCL's choice next to each point
        sizes = np.array([s for _, s in cells], dtype=float)
        lsz = np.log2(sizes)
        self.size_pos = np.zeros(self.n_cells)
        for c in problem.colls:  # position of each size in its collective's grid, 0..1
            idx = [i for i, (cc, _) in enumerate(cells) if cc == c]
            r = lsz[idx]
            self.size_pos[idx] = (r - r.min()) / max(r.max() - r.min(), 1.0)
        self.X = self._features(lsz)
        self.weights = problem.cell_weights()  # calls per step per cell (None: sizes count alike)

    def log_gain(self, plain: np.ndarray, final: np.ndarray) -> float:
        """The objective's gain (log) of the log times ``final`` over ``plain``, per cell
        (:meth:`ncclrl.agents.problem.Problem.log_gain`)."""
        if self.weights is None:
            return float(np.mean(plain - final))
        return self.problem.log_gain(np.exp(plain), np.exp(final))

    def sensitivity(self, final: np.ndarray) -> np.ndarray:
        """d gain / d log time of each cell's point at log times ``final``: ``1/n`` for the
        geometric mean; a cell's share of the step's communication time when weighted."""
        if self.weights is None:
            return np.full(len(final), 1.0 / len(final))
        x = self.weights * np.exp(final)
        return x / x.sum()

    def _features(self, lsz: np.ndarray) -> np.ndarray:
        """The model's regressors per point: intercept, algorithm/protocol, channel level, knob
        setting and collective, each also times the size's position (trends over size)."""
        pairs = sorted({f"{k[0]}/{k[1]}" for k in self.keys})
        pi = np.array([pairs.index(f"{k[0]}/{k[1]}") for k in self.keys])
        lvl = np.array([0 if k[2] == 0 else (1 if k[2] == 1 else 2) for k in self.keys])
        colls = sorted(set(c for c, _ in self.cells))
        ci = np.array([colls.index(self.cells[c][0]) for c in self.cell])
        z = (self.size_pos[self.cell] - 0.5) * 2
        blocks = [np.ones((self.size, 1)), z[:, None], (z * z)[:, None]]
        for idx, n in ((pi, len(pairs)), (lvl, 3), (self.knob, self.n_knobs), (ci, len(colls))):
            one = np.zeros((self.size, n))
            one[np.arange(self.size), idx] = 1.0
            blocks += [one, one * z[:, None]]
        return np.hstack(blocks)

    def decision(self, knob: int, rows: dict[int, int]) -> Decision:
        """A :class:`Decision` from a knob index and, per cell index, the chosen point."""
        return Decision(self.problem.knobs[knob],
                        {self.cells[c]: self.keys[i] for c, i in rows.items() if self.keys[i] != DEFAULT})


# -- the model ---------------------------------------------------------------------------------


@dataclass
class ModelConfig:
    """The model's prior, and the prior of the noise the run fits (:func:`fit_noise`).

    :param weight_sigma: prior sd of each correction weight (log time)
    :param local_sigma: prior sd of a point's own misfit, beyond what the features explain
    :param noise_sigma: prior guess of the per-point sd (log) of one job's median about the point's
        mean once its job's shift is taken out (the fit on 654 recorded A/A jobs,
        ``conf/noise/job_noise.yaml``: 0.13-0.23 by size, heavy-tailed)
    :param job_sigma: prior guess of the sd (log) of the shift all points of one job share (the same
        fit: 0.085)
    :param prior_dof: weight of each guess, in degrees of freedom: the fitted variance is pulled
        towards the guess as if it came from ``prior_dof`` measurements of it; with no repeated
        measurement the guesses are the noise
    :param noise_floor: the fitted sds never go below this (log)
    """

    weight_sigma: float = 0.15
    local_sigma: float = 0.1
    noise_sigma: float = 0.15
    job_sigma: float = 0.085
    prior_dof: float = 4.0
    noise_floor: float = 0.005

    def check(self) -> None:
        for name, v in asdict(self).items():
            if not v > 0:
                raise ConfigError(f"model.{name}", f"must be > 0, got {v}")
        for name in ("noise_sigma", "job_sigma"):
            if getattr(self, name) < self.noise_floor:
                raise ConfigError(f"model.{name}", f"must be >= model.noise_floor ({self.noise_floor}), "
                                  f"got {getattr(self, name)}")


@dataclass(frozen=True)
class Noise:
    """The run's noise: one job's median of a point is its mean + the job's shift (sd ``job_sd``,
    shared by all the job's points) + its own residual (sd ``point_sd``), all in log time.

    :param point_sd: per-point residual sd
    :param job_sd: sd of a job's shift
    :param dof: degrees of freedom the fit had (repeated measurements beyond each point's first;
        0: the prior's guesses alone)
    :param jobs: jobs that measured a point some other job measured too
    """

    point_sd: float
    job_sd: float
    dof: int = 0
    jobs: int = 0

    @property
    def one_job_sd(self) -> float:
        """sd of one job's median of one point about its mean, the job's shift included."""
        return math.hypot(self.point_sd, self.job_sd)

    def as_dict(self) -> dict[str, float | int]:
        return {"point_sd": round(self.point_sd, 4), "job_sd": round(self.job_sd, 4), "dof": self.dof,
                "jobs": self.jobs, "fitted": self.dof > 0}


def prior_noise(cfg: ModelConfig) -> Noise:
    return Noise(cfg.noise_sigma, cfg.job_sigma)


@dataclass
class Measurements:
    """Every job median of a run: the point (space index), the job's number, the log time."""

    point: np.ndarray
    job: np.ndarray
    y: np.ndarray

    @classmethod
    def empty(cls) -> Measurements:
        return cls(np.empty(0, np.int64), np.empty(0, np.int64), np.empty(0))

    def __len__(self) -> int:
        return len(self.y)


def _point_index(space: Space) -> dict[tuple, int]:
    idx = getattr(space, "_point_index", None)
    if idx is None:
        knobs = space.problem.knobs
        idx = {(knobs[space.knob[i]].knobs, *space.cells[space.cell[i]], space.keys[i]): i for i in range(space.size)}
        space._point_index = idx
    return idx


def measurements(space: Space, ev: Evaluator) -> Measurements:
    """The run's measurements from the evaluator's record of every job median per point
    (:attr:`ncclrl.agents.problem.Evaluator.jobs`), points outside ``space`` left out."""
    at = _point_index(space)
    pt, job, y = [], [], []
    for x, runs in ev.jobs.items():
        i = at.get(x)
        if i is None:
            continue
        for j, m in runs:
            if m > 0 and math.isfinite(m):
                pt.append(i)
                job.append(j)
                y.append(math.log(m))
    if not pt:
        return Measurements.empty()
    return Measurements(np.asarray(pt, np.int64), np.asarray(job, np.int64), np.asarray(y, float))


def same_as_nccl(space: Space) -> np.ndarray:
    """Per point, whether it runs exactly NCCL's own choice next to it: NCCL's choice itself, or an
    explicit configuration with the algorithm and protocol the replica says NCCL picks at that size
    (under the knob setting's channel count) and NCCL's own channel count (0) or the one it would
    take (:func:`ncclrl.costmodel.replica.default_decisions`). Such a row changes nothing, so it is
    never one; its measurements stay its own (the replica could be wrong about a machine)."""
    got = getattr(space, "_same_as_nccl", None)
    if got is not None:
        return got
    from ncclrl.costmodel import nccl as N
    from ncclrl.costmodel.replica import default_decisions

    pr = space.problem
    out = space.is_default.copy()
    comm_of = {ki: k.comm_channels or pr.topo.nccl.channels for ki, k in enumerate(pr.knobs)}
    cache: dict[tuple[int, int], tuple[str, str, int]] = {}
    for i, key in enumerate(space.keys):
        if out[i]:
            continue
        ki = int(space.knob[i])
        coll, s = space.cells[space.cell[i]]
        kc = (pr.knobs[ki].comm_channels, coll, s)
        if kc not in cache:
            d = default_decisions(pr.topo, coll, [s], comm_channels=pr.knobs[ki].comm_channels)
            cache[kc] = (N.ALGOS[int(d.algo[0])], N.PROTOS[int(d.proto[0])], int(d.max_channels[0]))
        algo, proto, maxc = cache[kc]
        same_ap = key[0] == "default" or (key[0], key[1]) == (algo, proto)
        out[i] = same_ap and (key[2] == 0 or min(key[2], comm_of[ki]) == maxc)
    space._same_as_nccl = out
    return out


def _contrasts(point: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Orthonormal contrasts (Helmert) within each point's measurements: rows of K with K 1_i = 0
    for every point, as (row, measurement, coefficient) triplets."""
    rows, cols, vals = [], [], []
    r = 0
    order = np.argsort(point, kind="stable")
    bounds = np.flatnonzero(np.diff(point[order])) + 1
    for g in np.split(order, bounds):
        for k in range(1, len(g)):
            c = 1.0 / math.sqrt(k * (k + 1))
            rows += [r] * (k + 1)
            cols += list(g[: k + 1])
            vals += [c] * k + [-k * c]
            r += 1
    return np.asarray(rows, np.int64), np.asarray(cols, np.int64), np.asarray(vals)


def fit_noise(obs: Measurements, cfg: ModelConfig) -> Noise:
    """The run's noise (:class:`Noise`) by restricted maximum likelihood (REML) of the mixed
    model ``y = mu_point + b_job + e`` over every point measured in more than one job or twice,
    each point's mean a free parameter: a point's repeats across jobs inform
    ``point_sd^2 + job_sd^2``, points measured together in the same jobs separate the two. Each sd
    has a prior (``cfg.noise_sigma``, ``cfg.job_sigma``) worth ``cfg.prior_dof`` degrees of
    freedom, and a floor (``cfg.noise_floor``)."""
    from scipy.optimize import minimize

    prior = prior_noise(cfg)
    if not len(obs):
        return prior
    r, c, v = _contrasts(obs.point)
    m = int(r.max()) + 1 if len(r) else 0
    if m == 0:
        return prior
    jobs, jj = np.unique(obs.job, return_inverse=True)
    K = np.zeros((m, len(obs)))
    K[r, c] = v
    u = K @ obs.y
    Z = np.zeros((len(obs), len(jobs)))
    Z[np.arange(len(obs)), jj] = 1.0
    W = K @ Z
    shared = int((np.abs(W) > 1e-12).any(axis=0).sum())
    U, S, _ = np.linalg.svd(W, full_matrices=False)
    cc = U.T @ u
    rest = max(float(u @ u - cc @ cc), 0.0)
    s2sq = S * S
    nu = cfg.prior_dof
    s0, t0 = cfg.noise_sigma ** 2, cfg.job_sigma ** 2

    def loss(x: np.ndarray) -> float:
        s2, t2 = math.exp(2 * x[0]), math.exp(2 * x[1])
        d = s2 + t2 * s2sq
        val = (m - len(S)) * math.log(s2) + float(np.log(d).sum()) + rest / s2 + float((cc * cc / d).sum())
        val += nu * (math.log(s2) + s0 / s2) + nu * (math.log(t2) + t0 / t2)
        return 0.5 * val

    lo = math.log(cfg.noise_floor)
    best = min((minimize(loss, np.array(x0), method="L-BFGS-B", bounds=[(lo, math.log(3.0))] * 2)
                for x0 in ((math.log(cfg.noise_sigma), math.log(cfg.job_sigma)), (lo + 1, lo + 1))),
               key=lambda res: res.fun)
    return Noise(float(math.exp(best.x[0])), float(math.exp(best.x[1])), m, shared)


@dataclass
class Estimate:
    """Each measured point's mean log time from the run's measurements alone (generalized least
    squares under the fitted :class:`Noise`, each job's shift a random effect), with the
    covariance of the estimates. ``at[i]``: row of space point ``i`` (-1: never measured)."""

    at: np.ndarray
    mu: np.ndarray
    cov: np.ndarray
    n: np.ndarray  # measurements per row
    jobs: list[set[int]]  # the jobs that measured each row

    def measured(self, i: int) -> bool:
        return i >= 0 and self.at[i] >= 0

    def diff(self, a: int, b: int) -> tuple[float, float]:
        """``mu[a] - mu[b]`` and its sd (both measured)."""
        x, y = self.at[a], self.at[b]
        if x == y:
            return 0.0, 0.0
        var = self.cov[x, x] + self.cov[y, y] - 2 * self.cov[x, y]
        return float(self.mu[x] - self.mu[y]), math.sqrt(max(float(var), 0.0))

    def contrast(self, wts: dict[int, float]) -> tuple[float, float]:
        """sum of ``w * mu[i]`` over space points ``i`` (all measured) and its sd."""
        v = np.zeros(len(self.mu))
        for i, w in wts.items():
            v[self.at[i]] += w
        return float(v @ self.mu), math.sqrt(max(float(v @ self.cov @ v), 0.0))


def estimate(space: Space, obs: Measurements, noise: Noise) -> Estimate:
    """The measured points' means and covariance (:class:`Estimate`). Two points measured in the
    same job are compared within it (their job's shift cancels); across jobs, the shifts are
    estimated from the points the jobs share, and what is left of them counts as ``job_sd``."""
    at = np.full(space.size, -1, dtype=np.int64)
    if not len(obs):
        return Estimate(at, np.empty(0), np.empty((0, 0)), np.empty(0, np.int64), [])
    pts, pi = np.unique(obs.point, return_inverse=True)
    jobs, jj = np.unique(obs.job, return_inverse=True)
    p, q = len(pts), len(jobs)
    A = np.zeros((p, q))
    np.add.at(A, (pi, jj), 1.0)
    s2, t2 = noise.point_sd ** 2, max(noise.job_sd, 1e-6) ** 2
    n_i, n_j = A.sum(axis=1), A.sum(axis=0)
    M = s2 / t2 + n_j
    P = (np.diag(n_i) - (A / M) @ A.T) / s2
    C = np.linalg.inv(P)
    C = (C + C.T) / 2
    xy = np.bincount(pi, obs.y, minlength=p)
    zy = np.bincount(jj, obs.y, minlength=q)
    mu = C @ (xy - A @ (zy / M)) / s2
    at[pts] = np.arange(p)
    sets = [set(jobs[A[r] > 0].tolist()) for r in range(p)]
    return Estimate(at, mu, C, n_i.astype(np.int64), sets)


class Model:
    """Posterior log times of every point of a :class:`Space` (see the module's docs)."""

    def __init__(self, space: Space, cfg: ModelConfig) -> None:
        cfg.check()
        self.space, self.cfg = space, cfg
        self.noise = prior_noise(cfg)
        self.mean = space.prior.copy()
        self.std = np.full(space.size, self._prior_sd())
        self.evals = 0  # predictions made (one per point per fit)

    def _prior_sd(self) -> np.ndarray:
        c = self.cfg
        return np.sqrt(c.weight_sigma ** 2 * (self.space.X ** 2).sum(axis=1) + c.local_sigma ** 2)

    def fit(self, n: np.ndarray, ybar: np.ndarray, noise: Noise | None = None) -> None:
        """Refit to ``n`` measurements per point with mean log time ``ybar`` (where ``n`` > 0),
        one job's median having the sd of ``noise`` (:meth:`Noise.one_job_sd`; default: the
        last fitted, at first the prior's guesses)."""
        if noise is not None:
            self.noise = noise
        c, X = self.cfg, self.space.X
        sd = self.noise.one_job_sd
        m = n > 0
        self.evals += self.space.size
        if not m.any():
            self.mean, self.std = self.space.prior.copy(), self._prior_sd()
            return
        res = ybar[m] - self.space.prior[m]
        v = c.local_sigma ** 2 + sd ** 2 / n[m]
        Xm = X[m]
        A = np.eye(X.shape[1]) / c.weight_sigma ** 2 + (Xm / v[:, None]).T @ Xm
        L = np.linalg.cholesky(A)
        w = np.linalg.solve(L.T, np.linalg.solve(L, Xm.T @ (res / v)))
        Li = np.linalg.solve(L, X.T)  # var of x.w: |L^-1 x|^2
        f = X @ w
        pv = (Li * Li).sum(axis=0) + c.local_sigma ** 2
        post_v = pv.copy()
        post_m = f.copy()
        prec = n[m] / sd ** 2
        post_v[m] = 1.0 / (1.0 / pv[m] + prec)
        post_m[m] = post_v[m] * (f[m] / pv[m] + prec * res)
        self.mean = self.space.prior + post_m
        self.std = np.sqrt(post_v)


# -- the decision ------------------------------------------------------------------------------

Z95 = 1.959963984540054  # two-sided 95% intervals


@dataclass
class DecisionConfig:
    """The one rule that turns measurements into a table: measured points only.

    :param delta: smallest gain worth a change (fraction: 0.02 = 2% faster)
    :param alpha: a row (or knob setting) is kept when, from the run's measurements alone, the
        probability that it is at least ``delta`` faster than NCCL's choice (defaults) exceeds
        ``1 - alpha``; a knob setting also needs, at every size, its measured speedup over NCCL's
        plain default at least ``1 / (1 + delta)``
    :param min_jobs: a point becomes a row, or part of a knob setting's table, only once measured in
        this many jobs: a job's median is a heavy-tailed draw (recorded A/A jobs: t with 2.5 degrees
        of freedom), and the fastest of many candidates measured once is fast by luck as often as
        not; the second job confirms or refutes it
    """

    delta: float = 0.01
    alpha: float = 0.05
    min_jobs: int = 2

    def check(self) -> None:
        if self.min_jobs < 1:
            raise ConfigError("decision.min_jobs", f"must be >= 1, got {self.min_jobs}")
        if not 0 <= self.delta < 1:
            raise ConfigError("decision.delta", f"must be in [0, 1), got {self.delta}")
        if not 0 < self.alpha < 0.5:
            raise ConfigError("decision.alpha", f"must be in (0, 0.5), got {self.alpha}")


@dataclass
class Table:
    """A decision with its evidence: per cell the chosen point (index into the space) and the
    probability that it is ``delta`` faster than NCCL's choice; the knob setting's; per cell the
    measured log speedup of the point the table runs over NCCL's plain default and its sd (0 where
    it runs NCCL's plain default itself, ``nan`` where that is not measured)."""

    knob: int
    rows: dict[int, int]
    prob: dict[int, float]
    knob_prob: float
    gain: float  # posterior mean of the objective's gain over NCCL's plain defaults (log; Space.log_gain)
    final: np.ndarray  # per cell, the point the table runs (its row or NCCL's choice)
    cell_gain: np.ndarray = field(default_factory=lambda: np.empty(0))  # measured log speedup per cell
    cell_sd: np.ndarray = field(default_factory=lambda: np.empty(0))
    noise: Noise | None = None  # the noise the decision was taken under

    def speedup(self, c: int) -> tuple[float, float, float]:
        """Cell ``c``'s measured speedup over NCCL's plain default, with its 95% interval."""
        g, s = float(self.cell_gain[c]), float(self.cell_sd[c])
        return math.exp(g), math.exp(g - Z95 * s), math.exp(g + Z95 * s)


def decide(space: Space, model: Model, obs: Measurements, cfg: DecisionConfig) -> Table:
    """The table the measurements support (the module's docs, point 3), from measured points only
    (:func:`estimate` under the model's fitted noise). Per knob setting and size, a row is a
    measured point other than NCCL's own choice (:func:`same_as_nccl`), at least ``delta`` faster
    than NCCL's choice next to it, itself measured, with probability above ``1 - alpha``; of those
    the fastest measured, else NCCL's choice stays. NCCL's choice never measured itself but
    measured as the same configuration made explicit is measured (that configuration's jobs
    stand for it); under another knob setting, where it was not measured at all, a row must be
    that much faster than NCCL's plain default. A knob setting other than NCCL's defaults needs
    the point its table runs at every size measured (in ``min_jobs`` jobs), its table's gain over
    the table under NCCL's defaults ``delta`` with that probability corrected (Sidak) for every
    other knob setting it was chosen among, and at no size a measured speedup over NCCL's plain
    default below ``1 / (1 + delta)`` (a setting that wins on the whole but measures slower at
    some size is refused); of those that pass, the largest measured gain wins. A row needs its
    point measured in ``min_jobs`` jobs, and its probability is corrected (Sidak) for every
    candidate measured at its size, confirmed or not: the confirmed ones were chosen among them."""
    est = estimate(space, obs, model.noise)
    thr = math.log1p(cfg.delta)
    nc = space.n_cells
    plain = space.default[:nc]
    same = same_as_nccl(space)
    tables = []
    for k in range(space.n_knobs):
        final = np.empty(nc, dtype=np.int64)
        seen = np.empty(nc, dtype=np.int64)  # per cell, the point whose measurements stand for final's
        rows, prob = {}, {}
        for c in range(nc):
            g = k * nc + c
            d = space.default[g]
            mem = space.members[g]
            meas = mem[(est.at[mem] >= 0) & ~same[mem]]
            n_cand = max(len(meas), 1)  # the confirmed candidates were picked among every measured one
            meas = meas[[len(est.jobs[est.at[i]]) >= cfg.min_jobs for i in meas]] if len(meas) else meas
            if d >= 0 and not est.measured(d):  # NCCL's choice, measured as the same configuration made explicit
                twins = mem[same[mem] & (est.at[mem] >= 0)]
                if len(twins):
                    d_seen = int(twins[np.argmax(est.n[est.at[twins]])])
                else:
                    d_seen = d
            else:
                d_seen = d
            if d < 0:  # NCCL's choice cannot run here: the table needs a row, judged against the plain default
                if not len(meas):
                    final = None
                    break
                r = meas[np.argmin(est.mu[est.at[meas]])]
                pr = float("nan")
                if est.measured(plain[c]):
                    g0, s0 = est.diff(plain[c], r)
                    pr = float(_cdf((g0 - thr) / max(s0, 1e-12)))
                rows[c], prob[c], final[c], seen[c] = int(r), pr, r, r
                continue
            final[c], seen[c] = d, d_seen
            # against NCCL's choice next to it; under another knob setting, where that was never
            # measured, against NCCL's plain default (the setting's table must then run the row)
            ref = d_seen if est.measured(d_seen) else plain[c]
            if not est.measured(ref) or not len(meas):
                continue
            diffs = [est.diff(ref, i) for i in meas]
            gain = np.array([x for x, _ in diffs])
            sd = np.array([max(s, 1e-12) for _, s in diffs])
            p = _cdf((gain - thr) / sd)
            ok = p > (1 - cfg.alpha) ** (1 / n_cand)  # the best of every candidate measured is kept: Sidak
            if ok.any():  # the fastest measured among the rows the evidence supports
                j = np.flatnonzero(ok)[np.argmin(est.mu[est.at[meas[ok]]])]
                rows[c], prob[c], final[c], seen[c] = int(meas[j]), float(p[j]), meas[j], meas[j]
        if final is None:
            continue
        cg, cs = np.full(nc, np.nan), np.full(nc, np.nan)
        for c in range(nc):
            if final[c] == plain[c]:
                cg[c], cs[c] = 0.0, 0.0
            elif est.measured(seen[c]) and est.measured(plain[c]):
                cg[c], cs[c] = est.diff(plain[c], seen[c])
        tables.append((k, rows, prob, final, cg, cs, seen))
    gain_of = {t[0]: space.log_gain(model.mean[plain], model.mean[t[3]]) for t in tables}
    t0 = tables[0]
    out = Table(0, t0[1], t0[2], 1.0, gain_of[0], t0[3], t0[4], t0[5], model.noise)
    seen0 = t0[6]
    best = 0.0
    a = space.sensitivity(model.mean[plain])
    for k, rows, prob, final, cg, cs, seen in tables[1:]:
        if not (est.at[seen] >= 0).all() or not (est.at[seen0] >= 0).all():
            continue  # a size this setting would run unmeasured, or a size of NCCL's table unmeasured
        if any(len(est.jobs[est.at[i]]) < cfg.min_jobs for i in seen):
            continue  # a size this setting would run on one job's word
        if (cg < -thr).any():
            continue  # a size measured slower than NCCL's plain default by more than delta
        wts: dict[int, float] = {}
        for c in range(nc):  # the setting's table against NCCL's table: shares of the objective
            wts[int(seen0[c])] = wts.get(int(seen0[c]), 0.0) + a[c]
            wts[int(seen[c])] = wts.get(int(seen[c]), 0.0) - a[c]
        g, sd = est.contrast(wts)
        p = float(_cdf((g - thr) / max(sd, 1e-12)))
        if p > (1 - cfg.alpha) ** (1 / max(space.n_knobs - 1, 1)) and g > best:  # the best of the settings: Sidak
            best = g
            out = Table(k, rows, prob, p, gain_of[k], final, cg, cs, model.noise)
    return out


def zero_shot(space: Space) -> Table:
    """The exact argmin of the prior: the knob setting whose best predicted point per size gains
    most over NCCL's plain defaults in the problem's objective (geometric mean over sizes, or the
    step's communication time with weights), and per size its best predicted point (a point that
    runs NCCL's own choice is no row)."""
    nc = space.n_cells
    plain = space.default[:nc]
    same = same_as_nccl(space)
    best = None
    for k in range(space.n_knobs):
        final = np.array([space.members[k * nc + c][np.argmin(space.prior[space.members[k * nc + c]])]
                          if len(space.members[k * nc + c]) else -1 for c in range(nc)])
        if (final < 0).any():
            continue
        gain = space.log_gain(space.prior[plain], space.prior[final])
        if best is None or gain > best.gain + 1e-12:
            rows = {c: int(i) for c, i in enumerate(final) if not same[i]}
            best = Table(k, rows, dict.fromkeys(rows, float("nan")), float("nan"), gain, final)
    return best


def zero_shot_within(space: Space, margin: float) -> Table:
    """:func:`zero_shot` under the margin rule (the simulator's measured error,
    :mod:`ncclrl.agents.export`): a cell leaves NCCL's choice only where the prior's best point is
    predicted faster than it by more than ``margin`` (a fraction: the point's time below
    ``(1 - margin)`` times NCCL's), and a knob setting other than NCCL's defaults is taken only where
    its table is predicted to gain more than ``margin`` over the table under the defaults.

    :param space: the problem's points with the prior's log times
    :param margin: fraction in [0, 1); 0 is :func:`zero_shot`'s choice
    """
    if not 0 <= margin < 1:
        raise ConfigError("margin", f"must be in [0, 1), got {margin}")
    thr = -math.log1p(-margin)
    nc = space.n_cells
    plain = space.default[:nc]
    best, base_gain = None, 0.0
    for k in range(space.n_knobs):
        final = np.full(nc, -1, dtype=np.int64)
        for c in range(nc):
            mem = space.members[k * nc + c]
            if not len(mem):
                continue
            j = mem[np.argmin(space.prior[mem])]
            d = space.default[k * nc + c]
            final[c] = d if d >= 0 and space.prior[j] > space.prior[d] - thr else j
        if (final < 0).any():
            continue
        gain = space.log_gain(space.prior[plain], space.prior[final])
        if k == 0:
            base_gain = gain
        elif gain <= base_gain + thr:
            continue
        if best is None or gain > best.gain + 1e-12:
            rows = {c: int(i) for c, i in enumerate(final) if not space.is_default[i]}
            best = Table(k, rows, dict.fromkeys(rows, float("nan")), float("nan"), gain, final)
    return best


# -- controllers -------------------------------------------------------------------------------


class Controller(Protocol):
    """Scores a shortlist: ``feats`` (rows, :data:`FEATURES`), the last row being *stop*;
    returns one score per row (the highest valid one is taken)."""

    name: str

    def scores(self, feats: np.ndarray) -> np.ndarray: ...


class RankController:
    """The model's ranking: the candidate with the largest predicted gain over its cell's best
    known point; never stops before the budget does (the learner removed)."""

    name = "rank"

    def scores(self, feats: np.ndarray) -> np.ndarray:
        s = feats[:, FEATURES.index("gain")].copy()
        s[-1] = -np.inf
        return s


class EIController:
    """Expected improvement over the cell's best known point (Bayesian optimization with the
    prior as mean and the same model); never stops before the budget does."""

    name = "ei"

    def scores(self, feats: np.ndarray) -> np.ndarray:
        s = feats[:, FEATURES.index("ei")].copy()
        s[-1] = -np.inf
        return s


class PerGpuSecondController:
    """Cost-aware Bayesian optimization with the same prior and model: expected improvement
    (``ei``) or an upper confidence bound on the gain over the current table (``ucb``: predicted
    gain + ``beta`` sd, floored at 0) per GPU-second the measurement is predicted to cost (the
    point's calls at its predicted time, plus a job's launch when no pending point shares its knob
    setting); never stops before the budget does.

    :param acquisition: ei or ucb
    :param beta: ucb's weight of the posterior sd
    """

    def __init__(self, acquisition: str = "ei", beta: float = 2.0) -> None:
        if acquisition not in ("ei", "ucb"):
            raise ConfigError("acquisition", f"unknown {acquisition!r}; allowed: ei, ucb")
        if not beta >= 0:
            raise ConfigError("beta", f"must be >= 0, got {beta}")
        self.acquisition, self.beta = acquisition, float(beta)
        self.name = f"{acquisition}/s"

    def scores_for(self, acq: dict[str, np.ndarray]) -> np.ndarray:
        """One score per shortlist entry from :attr:`Search.acquisition`, the stop row last (-inf)."""
        if self.acquisition == "ei":
            value = acq["ei"]
        else:
            value = np.maximum(acq["gain"] + self.beta * acq["std"], 0.0)
        return np.append(value / np.maximum(acq["gpu_s"], 1e-9), -np.inf)

    def scores(self, feats: np.ndarray) -> np.ndarray:  # the Controller protocol; Search calls scores_for
        raise NotImplementedError("PerGpuSecondController scores through scores_for (Search.acquisition)")


class JobController:
    """Composes whole jobs instead of picking points: each job runs the knob setting whose job is
    worth most per GPU-second (its expected improvement over the current table, its launch
    included: :meth:`Search.compose_job`). A setting not yet measured is swept whole in one job
    (measurements are nearly free next to a job's launch on most clusters, so this is a sweep in
    the order the model ranks settings); once every setting is swept, a job re-measures, under
    one setting, the candidates whose expected improvement per GPU-second beats the job's, with
    NCCL's choice at each of their sizes in the same job (the comparison the decision reads within
    one job). Never stops before the budget does.
    """

    name = "jobs"
    composes_jobs = True

    def scores(self, feats: np.ndarray) -> np.ndarray:  # the Controller protocol; Search composes jobs instead
        raise NotImplementedError("JobController composes jobs through Search.compose_job")


SHIPPED = "shipped"
# checkpoints that are pickles (stable-baselines3 .zip, torch .pt/.pth, plain pickles): never loaded
PICKLED_SUFFIXES = (".zip", ".pt", ".pth", ".pkl", ".pickle", ".ckpt")


def strategy_path(name: str) -> Path:
    """A strategy's JSON: ``shipped`` is the one installed with ncclrl, anything else a path."""
    if name == SHIPPED:
        from importlib.resources import files

        return Path(str(files("ncclrl.agents") / "pretrained" / "strategy.json"))
    return Path(name)


class PolicyController:
    """The learned strategy: one network scores every candidate alike from its features (and the
    stop row from the run's), as trained by :func:`ncclrl.agents.strategy_train.train`. Loaded
    from ``strategy.json`` (architecture, features, provenance) and ``strategy.npz`` (weights);
    no pickle."""

    name = "policy"

    def __init__(self, layers: list[tuple[np.ndarray, np.ndarray]], meta: dict[str, Any]) -> None:
        if layers[0][0].shape[0] != N_FEATURES:
            raise ConfigError("strategy", f"the strategy expects {layers[0][0].shape[0]} features, "
                              f"this ncclrl gives {N_FEATURES}")
        self.layers, self.meta = layers, meta

    def scores(self, feats: np.ndarray) -> np.ndarray:
        return mlp.forward(self.layers, feats)[:, 0]

    def save(self, path: Path) -> Path:
        """Writes ``path`` (JSON) and its weights next to it (same name, ``.npz``)."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        np.savez(path.with_suffix(".npz"), **{f"w{i}": w for i, (w, _) in enumerate(self.layers)},
                 **{f"b{i}": b for i, (_, b) in enumerate(self.layers)})
        meta = dict(self.meta, format="ncclrl-strategy", version=1, features=list(FEATURES),
                    layers=[list(w.shape) for w, _ in self.layers], activation="tanh",
                    weights=path.with_suffix(".npz").name)
        path.write_text(json.dumps(meta, indent=2) + "\n")
        return path

    @classmethod
    def load(cls, path: str | Path) -> PolicyController:
        """Read a strategy: JSON and an ``.npz`` of plain arrays (``allow_pickle=False``), so loading
        runs no code. A pickled checkpoint (stable-baselines3 ``.zip``, torch ``.pt``, ``.pkl``) is
        refused in one line, never unpickled."""
        path = Path(path)
        refuse = (f"{path} is a pickled checkpoint; ncclrl never loads pickles (loading one can run any code): "
                  "give the strategy.json (+ strategy.npz) that ncclrl pretrain writes")
        if path.suffix.lower() in PICKLED_SUFFIXES:
            raise ConfigError("strategy", refuse)
        try:
            raw = path.read_bytes()
        except OSError as e:
            raise ConfigError("strategy", f"cannot read {path}: {e.strerror or e}") from None
        if raw[:2] in (b"\x80\x02", b"\x80\x03", b"\x80\x04", b"\x80\x05") or raw[:4] == b"PK\x03\x04":
            raise ConfigError("strategy", refuse)
        try:
            meta = json.loads(raw.decode())
        except (UnicodeDecodeError, ValueError) as e:
            raise ConfigError("strategy", f"cannot read {path}: not JSON ({e})") from None
        if not isinstance(meta, dict) or meta.get("format") != "ncclrl-strategy" or meta.get("version") != 1:
            raise ConfigError("strategy", f"{path} is not an ncclrl strategy (format ncclrl-strategy, version 1)")
        if list(meta.get("features", [])) != list(FEATURES):
            raise ConfigError("strategy", f"{path} was trained on other features: {meta.get('features')}")
        weights = path.parent / str(meta.get("weights", ""))
        if weights.suffix != ".npz" or weights.parent != path.parent:
            raise ConfigError("strategy", f"{path}: weights must name an .npz beside it, got {meta.get('weights')!r}")
        try:
            with np.load(weights, allow_pickle=False) as z:
                layers = [(z[f"w{i}"].astype(float), z[f"b{i}"].astype(float)) for i in range(len(meta["layers"]))]
        except (OSError, ValueError, KeyError, TypeError, AttributeError, zipfile.BadZipFile) as e:
            raise ConfigError("strategy", f"cannot read the weights {weights}: {e} (plain arrays only, no "
                              "pickled objects)") from None
        return cls(layers, meta)


# -- the run -----------------------------------------------------------------------------------


@dataclass
class SearchConfig:
    """How a run picks and measures.

    :param round_points: points picked before they are measured (one job per knob setting among
        them) and the model refit
    :param max_repeats: most jobs one point is measured in
    :param shortlist: candidates the controller chooses from: half the best by predicted gain,
        half by optimistic gain (mean + 2 sd)
    :param allow_stop: whether the strategy may end the run before the budget is spent
    :param model: the model's prior
    :param decision: the rule the table is decided by
    """

    round_points: int = 8
    max_repeats: int = 3
    shortlist: int = 64
    allow_stop: bool = False
    model: ModelConfig = field(default_factory=ModelConfig)
    decision: DecisionConfig = field(default_factory=DecisionConfig)

    def check(self) -> None:
        for name in ("round_points", "max_repeats", "shortlist"):
            if getattr(self, name) < 1:
                raise ConfigError(name, f"must be >= 1, got {getattr(self, name)}")
        self.model.check()
        self.decision.check()


@dataclass
class Result:
    """What a run decided and why it stopped."""

    decision: Decision
    table: Table
    zero_shot: Table
    reason: str
    measured: int
    rounds: int
    history: list[dict[str, Any]] = field(default_factory=list)


class Search:
    """One tuning run of ``controller`` over ``problem``, measuring through ``ev``."""

    def __init__(self, problem: Problem, ev: Evaluator, controller: Controller | None, cfg: SearchConfig,
                 log: Callable[[str], None] = lambda _m: None, space: Space | None = None) -> None:
        cfg.check()
        self.problem, self.ev, self.controller, self.cfg, self.log = problem, ev, controller, cfg, log
        self.space = space or Space(problem)
        self.model = Model(self.space, cfg.model)
        sp = self.space
        self.n = np.zeros(sp.size, dtype=np.int64)
        self.ysum = np.zeros(sp.size)
        self.knob_jobs: list[set[int]] = [set() for _ in range(sp.n_knobs)]
        self.max_rep = np.full(sp.size, cfg.max_repeats, dtype=np.int64)
        if problem.repeats is not None:
            for i in range(sp.size):
                x = (problem.knobs[sp.knob[i]].knobs, *sp.cells[sp.cell[i]], sp.keys[i])
                self.max_rep[i] = min(cfg.max_repeats, problem.repeats.get(x, 1))
        self.pending: list[int] = []
        self.zs = zero_shot(sp)
        self.table = decide(sp, self.model, measurements(sp, ev), cfg.decision)
        self.rounds = 0
        self.history: list[dict[str, Any]] = []
        self._shortlist = np.empty(0, np.int64)
        self._t0 = time.time()

    # -- measuring -----------------------------------------------------------------------------
    def start(self) -> None:
        """The fixed first round: NCCL's plain defaults, then the zero-shot rows next to NCCL's
        choice under the zero-shot knob setting."""
        sp = self.space
        first = list(sp.default[: sp.n_cells])
        k = self.zs.knob
        for c, i in self.zs.rows.items():
            if k:  # NCCL's choice under the zero-shot setting, next to the row (-1: it cannot run)
                first.append(int(sp.default[k * sp.n_cells + c]))
            first.append(i)
        self.pending = [i for i in dict.fromkeys(first) if i >= 0]
        self.flush()

    def flush(self) -> None:
        """Measure the pending points, one job per knob setting, then refit and decide again."""
        if not self.pending:
            return
        sp = self.space
        by: dict[int, list[int]] = {}
        for i in self.pending:
            by.setdefault(int(sp.knob[i]), []).append(i)
        self.pending = []
        for k, idx in by.items():
            try:
                res = self.ev.evaluate(self.problem.knobs[k], [(*sp.cells[sp.cell[i]], sp.keys[i]) for i in idx])
            except BudgetExhausted:
                break
            job = self.ev.calls
            for i, m in zip(idx, res, strict=True):
                if m is not None and m > 0:
                    self.n[i] += 1
                    self.ysum[i] += math.log(m)
                    self.knob_jobs[k].add(job)
                elif m is None:
                    self.max_rep[i] = self.n[i]  # failed: not again
        self.refit()
        self.rounds += 1
        self.history.append({"round": self.rounds, "measured": self.ev.points, "jobs": self.ev.calls,
                             "gpu_s": round(self.ev.gpu_s, 2), "knob": self.table.knob,
                             "rows": len(self.table.rows), "gain": round(math.exp(self.table.gain), 4),
                             "wall_s": round(time.time() - self._t0, 2)})

    def refit(self) -> None:
        ybar = np.where(self.n > 0, self.ysum / np.maximum(self.n, 1), 0.0)
        obs = measurements(self.space, self.ev)
        self.model.fit(self.n, ybar, fit_noise(obs, self.cfg.model))
        self.ev.count_model(self.space.size)
        self.table = decide(self.space, self.model, obs, self.cfg.decision)

    def recalibrate(self, problem: Problem) -> None:
        """Go on with ``problem``'s prior (the same problem, its prior calibrated on what was
        measured: :func:`ncclrl.agents.calibration.calibrate`): the space's prior times, the model
        and the zero-shot table are rebuilt from it; every measurement is kept and the model refit."""
        if problem.cells() != self.problem.cells() or problem.knobs != self.problem.knobs:
            raise ConfigError("problem", "recalibrate takes the same problem with another prior")
        self.problem = problem
        self.ev.problem = problem  # its planning figures read the prior too
        self.space = Space(problem)
        self.model = Model(self.space, self.cfg.model)
        self.zs = zero_shot(self.space)
        self.refit()

    # -- what the controller sees ----------------------------------------------------------------
    def observe(self) -> tuple[np.ndarray, np.ndarray]:
        """The shortlist (point indices) and its features, the stop row last."""
        sp, m = self.space, self.model
        nc = sp.n_cells
        pend = np.zeros(sp.size, dtype=bool)
        pend[self.pending] = True
        ok = (self.n < self.max_rep) & ~pend
        # per (knob, cell): the best posterior mean among measured points, else NCCL's choice's
        inc = np.full(sp.n_knobs * nc, np.inf)
        meas = self.n > 0
        np.minimum.at(inc, sp.group[meas], m.mean[meas])
        none = ~np.isfinite(inc)
        dflt = sp.default.copy()
        inc[none & (dflt >= 0)] = m.mean[dflt[none & (dflt >= 0)]]
        potential = np.full(sp.n_knobs * nc, np.inf)
        np.minimum.at(potential, sp.group, m.mean)
        plain = m.mean[sp.default[:nc]]
        pot_k = np.array([np.mean(plain - potential[k * nc:(k + 1) * nc]) for k in range(sp.n_knobs)])
        cover = np.zeros(sp.n_knobs * nc)
        np.maximum.at(cover, sp.group, meas.astype(float))
        cover_k = cover.reshape(sp.n_knobs, nc).mean(axis=1)
        final = m.mean[self.table.final]
        gain = inc[sp.group] - m.mean
        g_tab = final[sp.cell] - m.mean
        std = m.std
        zz = g_tab / std
        ei = std * _phi(zz) + g_tab * _cdf(zz)
        left = self.ev.remaining - len(self.pending) * self.ev.point_gpu_s()
        frac_left = max(left, 0.0) / max(self.ev.budget, 1e-12)
        # the shortlist: half by predicted gain, half by optimistic gain
        cand = np.flatnonzero(ok)
        half = max(1, self.cfg.shortlist // 2)
        a = cand[np.argsort(-g_tab[cand], kind="stable")[:half]]
        b = cand[np.argsort(-(g_tab[cand] + 2 * std[cand]), kind="stable")[: 2 * half]]
        short = np.array(list(dict.fromkeys([*a.tolist(), *b.tolist()]))[: self.cfg.shortlist], dtype=np.int64)
        self._shortlist = short
        # per candidate, unclipped, for controllers that weigh a measurement by its GPU-time
        pend_knobs = {int(sp.knob[i]) for i in self.pending}
        t_us = np.exp(m.mean[short])
        cost = self.ev.cost.point_wall_s(t_us, self.ev.samples) * self.ev.nranks
        cost += np.array([0.0 if int(k) in pend_knobs else self.ev.cost.launch_s * self.ev.nranks
                          for k in sp.knob[short]])
        self.acquisition = {"ei": ei[short], "gain": g_tab[short], "std": std[short], "gpu_s": cost}
        ks = sp.knob[short]
        row_of = np.full(nc, -1)
        for c, i in self.table.rows.items():
            row_of[c] = i
        f = np.zeros((len(short) + 1, N_FEATURES))
        f[:-1, 0] = gain[short] * GAIN_SCALE
        f[:-1, 1] = std[short] * GAIN_SCALE
        f[:-1, 2] = ei[short] * GAIN_SCALE
        f[:-1, 3] = g_tab[short] * GAIN_SCALE
        f[:-1, 4] = ks == self.table.knob
        f[:-1, 5] = (pot_k[ks] - pot_k.max()) * GAIN_SCALE
        f[:-1, 6] = cover_k[ks]
        f[:-1, 7] = sp.is_default[short]
        f[:-1, 8] = np.minimum(self.n[short], 3) / 2
        d_of = sp.default_of[short]
        f[:-1, 9] = np.where(d_of >= 0, self.n[np.maximum(d_of, 0)] > 0, 1.0)
        f[:-1, 10] = row_of[sp.cell[short]] == short
        f[:-1, 11] = [self.table.prob.get(int(c), 0.0) for c in sp.cell[short]]
        f[:-1, 14] = sp.size_pos[sp.cell[short]]
        f[:, 12] = frac_left
        f[:, 13] = math.log10(max(self.ev.budget_points(), 1)) / 3
        # the stop row: the run's state (the best any knob setting could still gain over the table, the
        # shortlist's uncertainty)
        f[-1, 5] = (pot_k.max() - self.table.gain) * GAIN_SCALE
        f[-1, 1] = float(std[short].mean()) * GAIN_SCALE if len(short) else 0.0
        f[-1, 15] = 1.0
        np.clip(f, -5, 5, out=f)
        return short, f

    def act(self, choice: int) -> bool:
        """Take shortlist entry ``choice`` (its length: stop). Returns whether the run goes on."""
        if choice >= len(self._shortlist):
            self.flush()
            return False
        self.pending.append(int(self._shortlist[choice]))
        if len(self.pending) >= self.cfg.round_points or not self.affords_more():
            self.flush()
        return self.ev.remaining > 0

    def affords_more(self) -> bool:
        """Whether the budget left pays for another point beside the pending ones (a planning figure)."""
        jobs = max(len({int(self.space.knob[i]) for i in self.pending}), 1)
        return self.ev.remaining > 0 and self.ev.points_left(len(self.pending), jobs=jobs) > 0

    # -- whole jobs --------------------------------------------------------------------------------
    def point_gpu_s(self, idx: np.ndarray) -> np.ndarray:
        """Predicted GPU-seconds each point adds to its job (its calls at the posterior time)."""
        return self.ev.cost.point_wall_s(np.exp(self.model.mean[idx]), self.ev.samples) * self.ev.nranks

    def compose_job(self) -> list[int]:
        """The next job (:class:`JobController`): per knob setting, its points never measured, or,
        when it has none, the candidates (measured fewer than ``max_repeats`` times) in order of
        expected improvement over the current table per GPU-second while that ratio beats the
        job's own (its expected improvement so far over its launch and points); the setting whose
        job is worth most per GPU-second, with NCCL's choice under it at every size; a job of NCCL's
        defaults instead when they have been measured in fewer jobs than that setting's choices
        (every setting is judged against them). Empty when nothing is worth measuring."""
        sp, m = self.space, self.model
        final = m.mean[self.table.final]
        sens = sp.sensitivity(final) * sp.n_cells  # 1 per cell unweighted; the step's share weighted
        g = final[sp.cell] - m.mean
        std = np.maximum(m.std, 1e-9)
        z = g / std
        ei = (std * _phi(z) + g * _cdf(z)) * sens[sp.cell]
        ok = self.n < self.max_rep
        cost = self.point_gpu_s(np.arange(sp.size))
        launch = self.ev.cost.launch_s * self.ev.nranks
        best, best_rate = [], 0.0
        race: dict[int, list[int]] = {}
        for k in range(sp.n_knobs):
            idx = np.flatnonzero(ok & (sp.knob == k))
            fresh = idx[self.n[idx] == 0]
            if len(fresh):  # a setting not yet swept: its whole space in one job (points are cheap next to a launch)
                value, spent = float(ei[fresh].sum()), launch + float(cost[fresh].sum())
                if value / spent > best_rate:
                    best, best_rate = fresh.tolist(), value / spent
                continue
            idx = idx[np.argsort(-ei[idx] / cost[idx], kind="stable")]
            value, spent, take = 0.0, launch, 0
            for i in idx:
                if ei[i] / cost[i] <= value / spent:
                    break
                value, spent, take = value + ei[i], spent + cost[i], take + 1
            race[k] = idx[:take].tolist()
            if take and value / spent > best_rate:
                best, best_rate = race[k], value / spent
        if not best:
            return []
        k = int(sp.knob[best[0]])
        nc = sp.n_cells
        plain = sp.default[:nc]
        if k and 0 in race:
            under = sp.default[k * nc:(k + 1) * nc]
            if self.n[plain].min() < self.n[under[under >= 0]].min() + 1:
                # every setting is judged against NCCL's plain defaults: measure them as often
                k, best = 0, race[0]
        # NCCL's choice at every size: a setting is exported only once its table is confirmed at
        # every size (min_jobs), against NCCL's plain defaults measured as often
        pair = [int(i) for i in sp.default[k * nc:(k + 1) * nc]]
        return list(dict.fromkeys([*[i for i in pair if i >= 0], *best]))

    def run_jobs(self) -> Result:
        """A run of whole jobs (:class:`JobController`): NCCL's plain defaults with every
        configuration under them first, then :meth:`compose_job` until the budget is spent; or, when
        the controller composes jobs itself (``next_job(search)``: :class:`ncclrl.agents.compose.ComposerController`),
        every job it picks, the first included, until it stops or the budget is spent."""
        sp = self.space
        composer = getattr(self.controller, "next_job", None)  # a composer picks every job, the first too
        if composer is None:
            base = np.flatnonzero(sp.knob == 0)
            first = [*sp.default[: sp.n_cells].tolist(), *base[~sp.is_default[base]].tolist()]
            self.pending = list(dict.fromkeys(int(i) for i in first))
            self.flush()
        reason = "budget spent"
        while self.ev.remaining > 0:
            job = composer(self) if composer is not None else self.compose_job()
            if not job:
                reason = (getattr(self.controller, "stop_reason", "the composer stopped") if composer is not None
                          else "nothing left worth measuring")
                break
            self.pending = job
            self.flush()
        if self.ev.stop_reason:  # the budget, the wall clock, a signal or a failed job, as it was
            reason = self.ev.stop_reason
        t = self.table
        self.log(f"# {reason}: {self.ev.points} points measured in {self.ev.calls} jobs, "
                 f"{format_gpu_s(self.ev.gpu_s)}; {len(t.rows)} rows, knob setting {t.knob}")
        return Result(self.space.decision(t.knob, t.rows), t, self.zs, reason, self.ev.points, self.rounds,
                      self.history)

    # -- the whole run ---------------------------------------------------------------------------
    def run(self) -> Result:
        if getattr(self.controller, "composes_jobs", False):
            return self.run_jobs()
        self.start()
        reason = "budget spent"
        while self.affords_more():
            short, f = self.observe()
            if not len(short):
                reason = "nothing left to measure"
                break
            if hasattr(self.controller, "scores_for"):
                scores = np.asarray(self.controller.scores_for(self.acquisition), dtype=float)
            else:
                scores = np.asarray(self.controller.scores(f), dtype=float)
            if not self.cfg.allow_stop:
                scores[-1] = -np.inf
            choice = int(np.argmax(scores))
            if not self.act(choice):
                if choice >= len(short):
                    reason = "the strategy stopped: no candidate worth its measurement"
                break
        self.flush()
        if self.ev.stop_reason and reason == "budget spent":
            reason = self.ev.stop_reason
        t = self.table
        self.log(f"# {reason}: {self.ev.points} points measured in {self.ev.calls} jobs, "
                 f"{format_gpu_s(self.ev.gpu_s)}; {len(t.rows)} rows, knob setting {t.knob}")
        return Result(self.space.decision(t.knob, t.rows), t, self.zs, reason, self.ev.points, self.rounds,
                      self.history)
