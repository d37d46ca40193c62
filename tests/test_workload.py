"""Interference with concurrent compute in the simulator, and the workload objective: no load is
today's time exactly, channels cost compute, compute costs NCCL, the objective is the hand sum of
its calls, the aware choice never costs more than the isolated one where it was chosen."""

from __future__ import annotations

import numpy as np
import pytest

from ncclrl.costmodel import nccl as N
from ncclrl.costmodel import simulator as S
from ncclrl.costmodel.errors import ConfigError
from ncclrl.costmodel.platforms import draw_platform
from ncclrl.costmodel.profile import Entry, Profile, dump_profile
from ncclrl.costmodel.replica import eligible_mask
from ncclrl.costmodel.simulator import INTERFERENCE_PARAMS, RANDOMIZATION, Configs, SimParams, Simulator
from ncclrl.costmodel.table import Row, Table
from ncclrl.costmodel.workload import (
    NCCL_DEFAULT,
    Choice,
    Target,
    WorkCall,
    Workload,
    _configs,
    candidates,
    choose,
    compare,
    draws,
    load_workload,
    rescale,
    resolve_compute,
    step_cost,
    step_costs,
    table_choices,
)

PRESETS = ["h200-1x4", "dgx-h100-2n", "h200-2x2-sock", "a100-16x4-ib"]


def random_configs(sim: Simulator, n: int, seed: int = 0) -> Configs:
    rng = np.random.default_rng(seed)
    coll = rng.integers(0, 5, n)
    ok = [(int(c), a, p) for c in range(5) for a in range(N.NUM_ALGOS) for p in range(N.NUM_PROTOS)
          if eligible_mask(sim.topo)[c, a, p]]
    pick = [ok[i] for i in rng.integers(0, len(ok), n)]
    coll = np.array([c for c, _, _ in pick])
    algo = np.array([a for _, a, _ in pick])
    proto = np.array([p for _, _, p in pick])
    nbytes = (2 ** rng.integers(0, 31, n)) * sim.topo.nranks
    ch = rng.choice([0, 1, 2, 4, 8, 16], n)
    return Configs.make(coll, nbytes, algo, proto, ch)


@pytest.mark.parametrize("preset", PRESETS)
def test_no_load_is_todays_time_exactly(preset):
    sim = Simulator(preset)
    cfg = random_configs(sim, 400)
    today = sim.time_us(cfg)
    assert np.array_equal(sim.time_us(cfg, load=0.0), today)
    assert np.array_equal(sim.time_us(cfg, load=np.zeros(len(cfg))), today)
    inter = sim.interference(cfg, 0.0, 0.3)
    assert np.array_equal(inter.cost_us, today) and np.array_equal(inter.nccl_us, today)
    # entries without compute keep their isolated time exactly even when others carry load
    some = np.where(np.arange(len(cfg)) % 2 == 0, 50.0, 0.0)
    mixed = sim.interference(cfg, some, 0.3)
    assert np.array_equal(mixed.cost_us[1::2], today[1::2])


def test_more_channels_slow_compute_more():
    sim = Simulator("h200-1x4")
    ch = np.array([1, 2, 4, 8, 16, 24])
    cfg = Configs.make(N.ALLREDUCE, 256 << 20, N.RING, N.SIMPLE, ch)
    assert np.array_equal(sim.channels_used(cfg), ch)
    # SM-bound compute: exactly the SMs the channels hold (H200: 132 SMs, one per channel)
    rate = sim.compute_rate(cfg, 1000.0, mem_frac=0.0)
    assert sim.params.gpu_sms == 132
    assert np.allclose(rate, 1.0 - ch / 132.0)
    assert np.all(np.diff(rate) < 0)
    # memory-bound share: the same bytes moved faster take more of the HBM bandwidth
    t = sim.time_us(cfg)
    mem = sim.compute_rate(cfg, t, mem_frac=1.0)
    assert np.all(np.diff(mem) < 0) and np.all(mem < 1.0)
    # LL moves flags with the data: more HBM traffic than Simple for the same call and time
    ll = Configs.make(N.ALLREDUCE, 1 << 20, N.RING, [N.LL, N.SIMPLE], 4)
    r = sim.compute_rate(ll, 50.0, mem_frac=1.0)
    assert r[0] < r[1]
    # the overlapped cost of a well-hidden call grows with its channels (large, bandwidth-bound)
    hidden = sim.interference(Configs.make(N.ALLREDUCE, 64 << 20, N.RING, N.SIMPLE, np.array([8, 24])), 1e5, 0.0)
    assert hidden.cost_us[1] > hidden.cost_us[0]


