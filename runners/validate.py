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
spread that the repeated jobs of both sides show (pooled over neighbouring sizes), and the
two-sided p-value of "speedup = 1" of the same test.

The verdicts control the family-wise error over the whole report (every collective and size
judged): the per-size p-values are adjusted by Holm's step-down method, and a size is ``faster``
or ``slower`` (the direction of its estimate) only where the Holm-adjusted p-value is <= 0.05 (and
its own interval excludes 1), else ``same``. So a table that is NCCL's own choice everywhere gets
any verdict other than ``same`` in about 5% of validations or fewer, not at one size in most of
them (26 sizes each at 95%: about half of such reports under the job-noise model fitted on the
H200s). The interval columns (``speedup_lo``, ``speedup_hi``) stay per size and unadjusted; the
report has both ``p_value`` (per size) and ``p_holm`` (adjusted), and its first line says what was
controlled. The price is power: a true 1.5x at a few sizes with 3 jobs a side is called
``faster`` at about 2 sizes in 3 on that model (2x: nearly always); more ``rounds`` raise it.
With ``rounds=1`` there is no between-job spread to estimate and the test falls back to
within-job intervals, which judge NCCL's defaults against themselves "different" at about half
the sizes on the H200s (Holm does not repair a p-value that ignores the job noise): use
``rounds`` >= 3 (the default; 3-4 for small sizes). ``measure=false`` judges the jobs of an earlier
validation of the same table from the store, without a GPU.
"""

from __future__ import annotations

import hashlib
import logging
import math
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

from omegaconf import DictConfig

from ncclrl.costmodel import nccl as N
from ncclrl.costmodel.errors import ConfigError
from ncclrl.costmodel.noise import FWER_ALPHA, geomean, judge
from ncclrl.costmodel.space import Point, size_grid
from ncclrl.costmodel.table import TableCheck, check_table, check_unit, read_conf
from ncclrl.costmodel.topology import load_topology
from ncclrl.costmodel.units import parse_bytes
from ncclrl.envs.jobs import ending_on_signals
from ncclrl.envs.live import launch_of
from ncclrl.envs.measure import measure_whole
from ncclrl.envs.store import Store, job_ids, open_readonly
from ncclrl.runners.config import Command, parse, register
from ncclrl.runners.live import LiveConfig, check_launch, live_workers
from ncclrl.runners.progress import progress

log = logging.getLogger(__name__)

@dataclass
class ValidateConfig(LiveConfig):
    """Measure an exported table afresh through the tuner plugin against NCCL's defaults, in jobs
    alternating base, tuned, tuned, base, ..., and judge each size faster, same or slower from the
    between-job spread (``rounds`` >= 3 for small sizes). The verdicts are Holm-controlled: at most
    a 5% chance of any false verdict over all sizes of the report; the 95% intervals are per size.

    :param table: the table to validate (nccl_tuner.csv)
    :param conf: its nccl.conf (per-process knobs; empty: none); NCCL_MIN_NCHANNELS and NCCL_MAX_NCHANNELS
        must be equal (or one alone): the tuned side runs one channel count, not a range
    :param rounds: jobs per side
    :param out: write the per-size report to this CSV (and its S-curves next to it, .png)
    :param measure: true: measure afresh; false: judge an earlier validation of this table from the store (no GPU)
    :param warmup: a first job of NCCL's defaults, stored but not judged (the first job of a command runs apart)
    """

    FILE_KEYS = ("out",)  # a CSV, not a folder (ncclrl.runners.config.check_outputs)

    table: str = ""
    conf: str = ""
    topology: str = ""
    rounds: int = 3
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
        if self.conf:
            read_conf(self.conf)  # not text, an unknown setting, a channel range: one line before anything runs
        super().check()


def parse_args(argv: list[str]) -> DictConfig:
    """The command's config from ``key=value`` overrides (what ``ncclrl validate`` composes)."""
    return parse(COMMAND, argv)


def main_validate(args: DictConfig) -> int:
    if args["measure"]:  # no GPUs or the wrong hosts: one line, before the store is touched
        topo = load_topology(args["topology"])
        # measure=false is a way out only where the store holds an earlier validation of this table
        instead = "measure=false to judge the earlier validation of this table in its store" \
            if earlier_validation(args, topo) else ""
        check_launch(args, topo, instead, key="measure")
    run_validate(args)
    return 0


