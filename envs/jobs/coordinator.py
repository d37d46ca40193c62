"""Starting the online mode's coordinator for a job (``ncclrl coordinator``) and waiting until it listens."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from ncclrl.costmodel.errors import ConfigError


def start_coordinator(folder: Path, keys: list[str], log_file: Path, env: dict[str, str] | None = None,
                      timeout_s: float = 60.0, argv: list[str] | None = None) -> tuple[subprocess.Popen, int, Path]:
    """Start ``ncclrl coordinator`` (its ``keys`` besides ``port``, ``port_file`` and ``secret_file``) in
    ``folder``, its messages into ``log_file``; returns the process, the port, once it listens, and the
    file holding the job's fresh secret (mode 0600; the ranks' ``NCCLRL_ONLINE_SECRET_FILE``). A
    coordinator that exits or does not listen within ``timeout_s`` is one :class:`ConfigError` on ``online``.
    ``argv``: another program taking the same keys (a test's coordinator with a fault built in)."""
    folder = folder.resolve()
    port_file = folder / "coordinator.port"
    port_file.unlink(missing_ok=True)
    secret_file = folder / "coordinator.secret"
    secret_file.unlink(missing_ok=True)  # a fresh secret for every job
    with log_file.open("w") as err:
        program = argv or [sys.executable, "-m", "ncclrl", "coordinator"]
        proc = subprocess.Popen([*program, "port=0", f"port_file={port_file}", f"secret_file={secret_file}", *keys],
                                stdout=subprocess.DEVNULL, stderr=err, env=env, cwd=folder)
    t0 = time.monotonic()
    while not port_file.exists():
        if proc.poll() is not None or time.monotonic() - t0 > timeout_s:
            proc.kill()
            raise ConfigError("online", "the coordinator did not start: " + log_file.read_text()[-500:])
        time.sleep(0.05)
    return proc, int(port_file.read_text()), secret_file


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
