"""A RabbitMQ Stream connection as a sans-I/O state machine (the asyncpg ``coreproto`` role), on the
session kernel (:mod:`riverbed.shells.broker.session`), which owns the io contract, the states, the
lifecycle, heartbeats and flow control. Storage is reached only through the shared broker layer; the
RabbitMQ specifics shared by the connections of a listener (settings, single-active-consumer groups)
are in :class:`~riverbed.shells.rmq_stream.shell.RmqShell`. Publishing commands live in ``publish.py``,
consuming ones in ``consume.py``; this module has the framing, the handshake and stream administration
commands, the RabbitMQ error rendering and the dispatch table (:data:`COMMANDS`).

Behaviour where the protocol leaves a choice (each covered by tests/shells/test_rmq_session.py):

* Limits: 8 KiB frames until Open, then the negotiated frame_max, except Publish, which may be up to
  ``max_frame_size`` (limits.py; 64 MiB) with at most ``max_entries_per_frame`` messages. Over a cap:
  Close 0x0e, counted in ``riverbed_rejected_total``. Unknown key or version, or a body that does
  not parse: Close 0x0d. A command that needs authentication (or Open) before it: Close 0x10.
* Authentication failures: wrong credentials (0x08) and an unknown virtual host (Open 0x0c) are answered
  after ``auth_failure_delay`` (3 s) and the socket closes; 0x0b (loopback only) and 0x09 (SASL error)
  at once, then the socket closes; an unknown mechanism (0x07) leaves the connection open for another
  try. A re-authentication after Open that fails, changes the user (0x15) or the mechanism (0x14) ends
  the connection the same delayed way.
* How the broker ends a connection follows RabbitMQ (below): a Close frame only for a protocol error;
  a heartbeat timeout closes the socket without one, as RabbitMQ does (issue 19's contract).
* Flow control: a connection stops being read while ``max_pending_bytes`` (32 MiB) of its appends are
  uncommitted, while the broker-wide in-flight budget is exceeded, while 10,000
  of its engine operations are pending, or while its transport's write buffer is over 4 MiB (so a
  consumer that does not read, or a peer that does not read its replies, costs bounded memory).
* Delete and DeleteSuperStream are answered before the MetadataUpdate of the deleted streams goes out
  (rstream 0.20 closes a consumer's connection on the MetadataUpdate of its last stream).
* QueryOffset and QueryPublisherSequence wait for the broker's in-flight StoreOffset / appends of the
  same reference, so a client reads back what it just wrote.

What RabbitMQ sends when the broker ends a connection (read from ``deps/rabbitmq_stream/src/
rabbit_stream_reader.erl`` of rabbitmq-server, 4.3 line, and ``deps/rabbitmq_management/src/
rabbit_mgmt_wm_connection.erl``), which this module does the same way:

* Closed through the management API (``DELETE /api/connections/{name}``): ``force_close_connection/3``
  sends the reader ``{shutdown, Reason}``; ``open(info, {shutdown, _})`` returns ``stop``, and
  ``terminate/3`` -> ``close/3`` shuts the socket down for writing and closes it. **No Close frame**: the
  client sees the TCP connection end (the X-Reason is only logged). rabbitmq-stream-js-client cannot
  decode a server-initiated Close request at all; rstream and the JS client treat the socket closing as
  a lost connection and recover. Here: :meth:`close_by_admin` flushes what is queued and closes.
* Broker shutdown: the connection supervisor stops the reader (it traps exits), ``terminate/3`` ->
  ``close/3`` again: no Close frame. Here: :meth:`close_gracefully` (called by the listener once
  in-flight appends have confirmed) flushes and closes the socket.
* Heartbeat timeout: ``open(info, heartbeat_timeout)`` -> ``stop``: no frame (likewise the handshake
  ``state_timeout/3`` and an expired token). Here: :meth:`tick` closes the socket, without a frame; and a connection the
  broker owes answers (appends not yet confirmed: a publisher whose window is full sends nothing) or
  has stopped reading is never idle: its silence counts from when the broker is done with it.
* Authentication failure: ``handle_frame_pre_auth/4`` answers SaslAuthenticate 0x08 and moves to
  ``silent_close``; ``maybe_send_or_delay_frame/4`` holds the answer ``SILENT_CLOSE_DELAY`` (3,000 ms,
  since 4.1, "to protect from potential DoS attacks"), then sends it and stops. The same for Open with
  an unknown virtual host (0x0c) and for a refused re-authentication or a change of user or mechanism
  after Open. 0x0b (loopback only) and 0x09 (SASL error) go to the ``failure`` step: answered at once,
  then ``invalid_transition/4`` closes the socket. No Close frame on any of these.
* A stream deleted under a consumer or publisher: ``open(info, {'DOWN', ...})`` (the stream's member
  went away) and the Delete command (after its own response) send ``MetadataUpdate`` (0x10) with code
  0x06 (stream not available) for the stream, once per connection that used it; the connection stays
  open. Here: :meth:`stream_deleted`.
* Protocol errors are the only server-initiated ``Close``: an unknown command or a frame that does not
  parse (0x0d "unknown frame", ``send_close_and_increment/2``), a frame over the limit (0x0e); the
  reader then waits in ``close_sent`` for the CloseResponse (its negotiation-step timeout) and stops.
  Here: :meth:`_fatal` sends the Close and closes once the bytes are out.
"""

