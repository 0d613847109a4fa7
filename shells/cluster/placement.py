"""Where a new stream lives: its leader (the ``queue-leader-locator`` argument) and its members.

* ``client-local``: the node the create request came to leads.
* ``balanced`` (the default, as on RabbitMQ): the live node that leads the fewest streams, counting the
  placements in etcd and those this node is still making (so the partitions of a super stream, created
  in one transaction, spread over the nodes: three partitions on three nodes get three leaders). A tie
  goes to the local node, so a lone stream on a fresh cluster is led where it was made.

When the leader is another node, the placement carries ``"given": [leader, its etcd lease]``: that node
takes the stream at once (ClusterNode._take_role), while a node whose lease differs (it restarted since)
treats the seat as one of its earlier runs and calls an election instead. The create request is answered
only once the leader has taken the stream (:func:`hold_create`), so a client that publishes right after
its create finds the leader Metadata names ready.

Loop thread only.
"""

import asyncio
import logging
import time

from riverbed.engine.errors import StreamNotFound
from riverbed.engine.layout import LEADER_LOCATORS
from riverbed.shells.cluster.etcd import EtcdError

log = logging.getLogger("riverbed.cluster")

LEAD_WAIT_TTLS = 2          # lease TTLs a create waits for a remote leader to take the stream (plus 2 s)


def locator(node, name):
    """The ``queue-leader-locator`` of local stream ``name`` ("balanced" when unset or unknown)."""
    try:
        asked = node.engine._current(name).args.get("queue-leader-locator", "balanced")
    except (StreamNotFound, AttributeError):
        return "balanced"
    return LEADER_LOCATORS.get(asked, "balanced")


def leader_for(node, name):
    """The node that is to lead new stream ``name``: chosen once (by its locator), then remembered until
    the placement is in etcd."""
    placed = node.placements.get(name)
    if placed is not None:
        return placed[0]["leader"]
    chosen = node.pending_leaders.get(name)
    if chosen is None:
        chosen = node.name if locator(node, name) == "client-local" else _fewest_leaders(node)
        node.pending_leaders[name] = chosen
    return chosen


def _fewest_leaders(node):
    # stream -> leader: etcd's view, then what this node leads or is placing (a poll may not show it yet)
    led = {name: p.get("leader") for name, (p, _) in node.placements.items()}
    led.update((name, node.name) for name in node.leading if name not in led)
    led.update((name, leader) for name, leader in node.pending_leaders.items() if name not in led)
    leads = {n: 0 for n in node.nodes}
    leads[node.name] = 0
    for leader in led.values():
        if leader in leads:
            leads[leader] += 1
    return min(leads, key=lambda n: (leads[n], n != node.name, n))


async def place_remote(node, name, leader):
    """Place local stream ``name`` in etcd with ``leader`` (another node) leading it; this node is one
    of its members when the cluster size allows. Falls back to leading it here when ``leader`` is gone."""
    node.placing.add(name)
    try:
        kv = await node.etcd.get(node.prefix + "nodes/" + leader)
        if kv is None:
            log.warning("cluster: %s left before leading %s; %s leads it", leader, name, node.name)
            node.pending_leaders[name] = node.name
            node._lead(name, 1, node._choose_members(name))
            await node._place_and_refresh(name, None)
            return
        try:
            args = node.engine._current(name).args
        except StreamNotFound:
            return
        members = node._choose_members(name, leader)
        p = {"name": name, "epoch": 1, "leader": leader, "members": members, "arguments": args,
             "given": [leader, kv.lease]}
        key = node.prefix + "streams/" + name
        if await node.etcd.create(key, p):
            await node.etcd.delete(node.prefix + "deleted/" + name)
            got = await node.etcd.get(key)
            node.placements[name] = (p, got.mod_revision if got else 0)
            log.info("cluster: stream %s placed on %s (leader %s, %s)", name, ",".join(members), leader,
                     locator(node, name))
    except EtcdError as e:
        log.warning("cluster: cannot place %s yet: %s", name, e)
    finally:
        node.placing.discard(name)
        node.pending_leaders.pop(name, None)


def hold_create(node, names, cb):
    """Wrap a create request's ``cb(exc)`` so that it runs once every stream of ``names`` that another
    node is to lead is led there (its progress key is in etcd), or after LEAD_WAIT_TTLS lease TTLs."""
    def created(exc):
        if exc is not None:
            cb(exc)
            return
        remote = [n for n in names if node.engine.has_stream(n) and leader_for(node, n) != node.name]
        if not remote:
            cb(None)
            return
        asyncio.get_running_loop().create_task(_wait_led(node, remote, cb))
    return created


async def _wait_led(node, names, cb):
    deadline = time.monotonic() + LEAD_WAIT_TTLS * node.ttl + 2.0
    waiting = set(names)
    try:
        while waiting and time.monotonic() < deadline:
            for name in list(waiting):
                p = node.placements.get(name)
                leader = p[0]["leader"] if p else None
                if leader and await node.etcd.get(f"{node.prefix}progress/{name}/{leader}") is not None:
                    waiting.discard(name)
            if waiting:
                await asyncio.sleep(0.05)
    except EtcdError as e:
        log.warning("cluster: cannot see the leaders of %s: %s", ",".join(sorted(waiting)), e)
    if waiting:
        log.warning("cluster: %s not yet led where placed; the create is answered anyway",
                    ",".join(sorted(waiting)))
    cb(None)
