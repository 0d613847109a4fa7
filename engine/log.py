"""The log: every stream of a data directory in one LMDB environment, written by one group-commit thread.

This module is the Engine: its API, its reads and its lifecycle. The LMDB layout (keys, values, the
per-stream state) is drawn at the top of :mod:`riverbed.engine.layout`, the chunk at the top of
:mod:`riverbed.engine.format`; the writer thread is :mod:`riverbed.engine.writer`.

Writes: one writer thread per environment takes operations from a queue, applies everything that is
pending in ONE write transaction (group commit), commits, syncs according to the fsync policy, and only
then completes the callers' futures and wakes tailing readers. Appends to the same stream that meet in
one transaction share one chunk. Tracking state (publisher sequences, consumer offsets) is written in
the same transaction as the records it belongs to. py-lmdb releases the GIL during commit, so the
thread does not stall an asyncio loop.

Reads: each read opens its own short read transaction and sees only committed data. Every chunk is
CRC-checked before it is returned; a corrupt chunk raises ChunkError naming the stream and chunk id.

Durability (``fsync``):

    always  each group commit is fsynced (data and meta pages) before any append in it is acknowledged:
            acknowledged records survive a process crash and a power loss.
    batch   (default) each group commit fsyncs its data pages but not the meta page (LMDB NOMETASYNC):
            a process crash loses nothing acknowledged; a power loss may undo the last group commit
            (at most a few milliseconds of acknowledged appends), and never corrupts the environment.
    never   no fsync (LMDB NOSYNC): a process crash loses nothing acknowledged (the OS page cache holds
            it); a power loss may lose everything since the OS last flushed and may corrupt the
            environment. This matches RabbitMQ streams, whose confirms mean "in the page cache".

Per stream: the ``fsync`` stream argument (always, batch, never) raises one stream's durability above
the engine's policy: a group commit that touches such a stream is synced as a whole (data and meta
pages, ``env.sync``) before anything in it is acknowledged. It never lowers it: one LMDB environment
syncs as a whole, so a stream asking for less than the engine gets the engine's policy. On a cluster
member this is also what a member's acknowledgement means (it acks a chunk only once stored under the
stream's policy), so a stream can be replicated and fsynced.
"""

import json
import logging
import os
import sys
import threading
import time
from collections import namedtuple
from concurrent.futures import Future

import lmdb

from riverbed.engine import core
from riverbed.engine.errors import ChunkError, EngineClosed, InvalidArgument, RiverbedError, StreamNotFound
from riverbed.engine.format import (
    H_CHUNK_ID, H_RECORDS, H_TIMESTAMP, LEN_CHUNK_HEADER, TRACKING_OFFSET, TRACKING_SEQUENCE,
)
from riverbed.engine.layout import (  # noqa: F401 - re-exported: the engine's public names live here
    _CHUNK_KEY, _SID, _TIME_KEY, _U64, _U64_MAX, DEFAULT_CHUNK_MAX_BYTES, FSYNC_RANK, DEFAULT_CHUNK_MAX_RECORDS,
    FORMAT_VERSION, FORMATS_READ, MAX_CHUNK_ENTRIES, TS_BIAS, AppendResult, PublishingIds, StreamInfo, _check_name, _Stream,
    _tracking_key, normalize_arguments, parse_max_age,
)
from riverbed.engine.space import MapSpace
from riverbed.engine.sparse import chunk_times, roll_forward, seek_timestamp
from riverbed.engine.stats import EngineStats
from riverbed.engine.supers import SuperStreamBindings
from riverbed.engine.writer import (  # noqa: F401
    _OP_APPEND, _OP_CREATE, _OP_DELETE, _OP_OFFSET, _OP_RETENTION, _OP_SUPER_CREATE, _OP_SUPER_DELETE,
    _OP_SYNC, _OP_TXN, _OP_REPLICA, _OP_TRUNCATE, _OP_TRIM, Done, WriteContext, _Append, _Writer,
)

log = logging.getLogger("riverbed.engine")

FSYNC_POLICIES = ("always", "batch", "never")
DEFAULT_FSYNC = "batch"
# bytes: the map (the data file, reserved on disk: space.py) a new environment starts with; it grows by
# doubling when full, in steps of at most 1 GiB
DEFAULT_MAP_SIZE = 64 << 20
# MDB_WRITEMAP: "1" always, "0" never; unset: only with fsync=never (see lmdb_flags)
WRITEMAP = os.environ.get("RIVERBED_WRITEMAP")


def lmdb_flags(fsync):
    """The LMDB environment flags of fsync policy ``fsync``: a dict of ``sync``, ``metasync`` and
    ``writemap`` for ``lmdb.open`` (the fsync floor, bench/fsync_floor.py, opens with the same).

    ``batch`` is LMDB's NOMETASYNC: one sync of the data pages per commit, before its meta page is
    written; that meta page reaches the disk with the next commit's sync. WRITEMAP only with ``never``:
    there pages stay dirty in the map and a commit is a few stores. Under a sync policy each commit's
    sync leaves the map's pages clean and write-protected, so the next commit's puts take one page
    fault per page they touch (~45 µs of a one-message commit on the VM of issue 26); without WRITEMAP
    LMDB builds dirty pages in memory and writes them with pwrite, then fdatasync, and a batched append
    is also cheaper (one copy instead of a fault per page). ``RIVERBED_WRITEMAP=1``/``0`` forces it."""
    writemap = fsync == "never" if WRITEMAP is None else WRITEMAP == "1"
    return {"sync": fsync != "never", "metasync": fsync == "always", "writemap": writemap}


def _byte_view(obj):
    """Whether ``obj`` is a memoryview LMDB can put as it is: C-contiguous bytes (``len`` counts bytes)."""
    return type(obj) is memoryview and obj.c_contiguous and obj.itemsize == 1 and obj.ndim == 1


class OffsetSpec(namedtuple("OffsetSpec", "kind value")):
    """Where a reader starts: ``OffsetSpec.first()``, ``.last()``, ``.next()``, ``.offset(n)`` or
    ``.timestamp(ms)``. Resolve it with :meth:`Engine.resolve`."""

    __slots__ = ()

    @classmethod
    def first(cls):
        return cls("first", None)

    @classmethod
    def last(cls):
        return cls("last", None)

    @classmethod
    def next(cls):
        return cls("next", None)

    @classmethod
    def offset(cls, n):
        return cls("offset", int(n))

    @classmethod
    def timestamp(cls, ms):
        return cls("timestamp", int(ms))


