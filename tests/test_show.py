"""The plots a user reads: the decision map (``ncclrl show TABLE plot=``), validate's S-curves and
the benchmark plot, checked through matplotlib's objects (patches, texts, legends), not pixels."""

from __future__ import annotations

import io
import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402

from ncclrl.costmodel.table import MAX_BYTES, Row, Table  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
PLUGIN = REPO / "docs" / "results" / "plugin"


@pytest.fixture
def figures(monkeypatch):
    """The figures a plotting function closes, kept open for the test to read."""
    kept: list = []
    close = plt.close
    monkeypatch.setattr(plt, "close", lambda fig=None: kept.append(fig))
    yield kept
    for f in kept:
        close(f)


def _map(rows, tmp_path, figures):
    from ncclrl.runners.show import decision_map

    decision_map(rows, tmp_path / "map.png", "t")
    assert (tmp_path / "map.png").stat().st_size > 0
    (fig,) = figures
    return fig.axes[0]


def _row_patches(ax):
    return {p.get_gid(): p for p in ax.patches if (p.get_gid() or "").startswith("row")}


def _log2_extent(p):
    return math.log2(p.get_x()), math.log2(p.get_x() + p.get_width())


def test_decision_map_draws_every_row_from_one_byte(tmp_path, figures):
    """Rows below 32 KiB, one-byte rows and a row of size 0 alone are all drawn, at least
    MIN_OCTAVES wide on an axis that starts at 1 B; each bar covers its row."""
    from ncclrl.runners.show import MIN_OCTAVES

    rows = [Row("allreduce", 0, 0, "ring", "ll", 1), Row("allreduce", 1, 1, "tree", "ll", 2),
            Row("allreduce", 2, 1023, "ring", "ll", 4), Row("allreduce", 4096, 4096, "ring", "ll128", 8),
            Row("allreduce", 1 << 20, (1 << 20) + 1, "ring", "simple", 8),
            Row("allreduce", MAX_BYTES, MAX_BYTES, "ring", "simple", 24),
            Row("allgather", 0, 32767, "ring", "ll", 1), Row("allgather", 32768, MAX_BYTES, "ring", "simple", 2)]
    ax = _map(rows, tmp_path, figures)
    lo, hi = ax.get_xlim()
    assert lo <= 1 and hi >= MAX_BYTES
    bars = _row_patches(ax)
    assert set(bars) == {f"row{i}" for i in range(len(rows))}
    for i, r in enumerate(rows):
        a, b = _log2_extent(bars[f"row{i}"])
        assert b - a >= MIN_OCTAVES - 1e-9 and lo <= 2 ** a and 2 ** b <= hi * (1 + 1e-9)
        want_a, want_b = math.log2(max(r.min_bytes, 1)), math.log2(r.max_bytes + 1)
        if want_b - want_a >= MIN_OCTAVES:  # wide rows: exactly their sizes
            assert (a, b) == pytest.approx((want_a, want_b))
        else:  # narrow ones: widened around them
            assert a <= want_a + 1e-9 or a <= MIN_OCTAVES and b >= want_b - 1e-9
    assert _log2_extent(bars["row6"]) == pytest.approx((0, 15))  # allgather 0..32 KiB - 1: drawn from 1 B
    # the lanes follow NCCL's order, top down, named once each and never overprinted
    labels = [t.get_text() for t in ax.get_yticklabels()]
    assert labels == ["allgather", "allreduce"]
    for t in ax.texts:
        assert t.get_clip_on() and lo <= t.get_position()[0] <= hi


def test_decision_map_draws_ncclrl_choice_and_never_minus_one(tmp_path, figures):
    """Sizes no row covers are drawn as NCCL's choice; a -1/-1 row is named for what it is."""
    tab = Table.read(PLUGIN / "table-h200-1x4-handmade.csv")
    assert any(r.algo in ("-1", "default") for r in tab.rows)
    ax = _map(tab.rows, tmp_path, figures)
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert not any("-1" in t for t in legend)
    assert "NCCL's choice (no row)" in legend and any("NCCL picks" in t for t in legend)
    gaps = [p for p in ax.patches if p.get_gid() == "nccl"]
    # allreduce 4 MiB..16 MiB and 1 GiB..4 GiB, allgather 64 KiB..1 MiB and 64 MiB..4 GiB, reducescatter 0..4 KiB
    # and 1 MiB..4 GiB; broadcast is covered
    assert len(gaps) == 6
    assert any(_log2_extent(p) == pytest.approx((0, 12)) for p in gaps)  # reducescatter below 4 KiB
    assert len(_row_patches(ax)) == len(tab.rows)
    assert not any(t.get_text() in ("-1", "0") for t in ax.texts)


