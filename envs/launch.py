"""Starting a job's processes on one host or many, and ending all of them.

A *job* is one set of processes, one per GPU, that together make one NCCL communicator. The
launcher (``LaunchConfig.kind``) decides how they start:

* ``local``: ncclrl starts one process per rank on this host (several "nodes" on one host are
  emulated with a distinct ``NCCL_HOSTID`` per node and sockets on loopback);
* ``torchrun``: one ``torchrun`` agent per node (c10d rendezvous), started on this host or through
  ``remote`` (``ssh {host}`` by default) on the others;
* ``srun``: one Slurm step of ``nodes x gpus_per_node`` tasks inside the user's allocation;
* ``mpirun``: Open MPI with a host list, ranks per node and the environment forwarded with ``-x``.

Every process learns its rank, the world size and its local rank from its launcher's environment
(:func:`rank_env`), picks its GPU by local rank, and meets the others through a TCP rendezvous on
``MASTER_ADDR:MASTER_PORT``. What a job must know (its points, the table it forces, the knobs) is
handed over in environment variables, never through a file, so it reaches every node byte for byte
without a shared file system. Each process writes one-line records ``NCCLRL|rank|kind|payload`` to
its standard output, which every launcher forwards; the driver reads them as they come
(:class:`Job`). A timeout or a kill ends the launcher's whole process group (and with it the remote
ranks: Open MPI and Slurm end a job's ranks when their launcher dies; every worker also runs a
watchdog that ends it when its job stops making progress), and on this host every process that
carries the job's token in its environment (:data:`TOKEN_ENV`), wherever it moved: a daemon a rank
started in a session of its own, a process left running after the job. A launcher process that
exits non-zero ends the job soon after (:attr:`Job.fail_grace_s`): the other nodes' agents would
otherwise wait for the missing rank until the timeout.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import re
import secrets
import select
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from ncclrl.costmodel.errors import ConfigError

KINDS = ("local", "torchrun", "srun", "mpirun")
MARK = "NCCLRL|"
READ_MAX_S = 30.0  # the longest a finished job's output is still read (Job.close)
# the environment variables a job hands its processes (besides NCCL's and the knobs)
JOB_ENV = "NCCLRL_JOB"
TABLE_ENV = "NCCLRL_TUNER_TABLE_DATA"
# a job that hands its table in TABLE_ENV (empty: NCCL's own decisions) gets none of these from the
# user's environment: they would make the plugin read another table (a deployment's file), or hold
# the job's table to a deployment's fingerprint and fail its init
OTHER_TABLE_ENV = ("NCCLRL_TUNER_TABLE", "NCCL_TUNER_CONFIG_FILE", "NCCLRL_TUNER_TABLE_FINGERPRINT")
# set in the environment of every process a Job starts, a new value per job: every process on this
# host that inherited it belongs to the job, whatever its session, group or parent became
TOKEN_ENV = "NCCLRL_JOB_TOKEN"
# the first rank to fail and its exit code, as torchrun's summary and Open MPI's notice print them
TORCHRUN_RANK = re.compile(r"^\s*rank\s*:\s*(\d+)")
TORCHRUN_EXIT = re.compile(r"^\s*exitcode\s*:\s*(-?\d+)")
MPI_RANK = re.compile(r"^\s*Process name:\s*\[.*[,@]\d+,(\d+)\]|^\s*Process name:\s*\[\[\d+,\d+\],(\d+)\]")
MPI_EXIT = re.compile(r"^\s*Exit code:\s*(-?\d+)")
# torchrun's own output, never a rank's: its log lines (glog style: E1125 06:32:35.529000 4587 file:line])
# and its Python tracebacks (a failed job ends its agent with ChildFailedError and a summary)
AGENT_LOG = re.compile(r"^[EWIDF]\d{4} \d\d:\d\d:\d\d\.\d+ +\d+ \S+:\d+\] ")
AGENT_FRAME = "torch/distributed/run.py"
# a line of a rank's own output that says what went wrong
ERROR_WORDS = re.compile(r"Error\b|Exception\b|\berror\b|\bWARN\b|\bfailed\b|\bFATAL\b|Aborted|Killed")
# what mpirun forwards besides the job's variables, when set: the Python and libraries the ranks need
PASS_ON = ("PYTHONPATH", "LD_LIBRARY_PATH")
# the largest value one environment variable may hold on Linux (MAX_ARG_STRLEN)
MAX_ENV_BYTES = 131072 - 64
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


def encode(obj) -> str:
    """A JSON value as one environment-safe word (base64 of the JSON)."""
    return base64.b64encode(json.dumps(obj, separators=(",", ":")).encode()).decode()


def decode(word: str):
    return json.loads(base64.b64decode(word.encode()).decode())


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
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
class Record:
    """One line a worker wrote: ``NCCLRL|rank|kind|payload``."""

    rank: int
    kind: str
    payload: str


def parse_records(line: str) -> tuple[list[Record], str]:
    """The records in a line of a launcher's output, and the rest of the line. Launchers may prefix
    lines (``[1,0]<stdout>:``, ``[rank0]:``) and, forwarding many ranks, glue one rank's line onto
    another's or into NCCL's own output: every record is found wherever it starts."""
    parts = line.rstrip("\n").split(MARK)
    out, rest = [], parts[0]
    for part in parts[1:]:
        fields = part.split("|", 2)
        if len(fields) == 3 and fields[0].lstrip("-").isdigit():
            out.append(Record(int(fields[0]), fields[1], fields[2]))
        else:
            rest += MARK + part
    return out, rest


def parse_record(line: str) -> Record | None:
    """The first record in a line, or ``None``."""
    recs, _ = parse_records(line)
    return recs[0] if recs else None


def payload_json(payload: str):
    """A record's JSON payload; text glued after it (another rank's output) is ignored."""
    return json.JSONDecoder().raw_decode(payload.strip())[0]


@contextlib.contextmanager
def job_folder(prefix: str):
    """A temporary folder for a job's files, removed when the block ends. The folders live under
    ``$TMPDIR/ncclrl-<uid>/`` named with their process id, so those of a process that was killed
    (SIGKILL: no cleanup ran) are removed the next time any ncclrl process makes one."""
    import shutil
    import tempfile

    root = Path(tempfile.gettempdir()) / f"ncclrl-{os.getuid()}"
    root.mkdir(mode=0o700, exist_ok=True)
    for old in root.iterdir():
        m = re.search(r"-pid(\d+)-", old.name)
        if m and not _alive(int(m.group(1))):
            shutil.rmtree(old, ignore_errors=True)
    with tempfile.TemporaryDirectory(prefix=f"{prefix}-pid{os.getpid()}-", dir=root) as tmp:
        yield Path(tmp)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class Job:
    """A running job: its launcher processes, all in one new process group per process, and a
    reader that collects the workers' records as they arrive.

    :param commands: what :func:`launch_commands` returned
    :param base_env: the environment the launcher processes start from
    :param log_dir: where the launcher's own output goes (``launcher.log``)
    :param grace_s: seconds between SIGTERM and SIGKILL when the job is ended
    """

    def __init__(self, commands: list[tuple[list[str], dict[str, str]]], base_env: dict[str, str],
                 log_dir: Path, grace_s: float = 10.0) -> None:
        self.records: list[Record] = []
        self.nccl_warnings: list[str] = []
        self.last_output = time.time()
        self.grace_s = grace_s
        # after a launcher process exits non-zero, how long the others may still end by themselves
        # (and their ranks report) before done() says the job is over
        self.fail_grace_s = min(grace_s, 3.0)
        self.token = secrets.token_hex(12)
        self.rank_exit: tuple[int, int] | None = None  # (rank, code) of the first failed rank, as printed
        self._pending_rank: int | None = None
        self._first_fail: tuple[int, int] | None = None  # (process index, code) of the first seen to fail
        self._first_fail_at = 0.0
        self._local_ranks = len(commands) > 1 and all("RANK" in e for _, e in commands)  # launcher=local
        self.outputs = [LauncherOutput() for _ in commands]  # what each launcher process said, sorted
        self.rank_errors: dict[int, str] = {}  # a rank's own error record, the first per rank
        self._failed_codes: dict[int, int] = {}  # process index -> its non-zero exit code, before any kill
        self._killing = False
        self._lock = threading.Lock()
        self._log = open(Path(log_dir) / "launcher.log", "a", buffering=1)  # noqa: SIM115
        self.procs: list[subprocess.Popen] = []
        self._threads: list[threading.Thread] = []
        for cmd, env in commands:  # every process before any reader thread: no fork while threads run
            self._log.write("$ " + " ".join(shlex.quote(c) for c in cmd) + "\n")
            penv = dict(base_env, **env, **{TOKEN_ENV: self.token})
            if TABLE_ENV in env:  # the job's own table, and no other (OTHER_TABLE_ENV)
                for k in OTHER_TABLE_ENV:
                    penv.pop(k, None)
            try:
                p = subprocess.Popen([sys.executable, "-c", PDEATHSIG_EXEC, *cmd], env=penv,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     start_new_session=True, text=True, errors="replace", bufsize=1)
            except OSError as e:
                self.kill()
                raise ConfigError("launcher", f"could not start {cmd[0]}: {e.strerror}") from None
            self.procs.append(p)
        for i, p in enumerate(self.procs):
            t = threading.Thread(target=self._read, args=(p, i), daemon=True)
            t.start()
            self._threads.append(t)

    _closed = False
    _closing = False
    lingering = False  # a process left behind held the output open past close()
    read_grace_s = 5.0  # how long a finished job's output may stay silent before reading stops (close)

    def _read(self, p: subprocess.Popen, index: int = 0) -> None:
        """Read the launcher's output as it comes, line by line, to its end; once :meth:`close` is
        called, everything already written is still read, and reading stops at the end of the
        output or after ``read_grace_s`` of silence."""
        assert p.stdout is not None
        fd, buf, idle_since = p.stdout.fileno(), b"", None
        try:
            while True:
                ready, _, _ = select.select([fd], [], [], 0.05)
                if ready:
                    chunk = os.read(fd, 1 << 16)
                    if not chunk:
                        break
                    *lines, buf = (buf + chunk).split(b"\n")
                    for raw in lines:
                        if not self._line(raw.decode(errors="replace"), index):
                            return
                    idle_since = None
                elif self._closing:
                    idle_since = idle_since or time.time()
                    if time.time() - idle_since > self.read_grace_s:
                        self.lingering = True  # open, silent: something the job left behind holds it
                        return
            if buf:
                self._line(buf.decode(errors="replace"), index)
        except (OSError, ValueError):  # the pipe or the log closed under it
            return

    def _line(self, line: str, index: int = 0) -> bool:
        """Take one line of output of launcher process ``index``; False once the job is closed."""
        recs, rest = parse_records(line)
        with self._lock:
            if self._closed:
                return False
            self.last_output = time.time()
            self.records += recs
            for r in recs:
                if r.kind == "error" and r.rank not in self.rank_errors:
                    self.rank_errors[r.rank] = " ".join(r.payload.split())[:300]
            if rest.strip():
                self._log.write(rest + "\n")  # the raw output, torchrun's tracebacks too: for debugging
                if "NCCL WARN" in rest:
                    self.nccl_warnings.append(rest.strip()[-300:])
                self._note_exit(rest)
                if 0 <= index < len(self.outputs):
                    self.outputs[index].add(rest)
        return True

    def _note_exit(self, line: str) -> None:
        """The first failed rank and its exit code, from torchrun's failure summary (``rank : R``
        then ``exitcode : C``) or Open MPI's notice (``Process name: [...,R]`` then ``Exit code: C``)."""
        if self.rank_exit is not None:
            return
        m = TORCHRUN_RANK.match(line) or MPI_RANK.match(line)
        if m:
            self._pending_rank = int(next(g for g in m.groups() if g is not None))
            return
        m = TORCHRUN_EXIT.match(line) or MPI_EXIT.match(line)
        if m and self._pending_rank is not None:
            self.rank_exit = (self._pending_rank, int(m.group(1)))

    def take(self) -> list[Record]:
        """The records that arrived since the last call."""
        with self._lock:
            out, self.records = self.records, []
        return out

    def poll(self) -> list[int | None]:
        codes = [p.poll() for p in self.procs]
        if not self._killing:  # each process's own failure, before a kill adds its codes
            for i, c in enumerate(codes):
                if c not in (None, 0):
                    self._failed_codes.setdefault(i, c)
        if self._first_fail is None:  # the first failure seen, before a kill adds its own codes
            bad = [(i, c) for i, c in enumerate(codes) if c not in (None, 0)]
            if bad:
                self._first_fail, self._first_fail_at = bad[0], time.time()
        return codes

    def done(self) -> bool:
        """Whether the job is over: every launcher process ended, or one ended with a non-zero code
        ``fail_grace_s`` ago (a rank that failed at its start leaves the others waiting for it: the
        agents of other nodes until a timeout, under torchrun)."""
        codes = self.poll()
        if all(c is not None for c in codes):
            return True
        return self._first_fail is not None and time.time() - self._first_fail_at >= self.fail_grace_s

    def failed(self) -> int | None:
        """The exit code of the first launcher process seen to end non-zero, if any."""
        self.poll()
        return self._first_fail[1] if self._first_fail else None

    def failure(self) -> str:
        """Why the job failed, one clause per failed rank (``rank R exited with C: its last error
        line``), from the ranks' own words: an error record, or the last error line of the rank's own
        output (never the launcher's traceback: that stays in ``launcher.log``); ``""`` if nothing
        failed. The ranks come from torchrun's failure summaries (every node's), Open MPI's notice,
        or the rank's own process under launcher=local."""
        code = self.failed()
        if code is None:
            return ""
        with self._lock:
            if self._local_ranks:  # each rank its own process: its exit code and its own lines
                failed = [(i, c, self.outputs[i].last_error or NO_ERROR) for i, c in self._failed_codes.items()]
                if self._first_fail is not None:  # the first seen first
                    failed.sort(key=lambda f: f[0] != self._first_fail[0])
            else:
                failed = []
                for out in self.outputs:
                    # one rank failed on that node: the node's last error line is its; several: not told apart
                    own = (out.last_error or NO_ERROR) if len(out.failed) == 1 else MIXED
                    failed += [(r, c, own) for r, c in out.failed if r not in {f[0] for f in failed}]
                if not failed and self.rank_exit is not None:  # Open MPI's notice
                    failed = [(*self.rank_exit, MIXED)]
            errors = dict(self.rank_errors)
        if not failed:
            return f"the launcher exited with {code}"
        return "; ".join(f"rank {r} {exit_words(c)}: {errors.get(r) or own}" for r, c, own in failed)

    def kill(self) -> None:
        """End every process of the job: SIGTERM to each launcher's process group, SIGKILL after
        ``grace_s`` to whatever is left; then SIGKILL to every process on this host that carries the
        job's token, also after a job that ended well (what it left running)."""
        self.poll()
        self._killing = True
        live = [p for p in self.procs if p.poll() is None]
        # this host's processes of the job, whatever group or session they moved to (Open MPI puts
        # each rank in a group of its own): killed too if the launcher dies before it ends them
        spawned = set(descendants([p.pid for p in live])) | set(holding_token(self.token))
        for p in live:
            _signal_group(p, signal.SIGTERM)
        end = time.time() + self.grace_s
        while time.time() < end and any(p.poll() is None for p in live):
            time.sleep(0.1)
        for p in self.procs:  # the group too: a worker may outlive its launcher
            _signal_group(p, signal.SIGKILL)
        for _ in range(3):  # those that left the launcher's tree; again, for any they started meanwhile
            for pid in spawned:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
            spawned = set(holding_token(self.token))
            if not spawned:
                break
            time.sleep(0.05)
        for p in self.procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(timeout=5)

    def close(self) -> None:
        """Stop reading, once the processes have ended: what they wrote is read to its end, or until
        it has been silent for ``read_grace_s`` (at most :data:`READ_MAX_S` in all). A process the job
        left behind, in a session of its own and out of reach of the group kill, may hold the pipe
        open long after a complete run (``lingering`` says so)."""
        self._closing = True
        end = time.time() + READ_MAX_S
        for t in self._threads:
            t.join(timeout=max(0.0, end - time.time()))
        with self._lock:
            self._closed = True
            self.lingering = self.lingering or any(t.is_alive() for t in self._threads)
            self._log.close()


