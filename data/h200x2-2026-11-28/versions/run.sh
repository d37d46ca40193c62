#!/bin/bash
# ncclrl plugin verify and ncclrl detect on several NCCL releases, on one host of 2 x H200:
# PyTorch's own NCCL (2.28.9) and NCCL built here from NVIDIA's public sources (2.30.7 and the
# 2.31.0 prerelease of the dev branch), each loaded into PyTorch's workers with LD_PRELOAD.
# Two beds: 1 node x 2 GPUs over NVLink (h200-1x2.yaml) and 2 nodes x 1 GPU over loopback sockets
# (h200-2x1-sock: launcher=local gives each rank its own NCCL_HOSTID).
# NCCL is built for sm_90 only and with the device kernels the checks call (ONLY_FUNCS below: the
# decision code on the host is NCCL's whole); its sources come as third_party/nccl-<v>.tar.gz
# (git archive of NVIDIA/nccl at v2.30.7-1 and dev 86fa684d, Makefile makefiles src), never committed.
# Usage (repository root, .whl/deps as in data/h200x4-2026-11-28/README.md):
#   OUT=/tmp/w REV=$(git rev-parse --short HEAD) VERSIONS="2.30.7 2.31.0" [NCCLS="torch 2.30.7 2.31.0"] \
#     [ITERS=3] [ONLINE=2.31.0] bash data/h200x2-2026-11-28/versions/run.sh
# TABLE=<csv>: verify that table instead of table-handmade.csv; BEDS: the beds (default both).
# ONLINE=<v>: also a short online-mode job (ncclrl e2e online=true, DDP, 2 rounds x 60 steps) on NCCL <v>.
set -u
OUT=${OUT:?set OUT}
HERE=data/h200x2-2026-11-28/versions
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1  # NVLink multicast off on this host
PP=$(mktemp -d); ln -s "$PWD" "$PP/ncclrl"; export PYTHONPATH="$PP:$PWD/.whl/deps" PYTHONUNBUFFERED=1
mkdir -p "$PP/bin"; printf '#!/bin/sh\nexec python3 -m ncclrl "$@"\n' > "$PP/bin/ncclrl"; chmod +x "$PP/bin/ncclrl"
export PATH="$PP/bin:$PATH"
B=${NCCL_BUILD:-/tmp/nccl-builds}; W=$(mktemp -d); mkdir -p "$B" "$OUT/logs"
FUNCS="(AllReduce|Reduce|ReduceScatter) (Sum|MinMax) (f32|f64|bf16|f16|i32|i64|u8) [^ ]* [^ ]*|AllGather [^ ]* [^ ]*|AllGatherV [^ ]* [^ ]*|Broadcast [^ ]* [^ ]*|SendRecv"
build() {  # build NCCL $1 into $B/build-$1 (skipped when already built)
  local v=$1 t0=$(date +%s)
  [ -f "$B/build-$v/lib/libnccl.so" ] && { echo "NCCL $v already built"; return 0; }
  tar -C "$B" -xzf third_party/nccl-$v.tar.gz
  make -C "$B/nccl-$v/src" -j${JOBS:-16} lib BUILDDIR="$B/build-$v" ONLY_FUNCS="$FUNCS" \
    NVCC_GENCODE="-gencode=arch=compute_90,code=sm_90" > "$OUT/logs/build-$v.log" 2>&1
  echo "NCCL $v build exit $? after $(( $(date +%s) - t0 )) s"
}
run() { echo "\$ $*"; local t0=$(date +%s%N); timeout ${STEP_S:-150} "$@"; local rc=$? t1=$(date +%s%N)
        echo "# exit $rc after $(( (t1 - t0) / 1000000 )) ms"; echo; }
{
  date -u
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python3 -c "import torch, sys; print(sys.version.split()[0], torch.__version__, torch.cuda.nccl.version())"
  echo "code: revision ${REV:-unknown}; nproc $(nproc); $(nvcc --version | tail -1)"
  run ncclrl plugin build
  for v in ${VERSIONS:-2.30.7 2.31.0}; do build $v & done; wait
  for v in ${NCCLS:-torch ${VERSIONS:-2.30.7 2.31.0}}; do
    if [ $v = torch ]; then unset LD_PRELOAD; else export LD_PRELOAD="$B/build-$v/lib/libnccl.so.2"; fi
    [ $v != torch ] && [ ! -f "$LD_PRELOAD" ] && { echo "NCCL $v: not built"; continue; }
    for bed in ${BEDS:-h200-1x2 h200-2x1-sock}; do
      topo=$bed; [ $bed = h200-1x2 ] && topo=$HERE/h200-1x2.yaml
      run ncclrl plugin verify ${TABLE:-$HERE/table-handmade.csv} topology=$topo max_bytes=256M iters=${ITERS:-0} \
        out="$W/verify-$v-$bed"
      grep -h -m1 "NCCL version" "$W/verify-$v-$bed/nccl-plugin/nccl-rank0.log"
      grep -h -m1 "TUNER/ncclrl: table from" "$W/verify-$v-$bed/nccl-plugin/nccl-rank0.log"
      grep -h -m2 "TUNER/Plugin\|PROFILER/Plugin" "$W/verify-$v-$bed/nccl-plugin/nccl-rank0.log"
      grep -h -m1 "TUNER/ncclrl: .*means what its rows say" "$W/verify-$v-$bed/nccl-plugin/nccl-rank0.log"
      run ncclrl detect "$W/verify-$v-$bed/nccl-default/nccl-rank0.log" -o "$W/verify-$v-$bed/detected.yaml"
    done
    if [ -n "${ONLINE:-}" ] && [ $v = "${ONLINE}" ]; then  # the online mode on this NCCL: 2 nodes x 1 GPU, DDP
      T=$(mktemp -d); mkdir -p "$W/online-$v"; tar -C "$T" -xzf data/h200x2-2026-11-28/confirm/files3.tar.gz ./ft/nccl_tuner.csv
      NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,TUNING NCCL_DEBUG_FILE="$W/online-$v/nccl.%h.%p.log" \
        run ncclrl e2e "$T/ft/nccl_tuner.csv" topology=h200-2x1-sock mode=ddp online=true rounds=2 steps=60 \
        warmup=3 d_model=512 out="$W/online-$v/e2e"
      grep -h "PROFILER/Plugin\|TUNER/Plugin" "$W"/online-$v/nccl.*.log | sort | uniq -c
      grep -h "online" "$W"/online-$v/nccl.*.log | grep -c "commit" || true
      rm -f "$W/online-$v/e2e/coordinator.secret"
    fi
  done
  unset LD_PRELOAD
  date -u
} > "$OUT/run.log" 2>&1
tar -C "$W" -czf "$OUT/verify.tar.gz" .
tail -c 9000 "$OUT/run.log"
