"""The model of a tuning run and its statistics: the prior's log time plus a Bayesian linear
correction and each point's misfit (:class:`Model`); the measurements (:func:`measurements`), the
run's own noise (:func:`fit_noise`) and the estimate of every measured point with job shifts taken
out (:func:`estimate`)."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np

from ncclrl.agents.problem import Evaluator
from ncclrl.agents.search.space import Space
from ncclrl.costmodel.errors import ConfigError

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
    from scipy import sparse

    jobs, jj = np.unique(obs.job, return_inverse=True)
    K = sparse.csr_matrix((v, (r, c)), shape=(m, len(obs)))  # the contrasts: a few entries a row
    u = K @ obs.y
    Z = sparse.csr_matrix((np.ones(len(obs)), (np.arange(len(obs)), jj)), shape=(len(obs), len(jobs)))
    W = (K @ Z).toarray()
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
    covariance of the estimates. ``at[i]``: row of space point ``i`` (-1: never measured).

    The covariance is kept factored, ``diag(dinv) + W K W^T`` (a diagonal per point plus a term of
    rank the number of jobs), so an estimate costs what its points and jobs need, never a dense
    inverse over every point measured."""

    at: np.ndarray
    mu: np.ndarray
    dinv: np.ndarray  # per row, the diagonal part of the covariance
    W: np.ndarray  # rows x jobs
    K: np.ndarray  # jobs x jobs
    n: np.ndarray  # measurements per row
    jobs: list[set[int]]  # the jobs that measured each row

    def measured(self, i: int) -> bool:
        return i >= 0 and self.at[i] >= 0

    def _cov(self, x: int, y: int) -> float:
        return float((self.dinv[x] if x == y else 0.0) + self.W[x] @ self.K @ self.W[y])

    @property
    def cov(self) -> np.ndarray:
        """The dense covariance of the estimates (rows x rows)."""
        return np.diag(self.dinv) + self.W @ self.K @ self.W.T

    def diff(self, a: int, b: int) -> tuple[float, float]:
        """``mu[a] - mu[b]`` and its sd (both measured)."""
        x, y = self.at[a], self.at[b]
        if x == y:
            return 0.0, 0.0
        var = self._cov(x, x) + self._cov(y, y) - 2 * self._cov(x, y)
        return float(self.mu[x] - self.mu[y]), math.sqrt(max(float(var), 0.0))

    def contrast(self, wts: dict[int, float]) -> tuple[float, float]:
        """sum of ``w * mu[i]`` over space points ``i`` (all measured) and its sd."""
        rows: dict[int, float] = {}
        for i, w in wts.items():
            rows[int(self.at[i])] = rows.get(int(self.at[i]), 0.0) + w
        idx = np.fromiter(rows, dtype=np.int64)
        w = np.fromiter(rows.values(), dtype=float)
        g = self.W[idx].T @ w
        var = float((w * w * self.dinv[idx]).sum() + g @ self.K @ g)
        return float(w @ self.mu[idx]), math.sqrt(max(var, 0.0))


def estimate(space: Space, obs: Measurements, noise: Noise) -> Estimate:
    """The measured points' means and covariance (:class:`Estimate`). Two points measured in the
    same job are compared within it (their job's shift cancels); across jobs, the shifts are
    estimated from the points the jobs share, and what is left of them counts as ``job_sd``.
    The precision is diagonal less a term of rank the number of jobs, inverted by Woodbury's
    identity: the cost grows with points times jobs squared."""
    at = np.full(space.size, -1, dtype=np.int64)
    if not len(obs):
        return Estimate(at, np.empty(0), np.empty(0), np.empty((0, 0)), np.empty((0, 0)), np.empty(0, np.int64), [])
    pts, pi = np.unique(obs.point, return_inverse=True)
    jobs, jj = np.unique(obs.job, return_inverse=True)
    p, q = len(pts), len(jobs)
    A = np.zeros((p, q))
    np.add.at(A, (pi, jj), 1.0)
    s2, t2 = noise.point_sd ** 2, max(noise.job_sd, 1e-6) ** 2
    n_i, n_j = A.sum(axis=1), A.sum(axis=0)
    M = s2 / t2 + n_j
    # precision P = (diag(n_i) - (A / M) A^T) / s2 = D - U U^T
    dinv = s2 / n_i
    U = A / np.sqrt(M * s2)
    W = dinv[:, None] * U
    K = np.linalg.inv(np.eye(q) - U.T @ W)
    K = (K + K.T) / 2
    xy = np.bincount(pi, obs.y, minlength=p)
    zy = np.bincount(jj, obs.y, minlength=q)
    rhs = (xy - A @ (zy / M)) / s2
    mu = dinv * rhs + W @ (K @ (W.T @ rhs))
    at[pts] = np.arange(p)
    sets = [set(jobs[A[r] > 0].tolist()) for r in range(p)]
    return Estimate(at, mu, dinv, W, K, n_i.astype(np.int64), sets)


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
