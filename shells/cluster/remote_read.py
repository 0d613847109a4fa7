"""Reading a stream on a node that holds no copy of it: the node becomes an *observer* of the stream.

A stream is placed on its members (``initial-cluster-size`` of them, or what ``add-replica`` and
``delete-replica`` made); any node still serves every listener. When a client on a node outside the
members subscribes to such a stream (any protocol: RabbitMQ Stream Subscribe, BSON SUBSCRIBE, a ZeroMQ
SUB, a WebSocket subscribe or resend, a REAM EVENT SUBSCRIBE, ``riverbed tail``), the shell asks the
broker first (:meth:`~riverbed.shells.broker.core.Broker.needs_copy`,
:meth:`~riverbed.shells.broker.core.Broker.when_readable`), and the broker asks :class:`Observers`:

* the node makes a local copy of the stream (the same arguments as the placement) and follows the
  stream's leader over the replication port exactly as a member does, with ``"observer": true`` in its
  HELLO: the leader sends it every chunk as stored (byte for byte: same offsets, same CRCs) and the
  committed offset, and never counts its acknowledgements toward a majority; it has no vote and never
  stands in an election, and no progress key of it is written;
* the request goes on once the copy holds the committed offset the leader first told it (so an offset
  spec such as ``next`` or ``last`` resolves as it would on the leader), within ``--replication-timeout``
  (else the shell answers as for a missing stream);
* from then on the copy is a local log: the broker's ``Tail``, ``resolve`` and record reads serve it,
  limited to the committed offset (``Engine.set_read_limit``) like a member's, and a read at an offset the
  copy has not reached yet waits for it (a tail arms a watch);
* on a failover the observer follows the next leader (a tail the old leader had not committed is
  truncated, as on a member); a stream deleted on the cluster is deleted here as on a member; a restart
  of the node drops its observer copies (they are in no placement), and a node made a member of the
  stream (``add-replica``) keeps its copy as a member copy;
* a copy no reader used for ``IDLE_DROP`` seconds (no open tail: ``Broker.readers``, no request in
  flight; default 60, ``RIVERBED_OBSERVER_IDLE_SECONDS``) is deleted here (the cluster's stream stays);
  the next reader makes a new one. A ZeroMQ subscription holds it until its client DISCONNECTs or its
  TTL expires (a DEALER that goes away says nothing).

Read-your-writes for one-shot reads (:meth:`Observers.catch_up`, ``Broker.catch_up``): a WebSocket
resend, a REST read, the HTTP API's stream stats and records on a node that does not lead the stream
first ask the leader its committed offset (read_wire.py, on the forwarding connection) and wait until
the local copy holds it. A subscription needs no such step: its tail waits for offsets not here yet.

Publishes on an observer are forwarded to the leader as on any node that does not lead (forward.py).
Positions are the log's offsets on every node. Loop thread only.
"""

import asyncio
import logging
import os
import time

from riverbed.engine.errors import StreamNotFound
from riverbed.shells.cluster import membership
from riverbed.shells.cluster.etcd import EtcdError

log = logging.getLogger("riverbed.cluster")

READY_POLL = 0.01        # seconds between two looks at a new copy's progress while a request waits
# seconds an observer copy is kept with no reader (no open tail, no request) before it is dropped
IDLE_DROP = float(os.environ.get("RIVERBED_OBSERVER_IDLE_SECONDS", "60"))


class CopyTimeout(StreamNotFound):
    """No copy of the stream could be made and caught up here within --replication-timeout (its leader
    is away, or the stream is not placed): the request is answered as for a missing stream."""


