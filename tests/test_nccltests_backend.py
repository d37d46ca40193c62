"""The nccl-tests backend on CPU: a fake *_perf that prints REAL recorded output (chosen by the
configuration the plugin table asks for) and misbehaves on cue."""

from __future__ import annotations

import io
import os
import shutil
from pathlib import Path

import pytest

from ncclrl.costmodel.errors import ConfigError
from ncclrl.costmodel.space import Point
from ncclrl.envs.nccltests_backend import Launcher, NcclTestsBackend
from ncclrl.envs.store import Store
from ncclrl.runners.sweep import parse_args, run_sweep

FAKE = Path(__file__).parent / "fakes" / "fake_perf.py"


@pytest.fixture
def bindir(tmp_path, h200_data, monkeypatch):
    d = tmp_path / "bin"
    d.mkdir()
    for prog in ("all_reduce_perf", "all_gather_perf", "reduce_scatter_perf", "broadcast_perf", "reduce_perf"):
        shutil.copy(FAKE, d / prog)
        os.chmod(d / prog, 0o755)
    monkeypatch.setenv("FAKE_PERF_DATA", str(h200_data / "nccltests_allreduce"))
    plugin = tmp_path / "libnccl-tuner-ncclrl.so"
    plugin.write_bytes(b"")  # the fake does not load it
    return d, plugin


POINTS = [Point("allreduce", 8), Point("allreduce", 1 << 30), Point("allreduce", 1 << 30, "ring", "ll128", 8),
          Point("allreduce", 1 << 20, "tree", "ll", 0)]


def test_measures_the_recorded_times(bindir):
    d, plugin = bindir
    b = NcclTestsBackend(d, 4, plugin=plugin, timeout_s=30)
    res = b.measure(POINTS, samples=2)
    assert res[0] == [36.96, 36.96] and res[1] == [4528.45, 4528.45]  # all_reduce__default.txt
    assert res[2] == [10947.8, 10947.8]  # all_reduce__ring_LL128_c8.txt at 1 GiB
    assert res[3] == [29.18, 29.18]      # all_reduce__tree_LL.txt at 1 MiB
    assert b.nccl_version == "2.19.6" and not b.failures


@pytest.mark.parametrize("mode,needle", [("fail", "Connection closed"), ("warn", "out of memory"),
                                         ("wrong", "wrong elements"), ("truncate", "truncated")])
def test_faults_are_reported_per_point(bindir, monkeypatch, mode, needle):
    d, plugin = bindir
    monkeypatch.setenv("FAKE_PERF_MODE", mode)
    b = NcclTestsBackend(d, 4, plugin=plugin, timeout_s=30)
    res = b.measure(POINTS[:2], samples=1)
    assert res == [None, None] and all(needle in m for m in b.failures.values()), b.failures


def test_a_hanging_configuration_times_out_alone(bindir, monkeypatch):
    d, plugin = bindir
    monkeypatch.setenv("FAKE_PERF_HANG_ON", "tree_LL")
    b = NcclTestsBackend(d, 4, plugin=plugin, timeout_s=2)
    res = b.measure(POINTS, samples=2)
    assert res[3] is None and "timed out" in b.failures[3]
    assert res[0] is not None and res[2] is not None


def test_sweep_through_nccltests_into_the_store(bindir, tmp_path, monkeypatch):
    d, plugin = bindir
    monkeypatch.setattr("ncclrl.envs.live.PLUGIN", plugin)
    args = parse_args(["backend=nccl-tests", f"nccltests_dir={d}", "topology=h200-1x4", "collectives=allreduce",
                       "max_bytes=1M", "grid=full", f"store={tmp_path / 's.sqlite'}", "samples=2", "timeout_s=30"])
    out = io.StringIO()
    r = run_sweep(args, out)
    assert r["failed"] == 0 and r["measured"] > 0
    with Store(tmp_path / "s.sqlite") as s:
        assert s.count(backend="nccl-tests", status="ok") == r["measured"]
    assert "allreduce on h200-1x4" in out.getvalue()
    assert run_sweep(args, io.StringIO())["measured"] == 0  # resumes: nothing left to measure


def test_bad_configuration(tmp_path):
    with pytest.raises(ConfigError, match="nccltests.binary_dir"):
        NcclTestsBackend(tmp_path / "nope", 4)
    with pytest.raises(ConfigError, match="launcher"):
        Launcher.load("pbs")
    with pytest.raises(ConfigError, match="nccltests_dir"):
        parse_args(["backend=nccl-tests"])
    (tmp_path / "bin").mkdir()
    b = NcclTestsBackend(tmp_path / "bin", 4)
    with pytest.raises(ConfigError, match="missing or not executable"):
        b.measure([Point("allreduce", 8)], samples=1)


def test_launcher_templates():
    b = Launcher.load("mpirun")
    assert "{env_flags}" in b.template and b.gpus_per_proc == "1"
    assert Launcher.load("local").gpus_per_proc == "all"
