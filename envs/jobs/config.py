"""How a job's processes start (the ``launcher=`` group) and how each process learns its rank."""

from __future__ import annotations

import os
import shlex
from dataclasses import dataclass, field

from ncclrl.costmodel.errors import ConfigError

KINDS = ("local", "torchrun", "srun", "mpirun")
LOCAL_HOSTS = ("", "localhost", "127.0.0.1")

@dataclass
class LaunchConfig:
    """How a job's processes start (group ``launcher=``: local, torchrun, srun, mpirun).

    :param kind: local (this host only), torchrun, srun or mpirun
    :param hosts: the job's hosts, one per node (torchrun, mpirun); empty: every node on this host
        (nodes are then emulated). srun takes its nodes from the Slurm allocation.
    :param remote: torchrun: the command that runs a node's agent on another host; ``{host}`` is
        replaced; ``-tt`` gives the remote agent a terminal, so it gets SIGHUP when the job is
        ended here; the first host's agent runs here
    :param master_addr: the rendezvous address (empty: the first host, or 127.0.0.1 with no hosts)
    :param port: the rendezvous port (0: a free one on this host)
    :param program: the launcher program (empty: torchrun, srun or mpirun by kind)
    :param extra_args: more arguments for the launcher, before the program it starts (e.g.
        ``--mca btl_tcp_if_include ib0`` or ``--partition=gpu``)
    :param python: the Python that runs the workers on every node (empty: this one's path)
    :param grace_s: after a timeout, seconds between SIGTERM and SIGKILL to the job's processes
    :param mpi: srun: the ``--mpi=`` plugin for MPI programs (nccl-tests built with MPI=1)
    :param share_gpu: emulated nodes only: every rank on this host's first GPU, each its own NCCL
        node (``NCCL_HOSTID``), to test the live chain on one GPU; the GPU time-slices the ranks,
        so its times are not a cluster's
    """

    kind: str = "local"
    hosts: list[str] = field(default_factory=list)
    remote: str = "ssh -tt {host}"
    master_addr: str = ""
    port: int = 0
    program: str = ""
    extra_args: str = ""
    python: str = ""
    grace_s: float = 10.0
    mpi: str = "pmix"
    share_gpu: bool = False

    def check(self) -> None:
        if self.kind not in KINDS:
            raise ConfigError("launcher.kind", f"unknown value {self.kind!r}; allowed: {', '.join(KINDS)}")
        if self.kind == "local" and any(h not in LOCAL_HOSTS for h in self.hosts):
            raise ConfigError("launcher.hosts", "launcher=local runs on this host only; for other hosts use "
                              "launcher=torchrun, srun or mpirun")
        if not 0 <= int(self.port) < 65536:
            raise ConfigError("launcher.port", f"must be 0 (a free port) or a TCP port, got {self.port}")
        if self.kind == "torchrun" and self.hosts and "{host}" not in self.remote and \
                any(h not in LOCAL_HOSTS for h in self.hosts[1:]):
            raise ConfigError("launcher.remote", f"must contain {{host}} to start agents on other hosts, got "
                              f"{self.remote!r}")
        if not isinstance(self.share_gpu, bool):
            raise ConfigError("launcher.share_gpu", f"must be true or false, got {self.share_gpu!r}")
        if self.share_gpu and not self.emulated:
            raise ConfigError("launcher.share_gpu", "true needs every node emulated on this host (launcher=local, "
                              "or torchrun/mpirun with no other hosts)")
        if self.grace_s < 0:
            raise ConfigError("launcher.grace_s", f"must be >= 0, got {self.grace_s}")
        try:
            shlex.split(self.extra_args)
            shlex.split(self.remote)
        except ValueError as e:
            raise ConfigError("launcher.extra_args", f"not a valid command line: {e}") from None

    @classmethod
    def of(cls, d) -> LaunchConfig:
        """From a config node, a dict or a launcher name."""
        if isinstance(d, LaunchConfig):
            return d
        if d is None:
            return cls()
        if isinstance(d, str):
            return cls(kind=d)
        d = dict(d)
        d["hosts"] = [str(h) for h in d.get("hosts", []) or []]
        out = cls(**d)
        out.check()
        return out

    @property
    def emulated(self) -> bool:
        """Every node of the job on this host (distinct ``NCCL_HOSTID`` per node, sockets on lo)."""
        return self.kind == "local" or (self.kind != "srun" and all(h in LOCAL_HOSTS for h in self.hosts))

    def gpus_needed(self, nranks: int) -> int:
        """The GPUs this host must have for a job of ``nranks`` ranks started here: one per rank, or
        one for all of them with ``share_gpu``."""
        return 1 if self.share_gpu else nranks


def rank_gpu(rank: int, local_rank: int, visible: int, emulated: bool = False, share_gpu: bool = False) -> int:
    """The GPU a rank takes among the ``visible`` GPUs of its host: the first with ``share_gpu``
    or where a task sees one GPU only (a site's per-task binding); where every node is emulated on
    this host, the GPU of its global rank (one GPU per rank: the nodes' local ranks repeat); else
    its local rank."""
    if share_gpu or visible == 1:
        return 0
    return rank if emulated else local_rank


RANK_VARS_BY_KIND = {
    "local": ("RANK", "WORLD_SIZE", "LOCAL_RANK"),
    "torchrun": ("RANK", "WORLD_SIZE", "LOCAL_RANK"),
    "mpirun": ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK"),
    "srun": ("SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID"),
}


def rank_env(env: dict[str, str] | None = None, kind: str | None = None) -> tuple[int, int, int]:
    """``(rank, world_size, local_rank)`` from the launcher that started this process: ``kind``'s
    variables when given (stale ones of another launcher are ignored), else the first found of
    torchrun/ncclrl (``RANK``), Open MPI (``OMPI_COMM_WORLD_*``), Slurm (``SLURM_PROCID``), MPICH/PMI."""
    e = os.environ if env is None else env
    order = [RANK_VARS_BY_KIND[kind]] if kind in RANK_VARS_BY_KIND else [
        *dict.fromkeys(RANK_VARS_BY_KIND.values()), ("PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID")]
    for r, w, lr in order:
        if r in e and w in e:
            return int(e[r]), int(e[w]), int(e.get(lr, "0"))
    raise RuntimeError("no rank in the environment: start the workers with torchrun, srun, mpirun or ncclrl")

