"""Running one job to its end: the one wait loop every live command goes through, and how SIGINT
and SIGTERM stop it without losing what it measured."""

from __future__ import annotations

import contextlib
import signal
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from ncclrl.costmodel.errors import JobError
from ncclrl.envs.jobs.process import Job
from ncclrl.envs.jobs.records import Record
from ncclrl.envs.jobs.spec import JobOptions

# -- signals ---------------------------------------------------------------------------------------

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Interrupted(SystemExit):
    """SIGINT (Ctrl-C) or SIGTERM (a preemption, ``scancel``) arrived: the running job is ended,
    what it finished is kept, and the command stops with what its measurements support
    (exit code ``128 + signum``)."""

    def __init__(self, signum: int = signal.SIGTERM) -> None:
        super().__init__(128 + int(signum))
        self.signum = int(signum)

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name


class SignalLatch:
    """Which stop signal arrived while :func:`ending_on_signals` was open (``requested``);
    :meth:`check` raises :class:`Interrupted` once, where the caller can stop without losing what
    it holds. One latch per process: nested scopes (a command around its jobs) share it."""

    def __init__(self) -> None:
        self.requested: int | None = None
        self._raised = False

    def __call__(self, signum, frame) -> None:  # the signal handler: never raises mid-statement
        if self.requested is None:
            self.requested = int(signum)

    def check(self) -> None:
        if self.handled():
            raise Interrupted(self.requested or signal.SIGTERM)

    def handled(self) -> bool:
        """Whether a stop signal came and nobody acted on it yet; from now on the caller does."""
        if self.requested is not None and not self._raised:
            self._raised = True
            return True
        return False

    @property
    def stopping(self) -> bool:
        """Whether a stop signal came (acted on or not): start nothing new."""
        return self.requested is not None


_LATCH = SignalLatch()
_depth = 0
_previous: dict[int, object] = {}


@contextlib.contextmanager
def ending_on_signals() -> Iterator[SignalLatch]:
    """While it is open, SIGINT and SIGTERM only set the process's latch: wait loops call
    ``latch.check()`` between reads, so records already taken from a job are never dropped half
    way, and a command checks ``latch.stopping`` before it starts another job. Leaving the
    outermost block raises :class:`Interrupted` if a signal came and nobody acted on it (after
    the callers' ``finally`` ended their jobs), and resets the latch."""
    global _LATCH, _depth
    if threading.current_thread() is not threading.main_thread():
        yield _LATCH
        return
    if _depth == 0:
        _LATCH = SignalLatch()
        for s in STOP_SIGNALS:
            _previous[s] = signal.signal(s, _LATCH)
    _depth += 1
    try:
        yield _LATCH
    finally:
        _depth -= 1
        if _depth == 0:
            for s, prev in _previous.items():
                signal.signal(s, prev)  # type: ignore[arg-type]
    if _depth == 0:
        _LATCH.check()


def stop_requested(acknowledge: bool = False) -> int | None:
    """The stop signal that arrived inside an open :func:`ending_on_signals` (``None``: none).
    ``acknowledge``: the caller acts on it (stops, keeping what it has), so leaving the scope raises
    nothing."""
    if not _depth or _LATCH.requested is None:
        return None
    if acknowledge:
        _LATCH.handled()
    return _LATCH.requested


# -- one job ---------------------------------------------------------------------------------------


class Watch(Protocol):
    """What a caller reads from a running job's records, and when it ends the job early."""

    def add(self, records: list[Record]) -> None:
        """Take the records that arrived."""

    def stop(self) -> str:
        """Why the job must end now (``""``: no reason)."""

    def finished(self) -> bool:
        """Whether every rank said it is done (its processes get ``exit_grace_s`` to exit)."""


@dataclass
class JobEnd:
    """How a job ended: its records, and the first of: a timeout, a watch's reason, a signal."""

    records: list[Record]
    job: Job
    wall_s: float
    timed_out: bool = False
    stopped: str = ""
    interrupted: int | None = None
    lingered: bool = False  # every rank said done, a process did not exit: ended after exit_grace_s
    extra: dict = field(default_factory=dict)


class _Quiet:
    def add(self, records: list[Record]) -> None:
        pass

    def stop(self) -> str:
        return ""

    def finished(self) -> bool:
        return False


