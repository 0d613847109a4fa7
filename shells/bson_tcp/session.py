"""A BSON/TCP (mewbase) connection on the session kernel (:mod:`riverbed.shells.broker.session`: io
contract, lifecycle, flow control, shutdown drain): this module is its framing, its commands
(:data:`COMMANDS`, handlers ``_on_<frame type>``) and their error rendering; storage is reached only
through the broker layer and the document store.

Behaviour where the protocol leaves a choice:

* Framing: a declared length outside 5..16 MiB, invalid BSON or a document that is not an envelope:
  RESPONSE ok:false (errCode 6, with the rID when one could be read) and close; the body of an
  oversized frame is never read. An unknown ``type``: RESPONSE {ok:false, rID, errCode 6}, and the
  connection stays open. Any frame before a successful CONNECT: errCode 2 and close.
* A PUB frame that ``wire.bson_pub`` recognises (exactly the PUB envelope, strictly checked BSON) is
  not decoded: its event's bytes are stored as the frame has them, which are the bytes decoding and
  encoding them again would give. Any other frame is decoded in full (and a PUB's event encoded again).
* Pipelined PUBs read in one go are appended per channel as one batch (one engine append, contiguous);
  each PUB is answered with its rID once the batch is durable. A frame other than PUB first sends the
  batch gathered so far, so the order of a connection's requests is kept.
* A channel is created on first PUB (write permission suffices; CREATECHANNEL needs configure).
* Durable subscriptions keep ``lastAcked`` as a named offset ``mewbase-durable:<durableID>`` on the
  channel; a resumed subscription starts at ``lastAcked + 1``. While ACKEV writes are in flight, replies
  to later frames are held back until they commit.
* Transactions are kept in memory per (connection, sessID), at most 256 MiB per connection; COMMITTX
  appends them in one engine transaction (``append_records`` for one channel, ``broker.transact`` with
  one staged append per channel for several).
* The connection stops being read while 10,000 of its engine operations are pending or its transport's
  write buffer is over its high mark; RECEVs stop with it.
"""

import logging

from riverbed.engine import OffsetSpec
from riverbed.engine.errors import (
    FrameError, FrameTooLarge, InvalidArgument, RiverbedError, StorageFull, StreamNotFound,
)
from riverbed.engine.predicate import from_mongo
from riverbed.engine.record import CT_BSON, encode_record, max_depth
from riverbed.shells import auth as _auth
from riverbed.shells import wire
from riverbed.shells.bson_tcp import codec as c
from riverbed.shells.bson_tcp.admin import AdminCommands
from riverbed.shells.bson_tcp.queries import Matcher, Subscription
from riverbed.shells.broker import READ, WRITE
from riverbed.shells.broker import limits as _limits
from riverbed.shells.broker.session import SessionKernel, State, commands
from riverbed.shells.protocols import BSON

log = logging.getLogger("riverbed.bson")
LISTENER = BSON   # the one name (protocols.py): the listener label of riverbed_rejected_total
# what a handler raises for a value the frame check let through: answered as the request's error (errCode
# 6), never left to the listener's guard (which drops the connection as an internal error)
_VALUE_ERRORS = (TypeError, ValueError, OverflowError, LookupError, AttributeError, RecursionError)
FAST_PUB_DEPTH = 64      # wire.bson_pub leaves events nested deeper than this to the checked slow path

ST_CONNECTING, ST_OPEN, ST_CLOSED = State.HANDSHAKE, State.OPEN, State.CLOSED   # before CONNECT, after it
TX_MAX_BYTES = 256 << 20
DURABLE_PREFIX = "mewbase-durable:"
MAX_DURABLE_ID = 200


def _append_error_code(exc):
    """The errCode of a failed PUB or COMMITTX: 3 for a channel that is gone; 6 (command not processed:
    nothing stored, retry later) for a full disk or the disk alarm; 100 otherwise."""
    if isinstance(exc, StreamNotFound):
        return c.ERR_NO_SUCH_CHANNEL
    if isinstance(exc, StorageFull):
        return c.ERR_COMMAND_NOT_PROCESSED
    return c.ERR_SERVER_ERROR


class _Tx:
    __slots__ = ("events", "nbytes")

    def __init__(self):
        self.events = []      # (channel, record bytes)
        self.nbytes = 0


