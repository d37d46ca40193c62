"""A problem generator calibrated on measured hosts and grids.

The simulated training problems (:func:`ncclrl.agents.compose.draw_full`) promise more than the
measured ones give: the best table and knob setting saves a median 45% of the step's communication
time over NCCL's defaults in simulation (83% on socket platforms) against 46% on the recorded
2 nodes x 2 GPUs socket host and 6-18% on the public grids. This module draws the same problems
(platform, collective, calls per step, budget, served GPU-time, as :func:`draw_full` draws them)
and then calibrates each problem's truth per platform family (docs/explanation/generator.md):

- a gain scale ``gain`` (lambda) per family, applied to every point of the truth, every knob setting
  included: ``log t' = log t_nccl(size) + lambda (log t - log t_nccl(size))``, ``t_nccl`` NCCL's
  choice under NCCL's default knobs at that size; lambda < 1 shrinks every gain and every loss over
  NCCL's defaults alike, so which configuration is best at a size does not change, only by how much;
- the share of platforms with effects the simulator lacks and their strength
  (:class:`ncclrl.costmodel.platforms.Quirks`), per family;
- the family's job noise: one of the fitted :class:`ncclrl.costmodel.noise.JobNoise` of the family's
  measured hosts and grids, drawn per problem.

The figures the fit rests on, and its held-out check, are in docs/results/generator.md
(``python docs/results/scripts/generator_fit.py``). :data:`FIT` holds the committed fit.

The measured sources (:func:`recorded_sources`, :func:`grid_sources`) and the optimum of a truth under
calls per step (:func:`best_per_knob`, :func:`optimum_of`) are here too, so that the fit, the tests and
the figures compute them one way.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ncclrl.agents.compose import ComposeProblem, Draw, wide_knobs
from ncclrl.agents.problem import Measure, Oracle, Problem, replay_measure
from ncclrl.costmodel import nccl as N
from ncclrl.costmodel.errors import ConfigError
from ncclrl.costmodel.jobcost import DEFAULT_JOB_COST
from ncclrl.costmodel.noise import JobNoise
from ncclrl.costmodel.platforms import FAMILIES, Quirks, draw_platform, family_of
from ncclrl.costmodel.space import size_grid

#: the draw the generator keeps from :class:`ncclrl.agents.compose.Draw`: collectives, calls per step,
#: sizes, budget and served GPU-time
DRAW = Draw()

#: size bands by upper bound (bytes, inclusive), as :data:`ncclrl.agents.compose.BAND_EDGES`
BANDS = ((64 << 10, "<=64KiB"), (1 << 20, "<=1MiB"), ((64 << 20) - 1, "<64MiB"), (1 << 62, ">=64MiB"))


# -- the fit -------------------------------------------------------------------------------------

def _noise(shift: float, resid: Sequence[float], sample: Sequence[float], df: float, source: str) -> JobNoise:
    return JobNoise(shift_sd=shift, resid_sds=tuple(resid), sample_sds=tuple(sample), resid_df=df, source=source)


@dataclass(frozen=True, eq=False)
class GenFit:
    """The generator's parameters per family (keys: :data:`ncclrl.costmodel.platforms.FAMILIES`).

    :param gain: lambda, the gain scale of the truth (module docs); 1: the simulator's own gains
    :param gain_sd: sd of log lambda across a family's problems (0: every problem at ``gain``)
    :param misspecified: share of platforms with :class:`ncclrl.costmodel.platforms.Quirks`
    :param strength: range of the quirks' strength (uniform)
    :param noise: the family's job noises; each problem draws one
    :param source: what the numbers were fitted on
    """

    gain: Mapping[str, float]
    gain_sd: Mapping[str, float]
    misspecified: Mapping[str, float]
    strength: Mapping[str, tuple[float, float]]
    noise: Mapping[str, tuple[JobNoise, ...]]
    source: str = ""

    def __post_init__(self) -> None:
        for name in ("gain", "gain_sd", "misspecified", "strength", "noise"):
            d = getattr(self, name)
            missing = [f for f in FAMILIES if f not in d]
            extra = [f for f in d if f not in FAMILIES]
            if missing or extra:
                raise ConfigError(f"generator.{name}", f"needs one entry per family ({', '.join(FAMILIES)}); "
                                  f"missing {missing}, unknown {extra}")
        for f in FAMILIES:
            g, s, m = self.gain[f], self.gain_sd[f], self.misspecified[f]
            if not (math.isfinite(g) and g > 0):
                raise ConfigError(f"generator.gain.{f}", f"must be a finite number > 0, got {g}")
            if not (math.isfinite(s) and s >= 0):
                raise ConfigError(f"generator.gain_sd.{f}", f"must be a finite sd >= 0, got {s}")
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
        d = {k: dict(getattr(self, k)) for k in ("gain", "gain_sd", "misspecified", "strength", "noise")}
        for k, v in kw.items():
            if k not in d:
                raise ConfigError(f"generator.{k}", f"unknown parameter; allowed: {', '.join(d)}")
            d[k].update(v)
        return GenFit(**d, source=self.source)


def _host_noise(name: str) -> JobNoise:
    return JobNoise.load(name)


#: the committed fit. PROVISIONAL: gains set by hand from a first look at the measured optima, not
#: yet fitted (docs/explanation/generator.md says how the fit is made and checked).
FIT = GenFit(
    gain={"nvlink": 0.3, "infiniband": 0.5, "socket": 0.4},
    gain_sd={"nvlink": 0.0, "infiniband": 0.0, "socket": 0.0},
    misspecified={f: DRAW.misspecified for f in FAMILIES},
    strength={f: DRAW.strength for f in FAMILIES},
    noise={"nvlink": (_host_noise("h200-1x4/nccl"), _host_noise("h200-1x4/torch")),
           "infiniband": (_host_noise("pooled"),),
           "socket": (_host_noise("h200-2x2-sock/nccl"), _host_noise("h200-2x1-sock/nccl"))},
    source="provisional: gains set by hand, not fitted",
)


# -- the truth's optimum -------------------------------------------------------------------------

def calibrated_times(problem: Problem, times: Mapping[tuple[tuple[int, ...], int], np.ndarray],
                     gain: float) -> dict[tuple[tuple[int, ...], int], np.ndarray]:
    """Every point's time with its log gain over NCCL's choice under NCCL's defaults (at its size)
    scaled by ``gain`` (module docs); a point that cannot run stays infinitely slow."""
    out = {}
    for (kn, c), t in times.items():
        ref = np.log(times[(problem.base.knobs, c)][0])
        with np.errstate(invalid="ignore", divide="ignore"):
            lt = np.log(t)
            out[(kn, c)] = np.where(np.isfinite(lt), np.exp(ref + gain * (lt - ref)), np.inf)
    return out


def best_per_knob(problem: Problem, times: Mapping[tuple[tuple[int, ...], int], np.ndarray]
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per knob setting and cell (:meth:`Problem.cells` order), the fastest point's time; NCCL's
    defaults' time per cell; each cell's bytes. ``(best [knobs, cells], nccl [cells], nbytes [cells])``."""
    best = np.array([np.concatenate([np.min(times[(k.knobs, c)], axis=0) for c in problem.colls])
                     for k in problem.knobs])
    nccl = np.concatenate([times[(problem.base.knobs, c)][0] for c in problem.colls])
    nbytes = np.array([s for c in problem.colls for s in problem.sizes[c]], dtype=np.int64)
    return best, nccl, nbytes


