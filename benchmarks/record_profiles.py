"""Record what a small training job calls, for ``ncclrl profile``: a tiny transformer trained with
DDP or FSDP (random weights, synthetic data) by a few processes, under ``torch.profiler``.

Per rank and per job it writes, into ``--out``:

* ``{job}-rank{r}.trace.json.gz``: the profiler's Chrome trace of the profiled steps (each one a
  ``ProfilerStep#N`` span);
* ``{job}-rank{r}.truth.json``: the collectives that rank issued during those steps, counted by the
  job itself (a ``TorchDispatchMode`` that sees every ``c10d`` operator the process groups run,
  whoever calls it: DDP's reducer, FSDP, user code), per step;
* ``{job}-rank{r}.fr.json``: the flight recorder's JSON dump (``_dump_nccl_trace_json`` for NCCL,
  ``_dump_fr_trace_json`` for gloo), when this torch build records for the backend in use
  (``--flight-recorder``);
* with ``--device cuda``: ``{job}-rank{r}.nccl.log``, NCCL's ``NCCL_DEBUG=INFO`` output with
  ``NCCL_DEBUG_SUBSYS=COLL,INIT`` (one file per rank through ``NCCL_DEBUG_FILE``).

CPU (backend gloo)::

    python benchmarks/record_profiles.py --device cpu --jobs ddp fsdp --out tests/data/profiles

GPUs (backend nccl, one GPU per process)::

    python benchmarks/record_profiles.py --device cuda --nproc 8 --jobs ddp fsdp --out profiles/
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from ncclrl.envs.jobs import free_port

# c10d operators that move data between ranks (names as the dispatcher spells them)
_C10D_OPS = {
    "allreduce_": "allreduce",
    "allreduce_coalesced_": "allreduce",
    "allgather_": "allgather",
    "_allgather_base_": "allgather",
    "allgather_into_tensor_coalesced_": "allgather",
    "allgather_coalesced_": "allgather",
    "reduce_scatter_": "reducescatter",
    "_reduce_scatter_base_": "reducescatter",
    "reduce_scatter_tensor_coalesced_": "reducescatter",
    "broadcast_": "broadcast",
    "reduce_": "reduce",
    "alltoall_": "alltoall",
    "alltoall_base_": "alltoall",
    "gather_": "gather",
    "scatter_": "scatter",
    "send": "send",
    "recv_": "recv",
}


def _tensors(x: Any) -> Iterator[torch.Tensor]:
    if isinstance(x, torch.Tensor):
        yield x
    elif isinstance(x, (list, tuple)):
        for y in x:
            yield from _tensors(y)


class CollectiveCounter(TorchDispatchMode):
    """Counts every c10d collective this process issues while active: one record per call with the
    collective, the elements and bytes of its input (this rank's contribution) and the data type.
    Passes every operator through unchanged."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[dict[str, Any]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        kwargs = kwargs or {}
        if func.namespace == "c10d":
            name = func._schema.name.split("::", 1)[1]
            coll = _C10D_OPS.get(name)
            if coll is not None:
                # the input is the second positional argument for _base ops (output, input, ...) and
                # reduce_scatter_ (outputs, inputs, ...); the first for the in-place ones
                ins = args[1] if name in ("_allgather_base_", "_reduce_scatter_base_", "reduce_scatter_",
                                          "allgather_", "allgather_into_tensor_coalesced_",
                                          "reduce_scatter_tensor_coalesced_", "allgather_coalesced_",
                                          "alltoall_base_", "alltoall_") else args[0]
                outs = args[0]  # outputs first (the in-place ops: the same tensors)
                ts_in, ts_out = list(_tensors(ins)), list(_tensors(outs))
                self.calls.append({
                    "op": name, "collective": coll,
                    "in_nelems": int(sum(t.numel() for t in ts_in)),
                    "out_nelems": int(sum(t.numel() for t in ts_out)),
                    "element_nbytes": int(ts_in[0].element_size()) if ts_in else 0,
                    "dtype": str(ts_in[0].dtype).removeprefix("torch.") if ts_in else "",
                })
        return func(*args, **kwargs)


class TinyTransformer(nn.Module):
    """Embedding, ``layers`` encoder layers, a head: small enough for a few CPU steps."""

    def __init__(self, vocab: int = 256, d_model: int = 64, layers: int = 2, heads: int = 4) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, d_model)
        self.layers = nn.ModuleList(
            nn.TransformerEncoderLayer(d_model, heads, dim_feedforward=2 * d_model, dropout=0.0, batch_first=True)
            for _ in range(layers))
        self.head = nn.Linear(d_model, vocab)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.embed(x)
        for layer in self.layers:
            h = layer(h)
        return self.head(h)


