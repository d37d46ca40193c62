#!/usr/bin/env bash
# GPU run h200x4-2026-11-21/run2 of docs/live.md (4 x H200): live fine-tuning on h200-2x2-sock AllReduce under the
# budget (10% of the sweep's 2366 points), the fine-tuned table measured afresh through the plugin,
# the pretrained h200-1x4 table measured afresh, and the h200-1x4 AllReduce sweep. DEPS: folder with
# the Python packages the GPU image lacks (gymnasium, stable-baselines3, sb3-contrib, scipy).
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export PYTHONPATH=".:${DEPS:-}"
OUT=${OUT:-live-out}; mkdir -p "$OUT"; S=$OUT/store.sqlite; L=$OUT/log.txt
END=$((SECONDS + ${BUDGET_S:-540}))
. "$(dirname "$0")/step.sh"
step 60 make -C plugin
step 330 python3 -m runners.cli finetune --checkpoint docs/live/pretrained/policy.zip launch=torch backend=torch topology=h200-2x2-sock collectives=allreduce budget=236 timeout_s=60 store=$S out=$OUT/finetuned-h200-2x2-sock
step 90 python3 -m runners.validate launch=torch table=$OUT/finetuned-h200-2x2-sock/nccl_tuner.csv conf=$OUT/finetuned-h200-2x2-sock/nccl.conf topology=h200-2x2-sock collectives=allreduce rounds=2 store=$S out=$OUT/validate-finetuned-h200-2x2-sock.csv
step 80 python3 -m runners.validate launch=torch table=docs/live/pretrained/h200-1x4.csv conf=docs/live/pretrained/h200-1x4.conf topology=h200-1x4 collectives=allreduce,allgather,reducescatter rounds=2 store=$S out=$OUT/validate-pretrained-h200-1x4.csv
step 100 python3 -m runners.sweep launch=torch topology=h200-1x4 collectives=allreduce grid=full samples=5 timing=eager timeout_s=60 store=$S
echo "## $(date +%T) done" >> "$L"
