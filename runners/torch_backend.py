"""Live NCCL measurements through long-lived PyTorch workers, one process per GPU.

Per-call decisions (algorithm, protocol, channels) are switched without restarting: each
configuration gets its own communicator, created with our tuner plugin reading a one-row-per-
collective table that forces it (tables are read at every communicator init); NCCL's default is a
communicator with no table. Per-process knobs (``NCCL_BUFFSIZE``, ``NCCL_MIN/MAX_NCHANNELS``,
socket threads and sockets per thread) are cached by NCCL per process, so a change of knobs means
new workers. Several nodes can be emulated on one host (``NCCL_HOSTID`` per node, sockets on
loopback).

Timing: each point's operation is captured ``reps`` times into a CUDA graph and replayed between
CUDA events (launch overhead out of the way, like nccl-tests ``-G``), or launched eagerly
(``timing="eager"``, like plain nccl-tests). Samples of all points of one request are interleaved,
so NCCL's default and the candidates see the same machine drift; each sample is the slowest rank's.

Only needs PyTorch with CUDA and numpy on the GPU machine.
"""

from __future__ import annotations

import contextlib
import os
import queue
import socket
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

import numpy as np

from runners.store import Point

REPO = Path(__file__).resolve().parent.parent
PLUGIN = REPO / "plugin" / "build" / "libnccl-tuner-ncclrl.so"
SAFE_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
# Connect every algorithm's channels at communicator init: lazy runtime connection of a parent
# communicator while child communicators exist hung in our first GPU runs (docs/live.md).
RUNTIME_ENV = {"NCCL_RUNTIME_CONNECT": "0"}
COLLS = ("broadcast", "reduce", "allgather", "reducescatter", "allreduce")


class WorkerError(RuntimeError):
    """A worker failed (NCCL error, dead rank) or did not answer in time."""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _table_for(key: tuple[str, str, int], path: Path) -> None:
    algo, proto, ch = key
    a, p = ("-1", "-1") if algo == "default" else (algo, proto)
    path.write_text("".join(f"{c},0,max,{a},{p},{ch if ch > 0 else -1},-1,-1\n" for c in COLLS))


def _worker(rank: int, world: int, port: int, nodes: int, env: dict, workdir: str, cmd_q, res_q) -> None:
    logf = open(Path(workdir) / f"rank{rank}.log", "a", buffering=1)  # noqa: SIM115 - lives as long as the worker

    def note(msg: str) -> None:
        logf.write(f"{time.strftime('%H:%M:%S')} {msg}\n")

    try:
        os.environ.update(env)
        os.environ["NCCLRL_TUNER_TABLE"] = "/nonexistent/ncclrl-default.csv"
        if nodes > 1:
            os.environ["NCCL_HOSTID"] = f"ncclrl-node{rank * nodes // world}"
            os.environ.setdefault("NCCL_SOCKET_IFNAME", "lo")
        import torch
        import torch.distributed as dist

        torch.cuda.set_device(rank)
        dev = torch.device("cuda", rank)
        note(f"init rank {rank}/{world} nodes {nodes}")
        # Without device_id, PyTorch creates each new group's communicator with ncclCommInitRank
        # instead of splitting the default one (NCCLRL_WORKERS_SPLIT=1 restores the split).
        bind = {"device_id": dev} if os.environ.get("NCCLRL_WORKERS_SPLIT") == "1" else {}
        dist.init_process_group("nccl", rank=rank, world_size=world, init_method=f"tcp://127.0.0.1:{port}", **bind)
        dist.barrier(device_ids=[rank])
        note("process group up")
        groups: dict[tuple[str, str, int], Any] = {("default", "default", 0): None}
        stream = torch.cuda.Stream()

        def group_for(key):
            if key not in groups:
                path = Path(workdir) / f"table-{key[0]}-{key[1]}-{key[2]}-rank{rank}.csv"
                _table_for(key, path)
                os.environ["NCCLRL_TUNER_TABLE"] = str(path)
                note(f"new communicator for {key}")
                g = dist.new_group(list(range(world)))
                dist.barrier(group=g, device_ids=[rank])  # creates the communicator now, with this table
                note("communicator up")
                os.environ["NCCLRL_TUNER_TABLE"] = "/nonexistent/ncclrl-default.csv"
                groups[key] = g
            return groups[key]

        def make_op(coll, nbytes, group):
            from costmodel.nccl import COLL_INDEX
            from runners.plugin_verify import _make_op

            return _make_op(dist, torch, COLL_INDEX[coll], nbytes, world, dev, group=group)

        res_q.put((rank, "ready", torch.cuda.nccl.version()))
        while True:
            cmd = cmd_q.get()
            if cmd is None:
                break
            items, samples, timing, budget_us = cmd
            note(f"request: {len(items)} points, {samples} samples, {timing}")
            ops, reps, graphs = [], [], []
            # all communicators first, then any traffic; in item order, identical on every rank
            # (a set's order depends on each process's hash seed: ranks would create groups in
            # different orders and NCCL would hang)
            for key in dict.fromkeys(tuple(k) for _, _, k in items):
                group_for(key)
            torch.cuda.synchronize()
            dist.barrier(device_ids=[rank])
            for coll, nbytes, key in items:
                note(f"prepare {coll} {nbytes} {key}")
                op = make_op(coll, nbytes, groups[tuple(key)])
                op()
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                for _ in range(3):
                    op()
                torch.cuda.synchronize()
                est = (time.perf_counter() - t0) / 3 * 1e6
                r = int(np.clip(budget_us / max(est, 1.0), 1, 50))
                ops.append(op)
                reps.append(r)
                g = None
                if timing == "graph":
                    try:
                        g = torch.cuda.CUDAGraph()
                        with torch.cuda.stream(stream):
                            op()
                        torch.cuda.synchronize()
                        with torch.cuda.graph(g, stream=stream):
                            for _ in range(r):
                                op()
                        g.replay()
                        torch.cuda.synchronize()
                    except Exception as e:  # noqa: BLE001 - fall back to eager timing for this point
                        note(f"graph capture failed ({type(e).__name__}: {e}); eager timing")
                        g = None
                        torch.cuda.synchronize()
                graphs.append(g)
                torch.cuda.synchronize()
                dist.barrier(device_ids=[rank])
            out = [[] for _ in items]
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            for _ in range(samples):
                for i in range(len(items)):
                    dist.barrier(device_ids=[rank])
                    start.record()
                    if graphs[i] is not None:
                        graphs[i].replay()
                    else:
                        for _ in range(reps[i]):
                            ops[i]()
                    end.record()
                    end.synchronize()
                    out[i].append(start.elapsed_time(end) * 1000.0 / reps[i])
            note("samples done")
            modes = ["graph" if g is not None else "eager" for g in graphs]
            del graphs
            res_q.put((rank, "result", (out, modes)))
        dist.destroy_process_group()
        res_q.put((rank, "bye", None))
    except Exception:  # report, never hang the controller
        note(traceback.format_exc(limit=4))
        res_q.put((rank, "error", traceback.format_exc(limit=4)))


