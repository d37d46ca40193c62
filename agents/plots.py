"""The plots a run leaves for people to read: what a table changed per size, the simulator's S-curves,
e2e's step times and the job composer's training curves.

Each function takes plain data (dicts, lists, a DataFrame, a folder), writes one PNG (Agg backend,
about 8 x 4.5 inches per panel row at 150 dpi), closes its figure and returns a small summary of
what it drew, so a caller can print it and a test can check it. Sizes on an x axis read as people
write them (8 B, 1 KiB, 1 MiB, 1 GiB); a speedup is NCCL's defaults' time over the table's (> 1:
the table is faster); whatever the simulator predicted says "predicted (simulator)" in its title.
"""

from __future__ import annotations

import math
import textwrap
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ncclrl.costmodel import nccl as N
from ncclrl.costmodel.noise import geomean
from ncclrl.costmodel.table import lookup, parse_example_rows
from ncclrl.costmodel.units import format_bytes

DPI = 150
NCCL_COLOR = "black"  # NCCL's defaults: the reference every plot compares with
TABLE_COLOR = "tab:blue"
OPTIMUM_COLOR = "tab:green"
SLOWER_COLOR = "tab:red"
FASTER_COLOR = "tab:green"
LEFT_COLOR = "0.55"  # sizes the table leaves to NCCL's choice
SLOWER_BY = 0.01  # without an interval, a size counts as slower below 1 / (1 + SLOWER_BY)
SPEEDUP_TICKS = (0.125, 0.25, 0.5, 0.67, 0.8, 0.9, 1, 1.1, 1.25, 1.5, 2, 3, 4, 6, 8, 16, 32)


