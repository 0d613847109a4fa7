"""Publishing commands of a RabbitMQ Stream session: DeclarePublisher, Publish (v1 hot path, v2),
DeletePublisher, QueryPublisherSequence. Part of :class:`~riverbed.shells.rmq_stream.session.RmqStreamSession`.

Publish: an undeclared publisher gets PublishError 0x12 per id; a publisher whose stream was deleted
gets MetadataUpdate 0x06 once, then PublishError 0x02; a sub-batch with an unsupported codec, or one that
does not decompress to its declared records, gets PublishError 0x11 and the rest of the frame is stored.
Duplicates (named publishers) are confirmed, as in RabbitMQ. Confirms go out after the commit.
"""

import logging
import sys

from riverbed.engine import PublishingIds
from riverbed.engine import format as fmt
from riverbed.engine.errors import FrameError
from riverbed.shells import wire
from riverbed.shells.broker import WRITE
from riverbed.shells.broker import limits as _limits
from riverbed.shells.rmq_stream.codec import (
    _CONFIRM_HEAD, _U64, DecodeError, Reader, check_sub_batch, decode_publish, encode_publish_confirm,
    encode_publish_error, response_code_for,
)
from riverbed.shells.rmq_stream.constants import (
    CMD_DECLARE_PUBLISHER, CMD_DELETE_PUBLISHER, CMD_PUBLISH_CONFIRM, CMD_QUERY_PUBLISHER_SEQUENCE, MAX_REFERENCE,
    RC_ACCESS_REFUSED, RC_INTERNAL_ERROR, RC_NO_OFFSET, RC_OK, RC_PRECONDITION_FAILED,
    RC_PUBLISHER_DOES_NOT_EXIST, RC_STREAM_DOES_NOT_EXIST,
)
from riverbed.shells.protocols import STREAM

log = logging.getLogger("riverbed.rmq")
LISTENER = STREAM   # the one name (protocols.py): the listener label of riverbed_rejected_total


class Publisher:
    """A declared publisher of one connection."""

    __slots__ = ("publisher_id", "stream", "reference", "stream_gone")

    def __init__(self, publisher_id, stream, reference):
        self.publisher_id = publisher_id
        self.stream = sys.intern(stream) if type(stream) is str else stream   # one string per stream (engine too)
        self.reference = reference or None     # "" = unnamed: no deduplication
        self.stream_gone = False               # deleted under it: Publish gets 0x02


MAX_CONFIRM_IDS = 1 << 16      # ids per merged PublishConfirm frame (512 KiB, under any client's frame max)
# Publish frames up to this size (after their u32 size) may take the one-message path (_publish_alone): the
# engine commits appends up to its INLINE_MAX_BYTES on the caller's thread
ALONE_MAX_BYTES = 64 << 10


