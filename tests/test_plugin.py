"""The C tuner plugin: built here, driven by the C harness (plain and AddressSanitizer), by
libFuzzer, from Python through ctypes against a reference on random tables, and through the probe
(one communicator init per run) on real exported tables: the table's source (the environment's
content before any path), its fingerprint against Python's, and rows of several communicator shapes."""

from __future__ import annotations

import ctypes
import io
import os
import random
import re
import shutil
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest

from ncclrl.agents.export import export_table
from ncclrl.costmodel import nccl as N
from ncclrl.costmodel.simulator import Simulator
from ncclrl.costmodel.table import FILLED, MAX_BYTES, Row, Table, fingerprint, lookup, parse_example_rows

PLUGIN = Path(__file__).resolve().parents[1] / "plugin"


def make(build: Path, *targets: str, **env: str) -> str:
    p = subprocess.run(["make", "--no-print-directory", "-C", str(PLUGIN), f"BUILD={build}", *targets],
                       capture_output=True, text=True, env={**os.environ, **env}, timeout=600)
    assert p.returncode == 0, p.stdout + p.stderr
    return p.stdout + p.stderr


@pytest.fixture(scope="module")
def build(tmp_path_factory) -> Path:
    b = tmp_path_factory.mktemp("plugin-build")
    make(b, "all", "probe")
    return b


def test_only_versioned_structs_are_exported(build):
    out = subprocess.run(["nm", "-D", "--defined-only", str(build / "libnccl-tuner-ncclrl.so")], capture_output=True,
                         text=True, check=True).stdout
    names = sorted(line.split()[-1] for line in out.splitlines() if line.strip())
    assert names == [f"ncclProfiler_v{v}" for v in (5, 6, 7)] + [f"ncclTunerPlugin_v{v}" for v in range(2, 8)]


def test_c_harness(build):
    out = make(build, "test")
    assert any(line.endswith(" passed, 0 failed") for line in out.splitlines()), out


def test_c_harness_under_address_sanitizer(build):
    out = make(build, "asan")
    assert any(line.endswith(" passed, 0 failed") for line in out.splitlines()), out
    assert "ERROR: AddressSanitizer" not in out and "runtime error" not in out


def test_parser_fuzz_run(build):
    if shutil.which("clang") is None:
        pytest.fail("the fuzz run needs clang (apt-get install clang); .ci/run installs it")
    out = make(build, "fuzz", FUZZ_SECONDS="4")
    assert "Done" in out and "ERROR" not in out and "crash-" not in out


# -- ctypes: the same decisions from Python, against a reference ------------------------------------

V5_INIT = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(ctypes.c_void_p), ctypes.c_uint64, ctypes.c_size_t,
                           ctypes.c_size_t, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p)
V5_GET = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p,
                          ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.POINTER(ctypes.c_int))
V5_FIN = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p)


class TunerV5(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("init", V5_INIT), ("getCollInfo", V5_GET), ("finalize", V5_FIN)]


def random_table(rng: random.Random, nodes: int, nranks: int) -> tuple[str, list[dict]]:
    """Valid rows partitioning part of the size range, junk rows mixed in (the plugin rejects them)."""
    lines, valid = [], []
    for coll in N.COLLECTIVES:
        edges = sorted(rng.sample(range(1, 40), 8))
        for lo, hi in zip(edges[:-1], edges[1:], strict=True):
            if rng.random() < 0.25:
                continue  # a gap
            algo = rng.choice(N.ALGOS)
            proto = rng.choice(N.PROTOS)
            ch = rng.choice([-1, 0, 1, 2, 8, 24, 64])
            row = {"collective": coll, "min_bytes": 1 << lo, "max_bytes": (1 << hi) - 1, "algo": algo, "proto": proto,
                   "channels": ch, "nNodes": rng.choice([-1, nodes]), "nRanks": rng.choice([-1, nranks])}
            valid.append(row)
            lines.append(",".join(str(row[k]) for k in ("collective", "min_bytes", "max_bytes", "algo", "proto",
                                                         "channels", "nNodes", "nRanks")))
            if rng.random() < 0.3:
                lines.append(rng.choice([f"{coll},{1 << lo},{1 << hi},ring,ll512,1,-1,-1",
                                         f"{coll},{1 << lo},{1 << lo},tree,ll,1,-1,-1",  # overlaps: rejected
                                         "allreduce,1,2,ring,ll,1,-1", "alltoall,0,10,ring,ll,1,-1,-1"]))
    return "\n".join(lines) + "\n", valid