def pyplot():
    """matplotlib's pyplot on the Agg backend (no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def size_axis(ax, lo: float, hi: float, every: int | None = None, axis: str = "x", pad: float = 0.0) -> None:
    """A log2 size axis from ``lo`` to ``hi`` bytes, its ticks named as people write sizes (``8 B``,
    ``1 KiB``, ``32 MiB``): the ends, and every ``every`` octaves on a multiple of ``every``
    (default: 1, 2, 5 or 10 octaves, whichever gives at most 7 ticks); a minor tick each octave;
    ``pad`` octaves of room beyond each end (markers and error bars at the ends stay whole)."""
    from matplotlib.ticker import FixedLocator, NullFormatter

    k0, k1 = math.floor(math.log2(lo)), math.ceil(math.log2(hi))
    if k1 <= k0:
        k0, k1 = k0 - 1, k1 + 1
    span = k1 - k0
    if every is None:
        every = next((e for e in (1, 2, 5, 10) if span / e <= 6), 10)
    ticks = {k for k in range(k0, k1 + 1) if k % every == 0 and min(k - k0, k1 - k) >= every / 2}
    ticks |= {k0, k1}
    values = [2.0 ** k for k in sorted(ticks)]
    set_scale, set_lim = (ax.set_xscale, ax.set_xlim) if axis == "x" else (ax.set_yscale, ax.set_ylim)
    where = ax.xaxis if axis == "x" else ax.yaxis
    set_scale("log", base=2)
    set_lim(2.0 ** (k0 - pad), 2.0 ** (k1 + pad))
    where.set_major_locator(FixedLocator(values))
    where.set_ticklabels([format_bytes(int(v)) for v in values])
    where.set_minor_locator(FixedLocator([2.0 ** k for k in range(k0, k1 + 1)]))
    where.set_minor_formatter(NullFormatter())


def speedup_axis(ax, lo: float, hi: float) -> None:
    """A log2 speedup axis that holds ``lo`` .. ``hi`` and 1, its ticks ``0.8x``, ``1x``, ``1.5x``."""
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullFormatter

    ymin, ymax = min(lo, 1.0) / 1.12, max(hi, 1.0) * 1.12
    ax.set_yscale("log", base=2)
    ax.set_ylim(ymin, ymax)
    gap = math.log2(ymax / ymin) / 8  # ticks at least an eighth of the axis apart, 1x always among them
    ticks = [1.0]
    for t in sorted((t for t in SPEEDUP_TICKS if ymin <= t <= ymax), key=lambda t: (abs(math.log2(t)), t)):
        if all(abs(math.log2(t / u)) >= gap for u in ticks):
            ticks.append(t)
    ax.yaxis.set_major_locator(FixedLocator(sorted(ticks)))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}x"))
    ax.yaxis.set_minor_formatter(NullFormatter())


def _save(fig, path: str | Path) -> Path:
    path = Path(path)
    fig.savefig(path, dpi=DPI)
    pyplot().close(fig)
    return path


def _grid(n: int) -> tuple[int, int]:
    """Rows and columns for ``n`` panels: one row up to 2, then 2 or 3 columns."""
    if n <= 2:
        return 1, n
    cols = 2 if n == 4 else 3
    return math.ceil(n / cols), cols


def _num(x: Any) -> float | None:
    """A finite float, else None (None, NaN, a missing value)."""
    if x is None:
        return None
    try:
        v = float(x)
    except (TypeError, ValueError):
        return None
    return v if math.isfinite(v) else None


# ---------------------------------------------------------------------------------------------------------------
# what a table changed, per size


@dataclass(frozen=True)
class SizeChange:
    """One (collective, size) of a tuning run: the exported table against NCCL's defaults.

    :param collective: the collective's name (``allreduce``)
    :param nbytes: the size
    :param speedup: NCCL's defaults' time over the table's (> 1: the table faster); None: not known
    :param lo: the low end of its 95% interval (None: no interval)
    :param hi: the high end
    :param nccl_us: NCCL's defaults' time (us), where known
    :param table_us: the table's time (us), where known
    :param changed: the table sets its own decision here (False: it leaves NCCL's choice)
    :param measured: measured on the machine (False: predicted by the simulator)
    """

    collective: str
    nbytes: int
    speedup: float | None = None
    lo: float | None = None
    hi: float | None = None
    nccl_us: float | None = None
    table_us: float | None = None
    changed: bool = True
    measured: bool = True

    @property
    def value(self) -> float | None:
        """The speedup drawn: the known one, else 1.0 where the table leaves NCCL's choice."""
        return self.speedup if self.speedup is not None else None if self.changed else 1.0

    @property
    def slower(self) -> bool:
        """Slower than NCCL's defaults: the whole interval below 1, or, with no interval, more
        than :data:`SLOWER_BY` below 1."""
        if self.speedup is None:
            return False
        if self.hi is not None:
            return self.hi < 1.0
        return self.speedup < 1.0 / (1.0 + SLOWER_BY)

    @property
    def faster(self) -> bool:
        if self.speedup is None:
            return False
        if self.lo is not None:
            return self.lo > 1.0
        return self.speedup > 1.0 + SLOWER_BY


def size_change(d: Mapping[str, Any], measured: bool = True, changed: bool | None = None) -> SizeChange:
    """A :class:`SizeChange` from one record of whatever a run writes per size: finetune's rows
    (``speedup_vs_nccl_defaults: [x, lo, hi]``, ``nccl_time_us``, ``time_us``), its size report
    (``speedup``, ``lo``, ``hi``), ``sizes_on_sweep`` (``speedup``), validate's CSV (``base_us``,
    ``tuned_us``, ``speedup_lo``, ``speedup_hi``), ``evaluate_table`` (``default_time_us``,
    ``time_us``), finetune's replayed check (``speedup``, ``lo``, ``hi``, ``row``). A record's own
    ``measured`` and ``changed`` (or ``row``) keys win over the arguments; ``changed`` None: changed."""
    def first(*keys: str) -> float | None:
        return next((v for v in (_num(d.get(k)) for k in keys) if v is not None), None)

    nccl_us = first("nccl_us", "nccl_time_us", "default_time_us", "base_us")
    table_us = first("table_us", "tuned_us", "time_us")
    sp, lo, hi = first("speedup"), first("lo", "speedup_lo"), first("hi", "speedup_hi")
    triple = d.get("speedup_vs_nccl_defaults")
    if isinstance(triple, list | tuple) and len(triple) == 3:
        sp, lo, hi = (_num(x) for x in triple)
    if sp is None and nccl_us and table_us:
        sp = nccl_us / table_us
    own = d.get("changed", d.get("row", changed))
    return SizeChange(str(d["collective"]), int(d["nbytes"]), sp, lo, hi, nccl_us, table_us,
                      True if own is None else bool(own), bool(d.get("measured", measured)))


def size_changes(records: Iterable[Mapping[str, Any]], sizes: Mapping[Any, Iterable[int]] | None = None,
                 changed: Iterable[tuple[str, int]] | None = None, measured: bool = True) -> list[SizeChange]:
    """Every size of a run as :class:`SizeChange`: ``records`` as :func:`size_change` reads them;
    ``changed``: the (collective, bytes) the table sets (None: every record); ``sizes``: every size
    the run covered per collective (names or NCCL's collective indices), those without a record
    added as left to NCCL's choice. Finetune calls it as
    ``size_changes(res.rows, problem.sizes)`` (each row its confirmation's speedup and interval)."""
    keys = None if changed is None else {(str(c), int(s)) for c, s in changed}
    out = {}
    for d in records:
        k = (str(d["collective"]), int(d["nbytes"]))
        out[k] = size_change(d, measured, None if keys is None else k in keys)
    for c, ss in (sizes or {}).items():
        name = N.COLLECTIVES[c] if isinstance(c, int | np.integer) else str(c)
        for s in ss:
            if (name, int(s)) not in out:
                out[(name, int(s))] = SizeChange(name, int(s), changed=False, measured=measured)
    order = {c: i for i, c in enumerate(N.COLLECTIVES)}
    return sorted(out.values(), key=lambda r: (order.get(r.collective, len(order)), r.collective, r.nbytes))


def changed_by_table(table_text: str, sizes: Iterable[tuple[str, int]], nodes: int = -1,
                     nranks: int = -1) -> set[tuple[str, int]]:
    """The (collective, bytes) of ``sizes`` where the table text (nccl_tuner.csv) sets its own
    decision: a row matches it and is not marked as NCCL's choice."""
    rows = parse_example_rows(table_text)
    out = set()
    for c, s in sizes:
        r = lookup(rows, c, int(s), nodes, nranks)
        if r is not None and not r["nccl_choice"] and r["algo"] not in ("-1", "default"):
            out.add((c, int(s)))
    return out


def changes_from_validation(df, table_text: str, nodes: int = -1, nranks: int = -1) -> list[SizeChange]:
    """``ncclrl validate``'s per-size report (its CSV: ``base_us``, ``tuned_us``, ``speedup`` with
    ``speedup_lo`` and ``speedup_hi``) as measured changes, changed where the validated table's
    text sets its own decision (:func:`changed_by_table`)."""
    records = df.to_dict("records")
    changed = changed_by_table(table_text, [(r["collective"], r["nbytes"]) for r in records], nodes, nranks)
    return size_changes(records, changed=changed)


def changes_from_evaluation(df) -> list[SizeChange]:
    """The simulator's judgement of a table (:func:`ncclrl.agents.evaluate.evaluate_table`'s rows) as
    predicted changes: changed where the table's decision differs from NCCL's."""
    return [size_change(r, measured=False, changed=r["ours"] != r["nccl"]) for r in df.to_dict("records")]


@dataclass
class ChangeSummary:
    """What :func:`plot_table_change` drew, per collective and in all.

    :param path: the PNG
    :param collectives: per collective: ``geomean`` (the speedup's geometric mean over its sizes
        with a known or implied value), ``sizes``, ``changed``, ``unknown`` (changed sizes with no
        speedup), ``slower`` (the sizes drawn red), ``worst`` (the :class:`SizeChange` lowest)
    :param slower: every size drawn as slower, (collective, bytes)
    :param measured: every value measured (False: some or all predicted)
    """

    path: Path
    collectives: dict[str, dict[str, Any]] = field(default_factory=dict)
    slower: list[tuple[str, int]] = field(default_factory=list)
    measured: bool = True


def _verdict_line(r: SizeChange) -> str:
    iv = f" [{r.lo:.2f}, {r.hi:.2f}]" if r.lo is not None and r.hi is not None else ""
    return f"{format_bytes(r.nbytes)} {r.value:.2f}x{iv}"


def plot_table_change(changes: Iterable[SizeChange | Mapping[str, Any]], path: str | Path, title: str = "",
                      source: str = "") -> ChangeSummary:
    """Per collective (a panel each), the speedup of the table over NCCL's defaults per size on a
    log size axis, with its 95% interval where known: green when the interval lies above 1, red
    (and named) when it lies below 1, blue when it contains 1 (with no interval: more or less than
    1% off 1). Sizes where the table sets its own decision are filled, those where it leaves NCCL's
    choice hollow (at their speedup where one is known, under the table's nccl.conf; else grey at
    1x); changed sizes with no speedup known are grey crosses at 1x. A panel's title states its
    geometric-mean speedup over its sizes, how many the table changed and how many are slower, and
    its worst size; the figure's title says measured or predicted (simulator) and ``source``.
    Markers carry ``gid`` ``slower:<collective>``, ``faster:<collective>``, ``same:<collective>``,
    ``nccl:<collective>``, ``unknown:<collective>``, the error bars ``interval:<collective>``."""
    rows = [c if isinstance(c, SizeChange) else size_change(c) for c in changes]
    plt = pyplot()
    colls = list(dict.fromkeys(r.collective for r in rows))
    nrow, ncol = _grid(max(len(colls), 1))
    fig, axes = plt.subplots(nrow, ncol, figsize=(8.0 if ncol == 1 else 5.6 * ncol, 1.0 + 3.9 * nrow),
                             squeeze=False)
    measured = all(r.measured for r in rows)
    kind = "measured" if measured else "predicted (simulator)" if not any(r.measured for r in rows) \
        else "measured and predicted (simulator)"
    out = ChangeSummary(Path(path), measured=measured)
    for ax, coll in zip(axes.flat, colls, strict=False):
        g = sorted((r for r in rows if r.collective == coll), key=lambda r: r.nbytes)
        known = [r for r in g if r.value is not None]
        x = np.array([r.nbytes for r in known], float)
        y = np.array([r.value for r in known], float)
        if len(known):
            ax.plot(x, y, "-", color="0.7", lw=0.8, zorder=1)
        ax.axhline(1.0, color=NCCL_COLOR, lw=1.0, zorder=1, label="NCCL's defaults (1x)")
        iv = any(r.hi is not None for r in known)
        verdicts = (("faster", lambda r: r.faster, "^", FASTER_COLOR,
                     "faster: 95% interval above 1" if iv else "faster by more than 1%"),
                    ("same", lambda r: r.speedup is not None and not r.faster and not r.slower, "o", TABLE_COLOR,
                     "interval contains 1" if iv else "within 1%"),
                    ("slower", lambda r: r.slower, "v", SLOWER_COLOR,
                     "SLOWER: 95% interval below 1" if iv else "SLOWER by more than 1%"),
                    ("nccl", lambda r: r.speedup is None, "o", LEFT_COLOR, "left to NCCL's choice: 1x by definition"))
        lo_all, hi_all = [1.0], [1.0]
        for gid, pick, marker, color, label in verdicts:
            sel = [r for r in known if pick(r)]
            if not sel:
                continue
            for own in (True, False):  # the table's own decision filled, NCCL's choice hollow
                part = [r for r in sel if r.changed == own]
                if not part:
                    continue
                ax.plot([r.nbytes for r in part], [r.value for r in part], marker, color=color,
                        ms=7 if gid == "slower" else 5, ls="none", zorder=4 if gid == "slower" else 3,
                        mfc=color if own and gid != "nccl" else "white",
                        label=f"{label} ({len(sel)})" if own or not any(r.changed for r in sel) else None
                        )[0].set_gid(f"{gid}:{coll}")
            with_iv = [r for r in sel if r.lo is not None and r.hi is not None]
            if with_iv:
                bars = ax.errorbar([r.nbytes for r in with_iv], [r.value for r in with_iv],
                                   yerr=[[r.value - r.lo for r in with_iv], [r.hi - r.value for r in with_iv]],
                                   fmt="none", ecolor=color, elinewidth=1, capsize=2, zorder=2)
                bars.lines[2][0].set_gid(f"interval:{coll}")
                lo_all += [r.lo for r in with_iv]
                hi_all += [r.hi for r in with_iv]
            lo_all += [r.value for r in sel]
            hi_all += [r.value for r in sel]
        left = sum(not r.changed for r in g)
        if any(not r.changed and r.speedup is not None for r in g):  # a legend key for coloured hollow markers
            ax.plot([], [], "o", color="0.3", mfc="white", ls="none",
                    label=f"hollow: the table leaves NCCL's choice ({left})")
        unknown = [r for r in g if r.value is None]
        if unknown:
            ax.plot([r.nbytes for r in unknown], [1.0] * len(unknown), "x", color=LEFT_COLOR, ms=6, ls="none",
                    label=f"changed, speedup not known ({len(unknown)})")[0].set_gid(f"unknown:{coll}")
        slower = [r for r in g if r.slower]
        for r in slower:  # named under its interval, upright, so that neighbours never overlap
            ax.annotate(format_bytes(r.nbytes), (r.nbytes, r.lo if r.lo is not None else r.value),
                        textcoords="offset points", xytext=(0, -5), ha="center", va="top", rotation=90,
                        fontsize=7, color=SLOWER_COLOR)
        gm = geomean([r.value for r in known]) if known else float("nan")
        valued = [r for r in known if r.speedup is not None]
        worst = min(valued, key=lambda r: r.value) if valued else None
        nchanged = sum(r.changed for r in g)
        out.collectives[coll] = {"geomean": gm, "sizes": len(g), "changed": nchanged, "unknown": len(unknown),
                                 "slower": [r.nbytes for r in slower], "worst": worst}
        out.slower += [(coll, r.nbytes) for r in slower]
        head = f"{coll}: {gm:.2f}x geometric mean over {len(known)} sizes; {nchanged} changed, {len(slower)} slower"
        tail = [f"worst size {_verdict_line(worst)}"] if worst else []
        if left and (worst is None or worst.value >= 1.0):
            tail.append(f"{left} size{'s' if left != 1 else ''} left to NCCL's choice (1x)")
        ax.set_title("\n".join([head, "; ".join(tail)] if tail else [head]), fontsize=9)
        speedup_axis(ax, float(min(lo_all)) / (1.6 if slower else 1.0), float(max(hi_all)))
        every = [r.nbytes for r in g] or [1]
        size_axis(ax, min(every), max(every), pad=0.5)
        ax.set_xlabel("message size (log scale)")
        ax.set_ylabel("speedup over NCCL's defaults\n(NCCL's time / table's; > 1: table faster)", fontsize=8)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="best")
    for ax in list(axes.flat)[len(colls):]:
        ax.set_visible(False)
    head = [title or "What the table changed per size", f"{kind}{': ' + source if source else ''}"]
    fig.suptitle("\n".join(textwrap.fill(t, 45 * ncol + 50) for t in head), fontsize=10)
    fig.tight_layout()
    _save(fig, path)
    return out


