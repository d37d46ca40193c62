"""Simulator throughput: configuration evaluations per second on one core.

    python benchmarks/bench_simulator.py [--n 1000000] [--repeats 5]

Pins BLAS/OpenMP to one thread (numpy's elementwise kernels are single-threaded anyway) and
prints, per topology, the median over repeats of evaluations/s for a batch of random valid
configurations (all collectives, algorithms, protocols, channel counts, sizes 8 B - 4 GiB).
"""

from __future__ import annotations

import os

for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(var, "1")

import argparse  # noqa: E402
import platform  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402

from ncclrl.costmodel.replica import eligible_mask  # noqa: E402
from ncclrl.costmodel.simulator import Configs, Simulator  # noqa: E402


def random_configs(sim: Simulator, n: int, rng: np.random.Generator) -> Configs:
    c, a, p = np.nonzero(eligible_mask(sim.topo))
    pick = rng.integers(0, c.size, n)
    nbytes = (2.0 ** rng.uniform(3, 32, n)).astype(np.int64)
    channels = rng.integers(0, sim.topo.nccl.channels + 1, n)
    return Configs.make(c[pick], nbytes, a[pick], p[pick], channels)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=1_000_000)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--topologies", nargs="+", default=["h200-1x4", "h200-2x2-sock", "dgx-h100-16n"])
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    print(f"# {platform.processor() or platform.machine()}, numpy {np.__version__}, batch {args.n:,}, "
          f"median of {args.repeats}")
    print(f"{'topology':<16} {'evals/s (no checks)':>20} {'evals/s (validated)':>20}")
    for name in args.topologies:
        sim = Simulator(name)
        cfg = random_configs(sim, args.n, rng)
        sim.time_us(cfg)  # warm-up
        rates = []
        for validate in (False, True):
            ts = []
            for _ in range(args.repeats):
                t0 = time.perf_counter()
                sim.time_us(cfg, validate=validate)
                ts.append(time.perf_counter() - t0)
            rates.append(args.n / float(np.median(ts)))
        print(f"{name:<16} {rates[0]:>20,.0f} {rates[1]:>20,.0f}")


if __name__ == "__main__":
    main()
