"""``ncclrl validate``: measure an exported table afresh, through the tuner plugin, against NCCL's
defaults, and say per size whether it is faster, the same or slower.

    ncclrl validate table=nccl_tuner.csv conf=nccl.conf topology=h200-2x2-sock collectives=allreduce

Jobs alternate between NCCL's defaults (no table, no knobs) and the tuned setting (the table
loaded by our plugin, the ``nccl.conf`` knobs as the process environment), ``rounds`` times each
in the order base, tuned, tuned, base, ... so both see the same machine drift and neither side
always runs second; a warm-up job of NCCL's defaults comes first (tag ``validate-warmup``, not
judged: on the H200s the first job of a command ran 15-25% apart from the rest); no training
measurement is reused. Every sample goes to the
store (tags ``validate-base`` and ``validate-tuned:<table sha256>``, one job id per job).

The two sides always run in different jobs, and jobs differ more than samples within a job do
(:mod:`ncclrl.costmodel.noise`), so the unit of comparison is the job: per point, each side's job medians,
the speedup as the ratio of their geometric means, and its 95% interval from the between-job
spread that the repeated jobs of both sides show (pooled over neighbouring sizes). The verdict is
``faster`` (the interval lies above 1), ``slower`` (below 1) or ``same``. With ``rounds=1`` there
is no between-job spread to estimate and the verdict falls back to within-job intervals, which
judge NCCL's defaults against themselves "different" at about half the sizes on the H200s: use
``rounds`` >= 2 (3-4 for small sizes). ``measure=false`` judges the jobs of an earlier validation of
the same table from the store, without a GPU.
"""

from __future__ import annotations

import hashlib
import logging
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

from omegaconf import DictConfig

from ncclrl.costmodel import nccl as N
from ncclrl.costmodel.errors import ConfigError
from ncclrl.costmodel.noise import geomean, judge
from ncclrl.costmodel.space import Point, size_grid
from ncclrl.costmodel.table import read_conf
from ncclrl.costmodel.topology import load_topology
from ncclrl.costmodel.units import parse_bytes
from ncclrl.envs.live import launch_of
from ncclrl.envs.measure import measure_whole
from ncclrl.envs.store import Store, job_ids
from ncclrl.runners.config import Command, parse, register
from ncclrl.runners.progress import progress
from ncclrl.runners.sweep import LiveConfig, live_workers

log = logging.getLogger(__name__)

@dataclass
class ValidateConfig(LiveConfig):
    """Measure an exported table afresh through the tuner plugin against NCCL's defaults, in jobs
    alternating base, tuned, tuned, base, ..., and judge each size faster, same or slower from the
    between-job spread (``rounds`` >= 3 for small sizes).

    :param table: the table to validate (nccl_tuner.csv)
    :param conf: its nccl.conf (per-process knobs; empty: none)
    :param rounds: jobs per side
    :param out: write the per-size report to this CSV (and its S-curves next to it, .png)
    :param measure: true: measure afresh; false: judge an earlier validation of this table from the store (no GPU)
    :param warmup: a first job of NCCL's defaults, stored but not judged (the first job of a command runs apart)
    """

    table: str = ""
    conf: str = ""
    topology: str = ""
    rounds: int = 2
    samples: int = 5
    timing: str = "eager"
    store: str = "runs/validate.sqlite"
    out: str = ""
    measure: bool = True
    warmup: bool = True

    def check(self) -> None:
        for k in ("table", "topology"):
            if not getattr(self, k):
                raise ConfigError(k, "required (ncclrl validate TABLE topology=PRESET [conf=nccl.conf])")
        for k in ("table", "conf"):
            if getattr(self, k) and not Path(getattr(self, k)).is_file():
                raise ConfigError(k, f"no such file: {getattr(self, k)}")
        if self.rounds < 1:
            raise ConfigError("rounds", f"must be a whole number >= 1, got {self.rounds}")
        super().check()


def parse_args(argv: list[str]) -> DictConfig:
    """The command's config from ``key=value`` overrides (what ``ncclrl validate`` composes)."""
    return parse(COMMAND, argv)