# ---------------------------------------------------------------------------------------------------------------
# the simulator's S-curves of a table


def plot_s_curve(df, topology: str, nranks: int, path: str | Path) -> dict[str, Any]:
    """The simulator's S-curves of a table (:func:`ncclrl.agents.evaluate.evaluate_table`'s rows):
    per collective, bus bandwidth (GB/s) against size for NCCL's defaults (black, dashed, with
    markers, drawn above the others so it shows where the table runs the same), the table and the
    exhaustive optimum (top), and the table's predicted speedup over NCCL's defaults with the
    optimum's, a line at 1 and the sizes predicted slower in red (bottom). Everything is marked
    "predicted (simulator)". Lines carry ``gid`` ``nccl:<c>``, ``table:<c>``, ``optimum:<c>``,
    ``speedup:<c>``, ``slower:<c>``. Returns the geometric-mean speedup and the sizes predicted
    slower per collective."""
    plt = pyplot()
    colls = list(dict.fromkeys(df["collective"]))
    nrow, ncol = _grid(len(colls))
    fig = plt.figure(figsize=(8.0 if ncol == 1 else 4.6 * ncol, 0.9 + 4.4 * nrow), layout="constrained")
    subs = np.atleast_1d(fig.subfigures(nrow, ncol, squeeze=False)).ravel()
    out: dict[str, Any] = {"collectives": {}}
    for sub, name in zip(subs, colls, strict=False):
        g = df[df["collective"] == name].sort_values("nbytes")
        top, bot = sub.subplots(2, 1, sharex=True, gridspec_kw={"height_ratios": [3, 2]})
        x = g["nbytes"].to_numpy(float)
        bf = float(N.bus_factor(N.COLLECTIVES.index(name), nranks))
        for col, label, style, color, z, gid in (
                ("time_us", "exported table", dict(ls="-", lw=2.4), TABLE_COLOR, 2, "table"),
                ("optimum_time_us", "exhaustive optimum", dict(ls=":", lw=1.6), OPTIMUM_COLOR, 3, "optimum"),
                ("default_time_us", "NCCL's defaults", dict(ls="--", lw=1.2, marker="o", ms=2.5), NCCL_COLOR, 4,
                 "nccl")):
            top.plot(x, x * bf / g[col].to_numpy(float) / 1e3, color=color, zorder=z, label=label,
                     **style)[0].set_gid(f"{gid}:{name}")
        top.set_yscale("log")
        top.set_ylabel("bus bandwidth (GB/s)")
        top.grid(alpha=0.3)
        top.legend(fontsize=7, loc="upper left")
        sp = g["speedup"].to_numpy(float)
        opt = g["optimum_speedup"].to_numpy(float)
        bot.plot(x, opt, ":", color=OPTIMUM_COLOR, lw=1.4, label="optimum's speedup")[0].set_gid(f"optimum:{name}")
        bot.plot(x, sp, "-", color=TABLE_COLOR, lw=1.8, label="table's speedup")[0].set_gid(f"speedup:{name}")
        bot.axhline(1.0, color=NCCL_COLOR, lw=1.0, ls="--", label="NCCL's defaults")
        slow = sp < 1.0 / (1.0 + SLOWER_BY)
        if slow.any():
            bot.plot(x[slow], sp[slow], "v", color=SLOWER_COLOR, ms=5, ls="none",
                     label=f"predicted slower ({int(slow.sum())})")[0].set_gid(f"slower:{name}")
        speedup_axis(bot, float(min(sp.min(), opt.min())), float(max(sp.max(), opt.max())))
        bot.set_ylabel("speedup\n(> 1: table faster)")
        bot.grid(alpha=0.3)
        bot.legend(fontsize=7, loc="upper left")
        size_axis(bot, x.min(), x.max())
        bot.set_xlabel("message size (log scale)")
        gm = geomean(sp)
        worst = int(np.argmin(sp))
        sub.suptitle(f"{name}: {gm:.2f}x geometric mean; worst {format_bytes(int(x[worst]))} {sp[worst]:.2f}x",
                     fontsize=9)
        out["collectives"][name] = {"geomean": gm, "slower": [int(v) for v in x[slow]]}
    fig.suptitle(f"Predicted (simulator) on {topology}: the exported table against NCCL's defaults", fontsize=11)
    _save(fig, path)
    out["path"] = Path(path)
    return out


