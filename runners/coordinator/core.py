"""The coordinator's state machine: lines in, lines out, a clock; no sockets (:mod:`.server` has them).

For each communicator, collective and size bucket, the ranks report their timings of the round just
explored; once every rank of the communicator has, the exploration policy (:mod:`ncclrl.agents.online`)
decides the next round's plan or the arm to commit. The verdict goes to every rank, which confirms it
holds it (``HOLD``, with a digest of the line); only once every rank has does the coordinator send
``GO``, and a rank applies a verdict only with its GO. A round without every report or every HOLD
in time is aborted (``ABORT``) and the communicator frozen: every rank keeps its static table there.
No GO is ever sent after an ABORT of the same round, nor an ABORT after its GO. Why no two ranks
can apply different verdicts, and the one case outside it: docs/design/online.md.
"""

from __future__ import annotations

import hmac
import logging
import math
import re
import secrets
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from ncclrl.costmodel.errors import ConfigError
from ncclrl.costmodel.table import fingerprint as fnv1a64  # the plugin digests a verdict line the same way
from ncclrl.runners.coordinator import secret as S

log = logging.getLogger(__name__)

PROTOCOL_VERSION = 2
N_BUCKETS = 5 * 64
MAX_ARMS = 8
MAX_PLAN = 64
#: most ranks a communicator may say it has, communicators one connection may carry
MAX_RANKS = 1 << 16
MAX_COMMS_PER_CONN = 1024
COLLS = ("broadcast", "reduce", "allgather", "reducescatter", "allreduce")
_HEX16 = re.compile(r"[0-9a-fA-F]{1,16}")
_NONCE = re.compile(r"[0-9a-f]{32}")
_HEX64 = re.compile(r"[0-9a-f]{64}")
_PEER = re.compile(r"-|[0-9.]{7,15}:\d{1,5}|\[[0-9a-fA-F:.]{2,45}\]:\d{1,5}")


@dataclass
class Report:
    """One rank's cumulative evidence for a bucket at the end of a round."""

    k: int
    fp: str
    n: list[int]
    sum_us: list[float]
    sumsq_us: list[float]
    max_us: list[float]


@dataclass
class Pending:
    """A verdict sent, waiting for every rank to confirm it holds it."""

    kind: str
    digest: str
    due: float
    holds: set[int] = field(default_factory=set)


@dataclass
class BucketRun:
    """A bucket's exploration on one communicator, as the coordinator follows it."""

    narms: int = 0
    fp: str = ""
    rounds_done: int = 0
    reports: dict[int, dict[int, Report]] = field(default_factory=dict)  # round -> rank -> report
    deadline: dict[int, float] = field(default_factory=dict)  # round -> time every report is due
    decided: set[int] = field(default_factory=set)  # rounds a verdict or an abort was sent for
    pending: dict[int, Pending] = field(default_factory=dict)  # verdicts sent, awaiting every HOLD
    gone: set[int] = field(default_factory=set)  # rounds whose GO was sent: final
    finished: bool = False
    policy: object | None = None


@dataclass
class CommRun:
    nranks: int
    nnodes: int
    table_fp: str
    conns: dict[int, int] = field(default_factory=dict)  # rank -> connection id
    peers: dict[int, str] = field(default_factory=dict)  # rank -> where its peers may ask it (HOST:PORT, or -)
    peers_sent: bool = False
    buckets: dict[int, BucketRun] = field(default_factory=dict)
    left: set[int] = field(default_factory=set)
    frozen: str = ""


@dataclass
class ConnState:
    """A connection: its handshake, then the (communicator, rank) pairs it speaks for."""

    nonce_c: str = ""
    nonce_r: str = ""
    authed: bool = False
    key: str = ""  # the session key: every line after the handshake is sealed with it
    tx: int = 0  # lines sealed to this connection
    rx: int = 0  # lines read from it
    ranks: set[tuple[int, int]] = field(default_factory=set)


