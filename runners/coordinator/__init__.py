"""``ncclrl coordinator``: the agreement point of the plugin's online mode.

Every rank of a job whose plugin runs ``NCCLRL_TUNER_MODE=online`` connects here
(``NCCLRL_ONLINE_COORD=HOST:PORT``) and proves it holds the job's secret. For each communicator,
collective and size bucket, the ranks report their timings of the round just explored; once every
rank has, the exploration policy (:mod:`ncclrl.agents.online`) decides the next round's plan or the
arm to commit; every rank confirms it holds that verdict before any applies it. Any fault freezes
the communicator: every rank keeps its static table there. The protocol, its threat model and its
failure cases: docs/design/online.md.

- :mod:`.core`: the state machine (lines in, lines out, a clock);
- :mod:`.server`: asyncio sockets around it, every resource bounded;
- :mod:`.secret`: the per-job secret and the handshake's proofs;
- :mod:`.command`: the command line.
"""

from ncclrl.runners.coordinator.command import COMMAND, CoordinatorCommand, main_coordinator
from ncclrl.runners.coordinator.core import PROTOCOL_VERSION, Coordinator, bucket_name, fnv1a64
from ncclrl.runners.coordinator.server import ServerOptions, bind, serve

__all__ = ["COMMAND", "PROTOCOL_VERSION", "Coordinator", "CoordinatorCommand", "ServerOptions", "bind",
           "bucket_name", "fnv1a64", "main_coordinator", "serve"]
