"""Single active consumer across the nodes of a cluster: one group per stream, decided by its leader.

A RabbitMQ Stream consumer group (``single-active-consumer`` with a ``name``) is one group per stream
on the whole cluster, whichever nodes its consumers are connected to. Its decisions (who is active, the
super stream partition rule, step-down before activation) are taken in one place: the broker layer's
:class:`~riverbed.shells.broker.sac.SacGroups` of the node that **leads the stream** (for a super stream,
each partition's leader decides for that partition). No consensus is written for it: the leader is
already the one node etcd names for the stream, and the group's state is rebuilt from the members'
nodes whenever the leader changes.

* **Registering.** A member (a subscription on this node, :class:`_Local`) is registered with the
  stream's leader: directly with this node's own groups when it leads the stream (no hop, as a lone
  node), else over a SAC connection to the leader's replication port (sac_wire.py: one per leader node,
  opened with SAC_HELLO). The leader answers with the member's ``order`` (its place in the group) and
  later sends SAC_ACTIVATE / SAC_STEP_DOWN, which this node turns into the client's ConsumerUpdate;
  the client's step-down answer goes back as SAC_STEPPED_DOWN.
* **A node goes away.** Its SAC connections close (a killed process), or its etcd key expires (a paused or
  cut-off node: the leader closes the connection as soon as its etcd watch shows the key gone): the leader drops that node's members,
  and the next member in order is activated. The client of the new active consumer picks its offset as
  usual (the stored offset + 1: offsets replicate with the log, so every member's node answers
  QueryOffset).
* **The leader changes.** The old leader's groups are forgotten (by itself as soon as it sees the change, or with
  the process). Every node re-registers its members with the new leader (once its watch shows it), each
  with the ``order`` it had and its state: an active consumer stays active, a step-down still awaited is
  awaited. For :func:`gather_seconds` (three control-loop ticks, at least 0.5 s) after it began leading at epoch > 1,
  the new leader activates no one, so that an active consumer's re-registration is not overtaken by a
  waiting one's; then it decides. Should two members still both report being active, the later yields
  (it is told to step down).
* **Stale commands.** A node acts on a leader's command only when the member is registered over that very
  connection (never one from a former leader that has not noticed yet).

The SAC connection is a connection of its own on the replication port, not the forwarding link
(forward.py), because its life is the node's membership: a dropped forwarding link keeps its requests for
the next leader, a dropped SAC connection makes the leader drop that node's members at once.

What it does not guarantee: a node paused (SIGSTOP) with an active consumer keeps it delivering when it
resumes until its re-registration at the current leader tells it to step down; the leader had activated
another member once the paused node's lease went.

Loop thread only (the broker's loop).
"""

import asyncio
import itertools
import logging
import time

from riverbed.shells.broker.sac import SacGroups
from riverbed.shells.cluster import sac_wire as sw
from riverbed.shells.cluster import wire

log = logging.getLogger("riverbed.cluster.sac")

CONNECT_TIMEOUT = 2.0        # seconds to open a SAC connection to a leader
GATHER_MIN = 0.5             # seconds a new leader waits for re-registrations, at least
POLLS_GATHERED = 3           # ... and at least this many of the nodes' polls of etcd

_LOCAL = "local"             # a member registered with this node's own groups (this node leads its stream)


def gather_seconds(ttl, poll_max):
    """Seconds a new leader activates no one: three polls of the other nodes (each ``min(ttl / 6,
    poll_max)`` apart, as node.py polls), at least GATHER_MIN."""
    return max(GATHER_MIN, POLLS_GATHERED * min(ttl / 6, poll_max))


class _Local:
    """A member on this node (a RabbitMQ Stream subscription) and where it is registered: ``via`` is None
    (waiting for a leader), ``_LOCAL`` or the :class:`_Link` to the leader."""

    __slots__ = ("id", "stream", "name", "index", "sub", "order", "via", "epoch")

    def __init__(self, member_id, stream, name, index, sub):
        self.id = member_id
        self.stream = stream
        self.name = name
        self.index = index
        self.sub = sub
        self.order = 0           # 0 until a leader gave it its place
        self.via = None
        self.epoch = None        # the stream's epoch when it was registered over ``via``