# ---------------------------------------------------------------------------------------------------------------
# e2e's step times

SIDE_COLORS = {"default": NCCL_COLOR, "table": TABLE_COLOR, "online": "tab:orange"}
SIDE_NAMES = {"default": "NCCL's defaults", "table": "table", "online": "online mode"}
SIDE_SHORT = {"default": "NCCL", "table": "table", "online": "online"}


def job_center(jobs: list[np.ndarray], stat: str = "median") -> float:
    """A side's step time as e2e states it: the geometric mean over its jobs of each job's median
    (or mean) step, so that the ratio of two sides' values is the geometric mean of the rounds'
    ratios e2e reports."""
    f = np.median if stat == "median" else np.mean
    return float(np.exp(np.mean([np.log(f(np.asarray(j, float))) for j in jobs])))


def plot_step_times(steps, path: str | Path, summary: Mapping[str, Any] | None = None, title: str = "") -> dict:
    """e2e's step times: per mode (a panel each), every job's timed steps as a box in running order
    (ABBA), coloured by side, with each side's step time (the geometric mean of its jobs' median
    steps) as a line. The title states the ratio table / NCCL's defaults computed from those two
    values (so it points the way the lines do), with the 95% interval and verdict of ``summary``
    (e2e's ``summary.json``: its ``modes``) where given. ``steps``: e2e's ``steps.csv`` rows
    (``mode``, ``job``, ``side``, ``step_time_ms``) as dicts or a DataFrame. Returns per mode each
    side's step time and the ratio with its interval."""
    import pandas as pd

    plt = pyplot()
    d = pd.DataFrame(steps)
    modes = list(dict.fromkeys(d["mode"]))
    fig, axes = plt.subplots(len(modes), 1, figsize=(10.0, 0.8 + 3.6 * len(modes)), squeeze=False)
    out: dict[str, Any] = {}
    for ax, mode in zip(axes[:, 0], modes, strict=True):
        g = d[d["mode"] == mode]
        jobs = sorted(g["job"].unique())
        side_of = {j: g.loc[g["job"] == j, "side"].iloc[0] for j in jobs}
        data = [g.loc[g["job"] == j, "step_time_ms"].to_numpy(float) for j in jobs]
        bp = ax.boxplot(data, positions=range(len(jobs)), widths=0.6, patch_artist=True, showfliers=True,
                        flierprops={"ms": 3, "alpha": 0.5}, medianprops={"color": "white", "lw": 1.5})
        for box, j in zip(bp["boxes"], jobs, strict=True):
            box.set_facecolor(SIDE_COLORS.get(side_of[j], "tab:purple"))
            box.set_alpha(0.75)
            box.set_gid(f"job:{side_of[j]}")
        centers = {}
        for side in dict.fromkeys(side_of.values()):
            mine = [x for x, j in zip(data, jobs, strict=True) if side_of[j] == side]
            centers[side] = job_center(mine)
            ax.axhline(centers[side], color=SIDE_COLORS.get(side, "tab:purple"), ls="--", lw=1.2,
                       label=f"{SIDE_NAMES.get(side, side)}: {centers[side]:.2f} ms\n(geometric mean of its\n"
                             f"{len(mine)} jobs' median steps)").set_gid(f"center:{side}")
        info = {"centers_ms": centers}
        head = f"{mode}"
        if "default" in centers and "table" in centers:
            ratio = centers["table"] / centers["default"]
            info["ratio"] = ratio
            s = (summary or {}).get(mode) or {}
            r = s.get("ratio") or {}
            iv = ""
            if r.get("ci_lo") is not None:
                info.update(lo=r["ci_lo"], hi=r["ci_hi"], verdict=s.get("verdict"))
                iv = f" [95% {r['ci_lo']:.2f}, {r['ci_hi']:.2f}]: {s.get('verdict')}"
            way = "shorter" if ratio < 1 else "longer"
            head += (f": table / NCCL's defaults = {ratio:.3f}{iv} (the table's steps {abs(1 - ratio) * 100:.1f}% "
                     f"{way})")
        out[mode] = info
        ax.set_title(head, fontsize=9)
        ax.set_xticks(range(len(jobs)), [f"{j}\n{SIDE_SHORT.get(side_of[j], side_of[j])}" for j in jobs],
                      fontsize=7 if len(jobs) <= 16 else 5)
        ax.set_xlabel("job, in running order (ABBA: both sides see the same drift)")
        ax.set_ylabel("step time (ms)\nslowest rank, per timed step")
        ax.grid(alpha=0.3, axis="y")
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    fig.suptitle(title or "e2e: step times per job, NCCL's defaults against the table (measured)", fontsize=10)
    fig.tight_layout()
    _save(fig, path)
    out["path"] = Path(path)
    return out


