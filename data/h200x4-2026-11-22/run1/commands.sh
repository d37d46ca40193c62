#!/usr/bin/env bash
# GPU run h200x4-2026-11-22/run1 (4 x H200): the exhaustive sweep of h200-2x2-sock AllReduce with NCCL called
# directly (launch=nccl), the reference for "fine-tuning reaches 95% of the sweep's best with <= 10%
# of its measurements" in the timing the run h200x4-2026-11-21/run6 table was tuned and validated with.
#  1 The sweep (14 knob settings x 13 per-call configurations x 26 sizes, 5 samples per point,
#    eager), as far as wall_s allows; after_hang=skip: once NCCL hangs on an algorithm/protocol
#    (Tree/LL at 128-256 MiB with NCCL_SOCKET_INLINE raised, runs h200x4-2026-11-21/run3 to h200x4-2026-11-21/run4), larger sizes of it are
#    not tried under that setting.
#  2 The sweep resumed to its end; then, on the device's CPU, NVIDIA's recipe on it (the best
#    measured point per size under the best setting: `ncclrl tune method=exhaustive`, replayed) and
#    ncclrl's fine-tuning replayed on it with 10% of its points; then the run h200x4-2026-11-21/run6 fine-tuned table
#    and the sweep's table measured afresh, one after the other (3 rounds each), and the replayed
#    fine-tuning's table when time is left. (The replayed fine-tuning overran its 60 s step on the
#    device's CPU and wrote no table; it ran on CPU afterwards, 21 s, see docs/live.md.)
#  3 Fine-tuning live with direct calls (run h200x4-2026-11-21/run6's budget: 473 points = 10% of the sweep's 4,732,
#    wall_s=230), then its table, the sweep's table and run h200x4-2026-11-21/run6's table measured afresh one after
#    the other (3 rounds each): "95% of the sweep's best" judged in one window.
#  4 Part 3's table and the sweep's table measured afresh again (the session's last device minutes).
# DEPS: folder with the Python packages the GPU image lacks (gymnasium, stable-baselines3, sb3-contrib).
set -uo pipefail
. "$(dirname "$0")/step.sh"
live_setup
T=topology=h200-2x2-sock
V="python3 -m runners.validate rounds=3 store=$S launch=nccl"
SW="python3 -m runners.sweep backend=torch launch=nccl timing=eager $T collectives=allreduce grid=full samples=5 timeout_s=15 store=$S"
R="backend=replay replay_store=$S launch=nccl $T store=$OUT/replay.sqlite"
step 60 make -C plugin
if [ "${PART:-1}" = 1 ]; then
  step 540 $SW wall_s=400
elif [ "${PART}" = 2 ]; then
  step 330 $SW wall_s=240
  step 60 python3 -m runners.tune method=exhaustive $R budget=100000 out=$OUT/sweep-best
  step 60 python3 -m runners.cli finetune --checkpoint docs/live/pretrained/policy.zip $R budget=473 out=$OUT/replay-ft
  d=docs/live/finetuned-s6/h200-2x2-sock
  step 90 $V table=$d/nccl_tuner.csv conf=$d/nccl.conf $T out=$OUT/validate-s7-s6table.csv
  step 90 $V table=$OUT/sweep-best/nccl_tuner.csv conf=$OUT/sweep-best/nccl.conf $T out=$OUT/validate-s7-sweepbest.csv
  step 90 $V table=$OUT/replay-ft/nccl_tuner.csv conf=$OUT/replay-ft/nccl.conf $T out=$OUT/validate-s7-replayft.csv
elif [ "${PART}" = 3 ]; then
  P=docs/live/pretrained/policy.zip
  step 290 python3 -m runners.cli finetune --checkpoint $P backend=torch launch=nccl $T budget=473 wall_s=230 timeout_s=30 store=$S out=$OUT/tune-s7
  step 90 $V table=$OUT/tune-s7/nccl_tuner.csv conf=$OUT/tune-s7/nccl.conf $T out=$OUT/validate-s7-tuned.csv
  d=docs/live/sweep-best-s7/h200-2x2-sock
  step 90 $V table=$d/nccl_tuner.csv conf=$d/nccl.conf $T out=$OUT/validate-s7-sweepbest-2.csv
  d=docs/live/finetuned-s6/h200-2x2-sock
  step 90 $V table=$d/nccl_tuner.csv conf=$d/nccl.conf $T out=$OUT/validate-s7-s6table-2.csv
elif [ "${PART}" = 4 ]; then  # the last minutes of device time: part 3's table and the sweep's again
  for d in docs/live/finetuned-s7/h200-2x2-sock docs/live/sweep-best-s7/h200-2x2-sock; do
    step 85 $V table=$d/nccl_tuner.csv conf=$d/nccl.conf $T out=$OUT/validate-p4-$(echo "$d" | cut -d/ -f3).csv
  done
fi
echo "## $(date +%T) done" >> "$L"