class _Remote:
    """Leader side: a member on another node, as its group sees it."""

    __slots__ = ("conn", "id", "stream", "name", "order")

    def __init__(self, conn, member_id, stream, name):
        self.conn = conn
        self.id = member_id
        self.stream = stream
        self.name = name
        self.order = 0

    def sac_activate(self):
        self.conn.send(sw.encode_activate(self.id))

    def sac_step_down(self):
        self.conn.send(sw.encode_step_down(self.id))


class _Conn:
    """Leader side: the SAC connection of one node, and its members registered here."""

    __slots__ = ("peer", "writer", "members", "opened", "seen_live")

    def __init__(self, peer, writer):
        self.peer = peer
        self.writer = writer
        self.members = {}        # member id -> _Remote
        self.opened = time.monotonic()
        self.seen_live = False   # its node was registered in etcd at one of this node's polls

    def send(self, data):
        if not self.writer.is_closing():
            self.writer.write(data)


class _Link:
    """Member side: this node's SAC connection to one leader node."""

    def __init__(self, sac, node):
        self.sac = sac
        self.node = node
        self.writer = None
        self.pending = []        # frames written before the connection is open
        self.closed = False
        self.task = asyncio.get_running_loop().create_task(self._run())

    def send(self, data):
        if self.closed:
            return
        w = self.writer
        if w is None:
            self.pending.append(data)
        elif not w.is_closing():
            w.write(data)

    async def _run(self):
        writer = None
        try:
            reader, writer = await wire.open_node(self.sac.node, self.node, CONNECT_TIMEOUT)
            writer.write(sw.encode_hello(self.sac.node.name))
            writer.writelines(self.pending)
            self.pending = []
            self.writer = writer
            while True:
                kind, payload = await wire.read_frame(reader)
                self.sac._command(self, kind, payload)
        except asyncio.CancelledError:
            pass
        except (ConnectionError, OSError, asyncio.IncompleteReadError, asyncio.TimeoutError, wire.WireError) as e:
            log.info("cluster: SAC connection to %s: %s", self.node, e or type(e).__name__)
        except Exception:
            log.exception("cluster: SAC connection to %s failed", self.node)
        finally:
            self.closed = True
            self.writer = None
            self.pending = []
            if writer is not None:
                writer.close()
            self.sac._link_lost(self)

    def close(self):
        self.task.cancel()


