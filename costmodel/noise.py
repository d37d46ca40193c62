"""Between-job noise: judging "faster" or "slower" when the two sides ran in different jobs.

On the H200 hosts the same configuration measured in two consecutive jobs differs far more than
the samples within one job do: over 464 recorded A/A pairs (NCCL's defaults on both sides, two
jobs of one validation about 30 s apart), the standard deviation of the log ratio of the job
medians is 0.1-0.6, 3-6x the within-job standard error, and 47% of the pairs had disjoint
within-job 95% intervals (docs/explanation/statistics.md). Part of it is a shift of the whole job (every
latency-bound size 20-30% slower), part is per point.

The model here: the log of a point's job median is ``mu + e`` with ``e ~ N(0, sigma^2)`` per job,
``sigma`` a smooth function of the size. ``sigma`` is estimated from repeated jobs of one
configuration (the spread of their log medians), pooled over neighbouring sizes of the same
collective, so a comparison of ``n_a`` and ``n_b`` jobs has the standard error
``sigma * sqrt(1/n_a + 1/n_b)`` and a Student-t quantile with the pooled degrees of freedom. The
interval is never narrower than the within-job one (the two sides' pooled-sample 95% intervals
must not overlap). Without repeated jobs there is nothing to estimate ``sigma`` from, and the
comparison is the within-job one (and says so: ``df == 0``).

:class:`JobNoise` is the generative side: a job shift shared by every point of a job, a per-point
residual and the samples within the job, fitted (:func:`fit`) on the recorded repeated jobs; replays
and simulated platforms draw their jobs from it (docs/results/noise.md).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from ncclrl.costmodel import nccl as N
from ncclrl.costmodel.errors import ConfigError
from ncclrl.costmodel.space import Point

#: neighbouring sizes (each side) whose repeated jobs are pooled into one size's sigma

def _kept(samples: list[float] | np.ndarray) -> np.ndarray:
    """The finite samples, without outliers beyond 3 median absolute deviations (from 5 samples on)."""
    x = np.asarray(samples, dtype=float)
    x = x[np.isfinite(x)]
    if x.size < 5:
        return x
    med = float(np.median(x))
    mad = float(np.median(np.abs(x - med))) or 1e-12
    return x[np.abs(x - med) <= 3 * 1.4826 * mad]


def robust_median(samples: list[float] | np.ndarray) -> float:
    """:func:`summarize`'s median alone (no bootstrap): what every job median is."""
    kept = _kept(samples)
    return float(np.median(kept)) if kept.size else float("nan")


def summarize(samples: list[float] | np.ndarray, n_boot: int = 400, seed: int = 0) -> tuple[float, float, float]:
    """Median and a 95% bootstrap confidence interval of the median, after dropping outliers
    beyond 3 median absolute deviations (slow outliers are real on these machines: warm-up, drift)."""
    kept = _kept(samples)
    if kept.size == 0:
        return float("nan"), float("nan"), float("nan")
    rng = np.random.default_rng(seed)
    boots = np.median(rng.choice(kept, size=(n_boot, kept.size), replace=True), axis=1)
    return float(np.median(kept)), float(np.quantile(boots, 0.025)), float(np.quantile(boots, 0.975))


WINDOW = 2


def log_median(samples: Sequence[float]) -> float:
    return float(np.log(robust_median(samples)))


def geomean(values) -> float:
    """The geometric mean of positive ratios (speedups, fractions): how every figure averages them."""
    return float(np.exp(np.mean(np.log(np.asarray(values, dtype=float)))))


def log_geomean(jobs: Sequence[Sequence[float]]) -> float:
    """Mean log job median of ``jobs`` (each a list of samples): the log of their geometric mean."""
    return float(np.mean([log_median(j) for j in jobs]))


