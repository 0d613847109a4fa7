"""Changing a stream's members: ``riverbed cluster add-replica|delete-replica STREAM NODE`` and the node's
side of it.

The placement in etcd (``streams/<stream>``) is only ever changed by compare-and-swap, one change at a
time: a change is refused while another one of the same stream is under way.

**How a change stays safe** (no confirmed record lost, the committed offset never goes back):

* *Adding* a node makes it a **learner** first (``"learners": [node]``): it creates its copy, copies the
  leader's log chunk by chunk as stored (each CRC checked as it is stored) and then follows it, but it
  neither counts toward the majority nor votes. The leader promotes it to a member (CAS) only once it
  holds the committed offset. So the committed offset is still held by a majority of the new, larger
  member set at the moment it grows (the old majority plus the new member), and any majority of the
  new set overlaps any majority of the old one (a single node changes at a time).
* *Removing* a follower drops it from the members by CAS. Any majority of the remaining members
  overlaps every majority of the old set (one node less), so an election among them always includes a
  member holding every confirmed record.
* *Removing the leader* hands leadership over first, as RabbitMQ does: the CLI marks the placement
  ``"leaving": node``; the leader stops accepting publishes, waits until another live member holds its
  whole log and everything is committed, freezes its committed offset, and gives the stream to that
  member at epoch + 1 in one CAS (``"given": [member, its lease]``, removing itself). The new leader's
  log contains every chunk the old one had, so nothing it confirmed can be lost; a publish caught in the
  hand-over is refused (never confirmed) and may be retried on the new leader.
* A removed node stops following, deletes its copy and its progress key; one that was down when it was
  removed does so when it returns. The last member of a stream cannot be removed (delete the stream).

CLI exit status: 0 done, 1 refused or not finished in time (the message says why), 2 etcd unreachable.
Node side: loop thread only.
"""

import asyncio
import logging
import sys
import time

from riverbed.shells.cluster.etcd import Etcd, EtcdError

log = logging.getLogger("riverbed.cluster")

DEFAULT_TIMEOUT = 60.0      # seconds the CLI waits for a change to complete
POLL = 0.1


class MembershipError(RuntimeError):
    """A membership change refused (unknown stream or node, node down, already a member, ...)."""


# ---------------------------------------------------------------------------------------- node side

def learners_of(p):
    return list(p.get("learners") or ())


def take_part(node, name, p):
    """Whether this node holds a copy of the stream of placement ``p`` (a member or a learner)."""
    return node.name in p["members"] or node.name in learners_of(p)


def given_to_me(node, p):
    """Whether placement ``p`` hands its leadership to this very run of the node (its current lease)."""
    return p.get("given") == [node.name, node.lease]


async def take_given(node, name, p):
    """Lead stream ``name`` that another node placed here or handed over (placement ``p``)."""
    if not node.engine.has_stream(name):
        await node._create_local(name, p.get("arguments") or {})
    node.max_epoch[name] = p["epoch"]
    node._lead(name, p["epoch"], p["members"])
    log.info("cluster: %s takes %s at epoch %d (given)", node.name, name, p["epoch"])


async def promote(node, st):
    """Leader side: make a learner of ``st`` a member once it holds the committed offset (CAS)."""
    entry = node.placements.get(st.name)
    if entry is None or not node.lease_valid():
        return
    p, rev = entry
    if p.get("leader") != node.name or p.get("epoch") != st.epoch:
        return
    ready = [n for n in learners_of(p) if st.connected.get(n, 0) > 0 and st.acked.get(n, -1) >= st.committed]
    if not ready:
        return
    n = ready[0]
    new = dict(p, members=p["members"] + [n], learners=[x for x in learners_of(p) if x != n])
    key = node.prefix + "streams/" + st.name
    try:
        if not await node.etcd.replace(key, rev, new):
            return
        kv = await node.etcd.get(key)
    except EtcdError:
        return
    node.placements[st.name] = (new, kv.mod_revision if kv else rev)
    st.members, st.learners = list(new["members"]), list(new["learners"])
    log.info("cluster: %s is a member of %s (holds %d, committed %d)", n, st.name, st.acked.get(n, 0),
             st.committed)


def start_hand_off(node, name):
    if name in node.handing_off:
        return
    node.handing_off.add(name)
    asyncio.get_running_loop().create_task(_hand_off(node, name))


