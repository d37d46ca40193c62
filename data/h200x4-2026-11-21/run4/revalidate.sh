#!/usr/bin/env bash
# GPU run h200x4-2026-11-21/run4, part 4 (docs/benchmarks.md): the h200-2x2-sock AllReduce tables of the live
# comparison (AFNFA, AutoCCL, ncclrl from part 2-3, and ncclrl's run h200x4-2026-11-21/run3 table) validated again
# one after another in the same window, 3 alternating rounds each.
set -uo pipefail
. "$(dirname "$0")/step.sh"
live_setup
step 60 make -C plugin
for d in docs/live/bench/afnfa docs/live/bench/ncclrl docs/live/bench/autoccl docs/live/finetuned-s3/h200-2x2-sock; do
  n=$(echo "$d" | tr / -)
  step 75 python3 -m runners.validate launch=torch table=$d/nccl_tuner.csv conf=$d/nccl.conf topology=h200-2x2-sock rounds=3 store=$S out=$OUT/revalidate-$n.csv
done
echo "## $(date +%T) done" >> "$L"
