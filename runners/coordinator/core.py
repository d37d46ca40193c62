"""``ncclrl coordinator``: the agreement point of the plugin's online mode.

Every rank of a job whose plugin runs ``NCCLRL_TUNER_MODE=online`` connects here
(``NCCLRL_ONLINE_COORD=HOST:PORT``). For each communicator, collective and size bucket, the ranks
report their timings of the round just explored; once every rank of the communicator has, the
exploration policy (:mod:`ncclrl.agents.online`) decides the next round's plan or the arm to commit,
and every rank receives the same verdict, which takes effect at the call index the round fixed.
Any fault (a rank whose connection closes, a round not reported by every rank within
``round_timeout_s``, reports that disagree on the arms or the call index, a version mismatch)
aborts the communicator's open rounds and freezes it: every rank keeps its static table there.
The protocol and its failure cases: docs/design/online.md.

The core (:class:`Coordinator`) is a pure state machine (lines in, lines out, a clock); the server
around it is asyncio on one thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from omegaconf import DictConfig

from ncclrl.costmodel.errors import ConfigError
from ncclrl.runners.config import Command, register

log = logging.getLogger(__name__)

PROTOCOL_VERSION = 1
N_BUCKETS = 5 * 64
MAX_ARMS = 8
MAX_PLAN = 64
COLLS = ("broadcast", "reduce", "allgather", "reducescatter", "allreduce")


@dataclass
class Report:
    """One rank's cumulative evidence for a bucket at the end of a round."""

    k: int
    fp: str
    n: list[int]
    sum_us: list[float]
    sumsq_us: list[float]


@dataclass
class BucketRun:
    """A bucket's exploration on one communicator, as the coordinator follows it."""

    narms: int = 0
    fp: str = ""
    rounds_done: int = 0
    reports: dict[int, dict[int, Report]] = field(default_factory=dict)  # round -> rank -> report
    deadline: dict[int, float] = field(default_factory=dict)  # round -> time its verdict is due
    decided: set[int] = field(default_factory=set)
    finished: bool = False
    policy: object | None = None


@dataclass
class CommRun:
    nranks: int
    nnodes: int
    conns: dict[int, int] = field(default_factory=dict)  # rank -> connection id
    buckets: dict[int, BucketRun] = field(default_factory=dict)
    left: set[int] = field(default_factory=set)
    frozen: str = ""


def bucket_name(bucket: int) -> str:
    return f"{COLLS[bucket // 64]} 2^{bucket % 64} B" if 0 <= bucket < N_BUCKETS else f"bucket {bucket}"


