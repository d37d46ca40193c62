"""The plugin's online mode: the coordinator's state machine, the fault harness (several processes
load the plugin and play NCCL's tuner and profiler calls around a real coordinator, faults
injected; plain and under AddressSanitizer/UndefinedBehaviorSanitizer), the e2e side's environment
and the model's candidate rows."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from ncclrl.envs.online_harness import FAULTS, SharedCoordinator, run_job
from ncclrl.runners.coordinator import Coordinator, fnv1a64
from ncclrl.runners.coordinator.secret import line_mac, proof, session_key

PLUGIN = Path(__file__).resolve().parents[1] / "plugin"
FP = "00000000000000aa"


# -- the coordinator's state machine -------------------------------------------------------------

SECRET = "5e" * 32
NONCE = "0123456789abcdef" * 2


SESSIONS: dict[tuple[int, int], list] = {}  # (core, connection) -> [session key, lines sealed so far]


def handshake(core: Coordinator, conn: int, secret: str = SECRET) -> list[str]:
    core.opened(conn)
    core.line(conn, f"VERSION 2 {NONCE}", 0.0)
    out = core.take()
    welcome = out.pop(conn)[0].split()
    for c, queued in out.items():  # the other connections' lines stay for lines() to read, in order
        core.outbox[c] = queued + core.outbox.get(c, [])
    assert welcome[:2] == ["WELCOME", "2"] and welcome[4] == proof(SECRET, "coord", NONCE, welcome[3])
    core.line(conn, f"AUTH {proof(secret, 'rank', welcome[3], NONCE)}", 0.0)
    SESSIONS[id(core), conn] = [session_key(secret, NONCE, welcome[3]), 0]
    SESSIONS[id(core), conn, "c"] = 0  # (a new core may have an old one's id)
    return welcome


def send(core: Coordinator, conn: int, text: str, now: float = 0.0) -> None:
    """A line from a rank, sealed with its connection's key as the plugin seals it."""
    sess = SESSIONS[id(core), conn]
    core.line(conn, f"{text} ~{line_mac(sess[0], 'r', sess[1], text)}", now)
    sess[1] += 1


def hello(core: Coordinator, conn: int, rank: int, nranks: int = 2, cid: str = "abc", table: str = "0") -> None:
    handshake(core, conn)
    send(core, conn, f"HELLO 2 {cid} {rank} {nranks} 1 100 {table} 127.0.0.1:{4000 + rank}")


def report(core: Coordinator, conn: int, rank: int, rnd: int, k: int, arms: list[tuple[int, float, float]],
           now: float = 0.0, fp: str = FP, cid: str = "abc") -> None:
    ev = " ".join(f"{n}:{n * m:.3f}:{n * (m * m + s * s):.3f}:{m + 2 * s if n else 0:.3f}" for n, m, s in arms)
    send(core, conn, f"REPORT {cid} {rank} 260 {rnd} {k} {fp} {len(arms)} {ev}", now)


def unsealed(core: Coordinator, conn: int, line: str) -> str:
    """A line the coordinator sent, its seal checked (each connection's lines in order) and cut off."""
    text, _, seal = line.strip().rpartition(" ~")
    if not text:
        return line.strip()  # sent before the handshake ended (WELCOME, REJECT): not sealed
    n = SESSIONS.get((id(core), conn, "c"), 0)
    assert seal == line_mac(SESSIONS[id(core), conn][0], "c", n, text), line
    SESSIONS[id(core), conn, "c"] = n + 1
    return text


def lines(core: Coordinator) -> dict[int, list[str]]:
    return {c: [unsealed(core, c, x) for x in v] for c, v in core.take().items()}


def hold(core: Coordinator, conn: int, rank: int, verdict: str, now: float = 0.0, digest: str | None = None) -> None:
    w = verdict.split()
    send(core, conn, f"HOLD {w[1]} {rank} {w[2]} {w[3]} {digest or fnv1a64(verdict)}", now)