NO_ERROR = "it printed no error message"
MIXED = "its output is not told apart from the other ranks' (the launcher's output has it)"


def exit_words(code: int) -> str:
    """``exited with 3``, or ``was killed by SIGKILL`` for a negative code (a signal)."""
    if code < 0:
        with contextlib.suppress(ValueError):
            return f"was killed by {signal.Signals(-code).name}"
    return f"exited with {code}"


class LauncherOutput:
    """One launcher process's output, sorted: the ranks torchrun's failure summary names (with
    their exit codes) and the last error line of the ranks' own output; torchrun's log lines and
    its own tracebacks (the agent's ChildFailedError, a SignalException when it is ended) are
    neither."""

    def __init__(self) -> None:
        self.failed: list[tuple[int, int]] = []  # (rank, exit code) per entry of torchrun's summary
        self.last_error = ""  # the last line of the ranks' own output that says what went wrong
        self._block: list[str] | None = None  # a traceback being read
        self._summary = 0  # inside torchrun's summary: the '=====' lines seen
        self._rank: int | None = None

    def add(self, line: str) -> None:
        text = line.rstrip()
        if self._summary:
            self._in_summary(text)
            return
        if self._block is not None:
            self._block.append(text)
            if text and not text[0].isspace() and not text.startswith("Traceback"):  # the exception line
                block, self._block = self._block, None
                if any(AGENT_FRAME in x for x in block):  # the agent's own traceback
                    if "ChildFailedError" in text:  # its failure summary follows, between '=====' lines
                        self._summary = 1
                    return
                self._note(text)
            return
        if text.startswith("Traceback (most recent call last)"):
            self._block = [text]
        elif not AGENT_LOG.match(text):
            self._note(text)

    def _in_summary(self, text: str) -> None:
        if text.startswith("====="):
            self._summary += 1
            if self._summary > 2:  # the line that closes the summary
                self._summary = 0
            return
        m = TORCHRUN_RANK.match(text)
        if m:
            self._rank = int(m.group(1))
            return
        m = TORCHRUN_EXIT.match(text)
        if m and self._rank is not None:
            if self._rank not in {r for r, _ in self.failed}:
                self.failed.append((self._rank, int(m.group(1))))
            self._rank = None

    def _note(self, text: str) -> None:
        if text[:1].isspace():  # a traceback's frames and source lines: its last line says what went wrong
            return
        if ERROR_WORDS.search(text):
            self.last_error = " ".join(text.split())[:300]


