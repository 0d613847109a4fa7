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

A session is a :class:`~riverbed.shells.broker.session.SessionKernel` (states, lifecycle, flow, drain)
and talks to the transport through the kernel's io contract:

* ``io.write(data)`` - bytes holding complete WebSocket frames (see ``codec.ws_text_frame``);
* ``io.close(code, reason)`` - close the WebSocket (a close frame, then the socket);
* ``io.abort(reason)`` - drop the connection at once (a peer that does not read);
* ``io.defer(fn)`` / ``io.call_later(seconds, fn)`` - run ``fn()`` on the loop soon / later;
* ``io.pause_reading()`` / ``io.resume_reading()`` - stop / restart taking client frames (a publisher
  faster than the log commits waits instead of queueing without limit);
* ``io.buffer_size()`` - bytes written and not yet sent: only the memory bound of live delivery
  (``send_buffer_max``: past it the peer is dropped); flow is the adapter's ``session.pause_writing()``
  / ``session.resume_writing()`` calls (resends wait in between).

Loop-thread only.
"""

import logging

from riverbed.engine import OffsetSpec
from riverbed.engine import record as _record
from riverbed.engine.errors import RiverbedError, StorageFull, StreamNotFound
from riverbed.shells.broker import CONFIGURE, MODE_WINDOW, READ, WRITE, Tail
from riverbed.shells.broker import limits as _limits
from riverbed.shells.broker.session import SessionKernel, State, commands
from riverbed.shells.ws_json import codec
from riverbed.shells.ws_json.codec import RequestError
from riverbed.shells.ws_json.partitions import log_streams, partition_for_key
from riverbed.shells.protocols import WS

log = logging.getLogger("riverbed.ws")
LISTENER = WS   # the one name (protocols.py): the listener label of riverbed_rejected_total

DEFAULT_SEND_BUFFER_MAX = 16 << 20   # bytes a connection may have unsent before it is dropped
RESEND_HIGH_WATER = 1 << 20          # unsent bytes past which the transport says pause_writing (resends wait)
RESEND_CHUNKS = 16                   # chunks one resend step reads before yielding to other work
MAX_IN_FLIGHT = 32                   # appends of one connection not yet committed before it stops reading

ST_OPEN, ST_CLOSING, ST_CLOSED = State.OPEN, State.CLOSING, State.CLOSED   # names of issue 10 (tests)


def batch_messages(batch, stop=None):
    """``(offset, timestamp_ms, json_text)`` of each record of a broker
    :class:`~riverbed.shells.broker.records.RecordBatch` up to offset ``stop`` (inclusive; None: to the
    end). The timestamp is the broker's one rule (the record's creation-time when it has one, else its
    chunk's); the text is the record rendered as JSON (``record.to_json_text``)."""
    render = _record.to_json_text
    return [(offset, ts, render(view)) for offset, ts, view in batch.records(stop)]


def read_messages(broker, log_stream, pos, hi, chunks=RESEND_CHUNKS):
    """One bounded step of a read of offsets ``pos..hi`` (inclusive) of ``log_stream``: at most ``chunks``
    stored chunks, through the broker's record reads. Returns ``(messages, next_pos)``:
    ``(offset, timestamp_ms, json_text)`` as :func:`batch_messages` gives them, and the offset the next
    step starts at; the read is over when no message came back and ``next_pos`` did not move, or
    ``next_pos > hi``. The one record walk of the resends and the REST reads.
    Raises RiverbedError from the broker's read."""
    out = []
    batches, pos = broker.read_records(log_stream, pos, chunks, hi + 1)
    for batch in batches:
        out += batch_messages(batch, hi)
    return out, pos


def previous_offset(offset):
    """The offset of the record before ``offset`` in its log stream (offsets are contiguous there), None
    for the first record."""
    return offset - 1 if offset > 0 else None


def authenticate(auth, key, peer_loopback):
    """The user a request acts as, the one rule of the WebSocket requests and the REST API: without a
    users file the implicit user (by ``peer_loopback``); else the user of API key ``key`` (None: no key
    given, the request acts as nobody and returns None). Raises RequestError(ERR_AUTH_FAILED) for a key
    that is wrong or, for a loopback-only user, used from another host."""
    if auth.open_to_loopback:
        return auth.implicit_user(peer_loopback)
    if key is None:
        return None
    user = auth.user_for_api_key(key)
    if user is None or (user.loopback_only and not peer_loopback):
        raise RequestError(codec.ERR_AUTH_FAILED)
    return user


