"""``ncclrl coordinator``: the agreement point of the plugin's online mode, as a command."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import shutil
import signal
import stat
from dataclasses import dataclass
from pathlib import Path

from omegaconf import DictConfig

from ncclrl.costmodel.errors import ConfigError, JobError
from ncclrl.runners.config import Command, register
from ncclrl.runners.coordinator import secret as S
from ncclrl.runners.coordinator.core import MAX_PLAN, Coordinator
from ncclrl.runners.coordinator.server import ServerOptions, bind, raise_fd_limit, serve

log = logging.getLogger(__name__)


@dataclass
class CoordinatorCommand:
    """Serve the online mode's agreement: every rank's plugin connects here (NCCLRL_ONLINE_COORD=HOST:PORT)
    and proves it holds the job's secret (NCCLRL_ONLINE_SECRET_FILE or NCCLRL_ONLINE_SECRET).

    :param host: address to listen on, every IPv4 and IPv6 address it resolves to (localhost: this node's
        ranks only; a multi-node job: the address of the interface the ranks reach this node at)
    :param port: TCP port (0: any free port, printed at start)
    :param policy: exploration policy (round-robin, halving, thompson, ppo; empty or shipped: the shipped one)
    :param round_timeout_s: a round not reported, or its verdict not confirmed, by every rank this long
        after its first report (after it was sent) freezes the communicator
    :param slots: the longest plan a round may have (2..64)
    :param seed: seed of the policies' random numbers
    :param log: JSONL file every verdict and freeze is appended to, with its evidence, mode 0600 ('' for none)
    :param port_file: file the bound port is written to once listening, mode 0600 ('' for none)
    :param secret_file: file holding the job's secret (hex); created with a fresh secret, mode 0600, when
        missing; refused when others may read it; empty: a fresh one in a new private temporary folder
    :param max_conns: connections at once
    """

    host: str = "localhost"
    port: int = 29555
    policy: str = ""
    round_timeout_s: float = 10.0
    slots: int = 16
    seed: int = 0
    log: str = ""
    port_file: str = ""
    secret_file: str = ""
    max_conns: int = 4096

    def check(self) -> None:
        from ncclrl.agents.online import POLICIES

        if self.policy not in ("", SHIPPED, *POLICIES):
            raise ConfigError("policy", f"must be one of {', '.join(POLICIES)}, or {SHIPPED} (or empty: the shipped "
                              f"one), got {self.policy!r}")
        if not self.host.strip():
            raise ConfigError("host", "empty; give the address to listen on: localhost (this node's ranks), the "
                              "address of the interface the ranks reach this node at, or 0.0.0.0 (every IPv4 one)")
        if not 0 <= self.port < 65536:
            raise ConfigError("port", f"must be in 0..65535, got {self.port}")
        if not 0 < self.round_timeout_s <= 3600:
            raise ConfigError("round_timeout_s", f"must be in (0, 3600], got {self.round_timeout_s}")
        if not 2 <= self.slots <= MAX_PLAN:
            raise ConfigError("slots", f"must be in 2..{MAX_PLAN}, got {self.slots}")
        if not 1 <= self.max_conns <= 1 << 20:
            raise ConfigError("max_conns", f"must be in 1..{1 << 20}, got {self.max_conns}")
        for key in ("log", "port_file", "secret_file"):
            writable(key, str(getattr(self, key)))


#: ``policy=shipped``: the policy ncclrl ships (what an empty ``policy`` runs)
SHIPPED = "shipped"


def writable(key: str, path: str) -> None:
    """A file ``path`` can be written (or created), said before anything is: a folder named where a file
    is meant is bad input (:class:`ConfigError`); a file this process cannot write or create is an
    operational failure (:class:`JobError`, exit status 1)."""
    if not path:
        return
    p = Path(path).expanduser()
    if p.is_dir():
        raise ConfigError(key, f"{p} is a folder, not a file; name a file")
    if p.exists():
        if key != "secret_file" and not os.access(p, os.W_OK):
            raise JobError(key, f"{p} cannot be written (permission denied)")
        return
    parent = next((q for q in [p.parent, *p.parent.parents] if q.exists()), Path("/"))
    if not parent.is_dir() or not os.access(parent, os.W_OK | os.X_OK):
        raise JobError(key, f"{p} cannot be created ({parent} is not a writable folder)")


def private_open(path: Path, append: bool):
    """``path`` opened for writing, mode 0600 (an existing regular file is made 0600 too)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | (os.O_APPEND if append else os.O_TRUNC) | os.O_NOFOLLOW, 0o600)
    if stat.S_ISREG(os.fstat(fd).st_mode):  # a device (/dev/null) keeps its own mode
        os.fchmod(fd, 0o600)
    return os.fdopen(fd, "a" if append else "w", buffering=1)


