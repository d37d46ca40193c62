#!/bin/bash
# plugin verify, as the README writes it, on a table whose rows state NCCL's choice at every size
# (marked #ncclrl:nccl-choice): 2 GPUs of one host as 2 nodes x 1 GPU over loopback sockets
# (launcher=local gives each rank its own NCCL_HOSTID). The table is the one `ncclrl finetune`
# writes replaying the recorded 2 x H200 sweep (no row confirmed: NCCL's choice everywhere).
# Usage (repository root, .whl/deps as in data/h200x4-2026-11-28/README.md):
#   OUT=/tmp/w REV=$(git rev-parse --short HEAD) bash data/h200x2-2026-11-28/run.sh
set -u
OUT=${OUT:?set OUT}
W=$(mktemp -d)
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1  # NVLink multicast off on this host
PP=$(mktemp -d); ln -s "$PWD" "$PP/ncclrl"; export PYTHONPATH="$PP:$PWD/.whl/deps" PYTHONUNBUFFERED=1
mkdir -p "$PP/bin"; printf '#!/bin/sh\nexec python3 -m ncclrl "$@"\n' > "$PP/bin/ncclrl"; chmod +x "$PP/bin/ncclrl"
export PATH="$PP/bin:$PATH"
run() { echo "\$ $*"; local t0=$(date +%s%N); timeout 240 "$@"; local rc=$? t1=$(date +%s%N)
        echo "# exit $rc after $(( (t1 - t0) / 1000000 )) ms"; echo; }
{
  date -u
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python3 -c "import torch, sys; print(sys.version.split()[0], torch.__version__, torch.cuda.nccl.version())"
  echo "code: revision ${REV:-unknown}"
  run ncclrl plugin build
  run ncclrl finetune backend=replay replay_store=data/h200x2-2026-11-22/store.sqlite topology=h200-2x1-sock \
    launch=nccl collectives=[allreduce] budget=120 store="$W/ft.sqlite" out="$W/table"
  run ncclrl show "$W/table/nccl_tuner.csv"
  run ncclrl plugin verify "$W/table/nccl_tuner.csv" topology=h200-2x1-sock max_bytes=256M iters=5 out="$W/verify"
  date -u
} > "$OUT/run.log" 2>&1
tar -C "$W" -czf "$OUT/verify.tar.gz" table verify
tail -c 6000 "$OUT/run.log"
