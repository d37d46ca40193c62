"""The decision of a tuning run (:func:`decide`): one rule for rows and knob settings, on measured
points only; and the zero-shot table (:func:`zero_shot`)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from ncclrl.agents.search.model import Measurements, Model, Noise, estimate, same_as_nccl
from ncclrl.agents.search.space import Space, _cdf
from ncclrl.costmodel.errors import ConfigError

# -- the decision ------------------------------------------------------------------------------

Z95 = 1.959963984540054  # two-sided 95% intervals


@dataclass
class DecisionConfig:
    """The one rule that turns measurements into a table: measured points only.

    :param delta: smallest gain worth a change (fraction: 0.02 = 2% faster)
    :param alpha: a row (or knob setting) is kept when, from the run's measurements alone, the
        probability that it is at least ``delta`` faster than NCCL's choice (defaults) exceeds
        ``1 - alpha``; a knob setting also needs, at every size, its measured speedup over NCCL's
        plain default at least ``1 / (1 + delta)``
    :param min_jobs: a point becomes a row, or part of a knob setting's table, only once measured in
        this many jobs: a job's median is a heavy-tailed draw (recorded A/A jobs: t with 2.5 degrees
        of freedom), and the fastest of many candidates measured once is fast by luck as often as
        not; the second job confirms or refutes it
    """

    delta: float = 0.01
    alpha: float = 0.05
    min_jobs: int = 2

    def check(self) -> None:
        if self.min_jobs < 1:
            raise ConfigError("decision.min_jobs", f"must be >= 1, got {self.min_jobs}")
        if not 0 <= self.delta < 1:
            raise ConfigError("decision.delta", f"must be in [0, 1), got {self.delta}")
        if not 0 < self.alpha < 0.5:
            raise ConfigError("decision.alpha", f"must be in (0, 0.5), got {self.alpha}")


@dataclass
class Table:
    """A decision with its evidence: per cell the chosen point (index into the space) and the
    probability that it is ``delta`` faster than NCCL's choice; the knob setting's; per cell the
    measured log speedup of the point the table runs over NCCL's plain default and its sd (0 where
    it runs NCCL's plain default itself, ``nan`` where that is not measured)."""

    knob: int
    rows: dict[int, int]
    prob: dict[int, float]
    knob_prob: float
    gain: float  # posterior mean of the objective's gain over NCCL's plain defaults (log; Space.log_gain)
    final: np.ndarray  # per cell, the point the table runs (its row or NCCL's choice)
    cell_gain: np.ndarray = field(default_factory=lambda: np.empty(0))  # measured log speedup per cell
    cell_sd: np.ndarray = field(default_factory=lambda: np.empty(0))
    noise: Noise | None = None  # the noise the decision was taken under

    def speedup(self, c: int) -> tuple[float, float, float]:
        """Cell ``c``'s measured speedup over NCCL's plain default, with its 95% interval."""
        g, s = float(self.cell_gain[c]), float(self.cell_sd[c])
        return math.exp(g), math.exp(g - Z95 * s), math.exp(g + Z95 * s)


