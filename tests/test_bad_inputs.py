"""The bad-input audit (benchmarks/bad_inputs.py): how it classifies a command's result, and one
case run end to end."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def audit():
    spec = importlib.util.spec_from_file_location("bad_inputs", REPO / "benchmarks" / "bad_inputs.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["bad_inputs"] = mod
    spec.loader.exec_module(mod)
    yield mod
    sys.modules.pop("bad_inputs", None)


def result(audit, rc=2, stderr="ncclrl: error: key: bad\n", stdout="", created=(), seconds=1.0):
    return audit.Result(rc, stdout, stderr, seconds, list(created))


@pytest.mark.parametrize(("kwargs", "expected"), [
    ({}, "clean"),
    ({"stderr": "Traceback (most recent call last):\n  x\nValueError: y\n", "rc": 1}, "traceback"),
    ({"rc": 0, "stderr": ""}, "silent"),
    ({"rc": 1, "stderr": ""}, "silent"),
    ({"rc": None, "stderr": ""}, "timeout"),
    ({"created": ["work/runs/x.sqlite"]}, "leftover"),
    ({"rc": 1}, "wrong exit"),
    ({"stderr": "# progress\nncclrl: error: key: bad\n"}, "noisy"),
    ({"stderr": "something went wrong\n"}, "noisy"),
    ({"seconds": 60.0}, "late refusal"),
])
def test_classes(audit, tmp_path, kwargs, expected):
    case = audit.Case("c", ["decisions"], max_s=15)
    assert audit.judge(case, result(audit, **kwargs), tmp_path, tmp_path)[0] == expected


def test_operational_cases_expect_1(audit, tmp_path):
    case = audit.Case("c", ["coordinator"], expect=1)
    assert audit.judge(case, result(audit, rc=1), tmp_path, tmp_path)[0] == "clean"
    assert audit.judge(case, result(audit, rc=2), tmp_path, tmp_path)[0] == "wrong exit"


def test_forbidden_words_are_a_wrong_hint(audit, tmp_path):
    case = audit.Case("c", ["finetune"], forbid="pickle")
    res = result(audit, stderr="ncclrl: error: strategy: x.npz is a pickled checkpoint\n")
    assert audit.judge(case, res, tmp_path, tmp_path)[0] == "wrong hint"


def test_help_and_accepted_cases(audit, tmp_path):
    helptext = "keys:\n  method=                              the tuner: default, sweep,\n" \
               "                                       jobs, ppo\n  budget=1                             x\n"
    assert audit.help_line(helptext, "method").endswith("jobs, ppo")
    listed = audit.Case("c", ["tune", "--help"], kind="help", key="method", value="ppo")
    assert audit.judge(listed, result(audit, rc=0, stdout=helptext), tmp_path, tmp_path)[0] == "clean"
    missing = audit.Case("c", ["tune", "--help"], kind="help", key="method", value="kg-jobs")
    assert audit.judge(missing, result(audit, rc=0, stdout=helptext), tmp_path, tmp_path)[0] == "help mismatch"
    offered = audit.Case("c", ["coordinator"], kind="accepted", key="policy", value="shipped")
    refused = result(audit, stderr="ncclrl: error: policy: must be one of a, b\n")
    assert audit.judge(offered, refused, tmp_path, tmp_path)[0] == "help mismatch"
    assert audit.judge(offered, result(audit, rc=None, stderr=""), tmp_path, tmp_path)[0] == "clean"


def test_enough_cases_over_every_command(audit):
    cases = audit.cases()
    assert len(cases) >= 182
    assert len({c.name for c in cases}) == len(cases)
    for cmd in ("pretrain", "export", "finetune", "tune", "sweep", "validate", "benchmark", "show", "composer",
                "coordinator", "plugin build", "plugin verify", "e2e", "decisions", "predict", "calibrate",
                "topologies", "parse", "detect", "profile"):
        assert any(" ".join(c.argv).startswith(cmd) for c in cases), cmd


def test_one_case_end_to_end(audit, tmp_path):
    """A refusal at parse time, run as the audit runs it: clean, nothing left."""
    case = audit.Case("decisions-collective-unknown", ["decisions", "collective=bogus"])
    res, _cwd = audit.run_one(case.argv, tmp_path / "fx", tmp_path / "case", {}, None, 60, "", ())
    assert audit.judge(case, res, tmp_path / "fx", tmp_path / "case") == ("clean", "")
    assert res.created == []
