"""A man in the middle that does not hold the job's secret, started in place of ``ncclrl coordinator``
(it takes its keys): it runs the real coordinator on a port of its own and relays every connection
to it, the handshake untouched, then changes what follows for the rank that says HELLO as rank 0:
its plans reach it rotated, and its HOLDs reach the coordinator with the digest of the verdict
really sent (as a relay would, to hide the change). Sealed lines make both changes visible."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from ncclrl.runners.coordinator import fnv1a64

keys = dict(a.split("=", 1) for a in sys.argv[1:])
inner_port_file = keys["port_file"] + ".inner"
Path(inner_port_file).unlink(missing_ok=True)
inner = subprocess.Popen([sys.executable, "-m", "ncclrl", "coordinator",
                          *[f"{k}={v}" for k, v in keys.items() if k != "port_file"], f"port_file={inner_port_file}"])
while not os.path.exists(inner_port_file):
    time.sleep(0.02)
INNER = int(Path(inner_port_file).read_text())


def body(line: str) -> tuple[str, str]:
    """A line's text and its seal (" ~..."), if any."""
    text, sep, seal = line.rstrip("\n").rpartition(" ~")
    return (text, sep + seal) if sep else (line.rstrip("\n"), "")


async def relay(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, change) -> None:
    while line := (await reader.readline()).decode():
        writer.write(change(line).encode())
        await writer.drain()
    writer.close()


async def handle(rank_r: asyncio.StreamReader, rank_w: asyncio.StreamWriter) -> None:
    coord_r, coord_w = await asyncio.open_connection("127.0.0.1", INNER)
    state: dict = {"rank": None, "sent": {}}

    def down(line: str) -> str:  # coordinator -> rank
        text, seal = body(line)
        w = text.split()
        if state["rank"] == 0 and w and w[0] == "VERDICT" and w[5] == "PLAN":
            state["sent"][w[2], w[3]] = fnv1a64(text)
            arms = w[6].split(",")
            w[6] = ",".join(arms[1:] + arms[:1])
            return " ".join(w) + seal + "\n"
        return line

    def up(line: str) -> str:  # rank -> coordinator
        text, seal = body(line)
        w = text.split()
        if w and w[0] == "HELLO":
            state["rank"] = int(w[3])
        if w and w[0] == "HOLD" and (w[3], w[4]) in state["sent"]:
            return " ".join(w[:5] + [state["sent"][w[3], w[4]]]) + seal + "\n"
        return line

    await asyncio.gather(relay(rank_r, coord_w, up), relay(coord_r, rank_w, down))


async def main() -> None:
    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    tmp = Path(keys["port_file"] + ".tmp")
    tmp.write_text(f"{server.sockets[0].getsockname()[1]}\n")
    tmp.replace(keys["port_file"])
    async with server:
        await server.serve_forever()


def stop(*_: object) -> None:
    inner.terminate()  # the harness ends the relay; the coordinator behind it goes with it
    os._exit(0)


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, stop)
    try:
        asyncio.run(main())
    finally:
        inner.terminate()