def scaled(best: np.ndarray, nccl: np.ndarray, gain: float) -> np.ndarray:
    """:func:`calibrated_times` on the output of :func:`best_per_knob` (the scale is monotone per
    size, so the fastest point stays the fastest)."""
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(np.isfinite(best), nccl * np.exp(gain * np.log(best / nccl)), np.inf)


def optimum_of(best: np.ndarray, nccl: np.ndarray, calls: np.ndarray | None = None, knobs: bool = True) -> float:
    """Fraction of the step's communication time (``sum calls x time``; ``calls`` ``None``: one
    call per size) the best table saves over NCCL's defaults, under the best knob setting
    (``knobs=False``: NCCL's default knobs only)."""
    w = np.ones(len(nccl)) if calls is None else np.asarray(calls, dtype=float)
    rows = best if knobs else best[:1]
    base = float(np.dot(w, nccl))
    return max(0.0, max(1.0 - float(np.dot(w, np.where(np.isfinite(r), r, np.inf))) / base for r in rows))


def band_of_bytes(nbytes: np.ndarray) -> np.ndarray:
    return np.searchsorted(np.array([b for b, _ in BANDS]), np.asarray(nbytes), side="left")


def band_shares(best: np.ndarray, nccl: np.ndarray, nbytes: np.ndarray, calls: np.ndarray | None = None) -> np.ndarray:
    """Each size band's share of the optimum's saving (under its best knob setting; sums to 1 where
    there is a saving)."""
    w = np.ones(len(nccl)) if calls is None else np.asarray(calls, dtype=float)
    k = int(np.argmax([-np.dot(w, np.where(np.isfinite(r), r, np.inf)) for r in best]))
    save = w * (nccl - best[k])
    b = band_of_bytes(nbytes)
    out = np.array([save[b == i].sum() for i in range(len(BANDS))])
    tot = save.sum()
    return out / tot if tot > 0 else np.zeros(len(BANDS))


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
    #: the gain scale this problem's truth was drawn with
    gain: float = 1.0
    #: the seed stream of this problem's jobs (each :meth:`measure` seed is a stream within it)
    noise_seed: int = 0
    _recorded: dict | None = field(default=None, repr=False)

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
        """Fresh jobs around the truth with :attr:`noise`
        (:func:`ncclrl.agents.problem.replay_measure`), one independent noise stream per seed and per problem."""
        return replay_measure(self.recorded(), np.random.default_rng([self.noise_seed, int(seed)]), self.noise)

    def compose(self) -> ComposeProblem:
        """The problem as :class:`ncclrl.agents.compose.ComposeProblem` (budget and served GPU-time set)."""
        return ComposeProblem.from_problem(self.problem, self.oracle, self.noise, self.budget_gpu_s, self.serve_gpu_s,
                                           self.calls, self.name, self.family)

    def optimum(self) -> float:
        """Fraction of the step's communication time (calls-weighted) the best table and knob setting save."""
        best, nccl, _ = best_per_knob(self.problem, self.oracle.times)
        return optimum_of(best, nccl, self.calls)


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
    """One calibrated problem: :func:`draw_raw`, its truth scaled by the family's gain (drawn around
    ``fit.gain`` with ``fit.gain_sd``), one of the family's job noises, a budget of 0.25-1 sweep of
    GPU-time and a served GPU-time of 3-300 sweeps (log-uniform), as ``Draw`` draws them."""
    problem, raw, calls, name, fam = draw_raw(rng, fit, families)
    gain = float(fit.gain[fam] * np.exp(fit.gain_sd[fam] * rng.standard_normal()))
    oracle = Oracle(problem, times=calibrated_times(problem, raw.times, gain))
    noises = fit.noise[fam]
    noise = noises[int(rng.integers(len(noises)))]
    sweep = oracle.sweep_gpu_s(DEFAULT_JOB_COST, 5)
    budget = sweep * float(rng.uniform(*DRAW.budget))
    serve = sweep * float(np.exp(rng.uniform(*np.log(DRAW.horizon))))
    return GenProblem(problem, oracle, noise, calls, budget, serve, name, fam, gain, int(rng.integers(1 << 62)))


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
    """Uncalibrated problems of one family (:func:`draw_raw`), as :func:`best_per_knob` tables, with
    each problem's standard normal draw of its gain and its calls vector (``i mod`` the vectors)."""

    tables: list[tuple[np.ndarray, np.ndarray, np.ndarray]]
    z: np.ndarray
    weights: list[np.ndarray]

    @classmethod
    def draw(cls, family: str, n: int, stream: int, fit: GenFit | None = None,
             vectors: Sequence[np.ndarray] | None = None) -> Sample:
        vectors = common_calls() if vectors is None else vectors
        tables, z = [], np.random.default_rng([stream, 1 << 20]).standard_normal(n)
        for i in range(n):
            problem, oracle, *_ = draw_raw(np.random.default_rng([stream, i]), fit, [family])
            tables.append(best_per_knob(problem, oracle.times))
        return cls(tables, z, [calls_at(vectors[i % len(vectors)], t[2]) for i, t in enumerate(tables)])

    def optima(self, gain: float, gain_sd: float = 0.0, calls: bool = True, view: View | None = None) -> np.ndarray:
        """Each problem's optimum at gain ``gain exp(gain_sd z)`` (calls-weighted, or one call per
        size), as ``view`` sees it (default: every size and knob setting)."""
        view = view or View()
        g = gain * np.exp(gain_sd * self.z)
        out = []
        for (b, n, nb), gi, w in zip(self.tables, g, self.weights, strict=True):
            at = (nb >= view.lo) & (nb <= view.hi)
            out.append(optimum_of(scaled(b[:, at], n[at], gi), n[at], w[at] if calls else None, view.knobs)
                       if at.any() else 0.0)
        return np.array(out)


