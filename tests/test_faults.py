"""The fault suite (docs/results/faults.md): the measured program misbehaves, the store is killed
into, shared, read-only, corrupted or only read, a table is deployed to ranks that read other
bytes, a checkpoint is a pickle, a command gets bad input. Each case: one clear line, the run goes
on (or stops before anything is measured), nothing is lost."""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import math
import os
import pickle
import random
import re
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import numpy as np
import pytest

from ncclrl.agents.search import PolicyController, strategy_path
from ncclrl.costmodel.errors import ConfigError
from ncclrl.costmodel.space import Point
from ncclrl.costmodel.table import format_row
from ncclrl.costmodel.topology import load_topology
from ncclrl.envs.jobs import LaunchConfig
from ncclrl.envs.measure import measure_whole
from ncclrl.envs.nccltests_backend import NcclTestsBackend
from ncclrl.envs.replay import recorded_sweep, replay_noise
from ncclrl.envs.store import Store, open_readonly
from ncclrl.runners.cli import main
from ncclrl.runners.sweep import best_table, parse_args, run_sweep

sys.path.insert(0, str(Path(__file__).parent / "fakes"))
from fake_workers import SlowWholeWorkers  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
FAKES = Path(__file__).parent / "fakes"
LIVE = REPO / "data" / "h200x4-2026-11-21" / "store.sqlite"
PTS = [Point("allreduce", 8), Point("allreduce", 1 << 20)]


@pytest.fixture
def perf(tmp_path, h200_data, monkeypatch):
    """A folder of fake nccl-tests binaries (tests/fakes/fake_perf.py) and a stand-in plugin."""
    d = tmp_path / "bin"
    d.mkdir()
    shutil.copy(FAKES / "fake_perf.py", d / "all_reduce_perf")
    os.chmod(d / "all_reduce_perf", 0o755)
    for k in list(os.environ):
        if k.startswith(("FAKE_PERF_", "NCCL_", "NCCLRL_TUNER")):
            monkeypatch.delenv(k)
    monkeypatch.setenv("FAKE_PERF_DATA", str(h200_data / "nccltests_allreduce"))
    plugin = tmp_path / "libnccl-tuner-ncclrl.so"
    plugin.write_bytes(b"")
    return d, plugin


def backend(perf, **kw) -> NcclTestsBackend:
    d, plugin = perf
    return NcclTestsBackend(d, 4, plugin=plugin, launcher=LaunchConfig(grace_s=0.3), **{"timeout_s": 20, **kw})


# ---- P: the measured program misbehaves -------------------------------------------------------

def test_p1_output_that_is_not_utf8_is_read(perf, monkeypatch):
    monkeypatch.setenv("FAKE_PERF_BINARY", "1")
    b = backend(perf)
    assert b.measure(PTS, samples=1) == [[36.96], [41.84]] and not b.failures


def test_p2_a_process_holding_the_output_after_a_complete_run_is_done_not_hung(perf, monkeypatch):
    monkeypatch.setenv("FAKE_PERF_LINGER", "20")
    b = backend(perf, timeout_s=10)
    t0 = time.time()
    res = b.measure(PTS, samples=2)
    assert res == [[36.96, 36.96], [41.84, 41.84]] and not b.failures
    assert time.time() - t0 < 4  # the process's exit plus a short grace, twice; not the 20 s it holds the pipe
    time.sleep(0.3)
    left = []
    for d in Path("/proc").iterdir():
        with contextlib.suppress(OSError):
            if d.name.isdigit() and str(perf[0]).encode() in (d / "cmdline").read_bytes():
                left.append(d.name)
    assert left == []  # the process left behind, in a session of its own, was ended with its launch


def test_p3_a_timeout_is_stored_as_timeout_and_never_measured_again_unless_retried(perf, monkeypatch, tmp_path):
    monkeypatch.setenv("FAKE_PERF_HANG_ON", "tree_LL")
    pts = [Point("allreduce", 8), Point("allreduce", 1 << 20, "tree", "ll", 0)]
    with Store(tmp_path / "s.sqlite") as s:
        measure_whole(backend(perf, timeout_s=1.0), pts, s, "h200-1x4", backend="nccl-tests", samples=1, tag="sweep",
                      after_hang="skip")
        row = s.frame(algo="tree").iloc[0]
        assert row.status == "timeout" and row.error.startswith("timed out after 1 s")
        # the sweep's resume test (after_hang=skip): both done, the timeout is never measured again
        assert s.has(pts[0], backend="nccl-tests", topology="h200-1x4", tag="sweep", hung=True)
        assert s.has(pts[1], backend="nccl-tests", topology="h200-1x4", tag="sweep", hung=True)
        assert not s.has(pts[1], backend="nccl-tests", topology="h200-1x4", tag="sweep")
        s.add(pts[1], [], backend="nccl-tests", topology="t2", nccl_version="x", timing="eager", tag="sweep",
              status="failed", error="NCCL hung at 8 B")  # a hang NCCL named stays skipped
        assert s.has(pts[1], backend="nccl-tests", topology="t2", tag="sweep", hung=True)
    monkeypatch.delenv("FAKE_PERF_HANG_ON")
    with Store(tmp_path / "s.sqlite") as s:  # the next run, any command, never measures it again
        rows = s.count()
        res = measure_whole(backend(perf), [pts[1]], s, "h200-1x4", backend="nccl-tests", samples=1, tag="tune")
        assert res == [None] and s.count() == rows
        # ... unless told to retry it
        res = measure_whole(backend(perf), [pts[1]], s, "h200-1x4", backend="nccl-tests", samples=1, tag="sweep",
                            after_hang="retry")
        assert res[0] and s.has(pts[1], backend="nccl-tests", topology="h200-1x4", tag="sweep")


