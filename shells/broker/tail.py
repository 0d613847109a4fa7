"""Tailing subscriptions: one reader of one stream for one subscriber, at the subscriber's pace.

A :class:`Tail` reads committed chunks from its offset and hands each user chunk to the session's
``on_chunk``; when it has read everything committed it arms an engine watch and sleeps until the next
commit. It never reads ahead of what the subscriber may take, so a slow consumer holds at most one read
batch in the broker whatever its backlog: the rest stays in the log.

Flow control, two kinds (the session picks one):

* **credit** (RabbitMQ Stream): ``grant(n)`` adds n units; ``on_chunk`` returns the units a chunk used
  (1 per Deliver, 0 for a chunk a filter skipped). Delivery stops at 0.
* **window** (every other protocol): ``on_chunk`` returns the bytes it sent; delivery pauses once more
  than ``window_high`` bytes are unacknowledged and resumes when ``ack(n)`` brings them to
  ``window_low`` or below.

Independently, ``pause()``/``resume()`` follow the transport's write buffer (a peer that does not read
stops delivery before the buffer grows). One pump delivers at most ``budget`` chunks, then yields to the
loop through ``defer`` so that one busy subscriber cannot starve the other connections.

What the subscriber gets, two kinds (the session picks one):

* **records** (``records=True``; every protocol but RabbitMQ Stream): ``on_chunk(tail, batch)`` gets a
  :class:`~riverbed.shells.broker.records.RecordBatch`, the records of one committed user chunk from the
  first one the subscriber has not had, each with its offset, timestamp (the one rule of records.py)
  and decoded view. A chunk whose records do not walk is logged and skipped: it never stops the records
  after it.
* **chunks** (RabbitMQ Stream, whose wire format is the chunk): ``on_chunk(tail, chunk_id, raw, start)``
  gets the stored chunk (header, bloom, data) and ``start``, the first offset in it the subscriber has
  not had (a reader that started inside a chunk skips the records before it).

Either way, when ``on_chunk`` is called ``tail.offset`` already points past the chunk; a
record-at-a-time protocol that must stop inside the chunk (its window filled up) sets ``tail.offset`` to
the first record it did not send, and the next pump starts there. Loop-thread only.
"""

import logging

from riverbed.engine import core
from riverbed.engine.errors import ChunkError, StreamNotFound
from riverbed.shells.broker.records import RecordBatch, chunk_span

log = logging.getLogger("riverbed.broker")

DELIVER_BUDGET = 32     # chunks one pump may deliver before yielding to other connections
READ_BYTES = 4 << 20    # about this many chunk bytes per read: chunks of up to 1 MiB (staged.CHUNK_BODY_RECORDS)
                        # would otherwise put 32 MiB in the broker at once for one subscriber
MODE_CREDIT = "credit"
MODE_WINDOW = "window"


