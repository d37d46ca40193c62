# Shared by the docs/live/run_gpu_*.sh scripts (sourced after L, the log file, and END, the deadline
# in bash SECONDS, are set): step SECONDS CMD... runs CMD with a time limit that never passes END,
# logs its output and exit status to $L, and skips it when under 20 s are left.
step() {
  local t=$1 left=$((END - SECONDS)); shift
  if [ "$left" -lt 20 ]; then echo "## skipped (time): $*" >> "$L"; return; fi
  [ "$t" -gt "$left" ] && t=$left
  echo "## $(date +%T) [${t}s] $*" >> "$L"; timeout -k 5 "$t" "$@" >> "$L" 2>&1; echo "## exit $?" >> "$L"
}

# live_setup: what every device script does first: NVLink multicast off, unbuffered Python with
# DEPS on the path, OUT (default live-out) with the store S (a copy of STORE0 or the committed
# store), the log L and the deadline END (BUDGET_S seconds, default 560).
live_setup() {
  export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
  export PYTHONPATH=".:${DEPS:-}"
  OUT=${OUT:-live-out}; mkdir -p "$OUT"; S=$OUT/store.sqlite; L=$OUT/log.txt
  [ -f "$S" ] || cp "${STORE0:-docs/live/h200x4-2026-11-21.sqlite}" "$S"
  END=$((SECONDS + ${BUDGET_S:-560}))
}