@pytest.mark.parametrize("value", ["nan", "0", "-5", "inf"])
def test_p4_nan_zero_or_negative_times_from_nccl_tests_are_failures(perf, monkeypatch, tmp_path, value):
    monkeypatch.setenv("FAKE_PERF_TIME", value)
    with Store(tmp_path / "s.sqlite") as s:
        res = measure_whole(backend(perf), PTS, s, "h200-1x4", backend="nccl-tests", samples=1, tag="sweep")
        df = s.frame()
    assert res == [None, None] and set(df.status) == {"failed"}
    assert df.error.str.contains(f"out-of-place time of {float(value):g} us at 8 B: not a finite time > 0").all()


@pytest.mark.parametrize("bad", [math.nan, 0.0, -3.0, math.inf])
def test_p5_invalid_times_from_any_backend_are_stored_failed_never_best(tmp_path, bad, caplog):
    """The workers (or any backend) report a broken time: the store keeps it as a failure, the
    sweep goes on, and the best table never picks it."""
    args = parse_args(["topology=h200-2x2-sock", "collectives=allreduce", "max_bytes=64", "grid=full",
                       f"store={tmp_path / 's.sqlite'}", "samples=3"])
    r = run_sweep(args, io.StringIO(), lambda *a: SlowWholeWorkers(*a, per_job=10_000, times={16: [bad] * 3}))
    assert r["failed"] > 0 and r["measured"] > 0 and "not a finite number > 0; stored as failed" in caplog.text
    with Store(tmp_path / "s.sqlite") as s:
        bad_rows = s.frame(nbytes=16)
        assert set(bad_rows.status) == {"failed"} and bad_rows.median_us.isna().all()
        t = best_table(s, load_topology("h200-2x2-sock"), "allreduce", launch="nccl")
    assert 16 not in set(t.nbytes) and (t.best_us > 0).all() and np.isfinite(t.best_us).all()


def test_p6_a_corrupted_row_in_the_store_is_named_and_the_rest_is_used(tmp_path, caplog):
    path = tmp_path / "s.sqlite"
    args = parse_args(["topology=h200-2x2-sock", "collectives=allreduce", "max_bytes=64", "grid=default",
                       f"store={path}", "samples=3"])
    r = run_sweep(args, io.StringIO(), lambda *a: SlowWholeWorkers(*a, per_job=10_000))
    with sqlite3.connect(path) as db:
        ids = [i for (i,) in db.execute("SELECT id FROM measurements WHERE status='ok' ORDER BY id")]
        db.execute("UPDATE measurements SET samples_us='[1.0, oops' WHERE id=?", (ids[0],))
        db.execute("UPDATE measurements SET median_us='fast' WHERE id=?", (ids[1],))
        db.execute("UPDATE measurements SET samples_us='[NaN]', median_us=-1 WHERE id=?", (ids[2],))
    caplog.clear()
    with Store(path) as s:
        df = s.frame()
    assert len(df) == len(ids) - 3 and not set(ids[:3]) & set(df.id)
    for i in ids[:3]:
        assert f"row id {i} is corrupt" in caplog.text
    out = io.StringIO()
    r2 = run_sweep(args, out, lambda *a: SlowWholeWorkers(*a, per_job=10_000))  # measures the broken ones again
    assert r2["measured"] >= 2 and "geometric-mean speedup" in out.getvalue() and r["failed"] == 0


# ---- S: the store ------------------------------------------------------------------------------

DRIVER = FAKES / "drive_command.py"


def _points(path: Path) -> tuple[set, list]:
    """The store's point set and its rows (point, tag, status, samples) in order."""
    with sqlite3.connect(path) as db:
        rows = db.execute("SELECT collective, nbytes, algo, proto, channels, comm_channels, buffsize_bytes, "
                          "socket_nthreads, nsocks_perthread, socket_inline_bytes, tag, status, samples_us "
                          "FROM measurements ORDER BY id").fetchall()
    return {r[:12] for r in rows}, rows


