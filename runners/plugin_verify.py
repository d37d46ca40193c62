"""``ncclrl plugin verify TABLE``: check on a GPU machine that NCCL really uses a table.

Runs one short NCCL job (PyTorch, one process per GPU) with our tuner plugin loaded and
``NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=TUNING``, calls each collective at sizes inside every row
(its first byte, a middle size and its last byte, up to ``--max-bytes``) and at sizes the table
leaves uncovered, reads rank 0's NCCL log and reports per row whether NCCL's logged
``Algo/proto/channel`` is the table's decision. Expected channels are the row's count as NCCL's
scheduler spreads it (cells of >= 16 KiB of traffic, as :mod:`ncclrl.costmodel.replica` computes);
rows NCCL cannot run (an algorithm it disabled) and uncovered sizes must keep NCCL's own choice.
A second run without the plugin times the uncovered sizes, which must keep NCCL's speed.

Only needs PyTorch with CUDA, numpy and PyYAML on the GPU machine.
"""

from __future__ import annotations

import json
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ncclrl.costmodel import nccl as N
from ncclrl.costmodel.errors import ConfigError
from ncclrl.costmodel.replica import default_decisions, eligible_mask, scheduled_channels
from ncclrl.costmodel.table import parse_example_rows
from ncclrl.costmodel.topology import load_topology
from ncclrl.costmodel.units import parse_bytes
from ncclrl.envs.live import SAFE_ENV, elem_size, free_port, make_collective, plugin_library, require_gpus
from ncclrl.runners.config import Command, register

LOG_LINE = re.compile(r"(AllReduce|AllGather|ReduceScatter|Broadcast|Reduce): (\d+) Bytes -> Algo (\w+) proto (\w+) "
                      r"channel\{Lo\.\.Hi\}=\{(\d+)\.\.(\d+)\}")
LOG_NAME = {v: k for k, v in N.COLL_LOG_NAMES.items()}
MARKER_BYTES = 1357  # a Broadcast of this many bytes marks where the verifier's own calls start
END_MARKER_BYTES = 2468  # ... and this one where its decision calls end