class Coordinator:
    """The coordinator's state machine.

    :param policy: name of the exploration policy (:data:`ncclrl.agents.online.POLICIES`)
    :param round_timeout_s: a round every rank has not reported this long after its first report is aborted
    :param slots: the longest plan a policy may give (the plugin accepts up to 64)
    :param seed: seed of the policies' random numbers (each bucket draws from (seed, communicator, bucket))
    :param events: called with each verdict's record (a dict), e.g. to append it to a JSONL log
    """

    def __init__(self, policy: str, round_timeout_s: float = 10.0, slots: int = 16, seed: int = 0,
                 events: Callable[[dict], None] | None = None) -> None:
        from ncclrl.agents.online import make_policy

        make_policy(policy)  # a bad name fails here, before any rank connects
        if not 0 < round_timeout_s <= 3600:
            raise ConfigError("round_timeout_s", f"must be in (0, 3600], got {round_timeout_s}")
        if not 2 <= slots <= MAX_PLAN:
            raise ConfigError("slots", f"must be in 2..{MAX_PLAN}, got {slots}")
        self.policy_name = policy
        self.round_timeout_s = float(round_timeout_s)
        self.slots = int(slots)
        self.seed = int(seed)
        self.events = events or (lambda rec: None)
        self.comms: dict[int, CommRun] = {}
        self.conn_ranks: dict[int, set[tuple[int, int]]] = {}
        self.outbox: dict[int, list[str]] = {}
        self.closing: set[int] = set()

    # -- connections ---------------------------------------------------------------------------
    def _send(self, conn: int, line: str) -> None:
        self.outbox.setdefault(conn, []).append(line + "\n")

    def _comm_send(self, cid: int, line: str) -> None:
        for conn in set(self.comms[cid].conns.values()):
            self._send(conn, line)

    def take(self) -> dict[int, list[str]]:
        """The lines to send, by connection (and forget them)."""
        out, self.outbox = self.outbox, {}
        return out

    def opened(self, conn: int) -> None:
        self.conn_ranks[conn] = set()

    def closed(self, conn: int, now: float) -> None:
        """A connection ended: every communicator it carried a rank of is frozen."""
        for cid, rank in sorted(self.conn_ranks.pop(conn, set())):
            comm = self.comms.get(cid)
            if comm and comm.conns.get(rank) == conn:
                del comm.conns[rank]
                self._freeze(cid, f"rank {rank}'s connection closed", now)

    # -- faults --------------------------------------------------------------------------------
    def _freeze(self, cid: int, why: str, now: float) -> None:
        comm = self.comms[cid]
        if comm.frozen:
            return
        comm.frozen = why
        for b, run in comm.buckets.items():
            for rnd in sorted(run.reports):
                if rnd not in run.decided:
                    self._verdict(cid, b, rnd, "ABORT", why, now)
            run.finished = True
        self._comm_send(cid, f"FREEZE {cid:016x} {why.replace(' ', '_')}")
        log.warning("# communicator %016x frozen: %s", cid, why)
        self.events({"t": round(now, 6), "comm": f"{cid:016x}", "event": "freeze", "why": why})

    def tick(self, now: float) -> None:
        """Abort rounds past their deadline (a rank that stopped reporting)."""
        for cid, comm in self.comms.items():
            for b, run in list(comm.buckets.items()):
                for rnd, due in list(run.deadline.items()):
                    if rnd not in run.decided and now >= due:
                        missing = sorted(set(range(comm.nranks)) - set(run.reports.get(rnd, {})))
                        self._freeze(cid, f"round {rnd} of {bucket_name(b)}: ranks {missing} did not report within "
                                          f"{self.round_timeout_s:g} s", now)
                        break

    def next_deadline(self) -> float | None:
        dues = [due for c in self.comms.values() for r in c.buckets.values() for rnd, due in r.deadline.items()
                if rnd not in r.decided]
        return min(dues) if dues else None

    # -- messages ------------------------------------------------------------------------------
    def line(self, conn: int, text: str, now: float) -> None:
        """One line from a rank."""
        w = text.split()
        if not w or conn not in self.conn_ranks:  # a connection already refused: nothing it says counts
            return
        try:
            if w[0] == "VERSION":
                if len(w) != 2 or w[1] != str(PROTOCOL_VERSION):
                    self._send(conn, f"REJECT version {w[1] if len(w) > 1 else '?'} is not {PROTOCOL_VERSION}")
                    self.closing.add(conn)
                    self.closed(conn, now)
                    return
                self._send(conn, f"WELCOME {PROTOCOL_VERSION} {int(self.round_timeout_s * 1000)}")
            elif w[0] == "HELLO":
                self._hello(conn, w, now)
            elif w[0] == "REPORT":
                self._report(conn, w, now)
            elif w[0] == "BYE":
                self._bye(conn, w, now)
            else:
                raise ValueError(f"unknown message {w[0]!r}")
        except (ValueError, IndexError, KeyError) as e:
            log.warning("# connection %d: %s: %s", conn, e, text[:200])
            self._send(conn, f"REJECT malformed {str(e).replace(' ', '_')[:80]}")
            self.closing.add(conn)
            self.closed(conn, now)  # at once: its reports so far must not complete a round it will not hear of

    def _hello(self, conn: int, w: list[str], now: float) -> None:
        version, cid, rank, nranks, nnodes = int(w[1]), int(w[2], 16), int(w[3]), int(w[4]), int(w[5])
        if version != PROTOCOL_VERSION:
            raise ValueError(f"version {version}")
        if not 0 <= rank < nranks:
            raise ValueError(f"rank {rank} of {nranks}")
        comm = self.comms.setdefault(cid, CommRun(nranks=nranks, nnodes=nnodes))
        self.conn_ranks.setdefault(conn, set()).add((cid, rank))
        if comm.nranks != nranks or rank in comm.conns:
            comm.conns[rank] = conn
            self._freeze(cid, f"rank {rank} says {nranks} ranks, or joined twice", now)
            return
        comm.conns[rank] = conn
        if comm.frozen:
            self._send(conn, f"FREEZE {cid:016x} {comm.frozen.replace(' ', '_')}")

    def _bye(self, conn: int, w: list[str], now: float) -> None:
        """A rank's communicator was destroyed: its leaving is no fault, unless a round waits on it."""
        cid, rank = int(w[1], 16), int(w[2])
        comm = self.comms.get(cid)
        if comm is None or comm.conns.get(rank) != conn:
            return  # a communicator this connection never joined: nothing to leave
        del comm.conns[rank]
        self.conn_ranks.get(conn, set()).discard((cid, rank))
        comm.left.add(rank)
        waiting = [b for b, run in comm.buckets.items()
                   if any(rnd not in run.decided and rank not in reps for rnd, reps in run.reports.items())]
        if waiting:
            self._freeze(cid, f"rank {rank} left while {bucket_name(waiting[0])} waited for its report", now)
        elif len(comm.left) == comm.nranks:
            del self.comms[cid]  # every rank left: the id may come back (a reused unique id) as a new communicator

    def _report(self, conn: int, w: list[str], now: float) -> None:
        cid, rank, b, rnd, k, fp, narms = int(w[1], 16), int(w[2]), int(w[3]), int(w[4]), int(w[5]), w[6], int(w[7])
        comm = self.comms[cid]
        if comm.conns.get(rank) != conn:
            raise ValueError(f"rank {rank} of {cid:016x} reports on another connection")
        if not 0 <= b < N_BUCKETS or not 2 <= narms <= MAX_ARMS or len(w) != 8 + narms:
            raise ValueError("bucket or arms out of range")
        n, s, q = [], [], []
        for f in w[8:]:
            a, b_, c = f.split(":")
            n.append(int(a))
            s.append(float(b_))
            q.append(float(c))
        if comm.frozen:
            run = comm.buckets.setdefault(b, BucketRun(narms=narms, fp=fp, finished=True))
            if rnd not in run.decided:
                run.decided.add(rnd)
                self._send(conn, f"VERDICT {cid:016x} {b} {rnd} {k} ABORT - frozen:{comm.frozen.replace(' ', '_')}")
            return
        run = comm.buckets.setdefault(b, BucketRun(narms=narms, fp=fp))
        if run.finished or rnd in run.decided or rnd != run.rounds_done:
            raise ValueError(f"a report for round {rnd} of {bucket_name(b)}, which is not open")
        if now >= run.deadline.get(rnd, math.inf):  # past the round's timeout: ranks may have given up
            self._freeze(cid, f"round {rnd} of {bucket_name(b)} completed after its {self.round_timeout_s:g} s", now)
            return
        reports = run.reports.setdefault(rnd, {})
        reports[rank] = Report(k=k, fp=fp, n=n, sum_us=s, sumsq_us=q)
        run.deadline.setdefault(rnd, now + self.round_timeout_s)
        if fp != run.fp or narms != run.narms or any(r.k != k for r in reports.values()):
            self._freeze(cid, f"ranks disagree on the arms or the call index of {bucket_name(b)}", now)
            return
        if len(reports) == comm.nranks:
            self._decide(cid, b, rnd, now)

    # -- decisions -----------------------------------------------------------------------------
    def _state(self, run: BucketRun, rnd: int):
        from ncclrl.agents.online import ArmStats, BucketState

        reps = list(run.reports[rnd].values())
        arms = []
        for a in range(run.narms):
            ns = [r.n[a] for r in reps]
            means = [r.sum_us[a] / r.n[a] for r in reps if r.n[a] > 0]
            var = [max(r.sumsq_us[a] / r.n[a] - (r.sum_us[a] / r.n[a]) ** 2, 0.0) * r.n[a] / (r.n[a] - 1)
                   for r in reps if r.n[a] > 1]
            n = min(ns)
            arms.append(ArmStats(n=n, mean_us=float(np.mean(means)) if n > 0 else math.nan,
                                 std_us=float(math.sqrt(np.mean(var))) if n > 1 and var else math.nan))
        return BucketState(arms=tuple(arms), prior_us=tuple([math.nan] * run.narms), rounds=rnd + 1,
                           calls=reps[0].k, slots=self.slots)

    def _rng(self, cid: int, b: int, rnd: int) -> np.random.Generator:
        return np.random.default_rng([self.seed, cid & 0xFFFFFFFF, cid >> 32, b, rnd])

    def _decide(self, cid: int, b: int, rnd: int, now: float) -> None:
        from ncclrl.agents.online import Commit, Plan, make_policy

        run = self.comms[cid].buckets[b]
        if run.policy is None:
            run.policy = make_policy(self.policy_name)
        state = self._state(run, rnd)
        rng = self._rng(cid, b, rnd)
        # round 0 carries no evidence (the bucket's warm-up): the policy's first plan
        out = (run.policy.first(run.narms, state.prior_us, self.slots, rng) if rnd == 0
               else run.policy.decide(state, rng))
        evidence = ",".join(f"a{a}={s.mean_us:.1f}us/n{s.n}" for a, s in enumerate(state.arms))
        if isinstance(out, Plan) and 0 < len(out.slots) <= MAX_PLAN and all(0 <= a < run.narms for a in out.slots):
            self._verdict(cid, b, rnd, "PLAN", ",".join(str(a) for a in out.slots), now, evidence)
            run.rounds_done = rnd + 1
            return
        arm = out.arm if isinstance(out, Commit) and 0 <= out.arm < run.narms else 0
        a0, ax = state.arms[0], state.arms[arm]
        if arm and not (ax.n > 0 and a0.n > 0 and ax.mean_us < a0.mean_us):
            arm = 0  # never a size made slower than the static table on the evidence
        self._verdict(cid, b, rnd, "COMMIT", str(arm), now, evidence)
        run.finished = True

    def _verdict(self, cid: int, b: int, rnd: int, kind: str, what: str, now: float, evidence: str = "-") -> None:
        run = self.comms[cid].buckets[b]
        run.decided.add(rnd)
        k = next(iter(run.reports[rnd].values())).k if run.reports.get(rnd) else 0
        self._comm_send(cid, f"VERDICT {cid:016x} {b} {rnd} {k} {kind} {what} {evidence.replace(' ', '_')}")
        rec = {"t": round(now, 6), "comm": f"{cid:016x}", "bucket": bucket_name(b), "round": rnd, "k": k,
               "verdict": kind, "what": what, "evidence": evidence, "policy": self.policy_name}
        log.info("# %016x %s round %d: %s %s at call %d (%s)", cid, bucket_name(b), rnd, kind, what, k, evidence)
        self.events(rec)


