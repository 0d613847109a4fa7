"""A Fetch's records for one partition: the stored chunks read in place and written as record batches v2
into one buffer.

The chunks are read through ``Broker.read_chunk_views``: memoryviews into LMDB's map, valid inside one
short read transaction, so no chunk is copied out of the map. Before the first write the buffer is made
long enough for every chunk of that read (``wire.kafka_reserve``, from the chunk headers), and each
chunk's batch is written in place after the one before (``wire.kafka_chunk_batch_at``): the buffer is
not regrown chunk by chunk. A read takes the chunks that can fill what is left of the limit (by their
stored size, with half again as margin: a Kafka record is mostly smaller than its stored form), so one
read transaction normally serves the whole answer.

Not thread-safe: one Fetch, on the event loop.
"""

import logging

from riverbed.engine.errors import ChunkError, RiverbedError, StreamNotFound
from riverbed.shells import wire
from riverbed.shells.broker.records import chunk_span
from riverbed.shells.kafka import codec as C
from riverbed.shells.kafka import records as R

log = logging.getLogger("riverbed.kafka")

READ_MAX_CHUNKS = 1024      # chunks one read transaction of a Fetch takes at most


def read_batches(broker, stream, offset, limit):
    """Record batches v2 from ``offset``, one per stored chunk, written one after the other into one
    bytearray (no object per record: :func:`riverbed.shells.wire.kafka_chunk_batch_at`), stopped once
    ``limit`` bytes are reached (the first batch is always whole). The log's own chunks (offset
    tracking) become an empty batch over their offsets, so a consumer moves past them. A chunk whose
    header or CRC is bad ends the answer before it (the chunks before it are sent; a Fetch from it gets
    no records)."""
    w = _Batches(stream, offset, limit)
    while w.filled < limit:
        was = w.pos
        left = limit - w.filled
        try:
            broker.read_chunk_views(stream, w.pos, w.add, READ_MAX_CHUNKS, left + (left >> 1))
        except (StreamNotFound, RiverbedError):
            break
        if w.pos == was:
            break
    return w.result()


class _Batches:
    """The buffer of one partition's answer: ``out[:filled]`` written, the rest room reserved;
    ``pos`` the next offset to answer."""

    __slots__ = ("stream", "out", "filled", "pos", "limit")

    def __init__(self, stream, offset, limit):
        self.stream = stream
        self.out = bytearray()
        self.filled = 0
        self.pos = offset
        self.limit = limit

    def add(self, chunks):
        # inside the read transaction: the views are valid only until this returns
        wire.kafka_reserve(self.out, self.filled, chunks)
        pos = self.pos
        for chunk_id, raw in chunks:
            user, taken, chunk_ts = chunk_span(raw)     # read_chunk_views checked the header
            nxt = chunk_id + taken
            if nxt <= pos or not user:
                continue            # the log's own chunks: covered by the gap before the next batch
            start = max(pos, chunk_id)
            if start > pos:         # an empty batch over the offsets of the log's own chunks before it
                self._put(_empty_batch(pos, start - 1))
            try:
                self.filled = wire.kafka_chunk_batch_at(raw, start - chunk_id, start, chunk_ts, self.out,
                                                        self.filled, R.from_stored)
            except ChunkError as e:
                log.error("cannot read the records of chunk %d of %r: %s", chunk_id, self.stream, e)
            pos = nxt
            if self.filled >= self.limit:
                self.pos = pos
                return
        if chunks:
            last_id, last_raw = chunks[-1]
            nxt = last_id + chunk_span(last_raw)[1]
            if nxt > pos:           # the read ended on chunks of the log's own
                self._put(_empty_batch(pos, nxt - 1))
                pos = nxt
        self.pos = pos

    def _put(self, data):
        self.out[self.filled:self.filled + len(data)] = data
        self.filled += len(data)

    def result(self):
        del self.out[self.filled:]
        return self.out


def _empty_batch(first, last):
    # a batch with no records whose offset delta spans ``first..last`` (what compaction leaves in Kafka)
    b = bytearray(C.encode_batch(first, [(0, None, b"", [])]))
    # rewrite: zero records, last offset delta, no record bytes
    head = b[:C.LEN_BATCH_HEADER]
    C._I32.pack_into(head, 8, C.LEN_BATCH_HEADER - C.LEN_BATCH_OVERHEAD)
    C._I32.pack_into(head, 23, last - first)
    C._I32.pack_into(head, 57, 0)
    C._U32.pack_into(head, 17, C.crc32c(bytes(head[21:])))
    return bytes(head)