def two_ranks(policy: str = "round-robin", timeout: float = 5.0) -> Coordinator:
    core = Coordinator(policy, SECRET, round_timeout_s=timeout)
    hello(core, 1, 0)
    hello(core, 2, 1)
    lines(core)
    return core


ZERO3 = [(0, 0.0, 0.0)] * 3


def test_a_verdict_needs_every_rank_and_applies_only_once_every_rank_holds_it():
    core = two_ranks()
    report(core, 1, 0, 0, 2, ZERO3)
    assert lines(core) == {}  # rank 1 has not reported
    report(core, 2, 1, 0, 2, ZERO3)
    out = lines(core)
    assert out[1] == out[2] and out[1][0].startswith("VERDICT 0000000000000abc 260 0 2 PLAN ")
    plan = [int(a) for a in out[1][0].split()[6].split(",")]
    assert sorted(set(plan)) == [0, 1, 2]
    hold(core, 1, 0, out[1][0])
    assert lines(core) == {}  # no GO while rank 1 has not confirmed it
    hold(core, 2, 1, out[2][0])
    assert lines(core) == {1: ["GO 0000000000000abc 260 0"], 2: ["GO 0000000000000abc 260 0"]}


def test_every_rank_learns_where_to_ask_the_others_before_any_verdict():
    core = Coordinator("halving", SECRET)
    hello(core, 1, 0)
    assert all(not x.startswith("PEER") for x in sum(lines(core).values(), []))
    hello(core, 2, 1)
    out = lines(core)
    assert out[1] == out[2] == ["PEER 0000000000000abc 0 127.0.0.1:4000", "PEER 0000000000000abc 1 127.0.0.1:4001"]


def test_a_connection_without_the_secret_is_refused_and_cannot_join():
    core = Coordinator("halving", SECRET)
    handshake(core, 1, secret="77" * 32)  # the wrong proof
    assert lines(core)[1] == ["REJECT not_authenticated"] and 1 in core.closing
    core.line(1, "HELLO 2 abc 0 2 1 100 0 -", 0.0)
    assert core.comms == {}
    core.opened(2)
    core.line(2, "HELLO 2 abc 0 2 1 100 0 -", 0.0)  # no handshake at all
    assert lines(core)[2] == ["REJECT not_authenticated"] and core.comms == {}
    core.opened(3)
    core.line(3, f"VERSION 2 {NONCE}", 0.0)
    core.line(3, "AUTH " + "0" * 64, 0.0)  # a guess
    assert lines(core)[3][-1] == "REJECT not_authenticated"


def test_a_line_changed_replayed_or_unsealed_after_the_handshake_is_refused():
    """What a relay between a rank and the coordinator could do, once both proved the secret."""
    for attack in ("changed", "replayed", "unsealed"):
        core = Coordinator("halving", SECRET)
        hello(core, 1, 0)
        lines(core)
        key, n = SESSIONS[id(core), 1]
        text = "REPORT abc 0 260 0 2 00000000000000aa 3 0:0:0:0 0:0:0:0 0:0:0:0"
        if attack == "changed":  # sealed for one report, carrying another
            core.line(1, f"{text.replace(' 0:0', ' 5:0', 1)} ~{line_mac(key, 'r', n, text)}", 0.0)
        elif attack == "replayed":  # the HELLO's own seal again
            core.line(1, f"HELLO 2 abc 0 2 1 100 0 127.0.0.1:4000 ~{line_mac(key, 'r', n - 1, 'x')}", 0.0)
        else:
            core.line(1, text, 0.0)
        assert lines(core)[1] == ["REJECT not_sealed"] and 1 in core.closing, attack
        assert not core.comms[0xABC].conns  # its rank is out: the communicator cannot complete a round with it


