"""The Streamr v28 session: a sans-I/O state machine per WebSocket connection, and the listener-wide
fan-out of live messages.

* :class:`WsShell` - listener-wide: the broker, settings, one :class:`Fanout` per subscribed
  stream-partition, stream creation shared by concurrent requests.
* :class:`Fanout` - one broker :class:`~riverbed.shells.broker.Tail` per subscribed (stream id,
  partition), shared by every connection subscribed to it: each committed record is rendered, put in a
  v28 MSG, a broadcast frame and a WebSocket frame **once**, and the same bytes are written to every
  subscriber. A subscriber that does not read is dropped once its send buffer passes the bound
  (``send_buffer_max``), so one slow client never holds the others back nor grows memory without limit.
* :class:`WsSession` - requests (subscribe, unsubscribe, publish, resend), auth, publishing with
  auto-creation, resends (:class:`ResendJob`, paced by the connection's send buffer).

A session talks to the transport only through ``io``:

* ``io.write(data)`` - bytes holding complete WebSocket frames (see ``codec.ws_text_frame``);
* ``io.buffer_size()`` - bytes written and not yet sent;
* ``io.close(code, reason)`` - close the WebSocket (a close frame, then the socket);
* ``io.abort(reason)`` - drop the connection at once (a peer that does not read);
* ``io.defer(fn)`` / ``io.call_later(seconds, fn)`` - run ``fn()`` on the loop soon / later;
* ``io.pause_reading()`` / ``io.resume_reading()`` - stop / restart taking client frames (a publisher
  faster than the log commits waits instead of queueing without limit).

Loop-thread only.
"""

import logging

from riverbed.engine import OffsetSpec
from riverbed.engine import record as _record
from riverbed.engine.errors import RiverbedError, StorageFull, StreamNotFound
from riverbed.shells.broker import CONFIGURE, MODE_WINDOW, READ, WRITE, Tail
from riverbed.shells.broker import limits as _limits
from riverbed.shells.ws_json import codec
from riverbed.shells.ws_json.codec import RequestError
from riverbed.shells.ws_json.partitions import log_streams, partition_for_key

log = logging.getLogger("riverbed.ws")
LISTENER = "ws"

DEFAULT_SEND_BUFFER_MAX = 16 << 20   # bytes a connection may have unsent before it is dropped
RESEND_HIGH_WATER = 1 << 20          # a resend waits while more than this is unsent
RESEND_CHUNKS = 16                   # chunks one resend step reads before yielding to other work
RESEND_RETRY = 0.005                 # seconds between send-buffer checks of a waiting resend
MAX_IN_FLIGHT = 32                   # appends of one connection not yet committed before it stops reading

ST_OPEN, ST_CLOSING, ST_CLOSED = 0, 1, 2


def batch_messages(batch, stop=None):
    """``(offset, timestamp_ms, json_text)`` of each record of a broker
    :class:`~riverbed.shells.broker.records.RecordBatch` up to offset ``stop`` (inclusive; None: to the
    end). The timestamp is the broker's one rule (the record's creation-time when it has one, else its
    chunk's); the text is the record rendered as JSON (``record.to_json_text``)."""
    render = _record.to_json_text
    return [(offset, ts, render(view)) for offset, ts, view in batch.records(stop)]


def previous_offset(offset):
    """The offset of the record before ``offset`` in its log stream (offsets are contiguous there), None
    for the first record."""
    return offset - 1 if offset > 0 else None


class WsShell:
    """State shared by one listener's sessions. ``defer(fn)`` runs ``fn()`` on the loop soon."""

    def __init__(self, broker, *, defer, send_buffer_max=DEFAULT_SEND_BUFFER_MAX):
        self.broker = broker
        self.defer = defer
        self.send_buffer_max = send_buffer_max
        self.fanouts = {}        # (stream id, partition) -> Fanout

    def fanout(self, stream_id, partition, log_stream, from_first=False):
        """The Fanout of a stream-partition, made when missing; a new one starts at the next record, or
        at the first with ``from_first`` (a stream created after its subscribers subscribed: all of it is
        new to them)."""
        key = (stream_id, partition)
        f = self.fanouts.get(key)
        if f is None or f.log_stream != log_stream:
            f = self.fanouts[key] = Fanout(self, stream_id, partition, log_stream, from_first)
        return f

    def ensure_stream(self, name, cb):
        """``cb(exc)`` once the log stream ``name`` exists (created with default arguments if missing;
        concurrent callers share one creation; a stream created meanwhile by anyone counts)."""
        self.broker.ensure_stream(name, cb)