def test_decision_map_overlapping_rows_and_shapes(tmp_path, figures):
    """A row an earlier row overlaps is still drawn (a strip of its own); several shapes get a lane
    each; a collective NCCL does not name keeps its rows."""
    rows = [Row("allreduce", 0, 8191, "tree", "ll", 2, nnodes=1, nranks=4),
            Row("allreduce", 4096, 4096, "ring", "ll", 4, nnodes=1, nranks=4),
            Row("allreduce", 0, MAX_BYTES, "ring", "simple", -1, nnodes=2, nranks=8),
            Row("alltoall", 64, 1023, "ring", "simple", 4, nnodes=1, nranks=4)]
    ax = _map(rows, tmp_path, figures)
    bars = _row_patches(ax)
    assert {"row0", "row1", "row1-overlap", "row2", "row3"} == set(bars)
    labels = [t.get_text() for t in ax.get_yticklabels()]
    assert labels == ["allreduce\n(1 node x 4 ranks)", "allreduce\n(2 nodes x 8 ranks)", "alltoall\n(1 node x 4 ranks)"]
    assert "NCCL" in [t.get_text() for t in ax.texts]  # channels left to NCCL


def test_show_plot_writes_the_map(tmp_path, capsys):
    from ncclrl.runners.cli import main

    assert main(["show", str(PLUGIN / "table-h200-2x2-sock-exported.csv"), f"plot={tmp_path / 'm.png'}"]) == 0
    assert (tmp_path / "m.png").stat().st_size > 0 and "decision map" in capsys.readouterr().out


def _judged(jobs: int = 3, df_: int = 4) -> pd.DataFrame:
    sizes = [8 << i for i in range(10)]
    speed = [1.6, 1.5, 1.3, 1.2, 1.0, 1.0, 0.9, 1.1, 1.4, 2.0]
    rows = []
    for n, s in zip(sizes, speed, strict=True):
        base = 20 + n / 1e3
        rows.append({"topology": "h200-1x4", "collective": "allreduce", "nbytes": n, "base_us": base,
                     "tuned_us": base / s, "speedup": s, "speedup_lo": s * 0.95, "speedup_hi": s * 1.05,
                     "verdict": "faster" if s > 1.06 else "slower" if s < 0.94 else "same", "jobs": jobs,
                     "sigma_between": 0.05 if df_ else 0.0, "df": df_, "base_busbw_gbps": n / base / 1e3,
                     "tuned_busbw_gbps": n * s / base / 1e3, "table_sha256_12": "x"})
    return pd.DataFrame(rows)


def test_scurves_have_bands_a_speedup_panel_and_say_what_was_measured(tmp_path, figures):
    from ncclrl.runners.validate import plot_scurves

    plot_scurves(_judged(), tmp_path / "v.png", "t.csv vs NCCL's defaults", "fresh jobs: 3 per side")
    (fig,) = figures
    assert "fresh jobs: 3 per side" in fig._suptitle.get_text()
    top, bot = fig.axes
    bands = {c.get_gid(): c for ax in fig.axes for c in ax.collections if c.get_gid()}
    assert {"band-base", "band-tuned", "band-speedup"} <= set(bands)
    for side, curve in zip(("base", "tuned"), top.get_lines()[:2], strict=True):  # a band around each curve
        v = bands[f"band-{side}"].get_paths()[0].vertices
        at = v[np.isclose(v[:, 0], curve.get_xdata()[3])][:, 1]
        assert at.min() < curve.get_ydata()[3] < at.max()
    assert sum("95% interval (median \u00b1" in t.get_text() for t in top.get_legend().get_texts()) == 2
    assert bot.get_gid() == "speedup" and any(abs(line.get_ydata()[0] - 1) < 1e-12 and len(set(line.get_ydata())) == 1
                                              for line in bot.get_lines())  # the line at 1
    assert bot.get_xlim()[0] <= 8 and "speedup" in bot.get_ylabel()
    sp = [line for line in bot.get_lines() if line.get_label() == "NCCL's time / table's time"][0]
    assert list(sp.get_ydata())[:2] == [1.6, 1.5]  # the small-size gains are on the plot
    legend = [t.get_text() for t in bot.get_legend().get_texts()]
    assert any("95% interval" in t for t in legend) and "faster (7)" in legend


