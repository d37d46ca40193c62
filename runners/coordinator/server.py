"""The coordinator's server: asyncio on one thread around :class:`~.core.Coordinator`, with every
resource bounded. Anyone on the node can connect; until a connection proves it holds the job's
secret it may say two short lines, within :attr:`ServerOptions.handshake_s`, and only so many such
connections wait at once. No connection may send a line longer than :attr:`ServerOptions.line_bytes`
or leave more than :attr:`ServerOptions.write_buffer_bytes` unread."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import resource
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass

from ncclrl.costmodel.errors import ConfigError, JobError
from ncclrl.runners.coordinator.core import Coordinator


@dataclass(frozen=True)
class ServerOptions:
    """The server's bounds and timeouts.

    :param max_conns: connections at once (beyond it a new one is closed at once)
    :param max_unauthed: connections at once still in their handshake
    :param handshake_s: time a connection has to prove it holds the secret
    :param min_age_s: a full handshake room drops its oldest connection only once it is this old
    :param line_bytes: longest line a connection may send
    :param write_buffer_bytes: most bytes a connection may leave unread before it is closed
    """

    max_conns: int = 4096
    max_unauthed: int = 64
    handshake_s: float = 5.0
    min_age_s: float = 0.05
    line_bytes: int = 8192
    write_buffer_bytes: int = 1 << 22

    def __post_init__(self) -> None:
        for key in ("max_conns", "max_unauthed", "line_bytes", "write_buffer_bytes"):
            if int(getattr(self, key)) < 1:
                raise ConfigError(key, f"must be >= 1, got {getattr(self, key)}")
        if not 0 < self.handshake_s <= 600:
            raise ConfigError("handshake_s", f"must be in (0, 600], got {self.handshake_s}")


def raise_fd_limit(want: int) -> int:
    """Raise this process's descriptor limit towards ``want`` (as far as the hard limit allows); the limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = want if hard == resource.RLIM_INFINITY else min(want, hard)
    if soft != resource.RLIM_INFINITY and soft < target:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def bind(host: str, port: int) -> list[socket.socket]:
    """Listening sockets on every address ``host`` resolves to (IPv4 and IPv6 alike), one port for all
    (``port`` 0: a free one). An address that cannot be had (a host that does not resolve, a port in use)
    is an operational failure: a :class:`JobError` naming the key (exit status 1)."""
    try:
        infos = socket.getaddrinfo(host or None, None, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as e:
        raise JobError("host", f"cannot resolve {host!r} ({e.strerror})") from None
    addrs = list(dict.fromkeys((fam, sa[0]) for fam, _, _, _, sa in infos if fam in (socket.AF_INET, socket.AF_INET6)))
    if not addrs:
        raise JobError("host", f"{host!r} has no IPv4 or IPv6 address")
    for _attempt in range(20 if port == 0 else 1):
        socks: list[socket.socket] = []
        chosen = port
        try:
            for fam, addr in addrs:
                s = socket.socket(fam, socket.SOCK_STREAM)
                socks.append(s)
                s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                if fam == socket.AF_INET6:
                    s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
                s.bind((addr, chosen))
                chosen = s.getsockname()[1]
                s.listen(512)
                s.setblocking(False)
            return socks
        except OSError as e:
            for s in socks:
                s.close()
            if e.errno == errno.EADDRINUSE and port == 0:
                continue  # the first address's free port is taken on another: draw again
            if e.errno == errno.EADDRINUSE:
                raise JobError("port", f"{port} is in use on {host} (another coordinator? port=0 takes a free "
                               "one)") from None
            raise JobError("host", f"cannot listen on {host}:{chosen} ({e.strerror})") from None
    raise JobError("port", f"no free port common to every address of {host}")


async def serve(core: Coordinator, socks: list[socket.socket], ready: Callable[[int], None] | None = None,
                stop: asyncio.Event | None = None, options: ServerOptions | None = None) -> None:
    """Run the coordinator's server on ``socks`` (from :func:`bind`) until ``stop`` is set (or forever)."""
    opt = options or ServerOptions()
    writers: dict[int, asyncio.StreamWriter] = {}
    opened: dict[int, float] = {}  # connection -> when it was accepted
    counter = iter(range(1, 1 << 62))
    wake = asyncio.Event()

    def drop(conn: int) -> None:
        core.closed(conn, time.monotonic())
        wr = writers.pop(conn, None)
        if wr is not None:
            wr.transport.abort()

    def flush() -> None:
        for conn, lines in core.take().items():
            wr = writers.get(conn)
            if wr is not None and not wr.is_closing():
                wr.write("".join(lines).encode())
        for conn in list(core.closing):
            core.closing.discard(conn)
            wr = writers.get(conn)
            if wr is not None:
                wr.close()
        for conn, wr in list(writers.items()):  # a client that does not read is cut off, its memory bounded
            if wr.transport.get_write_buffer_size() > opt.write_buffer_bytes:
                drop(conn)
        core.emit()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if len(writers) >= opt.max_conns:
            writer.transport.abort()
            return
        waiting = [c for c in writers if not core.authed(c)]  # in opening order
        if len(waiting) >= opt.max_unauthed:
            # the oldest goes if it has had its time (a real rank's handshake takes about a millisecond, and
            # one under way is never cut short by a crowd); else the newcomer is turned away and retries
            if time.monotonic() - opened.get(waiting[0], 0.0) < opt.min_age_s:
                writer.transport.abort()
                return
            drop(waiting[0])
        conn = next(counter)
        opened[conn] = time.monotonic()
        writers[conn] = writer
        core.opened(conn)
        t_end = time.monotonic() + opt.handshake_s
        try:
            while True:
                timeout = None if core.authed(conn) else max(t_end - time.monotonic(), 0.0)
                raw = await asyncio.wait_for(reader.readline(), timeout)
                if not raw or not raw.endswith(b"\n"):
                    break
                core.line(conn, raw.decode("ascii", "replace").strip(), time.monotonic())
                flush()
                wake.set()
                if conn not in writers:
                    break
        except (TimeoutError, asyncio.TimeoutError, ValueError, ConnectionError, asyncio.IncompleteReadError,
                asyncio.CancelledError):
            pass  # a line too long, a handshake too slow, a rank gone, or the server stopping: the connection ends
        finally:
            core.closed(conn, time.monotonic())
            flush()
            wr = writers.pop(conn, None)
            opened.pop(conn, None)
            if wr is not None:
                wr.close()

    servers = [await asyncio.start_server(handle, sock=s, limit=opt.line_bytes) for s in socks]
    if ready:
        ready(socks[0].getsockname()[1])
    stop = stop or asyncio.Event()
    try:
        while not stop.is_set():
            due = core.next_deadline()
            timeout = 0.5 if due is None else max(0.0, min(0.5, due - time.monotonic()))
            wake.clear()
            with contextlib.suppress(asyncio.TimeoutError, TimeoutError):
                await asyncio.wait_for(wake.wait(), timeout=timeout)
            core.tick(time.monotonic())
            flush()
    finally:
        for srv in servers:
            srv.close()
        for wr in list(writers.values()):  # stopping: every rank sees its connection end (and freezes)
            wr.close()
