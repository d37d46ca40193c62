"""The layer contract (costmodel <- envs <- agents <- runners) that CI enforces with lint-imports
holds for the code as it is, and fails when one module imports a layer above it."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SUBPACKAGES = ("costmodel", "envs", "agents", "runners", "conf", "plugin")


def lint_imports(root: Path) -> subprocess.CompletedProcess:
    exe = shutil.which("lint-imports") or pytest.fail("lint-imports is not installed (pip install -e '.[dev]')")
    return subprocess.run([exe, "--config", str(REPO / "pyproject.toml"), "--no-cache"], cwd=root,
                          env=dict(os.environ, PYTHONPATH=str(root)), capture_output=True, text=True, timeout=300)


@pytest.fixture
def copy(tmp_path):
    """The package's Python sources under tmp_path/ncclrl, as an installed wheel lays them out."""
    pkg = tmp_path / "ncclrl"
    pkg.mkdir()
    shutil.copy(REPO / "__init__.py", pkg / "__init__.py")
    for sub in SUBPACKAGES:
        shutil.copytree(REPO / sub, pkg / sub, ignore=shutil.ignore_patterns("build", "__pycache__", "*.so"))
    return tmp_path


def test_the_code_keeps_the_layers(copy):
    r = lint_imports(copy)
    assert r.returncode == 0, r.stdout[-3000:]
    assert "BROKEN" not in r.stdout and "KEPT" in r.stdout


@pytest.mark.parametrize("module, upward", [
    ("costmodel/simulator.py", "from ncclrl.envs import store as _store"),
    ("envs/store.py", "import ncclrl.agents.finetune"),
    ("agents/evaluate.py", "from ncclrl.runners.config import Command"),
])
def test_an_upward_import_breaks_the_contract(copy, module, upward):
    path = copy / "ncclrl" / module
    text = path.read_text()
    i = text.index("\nfrom ncclrl")  # among the module's own imports
    path.write_text(text[:i] + "\n" + upward + "  # noqa" + text[i:])
    r = lint_imports(copy)
    assert r.returncode != 0 and "BROKEN" in r.stdout, r.stdout[-3000:]
    dotted = "ncclrl." + module[:-3].replace("/", ".")
    assert dotted in r.stdout


def test_lint_imports_runs_in_ci():
    assert "lint-imports" in (REPO / ".ci" / "run").read_text()
