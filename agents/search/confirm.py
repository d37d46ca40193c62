"""Screen, confirm, then explore: the default tuning run of ``ncclrl finetune``
(:class:`ConfirmController`), and its test (:func:`paired_test`).

1. **Screen**: one job under NCCL's defaults measures, at every size, NCCL's choice and every
   candidate the prior keeps (predicted no slower than ``prune`` times NCCL's choice, the
   explicit twin of NCCL's choice always kept), with ``screen_samples`` timed calls each. A
   size's leaders are the ``leaders`` candidates it measured fastest, where it measured them at
   least ``delta`` faster than NCCL's choice in its own job.
2. **Explore**: each other knob setting in order of the prior's predicted gain: a screen job under
   it (NCCL's choice under it, the configurations the first screen measured fastest, the prior's
   best), its table (per size its screen's fastest where that beat NCCL's choice under it), then
   pairs of jobs (the setting's table; NCCL's defaults with their table, NCCL's plain choice at
   every size and the open leaders) until the setting is decided. The defaults' side of each pair
   is also a confirmation job of the leaders.
3. **Confirm**: further jobs under NCCL's defaults measure the undecided leaders beside NCCL's
   choice (``confirm_samples`` calls each). Only these jobs judge them: the screen selects,
   confirmation tests (:func:`paired_test`), so a candidate that was fast in the screen by luck is
   not confirmed by the same luck. A leader leaves the confirmation jobs once decided: confirmed
   at ``alpha / 4`` or refuted (its upper bound below ``delta``).

Each job runs only while its expected value pays for its GPU-time: the value of a job is the
expected gain it may add to the exported table (per size: its share of the objective times the
estimated gain of its undecided leaders times the probability they are truly ``delta`` faster)
times the GPU-time the table will serve (``horizon``); a run whose horizon cannot repay the screen
and two confirmation jobs at the prior's predicted gain declines to start.

Repeats inside one job are not counted as jobs: on the 2 x 2 socket host 55-71% of a
configuration's job residual at 64 KiB and above persisted across repeats in the same job
(docs/results/confirm.md); only jobs are.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ncclrl.agents.search.decision import Table
from ncclrl.agents.search.model import same_as_nccl
from ncclrl.agents.search.space import Space
from ncclrl.costmodel.errors import ConfigError
from ncclrl.costmodel.noise import _quantile


def job_gpu_s(search, idx: list[int], samples: int) -> float:
    """Predicted GPU-seconds of one job measuring the points ``idx`` of ``search`` at ``samples``
    calls each (the model's posterior times; before any measurement, the prior's)."""
    ev = search.ev
    t = np.exp(search.model.mean[idx])
    return float(ev.cost.launch_s * ev.nranks + (ev.cost.point_wall_s(t, samples) * ev.nranks).sum())


@dataclass
class ConfirmConfig:
    """Settings of the screen-confirm-explore run.

    :param screen_samples: timed calls per point in the screening job
    :param confirm_samples: timed calls per point in a confirmation job
    :param leaders: candidates per size taken from the screen to confirmation
    :param prune: the screen measures a candidate only where the prior predicts it no slower than
        this many times NCCL's choice (the explicit twin of NCCL's choice is always measured)
    :param max_confirm_jobs: most confirmation jobs asked for the leaders (the defaults' side of a knob
        setting's pairs not counted); a knob setting has at most twice ``knob_pairs`` pairs
    :param horizon_sweeps: GPU-time the exported table will serve, in full sweeps' predicted
        GPU-time (``ncclrl finetune`` sets it from ``horizon=``)
    :param explore: whether knob settings other than NCCL's defaults are explored (after the screen,
        while the budget left pays for a setting's screen and its pairs)
    :param sd_prior: prior guess of the sd (log) of one job's paired difference (a candidate's
        log time minus NCCL's choice's, in the same job), worth ``prior_dof`` degrees of freedom
    :param prior_dof: weight of that guess
    :param pay_factor: after the screen, a job runs while its expected value over the horizon exceeds
        this many times its predicted GPU-time (the stopping rule; 1: it must pay for itself)
    :param knob_pairs: pairs of jobs a knob setting needs before it is accepted
    :param size_risk: a knob setting is refused once a size of its table is measured slower than NCCL's
        plain default by ``delta`` at this level (one-sided): its table changes every size
    """

    screen_samples: int = 1
    confirm_samples: int = 2
    leaders: int = 2
    prune: float = 4.0
    max_confirm_jobs: int = 8
    horizon_sweeps: float = 100.0
    explore: bool = True
    sd_prior: float = 0.15
    prior_dof: float = 4.0
    size_risk: float = 0.25
    knob_pairs: int = 5
    pay_factor: float = 1.0

    def check(self) -> None:
        for name in ("screen_samples", "confirm_samples", "leaders"):
            if getattr(self, name) < 1:
                raise ConfigError(f"confirm.{name}", f"must be >= 1, got {getattr(self, name)}")
        if self.knob_pairs < 3:
            raise ConfigError("confirm.knob_pairs", f"must be >= 3, got {self.knob_pairs}")
        if self.max_confirm_jobs < 2:
            raise ConfigError("confirm.max_confirm_jobs", f"must be >= 2, got {self.max_confirm_jobs}")
        if not self.prune > 1:
            raise ConfigError("confirm.prune", f"must be > 1, got {self.prune}")
        if not self.horizon_sweeps >= 0:
            raise ConfigError("confirm.horizon_sweeps", f"must be >= 0, got {self.horizon_sweeps}")
        if not 0 < self.size_risk < 0.5:
            raise ConfigError("confirm.size_risk", f"must be in (0, 0.5), got {self.size_risk}")
        if not self.pay_factor > 0:
            raise ConfigError("confirm.pay_factor", f"must be > 0, got {self.pay_factor}")
        if not (self.sd_prior > 0 and self.prior_dof >= 0):
            raise ConfigError("confirm.sd_prior", "sd_prior must be > 0 and prior_dof >= 0")


@dataclass
class PairedTest:
    """One candidate against NCCL's choice on the confirmation jobs that measured both.

    :param gain: mean log speedup (NCCL's choice's log time minus the candidate's, per job)
    :param se: its standard error (the pooled sd over sqrt(jobs))
    :param jobs: confirmation jobs that measured both
    :param df: degrees of freedom of the pooled sd (its prior's included)
    :param p_value: one-sided, of "the candidate is at most ``delta`` faster"
    :param wins: jobs where the candidate was the faster
    """

    gain: float
    se: float
    jobs: int
    df: float
    p_value: float
    wins: int

    def passes(self, thr: float, alpha: float) -> bool:
        """At least ``thr`` (log) faster at level ``alpha``, and faster in more than half its jobs."""
        return self.jobs >= 2 and self.p_value < alpha and 2 * self.wins > self.jobs and self.gain > thr

    def refuted(self, thr: float) -> bool:
        """Its one-sided 95% upper bound lies below ``thr``: not worth another job."""
        return self.jobs >= 2 and self.gain + _quantile(max(int(self.df), 1), 0.95) * self.se < thr


def _t_sf(x: float, df: float) -> float:
    from scipy.special import stdtr

    return float(1.0 - stdtr(max(df, 1.0), x))


def pooled_sd(diffs: dict[Any, np.ndarray], order: dict[Any, float], window: float, sd_prior: float,
              prior_dof: float) -> dict[Any, tuple[float, float]]:
    """Per key, the sd of its paired differences pooled with every key whose ``order`` (log2 size)
    lies within ``window`` of its own, and with the prior (``sd_prior`` worth ``prior_dof``);
    returns (sd, degrees of freedom)."""
    ss = {k: float(((v - v.mean()) ** 2).sum()) if len(v) > 1 else 0.0 for k, v in diffs.items()}
    df = {k: max(len(v) - 1, 0) for k, v in diffs.items()}
    keys = list(diffs)
    pos = np.array([order[k] for k in keys])
    out = {}
    for k in keys:
        near = [keys[j] for j in np.flatnonzero(np.abs(pos - order[k]) <= window)]
        s = sum(ss[x] for x in near) + prior_dof * sd_prior ** 2
        d = sum(df[x] for x in near) + prior_dof
        out[k] = (math.sqrt(s / max(d, 1e-9)), d)
    return out


def paired_test(space: Space, jobs_of: dict[int, dict[int, float]], pairs: list[tuple[int, int]],
                confirm_jobs: set[int], thr: float, cfg: ConfirmConfig) -> dict[tuple[int, int], PairedTest]:
    """Per (candidate, reference) in ``pairs`` (space indices), the paired test on the confirmation
    jobs that measured both: the per-job difference of log times, whose (job, size) effect (shared
    by every configuration of one size in one job) cancels; its sd pooled over pairs of sizes
    within a factor of 4 (and the prior); a one-sided Student-t test of "at most ``thr`` faster".

    :param jobs_of: per space point, job number -> the job's median (us)
    """
    diffs: dict[tuple[int, int], np.ndarray] = {}
    for i, d in pairs:
        a, b = jobs_of.get(i, {}), jobs_of.get(d, {})
        both = sorted(set(a) & set(b) & confirm_jobs)
        diffs[(i, d)] = np.array([math.log(b[j]) - math.log(a[j]) for j in both])
    if not diffs:
        return {}
    order = {x: math.log2(space.cells[space.cell[x[0]]][1]) for x in diffs}
    sds = pooled_sd(diffs, order, 2.0, cfg.sd_prior, cfg.prior_dof)
    out = {}
    for x, v in diffs.items():
        sd, df = sds[x]
        n = len(v)
        if n == 0:
            out[x] = PairedTest(float("nan"), float("inf"), 0, df, 1.0, 0)
            continue
        g = float(v.mean())
        se = sd / math.sqrt(n)
        out[x] = PairedTest(g, se, n, df, _t_sf((g - thr) / max(se, 1e-12), df), int((v > 0).sum()))
    return out


@dataclass
class Phase:
    """What the run has done under one knob setting."""

    knob: int
    screen: int = 0  # the screening job's number (0: not yet)
    leaders: dict[int, list[int]] = field(default_factory=dict)  # cell -> candidates in confirmation
    decided: dict[int, str] = field(default_factory=dict)  # candidate -> confirmed / refuted
    confirm: list[int] = field(default_factory=list)  # confirmation jobs' numbers
    table: dict[int, int] = field(default_factory=dict)  # explored setting: cell -> point it runs
    asked: int = 0  # confirmation jobs asked for its leaders (not counting the defaults' side of pairs)
    verdict: str = ""  # explored setting: accepted / refused / "" (undecided)


class ConfirmController:
    """Composes every job of a screen-confirm-explore run (the module's docs) for
    :meth:`ncclrl.agents.search.Search.run_jobs`, and decides its table (:meth:`decide`)."""

    name = "confirm"
    composes_jobs = True

    def __init__(self, cfg: ConfirmConfig | None = None) -> None:
        self.cfg = cfg or ConfirmConfig()
        self.cfg.check()
        self.phases: list[Phase] = []
        self.stop_reason = ""
        self._asked: tuple[str, int, int] | None = None  # the last job asked: (kind, knob, jobs run before it)
        self.evidence: dict[int, dict[str, Any]] = {}
        self.knob_evidence: dict[str, Any] = {}
        self._explored = False  # no knob setting left to explore
        self._jobs_cache: tuple[int, dict[int, dict[int, float]]] = (-1, {})
        self._sweep_gpu_s: float | None = None

    def fresh(self) -> ConfirmController:
        """A new controller with the same settings (one per run: it keeps the run's state)."""
        return ConfirmController(self.cfg)

    # -- bookkeeping -----------------------------------------------------------------------------
    def _record(self, search) -> None:
        """File the job that just ran (the evaluator's last job number) under its phase."""
        if self._asked is None:
            return
        kind, _k, before = self._asked
        self._asked = None
        ph = self.phases[-1]
        if kind == "confirm" and not _k and ph.knob and ph.verdict:  # a decided setting's pairs are done
            ph = self.phases[0]
        job = search.ev.calls
        if job == before:  # it never ran (the budget, a signal, a failed job)
            return
        if kind == "screen":
            ph.screen = job
            self._pick_leaders(search, ph)
        else:
            ph.confirm.append(job)
            if ph.knob and not _k:  # NCCL's defaults' side of a pair: a confirmation job of their leaders too
                self.phases[0].confirm.append(job)

    def _jobs_of(self, search) -> dict[int, dict[int, float]]:
        """Per space point, job number -> the job's median; read once per job the run has run."""
        if self._jobs_cache[0] == search.ev.calls:
            return self._jobs_cache[1]
        from ncclrl.agents.search.model import _point_index

        at = _point_index(search.space)
        out: dict[int, dict[int, float]] = {}
        for x, runs in search.ev.jobs.items():
            i = at.get(x)
            if i is None:
                continue
            seen: set[float] = set()
            out[i] = {}
            for j, m in runs:
                # a job answering a point with the very median an earlier job had is a replay of one
                # recorded job, not another job: it confirms nothing
                if m > 0 and math.isfinite(m) and m not in seen:
                    seen.add(m)
                    out[i][j] = m
        self._jobs_cache = (search.ev.calls, out)
        return out

    def _thr(self, search) -> float:
        return math.log1p(search.cfg.decision.delta)

    def _pick_leaders(self, search, ph: Phase) -> None:
        """Per size, the candidates the screen measured fastest, at least ``delta`` faster than the
        reference in the screening job itself (NCCL's choice; under another knob setting, the
        setting's best point is its table and its leaders are not confirmed one by one)."""
        sp = search.space
        nc = sp.n_cells
        jobs = self._jobs_of(search)
        thr = self._thr(search)
        for c in range(nc):
            g = ph.knob * nc + c
            mem = sp.members[g]
            got = {int(i): jobs[int(i)][ph.screen] for i in mem if ph.screen in jobs.get(int(i), {})}
            if not got:
                continue
            d = int(sp.default[g])
            if ph.knob:  # the setting's table: its screen's fastest where that beat NCCL's choice under it
                best = min(got, key=got.get)
                keep_nccl = d in got and math.log(got[d]) - math.log(got[best]) <= thr
                ph.table[c] = d if keep_nccl else best
                continue
            if d not in got:
                continue
            ranked = sorted((i for i in got if i != d and math.log(got[d]) - math.log(got[i]) > thr), key=got.get)
            if ranked:
                ph.leaders[c] = ranked[: self.cfg.leaders]

    def _cost(self, search, idx: list[int], samples: int) -> float:
        return job_gpu_s(search, idx, samples)

    def _horizon_gpu_s(self, search) -> float:
        from ncclrl.agents.problem import predicted_sweep_gpu_s

        if self._sweep_gpu_s is None:
            self._sweep_gpu_s = predicted_sweep_gpu_s(search.problem, search.ev.samples, search.ev.cost)
        return self.cfg.horizon_sweeps * self._sweep_gpu_s

    # -- the jobs ----------------------------------------------------------------------------------
    def next_job(self, search) -> list[int]:
        """The next job's points (one knob setting), or ``[]`` to stop (:attr:`stop_reason` says why)."""
        self._record(search)
        self.stop_reason = ""  # this call's own, if it ends the run
        sp = search.space
        if not self.phases:
            screen = self._screen_points(search, 0)
            if not self._pays_to_start(search, screen):
                return []
            self.phases.append(Phase(0))
            return self._ask(search, "screen", 0, screen, self.cfg.screen_samples)
        base = self.phases[0]
        if self.cfg.explore and sp.n_knobs > 1 and not self._explored:
            job = self._explore(search)  # knob settings first: their pairs' jobs under NCCL's defaults confirm too
            if job:
                return job
            self._explored = True
        job = self._confirm_points(search, base)
        if job:
            base.asked += 1
            return self._ask(search, "confirm", 0, job, self.cfg.confirm_samples)
        if not self.stop_reason:
            self.stop_reason = "every leader decided" if base.leaders else "the screen found no leader"
        return []

    def _ask(self, search, kind: str, k: int, idx: list[int], samples: int) -> list[int]:
        self._asked = (kind, k, search.ev.calls)
        search.job_samples = samples
        return idx

    def _screen_points(self, search, k: int) -> list[int]:
        sp = search.space
        nc = sp.n_cells
        same = same_as_nccl(sp)
        out = []
        lim = math.log(self.cfg.prune)
        for c in range(nc):
            g = k * nc + c
            mem = sp.members[g]
            d = int(sp.default[g])
            ref = sp.prior[d] if d >= 0 else sp.prior[mem].min()
            keep = [int(i) for i in mem if i == d or same[i] or sp.prior[i] <= ref + lim]
            out += sorted(keep, key=lambda i: (i != d, i))
        return out

    def _pays_to_start(self, search, screen: list[int]) -> bool:
        """The horizon repays the screen and two confirmation jobs at the prior's predicted gain
        (the zero-shot table's, at least 5%)."""
        zs = search.zs
        g = max(float(zs.gain), math.log(1.05))
        value = (1 - math.exp(-g)) * self._horizon_gpu_s(search)
        sp = search.space
        plain = [int(i) for i in sp.default[: sp.n_cells]]
        cost = self._cost(search, screen, self.cfg.screen_samples) + 2 * self._cost(
            search, plain + [int(i) for i in zs.final], self.cfg.confirm_samples)
        if value < cost:
            self.stop_reason = (f"the horizon does not pay: {value:.0f} GPU-s at the prior's predicted gain "
                                f"({math.exp(g):.3f}x) against {cost:.0f} GPU-s for a screen and two confirmation "
                                "jobs; nothing measured (raise horizon)")
            return False
        return True

    def tests(self, search, ph: Phase) -> dict[tuple[int, int], PairedTest]:
        sp = search.space
        nc = sp.n_cells
        pairs = [(i, int(sp.default[ph.knob * nc + c])) for c, ls in ph.leaders.items() for i in ls]
        return paired_test(sp, self._jobs_of(search), pairs, set(ph.confirm), self._thr(search), self.cfg)

    def _confirm_points(self, search, ph: Phase, pay: bool = True) -> list[int]:
        """NCCL's choice at every size with an undecided leader, and those leaders; ``[]`` when none
        is left, the phase has had its jobs, or (``pay``) the job does not pay."""
        if ph.asked >= self.cfg.max_confirm_jobs:
            if self._open_leaders(search, ph):
                self.stop_reason = (f"the leaders had their {self.cfg.max_confirm_jobs} confirmation jobs "
                                    "(confirm.max_confirm_jobs); the undecided ones keep NCCL's choice")
            return []
        idx, value, why = self.confirm_plan(search, ph)
        if not idx:
            if why:
                self.stop_reason = why
            return []
        cost = self._cost(search, idx, self.cfg.confirm_samples)
        if pay and (1 - math.exp(-value)) * self._horizon_gpu_s(search) < self.cfg.pay_factor * cost:
            self.stop_reason = "no confirmation job pays for its GPU-time over the horizon"
            return []
        return idx

    def confirm_plan(self, search, ph: Phase, mark: bool = True) -> tuple[list[int], float, str]:
        """The next confirmation job of ``ph``'s leaders before the horizon is weighed: its points
        (the most valuable sizes per GPU-second first, as many as the budget left can take through
        the jobs they still need), its value (the expected log gain it may add to the table) and,
        when it is empty, why (\"\": no leader left open). Leaders the tests have decided are marked
        (``mark``; else the plan changes nothing)."""
        sp = search.space
        decided = ph.decided if mark else dict(ph.decided)
        nc = sp.n_cells
        thr = self._thr(search)
        alpha = search.cfg.decision.alpha
        tests = self.tests(search, ph)
        sens = sp.sensitivity(search.model.mean[sp.default[:nc]])
        parts, value = [], 0.0
        for c, ls in sorted(ph.leaders.items()):
            d = int(sp.default[ph.knob * nc + c])
            open_, v = [], 0.0
            for i in ls:
                if i in decided:
                    continue
                t = tests[(i, d)]
                if t.passes(thr, alpha / 4):
                    decided[i] = "confirmed"
                elif t.refuted(thr):
                    decided[i] = "refuted"
                else:
                    open_.append(i)
                    if t.jobs:
                        p_true = 1.0 - _t_sf((t.gain - thr) / max(t.se, 1e-12), t.df)
                        v += sens[c] * max(t.gain, 0.0) * p_true
                    else:  # only the screen's word: its measured gain, at even odds
                        v += sens[c] * max(search.model.mean[d] - search.model.mean[i], 0.0) * 0.5
            if open_:
                pts = [d, *open_]
                need = max(2 - min(tests[(i, d)].jobs for i in open_), 1)  # jobs before a row can pass
                cost = self._cost(search, pts, self.cfg.confirm_samples) - self._cost(search, [], 1)
                parts.append((v / max(cost, 1e-9), pts, cost, need, v))
        # the most valuable sizes per GPU-second first, as many as the budget left can take through
        # the jobs they still need (a leader measured once beside NCCL's choice proves nothing)
        launch = self._cost(search, [], 1)
        idx, spent, jobs_needed = [], 0.0, 0
        for _, pts, cost, need, v in sorted(parts, key=lambda x: -x[0]):
            more = spent + cost * need + launch * max(jobs_needed, need)
            if more > search.ev.remaining:
                continue
            idx += pts
            spent, jobs_needed, value = spent + cost * need, max(jobs_needed, need), value + v
        if parts and not idx:
            return [], 0.0, "the budget left cannot confirm any leader"
        return idx, value, ""

    def _explore(self, search, pay: bool = True) -> list[int]:
        """Jobs under the other knob settings, best predicted first (the module's docs, point 3); a
        new setting only where (``pay``) its screen and pairs pay over the horizon."""
        sp = search.space
        nc = sp.n_cells
        base = self.phases[0]
        ph = self.phases[-1]
        if ph.knob and not ph.screen:
            return []
        if ph.knob and not ph.verdict:
            self._judge_knob(search, ph)
            if not ph.verdict:  # one more pair: the setting's table, then NCCL's defaults with theirs
                mine = sum(1 for j in ph.confirm if j in search.knob_jobs[ph.knob])
                if mine <= len(ph.confirm) - mine:
                    idx = sorted(set(ph.table.values()), key=lambda i: (sp.cell[i], i))
                    return self._ask(search, "confirm", ph.knob, idx, self.cfg.confirm_samples)
                t0 = self._base_table(search)
                idx = list(dict.fromkeys([*[int(i) for i in sp.default[:nc]], *t0.values(),
                                          *self._open_leaders(search, base)]))
                return self._ask(search, "confirm", 0, idx, self.cfg.confirm_samples)
        plan = self.explore_plan(search)
        if isinstance(plan, str):
            self.stop_reason = plan
            return []
        k, screen, cost, value = plan
        if search.ev.remaining < cost:
            self.stop_reason = (f"the budget left cannot screen and confirm another knob setting (next: "
                                f"{sp.problem.knobs[k].env()}, {cost:.0f} GPU-s)")
            return []
        if pay and value < self.cfg.pay_factor * cost:
            self.stop_reason = (f"no knob setting left whose screen and confirmation pay over the horizon (next: "
                                f"{sp.problem.knobs[k].env()}, {cost:.0f} GPU-s)")
            return []
        self.phases.append(Phase(k))
        return self._ask(search, "screen", k, screen, self.cfg.screen_samples)

    def explore_plan(self, search) -> tuple[int, list[int], float, float] | str:
        """The next knob setting to explore, best predicted first: (setting, its screen's points,
        the GPU-s of its screen and the pairs a verdict needs at the least, its value over the
        horizon in GPU-s); or why there is none."""
        sp = search.space
        nc = sp.n_cells
        base = self.phases[0]
        tried = {p.knob for p in self.phases}
        zs_gain = []
        plain = sp.prior[sp.default[:nc]]
        for k in range(1, sp.n_knobs):
            if k in tried:
                continue
            best = np.array([sp.prior[sp.members[k * nc + c]].min() if len(sp.members[k * nc + c]) else np.inf
                             for c in range(nc)])
            if np.isfinite(best).all():
                zs_gain.append((sp.log_gain(plain, best), k))
        if not zs_gain:
            return "every knob setting explored"
        g, k = max(zs_gain)
        screen = self._knob_screen_points(search, k)
        pair = self._cost(search, [ph_i for ph_i in sorted(set(self._base_table(search).values()))],
                          self.cfg.confirm_samples)
        # its screen and the pairs a verdict needs at the least
        cost = self._cost(search, screen, self.cfg.screen_samples) + self.cfg.knob_pairs * (pair + self._cost(
            search, [int(i) for i in sp.default[:nc]], self.cfg.confirm_samples))
        gain_now = self._table_gain(search, base)
        # the prior is no judge of knob settings (it misses what sockets and inlining do): at least 5%,
        # at even odds
        value = (1 - math.exp(-max(g - gain_now, math.log(1.05)))) * self._horizon_gpu_s(search) * 0.5
        return k, screen, cost, value

    def _knob_screen_points(self, search, k: int) -> list[int]:
        """A knob setting's screen: per size, NCCL's choice under it, the configurations NCCL's
        defaults' screen measured fastest (``leaders + 1``, as they are under this setting), and the
        prior's best under it."""
        sp = search.space
        nc = sp.n_cells
        jobs = self._jobs_of(search)
        base = self.phases[0]
        out = []
        for c in range(nc):
            mem = sp.members[k * nc + c]
            if not len(mem):
                continue
            by_key = {sp.keys[int(i)]: int(i) for i in mem}
            d = int(sp.default[k * nc + c])
            got = {int(i): jobs[int(i)][base.screen] for i in sp.members[c] if base.screen in jobs.get(int(i), {})}
            fast = [by_key[sp.keys[i]] for i in sorted(got, key=got.get) if sp.keys[i] in by_key]
            fast = fast[: self.cfg.leaders + 1]
            keep = [d] if d >= 0 else []
            keep += [*fast, int(mem[np.argmin(sp.prior[mem])])]
            out += list(dict.fromkeys(keep))
        return out

    def _open_leaders(self, search, ph: Phase) -> list[int]:
        """NCCL's choice and the undecided leaders of ``ph``, size by size."""
        sp = search.space
        out = []
        for c, ls in sorted(ph.leaders.items()):
            open_ = [i for i in ls if i not in ph.decided]
            if open_:
                out += [int(sp.default[ph.knob * sp.n_cells + c]), *open_]
        return out

    def _base_table(self, search) -> dict[int, int]:
        """Per cell, the point NCCL's defaults' table runs (its confirmed row, else NCCL's choice)."""
        sp = search.space
        t = self._rows_of(search, self.phases[0])
        return {c: t.get(c, int(sp.default[c])) for c in range(sp.n_cells)}

    def _rows_of(self, search, ph: Phase) -> dict[int, int]:
        """Per cell, the confirmed leader (the fastest confirmed) of a phase under NCCL's defaults."""
        sp = search.space
        thr = self._thr(search)
        alpha = search.cfg.decision.alpha
        tests = self.tests(search, ph)
        rows = {}
        for c, ls in ph.leaders.items():
            d = int(sp.default[c])
            ok = [i for i in ls if tests[(i, d)].passes(thr, alpha / len(ls) if len(ls) > 1 else alpha)]
            if ok:
                rows[c] = max(ok, key=lambda i: tests[(i, d)].gain)
        return rows

    def _table_gain(self, search, ph: Phase) -> float:
        sp = search.space
        tests = self.tests(search, ph)
        rows = self._rows_of(search, ph)
        g = np.zeros(sp.n_cells)
        for c, i in rows.items():
            g[c] = tests[(i, int(sp.default[c]))].gain
        return float(np.mean(g)) if sp.weights is None else float(np.dot(sp.sensitivity(
            search.model.mean[sp.default[:sp.n_cells]]), g))

    def _pair_diffs(self, search, ph: Phase, plain: bool = False) -> np.ndarray:
        """Per pair of jobs (the setting's i-th, NCCL's defaults' i-th after the setting's screen),
        per cell: the defaults' table's log time (``plain``: NCCL's plain default's) minus the
        setting's table's (nan: unmeasured)."""
        sp = search.space
        nc = sp.n_cells
        jobs = self._jobs_of(search)
        mine = [j for j in ph.confirm if j in search.knob_jobs[ph.knob]]
        theirs = [j for j in ph.confirm if j in search.knob_jobs[0]]
        t0 = {c: int(sp.default[c]) for c in range(nc)} if plain else self._base_table(search)
        out = np.full((min(len(mine), len(theirs)), nc), np.nan)
        for r, (a, b) in enumerate(zip(mine, theirs, strict=False)):
            for c in range(nc):
                x, y = jobs.get(ph.table.get(c, -1), {}).get(a), jobs.get(t0[c], {}).get(b)
                if x and y:
                    out[r, c] = math.log(y) - math.log(x)
        return out

    def _judge_knob(self, search, ph: Phase) -> None:
        """Accepted, from ``knob_pairs`` pairs on: over the pairs, the objective's gain of the
        setting's table over the defaults' table at least ``delta`` at level ``alpha`` (Student-t
        over pairs, every pair's job shifts in its noise), faster in more than half the pairs, no
        size measured slower than ``1 / (1 + delta)`` at level ``size_risk`` (per size, against
        NCCL's plain default, the pairs' mean difference with the pair's shift taken out, its sd
        pooled over sizes), and no size whose mean over the pairs is slower by ``delta``. Refused
        as soon as a size is so measured slower, when the gain's upper bound lies below ``delta``,
        or when the setting has had twice ``knob_pairs`` pairs."""
        sp = search.space
        thr = self._thr(search)
        D = self._pair_diffs(search, ph)
        if len(ph.table) < sp.n_cells:
            ph.verdict = "refused: its screen did not measure every size"
            return
        if len(D) < 2:
            return
        if np.isnan(D).any():
            ph.verdict = "refused: a size of its table went unmeasured"
            return
        alpha = search.cfg.decision.alpha
        a = sp.sensitivity(search.model.mean[sp.default[: sp.n_cells]])
        G = D @ a
        n, nc = D.shape
        se = max(float(np.std(G, ddof=1)), 1e-6) / math.sqrt(n)
        p = _t_sf((float(G.mean()) - thr) / se, n - 1)
        # per size, against NCCL's plain default (no size may be slower than that): the pair's shift
        # (its mean over sizes) taken out, the residual sd pooled over sizes
        D = self._pair_diffs(search, ph, plain=True)
        if np.isnan(D).any():
            ph.verdict = "refused: NCCL's plain default went unmeasured at a size"
            return
        R = D - D.mean(axis=1, keepdims=True)
        R = R - R.mean(axis=0, keepdims=True)
        df = max((n - 1) * (nc - 1), 1)
        sd = math.sqrt(float((R ** 2).sum()) / df)
        per_size = D.mean(axis=0)
        se_size = math.hypot(sd / math.sqrt(n), se)  # the size's own noise and the shift's
        # a size measured slower by delta at level size_risk (looser than alpha: a knob setting changes
        # every size, and where in doubt NCCL's defaults stay) refuses the setting, from 3 pairs on
        slower = per_size + _quantile(df, 1 - self.cfg.size_risk) * se_size < -thr
        self.knob_evidence[str(ph.knob)] = {
            "pairs": n, "gain": round(math.exp(float(G.mean())), 4), "p_value": round(p, 4),
            "worst_size": round(math.exp(float(per_size.min())), 4), "sizes_slower": int(slower.sum())}
        if slower.any() and n >= 3:
            ph.verdict = "refused"
        elif n >= self.cfg.knob_pairs and (per_size < -thr).any():
            ph.verdict = "refused"  # where in doubt NCCL's defaults stay: no size may even measure slower
        elif n >= self.cfg.knob_pairs and p < alpha and 2 * int((G > 0).sum()) > n:
            ph.verdict = "accepted"
        elif float(G.mean()) + _quantile(max(n - 1, 1), 0.95) * se < thr or n >= 2 * self.cfg.knob_pairs:
            ph.verdict = "refused"

    # -- the decision ------------------------------------------------------------------------------
    def decide(self, search) -> Table:
        """The table the confirmation jobs support: under NCCL's defaults, per size the fastest
        leader that passes :func:`paired_test` at ``alpha`` (divided by the size's leaders); an
        explored knob setting replaces them only when accepted (:meth:`_judge_knob`), the
        largest measured gain first."""
        self._record(search)
        for ph in self.phases[1:]:  # a pair that was the run's last job is judged too
            if ph.screen and not ph.verdict:
                self._judge_knob(search, ph)
        sp = search.space
        nc = sp.n_cells
        plain = sp.default[:nc]
        final = plain.copy()
        cg, cs = np.zeros(nc), np.zeros(nc)
        rows, prob = {}, {}
        self.evidence = {}
        knob = 0
        if self.phases:
            base = self.phases[0]
            tests = self.tests(search, base)
            same = same_as_nccl(sp)
            for c, i in self._rows_of(search, base).items():
                t = tests[(i, int(plain[c]))]
                rows[c], prob[c], final[c] = i, 1 - t.p_value, i
                cg[c], cs[c] = t.gain, t.se
                self.evidence[c] = {"confirm_jobs": t.jobs, "paired_gain": round(math.exp(t.gain), 4),
                                    "p_value": round(t.p_value, 5), "wins": t.wins, "df": round(t.df, 1),
                                    "leaders": len(base.leaders[c]), "screen_job": base.screen,
                                    **({"twin": "the replica says NCCL picks this configuration here, yet it "
                                        "measured faster than NCCL's own choice"} if same[i] else {})}
            best = 0.0
            for ph in self.phases[1:]:
                if ph.verdict == "accepted":
                    D = self._pair_diffs(search, ph)
                    g = float(D.mean(axis=0) @ sp.sensitivity(search.model.mean[plain]))
                    if g > best:
                        best, knob = g, ph.knob
            if knob:
                ph = next(p for p in self.phases if p.knob == knob)
                D = self._pair_diffs(search, ph, plain=True)
                final = np.array([ph.table[c] for c in range(nc)])
                cg = D.mean(axis=0)
                cs = D.std(axis=0, ddof=1) / math.sqrt(len(D))
                # every size runs the point its pairs measured: a twin of NCCL's choice stays an explicit row
                rows = {c: int(final[c]) for c in range(nc) if not sp.is_default[final[c]]}
                prob = dict.fromkeys(rows, float("nan"))
                self.evidence = {}
        gain = float(np.mean(cg)) if sp.weights is None else float(np.dot(sp.sensitivity(search.model.mean[plain]), cg))
        return Table(knob, rows, prob, 1.0 if knob == 0 else 1 - self.knob_evidence.get(str(knob), {}).get(
            "p_value", 0.0), gain, final, cg, cs, search.model.noise)
