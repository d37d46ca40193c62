"""The one interface every measurement backend implements.

A backend measures *points* (:class:`ncclrl.costmodel.space.Point`: a collective at a size, a
per-call configuration and the per-process knobs) on one platform, a *job* at a time: one call of
:meth:`Backend.measure` starts one set of processes (one NCCL communicator) and returns every
point's samples. Jobs differ more than samples within a job do, so the job is the unit of
between-job noise (:mod:`ncclrl.costmodel.noise`), and everything downstream (the store, the
sweep, a tuning run's decision, validation) speaks of jobs.

Implementations, one module each:

* :class:`ncclrl.envs.sim.SimBackend`: the simulator (noisy samples from a seeded generator);
  it also times whole arrays of configurations, which is what the Gymnasium environment uses;
* :class:`ncclrl.envs.replay.ReplayWorkers`: answers from a recorded sweep in the store;
* :class:`ncclrl.envs.torch_workers.TableWorkers`: PyTorch workers, one process per GPU, our
  tuner plugin forcing each configuration;
* :class:`ncclrl.envs.nccltests_backend.NcclTestsBackend`: the user's nccl-tests binaries.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

from ncclrl.costmodel.space import Point


class Backend(ABC):
    """Measures points on one platform, one job per :meth:`measure` call.

    After each call, implementations set:

    * ``failures``: ``{index: reason}`` of the points the job could not measure (NCCL hung on
      it, the configuration is invalid there, the launch failed); a point that is neither
      measured nor failed was not reached and may be asked again;
    * ``last_modes``: per point, how its samples were timed (the store's ``timing``);
    * ``nccl_version``: the NCCL version that ran (``"?"`` until known).

    Class attributes: ``name`` (the store's ``backend``), ``whole_request`` (``True``: give it
    every point of a knob setting at once, it keeps what finished when a point hangs; ``False``:
    one request per size, a failure raises :class:`ncclrl.envs.live.WorkerError`), ``launch``
    (how collectives are issued: ``nccl``, ``torch``; the store's timing names it).
    """

    name: str = "backend"
    whole_request: bool = True
    launch: str = "nccl"

    def __init__(self) -> None:
        self.failures: dict[int, str] = {}
        self.last_modes: list[str] = []
        self.nccl_version = "?"

    @abstractmethod
    def measure(self, points: list[Point], samples: int = 5) -> list[list[float] | None]:
        """One job: each point's per-call times in microseconds (``samples`` of them), or ``None``
        where the job did not measure it (see ``failures``)."""

    def close(self) -> None:  # noqa: B027  (a no-op for backends that hold nothing between jobs)
        """Release what the backend holds between jobs (processes, temporary files)."""
