"""Record-level reads: the log's records, one at a time, with their offset, timestamp and decoded view.

Every shell but RabbitMQ Stream (whose wire format is the chunk) reads the log through here, so none of
them parses chunk bytes: the engine's walk (``core.read_header``, ``core.chunk_records``) does that once,
and this module turns a stored chunk into a :class:`RecordBatch`, the records of that chunk the reader
has not had yet.

**The timestamp rule** (one rule for every protocol, :func:`record_timestamp`): a record's timestamp, in
ms since the epoch, is its AMQP 1.0 ``creation-time`` when it has one, else the timestamp of the chunk it
was committed in. Why this one:

* ``creation-time`` is the event's own time, and it is what a publisher gave: a Streamr ``ts``, an AMQP
  creation-time set by a RabbitMQ Stream client, the moment a BSON PUB reached the broker. Reading it
  back unchanged, on every protocol, is what the publisher expects (a Streamr message keeps its
  timestamp); an event published over one protocol carries the same time on all the others.
* A record without one (a raw RabbitMQ Stream payload, a ZeroMQ PUT, a REAM event) still has a time,
  and the best the log knows: when its chunk was committed, which RabbitMQ Stream delivers too.
* A chunk's timestamp is a storage detail shared by up to a thousand records from many publishers; it
  is never earlier than the creation-time the broker stamps (a BSON event's time is read before its
  chunk is built), so for those the two differ by at most one group commit.

Seeking by time (``OffsetSpec.timestamp``) uses the log's chunk index; a reader that must not show
records older than a time (a BSON ``startTimestamp``, a Streamr resend ``from`` a time) also checks each
record's timestamp by the rule, so what it shows agrees with what it filtered on.

Costs: the records of a chunk are the engine's ``chunk_records`` (one ``bytes`` per record, as any
reader of a record needs); a :class:`RecordBatch` is one object per chunk, and :meth:`RecordBatch.records`
decodes a record only when the reader gets to it (a reader that stops inside a chunk decodes no more).

Thread safety: the functions and a batch hold no shared state; a batch belongs to the reader it was
given to. :func:`read_records` reads through ``reader.read_chunks`` (a Broker or an Engine).
"""

import logging

from riverbed.engine import core
from riverbed.engine import format as fmt
from riverbed.engine.errors import ChunkError
from riverbed.engine.record import decode_record

log = logging.getLogger("riverbed.broker")

_H_TYPE, _H_RECORDS, _H_TIMESTAMP = fmt.H_TYPE, fmt.H_RECORDS, fmt.H_TIMESTAMP
_CHUNK_USER = fmt.CHUNK_USER


def record_timestamp(view, chunk_timestamp):
    """The timestamp rule (module docstring): ``view.creation_time`` (a decoded
    :class:`riverbed.engine.record.Record`) when it has one, else ``chunk_timestamp``; ms since the epoch."""
    ts = view.creation_time
    return chunk_timestamp if ts is None else ts


def chunk_span(raw):
    """``(is_user_chunk, next_offset_delta, chunk_timestamp)`` of a stored chunk: whether it holds user
    records (False for the log's own offset-tracking chunks), how many offsets it takes (at least 1), and
    its timestamp in ms. Raises ChunkError for a bad header."""
    h = core.read_header(raw)
    return h[_H_TYPE] == _CHUNK_USER, h[_H_RECORDS] or 1, h[_H_TIMESTAMP]


class RecordBatch:
    """The records of one committed user chunk of ``stream`` from offset ``start`` (the first one the
    reader has not had) to ``next_offset`` (exclusive: the offset after the chunk).

    * ``for offset, raw in batch`` - the stored bytes, not decoded (a reader that forwards or renders
      raw records, e.g. ZeroMQ).
    * :meth:`records` - ``(offset, timestamp, view)`` per record, decoded as the iteration reaches it:
      ``view`` is :func:`riverbed.engine.record.decode_record` of the record, ``timestamp`` the rule of
      the module docstring.
    * ``len(batch)`` - the number of records from ``start``.

    ``chunk_id`` and ``chunk_timestamp`` are the chunk's. Read-only to its users.
    """

    __slots__ = ("stream", "chunk_id", "chunk_timestamp", "start", "next_offset", "raws")

    def __init__(self, stream, chunk_id, chunk_timestamp, start, next_offset, raws):
        self.stream = stream
        self.chunk_id = chunk_id
        self.chunk_timestamp = chunk_timestamp
        self.start = start
        self.next_offset = next_offset
        self.raws = raws          # every record of the chunk (bytes), from chunk_id

    def __len__(self):
        return max(0, len(self.raws) - (self.start - self.chunk_id))

    def __iter__(self):
        skip = self.start - self.chunk_id
        raws = self.raws[skip:] if skip else self.raws
        return zip(range(self.start, self.start + len(raws)), raws)

    def records(self, stop=None):
        """Yield ``(offset, timestamp, view)`` from ``start`` up to ``stop`` (inclusive; None: to the end)."""
        chunk_ts = self.chunk_timestamp
        start = self.start
        end = self.chunk_id + len(self.raws)
        if stop is not None and stop < end:
            end = stop + 1
        skip = start - self.chunk_id
        raws = self.raws[skip:] if skip else self.raws
        decode = decode_record
        for offset, raw in zip(range(start, end), raws):
            view = decode(raw)
            ts = view.creation_time
            yield offset, chunk_ts if ts is None else ts, view


def read_records(reader, stream, offset, max_chunks, stop=None):
    """Up to ``max_chunks`` chunks' worth of the committed records of ``stream`` from ``offset``:
    ``(batches, next_offset)``, a list of :class:`RecordBatch` (user chunks only; a batch's records may
    run past ``stop``, which only ends the read) and the offset to read from next (``offset`` itself when
    nothing more is committed). ``stop`` (exclusive) ends the read at the chunk that reaches it.
    ``reader`` has ``read_chunks(stream, offset, n)`` (a Broker or an Engine). A chunk whose data does not
    walk is logged and skipped (a reader never stops on one). Raises StreamNotFound, and ChunkError for a
    chunk whose header or CRC is bad (from ``read_chunks``)."""
    batches = []
    for chunk_id, raw in reader.read_chunks(stream, offset, max_chunks):
        user, taken, chunk_ts = chunk_span(raw)
        if user:
            try:
                batches.append(RecordBatch(stream, chunk_id, chunk_ts, max(offset, chunk_id), chunk_id + taken,
                                           core.chunk_records(raw, False)))
            except ChunkError as e:
                log.error("cannot read the records of chunk %d of %r: %s", chunk_id, stream, e)
        offset = chunk_id + taken
        if stop is not None and offset >= stop:
            break
    return batches, offset


def scan_records(reader, stream, start, stop, batch_chunks=16):
    """Yield ``(offset, timestamp, view)`` for every committed record of ``stream`` in ``[start, stop)``,
    reading ``batch_chunks`` chunks at a time (bounded memory). Raises as :func:`read_records`."""
    offset = start
    while offset < stop:
        batches, nxt = read_records(reader, stream, offset, batch_chunks, stop)
        for b in batches:
            for item in b.records(stop - 1):
                yield item
        if nxt == offset:
            return
        offset = nxt
