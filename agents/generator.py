"""A problem generator calibrated on measured hosts and grids.

The simulated training problems (:func:`ncclrl.agents.compose.draw_full`) are not the measured ones:
their best tables save a share of the step's communication time over NCCL's defaults unlike what
the recorded hosts and the public grids show, and from other sources (docs/results/generator.md).
This module draws the same problems (platform, collective, calls per step, budget, served
GPU-time, as :func:`draw_full` draws them) and calibrates each problem's truth per platform family
(docs/explanation/generator.md):

- two gain scales per family, applied to every point of the truth: ``gain`` (per-call
  configurations) and ``knob_gain`` (knob settings; the committed fit ties the two: one gain).
  With ``t_nccl(size)`` NCCL's choice under NCCL's default knobs and ``t_nccl,k(size)`` NCCL's
  choice under knob setting ``k``, a point of ``k`` becomes ``log t' = log t_nccl + knob_gain
  (log t_nccl,k - log t_nccl) + gain (log t - log t_nccl,k)``. Below 1 a scale shrinks every gain
  and every loss alike: which configuration is the fastest under a knob setting does not change,
  only by how much. Each problem draws its scales around the family's (``gain_sd``,
  ``knob_gain_sd``: sd of their logs);
- the share of platforms with effects the simulator lacks and their strength
  (:class:`ncclrl.costmodel.platforms.Quirks`), per family (kept at :class:`Draw`'s);
- the family's job noise: one of the fitted :class:`ncclrl.costmodel.noise.JobNoise` of the family's
  measured hosts and grids, drawn per problem.

:data:`FIT` holds the committed fit (``python docs/results/scripts/generator_fit.py`` prints it and
its held-out check). The measured sources (:func:`recorded_sources`, :func:`grid_sources`) and the
optimum of a truth (:class:`Table`) are here too, so that the fit, the tests and the figures compute
them one way.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ncclrl.agents.compose import ComposeProblem, Draw, wide_knobs
from ncclrl.agents.problem import Measure, Oracle, Problem, truth_measure
from ncclrl.costmodel import nccl as N
from ncclrl.costmodel.errors import ConfigError
from ncclrl.costmodel.jobcost import DEFAULT_JOB_COST
from ncclrl.costmodel.noise import JobNoise, pooled_median
from ncclrl.costmodel.platforms import FAMILIES, Quirks, draw_platform, family_of
from ncclrl.costmodel.space import size_grid

#: the draw the generator keeps from :class:`ncclrl.agents.compose.Draw`: collectives, calls per step,
#: sizes, budget and served GPU-time
DRAW = Draw()

#: size bands by upper bound (bytes, inclusive), as :data:`ncclrl.agents.compose.BAND_EDGES`
BANDS = ((64 << 10, "<=64KiB"), (1 << 20, "<=1MiB"), ((64 << 20) - 1, "<64MiB"), (1 << 62, ">=64MiB"))

_PARAMS = ("gain", "gain_sd", "knob_gain", "knob_gain_sd", "misspecified", "strength", "noise")


# -- the fit -------------------------------------------------------------------------------------

@dataclass(frozen=True, eq=False)
class GenFit:
    """The generator's parameters per family (keys: :data:`ncclrl.costmodel.platforms.FAMILIES`).

    :param gain: the per-call configurations' gain scale (module docs); 1: the simulator's own
    :param gain_sd: sd of its log across a family's problems
    :param knob_gain: the knob settings' gain scale
    :param knob_gain_sd: sd of its log across a family's problems
    :param misspecified: share of platforms with :class:`ncclrl.costmodel.platforms.Quirks`
    :param strength: range of the quirks' strength (uniform)
    :param noise: the family's job noises; each problem draws one
    :param source: what the numbers were fitted on
    :param tied: one standard normal draw moves both scales of a problem (else one each)
    """

    gain: Mapping[str, float]
    gain_sd: Mapping[str, float]
    knob_gain: Mapping[str, float]
    knob_gain_sd: Mapping[str, float]
    misspecified: Mapping[str, float]
    strength: Mapping[str, tuple[float, float]]
    noise: Mapping[str, tuple[JobNoise, ...]]
    source: str = ""
    #: one draw moves both scales (a problem's knob gain is its gain times ``knob_gain / gain``)
    tied: bool = False

    def __post_init__(self) -> None:
        for name in _PARAMS:
            d = getattr(self, name)
            missing = [f for f in FAMILIES if f not in d]
            extra = [f for f in d if f not in FAMILIES]
            if missing or extra:
                raise ConfigError(f"generator.{name}", f"needs one entry per family ({', '.join(FAMILIES)}); "
                                  f"missing {missing}, unknown {extra}")
        for f in FAMILIES:
            for name in ("gain", "knob_gain"):
                g = getattr(self, name)[f]
                if not (isinstance(g, int | float) and math.isfinite(g) and g > 0):
                    raise ConfigError(f"generator.{name}.{f}", f"must be a finite number > 0, got {g}")
            for name in ("gain_sd", "knob_gain_sd"):
                s = getattr(self, name)[f]
                if not (isinstance(s, int | float) and math.isfinite(s) and s >= 0):
                    raise ConfigError(f"generator.{name}.{f}", f"must be a finite sd >= 0, got {s}")
            m = self.misspecified[f]
            if not 0 <= m <= 1:
                raise ConfigError(f"generator.misspecified.{f}", f"must be in [0, 1], got {m}")
            lo, hi = self.strength[f]
            if not 0 <= lo <= hi < math.inf:
                raise ConfigError(f"generator.strength.{f}", f"must be a range 0 <= low <= high, got {(lo, hi)}")
            ns = self.noise[f]
            if not ns or not all(isinstance(n, JobNoise) for n in ns):
                raise ConfigError(f"generator.noise.{f}", "needs one JobNoise or more")

    def replace(self, **kw) -> GenFit:
        """The same fit with some families' parameters changed: ``gain={"socket": 0.3}`` and so on."""
        d = {k: dict(getattr(self, k)) for k in _PARAMS}
        for k, v in kw.items():
            if k not in d:
                raise ConfigError(f"generator.{k}", f"unknown parameter; allowed: {', '.join(d)}")
            d[k].update(v)
        return GenFit(**d, source=self.source, tied=self.tied)


