"""``riverbed cluster status [--json]``: the cluster's nodes and streams, read from etcd alone (so it works
while any node is down).

The JSON document (issue 23's interface)::

    {"cluster": NAME,
     "nodes": [{"name", "up", "stream_port", "replication_port", "http_port", "advertised_host", "leads"}],
     "streams": [{"name", "epoch", "leader", "members": [{"node", "committed_offset", "lag"}],
                  "learners": [same as members], "locator"}]}

``learners`` are nodes still copying the log after ``add-replica`` (not counted toward the majority yet).

A member's ``committed_offset`` is how far it holds the log, capped at the leader's committed offset;
``lag`` is how many records it is behind the leader's log (both null until the member has reported).
"""

import asyncio
import json
import sys

from riverbed.shells.cluster.etcd import Etcd, EtcdError
from riverbed.shells.cluster.node import prefix_of


def status_json(etcd_kvs_nodes, etcd_kvs_streams, etcd_kvs_progress, cluster):
    """The ``riverbed cluster status --json`` document from the etcd keys of ``cluster``."""
    nodes = {}
    for kv in etcd_kvs_nodes:
        try:
            r = kv.json()
            nodes[r["name"]] = r
        except (ValueError, KeyError):
            continue
    progress = {}
    for kv in etcd_kvs_progress:
        try:
            r = kv.json()
            progress[(r["stream"], r["node"])] = r
        except (ValueError, KeyError):
            continue
    streams, names = [], set(nodes)
    for kv in etcd_kvs_streams:
        try:
            p = kv.json()
        except ValueError:
            continue
        lead = progress.get((p["name"], p["leader"]), {})
        head = lead.get("next", 0)
        committed = lead.get("committed", 0)
        def member(m):
            names.add(m)
            r = progress.get((p["name"], m))
            held = r.get("next", 0) if r else None
            return {"node": m, "committed_offset": min(held, committed) if r else None,
                    "lag": max(head - held, 0) if r else None}
        members = [member(m) for m in p["members"]]
        streams.append({"name": p["name"], "epoch": p["epoch"], "leader": p["leader"], "members": members,
                        "learners": [member(m) for m in p.get("learners") or ()],
                        "locator": (p.get("arguments") or {}).get("queue-leader-locator", "balanced")})
    node_list = []
    for n in sorted(names):
        r = nodes.get(n, {})
        node_list.append({"name": n, "up": n in nodes, "stream_port": r.get("stream_port"),
                          "replication_port": r.get("replication_port"), "http_port": r.get("http_port"),
                          "advertised_host": r.get("advertised_host"),
                          "leads": sorted(s["name"] for s in streams if s["leader"] == n)})
    return {"cluster": cluster, "nodes": node_list, "streams": sorted(streams, key=lambda s: s["name"])}


async def read_status(endpoints, cluster):
    """Read cluster ``cluster``'s state from etcd; the status document (status_json)."""
    c = Etcd(endpoints)
    try:
        pre = prefix_of(cluster)
        return status_json(await c.get_prefix(pre + "nodes/"), await c.get_prefix(pre + "streams/"),
                           await c.get_prefix(pre + "progress/"), cluster)
    finally:
        await c.close()


def format_status(doc):
    lines = [f"cluster {doc['cluster']}"]
    for n in doc["nodes"]:
        lines.append(f"  node {n['name']:<12} {'up' if n['up'] else 'down':<4} host={n['advertised_host']} "
                     f"stream={n['stream_port']} replication={n['replication_port']} http={n['http_port']} "
                     f"leads={','.join(n['leads']) or '-'}")
    for s in doc["streams"]:
        lines.append(f"  stream {s['name']}  epoch={s['epoch']} leader={s['leader']}")
        for m in s["members"]:
            lines.append(f"    member {m['node']:<12} committed={m['committed_offset']} lag={m['lag']}")
        for m in s.get("learners", ()):
            lines.append(f"    learner {m['node']:<11} committed={m['committed_offset']} lag={m['lag']}")
    return "\n".join(lines)


def main_status(args):
    """``riverbed cluster status``: exit 0, or 2 when etcd cannot be reached."""
    try:
        doc = asyncio.run(read_status(args.etcd, args.cluster))
    except (EtcdError, ValueError) as e:
        print(f"riverbed cluster: {e}", file=sys.stderr)
        return 2
    print(json.dumps(doc, indent=2) if args.json else format_status(doc))
    return 0
