"""The tuner plugin's request log (``NCCLRL_TUNER_REQUEST_LOG``): the plugin built with its Makefile,
driven by tests/drive.c (several communicators in one process, any tuner ABI version) with a known
DDP-like sequence; one file per context with exactly the requests sent, the cap and its counts,
failures that cost one WARN and change no decision; then ``ncclrl profile`` on those files gives the
calls and bytes per step that were sent."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import time
from collections import Counter
from pathlib import Path

import pytest

from ncclrl.costmodel.errors import ConfigError
from ncclrl.costmodel.profile import build_profile, detect_format, load_profile, read_request_log
from ncclrl.runners.cli import main

PLUGIN = Path(__file__).resolve().parents[1] / "plugin"
COLLS = ["broadcast", "reduce", "allgather", "reducescatter", "allreduce"]
BROADCAST, ALLGATHER, REDUCESCATTER, ALLREDUCE = 0, 2, 3, 4
OWN_VARS = ("NCCLRL_TUNER_REQUEST_LOG", "NCCLRL_TUNER_REQUEST_LOG_MAX", "NCCLRL_TUNER_TABLE_DATA",
            "NCCLRL_TUNER_TABLE", "NCCL_TUNER_CONFIG_FILE", "NCCLRL_TUNER_TABLE_FINGERPRINT", "NCCLRL_TUNER_ON_ERROR")
# decisions that differ by size and shape, so that "unchanged" means something
TABLE = """\
allreduce,0,8388607,ring,ll128,8,2,8
allreduce,8388608,max,ring,simple,16,2,8
broadcast,0,max,ring,simple,2,2,8
allgather,0,max,ring,simple,4,1,4
reducescatter,0,max,tree,simple,3,1,4
"""

# A data-parallel communicator across 2 nodes (8 ranks) and a tensor-parallel one inside a node
# (4 ranks): the parameter broadcast, DDP's first step (one bucket before it rebuilds them), then
# STEPS steps of two 25 MiB buckets and a 5 MiB one, and two all-gathers and a reduce-scatter.
STEPS = 5
DP = [(BROADCAST, 4096), (ALLREDUCE, 31457280)]
DP_STEP = [(ALLREDUCE, 26214400), (ALLREDUCE, 26214400), (ALLREDUCE, 5242880)]
TP_STEP = [(ALLGATHER, 1048576), (ALLGATHER, 1048576), (REDUCESCATTER, 1048576)]


@pytest.fixture(scope="module")
def build(tmp_path_factory) -> Path:
    b = tmp_path_factory.mktemp("plugin-build")
    p = subprocess.run(["make", "--no-print-directory", "-C", str(PLUGIN), f"BUILD={b}", "all", "drive"],
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout + p.stderr
    return b


def ddp_script(steps: int = STEPS, tp_version: int = 4, tp_comm: int = 0x5678) -> tuple[list[str], dict]:
    """The commands, and each context's requests in order."""
    sent: dict[int, list[tuple[int, int]]] = {0: list(DP), 1: []}
    lines = ["init 0 5 8 2 4660", f"init 1 {tp_version} 4 1 {tp_comm}"]
    lines += [f"call 0 {c} {n}" for c, n in DP]
    for _ in range(steps):
        for (dc, dn), (tc, tn) in zip(DP_STEP, TP_STEP, strict=True):  # the two communicators interleave
            lines += [f"call 0 {dc} {dn}", f"call 1 {tc} {tn}"]
            sent[0].append((dc, dn))
            sent[1].append((tc, tn))
    lines += ["fini 0", "fini 1"]
    return lines, sent


def drive(build: Path, lines: list[str], cwd: Path | None = None, **env: str,
          ) -> tuple[int, list[tuple[int, str]], list[tuple[int, ...]]]:
    """Run the driver with only ``env`` of the plugin's variables (the table always); returns its pid, the
    log lines (level, message) and the decisions (context, collType, nBytes, algo, proto, channels)."""
    base = {k: v for k, v in os.environ.items() if k not in OWN_VARS}
    p = subprocess.run([str(build / "drive"), str(build / "libnccl-tuner-ncclrl.so")], input="\n".join(lines) + "\n",
                       capture_output=True, text=True, env={**base, "NCCLRL_TUNER_TABLE_DATA": TABLE, **env},
                       cwd=cwd, timeout=120)
    assert p.returncode == 0, p.stderr
    out = p.stdout.splitlines()
    assert out[0].startswith("pid ")
    logs = [(int(x[4:].split(" ", 1)[0]), x[4:].split(" ", 1)[1]) for x in out if x.startswith("log ")]
    decisions = [tuple(map(int, x.split())) for x in out[1:] if not x.startswith("log ")]
    return int(out[0].split()[1]), logs, decisions