def test_a_hold_of_another_verdict_freezes_and_a_missing_hold_aborts_never_a_go():
    core = two_ranks(timeout=2.0)
    for r, conn in ((0, 1), (1, 2)):
        report(core, conn, r, 0, 2, ZERO3)
    v = lines(core)[1][0]
    hold(core, 1, 0, v, digest="0" * 16)  # rank 0 holds other bytes than were sent
    out = lines(core)
    assert out[1][0] == "ABORT 0000000000000abc 260 0 rank_0_holds_another_verdict_for_round_0_of_allreduce_2^4_B"
    assert out[1][1].startswith("FREEZE") and out[1] == out[2]
    hold(core, 2, 1, v)
    assert all(not x.startswith("GO") for x in sum(lines(core).values(), []))
    core2 = two_ranks(timeout=2.0)
    for r, conn in ((0, 1), (1, 2)):
        report(core2, conn, r, 0, 2, ZERO3, now=10.0)
    v = lines(core2)[1][0]
    hold(core2, 1, 0, v, now=10.5)
    core2.tick(11.9)
    assert lines(core2) == {}
    core2.tick(12.0)  # rank 1 never confirmed: the round is aborted, and a late HOLD gets no GO
    out = lines(core2)
    assert out[1][0].startswith("ABORT 0000000000000abc 260 0") and out[1] == out[2]
    hold(core2, 2, 1, v, now=12.1)
    assert all(not x.startswith("GO") for x in sum(lines(core2).values(), []))


def test_the_coordinator_never_commits_an_arm_slower_than_the_table():
    core = two_ranks()
    for r, conn in ((0, 1), (1, 2)):
        report(core, conn, r, 0, 2, ZERO3)
    verdicts = []
    v = lines(core)[1][0]
    for rnd in range(1, 60):
        hold(core, 1, 0, v)
        hold(core, 2, 1, v)
        lines(core)
        k = int(v.split()[4]) + 24
        for r, conn in ((0, 1), (1, 2)):
            # arm 1 slower than arm 0, arm 2 much slower: nothing beats the table
            report(core, conn, r, rnd, k, [(8 * rnd, 100.0, 2.0), (8 * rnd, 130.0, 2.0), (8 * rnd, 200.0, 2.0)])
        out = lines(core)
        assert out[1] == out[2]
        v = out[1][0]
        verdicts.append(v)
        if " COMMIT " in v:
            break
    assert " COMMIT 0 " in verdicts[-1]


def test_a_rank_that_stops_reporting_aborts_the_round_and_freezes_the_communicator():
    core = two_ranks(timeout=2.0)
    report(core, 1, 0, 0, 2, ZERO3, now=10.0)
    core.tick(11.9)
    assert lines(core) == {}
    core.tick(12.0)
    out = lines(core)
    assert out[1] == out[2]
    assert out[1][0].startswith("ABORT 0000000000000abc 260 0")
    assert out[1][1].startswith("FREEZE 0000000000000abc")
    report(core, 2, 1, 0, 2, ZERO3, now=12.5)  # the late report gets the same abort, never a plan
    assert all("PLAN" not in x for x in sum(lines(core).values(), []))


def test_a_round_completed_past_its_timeout_freezes_instead_of_deciding():
    core = two_ranks(timeout=2.0)
    report(core, 1, 0, 0, 2, ZERO3, now=10.0)
    report(core, 2, 1, 0, 2, ZERO3, now=12.5)  # the loop lagged: tick never ran, rank 0 may have given up
    out = lines(core)
    assert out[1] == out[2] and out[1][0].startswith("ABORT 0000000000000abc 260 0")
    assert all("PLAN" not in x for x in out[1])


def test_a_refused_connection_cannot_complete_a_round():
    core = two_ranks()
    report(core, 1, 0, 0, 2, ZERO3)
    send(core, 1, "BOGUS", 0.1)  # rank 0's process is refused: it will treat the coordinator as gone
    report(core, 1, 0, 0, 2, ZERO3, now=0.2)  # a line already buffered behind it is not read
    report(core, 2, 1, 0, 2, ZERO3, now=0.3)
    out = lines(core)
    assert all("PLAN" not in x for x in sum(out.values(), []))
    assert any(x.startswith("FREEZE") for x in out[2])