class BsonSession(AdminCommands, SessionKernel):
    """One mewbase connection. Loop-thread only; bad input never raises out of here (it ends in a
    RESPONSE ok:false, and for framing errors a close)."""

    LISTENER = LISTENER
    PROTOCOL = LISTENER     # the management API's protocol: the same one name

    def __init__(self, shell, io, *, peer="?", local=None, remote=None, peer_loopback=False):
        super().__init__(shell, io, peer=peer, local=local, remote=remote, peer_loopback=peer_loopback)
        self.client_version = None
        self.subscriptions = {}
        self.queries = {}
        self.txs = {}
        self.tx_bytes = 0
        self._next_sub = 0
        self._buf = bytearray()
        self._held = []               # replies waiting for durable ACKEV writes to commit
        self._acks_inflight = 0
        self._batch = {}              # channel -> ([records], [rIDs]) of pipelined PUBs not yet appended
        self._writable = {}           # channel -> whether this connection's user may write to it
        self._now_ms = None           # wall clock (ms) read once per data_received, for PUB records

    # ------------------------------------------------------------------------------------ input

    def _received(self, data):
        buf = self._buf
        if buf:
            buf += data
            src = buf
        else:
            src = data
        bad = None
        max_frame = self.limits.bson_max_frame
        try:
            # a declared length over the limit is refused as soon as its 4 bytes are in, before buffering
            frames, used = wire.split_bson_frames(src, max_frame)
        except FrameError as e:
            frames, used = self._split_until_bad(src, max_frame)
            bad = e
        if src is buf:
            if used:
                # a new buffer, not ``del buf[:used]``: the frames may be views of buf (the pure twin's
                # are), and a bytearray with views cannot be resized
                self._buf = bytearray(memoryview(buf)[used:])
        elif used < len(data):
            self._buf = bytearray(memoryview(data)[used:])
        for f in frames:
            self._dispatch(f)
            if self.state == ST_CLOSED:
                return
        self._now_ms = None
        self._send_batch()
        if bad is not None:
            if isinstance(bad, FrameTooLarge):
                _limits.reject(LISTENER, _limits.REASON_FRAME_SIZE, str(bad), self.peer)
            else:
                log.warning("%s: bad frame length: %s; closing", self.peer, bad)
            self._fatal(None, c.ERR_COMMAND_NOT_PROCESSED, f"bad frame: {bad}")
            return
        self._flush()

    @staticmethod
    def _split_until_bad(src, max_frame):
        # the frames before the one with a bad length are still served, in order
        mv = memoryview(src)
        pos, frames = 0, []
        while len(mv) - pos >= 4:
            n = int.from_bytes(mv[pos:pos + 4], "little", signed=True)
            if n < c.MIN_FRAME or n > max_frame or len(mv) - pos < n:
                break
            frames.append(bytes(mv[pos:pos + n]))
            pos += n
        return frames, pos

    def _dispatch(self, raw):
        if self.state == ST_OPEN and max_depth() >= FAST_PUB_DEPTH:
            pub = wire.bson_pub(raw)
            if pub is not None:
                # a well-formed PUB, checked without decoding (event nesting included, up to the parser's
                # bound): its event is stored as the frame has it
                self._pub(pub[0], pub[1], pub[2], bytes(raw[pub[3]:pub[4]]))
                return
        try:
            ftype, frame = c.decode_envelope(raw)
        except c.DecodeError as e:
            self._send_batch()
            self._fatal(None, c.ERR_COMMAND_NOT_PROCESSED, str(e))
            return
        f = frame
        if self.state == ST_OPEN:
            try:
                c.check_frame(f, max_depth())
            except c.FieldError as e:
                self._send_batch()
                self._refuse_frame(ftype, f, e)
                return
        if ftype == c.FT_PUB and self.state == ST_OPEN:
            try:
                self._on_pub(frame)
            except _VALUE_ERRORS as e:      # a value check_frame let through: this PUB's error only
                self._pub_error(f.get("rID"), c.ERR_COMMAND_NOT_PROCESSED, str(e))
            return
        self._send_batch()
        rid = f.get("rID")
        command = COMMANDS.get(ftype)
        if command is None or command.min_state > self.state:
            if self.state < ST_OPEN:
                self._fatal(rid, c.ERR_NOT_AUTHORISED, "CONNECT first")
            else:
                self._reply(c.response(rid, False, c.ERR_COMMAND_NOT_PROCESSED, f"unknown frame type {ftype!r}"))
            return
        try:
            command.handler(self, f)
        except (InvalidArgument, c.DecodeError) + _VALUE_ERRORS as e:
            self._reply(c.response(rid, False, c.ERR_COMMAND_NOT_PROCESSED, str(e)))

    def _refuse_frame(self, ftype, f, err):
        """Answer a frame that failed :func:`codec.check_frame` in its own reply form (RESPONSE,
        SUBRESPONSE, QUERYRESULT; frames without a reply are dropped), counted as a rejection."""
        _limits.reject(LISTENER, err.reason, f"{ftype}: {err}", self.peer)
        rid = f.get("rID")
        if ftype in (c.FT_ACKEV, c.FT_QUERYACK, c.FT_PING):
            return
        if ftype == c.FT_SUBSCRIBE:
            self._reply(c.sub_response(rid, False, err_code=c.ERR_COMMAND_NOT_PROCESSED, err_msg=str(err)))
        elif ftype == c.FT_QUERY:
            qid = f.get("queryID")
            self._reply(c.encode_query_result(qid if c.is_int(qid) else None, None, True, ok=False,
                                              errCode=c.ERR_COMMAND_NOT_PROCESSED, errMsg=str(err)))
        else:
            self._reply(c.response(rid, False, c.ERR_COMMAND_NOT_PROCESSED, str(err)))

    # ----------------------------------------------------------------------------------- output

    def _send_many(self, parts):
        self._out.extend(parts)
        self._flush()

    def _reply(self, data, after=None):
        """A reply to a request: held back while durable ACKEV writes are in flight."""
        if self._acks_inflight:
            self._held.append((data, after))
            return
        self._out.append(data)
        if after is not None:
            self._flush()
            after()

    # ------------------------------------------------------------------------- flow, lifecycle

    def _on_writable(self):
        for q in list(self.queries.values()):
            q.pump()

    def _idle_timeout(self):
        return self.shell.idle_timeout

    def _on_shutdown(self):
        self._send_batch()
        self._flush()

    def _fatal(self, rid, code, msg):
        log.info("%s: %s (errCode %d); closing", self.peer, msg, code)
        self._out.append(c.response(rid, False, code, msg))
        self._hard_close()

    def _before_close(self):
        for data, _ in self._held:
            self._out.append(data)
        self._held = []

    def _drop_all(self):
        for sub in list(self.subscriptions.values()):
            sub.close()
        self.subscriptions.clear()
        self.queries.clear()
        self.txs.clear()        # open transactions are discarded with the connection
        self.tx_bytes = 0
        self._batch = {}

    def stream_deleted(self, name):
        for sub in list(self.subscriptions.values()):
            if sub.channel == name:
                sub.close()
                self.subscriptions.pop(sub.sub_id, None)

    def _subscription_gone(self, sub, exc):
        log.info("%s: subscription %d on %r ended: %s", self.peer, sub.sub_id, sub.channel, exc)
        self.subscriptions.pop(sub.sub_id, None)

    def consumer_infos(self):
        """This connection's SUBSCRIBEs (see the RabbitMQ Stream session's): the reference is the durable
        subscription's name (None for a plain one); no credits (a byte window). Loop-thread only."""
        return [self._consumer_info(sub.channel, sub.sub_id, sub.tail.offset, sub.durable_ref)
                for sub in list(self.subscriptions.values())]

    def _info(self):
        return {"subscriptions": len(self.subscriptions)}

    def _can(self, what, resource):
        return self.broker.allowed(self.user, what, resource)

    # --------------------------------------------------------------------------------- CONNECT

    def _on_connect(self, f):
        if self.state >= ST_OPEN:
            self._reply(c.response(f.get("rID"), False, c.ERR_COMMAND_NOT_PROCESSED, "already connected"))
            return
        version = c.parse_version(f.get("version"))
        if version is None or version > c.SERVER_VERSION:
            self._fatal(None, c.ERR_SERVER_ERROR, "Client version not supported")
            return
        auth = self.broker.auth
        if auth.open_to_loopback:
            user = auth.implicit_user(self.peer_loopback)
            if user is None:
                self._fatal(None, c.ERR_AUTHENTICATION_FAILED, "only loopback clients are served without --users")
                return
        else:
            name, password = f.get("username"), f.get("password")
            if not isinstance(name, str) or not isinstance(password, str):
                self._fatal(None, c.ERR_AUTHENTICATION_FAILED, "username and password required")
                return
            res = auth.check_password(name, password, self.peer_loopback)
            if res.outcome != _auth.OK:
                log.info("%s: authentication failed: %s", self.peer, res.reason)
                self._fatal(None, c.ERR_AUTHENTICATION_FAILED, "authentication failed")
                return
            user = res.user
        self.user = user
        self.username = user.name
        self.client_version = f.get("version")
        if self.client_version:
            self.client_properties = {"version": self.client_version}
        self.state = ST_OPEN
        self._reply(c.response(None, True))

    # -------------------------------------------------------------------------------------- PUB

    def _on_pub(self, f):
        channel = f.get("channel")
        event = f.get("event")
        rid = f.get("rID")
        sess_id = f.get("sessID")
        if not isinstance(channel, str) or not channel:
            self._pub_error(rid, c.ERR_COMMAND_NOT_PROCESSED, "PUB needs a string 'channel'")
            return
        if not isinstance(event, dict):
            self._pub_error(rid, c.ERR_COMMAND_NOT_PROCESSED, "PUB needs a document 'event'")
            return
        self._pub(channel, rid, sess_id, event)

    def _pub(self, channel, rid, sess_id, event):
        """A PUB with a non-empty string ``channel``; ``event`` is a decoded document (encoded here), or
        its BSON bytes as they came in a frame :func:`wire.bson_pub` accepted (stored as they are)."""
        allowed = self._writable.get(channel)
        if allowed is None:
            # the user is fixed at CONNECT, so its answer per channel can be kept for the connection
            allowed = self._writable[channel] = self._can(WRITE, channel) if len(self._writable) < 1000 else None
            if allowed is None:
                allowed = self._can(WRITE, channel)
        if not allowed:
            self._pub_error(rid, c.ERR_NOT_AUTHORISED, f"no write permission on {channel!r}")
            return
        if type(event) is bytes:
            ev = event
        else:
            try:
                ev = c.encode_event(event)
            except c.DecodeError as e:
                self._pub_error(rid, c.ERR_COMMAND_NOT_PROCESSED, str(e))
                return
        now = self._now_ms
        if now is None:
            now = self._now_ms = self.broker.wall_clock()     # one clock read per read from the socket
        record = encode_record(ev, CT_BSON, now)
        if sess_id is not None:
            tx = self.txs.get(sess_id)
            if tx is not None:
                if self.tx_bytes + len(record) > TX_MAX_BYTES:
                    self._pub_error(rid, c.ERR_COMMAND_NOT_PROCESSED, "transaction too large")
                    return
                tx.events.append((channel, record))
                tx.nbytes += len(record)
                self.tx_bytes += len(record)
                self._send_batch()
                self._reply(c.response(rid, True))
                return
        entry = self._batch.get(channel)
        if entry is None:
            self._batch[channel] = ([record], [rid])
        else:
            entry[0].append(record)
            entry[1].append(rid)

    def _pub_error(self, rid, code, msg):
        self._send_batch()
        self._reply(c.response(rid, False, code, msg))

    def _send_batch(self):
        if not self._batch:
            return
        batch, self._batch = self._batch, {}
        for channel, (records, rids) in batch.items():
            self._append(channel, records, rids)

    def _append(self, channel, records, rids):
        def done(res, exc):
            if exc is None:
                ok = c.response_ok
                if self._acks_inflight:
                    for rid in rids:
                        self._reply(ok(rid))
                else:
                    self._out.extend([ok(rid) for rid in rids])
            else:
                code = _append_error_code(exc)
                if code == c.ERR_SERVER_ERROR:   # a full disk is logged once, by the disk alarm
                    log.warning("%s: append to %r failed: %s", self.peer, channel, exc)
                for rid in rids:
                    self._reply(c.response(rid, False, code, f"append failed: {exc}"))
        self.broker.append_or_create(channel, records, self._later(done))

    # ------------------------------------------------------------------------------- transactions

    def _on_starttx(self, f):
        rid, sess = f.get("rID"), f.get("sessID")
        if sess is None:
            self._reply(c.response(rid, False, c.ERR_COMMAND_NOT_PROCESSED, "STARTTX needs a sessID"))
        elif sess in self.txs:
            self._reply(c.response(rid, False, c.ERR_COMMAND_NOT_PROCESSED, "a transaction is already open"))
        else:
            self.txs[sess] = _Tx()
            self._reply(c.response(rid, True))

    def _close_tx(self, f):
        """``(rID, the transaction of sessID)``, taken off the open ones; the transaction is None (and
        the error answered) when none is open."""
        rid = f.get("rID")
        tx = self.txs.pop(f.get("sessID"), None)
        if tx is None:
            self._reply(c.response(rid, False, c.ERR_COMMAND_NOT_PROCESSED, "no transaction open"))
        else:
            self.tx_bytes -= tx.nbytes
        return rid, tx

    def _on_aborttx(self, f):
        rid, tx = self._close_tx(f)
        if tx is not None:
            self._reply(c.response(rid, True))

    def _on_committx(self, f):
        rid, tx = self._close_tx(f)
        if tx is None:
            return
        if not tx.events:
            self._reply(c.response(rid, True))
            return
        by_channel = {}
        for channel, record in tx.events:
            by_channel.setdefault(channel, []).append(record)

        def done(res, exc):
            if exc is None:
                self._reply(c.response(rid, True))
            else:
                code = _append_error_code(exc)
                if code == c.ERR_SERVER_ERROR:
                    log.warning("%s: COMMITTX failed: %s", self.peer, exc)
                self._reply(c.response(rid, False, code, f"commit failed: {exc}"))
        done = self._later(done)
        missing = [ch for ch in by_channel if self.shell.channel_pending(ch) or not self.broker.has_stream(ch)]

        def commit():
            if len(by_channel) == 1:
                (channel, records), = by_channel.items()
                self.broker.append_records(channel, records, done)
                return

            def stage(ctx):
                for channel, records in by_channel.items():
                    ctx.append(channel, records)
            refused = self.broker.write_refusal()      # the disk alarm holds for transactions too
            if refused is not None:
                done(None, refused)
                return
            self.broker.transact(stage, done)

        if not missing:
            commit()
            return
        left = [len(missing)]
        failed = []

        def created(exc):
            if exc is not None:
                failed.append(exc)
            left[0] -= 1
            if left[0] == 0:
                if failed:
                    done(None, failed[0])
                else:
                    commit()
        for ch in missing:
            self.shell.ensure_channel(ch, created)

    # ------------------------------------------------------------------------------ subscriptions

    def _on_subscribe(self, f, copied=False):
        rid = f.get("rID")
        channel = f.get("channel")

        def refuse(code, msg):
            self._reply(c.sub_response(rid, False, err_code=code, err_msg=msg))
        if not isinstance(channel, str) or not channel:
            return refuse(c.ERR_COMMAND_NOT_PROCESSED, "SUBSCRIBE needs a string 'channel'")
        if not self._can(READ, channel):
            return refuse(c.ERR_NOT_AUTHORISED, f"no read permission on {channel!r}")
        start_pos, start_ts = f.get("startPos"), f.get("startTimestamp")
        if start_pos is not None and start_ts is not None:
            return refuse(c.ERR_COMMAND_NOT_PROCESSED, "give startPos or startTimestamp, not both")
        for key, v in (("startPos", start_pos), ("startTimestamp", start_ts)):
            if v is not None and (not c.is_int(v) or v < 0):
                return refuse(c.ERR_COMMAND_NOT_PROCESSED, f"{key} must be a non-negative integer")
        durable = f.get("durableID")
        if durable is not None and (not isinstance(durable, str) or not durable
                                    or len(durable.encode("utf-8")) > MAX_DURABLE_ID):
            return refuse(c.ERR_COMMAND_NOT_PROCESSED, f"durableID must be a string of 1..{MAX_DURABLE_ID} bytes")
        matcher = f.get("matcher")
        if matcher is not None:
            if not isinstance(matcher, dict):
                return refuse(c.ERR_COMMAND_NOT_PROCESSED, "matcher must be a document")
            try:
                matcher = Matcher(from_mongo(matcher)) if matcher else None
            except (InvalidArgument, ValueError) as e:
                return refuse(c.ERR_COMMAND_NOT_PROCESSED, f"bad matcher: {e}")
        if self.shell.channel_pending(channel):
            # a PUB read before this frame is creating the channel: subscribe once it exists
            self.shell.ensure_channel(channel, self._later(lambda exc: self._on_subscribe(f)))
            return
        if not copied and self.broker.needs_copy(channel):
            # a cluster node holding no copy: it makes one from the leader first (remote_read.py)
            self.broker.when_readable(channel, self._later(lambda exc: self._on_subscribe(f, True)))
            return
        if not self.broker.has_stream(channel):
            return refuse(c.ERR_NO_SUCH_CHANNEL, f"no channel {channel!r}")
        sub_id = self._next_sub
        self._next_sub += 1
        durable_ref = DURABLE_PREFIX + durable if durable is not None else None

        def go(offset, exc, min_ts=None):
            if exc is not None:
                code = c.ERR_NO_SUCH_CHANNEL if isinstance(exc, StreamNotFound) else c.ERR_SERVER_ERROR
                return refuse(code, str(exc))
            sub = Subscription(self, sub_id, channel, offset, matcher, min_ts, durable_ref)
            self.subscriptions[sub_id] = sub
            self._reply(c.sub_response(rid, True, sub_id), after=sub.begin)

        def from_start_fields():
            if start_pos is not None:
                go(start_pos, None)
            elif start_ts is not None:
                try:
                    off = self.broker.resolve(channel, OffsetSpec.timestamp(start_ts))
                except RiverbedError as e:
                    return go(None, e)
                go(off, None, start_ts)
            else:
                self.broker.resolve_after_writes(channel, OffsetSpec.next(), self._later(go))

        if durable_ref is None:
            from_start_fields()
            return

        def resumed(last, exc):
            if exc is not None:
                go(None, exc)
            elif last is None:
                from_start_fields()
            else:
                go(last + 1, None)
        self.broker.query_offset(channel, durable_ref, self._later(resumed))

    def _on_ackev(self, f):
        sub = self.subscriptions.get(f.get("subID"))
        if sub is None:
            return
        n = f.get("bytes")
        if c.is_int(n) and n > 0:
            sub.tail.ack(n)
        pos = f.get("pos")
        if sub.durable_ref is not None and c.is_int(pos) and pos >= 0:
            self._acks_inflight += 1

            def stored(exc):
                self._acks_inflight -= 1
                if exc is not None:
                    log.info("%s: storing durable position %r failed: %s", self.peer, sub.durable_ref, exc)
                if self._acks_inflight == 0 and self._held:
                    held, self._held = self._held, []
                    for data, after in held:
                        self._reply(data, after)
            self.broker.store_offset(sub.channel, sub.durable_ref, pos, self._later(stored))

    def _on_subclose(self, f, delete=False):
        rid = f.get("rID")
        sub = self.subscriptions.pop(f.get("subID"), None)
        if sub is None:
            self._reply(c.response(rid, False, c.ERR_COMMAND_NOT_PROCESSED, "no such subscription"))
            return
        sub.close()
        if delete and sub.durable_ref is not None:
            self.broker.delete_offset(sub.channel, sub.durable_ref,
                                      self._later(lambda exc: self._reply(c.response(rid, True))))
            return
        self._reply(c.response(rid, True))

    def _on_unsubscribe(self, f):
        self._on_subclose(f, delete=True)


