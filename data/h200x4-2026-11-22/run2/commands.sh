#!/usr/bin/env bash
# GPU run h200x4-2026-11-22/run2 (4 x H200): fine-tuning h200-2x2-sock AllReduce live again, now that the search
# leaves wall-clock time for the verification (verify_reserve=3; run h200x4-2026-11-22/run1's run had time for one
# verification job and dropped the 32 B row against a fast job of NCCL's bimodal choice there),
# and every table measured afresh next to the others in the same device command.
#  1 Fine-tuning live with direct calls (runs h200x4-2026-11-21/run6 and h200x4-2026-11-22/run1's budget: 473 points = 10% of the exhaustive
#    sweep's 4,732; wall_s=260), then its table, the sweep's table (NVIDIA's recipe on run h200x4-2026-11-22/run1's
#    exhaustive sweep) and run h200x4-2026-11-21/run6's table measured afresh one after the other (3 rounds each).
#  2, 3 The three tables again in other orders (other device commands, possibly other hosts).
#  4 Fine-tuning again with wall_s=330 (part 1 stopped after 2 of 3 rounds on the clock), then its
#    table and the sweep's table measured afresh.
#  5 Both fine-tuned tables of this session again.
# DEPS: folder with the Python packages the GPU image lacks (gymnasium, stable-baselines3, sb3-contrib).
set -uo pipefail
. "$(dirname "$0")/step.sh"
live_setup
T=topology=h200-2x2-sock
V="python3 -m runners.validate rounds=3 store=$S launch=nccl $T"
S8=docs/live/finetuned-s8/h200-2x2-sock
S7=docs/live/sweep-best-s7/h200-2x2-sock
S6=docs/live/finetuned-s6/h200-2x2-sock
val() { step 85 $V table=$1/nccl_tuner.csv conf=$1/nccl.conf out=$OUT/validate-p${PART}-$2.csv; }
step 60 make -C plugin
if [ "${PART:-1}" = 1 ]; then
  P=docs/live/pretrained/policy.zip
  step 320 python3 -m runners.cli finetune --checkpoint $P backend=torch launch=nccl $T budget=473 wall_s=260 timeout_s=30 store=$S out=$OUT/tune-s8
  val $OUT/tune-s8 finetuned-s8
  val $S7 sweep-best-s7
  val $S6 finetuned-s6
elif [ "${PART}" = 2 ]; then
  val $S7 sweep-best-s7
  val $S6 finetuned-s6
  val $S8 finetuned-s8
elif [ "${PART}" = 3 ]; then
  val $S6 finetuned-s6
  val $S8 finetuned-s8
  val $S7 sweep-best-s7
elif [ "${PART}" = 4 ]; then  # fine-tuning with more wall clock (part 1 stopped after 2 rounds), then its table and the sweep's
  P=docs/live/pretrained/policy.zip
  step 390 python3 -m runners.cli finetune --checkpoint $P backend=torch launch=nccl $T budget=473 wall_s=330 timeout_s=30 store=$S out=$OUT/tune-s8b
  val $OUT/tune-s8b finetuned-s8b
  val $S7 sweep-best-s7
elif [ "${PART}" = 5 ]; then  # the session's last device minutes: both fine-tuned tables again
  val docs/live/finetuned-s8b/h200-2x2-sock finetuned-s8b
  val $S8 finetuned-s8
fi
echo "## $(date +%T) done" >> "$L"
