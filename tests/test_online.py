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
from ncclrl.runners.coordinator import Coordinator

PLUGIN = Path(__file__).resolve().parents[1] / "plugin"
FP = "00000000000000aa"


# -- the coordinator's state machine -------------------------------------------------------------

def hello(core: Coordinator, conn: int, rank: int, nranks: int = 2, cid: str = "abc") -> None:
    core.opened(conn)
    core.line(conn, "VERSION 1", 0.0)
    core.line(conn, f"HELLO 1 {cid} {rank} {nranks} 1 100", 0.0)


def report(core: Coordinator, conn: int, rank: int, rnd: int, k: int, arms: list[tuple[int, float, float]],
           now: float = 0.0, fp: str = FP, cid: str = "abc") -> None:
    ev = " ".join(f"{n}:{n * m:.3f}:{n * (m * m + s * s):.3f}" for n, m, s in arms)
    core.line(conn, f"REPORT {cid} {rank} 260 {rnd} {k} {fp} {len(arms)} {ev}", now)


def lines(core: Coordinator) -> dict[int, list[str]]:
    return {c: [x.strip() for x in v] for c, v in core.take().items()}


ZERO3 = [(0, 0.0, 0.0)] * 3


def test_a_verdict_needs_every_rank_and_reaches_every_rank():
    core = Coordinator("round-robin", round_timeout_s=5.0)
    hello(core, 1, 0)
    hello(core, 2, 1)
    assert lines(core) == {1: ["WELCOME 1 5000"], 2: ["WELCOME 1 5000"]}
    report(core, 1, 0, 0, 2, ZERO3)
    assert lines(core) == {}  # rank 1 has not reported
    report(core, 2, 1, 0, 2, ZERO3)
    out = lines(core)
    assert out[1] == out[2] and out[1][0].startswith("VERDICT 0000000000000abc 260 0 2 PLAN ")
    plan = [int(a) for a in out[1][0].split()[6].split(",")]
    assert sorted(set(plan)) == [0, 1, 2]


def test_the_coordinator_never_commits_an_arm_slower_than_the_table():
    core = Coordinator("round-robin", round_timeout_s=5.0)
    hello(core, 1, 0)
    hello(core, 2, 1)
    for r, conn in ((0, 1), (1, 2)):
        report(core, conn, r, 0, 2, ZERO3)
    lines(core)
    verdicts = []
    for rnd, k in ((1, 26), (2, 50), (3, 74)):
        for r, conn in ((0, 1), (1, 2)):
            # arm 1 slower than arm 0, arm 2 much slower: nothing beats the table
            report(core, conn, r, rnd, k, [(8 * rnd, 100.0, 2.0), (8 * rnd, 130.0, 2.0), (8 * rnd, 200.0, 2.0)])
        out = lines(core)
        assert out[1] == out[2]
        verdicts.append(out[1][0])
        if " COMMIT " in out[1][0]:
            break
    assert " COMMIT 0 " in verdicts[-1]


def test_a_rank_that_stops_reporting_aborts_the_round_and_freezes_the_communicator():
    core = Coordinator("round-robin", round_timeout_s=2.0)
    hello(core, 1, 0)
    hello(core, 2, 1)
    lines(core)
    report(core, 1, 0, 0, 2, ZERO3, now=10.0)
    core.tick(11.9)
    assert lines(core) == {}
    core.tick(12.0)
    out = lines(core)
    assert out[1] == out[2]
    assert out[1][0].startswith("VERDICT 0000000000000abc 260 0 2 ABORT")
    assert out[1][1].startswith("FREEZE 0000000000000abc")
    report(core, 2, 1, 0, 2, ZERO3, now=12.5)  # the late report gets the same abort, never a plan
    assert all("PLAN" not in x for x in sum(lines(core).values(), []))


def test_a_round_completed_past_its_timeout_freezes_instead_of_deciding():
    core = Coordinator("round-robin", round_timeout_s=2.0)
    hello(core, 1, 0)
    hello(core, 2, 1)
    lines(core)
    report(core, 1, 0, 0, 2, ZERO3, now=10.0)
    report(core, 2, 1, 0, 2, ZERO3, now=12.5)  # the loop lagged: tick never ran, rank 0 may have given up
    out = lines(core)
    assert out[1] == out[2] and out[1][0].startswith("VERDICT 0000000000000abc 260 0 2 ABORT")
    assert all("PLAN" not in x for x in out[1])


def test_a_refused_connection_cannot_complete_a_round():
    core = Coordinator("round-robin", round_timeout_s=5.0)
    hello(core, 1, 0)
    hello(core, 2, 1)
    lines(core)
    report(core, 1, 0, 0, 2, ZERO3)
    core.line(1, "BOGUS", 0.1)  # rank 0's process is refused: it will treat the coordinator as gone
    report(core, 1, 0, 0, 2, ZERO3, now=0.2)  # a line already buffered behind it is not read
    report(core, 2, 1, 0, 2, ZERO3, now=0.3)
    out = lines(core)
    assert all("PLAN" not in x for x in sum(out.values(), []))
    assert any(x.startswith("FREEZE") for x in out[2])


def test_ranks_that_disagree_on_the_arms_freeze_the_communicator():
    core = Coordinator("halving")
    hello(core, 1, 0)
    hello(core, 2, 1)
    lines(core)
    report(core, 1, 0, 0, 2, ZERO3)
    report(core, 2, 1, 0, 2, ZERO3, fp="00000000000000bb")
    out = lines(core)
    assert out[1][0].startswith("VERDICT 0000000000000abc 260 0 2 ABORT") and out[1][1].startswith("FREEZE")
    assert out[1] == out[2]


def test_a_closed_connection_freezes_and_a_goodbye_does_not():
    core = Coordinator("halving")
    hello(core, 1, 0)
    hello(core, 2, 1)
    lines(core)
    core.line(1, "BYE abc 0", 1.0)  # nothing open: leaving is no fault
    assert lines(core) == {}
    core2 = Coordinator("halving")
    hello(core2, 1, 0)
    hello(core2, 2, 1)
    lines(core2)
    report(core2, 2, 1, 0, 2, ZERO3)
    core2.closed(1, 1.0)  # rank 0 dies while round 0 waits for it
    out = lines(core2)
    assert out[2][0].startswith("VERDICT 0000000000000abc 260 0 2 ABORT") and out[2][1].startswith("FREEZE")


def test_another_protocol_version_or_garbage_is_refused():
    core = Coordinator("halving")
    core.opened(1)
    core.line(1, "VERSION 2", 0.0)
    assert lines(core)[1][0].startswith("REJECT version 2")
    assert 1 in core.closing
    core.opened(3)
    core.line(3, "VERSION 1", 0.0)
    core.line(3, "REPORT zz", 0.0)
    assert lines(core)[3][-1].startswith("REJECT malformed")


def test_a_bad_policy_or_timeout_is_one_config_error():
    from ncclrl.costmodel.errors import ConfigError

    with pytest.raises(ConfigError, match="policy"):
        Coordinator("nope")
    with pytest.raises(ConfigError, match="round_timeout_s"):
        Coordinator("halving", round_timeout_s=0)


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


FREEZES = {"rank-killed", "rank-stalled", "rank-paused", "no-profiler", "arms-differ"}
EXPLORES = {"none", "clock-skew", "garbage"}


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
    if fault in ("version-mismatch", "no-coordinator"):  # frozen before the first plan: the table only
        assert len(decisions(tmp_path, 0)) == 1 and out.verdicts == 0, out


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