def test_ranks_that_disagree_on_the_arms_or_the_table_freeze_the_communicator():
    core = two_ranks("halving")
    report(core, 1, 0, 0, 2, ZERO3)
    report(core, 2, 1, 0, 2, ZERO3, fp="00000000000000bb")
    out = lines(core)
    assert out[1][0].startswith("ABORT 0000000000000abc 260 0") and out[1][1].startswith("FREEZE")
    assert out[1] == out[2]
    core = Coordinator("halving", SECRET)
    hello(core, 1, 0, table="1111")
    hello(core, 2, 1, table="2222")
    out = lines(core)
    assert any(x.startswith("FREEZE 0000000000000abc the_ranks'_static_tables_differ") for x in out[1])


@pytest.mark.parametrize("odd_one", [0, 1, 2])
def test_every_rank_hears_of_a_freeze_whenever_it_joins_or_reports(odd_one):
    """The rank with another table says HELLO first, in the middle or last: every rank is told, and every
    report gets an abort (a rank told nothing waits at its verdict call while its connection is open)."""
    core = Coordinator("halving", SECRET)
    for r in range(3):
        hello(core, r + 1, r, nranks=3, table="2222" if r == odd_one else "1111")
    out = lines(core)
    assert all(any(x.startswith("FREEZE 0000000000000abc") for x in out[r + 1]) for r in range(3)), out
    for r in range(3):
        report(core, r + 1, r, 0, 2, ZERO3)
    out = lines(core)
    assert all(out[r + 1] and out[r + 1][0].startswith("ABORT 0000000000000abc 260 0") for r in range(3)), out


def test_a_closed_connection_freezes_and_a_goodbye_does_not():
    core = two_ranks("halving")
    send(core, 1, "BYE abc 0", 1.0)  # nothing open: leaving is no fault
    assert lines(core) == {}
    core2 = two_ranks("halving")
    report(core2, 2, 1, 0, 2, ZERO3)
    core2.closed(1, 1.0)  # rank 0 dies while round 0 waits for it
    out = lines(core2)
    assert out[2][0].startswith("ABORT 0000000000000abc 260 0") and out[2][1].startswith("FREEZE")


def test_another_protocol_version_or_garbage_is_refused():
    core = Coordinator("halving", SECRET)
    core.opened(1)
    core.line(1, f"VERSION 1 {NONCE}", 0.0)
    assert lines(core)[1][0].startswith("REJECT version_1")
    assert 1 in core.closing
    handshake(core, 3)
    send(core, 3, "REPORT zz")
    assert lines(core)[3][-1].startswith("REJECT malformed")


@pytest.mark.parametrize("hello_line", ["HELLO 2 abc 0 99999999999 1 100 0 -",  # unbounded ranks: no MemoryError
                                        "HELLO 2 abc 5 2 1 100 0 -", "HELLO 2 abc 0 2 3 100 0 -",
                                        "HELLO 2 " + "f" * 40 + " 0 2 1 100 0 -",
                                        "HELLO 2 abc 0 2 1 100 0 evil.host:1"])
def test_a_hello_out_of_bounds_is_refused(hello_line):
    core = Coordinator("halving", SECRET)
    handshake(core, 1)
    send(core, 1, hello_line)
    assert lines(core)[1][-1].startswith("REJECT malformed") and core.comms == {}


def test_a_bad_policy_timeout_or_secret_is_one_config_error():
    from ncclrl.costmodel.errors import ConfigError

    with pytest.raises(ConfigError, match="policy"):
        Coordinator("nope", SECRET)
    with pytest.raises(ConfigError, match="round_timeout_s"):
        Coordinator("halving", SECRET, round_timeout_s=0)
    with pytest.raises(ConfigError, match="secret"):
        Coordinator("halving", "short")


# -- the server: bounds on what an outsider can hold --------------------------------------------

