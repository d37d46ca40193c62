"""What every live PyTorch backend shares: the plugin's path, the environment every GPU job runs
with, how collectives are launched and how that is recorded, the worker error, a free TCP port for
the rendezvous."""

from __future__ import annotations

import socket
from pathlib import Path

from costmodel.errors import ConfigError

REPO = Path(__file__).resolve().parent.parent
PLUGIN = REPO / "plugin" / "build" / "libnccl-tuner-ncclrl.so"
# NVLink multicast off: it can take the shared GPUs down
SAFE_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


# how the workers issue collectives: torch.distributed calls, or NCCL called directly (runners.nccl_direct)
LAUNCHES = ("torch", "nccl")
NCCL_PREFIX = "nccl-"  # the store's timing of a direct-call measurement: nccl-eager, nccl-graph


def timing_label(launch: str, mode: str) -> str:
    """The store's ``timing`` of a measurement taken in ``mode`` (eager|graph) with ``launch``."""
    return NCCL_PREFIX + mode if launch == "nccl" else mode


def launch_of(timing: str) -> str:
    """The launch a stored ``timing`` was measured with (inverse of :func:`timing_label`)."""
    return "nccl" if timing.startswith(NCCL_PREFIX) else "torch"


# in the error of every point a job hung on (runners.table_backend, runners.nccltests_backend) and of
# the points a sweep skipped after it (after_hang=skip)
HANG = "NCCL hung"


def is_hang(error: str | None) -> bool:
    """Whether a stored failure is a hang (or a point skipped after one), not a crash or a start failure."""
    return bool(error) and HANG in error


def require_gpus(nranks: int) -> None:
    """Fail early, in one line, when this machine cannot start ``nranks`` GPU workers (one per GPU):
    no CUDA build of PyTorch, no GPU visible, or fewer GPUs than the topology's ranks."""
    import torch

    have = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if have < nranks:
        why = "a CPU-only build" if torch.version.cuda is None else f"CUDA {torch.version.cuda}"
        raise ConfigError("backend", f"live measurement needs {nranks} CUDA GPUs (one per rank of the topology); "
                          f"PyTorch {torch.__version__} ({why}) sees {have} here: run it on the GPU machine, or "
                          "use backend=replay with a recorded sweep")


class WorkerError(RuntimeError):
    """A worker failed (NCCL error, dead rank) or did not answer in time."""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
