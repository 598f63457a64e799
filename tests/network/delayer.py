"""A user-space delaying TCP proxy for one test host (``tc netem`` is missing on the test kernel).

    python delayer.py PORT MS LIFETIME_S

Runs inside the host's network namespace (started by ``TestNet.latency``), where iptables redirects
the host's new TCP connections to PORT: outgoing ones (nat OUTPUT, eth0) and incoming ones (nat
PREROUTING, eth0). For each, it reads the original destination (``SO_ORIGINAL_DST``), connects there
with socket mark 1 (which the redirect rule skips) and copies bytes both ways; bytes that leave the
host (client to server on an outgoing connection, server to client on an incoming one) are held for
MS milliseconds, in order, as ``netem delay`` on the host's interface would. It exits by itself after
LIFETIME_S seconds (a bound: a delay never outlives its test).
"""

from __future__ import annotations

import asyncio
import socket
import struct
import sys
import time

SO_ORIGINAL_DST = 80
SO_MARK = 36


def original_dst(sock: socket.socket) -> tuple[str, int]:
    raw = sock.getsockopt(socket.SOL_IP, SO_ORIGINAL_DST, 16)
    port, ip = struct.unpack("!2xH4s8x", raw)
    return socket.inet_ntoa(ip), port


async def pump(reader, writer, delay: float):
    queue: asyncio.Queue = asyncio.Queue()

    async def sender():
        while True:
            due, data = await queue.get()
            if data is None:
                break
            wait = due - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
            writer.write(data)
            await writer.drain()
        writer.close()

    task = asyncio.create_task(sender())
    try:
        while True:
            data = await reader.read(65536)
            if not data:
                break
            await queue.put((time.monotonic() + delay, data))
    except (ConnectionError, OSError):
        pass
    await queue.put((0.0, None))
    try:
        await task
    except (ConnectionError, OSError):
        pass


async def handle(reader, writer, delay: float, own_ip: set):
    sock = writer.get_extra_info("socket")
    try:
        ip, port = original_dst(sock)
    except OSError:
        writer.close()
        return
    outgoing = ip not in own_ip
    up = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    up.setsockopt(socket.SOL_SOCKET, SO_MARK, 1)
    up.setblocking(False)
    try:
        await asyncio.get_running_loop().sock_connect(up, (ip, port))
        ur, uw = await asyncio.open_connection(sock=up)
    except OSError:
        up.close()
        writer.close()
        return
    await asyncio.gather(
        pump(reader, uw, delay if outgoing else 0.0),  # from the connecting side to its destination
        pump(ur, writer, 0.0 if outgoing else delay),  # the answers
    )


async def main(port: int, ms: float, lifetime: float):
    own: set = set()  # the host's own addresses: the routing table's local entries
    with open("/proc/net/fib_trie") as fh:
        lines = fh.read().splitlines()
    for i, line in enumerate(lines):
        if "/32 host LOCAL" in line and i > 0:
            own.add(lines[i - 1].split()[-1])
    server = await asyncio.start_server(lambda r, w: handle(r, w, ms / 1000.0, own), "0.0.0.0", port)
    async with server:
        await asyncio.sleep(lifetime)


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3])))