def _noise(shift: float, resid: tuple[float, ...], sample: tuple[float, ...], df: float, samples: int,
           source: str) -> JobNoise:
    return JobNoise(shift_sd=shift, resid_sds=resid, sample_sds=sample, resid_df=df, fit_samples=samples,
                    source=source)


#: the committed fit (docs/results/generator.md: ``python docs/results/scripts/generator_fit.py``,
#: 400 problems per family, stream 777): one gain for per-call configurations and knob settings
#: alike (``tied``), fitted on the recorded H200 hosts (1x4 NVLink; 2x2, 2x1 and 4x1 sockets; the
#: recordings of data/h200x4-2026-11-28/knobs included) and the six public grids; each family's
#: gain the geometric mean of its sources' own, its sd the sd of their logs. Quirks as
#: :class:`Draw`'s. Job noise: the shipped fits of the H200 hosts (``conf/noise/job_noise.yaml``),
#: the 4x1 host's fitted on its repeated jobs, and the public grids' own repeated runs (their fit's
#: numbers here: the grids are not in the repository).
FIT = GenFit(
    gain={"nvlink": 0.516, "infiniband": 1.667, "socket": 0.989},
    gain_sd={"nvlink": 0.336, "infiniband": 0.834, "socket": 0.52},
    knob_gain={"nvlink": 0.516, "infiniband": 1.667, "socket": 0.989},
    knob_gain_sd={"nvlink": 0.336, "infiniband": 0.834, "socket": 0.52},
    misspecified={f: DRAW.misspecified for f in FAMILIES},
    strength={f: DRAW.strength for f in FAMILIES},
    noise={
        "nvlink": (JobNoise.load("h200-1x4/torch"),
                   _noise(0.0379, (0.0378, 0.0378, 0.0378, 0.0378, 0.0198, 0.0172, 0.0172), (0.0,) * 7, math.inf, 1,
                          "a100-1x8-step: its own repeated runs")),
        "infiniband": (
            _noise(0.0047, (0.2517, 0.2517, 0.2517, 0.0985, 0.0272, 0.0108, 0.0029),
                   (0.0193, 0.0193, 0.0193, 0.0125, 0.0052, 0.0028, 0.001), 2.05, 2, "p5en-2n: its own repeated runs"),
            _noise(0.0054, (0.2186, 0.2186, 0.2186, 0.1004, 0.0579, 0.0262, 0.0124),
                   (0.125, 0.125, 0.125, 0.016, 0.0079, 0.0048, 0.0015), 2.05, 2, "p5en-16n: its own repeated runs"),
            _noise(0.0, (0.1659, 0.1659, 0.1659, 0.0833, 0.0431, 0.0326, 0.0117),
                   (0.019, 0.019, 0.019, 0.0189, 0.0149, 0.0064, 0.002), 2.05, 2, "p5en-128n: its own repeated runs")),
        "socket": (JobNoise.load("h200-2x2-sock/nccl"), JobNoise.load("h200-2x1-sock/nccl"),
                   _noise(0.0, (0.077, 0.0489, 0.0465, 0.0751, 0.0873, 0.1257, 0.1257),
                          (0.0456, 0.0406, 0.0386, 0.0553, 0.0475, 0.0614, 0.0614), math.inf, 5,
                          "h200 4x1 sockets: fitted on its repeated jobs")),
    },
    source="generator_fit.py --mechanism preregistered (2026-11-28)",
    tied=True,
)


