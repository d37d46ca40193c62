#!/usr/bin/env bash
# Every table validated on the H200s, judged again from the committed store with the between-job
# noise model (ncclrl validate measure=0: no GPU; all stored validations of a table pooled).
# Writes docs/live/noise/rejudged/<name>.csv and prints each summary line.
set -euo pipefail
S=docs/live/h200x4-2026-11-21.sqlite
O=docs/live/noise/rejudged
mkdir -p $O
ALL=collectives=allreduce,allgather,reducescatter
AGRS=collectives=allgather,reducescatter
while read -r name table topo colls; do
  echo "## $name"
  python3 -m runners.validate launch=torch measure=0 store=$S table=$table topology=$topo $colls out=$O/$name.csv \
    | grep "rounds from\|geometric-mean"
done <<LIST
pretrained-h200-2x2-sock docs/live/pretrained/h200-2x2-sock.csv h200-2x2-sock $ALL
pretrained-h200-1x4 docs/live/pretrained/h200-1x4.csv h200-1x4 $ALL
finetuned-s2-h200-2x2-sock docs/live/finetuned/nccl_tuner.csv h200-2x2-sock
finetuned-s3-h200-2x2-sock docs/live/finetuned-s3/h200-2x2-sock/nccl_tuner.csv h200-2x2-sock
finetuned-s3-h200-1x4 docs/live/finetuned-s3/h200-1x4/nccl_tuner.csv h200-1x4
finetuned-s4-h200-2x2-sock docs/live/finetuned-s4/h200-2x2-sock/nccl_tuner.csv h200-2x2-sock $AGRS
finetuned-s4-h200-1x4 docs/live/finetuned-s4/h200-1x4/nccl_tuner.csv h200-1x4 $AGRS
bench-ncclrl-s4 docs/live/bench/ncclrl/nccl_tuner.csv h200-2x2-sock
bench-afnfa-s4 docs/live/bench/afnfa/nccl_tuner.csv h200-2x2-sock
bench-autoccl-s4 docs/live/bench/autoccl/nccl_tuner.csv h200-2x2-sock
finetuned-s5-h200-2x2-sock docs/live/finetuned-s5/h200-2x2-sock/nccl_tuner.csv h200-2x2-sock
finetuned-s5-h200-2x2-sock-2 docs/live/finetuned-s5/h200-2x2-sock-2/nccl_tuner.csv h200-2x2-sock
bench-afnfa-s5 docs/live/bench-s5/afnfa/nccl_tuner.csv h200-2x2-sock
aa-h200-2x2-sock docs/live/noise/aa_table.csv h200-2x2-sock
aa-h200-1x4 docs/live/noise/aa_table.csv h200-1x4
LIST
