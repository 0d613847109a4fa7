"""The cluster as ``GET /api/cluster`` and the dashboard show it: one document, from one source.

The document is ``riverbed cluster status --json``'s (:func:`riverbed.shells.cluster.status.status_json`,
read from etcd: nodes up/down with their addresses, each stream's epoch, leader and members with
``committed_offset`` and ``lag``), plus ``"self"``, the name of the node that answers (the HTTP layer adds
``"forwarded"``, :mod:`riverbed.shells.http.cluster`). A member's ``lag`` is the records it holds fewer than the leader's log, from the positions each
member reports to etcd. Reports that only move forward are written at most every half lease TTL
(roles.py ``_progress_can_wait``), except the leader's while a live member has fallen behind
(:func:`member_behind`): then the leader reports its log's end on every tick of its control loop (at most
0.25 s apart), so a paused or slow member's lag shows within a tick, a read of this view and a dashboard
interval, and grows while the leader's log does (the paused member's own position stays as it was until
its lease expires).

Reads are shared: one etcd read serves every caller for ``CACHE_TTL`` seconds. Loop thread only.
"""

import time

CACHE_TTL = 0.5              # seconds one etcd read of the cluster state is served from memory
# seconds without an acknowledgement after which a live member holding less than the leader's log counts
# as behind (a member keeping up acknowledges each batch within milliseconds, an idle one holds it all)
BEHIND_AFTER = 0.5

_cache = {}                  # id(node) -> (monotonic time, document)


async def read_view(node):
    """The cluster document (module docstring) as ``node`` (a ClusterNode) sees it. Raises EtcdError
    when etcd does not answer."""
    from riverbed.shells.cluster.status import status_json
    now = time.monotonic()
    hit = _cache.get(id(node))
    if hit is not None and now - hit[0] < CACHE_TTL:
        return hit[1]
    pre = node.prefix
    doc = status_json(await node.etcd.get_prefix(pre + "nodes/"), await node.etcd.get_prefix(pre + "streams/"),
                      await node.etcd.get_prefix(pre + "progress/"), node.cluster)
    doc["self"] = node.name
    _cache[id(node)] = (time.monotonic(), doc)
    return doc


def for_user(doc, can_read):
    """``doc`` with only the streams ``can_read(name)`` accepts (and a node's ``leads`` cut the same)."""
    streams = [s for s in doc["streams"] if can_read(s["name"])]
    nodes = [dict(n, leads=[s for s in n["leads"] if can_read(s)]) for n in doc["nodes"]]
    return dict(doc, streams=streams, nodes=nodes,
                forwarded={k: v for k, v in doc.get("forwarded", {}).items() if can_read(k)})


def member_behind(st, head, live):
    """Whether a member of ``st`` (a :class:`~riverbed.shells.cluster.replication.Leading`) that is up
    (in ``live``, the node's view of the live nodes) holds less than ``head`` (the leader's log end) and
    has not acknowledged anything for BEHIND_AFTER seconds: the leader then reports its position at once,
    so the view shows that member's lag now. A member that is down (its lease gone) counts not: its lag
    is unknown (null) anyway, and the leader's reports go back to their usual pace."""
    now = time.monotonic()
    return any(m != st.node.name and m in live and st.acked.get(m, 0) < head
               and now - st.heard.get(m, st.since) >= BEHIND_AFTER for m in st.members)
