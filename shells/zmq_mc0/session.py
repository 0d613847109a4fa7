"""mc0 sessions, sans-I/O: one :class:`McClient` per routing identity, run by one :class:`McShell` per
ROUTER. Nothing here touches a socket, a loop or LMDB: the shell writes through its ``io`` and reaches
the log through the broker layer.

``io`` (the server, or a fake in unit tests)::

    io.send(identity, frames) -> SENT | BLOCKED | GONE   # BLOCKED: the peer's pipe is at its HWM;
                                                          # GONE: no such peer (it disconnected)
    io.defer(fn)                                          # run fn() soon on the loop

Behaviour (issue 10):

* State is created on a client's first message and forgotten on DISCONNECT, TTL expiry, when the peer is
  gone (a send finds no route), on an admin close, or when it holds nothing (no TTL, no subscription,
  nothing in flight) and has been idle for ``IDLE_FORGET`` seconds: such a client is indistinguishable
  from a new one, and this keeps one-shot peers (and garbage senders) from accumulating.
* A client's requests take effect in order. A PUT is batched with the other PUTs of the same loop turn
  (one append per topic per turn), and every later request of that client waits in its queue until the
  PUT has committed; so an ``OK`` for a PUT means it and every earlier PUT of that client are stored.
* Each subscription (client, topic) is a broker-layer :class:`Tail` from its start offset: replay and
  live delivery are the same reader, so there is no gap and no duplicate, and a subscriber is read at
  its own pace. When the peer's pipe is full (ROUTER_MANDATORY + HWM -> BLOCKED) its tails pause and the
  rest of the current chunk is held; :meth:`McShell.tick` retries. Replies to a blocked client wait in
  a small outbox (over ``MAX_OUTBOX`` the client is dropped: it sends but never reads).
* A subscription to a topic whose stream does not exist yet waits; once the stream appears (this shell's
  first PUT creates it, or another protocol does) it starts at offset 0, which is everything written
  since the SUB. A deleted stream sends its subscriptions back to waiting.
* TTL: a NOOP once the client has been sent nothing for 0.95 x TTL, expiry after 1.05 x TTL of silence;
  one heap entry per client with a TTL, checked on every tick (the server ticks every ``TICK`` s).

Loop-thread only.
"""

import heapq
import logging
from collections import deque

from riverbed.engine import OffsetSpec
from riverbed.engine.errors import RiverbedError, StorageFull, StreamExists
from riverbed.shells import auth as _auth
from riverbed.shells.broker import CONFIGURE, READ, WRITE, MODE_CREDIT, Tail
from riverbed.shells.broker import limits as _limits
from riverbed.shells.zmq_mc0 import codec
from riverbed.shells.zmq_mc0.codec import (
    HDR_OFFSET, HDR_TOPIC, HDR_TTL, RequestError, VERB_CONNECT, VERB_DISCONNECT, VERB_NOOP, VERB_PUT, VERB_SUB,
    VERB_UNSUB,
)

log = logging.getLogger("riverbed.zmq")
LISTENER = "zmq"         # the listener label of riverbed_rejected_total

SENT, BLOCKED, GONE = "sent", "blocked", "gone"

TICK = 0.02                  # seconds between timer checks (TTL NOOP/expiry, blocked retries)
NOOP_FACTOR = 0.95           # NOOP after this x TTL of send-silence
EXPIRE_FACTOR = 1.05         # forget after this x TTL of receive-silence
IDLE_FORGET = 60.0           # seconds after which a client holding nothing is forgotten
MAX_OUTBOX = 10000           # replies held for a blocked client before it is dropped
BATCH_RECORDS = 4096         # records per append (one commit)
BATCH_BYTES = 8 << 20        # bytes per append
UNLIMITED = 1 << 62          # Tail credit: the HWM, not credit, paces a subscriber

ALL_PERMISSIONS = _auth.User("zmq")


