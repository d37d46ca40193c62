#!/bin/bash
# The README's "On your GPUs" commands as written, with the report on stdout and the progress on
# stderr kept apart, on the 2 nodes x 2 GPUs socket bed of a 4-GPU host (launcher=local gives each
# pair its own NCCL_HOSTID), then sweep's new defaults on the 1 node x 4 GPUs NVLink bed.
#   PART=1: plugin build; finetune topology=h200-2x2-sock out=runs/ft; show of its table; validate
#           rounds=3; sweep topology=h200-1x4 grid=default (eager, 5 samples, 120 s: sweep's defaults)
#   PART=2: e2e of PART 1's table (FT=: its folder) (DDP, d_model=512 over sockets): step times and steps.png
#   PART=3: plugin build and plugin verify of PART 1's table (FT=: its folder), decisions only (iters=0)
#   PART=4: tune method=random on 2 nodes x 2 GPUs (its report on stdout, its per-size plot)
# Each command's stdout, stderr, exit code and wall time go to $OUT/runN.log (stdout and stderr
# each under its own heading); what the runs wrote to $OUT/partN.tar.gz. Files stay in $S.
# Usage (repository root, .whl/deps carried; REV: the code's revision):
#   OUT=/tmp/w PART=1 REV=$(git rev-parse --short HEAD) bash data/h200x4-2026-11-28/commands/run.sh
set -u
OUT=${OUT:?set OUT}
PART=${PART:?set PART}
S=${S:-/tmp/cmds}
mkdir -p "$S"
cd "$S" || exit 1
REPO=${REPO:-$OLDPWD}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1  # NVLink multicast off on this host
PP=$(mktemp -d); ln -s "$REPO" "$PP/ncclrl"; export PYTHONPATH="$PP:$REPO/.whl/deps" PYTHONUNBUFFERED=1
mkdir -p "$PP/bin"; printf '#!/bin/sh\nexec python3 -m ncclrl "$@"\n' > "$PP/bin/ncclrl"; chmod +x "$PP/bin/ncclrl"
export PATH="$PP/bin:$PATH"  # the ncclrl command, as an installed package gives it
START=$(date +%s)
CALL_S=${CALL_S:-560}
run() {  # run LIMIT_S COMMAND...: stdout and stderr apart, wall time and exit code
  local limit=$1; shift
  local left=$(( CALL_S - ($(date +%s) - START) ))
  [ "$left" -lt "$limit" ] && limit=$left
  if [ "$limit" -lt 20 ]; then echo "# skipped (the call's time is spent): $*"; echo; return; fi
  echo "\$ $*"
  local t0=$(date +%s%N)
  timeout "$limit" "$@" > "$S/.out" 2> "$S/.err"
  local rc=$? t1=$(date +%s%N)
  echo "## stdout"; cat "$S/.out"; echo "## stderr"; grep -v '^# round' "$S/.err" | tail -40
  echo "# exit $rc after $(( (t1 - t0) / 1000000 )) ms"; echo
}
{
  date -u
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python3 -c "import torch, sys; print(sys.version.split()[0], torch.__version__, torch.cuda.nccl.version())"
  echo "code: revision ${REV:-unknown}"
  if [ "$PART" = 1 ]; then
    run 120 ncclrl plugin build
    run 330 ncclrl finetune topology=h200-2x2-sock out=runs/ft
    run 30 ncclrl show runs/ft/nccl_tuner.csv
    run 150 ncclrl validate runs/ft/nccl_tuner.csv conf=runs/ft/nccl.conf topology=h200-2x2-sock rounds=3 out=runs/val.csv
    run 90 ncclrl sweep topology=h200-1x4 grid=default store=runs/store.sqlite
  elif [ "$PART" = 2 ]; then
    FT=${FT:-runs/ft}  # PART 1's table (a later call: its copy in the repository, FT=$REPO/...)
    run 500 ncclrl e2e "$FT/nccl_tuner.csv" conf="$FT/nccl.conf" topology=h200-2x2-sock mode=ddp d_model=512 \
      rounds=${ROUNDS:-6} steps=60 out=runs/e2e
  elif [ "$PART" = 3 ]; then
    FT=${FT:-runs/ft}
    run 120 ncclrl plugin build
    run 200 ncclrl plugin verify "$FT/nccl_tuner.csv" topology=h200-2x2-sock max_bytes=256M iters=0 out=runs/verify
  elif [ "$PART" = 4 ]; then
    run 60 ncclrl plugin build
    run 300 ncclrl tune method=random backend=torch topology=h200-2x2-sock budget=5min wall_s=150 out=runs/tune \
      store=runs/tune.sqlite
  fi
  date -u
} > "$OUT/run$PART.log" 2>&1
tar -C "$S" --exclude='*.so' --exclude='.out' --exclude='.err' -czf "$OUT/part$PART.tar.gz" runs
tail -c 9000 "$OUT/run$PART.log"