class Fanout:
    """Live delivery of one stream-partition to every connection subscribed to it (see module doc)."""

    def __init__(self, shell, stream_id, partition, log_stream, from_first=False):
        self.shell = shell
        self.from_first = from_first
        self.stream_id = stream_id
        self.partition = partition
        self.log_stream = log_stream
        self.prefix = codec.msg_prefix(stream_id, partition)
        self.subscribers = {}      # session -> None, in subscription order
        self.tail = None
        self.ready = False         # the tail's start offset is known
        self._waiting = []         # callbacks run once ready

    def add(self, session, on_ready):
        """Subscribe ``session``; ``on_ready()`` once live delivery has a start position (every message
        the broker accepted before this call is before it)."""
        self.subscribers[session] = None
        if self.ready:
            on_ready()
            return
        self._waiting.append(on_ready)
        if self.tail is None:
            self.tail = Tail(self.shell.broker, self.log_stream, 0, self._on_records, defer=self.shell.defer,
                             on_gone=self._on_gone, mode=MODE_WINDOW, records=True)
            if self.from_first:
                self._started(0, None)
            else:
                self.shell.broker.resolve_after_writes(self.log_stream, OffsetSpec.next(), self._started)

    def _started(self, offset, exc):
        if self.tail is None or self.tail.closed:
            return
        if exc is not None:
            self._on_gone(exc)
            return
        self.ready = True
        self.tail.start(offset)
        waiting, self._waiting = self._waiting, []
        for fn in waiting:
            fn()

    def remove(self, session):
        self.subscribers.pop(session, None)
        if not self.subscribers:
            self.close()

    def close(self):
        if self.tail is not None:
            self.tail.close()
        if self.shell.fanouts.get((self.stream_id, self.partition)) is self:
            del self.shell.fanouts[(self.stream_id, self.partition)]

    def _on_records(self, tail, batch):
        prefix = self.prefix
        frames = []
        for offset, ts, text in batch_messages(batch):
            msg = codec.encode_msg(prefix, ts, offset, previous_offset(offset), text)
            frames.append(codec.ws_text_frame(codec.broadcast_frame(msg)))
        if frames:
            data = frames[0] if len(frames) == 1 else b"".join(frames)
            for s in list(self.subscribers):
                s.deliver(data)
        # No byte window: the tail runs at the pace of the log; each connection is bounded on its own
        # (WsSession.deliver drops it past send_buffer_max) so a slow one cannot hold the others back.
        return 0

    def _on_gone(self, exc):
        self.close()
        for s in list(self.subscribers):
            s.subscription_gone(self.stream_id, self.partition)
        self.subscribers.clear()


