#!/usr/bin/env python3
"""Runs one measuring command in-process for the kill-and-resume tests: ``sweep``, ``finetune`` or
``tune`` (argv[1]) with the overrides that follow. Every job sleeps ``FAKE_JOB_SLEEP`` seconds
(default 0.05) so that a kill lands inside the run; sweep measures through
:class:`fake_workers.SlowWholeWorkers`, finetune and tune replay a recorded sweep."""
import io
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from fake_workers import SlowWholeWorkers  # noqa: E402

from ncclrl.envs.replay import ReplayWorkers  # noqa: E402

SLEEP = float(os.environ.get("FAKE_JOB_SLEEP", "0.05"))
_measure = ReplayWorkers.measure


def slow_measure(self, points, samples=5):
    time.sleep(SLEEP)
    return _measure(self, points, samples)


ReplayWorkers.measure = slow_measure
cmd, argv = sys.argv[1], sys.argv[2:]
if cmd == "sweep":
    from ncclrl.runners.sweep import parse_args, run_sweep

    r = run_sweep(parse_args(argv), io.StringIO(), lambda *a: SlowWholeWorkers(*a, sleep_s=SLEEP))
elif cmd == "finetune":
    from ncclrl.runners.finetune import parse_args, run_finetune

    r = run_finetune(parse_args(argv), io.StringIO())
else:
    from ncclrl.runners.tune import parse_args, run_tune

    r = run_tune(parse_args(argv))
print("done", flush=True)
