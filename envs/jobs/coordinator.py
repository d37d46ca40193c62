"""Starting the online mode's coordinator for a job (``ncclrl coordinator``) and waiting until it listens."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from ncclrl.costmodel.errors import ConfigError


def start_coordinator(folder: Path, keys: list[str], log_file: Path, env: dict[str, str] | None = None,
                      timeout_s: float = 60.0) -> tuple[subprocess.Popen, int]:
    """Start ``ncclrl coordinator`` (its ``keys`` besides ``port`` and ``port_file``) in ``folder``,
    its messages into ``log_file``; returns the process and the port, once it listens. A coordinator
    that exits or does not listen within ``timeout_s`` is one :class:`ConfigError` on ``online``."""
    folder = folder.resolve()
    port_file = folder / "coordinator.port"
    port_file.unlink(missing_ok=True)
    with log_file.open("w") as err:
        proc = subprocess.Popen([sys.executable, "-m", "ncclrl", "coordinator", "port=0", f"port_file={port_file}",
                                 *keys], stdout=subprocess.DEVNULL, stderr=err, env=env, cwd=folder)
    t0 = time.monotonic()
    while not port_file.exists():
        if proc.poll() is not None or time.monotonic() - t0 > timeout_s:
            proc.kill()
            raise ConfigError("online", "the coordinator did not start: " + log_file.read_text()[-500:])
        time.sleep(0.05)
    return proc, int(port_file.read_text())


def stop_coordinator(proc: subprocess.Popen | None, grace_s: float = 10.0) -> None:
    """End a coordinator :func:`start_coordinator` started: SIGTERM, then SIGKILL after ``grace_s``."""
    if proc is None or proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=5)