@pytest.mark.parametrize("preset", PRESETS)
def test_load_slows_nccl(preset):
    sim = Simulator(preset)
    cfg = random_configs(sim, 200, seed=1)
    t0 = sim.time_us(cfg)
    t_half = sim.time_us(cfg, load=0.5)
    t_full = sim.time_us(cfg, load=1.0)
    assert np.all(t_half >= t0) and np.all(t_full >= t_half) and np.all(t_full > t0)
    # bandwidth-bound calls lose close to load_bw_loss of their speed
    big = Configs.make(N.ALLREDUCE, 1 << 30, N.RING, N.SIMPLE, 0)
    ratio = float(sim.time_us(big, load=1.0)[0] / sim.time_us(big)[0])
    assert 1.0 / (1.0 - sim.params.load_bw_loss) * 0.9 < ratio < 1.0 / (1.0 - sim.params.load_bw_loss) * 1.2


def test_randomized_interference_params_stay_within_bounds_and_leave_other_draws_alone(monkeypatch):
    base = SimParams.from_topology(Simulator("dgx-h100-2n").topo)
    rng = np.random.default_rng(0)
    seen = set()
    for _ in range(30):
        p = base.randomized(rng)
        for key in INTERFERENCE_PARAMS:
            lo, hi = RANDOMIZATION[key]
            ratio = np.asarray(getattr(p, key)) / np.asarray(getattr(base, key))
            assert np.all(ratio >= lo - 1e-9) and np.all(ratio <= hi + 1e-9), key
        assert 0 < p.load_bw_loss <= 0.9 and 0 < p.sms_per_channel <= 1.0 and p.gpu_sms == 132
        seen.add(round(p.load_bw_loss, 6))
    assert len(seen) > 20  # drawn, not fixed
    # every other parameter, and what the generator gives next, as without the interference parameters
    r1 = np.random.default_rng(7)
    with_new = base.randomized(r1)
    after_new = r1.random()
    monkeypatch.setattr(S, "RANDOMIZATION", {k: v for k, v in RANDOMIZATION.items() if k not in INTERFERENCE_PARAMS})
    r2 = np.random.default_rng(7)
    without = base.randomized(r2)
    assert r2.random() == after_new
    a, b = with_new.to_dict(), without.to_dict()
    assert {k: v for k, v in a.items() if k not in INTERFERENCE_PARAMS} == \
        {k: v for k, v in b.items() if k not in INTERFERENCE_PARAMS}


def tiny_profile(tmp_path):
    prof = Profile([
        Entry("allreduce", 8 << 20, 1, 4, "bfloat16", 3, 3 * (8 << 20), "yes"),
        Entry("allgather", 1 << 16, 1, 4, "bfloat16", 2, 2 << 16, "no"),
        Entry("alltoall", 1 << 16, 1, 4, "bfloat16", 1, 1 << 16, "yes"),
    ], steps=3, steps_from="given")
    path = tmp_path / "job.yaml"
    dump_profile(prof, path)
    yes = "  overlaps_compute: 'yes'\n"
    text = path.read_text().replace(yes, yes + "  compute_us_per_call: 150\n", 1)
    path.write_text(text)
    return path


def test_objective_is_the_hand_sum_of_a_tiny_profile(tmp_path):
    w = load_workload(tiny_profile(tmp_path), mem_frac=0.25)
    assert [(c.collective, c.overlap, c.compute_us_per_call, c.mem_frac) for c in w.calls] == \
        [("allreduce", 1.0, 150.0, 0.25), ("allgather", 0.0, 0.0, 0.25)]
    assert any("alltoall" in n for n in w.notes)
    sim = Simulator("h200-1x4")
    ar = Configs.make(N.ALLREDUCE, 8 << 20, N.RING, N.SIMPLE, 8)
    ag = Configs.make(N.ALLGATHER, 1 << 16, N.RING, N.LL, 2)
    choices = {("allreduce", 1, 4, 8 << 20): Choice("ring", "simple", 8),
               ("allgather", 1, 4, 1 << 16): Choice("ring", "ll", 2)}
    # by hand: 3 overlapped AllReduces under 150 us of compute, 2 isolated AllGathers
    t = float(sim.time_us(ar)[0])
    load = min(1.0, 150.0 / t)
    t_load = float(sim.time_us(ar, load=load)[0])
    rate = 1.0 / (0.75 / (1 - 8 / 132) + 0.25 / (1 - sim.params.hbm_bytes_per_bus_byte[N.SIMPLE]
                                                  * (8 << 20) * 1.5 / (1000 * t_load) / sim.params.hbm_gbps))
    hand_ar = 3 * max(t_load - 150.0, t_load * (1 - rate))
    hand_ag = 2 * float(sim.time_us(ag)[0])
    costs = step_costs(sim, w, choices)
    assert costs[("allreduce", 1, 4, 8 << 20)] == pytest.approx(hand_ar, rel=1e-9)
    assert costs[("allgather", 1, 4, 1 << 16)] == pytest.approx(hand_ag, rel=1e-12)
    assert step_cost(sim, w, choices) == pytest.approx(hand_ar + hand_ag, rel=1e-9)
    # without interference: calls x isolated time
    assert step_cost(sim, w, choices, interference=False) == pytest.approx(3 * t + hand_ag, rel=1e-12)
    # a table gives the same choices through its rows
    table = Table(sim.topo, [Row("allreduce", 0, 1 << 30, "ring", "simple", 8, nnodes=1, nranks=4),
                             Row("allgather", 0, 1 << 30, "ring", "ll", 2)])
    assert table_choices(table, w) == choices
    assert step_cost(sim, w, table) == step_cost(sim, w, choices)