import logging

from riverbed.engine.errors import FrameTooLarge, StreamNotFound
from riverbed.shells import wire
from riverbed.shells.broker import CONFIGURE, READ
from riverbed.shells.broker.internal import is_internal
from riverbed.shells.broker import limits as _limits
from riverbed.shells.broker.session import SessionKernel, commands
from riverbed.shells.rmq_stream.codec import (
    _AUTH_CODES, _I32, _KEY_VERSION, _U32, NO_RESPONSE_KEYS, REFUSAL_BODIES, DecodeError, FieldError, Reader,
    enc_properties, enc_strings, encode_close,
    encode_command_versions, encode_heartbeat, encode_metadata_response, encode_metadata_update,
    encode_stream_stats, encode_tune, response, response_code_for,
)
from riverbed.shells.rmq_stream.constants import (
    CMD_CLOSE, CMD_CONSUMER_UPDATE, CMD_CREATE, CMD_CREATE_SUPER_STREAM, CMD_CREDIT,
    CMD_DECLARE_PUBLISHER, CMD_DELETE, CMD_DELETE_PUBLISHER, CMD_DELETE_SUPER_STREAM, CMD_DELIVER,
    CMD_EXCHANGE_COMMAND_VERSIONS, CMD_HEARTBEAT, CMD_METADATA, CMD_OPEN, CMD_PARTITIONS, CMD_PEER_PROPERTIES,
    CMD_PUBLISH, CMD_QUERY_OFFSET, CMD_QUERY_PUBLISHER_SEQUENCE, CMD_RESOLVE_OFFSET_SPEC, CMD_ROUTE,
    CMD_SASL_AUTHENTICATE, CMD_SASL_HANDSHAKE, CMD_STORE_OFFSET, CMD_STREAM_STATS, CMD_SUBSCRIBE, CMD_TUNE,
    CMD_UNSUBSCRIBE, INITIAL_FRAME_MAX, LEN_KEY_VERSION, LEN_PUBLISH_HEAD, LEN_SIZE,
    PENDING_OPS_HIGH, PENDING_OPS_LOW, RC_ACCESS_REFUSED, RC_AUTHENTICATION_FAILURE, RC_FRAME_TOO_LARGE, RC_OK,
    RC_PRECONDITION_FAILED, RC_SASL_CANNOT_CHANGE_MECHANISM, RC_SASL_CANNOT_CHANGE_USERNAME,
    RC_SASL_MECHANISM_NOT_SUPPORTED, RC_STREAM_ALREADY_EXISTS, RC_STREAM_DOES_NOT_EXIST,
    RC_STREAM_NOT_AVAILABLE, RC_UNKNOWN_FRAME, RC_VIRTUAL_HOST_ACCESS_FAILURE, RESPONSE,
    SAC_ACTIVE, SAC_NONE, SERVER_COMMAND_VERSIONS, ST_CLOSED, ST_CLOSING, ST_HANDSHAKE, ST_OPEN, ST_TUNING,
)
from riverbed.shells.protocols import STREAM
from riverbed.shells.rmq_stream.consume import ConsumeCommands
from riverbed.shells.rmq_stream.publish import PublishCommands

log = logging.getLogger("riverbed.rmq")
LISTENER = STREAM   # the one name (protocols.py): the listener label of riverbed_rejected_total

# rabbit_stream_utils:consumer_activity_status/2: a plain consumer is "up", a single active one "single_active"
# while it delivers and "waiting" otherwise
_ACTIVITY = {SAC_NONE: "up", SAC_ACTIVE: "single_active"}


