"""Platform families to train and judge tuning strategies on.

A *platform* is a stand-in for a cluster: the expected time of every configuration, and noisy
measurements of it in jobs. Three kinds:

- **nominal**: a preset's simulator with its parameters drawn within :data:`ncclrl.costmodel.simulator.RANDOMIZATION`
  (what pretraining has always randomized over);
- **misspecified**: the same, with effects the simulator does not model (:class:`Quirks`): per
  (algorithm, protocol, channel level, knob setting) a smooth wave over log size, protocol cliffs
  above a random size, and per knob setting an offset that changes with size. A tuner that trusts
  the simulator blindly is wrong on these by 10-80%;
- recorded sweeps replayed as truth live in :mod:`ncclrl.agents.baselines.base` (they need the store).

Every measurement of a platform happens in a *job*: the samples of all points of one job share a
job effect (lognormal, ``job_sigma``), as processes started afresh do on real machines, and each
point of a job has its own residual (:class:`ncclrl.costmodel.noise.JobNoise`, fitted on recorded
repeated jobs; docs/results/noise.md).

Presets are grouped into :data:`FAMILIES` by network, so that a strategy can be trained with a
whole family left out and judged on it.
"""

from __future__ import annotations

import zlib

import numpy as np

from ncclrl.costmodel.errors import ConfigError
from ncclrl.costmodel.noise import JobNoise
from ncclrl.costmodel.simulator import Configs, Simulator

#: presets by the network that joins their nodes (the unit left out in leave-one-family-out)
FAMILIES: dict[str, tuple[str, ...]] = {
    "nvlink": ("h200-1x4",),
    "infiniband": ("dgx-h100-2n", "dgx-h100-16n", "a100-16x4-ib", "a40-4x8-ib"),
    "socket": ("h200-2x2-sock", "h200-2x1-sock", "v100-2x8-eth"),
}


def family_of(preset: str) -> str:
    """The family of a preset name (a preset of no family is its own)."""
    return next((f for f, ps in FAMILIES.items() if preset in ps), preset)


def _unit(*parts: object) -> float:
    """A deterministic number in [0, 1) from ``parts``."""
    return zlib.crc32("/".join(map(str, parts)).encode()) / 2**32


class Quirks:
    """Effects the simulator lacks, as a log-time offset per configuration, drawn from ``seed``.

    :param seed: the draw
    :param strength: scales every effect (1: waves up to 0.25 in log, cliffs up to 0.6, knob
        offsets of sd 0.15)
    """

    def __init__(self, seed: int, strength: float = 1.0) -> None:
        self.seed, self.strength = int(seed), float(strength)

    def offset(self, cfg: Configs) -> np.ndarray:
        ls = np.log2(np.maximum(np.asarray(cfg.nbytes, dtype=float), 1.0))
        out = np.zeros(len(cfg))
        keys = np.stack([cfg.algo, cfg.proto, np.minimum(cfg.channels, 2), cfg.comm_channels, cfg.socket_nthreads,
                         cfg.nsocks_perthread, cfg.socket_inline_bytes, cfg.buffsize_bytes], axis=1).astype(np.int64)
        uniq, inv = np.unique(keys, axis=0, return_inverse=True)
        inv = inv.ravel()
        for j, u in enumerate(uniq):
            at = inv == j
            a, p, ch = int(u[0]), int(u[1]), int(u[2])
            knobs = tuple(int(x) for x in u[3:])
            amp = 0.25 * _unit(self.seed, "amp", a, p, ch, knobs)
            period = 4.0 + 8.0 * _unit(self.seed, "period", a, p, ch, knobs)
            phase = 2 * np.pi * _unit(self.seed, "phase", a, p, ch, knobs)
            v = amp * np.sin(2 * np.pi * ls[at] / period + phase)
            if a >= 0 and _unit(self.seed, "cliff", a, p) < 0.3:  # a protocol that falls off above a size
                at_s = 10 + 18 * _unit(self.seed, "cliff-at", a, p)
                v += 0.6 * _unit(self.seed, "cliff-h", a, p) * (ls[at] > at_s)
            if any(knobs):  # a knob setting that helps or hurts more than modelled, changing with size
                z = (ls[at] - 15.0) / 15.0
                v += 0.15 * np.sqrt(12) * (_unit(self.seed, "k0", knobs) - 0.5) \
                    + 0.15 * np.sqrt(12) * (_unit(self.seed, "k1", knobs) - 0.5) * z
            out[at] = v
        return self.strength * out


