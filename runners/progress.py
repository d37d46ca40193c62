"""Progress bars with an ETA for the long commands (rich), on stderr and only on a terminal.

Messages go through :mod:`logging` (Hydra's job logging sends them to stderr); while a bar is
shown, log records are printed above it instead of tearing it.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn


def enabled() -> bool:
    """Bars are drawn on a terminal, unless ``NCCLRL_PROGRESS=0``."""
    return sys.stderr.isatty() and os.environ.get("NCCLRL_PROGRESS", "1") != "0"


class _Bar:
    """What a command updates: ``advance(n)`` or ``update(done)``, and ``total`` when it changes."""

    def __init__(self, progress: Progress | None, task: int | None) -> None:
        self._p, self._t = progress, task

    def advance(self, n: float = 1) -> None:
        if self._p is not None:
            self._p.advance(self._t, n)

    def update(self, done: float, total: float | None = None, description: str | None = None) -> None:
        if self._p is not None:
            kw = {"completed": done}
            if total is not None:
                kw["total"] = total
            if description is not None:
                kw["description"] = description
            self._p.update(self._t, **kw)


class _ProgressHandler(logging.Handler):
    def __init__(self, progress: Progress) -> None:
        super().__init__()
        self.progress = progress

    def emit(self, record: logging.LogRecord) -> None:
        self.progress.console.print(self.format(record), markup=False, highlight=False)


@contextmanager
def progress(description: str, total: float | None) -> Iterator[_Bar]:
    """A bar for one long loop; a no-op when bars are off."""
    if not enabled():
        yield _Bar(None, None)
        return
    p = Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TextColumn("elapsed"),
                 TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn(), console=Console(stderr=True),
                 transient=False)
    root = logging.getLogger()
    handler = _ProgressHandler(p)
    console_handlers = [h for h in root.handlers if isinstance(h, logging.StreamHandler)]
    if console_handlers:
        handler.setFormatter(console_handlers[0].formatter)
    for h in console_handlers:
        root.removeHandler(h)
    root.addHandler(handler)
    try:
        with p:
            yield _Bar(p, p.add_task(description, total=total))
    finally:
        root.removeHandler(handler)
        for h in console_handlers:
            root.addHandler(h)