async def serve(core: Coordinator, host: str, port: int, ready: Callable[[int], None] | None = None,
                stop: asyncio.Event | None = None) -> None:
    """Run the coordinator's server until ``stop`` is set (or forever)."""
    writers: dict[int, asyncio.StreamWriter] = {}
    counter = iter(range(1, 1 << 62))
    wake = asyncio.Event()

    def flush() -> None:
        for conn, lines in core.take().items():
            wr = writers.get(conn)
            if wr is not None and not wr.is_closing():
                wr.write("".join(lines).encode())
        for conn in list(core.closing):
            core.closing.discard(conn)
            wr = writers.get(conn)
            if wr is not None:
                wr.close()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conn = next(counter)
        writers[conn] = writer
        core.opened(conn)
        try:
            while True:
                raw = await reader.readline()
                if not raw:
                    break
                if len(raw) > 8192:
                    break
                core.line(conn, raw.decode("ascii", "replace").strip(), time.monotonic())
                flush()
                wake.set()
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.CancelledError):
            pass  # a rank gone, or the server stopping: the handler ends quietly either way
        finally:
            core.closed(conn, time.monotonic())
            flush()
            writers.pop(conn, None)
            writer.close()

    server = await asyncio.start_server(handle, host, port, limit=1 << 16)
    bound = server.sockets[0].getsockname()[1]
    if ready:
        ready(bound)
    stop = stop or asyncio.Event()
    async with server:
        while not stop.is_set():
            due = core.next_deadline()
            timeout = 0.5 if due is None else max(0.0, min(0.5, due - time.monotonic()))
            wake.clear()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(wake.wait(), timeout=timeout)
            core.tick(time.monotonic())
            flush()
        for wr in list(writers.values()):  # stopping: every rank sees its connection end (and freezes)
            wr.close()