class Tail:
    """A tailing reader of ``stream`` from ``offset``. See the module docstring for the two modes.

    ``defer(fn)`` schedules ``fn()`` on the loop soon (``loop.call_soon``). ``on_gone(exc)`` is called
    once when the stream is deleted (StreamNotFound) or a chunk is corrupt (ChunkError); delivery then
    stops for good. Nothing is delivered before :meth:`start`. ``records``: deliver
    :class:`~riverbed.shells.broker.records.RecordBatch` objects instead of chunk bytes.
    """

    __slots__ = ("broker", "stream", "offset", "on_chunk", "on_gone", "defer", "mode", "units", "window_high",
                 "window_low", "outstanding", "budget", "_stalled", "_paused", "_closed", "_started",
                 "_cancel_wait", "_scheduled", "records", "_chunk_bytes")

    def __init__(self, broker, stream, offset, on_chunk, *, defer, on_gone=None, mode=MODE_CREDIT, credit=0,
                 window_high=4 << 20, window_low=2 << 20, budget=None, records=False):
        self.broker = broker
        self.stream = stream
        self.offset = offset          # next offset to read: the chunk holding it is delivered next
        self.on_chunk = on_chunk
        self.on_gone = on_gone
        self.defer = defer
        self.mode = mode
        self.units = credit           # credit mode: chunks the subscriber may still take
        self.window_high = window_high
        self.window_low = window_low
        self.outstanding = 0          # window mode: bytes sent and not acknowledged
        self.budget = budget or DELIVER_BUDGET
        self._stalled = False         # window mode: over the high mark, waiting to drain to the low one
        self._paused = False          # the transport's write buffer is full
        self._closed = False
        self._started = False
        self._cancel_wait = None
        self._scheduled = False
        self.records = records
        self._chunk_bytes = 0         # the size of the last chunk read (how many to read at once)
        readers = broker.readers      # open tails per stream (an idle observer copy is dropped: remote_read.py)
        readers[stream] = readers.get(stream, 0) + 1

    # ------------------------------------------------------------------------------- flow control

    def grant(self, n):
        """Credit mode: ``n`` more chunks may be delivered."""
        self.units += n
        self.pump()

    def ack(self, nbytes):
        """Window mode: the subscriber has taken ``nbytes`` more (never below zero outstanding)."""
        self.outstanding = max(0, self.outstanding - nbytes)
        if self._stalled and self.outstanding <= self.window_low:
            self._stalled = False
            self.pump()

    def pause(self):
        """The transport cannot take more now."""
        self._paused = True

    def resume(self):
        self._paused = False
        self.pump()

    @property
    def closed(self):
        """True once :meth:`close` ran or the stream went away."""
        return self._closed

    @property
    def can_deliver(self):
        if self._closed or self._paused or not self._started:
            return False
        if self.mode == MODE_CREDIT:
            return self.units > 0
        return not self._stalled

    # ---------------------------------------------------------------------------------- lifecycle

    def start(self, offset=None):
        """Begin (or, after :meth:`stop`, begin again) delivering, from ``offset`` when given."""
        if offset is not None:
            self.offset = offset
        self._started = True
        self.pump()

    def stop(self):
        """Stop delivering (a single-active-consumer step-down) until :meth:`start` again."""
        self._started = False
        self._unwatch()

    def close(self):
        """Stop for good; idempotent."""
        if not self._closed:
            self._closed = True
            readers = self.broker.readers
            left = readers.get(self.stream, 0) - 1
            if left > 0:
                readers[self.stream] = left
            else:
                readers.pop(self.stream, None)
        self._unwatch()

    def _unwatch(self):
        if self._cancel_wait is not None:
            self._cancel_wait()
            self._cancel_wait = None

    # ------------------------------------------------------------------------------------ reading

    def pump(self):
        """Deliver while the subscriber may take more and committed chunks are there; then arm a watch."""
        budget = self.budget
        while self.can_deliver:
            if budget <= 0:
                if not self._scheduled:
                    self._scheduled = True
                    self.defer(self._deferred)
                return
            n = min(self.units, budget) if self.mode == MODE_CREDIT else min(4, budget)
            if self._chunk_bytes:
                n = min(n, max(1, READ_BYTES // self._chunk_bytes))
            try:
                chunks = self.broker.read_chunks(self.stream, self.offset, n)
            except (StreamNotFound, ChunkError) as e:
                self._gone(e)
                return
            if not chunks:
                self._arm_wait()
                return
            self._chunk_bytes = len(chunks[-1][1])
            for chunk_id, raw in chunks:
                budget -= 1
                start = self.offset
                try:
                    user, taken, chunk_ts = chunk_span(raw)
                except ChunkError as e:
                    self._gone(e)
                    return
                self.offset = chunk_id + taken
                if not user:
                    continue
                if self.records:
                    try:
                        batch = RecordBatch(self.stream, chunk_id, chunk_ts, max(start, chunk_id), self.offset,
                                            core.chunk_records(raw, False))
                    except ChunkError as e:    # one unreadable chunk must not stop the records after it
                        log.error("cannot read the records of chunk %d of %r: %s", chunk_id, self.stream, e)
                        continue
                    used = self.on_chunk(self, batch)
                else:
                    used = self.on_chunk(self, chunk_id, raw, max(start, chunk_id))
                if used:    # metrics: records the subscriber got (it may have stopped inside the chunk)
                    delivered = self.broker.stats.delivered
                    delivered[self.stream] = delivered.get(self.stream, 0) + self.offset - max(start, chunk_id)
                if self._closed:
                    return
                if self.mode == MODE_CREDIT:
                    self.units -= used
                else:
                    self.outstanding += used
                    if self.outstanding > self.window_high:
                        self._stalled = True
                if not self.can_deliver:
                    break

    def _deferred(self):
        self._scheduled = False
        self.pump()

    def _gone(self, exc):
        if self._closed:
            return
        self.close()
        if self.on_gone is not None:
            self.on_gone(exc)

    def _arm_wait(self):
        if self._cancel_wait is not None:
            return

        def woke(exc):
            self._cancel_wait = None
            if self._closed:
                return
            if exc is None:
                self.pump()
            else:
                self._gone(exc)
        self._cancel_wait = self.broker.watch(self.stream, self.offset, woke)
