"""What NCCL's own log says ran in the online side's jobs of a live ``ncclrl e2e online=true`` run.

    python docs/results/scripts/online_live.py data/h100x1-online-2026-11-27/online-e2e.tar.gz

For every job whose plugin ran the online mode: per explored bucket, the configurations NCCL
logged (``NCCL_DEBUG_SUBSYS=TUNING``, rank 0: NCCL prints per-call decisions on rank 0) in the
exploration and after the commit the plugin logged, whether every call from the commit's call
index on ran the committed arm, and whether the plugin's commit lines are the same on both ranks.
"""

from __future__ import annotations

import re
import sys
import tarfile
from collections import Counter, defaultdict
from pathlib import Path

CALL = re.compile(r"NCCL INFO (AllReduce|AllGather|ReduceScatter|Broadcast|Reduce): (\d+) Bytes -> Algo (\w+) proto "
                  r"(\w+) channel\{Lo\.\.Hi\}=\{(\d+)\.\.(\d+)\}")
COMMIT = re.compile(r"online ([0-9a-f]{16}) (\w+) 2\^(\d+) B: commit arm (\d+) \(([^)]*)\) from call (\d+) after (\d+) "
                    r"rounds; evidence (\S+)")
FROZEN = re.compile(r"online ([0-9a-f]{16}) (\w+) 2\^(\d+) B: frozen on the static table at call (\d+)")
NAMES = {"allreduce": "AllReduce", "allgather": "AllGather", "reducescatter": "ReduceScatter",
         "broadcast": "Broadcast", "reduce": "Reduce"}


def logs(src: Path) -> dict[str, str]:
    if src.is_dir():
        return {p.name: p.read_text(errors="replace") for p in sorted(src.rglob("nccl.*.log"))}
    with tarfile.open(src) as t:
        return {Path(m.name).name: t.extractfile(m).read().decode(errors="replace")
                for m in t.getmembers() if m.isfile() and Path(m.name).name.startswith("nccl.")}


def main(src: str) -> int:
    texts = logs(Path(src))
    by_comm: dict[str, list[str]] = defaultdict(list)
    for name, text in texts.items():
        m = re.search(r"online mode on communicator ([0-9a-f]{16})", text)
        if m:
            by_comm[m.group(1)].append(name)
    ok_all = True
    print("| job (communicator) | bucket | NCCL ran while exploring (calls) | commit | calls after it "
          "as committed | ranks' commit lines equal |")
    print("| --- | --- | --- | --- | --- | --- |")
    for comm, names in sorted(by_comm.items()):
        commits = {n: sorted(COMMIT.findall(texts[n])) for n in names}
        same = len({tuple(c) for c in commits.values()}) == 1
        rank0 = next((n for n in names if CALL.search(texts[n])), None)
        calls = [m.groups() for m in CALL.finditer(texts[rank0])] if rank0 else []
        shape = re.search(r"online mode on communicator [0-9a-f]{16} \(rank \d+ of (\d+)\)", texts[names[0]])
        nranks = int(shape.group(1))
        for _cid, coll, lg, arm, what, k, rounds, _ev in commits[names[0]]:
            lg, k = int(lg), int(k)
            # NCCL logs AllGather and ReduceScatter per rank; the plugin sees nBytes = count x size x nranks
            scale = nranks if coll in ("allgather", "reducescatter") else 1
            seq = [c for c in calls if c[0] == NAMES[coll] and 1 << lg <= int(c[1]) * scale < 2 << lg]
            cfg = [(a.lower(), p.lower(), int(hi) - int(lo) + 1) for _, _, a, p, lo, hi in seq]
            explored = Counter(f"{a}/{p}/{c}" for a, p, c in cfg[:k])
            after = cfg[k:]
            if arm == "0":
                as_committed = len(set(after)) <= 1  # the table's own decision, whatever it is
            else:
                a, p, ch = what.split("/")
                as_committed = all(x[0] == a and x[1] == p and (ch == "0" or x[2] == int(ch)) for x in after)
            ok_all &= as_committed and same
            print(f"| {comm} | {coll} 2^{lg} B | " + ", ".join(f"{c} x{n}" for c, n in sorted(explored.items()))
                  + f" | arm {arm} ({what}) from call {k}, after {rounds} rounds | {sum(1 for _ in after)} "
                  f"{'all' if as_committed else 'NOT all'} | {'yes' if same else 'NO'} |")
        for n in names:
            for f in FROZEN.findall(texts[n]):
                print(f"| {comm} | {f[1]} 2^{f[2]} B | | frozen at call {f[3]} ({n}) | | |")
    print(f"\nevery call after a commit ran the committed arm and every rank logged the same commits: {ok_all}")
    return 0 if ok_all else 1


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1]))