class RmqStreamSession(PublishCommands, ConsumeCommands, SessionKernel):
    """One RabbitMQ Stream connection on the session kernel (:mod:`riverbed.shells.broker.session`:
    io contract, lifecycle, flow control); this class adds the framing, the commands of
    :data:`COMMANDS` and their error rendering. It reaches storage only through ``broker``.

    Not thread-safe: every method, and every callback the broker runs for it, must run on one thread
    (the event loop's). Bad input never raises out of here: it ends in a response code or a
    server-initiated Close (0x0d unknown frame, 0x0e frame too large, ...) and the connection closes.
    """

    LISTENER = LISTENER
    PROTOCOL = LISTENER     # the management API's protocol: the same one name
    PENDING_OPS_HIGH = PENDING_OPS_HIGH
    PENDING_OPS_LOW = PENDING_OPS_LOW

    def __init__(self, shell, io, *, peer="?", local_host=None, peer_loopback=False, local=None, remote=None,
                 tls_port=None):
        local_host = local_host if local_host is not None else (local[0] if local else None)
        super().__init__(shell, io, peer=peer, local=local or (local_host, shell.listen_port or 0), remote=remote,
                         peer_loopback=peer_loopback)
        self.tls_port = tls_port        # set on the TLS listener: the port advertised to this client
        self.local_host = local_host
        self.frame_max = shell.frame_max
        self.heartbeat = shell.heartbeat
        self.mechanism = None
        self.publishers = {}
        self.subscriptions = {}
        self.deliver_version = 1
        self._buf = bytearray()
        self._need = 0
        self._max_frame = INITIAL_FRAME_MAX
        self._confirms = {}             # publisher id -> its confirm being merged in _out (publish.py)
        self._corr = 0
        self._pending_updates = {}      # correlation id of a ConsumerUpdate we sent -> subscription id
        self._alone_max = 0             # Publish frames the one-message path takes: none until Open
        self._alone_entries = 0         # (publish.py: _set_alone_limits, _publish_alone)

    # ------------------------------------------------------------------------------- input and output

    def _received(self, data):
        """Bytes from the peer (the kernel's ``data_received``): every complete frame, then the replies."""
        buf = self._buf
        if not buf and self._publish_alone(data):
            return                  # one small Publish frame alone: done (publish.py)
        if buf:
            buf += data
            if len(buf) < self._need:
                return
            src = buf
        else:
            src = data
        try:
            # Publish payloads come as views of src, not copies (the compiled parser copies each once,
            # into its chunk): so src is never changed after this; its unused tail moves to a new buffer
            frames, used = wire.split_frames(src, self._max_frame, CMD_PUBLISH)
        except FrameTooLarge:
            # Frames before the big one may include Open, which raises the cap: go one at a time.
            frames, used = self._split_slowly(src)
            if frames is None:
                return
            if src is buf:
                if used:
                    # a new buffer, not ``del buf[:used]``: the frames may be views of buf (the pure
                    # twin's are), and a bytearray with views cannot be resized
                    self._buf = bytearray(memoryview(buf)[used:])
                src = None
        if src is None or (used == 0 and src is buf):
            pass                                    # nothing taken from the buffer: keep it as it is
        elif used < len(src):
            self._buf = bytearray(memoryview(src)[used:])
        elif src is buf:
            self._buf = bytearray()
        rest = self._buf
        self._need = LEN_SIZE + _U32.unpack_from(rest, 0)[0] if len(rest) >= LEN_SIZE else LEN_SIZE
        for f in frames:
            self._dispatch(f)
            if self.state >= ST_CLOSED:
                return
        self._flush()

    def _split_slowly(self, src):
        """Frame by frame with the cap in force at each frame; dispatches as it goes. Returns
        ``([], used)``, or ``(None, 0)`` once the connection has been closed."""
        mv = memoryview(src)
        pos = 0
        while len(mv) - pos >= LEN_SIZE:
            n = _U32.unpack_from(mv, pos)[0]
            if n > self._max_frame:
                self._refuse_frame(_limits.REASON_FRAME_SIZE, f"frame of {n} bytes is over the "
                                   f"{self._max_frame}-byte limit")
                return None, 0
            if len(mv) - pos - LEN_SIZE < n:
                break
            self._dispatch(bytes(mv[pos + LEN_SIZE:pos + LEN_SIZE + n]))
            pos += LEN_SIZE + n
            if self.state >= ST_CLOSED:
                return None, 0
        return [], pos

    def _outgoing(self, out):
        return self._merged_confirms(out) if self._confirms else out

    def _next_corr(self):
        self._corr = (self._corr + 1) & 0xFFFFFFFF
        return self._corr

    def _respond(self, key, corr, code, body=b""):
        self._send(response(key, corr, code, body))

    # ------------------------------------------------------------------------------ flow and lifecycle

    def _handshake_timeout(self):
        return self.shell.handshake_timeout

    def _idle_timeout(self):
        # as RabbitMQ: two heartbeat intervals without a frame from the client (only once open)
        return 2 * self.heartbeat if self.heartbeat and self.state >= ST_OPEN else None

    def _heartbeat_interval(self):
        return self.heartbeat if self.state >= ST_OPEN else None

    def _heartbeat_frame(self):
        return encode_heartbeat()

    def _on_tick(self, now):
        if self.state >= ST_OPEN:
            self.check_step_downs(now)
            self._flush()

    def _refuse_and_close(self, frame):
        """RabbitMQ's ``silent_close``: hold the refusing ``frame`` for the shell's ``auth_failure_delay``
        seconds (reading nothing meanwhile), then send it and close the socket."""
        self._refuse_later(frame, self.shell.auth_failure_delay)

    def _refuse_frame(self, reason, text):
        """A frame over a named limit: counted (``riverbed_rejected_total``), then Close 0x0e."""
        _limits.reject(LISTENER, reason, text, self.peer)
        self._fatal(RC_FRAME_TOO_LARGE, text)

    def _fatal(self, code, reason):
        """Protocol error: Close with ``code`` and drop the connection (the bytes already queued,
        including the Close, are flushed by the transport before it closes)."""
        log.warning("%s: closing connection: %s (code 0x%02x)", self.peer, reason, code)
        if self.state < ST_CLOSING:
            self._send(encode_close(self._next_corr(), code, reason))
        self._flush()
        self._hard_close()

    def _drop_all(self):
        for sub in list(self.subscriptions.values()):
            self._drop_subscription(sub)
        self.subscriptions.clear()
        self._confirms.clear()

    # ----------------------------------------------------------------------------- management API

    @property
    def name(self):
        """The connection's name: the ``connection_name`` client property when the client chose one,
        else RabbitMQ's form ``"peer -> local"``."""
        chosen = self.client_properties.get("connection_name")
        if chosen:
            return chosen
        return f"{self.remote[0]}:{self.remote[1]} -> {self.local[0]}:{self.local[1]}"

    def _info(self):
        return {"vhost": "/", "publishers": len(self.publishers), "subscriptions": len(self.subscriptions),
                "ssl": self.tls_port is not None}

    def consumer_infos(self):
        """This connection's subscriptions for the dashboard and ``/api/stream/consumers``: dicts with
        ``stream``, ``protocol``, ``connection``, ``subscription_id``, ``reference`` (the single active
        consumer name, else None), ``offset`` (next offset to deliver) and ``credits`` (chunks the client
        may still take), ``properties`` (the Subscribe properties), ``active`` and ``activity_status`` (as
        RabbitMQ: ``up``, or ``single_active`` / ``waiting`` for a single active consumer). Subscriptions
        still resolving their start are left out. Loop-thread only."""
        return [self._consumer_info(sub.stream, sub.sub_id, sub.tail.offset, sub.sac_name, sub.tail.units,
                                    properties=dict(sub.properties), active=sub.sac in (SAC_NONE, SAC_ACTIVE),
                                    activity_status=_ACTIVITY.get(sub.sac, "waiting"))
                for sub in list(self.subscriptions.values()) if sub.ready and not sub.closed and sub.tail is not None]

    def publisher_infos(self):
        """This connection's declared publishers: ``stream``, ``protocol``, ``connection``,
        ``publisher_id``, ``reference`` (None when the publisher has none), ``published`` (None: not
        counted per publisher). Loop-thread only."""
        return [{"stream": pub.stream, "protocol": "stream", "connection": self.name,
                 "publisher_id": pub.publisher_id, "reference": pub.reference or None, "published": None}
                for pub in list(self.publishers.values()) if not pub.stream_gone]

    # -------------------------------------------------------------------------------------- dispatch

    def _dispatch(self, f):
        if len(f) < LEN_KEY_VERSION:
            self._fatal(RC_UNKNOWN_FRAME, f"frame of {len(f)} bytes has no key and version")
            return
        key, version = _KEY_VERSION.unpack_from(f, 0)
        if key == CMD_PUBLISH and self.state == ST_OPEN:
            if version != 1 and version != 2:
                self._fatal(RC_UNKNOWN_FRAME, f"unsupported version {version} of Publish")
                return
            if len(f) >= LEN_PUBLISH_HEAD and _I32.unpack_from(f, 5)[0] > self.limits.max_entries_per_frame:
                # checked before a message is read: a frame of millions of empty messages costs nothing
                self._refuse_frame(_limits.REASON_ENTRIES, f"Publish frame of {_I32.unpack_from(f, 5)[0]} "
                                   f"messages is over max_entries_per_frame {self.limits.max_entries_per_frame}")
                return
            try:
                self._on_publish(f, version)
            except DecodeError as e:
                self._fatal(RC_UNKNOWN_FRAME, f"malformed Publish frame: {e}")
            return
        entry = COMMANDS.get(key)
        if entry is None:
            self._fatal(RC_UNKNOWN_FRAME, f"unknown command key 0x{key:04x}")
            return
        method, min_state, name, versions = entry
        if version not in versions:
            self._fatal(RC_UNKNOWN_FRAME, f"unsupported version {version} of {name}")
            return
        if self.state == ST_CLOSING and key not in (CMD_CLOSE, CMD_CLOSE | RESPONSE, CMD_HEARTBEAT):
            return  # we are closing: the peer's in-flight requests are moot
        if self.state < min_state:
            self._fatal(RC_ACCESS_REFUSED, f"{name} is not allowed before "
                        f"{'authentication' if self.state == ST_HANDSHAKE else 'Open'}")
            return
        if self.state == ST_OPEN and self.frame_max and len(f) + LEN_SIZE > self.frame_max:
            self._refuse_frame(_limits.REASON_FRAME_SIZE, f"{name} frame of {len(f) + LEN_SIZE} bytes is over "
                               f"the negotiated frame_max {self.frame_max}")
            return
        try:
            method(self, f, version)
        except FieldError as e:
            self._refuse_values(key, f, name, e)
        except DecodeError as e:
            self._fatal(RC_UNKNOWN_FRAME, f"malformed {name} frame: {e}")
        except (TypeError, ValueError, LookupError, AttributeError, OverflowError, RecursionError) as e:
            # a value that parsed and that the command's checks let through: still this request's
            # error, answered as one (the frame was read whole, so the connection can go on)
            self._refuse_values(key, f, name, repr(e))

    def _refuse_values(self, key, f, name, err):
        """Answer a whole, well-framed request whose values its command cannot take with
        PRECONDITION_FAILED and an empty body of its response's shape; the connection stays open.
        Commands that have no response (Tune, Credit, StoreOffset, responses) are dropped, except a
        Metadata request, whose response has no code: Close 0x0d."""
        _limits.reject(LISTENER, "field", f"{name}: {err}", self.peer)
        if key == CMD_METADATA:
            self._fatal(RC_UNKNOWN_FRAME, f"malformed {name} frame: {err}")
            return
        if key & RESPONSE or key in NO_RESPONSE_KEYS or len(f) < LEN_KEY_VERSION + 4:
            return
        corr = _U32.unpack_from(f, LEN_KEY_VERSION)[0]
        self._respond(key, corr, RC_PRECONDITION_FAILED, REFUSAL_BODIES.get(key, b""))

    def _can(self, what, resource):
        return self.user is not None and self.user.can(what, resource)

    # ------------------------------------------------------------------------------------ handshake

    def _on_peer_properties(self, f, version):
        r = Reader(f)
        corr = r.u32()
        self.client_properties = r.properties(null_values=True)   # shown as given (management API)
        r.done()
        properties = self.shell.server_properties()
        properties.update(self.shell.http_properties())     # where the HTTP listener is, for admin clients
        self._respond(CMD_PEER_PROPERTIES, corr, RC_OK, enc_properties(properties))

    def _on_sasl_handshake(self, f, version):
        r = Reader(f)
        corr = r.u32()
        r.done()
        self._respond(CMD_SASL_HANDSHAKE, corr, RC_OK, enc_strings(self.broker.auth.mechanisms()))

    def _on_sasl_authenticate(self, f, version):
        r = Reader(f)
        corr = r.u32()
        mechanism = r.string() or ""
        data = r.bytes_() or b""
        r.done()
        result = self.broker.auth.authenticate(mechanism, data, self.peer_loopback)
        code = _AUTH_CODES[result.outcome]
        if self.state >= ST_TUNING:
            # re-authentication after the handshake (a refreshed secret; RabbitMQ 3.13); as RabbitMQ
            # 4.x, a change of mechanism or user ends the connection like a failure
            if mechanism != self.mechanism:
                log.warning("%s: %r may not change mechanism to %r", self.peer, self.username, mechanism)
                self._refuse_and_close(response(CMD_SASL_AUTHENTICATE, corr, RC_SASL_CANNOT_CHANGE_MECHANISM))
            elif code == RC_OK and result.username != self.username:
                log.warning("%s: %r may not change user to %r", self.peer, self.username, result.username)
                self._refuse_and_close(response(CMD_SASL_AUTHENTICATE, corr, RC_SASL_CANNOT_CHANGE_USERNAME))
            elif code == RC_OK:
                self.user = result.user
                self._respond(CMD_SASL_AUTHENTICATE, corr, RC_OK)
            else:
                log.warning("%s: re-authentication of %r failed: %s", self.peer, self.username, result.reason)
                self._close_after_auth_failure(corr, code)
            return
        if code == RC_OK:
            self.user = result.user
            self.username = result.username
            self.mechanism = mechanism
            self.state = ST_TUNING
            self._respond(CMD_SASL_AUTHENTICATE, corr, RC_OK)
            self._send(encode_tune(self.shell.frame_max, self.shell.heartbeat))
            return
        if code == RC_SASL_MECHANISM_NOT_SUPPORTED:
            self._respond(CMD_SASL_AUTHENTICATE, corr, code)
            return  # the client may try another mechanism
        log.warning("%s: authentication failed: %s", self.peer, result.reason)
        self._close_after_auth_failure(corr, code)

    def _close_after_auth_failure(self, corr, code):
        # RabbitMQ: refused credentials are answered after the tarpit delay, a loopback-only user or a
        # SASL error at once; the socket closes after the answer either way
        frame = response(CMD_SASL_AUTHENTICATE, corr, code)
        if code == RC_AUTHENTICATION_FAILURE:
            self._refuse_and_close(frame)
        else:
            self._send(frame)
            self._hard_close()

    def _on_tune(self, f, version):
        r = Reader(f)
        frame_max = r.u32()
        heartbeat = r.u32()
        r.done()
        ours = self.shell.frame_max
        self.frame_max = min(frame_max, ours) if frame_max and ours else (frame_max or ours)
        hb = self.shell.heartbeat
        # as RabbitMQ: 0 from one side means "no preference", so the other side's value holds
        self.heartbeat = min(heartbeat, hb) if heartbeat and hb else (heartbeat or hb)
        if self.state >= ST_OPEN:
            self._set_alone_limits()    # a confirm must still fit the frame_max

    def _on_open(self, f, version):
        r = Reader(f)
        corr = r.u32()
        vhost = r.string()
        r.done()
        if vhost not in ("/", None, ""):
            log.warning("%s: virtual host %r does not exist", self.peer, vhost)
            self._refuse_and_close(response(CMD_OPEN, corr, RC_VIRTUAL_HOST_ACCESS_FAILURE, enc_properties({})))
            return
        self.state = ST_OPEN
        self._max_frame = self.limits.max_frame_size
        self._set_alone_limits()
        host, port = self._advertised()
        self._respond(CMD_OPEN, corr, RC_OK,
                      enc_properties({"advertised_host": host, "advertised_port": str(port)}))

    def _on_close(self, f, version):
        r = Reader(f)
        corr = r.u32()
        code = r.u16()
        reason = r.string()
        r.done()
        log.debug("%s: client closed (0x%02x %s)", self.peer, code, reason)
        self._respond(CMD_CLOSE, corr, RC_OK)
        self._hard_close()

    def _on_close_response(self, f, version):
        if self.state == ST_CLOSING:
            self._hard_close()

    def _on_heartbeat(self, f, version):
        pass  # data_received already noted the time

    # --------------------------------------------------------------------------------------- streams

    def _on_create(self, f, version):
        r = Reader(f)
        corr = r.u32()
        stream = r.string()
        args = r.properties()
        r.done()
        if not stream:
            self._respond(CMD_CREATE, corr, RC_PRECONDITION_FAILED)
        elif not self._can(CONFIGURE, stream):
            self._respond(CMD_CREATE, corr, RC_ACCESS_REFUSED)
        elif self.broker.has_stream(stream):
            self._respond(CMD_CREATE, corr, RC_STREAM_ALREADY_EXISTS)
        else:
            self.broker.create_stream(stream, args, self._later(
                lambda exc: self._respond(CMD_CREATE, corr, response_code_for(exc))))

    def _on_delete(self, f, version):
        r = Reader(f)
        corr = r.u32()
        stream = r.string()
        r.done()
        if not self.broker.has_stream_anywhere(stream):     # in a cluster, also one held by other nodes only
            self._respond(CMD_DELETE, corr, RC_STREAM_DOES_NOT_EXIST)
        elif not self._can(CONFIGURE, stream):
            self._respond(CMD_DELETE, corr, RC_ACCESS_REFUSED)
        else:
            self.broker.delete_stream(stream, self._later(
                lambda exc: self._respond(CMD_DELETE, corr, response_code_for(exc))))

    def _advertised(self):
        # a client of the TLS port must be sent back to the TLS port: rstream dials what it is told
        host, port = self.shell.advertised(self.local_host)
        return host, self.tls_port or port

    def _on_metadata(self, f, version):
        r = Reader(f)
        corr = r.u32()
        streams = r.strings()
        r.done()
        host, port = self._advertised()
        visible = self.broker.has_stream
        # the server's own streams (broker/internal.py) are answered as not existing
        has = lambda name: visible(name) and not is_internal(name)   # noqa: E731
        cluster = getattr(self.broker, "cluster", None)
        if cluster is not None:
            # a cluster member: each stream's leader and replicas with their advertised addresses, also
            # for a stream this node holds no copy of (a client routes itself to its members); a stream
            # this node has not heard of yet is asked of etcd first (made elsewhere a moment ago)
            def found(names):
                brokers, entries = cluster.rmq_metadata(streams, names.__contains__, (host, port))
                self._send(encode_metadata_response(corr, brokers, entries))
            self.broker.find_streams(streams, self._later(found))
            return
        entries = [(s, RC_OK, 0, []) if s and has(s) else (s or "", RC_STREAM_DOES_NOT_EXIST, 0xFFFF, [])
                   for s in streams]
        self._send(encode_metadata_response(corr, [(0, host, port)], entries))

    def stream_deleted(self, stream):
        """The engine deleted ``stream``: drop its subscriptions, orphan its publishers (their Publish
        frames get 0x02 from now on) and send MetadataUpdate 0x06 once. Called by the broker."""
        if self.state >= ST_CLOSED:
            return
        notify = False
        for sub in list(self.subscriptions.values()):
            if sub.stream == stream:
                self._drop_subscription(sub, sac_handover=False)
                del self.subscriptions[sub.sub_id]
                notify = True
        for pub in self.publishers.values():
            if pub.stream == stream and not pub.stream_gone:
                pub.stream_gone = True
                notify = True
        if notify:
            self._send(encode_metadata_update(RC_STREAM_NOT_AVAILABLE, stream))
            self._flush()

    def _on_stream_stats(self, f, version):
        r = Reader(f)
        corr = r.u32()
        stream = r.string()
        r.done()
        if not self.broker.has_stream(stream):
            self._send(encode_stream_stats(corr, RC_STREAM_DOES_NOT_EXIST, []))
        elif not self._can(READ, stream):
            self._send(encode_stream_stats(corr, RC_ACCESS_REFUSED, []))
        else:
            try:
                info = self.broker.stream_info(stream)
            except StreamNotFound:
                self._send(encode_stream_stats(corr, RC_STREAM_DOES_NOT_EXIST, []))
                return
            self._send(encode_stream_stats(corr, RC_OK, [
                ("first_chunk_id", info.first_chunk_id), ("committed_chunk_id", info.committed_chunk_id),
                ("last_chunk_id", info.last_chunk_id)]))

    def _on_exchange_command_versions(self, f, version):
        r = Reader(f)
        corr = r.u32()
        for _ in range(r.count(6)):
            key = r.u16()
            r.u16()                      # the client's min version: we support every v1
            hi = r.u16()
            if key == CMD_DELIVER and hi >= 2:
                self.deliver_version = 2
        r.done()
        self._send(encode_command_versions(corr, SERVER_COMMAND_VERSIONS))

    # ---------------------------------------------------------------------------------- super streams

    def _on_create_super_stream(self, f, version):
        r = Reader(f)
        corr = r.u32()
        name = r.string()
        partitions = r.strings()
        keys = r.strings()
        args = r.properties()
        r.done()
        if not name or not partitions or len(partitions) != len(keys) or not all(partitions) \
                or None in keys or len(set(partitions)) != len(partitions):
            self._respond(CMD_CREATE_SUPER_STREAM, corr, RC_PRECONDITION_FAILED)
        elif not all(self._can(CONFIGURE, x) for x in [name] + partitions):
            self._respond(CMD_CREATE_SUPER_STREAM, corr, RC_ACCESS_REFUSED)
        else:
            self.broker.create_super_stream(name, partitions, keys, args, self._later(
                lambda exc: self._respond(CMD_CREATE_SUPER_STREAM, corr, response_code_for(exc))))

    def _on_delete_super_stream(self, f, version):
        r = Reader(f)
        corr = r.u32()
        name = r.string()
        r.done()
        parts = self.broker.partitions(name or "")
        if parts is None:
            self._respond(CMD_DELETE_SUPER_STREAM, corr, RC_STREAM_DOES_NOT_EXIST)
        elif not all(self._can(CONFIGURE, x) for x in [name] + parts):
            self._respond(CMD_DELETE_SUPER_STREAM, corr, RC_ACCESS_REFUSED)
        else:
            self.broker.delete_super_stream(name, self._later(
                lambda exc: self._respond(CMD_DELETE_SUPER_STREAM, corr, response_code_for(exc))))

    def _on_route(self, f, version):
        r = Reader(f)
        corr = r.u32()
        routing_key = r.string()
        super_stream = r.string()
        r.done()
        streams = self.broker.route(super_stream or "", routing_key)
        code = RC_OK if streams is not None else RC_STREAM_DOES_NOT_EXIST
        self._respond(CMD_ROUTE, corr, code, enc_strings(streams or []))

    def _on_partitions(self, f, version):
        r = Reader(f)
        corr = r.u32()
        super_stream = r.string()
        r.done()
        streams = self.broker.partitions(super_stream or "")
        code = RC_OK if streams is not None else RC_STREAM_DOES_NOT_EXIST
        self._respond(CMD_PARTITIONS, corr, code, enc_strings(streams or []))

    # ------------------------------------------------------------------------------------ publishing


