"""Live NCCL measurements with ONE communicator per process: every configuration is selected by
our tuner plugin through a table that maps a distinct message size to it.

A request (all points of one per-process knob setting) becomes one table: point ``k`` of a size
``s`` runs at ``s + k * q`` bytes (``q`` = 16, the smallest step every collective can take on 4
ranks), and the table has a one-byte-wide row ``[s + k*q, s + k*q]`` forcing its configuration;
NCCL's default has no row. The shift (at most a few hundred bytes) is negligible next to the
sizes' latency floor. One short job per request (``torch.multiprocessing.spawn``, one process per
GPU), the pattern `ncclrl plugin verify` runs successfully on our 4 x H200 box: one communicator,
eager calls. Samples are interleaved across the points of one size, each sample the slowest rank.

Only needs PyTorch with CUDA and numpy on the GPU machine.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from pathlib import Path

import numpy as np

from ncclrl.costmodel.errors import ConfigError
from ncclrl.costmodel.nccl import COLL_INDEX
from ncclrl.costmodel.space import Point
from ncclrl.costmodel.table import format_row
from ncclrl.envs.backend import Backend
from ncclrl.envs.live import (
    LAUNCHES,
    SAFE_ENV,
    free_port,
    make_collective,
    plugin_library,
    require_gpus,
    timing_label,
)
from ncclrl.envs.nccl_direct import DirectComm, Nccl

QUANTUM = 16
# repetitions per sample (per captured graph): enough that an 8 B call's launch cost is amortized
MAX_REPS = 50


def shifted_sizes(points: list[Point], nranks: int) -> list[int]:
    """The size each point runs at: its size plus ``k * quantum`` for the k-th point of that size."""
    q = max(QUANTUM, 4 * nranks)
    seen: dict[tuple[str, int], int] = {}
    out = []
    for p in points:
        k = seen.get((p.collective, p.nbytes), 0)
        seen[(p.collective, p.nbytes)] = k + 1
        out.append(int(p.nbytes) + k * q)
    return out


def table_rows(points: list[Point], sizes: list[int]) -> str:
    rows = []
    for p, s in zip(points, sizes, strict=True):
        if p.is_default:
            continue
        rows.append(format_row(p.collective, s, s, p.algo, p.proto, p.channels))
    return "\n".join(rows) + "\n"


def _job(rank: int, world: int, port: int, nodes: int, env: dict, items: list, samples: int, budget_us: float,
         out_dir: str, timing: str = "eager", launch: str = "torch") -> None:
    os.environ.update(env)
    if nodes > 1:
        os.environ["NCCL_HOSTID"] = f"ncclrl-node{rank * nodes // world}"
        os.environ.setdefault("NCCL_SOCKET_IFNAME", "lo")
    import torch
    import torch.distributed as dist

    log = open(Path(out_dir) / f"rank{rank}.log", "a", buffering=1)  # noqa: SIM115
    log.write(f"{time.strftime('%H:%M:%S')} started\n")
    torch.cuda.set_device(rank)
    dev = torch.device("cuda", rank)
    stream = torch.cuda.Stream()
    direct = None
    if launch == "nccl":
        # a CPU (gloo) group for the rendezvous and agreements; the collectives go straight to NCCL

        dist.init_process_group("gloo", rank=rank, world_size=world, init_method=f"tcp://127.0.0.1:{port}")
        ctrl = None
        nccl = Nccl()
        uid = [nccl.unique_id() if rank == 0 else b""]
        dist.broadcast_object_list(uid, src=0)
        direct = DirectComm(nccl, uid[0], rank, world)
        log.write(f"{time.strftime('%H:%M:%S')} NCCL {nccl.version()} at {nccl.path}\n")
    else:
        dist.init_process_group("nccl", rank=rank, world_size=world, init_method=f"tcp://127.0.0.1:{port}",
                                device_id=dev)
        # Every decision that changes how many collectives a rank issues (repetitions, graph or eager)
        # is agreed over a CPU (gloo) group, never taken per rank: ranks that time a warm-up differently
        # and pick different repetition counts issue different numbers of calls, and NCCL hangs.
        ctrl = dist.new_group(backend="gloo")
    log.write(f"{time.strftime('%H:%M:%S')} up, {len(items)} items, {timing} timing, {launch} calls\n")

    def agree(values: list[float], op) -> list[float]:
        t = torch.tensor(values, dtype=torch.float64)
        dist.all_reduce(t, op=op, group=ctrl)
        return t.tolist()

    def make_op(coll: str, nbytes: int):
        if direct is not None:
            return direct.make_op(torch, COLL_INDEX[coll], nbytes, dev, stream)
        return make_collective(dist, torch, COLL_INDEX[coll], nbytes, world, dev)

    # direct calls run on `stream` and are timed there; PyTorch's on the current stream
    on = stream if direct is not None else torch.cuda.current_stream()
    results: list[list[float]] = [[] for _ in items]
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    groups: dict[tuple[str, int], list[int]] = {}
    for i, (coll, base, _size) in enumerate(items):
        groups.setdefault((coll, base), []).append(i)
    out_file = open(Path(out_dir) / f"result{rank}.jsonl", "a", buffering=1)  # noqa: SIM115
    # warm the process and the connections before the first point (a fresh job's first calls run
    # slow); 4 bytes have no table row, so NCCL decides
    warm = make_op("allreduce", 4)
    for _ in range(20):
        warm()
    torch.cuda.synchronize()
    for (coll, base), idx in groups.items():  # dict order = item order, identical on every rank
        log.write(f"{time.strftime('%H:%M:%S')} {coll} {base} B: {len(idx)} points\n")
        ops, ests = [], []
        for i in idx:
            log.write(f"{time.strftime('%H:%M:%S')} item {i}\n")  # names the point if NCCL hangs here
            op = make_op(coll, items[i][2])
            op()
            op()
            torch.cuda.synchronize()
            start.record(on)
            op()
            end.record(on)
            end.synchronize()
            ests.append(max(start.elapsed_time(end) * 1000.0, 1.0))
            ops.append(op)
        log.write(f"{time.strftime('%H:%M:%S')} warm, agreeing on repetitions\n")
        ests = agree(ests, dist.ReduceOp.MAX)
        reps = [int(np.clip(budget_us / e, 1, MAX_REPS)) for e in ests]
        graphs: list = [None] * len(idx)
        if timing == "graph":
            ok = []
            for j, op in enumerate(ops):
                try:
                    g = torch.cuda.CUDAGraph()
                    with torch.cuda.graph(g, stream=stream):
                        for _ in range(reps[j]):
                            op()
                    graphs[j] = g
                    ok.append(1.0)
                except Exception as e:  # noqa: BLE001 - eager timing for this point, on every rank
                    log.write(f"{time.strftime('%H:%M:%S')} graph capture failed: {type(e).__name__}: {e}\n")
                    torch.cuda.synchronize()
                    ok.append(0.0)
            ok = agree(ok, dist.ReduceOp.MIN)
            graphs = [g if k == 1.0 else None for g, k in zip(graphs, ok, strict=True)]
            for g in graphs:  # warm replay (first replay uploads the graph)
                if g is not None:
                    g.replay()
            torch.cuda.synchronize()
        log.write(f"{time.strftime('%H:%M:%S')} sampling\n")
        for k in range(samples):
            log.write(f"{time.strftime('%H:%M:%S')} sample {k}\n")  # progress: a hang is told apart sooner
            for j, i in enumerate(idx):
                if graphs[j] is not None:
                    start.record(stream)
                    with torch.cuda.stream(stream):
                        graphs[j].replay()
                    end.record(stream)
                else:
                    start.record(on)
                    for _ in range(reps[j]):
                        ops[j]()
                    end.record(on)
                end.synchronize()
                results[i].append(start.elapsed_time(end) * 1000.0 / reps[j])
        if direct is not None:
            direct.async_error()
        modes = [timing_label(launch, "graph" if g is not None else "eager") for g in graphs]
        del ops, graphs
        # written per size, so a later hang loses nothing measured before it
        out_file.write(json.dumps({"idx": idx, "samples": [results[i] for i in idx], "modes": modes}) + "\n")
    torch.cuda.synchronize()
    dist.barrier(group=ctrl)
    if direct is not None:
        direct.destroy()
    log.write(f"{time.strftime('%H:%M:%S')} done\n")
    dist.destroy_process_group()


def collect(out_dir: Path, nranks: int, n: int) -> tuple[list[list[float] | None], list[str]]:
    """Per point, the slowest rank's samples, from the groups every rank finished (else ``None``),
    and its timing mode (``graph``/``eager``) as rank 0 wrote it."""
    modes = ["eager"] * n
    f0 = out_dir / "result0.jsonl"
    if f0.exists():
        for line in f0.read_text().splitlines():
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                continue
            for i, m in zip(rec["idx"], rec.get("modes", ["eager"] * len(rec["idx"])), strict=True):
                modes[i] = m
    per_rank: list[dict[int, list[float]]] = []
    for r in range(nranks):
        f = out_dir / f"result{r}.jsonl"
        got: dict[int, list[float]] = {}
        if f.exists():
            for line in f.read_text().splitlines():
                try:
                    rec = json.loads(line)
                except json.JSONDecodeError:
                    continue  # a line cut by a kill
                got.update(zip(rec["idx"], rec["samples"], strict=True))
        per_rank.append(got)
    out: list[list[float] | None] = []
    for i in range(n):
        if all(i in g for g in per_rank):
            out.append(np.max(np.array([g[i] for g in per_rank], dtype=float), axis=0).tolist())
        else:
            out.append(None)
    return out, modes


def last_progress(out_dir: Path) -> float:
    """When any rank last wrote a log line or a result (a job that writes nothing is hung)."""
    times = [f.stat().st_mtime for f in list(out_dir.glob("rank*.log")) + list(out_dir.glob("result*.jsonl"))]
    return max(times, default=0.0)


def last_item(out_dir: Path, nranks: int) -> int | None:
    """The point the job was on when it stopped (the lowest 'item' any rank last logged)."""
    last = []
    for r in range(nranks):
        f = out_dir / f"rank{r}.log"
        items = [int(x.split()[-1]) for x in f.read_text().splitlines() if " item " in x] if f.exists() else []
        if items:
            last.append(items[-1])
    return min(last) if last else None


class TableWorkers(Backend):
    """Same interface as :class:`ncclrl.envs.live.TorchWorkers`; each ``measure`` is one job, so
    a sweep hands it every point of a knob setting at once (``whole_request``).

    :param timing: ``graph`` (each point's repetitions captured in a CUDA graph and replayed, like
        nccl-tests ``-G``) or ``eager`` (queued launches, like plain nccl-tests)
    :param timeout_s: a job that writes no progress (log line or result) for this long is hung
    :param table: measure under this exported table as-is (``ncclrl validate``); every point must
        then be NCCL's default (the table decides), none is forced
    :param launch: ``torch`` (``torch.distributed`` calls) or ``nccl`` (NCCL called directly, on a
        communicator of the worker's own: :mod:`ncclrl.envs.nccl_direct`; no Python overhead per call,
        stored with timing ``nccl-eager``/``nccl-graph``)
    """

    name = "torch"

    def __init__(self, nranks: int, nodes: int = 1, knobs: Point | None = None, timing: str = "eager",
                 timeout_s: float = 300.0, plugin: str | Path | None = None, log_dir: str | Path | None = None,
                 table: str | Path | None = None, launch: str = "torch") -> None:
        if timing not in ("graph", "eager"):
            raise ConfigError("timing", f"allowed: graph, eager; got {timing!r}")
        if launch not in LAUNCHES:
            raise ConfigError("launch", f"allowed: {', '.join(LAUNCHES)}; got {launch!r}")
        require_gpus(nranks)
        super().__init__()
        self.launch = launch
        if table is not None and not Path(table).is_file():
            raise ConfigError("table", f"no such file: {table}")
        self.timing = timing
        self.table = Path(table).resolve() if table is not None else None
        self.nranks, self.nodes, self.timeout_s = nranks, nodes, timeout_s
        self.knobs = knobs or Point("allreduce", 1)
        self.plugin = plugin_library(plugin)  # built on first use
        self.log_dir = Path(log_dir) if log_dir else None

    def measure(self, points: list[Point], samples: int = 7, budget_us: float = 1000.0) -> list[list[float] | None]:
        """Samples per point; ``None`` for points the job did not reach. A point NCCL hung on (or a
        rank failure) is named in ``failures`` ({index: message}); what was measured before is kept."""
        import torch
        import torch.multiprocessing as mp

        self.nccl_version = ".".join(map(str, torch.cuda.nccl.version()))
        self.failures: dict[int, str] = {}
        if self.table is not None and not all(p.is_default for p in points):
            raise ConfigError("points", "with a table only NCCL's default (what the table decides) can be measured")
        sizes = shifted_sizes(points, self.nranks)
        with tempfile.TemporaryDirectory(prefix="ncclrl-table-") as tmp:
            out_dir = Path(self.log_dir or tmp)
            out_dir.mkdir(parents=True, exist_ok=True)
            for f in list(out_dir.glob("result*.jsonl")) + list(out_dir.glob("rank*.log")):
                f.unlink()
            table = Path(tmp) / "table.csv"
            table.write_text(self.table.read_text() if self.table is not None else table_rows(points, sizes))
            env = dict(SAFE_ENV, NCCL_TUNER_PLUGIN=str(self.plugin), NCCLRL_TUNER_TABLE=str(table),
                       **self.knobs.env())
            items = [(p.collective, int(p.nbytes), s) for p, s in zip(points, sizes, strict=True)]
            ctx = mp.spawn(_job, args=(self.nranks, free_port(), self.nodes, env, items, samples, budget_us,
                                       str(out_dir), self.timing, self.launch), nprocs=self.nranks, join=False)
            started = time.time()
            error = None
            try:
                while not ctx.join(timeout=2):
                    if time.time() - max(started, last_progress(out_dir)) > self.timeout_s:
                        error = f"no progress for {self.timeout_s:.0f} s (NCCL hung?); workers killed"
                        break
            except mp.ProcessRaisedException as e:
                error = f"a rank failed: {str(e).strip().splitlines()[-1]}"
            except mp.ProcessExitedException as e:
                error = f"a rank died: {e}"
            for p in ctx.processes:
                if p.is_alive():
                    p.kill()
            out, self.last_modes = collect(out_dir, self.nranks, len(points))
            if error:
                stuck = last_item(out_dir, self.nranks)
                if stuck is not None and out[stuck] is None:
                    self.failures[stuck] = error
                elif not any(r is not None for r in out):
                    self.failures.update({i: error for i in range(len(points))})
        return out

    def close(self) -> None:
        pass
