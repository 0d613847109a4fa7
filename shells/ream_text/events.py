"""The EVENT requests of a REAM connection (a mixin of :class:`~.session.ReamSession`): publishing in
per-read batches, subscriptions as broker Tails in window mode, UNSUBSCRIBE, LIST, REMOVE.

Loop-thread only; see session.py for the output queue and the ordering of effects these rely on.
"""

from riverbed.engine import OffsetSpec
from riverbed.engine.errors import RiverbedError, StreamNotFound
from riverbed.engine.core import encode_message
from riverbed.engine.record import CT_JSON, encode_record
from riverbed.shells.broker import MODE_WINDOW
from riverbed.shells.broker.subscription import Subscription as BrokerSubscription
from riverbed.shells.ream_text import codec as C
from riverbed.shells.ream_text.codec import EVENT, K_READ, K_WRITE, ST_OPEN, ReamError, reason_of
from riverbed.shells.ream_text.delivery import delivery_text
from riverbed.shells.ream_text.projections import NOT_FOUND

WINDOW_HIGH = 1 << 20    # bytes of event deliveries queued but not written before a tail pauses
WINDOW_LOW = 256 << 10


class Subscription(BrokerSubscription):
    """An EVENT SUBSCRIBE of one stream (the broker's one :class:`~riverbed.shells.broker.subscription.
    Subscription`): resolving (``start`` None), waiting for the stream (no tail), or tailing it."""
    __slots__ = ()


