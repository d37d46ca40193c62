#!/usr/bin/env python3
"""A stand-in for nccl-tests' *_perf binaries: prints REAL recorded all_reduce_perf output from
../shared/data, chosen by the configuration it is asked to run (our plugin's one-row table), and
misbehaves on cue (FAKE_PERF_MODE=hang|fail|warn|wrong|truncate) to exercise fault handling."""
import os
import sys
import time
from pathlib import Path

data = Path(os.environ["FAKE_PERF_DATA"])
mode = os.environ.get("FAKE_PERF_MODE", "")
name = "default"
table = os.environ.get("NCCLRL_TUNER_TABLE")
if table and os.environ.get("NCCL_TUNER_PLUGIN", "none") != "none":
    f = Path(table).read_text().split(",")
    algo, proto, ch = f[3], f[4], int(f[5])
    if algo == "-1":  # NCCL's own algorithm and protocol at a channel count: recorded as c1, c4, c16
        name = f"c{ch}" if ch > 0 else "default"
    else:
        name = f"{algo}_{ {'ll': 'LL', 'll128': 'LL128', 'simple': 'Simple'}[proto] }" + (f"_c{ch}" if ch > 0 else "")
if os.environ.get("FAKE_PERF_HANG_ON") == name:
    mode = "hang"
path = data / f"all_reduce__{name.replace(' ', '')}.txt"
if not path.exists():
    path = data / "all_reduce__default.txt"
text = path.read_text()
if mode == "hang":
    time.sleep(60)
if mode == "fail":
    print("vm:1:1 [0] NCCL WARN Net : Connection closed by remote peer", file=sys.stderr)
    sys.exit(3)
if mode == "warn":
    warn = "vm:1:1 [0] NCCL WARN Cuda failure 'out of memory'\n"
    text = text.replace("#\n# Using devices", warn + "#\n# Using devices", 1)
if mode == "wrong":
    text = text.replace("N/A", "7", 1)
if mode == "truncate":
    text = "\n".join(text.splitlines()[:20])
print(text)
