"""The plots a run leaves for people (ncclrl.agents.plots, the benchmark plot, the S-curves): each
writes a PNG of a sane size from small inputs, names sizes as people write them, marks the sizes
made slower and points its ratios the way its numbers do. Checked through matplotlib's objects and
the summaries the functions return, not pixels."""

from __future__ import annotations

import struct
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402
import test_show  # noqa: E402

from ncclrl.agents import plots as P  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
figures = test_show.figures  # the figures a plotting function closes, kept open for the test to read


def png_size(path: Path) -> tuple[int, int]:
    """Width and height of a PNG, from its header."""
    head = Path(path).read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">II", head[16:24])


def sane(path: Path, most_wide: float = 2.4) -> None:
    w, h = png_size(path)
    assert 800 <= w <= 2600 and 500 <= h <= 2600, (w, h)
    assert 0.7 <= w / h <= most_wide, (w, h)  # no strip


def labels(ax) -> list[str]:
    return [t.get_text() for t in ax.get_xticklabels()]


def by_gid(fig, gid: str) -> list:
    return [a for ax in fig.axes for a in [*ax.get_lines(), *ax.collections, *ax.images] if a.get_gid() == gid]


def test_size_axis_names_sizes_as_people_write_them():
    fig, ax = plt.subplots()
    P.size_axis(ax, 8, 1 << 30)
    assert labels(ax) == ["8 B", "1 KiB", "32 KiB", "1 MiB", "32 MiB", "1 GiB"]
    P.size_axis(ax, 8, 256 << 20, pad=0.5)
    assert labels(ax)[0] == "8 B" and labels(ax)[-1] == "256 MiB" and ax.get_xlim()[0] < 8
    plt.close(fig)


SIZES = [8 << i for i in range(10)]  # 8 B .. 4 KiB


def _changes() -> list[dict]:
    """A tuning run's per size: finetune's rows (their confirmation's speedup and interval) at
    four sizes, one of them slower beyond its interval; the other sizes left to NCCL."""
    return [{"collective": "allreduce", "nbytes": 8, "key": "tree/ll/1", "speedup_vs_nccl_defaults": [1.8, 1.4, 2.3]},
            {"collective": "allreduce", "nbytes": 64, "key": "ring/ll/2", "speedup_vs_nccl_defaults": [0.7, 0.6, 0.85]},
            {"collective": "allreduce", "nbytes": 128, "key": "ring/ll/2", "speedup_vs_nccl_defaults": [1.1, 0.9, 1.3]},
            {"collective": "allreduce", "nbytes": 1024, "key": "tree/ll/2", "nccl_time_us": 30.0, "time_us": 20.0}]


def test_size_changes_reads_what_runs_write_and_adds_the_sizes_left_to_nccl():
    from ncclrl.costmodel import nccl as N

    ch = P.size_changes(_changes(), {N.COLLECTIVES.index("allreduce"): SIZES})
    assert [c.nbytes for c in ch] == SIZES
    by = {c.nbytes: c for c in ch}
    assert (by[64].speedup, by[64].lo, by[64].hi, by[64].slower) == (0.7, 0.6, 0.85, True)
    assert by[128].slower is False and by[128].faster is False  # its interval contains 1
    assert by[1024].speedup == pytest.approx(1.5) and by[1024].lo is None and by[1024].faster
    assert not by[16].changed and by[16].speedup is None and by[16].value == 1.0
    assert sum(c.changed for c in ch) == 4
    # sizes_on_sweep's records (a speedup at every size) with the rows that changed
    ch = P.size_changes([{"collective": "allreduce", "nbytes": s, "speedup": 0.98} for s in SIZES],
                        changed=[("allreduce", 8)])
    assert [c.changed for c in ch] == [True] + [False] * 9 and all(c.slower for c in ch)
    # finetune's replayed check: a speedup with its interval at every size, ``row`` where the table has one
    (c,) = P.size_changes([{"collective": "allreduce", "nbytes": 8, "speedup": 1.2, "lo": 1.1, "hi": 1.3,
                            "row": False}])
    assert not c.changed and c.faster


def test_changed_by_table_leaves_out_rows_marked_as_nccl_choice():
    text = "allreduce,0,63,tree,ll,1,-1,-1\n#ncclrl:nccl-choice\nallreduce,64,1023,ring,ll,1,-1,-1\n"
    got = P.changed_by_table(text, [("allreduce", s) for s in SIZES])
    assert got == {("allreduce", 8), ("allreduce", 16), ("allreduce", 32)}


