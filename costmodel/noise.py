"""Between-job noise: judging "faster" or "slower" when the two sides ran in different jobs.

On the H200 hosts the same configuration measured in two consecutive jobs differs far more than
the samples within one job do: over 464 recorded A/A pairs (NCCL's defaults on both sides, two
jobs of one validation about 30 s apart), the standard deviation of the log ratio of the job
medians is 0.1-0.6, 3-6x the within-job standard error, and 47% of the pairs had disjoint
within-job 95% intervals (docs/design/statistics.md). Part of it is a shift of the whole job (every
latency-bound size 20-30% slower), part is per point.

The model here: the log of a point's job median is ``mu + e`` with ``e ~ N(0, sigma^2)`` per job,
``sigma`` a smooth function of the size. ``sigma`` is estimated from repeated jobs of one
configuration (the spread of their log medians), pooled over neighbouring sizes of the same
collective, so a comparison of ``n_a`` and ``n_b`` jobs has the standard error
``sigma * sqrt(1/n_a + 1/n_b)`` and a Student-t quantile with the pooled degrees of freedom. The
interval is never narrower than the within-job one (the two sides' pooled-sample 95% intervals
must not overlap). Without repeated jobs there is nothing to estimate ``sigma`` from, and the
comparison is the within-job one (and says so: ``df == 0``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from ncclrl.costmodel import nccl as N
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
    """``b`` against ``a``: ``ratio`` = a / b (> 1: b is faster), its 95% interval, the verdict."""

    a_us: float  # geometric mean of a's job medians
    b_us: float
    ratio: float
    ratio_lo: float
    ratio_hi: float
    verdict: str  # "faster" (b faster than a beyond the noise), "slower" or "same"
    df: int  # degrees of freedom of the between-job sigma (0: within-job intervals only)


def compare(a_jobs: Sequence[Sequence[float]], b_jobs: Sequence[Sequence[float]], sigma: float, df: int,
            q: float = 0.975) -> Comparison:
    """Compare the jobs of ``b`` with the jobs of ``a`` (each a list of samples) at one point.

    The log ratio of the geometric means of the job medians, with the half-width
    ``t_q(df) * sigma * sqrt(1/n_a + 1/n_b)`` (at least the two sides' within-job half-widths).
    "faster"/"slower" when that interval of the ratio excludes 1 and the two sides' pooled-sample
    95% intervals do not overlap either; with no between-job estimate (``df == 0``) the latter
    alone decides.
    """
    a = [list(j) for j in a_jobs if len(j)]
    b = [list(j) for j in b_jobs if len(j)]
    if not a or not b:
        raise ValueError("compare: both sides need at least one job with samples")
    d = log_geomean(a) - log_geomean(b)  # log(a / b)

    _, alo, ahi = summarize([x for j in a for x in j])
    _, blo, bhi = summarize([x for j in b for x in j])
    within = "faster" if bhi < alo else ("slower" if blo > ahi else "same")  # pooled 95% intervals apart
    half = float(np.log(ahi / alo) + np.log(bhi / blo)) / 2 if min(alo, blo) > 0 else 0.0
    if df > 0:
        half = max(half, t_quantile(df, q) * sigma * float(np.sqrt(1 / len(a) + 1 / len(b))))
    between = "faster" if d - half > 0 else ("slower" if d + half < 0 else "same")
    verdict = within if df == 0 else (between if between == within else "same")
    return Comparison(a_us=float(np.exp(log_geomean(a))), b_us=float(np.exp(log_geomean(b))), ratio=float(np.exp(d)),
                      ratio_lo=float(np.exp(d - half)), ratio_hi=float(np.exp(d + half)), verdict=verdict, df=int(df))


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


def judge(topo, points: list[Point], base: list[list[list[float]]], tuned: list[list[list[float]]],
          digest: str = "") -> pd.DataFrame:
    """The judge of a table against NCCL's defaults, from measured jobs: per point, the tuned jobs
    against the base jobs under the between-job noise model above, sigma from the repeated jobs of
    both sides pooled over neighbouring sizes of the same collective. ``base[i]``/``tuned[i]``:
    point ``i``'s samples, one list per job."""
    rows = []
    for coll in dict.fromkeys(p.collective for p in points):
        idx = [i for i, p in enumerate(points) if p.collective == coll and base[i] and tuned[i]]
        groups = [[[log_median(j) for j in base[i]], [log_median(j) for j in tuned[i]]] for i in idx]
        sigma, df = pooled_sigma(groups)
        bf = float(N.bus_factor(N.COLLECTIVES.index(coll), topo.nranks))
        for k, i in enumerate(idx):
            c = compare(base[i], tuned[i], float(sigma[k]), int(df[k]))
            nb = points[i].nbytes
            rows.append({"topology": topo.name, "collective": coll, "nbytes": nb, "base_us": c.a_us,
                         "tuned_us": c.b_us, "speedup": c.ratio, "speedup_lo": c.ratio_lo, "speedup_hi": c.ratio_hi,
                         "verdict": c.verdict, "jobs": min(len(base[i]), len(tuned[i])),
                         "sigma_between": float(sigma[k]), "df": c.df,
                         "base_busbw_gbps": nb * bf / c.a_us / 1e3, "tuned_busbw_gbps": nb * bf / c.b_us / 1e3,
                         "table_sha256_12": digest})
    return pd.DataFrame(rows)
