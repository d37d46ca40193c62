"""``ncclrl sweep``: measure a grid of configurations (or NCCL's default alone) on a live backend
into the store, resumably, and print nccl-tests-like tables (keys: :class:`SweepConfig`).

    ncclrl sweep backend=torch topology=h200-2x2-sock collectives=[allreduce] max_bytes=256M grid=full
"""

from __future__ import annotations

import logging
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from ncclrl.costmodel import nccl as N
from ncclrl.costmodel.errors import ConfigError, JobError
from ncclrl.costmodel.noise import geomean
from ncclrl.costmodel.space import KNOB_FIELDS, Point, call_configs, knob_grid, size_grid
from ncclrl.costmodel.topology import Topology, load_topology
from ncclrl.costmodel.units import parse_bytes
from ncclrl.envs.jobs import Interrupted, ending_on_signals, stop_requested
from ncclrl.envs.live import WorkerError, plugin_library, timing_label
from ncclrl.envs.measure import measure_whole
from ncclrl.envs.nccltests_backend import NcclTestsBackend
from ncclrl.envs.store import Store
from ncclrl.runners.config import Command, parse, register
from ncclrl.runners.live import LiveConfig, check_launch, check_load, exit_code, launcher_of, live_workers, load_tag
from ncclrl.runners.progress import progress

log = logging.getLogger(__name__)

@dataclass
class SweepConfig(LiveConfig):
    """Measure a grid of configurations (or NCCL's default alone) on live GPUs into the store,
    resumably, and print default-vs-best tables. Every request measures NCCL's default
    interleaved with its candidates; points already in the store (measured with the same
    ``launch``) are not measured again, so an interrupted sweep resumes.

    :param backend: torch (PyTorch workers, one process per GPU) or nccl-tests (the user's ``*_perf`` binaries)
    :param grid: default (NCCL's default only: the S-curve) or full (every per-call configuration
        under every knob setting)
    :param tag: what the measurements are for, stored with them
    :param nccltests_dir: backend=nccl-tests: the folder holding all_reduce_perf and the others
    :param wall_s: start no job after this many seconds (0: no limit); the same command measures the rest
    :param after_hang: skip (once NCCL hangs on an algorithm/protocol, it is not tried at larger
        sizes under the same knobs) or retry (measure every point, retrying recorded hangs)
    :param load: none, or gemm: every sample runs beside matrix products on each GPU (a stream of their
        own), stored under tag TAG+gemmN with the products' slowdown per sample (backend=torch)
    :param load_n: load=gemm: the products' size (load_n x load_n, bfloat16); size it like your model's
    """

    backend: str = "torch"
    grid: str = "default"
    tag: str = "sweep"
    nccltests_dir: str = ""
    wall_s: int = 0
    after_hang: str = "skip"
    load: str = "none"
    load_n: int = 4096

    def check(self) -> None:
        super().check()
        check_load(self.load, self.load_n, self.backend)
        if self.backend not in ("torch", "nccl-tests"):
            raise ConfigError("backend", f"unknown value {self.backend!r}; allowed: torch, nccl-tests")
        if self.backend == "nccl-tests" and not self.nccltests_dir:
            raise ConfigError("nccltests_dir", "backend=nccl-tests needs nccltests_dir=<folder with "
                              "all_reduce_perf ...>")
        if self.backend == "nccl-tests" and not Path(self.nccltests_dir).is_dir():
            raise ConfigError("nccltests_dir", f"no such folder: {self.nccltests_dir} (the folder holding "
                              "all_reduce_perf ...)")
        if self.grid not in ("default", "full"):
            raise ConfigError("grid", f"unknown value {self.grid!r}; allowed: default, full")
        if self.after_hang not in ("skip", "retry"):
            raise ConfigError("after_hang", f"unknown value {self.after_hang!r}; allowed: skip (do not try an "
                              "algorithm/protocol again at a size or larger after NCCL hung on it), retry")
        if self.wall_s < 0:
            raise ConfigError("wall_s", f"must be a whole number of seconds >= 0 (0: no limit), got {self.wall_s}")


def parse_args(argv: list[str]) -> DictConfig:
    """The sweep's config from ``key=value`` overrides (what ``ncclrl sweep`` composes)."""
    return parse(COMMAND, argv)


def main_sweep(cfg: DictConfig) -> int:
    if cfg["backend"] == "torch":  # no GPUs or the wrong hosts: one line, before the store is touched
        check_launch(cfg, load_topology(cfg["topology"]))  # a sweep measures GPUs: nothing to do instead
    r = run_sweep(cfg)
    if r["interrupted"] or r["failure"]:
        return exit_code(r)
    if r["failed"] and not r["measured"]:  # not one point measured: a failed run, whatever was stored
        print(f"ncclrl: error: sweep: every one of the {r['failed']} points it tried failed, none was measured "
              f"(the last: {' '.join(r['error'].split())[:300]}); each failure is in the store {cfg['store']}",
              file=sys.stderr)
        return 1
    return 0


