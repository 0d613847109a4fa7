"""Deleting a stream on the whole cluster, through whichever node a client asked (issue 23: "Deleting a
stream removes it from every member; a member that was down when it was deleted removes it when it
returns").

A stream lives on the nodes its placement in etcd names (``streams/<name>``); a node may hold no copy of a
stream at all (``initial-cluster-size`` below the node count, or a super stream's partitions led by
other nodes). A deletion therefore acts on etcd, not on the nodes' copies: in ONE compare-and-swap
transaction on the placement's revision it deletes the placement and the members' progress keys and puts
a tombstone ``deleted/<name>``. Every node holding a copy sees the placement give way to the tombstone
(its watch, ClusterNode._refresh) and deletes its copy, the leader included; a node that was down then
does so when it returns (the tombstone stays); a node holding no copy forgets what it kept of the stream
(its metric series, forwarding counters, single-active-consumer groups) and tells its sessions.

**Tombstones are collected** (:func:`collect`), so etcd does not grow with every deleted name: a tombstone
lists the nodes that held a copy (the placement's members and learners) and the time of the deletion;
each listed node takes itself off (one compare-and-swap) once it holds no copy, at once or when it
returns, and the last one deletes it. One older than ``--tombstone-max-age`` (default 7 days) goes even
if a listed node never came back; a node that returns after that finds its copy neither placed nor in a
tombstone, and drops it as an orphan because the copy records that it was placed once (incarnation.py).
Making the name again deletes the tombstone at once (the new placement's revision tells its copies from
the old ones).

The broker calls :func:`hold_delete` around a deletion of local streams (RabbitMQ Delete and
DeleteSuperStream, Kafka DeleteTopics, the management API, REAM) and :func:`delete_remote` for a stream
this node holds no copy of. The client is answered once etcd holds the deletion, so a client that makes
the same name again right after (through any node) finds it free, and a ``balanced`` placement no longer
counts the old stream's leaders.

Loop thread only.
"""

import asyncio
import logging
import time

from riverbed.engine.errors import RiverbedError, StreamNotFound
from riverbed.shells.cluster.etcd import EtcdError

log = logging.getLogger("riverbed.cluster")

CAS_TRIES = 5           # compare-and-swap rounds before a deletion gives up (the placement kept changing)
# seconds a tombstone waits for a node that held a copy (--tombstone-max-age)
DEFAULT_TOMBSTONE_MAX_AGE = 7 * 24 * 3600.0


class DeleteFailed(RiverbedError):
    """etcd did not take the deletion of a stream (unreachable, or its placement kept changing): the
    cluster may still hold it; deleting it again is safe."""


def tombstone(name, p, now=None):
    """The tombstone of stream ``name`` deleted at placement ``p``: the nodes that hold a copy of it
    (``holders``: its members and learners) and the wall-clock time of the deletion (``at``, seconds)."""
    holders = set(p.get("members") or ()) | set(p.get("learners") or ())
    return {"name": name, "holders": sorted(holders), "at": time.time() if now is None else now}


async def remove_placement(node, name):
    """Delete stream ``name``'s placement in etcd, its members' progress keys with it, and leave the
    tombstone (:func:`tombstone`), in one transaction on the placement's revision (retried when another
    node changed the placement meanwhile: an election, a member added). True when a placement was there
    to remove (by this call or, found gone, by another node's deletion a moment ago: its tombstone is
    there, or was collected already). Raises EtcdError, DeleteFailed."""
    key = node.prefix + "streams/" + name
    for _ in range(CAS_TRIES):
        kv = await node.etcd.get(key)
        if kv is None:
            # never placed (made while etcd was away: no other node holds a copy), or deleted by another
            # node a moment ago (its tombstone lists the holders; putting one again would undo their
            # collection)
            return await node.etcd.get(node.prefix + "deleted/" + name) is not None
        tomb = (node.prefix + "deleted/" + name, tombstone(name, kv.json()))
        if await node.etcd.remove(key, kv.mod_revision, puts=[tomb],
                                  delete_prefixes=[f"{node.prefix}progress/{name}/"]):
            return True
    raise DeleteFailed(f"the placement of {name!r} kept changing in etcd; it was not deleted")