# -- the truth's optimum -------------------------------------------------------------------------

def _scale(t: np.ndarray, own: np.ndarray, ref: np.ndarray, gain: float, knob_gain: float) -> np.ndarray:
    """Times ``t`` under a knob setting whose NCCL's choice takes ``own`` (inf: it cannot run;
    ``ref`` then anchors its points), NCCL's defaults' ``ref``, with both gains scaled (module docs)."""
    with np.errstate(invalid="ignore", divide="ignore"):
        anchor = np.where(np.isfinite(own), np.log(own), np.log(ref))
        top = np.log(ref) + knob_gain * (anchor - np.log(ref))
        lt = np.log(t)
        return np.where(np.isfinite(lt), np.exp(top + gain * (lt - anchor)), np.inf)


def calibrated_times(problem: Problem, times: Mapping[tuple[tuple[int, ...], int], np.ndarray], gain: float,
                     knob_gain: float) -> dict[tuple[tuple[int, ...], int], np.ndarray]:
    """Every point's time with its gains scaled (module docs); a point that cannot run stays
    infinitely slow. ``times``: per (knobs, collective), ``[configuration, size]`` with NCCL's choice first."""
    out = {}
    for (kn, c), t in times.items():
        out[(kn, c)] = _scale(t, t[0][None, :], times[(problem.base.knobs, c)][0][None, :], gain, knob_gain)
    return out


@dataclass
class Table:
    """A truth reduced to what its optimum needs, per knob setting (NCCL's defaults first) and size:
    the fastest point's time (``best``), NCCL's choice's (``own``, inf where it cannot run), the sizes."""

    best: np.ndarray
    own: np.ndarray
    nbytes: np.ndarray

    @classmethod
    def of(cls, problem: Problem, times: Mapping[tuple[tuple[int, ...], int], np.ndarray]) -> Table:
        """Of a problem's truth (every cell, :meth:`Problem.cells` order)."""
        best = np.array([np.concatenate([np.min(times[(k.knobs, c)], axis=0) for c in problem.colls])
                         for k in problem.knobs])
        own = np.array([np.concatenate([times[(k.knobs, c)][0] for c in problem.colls]) for k in problem.knobs])
        nbytes = np.array([s for c in problem.colls for s in problem.sizes[c]], dtype=np.int64)
        return cls(best, own, nbytes)

    @property
    def nccl(self) -> np.ndarray:
        return self.own[0]

    def scaled(self, gain: float, knob_gain: float) -> Table:
        """:func:`calibrated_times` on the table (both scales are monotone per knob setting and size,
        so the fastest point stays the fastest)."""
        ref = self.own[:1]
        return Table(_scale(self.best, self.own, ref, gain, knob_gain),
                     _scale(self.own, self.own, ref, gain, knob_gain), self.nbytes)

    def within(self, lo: int, hi: int) -> Table:
        at = (self.nbytes >= lo) & (self.nbytes <= hi)
        return Table(self.best[:, at], self.own[:, at], self.nbytes[at])

    def _totals(self, calls: np.ndarray | None) -> np.ndarray:
        w = np.ones(len(self.nbytes)) if calls is None else np.asarray(calls, dtype=float)
        with np.errstate(invalid="ignore"):
            return np.array([float(np.dot(w, r)) if np.isfinite(r).all() else np.inf for r in self.best])

    def optimum(self, calls: np.ndarray | None = None, knobs: bool = True) -> float:
        """Fraction of the step's communication time (``sum calls x time``; ``calls`` ``None``: one
        call per size) the best table saves over NCCL's defaults, under the best knob setting
        (``knobs=False``: NCCL's default knobs only)."""
        if not len(self.nbytes):
            return 0.0
        w = np.ones(len(self.nbytes)) if calls is None else np.asarray(calls, dtype=float)
        tot = self._totals(w)
        return max(0.0, 1.0 - float(np.min(tot if knobs else tot[:1])) / float(np.dot(w, self.nccl)))

    def mean_saving(self, knobs: bool = True) -> float:
        """The mean over sizes of each size's fractional saving, under the knob setting where that mean
        is largest (``knobs=False``: NCCL's default knobs only): every size counts alike, whatever its time."""
        rows = self.best if knobs else self.best[:1]
        with np.errstate(invalid="ignore"):
            v = [float(np.mean(1.0 - r / self.nccl)) for r in rows if np.isfinite(r).all()]
        return max(0.0, max(v)) if v and len(self.nbytes) else 0.0

    def band_shares(self, calls: np.ndarray | None = None) -> np.ndarray:
        """Each size band's share of the optimum's saving (under its best knob setting; sums to 1
        where there is a saving)."""
        w = np.ones(len(self.nbytes)) if calls is None else np.asarray(calls, dtype=float)
        save = w * (self.nccl - self.best[int(np.argmin(self._totals(w)))])
        b = np.searchsorted(np.array([e for e, _ in BANDS]), self.nbytes, side="left")
        out = np.array([save[b == i].sum() for i in range(len(BANDS))])
        return out / save.sum() if save.sum() > 0 else np.zeros(len(BANDS))


