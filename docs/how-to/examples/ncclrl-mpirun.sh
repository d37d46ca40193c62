#!/bin/bash
# The same with Open MPI on hosts you name (passwordless ssh between them): ncclrl runs here and
# starts each job with mpirun -H host:GPUs, forwarding the job and your NCCL_* variables with -x.
set -euo pipefail
HOSTS=[gpu01,gpu02]
RUN=${RUN:-$HOME/ncclrl/run1}
ncclrl finetune launcher=mpirun launcher.hosts=$HOSTS launcher.extra_args="--mca btl_tcp_if_include ib0" \
  topology="$RUN/cluster.yaml" budget=250 store="$RUN/store.sqlite" out="$RUN/ft"
# torchrun instead (one agent per host, c10d rendezvous on the first host, the others over ssh):
# ncclrl finetune launcher=torchrun launcher.hosts=$HOSTS topology=... out=...
