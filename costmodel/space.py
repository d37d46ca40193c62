"""The search space: per-process knob settings, per-call configurations and the sizes measured."""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from ncclrl.costmodel import nccl as N
from ncclrl.costmodel.replica import default_decisions, eligible_mask
from ncclrl.costmodel.simulator import Configs
from ncclrl.costmodel.topology import Topology

KNOB_FIELDS = ("comm_channels", "buffsize_bytes", "socket_nthreads", "nsocks_perthread", "socket_inline_bytes")


@dataclass(frozen=True)
class Point:
    """One configuration of one collective at one size (per-process knobs included)."""

    collective: str
    nbytes: int
    algo: str = "default"
    proto: str = "default"
    channels: int = 0
    comm_channels: int = 0
    buffsize_bytes: int = 0
    socket_nthreads: int = 0
    nsocks_perthread: int = 0
    socket_inline_bytes: int = 0

    @property
    def knobs(self) -> tuple[int, int, int, int, int]:
        return (self.comm_channels, self.buffsize_bytes, self.socket_nthreads, self.nsocks_perthread,
                self.socket_inline_bytes)

    @property
    def is_default(self) -> bool:
        return self.algo == "default" and self.channels == 0

    def env(self) -> dict[str, str]:
        """NCCL environment for the per-process knobs."""
        e = {}
        if self.comm_channels:
            e["NCCL_MIN_NCHANNELS"] = e["NCCL_MAX_NCHANNELS"] = str(self.comm_channels)
        if self.buffsize_bytes:
            e["NCCL_BUFFSIZE"] = str(self.buffsize_bytes)
        if self.socket_nthreads:
            e["NCCL_SOCKET_NTHREADS"] = str(self.socket_nthreads)
        if self.nsocks_perthread:
            e["NCCL_NSOCKS_PERTHREAD"] = str(self.nsocks_perthread)
        if self.socket_inline_bytes:
            e["NCCL_SOCKET_INLINE"] = str(self.socket_inline_bytes)
        return e


# NCCL_SOCKET_INLINE in the knob grid: 256 KiB measured best of 64/256 KiB on h200-2x2-sock
# (data/h200x4-2026-11-21/probe_socket_inline.py; NCCL's default is 128 B)
SOCKET_INLINE_BYTES = 256 << 10


def knob_grid(topo: Topology, grid: str) -> list[Point]:
    """Per-process knob settings: NCCL's defaults, and for ``full`` the ones that matter there
    (socket threads x sockets, channel counts and the inline size on socket networks; channels
    elsewhere)."""
    base = [Point("allreduce", 1)]
    if grid == "default":
        return base
    if topo.nodes > 1 and topo.net.kind == "socket":
        for t, s, c in ((2, 4, 4), (2, 4, 0), (4, 4, 4), (2, 2, 4), (4, 4, 0), (2, 2, 0)):
            base.append(Point("allreduce", 1, socket_nthreads=t, nsocks_perthread=s, comm_channels=c))
        # and each of them with NCCL_SOCKET_INLINE raised: steps up to it skip the helper threads
        base += [replace(k, socket_inline_bytes=SOCKET_INLINE_BYTES) for k in list(base)]
    else:
        base.append(Point("allreduce", 1, comm_channels=min(2 * topo.nccl.channels, N.MAX_CHANNELS)))
    return base


def call_configs(topo: Topology, coll: int, knobs: Point, grid: str) -> list[tuple[str, str, int]]:
    """Per-call (algorithm, protocol, channels) to try: every protocol of every algorithm NCCL can
    run for the collective, at NCCL's channel count and at 1 and the communicator's maximum; and,
    when the setting raises the communicator's channels above NCCL's count, NCCL's own algorithm
    and protocol at NCCL's count (``("default", "default", count)``, last). A raised count that
    wins at large sizes can lose at mid sizes, where NCCL itself would use all of them (on the
    h200-2x2-sock, NCCL's own choice under 4 channels ran 0.78-0.91x at 1-4 MiB; docs/results/live.md)."""
    if grid == "default":
        return []
    comm = knobs.comm_channels or topo.nccl.channels
    m = eligible_mask(topo)[coll]
    out: list[tuple[str, str, int]] = []
    for a in range(N.NUM_ALGOS):
        for p in range(N.NUM_PROTOS):
            if m[a, p]:
                for ch in sorted({0, 1, comm}):
                    out.append((N.ALGOS[a], N.PROTOS[p], ch))
    if comm > topo.nccl.channels:
        out.append(("default", "default", topo.nccl.channels))
    return out


def size_grid(lo: int, hi: int, nranks: int, coll: int) -> list[int]:
    q = (1 if coll in (N.ALLGATHER, N.BROADCAST) else 4) * (nranks if coll in (N.ALLGATHER, N.REDUCESCATTER) else 1)
    sizes, s = [], 1
    while s <= hi:
        if s >= lo:
            v = -(-s // q) * q
            if v <= hi and v not in sizes:
                sizes.append(v)
        s *= 2
    return sizes


Key = tuple[str, str, int]  # (algo, proto, channels); DEFAULT = NCCL's own per-call choice


DEFAULT: Key = ("default", "default", 0)


def point_configs(topo: Topology, k: Point, coll: int, sizes: np.ndarray, keys: list[Key]) -> Configs:
    """Simulator configurations of (size, key) pairs under knob setting ``k``."""
    sizes = np.asarray(sizes, dtype=np.int64)
    algo = np.empty(sizes.size, np.int64)
    proto = np.empty(sizes.size, np.int64)
    ch = np.zeros(sizes.size, np.int64)
    # NCCL's own algorithm and protocol (at its own per-call channel count, or at the key's)
    is_def = np.array([key[0] == "default" for key in keys])
    if is_def.any():
        d = default_decisions(topo, coll, sizes[is_def], comm_channels=k.comm_channels)
        algo[is_def], proto[is_def] = d.algo, d.proto
    for i, key in enumerate(keys):
        if key[0] == "default":
            ch[i] = key[2]
        else:
            algo[i], proto[i], ch[i] = N.ALGOS.index(key[0]), N.PROTOS.index(key[1]), key[2]
    return Configs.make(coll, sizes, algo, proto, ch, k.comm_channels, k.buffsize_bytes, k.socket_nthreads,
                        k.nsocks_perthread, k.socket_inline_bytes)
