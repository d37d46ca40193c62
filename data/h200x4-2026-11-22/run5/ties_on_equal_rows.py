"""What rows_on_ties keeps where rows are no better than NCCL's choice (docs/live.md, run h200x4-2026-11-22/run5).

Simulated h200-2x2-sock AllReduce, 8 B-1 MiB (18 sizes), budget 2,000, every knob setting alike and
every per-call configuration ``factor`` x NCCL's choice with 6% noise per sample (the platform of
tests/test_noise.py). Prints, per factor and rows_on_ties, whether a setting other than NCCL's
defaults was exported and how many rows its table kept.

    python data/h200x4-2026-11-22/run5/ties_on_equal_rows.py
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "tests"))

from test_noise import _rows_faster_by  # noqa: E402

from agents.finetune import FinetuneConfig, Finetuner, sizes_for  # noqa: E402
from costmodel import nccl as N  # noqa: E402
from costmodel.topology import load_topology  # noqa: E402

topo = load_topology("h200-2x2-sock")
sizes = sizes_for(topo, [N.ALLREDUCE], 8, 1 << 20)
for factor in (1.0, 1.03):
    for ties in (True, False):
        ft = Finetuner(topo, [N.ALLREDUCE], sizes, None, _rows_faster_by(factor),
                       FinetuneConfig(budget=2000, ppo_steps=0, rows_on_ties=ties), log=lambda m: None)
        res = ft.run()
        print(f"rows {factor:.2f}x NCCL's choice, rows_on_ties={ties}: setting other than the defaults "
              f"{any(res.conf.knobs)}, {len(res.rows)} of {len(sizes[N.ALLREDUCE])} rows kept")