def _kill_and_resume(tmp_path: Path, argv: list[str], seed: int, kills: int, name: str) -> tuple[Path, Path]:
    """A clean run, and the same command killed with SIGKILL at ``kills`` random moments (fixed
    seed) and rerun until it finishes; returns both stores."""
    env = dict(os.environ, FAKE_JOB_SLEEP="0.02", PYTHONHASHSEED="0")
    clean, killed = tmp_path / f"{name}-clean.sqlite", tmp_path / f"{name}-killed.sqlite"

    def cmd(store: Path, out: Path) -> list[str]:
        return [sys.executable, str(DRIVER), *argv, f"store={store}", *([f"out={out}"] if name != "sweep" else [])]

    t0 = time.time()
    p = subprocess.run(cmd(clean, tmp_path / "out-clean"), env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0 and "done" in p.stdout, p.stderr[-2000:]
    wall = time.time() - t0
    rng = random.Random(seed)
    stops = 0
    for _ in range(kills):
        q = subprocess.Popen(cmd(killed, tmp_path / "out-killed"), env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.DEVNULL, text=True)
        time.sleep(rng.uniform(0.6, max(0.7, wall * 0.9)))  # past the imports, into the run
        q.send_signal(signal.SIGKILL)
        out, _ = q.communicate(timeout=30)
        stops += "done" not in out
    p = subprocess.run(cmd(killed, tmp_path / "out-killed"), env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0 and "done" in p.stdout, p.stderr[-2000:]
    assert stops >= 1  # at least one kill landed inside the run
    return clean, killed


def test_s1_a_sweep_killed_at_random_points_resumes_to_the_clean_point_set(tmp_path):
    argv = ["sweep", "topology=h200-2x2-sock", "collectives=allreduce", "max_bytes=64", "grid=full", "samples=3"]
    clean, killed = _kill_and_resume(tmp_path, argv, seed=7, kills=3, name="sweep")
    (a, _), (b, rows) = _points(clean), _points(killed)
    assert a == b  # every point, no leftover
    measured = [r[:11] for r in rows if r[2] != "default"]  # NCCL's default is measured with every request
    assert len(measured) == len(set(measured))  # nothing measured twice


@pytest.mark.parametrize("name,extra,seed", [
    ("finetune", ["budget=150"], 11),
    ("tune", ["method=random", "seed=1", "budget=30"], 12)])
def test_s2_finetune_and_tune_killed_at_random_points_resume_without_measuring_again(tmp_path, name, extra, seed):
    argv = [name, *extra, "backend=replay", f"replay_store={LIVE}", "launch=nccl", "topology=h200-2x2-sock"]
    clean, killed = _kill_and_resume(tmp_path, argv, seed=seed, kills=3, name=name)
    (a, ra), (b, rb) = _points(clean), _points(killed)
    assert a == b and ra == rb  # the same rows in the same order: none again, none left over
    assert (tmp_path / "out-clean" / "nccl_tuner.csv").read_text() == \
        (tmp_path / "out-killed" / "nccl_tuner.csv").read_text()


WRITER = """
import sys
from ncclrl.costmodel.space import Point
from ncclrl.costmodel.table import format_row
from ncclrl.envs.store import Store
s = Store(sys.argv[1])
for i in range(60):
    with s.batch():
        for j in range(5):
            s.add(Point("allreduce", 8 * (j + 1)), [1.0 + i], backend=sys.argv[2], topology="t", nccl_version="x",
                  timing="eager", tag="sweep")
print("ok")
"""


def test_s3_two_processes_on_one_store_take_turns(tmp_path):
    path = tmp_path / "s.sqlite"
    Store(path).close()
    procs = [subprocess.Popen([sys.executable, "-c", WRITER, str(path), f"w{k}"], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for k in range(2)]
    outs = [p.communicate(timeout=60) for p in procs]
    assert all(p.returncode == 0 and o.strip() == "ok" for p, (o, _e) in zip(procs, outs, strict=True)), outs
    with Store(path) as s:
        assert s.count(backend="w0") == s.count(backend="w1") == 300


def _fingerprint(folder: Path) -> dict:
    return {p.name: (hashlib.sha256(p.read_bytes()).hexdigest(), p.stat().st_mtime_ns) for p in folder.iterdir()}


def test_s4_commands_that_only_read_a_store_never_change_it(tmp_path, capsys):
    ro = tmp_path / "ro"
    ro.mkdir()
    shutil.copy(LIVE, ro / "store.sqlite")
    before = _fingerprint(ro)
    topo = load_topology("h200-2x2-sock")
    # the replay's reading (finetune, tune and benchmark read recorded sweeps through it)
    assert len(recorded_sweep(ro / "store.sqlite", topo, "nccl", ("sweep", "sweep-repeat"), status="ok")) > 0
    replay_noise(ro / "store.sqlite", topo, "nccl", [4], {4: [1 << 20]})
    rc = main(["finetune", "backend=replay", f"replay_store={ro / 'store.sqlite'}", "launch=nccl",
               "topology=h200-2x2-sock", "budget=150", f"store={tmp_path / 'ft.sqlite'}", f"out={tmp_path / 'o'}"])
    assert rc == 0
    # validate measure=false: judging stored jobs reads only
    table = tmp_path / "o" / "nccl_tuner.csv"
    rc = main(["validate", str(table), "topology=h200-2x2-sock", "measure=false", f"store={ro / 'store.sqlite'}"])
    assert rc == 2 and "measure: no validation" in capsys.readouterr().err
    with open_readonly(ro / "store.sqlite") as s, pytest.raises(sqlite3.OperationalError, match="readonly"):
        s._db.execute("DELETE FROM measurements")
    # show reads a table only
    tb = _fingerprint(tmp_path / "o")
    main(["show", str(table)])
    assert _fingerprint(tmp_path / "o") == tb
    assert _fingerprint(ro) == before  # bytes and mtime, and no file beside it


@pytest.mark.parametrize("what", ["file", "folder"])
def test_s5_a_read_only_store_is_refused_before_any_measurement(tmp_path, capsys, what):
    folder = tmp_path / "ro"
    folder.mkdir()
    store = folder / "s.sqlite"
    Store(store).close()
    os.chmod(store if what == "file" else folder, 0o444 if what == "file" else 0o555)
    called = []
    try:
        with pytest.raises(ConfigError, match=r"^store: .*(read-only|cannot write in)"):
            run_sweep(parse_args(["topology=h200-2x2-sock", "max_bytes=64", f"store={store}"]), io.StringIO(),
                      lambda *a: called.append(a))
        assert not called
        bins = tmp_path / "bin"
        bins.mkdir()
        rc = main(["sweep", "topology=h200-1x4", "backend=nccl-tests", f"nccltests_dir={bins}", f"store={store}",
                   "max_bytes=64"])
        err = capsys.readouterr().err.strip().splitlines()
        assert rc == 2 and err[-1].startswith("ncclrl: error: store: ") and "Traceback" not in "".join(err)
    finally:
        os.chmod(folder, 0o755)
        os.chmod(store, 0o644)


OLD_ROWS = ("(topology = 'h200-1x4' AND tag = 'sweep') OR (topology = 'h200-2x2-sock' AND tag IN "
            "('sweep', 'validate-base') AND timing = 'nccl-eager')")
LEFT_IN_JOURNAL = 5  # rows a killed writer committed to the -wal and never folded into the file
KILLED_WRITER = f"""
import os, sqlite3, sys
db = sqlite3.connect(sys.argv[1])
db.execute("PRAGMA wal_autocheckpoint=0")
db.execute("INSERT INTO measurements (ts, host, backend, topology, nccl_version, collective, nbytes, algo, proto,"
           " channels, comm_channels, buffsize_bytes, socket_nthreads, nsocks_perthread, timing, tag, status,"
           " samples_us, median_us) SELECT ts + 1e6, host, backend, topology, nccl_version, collective, nbytes, algo,"
           " proto, channels, comm_channels, buffsize_bytes, socket_nthreads, nsocks_perthread, timing, tag, status,"
           " samples_us, median_us FROM measurements WHERE tag = 'sweep' LIMIT {LEFT_IN_JOURNAL}")
db.commit()
os._exit(0)  # killed: the -wal and -shm stay beside the file
"""


@pytest.fixture(scope="module")
def old_store(tmp_path_factory) -> Path:
    """A store of the schema before compute loads (no ``compute_slowdown``: the recorded H200 store's
    own), WAL mode, with a 1x4 sweep and a 2x2 sweep and its validations."""
    path = tmp_path_factory.mktemp("old-store") / "store.sqlite"
    src = sqlite3.connect(f"file:{LIVE}?mode=ro&immutable=1", uri=True)
    (schema,) = src.execute("SELECT sql FROM sqlite_master WHERE name = 'measurements'").fetchone()
    rows = src.execute(f"SELECT * FROM measurements WHERE {OLD_ROWS} ORDER BY id").fetchall()
    src.close()
    db = sqlite3.connect(path)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute(schema)
    db.executemany(f"INSERT INTO measurements VALUES ({','.join('?' * len(rows[0]))})", rows)
    db.commit()
    db.close()
    assert "compute_slowdown" not in schema and not path.with_name("store.sqlite-wal").exists()
    return path


def _files(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())}


READERS = {
    "calibrate": lambda s, t: ["calibrate", f"store={s}", "topology=h200-1x4", "holdout=false"],
    "validate": lambda s, t: ["validate", str(t / "nccl_tuner.csv"), "topology=h200-2x2-sock", "measure=false",
                              "launch=nccl", f"store={s}"],
    "finetune": lambda s, t: ["finetune", "backend=replay", f"replay_store={s}", "launch=nccl",
                              "topology=h200-2x2-sock", "budget=150", f"store={t / 'ft.sqlite'}", f"out={t / 'o'}"],
}


@pytest.mark.parametrize("copy", ["writable", "read-only"])
@pytest.mark.parametrize("command", list(READERS))
def test_s6_commands_that_read_a_store_change_none_of_its_files(old_store, tmp_path, capsys, command, copy):
    """calibrate store=, validate measure=false and finetune backend=replay read a store of an older
    schema that a killed writer left with rows in its -wal and a -shm: the file, the -wal and the
    -shm keep their bytes (sha256), no file appears or goes, the schema is not migrated, the rows in
    the journal are read; the same on a read-only copy (file 0444, folder 0555)."""
    folder = tmp_path / "store"
    folder.mkdir()
    store = folder / "store.sqlite"
    shutil.copy(old_store, store)
    subprocess.run([sys.executable, "-c", KILLED_WRITER, str(store)], check=True)
    assert sorted(p.name for p in folder.iterdir()) == ["store.sqlite", "store.sqlite-shm", "store.sqlite-wal"]
    (tmp_path / "nccl_tuner.csv").write_text(format_row("allreduce", 0, "max", "ring", "simple", 1) + "\n")
    before = _files(folder)
    if copy == "read-only":
        for p in folder.iterdir():
            p.chmod(0o444)
        folder.chmod(0o555)
    try:
        rc = main(READERS[command](store, tmp_path))
        err = capsys.readouterr().err
        assert "Traceback" not in err
        if command == "validate":  # the store holds no validation of this table: said in one line, after reading
            assert rc == 2 and "measure: no validation of" in err, err
        else:
            assert rc == 0, err
        assert _files(folder) == before
        with open_readonly(store) as s:
            cols = {r[1] for r in s._db.execute("PRAGMA table_info(measurements)")}
            assert "compute_slowdown" not in cols  # never migrated
            with sqlite3.connect(f"file:{old_store}?mode=ro&immutable=1", uri=True) as db:
                (n,) = db.execute("SELECT COUNT(*) FROM measurements").fetchone()
            assert s.count() == n + LEFT_IN_JOURNAL  # the rows in the journal are read too
        assert _files(folder) == before
    finally:
        folder.chmod(0o755)
        for p in folder.iterdir():
            p.chmod(0o644)


# ---- D: deployment ------------------------------------------------------------------------------

@pytest.mark.parametrize("umask", [0o022, 0o077], ids=["022", "077"])
def test_d1_written_tables_get_the_mode_of_any_new_file(tmp_path, umask):
    """A table's files (nccl_tuner.csv, nccl.conf, the JSON, the manifest) get 0666 & ~umask, like
    any file the user creates: readable by a job under another account at umask 022 (they were
    0600, the temporary file's mode)."""
    from ncclrl.costmodel.table import Row, Table, write_unit

    old = os.umask(umask)
    try:
        t = Table(None, [Row("allreduce", 0, 4294967295, "ring", "ll", 2)], conf={"NCCL_BUFFSIZE": 4194304})
        t.write(tmp_path / "t")
        write_unit(tmp_path / "u", {"a.txt": "x\n"})
    finally:
        os.umask(old)
    files = [p for p in (tmp_path / "t").iterdir()] + [p for p in (tmp_path / "u").iterdir()]
    assert {p.name for p in files} >= {"nccl_tuner.csv", "nccl.conf", "nccl_tuner.json", "nccl_tuner.manifest"}
    assert {p.name: oct(p.stat().st_mode & 0o777) for p in files} == {p.name: oct(0o666 & ~umask) for p in files}


def test_d3_a_table_write_names_the_fingerprint_to_deploy(tmp_path, caplog):
    """Every export (a table's write) logs the fingerprint a deployment sets on every rank, the same
    as the plugin computes over the file's bytes and the manifest holds."""
    from ncclrl.costmodel.table import MANIFEST, Row, Table, fingerprint

    caplog.set_level("INFO", logger="ncclrl.costmodel.table")
    paths = Table(None, [Row("allreduce", 0, 4294967295, "ring", "ll", 2)]).write(tmp_path / "t")
    fp = fingerprint(paths["csv"].read_bytes())
    assert json.loads((tmp_path / "t" / MANIFEST).read_text())["fingerprint"] == fp
    assert [r.getMessage() for r in caplog.records if f"NCCLRL_TUNER_TABLE_FINGERPRINT={fp} " in r.getMessage()]


@pytest.fixture(scope="module")
def probe_build(tmp_path_factory) -> Path:
    build = tmp_path_factory.mktemp("plugin")
    p = subprocess.run(["make", "--no-print-directory", "-C", str(REPO / "plugin"), f"BUILD={build}", "probe"],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    return build


def _rank_init(build: Path, env: dict[str, str]) -> tuple[int, list[str]]:
    """One rank's communicator init (the probe: the plugin as NCCL loads it, 2 nodes x 8 ranks), with
    the deployment's variables ``env``; its exit status (1: the init failed) and its WARN lines."""
    base = {k: v for k, v in os.environ.items() if not k.startswith(("NCCLRL_TUNER", "NCCL_TUNER"))}
    p = subprocess.run([str(build / "probe"), str(build / "libnccl-tuner-ncclrl.so"), "8", "2"], input="4 1024\n",
                       capture_output=True, text=True, env={**base, **env}, timeout=60)
    return p.returncode, [ln[6:] for ln in p.stdout.splitlines() if ln.startswith("log 2 ")]


def test_d2_a_rank_without_the_deployed_table_fails_its_init_loudly(probe_build, tmp_path):
    """The README's deployment, two ranks: rank 0 reads the table, then the file changes (a copy
    being replaced) before rank 1's init; on a third node the file is missing. Each rank that would
    run other decisions than rank 0 fails its communicator's init (NCCL fails the call on that rank)
    with a WARN naming the path, and both fingerprints; NCCLRL_TUNER_ON_ERROR=fallback keeps NCCL's
    decisions there, with the WARN."""
    from ncclrl.costmodel.table import fingerprint

    table = tmp_path / "nccl_tuner.csv"
    text = format_row("allreduce", 0, "max", "ring", "simple", 4) + "\n"
    table.write_text(text)
    deploy = {"NCCLRL_TUNER_TABLE": str(table), "NCCLRL_TUNER_TABLE_FINGERPRINT": fingerprint(text)}
    rc, warns = _rank_init(probe_build, deploy)
    assert rc == 0 and warns == []
    changed = text.replace("simple,4", "ll128,4")
    table.write_text(changed)
    rc, warns = _rank_init(probe_build, deploy)
    assert rc == 1 and len(warns) == 1
    assert str(table) in warns[0] and f"has fingerprint {fingerprint(changed)}, not the {fingerprint(text)}" in warns[0]
    assert "this communicator's init fails" in warns[0]
    missing = dict(deploy, NCCLRL_TUNER_TABLE=str(tmp_path / "elsewhere" / "nccl_tuner.csv"))
    rc, warns = _rank_init(probe_build, missing)
    assert rc == 1 and len(warns) == 1 and f"no table at {tmp_path / 'elsewhere'}" in warns[0]
    for env in (deploy, missing):
        rc, warns = _rank_init(probe_build, dict(env, NCCLRL_TUNER_ON_ERROR="fallback"))
        assert rc == 0 and len(warns) == 1 and warns[0].endswith("NCCL's own decisions everywhere")


def test_d4_a_table_file_deployed_without_its_fingerprint_is_refused_on_every_rank(probe_build, tmp_path):
    """The deployment of D2 without NCCLRL_TUNER_TABLE_FINGERPRINT: a file replaced between two ranks'
    inits would go unseen, so no rank loads a file unchecked. Each rank's init fails with one WARN
    naming the path and the fingerprint to set (that of the bytes it read, Python's); with
    NCCLRL_TUNER_ON_ERROR=fallback every rank keeps NCCL's decisions: the ranks agree either way.
    NCCLRL_TUNER_TABLE_FINGERPRINT=any loads the file unchecked (the opt-out)."""
    from ncclrl.costmodel.table import fingerprint

    table = tmp_path / "nccl_tuner.csv"
    text = format_row("allreduce", 0, "max", "ring", "simple", 4) + "\n"
    changed = text.replace("simple,4", "ll128,4")
    for content in (text, changed):  # rank 0, then rank 1 after the file changed
        table.write_text(content)
        rc, warns = _rank_init(probe_build, {"NCCLRL_TUNER_TABLE": str(table)})
        assert rc == 1 and len(warns) == 1
        assert warns[0].startswith(f"TUNER/ncclrl: table {table} is a file and NCCLRL_TUNER_TABLE_FINGERPRINT is unset")
        assert f"set NCCLRL_TUNER_TABLE_FINGERPRINT={fingerprint(content)} " in warns[0]
        assert "or =any to load files unchecked: this communicator's init fails" in warns[0]
        rc, warns = _rank_init(probe_build, {"NCCLRL_TUNER_TABLE": str(table), "NCCLRL_TUNER_ON_ERROR": "fallback"})
        assert rc == 0 and len(warns) == 1 and warns[0].endswith("NCCL's own decisions everywhere")
    rc, warns = _rank_init(probe_build, {"NCCLRL_TUNER_TABLE": str(table), "NCCLRL_TUNER_TABLE_FINGERPRINT": "any"})
    assert rc == 0 and warns == []


# ---- C: checkpoints ----------------------------------------------------------------------------

class _Boom:
    def __reduce__(self):
        return (os.system, (f"touch {os.environ.get('BOOM_MARK', '/nonexistent/x')}",))


def test_c1_the_shipped_strategy_is_json_and_npz_without_pickle():
    path = strategy_path("shipped")
    with np.load(path.with_suffix(".npz"), allow_pickle=False) as z:
        assert all(z[k].dtype != object for k in z.files)
    assert PolicyController.load(path).layers


@pytest.mark.parametrize("name", ["policy.zip", "model.pt", "model.pkl", "strategy.json"])
def test_c2_a_pickled_checkpoint_is_refused_and_never_run(tmp_path, monkeypatch, name):
    mark = tmp_path / "ran"
    monkeypatch.setenv("BOOM_MARK", str(mark))
    path = tmp_path / name
    if name.endswith(".zip"):  # stable-baselines3's layout: a zip with a pickled policy inside
        with zipfile.ZipFile(path, "w") as z:
            z.writestr("data", pickle.dumps(_Boom()))
    else:
        path.write_bytes(pickle.dumps(_Boom()))
    with pytest.raises(ConfigError, match="pickled checkpoint; ncclrl never loads pickles"):
        PolicyController.load(path)
    assert not mark.exists()


def test_c3_weights_holding_pickled_objects_are_refused(tmp_path):
    src = strategy_path("shipped")
    shutil.copy(src, tmp_path / "strategy.json")
    np.save(tmp_path / "w.npy", np.array([_Boom()], dtype=object), allow_pickle=True)
    with zipfile.ZipFile(tmp_path / "strategy.npz", "w") as z:
        z.write(tmp_path / "w.npy", "w0.npy")
    with pytest.raises(ConfigError, match="plain arrays only"):
        PolicyController.load(tmp_path / "strategy.json")


# ---- B: bad input on the command line ----------------------------------------------------------

def _bad_cases(tmp: Path) -> list[tuple[str, list[str], str]]:
    afile, table = tmp / "afile", tmp / "table.csv"
    return [
        ("not-a-number", ["sweep", "samples=abc"], "samples"),
        ("samples-0", ["sweep", "samples=0"], "samples"),
        ("min-over-max", ["sweep", "min_bytes=1M", "max_bytes=1K"], "max_bytes"),
        ("size-over-2^64", ["sweep", "max_bytes=99999999999999999999999"], "max_bytes"),
        ("size-over-2^64-decisions", ["decisions", "max_bytes=18446744073709551617"], "max_bytes"),
        ("size-not-a-size", ["sweep", "max_bytes=abc"], "max_bytes"),
        ("size-negative", ["sweep", "min_bytes=-8"], "min_bytes"),
        ("timeout-not-a-number", ["sweep", "timeout_s=abc"], "timeout_s"),
        ("timeout-negative", ["sweep", "timeout_s=-1"], "timeout_s"),
        ("extra-args-malformed", ["sweep", "launcher.extra_args='a \"b'"], "launcher.extra_args"),
        ("launcher-port", ["sweep", "launcher.port=70000"], "launcher.port"),
        ("run-folder-uncreatable", ["sweep", f"log_dir={afile}/logs"], "log_dir"),
        ("out-folder-uncreatable", ["finetune", "topology=h200-2x2-sock", f"out={afile}/o"], "out"),
        ("out-folder-in-proc", ["tune", "method=random", "topology=h200-2x2-sock", "out=/proc/ncclrl/o"], "out"),
        ("missing-output-folder", ["validate", str(table), "topology=h200-1x4", f"out={tmp}/missing/r.csv"], "out"),
        ("store-folder-is-a-file", ["finetune", "topology=h200-2x2-sock", "backend=replay", f"replay_store={LIVE}",
                                    f"store={afile}/s.sqlite", f"out={tmp}/o2"], "store"),
        ("budget-negative", ["finetune", "topology=h200-1x4", "budget=-1"], "budget"),
        ("search-zero", ["finetune", "topology=h200-1x4", "search.round_points=0"], "search.round_points"),
        ("strategy-missing", ["finetune", "topology=h200-1x4", "strategy=/nope.json"], "strategy"),
        ("strategy-pickled", ["finetune", "topology=h200-2x2-sock", "backend=replay", f"replay_store={LIVE}",
                              f"strategy={tmp}/policy.zip", f"store={tmp}/s3.sqlite", f"out={tmp}/o3"], "strategy"),
        ("method-unknown", ["tune", "method=nope", "topology=h200-1x4"], "method"),
        ("rounds-0", ["validate", str(table), "topology=h200-1x4", "rounds=0"], "rounds"),
        ("measure-not-bool", ["validate", str(table), "topology=h200-1x4", "measure=maybe"], "measure"),
        ("validate-store-missing", ["validate", str(table), "topology=h200-1x4", "measure=false",
                                    f"store={tmp}/none.sqlite"], "store"),
        ("benchmark-samples-0", ["benchmark", "samples=0"], "samples"),
        ("benchmark-workers-0", ["benchmark", "workers=0"], "workers"),
        ("benchmark-seed-word", ["benchmark", "suite.seeds=[x]"], "suite.seeds"),
        ("benchmark-out-uncreatable", ["benchmark", "suite=ci", f"out={afile}/b"], "out"),
        ("plugin-out-uncreatable", ["plugin", "build", f"out={afile}/p"], "out"),
        ("make-missing", ["plugin", "build", f"out={tmp}/plugin"], "plugin"),
        ("num-pipe-ops-0", ["decisions", "num_pipe_ops=0"], "num_pipe_ops"),
        ("show-missing", ["show", "/nonexistent/t.csv"], "table"),
        # a key the command does not have, with or without '+': refused, not ignored after spending a budget
        ("typo-plus", ["finetune", "topology=h200-2x2-sock", "backend=replay", f"replay_store={LIVE}", "+budjet=10",
                       f"store={tmp}/s4.sqlite", f"out={tmp}/o4"], "budjet"),
        ("unknown-plus", ["decisions", "+foo=1"], "foo"),
        ("hydra-key", ["decisions", "hydra.run.dir=x"], "hydra.run.dir"),
        ("plus-existing", ["decisions", "+num_pipe_ops=2"], "num_pipe_ops"),
        ("topology-empty", ["decisions", "topology="], "topology"),
        ("topology-folder", ["export", f"topology={tmp}", f"run_dir={tmp}/e"], "topology"),
        ("show-finetune-json", ["show", f"{tmp}/finetune.json"], "table"),
        ("timeout-nan", ["sweep", "timeout_s=nan"], "timeout_s"),
        ("timeout-inf", ["finetune", "topology=h200-2x2-sock", "backend=replay", f"replay_store={LIVE}",
                         "timeout_s=inf", f"store={tmp}/s5.sqlite", f"out={tmp}/o5"], "timeout_s"),
        ("timeout-tiny", ["sweep", "timeout_s=1e-9"], "timeout_s"),
        ("grace-nan", ["sweep", "launcher.grace_s=nan"], "launcher.grace_s"),
        ("lr-overflow", ["pretrain", "agent.learning_rate=1e400", f"run_dir={tmp}/r"], "agent.learning_rate"),
        ("int-overflow", ["decisions", "num_pipe_ops=99999999999999999999999"], "num_pipe_ops"),
        ("interpolation-loop", ["decisions", "topology=${topology}"], "topology"),
        ("conf-latin1", ["validate", str(table), "topology=h200-1x4", f"conf={tmp}/latin1.conf"],
         f"{tmp}/latin1.conf"),
        ("conf-channel-range", ["validate", str(table), "topology=h200-1x4", f"conf={tmp}/range.conf"],
         f"{tmp}/range.conf:NCCL_MIN_NCHANNELS"),
    ]


CASE_IDS = [c[0] for c in _bad_cases(Path("/t"))]


@pytest.mark.parametrize("case", CASE_IDS)
def test_b_bad_input_is_one_line_exit_2(tmp_path, monkeypatch, capsys, case):
    (tmp_path / "afile").write_text("x\n")
    (tmp_path / "table.csv").write_text(format_row("allreduce", 0, "max", "ring", "simple", 1) + "\n")
    with zipfile.ZipFile(tmp_path / "policy.zip", "w") as z:
        z.writestr("data", pickle.dumps(_Boom()))
    (tmp_path / "finetune.json").write_text('{"topology": "h200-2x1-sock", "measured": 3, "rows": '
                                            '[{"collective": "allreduce", "nbytes": 8, "key": "ring/ll/1"}]}')
    (tmp_path / "latin1.conf").write_bytes("# réglages\nNCCL_MIN_NCHANNELS=4\n".encode("latin-1"))
    (tmp_path / "range.conf").write_text("NCCL_MIN_NCHANNELS=4\nNCCL_MAX_NCHANNELS=8\n")
    if case == "make-missing":
        monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    name, argv, key = next(c for c in _bad_cases(tmp_path) if c[0] == case)
    before = sorted(p.name for p in tmp_path.iterdir())
    rc = main(argv)
    text = capsys.readouterr().err
    err = [ln for ln in text.splitlines() if ln.strip() and not ln.startswith("# ")]  # '# ': progress notes
    assert rc == 2 and len(err) == 1 and "Traceback" not in text, err
    assert re.match(rf"ncclrl: error: {re.escape(key)}(\[\d+\])?: ", err[0]), err
    assert "Error:" not in err[0]  # no exception's name (TypeError: ...) in place of what is allowed
    if case != "make-missing":
        assert sorted(p.name for p in tmp_path.iterdir()) == before  # nothing half written


def test_b_a_failing_background_thread_prints_no_traceback(perf, monkeypatch, capfd):
    """The reader of a launch whose output outlives it stops quietly."""
    monkeypatch.setenv("FAKE_PERF_LINGER", "1")
    backend(perf).measure(PTS[:1], samples=1)
    time.sleep(1.5)
    with contextlib.suppress(Exception):
        assert "Traceback" not in capfd.readouterr().err


# ---- U: what a user meets on the command line ----------------------------------------------------

@pytest.mark.parametrize("argv, key, close", [
    (["finetune", "topology=h200-1x4", "+budjet=10"], "budjet", "budget"),
    (["pretrain", "+agent.learnin_rate=1"], "agent.learnin_rate", "agent.learning_rate"),
    (["sweep", "launcher.read_grace_s=1"], "launcher.read_grace_s", "launcher.grace_s"),
])
def test_u1_an_unknown_key_is_refused_naming_the_closest_keys(capsys, argv, key, close):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"ncclrl: error: {key}: unknown key; close keys: ") and close in err.split("close keys:")[1]


def test_u1_hydra_verbose_is_the_one_hydra_setting_read(capsys):
    import logging

    level = logging.getLogger().level
    try:
        assert main(["decisions", "hydra.verbose=true", "collective=allreduce", "min_bytes=8", "max_bytes=8"]) == 0
        assert logging.getLogger().level == logging.DEBUG
    finally:
        logging.getLogger().setLevel(level)
    assert capsys.readouterr().out.splitlines()[1].startswith("allreduce,8,")
    assert main(["decisions", "hydra.job.chdir=true"]) == 2
    assert "hydra.verbose" in capsys.readouterr().err


@pytest.mark.parametrize("argv, module, key", [
    (["tune", "method=tpe"], "optuna", "method"),
    (["tune", "method=afnfa"], "sklearn", "method"),
    (["benchmark", "suite=ci", "suite.methods=[default,tpe]"], "optuna", "suite.methods"),
])
def test_u2_a_method_without_its_extra_stops_before_anything_is_written(tmp_path, monkeypatch, capsys, argv, module,
                                                                       key):
    monkeypatch.setitem(sys.modules, module, None)  # as if the extra were not installed: its import fails
    monkeypatch.chdir(tmp_path)
    extra = [f"out={tmp_path}/out"] + ([] if argv[0] == "benchmark" else [
        "topology=h200-2x2-sock", "backend=replay", f"replay_store={LIVE}", f"store={tmp_path}/s.sqlite"])
    assert main(argv + extra) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"ncclrl: error: {key}: ")
    assert 'pip install "ncclrl[baselines]"' in err[0]
    assert list(tmp_path.iterdir()) == []  # no store, no partial.yaml, no strategies trained


def test_u2_show_names_the_table_beside_a_finetune_json(tmp_path, capsys):
    (tmp_path / "finetune.json").write_text('{"measured": 3, "rows": [{"collective": "allreduce", "nbytes": 8}]}')
    (tmp_path / "nccl_tuner.csv").write_text(format_row("allreduce", 0, "max", "ring", "simple", 1) + "\n")
    assert main(["show", str(tmp_path / "finetune.json")]) == 2
    err = capsys.readouterr().err.strip()
    assert "evidence of a tuning run" in err and err.endswith(str(tmp_path / "nccl_tuner.csv"))


def test_u3_the_benchmark_finds_its_recorded_sweeps_from_any_folder_or_says_where(tmp_path, monkeypatch, capsys):
    from ncclrl.runners import benchmark

    monkeypatch.chdir(tmp_path)  # not the checkout: the default replays are relative to the package
    benchmark.compose(["suite=ci"])
    monkeypatch.setattr(benchmark, "PACKAGE_ROOT", tmp_path / "site-packages" / "ncclrl")  # a wheel: no data
    assert main(["benchmark", "suite=ci", f"out={tmp_path}/b"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("ncclrl: error: suite.replays: no store at data/") and "suite.sets=" in err
    assert not (tmp_path / "b").exists()
    benchmark.compose(["suite=ci", "suite.sets=[lofo]"])  # without the replay set nothing is looked for


@pytest.mark.parametrize("cmd", ["tune", "benchmark"])
def test_u3_help_names_the_extra_of_afnfa_and_tpe(cmd, capsys):
    assert main([cmd, "--help"]) == 0
    assert 'afnfa and tpe need the extra: pip install "ncclrl[baselines]"' in capsys.readouterr().out


def test_u5_without_gpus_e2e_suggests_its_own_cpu_mode_and_plugin_help_works(tmp_path, monkeypatch, capsys):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    table = tmp_path / "t.csv"
    table.write_text(format_row("allreduce", 0, "max", "ring", "simple", 1) + "\n")
    assert main(["e2e", str(table), "topology=h200-2x1-sock", f"out={tmp_path}/e"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("ncclrl: error: device: ") and "device=cpu" in err and "backend=" not in err
    assert main(["plugin", "verify", str(table), "topology=h200-2x1-sock", f"out={tmp_path}/v"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("ncclrl: error: launcher: ") and "backend=" not in err
    assert main(["plugin", "--help"]) == 0
    out = capsys.readouterr().out
    assert "plugin build" in out and "plugin verify" in out


def test_u7_validate_defaults_to_the_rounds_its_help_asks_for():
    from ncclrl.runners.validate import COMMAND

    cfg = COMMAND.schema()
    assert cfg.rounds >= 3 and "rounds`` >= 3" in COMMAND.schema.__doc__


def test_u14_sizes_past_2_to_the_53_are_exact(capsys, monkeypatch):
    from ncclrl.costmodel.units import parse_bytes

    n = (1 << 53) + 1
    assert parse_bytes(str(n)) == n and parse_bytes("8388609K") == 8388609 << 10
    assert main(["decisions", "collective=allreduce", f"min_bytes={n}", f"max_bytes={n}"]) == 0
    assert capsys.readouterr().out.splitlines()[1].startswith(f"allreduce,{n},")
    monkeypatch.setattr(sys, "stdin", io.StringIO("allreduce,99999999999999999999999,ring,simple,0\n"))
    assert main(["predict"]) == 2
    assert capsys.readouterr().err.startswith("ncclrl: error: line 1: nbytes: 99999999999999999999999 is beyond")


def test_u15_a_sweep_where_every_launch_failed_exits_non_zero(perf, monkeypatch, tmp_path, capsys):
    d, plugin = perf
    monkeypatch.setattr("ncclrl.envs.live.PLUGIN", plugin)
    monkeypatch.setenv("FAKE_PERF_MODE", "fail")
    argv = ["sweep", "backend=nccl-tests", f"nccltests_dir={d}", "topology=h200-1x4", "collectives=allreduce",
            "max_bytes=16", "grid=default", "samples=1", f"store={tmp_path / 's.sqlite'}", "timeout_s=20"]
    assert main(argv) == 1
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("ncclrl: error:")]
    assert len(err) == 1 and err[0].startswith("ncclrl: error: sweep: every one of the ")
    with Store(tmp_path / "s.sqlite") as s:  # every failure is kept, with its reason
        assert set(s.frame().status) == {"failed"}


def test_u15_a_process_killed_with_sigkill_leaves_no_job_folder_behind(tmp_path, monkeypatch):
    from ncclrl.envs.jobs import job_folder

    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr("tempfile.tempdir", None)
    code = "import time\nfrom ncclrl.envs.jobs import job_folder\nwith job_folder('job') as d:\n" \
           "    print(d, flush=True)\n    time.sleep(60)\n"
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, env=dict(os.environ))
    left = Path(p.stdout.readline().strip())
    p.kill()
    p.wait()
    assert left.is_dir() and left.parent.parent == tmp_path  # SIGKILL: nothing cleaned up
    with job_folder("job") as mine:
        assert mine.is_dir() and not left.exists()  # the next job removes what the dead process left
    assert not mine.exists()


def test_u15_an_nccl_conf_with_a_channel_range_keeps_both_bounds(tmp_path):
    from ncclrl.costmodel.table import read_conf, read_conf_env

    conf = tmp_path / "nccl.conf"
    conf.write_text("NCCL_MIN_NCHANNELS=4\nNCCL_MAX_NCHANNELS=8\n")
    assert read_conf_env(conf) == {"NCCL_MIN_NCHANNELS": 4, "NCCL_MAX_NCHANNELS": 8}
    with pytest.raises(ConfigError, match="are a range.*set both to one value"):
        read_conf(conf)
    conf.write_text("NCCL_MIN_NCHANNELS=4\nNCCL_MAX_NCHANNELS=4\n")
    assert read_conf(conf).comm_channels == 4



def test_u_calibrate_only_reads_its_store(tmp_path, capsys):
    import gc

    ro = tmp_path / "ro"
    ro.mkdir()
    args = parse_args(["topology=h200-2x2-sock", "collectives=allreduce", "max_bytes=64K", "grid=default",
                       f"store={ro / 's.sqlite'}", "samples=3"])
    run_sweep(args, io.StringIO(), lambda *a: SlowWholeWorkers(*a, per_job=10_000))
    gc.collect()  # the sweep's store closed: nobody writes it from here on
    os.utime(ro / "s.sqlite", (1, 1))
    before = _fingerprint(ro)
    os.chmod(ro, 0o555)  # a recorded store where the user cannot write (an installed package, a shared folder)
    try:
        assert main(["calibrate", f"store={ro / 's.sqlite'}", "topology=h200-2x2-sock", "holdout=false"]) == 0
    finally:
        os.chmod(ro, 0o755)
    assert "final fit on all 14 rows" in capsys.readouterr().out
    assert _fingerprint(ro) == before  # bytes and mtime, and no file beside it