def host() -> str:
    return re.sub(r"[^A-Za-z0-9._-]", "_", socket.gethostname()) or "unknown"


def expected_file(pid: int, context: int, comm_id: str, abi: int, nnodes: int, nranks: int,
                  requests: list[tuple[int, int]], max_records: int = 100000) -> str:
    kept, past = requests[:max_records], Counter(requests[max_records:])
    head = ["ncclrl-tuner-request-log: 1", f"host: {host()}", f"pid: {pid}", f"context: {context}",
            f"comm_id: {comm_id}", f"tuner_abi: {abi}", f"nnodes: {nnodes}", f"nranks: {nranks}",
            f"requests: {len(requests)}", f"recorded: {len(kept)}", f"max_records: {max_records}",
            f"dropped: {len(requests) - len(kept)}", "dropped_unkeyed: 0"]
    head += [f"dropped_count: {COLLS[c]},{n},{k}" for (c, n), k in sorted(past.items())]
    rows = [f"{COLLS[c]},{n},{nnodes},{nranks}" for c, n in kept]
    return "".join(f"# {h}\n" for h in head) + "collective,nbytes,nnodes,nranks\n" + "".join(r + "\n" for r in rows)


def files(prefix: Path) -> list[Path]:
    return sorted(prefix.parent.glob(prefix.name + ".*"))


# -- the plugin's side ---------------------------------------------------------------------------


def test_one_exact_file_per_context_and_no_decision_changes(build, tmp_path):
    lines, sent = ddp_script()
    _, plain_logs, plain = drive(build, lines)
    prefix = tmp_path / "job" / "req"
    prefix.parent.mkdir()
    pid, logs, decisions = drive(build, lines, NCCLRL_TUNER_REQUEST_LOG=str(prefix))
    assert decisions == plain and any(d[3] >= 0 for d in plain)  # the table applies, and the log changes nothing
    assert not [m for level, m in logs + plain_logs if level == 2]
    got = files(prefix)
    assert [p.name for p in got] == [f"req.{host()}.{pid}.0.csv", f"req.{host()}.{pid}.1.csv"]  # no temporary left
    assert got[0].read_text() == expected_file(pid, 0, "0x0000000000001234", 5, 2, 8, sent[0])
    assert got[1].read_text() == expected_file(pid, 1, "unknown", 4, 1, 4, sent[1])  # v4: no communicator id
    infos = [m for level, m in logs if level == 3 and "request log" in m]
    assert infos == [f"TUNER/ncclrl: request log: this communicator's requests (up to 100000 in order) go to {got[0]} "
                     "at its destroy",
                     f"TUNER/ncclrl: request log: this communicator's requests (up to 100000 in order) go to {got[1]} "
                     "at its destroy",
                     f"TUNER/ncclrl: request log: wrote {got[0]} ({len(sent[0])} requests, {len(sent[0])} in order, "
                     "0 past the cap)",
                     f"TUNER/ncclrl: request log: wrote {got[1]} ({len(sent[1])} requests, {len(sent[1])} in order, "
                     "0 past the cap)"]
    # a second process with the same prefix writes its own files beside these
    pid2, _, _ = drive(build, lines, NCCLRL_TUNER_REQUEST_LOG=str(prefix))
    assert pid2 != pid and len(files(prefix)) == 4
    assert got[0].read_text() == expected_file(pid, 0, "0x0000000000001234", 5, 2, 8, sent[0])