def _wrap(job: str, model: nn.Module, device: torch.device) -> nn.Module:
    if job == "ddp":
        from torch.nn.parallel import DistributedDataParallel as DDP

        # small buckets so that a tiny model still spreads over several all-reduces
        return DDP(model, device_ids=[device.index] if device.type == "cuda" else None, bucket_cap_mb=0.05)
    if job == "fsdp":
        from torch.distributed.fsdp import fully_shard

        for layer in model.layers:
            fully_shard(layer)
        fully_shard(model)
        return model
    raise ValueError(f"unknown job {job!r}")


def _worker(rank: int, nproc: int, port: int, job: str, device_kind: str, steps: int, warmup: int,
            out: str, flight_recorder: bool) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(nproc))
    outdir = Path(out)
    if device_kind == "cuda":
        os.environ.update(NCCL_DEBUG="INFO", NCCL_DEBUG_SUBSYS="COLL,INIT",
                          NCCL_DEBUG_FILE=str(outdir / f"{job}-rank{rank}.nccl.log"))
        torch.cuda.set_device(rank)
        device = torch.device("cuda", rank)
        backend = "nccl"
    else:
        device = torch.device("cpu")
        backend = "gloo"
    dist.init_process_group(backend, rank=rank, world_size=nproc, device_id=device if backend == "nccl" else None)
    torch.manual_seed(0)
    model = _wrap(job, TinyTransformer().to(device), device)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    gen = torch.Generator().manual_seed(rank)

    def step() -> None:
        x = torch.randint(0, 256, (4, 32), generator=gen).to(device)
        loss = nn.functional.cross_entropy(model(x).flatten(0, 1), x.flatten())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    for _ in range(warmup):  # DDP rebuilds its buckets after the first step; profile the steady state
        step()
    if device.type == "cuda":
        torch.cuda.synchronize()
    activities = [torch.profiler.ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    counter = CollectiveCounter()
    truth_steps: list[list[dict[str, Any]]] = []
    # a schedule makes the profiler mark each step with a ProfilerStep#N span; record_shapes adds the
    # collectives' arguments (sizes, dtype, process group) to their record_param_comms events
    sched = torch.profiler.schedule(wait=0, warmup=0, active=steps, repeat=1)
    with torch.profiler.profile(activities=activities, schedule=sched, record_shapes=True) as prof:
        for _ in range(steps):
            start = len(counter.calls)
            with counter:
                step()
            truth_steps.append(counter.calls[start:])
            prof.step()
    if device.type == "cuda":
        torch.cuda.synchronize()
    stem = outdir / f"{job}-rank{rank}"
    raw = stem.with_suffix(".trace.json")
    prof.export_chrome_trace(str(raw))
    with open(raw, "rb") as src, gzip.open(f"{raw}.gz", "wb", compresslevel=9) as dst:
        dst.write(src.read())
    raw.unlink()
    group = dist.group.WORLD
    truth = {
        "job": job, "backend": backend, "rank": rank, "world_size": nproc, "steps": steps,
        "group_name": group.group_name if group is not None else "",
        "torch": torch.__version__, "calls_by_step": truth_steps,
    }
    stem.with_suffix(".truth.json").write_text(json.dumps(truth, indent=1) + "\n")
    if flight_recorder:
        try:
            # ProcessGroupNCCL keeps its own recorder; the generic one serves the other backends
            c10d = torch._C._distributed_c10d
            dump = (c10d._dump_nccl_trace_json(includeCollectives=True) if backend == "nccl"
                    else c10d._dump_fr_trace_json(includeCollectives=True))
        except Exception as e:  # noqa: BLE001 - a torch build without a recorder for this backend
            print(f"rank {rank}: no flight recorder dump: {e}")
        else:
            stem.with_suffix(".fr.json").write_bytes(dump)
    dist.barrier()
    dist.destroy_process_group()


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="cpu: gloo; cuda: nccl, one GPU per rank")
    p.add_argument("--nproc", type=int, default=2, help="processes (ranks)")
    p.add_argument("--jobs", nargs="+", choices=("ddp", "fsdp"), default=["ddp", "fsdp"])
    p.add_argument("--steps", type=int, default=3, help="profiled steps")
    p.add_argument("--warmup", type=int, default=2, help="steps before profiling")
    p.add_argument("--flight-recorder", action="store_true",
                   help="also dump the flight recorder as JSON (sets TORCH_FR_BUFFER_SIZE)")
    p.add_argument("--out", default="profiles", help="output folder")
    a = p.parse_args(argv)
    Path(a.out).mkdir(parents=True, exist_ok=True)
    if a.flight_recorder:
        os.environ.setdefault("TORCH_FR_BUFFER_SIZE", "2000")
        os.environ.setdefault("TORCH_NCCL_TRACE_BUFFER_SIZE", "2000")  # the name older torch reads for NCCL
    for job in a.jobs:
        port = free_port("127.0.0.1")
        mp.spawn(_worker, args=(a.nproc, port, job, a.device, a.steps, a.warmup, a.out, a.flight_recorder),
                 nprocs=a.nproc, join=True)
        print(f"recorded {job} into {a.out}")


if __name__ == "__main__":
    main()