class ClusterSac:
    """The single-active-consumer groups of a :class:`~riverbed.shells.cluster.node.ClusterNode` (see the
    module docstring): ``groups`` decides for the streams this node leads; :meth:`register`,
    :meth:`unregister` and :meth:`stepped_down` are the RabbitMQ Stream shell's calls for its members;
    :meth:`serve` serves another node's SAC connection; :meth:`tick` runs after every reconcile with etcd's state and on
    the node's clock (at most ``poll_max`` seconds apart)."""

    def __init__(self, node, poll_max):
        self.node = node
        self.groups = SacGroups(hold=self._held)
        self.gather = gather_seconds(node.ttl, poll_max)
        self.members = {}            # member id -> _Local
        self._by_sub = {}            # subscription -> _Local
        self.links = {}              # leader node -> _Link
        self.conns = set()           # _Conn served here
        self._held_streams = set()   # streams whose groups took a registration while held
        self._ids = itertools.count(1)
        node.broker.on_stream_deleted(self._stream_deleted)

    # ------------------------------------------------------------------------------ the shell's calls

    def register(self, stream, name, sub, index=-1):
        """Join ``sub`` (having ``sac_activate()``, ``sac_step_down()``, ``sac_state()``) to the group
        ``(stream, name)`` of the cluster; ``index`` is its super stream partition index (-1: none)."""
        rec = _Local(next(self._ids), stream, name, index, sub)
        self.members[rec.id] = rec
        self._by_sub[sub] = rec
        self._register(rec)

    def unregister(self, stream, name, sub):
        """``sub`` leaves its group (unsubscribed, or its connection closed)."""
        rec = self._by_sub.pop(sub, None)
        if rec is None:
            return
        del self.members[rec.id]
        if rec.via is _LOCAL:
            self.groups.unregister(stream, name, sub)
        elif rec.via is not None:
            rec.via.send(sw.encode_unregister(rec.id, stream, name))

    def stepped_down(self, stream, name, sub):
        """``sub``'s client answered its step-down (or did not in time)."""
        rec = self._by_sub.get(sub)
        if rec is None:
            return
        if rec.via is _LOCAL:
            self.groups.stepped_down(stream, name, sub)
        elif rec.via is not None:
            rec.via.send(sw.encode_stepped_down(rec.id, stream, name))
        # (not registered anywhere: its next registration reports it waiting)

    # ------------------------------------------------------------------------------ member side

    def _leader_of(self, stream):
        """``_LOCAL``, the leader node's name, or None while the stream has no live leader."""
        node = self.node
        if stream in node.leading:
            return _LOCAL
        p = node.placements.get(stream)
        leader = p[0].get("leader") if p is not None else None
        if not leader or leader == node.name or leader not in node.nodes:
            return None
        return leader

    def _register(self, rec):
        leader = self._leader_of(rec.stream)
        if leader is None:
            rec.via = None
            return
        state = rec.sub.sac_state()
        if leader is _LOCAL:
            rec.via = _LOCAL
            if self._held(rec.stream):
                self._held_streams.add(rec.stream)
            rec.order = self.groups.register(rec.stream, rec.name, rec.sub, rec.index, rec.order, state)
            return
        try:
            frame = sw.encode_register(rec.id, rec.order, rec.index, state, rec.stream, rec.name)
        except ValueError as e:          # a name over 65535 bytes (the protocol's strings cannot be)
            log.warning("cluster: cannot register SAC member of %r: %s", rec.stream, e)
            return
        link = self.links.get(leader)
        if link is None or link.closed:
            link = self.links[leader] = _Link(self, leader)
        rec.via = link
        rec.epoch = self._epoch_of(rec.stream)
        link.send(frame)

    def _epoch_of(self, stream):
        p = self.node.placements.get(stream)
        return p[0].get("epoch") if p is not None else None

    def _command(self, link, kind, payload):
        """A leader's frame on ``link``."""
        if kind == sw.SAC_REGISTERED:
            member, order, code = sw.decode_registered(payload)
            rec = self.members.get(member)
            if rec is None or rec.via is not link:
                return
            if code == sw.CODE_OK:
                rec.order = order
            else:
                rec.via = None           # that node does not lead it (any more): the next poll asks again
            return
        if kind == sw.SAC_ACTIVATE:
            rec = self.members.get(sw.decode_activate(payload))
            if rec is not None and rec.via is link:
                rec.sub.sac_activate()
            return
        if kind == sw.SAC_STEP_DOWN:
            rec = self.members.get(sw.decode_step_down(payload))
            if rec is not None and rec.via is link:
                rec.sub.sac_step_down()
            return
        raise wire.WireError(f"frame type {kind} on a SAC connection")

    def _link_lost(self, link):
        if self.links.get(link.node) is link:
            del self.links[link.node]
        for rec in self.members.values():
            if rec.via is link:
                rec.via = None           # registered again on the next poll, with whoever leads then

    def _stream_deleted(self, stream):
        for rec in [r for r in self.members.values() if r.stream == stream]:
            del self.members[rec.id]
            self._by_sub.pop(rec.sub, None)
        self._forget(stream)

    # ------------------------------------------------------------------------------ leader side

    def _held(self, stream):
        """Whether this node began leading ``stream`` at epoch > 1 less than ``gather`` seconds ago."""
        st = self.node.leading.get(stream)
        return st is not None and st.epoch > 1 and time.monotonic() < st.since + self.gather

    def _forget(self, stream):
        self.groups.forget_stream(stream)
        self._held_streams.discard(stream)
        for conn in self.conns:
            for mid in [m for m, h in conn.members.items() if h.stream == stream]:
                del conn.members[mid]

    async def serve(self, reader, writer, hello):
        """Serve a node's SAC connection (its SAC_HELLO payload already read) until it closes; then its
        members leave their groups."""
        conn = _Conn(sw.decode_hello(hello), writer)
        self.conns.add(conn)
        try:
            while True:
                kind, payload = await wire.read_frame(reader)
                if kind == sw.SAC_REGISTER:
                    self._serve_register(conn, *sw.decode_register(payload))
                elif kind == sw.SAC_UNREGISTER:
                    member, _, _ = sw.decode_unregister(payload)
                    h = conn.members.pop(member, None)
                    if h is not None:
                        self.groups.unregister(h.stream, h.name, h)
                elif kind == sw.SAC_STEPPED_DOWN:
                    member, _, _ = sw.decode_stepped_down(payload)
                    h = conn.members.get(member)
                    if h is not None:
                        self.groups.stepped_down(h.stream, h.name, h)
                else:
                    raise wire.WireError(f"frame type {kind} on a SAC connection")
        except (asyncio.IncompleteReadError, ConnectionError, OSError, wire.WireError) as e:
            log.debug("cluster: SAC connection from %s: %s", conn.peer, e or type(e).__name__)
        finally:
            self._drop_conn(conn)

    def _drop_conn(self, conn):
        self.conns.discard(conn)
        members, conn.members = conn.members, {}
        for h in members.values():
            self.groups.unregister(h.stream, h.name, h)
        conn.writer.close()

    def _serve_register(self, conn, member, order, index, state, stream, name):
        if stream not in self.node.leading:
            conn.send(sw.encode_registered(member, 0, sw.CODE_NOT_LEADER))
            return
        old = conn.members.get(member)
        if old is not None and (old.stream, old.name) == (stream, name):
            # registered again at a new epoch of the same leader, which kept its groups: as it was
            conn.send(sw.encode_registered(member, old.order))
            return
        if old is not None:
            del conn.members[member]
            self.groups.unregister(old.stream, old.name, old)
        h = conn.members[member] = _Remote(conn, member, stream, name)
        if self._held(stream):
            self._held_streams.add(stream)
        h.order = self.groups.register(stream, name, h, index, order, state)
        conn.send(sw.encode_registered(member, h.order))

    # ------------------------------------------------------------------------------ every poll

    def tick(self):
        """On every poll of etcd: drop the members of nodes that left (their lease went), forget the
        groups of streams this node no longer leads, decide for the ones whose gathering ended, and
        register this node's members again where their stream's leader changed."""
        live = self.node.nodes
        now = time.monotonic()
        for conn in list(self.conns):
            if conn.peer in live:
                conn.seen_live = True
            elif conn.seen_live or now - conn.opened > 2 * self.node.ttl:
                # (a node that joined after this node's last poll is not in ``live`` yet: not dropped)
                log.info("cluster: %s left; its single-active consumers leave their groups", conn.peer)
                self._drop_conn(conn)
        for stream in self.groups.streams():
            if stream not in self.node.leading:
                self._forget(stream)
        for stream in list(self._held_streams):
            if not self._held(stream):
                self._held_streams.discard(stream)
                self.groups.rebalance_stream(stream)
        for rec in list(self.members.values()):
            leader = self._leader_of(rec.stream)
            if rec.via is _LOCAL and leader is not _LOCAL:
                rec.via = None               # its group was forgotten above
            if rec.via is _LOCAL:
                now = _LOCAL
            else:
                now = rec.via.node if rec.via is not None and not rec.via.closed else None
            # a new leader, or the same one at a new epoch (it may have stepped down and forgotten its
            # groups in between, while the connection stayed open)
            moved = leader != now or (now is not _LOCAL and rec.epoch != self._epoch_of(rec.stream))
            if leader is not None and moved:
                self._register(rec)

    def busy(self):
        """Whether any single-active-consumer state is here (members, connections of other nodes, groups
        still gathering): then :meth:`tick` runs at the control loop's full pace (pace.py)."""
        return bool(self.members or self.conns or self._held_streams)

    def close(self):
        for link in list(self.links.values()):
            link.close()
        for conn in list(self.conns):
            self._drop_conn(conn)