def test_ctypes_matches_the_reference_on_random_tables(build, tmp_path, monkeypatch):
    lib = ctypes.CDLL(str(build / "libnccl-tuner-ncclrl.so"))
    v5 = TunerV5.in_dll(lib, "ncclTunerPlugin_v5")
    assert v5.name == b"ncclrl"
    rng = random.Random(0)
    nrng = np.random.default_rng(0)
    for trial in range(20):
        text, valid = random_table(rng, nodes=1, nranks=4)
        path = tmp_path / f"t{trial}.csv"
        path.write_text(text)
        monkeypatch.delenv("NCCLRL_TUNER_TABLE_DATA", raising=False)
        monkeypatch.setenv("NCCLRL_TUNER_TABLE", str(path))
        monkeypatch.setenv("NCCLRL_TUNER_TABLE_FINGERPRINT", fingerprint(text))  # a file loads only checked
        ctx = ctypes.c_void_p()
        assert v5.init(ctypes.byref(ctx), trial, 4, 1, None, None, None) == 0
        for _ in range(300):
            coll = rng.randrange(5)
            nbytes = int(2 ** rng.uniform(0, 41))
            table = np.where(nrng.random((7, 3)) < 0.3, -1.0, 5.0 + nrng.random((7, 3))).astype(np.float32)
            before = table.copy()
            nch = ctypes.c_int(0)
            rc = v5.getCollInfo(ctx, coll, nbytes, 1, table.ctypes.data, 7, 3, 0, ctypes.byref(nch))
            assert rc == 0
            row = lookup(valid, N.COLLECTIVES[coll], nbytes, 1, 4)
            want = before.copy()
            want_ch = 0
            if row is not None:
                a, p = N.ALGOS.index(row["algo"]), N.PROTOS.index(row["proto"])
                if before[a, p] >= 0:
                    want[a, p] = 0.0
                    want_ch = max(row["channels"], 0)
            assert np.array_equal(table, want), (trial, coll, nbytes, row)
            assert nch.value == want_ch, (trial, coll, nbytes, row)
        v5.finalize(ctx)


def test_exported_tables_parse_under_both_readers(tmp_path):
    """What the exporter writes is what the example plugin's rules and ours read."""
    text = (PLUGIN / "tests" / "data" / "example_format.csv").read_text()
    rows = parse_example_rows(text)
    assert lookup(rows, "allreduce", 1 << 20, 1, 4)["proto"] == "ll128"


# -- the probe: one communicator init in a fresh process, real exported tables ------------------------

TABLE_VARS = ("NCCLRL_TUNER_TABLE_DATA", "NCCLRL_TUNER_TABLE", "NCCL_TUNER_CONFIG_FILE",
              "NCCLRL_TUNER_TABLE_FINGERPRINT", "NCCLRL_TUNER_ON_ERROR")
SOURCE_LINE = re.compile(r"TUNER/ncclrl: table from (.+) \((\d+) bytes, (\d+) rows, fingerprint ([0-9a-f]{16})\): "
                         r"(\d+) for this communicator \((\d+) ranks?, (\d+) nodes?\), (\d+) rejected")
QUERY_SIZES = [0, 1, 7, 8, 4095, 4096, 65535, 65536, 1 << 20, (1 << 20) + 1, (1 << 30) + 5, MAX_BYTES]


def probe(build: Path, nodes: int, nranks: int, env: dict[str, str], data_file: Path | None = None,
          queries: list[tuple[int, int]] | None = None, cwd: Path | None = None, init_fails: bool = False,
          ) -> tuple[list[tuple[int, str]], dict[tuple[int, int], tuple[int, int, int]]]:
    """Init one communicator of ``nodes`` x ``nranks`` with the table variables of ``env`` only;
    returns the log lines (level, message) and each query's (algorithm, protocol, channels).
    ``init_fails``: the init must fail (no decisions then)."""
    base = {k: v for k, v in os.environ.items() if k not in TABLE_VARS}
    args = [str(build / "probe"), str(build / "libnccl-tuner-ncclrl.so"), str(nranks), str(nodes)]
    if data_file is not None:
        args.append(str(data_file))
    queries = queries or [(c, s) for c in range(len(N.COLLECTIVES)) for s in QUERY_SIZES]
    p = subprocess.run(args, input="".join(f"{c} {s}\n" for c, s in queries), capture_output=True, text=True,
                       env={**base, **env}, cwd=cwd, timeout=60)
    assert p.returncode == (1 if init_fails else 0), p.stdout + p.stderr
    assert ("init failed" in p.stderr) == init_fails
    logs, decisions = [], {}
    for line in p.stdout.splitlines():
        if line.startswith("log "):
            level, msg = line[4:].split(" ", 1)
            logs.append((int(level), msg))
        else:
            c, s, a, q, ch = map(int, line.split())
            decisions[(c, s)] = (a, q, ch)
    assert len(decisions) == (0 if init_fails else len(queries))
    return logs, decisions


