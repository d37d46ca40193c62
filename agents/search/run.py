"""A tuning run (:class:`Search`): its settings, its rounds or jobs, its result."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ncclrl.agents.problem import BudgetExhausted, Decision, Evaluator, Problem
from ncclrl.agents.search.controllers import Controller
from ncclrl.agents.search.decision import DecisionConfig, Table, decide, zero_shot
from ncclrl.agents.search.model import Model, ModelConfig, fit_noise, measurements
from ncclrl.agents.search.space import GAIN_SCALE, N_FEATURES, Space, _cdf, _phi
from ncclrl.costmodel.errors import ConfigError
from ncclrl.costmodel.jobcost import format_gpu_s
from ncclrl.costmodel.units import plural

# -- the run -----------------------------------------------------------------------------------


@dataclass
class SearchConfig:
    """How a run picks and measures.

    :param round_points: points picked before they are measured (one job per knob setting among
        them) and the model refit
    :param max_repeats: most jobs one point is measured in
    :param shortlist: candidates the controller chooses from: half the best by predicted gain,
        half by optimistic gain (mean + 2 sd)
    :param allow_stop: whether the strategy may end the run before the budget is spent
    :param model: the model's prior
    :param decision: the rule the table is decided by
    """

    round_points: int = 8
    max_repeats: int = 3
    shortlist: int = 64
    allow_stop: bool = False
    model: ModelConfig = field(default_factory=ModelConfig)
    decision: DecisionConfig = field(default_factory=DecisionConfig)

    def check(self) -> None:
        for name in ("round_points", "max_repeats", "shortlist"):
            if getattr(self, name) < 1:
                raise ConfigError(name, f"must be >= 1, got {getattr(self, name)}")
        self.model.check()
        self.decision.check()


@dataclass
class Result:
    """What a run decided and why it stopped."""

    decision: Decision
    table: Table
    zero_shot: Table
    reason: str
    measured: int
    rounds: int
    history: list[dict[str, Any]] = field(default_factory=list)


class Search:
    """One tuning run of ``controller`` over ``problem``, measuring through ``ev``."""

    def __init__(self, problem: Problem, ev: Evaluator, controller: Controller | None, cfg: SearchConfig,
                 log: Callable[[str], None] = lambda _m: None, space: Space | None = None) -> None:
        cfg.check()
        self.problem, self.ev, self.controller, self.cfg, self.log = problem, ev, controller, cfg, log
        self.space = space or Space(problem)
        self.model = Model(self.space, cfg.model)
        sp = self.space
        self.n = np.zeros(sp.size, dtype=np.int64)
        self.ysum = np.zeros(sp.size)
        self.knob_jobs: list[set[int]] = [set() for _ in range(sp.n_knobs)]
        self.max_rep = np.full(sp.size, cfg.max_repeats, dtype=np.int64)
        if problem.repeats is not None:
            for i in range(sp.size):
                x = (problem.knobs[sp.knob[i]].knobs, *sp.cells[sp.cell[i]], sp.keys[i])
                self.max_rep[i] = min(cfg.max_repeats, problem.repeats.get(x, 1))
        self.pending: list[int] = []
        self.job_samples: int | None = None  # timed calls per point of the next job (None: the evaluator's)
        self.zs = zero_shot(sp)
        self.table = decide(sp, self.model, measurements(sp, ev), cfg.decision)
        self.rounds = 0
        self.history: list[dict[str, Any]] = []
        self._shortlist = np.empty(0, np.int64)
        self._t0 = time.time()

    # -- measuring -----------------------------------------------------------------------------
    def start(self) -> None:
        """The fixed first round: NCCL's plain defaults, then the zero-shot rows next to NCCL's
        choice under the zero-shot knob setting."""
        sp = self.space
        first = list(sp.default[: sp.n_cells])
        k = self.zs.knob
        for c, i in self.zs.rows.items():
            if k:  # NCCL's choice under the zero-shot setting, next to the row (-1: it cannot run)
                first.append(int(sp.default[k * sp.n_cells + c]))
            first.append(i)
        self.pending = [i for i in dict.fromkeys(first) if i >= 0]
        self.flush()

    def flush(self) -> None:
        """Measure the pending points, one job per knob setting, then refit and decide again."""
        if not self.pending:
            return
        sp = self.space
        by: dict[int, list[int]] = {}
        for i in self.pending:
            by.setdefault(int(sp.knob[i]), []).append(i)
        self.pending = []
        for k, idx in by.items():
            try:
                res = self.ev.evaluate(self.problem.knobs[k], [(*sp.cells[sp.cell[i]], sp.keys[i]) for i in idx],
                                       samples=self.job_samples)
            except BudgetExhausted:
                break
            job = self.ev.calls
            for i, m in zip(idx, res, strict=True):
                if m is not None and m > 0:
                    self.n[i] += 1
                    self.ysum[i] += math.log(m)
                    self.knob_jobs[k].add(job)
                elif m is None:
                    self.max_rep[i] = self.n[i]  # failed: not again
        self.refit()
        self.rounds += 1
        self.history.append({"round": self.rounds, "measured": self.ev.points, "jobs": self.ev.calls,
                             "gpu_s": round(self.ev.gpu_s, 2), "knob": self.table.knob,
                             "rows": len(self.table.rows), "gain": round(math.exp(self.table.gain), 4),
                             "wall_s": round(time.time() - self._t0, 2)})

    def refit(self) -> None:
        ybar = np.where(self.n > 0, self.ysum / np.maximum(self.n, 1), 0.0)
        own = getattr(self.controller, "decide", None)
        if own is not None:  # a controller that decides itself compares only what it measured for that
            self.model.fit(self.n, ybar)
            self.table = own(self)
            return
        obs = measurements(self.space, self.ev)
        self.model.fit(self.n, ybar, fit_noise(obs, self.cfg.model))
        self.ev.count_model(self.space.size)
        self.table = decide(self.space, self.model, obs, self.cfg.decision)

    def recalibrate(self, problem: Problem) -> None:
        """Go on with ``problem``'s prior (the same problem, its prior calibrated on what was
        measured: :func:`ncclrl.agents.calibration.calibrate`): the space's prior times, the model
        and the zero-shot table are rebuilt from it; every measurement is kept and the model refit."""
        if problem.cells() != self.problem.cells() or problem.knobs != self.problem.knobs:
            raise ConfigError("problem", "recalibrate takes the same problem with another prior")
        self.problem = problem
        self.ev.problem = problem  # its planning figures read the prior too
        self.space = Space(problem)
        self.model = Model(self.space, self.cfg.model)
        self.zs = zero_shot(self.space)
        self.refit()

    # -- what the controller sees ----------------------------------------------------------------
    def observe(self) -> tuple[np.ndarray, np.ndarray]:
        """The shortlist (point indices) and its features, the stop row last."""
        sp, m = self.space, self.model
        nc = sp.n_cells
        pend = np.zeros(sp.size, dtype=bool)
        pend[self.pending] = True
        ok = (self.n < self.max_rep) & ~pend
        # per (knob, cell): the best posterior mean among measured points, else NCCL's choice's
        inc = np.full(sp.n_knobs * nc, np.inf)
        meas = self.n > 0
        np.minimum.at(inc, sp.group[meas], m.mean[meas])
        none = ~np.isfinite(inc)
        dflt = sp.default.copy()
        inc[none & (dflt >= 0)] = m.mean[dflt[none & (dflt >= 0)]]
        potential = np.full(sp.n_knobs * nc, np.inf)
        np.minimum.at(potential, sp.group, m.mean)
        plain = m.mean[sp.default[:nc]]
        pot_k = np.array([np.mean(plain - potential[k * nc:(k + 1) * nc]) for k in range(sp.n_knobs)])
        cover = np.zeros(sp.n_knobs * nc)
        np.maximum.at(cover, sp.group, meas.astype(float))
        cover_k = cover.reshape(sp.n_knobs, nc).mean(axis=1)
        final = m.mean[self.table.final]
        gain = inc[sp.group] - m.mean
        g_tab = final[sp.cell] - m.mean
        std = m.std
        zz = g_tab / std
        ei = std * _phi(zz) + g_tab * _cdf(zz)
        left = self.ev.remaining - len(self.pending) * self.ev.point_gpu_s()
        frac_left = max(left, 0.0) / max(self.ev.budget, 1e-12)
        # the shortlist: half by predicted gain, half by optimistic gain
        cand = np.flatnonzero(ok)
        half = max(1, self.cfg.shortlist // 2)
        a = cand[np.argsort(-g_tab[cand], kind="stable")[:half]]
        b = cand[np.argsort(-(g_tab[cand] + 2 * std[cand]), kind="stable")[: 2 * half]]
        short = np.array(list(dict.fromkeys([*a.tolist(), *b.tolist()]))[: self.cfg.shortlist], dtype=np.int64)
        self._shortlist = short
        # per candidate, unclipped, for controllers that weigh a measurement by its GPU-time
        pend_knobs = {int(sp.knob[i]) for i in self.pending}
        t_us = np.exp(m.mean[short])
        cost = self.ev.cost.point_wall_s(t_us, self.ev.samples) * self.ev.nranks
        cost += np.array([0.0 if int(k) in pend_knobs else self.ev.cost.launch_s * self.ev.nranks
                          for k in sp.knob[short]])
        self.acquisition = {"ei": ei[short], "gain": g_tab[short], "std": std[short], "gpu_s": cost}
        ks = sp.knob[short]
        row_of = np.full(nc, -1)
        for c, i in self.table.rows.items():
            row_of[c] = i
        f = np.zeros((len(short) + 1, N_FEATURES))
        f[:-1, 0] = gain[short] * GAIN_SCALE
        f[:-1, 1] = std[short] * GAIN_SCALE
        f[:-1, 2] = ei[short] * GAIN_SCALE
        f[:-1, 3] = g_tab[short] * GAIN_SCALE
        f[:-1, 4] = ks == self.table.knob
        f[:-1, 5] = (pot_k[ks] - pot_k.max()) * GAIN_SCALE
        f[:-1, 6] = cover_k[ks]
        f[:-1, 7] = sp.is_default[short]
        f[:-1, 8] = np.minimum(self.n[short], 3) / 2
        d_of = sp.default_of[short]
        f[:-1, 9] = np.where(d_of >= 0, self.n[np.maximum(d_of, 0)] > 0, 1.0)
        f[:-1, 10] = row_of[sp.cell[short]] == short
        f[:-1, 11] = [self.table.prob.get(int(c), 0.0) for c in sp.cell[short]]
        f[:-1, 14] = sp.size_pos[sp.cell[short]]
        f[:, 12] = frac_left
        f[:, 13] = math.log10(max(self.ev.budget_points(), 1)) / 3
        # the stop row: the run's state (the best any knob setting could still gain over the table, the
        # shortlist's uncertainty)
        f[-1, 5] = (pot_k.max() - self.table.gain) * GAIN_SCALE
        f[-1, 1] = float(std[short].mean()) * GAIN_SCALE if len(short) else 0.0
        f[-1, 15] = 1.0
        np.clip(f, -5, 5, out=f)
        return short, f

    def act(self, choice: int) -> bool:
        """Take shortlist entry ``choice`` (its length: stop). Returns whether the run goes on."""
        if choice >= len(self._shortlist):
            self.flush()
            return False
        self.pending.append(int(self._shortlist[choice]))
        if len(self.pending) >= self.cfg.round_points or not self.affords_more():
            self.flush()
        return self.ev.remaining > 0

    def affords_more(self) -> bool:
        """Whether the budget left pays for another point beside the pending ones (a planning figure)."""
        jobs = max(len({int(self.space.knob[i]) for i in self.pending}), 1)
        return self.ev.remaining > 0 and self.ev.points_left(len(self.pending), jobs=jobs) > 0

    # -- whole jobs --------------------------------------------------------------------------------
    def point_gpu_s(self, idx: np.ndarray) -> np.ndarray:
        """Predicted GPU-seconds each point adds to its job (its calls at the posterior time)."""
        return self.ev.cost.point_wall_s(np.exp(self.model.mean[idx]), self.ev.samples) * self.ev.nranks

    def compose_job(self) -> list[int]:
        """The next job (:class:`JobController`): per knob setting, its points never measured, or,
        when it has none, the candidates (measured fewer than ``max_repeats`` times) in order of
        expected improvement over the current table per GPU-second while that ratio beats the
        job's own (its expected improvement so far over its launch and points); the setting whose
        job is worth most per GPU-second, with NCCL's choice under it at every size; a job of NCCL's
        defaults instead when they have been measured in fewer jobs than that setting's choices
        (every setting is judged against them). Empty when nothing is worth measuring."""
        sp, m = self.space, self.model
        final = m.mean[self.table.final]
        sens = sp.sensitivity(final) * sp.n_cells  # 1 per cell unweighted; the step's share weighted
        g = final[sp.cell] - m.mean
        std = np.maximum(m.std, 1e-9)
        z = g / std
        ei = (std * _phi(z) + g * _cdf(z)) * sens[sp.cell]
        ok = self.n < self.max_rep
        cost = self.point_gpu_s(np.arange(sp.size))
        launch = self.ev.cost.launch_s * self.ev.nranks
        best, best_rate = [], 0.0
        race: dict[int, list[int]] = {}
        for k in range(sp.n_knobs):
            idx = np.flatnonzero(ok & (sp.knob == k))
            fresh = idx[self.n[idx] == 0]
            if len(fresh):  # a setting not yet swept: its whole space in one job (points are cheap next to a launch)
                value, spent = float(ei[fresh].sum()), launch + float(cost[fresh].sum())
                if value / spent > best_rate:
                    best, best_rate = fresh.tolist(), value / spent
                continue
            idx = idx[np.argsort(-ei[idx] / cost[idx], kind="stable")]
            value, spent, take = 0.0, launch, 0
            for i in idx:
                if ei[i] / cost[i] <= value / spent:
                    break
                value, spent, take = value + ei[i], spent + cost[i], take + 1
            race[k] = idx[:take].tolist()
            if take and value / spent > best_rate:
                best, best_rate = race[k], value / spent
        if not best:
            return []
        k = int(sp.knob[best[0]])
        nc = sp.n_cells
        plain = sp.default[:nc]
        if k and 0 in race:
            under = sp.default[k * nc:(k + 1) * nc]
            if self.n[plain].min() < self.n[under[under >= 0]].min() + 1:
                # every setting is judged against NCCL's plain defaults: measure them as often
                k, best = 0, race[0]
        # NCCL's choice at every size: a setting is exported only once its table is confirmed at
        # every size (min_jobs), against NCCL's plain defaults measured as often
        pair = [int(i) for i in sp.default[k * nc:(k + 1) * nc]]
        return list(dict.fromkeys([*[i for i in pair if i >= 0], *best]))

    def run_jobs(self) -> Result:
        """A run of whole jobs (:class:`JobController`): NCCL's plain defaults with every
        configuration under them first, then :meth:`compose_job` until the budget is spent; or, when
        the controller composes jobs itself (``next_job(search)``: :class:`ncclrl.agents.compose.ComposerController`),
        every job it picks, the first included, until it stops or the budget is spent."""
        sp = self.space
        composer = getattr(self.controller, "next_job", None)  # a composer picks every job, the first too
        if composer is None:
            base = np.flatnonzero(sp.knob == 0)
            first = [*sp.default[: sp.n_cells].tolist(), *base[~sp.is_default[base]].tolist()]
            self.pending = list(dict.fromkeys(int(i) for i in first))
            self.flush()
        reason = "budget spent"
        while self.ev.remaining > 0:
            job = composer(self) if composer is not None else self.compose_job()
            if not job:
                reason = (getattr(self.controller, "stop_reason", "the composer stopped") if composer is not None
                          else "nothing left worth measuring")
                break
            self.pending = job
            self.flush()
        return self._result(reason)

    def _result(self, reason: str) -> Result:
        """The run's result; where the run ended because nothing was left to spend, the evaluator's
        reason (the budget, the wall clock, a signal or a failed job) is the one given."""
        if self.ev.stop_reason and reason == "budget spent":
            reason = self.ev.stop_reason
        t = self.table
        knobs = " ".join(f"{k}={v}" for k, v in self.problem.knobs[t.knob].env().items()) or "NCCL's defaults"
        self.log(f"# {reason}: {plural(self.ev.points, 'point')} measured in {plural(self.ev.calls, 'job')}, "
                 f"{format_gpu_s(self.ev.gpu_s)}; {plural(len(t.rows), 'row')}, knobs: {knobs}")
        return Result(self.space.decision(t.knob, t.rows), t, self.zs, reason, self.ev.points, self.rounds,
                      self.history)

    # -- the whole run ---------------------------------------------------------------------------
    def run(self) -> Result:
        if getattr(self.controller, "composes_jobs", False):
            return self.run_jobs()
        self.start()
        reason = "budget spent"
        while self.affords_more():
            short, f = self.observe()
            if not len(short):
                reason = "nothing left to measure"
                break
            if hasattr(self.controller, "scores_for"):
                scores = np.asarray(self.controller.scores_for(self.acquisition), dtype=float)
            else:
                scores = np.asarray(self.controller.scores(f), dtype=float)
            if not self.cfg.allow_stop:
                scores[-1] = -np.inf
            choice = int(np.argmax(scores))
            if not self.act(choice):
                if choice >= len(short):
                    reason = "the strategy stopped: no candidate worth its measurement"
                break
        self.flush()
        return self._result(reason)
