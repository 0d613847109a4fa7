"""The cluster as a Kafka client sees it: the live nodes as brokers, each partition's leader and replicas,
and which node coordinates a consumer group. Read by the Kafka shell (shells/kafka) only when the broker
is a cluster member (``broker.cluster`` is a :class:`~riverbed.shells.cluster.node.ClusterNode`).

* **Node ids** are stable: CRC-32 of the node's name (``--node``), as a non-negative int32, so every node
  names every other one alike and a restarted node keeps its id.
* **Brokers** are the live nodes that registered a Kafka port (``kafka_port`` in their etcd registration,
  beside ``advertised_host``). This node is listed with the address its client connected to (or the
  advertised one), as on a lone node.
* **A partition's leader** is its stream's leader in the placement; replicas are its members, the ISR
  the members that are live. No leader (a failover under way): leader -1 and LEADER_NOT_AVAILABLE, so
  clients ask Metadata again.
* **Produce** is the leader's: a Produce to another node is answered NOT_LEADER_OR_FOLLOWER (6), never
  forwarded, so clients refresh Metadata and go to the leader, as with Kafka.
* **A group's coordinator** is one live Kafka node chosen by the group id's CRC-32 among the live Kafka
  nodes sorted by name; a group API sent elsewhere gets NOT_COORDINATOR (16), so clients look again.
  Group state lives on that node (a coordinator that goes away: its members join again elsewhere).

Loop-thread only; no I/O.
"""

import zlib

from riverbed.shells.cluster.node import NotLeader

ERR_LEADER_NOT_AVAILABLE = 5


def node_id(name):
    """The Kafka node id of cluster node ``name`` (stable across restarts, equal on every node)."""
    return zlib.crc32(name.encode("utf-8")) & 0x7FFFFFFF


def _kafka_nodes(cluster):
    """{name: registration} of the live nodes with a Kafka port, this one always included."""
    out = {n: reg for n, reg in cluster.nodes.items() if reg.get("kafka_port")}
    out.setdefault(cluster.name, cluster.address)
    return out


def brokers(cluster, local):
    """Metadata's broker entries. ``local`` is this node's entry as its client was told it
    (``{"host", "port"}``)."""
    out = []
    for name, reg in sorted(_kafka_nodes(cluster).items()):
        if name == cluster.name:
            out.append({"node_id": node_id(name), "host": local["host"], "port": local["port"], "rack": None})
        else:
            out.append({"node_id": node_id(name), "host": reg.get("advertised_host") or "127.0.0.1",
                        "port": reg["kafka_port"], "rack": None})
    return out


def partition(cluster, stream):
    """Metadata's partition fields of ``stream``: ``(error code, leader id, leader epoch, replicas, isr)``."""
    placed = cluster.placements.get(stream)
    if placed is None:
        me = node_id(cluster.name)       # a stream made here a moment ago: this node leads it
        return 0, me, 0, [me], [me]
    p = placed[0]
    leader = p.get("leader")
    live = set(cluster.nodes) | {cluster.name}
    replicas = [node_id(m) for m in p["members"]]
    isr = [node_id(m) for m in p["members"] if m in live]
    if not leader or leader not in live:
        return ERR_LEADER_NOT_AVAILABLE, -1, p.get("epoch", 0), replicas, isr
    return 0, node_id(leader), p.get("epoch", 0), replicas, isr


def leads(cluster, stream):
    """Whether this node takes a Produce to ``stream`` (it leads it, or made it a moment ago)."""
    return stream in cluster.leading or stream not in cluster.placements


def coordinator(cluster, group_id):
    """The name of the node that coordinates ``group_id``."""
    names = sorted(_kafka_nodes(cluster))
    return names[zlib.crc32(group_id.encode("utf-8")) % len(names)]


def coordinator_entry(cluster, group_id, local):
    """FindCoordinator's ``(node id, host, port)`` for ``group_id``."""
    for b in brokers(cluster, local):
        if b["node_id"] == node_id(coordinator(cluster, group_id)):
            return b["node_id"], b["host"], b["port"]
    return node_id(cluster.name), local["host"], local["port"]


def not_leader(exc):
    """Whether an append's error means that this node does not lead the stream (any more)."""
    return isinstance(exc, NotLeader)