def test_the_server_refuses_outsiders_and_bounds_their_lines_and_handshakes():
    import asyncio
    import contextlib
    import socket
    import time

    from ncclrl.runners.coordinator import ServerOptions, bind, serve

    async def scenario() -> list[bytes]:
        core = Coordinator("halving", SECRET)
        socks = bind("127.0.0.1", 0)
        port = socks[0].getsockname()[1]
        stop = asyncio.Event()
        task = asyncio.create_task(serve(core, socks, stop=stop,
                                         options=ServerOptions(handshake_s=0.3, max_unauthed=4, line_bytes=256)))
        await asyncio.sleep(0.05)
        seen = []

        async def talk(payload: bytes, wait: float = 0.6) -> bytes:
            r, w = await asyncio.open_connection("127.0.0.1", port)
            w.write(payload)
            with contextlib.suppress(ConnectionError):
                await w.drain()
            try:
                return await asyncio.wait_for(r.read(4096), wait)
            except TimeoutError:
                return b"<still open>"
            except ConnectionError:
                return b""  # reset by the server: closed
            finally:
                w.close()

        seen.append(await talk(b"HELLO 2 abc 0 2 1 100 0 -\n"))  # no handshake: refused
        seen.append(await talk(b"x" * 1000))  # a line past the bound: cut off
        seen.append(await talk(b""))  # silent: cut off after the handshake time
        idle = [socket.create_connection(("127.0.0.1", port)) for _ in range(8)]  # more than max_unauthed
        await asyncio.sleep(0.1)
        seen.append(await talk(f"VERSION 2 {NONCE}\n".encode(), wait=0.2))
        for s in idle:
            s.close()
        t0 = time.monotonic()
        while core.conns and time.monotonic() - t0 < 2:
            await asyncio.sleep(0.05)
        seen.append(str(len(core.conns)).encode())
        stop.set()
        await task
        return seen

    refused, long_line, silent, crowded, left = asyncio.run(scenario())
    assert refused.startswith(b"REJECT not_authenticated")
    assert long_line == b"" and silent == b""  # closed by the server, not left open
    assert crowded.startswith(b"WELCOME 2 ")  # the waiting room was full: its oldest went, the newcomer is served
    assert left == b"0"  # nothing held once they left


def test_the_coordinator_command_says_a_port_in_use_in_one_line(tmp_path):
    """An operational failure (a port in use, a host that does not resolve, a file that cannot be
    written) is one line and exit status 1; bad input (a folder named as a file, an unknown policy)
    exit status 2; either way nothing is left behind, not even the fresh secret's private folder."""
    import socket
    import sys

    hog = socket.socket()
    hog.bind(("127.0.0.1", 0))
    hog.listen(1)
    port = hog.getsockname()[1]
    p = subprocess.run([sys.executable, "-m", "ncclrl", "coordinator", "host=127.0.0.1", f"port={port}",
                        f"secret_file={tmp_path / 's'}", f"log={tmp_path / 'l.jsonl'}"],
                       capture_output=True, text=True, timeout=60)
    hog.close()
    assert p.returncode == 1 and p.stderr.strip().count("\n") == 0, p.stderr
    assert f"port: {port} is in use" in p.stderr and "Traceback" not in p.stderr
    assert not (tmp_path / "l.jsonl").exists() and not (tmp_path / "s").exists()  # nothing written
    (tmp_path / "plain").write_text("")
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    for args, key, code in ((["host=no-such-host.invalid"], "host", 1), ([f"log={tmp_path}"], "log", 2),
                            ([f"port_file={tmp_path / 'plain' / 'port'}"], "port_file", 1),
                            ([f"log={tmp_path / 'plain' / 'log'}"], "log", 1),
                            (["log=/proc/ncclrl-test/log.jsonl"], "log", 1),
                            (["port_file=/proc/ncclrl-test-port"], "port_file", 1),
                            (["policy=bogus"], "policy", 2), (["host="], "host", 2)):
        p = subprocess.run([sys.executable, "-m", "ncclrl", "coordinator", "port=0", *args],
                           capture_output=True, text=True, timeout=60, env=dict(os.environ, TMPDIR=str(tmp)))
        assert p.returncode == code and p.stderr.startswith(f"ncclrl: error: {key}:"), (args, p.stderr)
        assert p.stderr.strip().count("\n") == 0 and "Traceback" not in p.stderr
        assert not list(tmp.iterdir()), args  # the fresh secret's folder went with the failure