@dataclass
class CoordinatorCommand:
    """Serve the online mode's agreement: every rank's plugin connects here (NCCLRL_ONLINE_COORD=HOST:PORT).

    :param host: address to listen on (0.0.0.0: every interface; the ranks must reach it)
    :param port: TCP port (0: any free port, printed at start)
    :param policy: exploration policy (round-robin, halving, thompson, ppo; shipped: the study's choice)
    :param round_timeout_s: a round not reported by every rank this long after its first report freezes the communicator
    :param slots: the longest plan a round may have (2..64)
    :param seed: seed of the policies' random numbers
    :param log: JSONL file every verdict and freeze is appended to, with its evidence ('' for none)
    :param port_file: file the bound port is written to once listening ('' for none)
    """

    host: str = "0.0.0.0"
    port: int = 29555
    policy: str = ""
    round_timeout_s: float = 10.0
    slots: int = 16
    seed: int = 0
    log: str = ""
    port_file: str = ""

    def check(self) -> None:
        from ncclrl.agents.online import POLICIES

        if self.policy and self.policy not in POLICIES:
            raise ConfigError("policy", f"must be one of {', '.join(POLICIES)}, got {self.policy!r}")
        if not 0 <= self.port < 65536:
            raise ConfigError("port", f"must be in 0..65535, got {self.port}")
        if not 0 < self.round_timeout_s <= 3600:
            raise ConfigError("round_timeout_s", f"must be in (0, 3600], got {self.round_timeout_s}")
        if not 2 <= self.slots <= MAX_PLAN:
            raise ConfigError("slots", f"must be in 2..{MAX_PLAN}, got {self.slots}")


