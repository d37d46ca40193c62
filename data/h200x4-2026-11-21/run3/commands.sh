#!/usr/bin/env bash
# GPU run h200x4-2026-11-21/run3 of docs/live.md (4 x H200), part PART (1 or 2):
#  1: the h200-2x2-sock AllReduce sweep completed with NCCL_SOCKET_INLINE=256 KiB under every knob
#     setting (resumes the committed store: only the new settings are measured); h200-1x4 AllReduce
#     fine-tuned and the table validated afresh.
#  2: h200-2x2-sock AllReduce fine-tuned in the 14-setting space (10% of its sweep) and validated.
#  3: both fine-tunings again after the guard learned to re-measure the few sizes where a knob
#     setting loses (fresh jobs on both sides, pooled samples), each validated afresh.
# DEPS: folder with the Python packages the GPU image lacks (gymnasium, stable-baselines3, sb3-contrib, scipy).
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export PYTHONPATH=".:${DEPS:-}"
OUT=${OUT:-live-out}; mkdir -p "$OUT"; S=$OUT/store.sqlite; L=$OUT/log.txt
[ -f "$S" ] || cp "${STORE0:-docs/live/h200x4-2026-11-21.sqlite}" "$S"
END=$((SECONDS + ${BUDGET_S:-560}))
. "$(dirname "$0")/step.sh"
P=docs/live/pretrained/policy.zip
step 60 make -C plugin
if [ "${PART:-1}" = 3 ]; then
  step 330 python3 -m runners.cli finetune --checkpoint $P launch=torch backend=torch topology=h200-2x2-sock collectives=allreduce budget=473 wall_s=200 timeout_s=30 store=$S out=$OUT/finetuned-h200-2x2-sock
  step 80 python3 -m runners.validate launch=torch table=$OUT/finetuned-h200-2x2-sock/nccl_tuner.csv conf=$OUT/finetuned-h200-2x2-sock/nccl.conf topology=h200-2x2-sock collectives=allreduce rounds=2 store=$S out=$OUT/validate-finetuned-h200-2x2-sock.csv
  step 100 python3 -m runners.cli finetune --checkpoint $P launch=torch backend=torch topology=h200-1x4 collectives=allreduce budget=200 guard_confs=1 timeout_s=30 store=$S out=$OUT/finetuned-h200-1x4
  step 60 python3 -m runners.validate launch=torch table=$OUT/finetuned-h200-1x4/nccl_tuner.csv conf=$OUT/finetuned-h200-1x4/nccl.conf topology=h200-1x4 collectives=allreduce rounds=2 store=$S out=$OUT/validate-finetuned-h200-1x4.csv
elif [ "${PART:-1}" = 1 ]; then
  step 280 python3 -m runners.sweep launch=torch topology=h200-2x2-sock collectives=allreduce grid=full samples=5 timing=eager timeout_s=60 store=$S
  step 150 python3 -m runners.cli finetune --checkpoint $P launch=torch backend=torch topology=h200-1x4 collectives=allreduce budget=200 guard_confs=1 timeout_s=60 store=$S out=$OUT/finetuned-h200-1x4
  step 100 python3 -m runners.validate launch=torch table=$OUT/finetuned-h200-1x4/nccl_tuner.csv conf=$OUT/finetuned-h200-1x4/nccl.conf topology=h200-1x4 collectives=allreduce rounds=2 store=$S out=$OUT/validate-finetuned-h200-1x4.csv
else
  step 420 python3 -m runners.cli finetune --checkpoint $P launch=torch backend=torch topology=h200-2x2-sock collectives=allreduce budget=473 wall_s=250 timeout_s=30 store=$S out=$OUT/finetuned-h200-2x2-sock
  step 110 python3 -m runners.validate launch=torch table=$OUT/finetuned-h200-2x2-sock/nccl_tuner.csv conf=$OUT/finetuned-h200-2x2-sock/nccl.conf topology=h200-2x2-sock collectives=allreduce rounds=2 store=$S out=$OUT/validate-finetuned-h200-2x2-sock.csv
fi
echo "## $(date +%T) done" >> "$L"