def source_line(logs: list[tuple[int, str]]) -> re.Match:
    found = [m for _, msg in logs if (m := SOURCE_LINE.search(msg))]
    assert len(found) == 1, logs  # once per communicator init
    return found[0]


def expected(table: Table, coll: int, nbytes: int, nodes: int, nranks: int) -> tuple[int, int, int]:
    """What the plugin does with every cost-table entry enabled: the Python reader's row, or NCCL's
    where no row covers the size or its row is marked as NCCL's choice (the plugin leaves it to NCCL)."""
    row = table.lookup(N.COLLECTIVES[coll], nbytes, nodes, nranks)
    if row is None or row.source == FILLED:
        return (-1, -1, 0)
    forced = (-1, -1) if row.algo == "default" else (N.ALGOS.index(row.algo), N.PROTOS.index(row.proto))
    return (*forced, max(row.channels, 0))


@pytest.fixture(scope="module")
def exported(tmp_path_factory) -> tuple[Table, str]:
    """The zero-shot table of a 2-node x 2-GPU job, its three default shapes, as written."""
    table = export_table(Simulator("h200-2x2-sock"), tune_conf=False)
    assert table.shapes() == [(2, 4), (1, 2), (2, 2)]
    path = table.write(tmp_path_factory.mktemp("exported"))["csv"]
    return Table.read(path), path.read_text()


def test_real_table_from_the_environment_every_shape_and_fingerprint(build, exported):
    """Each communicator shape applies its own rows and only those, exactly as ``Table.lookup``
    does, and the logged fingerprint, size and row count are Python's."""
    table, text = exported
    for nodes, nranks in table.shapes() + [(1, 4), (4, 8)]:  # the last two: no rows, NCCL decides
        logs, got = probe(build, nodes, nranks, {"NCCLRL_TUNER_TABLE_DATA": text})
        m = source_line(logs)
        assert m.group(1) == "NCCLRL_TUNER_TABLE_DATA" and int(m.group(2)) == len(text.encode())
        assert int(m.group(3)) == len(table.rows) and m.group(4) == fingerprint(text)
        loads = [r for r in table.for_shape(nodes, nranks).rows if r.source != FILLED]
        assert int(m.group(5)) == len(loads) and int(m.group(8)) == 0
        assert not [msg for level, msg in logs if level == 2]
        for (c, s), decision in got.items():
            assert decision == expected(table, c, s, nodes, nranks), (nodes, nranks, N.COLLECTIVES[c], s)
        if (nodes, nranks) in table.shapes():  # every size covered: a row forced explicitly, or left to NCCL
            for (c, s), d in got.items():       # because its row states NCCL's own choice
                row = table.lookup(N.COLLECTIVES[c], s, nodes, nranks)
                assert row is not None and ((d[0] >= 0 and d[2] >= 1) or row.source == FILLED)


