"""Direct NCCL calls (runners/nccl_direct.py) against a fake libnccl that records what crossed
the ctypes boundary: the GPU path's declarations, checked without a GPU."""

from __future__ import annotations

import ctypes
import os
import subprocess
from pathlib import Path

import pytest
import torch

from ncclrl.costmodel import nccl as N
from ncclrl.envs.nccl_direct import NCCL_FLOAT32, NCCL_SUM, NCCL_UINT8, DirectComm, Nccl, NcclError, libnccl_path

FAKE = Path(__file__).parent / "fakes" / "fake_nccl.c"


@pytest.fixture(scope="module")
def nccl(tmp_path_factory) -> Nccl:
    so = tmp_path_factory.mktemp("fake-nccl") / "libnccl.so.2"
    cc = os.environ.get("CC", "cc")
    p = subprocess.run([cc, "-std=c11", "-shared", "-fPIC", "-O1", "-Wall", "-Werror", "-o", str(so), str(FAKE)],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    return Nccl(str(so))


def args_of(nccl: Nccl) -> list[int]:
    out = (ctypes.c_longlong * 10)()
    nccl.lib.fake_args(out)
    return list(out)


class Stream:  # what make_op reads of a torch.cuda.Stream
    cuda_stream = 0xBEEF00


def test_version_and_unique_id_by_value(nccl: Nccl) -> None:
    assert nccl.version() == "2.28.9"
    uid = nccl.unique_id()
    assert len(uid) == 128 and uid[:3] == bytes([1, 8, 15])
    comm = DirectComm(nccl, uid[::-1], rank=2, world=4)  # any 128 bytes reach NCCL intact, by value
    nccl.lib.fake_uid.restype = ctypes.POINTER(ctypes.c_ubyte * 128)
    assert bytes(nccl.lib.fake_uid().contents) == uid[::-1]
    assert args_of(nccl)[:2] == [4, 2]
    comm.async_error()
    comm.destroy()
    comm.destroy()  # twice is harmless


@pytest.mark.parametrize("coll, call, count, dtype, op, root", [
    (N.ALLREDUCE, "ncclAllReduce", 1024 // 4, NCCL_FLOAT32, NCCL_SUM, -1),
    (N.ALLGATHER, "ncclAllGather", 1024 // 4, NCCL_UINT8, -1, -1),
    (N.REDUCESCATTER, "ncclReduceScatter", 1024 // 4 // 4, NCCL_FLOAT32, NCCL_SUM, -1),
    (N.BROADCAST, "ncclBroadcast", 1024, NCCL_UINT8, -1, 0),
    (N.REDUCE, "ncclReduce", 1024 // 4, NCCL_FLOAT32, NCCL_SUM, 0),
])
def test_collective_arguments(nccl: Nccl, coll: int, call: str, count: int, dtype: int, op: int, root: int) -> None:
    comm = DirectComm(nccl, bytes(128), rank=0, world=4)
    fn = comm.make_op(torch, coll, 1024, "cpu", Stream())
    fn()
    nccl.lib.fake_call.restype = ctypes.c_char_p
    assert nccl.lib.fake_call().decode() == call
    a = args_of(nccl)
    assert a[2:6] == [count, dtype, op, root]
    send, recv = fn.buffers
    assert (a[6], a[7]) == (send.data_ptr(), recv.data_ptr())
    assert recv.numel() * recv.element_size() == (1024 // 4 if coll == N.REDUCESCATTER else 1024)
    assert a[8] == Stream.cuda_stream and a[9] == 1


def test_errors_name_the_call(nccl: Nccl) -> None:
    comm = DirectComm(nccl, bytes(128), rank=0, world=4)
    fn = comm.make_op(torch, N.ALLREDUCE, 64, "cpu", Stream())
    nccl.lib.fake_fail_next(4)
    with pytest.raises(NcclError, match="ncclAllReduce 64 B: NCCL error 4 .invalid argument."):
        fn()
    fn()  # the next call succeeds
    with pytest.raises(NcclError, match="ncclCommInitRank"):
        DirectComm(nccl, bytes(128), rank=4, world=4)
    with pytest.raises(NcclError, match="128 bytes"):
        DirectComm(nccl, bytes(16), rank=0, world=4)


def test_libnccl_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NCCLRL_LIBNCCL", raising=False)
    maps = tmp_path / "maps"
    maps.write_text("7f00-7f01 r-xp 0 08:01 1 /usr/lib/libc.so.6\n"
                    "7f02-7f03 r-xp 0 08:01 2 /venv/nvidia/nccl/lib/libnccl.so.2\n\n")
    assert libnccl_path(maps) == "/venv/nvidia/nccl/lib/libnccl.so.2"
    maps.write_text("7f00-7f01 r-xp 0 08:01 1 /usr/lib/libc.so.6\n")
    with pytest.raises(NcclError, match="NCCLRL_LIBNCCL"):
        libnccl_path(maps)
    monkeypatch.setenv("NCCLRL_LIBNCCL", "/opt/nccl/libnccl.so.2")
    assert libnccl_path(maps) == "/opt/nccl/libnccl.so.2"
