"""What a job is: the environment every rank is handed, the command lines that start its
processes under each launcher, and how values travel in environment variables."""

from __future__ import annotations

import base64
import json
import os
import re
import shlex
import socket
import sys
from dataclasses import dataclass, field

from ncclrl.costmodel.errors import ConfigError
from ncclrl.envs.jobs.config import LOCAL_HOSTS, LaunchConfig

# the environment variables a job hands its processes (besides NCCL's and the knobs)
JOB_ENV = "NCCLRL_JOB"
TABLE_ENV = "NCCLRL_TUNER_TABLE_DATA"
# a job that hands its table in TABLE_ENV (empty: NCCL's own decisions) gets none of these from the
# user's environment: they would make the plugin read another table (a deployment's file), or hold
# the job's table to a deployment's fingerprint and fail its init
OTHER_TABLE_ENV = ("NCCLRL_TUNER_TABLE", "NCCL_TUNER_CONFIG_FILE", "NCCLRL_TUNER_TABLE_FINGERPRINT")
# what mpirun forwards besides the job's variables, when set: the Python and libraries the ranks need
PASS_ON = ("PYTHONPATH", "LD_LIBRARY_PATH")
# the largest value one environment variable may hold on Linux (MAX_ARG_STRLEN)
MAX_ENV_BYTES = 131072 - 64
# what a launcher sets per rank: never inherited from the user's shell into a job
RANK_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT")
# the user's variables every rank of a job gets, whatever its launcher forwards
FORWARD = ("NCCL_", "NCCLRL_")
WORKER = "ncclrl.envs.worker"


def user_env(drop: tuple[str, ...] = ()) -> dict[str, str]:
    """The user's NCCL (and ncclrl) environment, which reaches every rank of a job: every
    ``NCCL_*``/``NCCLRL_*`` variable but the table variables (a job hands its own) and ``drop``."""
    skip = {TABLE_ENV, JOB_ENV, *OTHER_TABLE_ENV[:1], *drop}
    return {k: v for k, v in os.environ.items() if k.startswith(FORWARD) and k not in skip}


def base_env() -> dict[str, str]:
    """The environment a job's launcher processes start from: this process's, less what a
    launcher sets per rank and the table variables (a job hands its own)."""
    return {k: v for k, v in os.environ.items() if k not in RANK_VARS and k not in (TABLE_ENV, OTHER_TABLE_ENV[0])}


def encode(obj) -> str:
    """A JSON value as one environment-safe word (base64 of the JSON)."""
    return base64.b64encode(json.dumps(obj, separators=(",", ":")).encode()).decode()


def decode(word: str):
    return json.loads(base64.b64decode(word.encode()).decode())


