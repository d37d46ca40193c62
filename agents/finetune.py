"""Fine-tuning: a tuning run (:class:`ncclrl.agents.search.Search`) of the shipped (or a given)
search strategy on a live or replayed platform under a measurement budget, and the files it
exports.

The default run (:class:`ncclrl.agents.search.ConfirmController`) screens every candidate in one
job, confirms each size's leaders beside NCCL's choice in further jobs and explores knob settings
with what is left; the table keeps a row only where the confirmation jobs alone show it at least
``delta`` faster than NCCL's choice (:func:`ncclrl.agents.search.paired_test`), and ``nccl.conf`` a
knob setting only where pairs of jobs show its table faster and no size slower. The other
strategies decide with :func:`ncclrl.agents.search.decide`. Every measurement counts against the
budget, NCCL's defaults included.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ncclrl.agents.calibration import CALIBRATE, calibrate_first, prior_is_calibrated
from ncclrl.agents.problem import Evaluator, Problem
from ncclrl.agents.search import Controller, Search, SearchConfig, estimate, measurements
from ncclrl.costmodel import nccl as N
from ncclrl.costmodel.errors import ConfigError
from ncclrl.costmodel.space import Point, size_grid
from ncclrl.costmodel.table import MAX_BYTES, Row, Table
from ncclrl.costmodel.topology import Topology


@dataclass
class Outcome:
    """What a tuning run exports: the knob setting, the rows (``collective``, ``nbytes``, ``key``
    and the evidence for each), the points measured, and the run's history and stop reason."""

    conf: Point
    rows: list[dict[str, Any]]
    measured: int
    rounds: int
    history: list[dict[str, Any]] = field(default_factory=list)
    reason: str = ""
    evidence: dict[str, Any] = field(default_factory=dict)


def knob_label(k: Point) -> str:
    return " ".join(f"{a}={b}" for a, b in k.env().items()) or "NCCL defaults"


def finetune(problem: Problem, ev: Evaluator, controller: Controller, cfg: SearchConfig,
             log: Callable[[str], None] = lambda _m: None, calibrate: str = "off") -> tuple[Outcome, Search]:
    """One tuning run of ``controller`` over ``problem`` through ``ev``; the outcome carries, per
    row, the probability that it is ``delta`` faster than NCCL's choice, both measured times
    (job shifts taken out: :func:`ncclrl.agents.search.estimate`), the jobs that measured both
    and its speedup over NCCL's plain default with a 95% interval; and the run's fitted noise and
    worst size (:func:`size_report`).

    :param calibrate: on: the first job measures NCCL's defaults at every size and the prior is
        calibrated on it before the search (:func:`ncclrl.agents.calibration.calibrate_first`);
        auto: so where the prior is not a calibration for the platform
        (:func:`ncclrl.agents.calibration.prior_is_calibrated`); off: the prior as given
    """
    if calibrate not in CALIBRATE:
        raise ConfigError("calibrate", f"allowed: {', '.join(CALIBRATE)}; got {calibrate!r}")
    search = Search(problem, ev, controller, cfg, log=log)
    calibration: dict[str, Any] = {}
    if calibrate == "on" or (calibrate == "auto" and not prior_is_calibrated(problem)):
        calibration = calibrate_first(search, log)
    res = search.run()
    sp, m, t = search.space, search.model, res.table
    est = estimate(sp, measurements(sp, ev), m.noise)
    rows = []
    for c, i in sorted(t.rows.items()):
        coll, s = sp.cells[c]
        d = sp.default_of[i]
        paired = sorted(est.jobs[est.at[i]] & est.jobs[est.at[d]]) if d >= 0 and est.measured(d) else []
        rows.append({"collective": N.COLLECTIVES[coll], "nbytes": int(s), "key": sp.keys[i],
                     "prob": round(float(t.prob[c]), 4), "measured_jobs": int(est.n[est.at[i]]),
                     "paired_jobs": len(paired), "time_us": round(math.exp(est.mu[est.at[i]]), 3),
                     "nccl_time_us": round(math.exp(est.mu[est.at[d]]), 3) if d >= 0 else None,
                     "speedup_vs_nccl_defaults": [round(x, 4) for x in t.speedup(c)]})
        confirmed = getattr(controller, "evidence", {}).get(c)
        if confirmed:  # screen, confirm: the test on the confirmation jobs alone
            rows[-1]["confirmation"] = confirmed
    zs = res.zero_shot
    evidence = {"knob_prob": round(float(t.knob_prob), 4),
                "gain_vs_defaults": round(math.exp(t.gain), 4),
                "zero_shot": {"conf": problem.knobs[zs.knob].env(), "rows": len(zs.rows),
                              "gain_vs_defaults_posterior": round(math.exp(sp.log_gain(
                                  m.mean[sp.default[: sp.n_cells]], m.mean[zs.final])), 4)},
                "delta": cfg.decision.delta, "alpha": cfg.decision.alpha, "jobs": ev.calls,
                "noise": m.noise.as_dict(), **size_report(search, t)}
    if calibration:
        evidence["calibration"] = calibration
    phases = getattr(controller, "phases", None)
    if phases is not None:  # screen, confirm, explore: what each knob setting's jobs were and came to
        evidence["phases"] = [{"conf": problem.knobs[ph.knob].env(), "screen_job": ph.screen,
                               "confirm_jobs": ph.confirm, "leaders": sum(map(len, ph.leaders.values())),
                               "confirmed": sum(v == "confirmed" for v in ph.decided.values()),
                               "refuted": sum(v == "refuted" for v in ph.decided.values()),
                               **({"verdict": ph.verdict or "undecided",
                                   **controller.knob_evidence.get(str(ph.knob), {})} if ph.knob else {})}
                              for ph in phases]
    if problem.weights is not None:
        evidence["step"] = step_saving(search, t)
    out = Outcome(res.decision.conf, rows, res.measured, res.rounds, res.history, res.reason, evidence)
    return out, search


