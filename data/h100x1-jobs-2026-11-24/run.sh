#!/usr/bin/env bash
# One H100 (1 GPU): a training job's collectives recorded in every form `ncclrl profile` reads
# (NCCL COLL logs, profiler traces with GPU kernels, flight recorder JSON) and checked against the
# job's own count; `ncclrl e2e` with NCCL on the GPU, NCCL's defaults against a table. Run from the
# repository root:
#   OUT=out bash data/h100x1-jobs-2026-11-24/run.sh
# DEPS (.whl/deps): the Python packages the GPU image lacks (hydra-core, omegaconf, antlr4, gymnasium,
# stable-baselines3, sb3-contrib), installed with pip --target.
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
HERE=data/h100x1-jobs-2026-11-24
OUT=${OUT:-out}; mkdir -p "$OUT"; L=$OUT/log.txt
PP=$(mktemp -d); ln -s "$PWD" "$PP/ncclrl"; export PYTHONPATH="$PP:$PWD/.whl/deps"
run() { echo "## $(date +%T) $*" >> "$L"; timeout -k 5 "${T:-240}" "$@" >> "$L" 2>&1; echo "## exit $?" >> "$L"; }
run python3 -c "import torch, sys; print(sys.version.split()[0], torch.__version__, torch.version.cuda, torch.cuda.device_count(), torch.cuda.get_device_name(0), torch.cuda.nccl.version())"
run python3 -m ncclrl plugin build
# 1. DDP and FSDP on the GPU (one rank, NCCL): traces, the job's own count, flight recorder, NCCL's COLL log
run python3 benchmarks/record_profiles.py --device cuda --nproc 1 --jobs ddp fsdp --steps 3 --warmup 2 \
  --flight-recorder --out "$OUT/profiles"
run python3 benchmarks/check_profiles.py "$OUT/profiles"
for job in ddp fsdp; do
  for kind in trace.json.gz fr.json nccl.log; do
    ls "$OUT/profiles/$job-rank0.$kind" >/dev/null 2>&1 && \
      run python3 -m ncclrl profile "$OUT/profiles/$job-rank0.$kind" -o "$OUT/profiles/$job.${kind%%.*}.profile.yaml"
  done
done
# 2. ncclrl e2e with NCCL: the table forces Ring/Simple with 8 channels for every AllReduce, AllGather
#    and ReduceScatter (on one rank NCCL runs no algorithm, so both sides should tie)
python3 - "$OUT/table.csv" <<'PY'
import sys
from ncclrl.costmodel.table import format_row
rows = [format_row(c, 0, 1 << 34, "ring", "simple", 8) for c in ("allreduce", "allgather", "reducescatter")]
open(sys.argv[1], "w").write("\n".join(rows) + "\n")
PY
printf 'NCCL_BUFFSIZE=4194304\n' > "$OUT/nccl.conf"
run python3 -m ncclrl e2e "$OUT/table.csv" conf="$OUT/nccl.conf" topology=$HERE/../h100x1-2026-11-24/h100-1x1.yaml \
  device=cuda rounds=3 steps=30 warmup=5 out="$OUT/e2e"
T=300 run python3 -m ncclrl e2e "$OUT/table.csv" conf="$OUT/nccl.conf" topology=$HERE/../h100x1-2026-11-24/h100-1x1.yaml \
  device=cuda rounds=3 steps=30 warmup=5 layers=4 d_model=1024 heads=16 seq_len=512 batch=8 dtype=bfloat16 \
  launcher=torchrun out="$OUT/e2e-large"
