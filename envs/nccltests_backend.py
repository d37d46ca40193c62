"""Live NCCL measurements through the user's nccl-tests binaries, on one node or a cluster.

Each configuration runs through NCCL's own mechanisms: per-process knobs as environment variables,
the per-call decision (algorithm, protocol, channels) through our tuner plugin and a one-row table.
One *launch* covers every requested size of one configuration (``-b``/``-e``/``-f 2``) and gives
one sample per size (nccl-tests averages ``-n`` iterations); the samples of a request are taken
round-robin over its configurations, so NCCL's default and the candidates see the same drift.

What each launcher (:class:`ncclrl.envs.jobs.LaunchConfig`, group ``launcher=``) runs, for a
topology of N nodes x G GPUs (arguments as a list, no shell; ``extra_args`` go just before the
binary):

* ``local``: one process on this host, ``<binary> <args> -g G``: it drives every GPU. One node
  only: nccl-tests' ranks in one process share one host identity, so several nodes cannot be
  emulated this way (a multi-node topology is a configuration error; use mpirun without hosts).
* ``mpirun``: ``mpirun -np N*G --bind-to none -H h1:G,h2:G --map-by ppr:G:node -x VAR... <binary>
  <args> -g 1``; every variable the ranks need is forwarded with ``-x``. Without hosts every rank
  runs on this host, ``--oversubscribe``, and each emulated node is its own application context
  (``-np G -x NCCL_HOSTID=ncclrl-node<n> <binary> ... : ...``) so that NCCL sees N nodes talking
  over sockets (on ``lo`` unless ``NCCL_SOCKET_IFNAME`` is set).
* ``srun``: ``srun --nodes=N --ntasks=N*G --ntasks-per-node=G --mpi=<mpi> --kill-on-bad-exit=1
  --export=ALL --gpu-bind=none <binary> <args> -g 1`` inside the user's allocation; nccl-tests must
  be built with ``MPI=1`` against an MPI that ``--mpi`` serves.
* ``torchrun`` starts Python workers, not binaries: a configuration error here.

Every task must see all of its node's GPUs: nccl-tests gives rank ``localRank`` the devices
``localRank*g ... localRank*g+g-1`` (``-g 1`` under a launcher), so no per-task GPU binding is
asked for. ``<args>`` are ``-b lo -e hi -f 2 -n iters -w warmup -c 0 -T t`` (``-T``: nccl-tests' own
timeout, present since 2.13: when one wait for a size's iterations exceeds ``t`` seconds it aborts
its communicators and prints ``Test timeout``; ``t`` is half the launch's ``timeout_s``).

What the ranks are given: every ``NCCL_*`` and ``NCCLRL_*`` variable of the user's environment
(``NCCLRL_TUNER_TABLE`` excepted), the point's knobs (``NCCL_BUFFSIZE``, ...), ``NCCL_TUNER_PLUGIN``
(our plugin's path, the same on every node; ``none`` for NCCL's default), the table's text in
``NCCLRL_TUNER_TABLE_DATA`` (no file: it reaches every node byte for byte, no shared file system
needed), ``NCCL_NVLS_ENABLE=0`` and friends with ``nvls="off"`` (``as-is``, the default, leaves the
user's choice), and, unless the user set ``NCCL_DEBUG``, ``NCCL_DEBUG=INFO
NCCL_DEBUG_SUBSYS=INIT,ENV,TUNING``: then every rank's plugin logs the table it loaded with its
FNV-1a fingerprint, and a launch whose ranks disagree (different fingerprints, one that is not the
table sent, or a rank that logged none once the table is running) is stopped at once and fails with
``ranks disagree on the table: ...`` (ranks that decide differently would hang NCCL). With the
user's own ``NCCL_DEBUG`` the check runs when their settings print the plugin's INFO lines
(``TUNING``; ``NCCL_DEBUG_SUBSYS`` unset gets TUNING added), and not with ``NCCL_DEBUG_FILE``.

Faults, per launch (its points are stored failed with a one-line reason; nothing else is lost):
a launch still running after ``timeout_s`` is ended with its whole process group (SIGTERM, SIGKILL
after ``launcher.grace_s``; Open MPI and Slurm end the remote ranks with their launcher) and fails
with ``timed out ...`` (the store's status ``timeout``), with NCCL's first ``WARN`` appended; a
non-zero exit, an NCCL ``WARN``, wrong results or a truncated table fail as such; so does a run
whose ``# Rank`` lines count other than the topology's ranks (``the job ran 1 rank, the topology
has 4``: e.g. nccl-tests built without MPI). SIGTERM (preemption) ends the running launch the same
way and ends ncclrl; what earlier jobs measured is in the store. One :meth:`NcclTestsBackend.measure`
call is one stored job and covers at most ``configs_per_job`` configurations; the rest of a request
is left for the next call (:func:`ncclrl.envs.measure.measure_whole` makes it), so a preemption
costs at most one job.

After each call, ``nccl_version`` is the NCCL that ran (NCCL's ``NCCL version`` line, else
nccl-tests' ``nccl-library=``) and ``provenance`` what ran the job (hosts and GPUs from the
``# Rank`` lines, the command, the NCCL environment the ranks were given), as
:meth:`ncclrl.envs.store.Store.add_job` takes it.
"""

