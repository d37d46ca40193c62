"""The calibrated problem generator's fit and its held-out check (docs/results/generator.md).

    nice python docs/results/scripts/generator_fit.py                          # every figure, the fit, the check
    nice python docs/results/scripts/generator_fit.py --mechanism two-gains    # the others tried (MECHANISMS)
    nice python docs/results/scripts/generator_fit.py --stream 778             # another sample of problems

The public grids are read from NCCLRL_SHARED_DATA (or ../shared/data beside the checkout).

1. Every measured source (docs/explanation/generator.md): its sizes and knob settings, jobs per
   point, its optimum (calls-weighted under the common calls vectors: median and 5-95% over them;
   one call per size), what its best knob setting adds over per-call configurations alone, the size
   bands that carry the saving, its job noise.
2. The generator before calibration (gain 1: the simulator's truth as ``draw_full`` draws it), per family.
3. The fit: each source's own gains, each family's gains and their sds (:data:`MECHANISMS`; the
   default is the one written down before the fit, docs/explanation/generator.md).
4. The held-out check (leave one source out within its family) and checks B and C.
5. The calibrated generator (``draw_calibrated`` with the fit), per family, and the fit as Python.
"""

from __future__ import annotations

import argparse

import numpy as np

from ncclrl.agents import generator as G
from ncclrl.costmodel.platforms import FAMILIES

STREAM = 777  # the generated problems' seed stream
MECHANISMS = {
    "preregistered": "one gain for per-call configurations and knob settings; each source's own, the family's their "
                     "geometric mean, its sd the sd of their logs (written before the fit)",
    "two-gains": "a per-call gain and a knob gain; each source's own, the family's their median, sd of their logs "
                 "(tried after the first)",
    "matched": "one gain; its sd the sd of the logs of the sources' own gains; the family's gain the one at which "
               "the generator's median in the sources' views is the measured median (after the first two)",
}
FACTOR = 1.5  # checks B and C


def pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def rng5(v) -> str:
    lo, med, hi = np.percentile(v, [5, 50, 95])
    return f"{pct(med)} [{pct(lo)}, {pct(hi)}]"


def human(n: int) -> str:
    for unit, k in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << k:
            return f"{n / (1 << k):g} {unit}"
    return f"{n} B"


def source_figures(s: G.Source, vectors) -> dict:
    cw = lambda t: [t.optimum(G.calls_at(v, t.nbytes)) for v in vectors]  # noqa: E731
    plain = lambda t: [t.optimum(G.calls_at(v, t.nbytes), knobs=False) for v in vectors]  # noqa: E731
    pooled = [x for part in s.parts for t in part for x in cw(t)]
    add_eq = lambda t: t.optimum() - t.optimum(knobs=False)  # noqa: E731
    bands_eq = np.mean([t.band_shares() for part in s.parts for t in part], axis=0)
    bands_cw = np.mean([t.band_shares(G.calls_at(v, t.nbytes)) for part in s.parts for t in part for v in vectors],
                       axis=0)
    f = {"cw": s.figure(cw), "plain": s.figure(plain), "mean": s.figure(lambda t: t.mean_saving()),
         "cw_range": pooled, "eq": s.figure(lambda t: t.optimum()),
         "add_eq": s.figure(add_eq), "bands_eq": bands_eq, "bands_cw": bands_cw}
    f["add"] = f["cw"] - f["plain"]
    return f


def noise_cells(n) -> str:
    if n is None:
        return "none of its own | | | | "
    r = n.resid_sd(np.array([64 << 10, 1 << 20, 64 << 20]))
    return f"{n.shift_sd:.3f} | {r[0]:.3f} | {r[1]:.3f} | {r[2]:.3f} | {n.resid_df:.3g}"