def test_the_environment_wins_over_a_path_and_empty_falls_back(build, exported, tmp_path):
    table, text = exported
    other = PLUGIN / "tests" / "data" / "example_format.csv"  # rows for 1 node x 4 ranks
    logs, got = probe(build, 2, 4, {"NCCLRL_TUNER_TABLE_DATA": text, "NCCLRL_TUNER_TABLE": str(other),
                                    "NCCL_TUNER_CONFIG_FILE": str(other)})
    assert source_line(logs).group(1) == "NCCLRL_TUNER_TABLE_DATA"
    assert got[(N.ALLREDUCE, 1 << 20)] == expected(table, N.ALLREDUCE, 1 << 20, 2, 4)
    # set but empty: the path, fingerprinted over the file's bytes (a file needs its fingerprint stated)
    fp = {"NCCLRL_TUNER_TABLE_FINGERPRINT": fingerprint(other.read_bytes())}
    logs, got = probe(build, 1, 4, {"NCCLRL_TUNER_TABLE_DATA": "", "NCCLRL_TUNER_TABLE": str(other), **fp})
    m = source_line(logs)
    assert m.group(1) == str(other) and m.group(4) == fingerprint(other.read_bytes())
    assert int(m.group(2)) == len(other.read_bytes()) and int(m.group(5)) == 3
    assert got[(N.ALLREDUCE, 1 << 20)] == (N.RING, N.LL128, 24)
    # then NCCL_TUNER_CONFIG_FILE, then ./nccl_tuner.conf
    logs, _ = probe(build, 2, 4, {"NCCL_TUNER_CONFIG_FILE": str(other), **fp})
    assert source_line(logs).group(1) == str(other)
    (tmp_path / "nccl_tuner.conf").write_text(text)
    logs, got = probe(build, 1, 2, {"NCCLRL_TUNER_TABLE_FINGERPRINT": fingerprint(text)}, cwd=tmp_path)
    m = source_line(logs)
    assert m.group(1) == "nccl_tuner.conf" and m.group(4) == fingerprint(text)
    assert got[(N.ALLREDUCE, 8)] == expected(table, N.ALLREDUCE, 8, 1, 2)


UNCHECKED = re.compile(r"^table (.+) is a file and NCCLRL_TUNER_TABLE_FINGERPRINT is unset: .*; set "
                       r"NCCLRL_TUNER_TABLE_FINGERPRINT=([0-9a-f]{16}) \(these (\d+) bytes' fingerprint; .*\) on every "
                       r"rank, or =any to load files unchecked: (.+)$")


@pytest.mark.parametrize("source", ["NCCLRL_TUNER_TABLE", "NCCL_TUNER_CONFIG_FILE", "./nccl_tuner.conf"])
def test_a_file_without_a_fingerprint_is_refused_naming_the_fix(build, exported, tmp_path, source):
    """A table file read while NCCLRL_TUNER_TABLE_FINGERPRINT is unset (ranks could read different
    bytes unseen) is refused: one WARN naming the path and the fingerprint to set, which is Python's
    for the file; init fails (fallback: NCCL decides everything). Set to that fingerprint, or to
    ``any``, the same file loads; the same text in NCCLRL_TUNER_TABLE_DATA needs none."""
    table, text = exported
    path = tmp_path / ("nccl_tuner.conf" if source.startswith("./") else "nccl_tuner.csv")
    path.write_text(text)
    env = {} if source.startswith("./") else {source: str(path)}
    named = "nccl_tuner.conf" if source.startswith("./") else str(path)
    logs, _ = probe(build, 2, 4, env, cwd=tmp_path, init_fails=True)
    (msg,) = warns(logs)
    m = UNCHECKED.match(msg.removeprefix("TUNER/ncclrl: "))
    assert m, msg
    assert (m.group(1), m.group(2), int(m.group(3))) == (named, fingerprint(text), len(text.encode()))
    assert m.group(4).startswith("this communicator's init fails")
    assert not [x for _, x in logs if "table from" in x]
    logs, got = probe(build, 2, 4, {**env, "NCCLRL_TUNER_ON_ERROR": "fallback"}, cwd=tmp_path)
    (msg,) = warns(logs)
    assert UNCHECKED.match(msg.removeprefix("TUNER/ncclrl: ")).group(4) == "NCCL's own decisions everywhere"
    assert set(got.values()) == {(-1, -1, 0)}
    for value in (m.group(2), "any", "ANY"):  # the fix the WARN names, and the opt-out
        logs, got = probe(build, 2, 4, {**env, "NCCLRL_TUNER_TABLE_FINGERPRINT": value}, cwd=tmp_path)
        assert source_line(logs).group(1) == named and not warns(logs)
        assert got[(N.ALLREDUCE, 1 << 20)] == expected(table, N.ALLREDUCE, 1 << 20, 2, 4)
    logs, _ = probe(build, 2, 4, {**env, "NCCLRL_TUNER_TABLE_DATA": text}, cwd=tmp_path)
    assert source_line(logs).group(1) == "NCCLRL_TUNER_TABLE_DATA" and not warns(logs)