# --------------------------------------------------------------------------------------------------------
# the environment gate: LMDB may only be remapped while no transaction is open in this process


class _Gate:
    """Shared/exclusive gate around transactions, so the map can be resized safely.

    Every transaction of this process holds it shared; a map resize (rare: the map doubles) takes it
    exclusive. The shared side is on every read, so it takes no lock: a holder is a token in a list, and
    ``list.append``/``pop`` are atomic under the GIL. The resizer raises ``_resizing`` before it looks at
    the holders, and a reader looks at ``_resizing`` after it has added its token, so one of the two
    always sees the other.
    """

    def __init__(self):
        self._holders = []
        self._resizing = False
        self._open = threading.Event()
        self._open.set()
        self._exclusive = threading.Lock()

    def enter(self):
        holders = self._holders
        while True:
            holders.append(None)
            if not self._resizing:
                return
            holders.pop()
            self._open.wait()

    def leave(self):
        self._holders.pop()

    def exclusive(self, fn):
        """Run ``fn`` with no transaction open in this process. The caller must hold none itself."""
        with self._exclusive:
            self._open.clear()
            self._resizing = True
            try:
                while self._holders:
                    time.sleep(0.0002)
                return fn()
            finally:
                self._resizing = False
                self._open.set()


# An append up to this size may commit on the caller's thread (fsync=never, writer idle). A bigger one
# goes to the writer thread even then: copying it into the map takes long enough that the caller (an
# event loop reading the next frames) is better off doing that meanwhile, on the other core.
INLINE_MAX_BYTES = 64 << 10