def test_scurves_with_one_job_a_side_say_there_is_no_between_job_band(tmp_path, figures):
    from ncclrl.runners.validate import plot_scurves

    plot_scurves(_judged(jobs=1, df_=0), tmp_path / "v.png", "t", "stored jobs")
    (fig,) = figures
    top, bot = fig.axes
    assert any("no between-job band" in t.get_text() for t in top.get_legend().get_texts())
    assert any("within-job" in t.get_text() for t in bot.get_legend().get_texts())


@pytest.mark.parametrize("measure", [True, False])
def test_validate_titles_carry_fresh_or_stored(tmp_path, figures, measure):
    """run_validate names what it judged: fresh jobs, or stored jobs pooled from the store."""
    from test_sweep_store import FakeTableWorkers

    from ncclrl.costmodel.simulator import Simulator
    from ncclrl.runners.validate import parse_args, run_validate

    table = tmp_path / "t.csv"
    table.write_text("allreduce,0,max,ring,simple,2,-1,-1\n")
    sim = Simulator("h200-2x2-sock", seed=0)
    common = [f"table={table}", "topology=h200-2x2-sock", "max_bytes=64K", f"store={tmp_path / 's.sqlite'}",
              f"out={tmp_path / 'v.csv'}"]
    run_validate(parse_args(common + ["rounds=2"]), out=io.StringIO(),
                 workers_factory=lambda k, t: FakeTableWorkers(k, t, sim))
    if not measure:
        figures.clear()
        run_validate(parse_args(common + ["measure=0"]), out=io.StringIO())
    title = figures[-1]._suptitle.get_text()
    assert ("fresh jobs" in title) == measure and ("stored jobs" in title) == (not measure)
    assert "t.csv" in title and (tmp_path / "v.png").stat().st_size > 0


def _results() -> pd.DataFrame:
    """A benchmark's results: 2 sets x 3 problems x 2 seeds, 3 methods, 2 budgets (a sweep's GPU-time
    differs per set), ``default`` measuring nothing."""
    rng = np.random.default_rng(0)
    rows = []
    for st, sweep_s in (("lofo", 600.0), ("replay", 6000.0)):
        for p in range(3):
            for seed in range(2):
                for m in ("jobs", "sweep", "default"):
                    for b, f in (("0.5sweep", 0.5), ("1sweep", 1.0)):
                        spent = 0.0 if m == "default" else f * sweep_s * 0.98
                        frac = 0.7 if m == "default" else 0.8 + 0.1 * f + 0.02 * rng.standard_normal()
                        rows.append({"set": st, "problem": f"p{p}", "seed": seed, "method": m, "budget": b,
                                     "budget_gpu_s": f * sweep_s, "gpu_s": spent, "points": 100 * (m != "default"),
                                     "jobs": 5 * (m != "default"), "model_evals": 0, "fraction": frac,
                                     "speedup": frac * 2, "optimum": 2.0, "worst": 0.9, "slower": 1, "wall_s": 0.1})
    return pd.DataFrame(rows)


def test_benchmark_plot_intervals_budgets_and_paired_differences(tmp_path, figures):
    """Per set: every method's fraction against the GPU-minutes budgeted (log x, each budget's
    ticks naming it and its GPU-minutes), the reference's paired differences below, methods at a
    budget apart, and a legend naming a method that measures nothing."""
    from ncclrl.runners.benchmark import plot, summarize

    s = summarize(_results(), "jobs")
    plot(s, tmp_path / "b.png", "jobs")
    (fig,) = figures
    sets, methods = list(dict.fromkeys(s["set"])), list(dict.fromkeys(s["method"]))
    axes = np.array(fig.axes).reshape(-1, len(sets))  # the curves, the paired differences, the slower-size grid
    assert len(axes) == 3
    assert [a.get_images()[0].get_gid() for a in axes[2]] == [f"slower:{st}" for st in sets]
    for k, st in enumerate(sets):
        top, bot = axes[0][k], axes[1][k]
        assert top.get_title().startswith(f"{st}: ") and top.get_xscale() == "log"
        gids = {c.get_gid() for c in top.collections}
        assert {f"fraction:{m}" for m in methods} <= gids
        assert {f"diff:{m}" for m in methods if m != "jobs"} <= {c.get_gid() for c in bot.collections}
        minutes = {"lofo": (5, 10), "replay": (50, 100)}[st]
        assert [t.get_text() for t in bot.get_xticklabels()] == [f"0.5sweep\n{minutes[0]:.3g}",
                                                                  f"1sweep\n{minutes[1]:.3g}"]
        # a budget's methods sit apart: no two error bars on the same x
        xs = [seg[0][0] for c in top.collections if (c.get_gid() or "").startswith("fraction:")
              for seg in c.get_segments()]
        assert len(xs) == len(set(np.round(xs, 6)))
    labels = [t.get_text() for t in fig.legends[0].get_texts()]
    assert len(labels) == len(methods) and any("measures nothing" in t for t in labels)