@pytest.mark.parametrize(("var", "value", "allowed"), [
    ("NCCLRL_TUNER_TABLE_FINGERPRINT", "anything", "is not 16 hex digits (the fingerprint the table's export prints, "
                                                   "also in nccl_tuner.manifest) or any"),
    ("NCCLRL_TUNER_ON_ERROR", "ignore", "is not fail or fallback"),
    ("NCCLRL_TUNER_REQUEST_LOG_MAX", "lots", "is not a whole number from 0 to 67108864; using 100000"),
])
def test_a_setting_outside_its_allowed_values_warns_naming_them(build, tmp_path, var, value, allowed):
    """Every static-mode setting with a fixed set of values: a value outside it is one WARN naming
    the variable, the value and what it may be (the fingerprint and the policy fail init; the request
    log's cap falls back to its default)."""
    env = {"NCCLRL_TUNER_TABLE_DATA": "allreduce,0,max,ring,simple,2,-1,-1\n", var: value}
    if var == "NCCLRL_TUNER_REQUEST_LOG_MAX":
        env["NCCLRL_TUNER_REQUEST_LOG"] = str(tmp_path / "req")
    logs, _ = probe(build, 1, 4, env, queries=[(4, 8)], init_fails=var != "NCCLRL_TUNER_REQUEST_LOG_MAX")
    (msg,) = warns(logs)
    assert msg.startswith(f"TUNER/ncclrl: {var}='{value}' {allowed}"), msg


def test_plugin_and_python_fingerprints_agree_on_every_shipped_table(build):
    for path in sorted((PLUGIN / "tests" / "data").glob("*.csv")):
        raw = path.read_bytes()
        logs, _ = probe(build, 1, 4, {"NCCLRL_TUNER_TABLE_DATA": raw.decode()}, queries=[(4, 8)])
        m = source_line(logs)
        assert (m.group(4), int(m.group(2))) == (fingerprint(raw), len(raw)), path.name
        assert m.group(4) == fingerprint(raw.decode())


def big_table(table: Table, text: str, min_bytes: int) -> str:
    """``text`` with rows for other communicator shapes appended until it is ``min_bytes`` long."""
    lines, k = [text.rstrip("\n")], 0
    while sum(len(x) + 1 for x in lines) < min_bytes:
        k += 1
        lines += [Row(r.collective, r.min_bytes, r.max_bytes, r.algo, r.proto, r.channels, nnodes=64 + k,
                      nranks=8 * (64 + k)).line() for r in table.rows]
    return "\n".join(lines) + "\n"


def test_a_table_over_100_kb_in_the_environment(build, exported, tmp_path):
    """Past 100 KB the table still loads from the environment, handed to a new program (under the
    kernel's 128 KiB limit on one variable) or set inside the process (1.5 MB here)."""
    table, text = exported
    for size, how in ((110_000, "exec"), (1_500_000, "in-process")):
        big = big_table(table, text, size)
        assert len(big) >= size
        if how == "exec":
            logs, got = probe(build, 1, 2, {"NCCLRL_TUNER_TABLE_DATA": big})
        else:
            data = tmp_path / "big.csv"
            data.write_text(big)
            logs, got = probe(build, 1, 2, {}, data_file=data)
        m = source_line(logs)
        assert m.group(1) == "NCCLRL_TUNER_TABLE_DATA" and int(m.group(2)) == len(big.encode())
        assert m.group(4) == fingerprint(big) and int(m.group(3)) == len(parse_example_rows(big))
        for (c, s), decision in got.items():
            assert decision == expected(table, c, s, 1, 2)


