"""A/A calibration of ``ncclrl validate``'s verdicts on recorded H200 jobs (no GPU needed).

NCCL's plain defaults were measured in many jobs of the committed store (``validate-base``, two
per validation, about 30 s apart). Four such jobs of one topology, close in time, make an A/A
validation with two rounds: jobs 1 and 3 play "base", 2 and 4 "tuned" (the order validate runs
them in). The same configuration on both sides, so every verdict other than "same" is false.
Printed: per rule, the share of sizes judged "faster" or "slower".

    python docs/results/noise/aa_calibration.py [data/h200x4-2026-11-21/store.sqlite]
"""

from __future__ import annotations

import sys

import pandas as pd

from ncclrl.costmodel.noise import compare, judge
from ncclrl.costmodel.space import Point
from ncclrl.costmodel.topology import load_topology
from ncclrl.envs.store import Store, job_ids


def base_jobs(store: Store) -> pd.DataFrame:
    df = store.frame(tag="validate-base", status="ok")
    df["job"] = job_ids(df)
    return df


def quadruples(df: pd.DataFrame, span_s: float = 1200.0):
    """Per topology and collective, every run of 4 consecutive base jobs within ``span_s``."""
    for (topo, coll), g in df.groupby(["topology", "collective"]):
        jobs = g.groupby("job").ts.min().sort_values()
        ids, ts = list(jobs.index), list(jobs.values)
        for i in range(len(ids) - 3):
            if ts[i + 3] - ts[i] <= span_s:
                yield topo, coll, [g[g.job == j] for j in ids[i:i + 4]]


def old_verdict(a: list[float], b: list[float]) -> str:
    """The within-job verdict: the two sides' 95% intervals apart (``compare`` without a between-job
    estimate)."""
    return compare([a], [b], 0.0, 0).verdict


def main(path: str, every: int = 1) -> pd.DataFrame:
    """Judge the A/A validations of the store at ``path`` (``every``: only every n-th of them)."""
    df = base_jobs(Store(path, readonly=True))
    rows = []
    for q, (topo, coll, js) in enumerate(quadruples(df, 3600.0)):
        if q % every:
            continue
        sizes = sorted(set.intersection(*(set(j.nbytes) for j in js)))
        pts = [Point(coll, s) for s in sizes]
        firsts = (j.drop_duplicates("nbytes", keep="first") for j in js)  # a job's first row per size
        by = [{s: list(x) for s, x in zip(j.nbytes, j.samples_us, strict=True)} for j in firsts]
        base = [[by[0][s], by[2][s]] for s in sizes]
        tuned = [[by[1][s], by[3][s]] for s in sizes]
        rep = judge(load_topology(topo), pts, base, tuned)
        for k, s in enumerate(sizes):
            rows.append({"topology": topo, "collective": coll, "nbytes": s, "quad": js[0].ts.min(),
                         "pooled_samples": old_verdict(base[k][0] + base[k][1], tuned[k][0] + tuned[k][1]),
                         "one_job_each": old_verdict(base[k][0], tuned[k][0]),
                         "between_job": rep.verdict.iloc[k]})
    out = pd.DataFrame(rows)
    print(f"# {out.quad.nunique()} A/A validations (2 rounds), {len(out)} sizes")
    for rule in ("one_job_each", "pooled_samples", "between_job"):
        bad = out[rule] != "same"
        print(f"{rule:>15}: {bad.mean():6.1%} of sizes judged different "
              f"({(out[rule] == 'faster').sum()} faster, {(out[rule] == 'slower').sum()} slower)")
    nr = no_row_sizes(path)
    bad = nr.verdict != "same"
    print(f"# sizes without a row in the 1x4 tables (no nccl.conf): the same configuration on both sides of "
          f"a real validation: {len(nr)} sizes, {bad.mean():.1%} judged different ({(nr.verdict == 'faster').sum()} "
          f"faster, {(nr.verdict == 'slower').sum()} slower)")
    return out


NO_CONF_TABLES = ["data/h200x4-2026-11-21/run3/finetuned/h200-1x4/nccl_tuner.csv",
                  "data/h200x4-2026-11-21/run4/finetuned/h200-1x4/nccl_tuner.csv"]


def no_row_sizes(path: str) -> pd.DataFrame:
    """Real validations of tables without an nccl.conf: at sizes without a row, both sides run NCCL's
    own choice (the plugin defers), so these are A/A comparisons too."""
    import hashlib
    from pathlib import Path

    from ncclrl.costmodel import nccl as N
    from ncclrl.costmodel.space import size_grid
    from ncclrl.runners.validate import stored_jobs

    topo = load_topology("h200-1x4")
    out = []
    for t in NO_CONF_TABLES:
        rows = [ln.split(",") for ln in Path(t).read_text().splitlines() if ln and not ln.startswith("#")]
        digest = hashlib.sha256(Path(t).read_bytes()).hexdigest()[:12]
        colls = sorted({r[0] for r in rows})
        pts = [Point(c, s) for c in colls for s in size_grid(8, 256 << 20, topo.nranks, N.COLLECTIVES.index(c))]
        base, tuned = stored_jobs(Store(path, readonly=True), topo.name, digest, pts, "torch")
        rep = judge(topo, pts, base, tuned)
        for r in rep.itertuples():
            if not any(x[0] == r.collective and int(x[1]) <= r.nbytes <= int(x[2]) for x in rows):
                out.append({"table": t, "collective": r.collective, "nbytes": r.nbytes, "verdict": r.verdict,
                            "speedup": r.speedup})
    return pd.DataFrame(out)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "data/h200x4-2026-11-21/store.sqlite")
