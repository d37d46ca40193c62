"""Live NCCL measurements with ONE communicator per job: every configuration is selected by
our tuner plugin through a table that maps a distinct message size to it.

A request (all points of one per-process knob setting) becomes one table: point ``k`` of a size
``s`` runs at ``s + k * q`` bytes (``q`` = 16, the smallest step every collective can take on 4
ranks, more for AllGather/ReduceScatter on many ranks), skipping sizes other points run at, and the
table has a one-byte-wide row forcing its configuration; NCCL's default has no row and runs at the
size itself. Below a few KiB the shift is large relative to the size (h200-1x4's full grid, 10
points per size from 8 B to 256 MiB: points run up to 560 B above their size; 14% at 1 KiB,
3.5% at 4 KiB, under 1% from 16 KiB), where every size sits on NCCL's latency floor. One short
job per request, one process per GPU on every node
(:mod:`ncclrl.envs.worker`), started by the launcher of the user's cluster
(:mod:`ncclrl.envs.jobs`: local, torchrun, srun, mpirun). The table travels to every rank in an
environment variable, and the ranks check they hold the same one before NCCL starts.

Only needs PyTorch with CUDA and numpy on the GPU machines.
"""

from __future__ import annotations

import math
import time
from pathlib import Path

from ncclrl.costmodel.errors import ConfigError, JobError
from ncclrl.costmodel.space import Point
from ncclrl.costmodel.table import format_row
from ncclrl.envs.backend import Backend
from ncclrl.envs.jobs import (
    JOB_ENV,
    MAX_ENV_BYTES,
    TABLE_ENV,
    JobOptions,
    JobSpec,
    LaunchConfig,
    base_env,
    encode,
    job_folder,
    payload_json,
    run_job,
    user_env,
)
from ncclrl.envs.live import LAUNCHES, SAFE_ENV, TIMEOUT, TOO_SLOW_WORDS, plugin_library, require_gpus

QUANTUM = 16


def shifted_sizes(points: list[Point], nranks: int) -> list[int]:
    """The size each point runs at: the first point of a size at that size, each further one at the
    next multiple of the quantum above it that no other point of the collective runs at. Every
    point's size is distinct, so no one-byte row of the job's table covers another point (a
    forced row on another size's NCCL default would run that default forced)."""
    # whole elements; divisible over the ranks where the buffer is split (AllGather, ReduceScatter)
    step = {c: math.lcm(QUANTUM, 4 * nranks) if c in ("allgather", "reducescatter") else QUANTUM
            for c in {p.collective for p in points}}
    used: dict[str, set[int]] = {}
    for p in points:
        used.setdefault(p.collective, set()).add(int(p.nbytes))
    first: set[tuple[str, int]] = set()
    out = []
    for p in points:
        s = int(p.nbytes)
        if (p.collective, s) not in first:
            first.add((p.collective, s))
            out.append(s)
            continue
        q = step[p.collective]
        x = s + q
        while x in used[p.collective]:
            x += q
        used[p.collective].add(x)
        out.append(x)
    return out


def table_rows(points: list[Point], sizes: list[int]) -> str:
    rows = []
    for p, s in zip(points, sizes, strict=True):
        if p.is_default:
            continue
        rows.append(format_row(p.collective, s, s, p.algo, p.proto, p.channels))
    return "\n".join(rows) + "\n"


# a point whose first calls take this many times NCCL's own choice at its size (measured in the same
# job) is abandoned for the job and stored as too slow; 0: never
TOO_SLOW = 10.0
# a point whose calls take less than this is never abandoned, whatever the factor: it costs little
TOO_SLOW_MIN_US = 5000.0
# the first calls of any point may take this long before the driver holds them to NCCL's time (a first
# use of an algorithm sets up its connections)
TOO_SLOW_FLOOR_S = 10.0
# calls of a point before its estimate is known: two warm-ups and one timed
SETUP_CALLS = 3
LOADS = ("none", "gemm")  # what runs beside the collective while it is timed


