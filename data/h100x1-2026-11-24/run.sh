#!/usr/bin/env bash
# One H100 (1 GPU): the launch path of every launcher that exists there, up to NCCL's communicator
# and through a short sweep, with the table handed to the plugin in NCCLRL_TUNER_TABLE_DATA; NCCL's
# INFO log of this machine for `ncclrl detect`. Run from the repository root:
#   OUT=out bash data/h100x1-2026-11-24/run.sh
# DEPS (.whl/deps): the Python packages the GPU image lacks (hydra-core, omegaconf, antlr4, gymnasium,
# stable-baselines3, sb3-contrib), installed with pip --target.
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
OUT=${OUT:-out}; mkdir -p "$OUT"; L=$OUT/log.txt
PP=$(mktemp -d); ln -s "$PWD" "$PP/ncclrl"; export PYTHONPATH="$PP:$PWD/.whl/deps"
run() { echo "## $(date +%T) $*" >> "$L"; timeout -k 5 "${T:-240}" "$@" >> "$L" 2>&1; echo "## exit $?" >> "$L"; }
run python3 -c "import torch, sys; print(sys.version.split()[0], torch.__version__, torch.version.cuda, torch.cuda.device_count(), torch.cuda.get_device_name(0), torch.cuda.nccl.version())"
run bash -c "which torchrun mpirun srun; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader"
run python3 -m ncclrl plugin build
# 1. NCCL's own log on this machine (one rank: init, graph and environment lines)
NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,GRAPH,ENV,TUNING NCCL_DEBUG_FILE="$OUT/h100-nccl-info.%h.%p.log" \
  run python3 -m ncclrl sweep launcher=local topology=data/h100x1-2026-11-24/h100-1x1.yaml \
  grid=default min_bytes=8 max_bytes=64K samples=3 timeout_s=60 tag=nccl-info store="$OUT/store.sqlite"
run python3 -m ncclrl detect "$OUT"/h100-nccl-info.*.log -o "$OUT/h100-detected.yaml"
# 2. a sweep through torchrun (one agent, c10d rendezvous), NCCL called directly and through
#    torch.distributed, the per-call configurations forced by the table in the environment; the
#    plugin's own INFO line (fingerprint) and NCCL's decisions kept in the job logs
for launch in nccl torch; do
  NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=TUNING run python3 -m ncclrl sweep launcher=torchrun \
    topology=data/h100x1-2026-11-24/h100-1x1.yaml grid=full min_bytes=8 max_bytes=1M samples=3 timeout_s=60 \
    launch=$launch store="$OUT/store.sqlite" log_dir="$OUT/jobs-torchrun-$launch"
done
# 3. the same through mpirun where Open MPI is installed
if command -v mpirun >/dev/null; then
  OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=TUNING \
    run python3 -m ncclrl sweep launcher=mpirun topology=data/h100x1-2026-11-24/h100-1x1.yaml grid=full \
    min_bytes=8 max_bytes=1M samples=3 timeout_s=60 launch=torch tag=sweep-mpirun store="$OUT/store.sqlite" \
    log_dir="$OUT/jobs-mpirun"
fi
# 4. what the store says ran each job
run python3 -c "
from ncclrl.envs.store import Store
s = Store('$OUT/store.sqlite'); j = s.jobs(); f = s.frame()
print(j[['launcher', 'nccl_version', 'gpus', 'driver', 'cuda', 'hosts', 'ranks_reported']].drop_duplicates().to_string())
print(f.groupby(['timing', 'status']).size().to_string())
"
# the plugin's table lines, and rows it rejected (none: every point runs at a size of its own)
for d in "$OUT"/jobs-*; do
  echo "$d: $(grep -c 'table from NCCLRL_TUNER_TABLE_DATA' "$d/launcher.log") tables loaded from the environment," \
    "$(grep -c 'WARN.*rejected' "$d/launcher.log") rows rejected" >> "$L"
done
for d in "$OUT"/jobs-*; do cp "$d/launcher.log" "$OUT/$(basename "$d").launcher.log"; rm -rf "$d"; done