# ---------------------------------------------------------------------------------------------------------------
# the job composer's training curves

COMPOSER_TAGS = {"compose/net_value": ("net value per episode (0: NCCL's defaults)", "net value (points)"),
                 "compose/vs_baseline": ("lead over sweep-then-race (same problem and noise; 0: a tie)",
                                         "lead (points)")}
#: the stopping agent's curves (docs/explanation/stopping.md)
STOP_TAGS = {"stop/net_value": ("net value per episode (0: NCCL's defaults)", "net value (points)"),
             "stop/vs_rule": ("lead over the default run's own rule (same problem and noise; 0: a tie)",
                              "lead (points)")}


def composer_scalars(source: str | Path,
                     tags: dict | None = None) -> dict[str, dict[str, tuple[np.ndarray, np.ndarray]]]:
    """The composer's training curves per run: ``{run: {tag: (steps, values)}}``, from a TensorBoard
    folder (SB3's logger: one subfolder per run, or a run's own folder) or SB3's ``progress.csv``
    (``time/total_timesteps`` and the tags as columns); ``tags``: which curves (default: the composer's)."""
    tags = COMPOSER_TAGS if tags is None else tags
    src = Path(source)
    if src.is_file():
        import pandas as pd

        d = pd.read_csv(src)
        step = d["time/total_timesteps"].to_numpy(float)
        runs = {src.parent.name or src.stem: {t: (step[d[t].notna()], d[t].dropna().to_numpy(float))
                                              for t in tags if t in d}}
        return runs
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    folders = sorted(p for p in src.iterdir() if p.is_dir()) or [src]
    out = {}
    for run in folders:
        acc = EventAccumulator(str(run))
        acc.Reload()
        have = acc.Tags().get("scalars", [])
        out[run.name] = {t: (np.array([e.step for e in acc.Scalars(t)], float),
                             np.array([e.value for e in acc.Scalars(t)], float)) for t in tags if t in have}
    return out