def table_digest(table: Path) -> str:
    """What the store tags a table's validation jobs with (``validate-tuned:DIGEST``)."""
    return hashlib.sha256(table.read_bytes()).hexdigest()[:12]


def validation_points(args: DictConfig, topo) -> list[Point]:
    colls = [N.parse_name("collectives", c, N.COLLECTIVES) for c in args["collectives"]]
    lo, hi = parse_bytes(args["min_bytes"], "min_bytes"), parse_bytes(args["max_bytes"], "max_bytes")
    return [Point(N.COLLECTIVES[c], s) for c in colls for s in size_grid(lo, hi, topo.nranks, c)]


def earlier_validation(args: DictConfig, topo) -> bool:
    """Whether ``store`` holds jobs of an earlier validation of this table (read only; no store: no)."""
    if not Path(args["store"]).is_file():
        return False
    try:
        store = open_readonly(args["store"])
    except ConfigError:
        return False
    with store:
        _base, tuned = stored_jobs(store, topo.name, table_digest(Path(args["table"])), validation_points(args, topo),
                                   args["launch"])
    return any(tuned)


def run_validate(args: DictConfig, out=sys.stdout, workers_factory=None):
    """Alternate base and tuned jobs (or, with ``measure=false``, take the jobs of an earlier
    validation of the same table from the store); returns the per-size report as a DataFrame."""
    topo = load_topology(args["topology"])
    table = Path(args["table"])
    digest = table_digest(table)
    points = validation_points(args, topo)
    check = check_plugin_table(table, Path(args["conf"]) if args["conf"] else None)
    knobs = read_conf(args["conf"]) if args["conf"] else Point("allreduce", 1)
    if not args["measure"]:  # only reads: the store opened read-only (mode=ro) never changes
        store = open_readonly(args["store"])
        base, tuned = stored_jobs(store, topo.name, digest, points, args["launch"])
        if not any(tuned):
            raise ConfigError("measure", f"no validation of {table} (sha256 {digest}) for {topo.name} in "
                              f"{args['store']}: a table is judged from a store only once validate measured it "
                              "there (on its GPUs)")
    log.info("# %s: %s", table, check.summary())  # everything checked: the progress begins
    if not args["measure"]:
        log.info("# %s: %d rounds from %s", table, max(map(len, tuned)), args["store"])
        measured = (f"stored jobs of earlier validations pooled from {args['store']} "
                    f"(up to {max(map(len, tuned))} per side), launch={args['launch']}")
    else:
        store = Store(Path(args["store"]))
        with ending_on_signals():  # a signal ends the job in flight, keeps what it finished, then the command
            base, tuned = measure_rounds(args, topo, knobs, table, digest, points, store, workers_factory)
        measured = (f"fresh jobs: {args['rounds']} per side alternating with NCCL's defaults, "
                    f"{args['samples']} samples each, launch={args['launch']}")
    df = judge(topo, points, base, tuned, digest)
    print_report(df, out)
    if args["out"]:
        df.to_csv(args["out"], index=False)
        wrote = [str(args["out"])]
        if not df.empty:
            wrote.append(str(plot_scurves(df, Path(args["out"]).with_suffix(".png"),
                                          f"{table.name} (sha256 {digest}) vs NCCL's defaults on {topo.name}",
                                          measured)))
        print(f"# wrote {' and '.join(wrote)}", file=out)
    return df


