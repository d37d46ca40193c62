"""The composer's training curves from its TensorBoard logs (SB3's logger): mean net value per
episode and its lead over the paired baseline (sweep-then-race on the same problem and noise), per
training seed.

    python docs/results/scripts/compose_curves.py TENSORBOARD_DIR OUT.png
"""

from __future__ import annotations

import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator  # noqa: E402


def main() -> int:
    root, out = Path(sys.argv[1]), Path(sys.argv[2])
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    for run in sorted(p for p in root.iterdir() if p.is_dir()):
        acc = EventAccumulator(str(run))
        acc.Reload()
        for ax, tag in zip(axes, ("compose/net_value", "compose/vs_baseline"), strict=True):
            if tag in acc.Tags()["scalars"]:
                ev = acc.Scalars(tag)
                ax.plot([e.step for e in ev], [e.value for e in ev], label=run.name)
    axes[0].set_title("net value per episode (points)")
    axes[1].set_title("minus sweep-then-race, same problem and noise")
    for ax in axes:
        ax.set_xlabel("training steps (jobs composed)")
        ax.axhline(0, color="grey", lw=0.5)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
