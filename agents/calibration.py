"""Calibrate a problem's prior on measurements before trusting it: the tuning run's first job
measures NCCL's defaults at every size (one S-curve), the prior simulator is fitted to them
(:func:`ncclrl.costmodel.calibrate.fit`), and the run goes on with the calibrated prior.

Also the margin rule's error figures: how far a prior's predicted times, and its predicted gains
over NCCL's choice, stand from measured ones (:func:`prior_errors`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

import numpy as np
import pandas as pd

from ncclrl.agents.export import simulator_is_calibrated
from ncclrl.agents.problem import Problem
from ncclrl.agents.search import Search
from ncclrl.costmodel import nccl as N
from ncclrl.costmodel.calibrate import fit
from ncclrl.costmodel.errors import ConfigError
from ncclrl.costmodel.replica import default_decisions
from ncclrl.costmodel.simulator import Simulator
from ncclrl.costmodel.space import DEFAULT, KNOB_FIELDS, Key, Point, point_configs

CALIBRATE = ("auto", "on", "off")
#: a measured point: (knob setting, collective, size, per-call configuration) -> time (us)
Measured = dict[tuple[tuple[int, ...], int, int, Key], float]


def prior_is_calibrated(problem: Problem) -> bool:
    """Whether the problem's prior is a calibration for its platform: the topology carries a fitted
    ``sim`` block (``ncclrl calibrate output=`` writes one; the shipped H200 presets carry their
    machine's fit) and the prior runs on exactly those parameters."""
    return problem.prior is not None and simulator_is_calibrated(problem.prior)


def fit_frame(problem: Problem, measured: Measured) -> pd.DataFrame:
    """The fit's rows (:func:`ncclrl.costmodel.calibrate.fit`) for measured points: NCCL's own choice
    resolved to the replica's decision under the point's knob setting; one nuisance source per knob
    setting (each ran in its own jobs)."""
    rows = []
    for (kn, c, s, key), t in measured.items():
        if not (t is not None and np.isfinite(t) and t > 0):
            continue
        k = dict(zip(KNOB_FIELDS, kn, strict=True))
        if key[0] == "default":
            d = default_decisions(problem.topo, c, np.array([s], dtype=np.int64), comm_channels=int(k["comm_channels"]))
            algo, proto = N.ALGOS[int(d.algo[0])], N.PROTOS[int(d.proto[0])]
        else:
            algo, proto = key[0], key[1]
        rows.append({"source": "/".join(map(str, kn)), "collective": N.COLLECTIVES[c], "nbytes": int(s),
                     "algo": algo, "proto": proto, "channels": int(key[2]), **{f: int(v) for f, v in k.items()},
                     "time_us": float(t)})
    if not rows:
        raise ConfigError("calibrate", "no measurement to calibrate the prior on")
    return pd.DataFrame(rows)


def calibrate(problem: Problem, measured: Measured, max_nfev: int = 400) -> Problem:
    """``problem`` with its prior fitted to ``measured`` (started from the prior's own parameters),
    everything else unchanged.

    :param problem: the problem whose prior to calibrate
    :param measured: the points measured (e.g. NCCL's defaults at every size) and their times (us)
    :param max_nfev: most evaluations of the fit
    """
    prior = problem.prior or Simulator(problem.topo, seed=0)
    res = fit(problem.topo, fit_frame(problem, measured), prior.params, max_nfev=max_nfev)
    return replace(problem, prior=Simulator(problem.topo, res.params, seed=0))


def s_curve(problem: Problem, measured: Measured) -> Measured:
    """The measured points that are NCCL's plain defaults (the S-curve the first job measures)."""
    return {x: t for x, t in measured.items() if x[0] == problem.base.knobs and x[3] == DEFAULT}


def predicted(problem: Problem, points: list[tuple[tuple[int, ...], int, int, Key]]) -> np.ndarray:
    """The prior's time (us) of each (knob setting, collective, size, configuration)."""
    out = np.empty(len(points))
    by: dict[tuple[tuple[int, ...], int], list[int]] = {}
    for i, (kn, c, _s, _key) in enumerate(points):
        by.setdefault((kn, c), []).append(i)
    for (kn, c), idx in by.items():
        k = Point(N.COLLECTIVES[c], 0, **dict(zip(KNOB_FIELDS, kn, strict=True)))
        cfg = point_configs(problem.topo, k, c, np.array([points[i][2] for i in idx]), [points[i][3] for i in idx])
        out[idx] = problem.prior.time_us(cfg, validate=False)
    return out


def prior_errors(problem: Problem, truth: Measured) -> pd.DataFrame:
    """Per measured point: the prior's |log error| of its time, and, where NCCL's choice under the
    same knob setting was measured at the same size, of its gain over NCCL's choice
    (``log(t_nccl / t_point)``, predicted against measured): the error the margin rule guards against."""
    pts = [x for x, t in truth.items() if t is not None and np.isfinite(t) and t > 0]
    pred = predicted(problem, pts)
    meas = np.array([truth[x] for x in pts])
    at = {x: i for i, x in enumerate(pts)}
    rows = []
    for i, (kn, c, s, key) in enumerate(pts):
        d = at.get((kn, c, s, ("default", "default", 0)))
        gain_err = np.nan
        if d is not None and d != i:
            gain_err = abs(np.log(pred[d] / pred[i]) - np.log(meas[d] / meas[i]))
        rows.append({"knobs": "/".join(map(str, kn)), "collective": N.COLLECTIVES[c], "nbytes": s,
                     "key": "/".join(map(str, key)), "log_err": abs(float(np.log(pred[i] / meas[i]))),
                     "gain_err": gain_err})
    return pd.DataFrame(rows)


def measured_s_curve(search: Search) -> Measured:
    """NCCL's plain defaults the run has measured: per size, the geometric mean of its jobs' medians."""
    sp, p = search.space, search.problem
    out: Measured = {}
    for c in range(sp.n_cells):
        i = int(sp.default[c])
        if search.n[i] > 0:
            coll, s = sp.cells[c]
            out[(p.base.knobs, coll, s, DEFAULT)] = float(np.exp(search.ysum[i] / search.n[i]))
    return out


def calibrate_first(search: Search, log: Callable[[str], None] = lambda _m: None) -> dict[str, Any]:
    """The run's first job measures NCCL's defaults at every size (one job, the S-curve); the prior
    is fitted to it and the run goes on with the calibrated prior (:meth:`Search.recalibrate`),
    every measurement kept. Returns what the calibration did: the points it was fitted on and the
    prior's median |log error| on them before and after (``{}`` when the job measured nothing)."""
    sp = search.space
    search.pending = [int(i) for i in sp.default[: sp.n_cells]]
    search.flush()
    curve = measured_s_curve(search)
    if not curve:
        return {}
    before = float(np.median(prior_errors(search.problem, curve)["log_err"]))
    problem = calibrate(search.problem, curve)
    after = float(np.median(prior_errors(problem, curve)["log_err"]))
    search.recalibrate(problem)
    log(f"# calibrated the prior on NCCL's defaults at {len(curve)} sizes (one job): median |log error| "
        f"{before:.3f} -> {after:.3f}")
    return {"points": len(curve), "median_log_err_before": round(before, 4), "median_log_err_after": round(after, 4)}