def check_plugin_table(table: Path, conf: Path | None = None) -> TableCheck:
    """The table as the plugin will load it, read by the plugin's own code
    (:func:`ncclrl.costmodel.table.check_table`): a table the plugin refuses, or with a row it
    rejects, is a one-line :class:`ConfigError` naming the first reasons (validating it would judge
    another table than the one written). The table and its ``nccl.conf`` must be whole files of one
    write where a manifest says which (:func:`ncclrl.costmodel.table.check_unit`)."""
    check_unit(table)
    if conf is not None and conf.parent.resolve() != table.parent.resolve():
        check_unit(conf)
    check = check_table(table)
    if check.refused:
        raise ConfigError("table", f"{table}: the plugin refuses it whole ({check.refused})")
    if check.rejected:
        first = "; ".join(f"line {r.line}: {r.message}" for r in check.rejected[:3])
        raise ConfigError("table", f"{table}: the plugin rejects {len(check.rejected)} row(s), so NCCL would run "
                          f"another table than this one ({first}); fix the rows (ncclrl show {table})")
    return check


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
    """The per-size report of :func:`ncclrl.costmodel.noise.judge`'s frame: one line saying what
    the verdicts control (Holm over every size of the report, all collectives), then per collective
    each size with its speedup, its own 95% interval (not adjusted for multiplicity), its p-value
    and Holm-adjusted p-value, the jobs and the verdict."""
    if df.empty:
        print("# nothing measured", file=out)
        return
    alpha = float(df.attrs.get("fwer", FWER_ALPHA))
    family = int(df.attrs.get("family", len(df)))
    ncoll = df["collective"].nunique()
    over = f"{family} sizes" + (f" of {ncoll} collectives" if ncoll > 1 else "")
    print(f"# verdicts: Holm over {over}, family-wise error {alpha:g} (intervals per size, 95%, unadjusted)",
          file=out)
    has_p = {"p_value", "p_holm"} <= set(df.columns)
    for coll, g in df.groupby("collective", sort=False):
        print(f"\n# {coll}: NCCL defaults vs table (geometric mean of job medians, us; speedup [95% CI per size, "
              "unadjusted, with between-job noise]; p per size; p_holm Holm-adjusted, the verdict's)", file=out)
        print(f"{'nbytes':>10} {'base_us':>10} {'tuned_us':>10} {'speedup':>8} {'95% CI':>13} {'p':>7} {'p_holm':>7} "
              "jobs  verdict", file=out)
        for _, r in g.iterrows():
            p_cols = f"{r.p_value:>7.2g} {r.p_holm:>7.2g}" if has_p else f"{'':>7} {'':>7}"
            print(f"{r['nbytes']:>10} {r.base_us:>10.1f} {r.tuned_us:>10.1f} {r.speedup:>7.2f}x "
                  f"[{r.speedup_lo:>5.2f}-{r.speedup_hi:<5.2f}] {p_cols} {r.jobs:>4}  {r.verdict}", file=out)
        gm = geomean(g.speedup)
        big = g[(g.nbytes >= 64 << 20) & (g.nbytes <= 256 << 20)]
        gm_big = f", {geomean(big.speedup):.2f}x at 64-256 MiB" if len(big) else ""
        print(f"# {coll}: geometric-mean speedup {gm:.2f}x over {len(g)} sizes{gm_big}; "
              f"{int((g.verdict == 'faster').sum())} faster, {int((g.verdict == 'slower').sum())} slower", file=out)
        if int(g.df.min()) == 0:
            print(f"# {coll}: one job per side at some sizes: their verdicts use within-job intervals only, "
                  "which do not cover between-job noise (rounds >= 2)", file=out)


