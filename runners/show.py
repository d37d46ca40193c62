"""``ncclrl show TABLE``: print a table back as the plugin loads it (the plugin's own code reads it:
:func:`ncclrl.costmodel.table.check_table`), with a decision map plot."""

from __future__ import annotations

import json
import math
import re
import sys
from dataclasses import dataclass
from pathlib import Path

from ncclrl.costmodel import nccl as N
from ncclrl.costmodel.errors import ConfigError
from ncclrl.costmodel.table import (
    FILLED,
    MAX_BYTES,
    NCCL_CHOICE_MARK,
    NCCL_VERSIONS_MARK,
    Row,
    Table,
    TableCheck,
    check_table,
    check_text,
    check_unit,
    parse_example_rows,
    read_conf_env,
    uncovered_spans,
)
from ncclrl.costmodel.units import plural
from ncclrl.runners.config import Command, register


def _human(n: int) -> str:
    """``n`` bytes in the largest unit that holds it exactly (``4 KiB``, ``1536 KiB``), else in bytes
    (``8191 B``): never rounded."""
    for unit, f in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= f and n % f == 0:
            return f"{n // f} {unit}"
    return f"{n} B"


def _bytes(n: int) -> str:
    """Exact bytes, with the size in a unit beside it where that is exact: ``4096 (4 KiB)``, ``8191``."""
    human = _human(n)
    return str(n) if human.endswith(" B") else f"{n} ({human})"


#: how ``ncclrl show`` names where a row comes from
FILLED_LABEL, TUNED_LABEL, UNKNOWN_LABEL = "nccl", "tuned", "?"


def _origin(r: Row | None) -> str:
    if r is None:
        return UNKNOWN_LABEL
    return FILLED_LABEL if r.source == FILLED else TUNED_LABEL


def _twin_rows(path: Path, manifest: dict | None) -> list[Row] | None:
    """The rows of the JSON written with the CSV ``path`` (the same write, per its manifest), in
    the CSV's row order; None when there is none."""
    if not manifest:
        return None
    names = [n for n in manifest.get("files", {}) if n.endswith(".json")]
    if len(names) != 1:
        return None
    try:
        return Table.read(path.with_name(names[0])).rows
    except ConfigError:
        return None


def check_json_table(path: Path) -> None:
    """A JSON file that is not a table (finetune's or tune's evidence, anything else) is one line
    naming the table beside it."""
    try:
        doc = json.loads(path.read_text(errors="replace"))
    except (OSError, ValueError):
        return  # Table.read names what is wrong with it
    rows = doc.get("rows") if isinstance(doc, dict) else None
    if isinstance(rows, list) and all(isinstance(r, dict) and "min_bytes" in r for r in rows):
        return
    beside = [p.name for p in (path.with_name("nccl_tuner.csv"), path.with_name("nccl_tuner.json")) if p.is_file()]
    what = ("the evidence of a tuning run (finetune.json: each row's measurements), not a table"
            if isinstance(rows, list) and "measured" in doc else "not an ncclrl table")
    hint = f"; the table beside it: {path.with_name(beside[0])}" if beside else ""
    raise ConfigError("table", f"{path} is {what}; show reads nccl_tuner.csv or nccl_tuner.json{hint}")


