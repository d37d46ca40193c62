"""The learning step between fine-tuning rounds, timed: the simulator refit to what was measured
(:meth:`agents.finetune.Finetuner.refit`) and PPO on the refit model
(:meth:`agents.finetune.Finetuner.train_policy`), at several torch thread counts.

In live runs on the 4 x H200 host, the time between the first round's last job and the second
round's first job ranged from about 8 s to about 70 s; this times the learning step alone
(docs/results/live.md). The first round is replayed from the recorded sweep in the store, so the
step learns from the same kind of data as a live run.

    python benchmarks/bench_finetune_learn.py [--store docs/data/h200x4-2026-11-21/store.sqlite]
        [--topology h200-2x2-sock] [--threads 1,2,4,0] [--ppo-steps 8192]

``--threads 0`` is torch's default (``torch.get_num_threads()`` at start). Prints one line per
thread count: refit seconds, PPO seconds, PPO steps per second.
"""

from __future__ import annotations

import argparse
import os
import time


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--store", default="docs/data/h200x4-2026-11-21/store.sqlite")
    ap.add_argument("--topology", default="h200-2x2-sock")
    ap.add_argument("--checkpoint", default="pretrained")
    ap.add_argument("--threads", default="1,2,4,0")
    ap.add_argument("--ppo-steps", type=int, default=8192)
    ap.add_argument("--launch", default="nccl")
    a = ap.parse_args()

    import torch

    from ncclrl.agents.finetune import FinetuneConfig, Finetuner, sizes_for
    from ncclrl.agents.pretrain import load_policy
    from ncclrl.costmodel import nccl as N
    from ncclrl.costmodel.topology import load_topology
    from ncclrl.envs.replay import ReplayWorkers, recorded_sweep, replay_knobs

    default_threads = torch.get_num_threads()
    print(f"# {os.cpu_count()} CPUs, torch {torch.__version__}, default threads {default_threads}")
    topo = load_topology(a.topology)
    coll = N.COLLECTIVES.index("allreduce")
    sizes = sizes_for(topo, [coll], 8, 256 << 20)
    frame = recorded_sweep(a.store, topo, a.launch, ("sweep",), status="ok")
    knobs = replay_knobs(frame, topo)
    for n in [int(x) for x in a.threads.split(",")]:
        torch.set_num_threads(n or default_threads)
        seen: dict = {}
        model = load_policy(a.checkpoint)
        model.set_random_seed(0)
        cfg = FinetuneConfig(budget=473, rounds=1, ppo_steps=0, verify=0)
        ft = Finetuner(topo, [coll], sizes, model,
                       lambda k, pts, samples, tag, seen=seen: ReplayWorkers(frame, k, seen).measure(pts, samples),
                       cfg,
                       log=lambda m: None, knobs=knobs)
        ft.run()  # round 1 (and the guard): the data the first refit sees
        t0 = time.perf_counter()
        ft.refit()
        t1 = time.perf_counter()
        ft.cfg.ppo_steps = a.ppo_steps
        ft.train_policy()
        t2 = time.perf_counter()
        print(f"threads={torch.get_num_threads():3d}: refit {t1 - t0:6.2f} s, PPO {t2 - t1:6.2f} s "
              f"({a.ppo_steps / (t2 - t1):7.0f} steps/s), {len(ft.data)} points learned from")


if __name__ == "__main__":
    main()
