"""The calibrated problem generator (agents/generator.py, docs/explanation/generator.md)."""

from __future__ import annotations

import numpy as np
import pytest

from ncclrl.agents import generator as G
from ncclrl.costmodel import nccl as N
from ncclrl.costmodel.errors import ConfigError
from ncclrl.costmodel.space import DEFAULT, Point

CALLS = G.common_calls(16)


@pytest.fixture(scope="module")
def recorded():
    return G.recorded_sources()


def cw(table):
    return [table.optimum(G.calls_at(v, table.nbytes)) for v in CALLS]


_TABLES: dict = {}


def generated(family, view, fit=G.FIT, n=48):
    """The calls-weighted optima of ``n`` generated problems of ``family`` as ``view`` sees them."""
    key = (family, id(fit), n)
    if key not in _TABLES:
        _TABLES[key] = (fit, [G.draw_calibrated(np.random.default_rng([92, i]), fit, [family]).table()
                              for i in range(n)])
    out = []
    for i, t in enumerate(_TABLES[key][1]):
        t = t.within(view.lo, view.hi)
        out.append(t.optimum(G.calls_at(CALLS[i % len(CALLS)], t.nbytes), view.knobs))
    return np.array(out)


@pytest.mark.parametrize("family", ["nvlink", "socket"])
def test_generated_optima_lie_within_the_recorded_hosts_range(recorded, family):
    """The committed fit's problems against the recorded hosts of the family (in this repository): in
    each host's view (its sizes, its knob settings), the generator's median calls-weighted optimum lies
    within [min, max] of the hosts' optima widened by the fit's acceptance factor (1.5), and each
    host's optimum within the generator's 2-98% range."""
    hosts = [s for s in recorded if s.family == family]
    assert hosts, f"no recorded host of {family}"
    measured = [s.figure(cw) for s in hosts]
    for s, m in zip(hosts, measured, strict=True):
        gen = generated(family, s.view)
        assert min(measured) / 1.5 <= np.median(gen) <= max(measured) * 1.5, (family, s.name, np.median(gen), measured)
        lo, hi = np.percentile(gen, [2, 98])
        assert lo <= m <= hi, (family, s.name, m, lo, hi)


def test_the_uncalibrated_generator_is_off_where_the_fit_moved_it(recorded):
    """The test can fail: with every gain at 1 (the simulator's own truth) the nvlink problems' optima
    lie far above the recorded NVLink host's."""
    one = G.FIT.replace(gain={"nvlink": 1.0}, gain_sd={"nvlink": 0.0}, knob_gain={"nvlink": 1.0},
                        knob_gain_sd={"nvlink": 0.0})
    host = next(s for s in recorded if s.family == "nvlink")
    assert np.median(generated("nvlink", host.view, one, 24)) > 1.5 * host.figure(cw)


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
    med = np.median([[np.median(x) for x in g.measure(s)(k, pts, 3, "t")] for s in range(30)], axis=0)
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
    zero = {"gain_sd": {"socket": 0.0}, "knob_gain_sd": {"socket": 0.0}}
    lo = fit.replace(gain={"socket": 0.2}, knob_gain={"socket": 0.2}, **zero)
    hi = fit.replace(gain={"socket": 1.0}, knob_gain={"socket": 1.0}, **zero)
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
    ({"knob_gain": {"socket": -0.5}}, "generator.knob_gain.socket"),
    ({"knob_gain_sd": {"nvlink": float("inf")}}, "generator.knob_gain_sd.nvlink"),
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


@pytest.fixture(scope="module")
def grids():
    return G.grid_sources()


@pytest.mark.public_grids
def test_the_fits_grid_noise_is_the_grids_own(grids):
    """The committed fit carries the public grids' noise as numbers (the grids are not in the
    repository): they are what the grids' own repeated runs give now."""
    for s in grids:
        if s.noise is None:
            continue
        have = [n for n in G.FIT.noise[s.family] if n.source == s.noise.source]
        assert len(have) == 1, s.name
        assert have[0].shift_sd == pytest.approx(s.noise.shift_sd, abs=1e-4)
        assert np.allclose(have[0].resid_sds, s.noise.resid_sds, atol=1e-4)


@pytest.mark.public_grids
def test_every_grids_optimum_lies_within_the_generators_range_in_its_view(grids):
    for s in grids:
        m = s.figure(cw)
        lo, hi = np.percentile(generated(s.family, s.view), [2, 98])
        assert lo <= m <= hi, (s.name, m, lo, hi)