def plugin_view(path: Path) -> tuple[Table, TableCheck]:
    """A table file as the plugin loads it: a CSV read by the plugin's own code (its accepted rows,
    with the ``nccl.conf`` beside it), a JSON through the CSV its rows write; the files of one write
    checked together first (:func:`check_unit`)."""
    if path.suffix == ".json":
        check_json_table(path)
        tab = Table.read(path)
        manifest = check_unit(path)
        twin = path.with_name("nccl_tuner.csv")
        if manifest and {path.name, twin.name} <= set(manifest.get("files", {})):
            return tab, check_table(twin)  # the CSV written with it, whole: the very file the plugin loads
        return tab, check_text(tab.csv_text())  # no CSV of this write: the text its rows make (no file)
    if not path.is_file():
        raise ConfigError("table", f"file not found: {path}")
    twin = _twin_rows(path, check_unit(path))
    check = check_table(path)
    # the JSON's rows (where it and its sources come from) follow the CSV's data lines in order
    data_lines = [i for i, line in enumerate(path.read_text(errors="replace").splitlines(), 1)
                  if line.strip() and not line.lstrip().startswith("#")]
    by_line = dict(zip(data_lines, twin, strict=True)) if twin is not None and len(twin) == len(data_lines) else {}
    rows = []
    for v in check.accepted:
        c, lo, hi, a, p, ch, nn, nr = v.row[:8]
        src = by_line.get(v.line)
        rows.append((v.line, Row(c, lo, hi, "default" if a == "-1" else a, "default" if p == "-1" else p, ch,
                                 nnodes=nn, nranks=nr, source=src.source if src else "",
                                 default_time_us=src.default_time_us if src else None,
                                 time_us=src.time_us if src else None)))
    # rows marked as NCCL's choice: the plugin leaves those sizes to NCCL; listed for what they state
    lines, marked = path.read_text(errors="replace").splitlines(), False
    for i, line in enumerate(lines, 1):  # as the plugin reads them: a mark holds for the next row
        if line.strip().startswith(NCCL_CHOICE_MARK):
            marked = True
        elif i in data_lines:
            try:
                got = parse_example_rows(line) if marked else []
            except ValueError:  # the checker's verdicts name what is wrong with it
                got = []
            marked = False
            for r in got:
                rows.append((i, Row(r["collective"], r["min_bytes"], r["max_bytes"], r["algo"], r["proto"],
                                    r["channels"], nnodes=r["nNodes"], nranks=r["nRanks"], source=FILLED)))
    conf = path.with_name("nccl.conf")
    return Table(None, [r for _i, r in sorted(rows, key=lambda x: x[0])],
                 read_conf_env(conf) if conf.is_file() else {}), check


def _differences(rows: list[Row], most: int = 8) -> list[str]:
    """Comment lines naming what the two plugins read differently: sizes of a communicator shape the
    rows name that no row covers (every collective counts), and rows that leave the algorithm,
    protocol or channel count to NCCL."""
    out = []
    shapes = list(dict.fromkeys((r.nnodes, r.nranks) for r in rows))
    gaps = []
    for shape in shapes:
        for coll in N.COLLECTIVES if shape != (-1, -1) else dict.fromkeys(r.collective for r in rows):
            spans = [(r.min_bytes, r.max_bytes) for r in rows if r.collective == coll and
                     r.nnodes in (-1, shape[0]) and r.nranks in (-1, shape[1])]
            gaps += [f"{coll} on {_shape(shape)} {lo}..{hi}" for lo, hi in uncovered_spans(spans)]
    if gaps:
        more = f"; and {len(gaps) - most} more" if len(gaps) > most else ""
        out.append("# not covered (ncclrl's plugin: NCCL decides; NVIDIA's example plugin: NCCL's algorithm on ONE "
                   f"channel): {'; '.join(gaps[:most])}{more}")
    left = [r for r in rows if r.channels <= 0 or r.algo in ("default", "-1")]
    if left:
        out.append(f"# {len(left)} row(s) leave the algorithm/protocol or channels to NCCL (NVIDIA's example plugin "
                   "runs channels -1 on ONE channel and algorithm -1 as ring/simple), first: "
                   f"{left[0].collective} {left[0].min_bytes}..{left[0].max_bytes} on "
                   f"{_shape((left[0].nnodes, left[0].nranks))}")
    return out


def _stated_versions(path: Path) -> str | None:
    """The NCCL releases a table's CSV states its rows mean the same on (its versions line), if any."""
    csv = path if path.suffix != ".json" else path.with_name("nccl_tuner.csv")
    try:
        lines = csv.read_text(errors="replace").splitlines()
    except OSError:
        return None
    stated = [ln.strip()[len(NCCL_VERSIONS_MARK):] for ln in lines if ln.strip().startswith(NCCL_VERSIONS_MARK)]
    valid = [v for v in stated if re.fullmatch(r"\d+\.\d+-\d+\.\d+", v)]  # the plugin takes the last it can read
    return valid[-1] if valid else (f"{stated[-1]!r} (unreadable: the plugin ignores it)" if stated else None)