def free_port(host: str = "") -> int:
    """A TCP port free on ``host`` (every address: ``""``) at this moment."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def launch_commands(cfg: LaunchConfig, nodes: int, gpus_per_node: int, env: dict[str, str],
                    module: str = "ncclrl.envs.worker") -> list[tuple[list[str], dict[str, str]]]:
    """The processes ncclrl itself starts for a job of ``nodes x gpus_per_node`` ranks: each a
    command line and the environment it adds. ``env`` is what every rank must see (the job, the
    table, NCCL's variables); rendezvous variables are added here."""
    nranks = nodes * gpus_per_node
    if TABLE_ENV in env:
        env = {k: v for k, v in env.items() if k not in OTHER_TABLE_ENV}
    py = cfg.python or sys.executable
    hosts = list(cfg.hosts)
    if hosts and len(hosts) != nodes:
        raise ConfigError("launcher.hosts", f"the topology has {nodes} nodes, {len(hosts)} hosts given: "
                          f"{', '.join(hosts)}")
    addr = cfg.master_addr or (hosts[0] if hosts and hosts[0] not in LOCAL_HOSTS else "127.0.0.1")
    port = int(cfg.port) or free_port()
    rdzv = {"MASTER_ADDR": addr, "MASTER_PORT": str(port)}
    extra = shlex.split(cfg.extra_args)
    worker = [py, "-m", module]
    if cfg.kind == "local":
        out = []
        for r in range(nranks):
            e = dict(env, **rdzv, RANK=str(r), WORLD_SIZE=str(nranks), LOCAL_RANK=str(r % gpus_per_node),
                     LOCAL_WORLD_SIZE=str(gpus_per_node), GROUP_RANK=str(r // gpus_per_node))
            out.append((worker, e))
        return out
    if cfg.kind == "mpirun":
        prog = cfg.program or "mpirun"
        full = dict(env, **rdzv)
        cmd = [prog, "-np", str(nranks), "--bind-to", "none"]
        if hosts and not cfg.emulated:
            cmd += ["-H", ",".join(f"{h}:{gpus_per_node}" for h in hosts), "--map-by", f"ppr:{gpus_per_node}:node"]
        else:  # this host only: inside an allocation mpirun would spread the ranks over its nodes
            cmd += ["-H", f"localhost:{nranks}", "--oversubscribe"]
        for k in sorted(full) + [k for k in PASS_ON if k in os.environ and k not in full]:
            cmd += ["-x", k]
        return [(cmd + extra + worker, full)]
    if cfg.kind == "srun":
        prog = cfg.program or "srun"
        full = dict(env, **rdzv)
        if not cfg.master_addr:
            full["MASTER_ADDR"] = ""  # the worker takes the first node of SLURM_JOB_NODELIST (first_node)
        # no per-task GPU binding: each task picks its GPU by local rank among all of its node's
        cmd = [prog, f"--nodes={nodes}", f"--ntasks={nranks}", f"--ntasks-per-node={gpus_per_node}",
               "--kill-on-bad-exit=1", "--export=ALL", "--wait=30", "--gpu-bind=none"]
        return [(cmd + extra + worker, full)]
    # torchrun: one agent per node
    prog = cfg.program or "torchrun"
    out = []
    for n in range(nodes):
        e = dict(env, **rdzv)
        cmd = [prog, f"--nnodes={nodes}", f"--nproc-per-node={gpus_per_node}", "--rdzv-backend=c10d",
               f"--rdzv-endpoint={addr}:{port}", f"--rdzv-id=ncclrl-{port}", "--max-restarts=0", *extra,
               "-m", module]
        if not cfg.program:  # torchrun of the same Python on every node, whatever PATH a remote shell has
            cmd = [py, "-m", "torch.distributed.run", *cmd[1:]]
        host = hosts[n] if hosts else ""
        if cfg.emulated:
            e["NCCL_HOSTID"] = f"ncclrl-node{n}"
            out.append((cmd, e))
        elif n == 0 and host in LOCAL_HOSTS + (socket.gethostname(),):
            out.append((cmd, e))
        else:
            # the remote agent gets the job's environment on its command line (ssh forwards none)
            assigns = [f"{k}={shlex.quote(v)}" for k, v in sorted(e.items())]
            remote = [w.replace("{host}", host) for w in shlex.split(cfg.remote)]
            line = remote + ["env", *assigns, *map(shlex.quote, cmd)]
            if sum(len(w) + 1 for w in line) > MAX_ENV_BYTES:
                raise ConfigError("launcher.remote", f"the command for {host} is {sum(len(w) + 1 for w in line)} "
                                  f"bytes, more than one remote command line holds ({MAX_ENV_BYTES}); use "
                                  "launcher=srun or mpirun, or measure fewer sizes at once")
            out.append((line, {}))
    return out


def first_node(nodelist: str) -> str:
    """The first host of a Slurm node list: ``gpu[01-04,07],login1`` -> ``gpu01``,
    ``rack[1-2]-node[01-04]`` -> ``rack1-node01``, ``node[1-2]-ib`` -> ``node1-ib``."""
    depth, end = 0, len(nodelist)
    for i, c in enumerate(nodelist):  # the first host expression ends at a comma outside brackets
        depth += (c == "[") - (c == "]")
        if c == "," and depth == 0:
            end = i
            break
    return re.sub(r"\[([^\]]*)\]", lambda m: m.group(1).split(",")[0].split("-")[0], nodelist[:end])



@dataclass
class JobOptions:
    """The timeouts of one job.

    :param timeout_s: the job is ended once it has written nothing for this long (``progress``:
        ``output``), or once it has run this long (``progress``: ``total``)
    :param grace_s: between SIGTERM and SIGKILL when the job is ended
    :param exit_grace_s: how long the processes may take to exit after every rank said it is done
        (a rank stuck in its teardown is ended then; what it reported is kept)
    :param read_grace_s: how long a finished job's output may stay silent before reading stops
    :param progress: ``output`` (any line is progress) or ``total``
    :param poll_s: how often the loop looks
    """

    timeout_s: float = 300.0
    grace_s: float = 10.0
    exit_grace_s: float = 5.0
    read_grace_s: float = 5.0
    progress: str = "output"
    poll_s: float = 0.2

    def __post_init__(self) -> None:
        if self.progress not in ("output", "total"):
            raise ConfigError("progress", f"allowed: output, total; got {self.progress!r}")


@dataclass
class JobSpec:
    """One job: who runs it (``launcher``, ``nodes`` x ``gpus_per_node`` ranks), what every rank
    is handed (``env``: the job, its table, NCCL's variables), the worker module each rank runs,
    and the job's timeouts (``options``). :meth:`commands` are its processes' command lines."""

    launcher: LaunchConfig
    nodes: int
    gpus_per_node: int
    env: dict[str, str]
    module: str = WORKER
    options: JobOptions = field(default_factory=JobOptions)

    def __post_init__(self) -> None:
        if self.nodes < 1 or self.gpus_per_node < 1:
            raise ConfigError("topology", f"a job needs >= 1 node and GPU per node, got {self.nodes} x "
                              f"{self.gpus_per_node}")
        for k, v in self.env.items():
            if len(v.encode()) > MAX_ENV_BYTES:
                raise ConfigError("points" if k == JOB_ENV else "table", f"{k} would hold {len(v.encode())} bytes, "
                                  f"more than one environment variable holds ({MAX_ENV_BYTES}); measure fewer sizes "
                                  "or collectives at once")

    @property
    def nranks(self) -> int:
        return self.nodes * self.gpus_per_node

    def commands(self) -> list[tuple[list[str], dict[str, str]]]:
        return launch_commands(self.launcher, self.nodes, self.gpus_per_node, self.env, self.module)