class TableWorkers(Backend):
    """PyTorch workers (:mod:`ncclrl.envs.worker`), one process per GPU on every node, started by
    the job's launcher (:mod:`ncclrl.envs.jobs`). Each ``measure`` is one job, so a sweep hands
    it every point of a knob setting at once (``whole_request``).

    :param nranks: the job's ranks (the topology's)
    :param nodes: the job's nodes; ranks are spread evenly, ``nranks // nodes`` per node
    :param knobs: the per-process knob setting every point of a job runs under
    :param timing: ``graph`` (each point's repetitions captured in a CUDA graph and replayed, like
        nccl-tests ``-G``) or ``eager`` (queued launches, like plain nccl-tests)
    :param timeout_s: a job that writes no progress for this long is ended, its point stored as timed out
    :param plugin: our tuner plugin's path, the same on every node (default: ``ncclrl plugin build``'s)
    :param log_dir: keep the job's records and the launcher's output here (default: a temporary folder)
    :param table: measure under this exported table as-is (``ncclrl validate``); every point must
        then be NCCL's default (the table decides), none is forced
    :param launch: ``torch`` (``torch.distributed`` calls) or ``nccl`` (NCCL called directly, on a
        communicator of the worker's own: :mod:`ncclrl.envs.nccl_direct`; no Python overhead per call,
        stored with timing ``nccl-eager``/``nccl-graph``)
    :param launcher: how the processes start (:class:`ncclrl.envs.jobs.LaunchConfig`; default local)
    :param nvls: ``as-is`` (NCCL's NVLink SHARP as the user's environment has it) or ``off``
    :param device: ``cuda``, or ``cpu`` (gloo stands in for NCCL: the launch path without a GPU)
    :param load: ``none``, or ``gemm``: every sample runs beside a compute load on each rank
        (:class:`ncclrl.envs.worker.ComputeLoad`), and the load's slowdown is kept per sample
        (``last_slowdowns``)
    :param load_n: the load's square matrix size (``n`` x ``n`` products, bfloat16 on GPUs)
    """

    name = "torch"

    def __init__(self, nranks: int, nodes: int = 1, knobs: Point | None = None, timing: str = "eager",
                 timeout_s: float = 300.0, plugin: str | Path | None = None, log_dir: str | Path | None = None,
                 table: str | Path | None = None, launch: str = "torch", launcher: LaunchConfig | None = None,
                 nvls: str = "as-is", device: str = "cuda", load: str = "none", load_n: int = 4096,
                 too_slow: float = TOO_SLOW, too_slow_floor_s: float = TOO_SLOW_FLOOR_S) -> None:
        if timing not in ("graph", "eager"):
            raise ConfigError("timing", f"allowed: graph, eager; got {timing!r}")
        if launch not in LAUNCHES:
            raise ConfigError("launch", f"allowed: {', '.join(LAUNCHES)}; got {launch!r}")
        if nvls not in NVLS:
            raise ConfigError("nvls", f"allowed: {', '.join(NVLS)}; got {nvls!r}")
        if device not in ("cuda", "cpu"):
            raise ConfigError("device", f"allowed: cuda, cpu; got {device!r}")
        if load not in LOADS:
            raise ConfigError("load", f"allowed: {', '.join(LOADS)}; got {load!r}")
        if not 16 <= int(load_n) <= 65536:
            raise ConfigError("load_n", f"allowed: 16 to 65536; got {load_n!r}")
        if not (too_slow == 0 or too_slow > 1):
            raise ConfigError("too_slow", f"allowed: 0 (off) or a factor > 1; got {too_slow!r}")
        if nodes < 1 or nranks % nodes:
            raise ConfigError("topology", f"{nranks} ranks do not spread evenly over {nodes} nodes")
        self.launcher = LaunchConfig.of(launcher)
        if self.launcher.kind == "local" and device == "cuda":
            require_gpus(self.launcher.gpus_needed(nranks))
        super().__init__()
        self.launch, self.timing, self.nvls, self.device = launch, timing, nvls, device
        self.load, self.load_n = load, int(load_n)
        self.last_slowdowns: list[list[float] | None] = []
        if table is not None and not Path(table).is_file():
            raise ConfigError("table", f"no such file: {table}")
        self.table = Path(table).resolve() if table is not None else None
        self.nranks, self.nodes, self.timeout_s = nranks, nodes, timeout_s
        self.knobs = knobs or Point("allreduce", 1)
        self.plugin = plugin_library(plugin)  # built on first use
        self.log_dir = Path(log_dir) if log_dir else None
        self.provenance: dict = {}
        self.too_slow, self.too_slow_floor_s = float(too_slow), float(too_slow_floor_s)

    def job_env(self, points: list[Point], sizes: list[int], samples: int, budget_us: float) -> dict[str, str]:
        """What every rank of the job is handed: the job, the table it forces, the plugin, the knobs."""
        text = self.table.read_text() if self.table is not None else table_rows(points, sizes)
        if len(text.encode()) > MAX_ENV_BYTES:
            raise ConfigError("table", f"{len(text.encode())} bytes: more than one environment variable holds "
                              f"({MAX_ENV_BYTES}); split the job")
        job = {"items": [(p.collective, int(p.nbytes), s, int(p.is_default and not p.channels))
                         for p, s in zip(points, sizes, strict=True)], "too_slow": self.too_slow,
               "too_slow_min_us": TOO_SLOW_MIN_US,
               "samples": samples, "budget_us": budget_us, "timing": self.timing, "launch": self.launch,
               "device": self.device, "timeout_s": self.timeout_s, "nranks": self.nranks, "kind": self.launcher.kind,
               "gpus_per_node": self.nranks // self.nodes, "emulate_nodes": self.launcher.emulated and self.nodes > 1,
               "share_gpu": self.launcher.share_gpu,
               "load": {"kind": self.load, "n": self.load_n} if self.load != "none" else None}
        word = encode(job)
        if len(word) > MAX_ENV_BYTES:
            raise ConfigError("points", f"{len(points)} points make a job of {len(word)} bytes, more than one "
                              f"environment variable holds ({MAX_ENV_BYTES}); measure fewer sizes or collectives")
        # the user's NCCL (and ncclrl) environment reaches every rank, whatever the launcher forwards
        env = user_env()
        env.update({JOB_ENV: word, TABLE_ENV: text, NCCL_TUNER_PLUGIN: str(self.plugin), **self.knobs.env()})
        if self.nvls == "off":
            env.update(SAFE_ENV)
        return env

    def measure(self, points: list[Point], samples: int = 7, budget_us: float = 1000.0) -> list[list[float] | None]:
        """Samples per point; ``None`` for points the job did not reach. A point the job stopped at
        (a timeout, a rank that failed) is named in ``failures`` ({index: message}); what was
        measured before is kept. A job whose ranks disagree (tables, plugin, rank count) raises
        :class:`ConfigError` before any collective."""
        self.failures = {}
        self.terminated = False
        if self.table is not None and not all(p.is_default for p in points):
            raise ConfigError("points", "with a table only NCCL's default (what the table decides) can be measured")
        sizes = shifted_sizes(points, self.nranks)
        spec = JobSpec(self.launcher, self.nodes, self.nranks // self.nodes, self.job_env(points, sizes, samples,
                       budget_us), options=JobOptions(timeout_s=self.timeout_s, grace_s=self.launcher.grace_s))
        with job_folder("job") as tmp:
            out_dir = Path(self.log_dir or tmp)
            out_dir.mkdir(parents=True, exist_ok=True)
            seen = JobRecords(self.nranks, len(points), out_dir, self.launcher.grace_s, self.too_slow,
                              self.too_slow_floor_s, [(p.collective, int(p.nbytes)) for p in points])
            cmds = spec.commands()  # once: the command lines that ran are the ones recorded (one rendezvous port)
            try:
                end = run_job(cmds, base_env(), out_dir, spec.options, seen)
            finally:
                seen.close()
        job = end.job
        self.terminated = end.interrupted  # the signal's number: what the job finished is returned, then ncclrl ends
        self.last_wall_s = end.wall_s
        self.nccl_version = seen.version or self.nccl_version
        self.provenance = seen.provenance(self.launcher, cmds)
        self.last_modes = seen.modes
        self.last_slowdowns = seen.slowdowns
        if self.terminated:
            return seen.results
        if seen.setup_error:
            raise JobError("launcher", seen.setup_error)
        out = seen.results
        if seen.slow_stop:
            why = ""  # the job was ended on a point far slower than NCCL's: that point's failure, no other
        elif end.timed_out:
            why = f"{TIMEOUT}: no progress for {self.timeout_s:.0f} s; the job was ended"
            if job.nccl_warnings:
                why += f"; NCCL said: {job.nccl_warnings[0]}"
        elif seen.errors:
            why = f"a rank failed: {seen.errors[0]}"
            silent = sorted(set(seen.hellos) - seen.spoke_last)
            if silent:
                why = f"ranks {silent} ended without a word (died?); {why}"
        else:
            why = job.failure()  # one clause per failed rank, in its own words; the raw output in launcher.log
            if not why and any(r is None for r in out):
                missing = sorted(set(range(self.nranks)) - set(seen.hellos))
                why = (f"ranks {missing} never reported: the job ran fewer ranks than the topology's {self.nranks}"
                       if missing else "the job ended before it measured every point")
        for i, why_slow in seen.slow.items():  # abandoned in the job (too slow): never measured again
            self.failures[i] = why_slow
        if why:
            stuck = seen.stuck()
            if stuck is not None and out[stuck] is None and stuck not in self.failures:
                self.failures[stuck] = why
            elif not any(r is not None for r in out):  # no point to blame: a timeout holds none of them back
                lost = f"not reached: {why}" if end.timed_out else why
                self.failures.update({i: lost for i in range(len(points)) if i not in self.failures})
        return out

    def close(self) -> None:
        pass


