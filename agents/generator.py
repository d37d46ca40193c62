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


# -- measured sources ------------------------------------------------------------------------------

ROOT = Path(__file__).resolve().parents[1]


@dataclass
class Source:
    """One measured communicator shape on one machine: its problems (one per collective) with truth.

    :param name: what it is
    :param family: its platform family
    :param kind: ``recorded`` (a host's sweep in this repository) or ``grid`` (a public grid)
    :param instances: one :class:`ncclrl.agents.suite.Instance` per collective
    """

    name: str
    family: str
    kind: str
    instances: list = field(default_factory=list)

    def tables(self) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
        """:func:`best_per_knob` of each collective, sizes within the generator's range."""
        out = []
        for inst in self.instances:
            best, nccl, nbytes = best_per_knob(inst.problem, inst.oracle.times)
            keep = (nbytes >= DRAW.min_bytes) & (nbytes <= DRAW.max_bytes) & np.isfinite(nccl)
            out.append((best[:, keep], nccl[keep], nbytes[keep]))
        return out


#: the recorded hosts: (name, stores (the first holds the sweep, the others its repeats), preset,
#: launch, collectives); paths relative to the repository
RECORDED: tuple[tuple[str, tuple[str, ...], str, str, tuple[str, ...]], ...] = (
    ("h200 1x4 NVLink", ("data/h200x4-2026-11-21/store.sqlite",), "h200-1x4", "torch",
     ("allreduce", "allgather", "reducescatter")),
    ("h200 2x2 sockets", ("",), "h200-2x2-sock", "nccl", ("allreduce",)),
    ("h200 2x1 sockets", ("data/h200x2-2026-11-22/store.sqlite",), "h200-2x1-sock", "nccl", ("allreduce",)),
)


def recorded_sources() -> list[Source]:
    """The recorded hosts of :data:`RECORDED` (the 2x2 socket host: the recording that ships,
    ``envs/recordings``, its sweep and re-recorded repeats pooled)."""
    from ncclrl.agents.suite import replayed

    out = []
    for name, stores, preset, launch, colls in RECORDED:
        paths = [str(ROOT / s) if s else "" for s in stores]
        if not paths[0]:
            from ncclrl.envs.replay import shipped_recording

            paths[0] = str(shipped_recording(preset))
        insts = [replayed(paths if len(paths) > 1 else paths[0], preset, launch, c) for c in colls]
        out.append(Source(name, family_of(preset), "recorded", insts))
    return out


def grid_sources(root: str | Path | None = None) -> list[Source]:
    """The public grids (:data:`ncclrl.envs.grids.PUBLIC_GRIDS`), read from the shared data folder."""
    from ncclrl.agents.suite import public_gridded
    from ncclrl.envs.grids import PUBLIC_GRIDS

    return [Source(name, g.family, "grid", [public_gridded(name, root)]) for name, g in PUBLIC_GRIDS.items()]