def pooled_sigma(groups: Sequence[Sequence[Sequence[float]]], window: int = WINDOW) -> tuple[np.ndarray, np.ndarray]:
    """Between-job sigma (log scale) and its degrees of freedom per size.

    :param groups: per size (in size order, one collective), a list of log-job-median arrays, each
        the repeated jobs of one configuration at that size (an array of one job adds nothing)
    :param window: sizes pooled on each side
    :return: ``(sigma, df)``, one entry per size; ``df == 0`` where no size in the window has a
        repeated job (``sigma`` is 0 there)
    """
    n = len(groups)
    ss, df = np.zeros(n), np.zeros(n)
    for i, gs in enumerate(groups):
        for g in gs:
            y = np.asarray(g, dtype=float)
            y = y[np.isfinite(y)]
            if y.size >= 2:
                ss[i] += float(((y - y.mean()) ** 2).sum())
                df[i] += y.size - 1
    sig, dof = np.zeros(n), np.zeros(n, dtype=int)
    for i in range(n):
        lo, hi = max(0, i - window), min(n, i + window + 1)
        d = df[lo:hi].sum()
        if d > 0:
            sig[i] = float(np.sqrt(ss[lo:hi].sum() / d))
            dof[i] = int(d)
    return sig, dof


def t_quantile(df: int, q: float = 0.975) -> float:
    from scipy.stats import t

    return float(t.ppf(q, df))


@dataclass(frozen=True)
class Comparison:
    """``b`` against ``a``: ``ratio`` = a / b (> 1: b is faster), its 95% interval, the verdict and
    the two-sided p-value of "ratio = 1" (one comparison alone: no multiplicity control)."""

    a_us: float  # geometric mean of a's job medians
    b_us: float
    ratio: float
    ratio_lo: float
    ratio_hi: float
    verdict: str  # "faster" (b faster than a beyond the noise), "slower" or "same"
    df: int  # degrees of freedom of the between-job sigma (0: within-job intervals only)
    p_value: float = float("nan")  # two-sided, of the test the interval inverts (see compare)


@functools.lru_cache(maxsize=256)
def _quantile(df: int, q: float) -> float:
    """The Student-t quantile of ``df`` degrees of freedom (``df == 0``: the normal one), cached:
    a validation asks for the same few hundreds of times."""
    if df > 0:
        return t_quantile(df, q)
    from scipy.special import ndtri

    return float(ndtri(q))


def _p_two_sided(stat: float, df: int) -> float:
    """Two-sided p-value of a t statistic of ``df`` degrees of freedom (``df == 0``: normal)."""
    from scipy.special import ndtr, stdtr

    if not np.isfinite(stat):
        return 0.0 if np.isinf(stat) else float("nan")
    x = -abs(float(stat))
    return float(min(1.0, 2.0 * (stdtr(df, x) if df > 0 else ndtr(x))))


def compare(a_jobs: Sequence[Sequence[float]], b_jobs: Sequence[Sequence[float]], sigma: float, df: int,
            q: float = 0.975) -> Comparison:
    """Compare the jobs of ``b`` with the jobs of ``a`` (each a list of samples) at one point.

    The log ratio of the geometric means of the job medians, with the half-width
    ``t_q(df) * sigma * sqrt(1/n_a + 1/n_b)`` (at least the two sides' within-job half-widths).
    "faster"/"slower" when that interval of the ratio excludes 1 and the two sides' pooled-sample
    95% intervals do not overlap either; with no between-job estimate (``df == 0``) the latter
    alone decides. This is one comparison at its own 95%: over many sizes use :func:`judge`,
    which controls the family-wise error.

    ``p_value`` is the two-sided p-value of "ratio = 1" of the test that interval inverts: the
    statistic ``log ratio / se`` with ``se = half-width / t_q(df)`` (the between-job standard
    error ``sigma * sqrt(1/n_a + 1/n_b)`` unless the within-job floor is wider), Student-t of
    ``df`` degrees of freedom, normal when ``df == 0``; so ``p_value < 2 (1 - q)`` exactly when
    the interval excludes 1.
    """
    return _compare(a_jobs, b_jobs, sigma, df, q)


