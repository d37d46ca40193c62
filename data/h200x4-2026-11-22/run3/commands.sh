#!/usr/bin/env bash
# GPU run h200x4-2026-11-22/run3 (4 x H200, available again after runs h200x2-2026-11-22/probes to h200x2-2026-11-22/run1): fine-tuning on h200-2x2-sock with the
# verification as it now is (kept rows must replicate in verification jobs; dropped rows judged once
# on all their jobs), then its table next to run h200x4-2026-11-22/run2's 4-channel table and the exhaustive sweep's.
#  1 Fine-tuning live (budget 473 = 10% of the 4,732-point sweep, wall_s=380), then its table
#    measured afresh (3 rounds).
#  2 Its table, run h200x4-2026-11-22/run2's 4-channel table and the sweep's table, one after the other.
#  3 The same three in another order.
#  4 Fine-tuning again with seed=1, then its table and part 1's measured afresh.
#  5 Part 4's table, the sweep's and part 1's.
#  6 After tie_pct (the guard's near-ties broken by time saved): fine-tuning with seed 0 again
#    (wall_s=300: the device time left), its table and the sweep's measured afresh.
# Each part starts from STORE0 (the previous part's store). S11: the fine-tuned table's folder
# (part 1's output; committed as docs/live/finetuned-s11/h200-2x2-sock).
# DEPS: folder with the Python packages the GPU image lacks (gymnasium, stable-baselines3, sb3-contrib, scipy).
set -uo pipefail
. "$(dirname "$0")/step.sh"
STORE0=${STORE0:-docs/live/h200x4-2026-11-21.sqlite}
live_setup
T=topology=h200-2x2-sock
V="python3 -m runners.validate rounds=3 store=$S launch=nccl $T"
S11=${S11:-docs/live/finetuned-s11/h200-2x2-sock}
S11B=${S11B:-docs/live/finetuned-s11b/h200-2x2-sock}
S8B=docs/live/finetuned-s8b/h200-2x2-sock
S7=docs/live/sweep-best-s7/h200-2x2-sock
val() { step 85 $V table=$1/nccl_tuner.csv conf=$1/nccl.conf out=$OUT/validate-p${PART}-$2.csv; }
step 60 make -C plugin
if [ "${PART:-1}" = 1 ]; then
  P=docs/live/pretrained/policy.zip
  step 420 python3 -m runners.cli finetune --checkpoint $P backend=torch launch=nccl $T budget=473 wall_s=380 timeout_s=30 store=$S out=$OUT/tune-s11
  val $OUT/tune-s11 finetuned-s11
elif [ "${PART}" = 2 ]; then
  val $S11 finetuned-s11
  val $S8B finetuned-s8b
  val $S7 sweep-best-s7
elif [ "${PART}" = 3 ]; then
  val $S7 sweep-best-s7
  val $S11 finetuned-s11
  val $S8B finetuned-s8b
elif [ "${PART}" = 4 ]; then
  P=docs/live/pretrained/policy.zip
  step 420 python3 -m runners.cli finetune --checkpoint $P backend=torch launch=nccl $T budget=473 wall_s=380 timeout_s=30 seed=1 store=$S out=$OUT/tune-s11b
  val $OUT/tune-s11b finetuned-s11b
  val $S11 finetuned-s11
elif [ "${PART}" = 5 ]; then
  val $S11B finetuned-s11b
  val $S7 sweep-best-s7
  val $S11 finetuned-s11
elif [ "${PART}" = 6 ]; then
  P=docs/live/pretrained/policy.zip
  step 330 python3 -m runners.cli finetune --checkpoint $P backend=torch launch=nccl $T budget=473 wall_s=300 timeout_s=30 store=$S out=$OUT/tune-s11c
  val $OUT/tune-s11c finetuned-s11c
  val $S7 sweep-best-s7
fi
echo "## $(date +%T) done" >> "$L"
