#!/usr/bin/env bash
# One H100 (1 GPU), second run: the recordings again with NCCL's own flight recorder dump, every
# file in one archive; fresh `ncclrl e2e` runs on one rank (where no table can change a step: A/A
# runs that judge the ratio's interval), the small one with the plugin's request log on. Run from
# the repository root:
#   OUT=out bash data/h100x1-jobs-2026-11-24/run2.sh
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
HERE=data/h100x1-jobs-2026-11-24; TOPO=data/h100x1-2026-11-24/h100-1x1.yaml
OUT=${OUT:-out}; mkdir -p "$OUT"; L=$OUT/log.txt
PP=$(mktemp -d); ln -s "$PWD" "$PP/ncclrl"; export PYTHONPATH="$PP:$PWD/.whl/deps"
run() { echo "## $(date +%T) $*" >> "$L"; timeout -k 5 "${T:-240}" "$@" >> "$L" 2>&1; echo "## exit $?" >> "$L"; }
run python3 -c "import torch, sys; print(sys.version.split()[0], torch.__version__, torch.version.cuda, torch.cuda.device_count(), torch.cuda.get_device_name(0), torch.cuda.nccl.version())"
run python3 -m ncclrl plugin build
P=$OUT/profiles
run python3 benchmarks/record_profiles.py --device cuda --nproc 1 --jobs ddp fsdp --steps 3 --warmup 2 \
  --flight-recorder --out "$P"
run python3 benchmarks/check_profiles.py "$P"
for job in ddp fsdp; do
  for kind in trace.json.gz fr.json nccl.log; do
    [ -e "$P/$job-rank0.$kind" ] && run python3 -m ncclrl profile "$P/$job-rank0.$kind" -o "$P/$job.${kind%%.*}.profile.yaml"
  done
done
cp "$HERE/first-run/table.csv" "$HERE/first-run/nccl.conf" "$OUT/"
mkdir -p "$OUT/reqlog"
NCCLRL_TUNER_REQUEST_LOG="$OUT/reqlog/e2e" run python3 -m ncclrl e2e "$OUT/table.csv" conf="$OUT/nccl.conf" \
  topology=$TOPO device=cuda rounds=6 steps=30 warmup=5 out="$OUT/e2e"
ls "$OUT/reqlog" >> "$L" 2>&1; head -20 "$OUT"/reqlog/* >> "$L" 2>&1
T=300 run python3 -m ncclrl e2e "$OUT/table.csv" conf="$OUT/nccl.conf" topology=$TOPO \
  device=cuda rounds=6 steps=30 warmup=5 layers=4 d_model=1024 heads=16 seq_len=512 batch=8 dtype=bfloat16 \
  launcher=torchrun out="$OUT/e2e-large"
tar -czf "$OUT/profiles.tar.gz" -C "$OUT" profiles reqlog && rm -rf "$P" "$OUT/reqlog"