class TorchWorkers:
    """A set of workers for one topology and one setting of the per-process knobs.

    :param nranks: processes (one per GPU)
    :param nodes: nodes to emulate on this host (1 = a plain single-node job)
    :param knobs: a :class:`Point` whose per-process fields set the environment
    :param timing: ``graph`` (CUDA graph replay) or ``eager``
    :param timeout_s: per request; a worker that does not answer is killed and reported
    """

    def __init__(self, nranks: int, nodes: int = 1, knobs: Point | None = None, timing: str = "graph",
                 timeout_s: float = 300.0, plugin: Path = PLUGIN, extra_env: dict | None = None,
                 log_dir: str | Path | None = None) -> None:
        if timing not in ("graph", "eager"):
            raise ValueError(f"timing: allowed graph, eager; got {timing!r}")
        if not Path(plugin).exists():
            raise FileNotFoundError(f"plugin not built: {plugin} (run `ncclrl plugin build`)")
        self.nranks, self.nodes, self.timing, self.timeout_s = nranks, nodes, timing, timeout_s
        self.knobs = knobs or Point("allreduce", 1)
        self._tmp = tempfile.TemporaryDirectory(prefix="ncclrl-workers-")
        self.log_dir = Path(log_dir) if log_dir else Path(self._tmp.name)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        env = dict(SAFE_ENV, **RUNTIME_ENV, NCCL_TUNER_PLUGIN=str(Path(plugin).resolve()), **self.knobs.env(),
                   **(extra_env or {}))
        import torch.multiprocessing as mp

        ctx = mp.get_context("spawn")
        self._res = ctx.Queue()
        self._cmds = [ctx.Queue() for _ in range(nranks)]
        port = _free_port()
        self._procs = [ctx.Process(target=_worker, args=(r, nranks, port, nodes, env, str(self.log_dir), self._cmds[r],
                                                         self._res), daemon=True) for r in range(nranks)]
        for p in self._procs:
            p.start()
        ready = self._collect("ready")
        self.nccl_version = ".".join(map(str, ready[0])) if isinstance(ready[0], tuple) else str(ready[0])

    def _collect(self, kind: str) -> list:
        got: dict[int, Any] = {}
        deadline = time.time() + self.timeout_s
        while len(got) < self.nranks:
            try:
                rank, what, payload = self._res.get(timeout=max(deadline - time.time(), 0.1))
            except queue.Empty:
                dead = [i for i, p in enumerate(self._procs) if not p.is_alive()]
                last = self._last_notes()
                self.close(force=True)
                raise WorkerError(f"no answer from ranks {sorted(set(range(self.nranks)) - set(got))} within "
                                  f"{self.timeout_s:.0f} s (dead: {dead}); workers killed; last: {last}") from None
            if what == "error":
                self.close(force=True)
                raise WorkerError(f"rank {rank} failed: {payload.strip().splitlines()[-1]}")
            if what == kind:
                got[rank] = payload
        return [got[r] for r in range(self.nranks)]

    def _last_notes(self) -> str:
        out = []
        for r in range(self.nranks):
            f = self.log_dir / f"rank{r}.log"
            lines = f.read_text().strip().splitlines() if f.exists() else []
            out.append(f"rank {r}: {lines[-1] if lines else '(nothing)'}")
        return "; ".join(out)

    def measure(self, points: list[Point], samples: int = 10, budget_us: float = 2000.0) -> list[list[float]]:
        """Per-call times (us) of each point, ``samples`` each, interleaved; slowest rank per sample."""
        for p in points:
            if p.knobs != self.knobs.knobs:
                raise ValueError("all points of a request must share the workers' per-process knobs")
        items = [(p.collective, int(p.nbytes), (p.algo, p.proto, int(p.channels))) for p in points]
        for q in self._cmds:
            q.put((items, samples, self.timing, budget_us))
        per_rank = self._collect("result")
        self.last_modes = per_rank[0][1]
        return np.max(np.array([r[0] for r in per_rank], dtype=float), axis=0).tolist()

    def close(self, force: bool = False) -> None:
        if not force:
            for q in self._cmds:
                with contextlib.suppress(Exception):  # a queue already broken
                    q.put(None)
            deadline = time.time() + 30
            for p in self._procs:
                p.join(timeout=max(deadline - time.time(), 0.1))
        for p in self._procs:
            if p.is_alive():
                p.kill()
        self._tmp.cleanup()

    def __enter__(self) -> TorchWorkers:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