def decide(space: Space, model: Model, obs: Measurements, cfg: DecisionConfig) -> Table:
    """The table the measurements support (the module's docs, point 3), from measured points only
    (:func:`estimate` under the model's fitted noise). Per knob setting and size, a row is a
    measured point other than NCCL's own choice (:func:`same_as_nccl`), at least ``delta`` faster
    than NCCL's choice next to it, itself measured, with probability above ``1 - alpha``; of those
    the fastest measured, else NCCL's choice stays. NCCL's choice never measured itself but
    measured as the same configuration made explicit is measured (that configuration's jobs
    stand for it); under another knob setting, where it was not measured at all, a row must be
    that much faster than NCCL's plain default. A knob setting other than NCCL's defaults needs
    the point its table runs at every size measured (in ``min_jobs`` jobs), its table's gain over
    the table under NCCL's defaults ``delta`` with that probability corrected (Sidak) for every
    other knob setting it was chosen among, and at no size a measured speedup over NCCL's plain
    default below ``1 / (1 + delta)`` (a setting that wins on the whole but measures slower at
    some size is refused); of those that pass, the largest measured gain wins. A row needs its
    point measured in ``min_jobs`` jobs, and its probability is corrected (Sidak) for every
    candidate measured at its size, confirmed or not: the confirmed ones were chosen among them."""
    est = estimate(space, obs, model.noise)
    thr = math.log1p(cfg.delta)
    nc = space.n_cells
    plain = space.default[:nc]
    same = same_as_nccl(space)
    tables = []
    for k in range(space.n_knobs):
        final = np.empty(nc, dtype=np.int64)
        seen = np.empty(nc, dtype=np.int64)  # per cell, the point whose measurements stand for final's
        rows, prob = {}, {}
        for c in range(nc):
            g = k * nc + c
            d = space.default[g]
            mem = space.members[g]
            meas = mem[(est.at[mem] >= 0) & ~same[mem]]
            n_cand = max(len(meas), 1)  # the confirmed candidates were picked among every measured one
            meas = meas[[len(est.jobs[est.at[i]]) >= cfg.min_jobs for i in meas]] if len(meas) else meas
            if d >= 0 and not est.measured(d):  # NCCL's choice, measured as the same configuration made explicit
                twins = mem[same[mem] & (est.at[mem] >= 0)]
                if len(twins):
                    d_seen = int(twins[np.argmax(est.n[est.at[twins]])])
                else:
                    d_seen = d
            else:
                d_seen = d
            if d < 0:  # NCCL's choice cannot run here: the table needs a row, judged against the plain default
                if not len(meas):
                    final = None
                    break
                r = meas[np.argmin(est.mu[est.at[meas]])]
                pr = float("nan")
                if est.measured(plain[c]):
                    g0, s0 = est.diff(plain[c], r)
                    pr = float(_cdf((g0 - thr) / max(s0, 1e-12)))
                rows[c], prob[c], final[c], seen[c] = int(r), pr, r, r
                continue
            final[c], seen[c] = d, d_seen
            # against NCCL's choice next to it; under another knob setting, where that was never
            # measured, against NCCL's plain default (the setting's table must then run the row)
            ref = d_seen if est.measured(d_seen) else plain[c]
            if not est.measured(ref) or not len(meas):
                continue
            diffs = [est.diff(ref, i) for i in meas]
            gain = np.array([x for x, _ in diffs])
            sd = np.array([max(s, 1e-12) for _, s in diffs])
            p = _cdf((gain - thr) / sd)
            ok = p > (1 - cfg.alpha) ** (1 / n_cand)  # the best of every candidate measured is kept: Sidak
            if ok.any():  # the fastest measured among the rows the evidence supports
                j = np.flatnonzero(ok)[np.argmin(est.mu[est.at[meas[ok]]])]
                rows[c], prob[c], final[c], seen[c] = int(meas[j]), float(p[j]), meas[j], meas[j]
        if final is None:
            continue
        cg, cs = np.full(nc, np.nan), np.full(nc, np.nan)
        for c in range(nc):
            if final[c] == plain[c]:
                cg[c], cs[c] = 0.0, 0.0
            elif est.measured(seen[c]) and est.measured(plain[c]):
                cg[c], cs[c] = est.diff(plain[c], seen[c])
        tables.append((k, rows, prob, final, cg, cs, seen))
    gain_of = {t[0]: space.log_gain(model.mean[plain], model.mean[t[3]]) for t in tables}
    t0 = tables[0]
    out = Table(0, t0[1], t0[2], 1.0, gain_of[0], t0[3], t0[4], t0[5], model.noise)
    seen0 = t0[6]
    best = 0.0
    a = space.sensitivity(model.mean[plain])
    for k, rows, prob, final, cg, cs, seen in tables[1:]:
        if not (est.at[seen] >= 0).all() or not (est.at[seen0] >= 0).all():
            continue  # a size this setting would run unmeasured, or a size of NCCL's table unmeasured
        if any(len(est.jobs[est.at[i]]) < cfg.min_jobs for i in seen):
            continue  # a size this setting would run on one job's word
        if (cg < -thr).any():
            continue  # a size measured slower than NCCL's plain default by more than delta
        wts: dict[int, float] = {}
        for c in range(nc):  # the setting's table against NCCL's table: shares of the objective
            wts[int(seen0[c])] = wts.get(int(seen0[c]), 0.0) + a[c]
            wts[int(seen[c])] = wts.get(int(seen[c]), 0.0) - a[c]
        g, sd = est.contrast(wts)
        p = float(_cdf((g - thr) / max(sd, 1e-12)))
        if p > (1 - cfg.alpha) ** (1 / max(space.n_knobs - 1, 1)) and g > best:  # the best of the settings: Sidak
            best = g
            out = Table(k, rows, prob, p, gain_of[k], final, cg, cs, model.noise)
    return out


