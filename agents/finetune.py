"""Fine-tuning a pretrained policy on a live platform under a measurement budget.

Live measurements are expensive (every per-process knob setting is a new set of processes, every
point costs tens of microseconds to seconds), so fine-tuning works in rounds of batched
measurements, and learns between rounds from a model refit to what was measured:

1. **Propose.** For each per-process knob setting worth measuring (NCCL's defaults always; first
   the setting the pretrained model predicts best, in full, every other one at a few sizes; then
   the settings the current model predicts best) and each (collective, size): NCCL's default under that
   setting, plus the next unmeasured per-call configurations, alternately the policy's best-scored
   and the model's best-predicted. The per-call space is the exhaustive sweep's
   (``runners.sweep.call_configs``), so the two are comparable.
2. **Measure** the batch on the backend (one job per knob setting), every point into the store.
3. **Learn.** Refit the simulator's parameters to every measurement so far
   (:func:`ncclrl.costmodel.calibrate.fit`), then continue PPO training of the policy on the refit
   simulator (the live platform as the model now sees it).
4. Repeat until the budget (points, wall clock) leaves only the guard's reserve.
5. **Decide and guard.** Rank the knob settings by measured geometric-mean speedup, each with, per
   size, the best measured configuration under it; then re-measure afresh, one job per setting,
   NCCL's plain defaults and the best settings, every row next to NCCL's choice under its
   setting: a row survives only if its 95% interval lies below NCCL's in the same job (else NCCL
   decides; under a setting other than NCCL's defaults, a row no slower there also survives:
   ``rows_on_ties``; under raised channels NCCL's own algorithm at NCCL's count is a candidate
   row too), and a setting only if at no size it is slower than NCCL's plain default beyond the
   between-job noise (:meth:`Finetuner.guard`, :mod:`ncclrl.costmodel.noise`). NCCL's plain defaults with
   their surviving rows are the fallback. Budget left re-measures the exported setting's dropped
   rows next to NCCL's choice, and each is judged once more on all its jobs.

Every measurement counts against the budget, the guard's included.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ncclrl.agents.pretrain import policy_scores
from ncclrl.costmodel import nccl as N
from ncclrl.costmodel.calibrate import fit, measurements_from_store
from ncclrl.costmodel.errors import ConfigError
from ncclrl.costmodel.noise import compare, log_geomean, log_median, pooled_sigma, summarize
from ncclrl.costmodel.replica import default_decisions
from ncclrl.costmodel.simulator import Simulator
from ncclrl.costmodel.space import DEFAULT, Key, Point, call_configs, knob_grid, point_configs, size_grid
from ncclrl.costmodel.table import MAX_BYTES, Row, Table
from ncclrl.costmodel.topology import Topology
from ncclrl.envs import spaces as S
from ncclrl.envs.nccl_env import NcclTuneEnv
from ncclrl.envs.sim import SimBackend


@dataclass
class FinetuneConfig:
    """Budget and search settings.

    :param budget: measured points allowed in all (search + guard)
    :param wall_s: wall-clock budget in seconds for the whole run: no new round starts when the
        guard (a job per setting it checks, at the median job's duration so far) would not fit
        in what is left, and ``verify`` stops when a job would not
    :param rounds: most search rounds
    :param confs_per_round: knob settings completed per round after the first
    :param probe_every: the first round probes every other knob setting at every n-th size
    :param per_size: new per-call candidates per (setting, collective, size) and round, at least
        (more when the budget left, spread over the rounds left, allows)
    :param samples: samples per point while searching
    :param guard_samples: samples per point in the guard's jobs
    :param guard_confs: knob settings (besides NCCL's defaults) the guard re-measures, best first
    :param ppo_steps: PPO steps on the refit simulator after each round (0: no policy update)
    :param verify: at most this many more guard jobs, with the budget left at the end, for the rows
        of the exported setting: those the guard kept on their one job must measure faster again,
        those it dropped (not shown faster than NCCL's choice in their job) are judged once, on all
        their jobs, when the jobs end (:meth:`Finetuner._verify`)
    :param verify_reserve: the search stops early enough to leave wall-clock time for this many of
        those jobs (at most ``verify``): NCCL's own choice can measure fast in one job and slow in
        most others, so a row first judged against a fast job needs a few more jobs to be kept
    :param tie_pct: settings the guard qualified whose geometric-mean gains lie within this many
        percent of the best tie; of those, the one that saves the most time over one call at each
        size is exported (:func:`pick_option`), and the guard checks the setting whose search rows
        save the most time (:meth:`Finetuner.guard_order`). The guard measures each setting in one
        job, and two jobs of one configuration put its geometric mean over 26 sizes 7% apart in
        the median (sd 0.11 in log, 187 pairs on the 4 x H200 host run as h200-2x2-sock; docs/design/statistics.md); 0
        exports the best geometric mean
    :param rows_on_ties: under a knob setting other than NCCL's defaults, a row that its guard job
        did not show faster than NCCL's choice under the setting is still kept where it measured
        no slower there (its median at most NCCL's choice's). There NCCL's choice is not NCCL's
        default either; both are judged against the plain default. On h200-2x2-sock, NCCL's own
        choice at 32 B under 4 threads x 4 sockets + inline passed its one guard job (21.6 us,
        the row 21.0 us) and ran 0.39-0.72x in three of four validations (docs/results/live.md);
        the Tree/LL rows next to it ran 1.3-1.6x. ``False``: NCCL's choice runs wherever a row
        is not shown faster
    :param seed: seed of the search and of the policy's updates
    """

    budget: int = 200
    wall_s: float = 1800.0
    rounds: int = 3
    confs_per_round: int = 2
    probe_every: int = 4
    per_size: int = 1
    samples: int = 5
    guard_samples: int = 9
    guard_confs: int = 2
    ppo_steps: int = 8192
    verify: int = 8
    verify_reserve: int = 3
    tie_pct: float = 10.0
    rows_on_ties: bool = True
    seed: int = 0

    def check(self) -> None:
        for name in ("budget", "rounds", "samples", "guard_samples", "per_size"):
            if getattr(self, name) < 1:
                raise ConfigError(name, f"must be >= 1, got {getattr(self, name)}")
        for name in ("confs_per_round", "ppo_steps", "guard_confs", "verify", "verify_reserve"):
            if getattr(self, name) < 0:
                raise ConfigError(name, f"must be >= 0, got {getattr(self, name)}")
        if not 0 <= self.tie_pct < 100:
            raise ConfigError("tie_pct", f"must be in [0, 100), got {self.tie_pct}; 0 exports the best geometric mean")


@dataclass
class Outcome:
    conf: Point
    rows: list[dict[str, Any]]
    measured: int
    rounds: int
    history: list[dict[str, Any]] = field(default_factory=list)
    guard: list[dict[str, Any]] = field(default_factory=list)


def guard_reserve(n_sizes: int, n_knobs: int, guard_confs: int) -> int:
    """Points the guard needs at most: NCCL's plain defaults and their rows, the same for each
    checked knob setting, and the re-measurement of up to a quarter of the sizes on both sides."""
    return 2 * n_sizes * (1 + min(guard_confs, n_knobs - 1)) + 2 * max(2, n_sizes // 4)


def pick_option(options: list[tuple[float, float, Any]], tie_pct: float) -> tuple[float, float, Any]:
    """The option to export from ``(gain, saved_us, payload)`` tuples: among those whose
    geometric-mean gain is within ``tie_pct`` percent of the best, the one that saves the most
    time (``saved_us``: NCCL's plain default minus the option, summed over one call at each size);
    ties in that keep the earlier option. The geometric mean weighs every size alike, so settings
    2% apart on it can differ by 20-30% at 64-256 MiB (h200-2x2-sock: NCCL's 2 channels against 4),
    where a call takes milliseconds rather than microseconds."""
    best = max(o[0] for o in options)
    close = [o for o in options if o[0] >= best * (1 - tie_pct / 100)]
    return max(close, key=lambda o: o[1])


def knob_label(k: Point) -> str:
    return " ".join(f"{a}={b}" for a, b in k.env().items()) or "NCCL defaults"


class Finetuner:
    """One fine-tuning run. ``measure(knobs, points, samples, tag)`` returns samples (or ``None``)
    per point and stores them; the runner wires it to a live or replay backend."""

    def __init__(self, topo: Topology, collectives: list[int], sizes: dict[int, list[int]], model,
                 measure: Callable[[Point, list[Point], int, str], list[list[float] | None]],
                 cfg: FinetuneConfig, log: Callable[[str], None] = print, sim: Simulator | None = None,
                 knobs: list[Point] | None = None,
                 noise_prior: dict[str, dict[int, tuple[float, int]]] | None = None) -> None:
        cfg.check()
        # the between-job spread to judge by, per collective and size, instead of the run's own
        # repeated jobs (a replayed sweep with one job per point answers a repeat with the same
        # samples: its spread would be zero)
        self.noise_prior = noise_prior
        self.topo, self.colls, self.sizes, self.model, self.cfg = topo, collectives, sizes, model, cfg
        self._measure, self.log = measure, log
        self.sim = sim or Simulator(topo, seed=cfg.seed)
        self.knobs = knobs or knob_grid(topo, "full")
        if any(self.knobs[0].knobs):
            raise ConfigError("knobs", "the first knob setting must be NCCL's defaults (the reference)")
        self.base_knobs = self.knobs[0]
        self.data: dict[tuple[tuple[int, ...], str, int, Key], list[float]] = {}
        # every job's samples per point (search and guard): repeated jobs of one point give the
        # between-job spread the guard judges cross-job comparisons with (runners.noise)
        self.jobs: dict[tuple[tuple[int, ...], str, int, Key], list[list[float]]] = {}
        self.used = 0
        self.job_s: list[float] = []  # each job's wall-clock duration
        self._t0 = time.time()
        self.n_sizes = sum(len(v) for v in sizes.values())
        # the guard: plain defaults + rows, then per checked setting its defaults + rows
        self.reserve = guard_reserve(self.n_sizes, len(self.knobs), cfg.guard_confs)
        self._noise: dict[str, dict[int, tuple[float, int]]] = {}

    # -- bookkeeping -------------------------------------------------------------------------
    def median(self, k: Point, coll: str, s: int, key: Key) -> float | None:
        v = self.data.get((k.knobs, coll, s, key))
        return summarize(v)[0] if v else None

    def _run(self, k: Point, pts: list[Point], samples: int, tag: str) -> list[list[float] | None]:
        """One job under ``k``, counted; search measurements (``tag`` "finetune") also feed the
        model, guard measurements only the between-job spread."""
        t = time.time()
        res = self._measure(k, pts, samples, tag)
        self.job_s.append(time.time() - t)
        self.used += len(pts)
        for p, r in zip(pts, res, strict=True):
            if r:
                key = (k.knobs, p.collective, p.nbytes, (p.algo, p.proto, p.channels))
                self.jobs.setdefault(key, []).append(list(r))
                if tag != "guard":
                    self.data.setdefault(key, []).extend(r)
        return res

    def time_left(self, jobs: float) -> bool:
        """Whether ``jobs`` more jobs of the median duration so far fit in the wall-clock budget."""
        per = float(np.median(self.job_s)) if self.job_s else 0.0
        return time.time() - self._t0 + jobs * per <= self.cfg.wall_s

    def noise(self, coll: str) -> dict[int, tuple[float, int]]:
        """Per size of ``coll``: the between-job sigma (log scale) and its degrees of freedom, from
        every point measured in more than one job so far (:func:`ncclrl.costmodel.noise.pooled_sigma`)."""
        sizes = self.sizes[N.COLLECTIVES.index(coll)]
        groups: list[list[list[float]]] = [[] for _ in sizes]
        at = {s: i for i, s in enumerate(sizes)}
        for (_, c, s, _), jobs in self.jobs.items():
            if c == coll and s in at and len(jobs) > 1:
                groups[at[s]].append([log_median(j) for j in jobs])
        sigma, df = pooled_sigma(groups)
        return {s: (float(sigma[i]), int(df[i])) for i, s in enumerate(sizes)}

    def _refresh_noise(self) -> None:
        """The between-job spread per collective and size from every job so far (read by :meth:`loses`)."""
        self._noise = {N.COLLECTIVES[c]: self.noise(N.COLLECTIVES[c]) for c in self.colls}
        for name, per_size in (self.noise_prior or {}).items():
            if name in self._noise:
                self._noise[name].update(per_size)

    def loses(self, x: tuple[str, int], jobs: list[list[float]], ref: list[list[float]]) -> bool:
        """``jobs`` slower than ``ref`` (NCCL's plain default) at ``x`` beyond the between-job noise."""
        if not jobs or not ref:
            return False
        sigma, df = self._noise.get(x[0], {}).get(x[1], (0.0, 0))
        return compare(ref, jobs, sigma, df).verdict == "slower"

    # -- proposing ---------------------------------------------------------------------------
    def policy_order(self, coll: int, sizes: list[int], space: list[Key], comm: int) -> list[list[Key]]:
        """Per size, the per-call candidates in the policy's order (best first); without a policy,
        the model's order."""
        if self.model is None:
            pred = self.predicted(Point("x", 1, comm_channels=comm), coll, sizes, space)
            return [[space[j] for j in np.argsort(pred[:, i], kind="stable") if space[j] != DEFAULT]
                    for i in range(len(sizes))]

        s = np.asarray(sizes, dtype=np.int64)
        obs = S.observations(self.topo, coll, s)
        mask = np.broadcast_to(S.action_mask(self.topo, coll), (s.size, S.N_ACTIONS))
        scores = policy_scores(self.model, obs, mask)
        a, p, ch, chunk = S.decode_all()
        comm = comm or self.topo.nccl.channels
        out = []
        for i in range(s.size):
            best: dict[Key, float] = {}
            for key in space:
                if key[0] == "default":  # NCCL's own algorithm: no action of the policy's
                    continue
                ai, pi = N.ALGOS.index(key[0]), N.PROTOS.index(key[1])
                # the policy knows the communicator's default channels; "the communicator's maximum"
                # under a knob setting maps to its own maximum choice
                top = min(comm, self.topo.nccl.channels)
                want = ch == 0 if key[2] == 0 else (ch == 1 if key[2] == 1 else ch >= top)
                sel = (a == ai) & (p == pi) & want & (chunk == 0) & mask[i]
                best[key] = float(scores[i, sel].max()) if sel.any() else -np.inf
            out.append(sorted(best, key=lambda k: -best[k]))
        return out

    def predicted(self, k: Point, coll: int, sizes: list[int], space: list[Key]) -> np.ndarray:
        """Model-predicted time (us) of each candidate key, shape (len(space), len(sizes))."""
        s = np.asarray(sizes, dtype=np.int64)
        cfg = point_configs(self.topo, k, coll, np.tile(s, len(space)), [key for key in space for _ in s])
        return self.sim.time_us(cfg).reshape(len(space), s.size)

    def measured_value(self, k: Point) -> float | None:
        """Geometric-mean speedup over NCCL's plain default of the best measured point under ``k``,
        over the sizes measured under ``k`` (``None`` before any)."""
        logs = []
        for c in self.colls:
            name = N.COLLECTIVES[c]
            for s in self.sizes[c]:
                base = self.median(self.base_knobs, name, s, DEFAULT)
                meas = [m for key in [DEFAULT] + call_configs(self.topo, c, k, "full")
                        if (m := self.median(k, name, s, key)) is not None]
                if base and meas:
                    logs.append(np.log(base / min(meas)))
        return float(np.exp(np.mean(logs))) if logs else None

    def conf_value(self, k: Point) -> float:
        """Predicted (measured where known) geometric-mean speedup of the best per-call choice
        under ``k`` over NCCL's plain default."""
        logs = []
        for c in self.colls:
            name, sizes = N.COLLECTIVES[c], self.sizes[c]
            space = [DEFAULT] + call_configs(self.topo, c, k, "full")
            pred = self.predicted(k, c, sizes, space).min(axis=0)
            base = self.predicted(self.base_knobs, c, sizes, [DEFAULT])[0]
            for i, s in enumerate(sizes):
                b = self.median(self.base_knobs, name, s, DEFAULT) or base[i]
                meas = [m for key in space if (m := self.median(k, name, s, key)) is not None]
                logs.append(np.log(b / min([pred[i], *meas])))
        return float(np.exp(np.mean(logs)))

    def propose(self, k: Point, room: int, with_default: bool, every: int = 1, per_size: int = 0) -> list[Point]:
        """Under knob setting ``k``: per (collective, size) the next ``per_size`` unmeasured
        candidates, alternately the policy's best-scored and the model's best-predicted (and NCCL's
        default under ``k`` first when ``with_default``); ``every`` > 1 probes every n-th size
        only (and the largest)."""
        pts: list[Point] = []
        for c in self.colls:
            name, sizes = N.COLLECTIVES[c], self.sizes[c]
            space = [DEFAULT] + call_configs(self.topo, c, k, "full")
            pol = self.policy_order(c, sizes, space, k.comm_channels)
            pred = self.predicted(k, c, sizes, space)
            for i, s in enumerate(sizes):
                if every > 1 and i % every and i != len(sizes) - 1:
                    continue
                seen = {key for key in space if (k.knobs, name, s, key) in self.data}
                want: list[Key] = [DEFAULT] if with_default and DEFAULT not in seen else []
                n0 = len(want)
                by_model = [space[j] for j in np.argsort(pred[:, i], kind="stable")]
                for j in range(2 * len(space)):
                    if len(want) - n0 >= (per_size or self.cfg.per_size):
                        break
                    nxt = next((x for x in (pol[i], by_model)[j % 2] if x not in seen and x not in want
                                and x != DEFAULT), None)
                    if nxt is not None:
                        want.append(nxt)
                pts += [Point(name, s, *key, *k.knobs) for key in want]
        return pts[:room]

    def remeasure(self, k: Point, room: int, top: int = 2) -> list[Point]:
        """Under ``k``, per (collective, size) NCCL's default and the ``top`` candidates with the
        lowest pooled median so far, to be measured again (all of them, or nothing when ``room``
        is short): with budget to spare, the leaders are compared on more samples before one is
        picked, since the best of many single measurements is partly the luckiest."""
        pts: list[Point] = []
        for c in self.colls:
            name = N.COLLECTIVES[c]
            for s in self.sizes[c]:
                meds = {key: m for key in [DEFAULT] + call_configs(self.topo, c, k, "full")
                        if (m := self.median(k, name, s, key)) is not None}
                lead = [key for key in sorted(meds, key=meds.get) if key != DEFAULT][:top]
                pts += [Point(name, s, *key, *k.knobs) for key in ([DEFAULT] if DEFAULT in meds else []) + lead]
        return pts if len(pts) <= room else []

    # -- learning ----------------------------------------------------------------------------
    def refit(self) -> None:
        import pandas as pd

        rows = [{"topology": self.topo.name, "status": "ok", "collective": coll, "nbytes": s, "algo": key[0],
                 "proto": key[1], "channels": key[2], "comm_channels": kn[0], "buffsize_bytes": kn[1],
                 "socket_nthreads": kn[2], "nsocks_perthread": kn[3], "socket_inline_bytes": kn[4],
                 "median_us": summarize(v)[0]}
                for (kn, coll, s, key), v in self.data.items()]
        if len(rows) < 10:
            return
        res = fit(self.topo, measurements_from_store(self.topo, pd.DataFrame(rows)), self.sim.params)
        self.sim = Simulator(self.topo, res.params, seed=self.cfg.seed)

    def train_policy(self) -> None:
        if not self.cfg.ppo_steps or self.model is None:
            return
        from stable_baselines3.common.vec_env import DummyVecEnv

        lo = min(min(v) for v in self.sizes.values())
        hi = max(max(v) for v in self.sizes.values())

        def make(rank: int):
            def _f():
                env = NcclTuneEnv(backends=[SimBackend(self.topo, simulator=self.sim)],
                                  collectives=[N.COLLECTIVES[c] for c in self.colls], min_bytes=lo, max_bytes=hi)
                env.reset(seed=self.cfg.seed * 1000 + rank)
                return env
            return _f

        self.model.set_env(DummyVecEnv([make(i) for i in range(self.model.n_envs)]))
        self.model.learn(total_timesteps=self.cfg.ppo_steps, reset_num_timesteps=False, progress_bar=False)

    # -- the run -----------------------------------------------------------------------------
    def run(self) -> Outcome:
        t0 = self._t0 = time.time()
        history = []
        r = 0
        # NCCL's defaults, each setting it checks, retests, and the verification's reserved jobs
        guard_jobs = 1 + self.cfg.guard_confs + 2 + min(self.cfg.verify, self.cfg.verify_reserve)
        for r in range(self.cfg.rounds):
            t_round = time.time()
            room = self.cfg.budget - self.reserve - self.used
            if room <= 0 or not self.time_left(1 + guard_jobs):  # a round is at least a job
                break
            batch: list[tuple[Point, list[Point]]] = []
            if r == 0:
                # NCCL's plain defaults at every size (the reference); the setting the pretrained
                # model predicts best completed with the policy's choices (the prior, checked
                # first); then candidates under NCCL's defaults; every other setting probed at a
                # few sizes, predicted best first. A tight budget is spent in that order.
                order = sorted(self.knobs[1:], key=lambda k: -self.conf_value(k))
                defaults = [p for p in self.propose(self.base_knobs, room, True, 1) if p.is_default]
                room -= len(defaults)
                steps = [(k, False, 1) for k in order[:1]] + [(self.base_knobs, False, 1)]
                steps += [(k, False, self.cfg.probe_every) for k in order[1:]]
                got: dict[tuple[int, ...], tuple[Point, list[Point]]] = {self.base_knobs.knobs: (self.base_knobs,
                                                                                                 defaults)}
                for k, with_default, every in steps:
                    if room <= 0:
                        break
                    pts = [p for p in self.propose(k, room, with_default, every) if not p.is_default or k.knobs]
                    got.setdefault(k.knobs, (k, []))[1].extend(pts)
                    room -= len(pts)
                batch = [(k, pts) for k, pts in got.values() if pts]
            else:  # complete the settings the refit model (measurements where known) ranks best
                # settings probed in the same sizes compare by measurement; the model ranks the rest
                ranked = sorted(self.knobs[1:], key=lambda k: -(self.measured_value(k) or self.conf_value(k)))
                # the search room spread over the rounds left: more candidates per size when it allows
                share = room // max(1, self.cfg.rounds - r)
                per = max(self.cfg.per_size, share // max(1, self.cfg.confs_per_round * self.n_sizes))
                for k in ranked:  # the best ones with something left to measure
                    if len(batch) >= self.cfg.confs_per_round or room <= 0:
                        break
                    pts = self.propose(k, room, False, 1, per)
                    if pts:
                        batch.append((k, pts))
                        room -= len(pts)
            again = not batch and r > 0
            if again:  # nothing left to measure in the best settings: measure their leaders again
                for k, _rows, _g in self.ranked()[: self.cfg.confs_per_round]:
                    pts = self.remeasure(k, room)
                    if pts:
                        batch.append((k, pts))
                        room -= len(pts)
            if not batch:
                break
            t_jobs = time.time()
            for j, (k, pts) in enumerate(batch):
                if j >= 2 and not self.time_left(1 + guard_jobs):  # the reference and the prior always run
                    self.log(f"# round {r + 1}: wall clock: {len(batch) - j} settings left unmeasured for the guard")
                    break
                self.log(f"# round {r + 1}: {knob_label(k)}: {len(pts)} points")
                self._run(k, pts, self.cfg.samples, "finetune")
            t_refit = t_ppo = time.time()
            if not again:  # re-measured leaders teach the model nothing new about the space
                self.refit()
                t_ppo = time.time()
                self.train_policy()
            t_end = time.time()
            # where a round's wall clock goes: choosing what to measure, the jobs, refit, PPO
            took = {"propose_s": round(t_jobs - t_round, 1), "jobs_s": round(t_refit - t_jobs, 1),
                    "refit_s": round(t_ppo - t_refit, 1), "ppo_s": round(t_end - t_ppo, 1)}
            self.log(f"# round {r + 1}: " + ", ".join(f"{k[:-2]} {v} s" for k, v in took.items()))
            history.append({"round": r + 1, "measured": self.used, "wall_s": round(time.time() - t0, 1), **took,
                            "confs": [knob_label(k) for k, _ in batch],
                            "predicted_best": round(max(self.conf_value(k) for k in self.knobs), 3)})
        guard = self.guard(self.guard_order(self.ranked()))
        return Outcome(conf=guard["conf"], rows=guard["rows"], measured=self.used, rounds=len(history),
                       history=history, guard=guard["checks"])

    def ranked(self) -> list[tuple[Point, list[dict[str, Any]], float]]:
        """Knob settings with every size measured, best measured geometric-mean speedup first, each
        with its rows: per size the best measured configuration under it (NCCL's default under the
        setting where nothing measured beat it)."""
        out = []
        for k in self.knobs:
            rows, logs, complete = [], [], True
            for c in self.colls:
                name = N.COLLECTIVES[c]
                for s in self.sizes[c]:
                    base = self.median(self.base_knobs, name, s, DEFAULT)
                    cands = {key: m for key in [DEFAULT] + call_configs(self.topo, c, k, "full")
                             if (m := self.median(k, name, s, key)) is not None}
                    if base is None or not cands:
                        complete = False
                        break
                    key = min(cands, key=cands.get)
                    rows.append({"collective": name, "nbytes": s, "key": key, "time_us": cands[key],
                                 "base_us": base})
                    logs.append(np.log(base / cands[key]))
                if not complete:
                    break
            if complete:
                out.append((k, rows, float(np.exp(np.mean(logs)))))
        return sorted(out, key=lambda x: -x[2])

    def guard_order(self, ranked: list[tuple[Point, list[dict[str, Any]], float]]) -> list[tuple[Point, list]]:
        """The settings in the order the guard checks them (it takes NCCL's plain defaults and the
        first ``guard_confs`` others): by the search's geometric mean, except that with
        ``tie_pct`` > 0 and two or more to check, the setting whose rows save the most time over
        one call per size (the search's medians) takes the last place when it is not among them.
        Export picks by time saved among near-ties, so the setting that saves the most must be
        checked to be picked: on 2x2 the search ranks settings with 2 and 4 channels within a few
        percent on the geometric mean, and 4 channels run 20-30% faster at 64-256 MiB."""
        out = [(k, rows) for k, rows, _ in ranked]
        others = [i for i, (k, _) in enumerate(out) if k.knobs != self.base_knobs.knobs]
        n = self.cfg.guard_confs
        if self.cfg.tie_pct <= 0 or n < 2 or len(others) <= n:
            return out
        most = max(others, key=lambda i: sum(r["base_us"] - r["time_us"] for r in out[i][1]))
        if most not in others[:n]:
            out.insert(others[n - 1], out.pop(most))
            self.log(f"# guard: also checking {knob_label(out[others[n - 1]][0])}: its rows save the most time")
        return out

    def own_at_count(self, conf: Point, rows: list[dict[str, Any]]) -> dict[tuple[str, int], dict[str, Any]]:
        """Under a setting that raises the communicator's channels above NCCL's count: the sizes
        where the guard also measures NCCL's own algorithm and protocol at NCCL's count, as a row
        (``("default", "default", count)``). At each size where NCCL's own per-call choice would
        use more channels than its count under ``conf`` (:func:`ncclrl.costmodel.replica.default_decisions`),
        unless the search's row there runs at least twice as fast as NCCL's plain default (the
        raised count is why: there NCCL's count cannot compete; on h200-2x2-sock Ring/Simple with 2
        channels also hangs at 256 MiB with inline sends)."""
        count = self.topo.nccl.channels
        if conf.comm_channels <= count:
            return {}
        key = ("default", "default", count)
        by = {(r["collective"], r["nbytes"]): r for r in rows}
        out = {}
        for c in self.colls:
            name, sizes = N.COLLECTIVES[c], self.sizes[c]
            d = default_decisions(self.topo, c, np.asarray(sizes, dtype=np.int64), comm_channels=conf.comm_channels)
            for s, ch in zip(sizes, d.channels, strict=True):
                r, plain = by.get((name, s)), self.median(self.base_knobs, name, s, DEFAULT)
                if ch <= count or (r is not None and r["key"] == key):
                    continue
                if r is not None and plain and r["time_us"] * 2 <= plain:
                    continue
                out[(name, s)] = {"collective": name, "nbytes": s, "key": key, "time_us": None, "base_us": plain}
        return out

    def _guard_job(self, conf: Point, rows: list[dict[str, Any]], checks: list[dict[str, Any]],
                   extra: dict[tuple[str, int], dict[str, Any]] | None = None) -> _GuardJob:
        """One job under ``conf``: per size NCCL's default under it and the row when it differs
        (and ``extra``, NCCL's own algorithm at NCCL's channel count where :meth:`own_at_count`
        says: the faster of the two in the job is the row). A row is kept if its 95% interval lies below the
        default's (the same job: no between-job noise between the two)."""
        cand = {(r["collective"], r["nbytes"]): r for r in rows if r["key"] != DEFAULT}
        extra = extra or {}
        pts, where = [], {}  # per size: NCCL's choice's index, then its candidate rows
        for c in self.colls:
            name = N.COLLECTIVES[c]
            for s in self.sizes[c]:
                rs = [r for r in (cand.get((name, s)), extra.get((name, s))) if r is not None]
                where[(name, s)] = (len(pts), rs)
                pts += [Point(name, s, *key, *conf.knobs) for key in [DEFAULT] + [r["key"] for r in rs]]
        res = self._run(conf, pts, self.cfg.guard_samples, "guard")
        job = _GuardJob()
        for (name, s), (i, rs) in where.items():
            d = res[i]
            job.default[(name, s)] = job.final[(name, s)] = [d] if d else []
            got = [(r, res[i + 1 + j]) for j, r in enumerate(rs)]
            if got:
                # the faster of the search's row and NCCL's own algorithm at NCCL's count, in this job
                r, t = min(got, key=lambda g: summarize(g[1])[0] if g[1] else np.inf)
                if r["time_us"] is None and t:
                    r = dict(r, time_us=summarize(t)[0])
                ok = bool(d and t and summarize(t)[2] < summarize(d)[1])
                checks.append({"knobs": knob_label(conf), "collective": name, "nbytes": s,
                               "config": "/".join(map(str, r["key"])), "default_us": summarize(d)[0] if d else None,
                               "row_us": summarize(t)[0] if t else None, "kept": ok,
                               **({"candidates": {"/".join(map(str, g[0]["key"])): summarize(g[1])[0] if g[1] else None
                                                  for g in got}} if len(got) > 1 else {})})
                if ok:
                    job.kept.append(r)
                    job.final[(name, s)] = [t]
                    job.shown[(name, s)] = (r, [t], [d])
                elif t and d:
                    job.dropped[(name, s)] = (r, [t], [d])
        return job

    def guard(self, ranked: list[tuple[Point, list[dict[str, Any]]]]) -> dict[str, Any]:
        """Re-measure afresh before anything is exported, every point counted:

        1. NCCL's plain defaults with the rows found under them (one job): a row survives only if
           its 95% interval lies below NCCL's default in the same job; what survives is the
           fallback.
        2. Then, best first, up to ``guard_confs`` knob settings with their rows (one job each, the
           same row test against NCCL's default under the setting; with ``rows_on_ties`` a row no
           slower than it in the job stays too; under raised channels the faster of the row and
           NCCL's own algorithm at NCCL's count, :meth:`own_at_count`, is tested). A setting qualifies only if
           at no size what the table would run there is slower than NCCL's plain default beyond
           the between-job noise (:mod:`ncclrl.costmodel.noise`: the setting's guard jobs against every job
           of the plain default, with the spread that this run's repeated jobs show); sizes where
           it loses (a few) are re-measured once on both sides in fresh jobs and judged again.
        3. Of the qualifying options whose geometric-mean speedup over the plain default is within
           ``tie_pct`` of the best, the one that saves the most time is exported
           (:func:`pick_option`); the fallback qualifies by construction.
        """
        checks: list[dict[str, Any]] = []
        base_rows = next((rows for k, rows in ranked if k.knobs == self.base_knobs.knobs), [])
        base = self._guard_job(self.base_knobs, base_rows, checks)

        def plain_jobs() -> dict[tuple[str, int], list[list[float]]]:  # every job of NCCL's plain default
            return {x: self.jobs.get((self.base_knobs.knobs, *x, DEFAULT), []) for x in base.default}

        plain = plain_jobs()
        with_row = {(r["collective"], r["nbytes"]) for r in base.kept}
        for x in base.final:  # the fallback runs NCCL's plain default where no row survived
            if x not in with_row:
                base.final[x] = plain[x]

        def score(fin: dict) -> tuple[float, float]:
            """The geometric-mean gain over NCCL's plain default, and the time saved over one call
            at each size (NCCL's plain default minus this)."""
            a = np.array([log_geomean(plain[x]) for x, v in fin.items() if v and plain[x]])
            b = np.array([log_geomean(v) for x, v in fin.items() if v and plain[x]])
            if not a.size:
                return 0.0, 0.0
            return float(np.exp(np.mean(a - b))), float(np.sum(np.exp(a) - np.exp(b)))

        options = [(*score(base.final), (self.base_knobs, base.kept, base))]
        checks.append({"knobs": knob_label(self.base_knobs), "collective": "*", "nbytes": 0, "gain": options[0][0],
                       "saved_us": options[0][1], "slower": [], "kept": True})
        for j, (conf, rows) in enumerate([(k, r) for k, r in ranked if k.knobs != self.base_knobs.knobs]
                                         [: self.cfg.guard_confs]):
            need = self.n_sizes + sum(r["key"] != DEFAULT for r in rows)
            if self.used + need > self.cfg.budget:
                self.log(f"# guard: no budget left to check {knob_label(conf)} ({need} points)")
                break
            # NCCL's own algorithm at NCCL's channel count too, from the budget the guard's reserve
            # leaves over (what the settings still to check need comes first)
            extra = self.own_at_count(conf, rows)
            if self.used + need + len(extra) + (self.cfg.guard_confs - j - 1) * 2 * self.n_sizes > self.cfg.budget:
                extra = {}
            job = self._guard_job(conf, rows, checks, extra)
            self._refresh_noise()
            kept_c, final_c = job.kept, job.final
            # a row not shown faster than NCCL's choice under the setting still beats running that
            # choice where the choice loses to the plain default and the row does not
            for x, (r, t, _) in list(job.dropped.items()):
                if self.loses(x, final_c[x], plain[x]) and not self.loses(x, t, plain[x]):
                    kept_c.append(r)  # judged against the plain default, not NCCL's choice: not re-judged
                    final_c[x] = t
                    del job.dropped[x]
            # under a setting NCCL's defaults do not run, NCCL's choice is no reference either: a
            # row that measured no slower than it in the job stays (both are judged against the
            # plain default below; the row has the search's jobs besides)
            if self.cfg.rows_on_ties:
                for x, (r, t, d) in list(job.dropped.items()):
                    if log_geomean(t) <= log_geomean(d):
                        kept_c.append(r)
                        final_c[x] = t
                        del job.dropped[x]
                        first_check(checks, conf, x).update(kept=True, on_tie=True)  # why it stays
            slow = [x for x, v in final_c.items() if not v or self.loses(x, v, plain[x])]
            # a setting that loses at a few sizes gets those sizes re-measured, both sides in fresh
            # jobs, and is judged again on all their jobs
            if slow and len(slow) <= max(2, self.n_sizes // 4) and self.used + 2 * len(slow) <= self.cfg.budget:
                by_row = {(r["collective"], r["nbytes"]): r["key"] for r in kept_c}
                self._run(self.base_knobs, [Point(n, s) for n, s in slow], self.cfg.guard_samples, "guard")
                again = self._run(conf, [Point(n, s, *by_row.get((n, s), DEFAULT), *conf.knobs) for n, s in slow],
                                  self.cfg.guard_samples, "guard")
                plain = plain_jobs()
                for x, c in zip(slow, again, strict=True):
                    final_c[x] = list(final_c[x]) + ([c] if c else [])
                self._refresh_noise()
                slow = [x for x, v in final_c.items() if not v or self.loses(x, v, plain[x])]
            slower = [f"{n}:{s}" for n, s in slow]
            g, saved = score(final_c)
            checks.append({"knobs": knob_label(conf), "collective": "*", "nbytes": 0, "gain": g, "saved_us": saved,
                           "slower": slower, "kept": not slower})
            self.log(f"# guard: {knob_label(conf)}: {g:.2f}x over NCCL's plain default, {saved:.0f} us saved over "
                     f"one call per size, {len(slower)} sizes slower{' (' + ', '.join(slower) + ')' if slower else ''}")
            if not slower:
                options.append((g, saved, (conf, kept_c, job)))
        g, saved, (conf, rows, job) = pick_option(options, self.cfg.tie_pct)
        if g < max(o[0] for o in options):
            self.log(f"# guard: exporting {knob_label(conf)}: its {g:.2f}x is within tie_pct={self.cfg.tie_pct:g}% "
                     f"of the best and it saves the most time ({saved:.0f} us)")
        added, withdrawn = self._verify(conf, job.dropped, checks, job.shown)
        rows = [r for r in rows if (r["collective"], r["nbytes"]) not in withdrawn] + added
        return {"conf": conf, "rows": rows, "checks": checks, "gain": g}

    def _verify(self, conf: Point, dropped: dict, checks: list[dict[str, Any]],
                kept: dict | None = None) -> tuple[list[dict[str, Any]], set[tuple[str, int]]]:
        """With the budget left, up to ``verify`` more jobs under the exported setting for its rows:
        those the guard kept on their one job (``kept``) and those it dropped (not shown faster than
        NCCL's choice in their job). Each job re-measures every such row and NCCL's choice next to
        it. When the jobs end (at ``verify``, the budget or the wall clock: none depends on how a row
        measures) each row is judged once:

        - a dropped row on all its jobs, at the guard's 2.5% level against the between-job noise;
          shown faster, it is added;
        - a kept row must replicate: over its verification jobs alone, NCCL's choice measured next
          to it in each, the row must again be faster (:func:`replicated`); else it is withdrawn
          and NCCL's choice runs there. The guard's same-job test is passed by a job in which NCCL's
          choice alone ran slow (seen on h200-2x1-sock: a 1 MiB row kept against a 1.34x slower job of NCCL's
          choice validated 0.89x); a second job seldom repeats that. Asking for a second
          significant test instead would withdraw most good rows at small sizes on socket
          networks, where one point's paired ratio spreads 0.23-0.48 (log) between jobs
          (docs/results/scripts/paired_spread.py).

        When the budget left cannot pay for ``verify`` jobs of them all, the kept rows and the
        dropped ones that measured faster in their guard job, if it pays for three; else the kept
        rows alone (a wrong one makes the table slower, a wrong drop only loses a gain), those with
        the smallest margin in their job first. One look at the end, and no row given up on the way: a
        look per job would need 2.5% / ``verify`` each, and dropping a row whenever its jobs so far
        do not measure it faster loses most rows a few percent faster; either leaves such gains
        unprovable however many jobs the budget buys.

        :return: the dropped rows now kept, and the (collective, nbytes) of kept rows withdrawn
        """
        kept = dict(kept or {})
        faster = [x for x, v in dropped.items() if log_geomean(v[1]) < log_geomean(v[2])]
        rest = [x for x in dropped if x not in faster]
        # kept rows with the smallest margin in their job first, dropped ones with the largest
        order = (sorted(kept, key=lambda x: log_geomean(kept[x][2]) - log_geomean(kept[x][1]))
                 + sorted(faster, key=lambda x: log_geomean(dropped[x][1]) - log_geomean(dropped[x][2])) + rest)
        left = self.cfg.budget - self.used
        # every row when the budget pays for ``verify`` jobs of them all; else the kept rows and the
        # dropped ones that measured faster when it pays for three; else the kept ones (as many as
        # one job can take)
        tiers = [(order, self.cfg.verify), (order[:len(kept) + len(faster)], min(3, self.cfg.verify)),
                 (order[:len(kept)], 1)]
        pend_xs = next((t for t, jobs in tiers if t and 2 * len(t) * jobs <= left), order[:len(kept)][:left // 2])
        pend = {x: kept[x] if x in kept else dropped[x] for x in pend_xs}
        for _ in range(self.cfg.verify):
            if not pend or self.used + 2 * len(pend) > self.cfg.budget or not self.time_left(1):
                break
            xs = list(pend)
            pts = [p for n, s in xs for p in (Point(n, s, *DEFAULT, *conf.knobs),
                                              Point(n, s, *pend[(n, s)][0]["key"], *conf.knobs))]
            res = self._run(conf, pts, self.cfg.guard_samples, "guard")
            for i, x in enumerate(xs):
                _r, t, d = pend[x]
                if res[2 * i] and res[2 * i + 1]:  # side by side in this job: the pairs stay aligned
                    d.append(res[2 * i])
                    t.append(res[2 * i + 1])
        self._refresh_noise()
        added: list[dict[str, Any]] = []
        withdrawn: set[tuple[str, int]] = set()
        for x, (r, t, d) in pend.items():
            if len(t) < 2:  # no verification job ran: the guard's own look stands
                continue
            if x in kept:  # replicated: faster again over the verification jobs, side by side
                shown = replicated(d[1:], t[1:])
                a_us, b_us = float(np.exp(log_geomean(d))), float(np.exp(log_geomean(t)))
            else:
                sigma, df = self._noise.get(x[0], {}).get(x[1], (0.0, 0))
                c = compare(d, t, sigma, df)
                shown, a_us, b_us = c.verdict == "faster", c.a_us, c.b_us
            if x in kept and not shown:
                withdrawn.add(x)
            elif x not in kept and shown:
                added.append(r)
            g = first_check(checks, conf, x)  # the row's check, now judged on all its jobs
            if g is not None and "jobs" not in g:
                g.update(kept=shown, jobs=len(t), default_us=a_us, row_us=b_us)
        if withdrawn:
            self.log(f"# verify: {len(withdrawn)} of {len(kept)} kept rows not shown faster on all their jobs: "
                     + ", ".join(f"{n}:{s}" for n, s in sorted(withdrawn)))
        return added, withdrawn


def first_check(checks: list[dict[str, Any]], conf: Point, x: tuple[str, int]) -> dict[str, Any] | None:
    """The guard's first check of the row at ``x`` (collective, size) under ``conf``."""
    return next((g for g in checks if (g["knobs"], g["collective"], g["nbytes"]) == (knob_label(conf), *x)), None)


def replicated(default_jobs: list[list[float]], row_jobs: list[list[float]]) -> bool:
    """Whether a row measured faster than NCCL's choice again: the geometric mean over jobs of the
    ratio of the two job medians, each pair from one job, above 1. ``False`` without a job."""
    r = [log_median(d) - log_median(t) for d, t in zip(default_jobs, row_jobs, strict=True)]
    return bool(r) and float(np.mean(r)) > 0


@dataclass
class _GuardJob:
    """What one guard job found, per (collective, size), as lists of jobs' samples: what the table
    would run there (``final``) and NCCL's default under the job's setting, the rows kept, those of
    them shown faster than NCCL's choice in the job (``shown``: row, its jobs, the jobs of NCCL's
    choice), and the rows that were measured but not shown faster (``dropped``, the same)."""

    kept: list[dict[str, Any]] = field(default_factory=list)
    shown: dict[tuple[str, int], tuple[dict[str, Any], list[list[float]], list[list[float]]]] = field(
        default_factory=dict)
    final: dict[tuple[str, int], list[list[float]]] = field(default_factory=dict)
    default: dict[tuple[str, int], list[list[float]]] = field(default_factory=dict)
    dropped: dict[tuple[str, int], tuple[dict[str, Any], list[list[float]], list[list[float]]]] = field(
        default_factory=dict)


def write_outcome(out: Outcome, topo: Topology, sizes: dict[int, list[int]], out_dir: Path,
                  provenance: dict[str, Any], title: str = "ncclrl fine-tuned table") -> dict[str, Path]:
    """``nccl_tuner.csv`` (example-plugin format; NCCL decides where there is no row), ``nccl.conf``
    and ``finetune.json`` (every decision, the guard's checks, the budget used)."""
    by = {(r["collective"], r["nbytes"]): r for r in out.rows}
    rows = []
    for c, ss in sizes.items():
        name = N.COLLECTIVES[c]
        for i, s in enumerate(ss):
            r = by.get((name, s))
            if r is None:
                continue
            lo = 0 if i == 0 else s
            hi = MAX_BYTES if i == len(ss) - 1 else ss[i + 1] - 1
            rows.append(Row(name, lo, hi, *r["key"], nnodes=topo.nodes, nranks=topo.nranks))
    env = out.conf.env()
    table = Table(topo, rows, {k: int(v) for k, v in env.items()}, provenance,
                  title=f"{title}, {out.measured} live measurements")
    # the JSON keeps every per-size decision ("rows"), the guard's checks and the run's history
    return table.write(out_dir, json_name="finetune.json", extra={
        "topology": topo.name, "measured": out.measured, "rounds": out.rounds, "conf": env,
        "rows": [dict(r, key="/".join(map(str, r["key"]))) for r in out.rows], "history": out.history,
        "guard": out.guard})


def sizes_for(topo: Topology, colls: list[int], lo: int, hi: int) -> dict[int, list[int]]:
    return {c: size_grid(lo, hi, topo.nranks, c) for c in colls}