def show(table: str, plot: str | None = None) -> int:
    """Print the table's rows as the plugin loads them; exit status 1 when the plugin rejects a
    row or refuses the table (each reason printed)."""
    tab, check = plugin_view(Path(table))
    if tab.provenance:
        print("# " + ", ".join(f"{k}={v}" for k, v in tab.provenance.items()))
    if tab.conf:
        print("# nccl.conf: " + " ".join(f"{k}={v}" for k, v in sorted(tab.conf.items())))
    summary = check.summary()
    if Path(table).suffix == ".json":  # the fingerprint printed is of a CSV, never of the JSON: say which
        summary = summary.replace("plugin check:", f"plugin check of {check.source} (written with this JSON):"
                                  if check.source != "<text>" else
                                  "plugin check of the CSV its rows write (no nccl_tuner.csv of the same write "
                                  "beside it; that text's fingerprint):", 1)
    print("# " + summary)
    stated = _stated_versions(Path(table))
    if stated:
        print(f"# NCCL releases its rows mean the same on: {stated} (ncclrl's plugin WARNs on others; from 2.31 a "
              "row's channels cap NCCL's own count, so rows that ask more mean less there)")
    where = "line" if Path(table).suffix != ".json" else "line of the CSV it writes"
    for v in check.rejected:
        print(f"# rejected, {where} {v.line}: {v.message}")
    for line in _differences(tab.rows):
        print(line)
    timed = any(r.time_us and r.default_time_us for r in tab.rows)
    origins = [_origin(r) if r.source else UNKNOWN_LABEL for r in tab.rows]
    print(f"# row: {TUNED_LABEL} = the table's decision; {FILLED_LABEL} = NCCL's own choice for those sizes, "
          "written out (the replica's prediction of it) for plugins that need every size covered; ncclrl's plugin "
          "leaves those sizes to NCCL"
          + (f"; {UNKNOWN_LABEL} = unknown (no JSON written with this CSV)" if UNKNOWN_LABEL in origins else ""))
    print("# sizes in bytes, both ends included; nodes/ranks: the communicator shape (any: every shape)")
    w = max([len(_bytes(x)) for r in tab.rows for x in (r.min_bytes, r.max_bytes)] + [9])
    head = f"{'collective':<14} {'nodes':>5} {'ranks':>5} {'min_bytes':>{w}} {'max_bytes':>{w}}  {'algorithm':<10} " \
        f"{'protocol':<8} {'channels':>8}  {'row':<5}" + ("  predicted speedup" if timed else "")
    print(head.rstrip())
    for r, origin in zip(tab.rows, origins, strict=True):
        extra = f"  {r.default_time_us / r.time_us:.2f}x" if timed and r.time_us and r.default_time_us else ""
        nodes, ranks = ("any" if v == -1 else str(v) for v in (r.nnodes, r.nranks))
        algo = "NCCL's" if r.algo in ("default", "-1") else r.algo
        proto = "NCCL's" if r.proto in ("default", "-1") else r.proto
        ch = str(r.channels) if r.channels > 0 else "NCCL's"
        print(f"{r.collective:<14} {nodes:>5} {ranks:>5} {_bytes(r.min_bytes):>{w}} {_bytes(r.max_bytes):>{w}}  "
              f"{algo:<10} {proto:<8} {ch:>8}  {origin:<5}{extra}".rstrip())
    if plot:
        decision_map(tab.rows, Path(plot), f"{Path(table).name}: {len(tab.rows)} rows")
        print(f"# decision map: {plot}")
    why = failure(check)
    if why:  # the report above is on stdout; the verdict, one line on stderr
        print(f"ncclrl: error: table: {table}: {why}", file=sys.stderr)
        return 1
    return 0


def failure(check: TableCheck) -> str:
    """Why the plugin would not run a table as written (empty: it would)."""
    if check.refused:
        return f"the plugin refuses it whole, NCCL decides everything ({check.refused})"
    if check.rejected:
        first = check.rejected[0]
        return (f"the plugin rejects {plural(len(check.rejected), 'row')} (first, line {first.line}: "
                f"{first.message}); NCCL would run the rest")
    if not check.accepted and not check.nccl_choice:
        return "holds no row: the plugin loads nothing from it (NCCL decides every size)"
    return ""


#: a row narrower than this many octaves (factors of 2) is drawn this wide, with a black outline:
#: on a log axis a one-byte row would otherwise be invisible
MIN_OCTAVES = 0.25
#: channel counts are written on bars at least this many octaves wide (``ncclrl show`` prints all)
LABEL_OCTAVES = 1.0
TOP = MAX_BYTES + 1  # the map runs from 1 B to 4 GiB


def _decision(r: Row) -> str:
    """A row's algorithm/protocol as the legend names it; NCCL's own choice is named as such."""
    auto_a, auto_p = r.algo in ("default", "-1"), r.proto in ("default", "-1")
    if auto_a and auto_p:
        return "NCCL picks algorithm/protocol"
    return f"{'NCCL picks algorithm' if auto_a else r.algo} / {'NCCL picks protocol' if auto_p else r.proto}"