def run_sweep(args: DictConfig, out=sys.stdout, workers_factory=None) -> dict[str, Any]:
    """Run a sweep. ``workers_factory(topology, knobs, timing, timeout_s)`` makes the measuring
    workers (default: :class:`ncclrl.envs.torch_workers.TableWorkers`); tests pass a fake."""

    if workers_factory is None:
        if args["backend"] == "nccl-tests":

            def workers_factory(topo, knobs, timing, timeout_s):
                b = NcclTestsBackend(args["nccltests_dir"], topo.nranks, launcher_of(args), plugin_library(),
                                     timeout_s, nodes=topo.nodes, gpus_per_node=topo.gpus_per_node,
                                     nvls=args.get("nvls", "as-is"))
                b.knobs = knobs
                return b
        else:

            def workers_factory(topo, knobs, timing, timeout_s):
                return live_workers(args, topo, knobs, timing=timing, timeout_s=timeout_s)

    topo = load_topology(args["topology"])
    colls = [N.parse_name("collectives", c, N.COLLECTIVES) for c in args["collectives"]]
    lo, hi = parse_bytes(args["min_bytes"], "min_bytes"), parse_bytes(args["max_bytes"], "max_bytes")
    samples, grid, tag = int(args["samples"]), args["grid"], load_tag(args)
    skip_hung = args["after_hang"] == "skip"
    # the workers' launch names how their timings were taken; nccl-tests is its own timing
    launch = args["launch"] if args["backend"] == "torch" else None
    deadline = time.time() + float(args["wall_s"]) if int(args["wall_s"]) else None
    store = Store(Path(args["store"]))
    measured, skipped, failed, left = 0, 0, 0, 0
    last_error = ""  # why the last failure failed (for a run where everything failed)
    t0 = time.time()
    plan = []  # (knobs, requests) of every knob setting with something left to measure
    for knobs in knob_grid(topo, grid):
        todo = []
        for c in colls:
            for s in size_grid(lo, hi, topo.nranks, c):
                pts = [Point(N.COLLECTIVES[c], s, *key, *knobs.knobs)
                       for key in [("default", "default", 0)] + call_configs(topo, c, knobs, grid)]
                done = [store.has(p, backend=args["backend"], topology=topo.name, tag=tag, launch=launch,
                                  hung=skip_hung) for p in pts]
                if all(done):
                    skipped += len(pts)
                    continue
                # NCCL's default is measured with every request (interleaved), even when stored already
                todo.append([pts[0]] + [p for p, d in zip(pts[1:], done[1:], strict=True) if not d])
                skipped += sum(done[1:])
        if todo:
            plan.append((knobs, todo))
    stopped: Interrupted | JobError | None = None  # a signal, or the cluster failing a job: no further job
    with ending_on_signals(), progress("sweep", sum(len(p) for _k, todo in plan for p in todo)) as bar:
        for knobs, todo in plan:
            n_todo = sum(map(len, todo))
            sig = stop_requested(acknowledge=True)
            if sig and stopped is None:
                stopped = Interrupted(sig)
            if (deadline is not None and time.time() > deadline) or stopped is not None:
                left += n_todo
                continue
            label = " ".join(f"{k}={v}" for k, v in knobs.env().items()) or "NCCL defaults"
            log.info("# %s: %s: %d points", topo.name, label, n_todo)
            try:
                workers = workers_factory(topo, knobs, args["timing"], float(args["timeout_s"]))
                job = uuid.uuid4().hex[:12]
            except WorkerError as e:
                log.warning("# workers failed to start: %s", e)
                last_error = f"workers failed to start: {e}"
                failed += n_todo
                bar.advance(n_todo)
                continue
            if workers.whole_request:  # one job per setting; a hang costs one point
                cut: list[int] = []
                try:
                    res = measure_whole(workers, [p for pts in todo for p in pts], store, topo.name,
                                        backend=args["backend"], samples=samples, tag=tag,
                                        after_hang=args["after_hang"], deadline=deadline, unmeasured=cut)
                except (Interrupted, JobError) as e:  # what the job finished is stored; no further job
                    stopped, left = e, left + n_todo
                    bar.advance(n_todo)
                    continue
                finally:
                    workers.close()
                got = sum(r is not None for r in res)
                measured, failed, left = measured + got, failed + len(res) - got - len(cut), left + len(cut)
                bar.advance(n_todo)
                continue
            try:
                for pts in todo:
                    if stopped is not None:
                        left += len(pts)
                        continue
                    bar.advance(len(pts))
                    try:
                        res = workers.measure(pts, samples=samples)
                    except (Interrupted, JobError) as e:  # what was stored stays; no further launch
                        stopped, left = e, left + len(pts)
                        continue
                    except WorkerError as e:
                        for p in pts:
                            store.add(p, [], backend=args["backend"], topology=topo.name, nccl_version="?",
                                      timing=timing_label(launch or "torch", args["timing"]), tag=tag,
                                      status="failed", error=str(e)[:500], job=job)
                        failed += len(pts)
                        log.warning("# %s %d B failed: %s; restarting workers", pts[0].collective, pts[0].nbytes, e)
                        workers = workers_factory(topo, knobs, args["timing"], float(args["timeout_s"]))
                        job = uuid.uuid4().hex[:12]
                        continue
                    for p, smp, mode in zip(pts, res, workers.last_modes, strict=True):
                        store.add(p, smp, backend=args["backend"], topology=topo.name,
                                  nccl_version=workers.nccl_version, timing=mode, tag=tag, job=job)
                    measured += len(pts)
            finally:
                workers.close()
        sig = stop_requested(acknowledge=True)  # came after the last job: say so, the tables follow
        if sig and stopped is None:
            stopped = Interrupted(sig)
    log.info("# measured %d points, %d already in %s, %d failed, %.0f s", measured, skipped, args["store"], failed,
             time.time() - t0)
    if isinstance(stopped, Interrupted):
        log.warning("# interrupted by %s: %d points not measured; what was measured is stored, and the same command "
                    "measures the rest", stopped.name, left)
    elif stopped is not None:
        log.warning("# a job failed: %s; %d points not measured; the same command measures them", stopped, left)
    elif left:
        log.warning("# wall_s=%s reached: %d points not measured; run the same command again to measure them",
                    args["wall_s"], left)
    print_tables(store, topo, colls, tag, out, launch)
    if failed and not measured:
        stored = store.frame(topology=topo.name, tag=tag, status="failed")
        if not stored.empty:
            last_error = str(stored["error"].iloc[-1])
    return {"measured": measured, "skipped": skipped, "failed": failed, "left": left, "error": last_error,
            "interrupted": stopped.name if isinstance(stopped, Interrupted) else None,
            "failure": str(stopped) if isinstance(stopped, JobError) else None}


