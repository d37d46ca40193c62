#!/usr/bin/env bash
# The whole live chain on ONE GPU: two ranks on GPU 0, each its own node (NCCL_HOSTID), over TCP
# sockets on loopback (topology h100-2x1-loopback, launcher.share_gpu=true). Its times are not a
# cluster's: the GPU time-slices the two processes (~4.5 ms a call up to ~2 MiB).
#   PART=1: ncclrl plugin build; the S-curve sweep with NCCL's INFO log (ncclrl detect reads it);
#           a full-grid sweep at 8-64 MiB; ncclrl finetune (small budget)
#   PART=2: ncclrl validate of the fine-tuned table (rounds=3); ncclrl plugin verify of it and of a
#           hand-made table; ncclrl e2e (DDP, NCCL's defaults vs the fine-tuned table)
#   PART=3: ncclrl plugin verify of both tables, decisions only (iters=0: rooted collectives' times
#           are bimodal on this bed, see README.md); ncclrl e2e with a model whose DDP bucket
#           (~7 MiB) falls in a row of the table; the full-grid sweep resumed ($STORE: the store so far)
#   PART=4: the current method: ncclrl finetune with its defaults under a GPU-time budget (FT_BUDGET,
#           default 6min; FT_WALL_S, default 330), ncclrl
#           validate of its table (rounds=3), ncclrl plugin verify of it (iters=0)
# Run from the repository root: OUT=out PART=1 bash data/h100x1-loopback-2026-11-25/run.sh
# PART=2 reads the fine-tuned table from $FT (default: part1/finetuned/ in this folder).
# .whl/deps holds the Python packages the GPU image lacks (hydra-core, omegaconf,
# antlr4-python3-runtime, gymnasium, Farama-Notifications, stable-baselines3, sb3-contrib), made
# with pip install --no-deps --target. Everything it makes is under $OUT; bundle.tgz holds it all.
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
D=$(dirname "$0")
OUT=${OUT:-out}; mkdir -p "$OUT"; L=${LOG:-$OUT/log.txt}; PART=${PART:-1}  # LOG: the log elsewhere as it grows
FT=${FT:-$D/part1/finetuned}
PP=$(mktemp -d); ln -s "$PWD" "$PP/ncclrl"; export PYTHONPATH="$PP:$PWD/.whl/deps"
END=$(( $(date +%s) + ${BUDGET_S:-560} ))  # every step ends by then, so that the bundle is written
run() {  # run LIMIT_S CMD...: at most LIMIT_S seconds, never past END
  local lim=$1; shift
  local left=$(( END - $(date +%s) ))
  (( lim > left )) && lim=$left
  if (( lim < 10 )); then echo "## $(date +%T) SKIPPED (no time left): $*" | tee -a "$L"; return; fi
  echo "## $(date +%T) [${lim}s] $*" | tee -a "$L"
  timeout -k 5 "$lim" "$@" 2>&1 | tee -a "$L"
  echo "## exit ${PIPESTATUS[0]}" | tee -a "$L"
}
T="topology=h100-2x1-loopback launcher.share_gpu=true"
S="store=$OUT/store.sqlite"
run 60 python3 -c "import torch, sys, hydra, gymnasium, stable_baselines3, sb3_contrib; print(sys.version.split()[0], torch.__version__, torch.version.cuda, torch.cuda.device_count(), torch.cuda.get_device_name(0), torch.cuda.nccl.version())"
run 20 bash -c "nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader; nproc"
run 90 python3 -m ncclrl plugin build
if [ "$PART" = 1 ]; then
  # 1. NCCL's default at every size (the S-curve), with NCCL's INFO log: nRanks 2 nNodes 2 on one GPU
  NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,GRAPH,ENV,NET,TUNING NCCL_DEBUG_FILE="$OUT/nccl-info.%h.%p.log" \
    run 90 python3 -m ncclrl sweep $T grid=default min_bytes=8 max_bytes=64M samples=5 timing=eager \
    timeout_s=60 tag=scurve $S
  run 30 python3 -m ncclrl detect "$OUT"/nccl-info.*.log -o "$OUT/detected.yaml"
  grep -h "nRanks 2 nNodes 2\|NET/Socket : Using\|Init COMPLETE" "$OUT"/nccl-info.*.log | head -6 | tee -a "$L"
  # 2. the full grid (every per-call configuration under every knob setting) where configurations
  #    differ on this bed, the plugin forcing each point; its own line per job in the launcher log
  NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=TUNING run 190 python3 -m ncclrl sweep $T grid=full min_bytes=8M \
    max_bytes=64M samples=3 timing=eager timeout_s=60 wall_s=150 $S log_dir="$OUT/jobs-sweep"
  echo "jobs-sweep: $(grep -c 'table from NCCLRL_TUNER_TABLE_DATA' "$OUT/jobs-sweep/launcher.log") tables loaded" \
    "from the environment, $(grep -c 'WARN.*rejected' "$OUT/jobs-sweep/launcher.log") rows rejected" | tee -a "$L"
  # 3. fine-tuning with the shipped strategy, a small budget
  run 190 python3 -m ncclrl finetune $T min_bytes=8 max_bytes=64M budget=100 wall_s=140 samples=3 \
    timeout_s=60 $S out="$OUT/finetuned"
  run 30 cat "$OUT/finetuned/nccl_tuner.csv" "$OUT/finetuned/nccl.conf"