def zero_shot(space: Space) -> Table:
    """The exact argmin of the prior: the knob setting whose best predicted point per size gains
    most over NCCL's plain defaults in the problem's objective (geometric mean over sizes, or the
    step's communication time with weights), and per size its best predicted point (a point that
    runs NCCL's own choice is no row)."""
    nc = space.n_cells
    plain = space.default[:nc]
    same = same_as_nccl(space)
    best = None
    for k in range(space.n_knobs):
        final = np.array([space.members[k * nc + c][np.argmin(space.prior[space.members[k * nc + c]])]
                          if len(space.members[k * nc + c]) else -1 for c in range(nc)])
        if (final < 0).any():
            continue
        gain = space.log_gain(space.prior[plain], space.prior[final])
        if best is None or gain > best.gain + 1e-12:
            rows = {c: int(i) for c, i in enumerate(final) if not same[i]}
            best = Table(k, rows, dict.fromkeys(rows, float("nan")), float("nan"), gain, final)
    return best


def zero_shot_within(space: Space, margin: float) -> Table:
    """:func:`zero_shot` under the margin rule (the simulator's measured error,
    :mod:`ncclrl.agents.export`): a cell leaves NCCL's choice only where the prior's best point is
    predicted faster than it by more than ``margin`` (a fraction: the point's time below
    ``(1 - margin)`` times NCCL's), and a knob setting other than NCCL's defaults is taken only where
    its table is predicted to gain more than ``margin`` over the table under the defaults.

    :param space: the problem's points with the prior's log times
    :param margin: fraction in [0, 1); 0 is :func:`zero_shot`'s choice
    """
    if not 0 <= margin < 1:
        raise ConfigError("margin", f"must be in [0, 1), got {margin}")
    thr = -math.log1p(-margin)
    nc = space.n_cells
    plain = space.default[:nc]
    best, base_gain = None, 0.0
    for k in range(space.n_knobs):
        final = np.full(nc, -1, dtype=np.int64)
        for c in range(nc):
            mem = space.members[k * nc + c]
            if not len(mem):
                continue
            j = mem[np.argmin(space.prior[mem])]
            d = space.default[k * nc + c]
            final[c] = d if d >= 0 and space.prior[j] > space.prior[d] - thr else j
        if (final < 0).any():
            continue
        gain = space.log_gain(space.prior[plain], space.prior[final])
        if k == 0:
            base_gain = gain
        elif gain <= base_gain + thr:
            continue
        if best is None or gain > best.gain + 1e-12:
            rows = {c: int(i) for c, i in enumerate(final) if not space.is_default[i]}
            best = Table(k, rows, dict.fromkeys(rows, float("nan")), float("nan"), gain, final)
    return best
