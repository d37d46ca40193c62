#!/bin/bash
# The plugin's online mode with a real NCCL on 2 x H200 as 2 nodes x 1 GPU over loopback sockets
# (h200-2x1-sock: each process its own NCCL_HOSTID; TOPO=h200-2x2-sock on 4 GPUs: 2 nodes x 2 GPUs):
# ncclrl e2e online=true, DDP then FSDP, against the static table (the finetuned table of that bed:
# TABLE_TAR, default data/h200x2-2026-11-28/confirm run 3's) and NCCL's defaults; NCCL's own per-call log (NCCL_DEBUG_SUBSYS=TUNING) kept for every job; the
# online getCollInfo cost (make bench-online) on this host's CPU.
# Usage (repository root, .whl/deps as in data/h100x1-loopback-2026-11-25/README.md):
#   OUT=/tmp/w bash data/h200x2-2026-11-28/online/run.sh
set -u
OUT=${OUT:?set OUT}
mkdir -p "$OUT/work/logs"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1  # NVLink multicast off on this host
PP=$(mktemp -d); ln -s "$PWD" "$PP/ncclrl"; export PYTHONPATH="$PP:$PWD/.whl/deps" PYTHONUNBUFFERED=1
T=$(mktemp -d)
TOPO=${TOPO:-h200-2x1-sock}  # h200-2x2-sock on a 4-GPU host: 2 nodes x 2 GPUs
tar -C "$T" -xzf "${TABLE_TAR:-data/h200x2-2026-11-28/confirm/files3.tar.gz}" ./ft/nccl_tuner.csv
{
  date -u
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python3 -c "import torch, sys; print(sys.version.split()[0], torch.__version__, torch.cuda.nccl.version())"
  echo "code: revision ${REV:-unknown}"
  timeout 120 python3 -m ncclrl plugin build
  timeout 60 make -s -C plugin BUILD=/tmp/ncclrl-bench bench-online
  NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,TUNING NCCL_DEBUG_FILE="$OUT/work/logs/nccl.%h.%p.log" \
    timeout ${E2E_S:-480} python3 -m ncclrl e2e "$T/ft/nccl_tuner.csv" topology=$TOPO mode=${MODE:-both} \
    online=true rounds=${ROUNDS:-3} steps=${STEPS:-100} warmup=3 d_model=512 out="$OUT/work/e2e"
  echo "e2e exit $?"
  date -u
} > "$OUT/run.log" 2>&1
tar -C "$OUT/work" --exclude=coordinator.secret -czf "$OUT/online-e2e.tar.gz" .  # the job's secret stays out
rm -rf "$OUT/work"
tail -40 "$OUT/run.log"
