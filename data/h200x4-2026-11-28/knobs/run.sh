#!/bin/bash
# Exhaustive per-call AllReduce sweeps under several knob settings, on one of three beds a 4-GPU host
# offers, each point measured in several jobs (benchmarks/record_repeats.py sweep: rounds over the
# settings, one job per setting and round, every per-call configuration of the full grid at every
# size from 8 B to 256 MiB, 5 samples, launch=nccl timing=eager, tag sweep-repeat):
#   BED=4x1: 4 nodes x 1 GPU over TCP sockets on loopback (topology=h200-4x1-sock; launcher=local
#            gives each GPU its own NCCL_HOSTID). First NCCL's INFO log of one small sweep job and
#            `ncclrl detect` on it (the channels, rings and trees NCCL built on this bed).
#            Settings: NCCL's defaults; NCCL_SOCKET_INLINE=256K; that with 2 threads x 4 sockets and
#            4 channels.
#   BED=2x2: 2 nodes x 2 GPUs over sockets (topology=h200-2x2-sock). Settings: NCCL's defaults;
#            2 threads x 4 sockets; 4 threads x 4 sockets with 4 channels.
#   BED=1x4: 1 node x 4 GPUs over NVLink (topology=h200-1x4). Settings: NCCL's channels or 48, each
#            with NCCL_BUFFSIZE of NCCL's own 4 MiB, 2 MiB and 8 MiB.
# Rounds stop at wall_s (WALL_S, default 430 s, less what the probe took) so the call ends in time.
# Output to $OUT/run-$BED.log, the store to $OUT/$BED.sqlite.
# Usage (repository root, .whl/deps as in ../README.md; REV: the code's revision):
#   OUT=/tmp/w BED=4x1 REV=$(git rev-parse --short HEAD) bash data/h200x4-2026-11-28/knobs/run.sh
set -u
OUT=${OUT:?set OUT}
BED=${BED:?set BED to 4x1, 2x2 or 1x4}
START=$(date +%s)
CALL_S=${CALL_S:-540}  # the device call's limit, less the packing: nothing runs past it
case "$BED" in
  4x1) TOPO=h200-4x1-sock; ROUNDS=3
       SETTINGS='[{}, {socket_inline_bytes: 262144}, {comm_channels: 4, socket_nthreads: 2, nsocks_perthread: 4, socket_inline_bytes: 262144}]' ;;
  2x2) TOPO=h200-2x2-sock; ROUNDS=3
       SETTINGS='[{}, {socket_nthreads: 2, nsocks_perthread: 4}, {comm_channels: 4, socket_nthreads: 4, nsocks_perthread: 4}]' ;;
  1x4) TOPO=h200-1x4; ROUNDS=4
       SETTINGS='[{}, {comm_channels: 48}, {buffsize_bytes: 2097152}, {comm_channels: 48, buffsize_bytes: 2097152}, {buffsize_bytes: 8388608}, {comm_channels: 48, buffsize_bytes: 8388608}]' ;;
  *) echo "BED: unknown $BED; allowed: 4x1, 2x2, 1x4" >&2; exit 2 ;;
esac
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1  # NVLink multicast off on this host
PP=$(mktemp -d); ln -s "$PWD" "$PP/ncclrl"; export PYTHONPATH="$PP:$PWD/.whl/deps" PYTHONUNBUFFERED=1
COMMON="topology=$TOPO min_bytes=8 max_bytes=256M samples=5 timing=eager launch=nccl timeout_s=120"
left() { echo $(( CALL_S - ($(date +%s) - START) )); }
{
  date -u
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python3 -c "import torch, sys; print(sys.version.split()[0], torch.__version__, torch.cuda.nccl.version())"
  echo "code: revision ${REV:-unknown}"
  echo "\$ python3 -m ncclrl plugin build"
  timeout 120 python3 -m ncclrl plugin build
  echo "# exit $?"
  if [ "$BED" = 4x1 ]; then
    L=$(mktemp -d)
    echo "\$ NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,ENV,NET,GRAPH,TUNING NCCL_DEBUG_FILE=... python3 -m ncclrl sweep topology=$TOPO grid=default min_bytes=1M max_bytes=1M samples=1 store=probe.sqlite"
    NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,ENV,NET,GRAPH,TUNING NCCL_DEBUG_FILE="$L/nccl.%h.%p.log" timeout 90 \
      python3 -m ncclrl sweep topology=$TOPO grid=default min_bytes=1M max_bytes=1M samples=1 store="$L/probe.sqlite"
    echo "# exit $?"
    echo "\$ python3 -m ncclrl detect nccl.*.log -o 4x1.yaml"
    timeout 60 python3 -m ncclrl detect "$L"/nccl.*.log -o "$L/4x1.yaml"
    echo "# exit $?"
    cat "$L/4x1.yaml"
    echo "# NCCL's INFO lines on channels, rings and trees (all ranks):"
    grep -h -E "nNodes|coll channels|Pattern|Trees|Channel 0[0-3]/|NCCL_SOCKET|Using network|NET/Socket : Using" "$L"/nccl.*.log \
      | sed -E 's/^.*NCCL INFO //' | sort | uniq -c | head -80
  fi
  WALL=${WALL_S:-430}; MAXW=$(( $(left) - 50 )); [ "$MAXW" -lt "$WALL" ] && WALL=$MAXW
  echo "\$ python3 benchmarks/record_repeats.py sweep $COMMON rounds=$ROUNDS wall_s=$WALL settings='$SETTINGS'"
  timeout -k 10 $(( $(left) - 5 )) python3 benchmarks/record_repeats.py sweep $COMMON store="$OUT/$BED.sqlite" \
    rounds=$ROUNDS wall_s=$WALL settings="$SETTINGS"
  echo "# exit $?"
  date -u
} > "$OUT/run-$BED.log" 2>&1
grep -v "too slow" "$OUT/run-$BED.log" | tail -c 9000