def _compare(a_jobs, b_jobs, sigma: float, df: int, q: float = 0.975, a_logs=None, b_logs=None) -> Comparison:
    """:func:`compare`, given (optionally) each side's log job medians, one per job of
    ``a_jobs``/``b_jobs`` (:func:`judge` has them already: the medians are most of its time)."""
    keep_a, keep_b = [bool(len(j)) for j in a_jobs], [bool(len(j)) for j in b_jobs]
    a = [list(j) for j, k in zip(a_jobs, keep_a, strict=True) if k]
    b = [list(j) for j, k in zip(b_jobs, keep_b, strict=True) if k]
    if not a or not b:
        raise ValueError("compare: both sides need at least one job with samples")
    la = log_geomean(a) if a_logs is None else float(np.mean([v for v, k in zip(a_logs, keep_a, strict=True) if k]))
    lb = log_geomean(b) if b_logs is None else float(np.mean([v for v, k in zip(b_logs, keep_b, strict=True) if k]))
    d = la - lb  # log(a / b)

    _, alo, ahi = summarize([x for j in a for x in j])
    _, blo, bhi = summarize([x for j in b for x in j])
    within = "faster" if bhi < alo else ("slower" if blo > ahi else "same")  # pooled 95% intervals apart
    half = float(np.log(ahi / alo) + np.log(bhi / blo)) / 2 if min(alo, blo) > 0 else 0.0
    if df > 0:
        half = max(half, _quantile(int(df), q) * sigma * float(np.sqrt(1 / len(a) + 1 / len(b))))
    between = "faster" if d - half > 0 else ("slower" if d + half < 0 else "same")
    verdict = within if df == 0 else (between if between == within else "same")
    se = half / _quantile(int(df) if df > 0 else 0, q)
    if se > 0:
        p = _p_two_sided(d / se, int(df))
    else:  # no spread at all: any difference is certain, none is no evidence
        p = float("nan") if not np.isfinite(d) else (0.0 if d != 0 else 1.0)
    return Comparison(a_us=float(np.exp(la)), b_us=float(np.exp(lb)), ratio=float(np.exp(d)),
                      ratio_lo=float(np.exp(d - half)), ratio_hi=float(np.exp(d + half)), verdict=verdict, df=int(df),
                      p_value=p)


def holm(p_values) -> np.ndarray:
    """Holm's step-down adjustment of a family of p-values: sorted ascending, the ``i``-th smallest
    (from 1) times ``m - i + 1``, made non-decreasing along that order and capped at 1. Rejecting
    every hypothesis whose adjusted p-value is <= alpha keeps the family-wise error (the chance of
    one false rejection or more) at alpha, whatever the dependence between the tests. A NaN
    p-value counts in ``m`` as 1 (never rejected) and stays NaN."""
    p = np.asarray(p_values, dtype=float).ravel()
    m = p.size
    if m == 0:
        return p.copy()
    filled = np.where(np.isnan(p), 1.0, p)
    order = np.argsort(filled, kind="stable")
    adj = np.minimum(1.0, np.maximum.accumulate(filled[order] * (m - np.arange(m))))
    out = np.empty(m)
    out[order] = adj
    return np.where(np.isnan(p), np.nan, out)


def aa_noise(frame, sizes: Sequence[int], span_s: float = 600.0,
             window: int = WINDOW) -> dict[int, tuple[float, int]]:
    """The between-job sigma and degrees of freedom per size of one collective from recorded jobs
    of one configuration (``ncclrl validate``'s jobs of NCCL's plain defaults, tag
    ``validate-base``): jobs that started within ``span_s`` of the previous one form a group (one
    device command's validations, minutes apart, the spread a fine-tuning run sees), each group's
    log job medians one entry of :func:`pooled_sigma`.

    :param frame: rows of :meth:`runners.store.Store.frame` (one collective, one topology, one
        launch, ``status='ok'``) with a ``job`` column
    :param sizes: the sizes to estimate for, ascending
    """
    if frame.empty:
        return {s: (0.0, 0) for s in sizes}
    start = frame.groupby("job").ts.min().sort_values()
    group, g, last = {}, 0, None
    for job, t in start.items():
        if last is not None and t - last > span_s:
            g += 1
        group[job], last = g, t
    f = frame.assign(group=frame.job.map(group), med=[log_median(v) for v in frame.samples_us])
    by_size = {int(n): [list(g.med) for _, g in rows.groupby("group", sort=False)]
               for n, rows in f.groupby("nbytes", sort=False)}
    sigma, df = pooled_sigma([by_size.get(s, []) for s in sizes], window)
    return {s: (float(sigma[i]), int(df[i])) for i, s in enumerate(sizes)}


