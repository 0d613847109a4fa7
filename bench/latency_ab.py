"""Confirm latency of several brokers measured side by side, in interleaved blocks (issue 23's p50 row).

This machine's speed drifts by 15-40% within a minute (a shared 2-core VM), so two latency figures taken
one after the other, as ``make bench-compare``'s rows are, compare two moments as much as two brokers.
Here every target is up at once (idle ones cost ~0.3% of a core each) and one rstream client publishes
one message at a time (``send_wait``, as the ``latency-rstream`` and ``cluster-latency`` rows) to each in
turn, ``--per`` confirms per block, ``--blocks`` rounds: drift hits every target alike, and each target's
figure is the median of its blocks' p50s, beside its ratio to the first target taken block by block.

A target is ``NAME=KIND[:ENV=VALUE...]``: KIND ``single`` (one ``riverbed serve``) or ``cluster`` (three
``riverbed serve --node`` on a private etcd, n1 leading: ``queue-leader-locator=client-local``), both at
``--fsync never`` and the default 3 s lease, as bench.compare starts them; ``ENV=VALUE`` is set in the
target's server processes (``RIVERBED_*`` settings, or a variant switch of the code under test), and
``PYTHON=PATH`` runs them with another interpreter (another checkout's ``.venv/bin/python``: its code).

    python -m bench.latency_ab one=single three=cluster --blocks 12 --per 300
    python -m bench.latency_ab one=single main=cluster:PYTHON=/work/wt/x/.venv/bin/python mine=cluster

Prints one line per target; ``--json FILE`` writes every block. Say ``uptime`` beside any figure.
"""

import argparse
import asyncio
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BODY = b"x" * 100


def parse_target(text):
    """``NAME=KIND[:K=V...]`` -> (name, kind, {K: V})."""
    name, _, spec = text.partition("=")
    kind, *pairs = spec.split(":")
    if not name or kind not in ("single", "cluster"):
        raise argparse.ArgumentTypeError(f"{text!r}: NAME=single|cluster[:ENV=VALUE...]")
    return name, kind, dict(p.split("=", 1) for p in pairs)


def start_target(tmp, etcd, name, kind, env):
    """The target's servers started: ``(port of the node the client speaks to, object with stop())``."""
    from clusterproc import Cluster
    from procs import ServerProcess
    env = dict(env)
    python = env.pop("PYTHON", None)
    # another interpreter: ``python -m riverbed.shells.cli`` as ServerProcess builds it, under that one
    wrap = [python, "-c", "import sys, runpy; sys.argv = sys.argv[3:]; "
            "runpy.run_module('riverbed.shells.cli', run_name='__main__')"] if python else []
    if kind == "single":
        srv = ServerProcess(tmp / name, "--fsync", "never", "--http-port", "0", "--host", "127.0.0.1",
                            env=env, wrap=wrap)
        srv.start()
        return srv.port, srv
    cluster = Cluster(tmp / name, etcd, n=3, lease_ttl=3.0, extra=("--host", "127.0.0.1"))
    for srv in cluster.nodes.values():
        srv.env, srv.wrap = env, wrap
        # each cluster its own etcd prefix, so that several share one etcd
        srv.args[srv.args.index("--cluster") + 1] = name
    for srv in cluster.nodes.values():
        srv.start()
    wait_up(etcd.url, name, len(cluster.nodes))
    return cluster.nodes["n1"].port, cluster


def wait_up(url, cluster, n, timeout=30.0):
    from riverbed.shells.cluster.status import read_status
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        st = asyncio.run(read_status(url, cluster))
        if len(st["nodes"]) == n and all(node["up"] for node in st["nodes"]):
            return
        time.sleep(0.1)
    raise RuntimeError(f"cluster {cluster}: not every node up after {timeout:.0f} s")


async def drive(ports, blocks, per, warmup):
    """{target: [p50 of each block, µs]}."""
    from rstream import Producer
    producers = {}
    try:
        for name, port in ports.items():
            p = producers[name] = Producer("127.0.0.1", port, username="guest", password="guest")
            await p.start()
            await p.create_stream("latency-ab", arguments={"queue-leader-locator": "client-local"},
                                  exists_ok=True)
            for _ in range(warmup):
                await p.send_wait("latency-ab", BODY)
        out = {name: [] for name in ports}
        clock = time.perf_counter_ns
        for _ in range(blocks):
            for name, p in producers.items():
                lat = []
                for _ in range(per):
                    t = clock()
                    await p.send_wait("latency-ab", BODY)
                    lat.append((clock() - t) / 1000)
                out[name].append(statistics.median(lat))
        return out
    finally:
        for p in producers.values():
            await p.close()


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("targets", nargs="+", type=parse_target, help="NAME=single|cluster[:ENV=VALUE...]")
    ap.add_argument("--blocks", type=int, default=12)
    ap.add_argument("--per", type=int, default=300, help="confirms per block (default 300)")
    ap.add_argument("--warmup", type=int, default=300, help="untimed confirms per target first")
    ap.add_argument("--json", help="write every block's p50 here")
    a = ap.parse_args(argv)
    for p in (ROOT / "tests" / "cluster", ROOT / "tests" / "integration"):
        sys.path.insert(0, str(p))
    from etcdproc import EtcdProcess
    tmp = Path(tempfile.mkdtemp(prefix="rb-latency-ab-"))
    etcd = None
    started = []
    try:
        if any(kind == "cluster" for _, kind, _ in a.targets):
            etcd = EtcdProcess(tmp / "etcd").start()
        ports = {}
        for name, kind, env in a.targets:
            port, obj = start_target(tmp, etcd, name, kind, env)
            started.append(obj)
            ports[name] = port
        load0 = os.getloadavg()[0]
        res = asyncio.run(drive(ports, a.blocks, a.per, a.warmup))
        first = a.targets[0][0]
        for name in ports:
            line = f"{name:12} p50 median {statistics.median(res[name]):6.0f} µs"
            if name != first:
                ratios = [x / y for x, y in zip(res[name], res[first])]
                line += f"  ÷ {first}: median {statistics.median(ratios):.3f} (blocks {min(ratios):.2f}-{max(ratios):.2f})"
            print(line)
        print(f"load {load0:.1f} -> {os.getloadavg()[0]:.1f}; {a.blocks} blocks x {a.per} confirms per target")
        if a.json:
            with open(a.json, "w") as f:
                json.dump({"targets": [list(t) for t in a.targets], "blocks": res}, f)
    finally:
        for obj in started:
            obj.stop()
        if etcd is not None:
            etcd.stop()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
