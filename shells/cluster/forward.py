"""Forwarding: a publish or a StoreOffset that reaches a node which does not lead the stream goes to the
leader, whatever protocol it came through, and is answered only with what the leader answered.

The broker (``Broker._appended``, ``Broker.store_offset``) hands such a request to :class:`Forwarder`
instead of refusing it; no shell knows about forwarding. The leader applies it through its own broker
(``forward=False``: never forwarded again), so its confirm waits for a majority of the stream's members
as any publish there does, and its publisher sequences deduplicate a retried publish: the forwarded
request carries the publisher reference and the publishing ids as the client sent them.

Frames (forward_wire.py) travel on a connection of their own per leader, opened to the leader's
replication port: pipelined with request ids, at most :data:`MAX_INFLIGHT` requests unanswered per
leader (more wait in that leader's queue); the bytes stay counted in the forwarding node's in-flight
budget until answered, so its clients are paused as for a local publish.

**When the leader goes away** (its connection drops, it answers that it no longer leads, or that it
could not confirm):

* a request that was never sent, or that the leader refused before storing anything
  (``CODE_NOT_LEADER``), is kept and sent to the next leader once etcd names one: safe, the old leader
  holds nothing of it;
* a request that was sent and not confirmed, when **deduplication makes a retry safe** (a publish with
  a publisher reference and publishing ids, or a StoreOffset, which is idempotent), is kept too and
  sent again to whoever leads next: if that leader holds it already (it replicated), its publisher
  sequence drops it and it is confirmed once a majority holds the stored copy; if not, it is stored;
* any other request that was sent and not confirmed (BSON, ZeroMQ, WebSocket, REAM publishes, which
  carry no ids) is **failed, never retried here**: the old leader may have stored it, and the new one
  may hold it or not. The client gets its protocol's refusal (:class:`ForwardFailed`, a
  :class:`~riverbed.shells.broker.core.NotLeaderError`) and retries: a retried message may then be
  stored twice, an acknowledged one is never lost.

Kept requests leave in the order they came (per stream, a new request waits behind kept ones), so a
publisher's ids reach the leader in order. A request not confirmed within ``--replication-timeout`` of
its arrival (no leader elected in time) fails (``ForwardFailed``); one sent and left unanswered for twice
that (a paused leader) fails too. **A stream deleted on the cluster** fails its requests at once, parked
or sent, with StreamNotFound (RabbitMQ Stream: PublishError STREAM_DOES_NOT_EXIST, as RabbitMQ answers),
and so does an answer for it that would park one again; a node that only drops its own copy of a stream
that lives on (delete-replica, an idle observer copy, a copy of an earlier stream of that name) keeps them
for the leader. The broker's deletion hook tells the two apart by the placement: every cluster deletion
has removed it from the node's view by the time the hook runs, a dropped copy's placement is still there.

Loop thread only (the broker's loop).
"""

import asyncio
import collections
import itertools
import logging
import time

from riverbed.engine import core
from riverbed.engine.errors import ChunkError, InvalidArgument, RiverbedError, StorageFull, StreamNotFound
from riverbed.engine.layout import AppendResult
from riverbed.shells.broker.core import NotLeaderError
from riverbed.shells.cluster import forward_wire as fw
from riverbed.shells.cluster import read_wire
from riverbed.shells.cluster import wire

log = logging.getLogger("riverbed.cluster.forward")

MAX_INFLIGHT = 1024          # unanswered requests per leader connection
CONNECT_TIMEOUT = 2.0        # seconds to open a connection to a leader


class ForwardFailed(NotLeaderError):
    """A forwarded request the leader did not confirm: it may or may not be stored (the leader went
    away with it in flight, or had no majority in time). Retry it; publishing ids make that safe."""


_seq = itertools.count()


class _Request:
    __slots__ = ("stream", "kind", "args", "cb", "deadline", "seq", "retry_safe")

    def __init__(self, stream, kind, args, cb, deadline, retry_safe):
        self.stream = stream
        self.kind = kind          # fw.FWD_APPEND or fw.FWD_OFFSET
        self.args = args
        self.cb = cb
        self.deadline = deadline
        self.seq = next(_seq)     # arrival order: kept requests leave in it
        self.retry_safe = retry_safe

    def parts(self, rid):
        if self.kind == fw.FWD_APPEND:
            publisher, ids, filters, num_entries, num_records, data = self.args
            return fw.encode_append(rid, self.stream, publisher, ids, filters, num_entries, num_records, data)
        if self.kind == fw.FWD_SEQUENCE:
            return [fw.encode_sequence(rid, self.stream, self.args)]
        if self.kind == read_wire.READ_COMMITTED:
            return [read_wire.encode_committed(rid, self.stream)]
        reference, offset = self.args
        return [fw.encode_offset(rid, self.stream, reference, offset)]


