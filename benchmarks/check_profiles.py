"""Check ``ncclrl profile`` against the jobs' own count, for recordings made by
``benchmarks/record_profiles.py``: per job and per input kind (profiler traces, flight recorder
JSON, NCCL COLL logs), the profile's calls per step of every (collective, nbytes, dtype) against
the ``truth.json`` files, and the bytes per step.

    python benchmarks/check_profiles.py tests/data/profiles

Prints one row per job and input kind; a row says ``match`` only when every key and count agrees.
Exit status 0 when every row found matches, 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path

from ncclrl.costmodel.errors import ConfigError
from ncclrl.costmodel.profile import Profile, build_profile

KINDS = {"traces": "trace.json.gz", "flight recorder": "fr.json", "NCCL logs": "nccl.log"}


def truth_per_step(folder: Path, job: str) -> list[Counter]:
    """Each profiled step's calls of every rank, as (collective, nbytes as NCCL's tuner sees them, dtype)."""
    steps = []
    for f in sorted(folder.glob(f"{job}-rank*.truth.json")):
        doc = json.loads(f.read_text())
        for calls in doc["calls_by_step"]:
            steps.append(Counter((c["collective"], max(c["in_nelems"], c["out_nelems"]) * c["element_nbytes"],
                                  c["dtype"]) for c in calls))
    return steps


def check(folder: Path) -> list[dict]:
    rows = []
    jobs = sorted({f.name.split("-rank")[0] for f in folder.glob("*-rank*.truth.json")})
    for job in jobs:
        truth = truth_per_step(folder, job)
        want = dict(truth[0]) if truth else {}
        same_every_step = all(t == truth[0] for t in truth)
        for kind, suffix in KINDS.items():
            files = sorted(folder.glob(f"{job}-rank*.{suffix}"))
            if not files:
                continue
            try:
                prof = build_profile(files)
            except ConfigError as e:
                if "no collective calls" not in str(e):
                    raise
                prof = Profile([], 0, "none: no collective calls", [], [])  # e.g. FSDP on one rank
            got = {(e.collective, e.nbytes, e.dtype): e.calls_per_step for e in prof.entries}
            bytes_got = sum(e.nbytes_per_step for e in prof.entries)
            bytes_want = sum(n * k for (_c, n, _d), k in want.items())
            rows.append({"job": job, "input": kind, "files": len(files), "steps": prof.steps,
                         "steps_from": prof.steps_from, "keys": len(got), "keys_truth": len(want),
                         "calls_per_step": sum(got.values()), "calls_per_step_truth": sum(want.values()),
                         "nbytes_per_step": bytes_got, "nbytes_per_step_truth": bytes_want,
                         "shapes": sorted({(e.nodes, e.ranks, e.overlaps_compute) for e in prof.entries}),
                         "match": got == want and same_every_step,
                         "differences": {str(k): (got.get(k), want.get(k)) for k in set(got) | set(want)
                                         if got.get(k) != want.get(k)}})
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    p.add_argument("folder", help="a folder written by benchmarks/record_profiles.py")
    a = p.parse_args(argv)
    rows = check(Path(a.folder))
    if not rows:
        print(f"no recordings (*-rank*.truth.json) in {a.folder}")
        return 1
    print("| job | input | files | steps (from) | calls/step: profile / job | bytes/step: profile / job "
          "| shapes (nodes, ranks, overlap) | verdict |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['job']} | {r['input']} | {r['files']} | {r['steps']} ({r['steps_from']}) | "
              f"{r['calls_per_step']} / {r['calls_per_step_truth']} | {r['nbytes_per_step']} / "
              f"{r['nbytes_per_step_truth']} | {r['shapes']} | "
              f"{'match' if r['match'] else 'DIFFERS: ' + json.dumps(r['differences'])} |")
    return 0 if all(r["match"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
