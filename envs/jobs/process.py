"""A running job's processes: started each in a process group of its own, read as they write,
ended together (the launcher's group, its descendants, and every process holding the job's token)."""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import select
import shlex
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from ncclrl.costmodel.errors import ConfigError
from ncclrl.envs.jobs.records import Record, parse_records
from ncclrl.envs.jobs.spec import OTHER_TABLE_ENV, TABLE_ENV

READ_MAX_S = 30.0  # the longest a finished job's output is still read (Job.close)
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


