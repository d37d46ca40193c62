"""What every live PyTorch backend shares: the plugin's path, the environment every GPU job runs
with, how collectives are launched and how that is recorded, the worker error, a free TCP port for
the rendezvous."""

from __future__ import annotations

import os
import subprocess
from importlib.resources import files
from pathlib import Path

from ncclrl.costmodel import nccl as N
from ncclrl.costmodel.errors import ConfigError

PLUGIN_NAME = "libnccl-tuner-ncclrl.so"
# where `ncclrl plugin build` puts the plugin and the live backends look for it
PLUGIN_DIR = Path(os.environ.get("NCCLRL_PLUGIN_DIR", "~/.cache/ncclrl/plugin")).expanduser()
PLUGIN = PLUGIN_DIR / PLUGIN_NAME
# NVLink multicast off: it can take the shared GPUs down
SAFE_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


# how the workers issue collectives: torch.distributed calls, or NCCL called directly (ncclrl.envs.nccl_direct)
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


# in the error of a point a job stopped at because it made no progress for timeout_s: NCCL may be
# hung there, or a rank, a node or the network stalled; the store's status is "timeout"
TIMEOUT = "timed out"

# in the error of a point abandoned because its first calls took many times NCCL's own choice at its
# size (ncclrl.envs.torch_workers); the store's status is "slow"
TOO_SLOW_WORDS = "too slow"


def is_hang(error: str | None) -> bool:
    """Whether a stored failure is a hang or a timeout (or a point skipped after one), not a crash
    or a start failure: what a sweep does not try again at larger sizes (after_hang=skip)."""
    return bool(error) and (HANG in error or error.startswith(TIMEOUT))


def block_group(p, channel_wide: bool) -> tuple:
    """What a failure of ``p`` holds back at its size and larger ones under the same knobs: a hang NCCL
    named, its whole :func:`hang_group` (every channel count); a point too slow or timed out, only its
    algorithm/protocol at the same channel count (slowness depends on the channels, and a timeout
    may have been the host's)."""
    g = hang_group(p)
    return g if channel_wide or p.algo == "default" else g + (int(p.channels),)


def hang_group(p) -> tuple:
    """What a hang on ``p`` says NCCL will hang on at larger sizes: its collective, algorithm and
    protocol; for NCCL's own algorithm (which NCCL picks per size) only at the same channel count,
    so that a hang of it at NCCL's count never skips NCCL's plain default."""
    return (p.collective, p.algo, p.proto) + ((p.channels,) if p.algo == "default" else ())


def require_gpus(nranks: int, key: str = "backend", instead: str = "use backend=replay with a recorded sweep") -> None:
    """Fail early, in one line naming ``key``, when this machine has fewer than ``nranks`` GPUs for a
    job's workers (one per rank, or one for all with ``launcher.share_gpu``): no CUDA build of
    PyTorch, no GPU visible, or too few. ``instead``: what the command can do without them (empty:
    nothing)."""
    import torch

    have = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if have < nranks:
        why = "a CPU-only build" if torch.version.cuda is None else f"CUDA {torch.version.cuda}"
        raise ConfigError(key, f"live measurement needs {nranks} CUDA GPUs (one per rank started here; one "
                          "for all with launcher.share_gpu=true on emulated nodes); "
                          f"PyTorch {torch.__version__} ({why}) sees {have} here: run it on the GPU machine"
                          + (f", or {instead}" if instead else ""))


class WorkerError(RuntimeError):
    """A worker failed (NCCL error, dead rank) or did not answer in time."""


def elem_size(coll: int) -> int:
    return 1 if coll in (N.ALLGATHER, N.BROADCAST) else 4


def make_collective(dist, torch, coll: int, nbytes: int, world: int, dev, group=None):
    """A closure issuing collective ``coll`` of ``nbytes`` through ``torch.distributed`` on buffers allocated
    once on ``dev`` (uint8 where the collective needs no arithmetic, float32 otherwise)."""
    dtype = torch.uint8 if elem_size(coll) == 1 else torch.float32
    n = nbytes // elem_size(coll)
    if coll == N.ALLGATHER:
        x, y = torch.ones(n // world, dtype=dtype, device=dev), torch.empty(n, dtype=dtype, device=dev)
        return lambda: dist.all_gather_into_tensor(y, x, group=group)
    if coll == N.REDUCESCATTER:
        x, y = torch.ones(n, dtype=dtype, device=dev), torch.empty(n // world, dtype=dtype, device=dev)
        return lambda: dist.reduce_scatter_tensor(y, x, group=group)
    x = torch.ones(n, dtype=dtype, device=dev)
    if coll == N.ALLREDUCE:
        return lambda: dist.all_reduce(x, group=group)
    if coll == N.BROADCAST:
        return lambda: dist.broadcast(x, 0, group=group)
    return lambda: dist.reduce(x, 0, group=group)


def build_plugin(out_dir: str | Path = PLUGIN_DIR) -> Path:
    """Compile the tuner plugin from the C sources shipped with ncclrl into ``out_dir`` (the
    sources stay where they are installed); returns the library's path."""
    src = Path(str(files("ncclrl.plugin")))
    out = Path(out_dir).expanduser().resolve()
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ConfigError("out", f"cannot create {out}: {e.strerror or e}") from None
    try:
        p = subprocess.run(["make", "--no-print-directory", "-C", str(src), f"BUILD={out}", str(out / PLUGIN_NAME)],
                           capture_output=True, text=True, errors="replace")
    except FileNotFoundError:
        raise ConfigError("plugin", "`make` is not on PATH: the plugin is built with make and a C11 compiler "
                          "(apt-get install make gcc, or build-essential)") from None
    if p.returncode != 0:
        last = (p.stderr or p.stdout).strip().splitlines()[-1:] or ["make failed"]
        raise ConfigError("plugin", f"build failed: {last[0]}")
    return out / PLUGIN_NAME


def plugin_library(path: str | Path | None = None) -> Path:
    """The plugin a live job loads: ``path`` if given (it must exist), else the one ``ncclrl plugin
    build`` made, built now if it is not there yet."""
    if path:
        lib = Path(path).expanduser()
        if not lib.is_file():
            raise ConfigError("plugin", f"{lib} does not exist; build it with `ncclrl plugin build`")
        return lib.resolve()
    return PLUGIN if PLUGIN.is_file() else build_plugin()