async def _hand_off(node, name):
    """Leader side of removing the leader: give ``name`` to a member that holds the whole log."""
    st = node.leading.get(name)
    try:
        deadline = time.monotonic() + max(node.replication_timeout, 2 * node.ttl)
        ready = []
        while st is not None and node.leading.get(name) is st:
            head = st.local_next()
            ready = sorted(m for m in st.members if m != node.name and m in node.nodes
                           and st.connected.get(m, 0) > 0 and st.acked.get(m, 0) >= head)
            if ready and st.committed >= head:
                st.frozen = True          # nothing more is confirmed here: the new leader has it all
                if st.local_next() == head:
                    break
                st.frozen = False
            if time.monotonic() > deadline:
                await _give_up(node, name, "no other member caught up in time")
                return
            await asyncio.sleep(0.02)
        else:
            return
        key = node.prefix + "streams/" + name
        cur, target = await node.etcd.get(key), await node.etcd.get(node.prefix + "nodes/" + ready[0])
        p = cur.json() if cur is not None else None
        if (p is None or target is None or p.get("leader") != node.name or p.get("epoch") != st.epoch
                or p.get("leaving") != node.name):
            st.frozen = False
            return
        new = dict(p, leader=ready[0], epoch=p["epoch"] + 1, members=[m for m in p["members"] if m != node.name],
                   given=[ready[0], target.lease])
        new.pop("leaving", None)
        if await node.etcd.replace(key, cur.mod_revision, new):
            log.info("cluster: %s hands %s to %s at epoch %d and leaves it", node.name, name, ready[0],
                     new["epoch"])
            node.max_epoch[name] = new["epoch"]
            node.placements[name] = (new, cur.mod_revision)
            node._step_down(name)
            drop_copy(node, name)
        else:
            st.frozen = False
    except EtcdError as e:
        log.warning("cluster: handing %s over failed: %s", name, e)
        if st is not None:
            st.frozen = False
    finally:
        node.handing_off.discard(name)


async def _give_up(node, name, why):
    log.warning("cluster: %s keeps leading %s: %s", node.name, name, why)
    key = node.prefix + "streams/" + name
    cur = await node.etcd.get(key)
    if cur is not None:
        p = cur.json()
        if p.get("leaving") == node.name:
            new = dict(p, failed=f"{node.name} could not hand {name} over: {why}")
            new.pop("leaving")
            await node.etcd.replace(key, cur.mod_revision, new)


def drop_copy(node, name):
    """This node is no longer in ``name``'s placement: stop following or leading it and delete its copy
    (the cluster's stream stays: the deletion hook knows this one is a member's copy)."""
    if name in node.placing or name in node.pending_leaders:
        return
    f = node.following.pop(name, None)
    if f is not None:
        f[2].cancel()
    node._step_down(name)
    node.detached.pop(name, None)
    if node.progress_sent.pop(name, None) is not None:
        asyncio.get_running_loop().create_task(_forget_progress(node, name))
    if node.engine.has_stream(name) and name not in node._member_deleting:
        log.info("cluster: %s is no longer a member of %s: its copy is deleted", node.name, name)
        node._member_deleting.add(name)

        def deleted(exc):
            if exc is not None:
                node._member_deleting.discard(name)
        node.broker.delete_stream(name, deleted, copy_only=True)


async def _forget_progress(node, name):
    try:
        await node.etcd.delete(f"{node.prefix}progress/{name}/{node.name}")
    except EtcdError:
        pass


# ----------------------------------------------------------------------------------------------- CLI

async def _read(c, pre, stream):
    kv = await c.get(pre + "streams/" + stream)
    if kv is None:
        raise MembershipError(f"unknown stream {stream!r} (no placement in etcd)")
    live = {k.key.decode()[len(pre) + len("nodes/"):] for k in await c.get_prefix(pre + "nodes/")}
    return kv.json(), kv.mod_revision, live


async def _known(c, pre, node, live):
    if node in live or await c.get(pre + "known/" + node) is not None:
        return True
    return any(node in kv.json().get("members", ()) for kv in await c.get_prefix(pre + "streams/"))


async def add_replica(endpoints, cluster, stream, node, timeout=DEFAULT_TIMEOUT, say=print):
    """Make ``node`` a member of ``stream``: a learner first, a member once it holds the committed offset
    (see the module docstring). Returns when it is a member. Raises MembershipError, EtcdError."""
    from riverbed.shells.cluster.node import prefix_of
    c, pre = Etcd(endpoints), prefix_of(cluster)
    try:
        key = pre + "streams/" + stream
        p, rev, live = await _read(c, pre, stream)
        if not await _known(c, pre, node, live):
            raise MembershipError(f"unknown node {node!r} (never joined cluster {cluster!r})")
        if node not in live:
            raise MembershipError(f"node {node!r} is down: it cannot copy {stream!r}")
        if node in p["members"]:
            raise MembershipError(f"node {node!r} is already a member of {stream!r}")
        if node not in learners_of(p):
            if learners_of(p) or p.get("leaving"):
                raise MembershipError(f"a membership change of {stream!r} is under way "
                                      f"({', '.join(learners_of(p)) or p.get('leaving')}); retry once it is done")
            if not p.get("leader") or p["leader"] not in live:
                raise MembershipError(f"{stream!r} has no live leader right now (an election is under way); retry")
            new = dict(p, learners=[node])
            new.pop("failed", None)
            if not await c.replace(key, rev, new):
                raise MembershipError(f"the placement of {stream!r} changed meanwhile; retry")
            say(f"{node} joins {stream} as a learner: copying the log from {p['leader']}")
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            kv = await c.get(key)
            if kv is None:
                raise MembershipError(f"stream {stream!r} was deleted meanwhile")
            p = kv.json()
            if node in p["members"]:
                say(f"{node} is a member of {stream} (members {','.join(p['members'])}, leader {p['leader']})")
                return p
            if node not in learners_of(p):
                raise MembershipError(f"{node!r} was taken off {stream!r} meanwhile")
            await asyncio.sleep(POLL)
        raise MembershipError(f"{node!r} is still catching up with {stream!r} after {timeout:.0f} s; it becomes "
                              f"a member once it holds the committed offset")
    finally:
        await c.close()


