#!/bin/bash
# The README's finetune on a socket bed (TOPO, default h200-2x2-sock: 2 nodes x 2 GPUs; h200-2x1-sock:
# 2 nodes x 1 GPU; launcher=local gives each node its own NCCL_HOSTID),
# with its defaults (strategy=confirm, budget=0.5sweep, 8 B - 256 MiB), then validate of its table
# (rounds=3) and plugin verify. Output to $OUT/run.log, what the runs wrote to $OUT/files.tar.gz.
# Usage (repository root, .whl/deps as in ../README.md): OUT=/tmp/w REV=... bash data/h200x4-2026-11-28/confirm/run.sh
set -u
OUT=${OUT:?set OUT}
W=${S:-/tmp/confirm}
TOPO=${TOPO:-h200-2x2-sock}
mkdir -p "$W"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1  # NVLink multicast off on this host
PP=$(mktemp -d); ln -s "$PWD" "$PP/ncclrl"; export PYTHONPATH="$PP:$PWD/.whl/deps" PYTHONUNBUFFERED=1
mkdir -p "$PP/bin"; printf '#!/bin/sh\nexec python3 -m ncclrl "$@"\n' > "$PP/bin/ncclrl"; chmod +x "$PP/bin/ncclrl"
export PATH="$PP/bin:$PATH"  # the ncclrl command, as an installed package gives it
START=$(date +%s)
CALL_S=${CALL_S:-560}
run() {  # run LIMIT_S COMMAND...: its output, wall time and exit code, within what the call has left
  local limit=$1; shift
  local left=$(( CALL_S - ($(date +%s) - START) ))
  [ "$left" -lt "$limit" ] && limit=$left
  if [ "$limit" -lt 20 ]; then echo "# skipped (the call's time is spent): $*"; echo; return; fi
  echo "\$ $*"
  local t0=$(date +%s%N)
  timeout "$limit" "$@"
  local rc=$? t1=$(date +%s%N)
  echo "# exit $rc after $(( (t1 - t0) / 1000000 )) ms"; echo
}
{
  date -u
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  python3 -c "import torch, sys; print(sys.version.split()[0], torch.__version__, torch.cuda.nccl.version())"
  echo "code: revision ${REV:-unknown}"
  run 120 ncclrl plugin build
  run 300 ncclrl finetune topology=$TOPO out="$W/ft" store="$W/ft.sqlite"
  run 170 ncclrl validate "$W/ft/nccl_tuner.csv" conf="$W/ft/nccl.conf" topology=$TOPO rounds=3 \
    out="$W/val.csv" store="$W/val.sqlite"
  run 60 ncclrl plugin verify "$W/ft/nccl_tuner.csv" topology=$TOPO max_bytes=256M iters=0 out="$W/verify"
  date -u
} > "$OUT/run.log" 2>&1
tar -C "$W" --exclude='*.so' -czf "$OUT/files.tar.gz" .
tail -c 7000 "$OUT/run.log"