def stage_port_file(path: str, port: int) -> Path:
    """``port`` written beside the file ``path`` (mode 0600), to be published by :func:`publish_port_file`
    once the server is up: a reader never sees half a number, and a file that cannot be written is said
    before anything is served."""
    tmp = Path(path + ".tmp").expanduser()
    try:
        with private_open(tmp, append=False) as f:
            f.write(f"{port}\n")
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise JobError("port_file", f"{path} cannot be written ({e.strerror})") from None
    return tmp


def publish_port_file(tmp: Path, path: str) -> None:
    try:
        tmp.replace(Path(path).expanduser())
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise JobError("port_file", f"{path} cannot be written ({e.strerror})") from None


def main_coordinator(args: DictConfig) -> int:
    from ncclrl.agents.online import SHIPPED_POLICY

    policy = SHIPPED_POLICY if str(args["policy"]) in ("", SHIPPED) else str(args["policy"])
    limit = raise_fd_limit(int(args["max_conns"]) + 64)
    options = ServerOptions(max_conns=max(1, min(int(args["max_conns"]), limit - 32)))
    socks = bind(str(args["host"]), int(args["port"]))
    port = socks[0].getsockname()[1]
    fh = staged = None
    fresh = None  # the private folder of a fresh secret: the job's, removed when the coordinator ends
    try:
        secret, secret_path = S.load_or_create(str(args["secret_file"]))
        fresh = None if str(args["secret_file"]) else secret_path.parent
        if str(args["log"]):
            try:
                fh = private_open(Path(str(args["log"])).expanduser(), append=True)
            except OSError as e:
                raise JobError("log", f"{args['log']} cannot be written ({e.strerror})") from None
        if str(args["port_file"]):
            staged = stage_port_file(str(args["port_file"]), port)
    except BaseException:
        for s in socks:
            s.close()
        if fh:
            fh.close()
        if fresh is not None:
            shutil.rmtree(fresh, ignore_errors=True)
        raise
    broken = []

    def events(rec: dict) -> None:
        if fh and not broken:
            try:
                fh.write(json.dumps(rec) + "\n")
            except OSError as e:  # a full disk: the log stops, the agreement goes on (it never depends on it)
                broken.append(e)
                log.warning("# the verdict log %s cannot be written (%s): no more records go there", args["log"],
                            e.strerror)

    core = Coordinator(policy, secret, float(args["round_timeout_s"]), int(args["slots"]), int(args["seed"]), events)

    def ready(port: int) -> None:
        if staged is not None:  # serving, its signals handled: the port file appears now
            publish_port_file(staged, str(args["port_file"]))
        where = ", ".join(f"[{s.getsockname()[0]}]" if s.family == 10 else s.getsockname()[0] for s in socks)
        log.info("# ncclrl coordinator on %s port %d, policy %s, round timeout %g s; the ranks need: "
                 "export NCCLRL_ONLINE_COORD=%s:%d NCCLRL_ONLINE_SECRET_FILE=%s", where, port, policy,
                 float(args["round_timeout_s"]), args["host"], port, secret_path)

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        await serve(core, socks, ready, stop, options)

    try:
        asyncio.run(main())
    finally:
        if fh:
            with contextlib.suppress(OSError):  # a full disk: what could not be written was said when it failed
                fh.close()
        if fresh is not None:
            shutil.rmtree(fresh, ignore_errors=True)
        if staged is not None:
            staged.unlink(missing_ok=True)
    return 0


COMMAND = Command("coordinator", CoordinatorCommand, main_coordinator,
                  "serve the plugin's online mode: every rank's timings in, one verdict per round out")
register(COMMAND)