def plot_scurves(df, path: str | Path, title: str = "", measured: str = "") -> Path:
    """Per collective: bus bandwidth vs size for NCCL's defaults and the table, each with its 95%
    interval from the between-job spread (top), and the speedup (NCCL's time / the table's) with
    its 95% interval (per size, unadjusted) and verdicts (Holm over the report), a line at 1
    (bottom): a gain at small sizes that a bandwidth curve squeezes into its lowest decade shows
    there. ``measured`` says what the jobs were (fresh or stored, how many); it goes into the title.
    The bands' artists carry ``gid`` ``band-base``, ``band-tuned`` and ``band-speedup``; the speedup
    axes ``gid`` ``speedup``."""
    import matplotlib

    matplotlib.use("Agg")
    import textwrap

    import matplotlib.pyplot as plt
    import numpy as np
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullFormatter

    from ncclrl.costmodel.noise import t_quantile
    from ncclrl.runners.show import size_axis

    colls = list(dict.fromkeys(df["collective"]))
    fig, axes = plt.subplots(2, len(colls), figsize=(5.6 * len(colls), 7.2), squeeze=False, sharex="col",
                             gridspec_kw={"height_ratios": [3, 2]})
    marks = {"faster": ("^", "tab:green"), "slower": ("v", "tab:red"), "same": ("o", "0.55")}
    for k, coll in enumerate(colls):
        top, bot = axes[0][k], axes[1][k]
        g = df[df["collective"] == coll].sort_values("nbytes")
        x = g["nbytes"].to_numpy(dtype=float)
        # each side: the geometric mean of its job medians, +- t * sigma_between / sqrt(jobs) (log scale)
        dof = g["df"].to_numpy(dtype=int)
        half = np.array([t_quantile(d) * s / np.sqrt(n) if d > 0 and n > 0 else np.nan
                         for d, s, n in zip(dof, g["sigma_between"], g["jobs"], strict=True)])
        for side, label, style in (("base", "NCCL defaults", "o-"), ("tuned", "table + nccl.conf", "s-")):
            bw = g[f"{side}_busbw_gbps"].to_numpy(dtype=float)
            (line,) = top.plot(x, bw, style, ms=3, label=label)
            width = f" (median \u00b1{100 * np.expm1(np.nanmedian(half)):.2g}%)" if np.isfinite(half).any() else ""
            top.fill_between(x, bw * np.exp(-half), bw * np.exp(half), color=line.get_color(), alpha=0.25,
                             lw=0, label=f"{label}: 95% interval{width}" if width else None).set_gid(f"band-{side}")
        top.set_yscale("log")
        top.set_ylabel("bus bandwidth (GB/s)")
        jobs = sorted(set(g["jobs"].astype(int)))
        njobs = f"{jobs[0]}" if len(jobs) == 1 else f"{jobs[0]}-{jobs[-1]}"
        top.set_title(f"{coll}, {g['topology'].iloc[0]}: {njobs} job{'s' if jobs[-1] != 1 else ''} per side",
                      fontsize=10)
        top.grid(alpha=0.3, which="both")
        if (dof == 0).any():
            top.plot([], [], " ", label=f"{int((dof == 0).sum())} of {len(dof)} sizes with one job a side: "
                     "no between-job band (rounds >= 2)")
        top.legend(fontsize=7, loc="best")

        sp, lo, hi = (g[c].to_numpy(dtype=float) for c in ("speedup", "speedup_lo", "speedup_hi"))
        kind = "between-job" if (dof > 0).all() else \
            "within-job: one job a side" if (dof == 0).all() else "between-job; within-job where one job a side"
        bot.fill_between(x, lo, hi, color="tab:purple", alpha=0.25, lw=0,
                         label=f"95% interval per size, unadjusted ({kind})").set_gid("band-speedup")
        bot.plot(x, sp, "-", color="tab:purple", lw=1, label="NCCL's time / table's time")
        for verdict, (m, c) in marks.items():
            sel = (g["verdict"] == verdict).to_numpy()
            if sel.any():
                bot.plot(x[sel], sp[sel], m, color=c, ms=5, ls="none", label=f"{verdict} ({int(sel.sum())})")
        bot.axhline(1.0, color="black", lw=0.8, zorder=0)
        bot.set_yscale("log", base=2)
        ymin = min(float(np.nanmin(lo)), 1.0) / 1.1
        ymax = max(float(np.nanmax(hi)), 1.0) * 1.1
        bot.set_ylim(ymin, ymax)
        ticks = [t for t in (0.25, 0.5, 0.67, 0.8, 1, 1.25, 1.5, 2, 3, 4, 6, 8, 16) if ymin <= t <= ymax]
        bot.yaxis.set_major_locator(FixedLocator(ticks))
        bot.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}x"))
        bot.yaxis.set_minor_formatter(NullFormatter())
        bot.set_ylabel("speedup (> 1: table faster)")
        bot.set_gid("speedup")
        bot.grid(alpha=0.3)
        bot.legend(fontsize=7, loc="best")
        lo_x, hi_x = 2.0 ** np.floor(np.log2(x.min())), 2.0 ** np.ceil(np.log2(x.max()))
        size_axis(bot, lo_x / 2 if lo_x == hi_x else lo_x, hi_x * 2 if lo_x == hi_x else hi_x,
                  every=max(1, math.ceil(np.log2(hi_x / lo_x) / 7)))
        bot.set_xlabel("size (log scale)")
    head = [textwrap.fill(t, int(13 * 5.6 * len(colls))) for t in (title, measured) if t]
    if head:
        fig.suptitle("\n".join(head), fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return Path(path)


COMMAND = Command("validate", ValidateConfig, main_validate,
                  "measure a table afresh through the plugin against NCCL's defaults, per size a verdict",
                  positional="table")
register(COMMAND)
