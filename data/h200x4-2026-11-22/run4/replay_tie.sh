#!/usr/bin/env bash
# run h200x4-2026-11-22/run4's replays: fine-tuning replayed on both direct-call sweeps at 473 points, one line per
# (tie_pct, topology, seed) with the fraction of the sweep's optimum, the 64-256 MiB speedup on the
# sweep's data and the exported setting. tie_pct=0 exports the best geometric mean (the guard checks
# the search's two best on it); tie_pct>0 ties settings within that many percent and exports the one
# saving the most time, the search's most time-saving setting among those checked.
# usage: bash data/h200x4-2026-11-22/run4/replay_tie.sh "0 10" 0 1 2
tps=$1; shift
for tp in $tps; do
 for seed in "$@"; do
  for t in h200-2x2-sock:docs/live/h200x4-2026-11-21.sqlite h200-2x1-sock:docs/live/h200x2-2026-11-22.sqlite; do
   T=${t%%:*}; S=${t#*:}; o=/tmp/tie-$tp-$T-$seed; rm -rf $o $o.sqlite
   ncclrl finetune --checkpoint docs/live/pretrained/policy.zip backend=replay replay_store=$S topology=$T \
     budget=473 seed=$seed tie_pct=$tp store=$o.sqlite out=$o > $o.log 2>&1
   echo "tie_pct=$tp $T seed=$seed $(grep -o '([0-9.]*%).*' $o.log | tail -1) | $(grep -o 'knobs: [^;]*' $o.log | tail -1)"
  done
 done
done