def test_table_change_marks_the_slower_sizes_and_states_gain_and_worst(tmp_path, figures):
    ch = P.size_changes(_changes(), {"allreduce": SIZES})
    s = P.plot_table_change(ch, tmp_path / "t.png", "finetune's table", "confirmation jobs")
    sane(tmp_path / "t.png")
    (fig,) = figures
    assert s.slower == [("allreduce", 64)] and s.measured
    info = s.collectives["allreduce"]
    assert info["changed"] == 4 and info["slower"] == [64] and info["worst"].nbytes == 64
    gm = float(np.exp(np.mean(np.log([1.8, 0.7, 1.1, 1.5] + [1.0] * 6))))
    assert info["geomean"] == pytest.approx(gm)
    (ax,) = [a for a in fig.axes if a.get_visible()]
    title = ax.get_title()
    assert f"{gm:.2f}x geometric mean" in title and "4 changed, 1 slower" in title and "worst size 64 B 0.70x" in title
    (red,) = by_gid(fig, "slower:allreduce")
    assert list(red.get_xdata()) == [64] and red.get_color() == P.SLOWER_COLOR
    left = by_gid(fig, "nccl:allreduce")
    assert sorted(x for line in left for x in line.get_xdata()) == [16, 32, 256, 512, 2048, 4096]
    assert {y for line in left for y in line.get_ydata()} == {1.0}  # rows left to NCCL at 1x
    assert by_gid(fig, "interval:allreduce")
    assert any(t.get_text() == "64 B" for t in ax.texts)  # the slower size is named
    assert labels(ax)[0] == "8 B" and "KiB" in labels(ax)[-1]
    assert "measured" in fig._suptitle.get_text() and "predicted" not in fig._suptitle.get_text()


def test_table_change_of_a_prediction_says_so_and_counts_slower_without_interval(tmp_path, figures):
    df = pd.DataFrame({"collective": "broadcast", "nbytes": SIZES, "nccl": "ring/ll/1",
                       "ours": ["ring/ll/1"] * 5 + ["tree/ll/1"] * 5,
                       "default_time_us": 10.0, "time_us": [10.0] * 4 + [10.5] + [8.0] * 5})
    s = P.plot_table_change(P.changes_from_evaluation(df), tmp_path / "p.png")
    (fig,) = figures
    assert "predicted (simulator)" in fig._suptitle.get_text() and not s.measured
    # the knobs slowed a size the table leaves to NCCL: still red, drawn hollow
    assert s.slower == [("broadcast", 128)]
    (red,) = by_gid(fig, "slower:broadcast")
    assert red.get_markerfacecolor() == "white"


def test_s_curve_is_marked_predicted_keeps_nccls_line_visible_and_marks_slower_sizes(tmp_path, figures):
    from ncclrl.agents.evaluate import s_curve_plot
    from ncclrl.costmodel.simulator import Simulator

    sizes = np.array([1 << k for k in range(3, 31)])
    rows = []
    for coll in ("allgather", "allreduce"):
        t_def = 10 + sizes / 1e4
        t_tab = t_def / np.where(sizes < 1024, 1.0, np.where(sizes < 8192, 0.8, 2.0))
        rows.append(pd.DataFrame({"collective": coll, "nbytes": sizes, "default_time_us": t_def, "time_us": t_tab,
                                  "optimum_time_us": np.minimum(t_tab, t_def) * 0.95}))
    df = pd.concat(rows, ignore_index=True)
    df["speedup"] = df["default_time_us"] / df["time_us"]
    df["optimum_speedup"] = df["default_time_us"] / df["optimum_time_us"]
    path = s_curve_plot(df, Simulator("h200-2x2-sock"), tmp_path / "s_curve.png")
    sane(path)
    (fig,) = figures
    assert "Predicted (simulator)" in fig._suptitle.get_text()
    for coll in ("allgather", "allreduce"):
        (nccl,) = by_gid(fig, f"nccl:{coll}")
        (table,) = by_gid(fig, f"table:{coll}")
        assert nccl.get_zorder() > table.get_zorder() and nccl.get_marker() not in (None, "None", "")
        assert nccl.get_linestyle() != table.get_linestyle()
        (red,) = by_gid(fig, f"slower:{coll}")
        assert list(red.get_xdata()) == [1024, 2048, 4096]
    bottom = [ax for ax in fig.axes if ax.get_xlabel()]
    assert bottom and all(labels(ax)[0] == "8 B" and labels(ax)[-1] == "1 GiB" for ax in bottom)
    assert all("GB/s" in ax.get_ylabel() for ax in fig.axes if not ax.get_xlabel())