# Each launcher runs in a process group of its own (what a timeout ends) and gets SIGTERM when
# ncclrl dies, even by SIGKILL (Linux): set in a small exec wrapper, not in a fork of this
# multi-threaded process.
PDEATHSIG_EXEC = ("import ctypes, os, signal, sys\n"
                  "try:\n    ctypes.CDLL(None).prctl(1, signal.SIGTERM)\nexcept (OSError, AttributeError):\n    pass\n"
                  "try:\n    os.execvp(sys.argv[1], sys.argv[1:])\n"
                  "except OSError as e:\n    print(f'could not start {sys.argv[1]}: {e.strerror}', flush=True)\n"
                  "    os._exit(127)")


class Terminated(SystemExit):
    """SIGTERM (a preemption, ``scancel``) while a job runs: the job is ended, then ncclrl exits."""


class SigtermLatch:
    """Whether SIGTERM arrived while :func:`ending_on_sigterm` was open; :meth:`check` raises
    :class:`Terminated` once, where the caller can stop without losing what it holds."""

    def __init__(self) -> None:
        self.requested = False
        self._raised = False

    def __call__(self, signum, frame) -> None:  # the signal handler: never raises mid-statement
        self.requested = True

    def check(self) -> None:
        if self.handled():
            raise Terminated(128 + signal.SIGTERM)

    def handled(self) -> bool:
        """Whether SIGTERM came and nobody acted on it yet; from now on the caller does."""
        if self.requested and not self._raised:
            self._raised = True
            return True
        return False