def size_report(search: Search, table: Any) -> dict[str, Any]:
    """The exported table's worst size: the (collective, bytes) whose measured speedup over NCCL's
    plain default is lowest, with its 95% interval, and the sizes slower than NCCL's plain default
    beyond their interval (upper end below 1; the decision never exports one)."""
    sp = search.space
    sizes = []
    for c in range(sp.n_cells):
        if not np.isfinite(table.cell_gain[c]):
            continue
        coll, s = sp.cells[c]
        x, lo, hi = table.speedup(c)
        sizes.append({"collective": N.COLLECTIVES[coll], "nbytes": int(s), "speedup": round(x, 4),
                      "lo": round(lo, 4), "hi": round(hi, 4)})
    worst = min(sizes, key=lambda r: r["speedup"]) if sizes else None
    return {"worst_size": worst, "slower_sizes": [r for r in sizes if r["hi"] < 1],
            "sizes_unmeasured": sp.n_cells - len(sizes)}


def step_saving(search: Search, table: Any, draws: int = 4000, seed: int = 0) -> dict[str, float]:
    """The job's communication time per step (calls x time, us) under NCCL's plain defaults and
    under ``table``, and the time saved, with a 95% interval: ``draws`` draws of every point's log
    time from the run's posterior, plus, when the table's knob setting is not NCCL's, the shift
    its jobs share (the run's fitted ``job_sd``)."""
    sp, m = search.space, search.model
    w = sp.weights
    plain, final = sp.default[: sp.n_cells], np.asarray(table.final)
    idx = np.unique(np.concatenate([plain, final]))
    rng = np.random.default_rng(seed)
    z = rng.standard_normal((draws, len(idx)))
    logt = np.zeros((draws, sp.size))
    logt[:, idx] = m.mean[idx] + z * m.std[idx]
    shift = np.zeros((draws, 1))
    if table.knob:
        jobs = search.knob_jobs
        sd = m.noise.job_sd * math.sqrt(1 / max(len(jobs[table.knob]), 1) + 1 / max(len(jobs[0]), 1))
        shift = rng.standard_normal((draws, 1)) * sd
    base = np.exp(logt[:, plain]) @ w
    tuned = np.exp(logt[:, final] + shift) @ w
    saved = base - tuned
    lo, hi = np.percentile(saved, [2.5, 97.5])
    return {"nccl_us_per_step": round(float(np.exp(m.mean[plain]) @ w), 3),
            "table_us_per_step": round(float(np.exp(m.mean[final]) @ w), 3),
            "saved_us_per_step": round(float(np.mean(saved)), 3), "saved_lo": round(float(lo), 3),
            "saved_hi": round(float(hi), 3), "saved_pct": round(float(100 * np.mean(saved) / np.mean(base)), 3)}


def write_outcome(out: Outcome, topo: Topology, sizes: dict[int, list[int]], out_dir: Path,
                  provenance: dict[str, Any], title: str = "ncclrl fine-tuned table",
                  exact: bool = False) -> dict[str, Path]:
    """``nccl_tuner.csv`` (example-plugin format), ``nccl.conf`` and ``finetune.json`` (every row
    with its evidence, the run's history, its stop reason, the budget used). A row covers its size
    up to the next measured one; ``exact``: only its own size (a job's sizes: the bytes between them
    were never measured). Every other size, and every other collective, of the run's communicator
    gets a row stating NCCL's own choice (:meth:`Table.complete`), so that both plugins run it as
    NCCL would; a row keeping NCCL's channel count gets the count NCCL would use."""
    by = {(r["collective"], r["nbytes"]): r for r in out.rows}
    rows = []
    for c, ss in sizes.items():
        name = N.COLLECTIVES[c]
        for i, s in enumerate(ss):
            r = by.get((name, s))
            if r is None:
                continue
            lo = s if exact or i else 0
            # the last row runs to the table's end, 4 GiB - 1, or to its own size above that
            hi = s if exact else (max(MAX_BYTES, s) if i == len(ss) - 1 else ss[i + 1] - 1)
            rows.append(Row(name, lo, hi, *r["key"], nnodes=topo.nodes, nranks=topo.nranks))
    env = out.conf.env()
    table = Table(topo, rows, {k: int(v) for k, v in env.items()}, provenance,
                  title=f"{title}, {out.measured} live measurements", cover=[(topo.nodes, topo.nranks)])
    return table.write(out_dir, json_name="finetune.json", extra={
        "topology": topo.name, "measured": out.measured, "rounds": out.rounds, "conf": env, "reason": out.reason,
        "rows": [dict(r, key="/".join(map(str, r["key"]))) for r in out.rows], "history": out.history,
        "evidence": out.evidence})


def sizes_for(topo: Topology, colls: list[int], lo: int, hi: int) -> dict[int, list[int]]:
    return {c: size_grid(lo, hi, topo.nranks, c) for c in colls}