def bucket_name(bucket: int) -> str:
    return f"{COLLS[bucket // 64]} 2^{bucket % 64} B" if 0 <= bucket < N_BUCKETS else f"bucket {bucket}"


def _word(why: str) -> str:
    return why.replace(" ", "_")[:200]


class Coordinator:
    """The coordinator's state machine.

    :param policy: name of the exploration policy (:data:`ncclrl.agents.online.POLICIES`)
    :param secret: the job's secret (hex); a connection that cannot prove it holds it is refused
    :param round_timeout_s: a round whose reports, or whose verdict's confirmations, are not all in
        this long after the first (after it was sent) is aborted and its communicator frozen
    :param slots: the longest plan a policy may give (the plugin accepts up to 64)
    :param seed: seed of the policies' random numbers (each bucket draws from (seed, communicator, bucket))
    :param events: called with each verdict's record (a dict), e.g. to append it to a JSONL log, by
        :meth:`emit`, which the server calls once the lines the records speak of are written
    :param max_comms: most communicators followed at once
    """

    def __init__(self, policy: str, secret: str, round_timeout_s: float = 10.0, slots: int = 16, seed: int = 0,
                 events: Callable[[dict], None] | None = None, max_comms: int = 4096) -> None:
        from ncclrl.agents.online import make_policy, warm_up

        make_policy(policy)  # a bad name fails here, before any rank connects
        warm_up()
        if not S.valid(secret):
            raise ConfigError("secret", f"must be {S.MIN_HEX} to {S.MAX_HEX} hex digits")
        if not 0 < round_timeout_s <= 3600:
            raise ConfigError("round_timeout_s", f"must be in (0, 3600], got {round_timeout_s}")
        if not 2 <= slots <= MAX_PLAN:
            raise ConfigError("slots", f"must be in 2..{MAX_PLAN}, got {slots}")
        if max_comms < 1:
            raise ConfigError("max_comms", f"must be >= 1, got {max_comms}")
        self.policy_name = policy
        self._secret = secret
        self.round_timeout_s = float(round_timeout_s)
        self.slots = int(slots)
        self.seed = int(seed)
        self.max_comms = int(max_comms)
        self.events = events or (lambda rec: None)
        self.comms: dict[int, CommRun] = {}
        self.conns: dict[int, ConnState] = {}
        self.outbox: dict[int, list[str]] = {}
        self.closing: set[int] = set()
        self.records: list[dict] = []
        self._refused = 0

    # -- connections ---------------------------------------------------------------------------
    def _send(self, conn: int, line: str) -> None:
        st = self.conns.get(conn)
        if st is not None and st.authed:
            line = f"{line} ~{S.line_mac(st.key, 'c', st.tx, line)}"
            st.tx += 1
        self.outbox.setdefault(conn, []).append(line + "\n")

    def _comm_send(self, cid: int, line: str) -> None:
        for conn in set(self.comms[cid].conns.values()):
            self._send(conn, line)

    def take(self) -> dict[int, list[str]]:
        """The lines to send, by connection (and forget them)."""
        out, self.outbox = self.outbox, {}
        return out

    def opened(self, conn: int) -> None:
        self.conns[conn] = ConnState()

    def authed(self, conn: int) -> bool:
        st = self.conns.get(conn)
        return bool(st and st.authed)

    def closed(self, conn: int, now: float) -> None:
        """A connection ended: every communicator it carried a rank of is frozen."""
        st = self.conns.pop(conn, None)
        for cid, rank in sorted(st.ranks if st else ()):
            comm = self.comms.get(cid)
            if comm and comm.conns.get(rank) == conn:
                del comm.conns[rank]
                self._freeze(cid, f"rank {rank}'s connection closed", now)

    def _refuse(self, conn: int, why: str, now: float) -> None:
        """Say why, close the connection, and freeze what it carried (nothing more it says counts)."""
        self._send(conn, f"REJECT {_word(why)}")
        self.closing.add(conn)
        self.closed(conn, now)

    # -- faults --------------------------------------------------------------------------------
    def _freeze(self, cid: int, why: str, now: float) -> None:
        comm = self.comms[cid]
        if comm.frozen:
            return
        comm.frozen = why
        for b, run in comm.buckets.items():
            for rnd in sorted(set(run.reports) | set(run.pending)):
                if rnd not in run.gone and (rnd not in run.decided or rnd in run.pending):
                    self._abort(cid, b, rnd, why, now)
            run.finished = True
        self._comm_send(cid, self._freeze_line(cid))
        log.warning("# communicator %016x frozen: %s", cid, why)
        self._event({"t": round(now, 6), "comm": f"{cid:016x}", "event": "freeze", "why": why})

    def _freeze_line(self, cid: int) -> str:
        return f"FREEZE {cid:016x} {_word(self.comms[cid].frozen)}"

    def _abort(self, cid: int, b: int, rnd: int, why: str, now: float) -> None:
        run = self.comms[cid].buckets[b]
        run.decided.add(rnd)
        run.pending.pop(rnd, None)
        self._comm_send(cid, f"ABORT {cid:016x} {b} {rnd} {_word(why)}")
        self._event({"t": round(now, 6), "comm": f"{cid:016x}", "bucket": bucket_name(b), "round": rnd,
                     "verdict": "ABORT", "what": why, "policy": self.policy_name})

    def _event(self, rec: dict) -> None:
        self.records.append(rec)

    def emit(self) -> None:
        """Hand the records so far to ``events`` (after the lines they speak of were written: the log
        never shows a verdict before every rank's socket holds it)."""
        recs, self.records = self.records, []
        for rec in recs:
            try:
                self.events(rec)
            except Exception as e:  # the record is lost; the ranks' agreement never depends on it
                log.warning("# the verdict log could not be written (%s): this record is lost: %s", e, rec)

    def tick(self, now: float) -> None:
        """Abort rounds past their deadline: a rank that stopped reporting, or stopped confirming."""
        for cid, comm in list(self.comms.items()):
            if comm.frozen:
                continue
            for b, run in list(comm.buckets.items()):
                late = [rnd for rnd, due in run.deadline.items() if rnd not in run.decided and now >= due]
                if late:
                    missing = sorted(set(range(comm.nranks)) - set(run.reports.get(late[0], {})))[:8]
                    self._freeze(cid, f"round {late[0]} of {bucket_name(b)}: ranks {missing} did not report within "
                                      f"{self.round_timeout_s:g} s", now)
                    break
                slow = [rnd for rnd, p in run.pending.items() if now >= p.due]
                if slow:
                    p = run.pending[slow[0]]
                    missing = sorted(set(range(comm.nranks)) - p.holds)[:8]
                    self._freeze(cid, f"round {slow[0]} of {bucket_name(b)}: ranks {missing} did not confirm the "
                                      f"verdict within {self.round_timeout_s:g} s", now)
                    break

    def next_deadline(self) -> float | None:
        dues = [due for c in self.comms.values() if not c.frozen for r in c.buckets.values()
                for rnd, due in r.deadline.items() if rnd not in r.decided]
        dues += [p.due for c in self.comms.values() if not c.frozen for r in c.buckets.values()
                 for p in r.pending.values()]
        return min(dues) if dues else None

    # -- messages ------------------------------------------------------------------------------
    def line(self, conn: int, text: str, now: float) -> None:
        """One line from a connection."""
        st = self.conns.get(conn)
        w = text.split()
        if not w or st is None or conn in self.closing:  # a connection already refused: nothing it says counts
            return
        if not st.authed:
            self._handshake(conn, st, w, now)
            return
        payload, _, seal = text.rpartition(" ~")
        if not payload or not hmac.compare_digest(seal.encode(errors="replace"),
                                                  S.line_mac(st.key, "r", st.rx, payload).encode()):
            log.warning("# connection %d refused: a line not sealed with its session key", conn)
            self._refuse(conn, "not sealed", now)
            return
        st.rx += 1
        w = payload.split()
        if not w:
            return
        try:
            if w[0] == "HELLO":
                self._hello(conn, st, w, now)
            elif w[0] == "REPORT":
                self._report(conn, w, now)
            elif w[0] == "HOLD":
                self._hold(conn, w, now)
            elif w[0] == "BYE":
                self._bye(conn, st, w, now)
            else:
                raise ValueError(f"unknown message {w[0][:16]!r}")
        except (ValueError, IndexError, KeyError, OverflowError) as e:
            log.warning("# connection %d: %s: %s", conn, e, text[:200])
            self._refuse(conn, f"malformed {e}"[:80], now)  # at once: its reports must not complete a round

    def _handshake(self, conn: int, st: ConnState, w: list[str], now: float) -> None:
        """VERSION <nonce> -> WELCOME with our proof; AUTH <proof> -> authenticated. Anything else: refused."""
        if w[0] == "VERSION" and not st.nonce_r:
            if len(w) != 3 or w[1] != str(PROTOCOL_VERSION) or not _NONCE.fullmatch(w[2]):
                self._refuse(conn, f"version {w[1][:8] if len(w) > 1 else '?'} is not {PROTOCOL_VERSION}", now)
                return
            st.nonce_r, st.nonce_c = w[2], secrets.token_hex(16)
            mine = S.proof(self._secret, "coord", st.nonce_r, st.nonce_c)
            self._send(conn, f"WELCOME {PROTOCOL_VERSION} {int(self.round_timeout_s * 1000)} {st.nonce_c} {mine}")
            return
        if w[0] == "AUTH" and st.nonce_r and len(w) == 2 and _HEX64.fullmatch(w[1]) and \
                hmac.compare_digest(w[1], S.proof(self._secret, "rank", st.nonce_c, st.nonce_r)):
            st.authed = True
            st.key = S.session_key(self._secret, st.nonce_r, st.nonce_c)
            return
        self._refused += 1
        if self._refused <= 10 or self._refused % 1000 == 0:  # an outsider cannot fill the log
            log.warning("# connection %d refused: it did not prove it holds the job's secret (%d refused so far)",
                        conn, self._refused)
        self._refuse(conn, "not authenticated", now)

    def _hello(self, conn: int, st: ConnState, w: list[str], now: float) -> None:
        if len(w) != 9 or w[1] != str(PROTOCOL_VERSION) or not _HEX16.fullmatch(w[2]) or \
                not _HEX16.fullmatch(w[7]) or not _PEER.fullmatch(w[8]):
            raise ValueError("HELLO has 9 fields: HELLO 2 COMM RANK NRANKS NNODES PID TABLE_FP PEER_ADDR")
        cid, rank, nranks, nnodes, table_fp = int(w[2], 16), int(w[3]), int(w[4]), int(w[5]), w[7].lower()
        if not 1 <= nranks <= MAX_RANKS or not 0 <= rank < nranks or not 1 <= nnodes <= nranks:
            raise ValueError(f"rank {rank} of {nranks} on {nnodes} nodes")
        if len(st.ranks) >= MAX_COMMS_PER_CONN:
            raise ValueError(f"more than {MAX_COMMS_PER_CONN} communicators on one connection")
        comm = self.comms.get(cid)
        if comm is None:
            if len(self.comms) >= self.max_comms:
                raise ValueError(f"more than {self.max_comms} communicators")
            comm = self.comms[cid] = CommRun(nranks=nranks, nnodes=nnodes, table_fp=table_fp)
        st.ranks.add((cid, rank))
        # every way below ends with this connection told of a freeze, if there is one: a rank that joins a
        # frozen communicator and hears nothing waits at its first verdict call for as long as it is connected
        if comm.nranks != nranks or rank in comm.conns or rank in comm.left:
            comm.conns[rank] = conn
            if comm.frozen:
                self._send(conn, self._freeze_line(cid))
            self._freeze(cid, f"rank {rank} says {nranks} ranks, or joined twice", now)
            return
        comm.conns[rank] = conn
        comm.peers[rank] = w[8]
        if len(comm.conns) == comm.nranks and not comm.peers_sent:  # before any verdict: where to ask each other
            comm.peers_sent = True
            for r, addr in sorted(comm.peers.items()):
                self._comm_send(cid, f"PEER {cid:016x} {r} {addr}")
        if comm.frozen:
            self._send(conn, self._freeze_line(cid))
        elif comm.table_fp != table_fp:
            self._freeze(cid, f"the ranks' static tables differ (fingerprints {comm.table_fp} and {table_fp})", now)

    def _bye(self, conn: int, st: ConnState, w: list[str], now: float) -> None:
        """A rank's communicator was destroyed: its leaving is no fault, unless a round waits on it."""
        cid, rank = int(w[1], 16), int(w[2])
        comm = self.comms.get(cid)
        if comm is None or comm.conns.get(rank) != conn:
            return  # a communicator this connection never joined: nothing to leave
        del comm.conns[rank]
        st.ranks.discard((cid, rank))
        comm.left.add(rank)
        waiting = [b for b, run in comm.buckets.items()
                   if any(rnd not in run.decided and rank not in reps for rnd, reps in run.reports.items())
                   or any(rank not in p.holds for p in run.pending.values())]
        if waiting:
            self._freeze(cid, f"rank {rank} left while {bucket_name(waiting[0])} waited for it", now)
        elif len(comm.left) == comm.nranks:
            del self.comms[cid]  # every rank left: the id may come back (a reused unique id) as a new communicator

    def _rank_of(self, conn: int, w: list[str]) -> tuple[int, CommRun, int]:
        cid, rank = int(w[1], 16), int(w[2])
        comm = self.comms[cid]
        if comm.conns.get(rank) != conn:
            raise ValueError(f"rank {rank} of {cid:016x} speaks on another connection")
        return cid, comm, rank

    def _report(self, conn: int, w: list[str], now: float) -> None:
        cid, comm, rank = self._rank_of(conn, w)
        b, rnd, k, fp, narms = int(w[3]), int(w[4]), int(w[5]), w[6], int(w[7])
        if not 0 <= b < N_BUCKETS or not 1 <= narms <= MAX_ARMS or len(w) != 8 + narms or not 0 <= rnd < 1 << 30:
            raise ValueError("bucket, round or arms out of range")
        n, s, q, mx = [], [], [], []
        for f in w[8:]:
            a, b_, c, d = f.split(":")
            vals = (float(b_), float(c), float(d))
            if not 0 <= int(a) < 1 << 40 or not all(math.isfinite(v) and v >= 0 for v in vals):
                raise ValueError("evidence out of range")
            n.append(int(a))
            s.append(vals[0])
            q.append(vals[1])
            mx.append(vals[2])
        if comm.frozen:  # every rank that reports gets the abort, whenever it reports
            run = comm.buckets.setdefault(b, BucketRun(narms=narms, fp=fp, finished=True))
            run.decided.add(rnd)
            self._send(conn, f"ABORT {cid:016x} {b} {rnd} frozen:{_word(comm.frozen)}")
            return
        run = comm.buckets.setdefault(b, BucketRun(narms=narms, fp=fp))
        if run.finished or rnd in run.decided or rnd != run.rounds_done:
            raise ValueError(f"a report for round {rnd} of {bucket_name(b)}, which is not open")
        if now >= run.deadline.get(rnd, math.inf):  # past the round's timeout: it is aborted, never decided
            self._freeze(cid, f"round {rnd} of {bucket_name(b)} completed after its {self.round_timeout_s:g} s", now)
            return
        reports = run.reports.setdefault(rnd, {})
        reports[rank] = Report(k=k, fp=fp, n=n, sum_us=s, sumsq_us=q, max_us=mx)
        run.deadline.setdefault(rnd, now + self.round_timeout_s)
        if fp != run.fp or narms != run.narms or any(r.k != k for r in reports.values()):
            self._freeze(cid, f"ranks disagree on the arms or the call index of {bucket_name(b)}", now)
            return
        if len(reports) == comm.nranks:
            self._decide(cid, b, rnd, now)

    def _hold(self, conn: int, w: list[str], now: float) -> None:
        """HOLD COMM RANK BUCKET ROUND DIGEST: the rank holds the verdict it was sent."""
        cid, comm, rank = self._rank_of(conn, w)
        b, rnd, digest = int(w[3]), int(w[4]), w[5].lower()
        run = comm.buckets.get(b)
        p = run.pending.get(rnd) if run else None
        if comm.frozen or p is None:
            return  # a verdict already aborted (its ABORT is on the way) or never sent to this rank's communicator
        if digest != p.digest:
            self._freeze(cid, f"rank {rank} holds another verdict for round {rnd} of {bucket_name(b)}", now)
            return
        p.holds.add(rank)
        if len(p.holds) == comm.nranks:
            self._go(cid, b, rnd, now)

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
                                 std_us=float(math.sqrt(np.mean(var))) if n > 1 and var else math.nan,
                                 max_us=max((r.max_us[a] for r in reps if r.n[a] > 0), default=math.nan)))
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
            self._prepare(cid, b, rnd, "PLAN", ",".join(str(a) for a in out.slots), now, evidence)
            return
        arm = out.arm if isinstance(out, Commit) and 0 <= out.arm < run.narms else 0
        a0, ax = state.arms[0], state.arms[arm]
        if arm and not (ax.n > 0 and a0.n > 0 and ax.mean_us < a0.mean_us):
            arm = 0  # never a size made slower than the static table on the evidence
        self._prepare(cid, b, rnd, "COMMIT", str(arm), now, evidence)

    def _prepare(self, cid: int, b: int, rnd: int, kind: str, what: str, now: float, evidence: str) -> None:
        """Send the verdict; it applies only once every rank has confirmed it holds it (:meth:`_go`)."""
        run = self.comms[cid].buckets[b]
        run.decided.add(rnd)
        k = next(iter(run.reports[rnd].values())).k
        text = f"VERDICT {cid:016x} {b} {rnd} {k} {kind} {what} {_word(evidence)}"
        run.pending[rnd] = Pending(kind=kind, digest=fnv1a64(text), due=now + self.round_timeout_s)
        self._comm_send(cid, text)
        log.info("# %016x %s round %d: %s %s at call %d (%s)", cid, bucket_name(b), rnd, kind, what, k, evidence)
        self._event({"t": round(now, 6), "comm": f"{cid:016x}", "bucket": bucket_name(b), "round": rnd, "k": k,
                     "verdict": kind, "what": what, "evidence": evidence, "policy": self.policy_name})

    def _go(self, cid: int, b: int, rnd: int, now: float) -> None:
        run = self.comms[cid].buckets[b]
        p = run.pending.pop(rnd)
        run.gone.add(rnd)
        self._comm_send(cid, f"GO {cid:016x} {b} {rnd}")
        if p.kind == "PLAN":
            run.rounds_done = rnd + 1
        else:
            run.finished = True
        for old in [r for r in run.reports if r < rnd]:  # the policy reads the latest (cumulative) reports only
            del run.reports[old]
        self._event({"t": round(now, 6), "comm": f"{cid:016x}", "bucket": bucket_name(b), "round": rnd,
                     "event": "go"})
