"""``ncclrl plugin verify TABLE``: check on a GPU machine that NCCL really uses a table.

Runs one short NCCL job (PyTorch, one process per GPU) with our tuner plugin loaded and
``NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=TUNING``, calls each collective at sizes inside every row
(its first byte, a middle size and its last byte, up to ``--max-bytes``) and at sizes the table
leaves uncovered, reads rank 0's NCCL log and reports per row whether NCCL's logged
``Algo/proto/channel`` is the table's decision. The plugin's own line in that log must show the
table it was handed (the same fingerprint) with every row applicable to this communicator accepted
and none rejected; a row the job did not call (it starts beyond ``max_bytes``) fails the check:
every row is confirmed or the verdict is no. Expected channels are the row's count as NCCL's
scheduler spreads it (cells of >= 16 KiB of traffic, as :mod:`ncclrl.costmodel.replica` computes);
rows NCCL cannot run (an algorithm it disabled) and uncovered sizes must keep NCCL's own choice.
A second communicator without the plugin times the uncovered sizes beside the table's (shown, and
those slower listed; the verdict is the decision NCCL logged: with the same decision on both
communicators, their times differed by up to 1.25x at 20 calls per size over sockets).

Only needs PyTorch with CUDA, numpy and PyYAML on the GPU machine.
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from omegaconf import OmegaConf

from ncclrl.costmodel import nccl as N
from ncclrl.costmodel.detect import SYM_DECISION, VERSION_LINE
from ncclrl.costmodel.errors import ConfigError
from ncclrl.costmodel.replica import default_decisions, eligible_mask, scheduled_channels
from ncclrl.costmodel.table import caps_channels, channels_capped, fingerprint, own_channels, parse_example_rows
from ncclrl.costmodel.topology import load_topology
from ncclrl.costmodel.units import parse_bytes, plural
from ncclrl.envs.jobs import (
    JOB_ENV,
    TABLE_ENV,
    JobOptions,
    JobSpec,
    LaunchConfig,
    base_env,
    encode,
    payload_json,
    run_to_end,
    user_env,
)
from ncclrl.envs.live import elem_size, plugin_library, require_gpus
from ncclrl.runners.config import Command, register

LOG_LINE = re.compile(r"(AllReduce|AllGather|ReduceScatter|Broadcast|Reduce): (\d+) Bytes -> Algo (\w+) proto (\w+) "
                      r"channel\{Lo\.\.Hi\}=\{(\d+)\.\.(\d+)\}")
COLL_CHANNELS = re.compile(r"NCCL INFO (\d+) coll channels")
# an uncovered size timed this much slower on the table's communicator (and by more than SLOWER_US) is listed;
# the verdict is the logged decision's: with the same decision on both communicators their medians still
# differed by 0.21-2.86x at 3 calls per size and 0.68-1.25x at 20 over sockets (data/h200x2-2026-11-28/versions)
SLOWER_RATIO, SLOWER_US = 1.10, 2.0
LOG_NAME = {v: k for k, v in N.COLL_LOG_NAMES.items()}
# the plugin's INFO line when a communicator loads a table (plugin/ncclrl_tuner.c)
PLUGIN_LINE = re.compile(r"TUNER/ncclrl: table from (.+?) \((\d+) bytes, (\d+) rows, fingerprint ([0-9a-f]{16})\): "
                         r"(\d+) for this communicator \((\d+) ranks?, (\d+) nodes?\), (\d+) rejected")
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


def expected(case: dict, rows: list[dict], topo, nccl_default: tuple[str, str, int] | None,
             as_row: bool = False) -> tuple[str, str, int]:
    """What NCCL must log with the plugin: the row's decision as NCCL's scheduler spreads it, or
    NCCL's own choice (as logged by the run without the plugin) where the table does not apply or
    the row is marked as NCCL's choice (the plugin leaves those sizes to NCCL). ``as_row``: what a
    marked row states (the replica's prediction of NCCL's choice, which NVIDIA's example plugin runs)."""
    c, s = case["coll"], case["nbytes"]
    d = default_decisions(topo, c, [s])
    default = nccl_default or (N.ALGOS[d.algo[0]], N.PROTOS[d.proto[0]], int(d.channels[0]))
    if case["row"] is None or (rows[case["row"]].get("nccl_choice") and not as_row):
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
        # a plugin-forced entry, not NCCL_ALGO/NCCL_PROTO: 2.31's LL128 check does not run for it
        own = default_decisions(topo, c, [s], allowed=_only(algo, proto), ll128_gate=False)
        return N.ALGOS[algo], N.PROTOS[proto], int(own.channels[0])
    maxc = r["channels"]
    if caps_channels(topo):  # NCCL takes min(row, its own per-call count for this algorithm/protocol)
        maxc = min(maxc, own_channels(topo, s, algo, proto))
    ch = int(scheduled_channels(c, np.array([s]), np.array([proto]), np.array([maxc]), topo.nccl.channels,
                                topo.nranks, topo.nccl.version)[0])
    return N.ALGOS[algo], N.PROTOS[proto], ch


def capped_at(case: dict, rows: list[dict], topo) -> int | None:
    """NCCL's own count where a row asks for more channels than NCCL 2.31+ lets a plugin give (the row
    cannot run as written there); ``None`` where the row runs its count, or the release has no cap."""
    r = rows[case["row"]] if case["row"] is not None else None
    if r is None or r["nccl_choice"]:
        return None
    return channels_capped(topo, N.COLLECTIVES[case["coll"]], case["nbytes"], r["algo"], r["proto"], r["channels"],
                           version=topo.nccl.version)


def log_version(log: str) -> str | None:
    """The NCCL release a log states (``NCCL version 2.31.0``), or ``None``."""
    m = VERSION_LINE.search(log)  # detect's reading of the version line
    return m.group(1) if m else None


def log_channels(log: str) -> int | None:
    """The communicator's collective channels as NCCL logs them at init (``24 coll channels, ...``)."""
    m = COLL_CHANNELS.search(log)
    return int(m.group(1)) if m else None


def _only(algo: int, proto: int) -> np.ndarray:
    m = np.zeros((N.NUM_ALGOS, N.NUM_PROTOS), bool)
    m[algo, proto] = True
    return m


def run_job(cases: list[dict], env: dict, topo, iters: int, out: Path, tag: str, launcher: LaunchConfig,
            timeout_s: float = 300.0, device: str = "cuda") -> dict:
    """One job of the verifier through the launcher: rank 0's NCCL log (its decisions) and, when
    ``iters``, the timed cases on the table's communicator and on a table-less one."""
    log_dir = out / f"nccl-{tag}"
    log_dir.mkdir(parents=True, exist_ok=True)
    (log_dir / "launcher.log").unlink(missing_ok=True)
    job = {"mode": "verify", "cases": [dict(c, i=i) for i, c in enumerate(cases)], "iters": iters,
           "marker_bytes": MARKER_BYTES, "end_marker_bytes": END_MARKER_BYTES, "device": device,
           "timeout_s": timeout_s, "nranks": topo.nranks, "gpus_per_node": topo.gpus_per_node, "kind": launcher.kind,
           "emulate_nodes": launcher.emulated and topo.nodes > 1, "share_gpu": launcher.share_gpu, "launch": "torch",
           "timing": "eager", "items": []}
    spec = JobSpec(launcher, topo.nodes, topo.gpus_per_node, {**user_env(), **env, JOB_ENV: encode(job)},
                   options=JobOptions(timeout_s=timeout_s, grace_s=launcher.grace_s))
    records, text = run_to_end(spec.commands(), base_env(), log_dir, timeout_s, launcher.grace_s, spec.nranks)
    (log_dir / "nccl-rank0.log").write_text(text)
    t = {}
    for r in records:
        if r.kind == "verify":
            try:
                d = payload_json(r.payload)
                t[int(d["i"])] = d["t"]
            except (ValueError, KeyError, TypeError):  # a record cut by the launcher: that case is untimed
                continue
    return {"times_us": [t[i][0] if i in t else None for i in range(len(cases))],
            "base_times_us": [t[i][1] if i in t else None for i in range(len(cases))],
            "log": text, "log_path": str(log_dir / "nccl-rank0.log")}


def match_log(log: str, cases: list[dict], nranks: int) -> list[tuple[str, str, int] | None]:
    """NCCL's logged decision for each case, in call order: ``(algo, proto, channels)``, or
    ``("symmetric", kernel, channels)`` for a call NCCL ran on one of its symmetric kernels."""
    lines = sorted([*LOG_LINE.finditer(log), *SYM_DECISION.finditer(log)], key=lambda m: m.start())
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
            if N.COLL_LOG_NAMES.get(m.group(1)) == case["coll"] and int(m.group(2)) == want_bytes:
                if m.re is SYM_DECISION:
                    found = ("symmetric", m.group(3), int(m.group(4)))
                else:
                    found = (m.group(3).lower(), m.group(4).lower(), int(m.group(6)) - int(m.group(5)) + 1)
                break
        out.append(found)
    return out


def plugin_loads(log: str) -> dict | None:
    """What the plugin said when the table's communicator loaded it (the first such line in the log):
    its source, rows, fingerprint, rows for this communicator and rows rejected; ``None`` if silent."""
    m = PLUGIN_LINE.search(log)
    if m is None:
        return None
    return {"source": m.group(1), "nbytes": int(m.group(2)), "rows": int(m.group(3)), "fingerprint": m.group(4),
            "applicable": int(m.group(5)), "ranks": int(m.group(6)), "nodes": int(m.group(7)),
            "rejected": int(m.group(8))}


def load_problems(loaded: dict | None, text: str, nrows: int, topo) -> list[str]:
    """Why the plugin's own line does not show ``text`` loaded whole for this communicator (``nrows``
    rows apply to it); empty when it does."""
    if loaded is None:
        return ["the plugin logged no table (not loaded, or NCCL_DEBUG_SUBSYS lacks TUNING)"]
    out = []
    if loaded["fingerprint"] != fingerprint(text):
        out.append(f"the plugin read fingerprint {loaded['fingerprint']}, the table is {fingerprint(text)}")
    if loaded["rejected"]:
        out.append(f"the plugin rejected {loaded['rejected']} rows (its WARN lines in the log say which)")
    if loaded["applicable"] != nrows:
        out.append(f"the plugin applies {loaded['applicable']} rows to this communicator, the table has {nrows} "
                   "it must apply (rows marked as NCCL's choice are left to NCCL)")
    if (loaded["ranks"], loaded["nodes"]) != (topo.nranks, topo.nodes):
        out.append(f"the communicator has {loaded['ranks']} ranks on {loaded['nodes']} nodes, the topology "
                   f"{topo.nranks} on {topo.nodes}")
    return out


def verify(table: str, topology: str, out: Path, max_bytes: int = 1 << 30, iters: int = 20,
           plugin: str | None = None, launcher: LaunchConfig | None = None, device: str = "cuda") -> int:
    topo = load_topology(topology)
    launcher = LaunchConfig.of(launcher)
    if launcher.kind == "local" and device == "cuda":
        # a one-line error (ConfigError), not a traceback from a worker; NCCL's own log needs NCCL on GPUs
        require_gpus(launcher.gpus_needed(topo.nranks), "launcher",
                     "start it on the GPU nodes (launcher=srun, mpirun or torchrun)")
    text = Path(table).read_text()
    rows = [r for r in parse_example_rows(text)
            if r["nNodes"] in (-1, topo.nodes) and r["nRanks"] in (-1, topo.nranks)]
    lib = plugin_library(plugin)
    out.mkdir(parents=True, exist_ok=True)
    cases = plan_cases(rows, topo, max_bytes)
    for case in cases:
        case["timed"] = case["row"] is None
    env = {"NCCL_TUNER_PLUGIN": str(lib.resolve()), TABLE_ENV: text}
    t0 = time.time()
    with_plugin = run_job(cases, env, topo, iters, out, "plugin", launcher, device=device)
    without = run_job([dict(c, timed=False) for c in cases], {"NCCL_TUNER_PLUGIN": "none"}, topo, 0, out,
                      "default", launcher, device=device)
    loaded = plugin_loads(with_plugin["log"])
    problems = load_problems(loaded, text, sum(not r["nccl_choice"] for r in rows), topo)
    # the release NCCL's own log states: the rules every expectation below follows
    version = log_version(with_plugin["log"]) or log_version(without["log"])
    topo = topo.with_nccl(**{k: v for k, v in (("version", version), ("channels", log_channels(with_plugin["log"])))
                             if v})
    logged = match_log(with_plugin["log"], cases, topo.nranks)
    nccl_own = match_log(without["log"], cases, topo.nranks)
    report, ok_all = [], True
    for case, got, own, t, base in zip(cases, logged, nccl_own, with_plugin["times_us"],
                                       with_plugin["base_times_us"], strict=True):
        want = expected(case, rows, topo, own)
        ok = got == want
        entry = {"row": case["row"], "collective": N.COLLECTIVES[case["coll"]], "nbytes": case["nbytes"],
                 "expected": "/".join(map(str, want)), "nccl_logged": "/".join(map(str, got)) if got else "missing"}
        if case["row"] is not None:
            r = rows[case["row"]]
            entry["as_written"] = r["algo"] == "-1" or want[:2] == (r["algo"], r["proto"]) or r["nccl_choice"]
            entry["nccl_disabled"] = not entry["as_written"]  # NCCL disabled the row's algorithm/protocol
            cap = capped_at(case, rows, topo)
            if cap is not None:
                entry["as_written"] = False
                entry["capped_at"] = cap
            if not r["nccl_choice"] and r["algo"] != "-1" and r["channels"] > topo.nccl.channels:
                entry["as_written"] = False
                entry["comm_channels"] = topo.nccl.channels
            if r["nccl_choice"]:  # NCCL decides; does the row (the replica's prediction) state its choice?
                entry["nccl_choice"] = True
                entry["predicted"] = "/".join(map(str, expected(case, rows, topo, own, as_row=True)))
        entry["nccl_without_plugin"] = "/".join(map(str, own)) if own else "missing"
        if case["row"] is None:
            entry.update(time_us=t, default_time_us=base)
            if t and base:
                entry["time_ratio"] = t / base
                entry["slower"] = t / base >= SLOWER_RATIO and t - base >= SLOWER_US
        entry["ok"] = bool(ok)
        ok_all &= ok
        report.append(entry)
    untested = [i for i in range(len(rows)) if not any(e["row"] == i for e in report)]
    ok_all &= not problems and not untested
    (out / "verify.json").write_text(json.dumps({"table": table, "topology": topo.name, "nccl_version": version,
                                                 "plugin_loaded": loaded,
                                                 "load_problems": problems, "rows": len(rows),
                                                 "rows_untested": [i + 1 for i in untested], "cases": report,
                                                 "nccl_log": with_plugin["log_path"]}, indent=1))
    print(f"# {table} on {topo.name}: NCCL's logged decision per table row (plugin {lib.name}, NCCL "
          f"{version or 'of unknown version: its log names none'}); {time.time() - t0:.0f} s")
    if problems:
        print("❌ the plugin's own line: " + "; ".join(problems))
    else:
        print(f"✅ the plugin loaded the table whole: {loaded['applicable']} rows for this communicator "
              f"({plural(loaded['ranks'], 'rank')}, {plural(loaded['nodes'], 'node')}), 0 rejected, "
              f"fingerprint {loaded['fingerprint']}")
    for i, r in enumerate(rows):
        mine = [e for e in report if e["row"] == i]
        if not mine:
            print(f"❌ row {i + 1}: {r['collective']} {r['min_bytes']}-{r['max_bytes']}: not called (it starts "
                  f"beyond max_bytes={max_bytes}; raise it to check this row)")
            continue
        good = all(e["ok"] for e in mine)
        detail = "; ".join(f"{e['nbytes']} B {e['nccl_logged']}" + ("" if e["ok"] else f" (want {e['expected']})")
                           for e in mine)
        capped = [e for e in mine if "capped_at" in e]
        disabled = [e for e in mine if e.get("nccl_disabled")]
        cannot = "" if not disabled else \
            " (NCCL cannot run it here at some of these sizes: NCCL's own choice there, as the plugin must leave it)"
        if capped:
            cannot += (f" (NCCL {version} cannot run it as written at {len(capped)} of {len(mine)} sizes: from 2.31 a "
                       f"plugin's channels cap NCCL's own per-call count, here "
                       f"{', '.join(str(e['capped_at']) for e in capped)}; the row asks {r['channels']})")
        if any("comm_channels" in e for e in mine):
            cannot += (f" (the row asks {r['channels']} channels, the communicator has {topo.nccl.channels}: "
                       "NCCL_MIN_NCHANNELS raises the communicator's count)")
        if r["nccl_choice"]:  # the plugin leaves it to NCCL; say whether the written prediction was right
            off = [e for e in mine if e.get("predicted") != e["nccl_logged"]]
            cannot = (f" (marked as NCCL's choice: left to NCCL; the row's prediction, which NVIDIA's example "
                      f"plugin would run, differs at {len(off)} of {len(mine)} sizes)" if off else
                      " (marked as NCCL's choice: left to NCCL, and the row states it right)")
        print(f"{'✅' if good else '❌'} row {i + 1}: {r['collective']} {r['min_bytes']}-{r['max_bytes']} "
              f"{r['algo']}/{r['proto']}/{r['channels']}: {detail}{cannot}")
    unc = [e for e in report if e["row"] is None]
    if unc:
        good = all(e["ok"] for e in unc)
        print(f"{'✅' if good else '❌'} {len(unc)} uncovered sizes keep NCCL's choice")
        for e in unc:
            if not e["ok"]:
                print(f"   ❌ {e['collective']} {e['nbytes']} B: {e['nccl_logged']} (want {e['expected']})")
        timed = [e for e in unc if "time_ratio" in e]
        if timed:
            slow = [e for e in timed if e["slower"]]
            print(f"# their time on the table's communicator / on a table-less one, interleaved, {iters} calls each: "
                  f"{min(e['time_ratio'] for e in timed):.2f}-{max(e['time_ratio'] for e in timed):.2f}; "
                  f"{len(slow)} at least {SLOWER_RATIO:.2f}x and {SLOWER_US:g} us slower"
                  + (": " + ", ".join(f"{e['collective']} {e['nbytes']} B {e['time_ratio']:.2f}" for e in slow)
                     + " (NCCL ran the same decision on both: the difference is the two communicators', not the "
                     "table's)" if slow else ""))
    named = sorted({e["row"] + 1 for e in report if e["row"] is not None and not e.get("as_written", True)
                    and not rows[e["row"]]["nccl_choice"]})
    print(f"{sum(e['ok'] for e in report)} passed, {sum(not e['ok'] for e in report)} failed; "
          f"{len(rows) - len(untested)} of {len(rows)} rows called; rows NCCL {version or ''} cannot run as written "
          f"at some size (named above): {', '.join(map(str, named)) or 'none'}")
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
    :param plugin: the plugin library (default: the one ncclrl plugin build makes, built if missing;
        the same path on every node)
    :param launcher: how the job's processes start (group launcher=: local, torchrun, srun, mpirun)
    """

    defaults: list[Any] = field(default_factory=lambda: ["_self_", {"launcher": "local"}])
    table: str = ""
    topology: str = ""
    out: str = "plugin-verify"
    max_bytes: str = "1G"
    iters: int = 20
    plugin: str | None = None
    launcher: LaunchConfig = field(default_factory=LaunchConfig)

    def check(self) -> None:
        self.launcher.check()
        for k in ("table", "topology"):
            if not getattr(self, k):
                raise ConfigError(k, "required: ncclrl plugin verify TABLE topology=T (the platform the job runs on)")
        if not Path(self.table).is_file():
            raise ConfigError("table", f"no such file: {self.table}")
        load_topology(self.topology)
        parse_bytes(self.max_bytes, "max_bytes")


def main_verify(cfg) -> int:
    return verify(cfg.table, cfg.topology, Path(cfg.out), parse_bytes(cfg.max_bytes, "max_bytes"), cfg.iters,
                  cfg.plugin, LaunchConfig.of(OmegaConf.to_container(cfg.launcher)))


COMMAND = Command("plugin verify", VerifyConfig, main_verify,
                  "check on GPUs, from NCCL's own log, that NCCL runs what a table says", positional="table")
register(COMMAND)
