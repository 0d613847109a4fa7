"""What the engine counts for monitoring, and cheap looks at its state, for ``GET /metrics``.

Each group commit is recorded into :class:`EngineStats` (``engine.stats``) by the thread that ran it
(the writer's, or with fsync=never an inline commit's caller; one at a time, under the writer's claim):
a count, the bytes it wrote, and two latencies in fixed buckets. Recording is a few integer updates,
no lock: a reader on another thread may see one commit half-recorded (its bucket counted, the sum not
yet), which a monitoring scrape tolerates. Nothing here imports a shell or a metrics library;
the HTTP listener turns these numbers into Prometheus families (shells/http/metrics.py).

Latencies, seconds, measured in the group commit (``_Writer._commit``):

    commit  from taking the batch to the end of LMDB's commit: applying every queued operation, the
            MapFull redos, and the commit itself (what an append waits for, less the queueing before)
    fsync   LMDB's commit alone: the end of the write transaction, which under the ``batch`` and
            ``always`` fsync policies includes writing the dirty pages (pwrite) and their fdatasync;
            near zero under ``never`` (WRITEMAP: the pages are already in the map)

The helpers below read the committed state the engine keeps in memory (no LMDB read transaction per
stream): :func:`stream_states`, :func:`published_since_open`, :func:`map_usage`, :func:`writer_alive`.
"""

from bisect import bisect_left

# seconds: group commits take tens of microseconds (never) to tens of milliseconds (fsync on slow disks)
LATENCY_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
                   2.5, 5.0)


class LatencyHistogram:
    """Counts of observations per bucket (upper bounds ``bounds`` in seconds, plus one for +Inf) and
    their sum. ``observe`` from one thread; ``snapshot`` from any."""

    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds=LATENCY_BUCKETS):
        self.bounds = tuple(bounds)
        self.counts = [0] * (len(self.bounds) + 1)
        self.sum = 0.0

    def observe(self, seconds):
        # bisect_left: a value equal to a bound belongs to that bound's bucket (Prometheus' "le")
        self.counts[bisect_left(self.bounds, seconds)] += 1
        self.sum += seconds

    def snapshot(self):
        """``([(upper bound as str, cumulative count), ..., ("+Inf", total)], sum)``; the +Inf count is
        the total, as Prometheus requires."""
        counts = list(self.counts)
        total = 0
        out = []
        for bound, n in zip(self.bounds, counts):
            total += n
            out.append((repr(bound), total))
        out.append(("+Inf", total + counts[-1]))
        return out, self.sum


class EngineStats:
    """Group-commit counters of one engine (``engine.stats``), written by the committing thread (one
    at a time), and each stream's next offset when the engine opened (``opened_at``: sid -> offset).

    Records published to a stream since the engine opened are ``state.next_offset -
    opened_at.get(state.sid, 0)`` (:func:`published_since_open`): the next offset only grows, counts
    every append whatever its path (duplicates dropped by publisher dedup excluded), and costs the
    hot path nothing. Stream ids are never reused, so a stream created again under a deleted one's
    name starts from 0.
    """

    __slots__ = ("group_commits", "operations", "bytes_written", "commit", "fsync", "opened_at", "stream_syncs")

    def __init__(self, streams=None):
        self.opened_at = {s.sid: s.next_offset for s in (streams or {}).values()}
        self.group_commits = 0
        self.operations = 0           # queued operations applied (appends, offsets, creates, ...)
        self.bytes_written = 0        # chunk bytes stored
        self.stream_syncs = 0         # extra syncs for streams whose fsync argument beats the engine's
        self.commit = LatencyHistogram()
        self.fsync = LatencyHistogram()

    def commit_done(self, started, applied, committed, operations, nbytes):
        """One group commit: ``time.perf_counter()`` values at its start, when its writes were staged
        and once LMDB's commit returned; ``operations`` applied; ``nbytes`` of chunks written."""
        self.group_commits += 1
        self.operations += operations
        self.bytes_written += nbytes
        # LatencyHistogram.observe, spelled out: this runs once per commit, and once per message when
        # each message is committed on its own (one message per frame, fsync=never)
        h, d = self.commit, committed - started
        h.counts[bisect_left(h.bounds, d)] += 1
        h.sum += d
        h, d = self.fsync, committed - applied
        h.counts[bisect_left(h.bounds, d)] += 1
        h.sum += d


def published_since_open(stats, state):
    """Records appended to the stream of committed ``state`` since the engine opened (see
    :class:`EngineStats`)."""
    return state.next_offset - stats.opened_at.get(state.sid, 0)


def stream_states(engine):
    """The committed state of every stream (``layout._Stream`` objects: ``name``, ``records``,
    ``bytes``, ``chunks``, ``first_chunk``, ``next_offset``, ...) as a list. The objects are never
    mutated after their commit (the writer swaps in new ones), so they may be read freely. Memory
    only. A read-only engine answers []: its state is in LMDB.

    No lock: ``list(dict.values())`` copies in C without giving up the GIL, so the writer cannot change
    the dict in the middle; taking the engine's lock instead would stall the caller (an event loop)
    whenever the OS deschedules the writer thread while it holds it."""
    if engine.readonly:
        return []
    return list(engine._streams.values())


_PAGE_SIZE = {}


def map_usage(engine):
    """``(map size, bytes in use)`` of the LMDB environment (the file's mapped size and the pages up to
    the last one used), or None once the engine is closed. No transaction; takes the environment gate
    shared, so it never reads the map while the writer resizes it."""
    if engine._closed:
        return None
    gate = engine._gate
    gate.enter()
    try:
        if engine._closed:
            return None
        info = engine.env.info()
        psize = _PAGE_SIZE.get(engine.path)
        if psize is None:
            psize = _PAGE_SIZE[engine.path] = engine.env.stat()["psize"]
    finally:
        gate.leave()
    return info["map_size"], (info["last_pgno"] + 1) * psize


def writer_alive(engine):
    """Whether the engine's writer thread runs and takes operations (False once it stopped after a fatal
    error or for a shutdown; False for a read-only engine, which has none)."""
    w = engine._writer
    return w is not None and not engine._closed and not w.stopping and w.is_alive()