class ResendJob:
    """One resend request: resending, one unicast frame per message in offset order, resent; or only
    no_resend when nothing matches. Reads a few chunks per step and waits while the connection's send
    buffer is over :data:`RESEND_HIGH_WATER`."""

    def __init__(self, session, log_stream, stream_id, partition, sub, variant):
        self.session = session
        self.log_stream = log_stream
        self.stream_id = stream_id
        self.partition = partition
        self.sub = sub
        self.kind, self.a, self.b = variant
        self.prefix = codec.msg_prefix(stream_id, partition)
        self.pos = self.hi = 0
        self.min_ts = None
        self.sent_any = False
        self.done = False

    def start(self):
        self.session.shell.broker.resolve_after_writes(self.log_stream, OffsetSpec.next(), self._bounds)

    def _bounds(self, next_offset, exc):
        if exc is not None:
            self._finish()
            return
        try:
            first = self.session.shell.broker.resolve(self.log_stream, OffsetSpec.first())
        except RiverbedError:
            self._finish()
            return
        hi = next_offset - 1
        lo = first
        if self.kind == codec.RESEND_LAST:
            lo = max(first, next_offset - self.a)
        elif self.kind == codec.RESEND_RANGE:
            lo = max(first, self.a)
            if self.b is not None:
                hi = min(hi, self.b)
        elif self.kind == codec.RESEND_FROM_TIME:
            self.min_ts = self.a      # every message is checked: timestamps need not follow offsets
        self.pos, self.hi = lo, hi
        if lo > hi:
            self._finish()
        else:
            self.step()

    def step(self):
        s = self.session
        if self.done or s.state == ST_CLOSED:
            self.done = True
            return
        if s.io.buffer_size() > RESEND_HIGH_WATER:
            s.io.call_later(RESEND_RETRY, self.step)
            return
        try:
            batches, nxt = s.shell.broker.read_records(self.log_stream, self.pos, RESEND_CHUNKS, self.hi + 1)
        except RiverbedError:
            batches, nxt = [], self.pos
        out = []
        sub, prefix, min_ts = self.sub, self.prefix, self.min_ts
        for batch in batches:
            for offset, ts, text in batch_messages(batch, self.hi):
                if min_ts is not None and ts < min_ts:
                    continue
                if not self.sent_any:
                    self.sent_any = True
                    out.append(codec.ws_text_frame(codec.encode_frame(
                        codec.TYPE_RESENDING, codec.stream_payload(self.stream_id, self.partition, sub))))
                msg = codec.encode_msg(prefix, ts, offset, previous_offset(offset), text)
                out.append(codec.ws_text_frame(codec.unicast_frame(msg, sub)))
        moved = nxt != self.pos
        self.pos = nxt
        if out:
            s.io.write(b"".join(out))
        if not moved or self.pos > self.hi:
            self._finish()
        else:
            s.io.defer(self.step)

    def _finish(self):
        if self.done:
            return
        self.done = True
        s = self.session
        s.resends.discard(self)
        if s.state == ST_CLOSED:
            return
        t = codec.TYPE_RESENT if self.sent_any else codec.TYPE_NO_RESEND
        s.send_frame(codec.encode_frame(t, codec.stream_payload(self.stream_id, self.partition, self.sub)))


