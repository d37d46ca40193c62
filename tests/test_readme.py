"""The README's fast example blocks and docs/reference/commands.md are what the current code prints."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_readme_examples_and_command_reference_are_current():
    r = subprocess.run([sys.executable, str(REPO / "docs" / "examples.py"), "--check"], capture_output=True,
                       text=True, timeout=600, cwd=REPO)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]


def test_the_check_sees_a_stale_block(tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text("<!-- example fast -->\n```console\n$ ncclrl decisions topology=h200-1x4 collective=allreduce "
                      "max_bytes=8\ncollective,nbytes,algo,proto,channels\nallreduce,8,tree,ll,9\n```\n")
    r = subprocess.run([sys.executable, str(REPO / "docs" / "examples.py"), "--check", str(readme)],
                       capture_output=True, text=True, timeout=300, cwd=REPO)
    assert r.returncode == 1 and "+allreduce,8,ring,ll,1" in r.stdout