def calls_vector(rng: np.random.Generator, sigma: float = DRAW.calls_sigma) -> np.ndarray:
    """Calls per step per power of two of bytes (index: log2 bytes, 0-40), lognormal of sd ``sigma``
    independently per size as :func:`ncclrl.agents.compose.draw_full` draws them; one vector can be
    applied to any problem (:func:`calls_at`), measured or generated."""
    return np.exp(sigma * rng.standard_normal(41))


def calls_at(vector: np.ndarray, nbytes: np.ndarray) -> np.ndarray:
    """A :func:`calls_vector`'s calls at each size (its nearest power of two)."""
    i = np.clip(np.rint(np.log2(np.maximum(np.asarray(nbytes, dtype=float), 1.0))).astype(int), 0, len(vector) - 1)
    return vector[i]


# -- the generated problem ------------------------------------------------------------------------

@dataclass
class GenProblem:
    """One calibrated problem (module docs)."""

    problem: Problem
    oracle: Oracle
    noise: JobNoise
    calls: np.ndarray
    budget_gpu_s: float
    serve_gpu_s: float
    name: str
    family: str
    #: the gain scales this problem's truth was drawn with (per-call configurations, knob settings)
    gains: tuple[float, float] = (1.0, 1.0)
    #: the seed stream of this problem's jobs (each :meth:`measure` seed is a stream within it)
    noise_seed: int = 0
    _recorded: dict | None = field(default=None, repr=False)
    _truth: dict | None = field(default=None, repr=False)

    def recorded(self) -> dict:
        """Every point the truth can run, as a recording of one job of one sample at its expected time."""
        if self._recorded is None:
            rec = {}
            p = self.problem
            for k in p.knobs:
                for c in p.colls:
                    keys, t = p.space(c, k), self.oracle.times[(k.knobs, c)]
                    for j, key in enumerate(keys):
                        for i, s in enumerate(p.sizes[c]):
                            if np.isfinite(t[j, i]):
                                rec[(k.knobs, c, s, key)] = [[float(t[j, i])]]
            self._recorded = rec
        return self._recorded

    def measure(self, seed: int) -> Measure:
        """Fresh jobs around the truth with :attr:`noise` (:func:`ncclrl.agents.problem.replay_measure`),
        one independent noise stream per seed and per problem."""
        if self._truth is None:  # each point's expected median, once per problem
            self._truth = {x: pooled_median(v) for x, v in self.recorded().items() if v}
        return truth_measure(self._truth, np.random.default_rng([self.noise_seed, int(seed)]), self.noise)

    def compose(self) -> ComposeProblem:
        """The problem as :class:`ncclrl.agents.compose.ComposeProblem` (budget and served GPU-time set)."""
        return ComposeProblem.from_problem(self.problem, self.oracle, self.noise, self.budget_gpu_s, self.serve_gpu_s,
                                           self.calls, self.name, self.family)

    def table(self) -> Table:
        return Table.of(self.problem, self.oracle.times)

    def optimum(self) -> float:
        """Fraction of the step's communication time (calls-weighted) the best table and knob setting save."""
        return self.table().optimum(self.calls)


