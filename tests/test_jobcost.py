"""The job cost model: what a job costs in GPU-time, the budget grammar, and the fit it ships with."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from ncclrl.costmodel.errors import ConfigError
from ncclrl.costmodel.jobcost import DEFAULT_JOB_COST, JobCost, format_gpu_s, parse_budget, parse_gpu_time

ROOT = Path(__file__).resolve().parents[1]


def test_a_job_costs_its_launch_and_its_points_times_its_gpus():
    c = JobCost(launch_s=10.0, point_s=0.5, work_factor=1.0, sample_budget_us=1000.0)
    # 8 B calls of 20 us: 50 calls per sample (the cap); 1 GiB calls of 20 ms: 1 per sample
    assert c.busy_us(20.0, 5) == pytest.approx((3 + 5 * 50) * 20.0)
    assert c.busy_us(20_000.0, 5) == pytest.approx((3 + 5) * 20_000.0)
    wall = c.job_wall_s(np.array([20.0, 20_000.0]), 5)
    assert wall == pytest.approx(10.0 + 2 * 0.5 + ((3 + 250) * 20 + 8 * 20_000) / 1e6)
    assert c.job_gpu_s(np.array([20.0, 20_000.0]), 5, 16) == pytest.approx(16 * wall)


@pytest.mark.parametrize("text, gpu_s", [("600", 600), ("600s", 600), ("10min", 600), ("1.5h", 5400),
                                         ("10gpu-min", 600), (" 2 min ", 120), ("0", 0)])
def test_gpu_time_grammar(text, gpu_s):
    assert parse_gpu_time(text) == pytest.approx(gpu_s)


@pytest.mark.parametrize("text", ["-1", "ten", "5 fortnights", "nan", "inf", "1e400", "", "sweep", "-0.5sweep",
                                  "10M", "10m", "0", "0min", "0sweep"])
def test_bad_budgets_are_one_line_naming_the_key(text):
    with pytest.raises(ConfigError) as e:
        parse_budget(text, 100.0, "budget")
    assert e.value.field == "budget" and "\n" not in str(e.value)


def test_a_budget_in_sweeps_is_a_multiple_of_the_sweep():
    assert parse_budget("0.5sweep", 300.0) == pytest.approx(150.0)
    assert parse_budget("2sweep", 300.0) == pytest.approx(600.0)
    assert parse_budget("10min", 300.0) == pytest.approx(600.0)


def test_gpu_time_for_people():
    assert format_gpu_s(42) == "42 GPU-s" and format_gpu_s(630) == "10.5 GPU-min" and format_gpu_s(9000) == "2.50 GPU-h"


def test_bad_constants_are_refused():
    with pytest.raises(ConfigError, match="job_cost.launch_s"):
        JobCost(launch_s=-1.0)


def test_the_shipped_constants_are_the_fit_of_the_recorded_stores():
    """The default job cost is what the fitting script gives on the recorded H200 stores (pooled)."""
    out = subprocess.run([sys.executable, str(ROOT / "docs/results/scripts/fit_job_cost.py")], capture_output=True,
                         text=True, check=True, cwd=ROOT).stdout
    pooled = next(line.split() for line in out.splitlines() if line.startswith("pooled"))
    launch_s, point_s, work = map(float, pooled[2:5])
    assert DEFAULT_JOB_COST.launch_s == pytest.approx(launch_s, abs=0.05)
    assert DEFAULT_JOB_COST.point_s == pytest.approx(point_s, abs=0.001)
    assert DEFAULT_JOB_COST.work_factor == pytest.approx(work, abs=0.01)