def smooth(values: np.ndarray, window: int = 9) -> np.ndarray:
    """A centred running mean over ``window`` points (shorter at the ends)."""
    v = np.asarray(values, float)
    if v.size < 3:
        return v
    k = max(1, min(window, v.size) // 2)
    c = np.concatenate([[0.0], np.cumsum(v)])
    lo = np.clip(np.arange(v.size) - k, 0, v.size)
    hi = np.clip(np.arange(v.size) + k + 1, 0, v.size)
    return (c[hi] - c[lo]) / (hi - lo)


def plot_composer_curves(source: str | Path, path: str | Path, title: str = "", tags: dict | None = None,
                         xlabel: str = "training steps (jobs composed)") -> dict[str, Any]:
    """The job composer's training curves (``ncclrl composer``'s ``run_dir/tensorboard``, or a
    ``progress.csv``): mean net value per episode and its lead over the paired baseline
    (sweep-then-race on the same problem and noise), against training steps, each run (training
    seed) raw (thin) and as a running mean over 9 points (thick), a line at 0. Everything is in
    simulation. ``tags``: other curves (:data:`STOP_TAGS`: the stopping agent's, against its rule).
    Returns per run and curve the last smoothed value."""
    tags = COMPOSER_TAGS if tags is None else tags
    plt = pyplot()
    runs = composer_scalars(source, tags)
    fig, axes = plt.subplots(1, 2, figsize=(11.0, 4.4), squeeze=False)
    colors = plt.get_cmap("tab10")
    out: dict[str, Any] = {"runs": {}}
    for i, (run, got) in enumerate(runs.items()):
        out["runs"][run] = {}
        for ax, tag in zip(axes[0], tags, strict=True):
            if tag not in got or not len(got[tag][0]):
                continue
            x, y = got[tag]
            ax.plot(x, y, "-", color=colors(i), lw=0.7, alpha=0.35)
            s = smooth(y)
            ax.plot(x, s, "-", color=colors(i), lw=2.0, label=run)[0].set_gid(
                f"{tag}:{run}")
            out["runs"][run][tag] = float(s[-1])
    from matplotlib.ticker import FuncFormatter

    for ax, (head, ylabel) in zip(axes[0], tags.values(), strict=True):
        ax.set_title(head, fontsize=9)
        ax.set_ylabel(ylabel)
        ax.set_xlabel(xlabel)
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v / 1000:g}k" if v else "0"))
        ax.axhline(0, color=NCCL_COLOR, lw=0.8)
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7, loc="lower right")
    fig.suptitle(title or "PPO job composer, training on simulated problems (thin: each logged mean; thick: "
                 "running mean of 9)", fontsize=10)
    fig.tight_layout()
    _save(fig, path)
    out["path"] = Path(path)
    return out
