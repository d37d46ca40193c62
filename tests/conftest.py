"""Shared fixtures: the real recorded data of ../shared/data (never skipped: a missing data
directory is a failure). Looked up in NCCLRL_SHARED_DATA, then ../shared/data beside the checkout,
then the copy committed in tests/data/shared (so a clean clone on a fresh machine has it)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def shared_data_dir() -> Path:
    env = os.environ.get("NCCLRL_SHARED_DATA")
    if env:
        path = Path(env)
    else:
        path = next((p for p in (REPO.parent / "shared" / "data", REPO / "tests" / "data" / "shared")
                     if (p / "h200x4-nccl2.28").is_dir()), REPO.parent / "shared" / "data")
    if not path.is_dir():
        raise FileNotFoundError(f"real data not found at {path}; set NCCLRL_SHARED_DATA")
    return path


@pytest.fixture(scope="session")
def h200_data() -> Path:
    return shared_data_dir() / "h200x4-nccl2.28"


@pytest.fixture(scope="session")
def allreduce_files(h200_data: Path) -> list[Path]:
    files = sorted((h200_data / "nccltests_allreduce").glob("*.txt"))
    assert len(files) >= 20, "expected the recorded nccl-tests files"
    return files


@pytest.fixture(scope="session", autouse=True)
def committed_stores_stay_unchanged():
    """Recorded measurement stores are data: tests and the commands they run only read them (a
    writable open would migrate the schema in place). Checked over the whole session."""
    import hashlib

    def state(p: Path) -> tuple:
        # a write in WAL mode lands in the -wal file first; the store itself changes at a checkpoint
        wal = p.with_name(p.name + "-wal")
        return (hashlib.sha256(p.read_bytes()).hexdigest() if p.exists() else None,
                wal.exists() and wal.stat().st_size > 0)

    stores = sorted(REPO.glob("data/**/*.sqlite"))
    before = {p: state(p) for p in stores}
    yield
    changed = [str(p.relative_to(REPO)) for p, s in before.items() if state(p) != s]
    assert not changed, f"tests changed committed stores: {changed}"
