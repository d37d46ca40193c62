#!/usr/bin/env bash
# GPU run h200x4-2026-11-21/run4 (4 x H200), part PART:
#  1 (docs/live.md): AllGather and ReduceScatter fine-tuned live from the pretrained policy and each
#    table validated afresh through the plugin, on h200-2x2-sock (the 14-setting knob space; budget
#    700 = 14% of its 4,998 points) and on h200-1x4 (budget 350).
#  2, 3 (docs/benchmarks.md): h200-2x2-sock AllReduce, the same live budget (473 points, 10% of the
#    space; no new measurement after 190 s) for the two best baselines on this platform's recorded
#    sweep (AFNFA, AutoCCL: part 2) and for ncclrl fine-tuning (part 3), each table validated afresh.
# DEPS: folder with the Python packages the GPU image lacks (gymnasium, stable-baselines3, sb3-contrib, scipy).
set -uo pipefail
. "$(dirname "$0")/step.sh"
live_setup
P=docs/live/pretrained/policy.zip
C=collectives=allgather,reducescatter
T=topology=h200-2x2-sock
step 60 make -C plugin
if [ "${PART:-1}" = 1 ]; then
  step 300 python3 -m runners.cli finetune --checkpoint $P launch=torch backend=torch topology=h200-2x2-sock $C budget=700 wall_s=170 timeout_s=30 store=$S out=$OUT/finetuned-h200-2x2-sock
  step 100 python3 -m runners.validate launch=torch table=$OUT/finetuned-h200-2x2-sock/nccl_tuner.csv conf=$OUT/finetuned-h200-2x2-sock/nccl.conf topology=h200-2x2-sock $C rounds=2 store=$S out=$OUT/validate-finetuned-h200-2x2-sock.csv
  step 100 python3 -m runners.cli finetune --checkpoint $P launch=torch backend=torch topology=h200-1x4 $C budget=350 guard_confs=1 timeout_s=30 store=$S out=$OUT/finetuned-h200-1x4
  step 70 python3 -m runners.validate launch=torch table=$OUT/finetuned-h200-1x4/nccl_tuner.csv conf=$OUT/finetuned-h200-1x4/nccl.conf topology=h200-1x4 $C rounds=2 store=$S out=$OUT/validate-finetuned-h200-1x4.csv
elif [ "${PART}" = 2 ]; then
  for m in afnfa autoccl; do
    step 230 python3 -m runners.tune launch=torch method=$m backend=torch $T budget=473 wall_s=190 timeout_s=30 store=$S out=$OUT/tune-$m
    step 60 python3 -m runners.validate launch=torch table=$OUT/tune-$m/nccl_tuner.csv conf=$OUT/tune-$m/nccl.conf $T rounds=2 store=$S out=$OUT/validate-tune-$m.csv
  done
else
  step 260 python3 -m runners.cli finetune --checkpoint $P launch=torch backend=torch $T budget=473 wall_s=190 timeout_s=30 store=$S out=$OUT/tune-ncclrl
  step 60 python3 -m runners.validate launch=torch table=$OUT/tune-ncclrl/nccl_tuner.csv conf=$OUT/tune-ncclrl/nccl.conf $T rounds=2 store=$S out=$OUT/validate-tune-ncclrl.csv
fi
echo "## $(date +%T) done" >> "$L"