elif [ "$PART" = 4 ]; then
  # the current method: finetune's defaults (whole jobs, a GPU-time budget: GPU-s = wall x ranks, both
  # ranks on the one GPU here), the fine-tuned table validated afresh, and NCCL's log checked for each row
  # (STORE: a store an earlier, interrupted call left; finetune resumes from it)
  [ -n "${STORE:-}" ] && cp "$STORE" "$OUT/store.sqlite" && chmod u+w "$OUT/store.sqlite"
  run 400 python3 -m ncclrl finetune $T min_bytes=8 max_bytes=64M budget=${FT_BUDGET:-6min} wall_s=${FT_WALL_S:-330} samples=3 \
    timeout_s=60 $S out="$OUT/finetuned"
  run 30 cat "$OUT/finetuned/nccl_tuner.csv" "$OUT/finetuned/nccl.conf" "$OUT/finetuned/summary.json"
  run 150 python3 -m ncclrl validate "$OUT/finetuned/nccl_tuner.csv" conf="$OUT/finetuned/nccl.conf" $T \
    min_bytes=8 max_bytes=64M rounds=3 samples=3 timeout_s=60 $S out="$OUT/validate.csv"
  run 40 python3 -m ncclrl plugin verify "$OUT/finetuned/nccl_tuner.csv" $T max_bytes=64M iters=0 \
    out="$OUT/verify-finetuned"
elif [ "$PART" = 3 ]; then
  cp "${STORE:-$D/part2/store.sqlite}" "$OUT/store.sqlite"
  run 90 python3 -m ncclrl plugin verify "$FT/nccl_tuner.csv" $T max_bytes=64M iters=0 out="$OUT/verify-finetuned"
  run 90 python3 -m ncclrl plugin verify "$D/table-handmade.csv" $T max_bytes=64M iters=0 out="$OUT/verify-handmade"
  run 150 python3 -m ncclrl e2e "$FT/nccl_tuner.csv" conf="$FT/nccl.conf" $T mode=ddp rounds=3 steps=10 \
    warmup=3 d_model=256 layers=2 timeout_s=120 out="$OUT/e2e-d256"
  NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=TUNING run 330 python3 -m ncclrl sweep $T grid=full min_bytes=8M \
    max_bytes=64M samples=3 timing=eager timeout_s=60 wall_s=180 $S log_dir="$OUT/jobs-sweep"
else
  # 4. the fine-tuned table measured afresh through the plugin against NCCL's defaults
  run 200 python3 -m ncclrl validate "$FT/nccl_tuner.csv" conf="$FT/nccl.conf" $T min_bytes=8 max_bytes=64M \
    rounds=3 samples=3 timeout_s=60 $S out="$OUT/validate.csv"
  # 5. NCCL's own log says each row ran as written (the fine-tuned table, then a hand-made one)
  run 150 python3 -m ncclrl plugin verify "$FT/nccl_tuner.csv" $T max_bytes=64M iters=1 out="$OUT/verify-finetuned"
  run 150 python3 -m ncclrl plugin verify "$D/table-handmade.csv" $T max_bytes=64M iters=1 out="$OUT/verify-handmade"
  # 6. a DDP training step with NCCL's defaults vs the table (alternating jobs)
  run 150 python3 -m ncclrl e2e "$FT/nccl_tuner.csv" conf="$FT/nccl.conf" $T mode=ddp rounds=3 steps=10 \
    warmup=3 timeout_s=120 out="$OUT/e2e"
fi
run 30 python3 -c "
from ncclrl.envs.store import Store
s = Store('$OUT/store.sqlite'); j = s.jobs(); f = s.frame()
print(j[['launcher', 'nccl_version', 'gpus', 'driver', 'cuda', 'hosts', 'ranks_reported']].drop_duplicates().to_string())
print(f.groupby(['tag', 'timing', 'status']).size().to_string())
"
echo "## $(date +%T) done" | tee -a "$L"
python3 -c "import sqlite3; sqlite3.connect('$OUT/store.sqlite').execute('PRAGMA wal_checkpoint(TRUNCATE)')"
[ "$L" -ef "$OUT/log.txt" ] || cp "$L" "$OUT/log.txt"
tar -C "$OUT" -czf /tmp/bundle.tgz --exclude=bundle.tgz . && mv /tmp/bundle.tgz "$OUT/bundle.tgz"
ls -la "$OUT"