class EventRequests:
    """EVENT PUBLISH/SUBSCRIBE/UNSUBSCRIBE/LIST/REMOVE handlers."""

    def _on_event_publish(self, req, payloads):
        stream = req.words[2]
        self._allow("write", stream)
        if not self.broker.has_stream(stream):
            self._allow("configure", stream)     # the first publish creates the stream
        payload = payloads[0]
        C.check_json_object(payload)
        self._batch_add(stream, [req.slot], [encode_record(payload, CT_JSON)])

    def _publish_allowed(self, stream):
        """Whether this user may publish to ``stream`` now (write; configure too when the publish would
        create it): :meth:`_on_event_publish`'s checks, without refusing."""
        broker, user = self.broker, self.user
        if not broker.allowed(user, "write", stream):
            return False
        return broker.has_stream(stream) or broker.allowed(user, "configure", stream)

    def _json_records(self, payloads):
        """The stored records of the leading payloads that :func:`codec.check_json_object` accepts, up
        to the first it refuses."""
        encode = encode_message
        return [encode((payload,), CT_JSON) for payload in payloads[:C.leading_json_objects(payloads)]]

    def _batch_add(self, stream, slots, records):
        """Add publishes (reply slots and records, as many records as the slots' ``replies``) to this
        read's batch: one engine append per run of one stream, submitted when another stream or request
        comes (or the read ends)."""
        batch = self.batch
        if batch is not None and batch[0] != stream:
            self._submit_batch()
            batch = None
        if batch is None:
            batch = self.batch = (stream, [], [])
        batch[1].extend(slots)
        batch[2].extend(records)

    def _submit_batch(self):
        batch = self.batch
        if batch is None:
            return
        self.batch = None
        stream, slots, records = batch
        self._run(K_WRITE, lambda: self._append(stream, slots, records))

    def _append(self, stream, slots, records):
        self._begin(K_WRITE)

        def done(res, exc):
            self._end(K_WRITE)
            if exc is not None:
                data = C.non(EVENT, "PUBLISHED", C.name_token(stream), reason_of(exc))
                for s in slots:
                    s.data = data * s.replies
            else:
                event_id = res.first_offset + 1
                token = C.name_token(stream).encode("utf-8")
                for s in slots:
                    n = s.replies
                    if n == 1:
                        s.data = b"EVENT PUBLISHED %s %d\n" % (token, event_id)
                    else:
                        head = b"EVENT PUBLISHED %s " % token
                        s.data = b"".join([b"%s%d\n" % (head, i) for i in range(event_id, event_id + n)])
                    event_id += n
            self._flush()
        try:
            self.shell.publish(stream, records, done)
        except RiverbedError as e:
            done(None, e)

    def _on_event_subscribe(self, req, payloads):
        self._need(req, 4)
        stream = req.words[2]
        self._allow("read", stream)
        word = req.words[3]
        if not (word.isascii() and word.isdigit()) or len(word) > 19:
            raise ReamError(f"Invalid event id {word!r}")
        first_id = max(1, int(word))
        if stream in self.subs:
            raise ReamError(f"Already subscribed to {stream}")
        sub = Subscription(self, stream, None)
        self.subs[stream] = sub
        slot = req.slot
        token = C.name_token(stream)
        self._begin(K_READ)

        def resolved(next_offset, exc):
            if sub.closed or self.state != ST_OPEN:
                slot.data = C.line("EVENT", "SUBSCRIBED", token, "EMPTY")
                self._end(K_READ)
                self._flush()
                return
            start = first_id - 1
            info = None
            if exc is None:
                try:
                    info = self.broker.stream_info(stream)
                except RiverbedError:
                    info = None
            if info is None or info.last_offset < 0:
                slot.data = C.line("EVENT", "SUBSCRIBED", token, "EMPTY")
            else:
                start = max(start, info.first_offset)
                slot.data = C.line("EVENT", "SUBSCRIBED", token, start + 1, info.last_offset + 1)
            sub.start = start
            self._end(K_READ)
            self._flush()
            if info is not None:
                self._start_tail(sub)
        # a cluster node holding no copy makes one from the leader first (remote_read.py); else at once
        self.broker.when_readable(stream, lambda exc: self.broker.resolve_after_writes(stream, OffsetSpec.next(),
                                                                                        resolved))

    def _start_tail(self, sub):
        stream = sub.stream
        name = C.name_token(stream).encode("utf-8")

        def on_records(tail, batch):
            parts = []
            for off, raw in batch:          # raw records: REAM's own take delivery.py's fast path
                body = delivery_text(raw)
                parts.append(b"EVENT %s %d %d\n%s\n" % (name, off + 1, len(body), body))
            if not parts:
                return 0
            data = b"".join(parts)
            self._push(data, tail, len(data))
            return len(data)

        def on_gone(exc):
            if sub.tail is tail and not sub.closed:
                sub.stop_tail()
                sub.start = 0   # deleted: wait for the stream to appear again, then read it from id 1
        tail = sub.open_tail(on_records, on_gone=on_gone, mode=MODE_WINDOW, window_high=WINDOW_HIGH,
                             window_low=WINDOW_LOW, records=True)
        sub.begin()

    def _end_sub(self, sub):
        sub.close()

    def _on_event_unsubscribe(self, req, payloads):
        self._need(req, 3)
        stream = req.words[2]
        sub = self.subs.pop(stream, None)
        if sub is None:
            raise ReamError(f"Not subscribed to {stream}")
        tail = sub.tail
        self._end_sub(sub)
        if tail is not None:
            # events of this stream queued behind this reply's slot go out before it ("flushed")
            out = self.out
            i = out.index(req.slot) if req.slot in out else -1
            if i >= 0:
                later = [s for s in list(out)[i + 1:] if s.tail is tail]
                for s in later:
                    out.remove(s)
                for j, s in enumerate(later):
                    out.insert(i + j, s)
        self._answer(req, C.line("EVENT", "UNSUBSCRIBED", C.name_token(stream)))

    def _on_event_list(self, req, payloads):
        self._need(req, 2)
        names = self.broker.list_streams()
        self._answer(req, C.line("EVENT", "LISTED", len(names), *map(C.name_token, names)))

    def _on_event_remove(self, req, payloads):
        self._need(req, 3)
        stream = req.words[2]
        self._allow("configure", stream)
        if not self.broker.has_stream_anywhere(stream):     # in a cluster, also one held by other nodes only
            raise ReamError(NOT_FOUND)
        slot = req.slot
        self._begin(K_WRITE)

        def done(exc):
            self._end(K_WRITE)
            token = C.name_token(stream)
            if exc is None:
                self._fill(slot, C.line("EVENT", "REMOVED", token))
            elif isinstance(exc, StreamNotFound):
                self._fill(slot, C.non(EVENT, "REMOVED", token, NOT_FOUND))
            else:
                self._fill(slot, C.non(EVENT, "REMOVED", token, reason_of(exc)))
        self.broker.delete_stream(stream, done)