# -- ncclrl show: what it says about one table, and about the checker it builds ------------------------

@pytest.fixture(scope="module")
def exported(tmp_path_factory) -> Path:
    """A zero-shot table written as the export writes it (CSV, JSON, nccl.conf, manifest)."""
    from ncclrl.agents.export import export_table
    from ncclrl.costmodel.simulator import Simulator

    out = tmp_path_factory.mktemp("exported") / "table"
    export_table(Simulator("h200-1x4")).write(out)
    return out


def test_show_prints_one_fingerprint_per_table_the_one_in_its_manifest(exported, tmp_path, capsys):
    """The CSV, its manifest and the JSON of the same write: one fingerprint, the deployed CSV's; a JSON
    with no CSV of its write beside it says its fingerprint is of the text its rows write."""
    import json
    import shutil

    from ncclrl.runners.show import show

    manifest = json.loads((exported / "nccl_tuner.manifest").read_text())
    for name in ("nccl_tuner.csv", "nccl_tuner.json"):
        assert show(str(exported / name)) == 0
        line = next(ln for ln in capsys.readouterr().out.splitlines() if "fingerprint" in ln)
        assert f"fingerprint {manifest['fingerprint']}," in line, line
    lone = tmp_path / "nccl_tuner.json"
    shutil.copy(exported / "nccl_tuner.json", lone)
    assert show(str(lone)) == 0
    line = next(ln for ln in capsys.readouterr().out.splitlines() if "fingerprint" in ln)
    assert line.startswith("# plugin check of the CSV its rows write (no nccl_tuner.csv of the same write")


@pytest.mark.parametrize("text,needle", [("", "holds no row"), ("hello\n", "the plugin rejects 1 row (first, line 1:")])
def test_show_of_a_table_the_plugin_would_not_run_says_so_on_stderr(tmp_path, capsys, text, needle):
    from ncclrl.runners.show import show

    path = tmp_path / "t.csv"
    path.write_text(text)
    assert show(str(path)) == 1
    out, err = capsys.readouterr()
    assert "# plugin check:" in out  # the report, on stdout
    assert err.count("\n") == 1 and err.startswith(f"ncclrl: error: table: {path}: ") and needle in err, err


def test_the_checker_is_compiled_out_loud_once_and_a_failed_build_leaves_no_folder(tmp_path, caplog, monkeypatch):
    import logging
    import os

    from ncclrl.costmodel.errors import ConfigError
    from ncclrl.costmodel.table import CHECKER, plugin_checker

    with caplog.at_level(logging.INFO, logger="ncclrl.costmodel.table"):
        assert plugin_checker(tmp_path / "a" / "b") == tmp_path / "a" / "b" / CHECKER
        said = [r.getMessage() for r in caplog.records if "compiling the table checker" in r.getMessage()]
        assert len(said) == 1 and str(tmp_path / "a" / "b") in said[0]
        caplog.clear()
        plugin_checker(tmp_path / "a" / "b")  # up to date: nothing compiled, nothing said
        assert not [r for r in caplog.records if "compiling" in r.getMessage()]
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "make").write_text("#!/bin/sh\nfor a; do case $a in BUILD=*) mkdir -p \"${a#BUILD=}\";; esac; done\n"
                               "echo 'cc: not found' >&2; exit 2\n")
    (fake / "make").chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake}{os.pathsep}{os.environ['PATH']}")
    with pytest.raises(ConfigError, match="building the table checker failed: cc: not found"):
        plugin_checker(tmp_path / "new" / "deep")
    assert not (tmp_path / "new").exists()
    with pytest.raises(ConfigError):
        plugin_checker(tmp_path / "a" / "b")  # a folder that was there stays
    assert (tmp_path / "a" / "b" / CHECKER).is_file()
