"""What one confirm costs each node, one publish at a time, counted (issue 23's confirm latency row).

On this 2-core machine a cluster confirm's wall time is mostly CPU: the leader, the member whose ACK
makes the majority, the other member and the client take turns on two cores. This counts each node's
instructions (``--callgrind DIR``) or CPU per message while rstream ``send_wait`` publishes ``--n``
messages one at a time, against three nodes (n1 leads) or one lone node, with ``bench.cluster_cost``'s
servers (``--fsync never``). Counted, so it holds at any load; clock-driven costs (heartbeats, the
COMMIT_DELAY timer) weigh more under valgrind than at full speed.

    python -m bench.confirm_counts cluster --n 2000 --callgrind DIR
    python -m bench.confirm_counts single --n 2000 --callgrind DIR

Prints one JSON document.
"""

import argparse
import asyncio
import json
import os
import shutil
import subprocess
import tempfile
import time

from bench.cluster_cost import STREAM, Servers

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


async def _create_and_warm(port, warm):
    from rstream import Producer
    async with Producer("127.0.0.1", port, username="guest", password="guest") as p:
        await p.create_stream(STREAM, arguments={"queue-leader-locator": "client-local"}, exists_ok=True)
        for _ in range(warm):
            await p.send_wait(STREAM, b"w" * 100)


async def _timed(port, n, collect):
    from rstream import Producer
    async with Producer("127.0.0.1", port, username="guest", password="guest") as p:
        await p.send_wait(STREAM, b"w" * 100)      # the publisher is declared before counting starts
        collect(True)
        t0 = time.monotonic()
        for _ in range(n):
            await p.send_wait(STREAM, b"x" * 100)
        return time.monotonic() - t0


def run(a):
    if a.callgrind:
        # valgrind runs each node some 30-50x slower: a 2 s lease would expire between keepalives
        import bench.cluster_cost as cluster_cost
        cluster_cost.LEASE_TTL = 10.0
    tmp = tempfile.mkdtemp(prefix="riverbed-confirm-counts-")
    nodes = 1 if a.mode == "single" else 3
    servers = Servers(tmp, nodes, a.callgrind)
    result = {"mode": a.mode, "nodes": nodes, "messages": a.n, "callgrind": bool(a.callgrind)}
    try:
        port = servers.nodes["n1"].port
        asyncio.run(_create_and_warm(port, 200))
        time.sleep(4.0 if nodes > 1 else 0.5)       # members connected and caught up
        cpu0, load0 = servers.cpu(), os.getloadavg()[0]
        elapsed = asyncio.run(_timed(port, a.n, servers.collect))
        servers.collect(False)
        cpu1 = servers.cpu()
        result.update(elapsed_s=round(elapsed, 2), load=[round(load0, 2), round(os.getloadavg()[0], 2)],
                      cpu_us_per_msg={k: round(1e6 * (sum(cpu1[k]) - sum(cpu0[k])) / a.n, 1) for k in cpu0},
                      user_sys_us_per_msg={k: [round(1e6 * (cpu1[k][i] - cpu0[k][i]) / a.n, 1) for i in (0, 1)]
                                           for k in cpu0})
    finally:
        irs = servers.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    if a.callgrind:
        result["ir_per_msg"] = {k: round(v / a.n) for k, v in irs.items()}
        result["ir_per_msg_total"] = round(sum(irs.values()) / a.n)
    try:
        result["git"] = subprocess.run(["git", "-C", ROOT, "describe", "--always", "--dirty"], capture_output=True,
                                       text=True).stdout.strip()
    except OSError:
        pass
    return result


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("mode", choices=("cluster", "single"))
    ap.add_argument("--n", type=int, default=2000, help="messages published one at a time (100 B each)")
    ap.add_argument("--callgrind", metavar="DIR", help="run the servers under callgrind, its files in DIR")
    print(json.dumps(run(ap.parse_args(argv))))


if __name__ == "__main__":
    main()