def test_step_times_ratio_points_the_way_the_step_times_do(tmp_path, figures):
    """Pooled medians and the rounds' ratio can disagree; the plot states the sides' step times
    that the ratio is made of, so its ratio and its lines agree."""
    from ncclrl.runners import e2e

    default = [[10.0] * 5, [20.0] * 5]  # pooled median 15; geometric mean of job medians 14.14
    table = [[14.5] * 5, [14.5] * 5]  # shorter than 15 pooled, longer than 14.14
    s = e2e.summarize(default, table, n_boot=50)
    steps = [{"mode": "ddp", "job": j, "side": side, "step_time_ms": x}
             for j, (side, job) in enumerate(zip(["default", "table", "table", "default"],
                                                 [default[0], table[0], table[1], default[1]], strict=True))
             for x in job]
    r = P.plot_step_times(steps, tmp_path / "e.png", {"ddp": s})
    sane(tmp_path / "e.png")
    (fig,) = figures
    c = r["ddp"]["centers_ms"]
    assert r["ddp"]["ratio"] == pytest.approx(c["table"] / c["default"]) == pytest.approx(s["ratio"]["value"])
    assert r["ddp"]["ratio"] > 1 and c["table"] > c["default"]
    title = fig.axes[0].get_title()
    assert "table / NCCL's defaults = 1.025" in title and "longer" in title
    assert {line.get_gid() for line in fig.axes[0].get_lines()} >= {"center:default", "center:table"}


def _results() -> pd.DataFrame:
    """A benchmark's results: one set, 3 problems x 2 seeds, 3 methods, 2 budgets; ``sweep`` leaves
    sizes slower, ``jobs`` (the reference) none."""
    rows = []
    for p in range(3):
        for seed in range(2):
            for m in ("sweep", "default", "jobs"):
                for b, f in (("0.5sweep", 0.5), ("1sweep", 1.0)):
                    rows.append({"set": "replay", "problem": f"p{p}", "seed": seed, "method": m, "budget": b,
                                 "budget_gpu_s": f * 600, "gpu_s": 0.0 if m == "default" else f * 590,
                                 "points": 0 if m == "default" else 100, "jobs": 0 if m == "default" else 5,
                                 "model_evals": 0, "fraction": 0.6 + 0.1 * f + 0.01 * p + 0.1 * (m == "sweep"),
                                 "speedup": 1.5, "optimum": 2.0, "worst": 0.5 if m == "sweep" else 1.0,
                                 "slower": 3 + p if m == "sweep" else 0, "wall_s": 0.1})
    return pd.DataFrame(rows)


def test_benchmark_plot_draws_the_reference_strongest_and_the_sizes_made_slower(tmp_path, figures):
    from ncclrl.runners.benchmark import plot, summarize

    s = summarize(_results(), "jobs")
    plot(s, tmp_path / "b.png", "jobs")
    sane(tmp_path / "b.png")
    (fig,) = figures
    handles, names = fig.axes[0].get_legend_handles_labels()
    lines = {name.split(" ")[0]: h.lines[0] for h, name in zip(handles, names, strict=True)}
    assert set(lines) == {"sweep", "NCCL's", "jobs"} and "(reference)" in names[-1]
    assert lines["jobs"].get_color() == "black" and lines["jobs"].get_zorder() == max(
        line.get_zorder() for line in lines.values())
    assert lines["jobs"].get_linewidth() > max(lines[m].get_linewidth() for m in ("sweep", "NCCL's"))
    (grid,) = by_gid(fig, "slower:replay")
    ax = grid.axes
    texts = [t.get_text() for t in ax.texts]
    assert "5, worst 0.50x" in texts and texts.count("0") == 4  # sweep: at most 5 sizes slower; the others none
    assert [t.get_text() for t in ax.get_yticklabels()] == ["sweep", "default", "jobs"]
    assert any("GPU-minutes" in a.get_xlabel() for a in fig.axes)
    assert any("slower" in a.get_title() for a in fig.axes)


def test_composer_curves_from_a_progress_csv_and_from_tensorboard(tmp_path, figures):
    csv = tmp_path / "progress.csv"
    steps = np.arange(1, 21) * 1000
    pd.DataFrame({"time/total_timesteps": steps, "compose/net_value": np.linspace(-1, 8, 20),
                  "compose/vs_baseline": np.linspace(-3, 4, 20)}).to_csv(csv, index=False)
    r = P.plot_composer_curves(csv, tmp_path / "c.png")
    sane(tmp_path / "c.png", most_wide=3.0)
    (fig,) = figures
    assert set(r["runs"][tmp_path.name]) == {"compose/net_value", "compose/vs_baseline"}
    assert all("points" in ax.get_ylabel() and "training steps" in ax.get_xlabel() for ax in fig.axes)
    r = P.plot_composer_curves(REPO / "docs" / "results" / "composer" / "tensorboard", tmp_path / "tb.png")
    assert len(r["runs"]) == 2 and all(len(v) == 2 for v in r["runs"].values())