def best_table(store: Store, topo: Topology, coll: str, tag: str = "sweep", launch: str | None = None):
    """Per size: NCCL's default (under NCCL's per-process defaults) and the best measured point
    (of those measured with ``launch`` when given)."""
    df = store.frame(launch, topology=topo.name, collective=coll, tag=tag, status="ok")
    if df.empty:
        return df
    knob_cols = list(KNOB_FIELDS)
    df["config"] = df.apply(lambda r: f"{r.algo}/{r.proto}/{r.channels}", axis=1)
    df["knobs"] = df.apply(lambda r: " ".join(f"{k}={int(r[k])}" for k in knob_cols if r[k]) or "-", axis=1)
    rows = []
    for nbytes, g in df.groupby("nbytes"):
        base = g[(g.algo == "default") & (g.channels == 0) & (g[knob_cols].sum(axis=1) == 0)]
        if base.empty:
            continue
        b = base.iloc[-1]
        best = g.loc[g["median_us"].idxmin()]
        rows.append({"nbytes": int(nbytes), "default_us": b.median_us,
                     "default_ci": f"{b.ci_lo_us:.1f}-{b.ci_hi_us:.1f}",
                     "best_us": best.median_us, "best_ci": f"{best.ci_lo_us:.1f}-{best.ci_hi_us:.1f}",
                     "best_config": best.config, "best_knobs": best.knobs,
                     "speedup": b.median_us / best.median_us})
    import pandas as pd

    return pd.DataFrame(rows)


def print_tables(store: Store, topo: Topology, colls: list[int], tag: str, out=sys.stdout,
                 launch: str | None = None) -> None:
    for c in colls:
        name = N.COLLECTIVES[c]
        t = best_table(store, topo, name, tag, launch)
        if t.empty:
            continue
        bf = float(N.bus_factor(c, topo.nranks))
        print(f"\n# {name} on {topo.name}: NCCL default vs best measured (median us, 95% CI; busbw GB/s)", file=out)
        print(f"{'size':>12} {'default':>10} {'busbw':>7} {'best':>10} {'busbw':>7} {'speedup':>8}  config / knobs",
              file=out)
        for _, r in t.iterrows():
            print(f"{r['nbytes']:>12} {r.default_us:>10.1f} {r['nbytes'] * bf / r.default_us / 1e3:>7.2f} "
                  f"{r.best_us:>10.1f} {r['nbytes'] * bf / r.best_us / 1e3:>7.2f} {r.speedup:>7.2f}x  "
                  f"{r.best_config} {r.best_knobs}", file=out)
        g = geomean(t["speedup"])
        print(f"# geometric-mean speedup of the best measured point: {g:.2f}x over {len(t)} sizes", file=out)


COMMAND = Command("sweep", SweepConfig, main_sweep,
                  "measure configurations on live GPUs into the measurement store (resumable)")
register(COMMAND)
