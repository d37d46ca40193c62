"""``ncclrl sweep``: measure a grid of configurations (or NCCL's default alone) on a live backend
into the store, resumably, and print nccl-tests-like tables.

    ncclrl sweep backend=torch topology=h200-2x2-sock collectives=allreduce max_bytes=256M grid=full

Arguments are ``key=value``: ``backend`` (torch), ``topology`` (preset or YAML), ``collectives``
(comma list), ``min_bytes``/``max_bytes``, ``grid`` (``default``: NCCL's default only, the S-curve;
``full``: every per-call configuration under every per-process knob setting of the grid),
``store`` (SQLite path), ``samples`` (per point), ``timing`` (graph|eager), ``timeout_s``,
``launch`` (torch: ``torch.distributed`` calls; nccl: NCCL called directly, no Python overhead
per call, :mod:`runners.nccl_direct`), ``wall_s`` (0: none; no job starts after that many seconds,
what is left is measured by the next run), ``after_hang`` (``skip``: once NCCL hangs on an
algorithm/protocol at some size, that algorithm/protocol is not tried again at larger sizes (nor at
that size after the hung point) under the same knobs, and a rerun does not retry them; ``retry``:
measure every point, retrying recorded hangs).
Every request measures NCCL's default interleaved with its candidates. Points already in the
store (measured with the same ``launch``) are not measured again, so an interrupted sweep resumes.
"""

from __future__ import annotations

import sys
import time
import uuid
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from costmodel import nccl as N
from costmodel.errors import ConfigError
from costmodel.replica import eligible_mask
from costmodel.topology import Topology, load_topology
from runners.live_common import HANG, LAUNCHES, is_hang, timing_label
from runners.store import KNOB_FIELDS, Point, Store

DEFAULTS: dict[str, str] = {"backend": "torch", "topology": "h200-1x4", "collectives": "allreduce",
                            "min_bytes": "8", "max_bytes": "256M", "grid": "default", "store": "runs/store.sqlite",
                            "samples": "7", "timing": "graph", "timeout_s": "300", "tag": "sweep",
                            "nccltests_dir": "", "launcher": "local", "launch": "nccl", "wall_s": "0",
                            "after_hang": "skip"}
# NCCL_SOCKET_INLINE in the knob grid: 256 KiB measured best of 64/256 KiB on h200-2x2-sock
# (docs/live/probe_socket_inline.py; NCCL's default is 128 B)
SOCKET_INLINE_BYTES = 256 << 10


def parse_kv(argv: list[str], defaults: dict[str, str], command: str) -> dict[str, str]:
    """``key=value`` arguments over ``defaults``; unknown keys and bare words are one-line errors."""
    args = dict(defaults)
    for a in argv:
        k, sep, v = a.partition("=")
        if not sep:
            raise ConfigError(command, f"arguments are key=value, got {a!r}; keys: {', '.join(defaults)}")
        if k not in defaults:
            raise ConfigError(k, f"unknown key; allowed: {', '.join(defaults)}")
        args[k] = v
    return args


def script_main(run, parse, argv: list[str] | None) -> int:
    """``python -m runners.X key=value ...``: one-line errors, exit 2."""
    try:
        run(parse(list(sys.argv[1:] if argv is None else argv)))
    except ConfigError as e:
        print(f"ncclrl: error: {e}", file=sys.stderr)
        return 2
    return 0


def check_timing(args: dict[str, str]) -> None:
    """``timing`` (graph|eager) and ``launch`` (torch|nccl), shared by every live command."""
    if args["timing"] not in ("graph", "eager"):
        raise ConfigError("timing", f"unknown value {args['timing']!r}; allowed: graph, eager")
    if args["launch"] not in LAUNCHES:
        raise ConfigError("launch", f"unknown value {args['launch']!r}; allowed: torch (torch.distributed calls), "
                          "nccl (NCCL called directly from the workers)")


