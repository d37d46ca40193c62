#!/usr/bin/env bash
# GPU run h200x2-2026-11-22/probes (4 x H200): the one-look verification's first live run, and where a round's wall
# clock goes (finetune.json's history now times propose/jobs/refit/PPO per round).
# NOT RUN YET: no 4-GPU machine was available then (docs/live.md, "run h200x2-2026-11-22/probes").
#  1 Per-call 2 channels under a 4-channel communicator at 8 B-1 MiB (docs/live/probe_channels.py),
#    then fine-tuning live (budget 473 = 10% of the exhaustive sweep; wall_s=380: three rounds on
#    run h200x4-2026-11-22/run2's slowest host), then its table measured afresh.
#  2 Its table, run h200x4-2026-11-22/run2's 4-channel table and the sweep's table, one after the other.
#  3 The same three in another order.
# DEPS: folder with the Python packages the GPU image lacks (gymnasium, stable-baselines3, sb3-contrib, scipy).
set -uo pipefail
. "$(dirname "$0")/step.sh"
live_setup
T=topology=h200-2x2-sock
V="python3 -m runners.validate rounds=3 store=$S launch=nccl $T"
S9=docs/live/finetuned-s9/h200-2x2-sock
S8B=docs/live/finetuned-s8b/h200-2x2-sock
S7=docs/live/sweep-best-s7/h200-2x2-sock
val() { step 85 $V table=$1/nccl_tuner.csv conf=$1/nccl.conf out=$OUT/validate-p${PART}-$2.csv; }
step 60 make -C plugin
if [ "${PART:-1}" = 1 ]; then
  step 70 python3 docs/live/probe_channels.py $S $OUT/probe-channels.csv
  P=docs/live/pretrained/policy.zip
  step 420 python3 -m runners.cli finetune --checkpoint $P backend=torch launch=nccl $T budget=473 wall_s=380 timeout_s=30 store=$S out=$OUT/tune-s9
  val $OUT/tune-s9 finetuned-s9
elif [ "${PART}" = 2 ]; then
  val $S9 finetuned-s9
  val $S8B finetuned-s8b
  val $S7 sweep-best-s7
elif [ "${PART}" = 3 ]; then
  val $S7 sweep-best-s7
  val $S9 finetuned-s9
  val $S8B finetuned-s8b
fi
echo "## $(date +%T) done" >> "$L"