class _Link:
    """The connection of this node to one leader node: a queue, the requests in flight, one task."""

    def __init__(self, fwd, node):
        self.fwd = fwd
        self.node = node
        self.queue = collections.deque()
        self.inflight = {}
        self.writer = None
        self.closed = False
        self.task = asyncio.get_running_loop().create_task(self._run())

    def send(self, req):
        self.queue.append(req)
        self.pump()
        self.fwd.node.tick_soon()       # route_changed times it out (the control loop's pace: pace.py)

    def pump(self):
        w = self.writer
        if w is None or w.is_closing():
            return
        while self.queue and len(self.inflight) < MAX_INFLIGHT:
            req = self.queue.popleft()
            rid = next(self.fwd.rids)
            self.inflight[rid] = req
            w.writelines(req.parts(rid))

    async def _run(self):
        writer = None
        try:
            reader, writer = await wire.open_node(self.fwd.node, self.node, CONNECT_TIMEOUT)
            writer.write(fw.encode_hello(self.fwd.node.name))
            self.writer = writer
            self.pump()
            while True:
                kind, payload = await wire.read_frame(reader)
                if kind != fw.FWD_RESULT:
                    raise wire.WireError(f"frame type {kind} on a forwarding connection")
                rid, code, first, last, dups, message = fw.decode_result(payload)
                req = self.inflight.pop(rid, None)
                if req is not None:
                    self.fwd._answered(req, code, first, last, dups, message)
                self.pump()
        except asyncio.CancelledError:
            pass
        except (ConnectionError, OSError, asyncio.IncompleteReadError, asyncio.TimeoutError, wire.WireError) as e:
            log.info("cluster: forwarding to %s: %s", self.node, e or type(e).__name__)
        except Exception:
            log.exception("cluster: forwarding to %s failed", self.node)
        finally:
            self.closed = True
            self.writer = None
            if writer is not None:
                writer.close()
            if self.fwd.links.get(self.node) is self:
                del self.fwd.links[self.node]
            inflight, self.inflight = self.inflight, {}
            for req in inflight.values():
                # sent: the leader may have stored it; sent again only where dedup makes that safe
                if req.retry_safe:
                    self.fwd._park(req)
                else:
                    self.fwd._fail(req, ForwardFailed(f"the leader {self.node} of {req.stream!r} went away "
                                                      f"before it confirmed; retry"))
            queued, self.queue = self.queue, collections.deque()
            for req in queued:
                self.fwd._park(req)         # never sent: safe to send to whoever leads next

    def close(self):
        self.task.cancel()


