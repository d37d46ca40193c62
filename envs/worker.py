"""One rank of a measuring job: ``python -m ncclrl.envs.worker``, started by any launcher
(:mod:`ncclrl.envs.jobs`).

The rank learns who it is from its launcher's environment, its job from ``NCCLRL_JOB`` and the
table it forces from ``NCCLRL_TUNER_TABLE_DATA`` (the plugin reads the same variable). Before NCCL
makes a communicator, the ranks meet over a CPU (gloo) group and compare the table's fingerprint,
whether the plugin is there, and the world size: any difference stops the job with one line naming
the ranks, because ranks that decide differently hang NCCL. Then every point of the job is timed
(NCCL's default and forced configurations interleaved per size), the slowest rank's samples are
agreed over the CPU group, and rank 0 writes them as records at once, size by size, so a later
hang loses nothing measured before it.

Records go to standard output as ``NCCLRL|rank|kind|payload``: ``hello`` (host, GPU, driver,
CUDA, NCCL version, NCCL environment), ``item`` (the point being set up: names it if NCCL hangs
there), ``log``, ``result`` (one point's samples), ``error`` (why this rank stops), ``done``.

A watchdog ends the rank when its job has made no progress for ``timeout_s`` plus a grace, so no
rank outlives a job its driver gave up on, even on a node the driver cannot signal.

``device: cpu`` in the job runs the same path on CPUs with gloo standing in for NCCL (the timings
mean nothing); tests use it to exercise launchers, rendezvous and faults without a GPU, and only
there ``NCCLRL_FAKE_FAULT=hang|die|crawl:RANK:ITEM`` makes a rank hang, die or crawl at a point.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from datetime import timedelta

from ncclrl.costmodel.table import fingerprint
from ncclrl.envs.jobs.config import rank_gpu
from ncclrl.envs.jobs.rank import Out, join_job, run_worker
from ncclrl.envs.jobs.spec import TABLE_ENV

MAX_REPS = 50  # repetitions per sample: enough that an 8 B call's launch cost is amortized
EXIT_MISMATCH = 3


# what decides NCCL's algorithm, protocol and channels besides the table: ranks must agree on it
DECIDING = ("NCCL_ALGO", "NCCL_PROTO", "NCCL_MIN_NCHANNELS", "NCCL_MAX_NCHANNELS", "NCCL_MIN_CTAS", "NCCL_MAX_CTAS",
            "NCCL_NTHREADS", "NCCL_BUFFSIZE", "NCCL_NVLS_ENABLE", "NCCL_COLLNET_ENABLE", "NCCL_TUNER_PLUGIN",
            "NCCL_SOCKET_NTHREADS", "NCCL_NSOCKS_PERTHREAD", "NCCL_CROSS_NIC", "NCCL_P2P_LEVEL", "NCCL_NET_GDR_LEVEL")


def _read(path: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError:
        return b""


class ComputeLoad:
    """A compute load beside the collective being timed, on every rank: square matrix products
    (``n`` x ``n``, ``dtype``) on a stream of their own (GPU) or in a thread (CPU). Before each
    sample, :meth:`start` queues enough products to last about as long as the sample's calls
    (from the point's estimate); :meth:`stop` waits for them, then runs the same number of
    products alone, and returns the ratio of the two times: the compute's slowdown while NCCL ran
    beside it (1.0: none). Each sample has its own baseline, taken right after it, so clock and
    temperature drift cancel. The products may outlast the calls, so the slowdown is diluted where
    the collective takes less time than its share of products."""

    def __init__(self, torch, dev, cuda: bool, spec: dict) -> None:
        self.torch, self.cuda = torch, cuda
        self.n = int(spec.get("n", 4096))
        dtype = getattr(torch, spec.get("dtype", "bfloat16" if cuda else "float32"))
        self.a = torch.randn(self.n, self.n, device=dev, dtype=dtype)
        self.b = torch.randn(self.n, self.n, device=dev, dtype=dtype)
        self.c = torch.empty(self.n, self.n, device=dev, dtype=dtype)
        self.stream = torch.cuda.Stream() if cuda else None
        self._thread = None
        self.count = 0
        self._mm(3)
        self.alone_us = self._products_us(10) / 10  # sizes the batches; each sample has its own baseline

    def _mm(self, k: int) -> None:
        for _ in range(k):
            self.torch.mm(self.a, self.b, out=self.c)

    def _products_us(self, k: int) -> float:
        """``k`` products alone, in microseconds."""
        if self.cuda:
            s, e = self.torch.cuda.Event(enable_timing=True), self.torch.cuda.Event(enable_timing=True)
            with self.torch.cuda.stream(self.stream):
                s.record()
                self._mm(k)
                e.record()
            e.synchronize()
            return s.elapsed_time(e) * 1000.0
        t0 = time.perf_counter()
        self._mm(k)
        return (time.perf_counter() - t0) * 1e6

    def describe(self) -> str:
        dtype = str(self.a.dtype).removeprefix("torch.")
        return f"{self.n} x {self.n} {dtype} products, {self.alone_us:.1f} us each alone"

    def start(self, window_us: float) -> None:
        self.count = max(1, int(window_us / self.alone_us + 0.5))
        if self.cuda:
            self._s = self.torch.cuda.Event(enable_timing=True)
            self._e = self.torch.cuda.Event(enable_timing=True)
            with self.torch.cuda.stream(self.stream):
                self._s.record()
                self._mm(self.count)
                self._e.record()
            return
        self._t0 = time.perf_counter()
        self._thread = threading.Thread(target=self._mm, args=(self.count,), daemon=True)
        self._thread.start()

    def stop(self) -> float:
        if self.cuda:
            self._e.synchronize()
            loaded = self._s.elapsed_time(self._e) * 1000.0
        else:
            self._thread.join()
            loaded = (time.perf_counter() - self._t0) * 1e6
        return loaded / self._products_us(self.count)


def _gpu_facts(torch, gpu: int) -> dict:
    facts = {"gpu": "cpu", "cuda": torch.version.cuda or "", "driver": ""}
    if torch.cuda.is_available() and gpu < torch.cuda.device_count():
        facts["gpu"] = torch.cuda.get_device_name(gpu)
    try:
        with open("/proc/driver/nvidia/version") as f:
            first = f.readline()
        facts["driver"] = next((w for w in first.split() if w[:1].isdigit() and "." in w), "")
    except OSError:
        pass
    return facts


def _fault(device: str, rank: int, item: int) -> None:
    """``device: cpu`` only: ``NCCLRL_FAKE_FAULT=KIND:RANK:ITEM``; hang or die at a point, or
    (item -1, before the ranks meet) hold another ``table`` or no ``plugin``."""
    spec = os.environ.get("NCCLRL_FAKE_FAULT", "")
    if device != "cpu" or not spec:
        return
    kind, r, i = spec.split(":")
    if int(r) != rank or int(i) != item:
        return
    if kind == "table":
        os.environ[TABLE_ENV] = os.environ.get(TABLE_ENV, "") + "allreduce,0,7,ring,ll,1,-1,-1\n"
    if kind == "plugin":
        os.environ["NCCL_TUNER_PLUGIN"] = "/nonexistent/libnccl-tuner-ncclrl.so"
    if kind == "die":
        os._exit(9)
    if kind == "hang":
        time.sleep(10**6)


def _crawl(device: str, rank: int, item: int, op):
    """``device: cpu`` only: ``NCCLRL_FAKE_FAULT=crawl:RANK:ITEM`` makes every call of that point
    on that rank take ``NCCLRL_FAKE_CRAWL_S`` seconds more (a configuration far slower than NCCL's)."""
    spec = os.environ.get("NCCLRL_FAKE_FAULT", "")
    if device != "cpu" or not spec.startswith("crawl:") or spec.split(":")[1:] != [str(rank), str(item)]:
        return op
    delay = float(os.environ.get("NCCLRL_FAKE_CRAWL_S", "0.5"))

    def crawling() -> None:
        time.sleep(delay)
        op()

    return crawling


def main() -> int:  # noqa: C901 - one job, start to end, in the order it runs
    me = join_job()
    job, rank, world, local, out = me.job, me.rank, me.world, me.local, me.out
    device = job.get("device", "cuda")
    if job.get("mode") == "verify":  # one log of NCCL's decisions: rank 0's, on its standard output
        os.environ["NCCL_DEBUG"] = "INFO" if rank == 0 else "WARN"
        os.environ["NCCL_DEBUG_SUBSYS"] = "INIT,TUNING"
        os.environ.pop("NCCL_DEBUG_FILE", None)

    import torch
    import torch.distributed as dist

    from ncclrl.costmodel.nccl import COLL_INDEX
    from ncclrl.envs.live import make_collective, timing_label

    _fault(device, rank, -1)
    table = os.environ.get(TABLE_ENV, "")
    plugin = os.environ.get("NCCL_TUNER_PLUGIN", "")
    plugin_ok = bool(plugin) and (plugin == "none" or os.path.isfile(plugin))
    nccl = ".".join(map(str, torch.cuda.nccl.version())) if device == "cuda" and torch.cuda.is_available() else ""
    seen = torch.cuda.device_count() if torch.cuda.is_available() else 0
    gpu = rank_gpu(rank, local, seen, bool(job.get("emulate_nodes")), bool(job.get("share_gpu")))
    decides = {k: os.environ[k] for k in sorted(DECIDING) if k in os.environ}
    hello = {"host": socket.gethostname(), "pid": os.getpid(), "local_rank": local, "world": world,
             "table": fingerprint(table), "plugin": plugin if plugin_ok else f"missing: {plugin}",
             "plugin_bytes": fingerprint(_read(plugin)) if plugin_ok and plugin != "none" else "", "nccl": nccl,
             "decides": fingerprint(json.dumps(decides, sort_keys=True)),
             "nccl_env": {k: v for k, v in os.environ.items() if k.startswith("NCCL_") and k != "NCCL_TUNER_PLUGIN"},
             **_gpu_facts(torch, gpu)}
    out("hello", hello)

    dist.init_process_group("gloo", init_method="env://", rank=rank, world_size=world,
                            timeout=timedelta(seconds=float(job["timeout_s"]) + 60))
    everyone: list = [None] * world
    dist.all_gather_object(everyone, (hello["table"], hello["plugin"], world, hello["host"], hello["plugin_bytes"],
                                      hello["nccl"], hello["decides"]))
    problems = []
    for i, what in ((4, "plugin libraries (a stale build on some node?)"), (5, "NCCL versions"),
                    (6, f"settings of the NCCL variables that decide ({', '.join(sorted(DECIDING)[:4])}, ...)")):
        if len({e[i] for e in everyone}) > 1:
            hosts: dict = {}
            for e in everyone:
                hosts.setdefault(e[i], set()).add(e[3])
            problems.append(f"ranks run different {what}: " + "; ".join(
                f"{v or 'none'} on {', '.join(sorted(h)[:3])}" for v, h in hosts.items()))
    if len({e[0] for e in everyone}) > 1:
        by = {}
        for r, e in enumerate(everyone):
            by.setdefault(e[0], []).append(r)
        problems.append("ranks were handed different tables: " +
                        "; ".join(f"fingerprint {fp} on ranks {rs}" for fp, rs in by.items()))
    if any(e[1].startswith("missing") for e in everyone):
        bad = [f"rank {r} on {e[3]}" for r, e in enumerate(everyone) if e[1].startswith("missing")]
        problems.append(f"the tuner plugin ({plugin}) is missing on {', '.join(bad)}: build it at the same path on "
                        "every node (ncclrl plugin build), or those ranks decide alone and NCCL hangs")
    if world != int(job["nranks"]):
        problems.append(f"the job has {world} ranks, the topology {job['nranks']}")
    if problems:
        if rank == 0:
            out("error", "stopped before any collective: " + " | ".join(problems))
        dist.destroy_process_group()
        return EXIT_MISMATCH

    if device == "cuda":
        if gpu >= seen:
            out("error", f"rank {rank} (local rank {local}) needs GPU {gpu}; {hello['host']} has {seen} visible")
            return 2
        torch.cuda.set_device(gpu)
        dev = torch.device("cuda", gpu)
    else:
        dev = torch.device("cpu")
        torch.set_num_threads(1)  # gloo's stand-in ranks share this host's cores; more threads only contend
    if job.get("mode") == "verify":
        return verify(job, out, rank, world, dev, device)
    launch = job["launch"] if device == "cuda" else "torch"
    direct = stream = None
    if launch == "nccl":
        from ncclrl.envs.nccl_direct import DirectComm, Nccl

        nccl = Nccl()
        uid = [nccl.unique_id() if rank == 0 else b""]
        dist.broadcast_object_list(uid, src=0)
        stream = torch.cuda.Stream()
        direct = DirectComm(nccl, uid[0], rank, world)
        out("log", f"NCCL {nccl.version()} at {nccl.path}")
        version = nccl.version()
        group = None
    else:
        group = dist.new_group(backend="nccl") if device == "cuda" else dist.new_group(backend="gloo")
        version = ".".join(map(str, torch.cuda.nccl.version())) if device == "cuda" else "gloo"
    out("log", f"up: {len(job['items'])} items, {job['timing']} timing, {launch} calls, NCCL {version}")
    if rank == 0:
        out("version", version)

    def agree(values: list[float], op) -> list[float]:
        t = torch.tensor(values, dtype=torch.float64)
        dist.all_reduce(t, op=op)
        return t.tolist()

    def make_op(coll: str, nbytes: int):
        if direct is not None:
            return direct.make_op(torch, COLL_INDEX[coll], nbytes, dev, stream)
        return make_collective(dist, torch, COLL_INDEX[coll], nbytes, world, dev, group=group)

    cuda = device == "cuda"
    on = (stream if direct is not None else torch.cuda.current_stream()) if cuda else None

    def timed(fn, reps: int) -> float:
        """Microseconds per call of ``reps`` calls of ``fn``."""
        if not cuda:
            t0 = time.perf_counter()
            for _ in range(reps):
                fn()
            return (time.perf_counter() - t0) * 1e6 / reps
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record(on)
        for _ in range(reps):
            fn()
        end.record(on)
        end.synchronize()
        return start.elapsed_time(end) * 1000.0 / reps

    def replayer(g):
        if stream is None:
            return g.replay

        def replay() -> None:
            with torch.cuda.stream(stream):
                g.replay()

        return replay

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize()

    load = ComputeLoad(torch, dev, cuda, job["load"]) if job.get("load") else None
    if load is not None:
        out("log", f"compute load: {load.describe()}")
    items = job["items"]
    samples, budget_us = int(job["samples"]), float(job["budget_us"])
    too_slow = float(job.get("too_slow", 0) or 0)
    too_slow_min_us = float(job.get("too_slow_min_us", 0) or 0)
    groups: dict[tuple[str, int], list[int]] = {}
    for i, (coll, base, *_rest) in enumerate(items):
        groups.setdefault((coll, base), []).append(i)
    for idx in groups.values():  # NCCL's own choice first: the other points are held to its time
        idx.sort(key=lambda i: not _is_default(items[i]))
    # warm the process and the connections before the first point (4 bytes have no table row)
    warm = make_op("allreduce", 4)
    for _ in range(20):
        warm()
    sync()
    for (coll, base), idx in groups.items():  # dict order = item order, identical on every rank
        out("log", f"{coll} {base} B: {len(idx)} points")
        ops, ests = [], []
        for i in idx:
            out("item", str(i))
            _fault(device, rank, i)
            op = _crawl(device, rank, i, make_op(coll, items[i][2]))
            op()
            op()
            sync()
            ests.append(max(timed(op, 1), 1.0))
            ops.append(op)
            if rank == 0:  # the driver holds the next points' first calls to this time (too_slow)
                out("est", {"i": i, "us": round(ests[-1], 3), "d": int(_is_default(items[i]))})
        # every decision that changes how many calls a rank issues is agreed, never taken alone
        ests = agree(ests, dist.ReduceOp.MAX)
        ref = ests[0] if _is_default(items[idx[0]]) else None

        limit_us = max(too_slow * ref, too_slow_min_us) if too_slow and ref is not None else float("inf")
        suspects = [j for j in range(1, len(idx)) if ests[j] > limit_us]
        if suspects:  # one timed call can spike: timed twice more, the fastest of three counts
            again = agree([min(timed(ops[j], 1), timed(ops[j], 1)) for j in suspects], dist.ReduceOp.MAX)
            for j, e in zip(suspects, again, strict=True):
                ests[j] = min(ests[j], max(e, 1.0))
        abandoned = [bool(j) and ests[j] > limit_us for j in range(len(idx))]
        if rank == 0:
            for j in (j for j, x in enumerate(abandoned) if x):  # never timed further, never captured
                out("slow", {"i": idx[j], "us": round(ests[j], 3), "ref": round(ref, 3)})
        reps = [int(min(max(budget_us / e, 1), MAX_REPS)) for e in ests]
        graphs: list = [None] * len(idx)
        if cuda and job["timing"] == "graph":
            ok = []
            for j, op in enumerate(ops):
                if abandoned[j]:
                    ok.append(0.0)
                    continue
                try:
                    g = torch.cuda.CUDAGraph()
                    cap = stream if stream is not None else torch.cuda.Stream()
                    with torch.cuda.graph(g, stream=cap):
                        for _ in range(reps[j]):
                            op()
                    graphs[j] = g
                    ok.append(1.0)
                except Exception as e:  # noqa: BLE001 - eager timing for this point, on every rank
                    out("log", f"graph capture failed: {type(e).__name__}: {e}")
                    sync()
                    ok.append(0.0)
            ok = agree(ok, dist.ReduceOp.MIN)
            graphs = [g if k == 1.0 else None for g, k in zip(graphs, ok, strict=True)]
            for graph in graphs:
                if graph is not None:
                    graph.replay()  # the first replay uploads the graph
            g = graph = None
            sync()
        res = [[0.0] * samples for _ in idx]
        slow = [[0.0] * samples for _ in idx]  # the compute load's slowdown while each sample ran
        for k in range(samples):
            out("log", f"sample {k}")
            for j in range(len(idx)):
                if abandoned[j]:
                    continue
                if rank == 0:  # names the point if NCCL hangs while it is timed
                    out("item", str(idx[j]))
                if load is not None:
                    load.start(ests[j] * reps[j])
                if graphs[j] is not None:
                    res[j][k] = timed(replayer(graphs[j]), 1) / reps[j]
                else:
                    res[j][k] = timed(ops[j], reps[j])
                if load is not None:
                    slow[j][k] = load.stop()
        if direct is not None:
            direct.async_error()
        flat = agree([x for r in res for x in r], dist.ReduceOp.MAX)  # the slowest rank's samples
        if load is not None:
            slow_flat = agree([x for r in slow for x in r], dist.ReduceOp.MAX)  # the most slowed rank's
        if rank == 0:
            for j, i in enumerate(idx):
                if abandoned[j]:
                    continue
                mode = timing_label(launch, "graph" if graphs[j] is not None else "eager")
                rec = {"i": i, "s": [round(x, 4) for x in flat[j * samples:(j + 1) * samples]], "m": mode}
                if load is not None:
                    rec["g"] = [round(x, 4) for x in slow_flat[j * samples:(j + 1) * samples]]
                out("result", rec)
        del ops, graphs  # every CUDA graph that captured NCCL calls is freed before the next group
    sync()
    dist.barrier()
    # done, then exit without tearing NCCL down (run_worker's os._exit): a communicator destroyed
    # while anything still holds a graph of its calls can block, and the driver ends a rank that
    # said done and did not exit (JobOptions.exit_grace_s)
    out("done", "")
    return 0


def _is_default(item) -> bool:
    """Whether a job item is NCCL's own choice (its fourth field; older jobs: the first point of its size)."""
    return bool(item[3]) if len(item) > 3 else item[1] == item[2]


def verify(job: dict, out: Out, rank: int, world: int, dev, device: str) -> int:
    """``ncclrl plugin verify``'s job: one call per case on a communicator that loaded the table,
    between two marker broadcasts (NCCL logs each decision: rank 0 alone runs with
    ``NCCL_DEBUG=INFO``, to its standard output, which the launcher brings back); then the timed
    cases on that communicator and on a second one with no table, interleaved."""
    import numpy as np
    import torch
    import torch.distributed as dist

    from ncclrl.envs.live import make_collective

    backend = "nccl" if device == "cuda" else "gloo"
    tuned = dist.new_group(backend=backend)
    make_op = lambda c, n, g: make_collective(dist, torch, c, n, world, dev, group=g)  # noqa: E731
    make_op(4, int(job["marker_bytes"]), tuned)()  # Broadcast: where the verifier's calls start
    for case in job["cases"]:
        out("item", str(case["i"]))
        make_op(case["coll"], case["nbytes"], tuned)()
    make_op(4, int(job["end_marker_bytes"]), tuned)()
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    sync()
    timed = [c for c in job["cases"] if c.get("timed")]
    times: dict[int, tuple[float, float]] = {}
    if timed and int(job["iters"]):
        os.environ[TABLE_ENV] = "# no rows\n"  # the second communicator's plugin loads an empty table: NCCL decides
        plain = dist.new_group(backend=backend)
        dist.barrier()
        for c in timed:
            op_t, op_p = make_op(c["coll"], c["nbytes"], tuned), make_op(c["coll"], c["nbytes"], plain)
            reps = 20 if c["nbytes"] < (64 << 20) else 3
            op_t(), op_p()
            ta, tb = [], []
            for _ in range(int(job["iters"])):
                for op, acc in ((op_t, ta), (op_p, tb)):
                    sync()
                    t0 = time.perf_counter()
                    for _ in range(reps):
                        op()
                    sync()
                    acc.append((time.perf_counter() - t0) * 1e6 / reps)
            mine = torch.tensor([float(np.median(ta)), float(np.median(tb))], dtype=torch.float64)
            dist.all_reduce(mine, op=dist.ReduceOp.MAX)  # the slowest rank's, as a job feels it
            times[c["i"]] = (float(mine[0]), float(mine[1]))
    sync()
    dist.barrier()
    if rank == 0:  # one short record per case: a long line may be cut by a launcher
        for i, t in times.items():
            out("verify", {"i": i, "t": t})
    out("done", "")
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    run_worker(main)