def _families(families: Sequence[str] | None) -> tuple[str, ...]:
    fams = tuple(FAMILIES) if families is None else tuple(families)
    if not fams:
        raise ConfigError("families", "name one family or more")
    for f in fams:
        if f not in FAMILIES:
            raise ConfigError("families", f"unknown family {f!r}; allowed: {', '.join(FAMILIES)}")
    return fams


def draw_raw(rng: np.random.Generator, fit: GenFit | None = None, families: Sequence[str] | None = None
             ) -> tuple[Problem, Oracle, np.ndarray, str, str]:
    """The uncalibrated part of a draw, in :func:`ncclrl.agents.compose.draw_full`'s order: a preset
    of ``families``, its platform (with quirks at the family's share and strength), a collective,
    calls per step. ``(problem, oracle of the simulated truth, calls, name, family)``."""
    fit = FIT if fit is None else fit
    presets = [p for f in _families(families) for p in FAMILIES[f]]
    preset = presets[int(rng.integers(len(presets)))]
    fam = family_of(preset)
    mis = bool(rng.random() < fit.misspecified[fam])
    plat = draw_platform(preset, rng, False)
    if mis:
        plat.quirks = Quirks(int(rng.integers(1 << 31)), float(rng.uniform(*fit.strength[fam])))
    coll = N.COLLECTIVES.index(DRAW.collectives[int(rng.integers(len(DRAW.collectives)))])
    sizes = size_grid(DRAW.min_bytes, DRAW.max_bytes, plat.topo.nranks, coll)
    calls = np.exp(DRAW.calls_sigma * rng.standard_normal(len(sizes)))
    problem = Problem(plat.topo, [coll], {coll: sizes}, wide_knobs(plat.topo),
                      weights={(coll, s): float(w) for s, w in zip(sizes, calls, strict=True)})
    return problem, Oracle(problem, plat), calls, f"{preset}/{N.COLLECTIVES[coll]}/{'mis' if mis else 'nom'}", fam


def draw_calibrated(rng: np.random.Generator, fit: GenFit = FIT, families: Sequence[str] | None = None) -> GenProblem:
    """One calibrated problem: :func:`draw_raw`, its truth's gains scaled by the family's (each drawn
    around ``fit``'s with its sd), one of the family's job noises, a budget of 0.25-1 sweep of
    GPU-time and a served GPU-time of 3-300 sweeps (log-uniform), as ``Draw`` draws them."""
    problem, raw, calls, name, fam = draw_raw(rng, fit, families)
    z = rng.standard_normal(2)
    gains = (float(fit.gain[fam] * np.exp(fit.gain_sd[fam] * z[0])),
             float(fit.knob_gain[fam] * np.exp(fit.knob_gain_sd[fam] * z[0 if fit.tied else 1])))
    oracle = Oracle(problem, times=calibrated_times(problem, raw.times, *gains))
    noises = fit.noise[fam]
    noise = noises[int(rng.integers(len(noises)))]
    sweep = oracle.sweep_gpu_s(DEFAULT_JOB_COST, 5)
    budget = sweep * float(rng.uniform(*DRAW.budget))
    serve = sweep * float(np.exp(rng.uniform(*np.log(DRAW.horizon))))
    return GenProblem(problem, oracle, noise, calls, budget, serve, name, fam, gains, int(rng.integers(1 << 62)))


def calibrated_problems(n: int, stream: int, fit: GenFit = FIT) -> list[GenProblem]:
    """``n`` problems, problem ``i`` from ``default_rng([stream, i])``."""
    return [draw_calibrated(np.random.default_rng([stream, i]), fit) for i in range(n)]


# -- fitting ----------------------------------------------------------------------------------------

