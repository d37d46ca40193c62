"""The command line imports what the chosen command needs and nothing more: the command list needs no
command module, a table command neither the learning stack nor pandas and SciPy."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

HEAVY = ("torch", "stable_baselines3", "sb3_contrib", "pandas", "scipy", "matplotlib", "tensorboard")
COMMAND_MODULES = ("benchmark", "composer", "coordinator", "e2e", "finetune", "plugin_verify", "pretrain", "profile",
                   "show", "sweep", "tune", "validate")


def loaded(argv: list[str], names: tuple[str, ...]) -> list[str]:
    """Which of ``names`` are imported once ``ncclrl ARGV`` has run (in a fresh interpreter)."""
    code = ("import io, json, sys, contextlib\n"
            "from ncclrl.runners.cli import main\n"
            "with contextlib.redirect_stdout(io.StringIO()):\n"
            f"    code = main({argv!r})\n"
            f"print(json.dumps([code, sorted(n for n in {names!r} if n in sys.modules)]))\n")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    code, names_loaded = json.loads(p.stdout.splitlines()[-1])
    assert code == 0, p.stderr
    return names_loaded


@pytest.mark.parametrize("argv", [["--help"], ["--version"], ["plugin", "--help"]], ids=" ".join)
def test_the_command_list_imports_no_command(argv):
    modules = tuple(f"ncclrl.runners.{m}" for m in COMMAND_MODULES)
    assert loaded(argv, (*HEAVY, "hydra", "omegaconf", *modules)) == []


@pytest.mark.parametrize("argv", [
    ["decisions", "topology=h200-1x4", "collective=allreduce"],
    ["topologies"],
    ["show", "--help"],
    ["decisions", "--help"],
    ["decisions", "--cfg", "job"],
], ids=" ".join)
def test_table_commands_import_neither_the_learning_stack_nor_pandas(argv):
    modules = tuple(f"ncclrl.runners.{m}" for m in COMMAND_MODULES if m != argv[0])
    assert loaded(argv, (*HEAVY, *modules)) == []


def test_table_commands_import_no_gymnasium():
    assert loaded(["decisions", "topology=h200-1x4", "collective=allreduce"], ("gymnasium",)) == []
