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
