"""What a wheel carries: every subpackage of the source tree and the data files commands read at run
time (a package missing from ``pyproject.toml`` installs without its modules: ``ncclrl`` then fails
at import on the user's machine)."""

from __future__ import annotations

from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

REPO = Path(__file__).resolve().parent.parent
SKIP = {"tests", "build", "third_party", "docs", "data", "benchmarks", ".whl"}


def _config() -> dict:
    return tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]


def test_every_subpackage_is_listed():
    found = {"ncclrl." + ".".join(p.parent.relative_to(REPO).parts) if p.parent != REPO else "ncclrl"
             for p in REPO.rglob("__init__.py")
             if not (set(p.relative_to(REPO).parts[:1]) & SKIP or any(x.startswith(".") for x in p.parts))}
    assert found == set(_config()["packages"])


def test_the_run_time_data_are_package_data():
    data = _config()["package-data"]
    assert "recordings/*" in data["ncclrl.envs"] and any((REPO / "envs" / "recordings").glob("*.sqlite.gz"))
    assert "pretrained/*" in data["ncclrl.agents"]
