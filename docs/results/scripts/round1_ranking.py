"""Why live fine-tuning of h200-2x2-sock AllReduce seldom completes the sweep's best knob setting
(4 channels x 2 socket threads x 4 sockets + 256 KiB inline): CPU analysis of the store.

1. Every recorded live fine-tuning run with direct calls (tag ``finetune``, launch=nccl): its first
   round replayed from its own jobs (the same proposals: same policy, same seed), then the settings
   ranked as round 2 ranks them (measured geometric mean over the sizes measured under each).
   Printed: the rank of the sweep's best setting, the two that round 2 completes, and the sweep's
   own figure for each setting.
2. On the exhaustive sweep's data: how much slower the single candidate that round 1 measures per
   probed size (the policy's) is than the best candidate under that setting at those sizes, and
   whether the probes alone (no between-job spread: each point is the sweep's one job) rank the
   sweep's best setting first.

Between the two (1b): each setting's probes averaged over the runs, with and without 8 MiB, where
the probe (the policy's Ring/Simple) runs about 1x under the 4-channel + inline settings.

    python docs/results/scripts/round1_ranking.py [STORE]
"""

from __future__ import annotations

import itertools
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from ncclrl.agents.finetune import FinetuneConfig, Finetuner, sizes_for  # noqa: E402
from ncclrl.agents.pretrain import load_policy  # noqa: E402
from ncclrl.costmodel import nccl as N  # noqa: E402
from ncclrl.costmodel.space import KNOB_FIELDS  # noqa: E402
from ncclrl.costmodel.topology import load_topology  # noqa: E402
from ncclrl.envs.replay import ReplayWorkers, recorded_sweep  # noqa: E402
from ncclrl.envs.store import Store
from ncclrl.runners.finetune import sweep_reference

POLICY = "pretrained"


def label(k: tuple[int, ...]) -> str:
    ch, _buf, th, so, inl = k
    return f"{ch or 'NCCL'}ch {th or '-'}x{so or '-'}{' +inline' if inl else ''}"


def truth_8m(sweep, k: tuple[int, ...]) -> float:
    """The sweep's speedup over NCCL's plain default of Ring/Simple (NCCL's channels) at 8 MiB under ``k``."""
    at = sweep[sweep.nbytes == 8 << 20]
    knobs = at[list(KNOB_FIELDS)].astype(int).apply(tuple, axis=1)
    base = at[(knobs == (0,) * len(KNOB_FIELDS)) & (at.algo == "default")].median_us.iloc[0]
    row = at[(knobs == k) & (at.algo == "ring") & (at.proto == "simple") & (at.channels == 0)]
    return float(base / row.median_us.iloc[0]) if len(row) else float("nan")