@contextlib.contextmanager
def ending_on_sigterm():
    """While it is open, SIGTERM only sets the latch it yields: the caller's wait loop calls
    ``latch.check()`` between reads, so records already taken from a job are never dropped half
    way; leaving the block raises :class:`Terminated` if SIGTERM came and nobody checked, after the
    caller's ``finally`` ended its job (what was stored before stays)."""
    latch = SigtermLatch()
    if threading.current_thread() is not threading.main_thread():
        yield latch
        return
    prev = signal.signal(signal.SIGTERM, latch)
    try:
        yield latch
    finally:
        signal.signal(signal.SIGTERM, prev)
    latch.check()


def descendants(pids: list[int]) -> list[int]:
    """Every process on this host descended from ``pids`` (from ``/proc``; empty where there is none)."""
    children: dict[int, list[int]] = {}
    for d in Path("/proc").iterdir() if Path("/proc").is_dir() else []:
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])  # the name in parentheses may hold spaces
        children.setdefault(ppid, []).append(int(d.name))
    out, todo = [], list(pids)
    while todo:
        for c in children.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


def holding_token(token: str) -> list[int]:
    """The processes on this host whose environment holds ``TOKEN_ENV=token`` (from
    ``/proc/PID/environ``: the environment each started with, inherited by everything it started,
    whatever session or parent it moved to); this process never."""
    want, out = f"{TOKEN_ENV}={token}".encode(), []
    for d in Path("/proc").iterdir() if Path("/proc").is_dir() else []:
        if not d.name.isdigit() or int(d.name) == os.getpid():
            continue
        try:
            env = (d / "environ").read_bytes()
        except OSError:  # gone, or another user's
            continue
        if want in env.split(b"\0"):
            out.append(int(d.name))
    return out


