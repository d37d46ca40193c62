"""Fake measuring backends for the fault tests (no GPU)."""

from __future__ import annotations

import time
import zlib

from ncclrl.envs.backend import Backend
from ncclrl.envs.live import timing_label


def fake_time(p) -> float:
    """A deterministic time for a point (microseconds)."""
    h = zlib.crc32(repr((p.collective, int(p.nbytes), p.algo, p.proto, int(p.channels), *map(int, p.knobs))).encode())
    return 10.0 + p.nbytes / 1e4 + (h % 1000) / 100.0


class SlowWholeWorkers(Backend):
    """Measures at most ``per_job`` points a job (the rest left for the next), ``sleep_s`` a job;
    ``times`` overrides a point's samples by its size (e.g. ``{1024: [nan]}``)."""

    name = "fake"

    def __init__(self, topo, knobs, timing, timeout_s, sleep_s: float = 0.0, per_job: int = 7,
                 times: dict | None = None) -> None:
        super().__init__()
        self.knobs, self.launch, self.nccl_version = knobs, "nccl", "2.28.9"
        self.sleep_s, self.per_job, self.times = sleep_s, per_job, times or {}
        self.timing = timing

    def measure(self, points, samples=5):
        self.failures = {}
        time.sleep(self.sleep_s)
        out = []
        for i, p in enumerate(points):
            if i >= self.per_job:
                out.append(None)
                continue
            t = fake_time(p)
            out.append(list(self.times.get(int(p.nbytes), [t * (1 + k / 1000) for k in range(samples)])))
        self.last_modes = [timing_label("nccl", self.timing)] * len(points)
        return out
