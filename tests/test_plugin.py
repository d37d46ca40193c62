"""The C tuner plugin: built here, driven by the C harness (plain and AddressSanitizer), by
libFuzzer, and from Python through ctypes against a reference on random tables."""

from __future__ import annotations

import ctypes
import os
import random
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from ncclrl.costmodel import nccl as N
from ncclrl.costmodel.table import lookup, parse_example_rows

PLUGIN = Path(__file__).resolve().parents[1] / "plugin"


def make(build: Path, *targets: str, **env: str) -> str:
    p = subprocess.run(["make", "--no-print-directory", "-C", str(PLUGIN), f"BUILD={build}", *targets],
                       capture_output=True, text=True, env={**os.environ, **env}, timeout=600)
    assert p.returncode == 0, p.stdout + p.stderr
    return p.stdout + p.stderr


@pytest.fixture(scope="module")
def build(tmp_path_factory) -> Path:
    b = tmp_path_factory.mktemp("plugin-build")
    make(b)
    return b


def test_only_versioned_structs_are_exported(build):
    out = subprocess.run(["nm", "-D", "--defined-only", str(build / "libnccl-tuner-ncclrl.so")], capture_output=True,
                         text=True, check=True).stdout
    names = sorted(line.split()[-1] for line in out.splitlines() if line.strip())
    assert names == [f"ncclTunerPlugin_v{v}" for v in range(2, 7)]


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
    out = make(build, "fuzz", FUZZ_SECONDS="10")
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
        monkeypatch.setenv("NCCLRL_TUNER_TABLE", str(path))
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