@pytest.mark.parametrize("preset", PRESETS)
def test_aware_choice_never_costs_more_than_isolated_where_chosen(preset):
    sim = Simulator(preset)
    topo = sim.topo
    calls = []
    for i, nb in enumerate([1 << 12, 1 << 16, 1 << 20, 8 << 20, 64 << 20]):
        for coll in ("allreduce", "allgather", "reducescatter"):
            q = topo.nranks * 2
            calls.append(WorkCall(coll, -(-nb // q) * q, topo.nodes, topo.nranks, 1 + i % 3,
                                  overlap=1.0 if i % 2 else 0.5, mem_frac=0.3, dtype="bfloat16"))
    w = resolve_compute(Workload(calls, "mix"), sim, ratio=1.5)
    assert all(c.compute_us_per_call > 0 for c in w.calls)
    rules = ({}, {"headroom": 0.5}, {"dominance": True}, {"headroom": 1.0, "dominance": True})
    for where in (sim, draw_platform(preset, np.random.default_rng(5), True)):
        for margin in (0.0, 0.01):
            for rule in rules:
                picks = choose(where, w, margin=margin, **rule)
                for key in picks.aware:
                    assert picks.aware_cost[key] <= picks.isolated_cost[key] * (1 + 1e-12)
                aware, iso = step_cost(where, w, picks.aware), step_cost(where, w, picks.isolated)
                assert aware <= iso * (1 + 1e-12)
                if not rule.get("headroom"):  # and never more than NCCL's default (headroom may pay for safety)
                    assert aware <= step_cost(where, w, {}) * (1 + 1e-12)
    # with no compute at all the two objectives agree: the same choices
    flat = Workload([WorkCall(c.collective, c.nbytes, c.nodes, c.ranks, c.calls_per_step) for c in calls])
    picks = choose(sim, flat)
    assert picks.aware == picks.isolated


def test_choices_differ_where_channels_cost_compute_and_judging_has_intervals():
    sim = Simulator("h200-1x4")
    w = Workload([WorkCall("allreduce", 32 << 20, 1, 4, 4, overlap=1.0, compute_us_per_call=2000.0)])
    picks = choose(sim, w)
    key = w.calls[0].key
    assert picks.aware[key] != picks.isolated[key]
    used = sim.channels_used
    ch = [used(Configs.make(N.ALLREDUCE, 32 << 20, N.RING if c.algo == "default" else N.ALGOS.index(c.algo),
                            N.SIMPLE if c.proto == "default" else N.PROTOS.index(c.proto), c.channels))[0]
          for c in (picks.isolated[key], picks.aware[key])]
    assert ch[1] < ch[0]  # fewer channels when the compute pays for them
    cmp = compare(draws("h200-1x4", range(5), True), w, {"iso": picks.isolated, "aware": picks.aware,
                                                         "nccl": {}})
    m, lo, hi = cmp.saving("iso", "aware")
    assert lo <= m <= hi and len(cmp.costs["aware"]) == 5
    assert cmp.verdict("iso", "iso") == "tie"


def test_headroom_keeps_the_aware_choice_hidden_under_slower_communication():
    sim = Simulator("h200-1x4")
    comp, nbytes, h = 1000.0, 32 << 20, 1.0
    w = Workload([WorkCall("allreduce", nbytes, 1, 4, 4, overlap=1.0, compute_us_per_call=comp, mem_frac=0.3)])
    key = w.calls[0].key
    cands = candidates(sim.topo, "allreduce")
    cfg = _configs(sim, N.ALLREDUCE, np.full(len(cands), nbytes), cands)
    t = sim.time_us(cfg)
    plain = sim.interference(cfg, comp, 0.3).nccl_us
    stressed = sim.interference(cfg, comp, 0.3, t_iso_us=t * (1 + h)).nccl_us
    hidden_plain = {c: x <= comp for c, x in zip(cands, plain, strict=True)}
    hidden_stressed = {c: x <= comp for c, x in zip(cands, stressed, strict=True)}
    base = choose(sim, w)
    safe = choose(sim, w, headroom=h)
    # without headroom the choice is hidden, but only just: exposed were the call 2x slower
    assert hidden_plain[base.aware[key]] and not hidden_stressed[base.aware[key]]
    # with it, a candidate hidden under the slower times exists, and the choice is one of them
    assert any(hidden_stressed.values())
    assert hidden_stressed[safe.aware[key]]
    assert safe.aware[key] != base.aware[key] and safe.isolated == base.isolated
    # it still costs no more than the isolated choice; its plain cost is at least the plain best's
    assert base.aware_cost[key] <= safe.aware_cost[key] <= safe.isolated_cost[key]
    # headroom 0 is the plain rule
    assert choose(sim, w, headroom=0.0).aware == base.aware


class _ForcedSlower(Target):
    """A platform on which every forced channel count runs ``factor`` times slower than simulated
    (NCCL's own count unchanged)."""

    def __init__(self, where, factor: float) -> None:
        super().__init__(where)
        self.factor = factor

    def iso_us(self, sim, cfg):
        t = super().iso_us(sim, cfg)
        return np.where(cfg.channels > 0, t * self.factor, t)


def test_dominance_keeps_the_isolated_choice_where_aware_costs_more_on_one_platform():
    sim = Simulator("h200-1x4")
    w = Workload([WorkCall("allreduce", 32 << 20, 1, 4, 4, overlap=1.0, compute_us_per_call=1000.0)])
    key = w.calls[0].key
    plats = [Target(sim)] * 5 + [_ForcedSlower(sim, 2.0)]
    mean = choose(plats, w)
    dom = choose(plats, w, dominance=True)
    assert mean.isolated == dom.isolated
    # the mean over the platforms picks a forced count that costs more than the isolated choice on
    # the slow platform ...
    assert step_costs(plats[-1], w, mean.aware)[key] > step_costs(plats[-1], w, mean.isolated)[key]
    assert mean.aware_cost[key] < mean.isolated_cost[key]
    # ... dominance does not: on every platform no more than the isolated choice
    for p in plats:
        assert step_costs(p, w, dom.aware)[key] <= step_costs(p, w, dom.isolated)[key] * (1 + 1e-12)
    assert dom.aware[key] != mean.aware[key]
    # on one platform dominance is the plain rule
    assert choose(sim, w, dominance=True).aware == choose(sim, w).aware


def test_aggregate_quantile_and_bad_rule_options():
    w = Workload([WorkCall("allreduce", 32 << 20, 1, 4, 4, overlap=1.0, compute_us_per_call=1000.0)])
    plats = draws("h200-1x4", range(4), True, stream=9)
    top = choose(plats, w, aggregate=1.0)
    worst = choose(plats, w, aggregate="max")
    assert (top.isolated, top.aware) == (worst.isolated, worst.aware)
    assert top.aware_cost == pytest.approx(worst.aware_cost)
    # a quantile: the cost reported is that quantile of the pick's costs on the platforms
    key = w.calls[0].key
    for q in (0.5, 0.9):
        mid = choose(plats, w, aggregate=q)
        for pick, cost in ((mid.aware, mid.aware_cost), (mid.isolated, mid.isolated_cost)):
            per = [step_costs(p, w, pick)[key] for p in plats]
            assert cost[key] == pytest.approx(float(np.quantile(per, q)), rel=1e-9)
    for bad in ({"aggregate": "median"}, {"aggregate": 0.0}, {"aggregate": 1.5}, {"aggregate": True},
                {"headroom": -0.1}, {"headroom": float("nan")}):
        with pytest.raises(ConfigError):
            choose(plats, w, **bad)


def test_rescale_and_bad_input(tmp_path):
    w = load_workload(tiny_profile(tmp_path))
    r = rescale(w, 2, 16, 3.0)
    assert {(c.nodes, c.ranks) for c in r.calls} == {(2, 16)}
    ag = next(c for c in r.calls if c.collective == "allgather")
    assert ag.nbytes % (16 * 2) == 0 and ag.nbytes >= 3 * (1 << 16)
    with pytest.raises(ConfigError, match="compute"):
        load_workload(tiny_profile(tmp_path), compute_us_per_call=1.0, compute_ratio=1.0)
    with pytest.raises(ConfigError, match="mem_frac"):
        load_workload(tiny_profile(tmp_path), mem_frac=2.0)
    bad = tmp_path / "bad.yaml"
    bad.write_text("kind: something-else\n")
    with pytest.raises(ConfigError, match="not an ncclrl job profile"):
        load_workload(bad)
    assert Choice() == NCCL_DEFAULT and str(NCCL_DEFAULT) == "nccl"