def test_a_table_over_the_plugins_limit_is_refused_whole(build, exported, tmp_path):
    """Over 16 MiB: one WARN and the init fails; with NCCLRL_TUNER_ON_ERROR=fallback, the WARN, no
    row applied (NCCL decides), init succeeds."""
    table, text = exported
    data = tmp_path / "huge.csv"
    data.write_text(text + ("#" * 79 + "\n") * ((17 << 20) // 80))
    head = f"TUNER/ncclrl: table from NCCLRL_TUNER_TABLE_DATA is larger than {16 << 20} bytes ({data.stat().st_size}): "
    logs, _ = probe(build, 2, 4, {}, data_file=data, init_fails=True)
    assert warns(logs) == [head + "this communicator's init fails (NCCLRL_TUNER_ON_ERROR=fallback keeps NCCL's own "
                           "decisions instead)"]
    logs, got = probe(build, 2, 4, {"NCCLRL_TUNER_ON_ERROR": "fallback"}, data_file=data)
    assert warns(logs) == [head + "NCCL's own decisions everywhere"]
    assert set(got.values()) == {(-1, -1, 0)}


# -- robustness: the locale, files that are not tables, big tables, overlaps, ABI v2, threads --------

def test_c_harness_under_other_locales(build, tmp_path):
    """The whole harness (names in upper case, numbers, every table) under a German locale (decimal
    comma) and a Turkish one (``tolower('I')`` is not ``'i'``): parsing never follows the locale."""
    if shutil.which("localedef") is None or not Path("/usr/share/i18n/locales/de_DE").exists():
        pytest.skip("no localedef or locale sources to build de_DE/tr_TR from")
    make(build, str(build / "harness"))
    locales = tmp_path / "locales"
    locales.mkdir()
    for name, src, charmap in (("de_DE.UTF-8", "de_DE", "UTF-8"), ("tr_TR.ISO-8859-9", "tr_TR", "ISO-8859-9")):
        subprocess.run(["localedef", "-i", src, "-f", charmap, str(locales / name)], capture_output=True,
                       timeout=120)
        assert (locales / name).exists(), name
        p = subprocess.run([str(build / "harness"), str(build / "libnccl-tuner-ncclrl.so"),
                            str(PLUGIN / "tests" / "data")], capture_output=True, text=True, timeout=120,
                           env={**os.environ, "LOCPATH": str(locales), "HARNESS_LOCALE": name})
        assert p.returncode == 0 and p.stdout.rstrip().endswith(" passed, 0 failed"), p.stdout + p.stderr
        assert f"locale {name}: decimal point ','" in p.stdout
        if name.startswith("tr_TR"):
            assert "tolower('I') = 0xfd" in p.stdout  # the trap is live, and the table still reads right


def warns(logs: list[tuple[int, str]]) -> list[str]:
    return [msg for level, msg in logs if level == 2]


@pytest.mark.parametrize("kind", ["nul", "fifo", "directory", "dev-zero"])
def test_files_that_are_not_tables_are_refused_quickly(build, tmp_path, kind):
    """A NUL byte, a FIFO with no writer, a directory, /dev/zero: one WARN naming the path, and init
    fails (NCCLRL_TUNER_ON_ERROR=fallback: NCCL decides everything), at once either way (a blocking
    read of the FIFO would hang NCCL's init; probe's timeout)."""
    path = {"nul": tmp_path / "t.csv", "fifo": tmp_path / "fifo.csv", "directory": tmp_path,
            "dev-zero": Path("/dev/zero")}[kind]
    if kind == "nul":
        path.write_bytes(b"allreduce,0,100,ring,ll,2,-1,-1\nallreduce,101,\x00200,ring,ll,2,-1,-1\n")
    if kind == "fifo":
        os.mkfifo(path)
    want = {"nul": "holds a NUL byte at offset 46 (line 2)", "fifo": "is a FIFO, not a regular file",
            "directory": "is a directory, not a regular file", "dev-zero": "is a character device, not a regular file"}
    t0 = time.monotonic()
    env = {"NCCLRL_TUNER_TABLE": str(path), "NCCLRL_TUNER_TABLE_FINGERPRINT": "any"}  # refused for what it is
    logs, _ = probe(build, 1, 4, env, init_fails=True)
    (msg,) = warns(logs)
    assert str(path) in msg and want[kind] in msg and "this communicator's init fails" in msg
    logs, got = probe(build, 1, 4, {**env, "NCCLRL_TUNER_ON_ERROR": "fallback"})
    assert time.monotonic() - t0 < 10
    (msg,) = warns(logs)
    assert str(path) in msg and want[kind] in msg and "NCCL's own decisions everywhere" in msg
    assert set(got.values()) == {(-1, -1, 0)}
    assert not [m for _, m in logs if "table from" in m]


def many_rows(n: int, shape: tuple[int, int] = (1, 4)) -> str:
    per = n // 5
    return "".join(f"{c},{i * 4096},{i * 4096 + 4095},{'ring' if i % 2 else 'tree'},{'simple' if i % 3 else 'll'},"
                   f"{1 + i % 24},{shape[0]},{shape[1]}\n" for c in N.COLLECTIVES for i in range(per))


def test_100000_rows_load_fast_and_whole(build, tmp_path):
    """100,000 rows (4.5 MB) from a file: every row loads, decisions from the first and last rows,
    and the load (init, in a fresh process) stays well under a second even on a loaded machine."""
    path = tmp_path / "big.csv"
    text = many_rows(100_000)
    path.write_text(text)
    queries = [(c, s) for c in range(5) for s in (0, 4095, 4096, 19_999 * 4096 + 4095, 20_000 * 4096)]
    t0 = time.monotonic()
    env = {"NCCLRL_TUNER_TABLE": str(path), "NCCLRL_TUNER_TABLE_FINGERPRINT": fingerprint(text)}
    logs, got = probe(build, 1, 4, env, queries=queries)
    assert time.monotonic() - t0 < 5
    m = source_line(logs)
    assert (int(m.group(3)), int(m.group(5)), int(m.group(8))) == (100_000, 100_000, 0) and not warns(logs)
    for c in range(5):
        assert got[(c, 0)] == got[(c, 4095)] == (N.TREE, N.LL, 1)
        assert got[(c, 4096)] == (N.RING, N.SIMPLE, 2)
        assert got[(c, 19_999 * 4096 + 4095)] == (N.RING, N.SIMPLE, 1 + 19_999 % 24)
        assert got[(c, 20_000 * 4096)] == (-1, -1, 0)


def test_bench_loads_100000_rows(build):
    out = make(build, "bench")
    (line,) = [x for x in out.splitlines() if x.startswith("table load, 100,000 rows")]
    assert "rows missing" not in line
    assert float(line.split(": ")[1].split(" ms")[0]) < 1000  # the goal, < 100 ms, is read off a quiet machine


def brute_force(rows: list[dict], nodes: int, nranks: int) -> dict[int, int | None]:
    """The overlap rule read literally, O(n^2): in file order, a row of this shape is rejected when
    it overlaps an accepted row of the same collective whose filters are compatible. line -> None
    (accepted) or the lines it overlaps."""
    accepted: list[dict] = []
    out: dict[int, int | None] = {}
    for r in rows:
        if r["nNodes"] not in (-1, nodes) or r["nRanks"] not in (-1, nranks):
            continue
        clash = [o["line"] for o in accepted if o["collective"] == r["collective"]
                 and (o["pipe"] == r["pipe"] or -1 in (o["pipe"], r["pipe"]))
                 and (o["reg"] == r["reg"] or -1 in (o["reg"], r["reg"]))
                 and r["min_bytes"] <= o["max_bytes"] and o["min_bytes"] <= r["max_bytes"]]
        out[r["line"]] = clash or None
        if not clash:
            accepted.append(r)
    return out


def overlapping_table(rng: random.Random, n: int) -> tuple[str, list[dict]]:
    rows, lines = [], []
    for i in range(n):
        lo = rng.randrange(0, 1000)
        r = {"line": i + 1, "collective": rng.choice(N.COLLECTIVES[3:]), "min_bytes": lo,
             "max_bytes": lo + rng.choice([0, 1, 5, 20, 100, 400]), "pipe": rng.choice([-1, -1, 1, 2, 4]),
             "reg": rng.choice([-1, 0, 1]), "nNodes": rng.choice([-1, 1, 2]), "nRanks": rng.choice([-1, 4, 8])}
        rows.append(r)
        lines.append(f"{r['collective']},{r['min_bytes']},{r['max_bytes']},ring,simple,{1 + i % 64},{r['nNodes']},"
                     f"{r['nRanks']},{r['pipe']},{r['reg']}")
    return "\n".join(lines) + "\n", rows


def test_overlap_check_matches_brute_force_on_random_tables(build):
    """The plugin's O(n log n) overlap check (sort, then prefix maxima) against the literal O(n^2)
    rule on random tables with every kind of filter, for several communicator shapes: the same rows
    rejected, each WARN naming a row it does overlap."""
    from ncclrl.costmodel.table import check_text, plugin_checker

    checker = plugin_checker(build)
    rng = random.Random(7)
    warn = re.compile(r":(\d+): field min_bytes: range \d+-\d+ of \w+ overlaps line (\d+); rejected")
    for trial in range(12):
        text, rows = overlapping_table(rng, rng.choice([20, 60, 200]))
        for nodes, nranks in ((1, 4), (2, 8), (2, 4)):
            want = brute_force(rows, nodes, nranks)
            logs, _ = probe(build, nodes, nranks, {"NCCLRL_TUNER_TABLE_DATA": text}, queries=[(4, 8)])
            got = {int(a): int(b) for a, b in (warn.search(m).groups() for m in warns(logs))}
            assert set(got) == {ln for ln, c in want.items() if c}, (trial, nodes, nranks)
            assert all(got[ln] in want[ln] for ln in got)
            m = source_line(logs)
            assert int(m.group(5)) == sum(c is None for c in want.values())
        # the checker (show, validate) runs the same code over every shape the table can meet
        res = check_text(text, checker)
        rejected = {v.line for v in res.rejected}
        for nodes, nranks in ((1, 4), (2, 8), (2, 4), (1, 8), (2, 99), (99, 4), (99, 99)):
            assert {ln for ln, c in brute_force(rows, nodes, nranks).items() if c} <= rejected
        assert rejected <= {ln for nodes in (1, 2, 99) for nranks in (4, 8, 99)
                            for ln, c in brute_force(rows, nodes, nranks).items() if c}


def test_the_checker_reports_what_the_plugin_loads(build, tmp_path):
    """``ncclrl show``/``validate`` read tables with the plugin's own code: on random tables with junk
    rows and on the fuzz seeds, the checker's accepted rows for a shape are what the plugin applies."""
    from ncclrl.costmodel.table import check_table, check_text, plugin_checker

    checker = plugin_checker(build)
    rng = random.Random(3)
    texts = [random_table(rng, 2, 8)[0] for _ in range(8)]
    texts += [p.read_text() for p in sorted((PLUGIN / "tests" / "data").glob("*.csv"))]
    for text in texts:
        res = check_text(text, checker)
        assert res.fingerprint == fingerprint(text) and not res.refused
        for nodes, nranks, loaded in res.shapes:
            if -1 in (nodes, nranks):
                continue
            logs, _ = probe(build, nodes, nranks, {"NCCLRL_TUNER_TABLE_DATA": text}, queries=[(4, 8)])
            m = source_line(logs)
            assert int(m.group(5)) == loaded and int(m.group(3)) == res.rows
        lines = text.splitlines()
        for v in res.accepted:  # the row as the plugin read it is the line's
            assert lines[v.line - 1].replace(" ", "").lower().startswith(f"{v.row[0]},{v.row[1]},")
    # the same refusals as the plugin for files that are not tables
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    assert "is a FIFO" in check_table(fifo, checker).refused
    assert "holds a NUL byte" in check_text(b"allreduce,0,1,ring,ll,1,-1,-1\n\x00", checker).refused


def test_show_prints_the_plugins_verdicts(build, tmp_path, capsys, monkeypatch):
    from ncclrl.runners.show import show

    monkeypatch.setenv("NCCLRL_PLUGIN_DIR", str(build))
    path = tmp_path / "nccl_tuner.csv"
    path.write_text("allreduce,0,1000,RING,LL,2,-1,-1\nallreduce,500,2000,tree,ll,2,-1,-1\nreduce,0,10,ring,LL256,1,-1,-1\n")
    assert show(str(path)) == 1
    out = capsys.readouterr().out
    assert "1 row loads, 2 rejected" in out and "line 2: field min_bytes" in out and "line 3: field protocol" in out
    assert "ring" in out and "tree" not in out.split("rejected")[-1].split("\n", 1)[1]
    path.write_text("allreduce,0,1000,ring,ll,2,-1,-1\n")
    assert show(str(path)) == 0


def test_validate_refuses_a_table_the_plugin_would_change(build, tmp_path, monkeypatch):
    from ncclrl.costmodel.errors import ConfigError
    from ncclrl.runners.validate import parse_args, run_validate

    monkeypatch.setenv("NCCLRL_PLUGIN_DIR", str(build))
    table = tmp_path / "t.csv"
    table.write_text("allreduce,0,max,ring,simple,2,-1,-1\nallreduce,0,10,tree,ll,2,-1,-1\n")
    args = parse_args([f"table={table}", "topology=h200-2x2-sock", "max_bytes=1M", f"store={tmp_path / 's.sqlite'}",
                       "measure=0"])
    with pytest.raises(ConfigError, match="rejects 1 row.*line 2: field min_bytes"):
        run_validate(args, out=io.StringIO())


def test_abi_v2_never_forces_what_that_nccl_cannot_run(build):
    """Covered case by case in the C harness (check_v2_refusals); here: it ran and passed."""
    out = make(build, "test")
    assert out.rstrip().endswith(" passed, 0 failed")
