#!/bin/bash
# Re-record the 2 nodes x 2 GPUs socket bed (NCCL_HOSTID per pair, launcher=local) with several jobs
# per point, and measure repeats inside one job:
#   1. benchmarks/record_repeats.py in-job: 2 jobs under NCCL's defaults, each point of every other
#      size measured twice in the job
#   2. benchmarks/record_repeats.py sweep: 3 rounds over the knob settings that matter (NCCL's
#      defaults; NCCL_SOCKET_INLINE=256K; that with 2 threads x 4 sockets and 4 channels, the
#      recorded optimum), 8 B - 256 MiB, every per-call configuration, one job per setting and round
# Output to $OUT/run.log, the stores to $OUT/in-job.sqlite and $OUT/sweep.sqlite.
# Usage (repository root, .whl/deps as in ../README.md): OUT=/tmp/w REV=... bash data/h200x4-2026-11-28/repeats/run.sh
set -u
OUT=${OUT:?set OUT}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1  # NVLink multicast off on this host
PP=$(mktemp -d); ln -s "$PWD" "$PP/ncclrl"; export PYTHONPATH="$PP:$PWD/.whl/deps" PYTHONUNBUFFERED=1
COMMON="topology=h200-2x2-sock min_bytes=8 max_bytes=256M samples=5 timing=eager launch=nccl timeout_s=120"
{
  date -u
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  python3 -c "import torch, sys; print(sys.version.split()[0], torch.__version__, torch.cuda.nccl.version())"
  echo "code: revision ${REV:-unknown}"
  python3 -m ncclrl plugin build
  echo "\$ python3 benchmarks/record_repeats.py in-job $COMMON jobs=2 repeats=2 every=2"
  python3 benchmarks/record_repeats.py in-job $COMMON store="$OUT/in-job.sqlite" jobs=2 repeats=2 every=2
  echo "# exit $?"
  echo "\$ python3 benchmarks/record_repeats.py sweep $COMMON rounds=3 wall_s=${WALL_S:-370} settings=..."
  python3 benchmarks/record_repeats.py sweep $COMMON store="$OUT/sweep.sqlite" rounds=3 wall_s=${WALL_S:-370} \
    settings='[{}, {socket_inline_bytes: 262144}, {comm_channels: 4, socket_nthreads: 2, nsocks_perthread: 4, socket_inline_bytes: 262144}]'
  echo "# exit $?"
  date -u
} > "$OUT/run.log" 2>&1
tail -c 8000 "$OUT/run.log"
