"""NCCL called directly from a PyTorch worker, for timing that Python does not dominate.

A ``torch.distributed`` collective costs tens of microseconds of host time per call (work objects,
events, stream syncs), more than an 8-byte AllReduce takes on the GPU: eager timing through it
measures Python, and captured graphs carry PyTorch's extra nodes. Here a worker calls the
``libnccl.so`` that PyTorch already loaded through ``ctypes``, on a communicator of its own, on a
PyTorch stream, with PyTorch tensors as buffers, the way nccl-tests calls NCCL: a call costs about
what ``ncclAllReduce`` itself costs on the host. Everything NCCL reads from the environment (the
tuner plugin and its table, per-process knobs, ``NCCL_HOSTID``) applies to this communicator as it
does to PyTorch's.

The declarations below are written from NCCL's public API (``nccl.h``): ``ncclResult_t`` and the
enums are ``int``; ``ncclUniqueId`` is 128 bytes passed by value; a communicator is a pointer.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Callable
from pathlib import Path

from ncclrl.costmodel import nccl as N

UNIQUE_ID_BYTES = 128
# ncclDataType_t and ncclRedOp_t values from nccl.h
NCCL_UINT8, NCCL_FLOAT32 = 1, 7
NCCL_SUM = 0


class NcclError(RuntimeError):
    """An NCCL call returned an error."""


class UniqueId(ctypes.Structure):
    _fields_ = [("internal", ctypes.c_ubyte * UNIQUE_ID_BYTES)]


def libnccl_path(maps: str | Path = "/proc/self/maps") -> str:
    """The NCCL library this process already loaded (PyTorch's), so that the direct calls and
    PyTorch share one NCCL; ``NCCLRL_LIBNCCL`` overrides it."""
    if os.environ.get("NCCLRL_LIBNCCL"):
        return os.environ["NCCLRL_LIBNCCL"]
    try:
        lines = Path(maps).read_text().splitlines()
    except OSError:
        lines = []
    for line in lines:
        path = line.split()[-1] if line.split() else ""
        if "/libnccl.so" in path:
            return path
    raise NcclError("no libnccl.so loaded in this process (import torch first, or set NCCLRL_LIBNCCL=<path>)")


class Nccl:
    """The few NCCL entry points a measuring worker needs, with argument types declared."""

    def __init__(self, path: str | None = None) -> None:
        self.path = path or libnccl_path()
        lib = ctypes.CDLL(self.path)
        vp, sz, i, comm = ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p
        sigs = {
            "ncclGetVersion": [ctypes.POINTER(i)],
            "ncclGetUniqueId": [ctypes.POINTER(UniqueId)],
            "ncclCommInitRank": [ctypes.POINTER(comm), i, UniqueId, i],
            "ncclCommDestroy": [comm],
            "ncclCommGetAsyncError": [comm, ctypes.POINTER(i)],
            "ncclAllReduce": [vp, vp, sz, i, i, comm, vp],
            "ncclAllGather": [vp, vp, sz, i, comm, vp],
            "ncclReduceScatter": [vp, vp, sz, i, i, comm, vp],
            "ncclBroadcast": [vp, vp, sz, i, i, comm, vp],
            "ncclReduce": [vp, vp, sz, i, i, i, comm, vp],
        }
        for name, argtypes in sigs.items():
            f = getattr(lib, name)
            f.argtypes, f.restype = argtypes, ctypes.c_int
        lib.ncclGetErrorString.argtypes, lib.ncclGetErrorString.restype = [ctypes.c_int], ctypes.c_char_p
        self.lib = lib

    def check(self, rc: int, what: str) -> None:
        if rc != 0:
            msg = self.lib.ncclGetErrorString(rc)
            raise NcclError(f"{what}: NCCL error {rc} ({msg.decode() if msg else '?'})")

    def version(self) -> str:
        """``major.minor.patch`` as ``torch.cuda.nccl.version()`` spells it."""
        v = ctypes.c_int()
        self.check(self.lib.ncclGetVersion(ctypes.byref(v)), "ncclGetVersion")
        code = v.value  # 2.28.9 -> 22809 (codes >= 2.9 are major*10000 + minor*100 + patch)
        return f"{code // 10000}.{code // 100 % 100}.{code % 100}"

    def unique_id(self) -> bytes:
        uid = UniqueId()
        self.check(self.lib.ncclGetUniqueId(ctypes.byref(uid)), "ncclGetUniqueId")
        return bytes(uid.internal)


class DirectComm:
    """One NCCL communicator of this rank, created on the current CUDA device from the unique id
    rank 0 made (every rank passes the same 128 bytes)."""

    def __init__(self, nccl: Nccl, uid: bytes, rank: int, world: int) -> None:
        if len(uid) != UNIQUE_ID_BYTES:
            raise NcclError(f"unique id must be {UNIQUE_ID_BYTES} bytes, got {len(uid)}")
        self.nccl, self.rank, self.world = nccl, rank, world
        u = UniqueId()
        ctypes.memmove(u.internal, uid, UNIQUE_ID_BYTES)
        self.comm = ctypes.c_void_p()
        nccl.check(nccl.lib.ncclCommInitRank(ctypes.byref(self.comm), world, u, rank), "ncclCommInitRank")

    def async_error(self) -> None:
        err = ctypes.c_int()
        self.nccl.check(self.nccl.lib.ncclCommGetAsyncError(self.comm, ctypes.byref(err)), "ncclCommGetAsyncError")
        self.nccl.check(err.value, "asynchronous")

    def make_op(self, torch, coll: int, nbytes: int, dev, stream) -> Callable[[], None]:
        """A no-argument call issuing collective ``coll`` of ``nbytes`` on ``stream`` (the buffers
        are allocated here, as ``ncclrl.envs.live.make_collective`` does for PyTorch's calls: uint8
        for AllGather/Broadcast, float32 sums otherwise)."""
        one = coll in (N.ALLGATHER, N.BROADCAST)
        dtype, nccl_type, esize = (torch.uint8, NCCL_UINT8, 1) if one else (torch.float32, NCCL_FLOAT32, 4)
        n = nbytes // esize
        lib, check, comm, s = self.nccl.lib, self.nccl.check, self.comm, ctypes.c_void_p(stream.cuda_stream)
        if coll == N.ALLGATHER:
            x, y = torch.ones(n // self.world, dtype=dtype, device=dev), torch.empty(n, dtype=dtype, device=dev)
            f, args = lib.ncclAllGather, (x.data_ptr(), y.data_ptr(), n // self.world, nccl_type, comm, s)
        elif coll == N.REDUCESCATTER:
            x, y = torch.ones(n, dtype=dtype, device=dev), torch.empty(n // self.world, dtype=dtype, device=dev)
            f, args = lib.ncclReduceScatter, (x.data_ptr(), y.data_ptr(), n // self.world, nccl_type, NCCL_SUM, comm, s)
        else:
            x = y = torch.ones(n, dtype=dtype, device=dev)
            if coll == N.ALLREDUCE:
                f, args = lib.ncclAllReduce, (x.data_ptr(), x.data_ptr(), n, nccl_type, NCCL_SUM, comm, s)
            elif coll == N.BROADCAST:
                f, args = lib.ncclBroadcast, (x.data_ptr(), x.data_ptr(), n, nccl_type, 0, comm, s)
            else:
                f, args = lib.ncclReduce, (x.data_ptr(), x.data_ptr(), n, nccl_type, NCCL_SUM, 0, comm, s)
        name = f.__name__
        keep = (x, y)  # the closure owns the buffers

        def op() -> None:
            rc = f(*args)
            if rc:
                check(rc, f"{name} {nbytes} B")

        op.buffers = keep  # type: ignore[attr-defined]
        return op

    def destroy(self) -> None:
        if self.comm:
            self.nccl.check(self.nccl.lib.ncclCommDestroy(self.comm), "ncclCommDestroy")
            self.comm = ctypes.c_void_p()