def fit_gain(sample: Sample, target: float, view: View | None = None, lo: float = 1e-3, hi: float = 4.0) -> float:
    """The gain at which the sample's median calls-weighted optimum in ``view`` is ``target``
    (bisection in log gain; the median grows with the gain); clipped to ``[lo, hi]``."""
    a, b = math.log(lo), math.log(hi)
    for _ in range(40):
        m = (a + b) / 2
        if np.median(sample.optima(math.exp(m), view=view)) < target:
            a = m
        else:
            b = m
    return math.exp((a + b) / 2)


def fit_family(sample: Sample, targets: Sequence[tuple[float, View]]) -> tuple[float, float, list[float]]:
    """A family's gain and gain sd from its fit sources' figures and views
    (docs/explanation/generator.md): each source's own gain, their geometric mean and the sd of
    their logs (0 with one source). ``(gain, gain_sd, per-source gains)``."""
    own = [fit_gain(sample, t, v) for t, v in targets]
    logs = np.log(own)
    return float(np.exp(logs.mean())), float(logs.std(ddof=1)) if len(own) > 1 else 0.0, own


# -- measured sources ------------------------------------------------------------------------------

ROOT = Path(__file__).resolve().parents[1]
#: NCCL's default knobs in a recording's or grid's point keys
BASE = (0, 0, 0, 0, 0)