async def collect(node, tomb_kvs, placements):
    """On every reconcile, the tombstones' collection, one compare-and-swap on the tombstone's revision
    per step (a step that loses a race changes nothing; the watch brings the newer tombstone and the next
    reconcile looks again), so any number of nodes may run it at once:

    * a node listed in ``holders`` that holds no copy of the name (deleted, or never made) takes itself
      off; the last one deletes the tombstone;
    * a tombstone older than ``--tombstone-max-age`` goes whoever is still listed (a node that never came
      back; if it does, its copy is an orphan: incarnation.py);
    * a tombstone of an earlier version (no ``holders``) lists every node that ever joined, from now.
    """
    items = []
    for kv in tomb_kvs:
        try:
            items.append((kv, kv.json()))
        except ValueError:
            continue
    await collect_tombstones(node, items, lambda name: (name in placements or node.engine.has_stream(name)
                                                        or name in node._member_deleting))


async def collect_tombstones(node, items, holds):
    """The collection steps of :func:`collect` over ``items``, ``(kv, its JSON value)`` pairs whose value
    is a tombstone ``{"name", "holders", "at", ...}`` (any further fields are kept): ``holds(name)`` says
    whether this node still holds what the tombstone deleted (then it stays listed). Shared by stream
    tombstones and super stream definition tombstones (superstreams.py), so both follow one rule."""
    now = time.time()
    max_age = getattr(node, "tombstone_max_age", DEFAULT_TOMBSTONE_MAX_AGE)
    known = None
    for kv, t in items:
        if not isinstance(t, dict) or not isinstance(t.get("name"), str):
            continue            # etcd is shared: anything may have written it; the reconcile goes on
        name, key = t["name"], kv.key
        holders = t.get("holders")
        try:
            if (not isinstance(holders, list) or not all(isinstance(h, str) for h in holders)
                    or not isinstance(t.get("at"), (int, float))):
                if known is None:
                    known = known_nodes(node)
                await node.etcd.replace(key, kv.mod_revision, dict(t, holders=known, at=now))
            elif now - t["at"] >= max_age:
                if await node.etcd.remove(key, kv.mod_revision):
                    log.info("cluster: tombstone of %s collected after %.0f s (not heard from: %s)", name,
                             now - t["at"], ",".join(t["holders"]) or "-")
            elif node.name in t["holders"] and not holds(name):
                left = [h for h in t["holders"] if h != node.name]
                if left:
                    await node.etcd.replace(key, kv.mod_revision, dict(t, holders=left))
                elif await node.etcd.remove(key, kv.mod_revision):
                    log.info("cluster: tombstone of %s collected: no node holds a copy", name)
        except EtcdError as e:
            log.debug("cluster: collecting the tombstone of %s: %s", name, e)


def known_nodes(node):
    """Every node that ever joined the cluster (``known/``), sorted, as the node's watched copy of etcd
    has them."""
    return sorted(k.key.decode()[len(node.prefix) + len("known/"):] for k in node.etcd_view.items("known/"))


def hold_delete(node, names, cb):
    """Around a client's deletion of ``names`` on this node: returns the engine completion ``held(res,
    exc)`` that, once the local copies are deleted, removes every placement of ``names`` from etcd and
    then calls ``cb(res, exc)`` (exc a :class:`DeleteFailed` when etcd did not take it: the local copies
    are gone, the rest of the cluster still holds them; the hook tries again in the background). From
    this call on, the reconcile leaves ``names`` alone (it would otherwise make a member copy again from a
    placement not yet removed). A deleted stream also leaves every super stream it is a partition of on
    the whole cluster (the definitions in etcd), as a deleted queue's bindings go on RabbitMQ."""
    names = list(names)
    node._cluster_deleting.update(names)
    bound = _bound(node, names)

    def held(res, exc):
        if exc is not None:
            node._cluster_deleting.difference_update(names)
            _end(node, bound)
            cb(res, exc)
            return
        asyncio.get_running_loop().create_task(_remove_all(node, names, lambda found, err: cb(res, err), bound))
    return held


