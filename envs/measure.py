"""Measuring points through a backend into the store, job by job."""

from __future__ import annotations

import logging
import signal
import time
import uuid

from ncclrl.costmodel.space import Point
from ncclrl.envs.backend import Backend
from ncclrl.envs.jobs import Interrupted, stop_requested
from ncclrl.envs.live import HANG, TIMEOUT, TOO_SLOW_WORDS, block_group, is_hang, timing_label
from ncclrl.envs.store import Store, bad_time

log = logging.getLogger(__name__)

def measure_whole(workers: Backend, points: list[Point], store: Store, topology: str, *, backend: str, samples: int,
                  tag: str, after_hang: str = "skip", deadline: float | None = None,
                  unmeasured: list[int] | None = None) -> list[list[float] | None]:
    """Measure ``points`` in as many jobs as it takes and store every one: each job keeps what it
    finished; a point NCCL hung on, that was too slow (its first calls far slower than NCCL's own
    choice) or that failed is stored as failed and left out of the next job. With
    ``after_hang="skip"`` (the default), a point is never measured where the store records that
    NCCL hung, timed out or was too slow on its algorithm/protocol at its size or a smaller one under
    the same knobs, in any command (:meth:`Store.blocked`; such points answer ``None`` and are not
    stored again), and once a job hangs or is too slow on one, its larger sizes (and that size for
    the points after it) are stored as failed without measuring. No job starts after ``deadline``
    (``time.time()``) or once SIGINT/SIGTERM came; the points it leaves are neither measured nor
    stored, and their indices go to ``unmeasured``. A job's rows are committed together as it ends,
    so a kill keeps every finished job whole and no part of the one it was in.
    Returns each point's samples (``None``: failed, blocked or left)."""
    results: list[list[float] | None] = [None] * len(points)
    remaining = list(range(len(points)))
    job = ""
    launch = workers.launch
    skip = after_hang == "skip"
    if skip:
        blocked = store.blocked(topology=topology, backend=backend)
        held = []
        for i in remaining:
            p = points[i]
            k = tuple(map(int, p.knobs))
            hit = min((h for h in (blocked.get((k, block_group(p, True))), blocked.get((k, block_group(p, False))))
                       if h is not None), default=None)
            if hit is not None and hit[0] <= p.nbytes and not (p.algo == "default" and not p.channels):
                held.append(i)
        if held:
            p = points[held[0]]
            log.info("# %d points not measured: the store records NCCL hung, timed out or was too slow on their "
                     "algorithm/protocol at their size or a smaller one under the same knobs (e.g. %s %d B %s/%s/%d)",
                     len(held), p.collective, p.nbytes, p.algo, p.proto, p.channels)
            remaining = [i for i in remaining if i not in set(held)]

    def add(i: int, smp: list[float], **kw) -> None:
        store.add(points[i], smp, backend=backend, topology=topology, nccl_version=workers.nccl_version, tag=tag,
                  job=job, **kw)

    def fail(i: int, error: str) -> None:
        status = "timeout" if error.startswith(TIMEOUT) else "slow" if error.startswith(TOO_SLOW_WORDS) else "failed"
        add(i, [], timing=timing_label(launch, "eager"), status=status, error=error[:500])

    while remaining:
        late = deadline is not None and time.time() > deadline and job  # the first job always runs
        if late or stop_requested():
            if unmeasured is not None:
                unmeasured.extend(remaining)
            if not job and not late:  # a stop signal before any job: nothing ran, nothing to return
                raise Interrupted(stop_requested(acknowledge=True) or signal.SIGTERM)
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
                    if skip and (is_hang(fails[j]) or fails[j].startswith(TOO_SLOW_WORDS)):
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
                wide = HANG in (workers.failures.get(remaining.index(hi), "") or "")  # a hang NCCL named
                same = {i for i in nxt if block_group(points[i], wide) == block_group(h, wide)
                        and (points[i].nbytes, i) > (h.nbytes, hi)
                        and not (points[i].algo == "default" and not points[i].channels)}  # NCCL's own: the reference
                for i in sorted(same):
                    first = workers.failures.get(remaining.index(hi), "") or HANG
                    cause = HANG if HANG in first else TOO_SLOW_WORDS if first.startswith(TOO_SLOW_WORDS) else TIMEOUT
                    fail(i, f"not measured: {cause} on {h.algo}/{h.proto} at {h.nbytes} B with these knobs "
                         "(after_hang=retry measures it)")
                if same:
                    log.warning("# %s %s/%s: %d points at >= %d B not measured after the hang", h.collective, h.algo,
                                h.proto, len(same), h.nbytes)
                nxt = [i for i in nxt if i not in same]
        if terminated:  # SIGINT/SIGTERM: what the job finished is stored; now end
            raise Interrupted(terminated if type(terminated) is int else stop_requested() or signal.SIGTERM)
        if stuck:
            break
        remaining = nxt
    return results
