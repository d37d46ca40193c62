"""Fit the job noise model (:class:`ncclrl.costmodel.noise.JobNoise`) on the recorded repeated jobs
and write the shipped constants, the figure and the table of docs/results/noise.md.

The data: every ``ncclrl validate`` job of the committed H200 stores (tags ``validate-base``:
NCCL's plain defaults, and ``validate-tuned:<table>``: one exported table; the ``validate-warmup``
job each command starts with is left out), read only. A *group* is the jobs of one tag, topology,
launch and collective that started within ``SPAN_S`` of the previous one (one device command's
validations, minutes apart): the same configuration in every job, so whatever differs between
them is noise. The fit is :func:`ncclrl.costmodel.noise.fit` (method of moments per group, pooled).
Written: ``conf/noise/job_noise.yaml`` (a fit per topology and launch, and ``pooled``),
``docs/results/noise/noise-model.png``, ``docs/results/noise/noise-model.csv``; printed: the table.

    PYTHONPATH=... python docs/results/scripts/noise_model.py
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pandas as pd
import yaml

from ncclrl.costmodel.noise import KNOTS_LOG2, fit
from ncclrl.envs.live import launch_of
from ncclrl.envs.store import job_ids, open_readonly

REPO = Path(__file__).resolve().parents[3]
STORES = ("data/h200x4-2026-11-21/store.sqlite", "data/h200x2-2026-11-22/store.sqlite")
SPAN_S = 600.0
BANDS = [(3, 9, "8 B-512 B"), (10, 15, "1-32 KiB"), (16, 20, "64 KiB-1 MiB"), (21, 25, "2-32 MiB"),
         (26, 30, "64 MiB-1 GiB")]


def validate_jobs(path: str) -> pd.DataFrame:
    """The store's validate jobs (base and tuned), one row per job median, with its group."""
    with open_readonly(REPO / path) as st:  # read only: the recorded file never changes
        df = st.frame(status="ok")
    df = df[(df.tag == "validate-base") | df.tag.str.startswith("validate-tuned:")].copy()
    df["job"] = job_ids(df)
    df["launch"] = df.timing.map(launch_of)
    out = []
    for key, g in df.groupby(["topology", "launch", "tag", "collective"]):
        start = g.groupby("job").ts.min().sort_values()
        chain, n, last = {}, 0, None
        for job, t in start.items():
            if last is not None and t - last > SPAN_S:
                n += 1
            chain[job], last = n, t
        out.append(g.assign(group=[(path, *key, chain[j]) for j in g.job], point=g.collective))
    return pd.concat(out, ignore_index=True)


def band_table(f, name: str) -> list[dict]:
    rows = []
    for lo, hi, label in BANDS:
        nb = 2.0 ** np.arange(lo, hi + 1)
        rows.append({"fit": name, "band": label, "resid_sd": float(np.sqrt(np.mean(f.noise.resid_sd(nb) ** 2))),
                     "sample_sd": float(np.sqrt(np.mean(f.noise.sample_sd(nb) ** 2)))})
    return rows


def entry(f, data: pd.DataFrame) -> dict:
    n = f.noise
    return {"shift_sd": round(n.shift_sd, 4), "knots_log2": list(n.knots_log2),
            "resid_sd": [round(v, 4) for v in n.resid_sds], "sample_sd": [round(v, 4) for v in n.sample_sds],
            "resid_df": round(n.resid_df, 2) if np.isfinite(n.resid_df) else float("inf"),
            "fit_samples": n.fit_samples,
            "data": {"stores": sorted({g[0] for g in data.group}), "groups": f.groups, "jobs": f.jobs,
                     "job_medians": f.rows, "df_shift": int(f.df_shift)}}


def model_checks(data: pd.DataFrame) -> None:
    """What the model leaves out, printed: the residual's asymmetry (quantiles of a job's point
    against the median of the group's other jobs, less the job's median deviation) and how far the
    job shift is shared across size bands (per band, the covariance of the jobs' mean deviations,
    less the residual's share, as sd and correlation)."""
    from ncclrl.costmodel.noise import log_median

    data = data.assign(y=[log_median(s) for s in data.samples_us])
    bands = [(0, 1 << 12), (1 << 13, 1 << 19), (1 << 20, 1 << 31)]
    loo, lag, cov, var, w = [], [], np.zeros((3, 3)), np.zeros(3), 0
    for _, g in data.groupby("group", sort=False):
        piv = g.drop_duplicates(["job", "point", "nbytes"]).pivot(index="job", columns=["point", "nbytes"],
                                                                    values="y").dropna(axis=1)
        y, nj = piv.to_numpy(), piv.shape[0]
        if nj < 2:
            continue
        if nj >= 3:
            for j in range(nj):
                d = y[j] - np.median(np.delete(y, j, 0), axis=0)
                loo.append(d - np.median(d))
        r = y - y.mean(0, keepdims=True) - y.mean(1, keepdims=True) + y.mean()
        lag.append(np.stack([r[:, :-1].ravel(), r[:, 1:].ravel()], 1))  # neighbouring sizes of one job
        yc = y - y.mean(0, keepdims=True)
        nb = piv.columns.get_level_values("nbytes").to_numpy()
        cols = [yc[:, (nb >= lo) & (nb <= hi)] for lo, hi in bands]
        m = np.stack([c.mean(1) for c in cols], 1)
        var += (nj - 1) * np.array([((c - c.mean(1, keepdims=True)) ** 2).sum() / ((nj - 1) * (c.shape[1] - 1))
                                    / c.shape[1] for c in cols])
        cov += m.T @ m
        w += nj - 1
    q = np.quantile(np.concatenate(loo), [0.001, 0.01, 0.05, 0.25, 0.75, 0.95, 0.99, 0.999])
    print("# residual quantiles 0.1%, 1%, 5%, 25%, 75%, 95%, 99%, 99.9%: " + ", ".join(f"{v:+.3f}" for v in q))
    pairs = pd.DataFrame(np.concatenate(lag), columns=["a", "b"])
    print(f"# residuals of neighbouring sizes of one job: correlation {pairs.a.corr(pairs.b):.2f} "
          f"(rank {pairs.a.corr(pairs.b, method='spearman'):.2f})")
    s = cov / w - np.diag(var / w)
    sd = np.sqrt(np.diag(s))
    r = s / np.outer(sd, sd)
    print(f"# job shift per band (<=4 KiB, 8 KiB-512 KiB, >=1 MiB): sd {', '.join(f'{v:.3f}' for v in sd)}; "
          f"correlation small-mid {r[0, 1]:.2f}, mid-large {r[1, 2]:.2f}, small-large {r[0, 2]:.2f}")


