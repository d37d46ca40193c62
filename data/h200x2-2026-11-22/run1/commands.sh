#!/usr/bin/env bash
# GPU run h200x2-2026-11-22/run1 (2 x H200; no 4-GPU machine was available in runs h200x2-2026-11-22/probes to h200x2-2026-11-22/run1): the whole path on
# h200-2x1-sock, two emulated nodes of one GPU each over loopback sockets, a shape the pretrained
# policy never saw. Store: docs/live/h200x2-2026-11-22.sqlite (each part starts from the previous
# part's store, copied back into the repository between device commands).
#  1 NCCL's own view of the shape (NCCL_DEBUG=INFO on one 8 B default point: channels, rings,
#    trees), then fine-tuning live (budget 473 = 10% of the full sweep's 4,732 points; wall_s=380,
#    as planned for 2x2 in run_gpu_session9.sh): the one-look verification's first live run; then
#    its table measured afresh (3 rounds).
#  2 The exhaustive sweep of the same space (14 knob settings x 13 per-call configurations x 26
#    sizes, 5 samples, eager, direct calls), as far as wall_s allows.
#  3 The sweep to its end; NVIDIA's recipe on it (the best measured point per size under the best
#    setting, replayed on the device's CPU); then the sweep's table and the fine-tuned table measured
#    afresh one after the other (3 rounds each): "95% of the sweep's best" judged in one window.
#  4 Fine-tuning again with another seed (seed=1), then the sweep's table and both fine-tuned
#    tables measured afresh; 5 the three tables again in the reverse order (what device time was left).
# DEPS: folder with the Python packages the GPU image lacks (gymnasium, stable-baselines3, sb3-contrib, scipy).
set -uo pipefail
. "$(dirname "$0")/step.sh"
STORE0=${STORE0:-docs/live/h200x2-2026-11-22.sqlite}
[ -f "$STORE0" ] || STORE0=/dev/null  # the first part starts an empty store
live_setup
T=topology=h200-2x1-sock
V="python3 -m runners.validate rounds=3 store=$S launch=nccl $T"
SW="python3 -m runners.sweep backend=torch launch=nccl timing=eager $T collectives=allreduce grid=full samples=5 timeout_s=15 store=$S"
val() { step 85 $V table=$1/nccl_tuner.csv conf=$1/nccl.conf out=$OUT/validate-p${PART}-$2.csv; }
step 60 make -C plugin
if [ "${PART:-1}" = 1 ]; then
  mkdir -p "$OUT/nccl-info"
  NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,GRAPH,TUNING NCCL_DEBUG_FILE="$OUT/nccl-info/%h.%p.log" \
    step 40 python3 -m runners.sweep backend=torch launch=nccl timing=eager $T grid=default min_bytes=8 max_bytes=8 \
    samples=3 timeout_s=30 store=$OUT/nccl-info.sqlite
  P=docs/live/pretrained/policy.zip
  step 420 python3 -m runners.cli finetune --checkpoint $P backend=torch launch=nccl $T budget=473 wall_s=380 timeout_s=30 store=$S out=$OUT/tune-s10
  val $OUT/tune-s10 finetuned-s10
elif [ "${PART}" = 2 ]; then
  step 540 $SW wall_s=470
elif [ "${PART}" = 3 ]; then
  step 240 $SW wall_s=200
  R="backend=replay replay_store=$S launch=nccl $T store=$OUT/replay.sqlite"
  step 60 python3 -m runners.tune method=exhaustive $R budget=100000 out=$OUT/sweep-best
  val $OUT/sweep-best sweep-best-s10
  val docs/live/finetuned-s10/h200-2x1-sock finetuned-s10
elif [ "${PART}" = 4 ]; then
  P=docs/live/pretrained/policy.zip
  step 300 python3 -m runners.cli finetune --checkpoint $P backend=torch launch=nccl $T budget=473 wall_s=380 timeout_s=30 seed=1 store=$S out=$OUT/tune-s10b
  val $OUT/tune-s10b finetuned-s10b
  val docs/live/sweep-best-s10/h200-2x1-sock sweep-best-s10
  val docs/live/finetuned-s10/h200-2x1-sock finetuned-s10
elif [ "${PART}" = 5 ]; then
  val docs/live/finetuned-s10/h200-2x1-sock finetuned-s10
  val docs/live/sweep-best-s10/h200-2x1-sock sweep-best-s10
  val docs/live/finetuned-s10b/h200-2x1-sock finetuned-s10b
fi
echo "## $(date +%T) done" >> "$L"