def main_validate(args: DictConfig) -> int:
    run_validate(args)
    return 0


def run_validate(args: DictConfig, out=sys.stdout, workers_factory=None):
    """Alternate base and tuned jobs (or, with ``measure=false``, take the jobs of an earlier
    validation of the same table from the store); returns the per-size report as a DataFrame."""

    topo = load_topology(args["topology"])
    colls = [N.parse_name("collectives", c, N.COLLECTIVES) for c in args["collectives"]]
    lo, hi = parse_bytes(args["min_bytes"], "min_bytes"), parse_bytes(args["max_bytes"], "max_bytes")
    knobs = read_conf(args["conf"]) if args["conf"] else Point("allreduce", 1)
    table = Path(args["table"])
    digest = hashlib.sha256(table.read_bytes()).hexdigest()[:12]
    points = [Point(N.COLLECTIVES[c], s) for c in colls for s in size_grid(lo, hi, topo.nranks, c)]
    store = Store(Path(args["store"]))
    if not args["measure"]:
        base, tuned = stored_jobs(store, topo.name, digest, points, args["launch"])
        if not any(tuned):
            raise ConfigError("measure", f"no validation of {table} (sha256 {digest}) for {topo.name} in "
                              f"{args['store']}; run with measure=true")
        log.info("# %s: %d rounds from %s", table, max(map(len, tuned)), args["store"])
    else:
        base, tuned = measure_rounds(args, topo, knobs, table, digest, points, store, workers_factory)
    df = judge(topo, points, base, tuned, digest)
    print_report(df, out)
    if args["out"]:
        df.to_csv(args["out"], index=False)
        if not df.empty:
            plot_scurves(df, Path(args["out"]).with_suffix(".png"), f"{table.name}: fresh measurement, {topo.name}")
    return df


def measure_rounds(args, topo, knobs, table, digest, points, store, workers_factory):
    """``rounds`` x (a base job, a tuned job), the order swapped every other round (base, tuned,
    tuned, base, ...): the job that runs second in a pair is not always the same side. Every sample
    stored. Returns per point its samples per job, for each side."""
    if workers_factory is None:

        def workers_factory(knobs, table):
            return live_workers(args, topo, knobs, table=table)

    jobs: dict[str, list[list[list[float]]]] = {"base": [[] for _ in points], "tuned": [[] for _ in points]}
    t0 = time.time()
    with progress("validate", 2 * int(args["rounds"]) + int(bool(args["warmup"]))) as bar:
        if args["warmup"]:  # the first job after a pause runs apart from the rest (1x4: +-25%)
            w = workers_factory(None, None)
            measure_whole(w, points, store, topo.name, backend="torch", samples=int(args["samples"]),
                          tag="validate-warmup")
            log.info("# warm-up job (stored, not judged): %.0f s", time.time() - t0)
            bar.advance()
        sides = (("base", None, None), ("tuned", knobs, table))
        for r in range(int(args["rounds"])):
            for which, kn, tab in sides if r % 2 == 0 else sides[::-1]:  # ABBA: an order effect cancels
                w = workers_factory(kn, tab)
                stored = [replace(kn, collective=p.collective, nbytes=p.nbytes) if kn else p for p in points]
                tag = "validate-base" if which == "base" else f"validate-tuned:{digest}"
                res = measure_whole(w, stored, store, topo.name, backend="torch", samples=int(args["samples"]),
                                    tag=tag)
                done = 0
                for i, smp in enumerate(res):
                    if smp:
                        jobs[which][i].append(list(smp))
                        done += 1
                log.info("# round %d: %s: %d/%d points, %.0f s", r + 1, which, done, len(points), time.time() - t0)
                bar.advance()
    return jobs["base"], jobs["tuned"]


