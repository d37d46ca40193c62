#!/usr/bin/env bash
# GPU run h200x4-2026-11-21/run1 of docs/live.md (4 x H200): latency check, the pretrained tables measured afresh
# through the plugin, and the exhaustive sweeps (the baselines fine-tuning is judged against).
# Run from the repository root with OUT set; every step has its own time limit and the stores
# resume, so a step cut short loses only what it had not measured. NCCLTESTS (optional): a folder
# with the user's all_reduce_perf, for the 8 B latency comparison.
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
OUT=${OUT:-live-out}; mkdir -p "$OUT"; S=$OUT/store.sqlite; L=$OUT/log.txt
END=$((SECONDS + ${BUDGET_S:-540}))  # the whole script stays inside the device's per-command limit
. "$(dirname "$0")/step.sh"
{ nvidia-smi -L; python3 -c "import sys, torch; print(sys.version.split()[0], 'torch', torch.__version__, 'nccl', torch.cuda.nccl.version())"; } >> "$L" 2>&1
step 60 make -C plugin
if [ -n "${NCCLTESTS:-}" ]; then  # 8 B AllReduce latency: nccl-tests plain and CUDA-graph vs our backend
  step 60 "$NCCLTESTS/all_reduce_perf" -g 4 -b 8 -e 8 -n 2000 -w 200 -c 0
  step 60 "$NCCLTESTS/all_reduce_perf" -g 4 -b 8 -e 8 -n 200 -w 200 -c 0 -G 10
fi
for t in graph eager; do
  step 90 python3 -m runners.sweep launch=torch topology=h200-1x4 grid=default min_bytes=8 max_bytes=8 samples=20 timing=$t tag=lat-$t store=$S
done
# exhaustive sweeps (resumable)
step ${SWEEP_S:-240} python3 -m runners.sweep launch=torch topology=h200-2x2-sock collectives=allreduce grid=full samples=5 timing=eager timeout_s=60 store=$S
# the tables the pretrained policy exported (simulation only), measured afresh against NCCL's defaults
step 150 python3 -m runners.validate launch=torch table=docs/live/pretrained/h200-2x2-sock.csv conf=docs/live/pretrained/h200-2x2-sock.conf topology=h200-2x2-sock collectives=allreduce,allgather,reducescatter rounds=2 timing=eager store=$S out=$OUT/validate-pretrained-h200-2x2-sock.csv
step 100 python3 -m runners.sweep launch=torch topology=h200-1x4 collectives=allreduce,allgather,reducescatter grid=full samples=5 timing=graph timeout_s=60 store=$S
step 90 python3 -m runners.validate launch=torch table=docs/live/pretrained/h200-1x4.csv conf=docs/live/pretrained/h200-1x4.conf topology=h200-1x4 collectives=allreduce,allgather,reducescatter rounds=2 timing=graph store=$S out=$OUT/validate-pretrained-h200-1x4.csv
step ${SWEEP2_S:-120} python3 -m runners.sweep launch=torch topology=h200-2x2-sock collectives=allgather,reducescatter grid=full samples=5 timing=eager timeout_s=60 store=$S
echo "## $(date +%T) done" >> "$L"