def test_the_coordinator_takes_policy_shipped_and_removes_its_fresh_secret_when_it_ends(tmp_path):
    import signal
    import sys
    import time

    tmp = tmp_path / "tmp"
    tmp.mkdir()
    proc = subprocess.Popen([sys.executable, "-m", "ncclrl", "coordinator", "port=0", "policy=shipped",
                             f"port_file={tmp_path / 'port'}"], stderr=subprocess.PIPE, text=True,
                            env=dict(os.environ, TMPDIR=str(tmp)))
    t0 = time.monotonic()
    while not (tmp_path / "port").exists() and proc.poll() is None and time.monotonic() - t0 < 60:
        time.sleep(0.05)
    assert proc.poll() is None, proc.stderr.read()
    assert int((tmp_path / "port").read_text()) > 0 and len(list(tmp.iterdir())) == 1  # the secret's folder
    proc.send_signal(signal.SIGTERM)
    err = proc.communicate(timeout=30)[1]
    assert proc.returncode == 0 and "policy halving" in err, err
    assert not list(tmp.iterdir())


def test_a_secret_file_others_may_read_is_refused(tmp_path):
    from ncclrl.costmodel.errors import ConfigError
    from ncclrl.runners.coordinator.secret import load_or_create

    text, path = load_or_create(str(tmp_path / "new"))
    assert len(text) == 64 and (path.stat().st_mode & 0o777) == 0o600
    _, deep = load_or_create(str(tmp_path / "not" / "yet" / "there"))  # its folders made, only the owner's
    assert (deep.parent.stat().st_mode & 0o777) == 0o700 and (deep.stat().st_mode & 0o777) == 0o600
    assert load_or_create(str(path))[0] == text
    path.chmod(0o644)
    with pytest.raises(ConfigError, match="secret_file"):
        load_or_create(str(path))


# -- the fault harness ---------------------------------------------------------------------------

@pytest.fixture(scope="module")
def build(tmp_path_factory) -> Path:
    b = tmp_path_factory.mktemp("online-build")
    p = subprocess.run(["make", "--no-print-directory", "-C", str(PLUGIN), f"BUILD={b}", "online", "online-asan"],
                       capture_output=True, text=True, env=dict(os.environ), timeout=600)
    assert p.returncode == 0, p.stdout + p.stderr
    return b


@pytest.fixture(scope="module")
def shared(tmp_path_factory):
    c = SharedCoordinator(tmp_path_factory.mktemp("coordinator"))
    yield c
    c.close()


def decisions(work: Path, rank: int) -> set[tuple[str, str, str]]:
    return {tuple(x.split()[3:6]) for x in (work / f"rank{rank}.txt").read_text().splitlines()}


FREEZES = {"rank-killed", "rank-stalled", "rank-paused", "no-profiler", "arms-differ", "tables-differ", "wrong-secret"}
EXPLORES = {"none", "clock-skew", "garbage"}
UNTOUCHED = {"version-mismatch", "no-coordinator", "impostor"}  # no coordinator they believe: never a verdict


@pytest.mark.parametrize("fault", FAULTS)
def test_every_fault_ends_without_hang_divergence_or_crash(build, shared, tmp_path, fault):
    out = run_job(build, tmp_path, fault, ranks=4, job="ddp", steps=40, pace_us=1000, shared=shared)
    assert not out.hung, out
    assert not out.divergent, out
    assert not out.crashed, (out, [(tmp_path / f"rank{r}.err").read_text()[-1500:] for r in range(4)])
    if fault in EXPLORES:  # the arms really ran (not a job that never left the table) and a winner was agreed
        assert len(decisions(tmp_path, 0)) >= 2 and out.commits >= 1, out
    if fault in FREEZES:
        assert out.freezes >= 1 and out.commits == 0, out
    if fault == "coordinator-paused":  # it resumes: the rounds go on to a commit, or, when its pause outlived a
        # round's timeout, that round is aborted and every rank freezes; nothing in between
        assert out.commits >= 1 or (out.freezes >= 1 and out.ranks_frozen == 4), out
    if fault in UNTOUCHED:  # frozen before the first plan: one decision per call, NCCL's own
        assert len(decisions(tmp_path, 0)) == 1 and out.verdicts == 0, out