def stored_jobs(store: Store, topology: str, digest: str, points: list[Point], launch: str = "nccl"):
    """The jobs of earlier validations of the table ``digest`` made with ``launch`` (torch or
    nccl calls time differently, so they are never paired): each tuned job with the base job that
    ran next to it (just before, else just after: validate alternates them). Per point, samples
    per job, each side."""
    df = store.frame(topology=topology, status="ok")
    df = df[df.timing.map(launch_of) == launch]
    base: list[list[list[float]]] = [[] for _ in points]
    tuned: list[list[list[float]]] = [[] for _ in points]
    df = df[(df.tag == "validate-base") | (df.tag == f"validate-tuned:{digest}")].copy()
    if df.empty:
        return base, tuned
    df["job"] = job_ids(df)
    where = {(p.collective, p.nbytes): i for i, p in enumerate(points)}
    order = df.groupby("job", sort=False).agg(first=("id", "min"), tag=("tag", "first")).sort_values("first")
    jobs, tags = list(order.index), list(order.tag)
    used: set[int] = set()
    for i, tag in enumerate(tags):
        if tag == "validate-base":
            continue
        mate = next((j for j in (i - 1, i + 1) if 0 <= j < len(tags) and tags[j] == "validate-base"
                     and j not in used), None)
        if mate is None:
            continue
        used.add(mate)
        for side, j in ((base, jobs[mate]), (tuned, jobs[i])):
            for row in df[df.job == j].itertuples():
                if (row.collective, row.nbytes) in where and row.algo == "default":
                    side[where[(row.collective, row.nbytes)]].append(list(row.samples_us))
    return base, tuned


def print_report(df, out=sys.stdout) -> None:
    if df.empty:
        print("# nothing measured", file=out)
        return
    for coll, g in df.groupby("collective", sort=False):
        print(f"\n# {coll}: NCCL defaults vs table (geometric mean of job medians, us; speedup [95% CI "
              "with between-job noise])", file=out)
        print(f"{'nbytes':>10} {'base_us':>10} {'tuned_us':>10} {'speedup':>8} {'95% CI':>13} jobs  verdict", file=out)
        for _, r in g.iterrows():
            print(f"{r['nbytes']:>10} {r.base_us:>10.1f} {r.tuned_us:>10.1f} {r.speedup:>7.2f}x "
                  f"[{r.speedup_lo:>5.2f}-{r.speedup_hi:<5.2f}] {r.jobs:>4}  {r.verdict}", file=out)
        gm = geomean(g.speedup)
        big = g[(g.nbytes >= 64 << 20) & (g.nbytes <= 256 << 20)]
        gm_big = f", {geomean(big.speedup):.2f}x at 64-256 MiB" if len(big) else ""
        print(f"# {coll}: geometric-mean speedup {gm:.2f}x over {len(g)} sizes{gm_big}; "
              f"{int((g.verdict == 'faster').sum())} faster, {int((g.verdict == 'slower').sum())} slower", file=out)
        if int(g.df.min()) == 0:
            print(f"# {coll}: one job per side at some sizes: their verdicts use within-job intervals only, "
                  "which do not cover between-job noise (rounds >= 2)", file=out)


def plot_scurves(df, path: str | Path, title: str = "") -> Path:
    """Bus bandwidth vs size, NCCL's defaults and the table, one panel per collective."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colls = list(dict.fromkeys(df["collective"]))
    fig, axes = plt.subplots(1, len(colls), figsize=(5 * len(colls), 3.8), squeeze=False)
    for ax, coll in zip(axes[0], colls, strict=True):
        g = df[df["collective"] == coll].sort_values("nbytes")
        ax.plot(g["nbytes"], g["base_busbw_gbps"], "o-", ms=3, label="NCCL defaults")
        ax.plot(g["nbytes"], g["tuned_busbw_gbps"], "s-", ms=3, label="table + nccl.conf")
        slower = g[g["verdict"] == "slower"]
        ax.plot(slower["nbytes"], slower["tuned_busbw_gbps"], "rx", ms=8, label="slower (95% CI)")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("size (bytes)")
        ax.set_ylabel("bus bandwidth (GB/s)")
        ax.set_title(f"{coll} {g['topology'].iloc[0]}")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return Path(path)


COMMAND = Command("validate", ValidateConfig, main_validate,
                  "measure a table afresh through the plugin against NCCL's defaults, per size a verdict",
                  positional="table")
register(COMMAND)