#: the family-wise error :func:`judge` keeps its verdicts of one report to
FWER_ALPHA = 0.05


def judge(topo, points: list[Point], base: list[list[list[float]]], tuned: list[list[list[float]]],
          digest: str = "", alpha: float = FWER_ALPHA) -> pd.DataFrame:
    """The judge of a table against NCCL's defaults, from measured jobs: per point, the tuned jobs
    against the base jobs under the between-job noise model above, sigma from the repeated jobs of
    both sides pooled over neighbouring sizes of the same collective. ``base[i]``/``tuned[i]``:
    point ``i``'s samples, one list per job.

    The verdicts control the family-wise error over every point judged (all collectives and sizes
    of the report): each point's two-sided p-value of "speedup = 1" (:func:`compare`'s test, column
    ``p_value``) is adjusted by Holm's step-down method over the report (``p_holm``); a point is
    ``faster`` or ``slower`` (the direction of its estimate) only where ``p_holm <= alpha`` and
    :func:`compare` calls it so on its own (its 95% interval excludes 1 and the two sides'
    pooled-sample intervals are apart), else ``same``. So a table equal to NCCL's defaults
    everywhere gets one or more verdicts other than ``same`` in at most ``alpha`` of its
    validations (when the noise model holds). ``speedup_lo``/``speedup_hi`` stay each point's own
    95% interval, not adjusted for multiplicity. ``alpha`` larger than ``2 (1 - q)`` of
    :func:`compare` (0.05) adds nothing: the per-point interval must exclude 1 as well. The
    frame's ``attrs`` carry ``fwer`` (alpha), ``family`` (points in the family) and ``method``."""
    rows, ps, verdicts = [], [], []
    for coll in dict.fromkeys(p.collective for p in points):
        idx = [i for i, p in enumerate(points) if p.collective == coll and base[i] and tuned[i]]
        groups = [[[log_median(j) if len(j) else float("nan") for j in base[i]],
                   [log_median(j) if len(j) else float("nan") for j in tuned[i]]] for i in idx]
        sigma, df = pooled_sigma(groups)
        bf = float(N.bus_factor(N.COLLECTIVES.index(coll), topo.nranks))
        for k, i in enumerate(idx):
            c = _compare(base[i], tuned[i], float(sigma[k]), int(df[k]), a_logs=groups[k][0], b_logs=groups[k][1])
            nb = points[i].nbytes
            ps.append(c.p_value)
            verdicts.append(c.verdict)
            rows.append({"topology": topo.name, "collective": coll, "nbytes": nb, "base_us": c.a_us,
                         "tuned_us": c.b_us, "speedup": c.ratio, "speedup_lo": c.ratio_lo, "speedup_hi": c.ratio_hi,
                         "verdict": c.verdict, "jobs": min(len(base[i]), len(tuned[i])),
                         "sigma_between": float(sigma[k]), "df": c.df,
                         "base_busbw_gbps": nb * bf / c.a_us / 1e3, "tuned_busbw_gbps": nb * bf / c.b_us / 1e3,
                         "table_sha256_12": digest, "p_value": c.p_value})
    adjusted = holm(ps)
    for row, v, ph in zip(rows, verdicts, adjusted, strict=True):
        row["p_holm"] = float(ph)
        row["verdict"] = v if ph <= alpha else "same"  # NaN: never rejected
    out = pd.DataFrame(rows)
    out.attrs.update(fwer=float(alpha), family=len(rows), method="holm")
    return out


# -- the job noise model: what a fresh job of a point measures ------------------------------------

#: the sizes (log2 bytes) at which the fitted sds are given; linear in log sd between them, flat beyond
KNOTS_LOG2 = (3.0, 8.0, 13.0, 18.0, 23.0, 28.0, 30.0)
#: where the fitted constants are (``docs/results/scripts/noise_model.py`` regenerates them)
NOISE_FILE = "noise/job_noise.yaml"