def sample_figures(smp: G.Sample, gains, tied: bool = False) -> dict:
    bands_eq, bands_cw, add, add_eq, mean = [], [], [], [], []
    for t, w in zip(smp.scaled(*gains, tied=tied), smp.weights, strict=True):
        mean.append(t.mean_saving())
        bands_eq.append(t.band_shares())
        bands_cw.append(t.band_shares(w))
        add.append(t.optimum(w) - t.optimum(w, knobs=False))
        add_eq.append(t.optimum() - t.optimum(knobs=False))
    return {"cw": smp.optima(gains, tied=tied), "eq": smp.optima(gains, calls=False, tied=tied),
            "add": float(np.median(add)), "add_eq": float(np.median(add_eq)), "mean": float(np.median(mean)),
            "bands_eq": np.mean(bands_eq, axis=0), "bands_cw": np.mean(bands_cw, axis=0)}


def bands(v) -> str:
    return " / ".join(str(round(100 * x)) for x in v)


def one_gain(sample: G.Sample, s: G.Source, fig: dict) -> tuple[float, float]:
    """The first mechanism: one gain for per-call configurations and knob settings alike, at which the
    sample's median calls-weighted optimum in the source's view is the source's."""
    g = G._bisect(lambda x: float(np.median(sample.optima((x, 0.0, x, 0.0), view=s.view))), fig["cw"])
    return g, g


def family_one_gain(own) -> tuple[float, float, float, float]:
    """The first mechanism's family gain: the geometric mean of its sources' own gains, the sd of their logs."""
    logs = np.log([a for a, _ in own])
    g, sd = float(np.exp(logs.mean())), float(logs.std(ddof=1)) if len(logs) > 1 else 0.0
    return g, sd, g, sd


