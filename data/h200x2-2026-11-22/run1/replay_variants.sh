#!/usr/bin/env bash
# run h200x2-2026-11-22/run1's replay loop for the search variants of channel-neighbour-attempt.patch (git apply it
# first; NCCLRL_NEIGH picks the variant: "" = main's order, np = channel neighbours of the measured
# leaders first, cp = an untried channel count first, ...): fine-tuning replayed on both direct-call
# sweeps at 473 points, one line per seed with the fraction of the sweep's optimum.
# usage: bash data/h200x2-2026-11-22/run1/replay_variants.sh MODE SEED...
m=$1; shift
for seed in "$@"; do
 for t in h200-2x2-sock:docs/live/h200x4-2026-11-21.sqlite h200-2x1-sock:docs/live/h200x2-2026-11-22.sqlite; do
  T=${t%%:*}; S=${t#*:}; o=/tmp/x-$m-$T-$seed; rm -rf $o $o.sqlite
  r=$(NCCLRL_NEIGH=$m ncclrl finetune --checkpoint docs/live/pretrained/policy.zip backend=replay replay_store=$S topology=$T budget=473 seed=$seed store=$o.sqlite out=$o 2>&1 | tail -1 | grep -o "([0-9.]*%)" | head -1)
  echo "$m $T seed=$seed $r"
 done
done