def main() -> int:
    store = sys.argv[1] if len(sys.argv) > 1 else "docs/data/h200x4-2026-11-21/store.sqlite"
    topo = load_topology("h200-2x2-sock")
    coll = N.COLLECTIVES.index("allreduce")
    sizes = sizes_for(topo, [coll], 8, 256 << 20)
    sweep = recorded_sweep(store, topo, "nccl", ("sweep",), status="ok")
    truth = {tuple(map(int, k.split("/"))): v for k, v in sweep_reference(sweep, topo, sizes)["per_conf"].items()}
    best = max(truth, key=truth.get)
    with Store(Path(store)) as st:
        f = st.frame("nccl", topology=topo.name, tag="finetune").sort_values("ts")
    jobs = f.groupby("job", sort=False).agg(n=("id", "size"), t=("ts", "min"),
                                            **{k: (k, "first") for k in KNOB_FIELDS}).sort_values("t")
    plain = [i for i, r in enumerate(jobs.itertuples()) if r.n == 52 and not any(getattr(r, k) for k in KNOB_FIELDS)]
    print(f"# 1. round 1 of each live run replayed; the sweep's best: {label(best)} ({truth[best]:.2f}x in the sweep)")
    for i in plain:
        frame = f[f.job.isin(jobs.index[i:i + 14])]  # round 1: the plain defaults' job and 13 more
        seen: dict = {}
        model = load_policy(POLICY)
        model.set_random_seed(0)
        ft = Finetuner(topo, [coll], sizes, model,
                       lambda k, pts, n, tag, frame=frame, seen=seen: ReplayWorkers(frame, k, seen).measure(pts, n),
                       FinetuneConfig(budget=473, rounds=1, ppo_steps=0, verify=0), log=lambda m: None)
        ft.run()
        ranked = sorted(ft.knobs[1:], key=lambda k: -(ft.measured_value(k) or ft.conf_value(k)))
        order = [k.knobs for k in ranked]
        when = np.datetime64(int(frame.ts.min()), "s")
        print(f"run of {when}: the sweep's best ranks {order.index(best) + 1} of {len(order)} "
              f"({ft.measured_value(ranked[order.index(best)]):.2f}x measured); round 2 completes "
              + ", ".join(f"{label(k)} ({ft.measured_value(r):.2f}x measured, {truth[k]:.2f}x in the sweep)"
                          for k, r in zip(order[:2], ranked[:2], strict=True)))

    print("# 1b. the probes averaged over the runs (mean log speedup per probed size, then over sizes)")
    probes: dict[tuple[int, ...], dict[int, list[float]]] = {}
    for i in plain:
        fr = f[f.job.isin(jobs.index[i:i + 14])]
        knobs = fr[list(KNOB_FIELDS)].astype(int).apply(tuple, axis=1)
        base = fr[(knobs == (0,) * len(KNOB_FIELDS)) & (fr.algo == "default")].groupby("nbytes").median_us.min()
        for k, g in fr[knobs != (0,) * len(KNOB_FIELDS)].groupby(knobs):
            for s, v in g.groupby("nbytes").median_us.min().items():
                probes.setdefault(k, {}).setdefault(int(s), []).append(float(np.log(base[s] / v)))
    common = set.intersection(*(set(v) for v in probes.values()))  # the probed sizes (the prior has all)
    mib8 = 8 << 20
    for k, v in sorted(probes.items(), key=lambda kv: -np.mean([np.mean(kv[1][s]) for s in common])):
        allv = np.exp(np.mean([np.mean(v[s]) for s in common]))
        no8 = np.exp(np.mean([np.mean(v[s]) for s in common if s != mib8]))
        print(f"{label(k):22s} {allv:.2f}x at the {len(common)} probed sizes, {no8:.2f}x without 8 MiB, "
              f"8 MiB: {np.exp(np.mean(v[mib8])):.2f}x (sweep's job: "
              f"{truth_8m(sweep, k):.2f}x)")

    for m in (1, 2, 3):  # the first rounds of m runs averaged: where the sweep's best ranks
        ranks = []
        for runs in itertools.combinations(range(len(plain)), m):
            val = {k: np.mean([np.mean([v[s][r] for r in runs]) for s in common]) for k, v in probes.items()}
            ranks.append(sorted(val, key=val.get, reverse=True).index(best) + 1)
        print(f"{m} run(s) averaged: the sweep's best ranks {ranks}, top two in {sum(r <= 2 for r in ranks)} "
              f"of {len(ranks)}")

    print("# 2. the probes on the sweep's data (one job per point)")
    med = {(int(r.nbytes), r.algo, r.proto, int(r.channels), tuple(int(getattr(r, k)) for k in KNOB_FIELDS)):
           float(r.median_us) for r in sweep.itertuples()}
    base = {s: med[(s, "default", "default", 0, (0,) * len(KNOB_FIELDS))] for s in sizes[coll]}
    ft = Finetuner(topo, [coll], sizes, load_policy(POLICY), lambda *a: [], FinetuneConfig(budget=473, ppo_steps=0),
                   log=lambda m: None)
    for per in (1, 2):
        slow, est = [], {}
        for k in ft.knobs[1:]:
            by: dict[int, list[float]] = {}
            for p in ft.propose(k, 10**6, False, ft.cfg.probe_every, per):
                if (v := med.get((p.nbytes, p.algo, p.proto, p.channels, k.knobs))) is not None:
                    by.setdefault(p.nbytes, []).append(v)
            top = {s: min(v for (n, *_c, kk), v in med.items() if n == s and kk == k.knobs) for s in by}
            slow.append(float(np.exp(np.mean([np.log(min(v) / top[s]) for s, v in by.items()]))))
            est[k.knobs] = float(np.exp(np.mean([np.log(base[s] / min(v)) for s, v in by.items()])))
        first = max(est, key=est.get)
        print(f"{per} candidate(s) per probed size: {min(slow):.2f}-{max(slow):.2f}x slower than the setting's best "
              f"there; ranked first by the probes: {label(first)} ({est[first]:.2f}x at the probed sizes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