async def delete_replica(endpoints, cluster, stream, node, timeout=DEFAULT_TIMEOUT, say=print):
    """Take ``node`` off ``stream`` (its copy is deleted there); the leader hands leadership over first.
    Returns the new placement. Raises MembershipError, EtcdError."""
    from riverbed.shells.cluster.node import prefix_of
    c, pre = Etcd(endpoints), prefix_of(cluster)
    try:
        key = pre + "streams/" + stream
        p, rev, live = await _read(c, pre, stream)
        if node in learners_of(p):          # an add not finished yet: cancelled
            new = dict(p, learners=[x for x in learners_of(p) if x != node])
            if not await c.replace(key, rev, new):
                raise MembershipError(f"the placement of {stream!r} changed meanwhile; retry")
            say(f"{node} no longer joins {stream}")
            return new
        if node not in p["members"]:
            if not await _known(c, pre, node, live):
                raise MembershipError(f"unknown node {node!r} (never joined cluster {cluster!r})")
            raise MembershipError(f"node {node!r} is not a member of {stream!r} (members: {', '.join(p['members'])})")
        if p["members"] == [node]:
            raise MembershipError(f"{node!r} is the last member of {stream!r}: refused (delete the stream to "
                                  f"remove it)")
        if learners_of(p):
            raise MembershipError(f"a membership change of {stream!r} is under way ({', '.join(learners_of(p))} "
                                  f"joining); retry once it is done")
        deadline = time.monotonic() + timeout
        asked = False
        while True:
            if node not in p["members"]:
                break
            if p.get("leader") == node:
                others = [m for m in p["members"] if m != node and m in live]
                if node not in live:
                    raise MembershipError(f"{node!r} leads {stream!r} and is down: wait for the election "
                                          f"(one lease TTL), then retry")
                if not others:
                    raise MembershipError(f"no other member of {stream!r} is up to take the lead from {node!r}")
                if p.get("failed") and asked:
                    raise MembershipError(p["failed"])
                if p.get("leaving") != node:
                    new = dict(p, leaving=node)
                    new.pop("failed", None)
                    if await c.replace(key, rev, new):
                        asked = True
                        say(f"{node} leads {stream}: handing leadership to another member first")
            else:
                new = dict(p, members=[m for m in p["members"] if m != node])
                if new.get("leaving") == node:
                    new.pop("leaving")
                if await c.replace(key, rev, new):
                    p = new
                    break
            if time.monotonic() > deadline:
                raise MembershipError(f"{node!r} is still a member of {stream!r} after {timeout:.0f} s")
            await asyncio.sleep(POLL)
            p, rev, live = await _read(c, pre, stream)
        say(f"{node} is no longer a member of {stream} (members {','.join(p['members'])}, leader "
            f"{p.get('leader') or '-'})")
        if node not in live:
            say(f"{node} is down: its copy of {stream} is deleted when it returns")
            return p
        # the node drops its copy on its next poll; its progress key goes with it
        while time.monotonic() < deadline:
            if await c.get(f"{pre}progress/{stream}/{node}") is None:
                say(f"{node} deleted its copy of {stream}")
                break
            await asyncio.sleep(POLL)
        return p
    finally:
        await c.close()


def main_change(args):
    """``riverbed cluster add-replica|delete-replica STREAM NODE``: exit 0, 1 (refused), 2 (no etcd)."""
    fn = add_replica if args.action == "add-replica" else delete_replica
    try:
        asyncio.run(fn(args.etcd, args.cluster, args.stream, args.node, timeout=args.timeout))
    except MembershipError as e:
        print(f"riverbed cluster {args.action}: {e}", file=sys.stderr)
        return 1
    except (EtcdError, ValueError) as e:
        print(f"riverbed cluster {args.action}: {e}", file=sys.stderr)
        return 2
    return 0
