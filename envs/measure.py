"""Measuring points through a backend into the store, job by job."""

from __future__ import annotations

import logging
import time
import uuid

from ncclrl.costmodel.space import Point
from ncclrl.envs.backend import Backend
from ncclrl.envs.launch import Terminated
from ncclrl.envs.live import HANG, TIMEOUT, is_hang, timing_label
from ncclrl.envs.store import Store, bad_time

log = logging.getLogger(__name__)

def hang_group(p: Point) -> tuple:
    """What a hang on ``p`` says NCCL will hang on at larger sizes: its collective, algorithm and
    protocol; for NCCL's own algorithm (which NCCL picks per size) only at the same channel count,
    so that a hang of it at NCCL's count never skips NCCL's plain default."""
    return (p.collective, p.algo, p.proto) + ((p.channels,) if p.algo == "default" else ())


def measure_whole(workers: Backend, points: list[Point], store: Store, topology: str, *, backend: str, samples: int,
                  tag: str, after_hang: str = "retry", deadline: float | None = None,
                  unmeasured: list[int] | None = None) -> list[list[float] | None]:
    """Measure ``points`` in as many jobs as it takes and store every one: each job keeps what it
    finished; a point NCCL hung on (or that failed) is stored as failed and left out of the next
    job. With ``after_hang="skip"``, once NCCL hangs on an algorithm/protocol at some size, that
    algorithm/protocol is stored as failed without measuring at larger sizes, and at that size
    for the points after the hung one (same collective; the knobs are the job's; the job ran the
    points before it). No job starts after ``deadline`` (``time.time()``); the
    points it leaves are neither measured nor stored, and their indices go to ``unmeasured``. A
    job's rows are committed together as it ends, so a kill keeps every finished job whole and no
    part of the one it was in.
    Returns each point's samples (``None``: failed or left)."""
    results: list[list[float] | None] = [None] * len(points)
    remaining = list(range(len(points)))
    job = ""
    launch = workers.launch

    def add(i: int, smp: list[float], **kw) -> None:
        store.add(points[i], smp, backend=backend, topology=topology, nccl_version=workers.nccl_version, tag=tag,
                  job=job, **kw)

    def fail(i: int, error: str) -> None:
        status = "timeout" if error.startswith(TIMEOUT) else "failed"
        add(i, [], timing=timing_label(launch, "eager"), status=status, error=error[:500])

    while remaining:
        if deadline is not None and time.time() > deadline and job:  # the first job always runs
            if unmeasured is not None:
                unmeasured.extend(remaining)
            break
        job = uuid.uuid4().hex[:12]  # one id per set of processes: the unit of between-job noise
        res = workers.measure([points[i] for i in remaining], samples=samples)
        with store.batch():  # the job's rows together: a kill keeps all of them or none
            store.add_job(job, backend=backend, topology=topology, tag=tag, **getattr(workers, "provenance", {}))
            fails = workers.failures
            nxt, hung = [], []
            for j, (i, r) in enumerate(zip(remaining, res, strict=True)):
                bad = bad_time(r) if r is not None else None
                if bad is not None:  # a broken timer or output: a failure, never a measurement
                    fail(i, f"invalid time {bad!r} us: not a finite number > 0")
                    p = points[i]
                    log.warning("# %s %d B %s/%s/%d: invalid time %r us: not a finite number > 0; stored as failed",
                                p.collective, p.nbytes, p.algo, p.proto, p.channels, bad)
                elif r is not None:
                    slow = getattr(workers, "last_slowdowns", None)
                    add(i, r, timing=workers.last_modes[j], compute_slowdown=slow[j] if slow else None)
                    results[i] = r
                elif j in fails:
                    fail(i, fails[j])
                    p = points[i]
                    log.warning("# %s %d B %s/%s/%d: %s", p.collective, p.nbytes, p.algo, p.proto, p.channels,
                                fails[j])
                    if after_hang == "skip" and is_hang(fails[j]):
                        hung.append(i)
                else:
                    nxt.append(i)
            terminated = getattr(workers, "terminated", False)
            # no progress and nothing to blame: give up on these (a preempted job's unreached points
            # are not failures: they stay unstored, and the resumed run measures them)
            stuck = len(nxt) == len(remaining) and not terminated
            if stuck:
                for i in nxt:
                    fail(i, "job made no progress")
            for hi in [] if stuck else hung:  # the job warmed the points before the hung one (item order): those ran
                h = points[hi]
                same = {i for i in nxt
                        if hang_group(points[i]) == hang_group(h) and (points[i].nbytes, i) > (h.nbytes, hi)}
                for i in sorted(same):
                    cause = HANG if HANG in (workers.failures.get(remaining.index(hi), "") or HANG) else TIMEOUT
                    fail(i, f"not measured: {cause} on {h.algo}/{h.proto} at {h.nbytes} B with these knobs "
                         "(after_hang=retry measures it)")
                if same:
                    log.warning("# %s %s/%s: %d points at >= %d B not measured after the hang", h.collective, h.algo,
                                h.proto, len(same), h.nbytes)
                nxt = [i for i in nxt if i not in same]
        if terminated:  # SIGTERM: what the job finished is stored; now end
            raise Terminated(128 + 15)
        if stuck:
            break
        remaining = nxt
    return results