# key -> (name, lowest state[, accepted versions]); the handler is ``_on_<name in snake_case>``
COMMANDS = commands(RmqStreamSession, {
    CMD_PEER_PROPERTIES: ("PeerProperties", ST_HANDSHAKE),
    CMD_SASL_HANDSHAKE: ("SaslHandshake", ST_HANDSHAKE),
    CMD_SASL_AUTHENTICATE: ("SaslAuthenticate", ST_HANDSHAKE),
    CMD_TUNE: ("Tune", ST_TUNING),
    CMD_OPEN: ("Open", ST_TUNING),
    CMD_CLOSE: ("Close", ST_HANDSHAKE),
    CMD_CLOSE | RESPONSE: ("CloseResponse", ST_HANDSHAKE),
    CMD_HEARTBEAT: ("Heartbeat", ST_HANDSHAKE),
    CMD_DECLARE_PUBLISHER: ("DeclarePublisher", ST_OPEN),
    CMD_PUBLISH: ("Publish", ST_OPEN, (1, 2)),      # handled before the table while open (hot path)
    CMD_QUERY_PUBLISHER_SEQUENCE: ("QueryPublisherSequence", ST_OPEN),
    CMD_DELETE_PUBLISHER: ("DeletePublisher", ST_OPEN),
    CMD_SUBSCRIBE: ("Subscribe", ST_OPEN),
    CMD_CREDIT: ("Credit", ST_OPEN),
    CMD_STORE_OFFSET: ("StoreOffset", ST_OPEN),
    CMD_QUERY_OFFSET: ("QueryOffset", ST_OPEN),
    CMD_UNSUBSCRIBE: ("Unsubscribe", ST_OPEN),
    CMD_CREATE: ("Create", ST_OPEN),
    CMD_DELETE: ("Delete", ST_OPEN),
    CMD_METADATA: ("Metadata", ST_OPEN),
    CMD_ROUTE: ("Route", ST_OPEN),
    CMD_PARTITIONS: ("Partitions", ST_OPEN),
    CMD_CONSUMER_UPDATE | RESPONSE: ("ConsumerUpdateResponse", ST_OPEN),
    CMD_EXCHANGE_COMMAND_VERSIONS: ("ExchangeCommandVersions", ST_OPEN),
    CMD_STREAM_STATS: ("StreamStats", ST_OPEN),
    CMD_CREATE_SUPER_STREAM: ("CreateSuperStream", ST_OPEN),
    CMD_DELETE_SUPER_STREAM: ("DeleteSuperStream", ST_OPEN),
    CMD_RESOLVE_OFFSET_SPEC: ("ResolveOffsetSpec", ST_OPEN),
})