class Subscription:
    """One (client, topic) subscription: a Tail once the stream exists (``tail``), else waiting.
    ``start``: the offset a waiting subscription starts at once its stream appears. ``held``: the rest
    of a record batch the peer could not take, as ``[(offset, raw) iterator, the pair not yet sent]``."""

    __slots__ = ("client", "topic", "name", "tail", "start", "held")

    def __init__(self, client, topic, name, start):
        self.client = client
        self.topic = topic          # bytes, as the client sent it
        self.name = name            # str, the stream
        self.tail = None
        self.start = start
        self.held = None

    def close(self):
        if self.tail is not None:
            self.tail.close()
            self.tail = None
        self.held = None


class McClient:
    """The state of one routing identity; registered with the broker (``connection_info``,
    ``close_by_admin``, ``stream_deleted``)."""

    def __init__(self, shell, identity, now):
        self.shell = shell
        self.identity = identity
        self.ttl = None               # seconds, or None: never expires, no NOOPs
        self.subs = {}                # topic bytes -> Subscription
        self.queue = deque()          # [done, fn] entries: the client's requests in order
        self.outbox = deque()         # replies waiting while blocked
        self.blocked = False
        self.gone = False
        self.last_recv = now
        self.last_send = now
        self.timer_at = None          # when this client's heap entry fires
        self.connected_at = shell.broker.wall_clock()
        self.user = shell.user_for(identity)
        self.messages_in = 0
        self.messages_out = 0
        shell.broker.register(self)

    # ------------------------------------------------------------------------------- management

    @property
    def peer(self):
        return self.shell.peer_of(self.identity) or self.identity.hex()

    def consumer_infos(self):
        """This client's topic subscriptions (see the RabbitMQ Stream session's): the subscription id is
        the topic; the offset is the tail's, or where it will start while it waits for the stream; no
        credits. Loop-thread only."""
        out = []
        for sub in list(self.subs.values()):
            offset = sub.tail.offset if sub.tail is not None else sub.start
            if offset is not None:
                out.append({"stream": sub.name, "protocol": "zmq", "connection": f"zmq {self.identity.hex()}",
                            "subscription_id": sub.topic.decode("utf-8", "replace"), "reference": None,
                            "offset": offset, "credits": None})
        return out

    def connection_info(self):
        host, port = self.shell.address_of(self.identity)
        return {
            "name": f"zmq {self.identity.hex()}",
            "protocol": "zmq",
            "peer_host": host,
            "peer_port": port,
            "host": self.shell.host,
            "port": self.shell.port,
            "user": self.user.name if self.user else None,
            "client_properties": {"identity": self.identity.decode("utf-8", "replace"),
                                  "ttl_ms": int(self.ttl * 1000) if self.ttl else None,
                                  "topics": [s.name for s in self.subs.values()]},
            "connected_at": self.connected_at,
            "state": "blocked" if self.blocked else "running",
        }

    def close_by_admin(self, reason):
        self.send(codec.encode_error(f"closed by the administrator: {reason}"))
        self.shell.forget(self, "closed by the administrator")

    def stream_deleted(self, name):
        for sub in self.subs.values():
            if sub.name == name:
                self.shell.to_waiting(sub, 0)

    # ---------------------------------------------------------------------------------- sending

    def send(self, frames):
        """Send a reply (OK, ERROR, NOOP) in order with what went before."""
        if self.gone:   # forgotten (DISCONNECT, expiry...) with replies still due: they need no state
            self.shell.io.send(self.identity, frames)
            return
        if self.blocked:
            if len(self.outbox) >= MAX_OUTBOX:
                self.shell.forget(self, "it does not read its replies")
                return
            self.outbox.append(frames)
            return
        self._transmit(frames, True)

    def _transmit(self, frames, hold):
        status = self.shell.io.send(self.identity, frames)
        if status == SENT:
            self.last_send = self.shell.now
            self.messages_out += 1
            return True
        if status == BLOCKED:
            if hold:
                self.outbox.append(frames)
            self.block()
            return False
        self.shell.forget(self, "no route to the peer")
        return False

    def block(self):
        if not self.blocked:
            self.blocked = True
            for sub in self.subs.values():
                if sub.tail is not None:
                    sub.tail.pause()
            self.shell.blocked.add(self)

    def retry(self):
        """Flush what is held; resume the tails once everything went. Returns True when unblocked."""
        while self.outbox:
            if not self._transmit(self.outbox[0], False):
                return False
            self.outbox.popleft()
        for sub in list(self.subs.values()):
            if sub.held is not None and not self.shell.deliver_held(sub):
                return False
            if self.gone:
                return False
        self.blocked = False
        for sub in list(self.subs.values()):
            if sub.tail is not None:
                sub.tail.resume()
            if self.blocked or self.gone:
                return False
        return True

    # ------------------------------------------------------------------------------ request order

    def advance(self):
        """Run queued requests whose turn has come (PUT entries wait for their commit)."""
        q = self.queue
        while q and q[0][0]:
            fn = q.popleft()[1]
            if fn is not None:
                fn()    # after a DISCONNECT the rest still runs, for a new client of the same identity

    @property
    def idle(self):
        return self.ttl is None and not self.subs and not self.queue and not self.outbox