#: the seed stream of the common calls vectors (:func:`calls_vector`) of the fit and its figures
CALLS_STREAM = 20261128
#: how many common calls vectors
N_CALLS = 64


def common_calls(n: int = N_CALLS) -> list[np.ndarray]:
    """The calls vectors the fit and its figures apply to measured and generated problems alike."""
    return [calls_vector(np.random.default_rng([CALLS_STREAM, j])) for j in range(n)]


@dataclass(frozen=True)
class View:
    """What a measured source covers, to compare a generated problem with it like for like: its
    sizes (``lo`` to ``hi`` bytes) and whether it measured knob settings beside NCCL's defaults."""

    knobs: bool = True
    lo: int = 0
    hi: int = 1 << 62


@dataclass
class Sample:
    """Uncalibrated problems of one family (:func:`draw_raw`) as :class:`Table`, with each problem's
    standard normal draws of its two gains and its calls vector (``i mod`` the vectors)."""

    tables: list[Table]
    z: np.ndarray
    weights: list[np.ndarray]

    @classmethod
    def draw(cls, family: str, n: int, stream: int, fit: GenFit | None = None,
             vectors: Sequence[np.ndarray] | None = None) -> Sample:
        vectors = common_calls() if vectors is None else vectors
        tables, z = [], np.random.default_rng([stream, 1 << 20]).standard_normal((n, 2))
        for i in range(n):
            problem, oracle, *_ = draw_raw(np.random.default_rng([stream, i]), fit, [family])
            tables.append(Table.of(problem, oracle.times))
        return cls(tables, z, [calls_at(vectors[i % len(vectors)], t.nbytes) for i, t in enumerate(tables)])

    def scaled(self, gain: float, gain_sd: float, knob_gain: float, knob_gain_sd: float,
               tied: bool = False) -> list[Table]:
        """Each problem's table with its gains drawn around ``gain`` and ``knob_gain`` with their sds
        (``tied``: one draw moves both)."""
        g = gain * np.exp(gain_sd * self.z[:, 0])
        k = knob_gain * np.exp(knob_gain_sd * self.z[:, 0 if tied else 1])
        return [t.scaled(a, b) for t, a, b in zip(self.tables, g, k, strict=True)]

    def optima(self, gains: Sequence[float], calls: bool = True, view: View | None = None,
               tied: bool = False) -> np.ndarray:
        """Each problem's optimum with ``gains`` (gain, its sd, knob gain, its sd) as ``view`` sees it
        (default: every size and knob setting), calls-weighted or one call per size."""
        view = view or View()
        out = []
        for t, w in zip(self.scaled(*gains, tied=tied), self.weights, strict=True):
            at = (t.nbytes >= view.lo) & (t.nbytes <= view.hi)
            out.append(t.within(view.lo, view.hi).optimum(w[at] if calls else None, view.knobs))
        return np.array(out)


def _bisect(f, target: float, lo: float = 1e-3, hi: float = 4.0) -> float:
    """The x in [lo, hi] (bisection in log x) where the increasing ``f(x)`` reaches ``target``."""
    a, b = math.log(lo), math.log(hi)
    for _ in range(30):
        m = (a + b) / 2
        if f(math.exp(m)) < target:
            a = m
        else:
            b = m
    return math.exp((a + b) / 2)


def fit_source(sample: Sample, view: View, optimum: float, default_knobs_optimum: float) -> tuple[float, float | None]:
    """One source's own gains (docs/explanation/generator.md): the per-call gain at which the
    sample's median calls-weighted optimum under NCCL's default knobs, in the source's sizes, is the
    source's; then, where the source measured knob settings, the knob gain at which the median
    optimum in its view is its optimum (``None`` where it did not)."""
    plain = View(False, view.lo, view.hi)
    gain = _bisect(lambda g: float(np.median(sample.optima((g, 0.0, 1.0, 0.0), view=plain))),
                   default_knobs_optimum)
    if not view.knobs:
        return gain, None
    return gain, _bisect(lambda k: float(np.median(sample.optima((gain, 0.0, k, 0.0), view=view))), optimum)