def arm_means(work: Path) -> tuple[list[float], list[float]]:
    """The arms' mean times the coordinator's verdicts state (``evidence``: ``a0=123.4us/n7,...``) in a
    job's ``coordinator.jsonl``: arm 0's, and every other arm's."""
    import json

    zero, others = [], []
    for line in (work / "coordinator.jsonl").read_text().splitlines():
        for arm in json.loads(line).get("evidence", "").split(","):
            name, _, rest = arm.partition("=")
            if "us/n" in rest and not rest.startswith("nan"):
                (zero if name == "a0" else others).append(float(rest.split("us/n")[0]))
    return zero, others


def test_kernel_phases_keep_the_wait_for_late_ranks_out_of_the_samples(build, tmp_path):
    """Every call of an explored configuration waits 20 ms for late ranks inside its channels (the
    simulated transfers take 0.1-10 ms). Timed by whole channels (profiler v5, NCCL 2.28-2.31) every
    alternative's mean carries the wait; with NCCL 2.32's kernel phases (profiler v7) a sample is the
    compute phase alone, so no alternative's mean does."""
    kw = {"ranks": 4, "job": "ddp", "steps": 40, "pace_us": 1000, "late_us": 20000.0}
    whole = run_job(build, tmp_path / "v5", "none", **kw)
    phased = run_job(build, tmp_path / "v7", "none", phases=True, **kw)
    for out in (whole, phased):
        assert not (out.hung or out.divergent or out.crashed), out
        assert out.verdicts >= 1, out
    v5, v7 = arm_means(tmp_path / "v5")[1], arm_means(tmp_path / "v7")[1]
    assert v5 and min(v5) >= 20000.0, v5
    assert v7 and max(v7) < 20000.0, v7


def test_the_calls_nccl_2_31_makes_for_its_symmetric_kernels_take_no_slot_and_no_sample(build, tmp_path):
    """Before each collective NCCL 2.31 (one NVLink node) calls the tuner twice more: every entry -1, then
    ahead of the call (numPipeOps 0). Every explored configuration waits 20 ms inside its channels, so a
    sample credited to the right arm is < 20 ms for arm 0 and >= 20 ms for the others. As 2.31 (the plugin
    asks NCCL's version) neither extra call is counted: every sample lands on its arm. Taken for an
    ordinary call (the same calls as NCCL 2.28 would make them), the early call takes a slot and its note
    the collective's event: the samples are lost or land on the wrong arms."""
    kw = {"ranks": 4, "job": "ddp", "steps": 40, "pace_us": 1000, "late_us": 20000.0, "sym_calls": True}
    v231 = run_job(build, tmp_path / "v231", "none", nccl_code=23100, **kw)
    v228 = run_job(build, tmp_path / "v228", "none", nccl_code=22809, **kw)
    for out in (v231, v228):
        assert not (out.hung or out.divergent or out.crashed), out
    zero, others = arm_means(tmp_path / "v231")
    assert zero and others and max(zero) < 20000.0 <= min(others), (zero, others)
    zero, others = arm_means(tmp_path / "v228")  # lost (the event matched no note) or on the wrong arm
    assert not (zero and others and max(zero) < 20000.0 <= min(others)), (zero, others)


def test_a_relay_that_changes_verdicts_in_transit_changes_no_decision(build, tmp_path):
    """A man in the middle without the secret (the handshake relayed untouched, later lines changed)
    is caught by the lines' seals: the ranks freeze alike, none runs a plan it was not sent."""
    import sys

    fake = Path(__file__).resolve().parent / "fakes" / "relay_coordinator.py"
    out = run_job(build, tmp_path, "none", ranks=4, job="ddp", steps=40, pace_us=1000,
                  coordinator_argv=[sys.executable, str(fake)])
    assert not (out.hung or out.divergent or out.crashed), out
    assert out.commits == 0 and len(decisions(tmp_path, 0)) == 1, out