def recorded_tables(recorded: Mapping[tuple, list[list[float]]]) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """Per collective of a recording or grid (points ``(knobs, collective, nbytes, key)`` -> each
    job's samples), :func:`best_per_knob` on its truth (each point's pooled median over its jobs),
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
        for x, t in truth.items():
            if x[1] == c and x[2] in si and np.isfinite(t):
                best[ki[x[0]], si[x[2]]] = min(best[ki[x[0]], si[x[2]]], t)
        out.append((best, np.array([base[s] for s in sizes]), np.array(sizes, dtype=np.int64)))
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
    parts: list[list[tuple[np.ndarray, np.ndarray, np.ndarray]]]
    depth: list[float]
    noise: JobNoise | None = None
    noise_source: str = ""

    @property
    def view(self) -> View:
        """What it covers: its sizes, and knob settings if any recording has more than NCCL's defaults."""
        nb = np.concatenate([t[2] for part in self.parts for t in part])
        return View(any(t[0].shape[0] > 1 for part in self.parts for t in part), int(nb.min()), int(nb.max()))

    def figure(self, fn) -> float:
        """The source's figure of ``fn(best, nccl, nbytes) -> float`` (or a list of floats: their
        median): the median over its recordings of each recording's median over its collectives."""
        return float(np.median([np.median([np.median(fn(*t)) for t in part]) for part in self.parts]))


#: the recorded hosts: name, preset, launch, recordings (store relative to the repository; ``""``:
#: the recording that ships, ``envs/recordings``; the tags of its sweep)
RECORDED: tuple[tuple[str, str, str, tuple[tuple[str, tuple[str, ...]], ...]], ...] = (
    ("h200 1x4 NVLink", "h200-1x4", "torch", (("data/h200x4-2026-11-21/store.sqlite", ("sweep",)),)),
    ("h200 2x2 sockets", "h200-2x2-sock", "nccl", (("", ("sweep", "sweep-repeat")),)),
    ("h200 2x1 sockets", "h200-2x1-sock", "nccl", (("data/h200x2-2026-11-22/store.sqlite", ("sweep",)),)),
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
    shipped fit for the host and launch (``conf/noise/job_noise.yaml``), else one fitted on the
    recording's repeated jobs."""
    from ncclrl.costmodel.noise import load_fits

    fits = load_fits()
    out = []
    for name, preset, launch, recs in (*RECORDED, *extra):
        parts, depth, frames = [], [], []
        for path, tags in recs:
            frame, rec = _store_recorded(str(ROOT / path) if path else "", preset, launch, tags)
            parts.append(recorded_tables(rec))
            depth.append(float(np.median([len(v) for v in rec.values()])))
            frames.append(frame)
        key = f"{preset}/{launch}"
        if key in fits:
            noise, src = JobNoise.load(key), f"the shipped fit {key}"
        else:
            noise = next((n for n in (_store_noise(f, name) for f in frames) if n is not None), None)
            src = "fitted on its repeated jobs" if noise is not None else ""
        out.append(Source(name, family_of(preset), "recorded", parts, depth, noise, src))
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