NVLS = ("as-is", "off")
NCCL_TUNER_PLUGIN = "NCCL_TUNER_PLUGIN"


class JobRecords:
    """What the ranks of one job reported, as it arrives (the job's :class:`ncclrl.envs.jobs.Watch`):
    per-rank logs under ``out_dir``, the results, the point each rank was on, errors, the facts each
    rank said hello with, and the points abandoned as too slow. It ends the job ``grace_s`` after a
    rank's error (the others then wait on that rank), and when a point's first calls outlast
    ``too_slow`` times NCCL's own choice at its size (measured in this job) by more than
    ``floor_s``: that point is then too slow, the job's other points go on in the next job."""

    def __init__(self, nranks: int, npoints: int, out_dir: Path, grace_s: float = 10.0, too_slow: float = 0.0,
                 floor_s: float = TOO_SLOW_FLOOR_S, keys: list[tuple[str, int]] | None = None) -> None:
        self.nranks = nranks
        self.keys = keys or [("", i) for i in range(npoints)]  # each point's (collective, size): its group
        self.results: list[list[float] | None] = [None] * npoints
        self.modes = ["eager"] * npoints
        self.slowdowns: list[list[float] | None] = [None] * npoints  # the compute load's, per sample
        self.items: dict[int, int] = {}
        self.item_at: dict[int, float] = {}  # when each rank named its current point
        self.hellos: dict[int, dict] = {}
        self.errors: list[str] = []
        self.first_error_at = 0.0
        self.setup_error = ""
        self.version = ""
        self.spoke_last: set[int] = set()
        self.done: set[int] = set()
        self.grace_s, self.too_slow, self.floor_s = grace_s, too_slow, floor_s
        self.ref_us: dict[tuple[str, int], float] = {}  # per group: NCCL's own choice's first-call time
        self.estimated: set[int] = set()
        self.slow: dict[int, str] = {}  # point -> why it was abandoned
        self.slow_stop = False
        self._files: dict[int, object] = {}
        self.out_dir = out_dir

    def _log(self, rank: int, text: str) -> None:
        if rank not in self._files:
            self._files[rank] = open(self.out_dir / f"rank{rank}.log", "a", buffering=1)  # noqa: SIM115
        self._files[rank].write(f"{time.strftime('%H:%M:%S')} {text}\n")  # type: ignore[attr-defined]

    def add(self, records: list) -> None:
        for r in records:
            self._log(r.rank, f"{r.kind} {r.payload}")
            try:
                self._take(r)
            except (ValueError, KeyError, TypeError):  # a line cut by a kill: what it held is lost, nothing else
                continue

    def _take(self, r) -> None:
        if r.kind == "item":
            self.items[r.rank] = int(r.payload)
            self.item_at[r.rank] = time.time()
        elif r.kind == "est":
            d = payload_json(r.payload)
            self.estimated.add(int(d["i"]))
            if d.get("d") and 0 <= int(d["i"]) < len(self.keys):
                self.ref_us[self.keys[int(d["i"])]] = float(d["us"])
        elif r.kind == "slow":
            d = payload_json(r.payload)
            self.slow[int(d["i"])] = (f"{TOO_SLOW_WORDS}: its first calls took {d['us'] / 1e3:.4g} ms, over "
                                      f"{self.too_slow:g}x NCCL's own choice at this size ({d['ref'] / 1e3:.4g} ms); "
                                      "abandoned in the job")
        elif r.kind == "result":
            d = payload_json(r.payload)
            if 0 <= d["i"] < len(self.results):
                self.results[d["i"]], self.modes[d["i"]] = [float(x) for x in d["s"]], d["m"]
                if "g" in d:
                    self.slowdowns[d["i"]] = [float(x) for x in d["g"]]
        elif r.kind == "hello":
            self.hellos[r.rank] = payload_json(r.payload)
        elif r.kind == "version":
            self.version = r.payload.split()[0] if r.payload.strip() else ""
        if r.kind in ("error", "done"):
            self.spoke_last.add(r.rank)
        if r.kind == "done":
            self.done.add(r.rank)
        if r.kind == "error":
            if r.payload.startswith("stopped before any collective") or r.payload.startswith("local rank"):
                self.setup_error = self.setup_error or r.payload
            if not self.errors:
                self.first_error_at = time.time()
            self.errors.append(f"rank {r.rank}: {r.payload}")

    def stop(self) -> str:
        """Why the job must end now: a rank's error ``grace_s`` ago, or a point set up for longer
        than NCCL's own choice's first calls allow (``too_slow``)."""
        if self.errors and time.time() - self.first_error_at > self.grace_s:
            return self.errors[0]
        if not self.too_slow:
            return ""
        for rank, i in self.items.items():
            ref = self.ref_us.get(self.keys[i]) if 0 <= i < len(self.keys) else None
            if ref is None or i in self.estimated or i in self.slow:
                continue
            took = time.time() - self.item_at.get(rank, time.time())
            if took > self.floor_s + self.too_slow * SETUP_CALLS * ref / 1e6:
                self.slow[i] = (f"{TOO_SLOW_WORDS}: its first calls had not returned after {took:.0f} s, where "
                                f"NCCL's own choice at this size took {ref / 1e3:.4g} ms a call ({self.too_slow:g}x "
                                f"that, plus {self.floor_s:g} s to connect); the job was ended")
                self.slow_stop = True
                return self.slow[i]
        return ""

    def finished(self) -> bool:
        return len(self.done) >= self.nranks

    def stuck(self) -> int | None:
        """The point the job was on when it stopped (the lowest any rank last named)."""
        return min(self.items.values()) if self.items else None

    def provenance(self, launcher: LaunchConfig, cmds: list) -> dict:
        h = self.hellos
        one = h.get(0, next(iter(h.values()), {}))
        return {"nccl_version": self.version, "gpus": sorted({x.get("gpu", "") for x in h.values()}),
                "driver": sorted({x.get("driver", "") for x in h.values()}),
                "cuda": sorted({x.get("cuda", "") for x in h.values()}),
                "hosts": sorted({x.get("host", "") for x in h.values()}), "ranks_reported": len(h),
                "launcher": launcher.kind, "command": " ".join(cmds[0][0]) if cmds else "",
                "nccl_env": one.get("nccl_env", {})}

    def close(self) -> None:
        for f in self._files.values():
            f.close()  # type: ignore[attr-defined]
