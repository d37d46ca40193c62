# Shared by the docs/live/run_gpu_*.sh scripts (sourced after L, the log file, and END, the deadline
# in bash SECONDS, are set): step SECONDS CMD... runs CMD with a time limit that never passes END,
# logs its output and exit status to $L, and skips it when under 20 s are left.
step() {
  local t=$1 left=$((END - SECONDS)); shift
  if [ "$left" -lt 20 ]; then echo "## skipped (time): $*" >> "$L"; return; fi
  [ "$t" -gt "$left" ] && t=$left
  echo "## $(date +%T) [${t}s] $*" >> "$L"; timeout -k 5 "$t" "$@" >> "$L" 2>&1; echo "## exit $?" >> "$L"
}
