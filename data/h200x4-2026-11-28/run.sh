#!/bin/bash
# The README's "On your GPUs" commands, as written, on both beds a 4-GPU host offers:
#   PART=1: 1 node x 4 GPUs over NVLink (sweep grid=default, detect, finetune, validate x3)
#   PART=2: 2 nodes x 2 GPUs over loopback sockets (NCCL_HOSTID per pair: launcher=local emulates
#           the nodes): finetune with its defaults over 8 B - 256 MiB, validate, plugin verify
#   PART=3: e2e of PART 2's table (DDP, a comm-bound model: d_model=512 over sockets)
# Each command's wall time, exit code and output go to $OUT/runN.log; stores, tables, summaries and
# NCCL's own logs to $OUT/partN.tar.gz. The runs keep their files in $S (default /tmp/x4), which
# later parts read (PART=3 reads PART 2's table).
# Usage (repository root, .whl/deps as in data/h100x1-loopback-2026-11-25/README.md; REV: the code's revision):
#   OUT=/tmp/w PART=1 REV=$(git rev-parse --short HEAD) bash data/h200x4-2026-11-28/run.sh
set -u
OUT=${OUT:?set OUT}
PART=${PART:?set PART}
S=${S:-/tmp/x4}
W=$S/part$PART
mkdir -p "$W"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1  # NVLink multicast off on this host
PP=$(mktemp -d); ln -s "$PWD" "$PP/ncclrl"; export PYTHONPATH="$PP:$PWD/.whl/deps" PYTHONUNBUFFERED=1
mkdir -p "$PP/bin"; printf '#!/bin/sh\nexec python3 -m ncclrl "$@"\n' > "$PP/bin/ncclrl"; chmod +x "$PP/bin/ncclrl"
export PATH="$PP/bin:$PATH"  # the ncclrl command, as an installed package gives it
START=$(date +%s)
CALL_S=${CALL_S:-560}  # the device call's limit, less the packing: no command runs past it
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
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  nvidia-smi topo -m | head -6
  python3 -c "import torch, sys; print(sys.version.split()[0], torch.__version__, torch.cuda.nccl.version())"
  echo "code: revision ${REV:-unknown}"
  run 120 ncclrl plugin build
  if [ "$PART" = 1 ]; then
    mkdir -p "$W/logs"
    NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,ENV,GRAPH,TUNING NCCL_DEBUG_FILE="$W/logs/nccl.%h.%p.log" \
      run 100 ncclrl sweep topology=h200-1x4 grid=default min_bytes=8 max_bytes=256M samples=5 store="$W/1x4.sqlite"
    run 60 ncclrl detect "$W"/logs/nccl.*.log -o "$W/1x4.yaml"
    run 150 ncclrl finetune topology="$W/1x4.yaml" out="$W/ft1x4" store="$W/ft1x4.sqlite"
    if grep -v '^#' "$W/ft1x4/nccl_tuner.csv" 2>/dev/null | grep -q .; then  # the table has rows: judge it too
      run 120 ncclrl validate "$W/ft1x4/nccl_tuner.csv" conf="$W/ft1x4/nccl.conf" topology="$W/1x4.yaml" rounds=3 \
        out="$W/val1x4-table.csv" store="$W/val1x4-table.sqlite"
    fi
    # NCCL's own choices by construction (the plugin loads a table with no rows), judged three times
    printf '# no rows: NCCL decides every call\n' > "$W/nccl-own.csv"
    for r in a b c; do
      run 120 ncclrl validate "$W/nccl-own.csv" topology="$W/1x4.yaml" rounds=3 out="$W/val-own-$r.csv" \
        store="$W/val-own-$r.sqlite"
    done
  elif [ "$PART" = 2 ]; then
    run 330 ncclrl finetune topology=h200-2x2-sock out="$W/ft" store="$W/ft.sqlite"
    run 150 ncclrl validate "$W/ft/nccl_tuner.csv" conf="$W/ft/nccl.conf" topology=h200-2x2-sock rounds=3 \
      out="$W/val.csv" store="$W/val.sqlite"
    run 60 ncclrl plugin verify "$W/ft/nccl_tuner.csv" topology=h200-2x2-sock max_bytes=256M iters=0 out="$W/verify"
  elif [ "$PART" = 3 ]; then
    run 500 ncclrl e2e "$S/part2/ft/nccl_tuner.csv" conf="$S/part2/ft/nccl.conf" topology=h200-2x2-sock \
      mode=ddp d_model=512 rounds=${ROUNDS:-8} steps=60 out="$W/e2e"
  fi
  date -u
} > "$OUT/run$PART.log" 2>&1
tar -C "$W" --exclude='*.so' -czf "$OUT/part$PART.tar.gz" .
tail -c 9000 "$OUT/run$PART.log"