# frame type -> (name, lowest state); the handler is ``_on_<type in lower case>``
COMMANDS = commands(BsonSession, {
    c.FT_CONNECT: ("CONNECT", ST_CONNECTING),
    c.FT_PUB: ("PUB", ST_OPEN),         # handled before the table while open (hot path)
    c.FT_SUBSCRIBE: ("SUBSCRIBE", ST_OPEN),
    c.FT_ACKEV: ("ACKEV", ST_OPEN),
    c.FT_SUBCLOSE: ("SUBCLOSE", ST_OPEN),
    c.FT_UNSUBSCRIBE: ("UNSUBSCRIBE", ST_OPEN),
    c.FT_STARTTX: ("STARTTX", ST_OPEN),
    c.FT_COMMITTX: ("COMMITTX", ST_OPEN),
    c.FT_ABORTTX: ("ABORTTX", ST_OPEN),
    c.FT_PING: ("PING", ST_OPEN),
    c.FT_LISTCHANNELS: ("LISTCHANNELS", ST_OPEN),
    c.FT_LISTCHANNELS_SIC: ("LISTCHANNELS", ST_OPEN),     # the real server's spelling, same command
    c.FT_CREATECHANNEL: ("CREATECHANNEL", ST_OPEN),
    c.FT_LISTBINDERS: ("LISTBINDERS", ST_OPEN),
    c.FT_CREATEBINDER: ("CREATEBINDER", ST_OPEN),
    c.FT_CREATEPROJECTION: ("CREATEPROJECTION", ST_OPEN),
    c.FT_FINDBYID: ("FINDBYID", ST_OPEN),
    c.FT_QUERY: ("QUERY", ST_OPEN),
    c.FT_QUERYACK: ("QUERYACK", ST_OPEN),
})
