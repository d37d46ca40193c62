"""What a measuring job costs in GPU-time: the unit every tuning budget is counted in.

A tuning run costs the user GPU-time: every job (one launch, one communicator, one knob setting)
holds all of its GPUs from its launch to its end, whatever it measures. A job's wall time is

    launch_s + sum over its points of (point_s + work_factor * busy_us(time_us, samples) / 1e6)

where ``busy_us`` is what the workers spend calling the collective: three untimed calls (two
warm-ups and one estimate), then ``samples`` samples of ``reps`` calls each, ``reps`` chosen so a
sample lasts ``sample_budget_us`` (at least one call, at most 50: the workers' rule, see
``ncclrl.envs.worker``). Its GPU-time is that wall time times the job's GPUs (``nranks``).

The defaults were fitted on the inter-job gaps of the recorded H200 stores (every job of
``data/h200x4-2026-11-21`` and ``data/h200x2-2026-11-22``: torchrun on one host, NCCL's
sockets on loopback for the emulated nodes), by a robust least-squares fit
(``docs/results/scripts/fit_job_cost.py``; the figures are in ``docs/results/job-cost.md``). A
cluster launching through srun or mpirun across nodes pays more per job: set ``launch_s`` to what
its jobs take, or let a live run charge its measured wall time (it does).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from ncclrl.costmodel.errors import ConfigError

#: repetitions per sample at most, and untimed calls per point (as the workers run them)
MAX_REPS = 50
UNTIMED_CALLS = 3


@dataclass(frozen=True)
class JobCost:
    """The GPU-time of a measuring job (see the module's docs).

    :param launch_s: fixed wall time of a job: launch, communicator setup, warm-up, teardown (s)
    :param point_s: fixed wall time per point: building its call, agreeing on repetitions (s)
    :param work_factor: wall time per second the collectives themselves run
    :param sample_budget_us: a sample's target duration (the workers' ``budget_us``)
    """

    launch_s: float = 6.6
    point_s: float = 0.012
    work_factor: float = 0.92
    sample_budget_us: float = 1000.0

    def __post_init__(self) -> None:
        for name, v in asdict(self).items():
            if not (np.isfinite(v) and v >= 0):
                raise ConfigError(f"job_cost.{name}", f"must be a finite number >= 0, got {v}")

    def busy_us(self, time_us: np.ndarray | float, samples: int) -> np.ndarray:
        """Microseconds the collectives run for points of ``time_us`` measured with ``samples`` samples."""
        t = np.maximum(np.asarray(time_us, dtype=float), 1e-3)
        reps = np.clip(np.floor(self.sample_budget_us / t), 1, MAX_REPS)
        return (UNTIMED_CALLS + samples * reps) * t

    def point_wall_s(self, time_us: np.ndarray | float, samples: int) -> np.ndarray:
        """Wall seconds each point adds to its job (its fixed part and its calls)."""
        return self.point_s + self.work_factor * self.busy_us(time_us, samples) / 1e6

    def job_wall_s(self, time_us: np.ndarray, samples: int) -> float:
        """Wall seconds of one job measuring points of ``time_us``."""
        return float(self.launch_s + np.sum(self.point_wall_s(time_us, samples)))

    def job_gpu_s(self, time_us: np.ndarray, samples: int, nranks: int) -> float:
        """GPU-seconds of one job on ``nranks`` GPUs."""
        return self.job_wall_s(time_us, samples) * int(nranks)


#: the fitted default
DEFAULT_JOB_COST = JobCost()


def format_gpu_s(gpu_s: float) -> str:
    """GPU-time for people: ``42 GPU-s``, ``3.5 GPU-min``, ``2.1 GPU-h``."""
    if not np.isfinite(gpu_s):
        return f"{gpu_s} GPU-s"
    if gpu_s < 120:
        return f"{gpu_s:.0f} GPU-s"
    if gpu_s < 7200:
        return f"{gpu_s / 60:.1f} GPU-min"
    return f"{gpu_s / 3600:.2f} GPU-h"


# no "m": sizes on the same command line read 1M as a MiB, so a budget of 10M would be ambiguous
_TIME_UNITS = {"": 1.0, "s": 1.0, "sec": 1.0, "min": 60.0, "h": 3600.0, "hr": 3600.0}


def parse_gpu_time(text: object, field: str = "budget") -> float:
    """GPU-time as users write it -> GPU-seconds: ``600`` or ``600s``, ``10min``, ``1.5h`` (an optional
    ``gpu-`` before the unit: ``10gpu-min``); negative, non-finite or unitless-garbage values are errors."""
    import re

    m = re.fullmatch(r"\s*([+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?)\s*(?:gpu-?)?([a-zA-Z]*)\s*", str(text),
                     flags=re.IGNORECASE)
    if m and m.group(2).lower() == "m":
        raise ConfigError(field, f"not a GPU-time: {text!r}: M is not a unit of time here (1M is a MiB on the same "
                          "command line); use seconds or a unit: 600s, 10min, 1.5h")
    if not m or m.group(2).lower() not in _TIME_UNITS:
        raise ConfigError(field, f"not a GPU-time: {text!r}; use seconds or a unit: 600s, 10min, 1.5h")
    v = float(m.group(1)) * _TIME_UNITS[m.group(2).lower()]
    if not (np.isfinite(v) and v >= 0):
        raise ConfigError(field, f"must be a finite GPU-time >= 0, got {text!r}")
    return v


def parse_budget(text: object, sweep_gpu_s: float, field: str = "budget") -> float:
    """A budget -> GPU-seconds: ``Nsweep`` is N times ``sweep_gpu_s`` (what one full sweep of the
    problem costs), anything else a GPU-time (:func:`parse_gpu_time`)."""
    b = str(text).strip()
    if b.lower().endswith("sweep"):
        try:
            n = float(b[:-5])
        except ValueError:
            n = -1.0
        if not (np.isfinite(n) and n > 0):
            raise ConfigError(field, f"not a budget: {text!r}; use Nsweep with N > 0 (0.5sweep: half a full sweep's "
                              "GPU-time) or a GPU-time > 0 (600s, 10min, 1.5h)")
        return n * sweep_gpu_s
    v = parse_gpu_time(b, field)
    if v <= 0:
        raise ConfigError(field, f"must be a GPU-time > 0, got {text!r}: a budget of nothing measures nothing "
                          "(600s, 10min, 1.5h or 0.5sweep)")
    return v