class PublishCommands:
    """Mixin: the publishing half of RmqStreamSession (uses its ``_send``, ``_later``, ``publishers``)."""

    def _on_declare_publisher(self, f, version):
        r = Reader(f)
        corr = r.u32()
        publisher_id = r.u8()
        reference = r.string()
        stream = r.string()
        r.done()
        if stream and self.broker.cluster is not None and not self.broker.has_stream_anywhere(stream):
            # made on another node a moment ago: etcd places it before this node's next poll sees it
            self.broker.find_stream(stream, self._later(
                lambda found: self._declare_publisher(corr, publisher_id, reference, stream, found)))
            return
        self._declare_publisher(corr, publisher_id, reference, stream,
                                bool(stream) and self.broker.has_stream_anywhere(stream))

    def _declare_publisher(self, corr, publisher_id, reference, stream, exists):
        if publisher_id in self.publishers:
            code = RC_PRECONDITION_FAILED
        elif reference and len(reference.encode("utf-8")) > MAX_REFERENCE:
            code = RC_PRECONDITION_FAILED
        elif not exists:     # a cluster forwards to the leader: a copy here is not needed
            code = RC_STREAM_DOES_NOT_EXIST
        elif not self._can(WRITE, stream):
            code = RC_ACCESS_REFUSED
        elif reference and any(p.reference == reference and p.stream == stream and not p.stream_gone
                               for p in self.publishers.values()):
            code = RC_PRECONDITION_FAILED
        else:
            self.publishers[publisher_id] = Publisher(publisher_id, stream, reference)
            code = RC_OK
        self._respond(CMD_DECLARE_PUBLISHER, corr, code)

    def _on_delete_publisher(self, f, version):
        r = Reader(f)
        corr = r.u32()
        publisher_id = r.u8()
        r.done()
        code = RC_OK if self.publishers.pop(publisher_id, None) is not None else RC_PUBLISHER_DOES_NOT_EXIST
        self._respond(CMD_DELETE_PUBLISHER, corr, code)

    def _on_query_publisher_sequence(self, f, version):
        self._tracking_query(f, CMD_QUERY_PUBLISHER_SEQUENCE, None, self.broker.query_publisher_sequence)

    def _tracking_query(self, f, cmd, permission, query):
        """QueryOffset and QueryPublisherSequence: ``corr | reference | stream`` answered with ``code |
        u64``; a value of None (no offset stored) is code 0x13."""
        r = Reader(f)
        corr = r.u32()
        reference = r.string() or ""
        stream = r.string()
        r.done()
        if not stream or not self.broker.has_stream_anywhere(stream):
            self._respond(cmd, corr, RC_STREAM_DOES_NOT_EXIST, _U64.pack(0))
            return
        if permission is not None and not self._can(permission, stream):
            self._respond(cmd, corr, RC_ACCESS_REFUSED, _U64.pack(0))
            return

        def answer(value, exc):
            if exc is not None:
                self._respond(cmd, corr, response_code_for(exc), _U64.pack(0))
            elif value is None:
                self._respond(cmd, corr, RC_NO_OFFSET, _U64.pack(0))
            else:
                self._respond(cmd, corr, RC_OK, _U64.pack(value & 0xFFFFFFFFFFFFFFFF))
        query(stream, reference, self._later(answer))

    def _on_publish(self, f, version):
        if version == 1:
            self._publish_v1(f)
        else:
            self._publish_batch(decode_publish(f, version))

    def _publish_v1(self, f):
        """The hot path: one compiled pass turns the frame into a sealed chunk (CRC included) and the raw
        publishing ids, so nothing here is per message unless a sub-batch or the publisher is bad."""
        try:
            publisher_id, count, chunk, raw_ids, first, last, increasing, records, subs = wire.publish_chunk(f, False)
        except FrameError as e:
            raise DecodeError(e.reason) from None
        pub = self.publishers.get(publisher_id)
        if pub is None or pub.stream_gone or count == 0:
            self._publish_batch(decode_publish(f, 1))   # errors for every id (or nothing to do)
            return
        if subs:
            mv = memoryview(f)
            lim = self.limits
            bad = {}
            for idx, flags, nrec, usize, a, b in subs:
                why = check_sub_batch(flags, nrec, usize, mv[a:b], lim)
                if why is not None:
                    bad[idx] = why
            if bad:
                # rare: the general path drops the refused sub-batches and reports why
                self._publish_batch(decode_publish(f, 1), bad)
                return
        ids = PublishingIds(raw_ids, first, last, increasing) if pub.reference else None
        # the CRC is the engine's to compute: only when the chunk is stored whole, not when it is cut.
        # A small frame is committed here and now when the engine can (fsync=never, writer idle): its
        # confirm then leaves with this read's replies, no completion to hand back (one message per frame)
        now = self.broker.append_chunk_now(pub.stream, chunk, ids, pub.reference, count, records, crc_done=False)
        if now is not None:
            self._published(pub, publisher_id, count, raw_ids, first, last, increasing, *now)
            return
        self._append_v1(pub, publisher_id, count, chunk, raw_ids, first, last, increasing, records, ids)

    def _append_v1(self, pub, publisher_id, count, chunk, raw_ids, first, last, increasing, records, ids):
        """A parsed Publish v1 frame appended the usual way (the engine's writer thread commits it)."""
        def done(result, exc):
            self._published(pub, publisher_id, count, raw_ids, first, last, increasing, result, exc)

        self.broker.append_chunk(pub.stream, chunk, ids, pub.reference,
                                 self._inflight(len(chunk) - fmt.LEN_CHUNK_HEADER, done), count, records,
                                 crc_done=False)

    def _set_alone_limits(self):
        """Once open (and after a later Tune): what :meth:`_publish_alone` takes. Frames up to
        ALONE_MAX_BYTES within the Publish cap, with at most as many messages as the entries limit
        allows and as one PublishConfirm frame within the client's frame_max holds."""
        self._alone_max = min(self._max_frame, ALONE_MAX_BYTES)
        self._alone_entries = min(self.limits.max_entries_per_frame, self._confirm_ids_max())

    def _publish_alone(self, data):
        """The one-message path (issue 26), beside the general one: ``data``, one whole read, is a
        single small Publish v1 frame (wire.publish_alone) of a live publisher, and no output is queued.
        One compiled pass parses it, seals its chunk and builds its PublishConfirm frame; when the engine
        commits it inline (Broker.append_chunk_now) that frame is written at once. Otherwise it goes on
        as the general path does with the parsed frame. The client sees the same bytes, the engine
        stores the same chunk and the log says the same as through ``_received`` -> ``_dispatch`` ->
        ``_publish_v1`` -> ``_send_confirm`` -> ``_flush`` (tests/shells/test_rmq_alone.py). Returns False,
        having done nothing, for anything else (then the general path reads ``data``)."""
        got = wire.publish_alone(data, self._alone_max, self._alone_entries)
        if got is None or self._out:
            return False
        publisher_id, count, chunk, raw_ids, first, last, increasing, records, confirm = got
        pub = self.publishers.get(publisher_id)
        if pub is None or pub.stream_gone:
            return False        # the errors are the general path's
        reference = pub.reference
        ids = PublishingIds.of(raw_ids, first, last, increasing) if reference else None
        broker = self.broker
        now = broker.append_chunk_now(pub.stream, chunk, ids, reference, count, records, crc_done=False,
                                      replicated=True)
        if now is None:
            self._append_v1(pub, publisher_id, count, chunk, raw_ids, first, last, increasing, records, ids)
        elif now[1] is None:
            if broker.cluster is not None:
                # a cluster leader: confirmed once a majority holds it (issue 23), as _append_v1 would
                def done(result, exc):
                    if exc is None and not self._out:
                        # nothing queued before it: the prebuilt confirm, as a lone node writes it
                        self.io.write(confirm)
                        self.last_sent = self.broker.clock()
                        return
                    self._published(pub, publisher_id, count, raw_ids, first, last, increasing, result, exc)
                broker.hold_replicated(pub.stream, reference, now[0], self._later(done))
                return True
            # the confirm after the commit, in the bytes _send_confirm and _merged_confirms would make
            self.io.write(confirm)
            self.last_sent = self.last_recv
            return True
        else:
            self._published(pub, publisher_id, count, raw_ids, first, last, increasing, *now)
        self._flush()
        return True

    def _published(self, pub, publisher_id, count, raw_ids, first, last, increasing, result, exc):
        """A Publish v1 frame's append completed: confirm its ids, or refuse each with the error's code."""
        if exc is None:
            self._send_confirm(publisher_id, count, raw_ids)
            return
        code = response_code_for(exc)
        if code == RC_INTERNAL_ERROR:
            log.error("%s: append to %r failed: %r", self.peer, pub.stream, exc)
        ids = PublishingIds(raw_ids, first, last, increasing)
        self._send(encode_publish_error(publisher_id, [(i, code) for i in ids]))

    def _send_confirm(self, publisher_id, count, raw_ids):
        """Queue a confirm of ``count`` ids (``raw_ids``: their 8-byte big-endian bytes as they came).
        Confirms of one publisher that leave in the same flush become one PublishConfirm frame, at
        the place of the first: a group commit of many Publish frames costs the client one frame to
        parse, not one per Publish (moving a confirm earlier among frames that follow it is safe)."""
        merged = self._confirms.get(publisher_id)
        if merged is None or merged[0] + count > self._confirm_ids_max():
            merged = self._confirms[publisher_id] = [count, [raw_ids], publisher_id]
            self._out.append(merged)
        else:
            merged[0] += count
            merged[1].append(raw_ids)

    def _confirm_ids_max(self):
        # a merged frame stays within the frame max the client asked for (13 bytes of frame head)
        fm = self.frame_max
        return min(MAX_CONFIRM_IDS, (fm - 13) // 8) if fm else MAX_CONFIRM_IDS

    def _merged_confirms(self, out):
        """``out`` with each merged confirm (a list in it) turned into its frame's parts."""
        done = []
        for item in out:
            if type(item) is list:
                count, parts, publisher_id = item
                size = 9 + 8 * count
                done.append(_CONFIRM_HEAD.pack(size, CMD_PUBLISH_CONFIRM, 1, publisher_id, count))
                done.extend(parts)
            else:
                done.append(item)
        self._confirms.clear()
        return done

    def _publish_batch(self, batch, refused=None):
        """Publish v2, and v1 frames the fast path hands over (refused sub-batches, unknown publisher).
        ``refused``: entry index -> Refusal, when the fast path already checked the sub-batches."""
        pub = self.publishers.get(batch.publisher_id)
        ids = batch.ids
        if pub is None or pub.stream_gone:
            if ids:
                code = RC_PUBLISHER_DOES_NOT_EXIST if pub is None else RC_STREAM_DOES_NOT_EXIST
                self._send(encode_publish_error(batch.publisher_id, [(i, code) for i in ids]))
            return
        parts = batch.parts
        filters = batch.filters
        records = len(ids)
        if batch.sub_batches:
            bad = {}
            for idx, flags, nrec, usize, body in batch.sub_batches:
                why = refused.get(idx) if refused is not None else check_sub_batch(flags, nrec, usize, body,
                                                                                   self.limits)
                if why is not None:
                    bad[idx] = why
                else:
                    records += nrec - 1
            if bad:
                first = next(iter(bad.values()))
                for why in bad.values():
                    if why.reason is not None:      # a named limit: counted in /metrics, logged there
                        _limits.reject(LISTENER, why.reason, why, self.peer)
                if first.reason is None:
                    log.warning("%s: refusing %d sub-batch(es) from publisher %d: %s", self.peer, len(bad),
                                batch.publisher_id, first)
                self._send(encode_publish_error(batch.publisher_id,
                                                [(ids[i], RC_PRECONDITION_FAILED) for i in sorted(bad)]))
                keep = [i for i in range(len(ids)) if i not in bad]
                parts = [parts[i] for i in keep]
                ids = [ids[i] for i in keep]
                records -= len(bad)
        if not parts:
            return
        data = b"".join(parts)
        size = len(data)
        publisher_id = batch.publisher_id

        def done(result, exc):
            if exc is None:
                self._send(encode_publish_confirm(publisher_id, ids))
            else:
                code = response_code_for(exc)
                if code == RC_INTERNAL_ERROR:
                    log.error("%s: append to %r failed: %r", self.peer, pub.stream, exc)
                self._send(encode_publish_error(publisher_id, [(i, code) for i in ids]))

        # the entry and record counts are exact (every entry was parsed and every sub-batch checked),
        # which spares the writer a walk over the data section
        self.broker.append(pub.stream, data, ids if pub.reference else None, pub.reference, filters,
                           self._inflight(size, done), len(ids), records)

    # ------------------------------------------------------------------------------------- consuming
