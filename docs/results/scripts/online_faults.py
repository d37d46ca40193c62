"""The online mode's fault table: every fault of ncclrl.envs.online_harness, and a coordinator that
dies inside its GO (tests/fakes/half_go_coordinator.py: the GO reaches one rank, or none), on the
recorded DDP and FSDP call sequences, plain and under AddressSanitizer + UndefinedBehaviorSanitizer,
over seeds.

    python docs/results/scripts/online_faults.py --seeds 14 --out docs/results/online

Writes faults.csv (one row per job) and faults.md (the table: jobs, hangs, divergent decisions,
crashes, and what the coordinator did), and prints the table.
"""

from __future__ import annotations

import argparse
import csv
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from ncclrl.envs.online_harness import FAULTS, run_job

ROOT = Path(__file__).resolve().parents[3]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--out", default=str(ROOT / "docs" / "results" / "online"))
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    build = Path(tempfile.mkdtemp(prefix="online-faults-"))
    subprocess.run(["make", "-s", "-C", str(ROOT / "plugin"), f"BUILD={build}", "online", "online-asan"], check=True)
    rows = []
    fake = [sys.executable, str(ROOT / "tests" / "fakes" / "half_go_coordinator.py")]
    cases = [(f, None, "") for f in FAULTS] + [("coordinator-dies-in-go", fake, "one"),
                                             ("coordinator-dies-before-go", fake, "none")]
    for fault, argv, go_to in cases:
        os.environ["GO_TO"] = go_to
        for job in ("ddp", "fsdp"):
            for sanitized in (False, True):
                for seed in range(a.seeds):
                    with tempfile.TemporaryDirectory() as work:
                        o = run_job(build, Path(work), fault if argv is None else "none", ranks=a.ranks, job=job,
                                    steps=40, seed=seed, sanitized=sanitized, pace_us=1000, coordinator_argv=argv)
                    rows.append({"fault": fault, "job": job, "sanitized": int(sanitized), "seed": seed,
                                 "ranks": a.ranks, "calls": o.calls, "hung": int(o.hung),
                                 "divergent": int(o.divergent), "crashed": int(o.crashed),
                                 "verdicts": o.verdicts, "commits": o.commits, "freezes": o.freezes,
                                 "ranks_frozen": o.ranks_frozen, "wall_s": o.wall_s})
                    print(fault, job, sanitized, seed, o.hung, o.divergent, o.crashed, o.commits, o.freezes,
                          file=sys.stderr, flush=True)
    with open(out / "faults.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]), lineterminator="\n")
        w.writeheader()
        w.writerows(rows)
    lines = ["| fault | jobs | hangs | divergent | crashes | jobs with a commit | jobs the coordinator froze | "
             "ranks that froze (of all) | wall s (max) |", "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for fault, _, _ in cases:
        r = [x for x in rows if x["fault"] == fault]
        lines.append(f"| {fault} | {len(r)} | {sum(x['hung'] for x in r)} | {sum(x['divergent'] for x in r)} | "
                     f"{sum(x['crashed'] for x in r)} | {sum(x['commits'] > 0 for x in r)} | "
                     f"{sum(x['freezes'] > 0 for x in r)} | {sum(x['ranks_frozen'] for x in r)} of "
                     f"{sum(x['ranks'] for x in r)} | {max(x['wall_s'] for x in r):.1f} |")
    n = len(rows)
    lines.append(f"| **all** | {n} | {sum(x['hung'] for x in rows)} | {sum(x['divergent'] for x in rows)} | "
                 f"{sum(x['crashed'] for x in rows)} | | | | |")
    (out / "faults.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