class Forwarder:
    """Forwards the publishes and StoreOffsets of streams this node does not lead (client side) and serves
    the ones other nodes forward here (leader side, :meth:`serve`). One per :class:`ClusterNode`.
    ``forwarded`` counts, per stream, the records forwarded and stored and confirmed by a leader (the metric
    ``riverbed_forwarded_publishes_total{stream}``)."""

    def __init__(self, node):
        self.node = node
        self.broker = node.broker
        self.links = {}                  # leader node -> _Link
        self.parked = []                 # requests waiting for a (new) leader
        self._parked_streams = collections.Counter()   # stream -> parked requests (new ones wait behind)
        self.rids = itertools.count(1)
        self.forwarded = collections.Counter()
        self.gone = {}                   # stream deleted on the cluster -> monotonic time its requests may linger
        self.broker.on_stream_deleted(self._stream_deleted)

    def _stream_deleted(self, name):
        self.forwarded.pop(name, None)
        if name in self.node.placements:
            return          # only this node's copy went: the stream lives on, its requests go to its leader
        # requests made before the deletion are all past their deadline after twice the timeout
        self.gone[name] = time.monotonic() + 2 * self.node.replication_timeout
        exc = StreamNotFound(f"stream {name!r} was deleted")
        if self._parked_streams.pop(name, 0):
            for req in [r for r in self.parked if r.stream == name]:
                self._fail(req, exc)
            self.parked = [r for r in self.parked if r.stream != name]
        for link in list(self.links.values()):
            for rid in [rid for rid, req in link.inflight.items() if req.stream == name]:
                self._fail(link.inflight.pop(rid), exc)
            if any(req.stream == name for req in link.queue):
                for req in [r for r in link.queue if r.stream == name]:
                    self._fail(req, exc)
                link.queue = collections.deque(r for r in link.queue if r.stream != name)
            link.pump()

    # ------------------------------------------------------------------------------ broker side

    def append(self, stream, publisher, ids, filters, num_entries, num_records, data, cb):
        """Forward an append (an Osiris data section of ``num_entries`` entries and ``num_records``
        records) to the leader of ``stream``; ``cb(AppendResult, exc)`` with the leader's offsets once it
        confirmed (a majority holds it), or an error: the ones the leader's engine raised
        (StreamNotFound, ChunkError, StorageFull) or :class:`ForwardFailed`."""
        if num_entries is None:
            ends, counts = core.scan_entries(data)
            num_entries, num_records = len(ends), sum(counts)
        self._route(_Request(stream, fw.FWD_APPEND, (publisher, ids, filters, num_entries, num_records, data), cb,
                             time.monotonic() + self.node.replication_timeout,
                             retry_safe=bool(publisher) and ids is not None))

    def store_offset(self, stream, reference, offset, cb):
        """Forward a StoreOffset to the leader of ``stream`` (it then reaches every member with the log);
        ``cb(exc)`` once the leader stored it."""
        self._route(_Request(stream, fw.FWD_OFFSET, (reference, offset), lambda res, exc: cb(exc),
                             time.monotonic() + self.node.replication_timeout, retry_safe=True))

    def query_sequence(self, stream, publisher, cb):
        """QueryPublisherSequence of ``publisher`` on ``stream``, asked of its leader (a member's copy of
        the sequences may be behind, and a publisher that continued from a stale one would have its new
        messages dropped as duplicates); ``cb(sequence, exc)``."""
        self._route(_Request(stream, fw.FWD_SEQUENCE, publisher, cb,
                             time.monotonic() + self.node.replication_timeout, retry_safe=True))

    def committed(self, stream, cb):
        """``cb(offset, exc)`` with the committed offset of ``stream`` as its leader has it now (read-your-
        writes on a node that does not lead it: remote_read.py)."""
        self._route(_Request(stream, read_wire.READ_COMMITTED, None, cb,
                             time.monotonic() + self.node.replication_timeout, retry_safe=True))

    def placed(self, stream):
        """Whether etcd (as this node last read it) places ``stream`` on the cluster."""
        return stream in self.node.placements

    def lookup(self, stream, cb):
        """``cb(placed, exc)`` after asking etcd whether ``stream`` is placed (it may have been made on
        another node a moment ago): a node creates a stream only when the cluster has none of that name."""
        async def ask():
            try:
                kv = await self.node.etcd.get(self.node.prefix + "streams/" + stream)
                if kv is not None and stream not in self.node.placements:
                    self.node.placements[stream] = (kv.json(), kv.mod_revision)
                elif kv is None:
                    # deleted a moment ago, before this node's reconcile saw it: a creation that follows
                    # must be placed anew, not taken for the old placement
                    self.node.placements.pop(stream, None)
                cb(kv is not None, None)
            except Exception as e:     # etcd unreachable: the creation goes on as a lone node would
                log.info("cluster: cannot ask etcd about %s: %s", stream, e)
                cb(False, None)
        asyncio.get_running_loop().create_task(ask())

    def route_changed(self):
        """Called on every poll of the cluster state (a leader may have changed): send what was parked,
        fail what waited too long, parked or sent (a leader that stopped answering: paused, cut off)."""
        now = time.monotonic()
        placements = self.node.placements
        if self.gone:
            for name in [n for n, until in self.gone.items() if now >= until or n in placements]:
                del self.gone[name]      # made again since, or nothing of the old one can be left
        for link in list(self.links.values()):
            late = [rid for rid, req in link.inflight.items() if now >= req.deadline + self.node.replication_timeout]
            for rid in late:
                req = link.inflight.pop(rid)
                self._fail(req, ForwardFailed(f"the leader {link.node} of {req.stream!r} did not answer in time"))
            # etcd names another leader (the old one paused or cut off, its connection still open): what
            # it has not answered is handled as if its connection had dropped
            moved = [rid for rid, req in link.inflight.items()
                     if placements.get(req.stream, ({},))[0].get("leader", link.node) != link.node]
            for rid in sorted(moved):
                req = link.inflight.pop(rid)
                if req.retry_safe:
                    self._park(req)
                else:
                    self._fail(req, ForwardFailed(f"{link.node} no longer leads {req.stream!r}; it did not confirm"))
            if late or moved:
                link.pump()
        if not self.parked:
            return
        parked, self.parked = sorted(self.parked, key=lambda r: r.seq), []
        self._parked_streams.clear()
        for req in parked:
            self._route(req)

    def close(self):
        for link in list(self.links.values()):
            link.close()
        parked, self.parked = self.parked, []
        self._parked_streams.clear()
        for req in parked:
            self._fail(req, ForwardFailed("the node is stopping"))

    def _route(self, req):
        if time.monotonic() >= req.deadline:
            self._fail(req, ForwardFailed(f"no leader of {req.stream!r} took the request within "
                                          f"{self.node.replication_timeout:g} s"))
            return
        if req.stream in self.gone and req.stream not in self.node.placements:
            self._fail(req, StreamNotFound(f"stream {req.stream!r} was deleted"))
            return
        if self._parked_streams[req.stream]:
            self._park(req)          # behind the kept requests of its stream: order is kept
            return
        node = self.node
        if req.stream in node.leading and req.stream not in node.handing_off:
            self._apply_here(req)
            return       # (while handing the stream over, the request waits for the next leader below)
        p = node.placements.get(req.stream)
        leader = p[0].get("leader") if p is not None else None
        if not leader or leader == node.name or leader not in node.nodes:
            self._park(req)
            return
        link = self.links.get(leader)
        if link is None or link.closed:
            link = self.links[leader] = _Link(self, leader)
        link.send(req)

    def _apply_here(self, req):
        # this node became the leader meanwhile: the request goes to its own broker
        if req.kind == fw.FWD_APPEND:
            publisher, ids, filters, num_entries, num_records, data = req.args
            self.broker.append(req.stream, data, ids, publisher, filters, req.cb, num_entries, num_records,
                               forward=False)
        elif req.kind == fw.FWD_SEQUENCE:
            self.broker.query_publisher_sequence(req.stream, req.args, req.cb, forward=False)
        elif req.kind == read_wire.READ_COMMITTED:
            self.broker._post(req.cb, self.node.leading[req.stream].committed, None)
        else:
            reference, offset = req.args
            self.broker.store_offset(req.stream, reference, offset, lambda exc: req.cb(None, exc), forward=False)

    def _park(self, req):
        if req.stream in self.gone and req.stream not in self.node.placements:
            self._fail(req, StreamNotFound(f"stream {req.stream!r} was deleted"))
            return
        self.parked.append(req)
        self._parked_streams[req.stream] += 1
        self.node.tick_soon()

    def busy(self):
        """Whether a request is parked, queued or unanswered: then the control loop calls
        :meth:`route_changed` at its full pace (pace.py)."""
        return bool(self.parked) or any(link.inflight or link.queue for link in self.links.values())

    def _fail(self, req, exc):
        self.broker._post(req.cb, None, exc)

    def _answered(self, req, code, first, last, dups, message):
        if code == fw.CODE_NOT_LEADER or (code == fw.CODE_NOT_CONFIRMED and req.retry_safe):
            self._park(req)          # nothing stored there, or stored and deduplicated if sent again
            return
        if code == fw.CODE_OK:
            if req.kind in (fw.FWD_SEQUENCE, read_wire.READ_COMMITTED):
                res, exc = fw.u64_of(first), None
            else:
                if req.kind == fw.FWD_APPEND and first >= 0:
                    self.forwarded[req.stream] += last - first + 1    # what the leader stored (not duplicates)
                res, exc = AppendResult(first, last, dups), None
        else:
            res, exc = None, _ERRORS.get(code, ForwardFailed)(message or f"forwarding failed (code {code})")
        # through the broker's inbox: the confirms of one read leave in one write per connection
        self.broker._post(req.cb, res, exc)

    # ------------------------------------------------------------------------------ leader side

    async def serve(self, reader, writer, hello):
        """Serve a forwarding connection (its FWD_HELLO payload already read): apply each request through
        this node's broker while it leads the stream, answer FWD_RESULT. Reading pauses while the
        broker's in-flight budget is exceeded."""
        peer = fw.decode_hello(hello)
        key = object()
        budget = self.broker.inflight
        try:
            while True:
                if budget.over():
                    resumed = asyncio.get_running_loop().create_future()
                    budget.wait(key, lambda: resumed.done() or resumed.set_result(None))
                    await resumed
                kind, payload = await wire.read_frame(reader)
                if kind == fw.FWD_APPEND:
                    self._serve_append(writer, fw.decode_append(payload))
                elif kind == fw.FWD_OFFSET:
                    self._serve_offset(writer, fw.decode_offset(payload))
                elif kind == fw.FWD_SEQUENCE:
                    self._serve_sequence(writer, fw.decode_sequence(payload))
                elif kind == read_wire.READ_COMMITTED:
                    rid, stream = read_wire.decode_committed(payload)
                    st = self.node.leading.get(stream)
                    writer.write(self._not_leader(rid, stream) if st is None else
                                 fw.encode_result(rid, fw.CODE_OK, fw.i64_of(st.committed), -1))
                else:
                    raise wire.WireError(f"frame type {kind} on a forwarding connection")
        except (asyncio.IncompleteReadError, ConnectionError, OSError, wire.WireError) as e:
            log.debug("cluster: forwarding connection from %s: %s", peer, e)
        finally:
            budget.cancel(key)

    def _not_leader(self, rid, stream):
        return fw.encode_result(rid, fw.CODE_NOT_LEADER, message=f"{self.node.name} does not lead {stream!r}")

    def _serve_append(self, writer, req):
        rid, stream, publisher, ids, filters, num_entries, num_records, data = req
        if stream not in self.node.leading:
            writer.write(self._not_leader(rid, stream))
            return

        def done(res, exc):
            if writer.is_closing():
                return
            if exc is None:
                writer.write(fw.encode_result(rid, fw.CODE_OK, res.first_offset, res.last_offset, res.duplicates))
            else:
                writer.write(fw.encode_result(rid, _code_of(exc), message=str(exc)))
        self.broker.append(stream, data, ids, publisher, filters, done, num_entries, num_records, forward=False)

    def _serve_sequence(self, writer, req):
        rid, stream, publisher = req
        if stream not in self.node.leading:
            writer.write(self._not_leader(rid, stream))
            return

        def done(seq, exc):
            if writer.is_closing():
                return
            if exc is None:
                writer.write(fw.encode_result(rid, fw.CODE_OK, fw.i64_of(seq), -1))
            else:
                writer.write(fw.encode_result(rid, _code_of(exc), message=str(exc)))
        self.broker.query_publisher_sequence(stream, publisher, done, forward=False)

    def _serve_offset(self, writer, req):
        rid, stream, reference, offset = req
        if stream not in self.node.leading:
            writer.write(self._not_leader(rid, stream))
            return

        def done(exc):
            if not writer.is_closing():
                writer.write(fw.encode_result(rid, fw.CODE_OK if exc is None else _code_of(exc),
                                              message="" if exc is None else str(exc)))
        self.broker.store_offset(stream, reference, offset, done, forward=False)


_ERRORS = {fw.CODE_NOT_FOUND: StreamNotFound, fw.CODE_INVALID: ChunkError, fw.CODE_STORAGE_FULL: StorageFull,
           fw.CODE_NOT_CONFIRMED: ForwardFailed, fw.CODE_ERROR: ForwardFailed}


def _code_of(exc):
    if isinstance(exc, StorageFull):
        return fw.CODE_STORAGE_FULL
    if isinstance(exc, StreamNotFound):
        return fw.CODE_NOT_FOUND
    if isinstance(exc, (InvalidArgument, ChunkError)):
        return fw.CODE_INVALID
    if isinstance(exc, RiverbedError):      # NotLeader, ReplicationTimeout: after the engine took it
        return fw.CODE_NOT_CONFIRMED
    return fw.CODE_ERROR