from __future__ import annotations

import logging
import math
import os
import re
import shlex
import time
import uuid
from pathlib import Path

from ncclrl.costmodel.errors import ConfigError
from ncclrl.costmodel.nccltests import (
    NcclTestsError,
    RankLine,
    library_version,
    parse_stdout,
    perf_timeout,
    rank_lines,
    split_log,
    strip_prefixes,
)
from ncclrl.costmodel.space import Point
from ncclrl.costmodel.table import fingerprint, format_row
from ncclrl.envs.backend import Backend
from ncclrl.envs.jobs import (
    FORWARD,
    LOCAL_HOSTS,
    MAX_ENV_BYTES,
    TABLE_ENV,
    Interrupted,
    JobOptions,
    LaunchConfig,
    job_folder,
    run_job,
)
from ncclrl.envs.live import SAFE_ENV, TIMEOUT

log = logging.getLogger(__name__)

PROGRAMS = {"allreduce": "all_reduce_perf", "allgather": "all_gather_perf", "reducescatter": "reduce_scatter_perf",
            "broadcast": "broadcast_perf", "reduce": "reduce_perf"}
NVLS = ("as-is", "off")
# what NCCL logs by default (NCCL_DEBUG_SUBSYS unset) and what the table check needs besides
NCCL_DEFAULT_SUBSYS = "INIT,BOOTSTRAP,ENV"
DEBUG_ENV = {"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,ENV,TUNING"}
# the plugin's INFO line at each communicator's init: the table it loaded and where from, or none
TABLE_LINE = re.compile(r"table from (\S+) \(\d+ bytes, \d+ rows, fingerprint ([0-9a-fA-F]{16})\)")
NO_TABLE_LINE = re.compile(r"no table at (\S+)")
DISAGREE = "ranks disagree on the table"
# how long after the table starts printing a rank may still be missing its plugin line
LATE_LINE_S = 5.0
# how long the output is still read after the launch's processes ended (a process they left behind
# may hold it open: the launch is done at its exit, not at the end of its output)
READ_GRACE_S = 0.5


