#!/usr/bin/env bash
# GPU run h200x4-2026-11-22/run4 (4 x H200): fine-tuning on h200-2x2-sock with tie_pct=10 (settings within 10% of
# the best geometric mean tie, the one saving the most time is exported) and the guard checking the
# search's most time-saving setting; three seeds, each table measured afresh next to the sweep's.
#  1 Fine-tuning live, seed 0 (budget 473 = 10% of the 4,732-point sweep, wall_s=330), its table
#    measured afresh (3 rounds).
#  2 The same with seed 1.
#  3 Parts 1 and 2's tables and the sweep's, one after the other.
#  4 The same with seed 2, then the sweep's table.
#  5 Part 4's, part 1's and part 2's tables again.
#  6 The sweep's table, part 4's and part 1's.
#  7 (a fresh machine, the device time left) Fine-tuning with seed 3, its table and part 2's.
# Each part starts from STORE0 (the previous part's store). S12, S12B, S12C: the fine-tuned tables'
# folders (parts 1, 2, 4's outputs; committed as docs/live/finetuned-s12{,b,c}/h200-2x2-sock).
# DEPS: folder with the Python packages the GPU image lacks (gymnasium, stable-baselines3, sb3-contrib, scipy).
set -uo pipefail
. "$(dirname "$0")/step.sh"
STORE0=${STORE0:-docs/live/h200x4-2026-11-21.sqlite}
live_setup
T=topology=h200-2x2-sock
V="python3 -m runners.validate rounds=3 store=$S launch=nccl $T"
S12=${S12:-docs/live/finetuned-s12/h200-2x2-sock}
S12B=${S12B:-docs/live/finetuned-s12b/h200-2x2-sock}
S12C=${S12C:-docs/live/finetuned-s12c/h200-2x2-sock}
S7=docs/live/sweep-best-s7/h200-2x2-sock
P=docs/live/pretrained/policy.zip
val() { step 85 $V table=$1/nccl_tuner.csv conf=$1/nccl.conf out=$OUT/validate-p${PART}-$2.csv; }
ft() { step 370 python3 -m runners.cli finetune --checkpoint $P backend=torch launch=nccl $T budget=473 wall_s=330 \
  timeout_s=30 seed=$1 store=$S out=$OUT/$2; }
step 60 make -C plugin
case "${PART:-1}" in
  1) ft 0 tune-s12; val $OUT/tune-s12 finetuned-s12 ;;
  2) ft 1 tune-s12b; val $OUT/tune-s12b finetuned-s12b ;;
  3) val $S12 finetuned-s12; val $S12B finetuned-s12b; val $S7 sweep-best-s7 ;;
  4) ft 2 tune-s12c; val $OUT/tune-s12c finetuned-s12c; val $S7 sweep-best-s7 ;;
  5) val $S12C finetuned-s12c; val $S12 finetuned-s12; val $S12B finetuned-s12b ;;
  6) val $S7 sweep-best-s7; val $S12C finetuned-s12c; val $S12 finetuned-s12 ;;
  7) ft 3 tune-s12d; val $OUT/tune-s12d finetuned-s12d; val $S12B finetuned-s12b ;;
esac
echo "## $(date +%T) done" >> "$L"