def parse_args(argv: list[str]) -> dict[str, str]:
    args = parse_kv(argv, DEFAULTS, "sweep")
    if args["backend"] not in ("torch", "nccl-tests"):
        raise ConfigError("backend", f"unknown value {args['backend']!r}; allowed: torch, nccl-tests")
    if args["backend"] == "nccl-tests" and not args["nccltests_dir"]:
        raise ConfigError("nccltests_dir", "backend=nccl-tests needs nccltests_dir=<folder with all_reduce_perf ...>")
    if args["grid"] not in ("default", "full"):
        raise ConfigError("grid", f"unknown value {args['grid']!r}; allowed: default, full")
    if args["after_hang"] not in ("skip", "retry"):
        raise ConfigError("after_hang", f"unknown value {args['after_hang']!r}; allowed: skip (do not try an "
                          "algorithm/protocol again at a size or larger after NCCL hung on it), retry")
    if not args["wall_s"].isdigit():
        raise ConfigError("wall_s", f"must be a whole number of seconds >= 0 (0: no limit), got {args['wall_s']!r}")
    check_timing(args)
    return args


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
    lent 2x2, NCCL's own choice under 4 channels ran 0.78-0.91x at 1-4 MiB; docs/live.md,
    session 13)."""
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


def run_sweep(args: dict[str, str], out=sys.stdout, workers_factory=None) -> dict[str, Any]:
    """Run a sweep. ``workers_factory(topology, knobs, timing, timeout_s)`` makes the measuring
    workers (default: :class:`runners.table_backend.TableWorkers`); tests pass a fake."""
    from runners.cli import parse_bytes
    from runners.live_common import WorkerError

    if workers_factory is None:
        if args["backend"] == "nccl-tests":
            from runners.live_common import PLUGIN
            from runners.nccltests_backend import NcclTestsBackend

            def workers_factory(topo, knobs, timing, timeout_s):
                b = NcclTestsBackend(args["nccltests_dir"], topo.nranks, args["launcher"], PLUGIN, timeout_s)
                b.knobs = knobs
                return b
        else:
            from runners.table_backend import TableWorkers

            def workers_factory(topo, knobs, timing, timeout_s):
                return TableWorkers(topo.nranks, topo.nodes, knobs, timing=timing, timeout_s=timeout_s,
                                    launch=args["launch"])

    topo = load_topology(args["topology"])
    colls = [N.parse_name("collectives", c, N.COLLECTIVES) for c in args["collectives"].split(",") if c]
    lo, hi = parse_bytes(args["min_bytes"], "min_bytes"), parse_bytes(args["max_bytes"], "max_bytes")
    samples, grid, tag = int(args["samples"]), args["grid"], args["tag"]
    skip_hung = args["after_hang"] == "skip"
    # the workers' launch names how their timings were taken; nccl-tests is its own timing
    launch = args["launch"] if args["backend"] == "torch" else None
    deadline = time.time() + float(args["wall_s"]) if int(args["wall_s"]) else None
    store = Store(Path(args["store"]))
    measured, skipped, failed, left = 0, 0, 0, 0
    t0 = time.time()
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
        if not todo:
            continue
        if deadline is not None and time.time() > deadline:
            left += sum(map(len, todo))
            continue
        label = " ".join(f"{k}={v}" for k, v in knobs.env().items()) or "NCCL defaults"
        print(f"# {topo.name}: {label}: {sum(map(len, todo))} points", file=out, flush=True)
        try:
            workers = workers_factory(topo, knobs, args["timing"], float(args["timeout_s"]))
            job = uuid.uuid4().hex[:12]
        except WorkerError as e:
            print(f"# workers failed to start: {e}", file=out, flush=True)
            failed += sum(map(len, todo))
            continue
        if getattr(workers, "whole_request", False):  # one job per setting; a hang costs one point
            cut: list[int] = []
            try:
                res = measure_whole(workers, [p for pts in todo for p in pts], store, topo.name,
                                    backend=args["backend"], samples=samples, tag=tag, out=out,
                                    after_hang=args["after_hang"], deadline=deadline, unmeasured=cut)
            finally:
                workers.close()
            got = sum(r is not None for r in res)
            measured, failed, left = measured + got, failed + len(res) - got - len(cut), left + len(cut)
            continue
        try:
            for pts in todo:
                try:
                    res = workers.measure(pts, samples=samples)
                except WorkerError as e:
                    for p in pts:
                        store.add(p, [], backend=args["backend"], topology=topo.name, nccl_version="?",
                                  timing=timing_label(launch or "torch", args["timing"]), tag=tag, status="failed",
                                  error=str(e)[:500], job=job)
                    failed += len(pts)
                    print(f"# {pts[0].collective} {pts[0].nbytes} B failed: {e}; restarting workers", file=out)
                    workers = workers_factory(topo, knobs, args["timing"], float(args["timeout_s"]))
                    job = uuid.uuid4().hex[:12]
                    continue
                for p, smp, mode in zip(pts, res, workers.last_modes, strict=True):
                    store.add(p, smp, backend=args["backend"], topology=topo.name, nccl_version=workers.nccl_version,
                              timing=mode, tag=tag, job=job)
                measured += len(pts)
        finally:
            workers.close()
    print(f"# measured {measured} points, {skipped} already in {args['store']}, {failed} failed, "
          f"{time.time() - t0:.0f} s", file=out, flush=True)
    if left:
        print(f"# wall_s={args['wall_s']} reached: {left} points not measured; run the same command again to "
              "measure them", file=out, flush=True)
    print_tables(store, topo, colls, tag, out, launch)
    return {"measured": measured, "skipped": skipped, "failed": failed, "left": left}


def hang_group(p: Point) -> tuple:
    """What a hang on ``p`` says NCCL will hang on at larger sizes: its collective, algorithm and
    protocol; for NCCL's own algorithm (which NCCL picks per size) only at the same channel count,
    so that a hang of it at NCCL's count never skips NCCL's plain default."""
    return (p.collective, p.algo, p.proto) + ((p.channels,) if p.algo == "default" else ())


def measure_whole(workers, points: list[Point], store: Store, topology: str, *, backend: str, samples: int,
                  tag: str, out=sys.stdout, after_hang: str = "retry", deadline: float | None = None,
                  unmeasured: list[int] | None = None) -> list[list[float] | None]:
    """Measure ``points`` in as many jobs as it takes and store every one: each job keeps what it
    finished; a point NCCL hung on (or that failed) is stored as failed and left out of the next
    job. With ``after_hang="skip"``, once NCCL hangs on an algorithm/protocol at some size, that
    algorithm/protocol is stored as failed without measuring at larger sizes, and at that size
    for the points after the hung one (same collective; the knobs are the job's; the job ran the
    points before it). No job starts after ``deadline`` (``time.time()``); the
    points it leaves are neither measured nor stored, and their indices go to ``unmeasured``.
    Returns each point's samples (``None``: failed or left)."""
    results: list[list[float] | None] = [None] * len(points)
    remaining = list(range(len(points)))
    job = ""
    launch = getattr(workers, "launch", "torch")

    def add(i: int, smp: list[float], **kw) -> None:
        store.add(points[i], smp, backend=backend, topology=topology, nccl_version=workers.nccl_version, tag=tag,
                  job=job, **kw)

    def fail(i: int, error: str) -> None:
        add(i, [], timing=timing_label(launch, "eager"), status="failed", error=error[:500])

    while remaining:
        if deadline is not None and time.time() > deadline and job:  # the first job always runs
            if unmeasured is not None:
                unmeasured.extend(remaining)
            break
        job = uuid.uuid4().hex[:12]  # one id per set of processes: the unit of between-job noise
        res = workers.measure([points[i] for i in remaining], samples=samples)
        fails = getattr(workers, "failures", {})
        nxt, hung = [], []
        for j, (i, r) in enumerate(zip(remaining, res, strict=True)):
            if r is not None:
                add(i, r, timing=workers.last_modes[j])
                results[i] = r
            elif j in fails:
                fail(i, fails[j])
                p = points[i]
                print(f"# {p.collective} {p.nbytes} B {p.algo}/{p.proto}/{p.channels}: {fails[j]}", file=out,
                      flush=True)
                if after_hang == "skip" and is_hang(fails[j]):
                    hung.append(i)
            else:
                nxt.append(i)
        if len(nxt) == len(remaining):  # no progress and nothing to blame: give up on these
            for i in nxt:
                fail(i, "job made no progress")
            break
        for hi in hung:  # the job warmed the points before the hung one (item order): those ran
            h = points[hi]
            same = {i for i in nxt if hang_group(points[i]) == hang_group(h) and (points[i].nbytes, i) > (h.nbytes, hi)}
            for i in sorted(same):
                fail(i, f"not measured: {HANG} on {h.algo}/{h.proto} at {h.nbytes} B with these knobs "
                     "(after_hang=retry measures it)")
            if same:
                print(f"# {h.collective} {h.algo}/{h.proto}: {len(same)} points at >= {h.nbytes} B not measured "
                      "after the hang", file=out, flush=True)
            nxt = [i for i in nxt if i not in same]
        remaining = nxt
    return results


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
        g = float(np.exp(np.mean(np.log(t["speedup"]))))
        print(f"# geometric-mean speedup of the best measured point: {g:.2f}x over {len(t)} sizes", file=out)


def main(argv: list[str] | None = None) -> int:
    return script_main(run_sweep, parse_args, argv)


if __name__ == "__main__":
    sys.exit(main())