@pytest.mark.parametrize("version", [2, 3, 4, 5, 6])
def test_every_abi_version_records(build, tmp_path, version):
    prefix = tmp_path / "req"
    lines = [f"init 0 {version} 4 1 7", "call 0 4 100", "call 0 2 5000", "call 0 7 12", "fini 0"]
    pid, logs, _ = drive(build, lines, NCCLRL_TUNER_REQUEST_LOG=str(prefix))
    (f,) = files(prefix)
    comm = "0x0000000000000007" if version >= 5 else "unknown"
    text = expected_file(pid, 0, comm, version, 1, 4, [(4, 100), (2, 5000)]) + "colltype7,12,1,4\n"
    assert f.read_text() == text.replace("requests: 2", "requests: 3").replace("recorded: 2", "recorded: 3")


def test_a_relative_prefix_is_the_working_folder_at_init(build, tmp_path):
    (tmp_path / "logs").mkdir()
    pid, logs, _ = drive(build, ["init 0 5 4 1 3", "call 0 3 64", "fini 0"], cwd=tmp_path,
                         NCCLRL_TUNER_REQUEST_LOG="logs/req")
    (f,) = files(tmp_path / "logs" / "req")
    assert f.read_text() == expected_file(pid, 0, "0x0000000000000003", 5, 1, 4, [(3, 64)])
    assert any(m.endswith(f"go to {f} at its destroy") for _, m in logs)  # the absolute path


@pytest.mark.parametrize("cap", [0, 1, 4, 16])
def test_the_cap_keeps_the_first_requests_in_order_and_counts_the_rest(build, tmp_path, cap):
    lines, sent = ddp_script()
    _, _, plain = drive(build, lines)
    prefix = tmp_path / "req"
    pid, logs, decisions = drive(build, lines, NCCLRL_TUNER_REQUEST_LOG=str(prefix),
                                 NCCLRL_TUNER_REQUEST_LOG_MAX=str(cap))
    assert decisions == plain and not [m for level, m in logs if level == 2]
    a, b = files(prefix)
    assert a.read_text() == expected_file(pid, 0, "0x0000000000001234", 5, 2, 8, sent[0], max_records=cap)
    assert b.read_text() == expected_file(pid, 1, "unknown", 4, 1, 4, sent[1], max_records=cap)
    dropped = max(len(sent[0]) - cap, 0)
    assert f"({len(sent[0])} requests, {len(sent[0]) - dropped} in order, {dropped} past the cap)" in \
        " ".join(m for _, m in logs)


def test_a_malformed_cap_is_one_warn_and_the_default(build, tmp_path):
    prefix = tmp_path / "req"
    pid, logs, _ = drive(build, ["init 0 5 4 1 1", "call 0 4 8", "fini 0"], NCCLRL_TUNER_REQUEST_LOG=str(prefix),
                         NCCLRL_TUNER_REQUEST_LOG_MAX="lots")
    assert [m for level, m in logs if level == 2] == \
        ["TUNER/ncclrl: NCCLRL_TUNER_REQUEST_LOG_MAX='lots' is not a whole number from 0 to 67108864; using 100000"]
    assert files(prefix)[0].read_text() == expected_file(pid, 0, "0x0000000000000001", 5, 1, 4, [(4, 8)])


def test_an_unwritable_folder_is_one_warn_per_context_and_nothing_else(build, tmp_path):
    lines, _ = ddp_script()
    _, _, plain = drive(build, lines)
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    for prefix in (tmp_path / "missing" / "req", blocker / "req"):  # no such folder; a file where one should be
        pid, logs, decisions = drive(build, lines, NCCLRL_TUNER_REQUEST_LOG=str(prefix))
        assert decisions == plain
        warns = [m for level, m in logs if level == 2]
        assert len(warns) == 2 and all(f"request log {prefix}.{host()}.{pid}." in w and
                                       f"cannot create files in {prefix.parent}" in w and
                                       "NCCL's decisions are unaffected" in w for w in warns), warns
        assert not [m for level, m in logs if level == 3 and "request log" in m]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file"]


