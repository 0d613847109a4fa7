"""The scale-up row of ``bench.compare`` (issue 26, "one node per core"): two ``riverbed serve`` nodes on
this 2-core machine, joined by a private etcd, against the headline single node.

``scaleup-publish`` makes a super stream with one partition per client process (``initial-cluster-size=1``:
no replication; the default ``balanced`` leader locator, so on ``RiverbedPair`` each node leads one
partition) through the broker's RabbitMQ Stream port (:func:`setup_super_stream`), asks Metadata where
each partition's leader is, and runs the server-bound load generator (``bench._loadgen``, pre-encoded
Publish frames) in two client processes, client i publishing to partition i on its leader, as a super
stream client routing its messages does. On the single node both partitions live in one process. Server
CPU and RSS are summed over both nodes. The goal: aggregate publish rate on two nodes >= 1.7x one node's
(``SCALEUP_GOAL``), judged on medians by :func:`scaleup_goal_lines`.
"""

import time

from bench import _loadgen
from bench._cluster import RiverbedCluster

SCALEUP_GOAL = 1.7


class RiverbedPair(RiverbedCluster):
    """etcd and two ``riverbed serve`` nodes, one per core; client i speaks to node i % 2 + 1."""

    name = "riverbed-pair"
    label = "Riverbed 2 nodes, one partition each"

    def __init__(self, log=print):
        super().__init__(log=log, n=2)

    def client_port(self, i):
        return self.cluster.nodes[f"n{i % self.n + 1}"].port

    def client_args(self):
        """Every client measures both nodes (the same pids, so their snapshots add up)."""
        out = []
        for p in self.pids[1:]:
            out += ["--also-server-pid", str(p)]
        return out


SUPER_ARGS = {"initial-cluster-size": "1"}   # one copy per partition: each node writes only its own
LEADER_WAIT = 20.0                          # seconds for every partition's leader to show in Metadata


def partition_names(base, n):
    """The partitions of super stream ``base``: the stream names bench.compare gives its n clients."""
    return [f"{base}-{i}" for i in range(n)]


def setup_super_stream(broker, base, n):
    """Make super stream ``base`` with ``n`` partitions through ``broker``'s RabbitMQ Stream port and
    return each partition's leader port (client i publishes to partition i there). Raises RuntimeError
    when the partitions are not led by as many different nodes as the broker has (a pair whose two
    partitions landed on one node would measure one node twice)."""
    parts = partition_names(base, n)
    conn = _loadgen.Conn("127.0.0.1", broker.port)
    try:
        _loadgen.create_super_stream(conn, base, parts, SUPER_ARGS)
        deadline = time.monotonic() + LEADER_WAIT
        while True:
            where = _loadgen.leaders(conn, parts)
            if all(where.get(p) for p in parts):
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"super stream {base}: no leader in Metadata for "
                                   f"{[p for p in parts if not where.get(p)]}")
            time.sleep(0.05)
    finally:
        conn.close()
    ports = [where[p][1] for p in parts]
    nodes = len(getattr(broker, "pids", None) or [broker.pid])
    if len(set(ports)) < min(nodes, n):
        teardown_super_stream(broker, base)
        raise RuntimeError(f"super stream {base}: its {n} partitions are led by {len(set(ports))} of the "
                           f"{nodes} nodes (ports {ports})")
    return ports


def teardown_super_stream(broker, base):
    """Delete super stream ``base`` and its partitions (the single node keeps running for other rows).
    On the pair, one DeleteSuperStream through the first node deletes every partition on both nodes,
    also the one only the other node holds (shells/cluster/deletion.py), so the next run's partitions
    are placed balanced again."""
    conn = _loadgen.Conn("127.0.0.1", broker.port)
    try:
        _loadgen.delete_super_stream(conn, base)
    finally:
        conn.close()


def scaleup_goal_lines(summary):
    """``[{"workload", "pair", "one_node", "ratio", "ok", "text"}]`` for every scale-up row that ran on both."""
    out = []
    for wname in ("scaleup-publish",):
        pair = summary.get((wname, RiverbedPair.name), {}).get("msgs_per_s")
        one = summary.get((wname, "riverbed"), {}).get("msgs_per_s")
        if not pair or not one or not one["med"]:
            continue
        r = pair["med"] / one["med"]
        ok = r >= SCALEUP_GOAL
        out.append({"workload": wname, "pair": pair["med"], "one_node": one["med"], "ratio": r, "ok": ok,
                    "text": f"{wname}: 2 nodes {pair['med']:,.0f} msgs/s, one node {one['med']:,.0f}: {r:.2f}× "
                            f"(goal >= {SCALEUP_GOAL:g}×: {'met' if ok else 'MISSED'})"})
    return out
