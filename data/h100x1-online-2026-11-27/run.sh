#!/bin/bash
# The plugin's online mode on one GPU with a real NCCL: ncclrl e2e with online=true on the
# two-node loopback bed (two processes on GPU 0, each its own NCCL_HOSTID), DDP, against the static
# table and NCCL's defaults; NCCL's own per-call log (NCCL_DEBUG_SUBSYS=TUNING) kept for every job.
# Usage (repository root, .whl/deps as in data/h100x1-loopback-2026-11-25/README.md):
#   OUT=/tmp/w bash data/h100x1-online-2026-11-27/run.sh
set -u
OUT=${OUT:?set OUT}
mkdir -p "$OUT/work/logs"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
PP=$(mktemp -d); ln -s "$PWD" "$PP/ncclrl"; export PYTHONPATH="$PP:$PWD/.whl/deps"
T="topology=h100-2x1-loopback launcher.share_gpu=true"
TABLE=data/h100x1-loopback-2026-11-25/part1/finetuned/nccl_tuner.csv
{
  date -u
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python3 -c "import torch, sys; print(sys.version.split()[0], torch.__version__, torch.cuda.nccl.version())"
  timeout 120 python3 -m ncclrl plugin build
  timeout 60 make -s -C plugin BUILD=/tmp/ncclrl-bench bench-online
  NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,TUNING NCCL_DEBUG_FILE="$OUT/work/logs/nccl.%h.%p.log" \
    timeout ${E2E_S:-420} python3 -m ncclrl e2e $TABLE $T mode=${MODE:-ddp} online=true rounds=${ROUNDS:-3} \
    steps=${STEPS:-200} warmup=3 d_model=512 out="$OUT/work/e2e"
  echo "e2e exit $?"
  date -u
} > "$OUT/run.log" 2>&1
tar -C "$OUT/work" -czf "$OUT/online-e2e.tar.gz" .
rm -rf "$OUT/work"
tail -30 "$OUT/run.log"