def _octaves(lo: int, hi: int) -> tuple[float, float]:
    """Row ``lo..hi`` (inclusive) as log2 bounds on the map: ``[lo, hi + 1)``, size 0 at 1 B."""
    a = math.log2(max(lo, 1))
    return a, max(a, math.log2(max(hi + 1, 1)))


def _widened(a: float, b: float) -> tuple[float, float, bool]:
    """``[a, b)`` (log2) at least :data:`MIN_OCTAVES` wide, centred where it was, kept on the map."""
    if b - a >= MIN_OCTAVES:
        return a, b, False
    c = min(max((a + b) / 2, MIN_OCTAVES / 2), math.log2(TOP) - MIN_OCTAVES / 2)
    return c - MIN_OCTAVES / 2, c + MIN_OCTAVES / 2, True


def _lanes(rows: list[Row]) -> tuple[list[tuple[str, tuple[int, int]]], bool]:
    """One lane per collective (NCCL's order, then names NCCL does not know) and communicator shape."""
    shapes = list(dict.fromkeys((r.nnodes, r.nranks) for r in rows))
    names = [c for c in N.COLLECTIVES if any(r.collective == c for r in rows)]
    names += [c for c in dict.fromkeys(r.collective for r in rows) if c not in names]
    lanes = [(c, s) for c in names for s in shapes
             if any(r.collective == c and (r.nnodes, r.nranks) == s for r in rows)]
    return lanes, len(shapes) > 1


def _shape(s: tuple[int, int]) -> str:
    if s == (-1, -1):
        return "any shape"
    nodes, ranks = ("any" if v == -1 else v for v in s)
    return f"{nodes} node{'' if nodes == 1 else 's'} x {ranks} rank{'' if ranks == 1 else 's'}"


def size_axis(ax, lo: float = 1, hi: float = TOP, every: int = 4) -> None:
    """A log2 size axis from ``lo`` to ``hi`` bytes: ticks every ``every`` octaves named in B, KiB,
    MiB, GiB (and the ends), a minor tick each octave."""
    from matplotlib.ticker import FixedLocator, NullFormatter

    ax.set_xscale("log", base=2)
    ax.set_xlim(lo, hi)
    k0, k1 = math.ceil(math.log2(lo)), math.floor(math.log2(hi))
    major = sorted({*range(k0, k1 + 1, every), k1})
    if len(major) > 1 and major[-1] - major[-2] < every / 2:
        major.pop(-2)
    ax.set_xticks([2.0 ** k for k in major], [_human(2 ** k) for k in major])
    ax.xaxis.set_minor_locator(FixedLocator([2.0 ** k for k in range(k0, k1 + 1)]))
    ax.xaxis.set_minor_formatter(NullFormatter())