class Observers:
    """The streams this node observes (holds a copy of without being a member). One per
    :class:`~riverbed.shells.cluster.node.ClusterNode`."""

    def __init__(self, node):
        self.node = node
        self.streams = {}          # stream -> commit offset last heard from its leader (None: none yet)
        self._waiting = {}         # stream -> [cb(exc)] of requests waiting for the copy
        self._used = {}            # stream -> monotonic time a reader last used (or held) the copy
        self._busy = {}            # stream -> catch_up calls in flight
        node.broker.on_stream_deleted(self.forget)

    def observing(self, name):
        return name in self.streams

    def ready(self, name):
        """Whether the local copy of ``name`` (which exists) may be read now: a member's always; an
        observer's once caught up; not while it is being dropped, nor while no role keeps it up to date
        (:meth:`stale`)."""
        if name in self.node._member_deleting:
            return False
        if name in self.streams:
            return self._caught_up(name)
        return not self.stale(name)

    def stale(self, name):
        """Whether the local copy of ``name`` is one that nothing keeps up to date: the placement (as this
        node knows it) names this node neither member nor learner, and it does not observe it. So is the
        copy a node made a stream with before placing it on another node, or the one a ``delete-replica``
        left, until the control loop drops it: a reader must not be served from it (it would wait in vain
        for the leader's committed offset, then find it deleted). :meth:`observe` adopts it instead."""
        entry = self.node.placements.get(name)
        return (entry is not None and name not in self.node.leading
                and not membership.take_part(self.node, name, entry[0]))

    def heard_commit(self, name, offset):
        """The leader sent COMMIT ``offset`` to this node's copy of ``name`` (replication.py hook)."""
        if name in self.streams:
            self.streams[name] = offset

    def observe(self, name, cb):
        """``cb(exc)`` on the loop once this node holds a copy of ``name`` caught up to the committed
        offset (exc None), or could not within the replication timeout (:class:`CopyTimeout`). A stream
        no placement names (etcd is asked first) gets CopyTimeout at once."""
        self._used[name] = time.monotonic()
        if self.node.engine.has_stream(name) and self.ready(name):
            cb(None)
            return
        waiting = self._waiting.get(name)
        if waiting is not None:
            waiting.append(cb)
            return
        self._waiting[name] = [cb]
        asyncio.get_running_loop().create_task(self._copy(name))

    def _caught_up(self, name):
        commit = self.streams.get(name)
        if commit is None:
            return False
        try:
            return self.node.engine._current(name).next_offset >= commit
        except StreamNotFound:
            return False

    async def _copy(self, name):
        node = self.node
        exc = None
        try:
            deadline = time.monotonic() + node.replication_timeout
            while name in node._member_deleting:       # an idle copy being dropped: made again after
                if time.monotonic() >= deadline:
                    raise CopyTimeout(f"the copy of {name!r} here is still being deleted")
                await asyncio.sleep(READY_POLL)
            while name not in node.placements:
                # placed a moment ago (this node's next poll would see it): asked of etcd, again while
                # etcd does not answer (a busy etcd must not make a stream look missing)
                try:
                    kv = await node.etcd.get(node.prefix + "streams/" + name)
                except EtcdError:
                    if time.monotonic() >= deadline:
                        raise
                    await asyncio.sleep(0.1)
                    continue
                if kv is None:
                    break
                if name not in node.placements:
                    node.placements[name] = (kv.json(), kv.mod_revision)
            entry = node.placements.get(name)
            if entry is None:
                raise CopyTimeout(f"stream {name!r} does not exist on the cluster")
            if membership.take_part(node, name, entry[0]):
                if not node.engine.has_stream(name) and name not in node._member_creating:
                    # a member (or learner) whose control loop has not taken its role yet (its view of
                    # the cluster is a poll or a watch event behind): taken now, as that loop would
                    await node._take_role(name, entry[0], entry[1])
                while not node.engine.has_stream(name):
                    if time.monotonic() >= deadline:
                        raise CopyTimeout(f"this node's member copy of {name!r} is not there yet")
                    await asyncio.sleep(READY_POLL)
            elif not node.engine.has_stream(name):
                log.info("cluster: %s observes %s (no copy here; following its leader)", node.name, name)
                self.streams[name] = None
                await node._create_local(name, entry[0].get("arguments") or {})
                if not node.engine.has_stream(name):
                    raise CopyTimeout(f"cannot make a copy of {name!r} here")
                self.follow(name, entry[0])
            elif name not in self.streams:
                # a copy here that no role keeps up to date (stale()): adopted as this node's observer
                # copy; the leader truncates what it does not hold, as for any copy that follows it
                log.info("cluster: %s observes %s (adopting the copy it holds; following its leader)",
                         node.name, name)
                self.streams[name] = None
                if node.engine.read_limit(name) is None:
                    node.engine.set_read_limit(name, 0)
                self.follow(name, entry[0])
            while not self._caught_up(name) and name in self.streams:
                if time.monotonic() >= deadline:
                    raise CopyTimeout(f"the copy of {name!r} here did not reach its leader's committed offset "
                                      f"within {node.replication_timeout:g} s")
                await asyncio.sleep(READY_POLL)
        except Exception as e:      # etcd away, a refused creation: answered, never raised
            exc = e if isinstance(e, StreamNotFound) else CopyTimeout(f"no copy of {name!r} here: {e}")
            if not node.engine.has_stream(name):
                self.streams.pop(name, None)
        self._used[name] = time.monotonic()        # its readers open their tails from now on
        for fn in self._waiting.pop(name, ()):
            try:
                fn(exc)
            except Exception:
                log.exception("a request waiting for the copy of %r failed", name)

    def catch_up(self, name, cb):
        """``cb()`` on the loop once this node's copy of ``name`` (a member's or an observer's) holds the
        committed offset its leader has now, asked over the forwarding connection (read_wire.py), or after
        ``--replication-timeout`` (then the read goes on with what is here). Read-your-writes: a client that
        published through another node and reads here sees its write."""
        node = self.node
        loop = asyncio.get_running_loop()
        state = {"done": False, "cancel": None, "timer": None}
        self._used[name] = time.monotonic()
        self._busy[name] = self._busy.get(name, 0) + 1      # the copy is not dropped under a read

        def finish(exc=None):
            if state["done"]:
                return
            state["done"] = True
            self._used[name] = time.monotonic()
            left = self._busy.get(name, 0) - 1
            if left > 0:
                self._busy[name] = left
            else:
                self._busy.pop(name, None)
            if state["cancel"] is not None:
                state["cancel"]()
            if state["timer"] is not None:
                state["timer"].cancel()
            cb()

        def got(offset, exc):
            if state["done"]:
                return
            if exc is not None or not offset:
                finish()
                return
            state["cancel"] = node.broker.watch(name, offset - 1, finish)
        state["timer"] = loop.call_later(node.replication_timeout, finish)
        node.forwarding.committed(name, got)

    def follow(self, name, p):
        """Follow the leader of placement ``p`` (called on every poll of the cluster state for an observed
        stream): a new leader or epoch starts a new follower; no live leader, none (the members elect)."""
        node = self.node
        if self._idle(name):
            self._drop(name)
            return
        leader, epoch = p.get("leader"), p.get("epoch", 0)
        if epoch < node.max_epoch.get(name, 0):
            return
        node.max_epoch[name] = epoch
        f = node.following.get(name)
        if not leader or leader == node.name or leader not in node.nodes or node.watch.is_lost(name, leader, epoch):
            if f is not None:
                f[2].cancel()
                node.following.pop(name, None)
            return
        if f is not None and f[0] == leader and f[1] == epoch and not f[2].done():
            return
        if f is not None:
            f[2].cancel()
        if node.engine.read_limit(name) is None:
            node.engine.set_read_limit(name, 0)
        task = asyncio.get_running_loop().create_task(node._follow(name, leader, epoch))
        node.following[name] = (leader, epoch, task)

    def _idle(self, name):
        now = time.monotonic()
        if (self.node.broker.readers.get(name) or name in self._waiting or name in self._busy
                or not self.node.engine.has_stream(name)):
            self._used[name] = now
            return False
        return now - self._used.setdefault(name, now) >= IDLE_DROP

    def _drop(self, name):
        """Delete the observer copy of ``name`` (no reader for IDLE_DROP seconds); the cluster's stream
        stays (the deletion hook knows this one is a copy of this node only). A later reader makes a new one."""
        node = self.node
        log.info("cluster: %s drops its observer copy of %s (no reader for %g s)", node.name, name, IDLE_DROP)
        self.streams.pop(name, None)
        self._used.pop(name, None)
        f = node.following.pop(name, None)
        if f is not None:
            f[2].cancel()
        node._member_deleting.add(name)

        def deleted(exc):
            if exc is not None:
                node._member_deleting.discard(name)
        node.broker.delete_stream(name, deleted, copy_only=True)

    def became_member(self, name):
        """This node is now a member (or learner) of ``name``: its copy is a member copy from now on."""
        self.streams.pop(name, None)
        self._used.pop(name, None)

    def forget(self, name):
        """Broker deletion hook: the copy is gone."""
        self.streams.pop(name, None)
        self._used.pop(name, None)
