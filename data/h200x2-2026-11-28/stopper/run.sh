#!/bin/bash
# finetune with the installed stopping agent (strategy=confirm-ppo) as the README writes the
# command, on emulated socket nodes of one host (TOPO: h200-2x2-sock on 4 GPUs, the default, or
# h200-2x1-sock on 2; launcher=local gives each node its own NCCL_HOSTID), its report on stdout
# and its progress on stderr kept apart, then show of its table.
# stdout, stderr, exit code and wall time go to $OUT/run.log; what the run wrote to $OUT/stopper.tar.gz.
# Usage (repository root, .whl/deps carried; REV: the code's revision):
#   OUT=/tmp/w REV=$(git rev-parse --short HEAD) [TOPO=h200-2x1-sock] bash data/h200x2-2026-11-28/stopper/run.sh
set -u
OUT=${OUT:?set OUT}
S=${S:-/tmp/cmds}
mkdir -p "$S"
cd "$S" || exit 1
REPO=${REPO:-$OLDPWD}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1  # NVLink multicast off on this host
PP=$(mktemp -d); ln -s "$REPO" "$PP/ncclrl"; export PYTHONPATH="$PP:$REPO/.whl/deps" PYTHONUNBUFFERED=1
mkdir -p "$PP/bin"; printf '#!/bin/sh\nexec python3 -m ncclrl "$@"\n' > "$PP/bin/ncclrl"; chmod +x "$PP/bin/ncclrl"
export PATH="$PP/bin:$PATH"  # the ncclrl command, as an installed package gives it
START=$(date +%s)
CALL_S=${CALL_S:-330}
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
  run 300 ncclrl finetune topology=${TOPO:-h200-2x2-sock} strategy=confirm-ppo out=runs/ft-ppo
  run 20 ncclrl show runs/ft-ppo/nccl_tuner.csv
  date -u
} > "$OUT/run.log" 2>&1
tar czf "$OUT/stopper.tar.gz" runs
tail -c 6000 "$OUT/run.log"