class NcclTestsBackend(Backend):
    """Measure points with nccl-tests (see the module's description).

    :param binary_dir: folder holding the user's ``*_perf`` binaries (the same path on every node)
    :param nranks: ranks of the job (the topology's GPUs)
    :param launcher: how the ranks start (:class:`LaunchConfig`, or a kind: local, mpirun, srun)
    :param plugin: our tuner plugin (needed for forced per-call decisions; the same path on every node)
    :param timeout_s: per launch; nccl-tests' own ``-T`` gets half of it
    :param iters: nccl-tests ``-n``
    :param warmup: nccl-tests ``-w``
    :param extra_env: more variables every rank gets
    :param nodes: the topology's nodes
    :param gpus_per_node: the topology's GPUs per node (0: ``nranks // nodes``)
    :param nvls: ``as-is`` (NVLink SHARP as the user's environment has it) or ``off``
    :param configs_per_job: configurations one :meth:`measure` call (one stored job) covers; 0: all
    :param log_dir: keep each launch's output here (``<job>-<n>/launcher.log``; default: not kept)
    """

    name = "nccl-tests"
    launch = "nccl-tests"  # its own timing: the store's timing is eager

    def __init__(self, binary_dir: str | Path, nranks: int, launcher: LaunchConfig | str = "local",
                 plugin: str | Path | None = None, timeout_s: float = 120.0, iters: int = 20, warmup: int = 5,
                 extra_env: dict | None = None, *, nodes: int = 1, gpus_per_node: int = 0, nvls: str = "as-is",
                 configs_per_job: int = 4, log_dir: str | Path | None = None) -> None:
        super().__init__()
        self.binary_dir = Path(binary_dir)
        if not self.binary_dir.is_dir():
            raise ConfigError("nccltests.binary_dir", f"not a folder: {self.binary_dir}; point it at the folder "
                              "holding all_reduce_perf and friends (nccl-tests' build/)")
        self.launcher = LaunchConfig.of(launcher)
        self.launcher.check()
        gpus_per_node = gpus_per_node or (nranks // nodes if nodes > 0 else 0)
        if nodes < 1 or gpus_per_node < 1 or nodes * gpus_per_node != nranks:
            raise ConfigError("topology", f"{nranks} ranks are not {nodes} nodes x {gpus_per_node} GPUs")
        if nvls not in NVLS:
            raise ConfigError("nvls", f"allowed: {', '.join(NVLS)}; got {nvls!r}")
        if self.launcher.kind == "torchrun":
            raise ConfigError("launcher", "nccl-tests runs under launcher=mpirun or launcher=srun (or local on one "
                              "node), not torchrun")
        if self.launcher.kind == "local" and nodes > 1:
            raise ConfigError("launcher", f"launcher=local runs nccl-tests as one process on one node; for {nodes} "
                              "nodes use launcher=mpirun (without hosts it emulates the nodes here) or srun")
        if self.launcher.hosts and len(self.launcher.hosts) != nodes:
            raise ConfigError("launcher.hosts", f"the topology has {nodes} nodes, {len(self.launcher.hosts)} hosts "
                              f"given: {', '.join(self.launcher.hosts)}")
        if timeout_s <= 0 or configs_per_job < 0:
            raise ConfigError("timeout_s", f"must be > 0 (configs_per_job >= 0), got {timeout_s}, {configs_per_job}")
        self.nranks, self.nodes, self.gpus_per_node = nranks, nodes, gpus_per_node
        self.timeout_s, self.iters, self.warmup, self.nvls = timeout_s, iters, warmup, nvls
        self.configs_per_job = configs_per_job
        self.plugin = Path(plugin).resolve() if plugin else None
        self.extra_env = {str(k): str(v) for k, v in (extra_env or {}).items()}
        self.log_dir = Path(log_dir) if log_dir else None
        self.provenance: dict = {}
        self._job_cmd, self._job_env, self._ranks = "", {}, 0
        self._hosts: set[str] = set()
        self._gpus: set[str] = set()
        self._cuda: set[str] = set()

    # ---- command lines ----

    def _binary(self, collective: str) -> Path:
        b = self.binary_dir / PROGRAMS[collective]
        if not (b.exists() and os.access(b, os.X_OK)):
            raise ConfigError("nccltests.binary_dir", f"{b} is missing or not executable")
        return b

    @property
    def emulated(self) -> bool:
        """Several nodes on this host (mpirun without hosts)."""
        return self.launcher.kind == "mpirun" and self.nodes > 1 and \
            all(h in LOCAL_HOSTS for h in self.launcher.hosts)

    def perf_args(self, lo: int, hi: int) -> list[str]:
        """nccl-tests' arguments for one launch over ``lo``..``hi`` bytes (``-g`` excepted)."""
        return ["-b", str(lo), "-e", str(hi), "-f", "2", "-n", str(self.iters), "-w", str(self.warmup), "-c", "0",
                "-T", str(max(1, int(self.timeout_s // 2)))]

    def command(self, binary: Path, args: list[str], env: dict[str, str]) -> list[str]:
        """The launch's command line; ``env`` is what every rank must see (mpirun forwards each
        variable of it with ``-x``)."""
        cfg, g, n = self.launcher, self.gpus_per_node, self.nranks
        extra = shlex.split(cfg.extra_args)
        if cfg.kind == "local":
            return [*extra, str(binary), *args, "-g", str(g)]
        if cfg.kind == "srun":
            return [cfg.program or "srun", f"--nodes={self.nodes}", f"--ntasks={n}", f"--ntasks-per-node={g}",
                    f"--mpi={cfg.mpi}", "--kill-on-bad-exit=1", "--export=ALL", "--gpu-bind=none", *extra,
                    str(binary), *args, "-g", "1"]
        cmd = [cfg.program or "mpirun", "--bind-to", "none"]
        if self.emulated:
            cmd += ["-H", f"localhost:{n}", "--oversubscribe"]  # inside an allocation mpirun would spread them
            for k in sorted(env):
                cmd += ["-x", k]
            cmd += extra
            for node in range(self.nodes):
                cmd += [*([":"] if node else []), "-np", str(g), "-x", f"NCCL_HOSTID=ncclrl-node{node}", str(binary),
                        *args, "-g", "1"]
            return cmd
        cmd += ["-np", str(n)]
        if cfg.hosts and not all(h in LOCAL_HOSTS for h in cfg.hosts):
            cmd += ["-H", ",".join(f"{h}:{g}" for h in cfg.hosts), "--map-by", f"ppr:{g}:node"]
        else:
            cmd += ["-H", f"localhost:{n}", "--oversubscribe"]
        for k in sorted(env):
            cmd += ["-x", k]
        return [*cmd, *extra, str(binary), *args, "-g", "1"]

    def rank_env(self, config: Point, table: str | None) -> tuple[dict[str, str], bool]:
        """What every rank is given for ``config`` (forcing ``table`` when not ``None``), and
        whether the ranks' plugin lines will show which table each loaded."""
        user = {**os.environ, **self.extra_env}
        env = {k: v for k, v in user.items() if k.startswith(FORWARD) and k not in ("NCCLRL_TUNER_TABLE", TABLE_ENV)}
        env.update(self.extra_env)
        check = False
        if "NCCL_DEBUG_FILE" in user:
            pass  # NCCL's lines go to the user's files: the table cannot be checked
        elif "NCCL_DEBUG" not in user:
            env.update(DEBUG_ENV)
            check = True
        elif user["NCCL_DEBUG"].strip().upper() in ("INFO", "TRACE"):
            spec = user.get("NCCL_DEBUG_SUBSYS")
            if spec is None:
                env["NCCL_DEBUG_SUBSYS"] = NCCL_DEFAULT_SUBSYS + ",TUNING"
                check = True
            else:
                names = {x.strip().upper() for x in spec.lstrip("^").split(",")}
                hit = "TUNING" in names or "ALL" in names
                check = not hit if spec.strip().startswith("^") else hit
        if self.nvls == "off":
            env.update(SAFE_ENV)
        if self.emulated:
            env.pop("NCCL_HOSTID", None)  # one per emulated node, on the command line
            if "NCCL_SOCKET_IFNAME" not in user:
                env["NCCL_SOCKET_IFNAME"] = "lo"
        env.update(config.env())
        if table is None:
            env["NCCL_TUNER_PLUGIN"] = "none"
        else:
            env.update({"NCCL_TUNER_PLUGIN": str(self.plugin), TABLE_ENV: table})
        return env, check and table is not None

    # ---- one launch ----

    def launch_once(self, collective: str, sizes: list[int], config: Point, workdir: Path) -> dict[int, float]:
        """One launch: ``{size: time_us}`` (out-of-place); :class:`LaunchError` with a one-line reason
        when it times out, fails, or prints something that is not a complete, correct run of every rank."""
        table = None
        if not config.is_default:
            if self.plugin is None or not self.plugin.exists():
                raise ConfigError("plugin", "forcing a per-call decision needs our tuner plugin "
                                  "(`ncclrl plugin build`)")
            table = format_row(collective, 0, "max", config.algo, config.proto, config.channels) + "\n"
            if len(table.encode()) > MAX_ENV_BYTES:
                raise ConfigError("table", f"{len(table.encode())} bytes: more than one environment variable holds")
        env, check = self.rank_env(config, table)
        cmd = self.command(self._binary(collective), self.perf_args(min(sizes), max(sizes)), env)
        base = {k: v for k, v in os.environ.items() if k not in ("NCCLRL_TUNER_TABLE", TABLE_ENV)}
        workdir.mkdir(parents=True, exist_ok=True)
        watch = TableWatch(self.nranks, fingerprint(table) if check and table is not None else None)
        what = f"{config.algo}/{config.proto}/{config.channels}"
        self._note(cmd, env)
        text, code, timed_out, early = self._run(cmd, {**base, **env}, workdir, watch)
        self._seen(text)
        if early:
            raise LaunchError(early)
        clean, log = split_log(strip_prefixes(text))
        warn = next((f"; NCCL said: {ln.message}" for ln in log if ln.level in ("WARN", "ABORT")), "")
        if timed_out:
            if 0 < len(watch.seen) < self.nranks:  # some ranks' NCCL got the table, the others' did not
                raise LaunchError(f"{watch.missing()}; the launch then made no progress for {self.timeout_s:.0f} s")
            raise LaunchError(f"{TIMEOUT} after {self.timeout_s:.0f} s: the launch was ended{warn}")
        tt = perf_timeout(text)
        if tt is not None:
            raise LaunchError(f"{TIMEOUT}: nccl-tests' -T {tt[1]} s expired on {tt[0]} (it aborted NCCL){warn}")
        seen = rank_lines(clean)
        if not code and seen:  # processes that each ran alone interleave their runs: said before parsing
            self._check_ranks(seen)
        try:
            run = parse_stdout(text, source=f"{Path(cmd[0]).name if self.launcher.kind != 'local' else 'nccl-tests'}"
                               f" ({what})")
        except NcclTestsError as e:
            if code:
                raise LaunchError(f"exit {code}: {warn[2:] if warn else last_words(text, str(e))}") from None
            raise LaunchError(f"exit {code}: {e}") from None
        if code:
            raise LaunchError(f"exit {code}: {warn[2:] if warn else last_words(text, 'no output')}")
        if not seen:  # a run that printed no rank line at all
            self._check_ranks(seen)
        late = watch.verdict(final=True)
        if late:
            raise LaunchError(late)
        out: dict[int, float] = {}
        for r in run.records:
            if r.out_of_place is not None:
                t = r.out_of_place.time_us
                if not (math.isfinite(t) and t > 0):
                    raise LaunchError(f"nccl-tests printed an out-of-place time of {t:g} us at {r.nbytes} B: not a "
                                      "finite time > 0 (a broken timer or a corrupted output)")
                out[r.nbytes] = t
        return out

    def _check_ranks(self, lines: list[RankLine]) -> None:
        """Refuse a launch whose ``# Rank`` lines count other ranks than the topology's."""
        ranks = {r.rank for r in lines}
        if len(ranks) != self.nranks:
            hint = ""
            if len(lines) > len(ranks):
                hint = " (every process ran alone: is nccl-tests built with MPI=1?)"
            raise LaunchError(f"the job ran {len(ranks)} rank{'s' * (len(ranks) != 1)}, the topology has "
                              f"{self.nranks}{hint}")

    def _run(self, cmd: list[str], env: dict[str, str], workdir: Path,
             watch: TableWatch) -> tuple[str, int | None, bool, str]:
        """Run one launch to its end, its timeout, or the moment its ranks disagree on the table:
        ``(output, exit code, timed out, why it was stopped early)``."""
        log_file = workdir / "launcher.log"
        start = log_file.stat().st_size if log_file.exists() else 0
        reader = OutputTail(log_file, start)
        opts = JobOptions(timeout_s=self.timeout_s, grace_s=self.launcher.grace_s, read_grace_s=READ_GRACE_S,
                          progress="total", poll_s=0.05)
        end = run_job([(cmd, {})], env, workdir, opts, _Verdict(watch), on_poll=lambda: watch.add(reader.new_lines()))
        if end.interrupted:  # whatever is left of the launch was ended, on every node
            raise Interrupted(end.interrupted)
        job, early, timed_out = end.job, end.stopped, end.timed_out
        if job.lingering:
            log.warning("# %s: a process the launch left behind still holds its output; the launch ended at its "
                        "exit, later output is not read", Path(cmd[0]).name)
        watch.add(reader.new_lines() + [reader.rest])
        code = job.procs[0].returncode if job.procs else None
        return reader.all_text(), code, timed_out, early or watch.verdict(final=False)

    # ---- provenance ----

    def _note(self, cmd: list[str], env: dict[str, str]) -> None:
        if not self._job_cmd:
            self._job_cmd = " ".join(shlex.quote(c) for c in cmd)
            self._job_env = {k: v for k, v in env.items() if k.startswith("NCCL_") and k != "NCCL_TUNER_PLUGIN"}

    def _seen(self, text: str) -> None:
        ranks = rank_lines(text)
        if ranks:
            self._hosts.update(r.host for r in ranks)
            self._gpus.update(r.gpu for r in ranks)
            self._ranks = len({r.rank for r in ranks})
        version, cuda = library_version(text)
        if version:
            self.nccl_version = version
        if cuda:
            self._cuda.add(cuda)

    def _provenance(self) -> dict:
        return {"nccl_version": self.nccl_version, "gpus": sorted(self._gpus), "hosts": sorted(self._hosts),
                "driver": [], "cuda": sorted(self._cuda), "launcher": self.launcher.kind, "command": self._job_cmd,
                "nccl_env": self._job_env, "ranks_reported": self._ranks}

    # ---- a job ----

    def measure(self, points: list[Point], samples: int = 5, budget_us: float = 0.0) -> list[list[float] | None]:
        """Samples per point (one per launch), round-robin over the configurations of this job (the
        first ``configs_per_job`` of the request; points of the others are left unmeasured and
        unfailed, for the next call)."""
        self.failures = {}
        self._job_cmd, self._job_env, self._ranks = "", {}, 0
        self._hosts, self._gpus, self._cuda = set(), set(), set()
        groups: dict[tuple, list[int]] = {}
        for i, p in enumerate(points):
            key = (p.collective, p.algo, p.proto, p.channels, *p.knobs)
            groups.setdefault(key, []).append(i)
        if self.configs_per_job:
            groups = dict(list(groups.items())[:self.configs_per_job])
        out: list[list[float]] = [[] for _ in points]
        dead: set[tuple] = set()
        job = f"{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}"
        with job_folder("nccltests") as tmp:
            root = self.log_dir or Path(tmp)
            n = 0
            for _ in range(samples):
                for key, idx in groups.items():
                    if key in dead:
                        continue
                    cfg = points[idx[0]]
                    n += 1
                    try:
                        t = self.launch_once(cfg.collective, [points[i].nbytes for i in idx], cfg,
                                             root / f"{job}-{n}")
                    except LaunchError as e:
                        dead.add(key)
                        for i in idx:
                            self.failures[i] = str(e)
                        continue
                    for i in idx:
                        if points[i].nbytes in t:
                            out[i].append(t[points[i].nbytes])
        for idx in groups.values():
            for i in idx:
                if i not in self.failures and not out[i]:
                    self.failures[i] = (f"nccl-tests printed no {points[i].nbytes} B row (it runs -b times powers "
                                        "of 2)")
        self.provenance = self._provenance()
        self.last_modes = ["eager"] * len(points)
        return [o if (o and i not in self.failures) else None for i, o in enumerate(out)]

    def close(self) -> None:
        pass


class _Verdict:
    """A launch's :class:`ncclrl.envs.jobs.Watch`: it stops when the ranks disagree on the table."""

    def __init__(self, watch: TableWatch) -> None:
        self.watch = watch

    def add(self, records) -> None:
        pass

    def stop(self) -> str:
        return self.watch.verdict(final=False)

    def finished(self) -> bool:
        return False


class OutputTail:
    """The lines a launch has written to its log so far (the launcher's merged output)."""

    def __init__(self, path: Path, start: int) -> None:
        self.path, self.start, self.pos, self.rest = path, start, start, ""

    def new_lines(self) -> list[str]:
        if not self.path.exists():
            return []
        with open(self.path, errors="replace") as f:
            f.seek(self.pos)
            chunk = f.read()
            self.pos = f.tell()
        text = self.rest + chunk
        lines = text.split("\n")
        self.rest = lines.pop()
        return lines

    def all_text(self) -> str:
        if not self.path.exists():
            return ""
        with open(self.path, errors="replace") as f:
            f.seek(self.start)
            text = f.read()
        return "\n".join(ln for ln in text.split("\n") if not ln.startswith("$ "))


class TableWatch:
    """The plugin lines of a launch as they arrive: which table each rank (host, process, GPU)
    loaded, against the one sent (``expected``; ``None``: nothing to check)."""

    def __init__(self, nranks: int, expected: str | None) -> None:
        self.nranks, self.expected = nranks, expected
        self.seen: dict[tuple[str, int, int], str] = {}
        self.conflict = ""
        self.rows_at = 0.0  # when the first table row was printed: every rank's NCCL is up then
        self._lines: list[str] = []

    def add(self, lines: list[str]) -> None:
        if self.expected is None or not lines:
            return
        _clean, log = split_log("\n".join(lines) + "\n")
        for ln in log:
            m = TABLE_LINE.search(ln.message) if ln.level == "INFO" else None
            if m:
                fp = m.group(2).lower() + ("" if m.group(1) == TABLE_ENV else f" (from {m.group(1)})")
            elif ln.level == "INFO" and NO_TABLE_LINE.search(ln.message):
                fp = f"no table ({TABLE_ENV} did not arrive)"
            else:
                continue
            key = (ln.host, ln.pid, ln.dev)
            if self.seen.get(key, fp) != fp and not self.conflict:
                self.conflict = f"{ln.host}:{ln.pid} GPU {ln.dev} logged {self.seen[key]} and then {fp}"
            self.seen[key] = fp
        if not self.rows_at and any(_is_row(x) for x in _clean.split("\n")):
            self.rows_at = time.time()

    def verdict(self, final: bool) -> str:
        """Why the launch must stop (``""``: no reason yet). ``final``: the launch ended."""
        if self.expected is None:
            return ""
        if self.conflict:
            return f"{DISAGREE}: {self.conflict}"
        fps = set(self.seen.values())
        if fps and fps != {self.expected}:
            if fps.isdisjoint({self.expected}) and len(fps) == 1 and len(self.seen) == self.nranks:
                return (f"{DISAGREE}: every rank loaded {fps.pop()}, not the table sent ({self.expected}): is the "
                        "plugin on every node the one this ncclrl builds?")
            by = {fp: sorted(f"{h}:{p} GPU {d}" for (h, p, d), x in self.seen.items() if x == fp) for fp in fps}
            parts = "; ".join(f"{', '.join(who[:3])}{' ...' * (len(who) > 3)} loaded {fp}" for fp, who in
                              sorted(by.items(), key=lambda kv: (kv[0] != self.expected, kv[0])))
            return f"{DISAGREE}: {parts} (sent {self.expected})"
        late = self.rows_at and time.time() - self.rows_at > LATE_LINE_S
        if (final or late) and len(self.seen) < self.nranks:
            return self.missing()
        return ""

    def missing(self) -> str:
        return (f"{DISAGREE}: {len(self.seen)} of {self.nranks} ranks logged the table they were sent (did "
                "NCCL_TUNER_PLUGIN load on every node?)")


def _is_row(line: str) -> bool:
    toks = line.split()
    return len(toks) >= 9 and toks[0].isdigit() and toks[1].isdigit()


def last_words(text: str, default: str) -> str:
    """The launch's last meaningful line (e.g. mpirun's note on the rank that died)."""
    clean, _log = split_log(text)
    lines = [x.strip() for x in clean.splitlines() if any(c.isalnum() for c in x) and not x.startswith("#")]
    return lines[-1][-300:] if lines else default


class LaunchError(RuntimeError):
    """One nccl-tests launch failed; the message is one line."""

