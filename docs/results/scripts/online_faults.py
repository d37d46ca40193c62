"""The online mode's fault table: every fault of ncclrl.envs.online_harness, a coordinator that dies
inside its GO (tests/fakes/half_go_coordinator.py: the GO reaches one rank, or none), and a man in
the middle without the secret that changes lines (tests/fakes/relay_coordinator.py), on the
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

from ncclrl.envs.online_harness import FAULTS, SharedCoordinator, run_job

ROOT = Path(__file__).resolve().parents[3]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--first-seed", type=int, default=0,
                    help="seeds first-seed .. first-seed+seeds-1 (one worker's share)")
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--out", default=str(ROOT / "docs" / "results" / "online"))
    ap.add_argument("--resume", action="store_true", help="keep the jobs faults.csv already holds")
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    build = Path(tempfile.mkdtemp(prefix="online-faults-"))
    subprocess.run(["make", "-s", "-C", str(ROOT / "plugin"), f"BUILD={build}", "online", "online-asan"], check=True)
    rows = []
    csv_path = out / "faults.csv"
    fields = ["fault", "job", "sanitized", "seed", "ranks", "calls", "hung", "divergent", "crashed", "verdicts",
              "commits", "freezes", "ranks_frozen", "wall_s"]
    done = set()
    if a.resume and csv_path.exists():  # each job is stored as it ends: a stopped run goes on where it was
        with open(csv_path, newline="") as f:
            for r in csv.DictReader(f):
                r = {k: (r[k] if k in ("fault", "job") else float(r[k]) if k == "wall_s" else int(r[k]))
                     for k in fields}
                rows.append(r)
                done.add((r["fault"], r["job"], r["sanitized"], r["seed"]))
    else:
        with open(csv_path, "w", newline="") as f:
            csv.DictWriter(f, fieldnames=fields, lineterminator="\n").writeheader()
    shared = SharedCoordinator(Path(tempfile.mkdtemp(prefix="online-faults-coordinator-")))  # as a cluster's:
    # one coordinator serves every job whose fault leaves it alone (each job its own communicator)
    fake = [sys.executable, str(ROOT / "tests" / "fakes" / "half_go_coordinator.py")]
    relay = [sys.executable, str(ROOT / "tests" / "fakes" / "relay_coordinator.py")]
    cases = [(f, None, "") for f in FAULTS] + [("coordinator-dies-in-go", fake, "one"),
                                             ("coordinator-dies-before-go", fake, "none"),
                                             ("relay-changes-lines", relay, "")]
    for seed in range(a.first_seed, a.first_seed + a.seeds):  # seed by seed: stopped early, it still covers every fault
        for fault, argv, go_to in cases:
            os.environ["GO_TO"] = go_to
            for job in ("ddp", "fsdp"):
                for sanitized in (False, True):
                    if (fault, job, int(sanitized), seed) in done:
                        continue
                    with tempfile.TemporaryDirectory() as work:
                        o = run_job(build, Path(work), fault if argv is None else "none", ranks=a.ranks, job=job,
                                    steps=40, seed=seed, sanitized=sanitized, pace_us=1000, coordinator_argv=argv,
                                    shared=shared)
                    row = {"fault": fault, "job": job, "sanitized": int(sanitized), "seed": seed,
                           "ranks": a.ranks, "calls": o.calls, "hung": int(o.hung),
                           "divergent": int(o.divergent), "crashed": int(o.crashed),
                           "verdicts": o.verdicts, "commits": o.commits, "freezes": o.freezes,
                           "ranks_frozen": o.ranks_frozen, "wall_s": o.wall_s}
                    rows.append(row)
                    with open(csv_path, "a", newline="") as f:
                        csv.DictWriter(f, fieldnames=fields, lineterminator="\n").writerow(row)
                    print(fault, job, sanitized, seed, o.hung, o.divergent, o.crashed, o.commits, o.freezes,
                          file=sys.stderr, flush=True)
    shared.close()
    lines = ["| fault | jobs | hangs | divergent | crashes | jobs with a commit | jobs the coordinator froze | "
             "ranks that froze (of all) | wall s (max) |", "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for fault, _, _ in cases:
        r = [x for x in rows if x["fault"] == fault]
        if not r:
            continue
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
