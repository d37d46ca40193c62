"""One rank of an end-to-end training job: ``python -m ncclrl.envs.e2e_worker``, started by any
launcher (:mod:`ncclrl.envs.jobs`) for ``ncclrl e2e``.

The rank trains a small decoder-only transformer (random weights, random tokens, nothing
downloaded) with DDP, then with FSDP (``fully_shard`` per block), each a fresh model for
``warmup + steps`` steps, and times every step: ``torch.cuda.synchronize`` around it on GPUs, the
wall clock on CPUs. The slowest rank's time of each step (what the job feels) is agreed with one
``all_reduce(MAX)`` over a CPU (gloo) group after the last step of a mode, so the timing adds no
traffic to the steps.

What the rank was handed decides which side of the comparison it is on: NCCL's defaults
(``NCCL_TUNER_PLUGIN=none``) or a table (``NCCL_TUNER_PLUGIN``, ``NCCLRL_TUNER_TABLE_DATA`` and the
``nccl.conf`` knobs). Every rank says in its ``hello`` record what it received (the table's
fingerprint, the knobs, the plugin), so the driver can check each side got what it should.

Records (``NCCLRL|rank|kind|payload``): ``hello``, ``log``, ``progress`` (rank 0, one per step),
``steps`` (rank 0, one per mode: ``{"mode": "ddp", "step_time_ms": [...]}``, the timed steps),
``error``, ``done``. The job (``NCCLRL_JOB``) holds ``modes`` (``ddp``, ``fsdp``, in running order),
the model (``layers``, ``d_model``, ``heads``, ``seq_len``, ``batch``, ``vocab``, ``dtype``),
``steps``, ``warmup``, ``seed``, ``device`` (cuda or cpu: gloo stands in for NCCL), ``timeout_s``,
``nranks``, ``gpus_per_node``, ``local_world`` (ranks on this host), ``emulate_nodes``, ``share_gpu``.
"""

from __future__ import annotations

import os
import socket
import time
from datetime import timedelta

from ncclrl.costmodel.table import CONF_KEYS, fingerprint
from ncclrl.envs.jobs import TABLE_ENV, rank_gpu
from ncclrl.envs.jobs.rank import Out, join_job, run_worker


def received(env: dict[str, str] | None = None) -> dict:
    """What this rank was handed for NCCL's decisions: the table's fingerprint (empty: no table
    variable at all), the ``nccl.conf`` knobs present, and the tuner plugin setting."""
    e = os.environ if env is None else env
    return {"table": fingerprint(e[TABLE_ENV]) if TABLE_ENV in e else "",
            "knobs": {k: e[k] for k in sorted(CONF_KEYS) if k in e},
            "plugin": e.get("NCCL_TUNER_PLUGIN", "")}