@pytest.mark.parametrize("go_to", ["one", "none"])
def test_a_coordinator_dying_inside_its_go_leaves_every_rank_on_one_side(build, tmp_path, monkeypatch, go_to):
    """The coordinator dies with one round's GO written to one rank's socket only (or to none, every
    rank having confirmed the verdict): the ranks ask each other, and all apply it (or none does)."""
    import sys

    monkeypatch.setenv("GO_TO", go_to)
    fake = Path(__file__).resolve().parent / "fakes" / "half_go_coordinator.py"
    out = run_job(build, tmp_path, "none", ranks=4, job="ddp", steps=40, pace_us=1000,
                  coordinator_argv=[sys.executable, str(fake)])
    assert not (out.hung or out.divergent or out.crashed), out
    errs = [(tmp_path / f"rank{r}.err").read_text() for r in range(4)]
    if go_to == "one":  # every rank ran round 1's plan: the three without the GO learned it from rank 0
        assert all("at call 15 (round 1)" in e for e in errs), errs
        assert len(decisions(tmp_path, 0)) >= 2
    else:
        assert all("no rank holds a GO for the round (asked them all)" in e for e in errs), errs


@pytest.mark.parametrize("fault", FAULTS)
def test_every_fault_under_address_and_undefined_behaviour_sanitizers(build, shared, tmp_path, fault):
    out = run_job(build, tmp_path, fault, ranks=3, job="fsdp", steps=30, pace_us=1000, sanitized=True, shared=shared)
    assert not (out.hung or out.divergent or out.crashed), (out, [(tmp_path / f"rank{r}.err").read_text()[-3000:]
                                                                 for r in range(3)])


# -- the e2e side and the model's candidates -----------------------------------------------------

def test_the_online_side_hands_every_rank_the_profiler_the_mode_and_the_candidates(tmp_path):
    from ncclrl.runners.e2e import E2E, E2EConfig

    table = tmp_path / "t.csv"
    table.write_text("allreduce,0,4294967295,ring,simple,2,-1,-1\n")
    lib = tmp_path / "lib.so"
    lib.write_text("")
    e = E2E(E2EConfig(table=str(table), topology="h200-2x1-sock", device="cpu", online=True, plugin=str(lib)))
    e.coordinator = "127.0.0.1:1234"
    env = e.side_env("online")
    assert env["NCCL_TUNER_PLUGIN"] == env["NCCL_PROFILER_PLUGIN"] == str(lib)
    assert env["NCCLRL_TUNER_MODE"] == "online" and env["NCCLRL_ONLINE_COORD"] == "127.0.0.1:1234"
    assert env["NCCLRL_TUNER_TABLE_DATA"] == table.read_text()
    assert "allreduce," in env["NCCLRL_ONLINE_CANDIDATES_DATA"]
    assert "NCCL_PROFILER_PLUGIN" not in e.side_env("table") and e.side_env("default")["NCCL_TUNER_PLUGIN"] == "none"


def test_online_candidates_are_table_rows_other_than_nccls_choice():
    import numpy as np

    from ncclrl.agents.export import online_candidates
    from ncclrl.costmodel import nccl as N
    from ncclrl.costmodel.replica import default_decisions
    from ncclrl.costmodel.simulator import Simulator
    from ncclrl.costmodel.table import parse_example_rows
    from ncclrl.costmodel.topology import load_topology

    topo = load_topology("h200-2x2-sock")
    rows = online_candidates(Simulator(topo), k=2, min_bytes=1 << 20, max_bytes=1 << 24, collectives=["allreduce"])
    parsed = parse_example_rows("\n".join(rows))
    assert len(parsed) == 2 * 5
    for r in parsed:
        assert r["max_bytes"] == 2 * r["min_bytes"] - 1 and (r["nNodes"], r["nRanks"]) == (2, 4)
        mid = 3 * r["min_bytes"] // 2
        d = default_decisions(topo, N.COLLECTIVES.index("allreduce"), np.array([mid]))
        assert not (r["algo"] == N.ALGOS[int(d.algo[0])] and r["proto"] == N.PROTOS[int(d.proto[0])]
                    and r["channels"] in (0, -1))