@functools.lru_cache(maxsize=32)
def _median_spread(n: int) -> tuple[float, float]:
    """For ``n`` standard normal samples: the variance of their median, and the median over draws
    of their median absolute deviation (a seeded Monte Carlo; exact enough for constants)."""
    z = np.random.default_rng(12345).standard_normal((20000, max(int(n), 1)))
    med = np.median(z, axis=1)
    return float(med.var()), float(np.median(np.median(np.abs(z - med[:, None]), axis=1)))


@dataclass(frozen=True)
class JobNoise:
    """The log of a point's job median is ``log(truth) + shift + resid``: ``shift ~ N(0, shift_sd^2)``
    once per job (every point of the job shares it), ``resid`` per point and job, of sd
    :meth:`resid_sd` (a smooth function of log size; a Student-t of ``resid_df`` degrees of freedom
    scaled to that sd: the recorded residuals have heavy tails); the job's samples of a point
    scatter around its job centre lognormally with sd :meth:`sample_sd`. ``resid_sd`` is the sd of
    a job median of ``fit_samples`` samples, the sampling of the median included.

    :param shift_sd: sd (log) of the job shift
    :param resid_sds: sd (log) of the per-point residual at :data:`KNOTS_LOG2` (or ``knots_log2``)
    :param sample_sds: sd (log) of the samples around their job's centre at the knots
    :param resid_df: degrees of freedom of the residual's t shape (``inf``: normal), > 2
    :param fit_samples: samples per job median in the data the sds were fitted on
    :param knots_log2: the knots, log2 bytes, ascending
    :param source: where the numbers come from
    """

    shift_sd: float
    resid_sds: tuple[float, ...]
    sample_sds: tuple[float, ...]
    resid_df: float = float("inf")
    fit_samples: int = 5
    knots_log2: tuple[float, ...] = KNOTS_LOG2
    source: str = ""

    def __post_init__(self) -> None:
        k = np.asarray(self.knots_log2, dtype=float)
        if k.size < 1 or np.any(np.diff(k) <= 0):
            raise ConfigError("noise.knots_log2", f"must be ascending, got {list(self.knots_log2)}")
        for name in ("resid_sds", "sample_sds"):
            v = np.asarray(getattr(self, name), dtype=float)
            if v.shape != k.shape or not np.all(np.isfinite(v)) or np.any(v < 0):
                raise ConfigError(f"noise.{name}", f"needs one sd >= 0 per knot ({k.size}), got {list(v)}")
        if not (np.isfinite(self.shift_sd) and self.shift_sd >= 0):
            raise ConfigError("noise.shift_sd", f"must be a finite sd >= 0, got {self.shift_sd}")
        if not self.resid_df > 2:
            raise ConfigError("noise.resid_df", f"must be > 2 (a finite sd), got {self.resid_df}")
        if self.fit_samples < 1:
            raise ConfigError("noise.fit_samples", f"must be >= 1, got {self.fit_samples}")

    @classmethod
    def zero(cls) -> JobNoise:
        """No noise at all: every job measures the truth."""
        n = len(KNOTS_LOG2)
        return cls(0.0, (0.0,) * n, (0.0,) * n, source="none")

    @classmethod
    def load(cls, name: str = "pooled") -> JobNoise:
        """The fitted model ``name`` (a topology/launch such as ``h200-2x2-sock/nccl``, or ``pooled``)
        from the shipped constants; an unknown name gets the pooled fit."""
        fits = _read_fits()
        d = fits.get(name) or fits["pooled"]
        return cls(shift_sd=float(d["shift_sd"]), resid_sds=tuple(map(float, d["resid_sd"])),
                   sample_sds=tuple(map(float, d["sample_sd"])), resid_df=float(d["resid_df"]),
                   fit_samples=int(d["fit_samples"]), knots_log2=tuple(map(float, d["knots_log2"])),
                   source=f"{NOISE_FILE}:{name if name in fits else 'pooled'}")

    def scaled(self, shift: float = 1.0, resid: float = 1.0) -> JobNoise:
        """The same model with the job shift's sd times ``shift`` and the residual's times ``resid``."""
        from dataclasses import replace

        return replace(self, shift_sd=self.shift_sd * shift, resid_sds=tuple(v * resid for v in self.resid_sds))

    def _at(self, values: tuple[float, ...], nbytes) -> np.ndarray:
        x = np.log2(np.maximum(np.asarray(nbytes, dtype=float), 1.0))
        v = np.asarray(values, dtype=float)
        return np.exp(np.interp(x, self.knots_log2, np.log(np.maximum(v, 1e-9)))) * (v.max() > 0)

    def resid_sd(self, nbytes) -> np.ndarray:
        """sd (log) of a point's job median around ``truth x job shift``, per size."""
        return self._at(self.resid_sds, nbytes)

    def sample_sd(self, nbytes) -> np.ndarray:
        """sd (log) of one sample around its job's centre, per size."""
        return self._at(self.sample_sds, nbytes)

    def _t(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """``n`` draws of unit sd with the residual's shape."""
        if not np.isfinite(self.resid_df):
            return rng.standard_normal(n)
        return rng.standard_t(self.resid_df, n) * np.sqrt((self.resid_df - 2) / self.resid_df)

    def draw_shift(self, rng: np.random.Generator) -> float:
        """One job's shift (log)."""
        return float(self.shift_sd * rng.standard_normal())

    def draw_resid(self, nbytes, rng: np.random.Generator) -> np.ndarray:
        """One job's residual (log) of each point, the sampling of a median of ``fit_samples``
        samples left out (drawing the samples adds it back)."""
        nb = np.atleast_1d(np.asarray(nbytes, dtype=float))
        vmed, _ = _median_spread(self.fit_samples)
        sd = np.sqrt(np.maximum(self.resid_sd(nb) ** 2 - vmed * self.sample_sd(nb) ** 2, 0.0))
        return sd * self._t(rng, nb.size)

    def draw_job(self, truth_us, nbytes, samples: int, rng: np.random.Generator) -> np.ndarray:
        """The samples ``(points, samples)`` of one job measuring points of expected times
        ``truth_us`` and sizes ``nbytes``: one shift for the job, a residual per point, lognormal samples."""
        t = np.atleast_1d(np.asarray(truth_us, dtype=float))
        nb = np.broadcast_to(np.asarray(nbytes, dtype=float), t.shape)
        centre = t * np.exp(self.draw_shift(rng) + self.draw_resid(nb, rng))
        z = rng.standard_normal((t.size, int(samples)))
        return centre[:, None] * np.exp(self.sample_sd(nb)[:, None] * z)


def load_fits() -> dict[str, dict]:
    """The shipped fitted constants: name -> fit (with its provenance)."""
    import copy

    return copy.deepcopy(_read_fits())


@functools.lru_cache(maxsize=1)
def _read_fits() -> dict[str, dict]:
    """The shipped constants, read once (every drawn platform and replay loads them)."""
    from importlib.resources import files

    import yaml

    return yaml.safe_load((Path(str(files("ncclrl.conf"))) / NOISE_FILE).read_text())["fits"]


def pooled_median(jobs: Sequence[Sequence[float]]) -> float:
    """A point's expected time from its recorded jobs: the geometric mean of their medians."""
    return float(np.exp(np.mean([np.log(np.median(j)) for j in jobs])))


@dataclass(frozen=True)
class NoiseFit:
    """What :func:`fit` found: the model, and what it rests on."""

    noise: JobNoise
    groups: int  # sets of repeated jobs used
    jobs: int  # jobs in them
    rows: int  # job medians
    df_shift: float  # degrees of freedom of the shift's variance (sum of jobs - 1 over groups)
    resid_by_size: pd.DataFrame  # per size: the pooled unsmoothed residual sd and its df
    job_shifts: np.ndarray  # each job's estimated shift (its mean deviation, scaled to be unbiased in variance)


def _group_moments(y: np.ndarray) -> tuple[np.ndarray, float, np.ndarray, np.ndarray]:
    """Method of moments on one group, ``y`` (jobs x points, complete) the log job medians:
    ``y[j, p] = mu[p] + s[j] + e[j, p]``, ``var s = shift^2``, ``var e[., p] = sigma_p^2``.

    With the double-centred residuals ``r`` and ``v_p = sum_j r[j, p]^2 / (J - 1)``:
    ``E v_p = (1 - 2/P) sigma_p^2 + S / P^2`` (``S = sum sigma_p^2``), so ``S = sum v / (1 - 1/P)``
    and ``sigma_p^2 = (v_p - S/P^2) / (1 - 2/P)``; the job means' spread
    ``E sum_j (ybar_j - ybar)^2 / (J - 1) = shift^2 + S / P^2``. Each is unbiased (any residual shape).

    :return: ``(sigma_p^2, shift^2, job deviations, double-centred residuals)``
    """
    J, P = y.shape
    r = y - y.mean(0, keepdims=True) - y.mean(1, keepdims=True) + y.mean()
    v = (r ** 2).sum(0) / (J - 1)
    S = v.sum() / (1 - 1 / P)
    s2 = (v - S / P ** 2) / (1 - 2 / P)
    dev = y.mean(1) - y.mean()
    return s2, float((dev ** 2).sum() / (J - 1) - S / P ** 2), dev, r


def _t_df_from_tails(z: np.ndarray) -> float:
    """Degrees of freedom of the Student-t whose ratio of the 95% to the 50% quantile of ``|z|``
    is the sample's (``inf`` where the sample's tails are no heavier than a normal's)."""
    from scipy.optimize import brentq
    from scipy.stats import t

    a = np.abs(z[np.isfinite(z)])
    if a.size < 50:
        return float("inf")
    ratio = float(np.quantile(a, 0.95) / np.quantile(a, 0.5))
    f = lambda nu: float(t.ppf(0.975, nu) / t.ppf(0.75, nu)) - ratio  # noqa: E731
    if f(200.0) >= 0:
        return float("inf")
    return float(brentq(f, 2.05, 200.0)) if f(2.05) > 0 else 2.05


def fit(frame: pd.DataFrame, knots_log2: Sequence[float] = KNOTS_LOG2, min_points: int = 5,
        source: str = "") -> NoiseFit:
    """Fit :class:`JobNoise` on repeated jobs.

    Each ``group`` is one configuration (or one table) measured over the same points in several
    jobs (A/A: nothing differs but the job). Within a group, only the points every job measured
    are used; per group the method of moments of :func:`_group_moments` (unbiased in the
    variances), pooled over groups with weights ``J - 1``; the per-point residual variance is
    pooled per size and then per knot with a triangular kernel in log2 size (a size between two
    knots counts for both, by its distance). The residual's tail shape from the 95%/50% quantile
    ratio of the standardized residuals; the sample sd from the median absolute deviation of the
    log samples from their job median (a weighted median per knot), against a normal's for that many samples.

    :param frame: one row per job median: ``group``, ``job``, ``point`` (hashable, what a repeat of
        the point has in common; with ``nbytes``), ``nbytes``, ``samples_us``
    :param knots_log2: where the sds are given, log2 bytes ascending
    :param min_points: a group needs at least this many complete points
    """
    k = np.asarray(knots_log2, dtype=float)
    f = frame.assign(y=[log_median(s) for s in frame.samples_us])
    s2_rows, shifts, devs, zs = [], [], [], []
    n_groups = n_jobs = n_rows = 0
    for _, g in f.groupby("group", sort=False):
        piv = g.drop_duplicates(["job", "point", "nbytes"]).pivot(index="job", columns=["point", "nbytes"], values="y")
        piv = piv.dropna(axis=1)
        nj, npt = piv.shape
        if nj < 2 or npt < max(min_points, 3):
            continue
        s2, sh2, dev, r = _group_moments(piv.to_numpy())
        nb = piv.columns.get_level_values("nbytes").to_numpy(dtype=float)
        s2_rows.append(pd.DataFrame({"nbytes": nb, "s2": s2, "df": nj - 1.0}))
        shifts.append((sh2, nj - 1.0))
        devs.append(dev * np.sqrt(nj / (nj - 1)))
        zs.append((r / np.sqrt((nj - 1) / nj), nb))
        n_groups, n_jobs, n_rows = n_groups + 1, n_jobs + nj, n_rows + nj * npt
    if not n_groups:
        raise ConfigError("noise", "no group with 2 or more jobs over the same points: nothing to fit")
    per = pd.concat(s2_rows)
    by_size = per.assign(w=per.s2 * per.df).groupby("nbytes").agg(w=("w", "sum"), df=("df", "sum"))
    by_size["resid_sd"] = np.sqrt(np.maximum(by_size.w / by_size.df, 0.0))
    by_size = by_size.drop(columns="w").reset_index()
    x = np.log2(by_size.nbytes.to_numpy(dtype=float))
    kern = _kernel(x, k)
    w = kern * by_size.df.to_numpy()[:, None]
    var_k = (w * (by_size.resid_sd.to_numpy()[:, None] ** 2)).sum(0) / np.maximum(w.sum(0), 1e-12)
    var_k = _fill(var_k, w.sum(0) > 0)
    sh = np.array(shifts)
    shift_sd = float(np.sqrt(max((sh[:, 0] * sh[:, 1]).sum() / sh[:, 1].sum(), 0.0)))
    resid_sds = tuple(float(v) for v in np.sqrt(np.maximum(var_k, 0.0)))
    at = lambda nbs: np.exp(np.interp(np.log2(nbs), k, np.log(np.maximum(resid_sds, 1e-9))))  # noqa: E731
    z = np.concatenate([(r / at(nb)[None, :]).ravel() for r, nb in zs])
    # the samples around their job median: each row's median absolute deviation of the log samples,
    # the weighted median of those per knot, over a normal's for that many samples (robust: the slow
    # outliers a job median drops do not count)
    n_fit = int(pd.Series([len(s) for s in f.samples_us]).mode().iloc[0])
    mads = np.array([[float(np.median(np.abs(np.log(s) - np.log(np.median(s))))), nbytes]
                     for s, nbytes in zip(f.samples_us, f.nbytes, strict=True) if len(s) == n_fit])
    if n_fit > 1:
        ks = _kernel(np.log2(mads[:, 1]), k)
        have = ks.sum(0) > 0
        sample_k = _fill(np.array([_wmedian(mads[:, 0], ks[:, i]) if have[i] else 0.0 for i in range(k.size)]),
                         have) / _median_spread(n_fit)[1]
    else:  # one sample per job (a mean of many calls): nothing to tell the samples' spread from the residual's
        sample_k = np.zeros(k.size)
    noise = JobNoise(shift_sd, resid_sds, tuple(float(v) for v in sample_k), _t_df_from_tails(z), n_fit,
                     tuple(float(v) for v in k), source)
    return NoiseFit(noise, n_groups, n_jobs, n_rows, float(sh[:, 1].sum()), by_size, np.concatenate(devs))


def _kernel(x: np.ndarray, knots: np.ndarray) -> np.ndarray:
    """Weights ``(len(x), len(knots))``: each x shared between its two neighbouring knots by distance
    (all on the end knot beyond the ends)."""
    x = np.clip(x, knots[0], knots[-1])
    w = np.zeros((x.size, knots.size))
    i = np.clip(np.searchsorted(knots, x, side="right") - 1, 0, knots.size - 1)
    j = np.minimum(i + 1, knots.size - 1)
    span = np.where(j > i, knots[j] - knots[i], 1.0)
    a = np.where(j > i, (x - knots[i]) / span, 0.0)
    np.add.at(w, (np.arange(x.size), i), 1 - a)
    np.add.at(w, (np.arange(x.size), j), a)
    return w


def _wmedian(x: np.ndarray, w: np.ndarray) -> float:
    """The weighted median of ``x``."""
    o = np.argsort(x)
    c = np.cumsum(w[o])
    return float(x[o][np.searchsorted(c, c[-1] / 2)])


def _fill(v: np.ndarray, have: np.ndarray) -> np.ndarray:
    """Knots without data take the value interpolated from those with (flat beyond them)."""
    idx = np.arange(v.size)
    return np.interp(idx, idx[have], v[have]) if have.any() else np.zeros_like(v)