def publish_target(broker, user, stream, pkey):
    """The log stream a publish of ``user`` to stream id ``stream`` (routed by ``pkey``, may be None)
    goes to, the one rule of the WebSocket and REST publishes. A missing one is fine when ``user`` may
    create it (configure permission; the append creates it: ``broker.append_or_create``); a missing
    partition of a super stream never is. Raises RequestError("Stream ... not found.") otherwise. The
    write permission is the caller's check (its denial text differs)."""
    logs = log_streams(broker, stream)
    log_stream = logs[partition_for_key(pkey, len(logs)) if pkey is not None else 0]
    if not broker.has_stream(log_stream) and (len(logs) > 1 or not broker.allowed(user, CONFIGURE, stream)):
        raise RequestError(f"Stream {stream} not found.")
    return log_stream


def publish_record(broker, json_text, ts, pkey):
    """The stored record of one published message: ``json_text`` with creation time ``ts`` (ms; None:
    now) and the ``pkey`` property when given."""
    return _record.from_json_text(json_text, broker.wall_clock() if ts is None else ts,
                                  {"pkey": pkey} if pkey is not None else None)


def publish_error(broker, stream, log_stream, exc, was_missing, count=None):
    """``(created, text)`` for a publish that ``broker.append_or_create`` failed: ``created`` when it was
    the creation that failed (``log_stream`` was missing at submission, ``was_missing``, and still is),
    and the client-facing text (``count``, when given, says how many messages were lost)."""
    if was_missing and not broker.has_stream(log_stream) and not isinstance(exc, StreamNotFound):
        lost = f" ({count} message(s) not published)" if count is not None else ""
        return True, f"Cannot create stream {stream}: {exc}{lost}"
    return False, f"Stream {log_stream} not found." if isinstance(exc, StreamNotFound) else f"Publish failed: {exc}"


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
    no_resend when nothing matches. Reads a few chunks per step and waits while the connection's
    writing is paused (the kernel's ``pause_writing``, until ``resume_writing``)."""

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
        broker = self.session.shell.broker
        # on a cluster node that does not lead the stream, NEXT waits until this node's copy holds what
        # its leader has committed (read-your-writes across nodes: Broker.resolve_after_writes)
        broker.resolve_after_writes(self.log_stream, OffsetSpec.next(), self._bounds)

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
        if self.done or s.state == State.CLOSED:
            self.done = True
            return
        if s._write_paused:        # the transport is over its high mark: on until it drains (_on_writable)
            s.paused_resends.add(self)
            return
        try:
            messages, pos = read_messages(s.shell.broker, self.log_stream, self.pos, self.hi)
        except RiverbedError:
            messages, pos = [], self.pos
        moved = pos != self.pos
        self.pos = pos
        out = []
        sub, prefix, min_ts = self.sub, self.prefix, self.min_ts
        for offset, ts, text in messages:
            if min_ts is not None and ts < min_ts:
                continue
            if not self.sent_any:
                self.sent_any = True
                out.append(codec.ws_text_frame(codec.encode_frame(
                    codec.TYPE_RESENDING, codec.stream_payload(self.stream_id, self.partition, sub))))
            msg = codec.encode_msg(prefix, ts, offset, previous_offset(offset), text)
            out.append(codec.ws_text_frame(codec.unicast_frame(msg, sub)))
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
        if s.state == State.CLOSED:
            return
        t = codec.TYPE_RESENT if self.sent_any else codec.TYPE_NO_RESEND
        s.send_frame(codec.encode_frame(t, codec.stream_payload(self.stream_id, self.partition, self.sub)))


class WsSession(SessionKernel):
    """One WebSocket connection speaking Streamr v28, on the session kernel (its states, lifecycle,
    flow and drain). ``io`` as in the module docstring; ``peer`` and ``local`` are (host, port);
    ``peer_loopback`` decides the implicit user without a users file."""

    LISTENER = LISTENER
    PROTOCOL = LISTENER     # the management API's protocol: the same one name
    INITIAL_STATE = State.OPEN          # the HTTP upgrade was the handshake; auth is per request
    PENDING_OPS_HIGH = MAX_IN_FLIGHT - 1     # appends in flight past which reading pauses ...
    PENDING_OPS_LOW = MAX_IN_FLIGHT - 1      # ... and under which it resumes

    def __init__(self, shell, io, *, peer=("", 0), local=("", 0), peer_loopback=False):
        super().__init__(shell, io, peer=f"{peer[0]}:{peer[1]}", local=tuple(local), remote=tuple(peer),
                         peer_loopback=peer_loopback)
        self.auth = self.broker.auth
        self.paused_resends = set()    # resends waiting for the transport to drain
        self.subscriptions = {}        # (stream id, partition) -> Fanout
        self.waiting = {}              # (stream id, partition) -> log stream: subscribed, the stream not there yet
        self.resends = set()
        self.last_user = None          # for connection_info
        self._outbox = {}              # log stream -> (stream id, [records]) waiting for the next flush
        self._flush_scheduled = False
        self._after_writes = []        # run once every publish accepted so far has committed
        self.published = 0

    # ------------------------------------------------------------------------------------- output

    def send_frame(self, text):
        """Write one server frame (JSON text)."""
        if self.state != State.CLOSED:
            self.io.write(codec.ws_text_frame(text))

    def send_error(self, payload):
        self.send_frame(codec.error_frame(payload))

    def deliver(self, data):
        """Live frames from a Fanout: written, then the send-buffer bound is checked."""
        if self.state == State.CLOSED:
            return
        self.io.write(data)
        if self.io.buffer_size() > self.shell.send_buffer_max:
            log.warning("%s: send buffer over %d bytes (the client does not read): dropping the connection",
                        self.peer, self.shell.send_buffer_max)
            self.io.abort("send buffer over its bound")
            self.connection_lost()

    # -------------------------------------------------------------------------------------- input

    def text_received(self, text):
        """One client text frame (str), through the kernel's entry point (ignored once closing)."""
        self.data_received(text)

    def _received(self, text):
        """One client message: parsed, dispatched through :data:`COMMANDS`. Every problem is answered
        with an error frame; the connection stays usable."""
        try:
            req = codec.parse_request(text)
            command = COMMANDS.get(req["type"])
            if command is None:
                raise RequestError(f"Unknown request type: {req['type']}")
            command.handler(self, req)
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
        user = authenticate(self.auth, req.get("authKey") or None, self.peer_loopback)
        if user is not None:
            self.last_user = user
            self.username = user.name
        return user

    def _require(self, req, what, stream, denied):
        user = self._user(req)
        if not self.broker.allowed(user, what, stream):
            raise RequestError(denied)
        return user

    # ----------------------------------------------------------------------------------- requests

    def _on_subscribe(self, req):
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
        if log_stream in self._outbox:
            self._flush()      # this connection's publishes first: they may be what creates the stream
        if self.broker.creating(log_stream):
            # a publish (this connection's or another's) is making it: once made, the subscription starts
            # at the next record, so it never gets back what was published before it subscribed
            self.broker.ensure_stream(log_stream, lambda exc: self._subscribe_ready(stream, p, log_stream, exc))
            return
        if self.broker.needs_copy(log_stream):
            # a cluster node holding no copy: it makes one from the leader first (remote_read.py)
            self.broker.when_readable(log_stream,
                                      self._later(lambda exc: self._subscribe_copied(stream, p, log_stream)))
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

    def _subscribe_copied(self, stream, p, log_stream):
        key = (stream, p)
        if key in self.subscriptions or key in self.waiting:
            return
        if self.broker.has_stream(log_stream):
            self._subscribe_ready(stream, p, log_stream, None)
            return
        self.waiting[key] = log_stream          # no copy could be made: it waits as for a missing stream
        self.send_frame(codec.encode_frame(codec.TYPE_SUBSCRIBED, codec.stream_payload(stream, p)))

    def _subscribe_ready(self, stream, p, log_stream, exc):
        if self.state == State.CLOSED:
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
            if self.state != State.CLOSED and self.subscriptions.get(key) is fan:
                self.send_frame(codec.encode_frame(codec.TYPE_SUBSCRIBED, codec.stream_payload(stream, p)))
        fan.add(self, ready)

    def _on_unsubscribe(self, req):
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

    def _on_publish(self, req):
        stream, msg, ts, pkey = codec.check_publish(req)
        user = self._require(req, WRITE, stream, f"Not authorized to publish to stream {stream}")
        log_stream = publish_target(self.broker, user, stream, pkey)
        rec = publish_record(self.broker, msg, ts, pkey)
        self._outbox.setdefault(log_stream, (stream, []))[1].append(rec)
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self.io.defer(self._flush)

    def _flush(self):
        """Append each stream's waiting records in one broker call (one commit, in publish order; a
        missing stream is created first, ``broker.append_or_create``)."""
        self._flush_scheduled = False
        outbox, self._outbox = self._outbox, {}
        for log_stream, (stream, records) in outbox.items():
            self.published += len(records)
            missing = not self.broker.has_stream(log_stream)
            # _later: counted in pending_ops (the drain, and reading pauses past PENDING_OPS_HIGH)
            self.broker.append_or_create(log_stream, records, self._later(
                lambda res, exc, s=stream, ls=log_stream, n=len(records), m=missing: self._appended(s, ls, n, exc, m)))
        if not self._read_paused:
            self._update_reading()
        if not self._budget_paused:
            self._hold_if_over_budget()

    def _appended(self, stream, log_stream, n, exc, was_missing=False):
        if self._after_writes and not self.unsettled:
            waiting, self._after_writes = self._after_writes, []
            for fn in waiting:
                fn()
        if exc is not None and self.state != State.CLOSED:
            if not isinstance(exc, StorageFull):   # a full disk is logged once, by the disk alarm
                log.info("%s: publishing %d message(s) to %r failed: %s", self.peer, n, log_stream, exc)
            self.send_error(publish_error(self.broker, stream, log_stream, exc, was_missing, n)[1])

    def _on_resend(self, req):
        stream = codec.request_stream(req)
        p = codec.request_partition(req)
        sub = req.get("sub", "")
        self._require(req, READ, stream, f"Not authorized to request resend from stream {stream} and partition {p}")
        variant = codec.resend_variant(req)
        if variant is not None and self.unsettled:
            # read-your-writes: a resend sees every publish this connection sent before it
            self._after_writes.append(lambda: self._resend_start(stream, p, sub, variant))
            return
        self._resend_start(stream, p, sub, variant)

    def _resend_start(self, stream, p, sub, variant, copied=False):
        if self.state == State.CLOSED:
            return
        logs = log_streams(self.broker, stream)
        if not copied and variant is not None and p < len(logs) and self.broker.needs_copy(logs[p]):
            # a cluster node holding no copy: it makes one from the leader first (remote_read.py)
            self.broker.when_readable(logs[p], self._later(
                lambda exc: self._resend_start(stream, p, sub, variant, True)))
            return
        if variant is None or p >= len(logs) or not self.broker.has_stream(logs[p]):
            self.send_frame(codec.encode_frame(codec.TYPE_NO_RESEND, codec.stream_payload(stream, p, sub)))
            return
        job = ResendJob(self, logs[p], stream, p, sub, variant)
        self.resends.add(job)
        job.start()

    # -------------------------------------------------------------------------------- broker side

    def subscription_gone(self, stream, partition):
        """The log stream behind a subscription was deleted: tell the client it is unsubscribed."""
        if self.subscriptions.pop((stream, partition), None) is not None and self.state != State.CLOSED:
            self.send_frame(codec.encode_frame(codec.TYPE_UNSUBSCRIBED, codec.stream_payload(stream, partition)))

    def stream_created(self, name):
        """The broker says log stream ``name`` now exists: subscriptions waiting for it start at its first
        record (everything in it was published after they subscribed)."""
        for key, log_stream in list(self.waiting.items()):
            if log_stream != name or self.state == State.CLOSED:
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
    def unsettled(self):
        """Publishes accepted and not yet committed: in flight (the kernel's ``pending_ops``) or still
        in this turn's outbox (read-your-writes waits for them)."""
        return self.pending_ops + sum(len(v[1]) for v in self._outbox.values())

    def _on_shutdown(self):
        """Stop taking requests; what was accepted is handed on now and still commits (the drain)."""
        if self.state == State.OPEN:
            self.state = State.CLOSING
        if self._outbox:
            self._flush()

    def _goodbye(self, reason):
        """A close frame (1001, going away), then the socket: the WebSocket's goodbye."""
        self.state = State.CLOSING
        self.io.close(1001, reason)

    def _tails(self):
        return ()       # live delivery is the shared Fanouts'; a slow reader is bounded in deliver()

    def _on_writable(self):
        waiting, self.paused_resends = self.paused_resends, set()
        for job in waiting:
            self.io.defer(job.step)

    def _drop_all(self):
        """The connection is gone: end subscriptions and resends."""
        for fan in self.subscriptions.values():
            fan.remove(self)
        self.subscriptions.clear()
        self.waiting.clear()
        for job in list(self.resends):
            job.done = True
        self.resends.clear()
        self.paused_resends.clear()

    def consumer_infos(self):
        """This connection's subscriptions (see the RabbitMQ Stream session's): the subscription id is
        the stream id, with ``#PARTITION`` for a partition other than 0; the offset is its fan-out's (one
        reader per stream-partition, shared by its subscribers); no credits (a byte window).
        Subscriptions whose start is not resolved yet are left out. Loop-thread only."""
        return [self._consumer_info(fan.log_stream, stream_id if not partition else f"{stream_id}#{partition}",
                                    fan.tail.offset)
                for (stream_id, partition), fan in list(self.subscriptions.items())
                if fan.ready and fan.tail is not None]

    def _info(self):
        return {"subscriptions": len(self.subscriptions) + len(self.waiting)}


# request type -> Command(handler _on_<type>, lowest state, name): the Streamr session's dispatch table
COMMANDS = commands(WsSession, {
    "subscribe": ("subscribe", State.OPEN),
    "unsubscribe": ("unsubscribe", State.OPEN),
    "publish": ("publish", State.OPEN),
    "resend": ("resend", State.OPEN),
})