def family_gains(own: Sequence[tuple[float, float | None]]) -> tuple[float, float, float, float]:
    """A family's ``(gain, gain_sd, knob_gain, knob_gain_sd)`` from its sources' own gains: the median
    and the sd of the logs (0 with one source); a family with no knob gain measured gets its per-call
    gain and sd for the knob settings too."""
    def med_sd(v):
        logs = np.log(v)
        return float(np.exp(np.median(logs))), float(logs.std(ddof=1)) if len(v) > 1 else 0.0
    g, gs = med_sd([a for a, _ in own])
    ks = [b for _, b in own if b is not None]
    k, kss = med_sd(ks) if ks else (g, gs)
    return g, gs, k, kss


# -- measured sources ------------------------------------------------------------------------------

ROOT = Path(__file__).resolve().parents[1]
#: NCCL's default knobs in a recording's or grid's point keys
BASE = (0, 0, 0, 0, 0)


def recorded_tables(recorded: Mapping[tuple, list[list[float]]]) -> list[Table]:
    """Per collective of a recording or grid (points ``(knobs, collective, nbytes, key)`` -> each
    job's samples), the :class:`Table` of its truth (each point's pooled median over its jobs),
    at the sizes within the generator's range where NCCL's defaults were measured; a knob setting
    missing a size cannot be the table's there (infinitely slow)."""
    from ncclrl.costmodel.noise import pooled_median
    from ncclrl.costmodel.space import DEFAULT

    truth = {x: pooled_median(v) for x, v in recorded.items() if v}
    out = []
    for c in sorted({x[1] for x in truth}):
        base = {x[2]: t for x, t in truth.items() if x[1] == c and x[0] == BASE and x[3] == DEFAULT}
        sizes = sorted(s for s, t in base.items() if DRAW.min_bytes <= s <= DRAW.max_bytes and np.isfinite(t))
        if not sizes:
            continue
        knobs = [BASE, *sorted({x[0] for x in truth if x[1] == c and x[0] != BASE})]
        ki, si = {k: i for i, k in enumerate(knobs)}, {s: i for i, s in enumerate(sizes)}
        best = np.full((len(knobs), len(sizes)), np.inf)
        own = np.full((len(knobs), len(sizes)), np.inf)
        for x, t in truth.items():
            if x[1] == c and x[2] in si and np.isfinite(t):
                best[ki[x[0]], si[x[2]]] = min(best[ki[x[0]], si[x[2]]], t)
                if x[3] == DEFAULT:
                    own[ki[x[0]], si[x[2]]] = t
        out.append(Table(best, own, np.array(sizes, dtype=np.int64)))
    return out


@dataclass
class Source:
    """One measured communicator shape on one machine (docs/explanation/generator.md).

    :param name: what it is
    :param family: its platform family
    :param kind: ``recorded`` (a host's recording in this repository) or ``grid`` (a public grid)
    :param parts: per recording of it, :func:`recorded_tables` (one entry per collective)
    :param depth: per recording, the median number of jobs a point was measured in
    :param noise: its fitted job noise (``None``: none of its own)
    :param noise_source: where that comes from
    """

    name: str
    family: str
    kind: str
    parts: list[list[Table]]
    depth: list[float]
    noise: JobNoise | None = None
    noise_source: str = ""

    @property
    def view(self) -> View:
        """What it covers: its sizes, and knob settings if any recording has more than NCCL's defaults."""
        nb = np.concatenate([t.nbytes for part in self.parts for t in part])
        return View(any(t.best.shape[0] > 1 for part in self.parts for t in part), int(nb.min()), int(nb.max()))

    def figure(self, fn) -> float:
        """The source's figure of ``fn(table) -> float`` (or a list of floats: their median): the
        median over its recordings of each recording's median over its collectives."""
        return float(np.median([np.median([np.median(fn(t)) for t in part]) for part in self.parts]))


#: the recorded hosts: name, family, preset, recordings (store relative to the repository, ``""``: the
#: recording that ships, ``envs/recordings``; launch; the tags of its sweep)
RECORDED: tuple[tuple[str, str, str, tuple[tuple[str, str, tuple[str, ...]], ...]], ...] = (
    ("h200 1x4 NVLink", "nvlink", "h200-1x4", (("data/h200x4-2026-11-21/store.sqlite", "torch", ("sweep",)),
                                               ("data/h200x4-2026-11-28/knobs/1x4.sqlite", "nccl", ("sweep-repeat",)))),
    ("h200 2x2 sockets", "socket", "h200-2x2-sock", (("", "nccl", ("sweep", "sweep-repeat")),
                                                     ("data/h200x4-2026-11-28/knobs/2x2.sqlite", "nccl",
                                                      ("sweep-repeat",)))),
    ("h200 2x1 sockets", "socket", "h200-2x1-sock", (("data/h200x2-2026-11-22/store.sqlite", "nccl", ("sweep",)),)),
    ("h200 4x1 sockets", "socket", "h200-4x1-sock", (("data/h200x4-2026-11-28/knobs/4x1.sqlite", "nccl",
                                                      ("sweep-repeat",)),)),
)