def family_matched(sample: G.Sample, srcs, own, figs) -> tuple[float, float, float, float]:
    """One gain per family, drawn with the sd of the logs of its sources' own gains, at which the
    median over its sources of the generator's median optimum in each source's view is the measured
    median of their optima (what check B compares)."""
    logs = np.log([own[s.name][0] for s in srcs])
    sd = float(logs.std(ddof=1)) if len(logs) > 1 else 0.0
    target = float(np.median([figs[s.name]["cw"] for s in srcs]))
    g = G._bisect(lambda x: float(np.median([np.median(sample.optima((x, sd, x, sd), view=s.view, tied=True))
                                             for s in srcs])), target)
    return g, sd, g, sd


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=400, help="generated problems per family")
    ap.add_argument("--mechanism", choices=MECHANISMS, default="preregistered", help="how the gains are fitted")
    ap.add_argument("--stream", type=int, default=STREAM, help="seed stream of the generated problems")
    args = ap.parse_args()
    tied = args.mechanism != "two-gains"
    vectors = G.common_calls()
    sources = G.recorded_sources() + G.grid_sources()
    figs = {s.name: source_figures(s, vectors) for s in sources}

    print(f"## 1. Measured sources ({len(vectors)} common calls vectors; sizes 64 B - 1 GiB)\n")
    print("| source | family | kind | sizes | knob settings | jobs per point | optimum, calls-weighted: median "
          "[5%, 95%] over vectors | under NCCL's default knobs, calls-weighted | optimum, one call per size | "
          "mean per-size saving | "
          "best knob setting adds (calls / one call) | saving by band <=64KiB / <=1MiB / <64MiB / >=64MiB, "
          "one call (calls) |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for s in sources:
        f, v = figs[s.name], s.view
        nk = max(t.best.shape[0] for part in s.parts for t in part)
        lo, hi = np.percentile(f["cw_range"], [5, 95])
        print(f"| {s.name} | {s.family} | {s.kind} | {human(v.lo)} - {human(v.hi)} | {nk} | "
              f"{', '.join(f'{d:g}' for d in s.depth)} | {pct(f['cw'])} [{pct(lo)}, {pct(hi)}] | {pct(f['plain'])} | "
              f"{pct(f['eq'])} | {pct(f['mean'])} | {pct(f['add'])} / {pct(f['add_eq'])} | "
              f"{bands(f['bands_eq'])} ({bands(f['bands_cw'])}) |")
    print("\nJob noise per source (sd of log): job shift; per-point residual at 64 KiB, 1 MiB, 64 MiB; the "
          "residual's t degrees of freedom\n")
    print("| source | where from | shift sd | resid 64 KiB | resid 1 MiB | resid 64 MiB | resid df |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for s in sources:
        print(f"| {s.name} | {s.noise_source or '-'} | {noise_cells(s.noise)} |")

    samples = {f: G.Sample.draw(f, args.n, args.stream, G.FIT, vectors) for f in FAMILIES}
    by_fam = {f: [s for s in sources if s.family == f] for f in FAMILIES}

    print(f"\n## 2. The generator before calibration (gains 1; {args.n} problems per family, every size and "
          "knob setting, the common calls vectors)\n")
    print("| family | optimum, calls-weighted: median [5%, 95%] | one call per size | mean per-size saving | best knob "
          "setting adds (calls / one call) | saving by band, one call (calls) | measured: median of its sources' "
          "calls-weighted |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for f in FAMILIES:
        g = sample_figures(samples[f], (1.0, 0.0, 1.0, 0.0))
        meas = np.median([figs[s.name]["cw"] for s in by_fam[f]])
        print(f"| {f} | {rng5(g['cw'])} | {pct(np.median(g['eq']))} | {pct(g['mean'])} | {pct(g['add'])} / "
              f"{pct(g['add_eq'])} | {bands(g['bands_eq'])} ({bands(g['bands_cw'])}) | {pct(meas)} |")

    print(f"\n## 3. The fit ({MECHANISMS[args.mechanism]}): each source's own gains in its view, each family's\n")
    if tied:
        own = {s.name: one_gain(samples[s.family], s, figs[s.name]) for s in sources}
    else:
        own = {s.name: G.fit_source(samples[s.family], s.view, figs[s.name]["cw"], figs[s.name]["plain"])
               for s in sources}

    def fam_fit(srcs):
        if args.mechanism == "matched":
            return family_matched(samples[srcs[0].family], srcs, own, figs)
        return (family_one_gain if tied else G.family_gains)([own[s.name] for s in srcs])

    print("| family | source | view | its optimum | under NCCL's default knobs | its own gain | its own knob gain |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    fitted = {}
    for f in FAMILIES:
        for s in by_fam[f]:
            v, (a, b) = s.view, own[s.name]
            print(f"| {f} | {s.name} | {human(v.lo)} - {human(v.hi)}, "
                  f"{'knob settings' if v.knobs else 'NCCL default knobs'} | {pct(figs[s.name]['cw'])} | "
                  f"{pct(figs[s.name]['plain'])} | {a:.3f} | {'-' if b is None else f'{b:.3f}'} |")
        fitted[f] = fam_fit(by_fam[f])
    print("\n| family | gain | gain sd (log) | knob gain | knob gain sd (log) | sources |")
    print("| --- | --- | --- | --- | --- | --- |")
    for f in FAMILIES:
        print(f"| {f} | {fitted[f][0]:.3f} | {fitted[f][1]:.3f} | {fitted[f][2]:.3f} | {fitted[f][3]:.3f} | "
              f"{len(by_fam[f])} |")

    print("\n## 4. The checks (docs/explanation/generator.md)\n")
    print("A. Leave one source out within its family: the gains refitted on the family's other sources; "
          "the held-out source's optimum against the refitted generator's 5-95% range in its view\n")
    print("| family | held out | refitted gain, sd; knob gain, sd | its optimum | generator in its view: median "
          "[5%, 95%] | in range |")
    print("| --- | --- | --- | --- | --- | --- |")
    ok_a = True
    for f in FAMILIES:
        if len(by_fam[f]) < 2:
            print(f"| {f} | (one source: no held-out check) | | | | |")
            continue
        for s in by_fam[f]:
            gains = fam_fit([o for o in by_fam[f] if o is not s])
            o = samples[f].optima(gains, view=s.view, tied=tied)
            lo, hi = np.percentile(o, [5, 95])
            inside = bool(lo <= figs[s.name]["cw"] <= hi)
            ok_a &= inside
            print(f"| {f} | {s.name} | {gains[0]:.3f}, {gains[1]:.3f}; {gains[2]:.3f}, {gains[3]:.3f} | "
                  f"{pct(figs[s.name]['cw'])} | {rng5(o)} | {'yes' if inside else 'NO'} |")
    print(f"\nA: {'passed' if ok_a else 'FAILED'}\n")
    print("B and C. The fit on every source: per family, the median over its sources of the generator's median in "
          f"each source's view against the measured median (within a factor {FACTOR})\n")
    print("| family | check | measured median | generator median | ratio | within |")
    print("| --- | --- | --- | --- | --- | --- |")
    ok_bc = True
    for f in FAMILIES:
        for check, calls, key in (("B calls-weighted", True, "cw"), ("C one call per size", False, "eq")):
            meas = float(np.median([figs[s.name][key] for s in by_fam[f]]))
            gen = float(np.median([np.median(samples[f].optima(fitted[f], calls, s.view, tied)) for s in by_fam[f]]))
            r = gen / meas if meas > 0 else float("inf")
            inside = 1 / FACTOR <= r <= FACTOR
            ok_bc &= inside
            print(f"| {f} | {check} | {pct(meas)} | {pct(gen)} | {r:.2f} | {'yes' if inside else 'NO'} |")
    print(f"\nB and C: {'passed' if ok_bc else 'FAILED'}")
    print(f"\nThe fit {'PASSED' if ok_a and ok_bc else 'FAILED'} its acceptance check.\n")

    noise = {f: tuple(s.noise for s in by_fam[f] if s.noise is not None) for f in FAMILIES}
    print(f"## 5. The calibrated generator ({args.n} problems per family, every size and knob setting)\n")
    print("| family | optimum, its own calls (draw_calibrated): median [5%, 95%] | optimum, common calls vectors | "
          "one call per size | mean per-size saving | best knob setting adds (common calls / one call) | saving by "
          "band, one call (calls) |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    fit = G.GenFit(gain={f: fitted[f][0] for f in FAMILIES}, gain_sd={f: fitted[f][1] for f in FAMILIES},
                   knob_gain={f: fitted[f][2] for f in FAMILIES}, knob_gain_sd={f: fitted[f][3] for f in FAMILIES},
                   misspecified=dict(G.FIT.misspecified), strength=dict(G.FIT.strength), noise=noise,
                   source="generator_fit.py", tied=tied)
    for f in FAMILIES:
        drawn = rng5([G.draw_calibrated(np.random.default_rng([args.stream + 1, i]), fit, [f]).optimum()
                      for i in range(args.n)])
        g = sample_figures(samples[f], fitted[f], tied)
        print(f"| {f} | {drawn} | {rng5(g['cw'])} | {pct(np.median(g['eq']))} | {pct(g['mean'])} | "
              f"{pct(g['add'])} / {pct(g['add_eq'])} | {bands(g['bands_eq'])} ({bands(g['bands_cw'])}) |")

    same = all(abs(fitted[f][0] - G.FIT.gain[f]) < 5e-4 and abs(fitted[f][1] - G.FIT.gain_sd[f]) < 5e-4
               and abs(fitted[f][2] - G.FIT.knob_gain[f]) < 5e-4 for f in FAMILIES) and tied == G.FIT.tied
    print(f"\n## The fit as Python (agents/generator.py FIT; the committed FIT is this fit: "
          f"{'yes' if same else 'no'})\n")
    for i, name in enumerate(("gain", "gain_sd", "knob_gain", "knob_gain_sd")):
        print(f"{name}={ {f: round(fitted[f][i], 3) for f in FAMILIES} },")
    for f in FAMILIES:
        for s, n in zip([s for s in by_fam[f] if s.noise is not None], noise[f], strict=True):
            print(f"noise {f} {s.name}: _noise({n.shift_sd:.4f}, {tuple(round(x, 4) for x in n.resid_sds)}, "
                  f"{tuple(round(x, 4) for x in n.sample_sds)}, {n.resid_df:.3g}, {n.fit_samples}, {n.source!r})")


if __name__ == "__main__":
    main()