class WsSession:
    """One WebSocket connection speaking Streamr v28. ``io`` as in the module docstring; ``peer`` and
    ``local`` are (host, port); ``peer_loopback`` decides the implicit user without a users file."""

    def __init__(self, shell, io, *, peer=("", 0), local=("", 0), peer_loopback=False):
        self.shell = shell
        self.broker = shell.broker
        self.auth = self.broker.auth
        self.io = io
        self.peer = peer
        self.local = local
        self.peer_loopback = peer_loopback
        self.state = ST_OPEN
        self.connected_at = self.broker.wall_clock()
        self.subscriptions = {}        # (stream id, partition) -> Fanout
        self.waiting = {}              # (stream id, partition) -> log stream: subscribed, the stream not there yet
        self.resends = set()
        self.last_user = None          # for connection_info
        self._outbox = {}              # log stream -> [records] waiting for the next flush
        self._blocked = set()          # log streams being created: their records wait
        self._flush_scheduled = False
        self._in_flight = 0            # appends sent to the broker, not yet committed
        self._budget_paused = False    # reading paused by the broker-wide in-flight budget
        self._after_writes = []        # run once every publish accepted so far has committed
        self.published = 0
        self.broker.register(self)

    # ------------------------------------------------------------------------------------- output

    def send_frame(self, text):
        """Write one server frame (JSON text)."""
        if self.state != ST_CLOSED:
            self.io.write(codec.ws_text_frame(text))

    def send_error(self, payload):
        self.send_frame(codec.error_frame(payload))

    def deliver(self, data):
        """Live frames from a Fanout: written, then the send-buffer bound is checked."""
        if self.state == ST_CLOSED:
            return
        self.io.write(data)
        if self.io.buffer_size() > self.shell.send_buffer_max:
            log.warning("%s: send buffer over %d bytes (the client does not read): dropping the connection",
                        self.peer, self.shell.send_buffer_max)
            self.io.abort("send buffer over its bound")
            self.connection_lost()

    # -------------------------------------------------------------------------------------- input

    def text_received(self, text):
        """One client text frame (str). Every problem is answered with an error frame; the connection
        stays usable."""
        if self.state != ST_OPEN:
            return
        try:
            req = codec.parse_request(text)
            handler = self.HANDLERS.get(req["type"])
            if handler is None:
                raise RequestError(f"Unknown request type: {req['type']}")
            handler(self, req)
        except RequestError as e:
            if e.reason is not None:
                _limits.reject(LISTENER, e.reason, str(e)[:200], self.peer)
            self.send_error(e.payload)
        except RiverbedError as e:
            self.send_error(f"Request failed: {e}")
        except (TypeError, ValueError, LookupError, RecursionError) as e:
            # a value parse_request let through that a handler cannot take: still the request's error
            _limits.reject(LISTENER, "field", f"{e!r}: {text!r:.200}", self.peer)
            self.send_error(f"Invalid request: {type(e).__name__}")
        except Exception:      # a bug must cost this request only, not the connection or the process
            log.exception("%s: request failed: %.200r", self.peer, text)
            self.send_error("Internal error")

    def binary_received(self, data):
        """A binary frame: the protocol is text; try it as UTF-8 JSON, else answer with an error."""
        try:
            text = bytes(data).decode("utf-8")
        except UnicodeDecodeError:
            self.send_error(codec.ERR_NOT_A_REQUEST)
            return
        self.text_received(text)

    # --------------------------------------------------------------------------------------- auth

    def _user(self, req):
        """The user a request acts as, or None (no key given). Raises RequestError for a wrong key."""
        if self.auth.open_to_loopback:
            user = self.auth.implicit_user(self.peer_loopback)
        else:
            key = req.get("authKey")
            if key is None or key == "":
                return None
            user = self.auth.user_for_api_key(key)
            if user is None or (user.loopback_only and not self.peer_loopback):
                raise RequestError(codec.ERR_AUTH_FAILED)
        if user is not None:
            self.last_user = user
        return user

    def _require(self, req, what, stream, denied):
        user = self._user(req)
        if not self.broker.allowed(user, what, stream):
            raise RequestError(denied)
        return user

    # ----------------------------------------------------------------------------------- requests

    def _subscribe(self, req):
        stream = codec.request_stream(req)
        p = codec.request_partition(req)
        self._require(req, READ, stream, f"Not authorized to subscribe to stream {stream} and partition {p}")
        logs = log_streams(self.broker, stream)
        if p >= len(logs):
            raise RequestError(f"Stream {stream} has {len(logs)} partition(s): partition {p} does not exist")
        key = (stream, p)
        if key in self.subscriptions or key in self.waiting:
            self.send_frame(codec.encode_frame(codec.TYPE_SUBSCRIBED, codec.stream_payload(stream, p)))
            return
        log_stream = logs[p]
        if log_stream in self._blocked or self.broker.creating(log_stream):
            # a publish (this connection's or another's) is making it: once made, the subscription starts
            # at the next record, so it never gets back what was published before it subscribed
            self.shell.ensure_stream(log_stream, lambda exc: self._subscribe_ready(stream, p, log_stream, exc))
            return
        if not self.broker.has_stream(log_stream):
            if len(logs) > 1:
                raise RequestError(f"Stream {stream} not found.")
            # only publishes (and explicit creation) make streams, so a misspelled id creates nothing:
            # the subscription is in effect ("from the next published message") and waits for the stream
            # to be made by anyone; all of it is then new to this subscriber (stream_created)
            self.waiting[key] = log_stream
            self.send_frame(codec.encode_frame(codec.TYPE_SUBSCRIBED, codec.stream_payload(stream, p)))
            return
        self._subscribe_ready(stream, p, log_stream, None)

    def _subscribe_ready(self, stream, p, log_stream, exc):
        if self.state == ST_CLOSED:
            return
        if exc is not None:
            self.send_error(f"Stream {stream} not found." if isinstance(exc, StreamNotFound)
                            else f"Cannot subscribe to stream {stream}: {exc}")
            return
        key = (stream, p)
        if key in self.subscriptions:
            return
        if self._outbox:
            # this connection's own publishes go to the engine before the subscription's start is
            # resolved, so a subscriber never gets back what it published before subscribing
            self._flush()
        fan = self.shell.fanout(stream, p, log_stream)
        self.subscriptions[key] = fan

        def ready():
            if self.state != ST_CLOSED and self.subscriptions.get(key) is fan:
                self.send_frame(codec.encode_frame(codec.TYPE_SUBSCRIBED, codec.stream_payload(stream, p)))
        fan.add(self, ready)

    def _unsubscribe(self, req):
        stream = req.get("stream")
        try:
            p = codec.request_partition(req)
        except RequestError:
            p = None
        fan = self.subscriptions.pop((stream, p), None) if isinstance(stream, str) else None
        waited = self.waiting.pop((stream, p), None) if isinstance(stream, str) else None
        if fan is None and waited is None:
            raise RequestError({"error": codec.ERR_NOT_SUBSCRIBED, "request": req})
        if fan is not None:
            fan.remove(self)
        self.send_frame(codec.encode_frame(codec.TYPE_UNSUBSCRIBED, codec.stream_payload(stream, p)))

    def _publish(self, req):
        stream, msg, ts, pkey = codec.check_publish(req)
        user = self._require(req, WRITE, stream, f"Not authorized to publish to stream {stream}")
        logs = log_streams(self.broker, stream)
        log_stream = logs[partition_for_key(pkey, len(logs)) if pkey is not None else 0]
        rec = _record.from_json_text(msg, self.broker.wall_clock() if ts is None else ts,
                                     {"pkey": pkey} if pkey is not None else None)
        if log_stream not in self._blocked and not self.broker.has_stream(log_stream):
            if len(logs) > 1 or not self.broker.allowed(user, CONFIGURE, stream):
                raise RequestError(f"Stream {stream} not found.")
            self._blocked.add(log_stream)
            self.shell.ensure_stream(log_stream, lambda exc: self._created(stream, log_stream, exc))
        self._outbox.setdefault(log_stream, []).append(rec)
        if not self._flush_scheduled and log_stream not in self._blocked:
            self._flush_scheduled = True
            self.io.defer(self._flush)

    def _created(self, stream, log_stream, exc):
        self._blocked.discard(log_stream)
        if exc is not None:
            dropped = self._outbox.pop(log_stream, [])
            if self.state != ST_CLOSED:
                self.send_error(f"Cannot create stream {stream}: {exc} ({len(dropped)} message(s) not published)")
            self._in_flight += 1
            self._appended(log_stream, 0, None)     # release read-your-writes waiters
            return
        self._flush()

    def _flush(self):
        """Append each stream's waiting records in one broker call (one commit, in publish order)."""
        self._flush_scheduled = False
        for log_stream in list(self._outbox):
            if log_stream in self._blocked:
                continue
            records = self._outbox.pop(log_stream)
            self._in_flight += 1
            if self._in_flight == MAX_IN_FLIGHT:
                self.io.pause_reading()
            self.published += len(records)
            self.broker.append_records(log_stream, records,
                                       lambda res, exc, s=log_stream, n=len(records): self._appended(s, n, exc))
        if not self._budget_paused:
            self.broker.hold_if_over_budget(self, self._budget_pause, self._budget_resume)

    def _budget_pause(self):
        self._budget_paused = True
        self.io.pause_reading()

    def _budget_resume(self):
        self._budget_paused = False
        if self._in_flight < MAX_IN_FLIGHT:
            self.io.resume_reading()

    def _appended(self, log_stream, n, exc):
        self._in_flight -= 1
        if self._in_flight == MAX_IN_FLIGHT - 1 and not self._budget_paused:
            self.io.resume_reading()
        if self._after_writes and not self.pending_ops:
            waiting, self._after_writes = self._after_writes, []
            for fn in waiting:
                fn()
        if exc is not None and self.state != ST_CLOSED:
            if not isinstance(exc, StorageFull):   # a full disk is logged once, by the disk alarm
                log.info("%s: publishing %d message(s) to %r failed: %s", self.peer, n, log_stream, exc)
            self.send_error(f"Stream {log_stream} not found." if isinstance(exc, StreamNotFound)
                            else f"Publish failed: {exc}")

    def _resend(self, req):
        stream = codec.request_stream(req)
        p = codec.request_partition(req)
        sub = req.get("sub", "")
        self._require(req, READ, stream, f"Not authorized to request resend from stream {stream} and partition {p}")
        variant = codec.resend_variant(req)
        if variant is not None and self.pending_ops:
            # read-your-writes: a resend sees every publish this connection sent before it
            self._after_writes.append(lambda: self._resend_start(stream, p, sub, variant))
            return
        self._resend_start(stream, p, sub, variant)

    def _resend_start(self, stream, p, sub, variant):
        if self.state == ST_CLOSED:
            return
        logs = log_streams(self.broker, stream)
        if variant is None or p >= len(logs) or not self.broker.has_stream(logs[p]):
            self.send_frame(codec.encode_frame(codec.TYPE_NO_RESEND, codec.stream_payload(stream, p, sub)))
            return
        job = ResendJob(self, logs[p], stream, p, sub, variant)
        self.resends.add(job)
        job.start()

    HANDLERS = {"subscribe": _subscribe, "unsubscribe": _unsubscribe, "publish": _publish, "resend": _resend}

    # -------------------------------------------------------------------------------- broker side

    def subscription_gone(self, stream, partition):
        """The log stream behind a subscription was deleted: tell the client it is unsubscribed."""
        if self.subscriptions.pop((stream, partition), None) is not None and self.state != ST_CLOSED:
            self.send_frame(codec.encode_frame(codec.TYPE_UNSUBSCRIBED, codec.stream_payload(stream, partition)))

    def stream_created(self, name):
        """The broker says log stream ``name`` now exists: subscriptions waiting for it start at its first
        record (everything in it was published after they subscribed)."""
        for key, log_stream in list(self.waiting.items()):
            if log_stream != name or self.state == ST_CLOSED:
                continue
            del self.waiting[key]
            fan = self.shell.fanout(key[0], key[1], name, from_first=True)
            self.subscriptions[key] = fan
            fan.add(self, lambda: None)     # SUBSCRIBED went out when the client subscribed

    def stream_deleted(self, name):
        """A stream was deleted (any protocol): end the subscriptions reading it."""
        for key, fan in list(self.subscriptions.items()):
            if fan.log_stream == name:
                fan.remove(self)
                self.subscription_gone(*key)
        self._outbox.pop(name, None)

    # ---------------------------------------------------------------------------------- lifecycle

    @property
    def pending_ops(self):
        """Publishes accepted and not yet committed (graceful shutdown waits for them)."""
        return self._in_flight + sum(len(v) for v in self._outbox.values())

    def begin_shutdown(self):
        """Stop taking requests; what was accepted still commits."""
        if self.state == ST_OPEN:
            self.state = ST_CLOSING

    def close_gracefully(self, reason="server shutdown"):
        if self.state == ST_CLOSED:
            return
        self.state = ST_CLOSING
        self.io.close(1001, reason)

    def close_by_admin(self, reason="closed via management API"):
        log.info("%s: closing WebSocket connection: %s", self.peer, reason)
        self.close_gracefully(reason)

    def connection_lost(self):
        """The connection is gone: end subscriptions and resends. Idempotent."""
        if self.state == ST_CLOSED:
            return
        self.state = ST_CLOSED
        for fan in self.subscriptions.values():
            fan.remove(self)
        self.subscriptions.clear()
        self.waiting.clear()
        for job in list(self.resends):
            job.done = True
        self.resends.clear()
        self.broker.unregister(self)

    def consumer_infos(self):
        """This connection's subscriptions (see the RabbitMQ Stream session's): the subscription id is
        the stream id, with ``#PARTITION`` for a partition other than 0; the offset is its fan-out's (one
        reader per stream-partition, shared by its subscribers); no credits (a byte window).
        Subscriptions whose start is not resolved yet are left out. Loop-thread only."""
        name = f"{self.peer[0]}:{self.peer[1]} -> {self.local[0]}:{self.local[1]}"
        out = []
        for (stream_id, partition), fan in list(self.subscriptions.items()):
            if fan.ready and fan.tail is not None:
                out.append({"stream": fan.log_stream, "protocol": "ws", "connection": name,
                            "subscription_id": stream_id if not partition else f"{stream_id}#{partition}",
                            "reference": None, "offset": fan.tail.offset, "credits": None})
        return out

    def connection_info(self):
        user = self.last_user.name if self.last_user is not None else ""
        return {
            "name": f"{self.peer[0]}:{self.peer[1]} -> {self.local[0]}:{self.local[1]}", "protocol": "ws",
            "peer_host": self.peer[0], "peer_port": self.peer[1], "host": self.local[0], "port": self.local[1],
            "user": user, "client_properties": {}, "connected_at": self.connected_at,
            "state": {ST_OPEN: "running", ST_CLOSING: "closing"}.get(self.state, "closed"),
            "subscriptions": len(self.subscriptions) + len(self.waiting),
        }
