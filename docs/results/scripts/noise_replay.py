"""What fresh noise does to a replayed sweep: the exhaustive tuner on the recorded sweeps, scored
against the pooled medians (the benchmark's oracle), when every job it runs answers with the
recorded realization (the replay before the noise model: a point's recorded jobs in a shuffled
order) and when it is a fresh draw of the fitted job noise (``replay_measure``, the default now).
Budgets: one sweep (one job per knob setting, every point), and twice its GPU-time (sweep, then race: the
rest re-measures the leaders in new jobs).

    PYTHONPATH=... python docs/results/scripts/noise_replay.py
"""

from __future__ import annotations

import numpy as np

from ncclrl.agents.baselines.search import SweepRaceTuner, SweepTuner
from ncclrl.agents.problem import Decision, Evaluator, replay_measure
from ncclrl.agents.suite import replayed
from ncclrl.costmodel import nccl as N
from ncclrl.costmodel.jobcost import DEFAULT_JOB_COST
from ncclrl.costmodel.noise import JobNoise

REPLAYS = [("data/h200x2-2026-11-22/store.sqlite", "h200-2x1-sock", "nccl"),
           ("data/h200x4-2026-11-21/store.sqlite", "h200-2x2-sock", "nccl")]
SEEDS = range(5)


def recorded_measure(recorded, rng):
    """The replay before the noise model: each point's recorded jobs in an order shuffled by ``rng``."""
    order = {x: list(rng.permutation(len(v))) for x, v in recorded.items()}
    seen: dict = {}

    def measure(k, pts, samples, tag):
        out = []
        for p in pts:
            x = (k.knobs, N.COLLECTIVES.index(p.collective), p.nbytes, (p.algo, p.proto, p.channels))
            jobs = recorded.get(x)
            if not jobs:
                out.append(None)
                continue
            n = seen.get(x, 0)
            seen[x] = n + 1
            out.append(list(jobs[order[x][n % len(jobs)]]))
        return out

    return measure


def main() -> None:
    from ncclrl.agents.suite import recorded_points
    from ncclrl.costmodel.topology import load_topology
    from ncclrl.envs.replay import recorded_sweep

    print("replay | budget | replay answers | sweep (race) fraction per seed | mean | optimum (pooled medians)")
    for store, preset, launch in REPLAYS:
        inst = replayed(store, preset, launch, "allreduce")
        topo = load_topology(preset)
        frame = recorded_sweep(store, topo, launch, ("sweep", "sweep-repeat"), status="ok", collective="allreduce")
        _, recorded = recorded_points(frame, topo, [N.ALLREDUCE])
        sweep = inst.oracle.sweep_gpu_s(DEFAULT_JOB_COST, 5)
        for mult in (1, 2):
            for name in ("recorded", "fresh"):
                fr, picks = [], []
                for seed in SEEDS:
                    rng = np.random.default_rng([7, seed])
                    m = recorded_measure(recorded, rng) if name == "recorded" else \
                        replay_measure(recorded, rng, JobNoise.load(f"{preset}/{launch}"))
                    ev = Evaluator(inst.problem, m, sweep * mult * 1.02)  # a sweep's noise may cost 2% more
                    d = (SweepTuner() if mult == 1 else SweepRaceTuner()).tune(inst.problem, ev, seed)
                    fr.append(inst.oracle.score(d).fraction)
                    # the chosen knob setting, and the best its table could reach (the truth's rows under it)
                    best = inst.oracle.score(Decision(d.conf, {
                        (N.ALLREDUCE, s): inst.problem.space(N.ALLREDUCE, d.conf)[int(j)]
                        for s, j in zip(inst.problem.sizes[N.ALLREDUCE],
                                        inst.oracle.times[(d.conf.knobs, N.ALLREDUCE)].argmin(axis=0), strict=True)}))
                    picks.append(f"{d.conf.knobs}: {best.speedup:.2f}")
                print(f"{preset}/{launch} | {mult} x sweep ({sweep * mult / 60:.0f} GPU-min) | {name} | "
                      f"{', '.join(f'{x:.3f}' for x in fr)} | {np.mean(fr):.3f} | {inst.oracle.optimum:.3f}")
                print(f"#   chosen knob setting per seed: best speedup of its table: {'; '.join(picks)}")


if __name__ == "__main__":
    main()
