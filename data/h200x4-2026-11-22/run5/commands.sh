#!/usr/bin/env bash
# GPU run h200x4-2026-11-22/run5 (4 x H200): under a setting that raises the communicator's channels (4 on the 2x2),
# the space and the guard also hold NCCL's own algorithm and protocol at NCCL's 2 channels (a row
# "-1,-1,2"), where run h200x4-2026-11-22/run4's 4-channel tables lost to NCCL's own choice (1 MiB, 0.77-0.83x).
#  1 The exhaustive sweep completed with the new points (NCCL's own algorithm at 2 channels under
#    the six 4-channel settings, 26 sizes, NCCL's default next to them), then fine-tuning live,
#    seed 0 (budget 473, wall_s=330).
#  2 Part 1's table measured afresh (3 rounds); fine-tuning with seed 1 and its table.
#  3 Parts 1 and 2's tables and the completed sweep's table (NVIDIA's recipe, replayed on the
#    device's CPU from the store), one after the other.
#  4 (a fresh machine, after rows_on_ties: under a setting other than NCCL's defaults, a row no
#    slower than NCCL's choice in its guard job stays) Fine-tuning with seed 2, its table and the
#    sweep's (S13S: part 3's sweep-best-s13 folder).
# Each part starts from STORE0 (the previous part's store). S13: part 1's table folder.
# DEPS: folder with the Python packages the GPU image lacks (gymnasium, stable-baselines3, sb3-contrib, scipy).
set -uo pipefail
. "$(dirname "$0")/step.sh"
STORE0=${STORE0:-docs/live/h200x4-2026-11-21.sqlite}
live_setup
T=topology=h200-2x2-sock
V="python3 -m runners.validate rounds=3 store=$S launch=nccl $T"
S13=${S13:-docs/live/finetuned-s13/h200-2x2-sock}
S13B=${S13B:-docs/live/finetuned-s13b/h200-2x2-sock}
S13S=${S13S:-docs/live/sweep-best-s13/h200-2x2-sock}
P=docs/live/pretrained/policy.zip
val() { step 85 $V table=$1/nccl_tuner.csv conf=$1/nccl.conf out=$OUT/validate-p${PART}-$2.csv; }
ft() { step 370 python3 -m runners.cli finetune --checkpoint $P backend=torch launch=nccl $T budget=473 wall_s=330 \
  timeout_s=30 seed=$1 store=$S out=$OUT/$2; }
step 60 make -C plugin
case "${PART:-1}" in
  1) step 150 python3 -m runners.sweep backend=torch launch=nccl timing=eager $T collectives=allreduce grid=full \
       samples=5 timeout_s=15 wall_s=120 store=$S
     ft 0 tune-s13 ;;
  2) val $S13 finetuned-s13; ft 1 tune-s13b; val $OUT/tune-s13b finetuned-s13b ;;
  3) step 60 python3 -m runners.tune method=exhaustive backend=replay replay_store=$S launch=nccl $T \
       store=$OUT/replay.sqlite budget=100000 out=$OUT/sweep-best-s13
     val $S13 finetuned-s13; val $S13B finetuned-s13b; val $OUT/sweep-best-s13 sweep-best-s13 ;;
  4) ft 2 tune-s13c; val $OUT/tune-s13c finetuned-s13c; val $S13S sweep-best-s13 ;;
esac
echo "## $(date +%T) done" >> "$L"
