#!/usr/bin/env bash
# run h200x4-2026-11-22/run5's replays: fine-tuning replayed on the 2x2 direct-call sweep (completed in run h200x4-2026-11-22/run5
# with NCCL's own algorithm at 2 channels under the 4-channel settings) at 473 points, one line per
# (rows_on_ties, seed): the fraction of the sweep's optimum, the 64-256 MiB speedup on the sweep's
# data and the exported setting.
# usage: bash data/h200x4-2026-11-22/run5/replay_ties.sh "true false" 0 1 2
rts=$1; shift
S=docs/live/h200x4-2026-11-21.sqlite
for rt in $rts; do
 for seed in "$@"; do
  o=/tmp/ties-$rt-$seed; rm -rf $o $o.sqlite
  ncclrl finetune --checkpoint docs/live/pretrained/policy.zip backend=replay replay_store=$S topology=h200-2x2-sock \
    budget=473 seed=$seed rows_on_ties=$rt store=$o.sqlite out=$o > $o.log 2>&1
  echo "rows_on_ties=$rt seed=$seed $(grep -o '([0-9.]*%).*' $o.log | tail -1) | $(grep -o 'knobs: [^;]*' $o.log | tail -1)"
 done
done