class McShell:
    """Every client of one ROUTER. ``handle(identity, frames)`` per received message, ``tick()`` every
    :data:`TICK` seconds. ``host``/``port`` are for ``connection_info``. ``zap`` (optional) maps an
    identity to ``(user name or None, "host:port" or None)`` learnt by the ZAP handler."""

    def __init__(self, broker, io, *, host=None, port=None, max_request=64 << 20):
        self.broker = broker
        self.io = io
        self.host = host
        self.port = port
        self.max_request = max_request
        self.clients = {}
        self.blocked = set()
        self.waiting = {}             # stream name -> set of waiting Subscriptions
        self.peers = {}               # identity -> (user, "host:port") from the ZAP handler
        self.now = broker.clock()
        self.pending_ops = 0          # appends and creations in flight (shutdown waits for 0)
        self.closing = False
        self._heap = []
        self._seq = 0
        self._batches = {}            # stream name -> [(record, client, entry), ...] of this loop turn
        self._creating = {}           # stream name -> batches waiting for its creation
        self._flush_scheduled = False
        # a subscription to a topic that does not exist yet starts when any protocol creates it
        broker.on_stream_created(self._wake_waiting)
        self._next_idle_sweep = 0.0

    # ------------------------------------------------------------------------------- identities

    def user_for(self, identity):
        known = self.peers.get(identity)
        if known and known[0]:
            return self.broker.auth.user(known[0]) or _auth.User(known[0])
        # admitted by the ZAP handler as a loopback peer: guest when there is no users file
        return self.broker.auth.implicit_user(True) or ALL_PERMISSIONS

    def peer_of(self, identity):
        known = self.peers.get(identity)
        return known[1] if known else None

    def address_of(self, identity):
        addr = self.peer_of(identity)
        if not addr:
            return None, None
        host, _, port = addr.rpartition(":")
        return host, int(port) if port.isdigit() else None

    # --------------------------------------------------------------------------------- requests

    def refuse(self, identity, text):
        """Answer a message the listener refused by a limit before handing it over (too many parts, too
        big) with an error reply, as for a request that does not parse."""
        client = self.clients.get(identity)
        reply = codec.encode_error(text, None)
        if client is not None:
            client.last_recv = self.broker.clock()
            self._in_order(client, lambda: client.send(reply))
        else:
            self.io.send(identity, reply)

    def handle(self, identity, frames):
        """One message from ``identity`` (the frames after the routing identity)."""
        self.now = now = self.broker.clock()
        client = self.clients.get(identity)
        try:
            if sum(map(len, frames)) > self.max_request:
                raise RequestError(f"message too large (over {self.max_request} bytes)")
            req = codec.parse_request(frames)
        except RequestError as e:
            if client is not None:
                client.last_recv = now
                reply = codec.encode_error(e.text, e.id)   # built now: ``e`` does not outlive the handler
                self._in_order(client, lambda: client.send(reply))
            else:   # no state for a client whose first message is garbage
                self.io.send(identity, codec.encode_error(e.text, e.id))
            return
        if client is None:
            client = self._new_client(identity)
        client.last_recv = now
        client.messages_in += 1
        verb = req.verb
        if verb == VERB_PUT:
            self._put(client, req)
        elif client.queue:
            client.queue.append([True, lambda: self._run(client, req)])
        else:
            self._run(client, req)

    def _new_client(self, identity):
        client = self.clients[identity] = McClient(self, identity, self.now)
        return client

    def _in_order(self, client, fn):
        if client.queue:
            client.queue.append([True, fn])
        else:
            fn()

    def _run(self, client, req):
        if client.gone:    # queued behind a DISCONNECT: the identity speaks again, as a new client
            client = self.clients.get(client.identity) or self._new_client(client.identity)
            if client.queue:
                client.queue.append([True, lambda: self._run(client, req)])
                return
        started = ()
        try:
            verb = req.verb
            if verb == VERB_NOOP:
                pass
            elif verb == VERB_SUB:
                started = self._sub(client, req)
            elif verb == VERB_UNSUB:
                for topic in req.body:
                    sub = client.subs.pop(topic, None)
                    if sub is not None:
                        self._drop_sub(sub)
            elif verb == VERB_CONNECT:
                ttl = req.header(HDR_TTL)
                if ttl is not None:
                    try:
                        ms = codec.parse_ms(ttl)
                    except ValueError as e:
                        raise RequestError(f"bad TTL {codec.shown(ttl)!r}: {e}", req.id) from None
                    client.ttl = ms / 1000.0
                    self._arm(client)
            elif verb == VERB_DISCONNECT:
                self.forget(client, None)
                if req.id is not None:   # the client is forgotten; this reply creates no state
                    self.io.send(client.identity, codec.encode_ok(req.id))
                return
        except RequestError as e:
            client.send(codec.encode_error(e.text, e.id if e.id is not None else req.id))
            return
        except (ValueError, TypeError, LookupError, OverflowError, RiverbedError) as e:
            # a value the request checks let through: this request's ERROR, not the listener's guard
            _limits.reject(LISTENER, "field", repr(e), client.identity.hex())
            client.send(codec.encode_error(f"request failed: {e}", req.id))
            return
        if req.id is not None:
            client.send(codec.encode_ok(req.id))
        for sub in started:   # after the OK: replayed messages follow it
            if sub.tail is not None and client.subs.get(sub.topic) is sub:
                sub.tail.start()

    def _sub(self, client, req):
        start = None
        raw = req.header(HDR_OFFSET)
        if raw is not None:
            try:
                start = codec.parse_offset(raw)
            except ValueError as e:
                raise RequestError(f"bad X-OFFSET {codec.shown(raw)!r}: {e}", req.id) from None
        names, started = [], []
        for topic in req.body:
            try:
                name = codec.topic_name(topic)
            except ValueError as e:
                raise RequestError(f"bad topic {codec.shown(topic)!r}: {e}", req.id) from None
            if not self.broker.allowed(client.user, READ, name):
                raise RequestError(f"access to topic {name!r} refused", req.id)
            names.append((topic, name))
        for topic, name in names:
            sub = client.subs.get(topic)
            if sub is not None:
                if start is None:
                    continue        # already live: a repeated SUB changes nothing
                self._drop_sub(sub)
            sub = client.subs[topic] = Subscription(client, topic, name, start)
            if self.broker.has_stream(name):
                if start is None:
                    try:
                        start = self.broker.resolve(name, OffsetSpec.next())
                    except RiverbedError:
                        start = 0
                    self._start_tail(sub, start, False)
                    start = None
                else:
                    self._start_tail(sub, start, False)
                started.append(sub)
            else:
                self.to_waiting(sub, start or 0)
        return started

    def _drop_sub(self, sub):
        sub.close()
        w = self.waiting.get(sub.name)
        if w is not None:
            w.discard(sub)
            if not w:
                del self.waiting[sub.name]

    def to_waiting(self, sub, start):
        """``sub``'s stream is missing (never created, or deleted): wait for it, then start at ``start``."""
        sub.close()
        sub.start = start
        self.waiting.setdefault(sub.name, set()).add(sub)

    def _wake_waiting(self, name):
        subs = self.waiting.pop(name, None)
        if not subs:
            return
        for sub in subs:
            if not sub.client.gone and sub.client.subs.get(sub.topic) is sub:
                self._start_tail(sub, sub.start or 0)

    def _start_tail(self, sub, offset, start=True):
        client = sub.client

        def on_records(tail, batch):
            sub.held = [iter(batch), None]
            self.deliver_held(sub)
            return 0

        def on_gone(exc):
            if not client.gone and client.subs.get(sub.topic) is sub:
                self.to_waiting(sub, 0)

        sub.tail = Tail(self.broker, sub.name, offset, on_records, defer=self.io.defer, on_gone=on_gone,
                        mode=MODE_CREDIT, credit=UNLIMITED, records=True)
        if client.blocked:
            sub.tail.pause()
        if start:
            sub.tail.start()

    def deliver_held(self, sub):
        """Send what is left of ``sub``'s current chunk; False (and the client blocked) when the peer's
        pipe is full."""
        held = sub.held
        pairs, pending = held
        client = sub.client
        topic = sub.topic
        io_send = self.io.send
        ident = client.identity
        while True:
            if pending is None:
                pending = next(pairs, None)
                if pending is None:
                    break
            offset, raw = pending
            try:
                frames = codec.record_message(topic, raw, offset)
            except Exception as e:   # a record this shell cannot render: skip it, say so in the log
                log.warning("zmq: record %d of %r cannot be rendered: %s", offset, sub.name, e)
                pending = None
                continue
            status = io_send(ident, frames)
            if status == SENT:
                pending = None
                client.messages_out += 1
                continue
            held[1] = pending
            if status == BLOCKED:
                client.block()
            else:
                self.forget(client, "no route to the peer")
            return False
        sub.held = None
        client.last_send = self.now
        return True

    # --------------------------------------------------------------------------------------- PUT

    def _put(self, client, req):
        rid = req.id
        entry = [False, None, rid]     # done, what to run at its turn, the request's ID
        client.queue.append(entry)
        try:
            topic = req.header(HDR_TOPIC)
            if topic is None:
                raise RequestError("PUT without a TOPIC header", rid)
            try:
                name = codec.topic_name(topic)
            except ValueError as e:
                raise RequestError(f"bad topic {codec.shown(topic)!r}: {e}", rid) from None
            if not self.broker.allowed(client.user, WRITE, name):
                raise RequestError(f"access to topic {name!r} refused", rid)
            record = codec.put_record(req.headers, req.body)
        except RequestError as e:
            entry[0] = True
            reply = codec.encode_error(e.text, e.id)
            entry[1] = lambda: client.send(reply)
            client.advance()
            return
        except (ValueError, TypeError) as e:
            entry[0] = True
            reply = codec.encode_error(f"cannot store the message: {e}", rid)
            entry[1] = lambda: client.send(reply)
            client.advance()
            return
        if rid is not None:
            entry[1] = lambda: client.send(codec.encode_ok(rid))
        self._batches.setdefault(name, []).append((record, client, entry))
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self.io.defer(self.flush)

    def flush(self):
        """Submit the PUTs of this loop turn: one append per topic (split at BATCH_RECORDS/BATCH_BYTES)."""
        self._flush_scheduled = False
        batches, self._batches = self._batches, {}
        for name, items in batches.items():
            if name in self._creating:
                self._creating[name].append(items)
            elif self.broker.has_stream(name):
                self._append(name, items)
            else:
                client = items[0][1]
                if not self.broker.allowed(client.user, CONFIGURE, name):
                    self._fail(items, f"creating topic {name!r} refused")
                    continue
                self._creating[name] = [items]
                self.pending_ops += 1
                self.broker.create_stream(name, {}, lambda exc, name=name: self._created(name, exc))

    def _created(self, name, exc):
        self.pending_ops -= 1
        waiting = self._creating.pop(name, [])
        if exc is not None and not isinstance(exc, StreamExists):
            for items in waiting:
                self._fail(items, f"cannot create topic {name!r}: {exc}")
            return
        for items in waiting:
            self._append(name, items)
        self._wake_waiting(name)

    def _append(self, name, items):
        start, size = 0, 0
        for i, (record, _, _) in enumerate(items):
            size += len(record)
            if i + 1 - start >= BATCH_RECORDS or size >= BATCH_BYTES or i + 1 == len(items):
                part = items[start:i + 1]
                self.pending_ops += 1
                self.broker.append_records(name, [r for r, _, _ in part],
                                           lambda res, exc, part=part: self._appended(name, part, exc))
                start, size = i + 1, 0

    def _appended(self, name, items, exc):
        self.pending_ops -= 1
        if exc is not None:
            if not isinstance(exc, StorageFull):   # a full disk is logged once, by the disk alarm
                log.info("zmq: appending to %r failed: %s", name, exc)
            self._fail(items, f"cannot store the message in topic {name!r}: {exc}")
            return
        touched = []
        for _, client, entry in items:
            entry[0] = True
            if not touched or touched[-1] is not client:
                touched.append(client)
        for client in touched:
            client.advance()

    def _fail(self, items, text):
        for _, client, entry in items:
            entry[0] = True
            entry[1] = (lambda client=client, rid=entry[2]: client.send(codec.encode_error(text, rid)))
        for client in {c for _, c, _ in items}:
            client.advance()

    # ---------------------------------------------------------------------------------- lifecycle

    def forget(self, client, reason):
        """Drop ``client`` with its subscriptions (DISCONNECT, expiry, gone, admin)."""
        if client.gone:
            return
        client.gone = True
        if reason:
            log.info("zmq: forgetting client %s: %s", client.peer, reason)
        for sub in client.subs.values():
            self._drop_sub(sub)
        client.subs.clear()
        client.outbox.clear()
        self.blocked.discard(client)
        if self.clients.get(client.identity) is client:
            del self.clients[client.identity]
        self.broker.unregister(client)

    def _arm(self, client):
        if client.ttl is None:
            return
        when = min(client.last_send + client.ttl * NOOP_FACTOR, client.last_recv + client.ttl * EXPIRE_FACTOR)
        if client.timer_at is not None and client.timer_at <= when:
            return
        client.timer_at = when
        self._seq += 1
        heapq.heappush(self._heap, (when, self._seq, client))

    def tick(self, now=None):
        """Fire due TTL timers, retry blocked clients, wake waiting subscriptions, sweep idle clients."""
        self.now = now = self.broker.clock() if now is None else now
        heap = self._heap
        while heap and heap[0][0] <= now:
            when, _, client = heapq.heappop(heap)
            if client.gone or client.timer_at != when or client.ttl is None:
                continue
            client.timer_at = None
            ttl = client.ttl
            if now >= client.last_recv + ttl * EXPIRE_FACTOR:
                self.forget(client, f"silent for over {EXPIRE_FACTOR} x TTL")
                continue
            if now >= client.last_send + ttl * NOOP_FACTOR:
                client.send(codec.FRAMES_NOOP)
                client.last_send = now    # even when held: the peer is not reading anyway
            self._arm(client)
        for client in list(self.blocked):
            if client.gone:
                self.blocked.discard(client)
            elif client.retry():
                self.blocked.discard(client)
        if now >= self._next_idle_sweep:
            self._next_idle_sweep = now + IDLE_FORGET / 4
            for client in list(self.clients.values()):
                if client.idle and now - max(client.last_recv, client.last_send) > IDLE_FORGET:
                    self.forget(client, None)

    def close(self):
        """Forget every client (the listener is stopping)."""
        for client in list(self.clients.values()):
            self.forget(client, None)
