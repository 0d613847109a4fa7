"""mc0 sessions, sans-I/O: one :class:`McSession` per routing identity, made on its first message by
the :class:`McShell` of its ROUTER, which holds what the listener's sessions share (the PUT batches of a
loop turn, waiting subscriptions, TTL timers, ZAP's peers). Nothing here touches a socket, a loop or
LMDB: sessions write through their :class:`PeerIO` and reach the log through the broker layer.

The ROUTER's ``io`` (the server, or a fake in unit tests)::

    io.send(identity, frames) -> SENT | BLOCKED | GONE   # BLOCKED: the peer's pipe is at its HWM;
                                                          # GONE: no such peer (it disconnected)
    io.defer(fn)                                          # run fn() soon on the loop

and a session's, one :class:`PeerIO` per identity over it: ``write(frames) -> sent``, where BLOCKED is
the session's ``pause_writing()`` (resumed by the listener's tick: ``resume_writing()``) and GONE its
``connection_lost()``. A session's requests dispatch through :data:`COMMANDS` (verb -> ``_on_<verb>``
handler and lowest :class:`State`).

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
from riverbed.engine.errors import RiverbedError, StorageFull
from riverbed.shells import auth as _auth
from riverbed.shells.broker import CONFIGURE, READ, WRITE, MODE_CREDIT
from riverbed.shells.broker.subscription import Subscription as BrokerSubscription
from riverbed.shells.broker import limits as _limits
from riverbed.shells.broker.session import SessionKernel, State, commands
from riverbed.shells.zmq_mc0 import codec
from riverbed.shells.zmq_mc0.codec import (
    HDR_OFFSET, HDR_TOPIC, HDR_TTL, RequestError, VERB_CONNECT, VERB_DISCONNECT, VERB_NOOP, VERB_PUT, VERB_SUB,
    VERB_UNSUB,
)
from riverbed.shells.protocols import ZMQ

log = logging.getLogger("riverbed.zmq")
LISTENER = ZMQ   # the one name (protocols.py): the listener label of riverbed_rejected_total

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


class Subscription(BrokerSubscription):
    """One (client, topic) subscription (the broker's one :class:`~riverbed.shells.broker.subscription.
    Subscription`; its stream is the topic's): a Tail once the stream exists, else waiting.
    ``start``: the offset a waiting subscription starts at once its stream appears. ``held``: the rest
    of a record batch the peer could not take, as ``[(offset, raw) iterator, the pair not yet sent]``,
    dropped with the tail."""

    __slots__ = ("topic", "held")

    def __init__(self, client, topic, name, start):
        super().__init__(client, name, start)
        self.topic = topic          # bytes, as the client sent it
        self.held = None

    @property
    def client(self):
        return self.session

    @property
    def name(self):
        """The stream (str)."""
        return self.stream

    def stop_tail(self):
        super().stop_tail()
        self.held = None


class PeerIO:
    """The io of one routing identity over the ROUTER's io (``router.send(identity, frames) -> SENT |
    BLOCKED | GONE``, ``router.defer(fn)``): a message goes to that identity; a full pipe is the
    session's :meth:`~McSession.pause_writing`, a peer that is gone its :meth:`~McSession.connection_lost`.
    ZeroMQ owns the peer's TCP connection, so there is nothing to close, and a ROUTER cannot stop
    reading one peer: reading is paused for the whole ROUTER by the listener (the broker's budget)."""

    __slots__ = ("router", "identity", "session")

    def __init__(self, router, identity):
        self.router = router
        self.identity = identity
        self.session = None

    def write(self, frames):
        """Send one message (a list of frames); True when sent. BLOCKED pauses the session's writing,
        GONE ends the session; both return False."""
        status = self.router.send(self.identity, frames)
        if status == SENT:
            return True
        session = self.session
        if status == BLOCKED:
            session.pause_writing()
        else:
            session.shell.forget(session, "no route to the peer")
        return False

    def writelines(self, messages):
        for frames in messages:
            if not self.write(frames):
                return

    def defer(self, fn, *args):
        self.router.defer(fn, *args)

    def close(self, *args):
        """Nothing to close: the peer may send again, and then it is a new session."""

    def abort(self, internal=False):
        """Forget the session (a bug in it, caught by the kernel's guard)."""
        self.session.shell.forget(self.session, "internal error" if internal else "aborted")

    def pause_reading(self):
        """Per peer a no-op (see the class doc)."""

    def resume_reading(self):
        """Per peer a no-op."""


class McSession(SessionKernel):
    """The session of one routing identity on the session kernel: its requests in order, its
    subscriptions, its replies and flow (:class:`PeerIO`). ZAP admitted the peer before its first
    message, so a session starts OPEN; it is CLOSED once forgotten (DISCONNECT, TTL expiry, peer gone,
    admin close, idle). The TTL is the kernel's heartbeat (NOOP after ``NOOP_FACTOR`` x TTL without
    output) and idle timeout (``EXPIRE_FACTOR`` x TTL without input), ticked when the shell's timer heap
    says so."""

    LISTENER = LISTENER
    PROTOCOL = LISTENER     # the management API's protocol: the same one name
    INITIAL_STATE = State.OPEN

    def __init__(self, shell, identity, now):
        io = PeerIO(shell.io, identity)
        super().__init__(shell, io, peer=shell.peer_of(identity) or identity.hex())
        io.session = self
        self.identity = identity
        self.ttl = None               # seconds, or None: never expires, no NOOPs
        self.subs = {}                # topic bytes -> Subscription
        self.queue = deque()          # [done, fn] entries: the client's requests in order
        self.outbox = deque()         # replies waiting while blocked
        self.blocked = False          # the peer's pipe is full (writing paused)
        self.last_recv = now
        self.last_sent = now
        self.timer_at = None          # when this client's heap entry fires
        self.user = shell.user_for(identity)
        self.messages_in = 0
        self.messages_out = 0

    @property
    def gone(self):
        return self.state == State.CLOSED

    @property
    def pending_ops(self):
        """PUTs of this client not committed (or failed) yet: the shutdown drain waits for them."""
        return sum(1 for entry in self.queue if not entry[0])

    # ------------------------------------------------------------------------------- kernel hooks

    def _send(self, frames):
        self.send(frames)
        self.last_sent = self.shell.now    # even when held: the peer is not reading anyway

    def _heartbeat_interval(self):
        return self.ttl * NOOP_FACTOR if self.ttl else None

    def _heartbeat_frame(self):
        return codec.FRAMES_NOOP

    def _idle_timeout(self):
        return self.ttl * EXPIRE_FACTOR if self.ttl else None

    def _tails(self):
        return [sub.tail for sub in self.subs.values() if sub.tail is not None]

    def _backlogged(self):
        return False      # a ROUTER is paused as a whole (PeerIO)

    def _drained(self):
        return True

    def _on_shutdown(self):
        self.shell.flush()          # the turn's gathered PUTs go to the engine before the drain

    def _before_close(self):
        if self.blocked:
            self.resume_writing()   # what is held still goes out if the pipe took it meanwhile

    def _drop_all(self):
        self.shell.dropped(self)

    # ------------------------------------------------------------------------------- management

    def consumer_infos(self):
        """This client's topic subscriptions (see the RabbitMQ Stream session's): the subscription id is
        the topic; the offset is the tail's, or where it will start while it waits for the stream; no
        credits. Loop-thread only."""
        out = []
        for sub in list(self.subs.values()):
            offset = sub.tail.offset if sub.tail is not None else sub.start
            if offset is not None:
                out.append(self._consumer_info(sub.name, sub.topic.decode("utf-8", "replace"), offset))
        return out

    @property
    def name(self):
        """A ZeroMQ peer is known by its routing identity."""
        return f"zmq {self.identity.hex()}"

    def connection_info(self):
        host, port = self.shell.address_of(self.identity)
        return {
            "name": self.name,
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
        if self.io.write(frames):
            self.last_sent = self.shell.now
            self.messages_out += 1
            return True
        if hold and self.blocked:
            self.outbox.append(frames)
        return False

    def pause_writing(self):
        """The peer's pipe is full: its tails pause and replies wait in the outbox until
        :meth:`resume_writing` (the listener's tick retries)."""
        if not self.blocked:
            self.blocked = True
            self.shell.blocked.add(self)
            super().pause_writing()

    def resume_writing(self):
        """Flush what is held; resume the tails once everything went. Returns True when unblocked."""
        while self.outbox:
            if not self._transmit(self.outbox[0], False):
                return False
            self.outbox.popleft()
        for sub in list(self.subs.values()):
            if sub.held is not None and not self.deliver_held(sub):
                return False
            if self.gone:
                return False
        self.blocked = self._write_paused = False
        for sub in list(self.subs.values()):
            if sub.tail is not None:
                sub.tail.resume()
            if self.blocked or self.gone:
                return False
        return True

    def deliver_held(self, sub):
        """Send what is left of ``sub``'s current chunk; False (and the client blocked) when the peer's
        pipe is full."""
        held = sub.held
        pairs, pending = held
        topic = sub.topic
        write = self.io.write
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
            if write(frames):
                pending = None
                self.messages_out += 1
                continue
            held[1] = pending
            return False
        sub.held = None
        self.last_sent = self.shell.now
        return True

    # ------------------------------------------------------------------------------ request order

    def _received(self, frames):
        """One message from the peer (the frames after the routing identity; the kernel's input hook):
        parsed, then dispatched through :data:`COMMANDS` in the client's order (PUTs at once, into the
        turn's batch; the rest wait behind uncommitted PUTs). A message that does not parse is answered
        with ERROR, in order."""
        try:
            req = self.shell.parse(frames)
        except RequestError as e:
            reply = codec.encode_error(e.text, e.id)   # built now: ``e`` does not outlive the handler
            self.in_order(lambda: self.send(reply))
            return
        self.request(req)

    def request(self, req):
        """Dispatch a parsed request (see :meth:`_received`)."""
        self.messages_in += 1
        if req.verb == VERB_PUT:
            self._on_put(req)
        elif req.verb != VERB_SUB or not self._copy_first(req):
            self.in_order_run(req)

    def _copy_first(self, req):
        """A SUB on a cluster node holding no copy of a topic's stream: the node makes the copies from
        their leaders first (remote_read.py), and the SUB takes its turn once they are ready. A SUB from
        the next message on a node that does not lead the stream waits until its copy holds what the
        leader has committed (Broker.catch_up), so it starts at the committed end as the leader knows it.
        False when neither is needed (the SUB runs as usual, at once: always on a lone node)."""
        names, behind = [], []
        from_next = self.broker.cluster is not None and req.header(HDR_OFFSET) is None
        for topic in req.body:
            try:
                name = codec.topic_name(topic)
            except ValueError:
                continue         # the SUB itself refuses it
            if self.broker.needs_copy(name):
                names.append(name)
            elif from_next and self.broker.has_stream(name) and self.broker.cluster.check_write(name) is not None:
                behind.append(name)      # a member or an observer: NEXT as the leader knows it
        if not names and not behind:
            return False
        entry = [False, lambda: self._run(req)]
        self.queue.append(entry)
        left = [len(names) + len(behind)]

        def ready(exc=None):
            left[0] -= 1
            if left[0] == 0:
                entry[0] = True
                self.advance()
        for name in names:
            # not _later: the entry counts in this session's pending_ops until it has run
            self.broker.when_readable(name, ready)
        for name in behind:
            self.broker.catch_up(name, ready)
        return True

    def in_order(self, fn):
        """Run ``fn()`` once every earlier request of this client has been answered."""
        if self.queue:
            self.queue.append([True, fn])
        else:
            fn()

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

    def _run(self, req):
        if self.gone:    # queued behind a DISCONNECT: the identity speaks again, as a new session
            self.shell.session_for(self.identity).in_order_run(req)
            return
        command = COMMANDS[req.verb]
        if self.state < command.min_state:
            self.send(codec.encode_error(f"{command.name} refused: the connection is closing", req.id))
            return
        try:
            started = command.handler(self, req)
        except RequestError as e:
            self.send(codec.encode_error(e.text, e.id if e.id is not None else req.id))
            return
        except (ValueError, TypeError, LookupError, OverflowError, RiverbedError) as e:
            # a value the request checks let through: this request's ERROR, not the listener's guard
            _limits.reject(LISTENER, "field", repr(e), self.identity.hex())
            self.send(codec.encode_error(f"request failed: {e}", req.id))
            return
        if self.gone:     # DISCONNECT: answered without state
            return
        if req.id is not None:
            self.send(codec.encode_ok(req.id))
        for sub in started or ():   # after the OK: replayed messages follow it
            if sub.tail is not None and self.subs.get(sub.topic) is sub:
                sub.tail.start()

    def in_order_run(self, req):
        """Run request ``req`` (not a PUT) once every earlier one of this client has been answered."""
        if self.queue:
            self.queue.append([True, lambda: self._run(req)])
        else:
            self._run(req)

    # ---------------------------------------------------------------------------------- commands

    @staticmethod
    def _parsed_header(req, name, parse):
        """Header ``name`` of ``req`` through ``parse`` (None when absent); RequestError naming it when
        ``parse`` refuses the value."""
        raw = req.header(name)
        if raw is None:
            return None
        try:
            return parse(raw)
        except ValueError as e:
            raise RequestError(f"bad {name.decode()} {codec.shown(raw)!r}: {e}", req.id) from None

    def _on_noop(self, req):
        return ()

    def _on_connect(self, req):
        ms = self._parsed_header(req, HDR_TTL, codec.parse_ms)
        if ms is not None:
            self.ttl = ms / 1000.0
            self.shell.arm(self)
        return ()

    def _on_disconnect(self, req):
        self.shell.forget(self, None)
        if req.id is not None:   # the client is forgotten; this reply creates no state
            self.shell.io.send(self.identity, codec.encode_ok(req.id))
        return ()

    def _on_unsub(self, req):
        for topic in req.body:
            sub = self.subs.pop(topic, None)
            if sub is not None:
                self.shell.drop_sub(sub)
        return ()

    def _on_sub(self, req):
        shell, broker = self.shell, self.broker
        start = self._parsed_header(req, HDR_OFFSET, codec.parse_offset)
        names, started = [], []
        for topic in req.body:
            try:
                name = codec.topic_name(topic)
            except ValueError as e:
                raise RequestError(f"bad topic {codec.shown(topic)!r}: {e}", req.id) from None
            if not broker.allowed(self.user, READ, name):
                raise RequestError(f"access to topic {name!r} refused", req.id)
            names.append((topic, name))
        for topic, name in names:
            sub = self.subs.get(topic)
            if sub is not None:
                if start is None:
                    continue        # already live: a repeated SUB changes nothing
                shell.drop_sub(sub)
            sub = self.subs[topic] = Subscription(self, topic, name, start)
            if broker.has_stream(name):
                if start is None:
                    try:
                        start = broker.resolve(name, OffsetSpec.next())
                    except RiverbedError:
                        start = 0
                    shell.start_tail(sub, start, False)
                    start = None
                else:
                    shell.start_tail(sub, start, False)
                started.append(sub)
            else:
                shell.to_waiting(sub, start or 0)
        return started

    def _on_put(self, req):
        """A PUT joins this loop turn's batch of its topic (:meth:`McShell.flush`); its reply, and every
        later request of this client, waits for its commit."""
        rid = req.id
        entry = [False, None, rid]     # done, what to run at its turn, the request's ID
        self.queue.append(entry)
        try:
            topic = req.header(HDR_TOPIC)
            if topic is None:
                raise RequestError("PUT without a TOPIC header", rid)
            try:
                name = codec.topic_name(topic)
            except ValueError as e:
                raise RequestError(f"bad topic {codec.shown(topic)!r}: {e}", rid) from None
            if not self.broker.allowed(self.user, WRITE, name):
                raise RequestError(f"access to topic {name!r} refused", rid)
            record = codec.put_record(req.headers, req.body)
        except RequestError as e:
            entry[0] = True
            reply = codec.encode_error(e.text, e.id)
            entry[1] = lambda: self.send(reply)
            self.advance()
            return
        except (ValueError, TypeError) as e:
            entry[0] = True
            reply = codec.encode_error(f"cannot store the message: {e}", rid)
            entry[1] = lambda: self.send(reply)
            self.advance()
            return
        if rid is not None:
            entry[1] = lambda: self.send(codec.encode_ok(rid))
        self.shell.batch(name, record, self, entry)


McClient = McSession     # the name of issue 10's code


# verb -> Command(handler _on_<verb>, lowest state, name): the mc0 session's dispatch table
COMMANDS = commands(McSession, {
    VERB_CONNECT: ("CONNECT", State.OPEN),
    VERB_DISCONNECT: ("DISCONNECT", State.OPEN),
    VERB_SUB: ("SUB", State.OPEN),
    VERB_UNSUB: ("UNSUB", State.OPEN),
    VERB_PUT: ("PUT", State.OPEN),
    VERB_NOOP: ("NOOP", State.OPEN),
})


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
        session = self.clients.get(identity)
        reply = codec.encode_error(text, None)
        if session is not None:
            session.last_recv = self.broker.clock()
            session.in_order(lambda: session.send(reply))
        else:
            self.io.send(identity, reply)

    def parse(self, frames):
        """The Request of one message; RequestError for one over ``max_request`` or malformed."""
        if sum(map(len, frames)) > self.max_request:
            raise RequestError(f"message too large (over {self.max_request} bytes)")
        return codec.parse_request(frames)

    def handle(self, identity, frames):
        """One message from ``identity`` (the frames after the routing identity), handed to that
        identity's session. A first message that does not parse is answered without making one."""
        self.now = now = self.broker.clock()
        session = self.clients.get(identity)
        if session is not None:
            session.guard(session.data_received, frames)      # the kernel's entry point
            return
        try:
            req = self.parse(frames)
        except RequestError as e:   # no state for a client whose first message is garbage
            self.io.send(identity, codec.encode_error(e.text, e.id))
            return
        session = self.session_for(identity)
        session.last_recv = now
        session.request(req)

    def session_for(self, identity):
        """The session of ``identity``, made when there is none."""
        session = self.clients.get(identity)
        if session is None:
            session = self.clients[identity] = McSession(self, identity, self.now)
        return session

    def drop_sub(self, sub):
        sub.close()
        w = self.waiting.get(sub.name)
        if w is not None:
            w.discard(sub)
            if not w:
                del self.waiting[sub.name]

    def to_waiting(self, sub, start):
        """``sub``'s stream is missing (never created, or deleted): wait for it, then start at ``start``."""
        sub.stop_tail()
        sub.start = start
        self.waiting.setdefault(sub.name, set()).add(sub)

    def _wake_waiting(self, name):
        subs = self.waiting.pop(name, None)
        if not subs:
            return
        for sub in subs:
            if not sub.client.gone and sub.client.subs.get(sub.topic) is sub:
                self.start_tail(sub, sub.start or 0)

    def start_tail(self, sub, offset, start=True):
        client = sub.client

        def on_records(tail, batch):
            sub.held = [iter(batch), None]
            client.deliver_held(sub)
            return 0

        def on_gone(exc):
            if not client.gone and client.subs.get(sub.topic) is sub:
                self.to_waiting(sub, 0)

        sub.open_tail(on_records, offset=offset, defer=self.io.defer, on_gone=on_gone, mode=MODE_CREDIT,
                      credit=UNLIMITED, records=True)
        sub.begin(deliver=start)

    def batch(self, name, record, session, entry):
        """Add a PUT's record to this loop turn's batch of stream ``name``; ``entry`` is its place in the
        session's queue, marked done once committed (or failed)."""
        self._batches.setdefault(name, []).append((record, session, entry))
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self.io.defer(self.flush)

    def flush(self):
        """Submit the PUTs of this loop turn: one append per topic (split at BATCH_RECORDS/BATCH_BYTES);
        a missing topic is created first (``broker.append_or_create``) when the turn's first publisher
        to it may configure it."""
        self._flush_scheduled = False
        batches, self._batches = self._batches, {}
        for name, items in batches.items():
            missing = not self.broker.has_stream(name)
            if missing and not self.broker.creating(name) and \
                    not self.broker.allowed(items[0][1].user, CONFIGURE, name):
                self._fail(items, f"creating topic {name!r} refused")
                continue
            self._append(name, items, missing)

    def _append(self, name, items, missing):
        start, size = 0, 0
        for i, (record, _, _) in enumerate(items):
            size += len(record)
            if i + 1 - start >= BATCH_RECORDS or size >= BATCH_BYTES or i + 1 == len(items):
                part = items[start:i + 1]
                self.pending_ops += 1
                self.broker.append_or_create(name, [r for r, _, _ in part],
                                             lambda res, exc, part=part: self._appended(name, part, exc, missing))
                start, size = i + 1, 0

    def _appended(self, name, items, exc, missing=False):
        self.pending_ops -= 1
        if exc is not None:
            if missing and not self.broker.has_stream(name):     # the creation failed
                self._fail(items, f"cannot create topic {name!r}: {exc}")
                return
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
        """Drop ``client`` with its subscriptions (DISCONNECT, expiry, gone, admin): the session is
        lost (the kernel's ``connection_lost``, which releases it: :meth:`dropped`)."""
        if client.gone:
            return
        if reason:
            log.info("zmq: forgetting client %s: %s", client.peer, reason)
        client.connection_lost()

    def dropped(self, client):
        """A session released (any way: forgotten, a TTL expiry, a close): its subscriptions and
        place go."""
        for sub in client.subs.values():
            self.drop_sub(sub)
        client.subs.clear()
        client.outbox.clear()
        self.blocked.discard(client)
        if self.clients.get(client.identity) is client:
            del self.clients[client.identity]

    def arm(self, client):
        if client.ttl is None:
            return
        when = min(client.last_sent + client.ttl * NOOP_FACTOR, client.last_recv + client.ttl * EXPIRE_FACTOR)
        if client.timer_at is not None and client.timer_at <= when:
            return
        client.timer_at = when
        self._seq += 1
        heapq.heappush(self._heap, (when, self._seq, client))

    def tick(self, now=None):
        """Fire due TTL timers, retry blocked clients, wake waiting subscriptions, sweep idle clients."""
        self.now = now = self.broker.clock() if now is None else now
        heap = self._heap
        due = []
        while heap and heap[0][0] <= now:
            when, _, client = heapq.heappop(heap)
            if client.gone or client.timer_at != when or client.ttl is None:
                continue
            client.timer_at = None
            client.guard(client.tick, now)        # the kernel's: TTL expiry, then the NOOP heartbeat
            due.append(client)
        for client in due:      # re-armed after the loop: a timer due now fires again next tick, not now
            if not client.gone:
                self.arm(client)
        for client in list(self.blocked):
            if client.gone:
                self.blocked.discard(client)
            elif client.resume_writing():
                self.blocked.discard(client)
        if now >= self._next_idle_sweep:
            self._next_idle_sweep = now + IDLE_FORGET / 4
            for client in list(self.clients.values()):
                if client.idle and now - max(client.last_recv, client.last_sent) > IDLE_FORGET:
                    self.forget(client, None)

    def close(self):
        """Forget every client (the listener is stopping)."""
        for client in list(self.clients.values()):
            self.forget(client, None)