class Platform:
    """A simulated cluster: expected times, and noisy measurements in jobs.

    :param sim: the simulator of the platform's nominal behaviour
    :param quirks: effects beyond the simulator (``None``: none)
    :param job_sigma: sd (log) of the shift every point of one job shares
    :param noise: the per-point residual of a job (:meth:`JobNoise.draw_resid`; its shift and
        samples are not used: ``job_sigma`` and the simulator's sample noise stand for them);
        ``None``: no residual, every point of a job moves with the job alone
    """

    def __init__(self, sim: Simulator, quirks: Quirks | None = None, job_sigma: float = 0.03,
                 noise: JobNoise | None = None) -> None:
        self.sim, self.quirks, self.job_sigma, self.noise = sim, quirks, float(job_sigma), noise
        self.topo = sim.topo

    def time_us(self, cfg: Configs, validate: bool = False) -> np.ndarray:
        """Expected time of each configuration (us)."""
        t = self.sim.time_us(cfg, validate=validate)
        return t * np.exp(self.quirks.offset(cfg)) if self.quirks is not None else t

    def job(self, cfg: Configs, samples: int, rng: np.random.Generator) -> np.ndarray:
        """Samples ``(len(cfg), samples)`` of one job: the simulator's per-sample noise around the
        expected times, every point shifted by the job's common effect and its own residual."""
        t, lat = self.sim.times_and_latency(cfg, validate=False)
        if self.quirks is not None:
            q = np.exp(self.quirks.offset(cfg))
            t, lat = t * q, lat * q
        shift = float(np.exp(self.job_sigma * rng.standard_normal()))
        if self.noise is not None:
            shift = shift * np.exp(self.noise.draw_resid(np.asarray(cfg.nbytes), rng))
        return self.sim.add_noise(t * shift, lat * shift, samples, rng).reshape(len(cfg), samples)


#: how far a drawn platform's noise strays from the fitted one: each sd times exp(U(-s, s))
NOISE_SPREAD = 0.5


def draw_platform(preset: str, rng: np.random.Generator, misspecified: bool, scale: float = 1.0,
                  job_sigma: float | None = None, noise: JobNoise | None | str = "fitted") -> Platform:
    """A platform drawn around ``preset``: simulator parameters within the randomization bounds,
    with :class:`Quirks` when ``misspecified``, and its job noise.

    :param job_sigma: the job shift's sd (default: drawn, see ``noise``)
    :param noise: ``"fitted"``: the job shift's sd and the per-point residual's drawn around the
        fitted model's (:meth:`JobNoise.load`, each times ``exp(U(-0.5, 0.5))``, independently); a
        :class:`JobNoise`: the same around it; ``None``: no per-point residual and a job shift's
        sd drawn in [0.01, 0.08] (the model before the recorded jobs were fitted)
    """
    from ncclrl.costmodel.topology import load_topology

    sim = Simulator(load_topology(preset)).randomized(rng, scale)
    quirks = Quirks(int(rng.integers(1 << 31))) if misspecified else None
    if noise is None:
        js = float(np.exp(rng.uniform(np.log(0.01), np.log(0.08)))) if job_sigma is None else job_sigma
        return Platform(sim, quirks, js)
    if isinstance(noise, str) and noise != "fitted":
        raise ConfigError("noise", f"unknown value {noise!r}; allowed: fitted, a JobNoise, None")
    base = JobNoise.load() if isinstance(noise, str) else noise
    f_shift, f_resid = np.exp(rng.uniform(-NOISE_SPREAD, NOISE_SPREAD, 2))
    js = base.shift_sd * float(f_shift) if job_sigma is None else job_sigma
    return Platform(sim, quirks, js, base.scaled(resid=float(f_resid)))