def build_model(torch, job: dict):
    """The transformer: token and position embeddings, ``layers`` pre-norm blocks with causal
    self-attention and a 4x MLP, a final norm and an untied output head."""
    nn = torch.nn
    d, seq = int(job["d_model"]), int(job["seq_len"])

    class TinyLM(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = nn.Embedding(int(job["vocab"]), d)
            self.pos = nn.Parameter(torch.randn(seq, d) * 0.02)
            self.blocks = nn.ModuleList(
                nn.TransformerEncoderLayer(d, int(job["heads"]), 4 * d, dropout=0.0, batch_first=True, norm_first=True)
                for _ in range(int(job["layers"])))
            self.norm = nn.LayerNorm(d)
            self.head = nn.Linear(d, int(job["vocab"]), bias=False)
            self.register_buffer("mask", nn.Transformer.generate_square_subsequent_mask(seq), persistent=False)

        def forward(self, tokens):
            x = self.embed(tokens) + self.pos
            mask = self.mask.to(x.dtype)
            for block in self.blocks:
                x = block(x, src_mask=mask, is_causal=True)
            return self.head(self.norm(x))

    return TinyLM()


def train(torch, dist, job: dict, mode: str, dev, rank: int, sync, out: Out) -> list[float]:
    """``warmup + steps`` training steps of a fresh model wrapped in DDP or FSDP; the time of each
    timed step on this rank, in milliseconds."""
    dtype = getattr(torch, job["dtype"])
    torch.manual_seed(int(job["seed"]))  # the same initial weights on every rank and in every job
    model = build_model(torch, job).to(device=dev, dtype=dtype)
    if mode == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        model = DistributedDataParallel(model, device_ids=[dev.index] if dev.type == "cuda" else None)
    else:
        from torch.distributed.fsdp import fully_shard

        for block in model.blocks:
            fully_shard(block)
        fully_shard(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    gen = torch.Generator().manual_seed(int(job["seed"]) * 1000 + rank)  # each rank its own data
    shape = (int(job["batch"]), int(job["seq_len"]) + 1)
    batches = [torch.randint(0, int(job["vocab"]), shape, generator=gen).to(dev) for _ in range(4)]
    loss_fn = torch.nn.CrossEntropyLoss()
    warmup, steps = int(job["warmup"]), int(job["steps"])
    out("log", f"{mode}: {sum(p.numel() for p in model.parameters())} parameters on this rank, {dtype}, "
        f"{warmup} warmup + {steps} timed steps")
    step_time_ms: list[float] = []
    sync()
    dist.barrier()
    for i in range(warmup + steps):
        tokens = batches[i % len(batches)]
        sync()
        t0 = time.perf_counter()
        logits = model(tokens[:, :-1])
        loss = loss_fn(logits.reshape(-1, logits.shape[-1]).float(), tokens[:, 1:].reshape(-1))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        sync()
        if i >= warmup:
            step_time_ms.append((time.perf_counter() - t0) * 1e3)
        if rank == 0:
            out("progress", f"{mode} {i}")
    del model, opt, batches
    return step_time_ms


def main() -> int:
    me = join_job()
    job, rank, world, local, out = me.job, me.rank, me.world, me.local, me.out
    device = job["device"]
    gpn = int(job["gpus_per_node"])

    import torch
    import torch.distributed as dist

    got = received()
    plugin = got["plugin"]
    got["plugin_found"] = plugin in ("", "none") or os.path.isfile(plugin)
    out("hello", {"host": socket.gethostname(), "pid": os.getpid(), "local_rank": local, "world": world,
                  "modes": job["modes"], "side": job.get("side", ""), **got})
    if world != int(job["nranks"]):
        out("error", f"the job has {world} ranks, the topology {job['nranks']}")
        return 2
    timeout = timedelta(seconds=float(job["timeout_s"]) + 60)
    if device == "cuda":
        n = torch.cuda.device_count() if torch.cuda.is_available() else 0
        gpu = rank_gpu(rank, local, n, bool(job.get("emulate_nodes")), bool(job.get("share_gpu")))
        if gpu >= n:
            out("error", f"rank {rank} (local rank {local}) needs GPU {gpu}; {socket.gethostname()} has {n} visible")
            return 2
        torch.cuda.set_device(gpu)
        dev = torch.device("cuda", gpu)
        dist.init_process_group("nccl", init_method="env://", rank=rank, world_size=world, timeout=timeout,
                                device_id=dev)
        timing_group = dist.new_group(backend="gloo")

        def sync() -> None:
            torch.cuda.synchronize(dev)
    else:
        dev = torch.device("cpu")
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // max(1, int(job.get("local_world", gpn)))))
        dist.init_process_group("gloo", init_method="env://", rank=rank, world_size=world, timeout=timeout)
        timing_group = None

        def sync() -> None:
            pass

    for mode in job["modes"]:  # the same order on every rank and in every job
        step_time_ms = train(torch, dist, job, mode, dev, rank, sync, out)
        slowest = torch.tensor(step_time_ms, dtype=torch.float64)
        dist.all_reduce(slowest, op=dist.ReduceOp.MAX, group=timing_group)  # the slowest rank's, per step
        if rank == 0:
            out("steps", {"mode": mode, "step_time_ms": [round(x, 4) for x in slowest.tolist()]})
        if device == "cuda":
            torch.cuda.empty_cache()
    dist.barrier()
    out("done", "")  # then exit without tearing NCCL down (run_worker's os._exit)
    return 0


if __name__ == "__main__":
    run_worker(main)
