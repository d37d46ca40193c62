"""``ncclrl coordinator`` (the real state machine and server) that dies in the middle of one GO: the
first GO it sends reaches the lowest rank's connection only, then the process exits at once, as a
coordinator killed inside its broadcast loop would. With ``GO_TO=none`` it dies once every rank has
confirmed the verdict, before any GO is written. Takes the coordinator's keys."""

from __future__ import annotations

import os
import sys

from ncclrl.runners import cli
from ncclrl.runners.coordinator import command
from ncclrl.runners.coordinator.core import Coordinator


class HalfGo(Coordinator):
    dying = False

    def _go(self, cid: int, b: int, rnd: int, now: float) -> None:
        if self.dying:
            return
        comm = self.comms[cid]
        first = comm.conns[min(comm.conns)]
        before = {conn: len(self.outbox.get(conn, [])) for conn in set(comm.conns.values())}
        super()._go(cid, b, rnd, now)
        for conn, n in before.items():  # the GO lines queued for the other ranks (or all) never leave
            if conn != first or os.environ.get("GO_TO") == "none":
                del self.outbox[conn][n:]
        self.dying = True

    def emit(self) -> None:
        super().emit()
        if self.dying:
            sys.stderr.flush()
            os._exit(0)


if __name__ == "__main__":
    command.Coordinator = HalfGo
    sys.exit(cli.main(["coordinator", *sys.argv[1:]]))
