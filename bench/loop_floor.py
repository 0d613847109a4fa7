"""The floor under every one-message-per-frame row: a bare uvloop echo server on loopback.

A server that does nothing but echo each 120-byte message back (uvloop, an ``asyncio.Protocol`` whose
``data_received`` writes the bytes back) is driven by a stop-and-wait client (a blocking socket: send,
read the reply, next), as rbfly's ``send`` and rstream's ``send_wait`` drive a broker. It prints the
server's CPU per round trip (utime+stime from /proc) and the round trip's p50/p99: what the event loop,
the two syscalls and the kernel's loopback cost before a broker does any work. On this 2-core VM
(2026-11-22): 27.5-28 µs of server CPU and p50 65-67 µs per round trip when quiet (35-38 µs and
84-92 µs with other work running), against RabbitMQ 3.10.8's
~135-190 µs of server CPU per message in the same pattern, so a 0.2× goal there (27-38 µs) is
about this floor.

    .venv/bin/python -m bench.loop_floor [--messages 20000] [--rounds 2]
"""

import argparse
import asyncio
import os
import socket
import subprocess
import sys
import time

CLK_TCK = os.sysconf("SC_CLK_TCK")


class _Echo(asyncio.Protocol):
    def connection_made(self, transport):
        self.transport = transport

    def data_received(self, data):
        self.transport.write(data)


async def _serve():
    loop = asyncio.get_running_loop()
    srv = await loop.create_server(_Echo, "127.0.0.1", 0)
    print(srv.sockets[0].getsockname()[1], flush=True)
    await loop.run_in_executor(None, sys.stdin.read)      # until the parent closes our stdin


def _cpu(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def run(n):
    srv = subprocess.Popen([sys.executable, "-m", "bench.loop_floor", "--serve"], stdin=subprocess.PIPE,
                           stdout=subprocess.PIPE, text=True)
    try:
        port = int(srv.stdout.readline())
        s = socket.create_connection(("127.0.0.1", port))
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        msg = b"x" * 120
        lat = []
        cpu0 = _cpu(srv.pid)
        for _ in range(n):
            t0 = time.perf_counter()
            s.sendall(msg)
            got = 0
            while got < len(msg):
                got += len(s.recv(4096))
            lat.append(time.perf_counter() - t0)
        cpu = _cpu(srv.pid) - cpu0
        s.close()
        lat.sort()
        return cpu / n * 1e6, lat[n // 2] * 1e6, lat[int(n * 0.99)] * 1e6
    finally:
        srv.stdin.close()
        srv.wait(10)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--messages", type=int, default=20000)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.serve:
        import uvloop
        uvloop.run(_serve())
        return
    print(f"bare uvloop echo server, stop-and-wait client, {a.messages:,} x 120 B round trips")
    for i in range(a.rounds):
        cpu, p50, p99 = run(a.messages)
        print(f"round {i + 1}: server CPU {cpu:.1f} µs per round trip, p50 {p50:.0f} µs, p99 {p99:.0f} µs")


if __name__ == "__main__":
    main()