def test_a_failed_write_at_destroy_is_one_warn_and_leaves_no_temporary(build, tmp_path):
    """The folder takes files at init, but the file's name is taken by a folder when the
    communicator is destroyed: the rename fails."""
    prefix = tmp_path / "req"
    base = {k: v for k, v in os.environ.items() if k not in OWN_VARS}
    p = subprocess.Popen([str(build / "drive"), str(build / "libnccl-tuner-ncclrl.so")], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env={**base, "NCCLRL_TUNER_TABLE_DATA": TABLE, "NCCLRL_TUNER_REQUEST_LOG": str(prefix)})
    try:
        p.stdin.write("init 0 5 8 2 1\n")
        p.stdin.flush()
        out = []
        while not any(" go to " in x for x in out):
            out.append(p.stdout.readline())
            assert out[-1], "the driver ended early"
        path = Path(re.search(r" go to (\S+) at its destroy", out[-1]).group(1))
        path.mkdir()
        rest, err = p.communicate("call 0 4 1048576\ncall 0 4 1048576\nfini 0\n", timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 0, err
    rest_lines = rest.splitlines()
    assert rest_lines[:2] == ["0 4 1048576 1 1 8"] * 2  # ring/LL128, 8 channels: the table's decision
    warns = [x for x in rest_lines if x.startswith("log 2 ")]
    assert warns == [f"log 2 TUNER/ncclrl: request log {path}: cannot be written (Is a directory); its 2 requests are "
                     "lost; NCCL's decisions are unaffected"]
    assert sorted(x.name for x in tmp_path.iterdir()) == [path.name] and not any(path.iterdir())


# -- the profile's side --------------------------------------------------------------------------


def ddp_profile_truth() -> dict[tuple, tuple[float, float]]:
    per_step = Counter(DP_STEP)
    truth = {(COLLS[c], n, 2, 8, "unknown"): (k, k * n) for (c, n), k in per_step.items()}
    truth |= {(COLLS[c], n, 1, 4, "unknown"): (k, k * n) for (c, n), k in Counter(TP_STEP).items()}
    return truth


def got_of(prof) -> dict[tuple, tuple[float, float]]:
    return {(e.collective, e.nbytes, e.nodes, e.ranks, e.dtype): (e.calls_per_step, e.nbytes_per_step)
            for e in prof.entries}


def test_profile_of_two_ranks_request_logs_is_the_sequence_sent(build, tmp_path, capsys):
    """Two processes (ranks) of the job, two communicators each: four files; calls and bytes per
    step are what was sent, steps from the repeating pattern, the broadcast and first step left out."""
    lines, _ = ddp_script()
    prefix = tmp_path / "req"
    for _rank in range(2):
        drive(build, lines, NCCLRL_TUNER_REQUEST_LOG=str(prefix))
    inputs = files(prefix)
    assert len(inputs) == 4 and {detect_format(p) for p in inputs} == {"request-log"}
    out = tmp_path / "job-profile.yaml"
    assert main(["profile", *map(str, inputs), "-o", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "allreduce,26214400,2,8,unknown,2,52428800,unknown" in printed
    prof = load_profile(out)
    assert got_of(prof) == ddp_profile_truth()
    assert prof.steps == STEPS and "repeating pattern" in prof.steps_from
    assert sum(e.nbytes_per_step for e in prof.entries) == \
        sum(n for _, n in DP_STEP) + sum(n for _, n in TP_STEP)
    assert {i["format"] for i in prof.inputs} == {"request-log"}
    assert sum("2 calls outside the 5 repeating steps" in n for n in prof.notes) == 2  # broadcast + first step
    assert any("dtype unknown, nbytes exact" in n for n in prof.notes)
    # steps given: every request counts, divided by them
    given = build_profile(inputs, steps=STEPS + 1)
    got = got_of(given)
    assert got[("allreduce", 26214400, 2, 8, "unknown")][0] == pytest.approx(2 * STEPS / (STEPS + 1), abs=1e-6)
    assert got[("broadcast", 4096, 2, 8, "unknown")][0] == pytest.approx(1 / (STEPS + 1), abs=1e-6)


def test_one_process_driving_two_ranks_of_a_communicator_is_not_counted_twice(build, tmp_path):
    """Both contexts are the same communicator (same comm_id): two ranks, each with the whole sequence."""
    prefix = tmp_path / "req"
    lines = ["init 0 5 4 1 99", "init 1 5 4 1 99"]
    for _ in range(STEPS):
        for c, n in TP_STEP:
            lines += [f"call 0 {c} {n}", f"call 1 {c} {n}"]
    drive(build, lines + ["fini 0", "fini 1"], NCCLRL_TUNER_REQUEST_LOG=str(prefix))
    prof = build_profile(files(prefix))
    assert got_of(prof) == {k: v for k, v in ddp_profile_truth().items() if k[2] == 1}
    # two communicators of one rank (different comm_id) do add up
    prefix2 = tmp_path / "two" / "req"
    prefix2.parent.mkdir()
    drive(build, [x.replace("init 1 5 4 1 99", "init 1 5 4 1 98") for x in lines] + ["fini 0", "fini 1"],
          NCCLRL_TUNER_REQUEST_LOG=str(prefix2))
    got = got_of(build_profile(files(prefix2)))
    assert got[("allgather", 1048576, 1, 4, "unknown")] == (4, 4 * 1048576)


def test_past_the_cap_counts_only_when_steps_are_given(build, tmp_path):
    lines, sent = ddp_script(steps=20)
    prefix = tmp_path / "req"
    drive(build, lines, NCCLRL_TUNER_REQUEST_LOG=str(prefix), NCCLRL_TUNER_REQUEST_LOG_MAX="32")
    inputs = files(prefix)
    inferred = build_profile(inputs)
    assert any("past its cap of 32 have no order" in n for n in inferred.notes)
    dp = {k: v for k, v in got_of(inferred).items() if k[2] == 2}
    assert dp == {k: v for k, v in ddp_profile_truth().items() if k[2] == 2}  # from the 32 in order
    given = got_of(build_profile(inputs, steps=20))
    assert given[("allreduce", 26214400, 2, 8, "unknown")][0] == pytest.approx(2.0)
    assert given[("reducescatter", 1048576, 1, 4, "unknown")][0] == pytest.approx(1.0)
    assert given[("allreduce", 31457280, 2, 8, "unknown")][0] == pytest.approx(1 / 20)


def test_the_default_cap_on_a_long_job_and_a_fast_profile(build, tmp_path):
    """250,000 requests: 100,000 in order, the rest counted; the profile of the file takes seconds."""
    steps = 83_333
    lines = ["init 0 5 8 2 1"] + [f"call 0 {c} {n}" for c, n in DP]
    lines += [f"call 0 {c} {n}" for _ in range(steps) for c, n in DP_STEP] + ["fini 0"]
    prefix = tmp_path / "req"
    pid, logs, _ = drive(build, lines, NCCLRL_TUNER_REQUEST_LOG=str(prefix))
    (f,) = files(prefix)
    log = read_request_log(f)
    total = len(DP) + 3 * steps
    assert (log.header["requests"], log.header["recorded"], log.header["dropped"]) == \
        (str(total), "100000", str(total - 100000))
    assert sum(c.count for c in log.past_cap) == total - 100000 and len(log.calls) == 100000
    t0 = time.perf_counter()
    prof = build_profile([f])
    assert time.perf_counter() - t0 < 30
    assert got_of(prof) == {k: v for k, v in ddp_profile_truth().items() if k[2] == 2}
    assert prof.steps == (100000 - len(DP)) // 3


@pytest.mark.parametrize("edit, words", [
    (lambda t: t.replace("request-log: 1", "request-log: 2"), "format '2'"),
    (lambda t: t.rsplit("\n", 2)[0] + "\n", "header says recorded"),
    (lambda t: t.replace("# nranks: 4\n", ""), "without nranks"),
    (lambda t: t + "allreduce,12,1\n", "expected collective,nbytes,nnodes,nranks"),
    (lambda t: t.replace("# dropped: 0", "# dropped: 3"), "counts disagree"),
])
def test_a_damaged_request_log_is_one_error(build, tmp_path, capsys, edit, words):
    prefix = tmp_path / "req"
    drive(build, ["init 0 5 4 1 1", "call 0 4 8", "call 0 4 16", "fini 0"], NCCLRL_TUNER_REQUEST_LOG=str(prefix))
    (f,) = files(prefix)
    f.write_text(edit(f.read_text()))
    with pytest.raises(ConfigError, match=re.escape(words)):
        build_profile([f])
    assert main(["profile", str(f)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and words in err
