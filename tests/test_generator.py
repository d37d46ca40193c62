"""The calibrated problem generator (agents/generator.py, docs/explanation/generator.md)."""

from __future__ import annotations

import numpy as np
import pytest

from ncclrl.agents import generator as G
from ncclrl.costmodel import nccl as N
from ncclrl.costmodel.errors import ConfigError
from ncclrl.costmodel.space import DEFAULT, Point

CALLS = [G.calls_vector(np.random.default_rng([91, j])) for j in range(8)]


@pytest.fixture(scope="module")
def recorded():
    return G.recorded_sources()


def measured_optima(sources, family):
    """Per recorded source of ``family``, its median calls-weighted optimum over CALLS and its collectives."""
    out = []
    for s in sources:
        if s.family != family:
            continue
        v = [G.optimum_of(b, n, G.calls_at(c, nb)) for b, n, nb in s.tables() for c in CALLS]
        out.append(float(np.median(v)))
    return out


def generated_optima(family, n=24):
    out = []
    for i in range(n):
        g = G.draw_calibrated(np.random.default_rng([92, i]), families=[family])
        best, nccl, nbytes = G.best_per_knob(g.problem, g.oracle.times)
        out.append(G.optimum_of(best, nccl, G.calls_at(CALLS[i % len(CALLS)], nbytes)))
    return out


@pytest.mark.parametrize("family", ["nvlink", "socket"])
def test_generated_optima_lie_within_the_recorded_hosts_range(recorded, family):
    measured = measured_optima(recorded, family)
    assert measured, f"no recorded host of {family}"
    med = float(np.median(generated_optima(family)))
    # the recorded hosts alone: a family with one host gives a range of one value, widened by half the
    # fit's acceptance factor (1.5) either side
    lo, hi = min(measured) / 1.5, max(measured) * 1.5
    assert lo <= med <= hi, (family, med, measured)


def test_same_seed_reproduces_and_streams_differ():
    a = G.calibrated_problems(3, 11)
    b = G.calibrated_problems(3, 11)
    c = G.calibrated_problems(3, 12)
    for x, y in zip(a, b, strict=True):
        assert x.name == y.name and np.array_equal(x.calls, y.calls)
        assert x.budget_gpu_s == y.budget_gpu_s and x.serve_gpu_s == y.serve_gpu_s and x.optimum() == y.optimum()
    assert len({(x.name, x.budget_gpu_s) for x in a}) == 3
    assert all(not np.array_equal(x.calls, y.calls) for x, y in zip(a, c, strict=True))


def _default_points(g, n=4):
    c = g.problem.colls[0]
    k = g.problem.base
    return k, [Point(N.COLLECTIVES[c], s, *DEFAULT, *k.knobs) for s in g.problem.sizes[c][:n]]


def test_measure_draws_fresh_noise_per_seed_and_per_problem():
    g = G.draw_calibrated(np.random.default_rng([93, 0]))
    k, pts = _default_points(g)
    a = g.measure(0)(k, pts, 3, "t")
    assert a == g.measure(0)(k, pts, 3, "t")  # a seed reproduces
    assert a != g.measure(1)(k, pts, 3, "t")  # another seed draws other jobs
    m = g.measure(0)
    assert m(k, pts, 3, "t") != m(k, pts, 3, "t")  # every job of one seed is a new job
    # two problems with the same truth but drawn apart measure apart under the same seed
    h = G.draw_calibrated(np.random.default_rng([93, 0]))
    h.noise_seed += 1
    assert h.measure(0)(k, pts, 3, "t") != a
    # the noise is around the truth: the median of many jobs is near the expected time
    t = g.oracle.times[(k.knobs, g.problem.colls[0])][0, : len(pts)]
    med = np.median([[np.median(x) for x in g.measure(s)(k, pts, 3, "t")] for s in range(60)], axis=0)
    assert np.allclose(med, t, rtol=0.15)


def test_compose_and_optimum_agree():
    g = G.draw_calibrated(np.random.default_rng([94, 3]))
    cp = g.compose()
    assert cp.budget_gpu_s == g.budget_gpu_s and cp.serve_gpu_s == g.serve_gpu_s
    assert cp.optimum() == pytest.approx(g.optimum(), rel=1e-9)
    assert 0.25 <= g.budget_gpu_s / cp.sweep_gpu_s() <= 1.0
    assert 3.0 <= g.serve_gpu_s / cp.sweep_gpu_s() <= 300.0


def test_gain_scales_the_optimum():
    fit = G.FIT
    lo = fit.replace(gain={"socket": 0.2}, gain_sd={"socket": 0.0})
    hi = fit.replace(gain={"socket": 1.0}, gain_sd={"socket": 0.0})
    rng = [np.random.default_rng([95, 0]) for _ in range(2)]
    a = G.draw_calibrated(rng[0], lo, ["socket"])
    b = G.draw_calibrated(rng[1], hi, ["socket"])
    assert a.name == b.name and a.optimum() < b.optimum()
    # the calibration keeps NCCL's defaults and which point is fastest at each size
    c = a.problem.colls[0]
    assert np.allclose(a.oracle.times[(a.problem.base.knobs, c)][0], b.oracle.times[(b.problem.base.knobs, c)][0])
    ta, tb = (x.oracle.times[(x.problem.base.knobs, c)] for x in (a, b))
    assert np.array_equal(np.argmin(ta, axis=0), np.argmin(tb, axis=0))


@pytest.mark.parametrize("kw, key", [
    ({"gain": {"socket": 0.0}}, "generator.gain.socket"),
    ({"gain": {"nvlink": float("nan")}}, "generator.gain.nvlink"),
    ({"gain_sd": {"infiniband": -1.0}}, "generator.gain_sd.infiniband"),
    ({"misspecified": {"socket": 1.5}}, "generator.misspecified.socket"),
    ({"strength": {"socket": (3.0, 1.0)}}, "generator.strength.socket"),
    ({"noise": {"socket": ()}}, "generator.noise.socket"),
    ({"gain": {"ethernet": 1.0}}, "generator.gain"),
    ({"bogus": {}}, "generator.bogus"),
])
def test_bad_parameters_name_the_key(kw, key):
    with pytest.raises(ConfigError) as e:
        G.FIT.replace(**kw)
    assert key in str(e.value)


def test_unknown_family_is_refused():
    with pytest.raises(ConfigError, match="families"):
        G.draw_calibrated(np.random.default_rng(0), families=["ethernet"])