def delete_remote(node, name, cb):
    """Delete stream ``name``, of which this node holds no copy, on the cluster: ``cb(exc)`` once etcd
    holds it (StreamNotFound when etcd places no such stream, DeleteFailed when etcd did not take it).
    The nodes holding it delete their copies when their watch brings the tombstone."""
    node._cluster_deleting.add(name)

    def done(found, err):
        cb(err if err is not None or found else StreamNotFound(f"stream {name!r} does not exist"))
    asyncio.get_running_loop().create_task(_remove_all(node, [name], done, _bound(node, [name]), must_exist=True))


def _bound(node, names):
    """``{super stream: [its partitions among names]}`` as this node's definitions have them (a deletion
    is rare: reading them all costs nothing that matters). Each such super stream's change begins here
    (superstreams.begin: the engine's deletion of a local copy unbinds it at once, and a reconcile must
    not put the binding back from etcd before the change is written there); :func:`_unbind` or
    :func:`_end` closes it."""
    want, out = set(names), {}
    for s in node.engine.list_super_streams():
        hit = [p for p in (node.engine.super_stream(s) or {}).get("partitions", ()) if p in want]
        if hit:
            out[s] = hit
            node.superstreams.begin(s)
    return out


def _end(node, bound):
    for s in bound:
        node.superstreams.ended(s)


async def _unbind(node, bound):
    """The deleted partitions leave their super streams here (a local copy's deletion did so already in
    the engine; one this node held no copy of is unbound now) and the definitions go to etcd: without
    that, every node's next reconcile would put them back from etcd, and Route would name a stream that
    is gone. A super stream deleted with them (DeleteSuperStream) has its tombstone written already."""
    from riverbed.shells.cluster.superstreams import unbind      # (superstreams.py imports this module)
    for s, parts in bound.items():
        try:
            for p in parts:
                d = node.engine.super_stream(s)
                if d is None:
                    node.superstreams.ended(s)
                    await node.superstreams.written(s)      # its tombstone, before the client is answered
                    break
                if p in d["partitions"]:
                    await asyncio.wrap_future(node.engine.unbind_super_stream(s, p))
            else:
                node.superstreams.changed(s, op=unbind(tuple(parts)))
        except RiverbedError as e:
            node.superstreams.ended(s)
            log.warning("cluster: cannot unbind %s from super stream %s: %s", ",".join(parts), s, e)


async def _remove_all(node, names, cb, bound, must_exist=False):
    found, err = False, None
    try:
        for name in names:
            if must_exist and await node.etcd.get(node.prefix + "streams/" + name) is None:
                continue
            found = await remove_placement(node, name) or found
            node.placements.pop(name, None)
            node.removed_here.add(name)        # the deletion hook: nothing more to do in etcd
    except EtcdError as e:
        log.warning("cluster: cannot delete %s in etcd: %s", ",".join(names), e)
        err = DeleteFailed(f"etcd did not take the deletion: {e}")
    except DeleteFailed as e:
        err = e
    finally:
        node._cluster_deleting.difference_update(names)
    if err is None and found:
        log.info("cluster: %s deleted %s on the cluster", node.name, ",".join(names))
        await _unbind(node, bound)
    else:
        _end(node, bound)
    cb(found, err)


def forget_gone(node, before, placements):
    """On every reconcile: the streams whose placement this node knew (``before``) and that is gone (a
    deletion: its tombstone is there, or collected already) while this node holds no copy (it is no
    member, or was never one): the broker's deletion hooks and sessions hear of them, so nothing here
    keeps state of a deleted stream (a metric series of forwarded publishes, a parked forward, a
    single-active-consumer group, a publisher's stream)."""
    for name in before:
        # (a placement goes from etcd only by a deletion; its tombstone may be collected already)
        if name in placements or name in node._cluster_deleting or node.engine.has_stream(name):
            continue
        node._member_deleting.add(name)        # the node's hook forgets it without touching etcd
        node.broker.stream_deleted(name)
