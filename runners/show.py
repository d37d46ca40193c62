"""``ncclrl show TABLE``: print an exported table back, with a decision map plot."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ncclrl.costmodel import nccl as N
from ncclrl.costmodel.errors import ConfigError
from ncclrl.costmodel.table import Row, Table
from ncclrl.runners.config import Command, register


def _human(n: int) -> str:
    for unit, f in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= f:
            return f"{n / f:g} {unit}"
    return f"{n} B"


def show(table: str, plot: str | None = None) -> int:
    tab = Table.read(table)
    if tab.provenance:
        print("# " + ", ".join(f"{k}={v}" for k, v in tab.provenance.items()))
    if tab.conf:
        print("# nccl.conf: " + " ".join(f"{k}={v}" for k, v in sorted(tab.conf.items())))
    timed = bool(tab.rows) and all(r.time_us and r.default_time_us for r in tab.rows)
    print(f"{'collective':<14} {'from':>10} {'to':>10}  {'algorithm':<10} {'protocol':<8} {'channels':>8}"
          + ("  predicted speedup" if timed else ""))
    for r in tab.rows:
        extra = f"  {r.default_time_us / r.time_us:.2f}x" if timed else ""
        print(f"{r.collective:<14} {_human(r.min_bytes):>10} {_human(r.max_bytes):>10}  {r.algo:<10} "
              f"{r.proto:<8} {r.channels:>8}{extra}")
    if plot:
        decision_map(tab.rows, Path(plot))
        print(f"# decision map: {plot}")
    return 0


def decision_map(rows: list[Row], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colls = [c for c in N.COLLECTIVES if any(r.collective == c for r in rows)]
    labels = sorted({f"{r.algo}/{r.proto}" for r in rows})
    cmap = plt.get_cmap("tab10")
    fig, ax = plt.subplots(figsize=(9, 0.6 * len(colls) + 1.2))
    for y, c in enumerate(colls):
        for r in (r for r in rows if r.collective == c):
            lo, hi = max(r.min_bytes, 1), r.max_bytes + 1
            color = cmap(labels.index(f"{r.algo}/{r.proto}") % 10)
            ax.barh(y, hi - lo, left=lo, color=color, edgecolor="white")
            ax.text((lo * hi) ** 0.5, y, str(r.channels), ha="center", va="center", fontsize=7)
    ax.set_xscale("log", base=2)
    ax.set_yticks(range(len(colls)), colls)
    ax.set_xlabel("message size (bytes); bar labels: channels")
    handles = [plt.Rectangle((0, 0), 1, 1, color=cmap(i % 10)) for i in range(len(labels))]
    ax.legend(handles, labels, fontsize=7, loc="upper left", bbox_to_anchor=(1, 1))
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


@dataclass
class ShowConfig:
    """Print an exported table (CSV or JSON) back, one row a line, and draw its decision map.

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