def valid_size(coll: int, nbytes: int, nranks: int, up: bool) -> int | None:
    """Nearest size the collective can run with (whole elements, divisible over ranks for AG/RS)."""
    q = elem_size(coll) * (nranks if coll in (N.ALLGATHER, N.REDUCESCATTER) else 1)
    v = -(-nbytes // q) * q if up else nbytes // q * q
    return v if v > 0 else None


def plan_cases(rows: list[dict], topo, max_bytes: int) -> list[dict]:
    """Sizes to call: three per row (first, middle, last byte) and uncovered sizes per collective."""
    cases = []
    for i, r in enumerate(rows):
        c = N.COLLECTIVES.index(r["collective"])
        lo, hi = max(r["min_bytes"], 1), min(r["max_bytes"], max_bytes)
        if lo > hi:
            continue
        picks = {valid_size(c, lo, topo.nranks, True), valid_size(c, hi, topo.nranks, False),
                 valid_size(c, int(np.sqrt(float(lo) * float(hi))), topo.nranks, True)}
        for s in sorted(p for p in picks if p and lo <= p <= hi):
            cases.append({"row": i, "coll": c, "nbytes": s})
    for c in range(5):
        covered = [r for r in rows if r["collective"] == N.COLLECTIVES[c]]
        seen = set()
        for k in range(3, 31):
            s = valid_size(c, 1 << k, topo.nranks, True)
            if s and s <= max_bytes and s not in seen and not any(r["min_bytes"] <= s <= r["max_bytes"]
                                                                  for r in covered):
                seen.add(s)
                cases.append({"row": None, "coll": c, "nbytes": s})
    return cases


def expected(case: dict, rows: list[dict], topo, nccl_default: tuple[str, str, int] | None) -> tuple[str, str, int]:
    """What NCCL must log with the plugin: the row's decision as NCCL's scheduler spreads it, or
    NCCL's own choice (as logged by the run without the plugin) where the table does not apply."""
    c, s = case["coll"], case["nbytes"]
    d = default_decisions(topo, c, [s])
    default = nccl_default or (N.ALGOS[d.algo[0]], N.PROTOS[d.proto[0]], int(d.channels[0]))
    if case["row"] is None:
        return default
    r = rows[case["row"]]
    if r["algo"] == "-1":
        algo, proto = N.ALGOS.index(default[0]), N.PROTOS.index(default[1])
    else:
        algo, proto = N.ALGOS.index(r["algo"]), N.PROTOS.index(r["proto"])
        if not eligible_mask(topo)[c, algo, proto]:
            return default  # NCCL disabled that entry: the plugin must leave NCCL's choice
    if r["channels"] <= 0:
        if r["algo"] == "-1":
            return default
        return N.ALGOS[algo], N.PROTOS[proto], int(default_decisions(topo, c, [s], allowed=_only(algo, proto))
                                                   .channels[0])
    ch = int(scheduled_channels(c, np.array([s]), np.array([proto]), np.array([r["channels"]]),
                                topo.nccl.channels, topo.nranks)[0])
    return N.ALGOS[algo], N.PROTOS[proto], ch


def _only(algo: int, proto: int) -> np.ndarray:
    m = np.zeros((N.NUM_ALGOS, N.NUM_PROTOS), bool)
    m[algo, proto] = True
    return m


def _time_ops(torch, op, reps: int) -> float:
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(reps):
        op()
    b.record()
    b.synchronize()
    return a.elapsed_time(b) * 1000 / reps


def _worker(rank: int, world: int, port: int, cases: list[dict], env: dict, nodes: int, iters: int,
            result_path: str) -> None:
    os.environ.update(env)
    if nodes > 1:  # emulate nodes on one host: NCCL sees distinct host ids, talks over loopback sockets
        os.environ["NCCL_HOSTID"] = f"ncclrl-node{rank * nodes // world}"
        os.environ.setdefault("NCCL_SOCKET_IFNAME", "lo")
    import torch
    import torch.distributed as dist

    torch.cuda.set_device(rank)
    dev = torch.device("cuda", rank)
    dist.init_process_group("nccl", rank=rank, world_size=world, init_method=f"tcp://127.0.0.1:{port}",
                            device_id=dev)
    # 1. one call per case on the communicator that loaded the table; NCCL logs each decision
    marker = torch.zeros(MARKER_BYTES, dtype=torch.uint8, device=dev)
    dist.broadcast(marker, 0)
    for case in cases:
        make_collective(dist, torch, case["coll"], case["nbytes"], world, dev)()
    dist.broadcast(torch.zeros(END_MARKER_BYTES, dtype=torch.uint8, device=dev), 0)
    torch.cuda.synchronize()
    # 2. a second communicator in the same process with no table (the plugin keeps NCCL's choices):
    #    time the timed cases on both, interleaved, so machine drift hits both alike
    times, base = [None] * len(cases), [None] * len(cases)
    timed = [i for i, c in enumerate(cases) if c.get("timed")]
    if iters and timed:
        os.environ["NCCLRL_TUNER_TABLE"] = "/nonexistent/ncclrl-no-table.csv"
        plain = dist.new_group(list(range(world)))
        dist.barrier(group=plain)
        for i in timed:
            c = cases[i]
            op_t = make_collective(dist, torch, c["coll"], c["nbytes"], world, dev)
            op_p = make_collective(dist, torch, c["coll"], c["nbytes"], world, dev, group=plain)
            reps = 20 if c["nbytes"] < (64 << 20) else 3
            op_t(), op_p()
            ta, tb = [], []
            for _ in range(iters):
                ta.append(_time_ops(torch, op_t, reps))
                tb.append(_time_ops(torch, op_p, reps))
            times[i], base[i] = float(np.median(ta)), float(np.median(tb))
    torch.cuda.synchronize()
    dist.barrier()
    if rank == 0:
        Path(result_path).write_text(json.dumps({"pid": os.getpid(), "times_us": times, "base_times_us": base}))
    dist.destroy_process_group()


def run_job(cases: list[dict], env: dict, world: int, nodes: int, iters: int, out: Path, tag: str) -> dict:
    import torch.multiprocessing as mp

    log_dir = out / f"nccl-{tag}"
    log_dir.mkdir(parents=True, exist_ok=True)
    env = dict(env, NCCL_DEBUG="INFO", NCCL_DEBUG_SUBSYS="INIT,TUNING",
               NCCL_DEBUG_FILE=str(log_dir / "nccl.%h.%p.log"), **SAFE_ENV)
    result = out / f"result-{tag}.json"
    mp.spawn(_worker, args=(world, free_port(), cases, env, nodes, iters, str(result)), nprocs=world, join=True)
    res = json.loads(result.read_text())
    logs = list(log_dir.glob(f"nccl.*.{res['pid']}.log"))
    res["log"] = logs[0].read_text() if logs else ""
    res["log_path"] = str(logs[0]) if logs else ""
    return res


def match_log(log: str, cases: list[dict], nranks: int) -> list[tuple[str, str, int] | None]:
    """NCCL's logged decision for each case, in call order."""
    lines = [m for m in LOG_LINE.finditer(log)]
    out, j = [], 0
    for i, m in enumerate(lines):  # between the markers: the verifier's own calls only
        if m.group(1) == "Broadcast" and int(m.group(2)) == MARKER_BYTES:
            j = i + 1
            break
    end = next((i for i, m in enumerate(lines) if i >= j and m.group(1) == "Broadcast"
                and int(m.group(2)) == END_MARKER_BYTES), len(lines))
    lines = lines[:end]
    for case in cases:
        want_bytes = case["nbytes"] // nranks if case["coll"] in (N.ALLGATHER, N.REDUCESCATTER) else case["nbytes"]
        found = None
        while j < len(lines):
            m = lines[j]
            j += 1
            if N.COLL_LOG_NAMES[m.group(1)] == case["coll"] and int(m.group(2)) == want_bytes:
                found = (m.group(3).lower(), m.group(4).lower(), int(m.group(6)) - int(m.group(5)) + 1)
                break
        out.append(found)
    return out


def verify(table: str, topology: str, out: Path, max_bytes: int = 1 << 30, iters: int = 20,
           plugin: str | None = None) -> int:
    topo = load_topology(topology)

    require_gpus(topo.nranks)  # a one-line error (ConfigError), not a traceback from a worker
    rows = [r for r in parse_example_rows(Path(table).read_text())
            if r["nNodes"] in (-1, topo.nodes) and r["nRanks"] in (-1, topo.nranks)]
    lib = plugin_library(plugin)
    out.mkdir(parents=True, exist_ok=True)
    cases = plan_cases(rows, topo, max_bytes)
    for case in cases:
        case["timed"] = case["row"] is None
    env = {"NCCL_TUNER_PLUGIN": str(lib.resolve()), "NCCLRL_TUNER_TABLE": str(Path(table).resolve())}
    t0 = time.time()
    with_plugin = run_job(cases, env, topo.nranks, topo.nodes, iters, out, "plugin")
    without = run_job([dict(c, timed=False) for c in cases], {"NCCL_TUNER_PLUGIN": "none"}, topo.nranks,
                      topo.nodes, 0, out, "default")
    logged = match_log(with_plugin["log"], cases, topo.nranks)
    nccl_own = match_log(without["log"], cases, topo.nranks)
    report, ok_all = [], True
    for case, got, own, t, base in zip(cases, logged, nccl_own, with_plugin["times_us"],
                                       with_plugin["base_times_us"], strict=True):
        want = expected(case, rows, topo, own)
        ok = got == want
        entry = {"row": case["row"], "collective": N.COLLECTIVES[case["coll"]], "nbytes": case["nbytes"],
                 "expected": "/".join(map(str, want)), "nccl_logged": "/".join(map(str, got)) if got else "missing"}
        entry["nccl_without_plugin"] = "/".join(map(str, own)) if own else "missing"
        if case["row"] is None:
            entry.update(time_us=t, default_time_us=base)
            if t and base:
                entry["time_ratio"] = t / base
                ok = ok and (t / base < 1.10 or t - base < 2.0)  # within 10% or 2 us
        entry["ok"] = bool(ok)
        ok_all &= ok
        report.append(entry)
    (out / "verify.json").write_text(json.dumps({"table": table, "topology": topo.name, "cases": report,
                                                 "nccl_log": with_plugin["log_path"]}, indent=1))
    print(f"# {table} on {topo.name}: NCCL's logged decision per table row (plugin {lib.name}); "
          f"{time.time() - t0:.0f} s")
    for i, r in enumerate(rows):
        mine = [e for e in report if e["row"] == i]
        if not mine:
            print(f"   row {i + 1}: {r['collective']} {r['min_bytes']}-{r['max_bytes']}: not tested "
                  f"(beyond --max-bytes)")
            continue
        good = all(e["ok"] for e in mine)
        detail = "; ".join(f"{e['nbytes']} B {e['nccl_logged']}" + ("" if e["ok"] else f" (want {e['expected']})")
                           for e in mine)
        print(f"{'✅' if good else '❌'} row {i + 1}: {r['collective']} {r['min_bytes']}-{r['max_bytes']} "
              f"{r['algo']}/{r['proto']}/{r['channels']}: {detail}")
    unc = [e for e in report if e["row"] is None]
    if unc:
        good = all(e["ok"] for e in unc)
        print(f"{'✅' if good else '❌'} {len(unc)} uncovered sizes keep NCCL's choice and speed (time on the "
              f"table's communicator / on a table-less one, interleaved: {min(e.get('time_ratio', 1) for e in unc):.2f}"
              f"-{max(e.get('time_ratio', 1) for e in unc):.2f})")
        for e in unc:
            if not e["ok"]:
                print(f"   ❌ {e['collective']} {e['nbytes']} B: {e['nccl_logged']} (want {e['expected']}), "
                      f"ratio {e.get('time_ratio', float('nan')):.2f}")
    print(f"{sum(e['ok'] for e in report)} passed, {sum(not e['ok'] for e in report)} failed")
    return 0 if ok_all else 1


@dataclass
class VerifyConfig:
    """Run a short NCCL job with the plugin loading ``table`` and print, per table row, whether
    NCCL's own log shows the decision the row asks for (and NCCL's choice where no row covers).

    :param table: the table (nccl_tuner.csv)
    :param topology: the platform the job runs on: a preset name or a topology YAML path
    :param out: folder for NCCL's logs and verify.json
    :param max_bytes: the largest size checked
    :param iters: timed calls per size
    :param plugin: the plugin library (default: the one ncclrl plugin build makes, built if missing)
    """

    table: str = ""
    topology: str = ""
    out: str = "plugin-verify"
    max_bytes: str = "1G"
    iters: int = 20
    plugin: str | None = None

    def check(self) -> None:
        for k in ("table", "topology"):
            if not getattr(self, k):
                raise ConfigError(k, "required: ncclrl plugin verify TABLE topology=T (the platform the job runs on)")
        if not Path(self.table).is_file():
            raise ConfigError("table", f"no such file: {self.table}")
        load_topology(self.topology)
        parse_bytes(self.max_bytes, "max_bytes")


def main_verify(cfg) -> int:
    return verify(cfg.table, cfg.topology, Path(cfg.out), parse_bytes(cfg.max_bytes, "max_bytes"), cfg.iters,
                  cfg.plugin)


COMMAND = Command("plugin verify", VerifyConfig, main_verify,
                  "check on GPUs, from NCCL's own log, that NCCL runs what a table says", positional="table")
register(COMMAND)