def decision_map(rows: list[Row], path: Path, title: str = "") -> Path:
    """The table as NCCL applies it: one lane per collective (and communicator shape when the table
    names several), a bar per row from ``min_bytes`` to ``max_bytes`` on a log size axis from 1 B to
    4 GiB, coloured by algorithm/protocol, with its channel count; sizes no row covers are drawn
    (hatched) as NCCL's choice. Every row is drawn: one narrower than :data:`MIN_OCTAVES` is drawn
    that wide with a black outline; a row overlapping an earlier one (the first match wins) is drawn
    under it and again as a hatched strip along the lane's bottom. Patches carry ``gid``
    ``row<i>`` (``i``: the row's index in ``rows``), ``row<i>-overlap`` and ``nccl``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    lanes, by_shape = _lanes(rows)
    decisions = sorted({_decision(r) for r in rows if not _decision(r).startswith("NCCL picks algorithm/")})
    palette = [plt.get_cmap("tab10")(i) for i in (0, 1, 2, 3, 4, 5, 6, 8, 9)] + \
        [plt.get_cmap("tab20")(i) for i in range(1, 20, 2)]
    colors = {d: palette[i % len(palette)] for i, d in enumerate(decisions)}
    colors["NCCL picks algorithm/protocol"] = "#9e9e9e"
    gap_style = {"facecolor": "#f4f4f4", "edgecolor": "#8c8c8c", "hatch": "///", "linewidth": 0.5}
    fig, ax = plt.subplots(figsize=(10, 0.55 * max(len(lanes), 1) + 1.9))
    widened = overlapped = gaps = False
    for y, (coll, shape) in enumerate(lanes):
        applies = [(i, r) for i, r in enumerate(rows) if r.collective == coll and
                   ((r.nnodes, r.nranks) == shape or (r.nnodes, r.nranks) == (-1, -1))]
        for lo, hi in uncovered_spans([(r.min_bytes, r.max_bytes) for _, r in applies]):
            a, b = _octaves(lo, hi)
            gaps = True
            ax.barh(y, 2 ** b - 2 ** a, left=2 ** a, height=0.8, zorder=1, **gap_style)[0].set_gid("nccl")
        seen: list[Row] = []
        for i, r in applies:
            if (r.nnodes, r.nranks) != shape:  # an any-shape row has its own lane
                seen.append(r)
                continue
            a, b, wide = _widened(*_octaves(r.min_bytes, r.max_bytes))
            over = any(s.min_bytes <= r.max_bytes and r.min_bytes <= s.max_bytes for s in seen)
            seen.append(r)
            color = colors[_decision(r)]
            bar = ax.barh(y, 2 ** b - 2 ** a, left=2 ** a, height=0.8, color=color, zorder=3 + 1 / (i + 1),
                          edgecolor="black" if wide else "white", linewidth=1.2 if wide else 0.8)[0]
            bar.set_gid(f"row{i}")
            widened |= wide
            if over:
                overlapped = True
                ax.barh(y + 0.3, 2 ** b - 2 ** a, left=2 ** a, height=0.2, color=color, hatch="xxx",
                        edgecolor="black", linewidth=0.6, zorder=6)[0].set_gid(f"row{i}-overlap")
            elif b - a >= LABEL_OCTAVES:
                ax.text(2 ** ((a + b) / 2), y, str(r.channels) if r.channels > 0 else "NCCL", ha="center",
                        va="center", fontsize=7, zorder=7, clip_on=True)
    size_axis(ax)
    ax.set_ylim(len(lanes) - 0.5, -0.5)  # the table's order, top down
    ax.set_yticks(range(len(lanes)),
                  [f"{c}\n({_shape(s)})" if by_shape else c for c, s in lanes], fontsize=9)
    ax.set_xlabel("message size (log scale; a bar spans a row's min_bytes..max_bytes; size 0 is drawn at 1 B)")
    handles = [Patch(color=colors[d], label=d) for d in decisions]
    if any(_decision(r) == "NCCL picks algorithm/protocol" for r in rows):
        handles.append(Patch(color=colors["NCCL picks algorithm/protocol"],
                             label="row: NCCL picks algorithm/protocol"))
    if gaps:
        handles.append(Patch(label="NCCL's choice (no row)", **gap_style))
    if widened:
        handles.append(Patch(facecolor="white", edgecolor="black", linewidth=1.2,
                             label=f"row under {MIN_OCTAVES:g} octave: drawn {MIN_OCTAVES:g} octave wide"))
    if overlapped:
        handles.append(Patch(facecolor="white", edgecolor="black", hatch="xxx",
                             label="row overlapping an earlier row\n(the earlier row wins where both match)"))
    ax.legend(handles=handles, fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1), frameon=False)
    notes = [f"numbers on bars: channels (NCCL: NCCL picks); written on bars at least {LABEL_OCTAVES:g} octave wide",
             "`ncclrl show` prints every row"]
    if by_shape:
        notes.append("blank in a lane of one shape: the row in its 'any shape' lane applies")
    shapes = {s for _, s in lanes}
    where = f" ({_shape(next(iter(shapes)))})" if len(shapes) == 1 and shapes != {(-1, -1)} else ""
    ax.set_title((title or "decision map") + where, fontsize=10)
    fig.text(0.01, 0.005, "; ".join(notes), fontsize=7, color="#444444", ha="left", va="bottom")
    fig.tight_layout(rect=(0, 0.04, 1, 1))
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return Path(path)


@dataclass
class ShowConfig:
    """Print a table (CSV or JSON) back as the plugin loads it, one row a line (communicator shape,
    exact bytes, decision, and whether the row is the table's decision or NCCL's choice written
    out), with every row the plugin rejects and why (exit status 1 then) and what the two plugins
    would read differently, and draw its decision map.

    :param table: nccl_tuner.csv or nccl_tuner.json
    :param plot: write the decision map to this PNG
    """

    table: str = ""
    plot: str | None = None

    def check(self) -> None:
        if not self.table:
            raise ConfigError("table", "required: ncclrl show TABLE")


def main_show(cfg) -> int:
    return show(cfg.table, cfg.plot)


COMMAND = Command("show", ShowConfig, main_show, "print a table (CSV or JSON) back; draw its decision map",
                  positional="table")
register(COMMAND)