def main() -> None:
    data = pd.concat([validate_jobs(p) for p in STORES], ignore_index=True)
    fits, table = {}, []
    pooled = fit(data, KNOTS_LOG2, source="pooled")
    fits["pooled"] = (pooled, data)
    for (topo, launch), d in data.groupby(["topology", "launch"]):
        try:
            fits[f"{topo}/{launch}"] = (fit(d, KNOTS_LOG2, source=f"{topo}/{launch}"), d)
        except Exception as e:  # a source with no repeated group
            print(f"# {topo}/{launch}: {e}")
    for coll, d in data.groupby("collective"):  # per collective: reported, not shipped (see noise.md)
        fits[f"collective:{coll}"] = (fit(d, KNOTS_LOG2, source=coll), d)
    print("fit | groups | jobs | job medians | df(shift) | shift_sd | resid_df | resid_sd by band | sample_sd by band")
    for name, (f, _d) in fits.items():
        bt = band_table(f, name)
        table += bt
        print(f"{name} | {f.groups} | {f.jobs} | {f.rows} | {f.df_shift:.0f} | {f.noise.shift_sd:.3f} | "
              f"{f.noise.resid_df:.1f} | " + ", ".join(f"{r['resid_sd']:.3f}" for r in bt) + " | "
              + ", ".join(f"{r['sample_sd']:.3f}" for r in bt))
    out = {"about": "Job noise fitted on the recorded repeated validate jobs (A/A); regenerate with "
                    "python docs/results/scripts/noise_model.py (docs/results/noise.md)",
           "fits": {k: entry(f, d) for k, (f, d) in fits.items() if not k.startswith("collective:")}}
    (REPO / "conf" / "noise").mkdir(exist_ok=True)
    (REPO / "conf" / "noise" / "job_noise.yaml").write_text(yaml.safe_dump(out, sort_keys=False, width=120))
    pd.DataFrame(table).to_csv(REPO / "docs" / "results" / "noise" / "noise-model.csv", index=False,
                               float_format="%.4f")
    figure(fits, REPO / "docs" / "results" / "noise" / "noise-model.png")
    model_checks(data)


def figure(fits: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(12, 4.5))
    grid = 2.0 ** np.linspace(3, 30, 200)
    for i, (name, (f, _d)) in enumerate(k for k in fits.items() if not k[0].startswith("collective:")):
        c = f"C{i}"
        bs = f.resid_by_size
        a.scatter(bs.nbytes, bs.resid_sd, s=8 + bs.df / 10, color=c, alpha=0.6)
        a.plot(grid, f.noise.resid_sd(grid), color=c, lw=2.5 if name == "pooled" else 1.2,
               label=f"{name} ({f.jobs} jobs)")
        a.plot(grid, f.noise.sample_sd(grid), color=c, lw=0.8, ls=":")
    a.set(xscale="log", xlabel="message size (bytes)", ylabel="sd of log time",
          title="per-point residual of a job median (dots: per size, line: fit)\ndotted: samples within a job")
    a.set_xscale("log", base=2)
    a.legend(fontsize=7)
    f = fits["pooled"][0]
    s = f.job_shifts
    b.hist(s, bins=60, density=True, color="C0", alpha=0.6, label=f"{s.size} jobs' shift estimates")
    x = np.linspace(s.min(), s.max(), 200)
    sd = f.noise.shift_sd
    b.plot(x, np.exp(-0.5 * (x / sd) ** 2) / (sd * np.sqrt(2 * np.pi)), color="k",
           label=f"N(0, {sd:.3f}^2) (the fit)")
    b.set(xlabel="job shift (log time; estimate includes residual/points)", ylabel="density",
          title="job shift, pooled (every point of a job shares it)")
    b.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    sys.exit(main())
