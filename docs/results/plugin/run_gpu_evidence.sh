#!/usr/bin/env bash
# The GPU evidence of docs/results/plugin.md: build the plugin on the GPU machine, then `ncclrl plugin
# verify` three tables (hand-made and exported for the 4 x H200 box; exported for the box seen as
# 2 nodes over sockets). Run from the repository root; OUT is where results go.
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
OUT=${OUT:-plugin-evidence}
mkdir -p "$OUT"
{
  nvidia-smi -L
  python3 -c "import torch; print('torch', torch.__version__, 'nccl', torch.cuda.nccl.version(), 'gpus', torch.cuda.device_count())"
  make -C plugin 2>&1 | tail -1
  nm -D --defined-only plugin/build/libnccl-tuner-ncclrl.so
} > "$OUT/environment.txt" 2>&1
for spec in "handmade h200-1x4 docs/results/plugin/table-h200-1x4-handmade.csv 1073741824" \
            "exported h200-1x4 docs/results/plugin/table-h200-1x4-exported.csv 1073741824" \
            "sock h200-2x2-sock docs/results/plugin/table-h200-2x2-sock-exported.csv 67108864"; do
  set -- $spec
  timeout 170 python3 -m runners.plugin_verify "$3" --topology "$2" --out "$OUT/run-$1" --max-bytes "$4" \
    > "$OUT/verify-$1.txt" 2>&1
  echo "exit $?" >> "$OUT/verify-$1.txt"
  # rank 0's NCCL logs (with and without the plugin) and the per-case report, in one archive
  tar czf "$OUT/logs-$1.tgz" -C "$OUT/run-$1" verify.json $(cd "$OUT/run-$1" && grep -l "Broadcast: 1357 Bytes" nccl-*/*.log) 2>/dev/null
  rm -rf "$OUT/run-$1"
done