def _store_recorded(path: str, preset: str, launch: str, tags: tuple[str, ...]):
    """A store's sweep of ``preset``: its rows (with a ``job`` column) and its points' jobs."""
    from ncclrl.costmodel.space import KNOB_FIELDS
    from ncclrl.costmodel.topology import load_topology
    from ncclrl.envs.replay import recorded_sweep, shipped_recording
    from ncclrl.envs.store import job_ids

    topo = load_topology(preset)
    frame = recorded_sweep(path or shipped_recording(preset), topo, launch, tags, status="ok")
    frame = frame.assign(job=job_ids(frame))
    rec: dict[tuple, list[list[float]]] = {}
    for r in frame.itertuples(index=False):
        kn = tuple(int(getattr(r, f)) for f in KNOB_FIELDS)
        rec.setdefault((kn, N.COLLECTIVES.index(r.collective), int(r.nbytes), (r.algo, r.proto, int(r.channels))),
                       []).append(list(r.samples_us))
    return frame, rec


def _store_noise(frame, name: str) -> JobNoise | None:
    """The job noise fitted on a store's repeated jobs of each knob setting (``None``: none repeated)."""
    from ncclrl.costmodel.noise import fit
    from ncclrl.costmodel.space import KNOB_FIELDS

    f = frame.assign(group=[tuple(int(getattr(r, k)) for k in KNOB_FIELDS) + (r.collective,)
                            for r in frame.itertuples(index=False)],
                     point=list(zip(frame.algo, frame.proto, frame.channels, strict=True)))
    try:
        return fit(f[["group", "job", "point", "nbytes", "samples_us"]], min_points=3, source=name).noise
    except ConfigError:
        return None


def recorded_sources(extra: Sequence = ()) -> list[Source]:
    """The recorded hosts of :data:`RECORDED` (and ``extra`` entries of its form). Job noise: the
    shipped fit for the host and its first recording's launch (``conf/noise/job_noise.yaml``), else
    one fitted on its recordings' repeated jobs."""
    from ncclrl.costmodel.noise import load_fits

    fits = load_fits()
    out = []
    for name, family, preset, recs in (*RECORDED, *extra):
        parts, depth, frames = [], [], []
        for path, launch, tags in recs:
            frame, rec = _store_recorded(str(ROOT / path) if path else "", preset, launch, tags)
            parts.append(recorded_tables(rec))
            depth.append(float(np.median([len(v) for v in rec.values()])))
            frames.append(frame)
        key = f"{preset}/{recs[0][1]}"
        if key in fits:
            noise, src = JobNoise.load(key), f"the shipped fit {key}"
        else:
            noise = next((n for n in (_store_noise(f, f"{name}: fitted on its repeated jobs") for f in frames)
                          if n is not None), None)
            src = "fitted on its repeated jobs" if noise is not None else ""
        out.append(Source(name, family, "recorded", parts, depth, noise, src))
    return out


def grid_sources(root: str | Path | None = None) -> list[Source]:
    """The public grids (:data:`ncclrl.envs.grids.PUBLIC_GRIDS`), read from the shared data folder;
    job noise: the grid's own repeated runs (:func:`ncclrl.agents.suite.grid_noise`), else none."""
    from ncclrl.agents.suite import grid_noise
    from ncclrl.costmodel.topology import load_topology
    from ncclrl.envs.grids import PUBLIC_GRIDS, read_public_grid

    out = []
    for name, g in PUBLIC_GRIDS.items():
        grid = read_public_grid(name, load_topology(g.topology), root)
        noise = grid_noise(grid, f"{name}: its own repeated runs")
        out.append(Source(name, g.family, "grid", [recorded_tables(grid.recorded)],
                          [float(np.median([len(v) for v in grid.recorded.values()]))], noise,
                          "its own repeated runs" if noise is not None else ""))
    return out
