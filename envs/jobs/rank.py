"""One rank of a job, inside the process a launcher started: who it is, where its node's
rendezvous is, its records on standard output, and the watchdog that ends it when its driver
gave up on it. Every worker module (measuring, end-to-end training) starts through here."""

from __future__ import annotations

import ctypes
import json
import os
import signal
import sys
import threading
import time
from dataclasses import dataclass

from ncclrl.envs.jobs.config import rank_env
from ncclrl.envs.jobs.records import MARK
from ncclrl.envs.jobs.spec import JOB_ENV, decode, first_node

EXIT_WATCHDOG = 124


class Out:
    """This rank's records on standard output (one line each, flushed), and its progress clock."""

    def __init__(self, rank: int) -> None:
        self.rank = rank
        self.last = time.time()
        self._lock = threading.Lock()

    def __call__(self, kind: str, payload, wait_s: float = -1) -> None:
        text = payload if isinstance(payload, str) else json.dumps(payload, separators=(",", ":"))
        if not self._lock.acquire(timeout=wait_s):
            return
        try:
            sys.stdout.write(f"{MARK}{self.rank}|{kind}|{text.replace(chr(10), ' ')}\n")
            sys.stdout.flush()
            self.last = time.time()
        finally:
            self._lock.release()


def _die_with_parent() -> None:
    """Linux: this process gets SIGKILL when the process that started it dies."""
    try:
        libc = ctypes.CDLL(None)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _watchdog(out: Out, limit_s: float) -> None:
    """Ends the rank when it has written nothing for ``limit_s`` (its driver gave up on it)."""
    while True:
        time.sleep(min(5.0, limit_s / 4))
        if time.time() - out.last > limit_s:
            try:  # a best effort: the driver may be gone, the pipe broken or full
                out("error", f"watchdog: no progress for {limit_s:.0f} s; this rank ends", wait_s=2.0)
            finally:
                os._exit(EXIT_WATCHDOG)


@dataclass
class RankSetup:
    """What a rank learned at its start."""

    job: dict
    rank: int
    world: int
    local: int
    out: Out


def join_job() -> RankSetup:
    """Read the job (``NCCLRL_JOB``) and this rank's place in it from the launcher's environment;
    on emulated nodes take the node's ``NCCL_HOSTID`` and loopback sockets; under Slurm with no
    ``MASTER_ADDR``, the rendezvous on the step's first node (``SLURM_STEP_NODELIST``, else the
    allocation's); start the watchdog (``timeout_s`` + 30 s of silence ends the rank)."""
    job = decode(os.environ[JOB_ENV])
    rank, world, local = rank_env(kind=job.get("kind"))
    out = Out(rank)
    _die_with_parent()
    gpn = int(job["gpus_per_node"])
    if job.get("emulate_nodes") and int(job["nranks"]) > gpn:
        os.environ["NCCL_HOSTID"] = f"ncclrl-node{int(os.environ.get('GROUP_RANK', rank // gpn))}"
        os.environ.setdefault("NCCL_SOCKET_IFNAME", "lo")
    nodelist = os.environ.get("SLURM_STEP_NODELIST") or os.environ.get("SLURM_JOB_NODELIST")
    if not os.environ.get("MASTER_ADDR") and nodelist:  # rank 0 runs on the step's first node
        os.environ["MASTER_ADDR"] = first_node(nodelist)
    threading.Thread(target=_watchdog, args=(out, float(job["timeout_s"]) + 30.0), daemon=True).start()
    return RankSetup(job, rank, world, local, out)


def run_worker(main) -> None:
    """Run a worker's ``main`` and end the process with its code; an exception becomes one
    ``error`` record (rank from the launcher's environment, -1 when unknown) and exit code 1. The
    exit skips interpreter teardown, which can hang in NCCL or gloo after a failure (or with CUDA
    graphs that captured NCCL calls still alive)."""
    try:
        code = main()
    except Exception as e:  # noqa: BLE001 - one line for the driver, then a non-zero exit
        try:
            r = rank_env(kind=decode(os.environ[JOB_ENV]).get("kind"))[0]
        except (RuntimeError, KeyError, ValueError, TypeError, AttributeError):
            r = -1
        sys.stdout.write(f"{MARK}{r}|error|{type(e).__name__}: {' '.join(str(e).split())[:400]}\n")
        code = 1
    sys.stdout.flush()
    os._exit(code)
