#!/usr/bin/env bash
# GPU run h200x4-2026-11-21/run5 (4 x H200): the between-job noise model (runners/noise.py) on hardware, part PART:
#  1 h200-2x2-sock AllReduce fine-tuned again with the guard that judges cross-job comparisons
#    against the between-job spread (same budget and wall clock as run h200x4-2026-11-21/run4 part 3: 473 points,
#    190 s), then validated afresh with 3 rounds next to run h200x4-2026-11-21/run3's table and AFNFA's table.
#  3 Reproducibility: part 1's fine-tuning again (same command), its table and part 1's
#    (docs/live/finetuned-s5) validated with 3 rounds in the base/tuned/tuned/base order, and the
#    A/A table on h200-1x4 again in that order.
#  4 AFNFA live with the same budget in this session, its table and part 3's ncclrl table
#    validated one after the other (3 rounds each; docs/benchmarks.md).
#  5 With validate's warm-up job (a first job of NCCL's defaults, not judged): the A/A table and
#    the run h200x4-2026-11-21/run4 AllGather/ReduceScatter table on h200-1x4 again.
#  2 Validations with 3 rounds: an A/A table (no rows: the plugin loads and NCCL decides) on
#    h200-2x2-sock and h200-1x4, the run h200x4-2026-11-21/run4 AllGather/ReduceScatter tables (h200-1x4, then
#    h200-2x2-sock) and run h200x4-2026-11-21/run3's h200-1x4 AllReduce table.
# DEPS: folder with the Python packages the GPU image lacks (gymnasium, stable-baselines3, sb3-contrib, scipy).
set -uo pipefail
. "$(dirname "$0")/step.sh"
live_setup
P=docs/live/pretrained/policy.zip
T=topology=h200-2x2-sock
V="python3 -m runners.validate launch=torch rounds=3 store=$S"
step 60 make -C plugin
if [ "${PART:-1}" = 1 ]; then
  step 260 python3 -m runners.cli finetune --checkpoint $P launch=torch backend=torch $T budget=473 wall_s=190 timeout_s=30 store=$S out=$OUT/tune-ncclrl
  step 75 $V table=$OUT/tune-ncclrl/nccl_tuner.csv conf=$OUT/tune-ncclrl/nccl.conf $T out=$OUT/validate-tune-ncclrl.csv
  for d in docs/live/finetuned-s3/h200-2x2-sock docs/live/bench/afnfa; do
    step 75 $V table=$d/nccl_tuner.csv conf=$d/nccl.conf $T out=$OUT/validate-$(echo "$d" | tr / -).csv
  done
elif [ "${PART}" = 3 ]; then
  step 260 python3 -m runners.cli finetune --checkpoint $P launch=torch backend=torch $T budget=473 wall_s=190 timeout_s=30 store=$S out=$OUT/tune-ncclrl-2
  step 75 $V table=$OUT/tune-ncclrl-2/nccl_tuner.csv conf=$OUT/tune-ncclrl-2/nccl.conf $T out=$OUT/validate-tune-ncclrl-2.csv
  d=docs/live/finetuned-s5/h200-2x2-sock
  step 75 $V table=$d/nccl_tuner.csv conf=$d/nccl.conf $T out=$OUT/validate-s5-again.csv
  step 75 $V table=docs/live/noise/aa_table.csv topology=h200-1x4 out=$OUT/validate-aa-h200-1x4-abba.csv
elif [ "${PART}" = 4 ]; then
  step 230 python3 -m runners.tune launch=torch method=afnfa backend=torch $T budget=473 wall_s=190 timeout_s=30 store=$S out=$OUT/tune-afnfa
  step 75 $V table=$OUT/tune-afnfa/nccl_tuner.csv conf=$OUT/tune-afnfa/nccl.conf $T out=$OUT/validate-tune-afnfa.csv
  d=docs/live/finetuned-s5/h200-2x2-sock-2
  step 75 $V table=$d/nccl_tuner.csv conf=$d/nccl.conf $T out=$OUT/validate-s5-2-again.csv
elif [ "${PART}" = 5 ]; then
  step 75 $V table=docs/live/noise/aa_table.csv topology=h200-1x4 out=$OUT/validate-aa-h200-1x4-warmup.csv
  d=docs/live/finetuned-s4/h200-1x4
  step 100 $V table=$d/nccl_tuner.csv conf=$d/nccl.conf topology=h200-1x4 collectives=allgather,reducescatter out=$OUT/validate-s4-h200-1x4-warmup.csv
else
  A=docs/live/noise/aa_table.csv
  step 75 $V table=$A $T out=$OUT/validate-aa-h200-2x2-sock.csv
  step 75 $V table=$A topology=h200-1x4 out=$OUT/validate-aa-h200-1x4.csv
  d=docs/live/finetuned-s4/h200-1x4
  step 90 $V table=$d/nccl_tuner.csv conf=$d/nccl.conf topology=h200-1x4 collectives=allgather,reducescatter out=$OUT/validate-s4-h200-1x4.csv
  d=docs/live/finetuned-s3/h200-1x4
  step 70 $V table=$d/nccl_tuner.csv conf=$d/nccl.conf topology=h200-1x4 out=$OUT/validate-s3-h200-1x4.csv
  d=docs/live/finetuned-s4/h200-2x2-sock
  step 110 $V table=$d/nccl_tuner.csv conf=$d/nccl.conf $T collectives=allgather,reducescatter out=$OUT/validate-s4-h200-2x2-sock.csv
fi
echo "## $(date +%T) done" >> "$L"
