"""A job played without NCCL for the plugin's online mode: several processes load the plugin, call
its tuner and profiler entry points in the order NCCL 2.28 does, with a recorded job's call sequence
and simulated times, around a real ``ncclrl coordinator``; faults are injected and the outcome read.

Each rank is ``plugin/tests/online_rank.c`` (built by the plugin's Makefile, plain or with
AddressSanitizer and UndefinedBehaviorSanitizer). What a job shows (:class:`JobOutcome`):

- **hung**: a rank or the coordinator still running at the deadline (killed then);
- **divergent**: two ranks that ran every call made a different decision at some call (the
  decisions files differ), or a rank killed on purpose decided, before its death, other than the
  survivors at a call both made;
- **crashed**: a rank that exited other than by the fault injected (a signal, a sanitizer report,
  a non-zero status).

Faults (:data:`FAULTS`): none, a rank killed mid-exploration, the coordinator killed mid-
exploration, a rank stalled past the round timeout, a rank stopped (SIGSTOP) past it, clock skew
(one rank's GPU timer offset and running fast), garbage profiler events and tuner calls, a
coordinator speaking another protocol version, no coordinator at all, one rank without the
profiler, ranks with different candidate files (arms that disagree), the coordinator stopped
(SIGSTOP) mid-exploration while the ranks reach their verdict calls, its verdict log on a full disk
(``/dev/full``), ranks whose static tables differ, an impostor listening at the address the ranks
were given (it does not hold the secret), and one rank given another secret.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ncclrl.costmodel import nccl as N
from ncclrl.costmodel.platforms import draw_platform
from ncclrl.costmodel.simulator import Configs, Simulator
from ncclrl.costmodel.topology import load_topology
from ncclrl.envs.jobs import free_port, start_coordinator

FAULTS = ("none", "rank-killed", "coordinator-killed", "rank-stalled", "rank-paused", "clock-skew", "garbage",
          "version-mismatch", "no-coordinator", "no-profiler", "arms-differ", "coordinator-paused", "log-disk-full",
          "tables-differ", "impostor", "wrong-secret")
COLL_IDS = {"broadcast": 0, "reduce": 1, "allgather": 2, "reducescatter": 3, "allreduce": 4}
#: configurations timed per size bucket: (algorithm, protocol, channels); channels 0 = NCCL's own count
CONFIGS = [(a, p, c) for a in (0, 1) for p in (0, 1, 2) for c in (0, 2, 4, 8)]


def recorded_calls(job: str, steps: int, bytes_factor: int, data: Path) -> list[tuple[int, int]]:
    """The call sequence of one step of a recorded job (``tests/data/profiles/{job}-rank0.truth.json``),
    sizes multiplied by ``bytes_factor``, repeated ``steps`` times: (collective id, nbytes) per call."""
    doc = json.loads((data / f"{job}-rank0.truth.json").read_text())
    step = [(COLL_IDS[c["collective"]], max(c["in_nelems"], c["out_nelems"]) * c["element_nbytes"] * bytes_factor)
            for c in doc["calls_by_step"][0]]
    return step * steps


def simulated_times(calls: list[tuple[int, int]], preset: str, seed: int) -> list[str]:
    """TIMES lines for every size bucket of ``calls``: the truth of a misspecified draw of ``preset``
    (what the harness's "GPU" takes) and the nominal model's prediction (NCCL's cost table)."""
    nominal = Simulator(load_topology(preset))
    truth = draw_platform(preset, np.random.default_rng(seed), misspecified=True)
    lines = []
    for coll, lg in sorted({(c, int(n).bit_length() - 1) for c, n in calls}):
        nbytes = 1 << lg
        q = 4 * (nominal.topo.nranks if coll in (2, 3) else 1)
        nbytes = max(q, nbytes // q * q)
        ok = [(a, p, c) for a, p, c in CONFIGS if coll == 4 or a == 1]
        cfg = Configs.make(coll, nbytes, [a for a, _, _ in ok], [p for _, p, _ in ok], [c for _, _, c in ok])
        t_true = truth.time_us(cfg)
        t_cost = nominal.time_us(cfg, validate=False)
        for (a, p, c), tt, tc in zip(ok, t_true, t_cost, strict=True):
            if np.isfinite(tt) and tt > 0:
                lines.append(f"{coll} {lg} {a} {p} {c} {tt:.3f} {tc:.3f}")
    return lines


def candidate_rows(calls: list[tuple[int, int]]) -> list[str]:
    """Alternatives for every bucket, as the export writes them: ring/simple and tree/ll128 at 4 channels."""
    rows = []
    for coll, lg in sorted({(c, int(n).bit_length() - 1) for c, n in calls}):
        name = N.COLLECTIVES[coll]
        lo, hi = 1 << lg, (1 << (lg + 1)) - 1
        rows.append(f"{name},{lo},{hi},ring,simple,4,-1,-1")
        if coll == 4:
            rows.append(f"{name},{lo},{hi},tree,ll128,4,-1,-1")
    return rows


@dataclass
class JobOutcome:
    fault: str
    sanitized: bool
    ranks: int
    calls: int
    hung: bool
    divergent: bool
    crashed: bool
    exit_codes: list[int]
    wall_s: float
    verdicts: int
    commits: int
    freezes: int
    ranks_frozen: int = 0
    notes: list[str] = field(default_factory=list)


def _log(stack: contextlib.ExitStack, path: Path):
    """A process's log file, closed with ``stack`` once the processes have ended."""
    return stack.enter_context(path.open("w"))


class _FakeCoordinator:
    """A server that does not hold the job's secret: it answers VERSION with a WELCOME of another
    protocol version (``version``), or of this one with a forged proof and then a verdict every rank
    would take, were it believed (``forge``)."""

    def __init__(self, forge: bool = False) -> None:
        self.forge = forge
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.port = self.sock.getsockname()[1]
        self.conns: list[socket.socket] = []
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                c, _ = self.sock.accept()
            except OSError:
                return
            self.conns.append(c)
            with contextlib.suppress(OSError):
                if self.forge:
                    c.sendall(b"WELCOME 2 1000 " + b"0" * 32 + b" " + b"f" * 64 + b"\n"
                              b"VERDICT 0 260 0 2 COMMIT 1 forged\nGO 0 260 0\n")
                else:
                    c.sendall(b"WELCOME 3 1000\n")

    def close(self) -> None:
        for c in self.conns:
            c.close()
        self.sock.close()


ROUND_TIMEOUT_S = 1.0
#: faults that need a coordinator of their own (killed, stopped, or logging to a full disk)
OWN_COORDINATOR = ("coordinator-killed", "coordinator-paused", "log-disk-full")
GATHER_S = 0.2


class SharedCoordinator:
    """One ``ncclrl coordinator`` process for several jobs (each its own communicator id), as a
    cluster's would serve several jobs: the jobs of a test run pay its start once. Faults that kill
    or replace the coordinator still get their own.

    :param work: folder for its log (``coordinator.jsonl``) and port file
    :param policy: its exploration policy
    """

    def __init__(self, work: Path, policy: str = "round-robin") -> None:
        work.mkdir(parents=True, exist_ok=True)
        self.log_path = work / "coordinator.jsonl"
        self.proc, self.address, self.secret_file = _start_coordinator(work, policy, self.log_path, dict(os.environ))

    def close(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def _start_coordinator(work: Path, policy: str, log_path: Path | str, env: dict[str, str],
                       argv: list[str] | None = None) -> tuple[subprocess.Popen, str, Path]:
    log = log_path if isinstance(log_path, str) else log_path.resolve()
    proc, port, secret = start_coordinator(work, ["host=127.0.0.1", f"policy={policy}",
                                                  f"round_timeout_s={ROUND_TIMEOUT_S}", "slots=8", f"log={log}"],
                                           work / "coordinator.err", env, argv=argv)
    return proc, f"127.0.0.1:{port}", secret


def run_job(build: Path, work: Path, fault: str = "none", *, ranks: int = 4, job: str = "ddp", steps: int = 60,
            bytes_factor: int = 256, preset: str = "h200-2x2-sock", policy: str = "round-robin",
            sanitized: bool = False, seed: int = 0, deadline_s: float = 120.0, data: Path | None = None,
            pace_us: float = 2000.0, shared: SharedCoordinator | None = None,
            coordinator_argv: list[str] | None = None, late_us: float = 0.0, phases: bool = False,
            nccl_code: int = 0, sym_calls: bool = False) -> JobOutcome:
    """Run one job of ``ranks`` processes with ``fault`` injected; see the module docstring. With
    ``shared``, the job reports to that coordinator (under a communicator id of its own) unless
    the fault needs a coordinator of its own. ``coordinator_argv``: a program to run instead of
    ``ncclrl coordinator`` (taking its keys), e.g. one with a fault of its own built in. ``late_us``:
    every call that runs another configuration than NCCL's own waits that long for late ranks inside
    its channels; ``phases``: the ranks bind the library as NCCL 2.32 does (v7) and report kernel phases;
    ``nccl_code``: the NCCL version the ranks' ``ncclGetVersion`` answers (0: none); ``sym_calls``: before
    each collective the two calls NCCL 2.31's symmetric kernels make (every entry -1, then ``numPipeOps`` 0)."""
    if fault not in FAULTS:
        raise ValueError(f"fault must be one of {', '.join(FAULTS)}, got {fault!r}")
    data = data or Path(__file__).resolve().parents[1] / "tests" / "data" / "profiles"
    work.mkdir(parents=True, exist_ok=True)
    calls = recorded_calls(job, steps, bytes_factor, data)
    (work / "calls.txt").write_text("".join(f"{c} {n}\n" for c, n in calls))
    (work / "times.txt").write_text("\n".join(simulated_times(calls, preset, seed)) + "\n")
    cand = candidate_rows(calls)
    (work / "candidates.csv").write_text("\n".join(cand) + "\n")
    (work / "candidates-other.csv").write_text("\n".join(cand[:-1]) + "\n")
    lib = build / ("asan" if sanitized else "") / "libnccl-tuner-ncclrl.so"
    prog = build / ("asan" if sanitized else "") / "online_rank"
    round_timeout_s, gather_s = ROUND_TIMEOUT_S, GATHER_S
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NCCLRL_", "NCCL_"))}
    env.update({"NCCLRL_TUNER_MODE": "online", "NCCLRL_ONLINE_CANDIDATES": str(work / "candidates.csv"),
                "NCCLRL_ONLINE_GATHER_S": str(gather_s), "NCCLRL_ONLINE_WAIT_S": "5",
                "NCCLRL_ONLINE_GAP_CALLS": "4", "NCCLRL_ONLINE_CONNECT_S": "1",
                "NCCLRL_TUNER_TABLE_DATA": "# no rows: NCCL's own choice is the static table\n",
                "ASAN_OPTIONS": "detect_leaks=1:abort_on_error=0:exitcode=86",
                "UBSAN_OPTIONS": "halt_on_error=1:exitcode=87:print_stacktrace=1"})
    coord = fake = None
    stack = contextlib.ExitStack()  # the processes' log files, closed once they have ended
    log_path = work / "coordinator.jsonl"
    log_path.unlink(missing_ok=True)
    env["NCCLRL_ONLINE_SECRET"] = "ab" * 32  # what the impostors are told nothing of
    if fault in ("version-mismatch", "impostor"):
        fake = _FakeCoordinator(forge=fault == "impostor")
        env["NCCLRL_ONLINE_COORD"] = f"127.0.0.1:{fake.port}"
    elif fault == "no-coordinator":
        env["NCCLRL_ONLINE_COORD"] = f"127.0.0.1:{free_port('127.0.0.1')}"  # nobody listens there
    elif shared is not None and fault not in OWN_COORDINATOR and coordinator_argv is None:
        env["NCCLRL_ONLINE_COORD"] = shared.address
        env["NCCLRL_ONLINE_SECRET_FILE"] = str(shared.secret_file)
        del env["NCCLRL_ONLINE_SECRET"]
        log_path = shared.log_path
    else:
        coord, env["NCCLRL_ONLINE_COORD"], secret = _start_coordinator(
            work, policy, "/dev/full" if fault == "log-disk-full" else log_path, env, coordinator_argv)
        env["NCCLRL_ONLINE_SECRET_FILE"] = str(secret)
        del env["NCCLRL_ONLINE_SECRET"]
    comm = f"{int.from_bytes(os.urandom(8), 'little') | 1:016x}"
    ncalls = len(calls)
    # inside the first explored round (2 warm-up calls, then 8 slots) of the busiest bucket: its 7th call
    keys = [(c, int(n).bit_length()) for c, n in calls]
    busiest = max(set(keys), key=keys.count)
    at = [i for i, k in enumerate(keys) if k == busiest][6]
    victim = ranks - 1
    procs = []
    t_start = time.monotonic()
    for r in range(ranks):
        args = [str(prog), str(lib), str(work / "calls.txt"), str(work / "times.txt"), str(work / f"rank{r}.txt"),
                "--rank", str(r), "--nranks", str(ranks), "--seed", str(seed), "--pace-us", str(pace_us),
                "--comm", comm, "--late-us", str(late_us), "--nccl-code", str(nccl_code)] + \
            (["--phases"] if phases else []) + (["--sym-calls"] if sym_calls else [])
        renv = dict(env)
        if r == victim:
            if fault == "rank-killed":
                args += ["--die-at", str(at)]
            elif fault == "rank-stalled":
                args += ["--stall-at", str(at), "--stall-s", str(round_timeout_s + gather_s + 2)]
            elif fault == "clock-skew":
                args += ["--skew-ns", "3.7e15", "--rate", "1.5"]
            elif fault == "no-profiler":
                renv["NCCLRL_TUNER_MODE"] = "online"
                args += ["--no-profiler"]
            elif fault == "arms-differ":
                renv["NCCLRL_ONLINE_CANDIDATES"] = str(work / "candidates-other.csv")
            elif fault == "tables-differ":  # a row the others do not have: their decisions would differ
                renv["NCCLRL_TUNER_TABLE_DATA"] = "allreduce,0,4294967295,ring,simple,2,-1,-1\n"
            elif fault == "wrong-secret":
                renv.pop("NCCLRL_ONLINE_SECRET_FILE", None)
                renv["NCCLRL_ONLINE_SECRET"] = "cd" * 32
        if fault == "garbage":
            args += ["--garbage"]
        procs.append(subprocess.Popen(args, stdout=subprocess.DEVNULL,
                                      stderr=_log(stack, work / f"rank{r}.err"), env=renv))
    if fault == "coordinator-killed":  # once it has sent its first plans: mid-exploration
        while coord.poll() is None and any(p.poll() is None for p in procs):
            if log_path.exists() and '"PLAN"' in log_path.read_text():
                break
            time.sleep(0.002)
        coord.send_signal(signal.SIGKILL)
    if fault == "coordinator-paused":  # stopped mid-exploration while the ranks reach their verdict calls
        while coord.poll() is None and any(p.poll() is None for p in procs):
            if log_path.exists() and '"PLAN"' in log_path.read_text():
                break
            time.sleep(0.002)
        coord.send_signal(signal.SIGSTOP)
        time.sleep(round_timeout_s + gather_s + 1.5)
        coord.send_signal(signal.SIGCONT)
    if fault == "rank-paused":  # the whole process stopped (SIGSTOP) mid-exploration, past the round timeout
        while any(p.poll() is None for p in procs):
            if log_path.exists() and '"PLAN"' in log_path.read_text():
                break
            time.sleep(0.002)
        procs[victim].send_signal(signal.SIGSTOP)
        time.sleep(round_timeout_s + gather_s + 1.5)
        procs[victim].send_signal(signal.SIGCONT)
    hung = False
    codes = []
    for p in procs:
        left = deadline_s - (time.monotonic() - t_start)
        try:
            codes.append(p.wait(timeout=max(left, 0.1)))
        except subprocess.TimeoutExpired:
            hung = True
            p.kill()
            codes.append(p.wait())
    wall = time.monotonic() - t_start
    if coord is not None and coord.poll() is None:
        coord.send_signal(signal.SIGTERM)
        try:
            coord.wait(timeout=10)
        except subprocess.TimeoutExpired:
            hung = True
            coord.kill()
    if fake:
        fake.close()
    stack.close()
    expected = {r: (-signal.SIGKILL if fault == "rank-killed" and r == victim else 0) for r in range(ranks)}
    crashed = any(c != expected[r] for r, c in enumerate(codes))
    outs = {r: (work / f"rank{r}.txt").read_text().splitlines() for r in range(ranks)
            if (work / f"rank{r}.txt").exists()}
    full = [outs[r] for r in range(ranks) if expected[r] == 0 and r in outs]
    divergent = any(o != full[0] for o in full[1:]) if full else True
    if fault == "rank-killed" and victim in outs and full:
        part = outs[victim]
        divergent |= part != full[0][:len(part)]
    notes = []
    ranks_frozen = 0
    for r in range(ranks):
        err = (work / f"rank{r}.err").read_text()
        ranks_frozen += "frozen on " in err
        if "ERROR: AddressSanitizer" in err or "runtime error:" in err:
            crashed = True
            notes.append(f"rank {r}: sanitizer report")
    recs = [json.loads(x) for x in log_path.read_text().splitlines()] if log_path.exists() else []
    recs = [x for x in recs if x.get("comm") == comm]
    return JobOutcome(fault, sanitized, ranks, ncalls, hung, divergent, crashed, codes, round(wall, 3),
                      sum(1 for x in recs if x.get("verdict")), sum(1 for x in recs if x.get("verdict") == "COMMIT"),
                      sum(1 for x in recs if x.get("event") == "freeze"), ranks_frozen, notes)
