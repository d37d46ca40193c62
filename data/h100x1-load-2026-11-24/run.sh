#!/usr/bin/env bash
# One H100 (1 GPU): `ncclrl sweep load=gemm` against the same sweep alone. Every sample of an
# AllReduce runs beside bf16 matrix products on a stream of their own; the store keeps the
# collective's times under load and the products' slowdown. On one rank NCCL's AllReduce is a
# device-local copy, so this shows the load path on a GPU and the copy/compute contention, not
# how channels trade against compute. Run from the repository root:
#   OUT=out bash data/h100x1-load-2026-11-24/run.sh
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
TOPO=data/h100x1-2026-11-24/h100-1x1.yaml
OUT=${OUT:-out}; mkdir -p "$OUT"; L=$OUT/log.txt
PP=$(mktemp -d); ln -s "$PWD" "$PP/ncclrl"; export PYTHONPATH="$PP:$PWD/.whl/deps"
run() { echo "## $(date +%T) $*" >> "$L"; timeout -k 5 "${T:-240}" "$@" >> "$L" 2>&1; echo "## exit $?" >> "$L"; }
run python3 -c "import torch, sys; print(sys.version.split()[0], torch.__version__, torch.cuda.get_device_name(0), torch.cuda.nccl.version())"
run python3 -m ncclrl plugin build
for load in none gemm; do
  for timing in eager graph; do
    run python3 -m ncclrl sweep topology=$TOPO grid=default min_bytes=1K max_bytes=256M samples=5 launch=nccl \
      timing=$timing load=$load load_n=4096 tag=sweep-$timing store="$OUT/store.sqlite" timeout_s=120
  done
done
run python3 - "$OUT/store.sqlite" <<'PY'
import sys
import numpy as np
from ncclrl.envs.store import Store
f = Store(sys.argv[1]).frame(status="ok")
f["slowdown"] = f["compute_slowdown"].map(lambda s: float(np.median(s)) if s else float("nan"))
for timing in ("eager", "graph"):
    a = f[f.tag == f"sweep-{timing}"].set_index("nbytes")
    b = f[f.tag == f"sweep-{timing}+gemm4096"].set_index("nbytes")
    print(f"# {timing}: AllReduce alone and beside 4096 x 4096 bf16 products (median of 5 samples)")
    print("nbytes,time_us_alone,time_us_loaded,collective_slowdown,compute_slowdown")
    for n in sorted(set(a.index) & set(b.index)):
        print(f"{n},{a.loc[n, 'median_us']:.2f},{b.loc[n, 'median_us']:.2f},"
              f"{b.loc[n, 'median_us'] / a.loc[n, 'median_us']:.3f},{b.loc[n, 'slowdown']:.3f}")
PY