def main_coordinator(args: DictConfig) -> int:
    from ncclrl.agents.online import SHIPPED_POLICY

    policy = str(args["policy"]) or SHIPPED_POLICY
    path = Path(str(args["log"])) if str(args["log"]) else None
    if path:
        path.parent.mkdir(parents=True, exist_ok=True)
    fh = path.open("a", buffering=1) if path else None

    def events(rec: dict) -> None:
        if fh:
            fh.write(json.dumps(rec) + "\n")

    core = Coordinator(policy, float(args["round_timeout_s"]), int(args["slots"]), int(args["seed"]), events)

    def ready(port: int) -> None:
        log.info("# ncclrl coordinator on %s:%d, policy %s, round timeout %g s: export NCCLRL_ONLINE_COORD=HOST:%d",
                 args["host"], port, policy, float(args["round_timeout_s"]), port)
        if str(args["port_file"]):
            tmp = Path(str(args["port_file"]) + ".tmp")
            tmp.write_text(f"{port}\n")
            tmp.replace(str(args["port_file"]))

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        await serve(core, str(args["host"]), int(args["port"]), ready, stop)

    try:
        asyncio.run(main())
    finally:
        if fh:
            fh.close()
    return 0


COMMAND = Command("coordinator", CoordinatorCommand, main_coordinator,
                  "serve the plugin's online mode: every rank's timings in, one verdict per round out")
register(COMMAND)