class Engine(SuperStreamBindings):
    """A data directory: its LMDB environment, its streams and its single writer thread.

    Every method is thread-safe. Writer operations (create, delete, append, store_offset) return
    ``concurrent.futures.Future`` objects completed on the writer thread after the commit (and the
    fsync the policy asks for); from asyncio, ``await asyncio.wrap_future(f)``. Reads run on the
    calling thread in their own read transaction and block only for LMDB page access.

    ``readonly=True`` opens without a writer (for ``riverbed dump`` and Spark executors); writer
    operations then raise RiverbedError. Only one read-write Engine may use a data directory at a time
    (a second one raises RiverbedError naming the lock file).

    Disk space (space.py): the data file is reserved on disk before LMDB writes into it, so a full
    filesystem never crashes the process. An append, transaction or other write that would need more space
    than the filesystem can give, or would take the data file past ``max_size`` bytes (None: no cap),
    fails alone with :class:`StorageFull` (nothing of it stored); the engine goes on, and the same write
    succeeds once space returns. ``map_size`` is the map a new environment starts with (it grows).
    """

    def __init__(self, path, *, fsync=DEFAULT_FSYNC, map_size=DEFAULT_MAP_SIZE, readonly=False,
                 retention_interval=1.0, max_batch_bytes=64 << 20, clock=None, max_size=None):
        if fsync not in FSYNC_POLICIES:
            raise InvalidArgument(f"fsync must be one of {', '.join(FSYNC_POLICIES)}, not {fsync!r}")
        self.path = os.fspath(path)
        self.fsync = fsync
        self.fsync_rank = FSYNC_RANK[fsync]
        self.readonly = readonly
        # ms since the epoch; chunk timestamps and age retention use it (tests pass a fake clock)
        self.clock = clock or (lambda: int(time.time() * 1000))
        self._gate = _Gate()
        self._lockfile = None
        if not readonly:
            os.makedirs(self.path, exist_ok=True)
            self._lockfile = _take_writer_lock(self.path)
        self.env = lmdb.open(
            self.path, map_size=map_size, max_dbs=32, max_readers=1024, subdir=True, readonly=readonly,
            readahead=True, lock=True, create=not readonly, **lmdb_flags(fsync))
        # before the first write (open_db below writes): the map and lock.mdb reserved on disk, so no
        # write through the map can fault (SIGBUS) on a full filesystem; see space.py
        self._space = None
        if not readonly:
            self._space = MapSpace(self, max_size)
            try:
                self._space.open_check()
            except BaseException:
                self._space.close()
                self.env.close()
                self._lockfile.close()
                raise
        self._db_streams = self.env.open_db(b"streams", create=not readonly)
        self._db_chunks = self.env.open_db(b"chunks", create=not readonly)
        self._db_time = self.env.open_db(b"timeidx", create=not readonly)
        self._db_tracking = self.env.open_db(b"tracking", create=not readonly)
        self._db_meta = self.env.open_db(b"meta", create=not readonly)
        # added after format 1 shipped: a read-only open of an older directory finds them missing
        self._db_supers = self._open_db(b"superstreams")
        self._db_docs = self._open_db(b"docs")
        self._db_docidx = self._open_db(b"docidx")
        self._db_collections = self._open_db(b"collections")
        self._closed = False
        # name -> _Stream as last committed; replaced (never mutated) by the writer after each commit
        self._streams = {}
        self._lock = threading.Lock()        # guards _streams, _waiters and listener lists
        self._waiters = {}                   # sid -> list of (offset, callback, limited)
        self._delete_listeners = []
        self._create_listeners = []
        self._trusted_from = {}              # sid -> first chunk id written by this process (read_chunks)
        self._verified = {}                  # sid -> [first, last] chunk ids of a run already CRC-checked
        self._doc_shared = None              # the document store's committed collections (docstore._Shared)
        # replication (a cluster member, shells/cluster): the leader epoch stamped into new chunks per
        # stream, and how far readers may see (the offset a majority holds); both empty on a lone node
        self.epochs = {}
        self._read_limits = {}
        # a cluster leader's hook (shells/cluster/leader_path.py): the one-message inline commit hands it
        # the stamped chunk before LMDB commits it, so the members store it while this node does;
        # ``sealed(stream, chunk_id, records, chunk, sequences) -> sent`` and ``unsealed(stream, chunk_id)``
        # (that commit failed after the chunk went out), both on the committing thread; None on a lone node
        self.replica_feed = None
        self.offsets_version = 0    # raised after every commit that stores or deletes a consumer offset
        self._load()
        self.stats = EngineStats(self._streams)   # group commits, latencies, offsets at open: /metrics (stats.py)
        self._writer = None
        # with fsync=never a commit costs microseconds, so a caller may run it rather than wake the
        # writer thread; with an fsync it would block the caller (an event loop) for the fsync
        self._inline = fsync == "never"
        if not readonly:
            self._writer = _Writer(self, retention_interval, max_batch_bytes)
            self._writer.start()

    # ---------------------------------------------------------------------------------------- lifecycle

    def _open_db(self, name):
        try:
            return self.env.open_db(name, create=not self.readonly)
        except lmdb.NotFoundError:
            return None

    def _load(self):
        with self.read_txn() as txn:
            raw = txn.get(b"format", db=self._db_meta)
            stored = _SID.unpack(raw)[0] if raw is not None and len(raw) == _SID.size else raw
            if raw is not None and stored not in FORMATS_READ:
                raise RiverbedError(f"{self.path}: unknown data format version")
            for key, value in txn.cursor(db=self._db_streams):
                name = sys.intern(bytes(key).decode())
                s = self._streams[name] = roll_forward(txn, self._db_chunks, _Stream.decode(name, value))
                self._trusted_from[s.sid] = s.next_offset
        if raw is not None and stored != FORMAT_VERSION and not self.readonly:
            # before the writer starts (this thread is the only one writing); a failure (a full map)
            # leaves the mark to the next stream creation, which writes it too
            try:
                with self.env.begin(write=True) as txn:
                    txn.put(b"format", _SID.pack(FORMAT_VERSION), db=self._db_meta)
            except lmdb.Error:
                log.warning("%s: could not mark the data format %d", self.path, FORMAT_VERSION, exc_info=True)

    def close(self):
        """Finish the queued operations, sync to disk and close the environment. Idempotent."""
        if self._closed:
            return
        if self._writer is not None:
            self._writer.stop()
        self._closed = True
        with self._lock:
            waiters, self._waiters = self._waiters, {}
        for items in waiters.values():
            for entry in items:
                entry[1](EngineClosed("engine closed"))
        self.env.close()
        if self._space is not None:
            self._space.close()
        if self._lockfile is not None:
            self._lockfile.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # ----------------------------------------------------------------------------------------- reading

    def read_txn(self):
        """A read transaction as a context manager (buffers=True: values are memoryviews valid only
        inside it). Retries once if another process grew the map."""
        return _ReadTxn(self)

    def get_value(self, db, key):
        """The value of ``key`` in the named database ``db`` as ``bytes``, or None: one short read
        transaction, for point lookups on a hot path (a document by id). Thread-safe."""
        gate = self._gate
        gate.enter()
        try:
            try:
                txn = self.env.begin()
            except lmdb.MapResizedError:
                # another process grew the map: adopt its size, with no transaction open here
                gate.leave()
                gate.exclusive(lambda: self.env.set_mapsize(0))
                gate.enter()
                txn = self.env.begin()
            try:
                return txn.get(key, db=db)
            finally:
                txn.abort()
        finally:
            gate.leave()

    def _get_stream(self, name):
        s = self._streams.get(name)
        if s is None:
            raise StreamNotFound(f"stream {name!r} does not exist")
        return s

    def list_streams(self):
        """Names of all streams, sorted."""
        return sorted(self._streams) if not self.readonly else self._read_names()

    def _read_names(self):
        with self.read_txn() as txn:
            return [bytes(k).decode() for k, _ in txn.cursor(db=self._db_streams)]

    def has_stream(self, name):
        return name in self._streams if not self.readonly else self._stream_from_db(name) is not None

    def _stream_from_db(self, name):
        with self.read_txn() as txn:
            raw = txn.get(name.encode(), db=self._db_streams)
            return None if raw is None else roll_forward(txn, self._db_chunks, _Stream.decode(name, raw))

    def _current(self, name):
        # A read-only engine sees another process's writes, so it reads the state from LMDB each time.
        if self.readonly:
            s = self._stream_from_db(name)
            if s is None:
                raise StreamNotFound(f"stream {name!r} does not exist")
            return s
        return self._get_stream(name)

    def stream_info(self, name):
        """Committed statistics of ``name`` as a StreamInfo. Raises StreamNotFound."""
        s = self._current(name)
        first_ts = -1
        if s.chunks:
            with self.read_txn() as txn:
                raw = txn.get(_CHUNK_KEY.pack(s.sid, s.first_chunk), db=self._db_chunks)
                if raw is not None:
                    try:
                        first_ts = core.read_header(raw)[H_TIMESTAMP]
                    except ChunkError as e:
                        raise ChunkError(e.reason, name, s.first_chunk) from None
        return s.info(first_ts)

    def committed_chunk_id(self, name):
        """Id of the last committed chunk of ``name`` (-1 when empty), from memory: no transaction.
        Raises StreamNotFound."""
        return self._current(name).last_chunk

    def resolve(self, name, spec):
        """The offset a reader of ``spec`` (an OffsetSpec) starts at. Raises StreamNotFound.

        first: the first chunk still stored; last: the start of the last chunk; next: the offset the
        next record will get; offset(n): n, moved up to the first stored chunk when retention removed
        it and down to ``next`` when beyond the end; timestamp(ms): the first chunk whose timestamp is
        at or after ms (``next`` when there is none).
        """
        s = self._current(name)
        limit = self._read_limits.get(name)
        if limit is not None and limit < s.next_offset:
            s = self._limited_state(s, limit)
        kind = spec.kind
        if kind == "next":
            return s.next_offset
        if kind == "first":
            return s.first_chunk if s.chunks else s.next_offset
        if kind == "last":
            return s.last_chunk if s.chunks else s.next_offset
        if kind == "offset":
            n = spec.value
            if n < 0:
                raise InvalidArgument(f"offset {n} is negative")
            if not s.chunks:
                return s.next_offset
            return min(max(n, s.first_chunk), s.next_offset)
        if kind == "timestamp":
            with self.read_txn() as txn:
                try:
                    chunk_id = seek_timestamp(txn, self._db_time, self._db_chunks, s.sid, spec.value)
                except ChunkError as e:
                    raise ChunkError(e.reason, name, e.chunk_id) from None
            return s.next_offset if chunk_id is None else chunk_id
        raise InvalidArgument(f"unknown offset spec {spec!r}")

    def _limited_state(self, s, limit):
        """A copy of stream state ``s`` cut at ``limit`` (a chunk boundary), as readers may see it."""
        t = s.copy()
        t.next_offset = limit
        last = -1
        with self.read_txn() as txn:
            cur = txn.cursor(db=self._db_chunks)
            if cur.set_range(_CHUNK_KEY.pack(s.sid, limit)) and cur.prev() or cur.last():
                ksid, cid = _CHUNK_KEY.unpack(cur.key())
                if ksid == s.sid and cid < limit:
                    last = cid
        t.last_chunk = last
        if last < 0 or s.first_chunk < 0 or s.first_chunk > last:
            t.chunks = 0
        return t

    # ---------------------------------------------------------------------------- replication support

    def set_epoch(self, name, epoch):
        """Stamp leader ``epoch`` into every chunk of ``name`` written from now on (a cluster leader)."""
        self.epochs[name] = int(epoch)

    def read_limit(self, name):
        """The read limit of ``name`` (see :meth:`set_read_limit`), or None."""
        return self._read_limits.get(name)

    def set_read_limit(self, name, offset):
        """Let readers of ``name`` see only the chunks below ``offset`` (a chunk boundary: the committed
        offset of a replicated stream); None lifts the limit. Raising it wakes the watchers it lets
        through. Any thread."""
        wake = []
        with self._lock:
            if offset is None:
                self._read_limits.pop(name, None)
            else:
                self._read_limits[name] = int(offset)
            s = self._streams.get(name)
            if s is not None:
                visible = s.next_offset if offset is None else min(s.next_offset, offset)
                items = self._waiters.get(s.sid)
                if items:
                    keep = []
                    for entry in items:
                        (wake if entry[0] < visible and entry[2] else keep).append(entry)
                    self._waiters[s.sid] = keep
        for entry in wake:
            try:
                entry[1](None)
            except Exception:   # a broken callback must not stop the others
                import logging
                logging.getLogger("riverbed.engine").exception("commit waiter failed")

    def replicate_chunk(self, stream, chunk, *, sequences=None, on_done=None, start=False):
        """Store ``chunk`` (bytes: a whole chunk as the leader stored it, header and CRC included) at its
        own chunk id, unchanged: a cluster member copying its leader. The chunk id must be the stream's
        next offset (ChunkError otherwise: a gap or an overlap); its CRC is checked here.
        ``sequences`` ({publisher: last publishing id}) are stored in the same transaction, so dedup
        survives a failover. With ``start``, a copy holding no chunk takes this one wherever it is (its
        leader's log starts there now: retention or compaction removed what came before). Future (or
        ``on_done``) of the stream's next offset after it."""
        return self.replicate_chunks(stream, [chunk], sequences=sequences, start=start, on_done=on_done)

    def replicate_chunks(self, stream, chunks, *, sequences=None, start=False, on_done=None):
        """:meth:`replicate_chunk` for several consecutive chunks in ONE write transaction (one commit, one
        sync under the stream's fsync policy, one completion): every CRC is checked here (ChunkError
        before anything is queued), every chunk id against the log's end in the writer (a gap refuses
        the whole batch: nothing of it is stored). ``sequences`` cover the whole batch; ``start`` lets an
        empty copy begin at the first chunk's id. Future (or ``on_done``) of the stream's next offset after
        the last chunk. A ``bytearray`` chunk, or a contiguous byte ``memoryview``, is stored as it is,
        not copied: the caller hands it over and must not change it before the completion (a member's
        chunk as it came off the socket, in a receive buffer it reuses once the chunk is stored)."""
        checked = [(c if type(c) is bytes or type(c) is bytearray or _byte_view(c) else bytes(c),
                    core.check_chunk(c)) for c in chunks]
        return self._submit(_OP_REPLICA, stream, checked, sequences or {}, bool(start), on_done=on_done)

    def read_for_replica(self, name, from_offset, max_chunks=64, max_bytes=4 << 20):
        """``(chunks, sequences)`` read in one transaction, past any read limit: up to ``max_chunks``
        chunks (``(chunk_id, bytes)``, at most about ``max_bytes``) from the one at ``from_offset``, and
        every publisher sequence of the stream as of that same commit ({reference: id}) when the batch
        reaches the end of the log (they then cover exactly the chunks read; None otherwise). What a
        leader sends its members (copied: :meth:`read_replica_views` sends them without a copy). Raises
        StreamNotFound."""
        return self.read_replica_views(name, from_offset, _copied_batch, max_chunks, max_bytes)

    def read_replica_views(self, name, from_offset, fn, max_chunks=64, max_bytes=4 << 20):
        """``fn(chunks, sequences)`` called once inside one read transaction, and its result returned:
        what :meth:`read_for_replica` returns, each chunk a read-only memoryview in LMDB's map instead
        of a copy (valid only until ``fn`` returns: it copies what it keeps, and must neither wait nor
        block). A cluster leader writes them to its members' sockets from there. Raises StreamNotFound
        (``fn`` not called)."""
        s = self._current(name)
        out, size, seqs = [], 0, {}
        with self.read_txn() as txn:
            cur = txn.cursor(db=self._db_chunks)
            ok = self._seek(cur, name, s.sid, from_offset)
            while ok and len(out) < max_chunks and size < max_bytes:
                ksid, chunk_id = _CHUNK_KEY.unpack(cur.key())
                if ksid != s.sid:
                    ok = False
                    break
                raw = cur.value()
                out.append((chunk_id, raw))
                size += len(raw)
                ok = cur.next()
                if ok and _CHUNK_KEY.unpack(cur.key())[0] != s.sid:
                    ok = False
            if ok:
                return fn(out, None)       # more chunks follow: the sequences would be ahead of the batch
            prefix = _SID.pack(s.sid) + bytes((TRACKING_SEQUENCE,))
            tcur = txn.cursor(db=self._db_tracking)
            ok = tcur.set_range(prefix)
            while ok:
                key = bytes(tcur.key())
                if not key.startswith(prefix):
                    break
                seqs[key[len(prefix):].decode("utf-8")] = _U64.unpack(tcur.value())[0]
                ok = tcur.next()
            return fn(out, seqs)

    def stored_offsets(self, name):
        """Every consumer offset stored on ``name``: {reference: offset}. Raises StreamNotFound."""
        s = self._current(name)
        out = {}
        prefix = _SID.pack(s.sid) + bytes((TRACKING_OFFSET,))
        with self.read_txn() as txn:
            cur = txn.cursor(db=self._db_tracking)
            ok = cur.set_range(prefix)
            while ok:
                key = bytes(cur.key())
                if not key.startswith(prefix):
                    break
                out[key[len(prefix):].decode("utf-8")] = _U64.unpack(cur.value())[0]
                ok = cur.next()
        return out

    def truncate(self, stream, offset):
        """Remove every chunk of ``stream`` at or after ``offset`` (a chunk boundary): a member drops the
        unconfirmed tail of an older epoch before following a new leader. Future of the new next
        offset."""
        return self._submit(_OP_TRUNCATE, stream, int(offset))

    def trim_head(self, stream, offset):
        """Remove every whole chunk of ``stream`` that ends at or before ``offset``, always keeping the last
        chunk: what retention does, at a point the caller chose (the document changelog drops what a
        snapshot covers, shells/cluster/compaction.py). Readers asking for a removed offset get the first
        chunk after it, as after retention. Future of the stream's first chunk id after it; raises
        StreamNotFound."""
        return self._submit(_OP_TRIM, stream, int(offset))

    def read_chunks(self, name, from_offset, max_chunks=1, *, limited=True):
        """Up to ``max_chunks`` committed chunks, in order, as ``(chunk_id, bytes)`` pairs: first the
        chunk holding ``from_offset`` (or, when retention removed it, the first chunk after it).

        The bytes are the chunk as stored (header, bloom, data). Raises StreamNotFound, and ChunkError
        (naming stream and chunk id) for a chunk whose header or CRC is bad. With a read limit set
        (:meth:`set_read_limit`) no chunk at or past it is returned, unless ``limited`` is False (the
        replication of the log itself).
        """
        s = self._current(name)
        limit = self._read_limits.get(name) if limited else None
        with self.read_txn() as txn:
            views, bad = self._read_checked(txn, name, s.sid, from_offset, max_chunks, None, limit)
            if bad is not None:
                raise bad
            out = []
            for chunk_id, raw in views:     # copied out of the map before the transaction ends
                out.append((chunk_id, bytes(raw)))
        return out

    def read_chunk_views(self, name, from_offset, fn, max_chunks=1, max_bytes=None, *, limited=True):
        """``fn(chunks)`` called once inside one read transaction, and its result returned: ``chunks`` the
        committed chunks :meth:`read_chunks` would give from ``from_offset`` (up to ``max_chunks``; with
        ``max_bytes``, none after the one that brings their stored bytes to it), as a list of ``(chunk_id,
        view)``, each ``view`` a read-only memoryview of the chunk as stored, in LMDB's map: no copy.

        The views are valid only until ``fn`` returns: it copies what it keeps, and must neither wait nor
        block (the transaction holds a reader slot and the pages it sees meanwhile). Each chunk is checked
        as read_chunks checks it (header and chunk id; its CRC once, at its first read). A chunk whose
        header or CRC is bad ends the list: ``fn`` gets the good chunks before it, then ChunkError (naming
        stream and chunk id) is raised. Raises StreamNotFound (``fn`` not called). Thread-safe, as
        read_chunks; ``limited`` as there."""
        s = self._current(name)
        limit = self._read_limits.get(name) if limited else None
        with self.read_txn() as txn:
            views, bad = self._read_checked(txn, name, s.sid, from_offset, max_chunks, max_bytes, limit)
            result = fn(views)
        if bad is not None:
            raise bad
        return result

    def _read_checked(self, txn, name, sid, from_offset, max_chunks, max_bytes, limit):
        """The read loop of read_chunks and read_chunk_views, in ``txn``: ``([(chunk_id, view)], bad)``,
        each view a memoryview into the map (valid in ``txn`` only), and ``bad`` the ChunkError of the
        chunk that ended the list, or None. Stops at ``max_chunks``, after the chunk that brings the bytes to
        ``max_bytes`` (None: no bound), at the stream's end or at ``limit`` (a chunk id; None: none).

        A chunk's CRC is checked once: when it is written (this process built or checked it), or at its
        first read. Chunks from before this process are remembered as one verified run per stream
        (consumers read in order, so one run covers them); a jump starts a new run."""
        trusted = self._trusted_from.get(sid, 0)
        run = self._verified.get(sid)
        prev = None
        out = []
        size = 0
        bad = None
        cur = txn.cursor(db=self._db_chunks)
        ok = self._seek(cur, name, sid, from_offset)
        while ok and len(out) < max_chunks and (max_bytes is None or size < max_bytes):
            ksid, chunk_id = _CHUNK_KEY.unpack(cur.key())
            if ksid != sid or (limit is not None and chunk_id >= limit):
                break
            raw = cur.value()
            first_read = not (chunk_id >= trusted or (run is not None and run[0] <= chunk_id <= run[1]))
            try:
                h = core.check_chunk(raw) if first_read else core.read_header(raw)
            except ChunkError as e:
                bad = ChunkError(e.reason, name, chunk_id)
                break
            if h[H_CHUNK_ID] != chunk_id:
                bad = ChunkError(f"header says chunk id {h[H_CHUNK_ID]}", name, chunk_id)
                break
            if first_read:
                if run is not None and prev is not None and run[1] == prev:
                    run[1] = chunk_id
                else:
                    run = self._verified[sid] = [chunk_id, chunk_id]
            out.append((chunk_id, raw))
            size += len(raw)
            prev = chunk_id
            ok = cur.next()
        return out, bad

    def scan(self, name, from_offset=0, chunks_per_txn=64):
        """Yield ``(offset, record bytes)`` for every committed record at or after ``from_offset``,
        sub-batches expanded. Holds a read transaction only while decoding ``chunks_per_txn`` chunks."""
        for chunk_id, records in self.scan_chunks(name, from_offset, chunks_per_txn=chunks_per_txn):
            first = max(from_offset - chunk_id, 0)
            for i in range(first, len(records)):
                yield chunk_id + i, records[i]

    def scan_chunks(self, name, from_offset=0, to_offset=None, chunks_per_txn=64, bytes_per_txn=1 << 20):
        """Yield ``(chunk_id, list of record bytes)`` per committed chunk from the one holding
        ``from_offset`` up to (not including) the first chunk at or after ``to_offset``. Sub-batches
        are expanded. Raises ChunkError as read_chunks does. See map_chunks for the transactions."""
        return self.map_chunks(name, lambda chunk_id, raw: (chunk_id, core.chunk_records(raw)), from_offset,
                               to_offset, chunks_per_txn, bytes_per_txn, verify=False)

    def map_chunks(self, name, fn, from_offset=0, to_offset=None, chunks_per_txn=64, bytes_per_txn=1 << 20,
                   verify=True):
        """Yield ``fn(chunk_id, view)`` for each committed chunk from the one holding ``from_offset`` up
        to (not including) the first chunk at or after ``to_offset`` (None: to the end).

        ``view`` is a memoryview into the LMDB map, valid only during the call: ``fn`` must copy what it
        keeps. With ``verify`` the chunk's header and CRC are checked before ``fn`` sees it; a ChunkError
        from either is re-raised naming the stream and chunk id. Chunks are visited inside short read
        transactions of at most ``chunks_per_txn`` chunks or ``bytes_per_txn`` stored bytes, so what
        ``fn`` builds stays small and no transaction outlives a ``yield``. Raises StreamNotFound.
        """
        s = self._current(name)
        sid = s.sid
        limit = self._read_limits.get(name)
        if limit is not None and (to_offset is None or limit < to_offset):
            to_offset = limit
        pos = from_offset
        while True:
            batch = []
            size = 0
            with self.read_txn() as txn:
                cur = txn.cursor(db=self._db_chunks)
                ok = self._seek(cur, name, sid, pos)
                while ok and len(batch) < chunks_per_txn and size < bytes_per_txn:
                    ksid, chunk_id = _CHUNK_KEY.unpack(cur.key())
                    if ksid != sid or (to_offset is not None and chunk_id >= to_offset):
                        ok = False
                        break
                    raw = cur.value()
                    try:
                        h = core.check_chunk(raw) if verify else core.read_header(raw)
                        batch.append(fn(chunk_id, raw))
                    except ChunkError as e:
                        raise ChunkError(e.reason, name, chunk_id) from None
                    size += len(raw)
                    pos = chunk_id + max(h[H_RECORDS], 1)
                    ok = cur.next()
            yield from batch
            if not ok:
                return

    def chunk_index(self, name, from_offset=0, to_offset=None):
        """``[(chunk_id, timestamp_ms), ...]`` of the committed chunks in ``[from_offset, to_offset)``, in
        id order, from the chunks' headers (the timestamp index is sparse: sparse.py): for planning
        parallel scans. Raises StreamNotFound, ChunkError."""
        s = self._current(name)
        with self.read_txn() as txn:
            try:
                return chunk_times(txn, self._db_chunks, s.sid, from_offset, to_offset)
            except ChunkError as e:
                raise ChunkError(e.reason, name, e.chunk_id) from None

    def _seek(self, cur, name, sid, offset):
        """Position ``cur`` on the chunk holding ``offset`` or the first after it; False if none."""
        key = _CHUNK_KEY.pack(sid, offset)
        if cur.set_range(key):
            if cur.key() == key:
                return True
            here = cur.key()
            if cur.prev():
                psid, pid = _CHUNK_KEY.unpack(cur.key())
                if psid == sid and pid + self._records_of(name, pid, cur.value()) > offset:
                    return True
            cur.set_key(here)
            return _SID.unpack_from(here)[0] == sid
        if cur.last():
            psid, pid = _CHUNK_KEY.unpack(cur.key())
            return psid == sid and pid + self._records_of(name, pid, cur.value()) > offset
        return False

    @staticmethod
    def _records_of(name, chunk_id, raw):
        try:
            return core.read_header(raw)[H_RECORDS]
        except ChunkError as e:
            raise ChunkError(e.reason, name, chunk_id) from None

    def query_offset(self, name, reference):
        """The consumer offset stored for ``reference`` on ``name``, or None. Raises StreamNotFound."""
        return self._tracking(name, TRACKING_OFFSET, reference)

    def query_publisher_sequence(self, name, publisher):
        """The last publishing id stored for ``publisher`` on ``name``; 0 when none, as RabbitMQ answers
        (deduplication still treats such a reference as having stored nothing, so its id 0 is kept)."""
        v = self._tracking(name, TRACKING_SEQUENCE, publisher)
        return 0 if v is None else v

    def _tracking(self, name, kind, reference):
        s = self._current(name)
        with self.read_txn() as txn:
            raw = txn.get(_tracking_key(s.sid, kind, reference), db=self._db_tracking)
        return None if raw is None else _U64.unpack(raw)[0]

    # ------------------------------------------------------------------------------------------ waiting

    def watch(self, name, offset, callback, *, limited=True):
        """Call ``callback(None)`` once a committed chunk holds ``offset`` (at once, on this thread, if
        one does already), or ``callback(exc)`` with StreamNotFound when the stream is deleted or
        EngineClosed. Later calls come from the writer thread. Returns a cancel function. Under a read
        limit (:meth:`set_read_limit`) the chunk must also be below it, unless ``limited`` is False."""
        with self._lock:
            s = self._streams.get(name)
            limit = self._read_limits.get(name) if limited else None
            if s is None:
                exc = StreamNotFound(f"stream {name!r} does not exist")
            elif offset < s.next_offset and (limit is None or offset < limit):
                exc = None
            else:
                entry = (offset, callback, limited)
                self._waiters.setdefault(s.sid, []).append(entry)
                return lambda: self._unwatch(s.sid, entry)
        callback(exc)
        return lambda: None

    def _unwatch(self, sid, entry):
        with self._lock:
            items = self._waiters.get(sid)
            if items and entry in items:
                items.remove(entry)
                if not items:
                    del self._waiters[sid]

    def wait(self, name, offset):
        """An asyncio future (of the running loop) that resolves once a committed chunk holds
        ``offset``; it raises StreamNotFound if the stream is deleted first. Call from the loop."""
        import asyncio
        loop = asyncio.get_running_loop()
        fut = loop.create_future()

        def done(exc):
            def settle():
                if not fut.done():
                    if exc is None:
                        fut.set_result(None)
                    else:
                        fut.set_exception(exc)
            if threading.current_thread() is self._writer:
                loop.call_soon_threadsafe(settle)
            else:
                settle()

        cancel = self.watch(name, offset, done)
        fut.add_done_callback(lambda f: cancel() if f.cancelled() else None)
        return fut

    def add_delete_listener(self, callback):
        """Call ``callback(name)`` on the writer thread after a stream is deleted."""
        with self._lock:
            self._delete_listeners.append(callback)

    def add_create_listener(self, callback):
        """Call ``callback(name)`` on the writer thread after a stream is created (and committed)."""
        with self._lock:
            self._create_listeners.append(callback)

    # ----------------------------------------------------------------------------------------- writing

    def _submit(self, op, *args, on_done=None):
        """Queue ``op`` for the writer. Returns a Future, or, with ``on_done(result, exc)``, None: the
        callback then runs once on the thread that committed, with no Future made (see Done). With
        fsync=never, a small operation (an append of at most INLINE_MAX_BYTES) that finds the writer
        idle commits on the caller's thread, and its callback runs before this returns."""
        if self._writer is None:
            raise RiverbedError("engine was opened read-only")
        fut = Future() if on_done is None else Done(on_done)
        if self._closed or self._writer.stopping:
            fut.set_exception(EngineClosed("engine closed"))
            return None if on_done is not None else fut
        item = (op, args, fut)
        if on_done is None:
            self._writer.submit(item)
            return fut
        if not (self._inline and (op != _OP_APPEND or len(args[0].data) <= INLINE_MAX_BYTES)
                and not self._syncs(op, args) and self._writer.commit_inline(item)):
            self._writer.submit(item)
        return None

    def _syncs(self, op, args):
        """Whether ``op`` may touch a stream whose ``fsync`` argument asks for a sync (then it is not
        committed inline: the caller may be an event loop)."""
        rank = self.fsync_rank
        if op == _OP_CREATE:
            return FSYNC_RANK.get(args[1].get("fsync"), 0) > rank
        if op == _OP_SUPER_CREATE:
            return FSYNC_RANK.get(args[3].get("fsync"), 0) > rank
        if op == _OP_TXN:
            return any(FSYNC_RANK.get(s.args.get("fsync"), 0) > rank for s in list(self._streams.values()))
        name = args[0].stream if op == _OP_APPEND else (args[0] if args else None)
        s = self._streams.get(name) if isinstance(name, str) else None
        return s is not None and FSYNC_RANK.get(s.args.get("fsync"), 0) > rank

    def stream_fsync(self, name):
        """The fsync policy stream ``name`` gets: the stronger of the engine's and its ``fsync``
        argument. Raises StreamNotFound."""
        asked = self._current(name).args.get("fsync", self.fsync)
        return asked if FSYNC_RANK[asked] > self.fsync_rank else self.fsync

    def create_stream(self, name, arguments=None):
        """Create stream ``name`` with RabbitMQ-style ``arguments`` (see normalize_arguments).

        Returns a Future of None. Raises (through the future) StreamExists if the name is taken and
        InvalidArgument for a bad name or argument (the latter two also directly)."""
        _check_name(name)
        # interned: the sessions' subscriptions and publishers of the stream intern their copies of the
        # name too, so 10,000 streams hold one string each, not one per holder (issue 26)
        return self._submit(_OP_CREATE, sys.intern(name), normalize_arguments(arguments))

    def delete_stream(self, name, keep_bindings=False):
        """Delete ``name`` and all of its records and tracking. Future of None; StreamNotFound. The stream
        leaves every super stream it is a partition of, unless ``keep_bindings`` (a cluster node dropping
        its copy of a stream that lives on: the definitions are the cluster's, shells/cluster/superstreams.py)."""
        if keep_bindings:
            return self._submit(_OP_DELETE, name, True)
        return self._submit(_OP_DELETE, name)

    def append(self, stream, records, *, publishing_ids=None, publisher=None, filter_values=None, on_done=None):
        """Append ``records`` (bytes-like), one simple entry each. See append_entries."""
        if filter_values is None and 0 < len(records) <= MAX_CHUNK_ENTRIES:
            # build the chunk here, CRC included, so the writer thread only stamps and stores it
            if publisher is not None:
                _check_name(publisher, "publisher reference")
            return self._submit(_OP_APPEND, _Append(stream, core.encode_chunk_buffer(records), publishing_ids,
                                                    publisher, None, len(records), len(records), True),
                                on_done=on_done)
        return self.append_entries(stream, core.encode_entries(records), publishing_ids=publishing_ids,
                                   publisher=publisher, filter_values=filter_values,
                                   num_entries=len(records), num_records=len(records), on_done=on_done)

    def append_chunk(self, stream, chunk, *, num_entries, num_records, publishing_ids=None, publisher=None,
                     crc_done=True, on_done=None):
        """Append a chunk the caller built whole: a ``bytearray`` laid out as :func:`core.encode_chunk_buffer`
        or the shells' :func:`riverbed.shells.wire.publish_chunk` make it (48-byte header with the data CRC,
        length and counts, then the data section; no bloom, no filter values). The writer stamps chunk id
        and timestamp into it in place, so the caller hands it over and must not use it again.

        ``num_entries`` and ``num_records`` must be exact. Over 65535 entries (more than a header can
        count), or over the stream's records or bytes per chunk, the data section is appended as entries
        and split over several chunks. ``crc_done=False`` says the header CRC is not filled in yet
        (``wire.publish_chunk(..., crc=False)``): the writer computes it only if the chunk is stored whole.
        ``publishing_ids``
        (per entry: a list of ints or a :class:`PublishingIds`) and ``publisher`` work as in
        append_entries. Returns a Future of AppendResult.
        """
        if publisher is not None:
            _check_name(publisher, "publisher reference")
        if type(chunk) is not bytearray:
            raise InvalidArgument("a chunk to append must be a bytearray (the writer stamps it in place)")
        if num_entries > MAX_CHUNK_ENTRIES:
            return self._submit(_OP_APPEND, _Append(stream, memoryview(chunk)[LEN_CHUNK_HEADER:], publishing_ids,
                                                    publisher, None, num_entries, num_records), on_done=on_done)
        return self._submit(_OP_APPEND, _Append(stream, chunk, publishing_ids, publisher, None, num_entries,
                                                num_records, True, not crc_done), on_done=on_done)

    def append_chunk_now(self, stream, chunk, *, num_entries, num_records, publishing_ids=None, publisher=None,
                         crc_done=True):
        """:meth:`append_chunk` committed on the caller's thread before this returns, or not at all.

        Returns ``(AppendResult, None)`` once committed, ``(None, exc)`` when the append failed (as the
        Future of :meth:`append_chunk` would fail: StreamNotFound, StorageFull, ...), or None when it
        cannot be committed inline: fsync is not ``never``, the stream asks for a sync, the writer has
        work queued or running, the chunk is over INLINE_MAX_BYTES or is not one sealable chunk. Then
        nothing was done and the caller appends the usual way. What it stores and when it is durable
        is exactly what :meth:`append_chunk` stores (the same group-commit code runs, for one append):
        a one-message publish skips two thread-safe hand-offs and a completion callback."""
        if (not self._inline or len(chunk) > INLINE_MAX_BYTES or num_entries > MAX_CHUNK_ENTRIES
                or self._writer is None or self._closed):
            return None
        if publisher is not None:
            _check_name(publisher, "publisher reference")
        if type(chunk) is not bytearray:
            raise InvalidArgument("a chunk to append must be a bytearray (the writer stamps it in place)")
        s = self._streams.get(stream)
        if s is not None and s.args and FSYNC_RANK.get(s.args.get("fsync"), 0) > self.fsync_rank:
            return None     # the stream asks for a sync: never on the caller's thread (an event loop)
        return self._writer.append_alone(_Append.sealed_chunk(stream, chunk, publishing_ids, publisher, num_entries,
                                                              num_records, not crc_done))

    def append_entries(self, stream, data, *, publishing_ids=None, publisher=None, filter_values=None,
                       num_entries=None, num_records=None, on_done=None):
        """Append an Osiris data section (simple and/or sub-batch entries, format.py) to ``stream``.

        ``publishing_ids`` and ``filter_values`` are per entry. With a ``publisher`` reference, an
        entry whose id is at or below the highest id stored for that reference is dropped and listed in
        ``AppendResult.duplicates`` (a reference that stored nothing keeps every id, 0 included); the
        sequence is stored in the same transaction as the records.
        ``num_entries`` and ``num_records``, when the caller knows them (it built the entries), spare the
        writer a walk over the section; they must then be right. Without them the section is walked and
        checked. Returns a Future of AppendResult; errors through it: StreamNotFound, ChunkError
        (malformed entries), EngineClosed. With ``on_done(result, exc)`` (every append method takes it)
        no Future is made and None is returned; the callback runs once after the commit, on the
        writer's thread or, with fsync=never and an idle writer, on the caller's before the call returns.
        """
        if publisher is not None:
            _check_name(publisher, "publisher reference")
        if (num_entries is None) != (num_records is None):
            raise InvalidArgument("give both num_entries and num_records, or neither")
        return self._submit(_OP_APPEND, _Append(stream, data, publishing_ids, publisher, filter_values,
                                                num_entries, num_records), on_done=on_done)

    def store_offset(self, stream, reference, offset):
        """Store consumer ``offset`` for ``reference``. Future of None; StreamNotFound."""
        _check_name(reference, "consumer reference")
        offset = int(offset)
        if not 0 <= offset <= _U64_MAX:
            raise InvalidArgument(f"offset {offset} is outside 0..2**64-1")
        return self._submit(_OP_OFFSET, stream, reference, offset)

    def transact(self, fn):
        """Run ``fn(ctx)`` on the writer thread inside the next group commit; a Future of its result.

        ``ctx`` is a :class:`WriteContext`: the write transaction and the named databases, plus
        ``store_offset`` and ``append`` that stage in the same transaction, so a caller's own writes and
        stream state commit atomically (a projection's documents and its position, say). The future
        completes after the commit and the fsync the policy asks for.

        ``fn`` may run more than once (the transaction is retried when the map grows), so it must have
        no side effects outside ``ctx``; use ``ctx.on_commit(cb)`` for what should happen once, after
        the commit. If ``fn`` raises, nothing it wrote is kept: the group transaction is redone without
        it and the future raises the exception (RiverbedError subclasses as they are).
        """
        return self._submit(_OP_TXN, fn)

    # ----------------------------------------------------------------------------------- super streams

    def create_super_stream(self, name, partitions, binding_keys, arguments=None, *, adopt=False):
        """Create the partition streams and record super stream ``name`` in one transaction.

        Future of None; raises (through it) StreamExists when the super stream or any partition exists
        (with ``adopt=True``, existing partitions are taken as they are: for importing old
        definitions), InvalidArgument for bad names, arguments or a partition/binding-key mismatch."""
        _check_name(name, "super stream name")
        partitions = [str(p) for p in partitions]
        binding_keys = [str(k) for k in binding_keys]
        if not partitions or len(partitions) != len(binding_keys) or len(set(partitions)) != len(partitions):
            raise InvalidArgument("a super stream needs distinct partitions, one binding key each")
        for p in partitions:
            _check_name(p)
        return self._submit(_OP_SUPER_CREATE, name, partitions, binding_keys, normalize_arguments(arguments),
                            adopt)

    def delete_super_stream(self, name):
        """Forget super stream ``name`` and delete its partitions (those that still exist) in one
        transaction. Future of None; StreamNotFound when there is no such super stream."""
        return self._submit(_OP_SUPER_DELETE, name)

    def super_stream(self, name):
        """``{"partitions": [...], "binding_keys": [...], "arguments": {...}}`` (and ``"orders"``, the
        partition order of each binding, when it was built binding by binding) or None."""
        if self._db_supers is None:
            return None
        with self.read_txn() as txn:
            raw = txn.get(name.encode("utf-8"), db=self._db_supers)
            return None if raw is None else json.loads(bytes(raw))

    def list_super_streams(self):
        """Names of all super streams, sorted."""
        if self._db_supers is None:
            return []
        with self.read_txn() as txn:
            return [bytes(k).decode() for k, _ in txn.cursor(db=self._db_supers)]

    def run_retention(self):
        """Future that completes after a retention pass over every stream (it also runs every
        ``retention_interval`` seconds by itself)."""
        return self._submit(_OP_RETENTION)

    def sync(self):
        """Future that completes once everything queued before it is committed and fsynced."""
        return self._submit(_OP_SYNC)


def _take_writer_lock(path):
    import fcntl
    f = open(os.path.join(path, "writer.lock"), "a+")
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        f.close()
        raise RiverbedError(f"{path} is in use by another riverbed process (writer.lock is held)") from None
    return f


def _copied_batch(chunks, seqs):
    """read_for_replica's ``fn``: the chunks copied out of the map."""
    return [(chunk_id, bytes(view)) for chunk_id, view in chunks], seqs


class _ReadTxn:
    __slots__ = ("engine", "txn")

    def __init__(self, engine):
        self.engine = engine
        self.txn = None

    def __enter__(self):
        eng = self.engine
        eng._gate.enter()
        try:
            try:
                self.txn = eng.env.begin(buffers=True)
            except lmdb.MapResizedError:
                # another process grew the map: adopt its size, with no transaction open here
                eng._gate.leave()
                eng._gate.exclusive(lambda: eng.env.set_mapsize(0))
                eng._gate.enter()
                self.txn = eng.env.begin(buffers=True)
        except BaseException:
            eng._gate.leave()
            raise
        return self.txn

    def __exit__(self, *exc):
        try:
            self.txn.abort()
        finally:
            self.engine._gate.leave()