def run_job(commands: list[tuple[list[str], dict[str, str]]], base_env: dict[str, str], log_dir: Path,
            options: JobOptions, watch: Watch | None = None, on_poll=None) -> JobEnd:
    """Start the job, wait for its end, end every process it left: the one wait loop. It stops
    waiting when every launcher process has ended, when ``watch`` gives a reason, when every rank
    said done and ``exit_grace_s`` passed, at the timeout, or at SIGINT/SIGTERM (checked between
    two reads: every record taken is returned; the caller decides what to keep, then ends).
    ``on_poll()`` runs each round (a caller reading a file the job writes)."""
    w = watch or _Quiet()
    records: list[Record] = []
    end = JobEnd(records, None, 0.0)  # type: ignore[arg-type]
    with ending_on_signals() as latch:
        job = Job(commands, base_env, log_dir, grace_s=options.grace_s)
        job.read_grace_s = options.read_grace_s
        end.job = job
        t0 = time.time()
        done_at = None
        try:
            while True:
                if latch.handled():
                    end.interrupted = latch.requested
                    break
                new = job.take()
                records += new
                w.add(new)
                if on_poll is not None:
                    on_poll()
                if job.done():
                    break
                why = w.stop()
                if why:
                    end.stopped = why
                    break
                now = time.time()
                if w.finished():
                    done_at = done_at or now
                    if now - done_at > options.exit_grace_s:
                        end.lingered = True
                        break
                since = t0 if options.progress == "total" else max(t0, job.last_output)
                if now - since > options.timeout_s:
                    end.timed_out = True
                    break
                time.sleep(options.poll_s)
        finally:
            if all(c == 0 for c in job.poll()):  # it ended by itself: read its output to the end, then end what
                job.close()                      # it left running (a daemon may still be forwarding its output)
                job.kill()
            else:
                job.kill()
                job.close()
        new = job.take()
        records += new
        w.add(new)
        end.wall_s = time.time() - t0
    return end


def run_to_end(commands: list[tuple[list[str], dict[str, str]]], base_env: dict[str, str], log_dir: Path,
               timeout_s: float, grace_s: float = 10.0, nranks: int = 0) -> tuple[list[Record], str]:
    """Run one job to its end (or until it makes no progress for ``timeout_s``, or a rank reports
    an error); every process is ended afterwards. Returns the records and the launcher's other
    output (what NCCL printed). Raises :class:`ncclrl.costmodel.errors.JobError` with the reason
    when it did not end well, :class:`Interrupted` at SIGINT/SIGTERM. ``nranks``: once that many
    ranks said done, their processes get :attr:`JobOptions.exit_grace_s` to exit (0: wait for them)."""
    watch = FirstError(grace_s, nranks)
    end = run_job(commands, base_env, log_dir, JobOptions(timeout_s=timeout_s, grace_s=grace_s), watch)
    if end.interrupted:
        raise Interrupted(end.interrupted)
    records, job = end.records, end.job
    text = (Path(log_dir) / "launcher.log").read_text(errors="replace")
    why = end.stopped or (f"rank {watch.error.rank}: {watch.error.payload}" if watch.error else "")
    if end.timed_out:
        why = f"timed out: no progress for {timeout_s:.0f} s; the job was ended"
    if not why and not end.lingered and job.failed():  # a rank that said done and lingered was ended by us
        why = job.failure()
    if not why and not any(r.kind == "done" for r in records):
        why = "the job ended without finishing"
    if why:
        raise JobError("launcher", why)
    return records, text


class FirstError:
    """Ends a job ``grace_s`` after a rank's first ``error`` record (the others may be waiting
    on that rank), with that error as the reason; finished once every rank said ``done``."""

    def __init__(self, grace_s: float, nranks: int = 0) -> None:
        self.grace_s, self.nranks = grace_s, nranks
        self.error: Record | None = None
        self.error_at = 0.0
        self.done: set[int] = set()

    def add(self, records: list[Record]) -> None:
        for r in records:
            if r.kind == "error" and self.error is None:
                self.error, self.error_at = r, time.time()
            elif r.kind == "done":
                self.done.add(r.rank)

    def stop(self) -> str:
        if self.error is not None and time.time() - self.error_at >= self.grace_s:
            return f"rank {self.error.rank}: {self.error.payload}"
        return ""

    def finished(self) -> bool:
        return self.nranks > 0 and len(self.done) >= self.nranks