def _signal_group(p: subprocess.Popen, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(p.pid, sig)


def run_to_end(commands: list[tuple[list[str], dict[str, str]]], base_env: dict[str, str], log_dir: Path,
               timeout_s: float, grace_s: float = 10.0) -> tuple[list[Record], str]:
    """Run one job to its end (or until it makes no progress for ``timeout_s``, or a rank reports
    an error); every process is ended afterwards. Returns the records and the launcher's other
    output (what NCCL printed). Raises :class:`ConfigError` with the reason when it did not end well."""
    records: list[Record] = []
    with ending_on_sigterm() as latch:
        job = Job(commands, base_env, log_dir, grace_s=grace_s)
        started, why = time.time(), ""
        try:
            while not job.done():
                latch.check()
                records += job.take()
                errors = [r for r in records if r.kind == "error"]
                if errors:
                    time.sleep(grace_s)
                    why = f"rank {errors[0].rank}: {errors[0].payload}"
                    break
                if time.time() - max(started, job.last_output) > timeout_s:
                    why = f"timed out: no progress for {timeout_s:.0f} s; the job was ended"
                    break
                time.sleep(0.2)
        finally:
            job.kill()
            job.close()
        records += job.take()
    text = (Path(log_dir) / "launcher.log").read_text(errors="replace")
    if not why and job.failed():
        why = job.failure()
    if not why and not any(r.kind == "done" for r in records):
        why = "the job ended without finishing"
    if why:
        raise ConfigError("launcher", why)
    return records, text


def run_worker(main) -> None:
    """Run a worker's ``main`` and end the process with its code; an exception becomes one
    ``error`` record (rank from the launcher's environment, -1 when unknown) and exit code 1. The
    exit skips interpreter teardown, which can hang in NCCL or gloo after a failure."""
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


def start_coordinator(folder: Path, keys: list[str], log_file: Path, env: dict[str, str] | None = None,
                      timeout_s: float = 60.0) -> tuple[subprocess.Popen, int]:
    """Start ``ncclrl coordinator`` (its ``keys`` besides ``port`` and ``port_file``) in ``folder``,
    its messages into ``log_file``; returns the process and the port, once it listens. A coordinator
    that exits or does not listen within ``timeout_s`` is one :class:`ConfigError` on ``online``."""
    folder = folder.resolve()
    port_file = folder / "coordinator.port"
    port_file.unlink(missing_ok=True)
    with log_file.open("w") as err:
        proc = subprocess.Popen([sys.executable, "-m", "ncclrl", "coordinator", "port=0", f"port_file={port_file}",
                                 *keys], stdout=subprocess.DEVNULL, stderr=err, env=env, cwd=folder)
    t0 = time.monotonic()
    while not port_file.exists():
        if proc.poll() is not None or time.monotonic() - t0 > timeout_s:
            proc.kill()
            raise ConfigError("online", "the coordinator did not start: " + log_file.read_text()[-500:])
        time.sleep(0.05)
    return proc, int(port_file.read_text())
