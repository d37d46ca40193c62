"""The composer's training curves from its TensorBoard logs (SB3's logger): mean net value per
episode and its lead over the paired baseline (sweep-then-race on the same problem and noise), per
training seed (:func:`ncclrl.agents.plots.plot_composer_curves`).

    python docs/results/scripts/compose_curves.py TENSORBOARD_DIR OUT.png
"""

from __future__ import annotations

import sys

from ncclrl.agents.plots import plot_composer_curves


def main() -> int:
    print(plot_composer_curves(sys.argv[1], sys.argv[2])["path"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
