"""The log: every stream of a data directory in one LMDB environment, written by one group-commit thread.

LMDB layout (one environment per data directory; keys are prefixed by the stream id, because one named
database per stream makes every transaction pay for all of them)::

    named db   key                                              value
    ---------  -----------------------------------------------  ----------------------------------------
    streams    name (UTF-8)                                     STATE (below) + arguments as JSON
    chunks     sid u32 BE | chunk id u64 BE          (12 B)     the chunk: 48-byte header | bloom | data
    timeidx    sid u32 BE | timestamp u64 BE | chunk id u64 BE  empty; timestamp stored as ms + 2**63 so
                                                     (20 B)     that negative times sort first
    tracking   sid u32 BE | kind u8 | reference (UTF-8)         value uint64 BE (kind 0 publisher sequence,
                                                                1 consumer offset; format.TRACKING_*)
    meta       b"next-sid" | b"format"                           u32 BE
    superstreams  name (UTF-8)                                      JSON {"partitions", "binding_keys",
                                                                    "arguments"}; written in the same
                                                                    transaction as the partitions
    docs, docidx, collections                                       the document store (engine/docstore.py
                                                                    owns their layout)

    STATE (64 bytes, big-endian, FMT_STATE):
    0 sid u32 | 4 reserved u32 | 8 next offset i64 | 16 first chunk id i64 | 24 last chunk id i64 |
    32 bytes u64 | 40 records u64 | 48 chunks u64 | 56 last timestamp i64

    A chunk's key is its first offset, so "the chunk holding offset N" is one cursor seek: set_range(sid|N)
    and, unless that lands exactly on N, one step back. The timestamp index finds "the first chunk at or
    after T" the same way. Both are O(log n) B-tree descents.

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
"""

import bisect
import itertools
import json
import logging
import os
import queue
import re
import struct
import threading
import time
from collections import namedtuple
from concurrent.futures import Future

import lmdb

from riverbed.engine import core
from riverbed.engine.errors import (
    ChunkError, EngineClosed, InvalidArgument, RiverbedError, StreamExists, StreamNotFound,
)
from riverbed.engine.format import (
    BLOOM_DEFAULT_SIZE, BLOOM_MAX_SIZE, BLOOM_MIN_SIZE, H_CHUNK_ID, H_DATA_LEN, H_RECORDS, H_TIMESTAMP,
    HEADER_STRUCT, LEN_CHUNK_HEADER, TRACKING_OFFSET, TRACKING_SEQUENCE,
)

log = logging.getLogger("riverbed.engine")

FSYNC_POLICIES = ("always", "batch", "never")
DEFAULT_FSYNC = "batch"
DEFAULT_MAP_SIZE = 1 << 30            # bytes; grows by doubling when full
DEFAULT_CHUNK_MAX_BYTES = (1 << 20) - 1024   # data bytes; a chunk + Deliver prefix fits a 1 MiB frame_max
# Records per chunk. A reader at "last" starts at the last chunk, so the bound is how far back "last"
# reaches: RabbitMQ splits a 4,999-message Publish into chunks of about that many, and users expect it.
DEFAULT_CHUNK_MAX_RECORDS = 1000
MAX_STREAM_NAME = 255                 # bytes of UTF-8, as RabbitMQ queue names
MAX_REFERENCE = 255                   # bytes of UTF-8 (publisher and consumer references)
FORMAT_VERSION = 1
TS_BIAS = 1 << 63
CHUNK_EPOCH = 1      # Osiris starts a new stream's leader epoch at 1, and clients assert it
WRITEMAP = os.environ.get("RIVERBED_WRITEMAP", "1") == "1"

FMT_CHUNK_KEY = ">IQ"
FMT_TIME_KEY = ">IQQ"
FMT_STATE = ">IIqqqQQQq"
LEN_STATE = 64

_CHUNK_KEY = struct.Struct(FMT_CHUNK_KEY)
_TIME_KEY = struct.Struct(FMT_TIME_KEY)
_STATE = struct.Struct(FMT_STATE)
_SID = struct.Struct(">I")
_U64 = struct.Struct(">Q")    # tracking values: consumer offsets and publishing ids are uint64 on the wire
_U64_MAX = (1 << 64) - 1
_STAMP_TS = struct.Struct(">q")
_STAMP_ID = struct.Struct(">Q")
_CRC = struct.Struct(">I")
H_CRC_OFFSET = 32            # the data CRC's place in the chunk header (format.py)
MAX_CHUNK_ENTRIES = 0xFFFF      # NumEntries is a uint16
OWN_CHUNK_MIN = 16 << 10        # a caller-built chunk at least this big is stored as it is, not merged
assert _STATE.size == LEN_STATE

StreamInfo = namedtuple("StreamInfo", (
    "name arguments first_chunk_id committed_chunk_id last_chunk_id first_offset last_offset next_offset "
    "bytes records chunks first_timestamp last_timestamp"))
StreamInfo.__doc__ = """Committed statistics of one stream. Offsets and chunk ids are -1 when there is none;
bytes are stored chunk bytes (headers included); timestamps are ms since the epoch (-1 when empty)."""

AppendResult = namedtuple("AppendResult", "first_offset last_offset duplicates")
AppendResult.__doc__ = """Outcome of an append: the offsets given to the stored records (-1, -1 when every
entry was a duplicate) and the publishing ids dropped as duplicates."""


class PublishingIds:
    """The publishing ids of one append's entries, kept as the raw big-endian uint64s they arrived as
    (``raw``, 8 bytes each: a PublishConfirm body as is) plus ``first``, ``last`` and ``increasing``
    (strictly rising), so the writer's duplicate check costs nothing per id in the common case. It is a
    read-only sequence of ints too: indexing or iterating expands them once, for the duplicate path."""

    __slots__ = ("raw", "first", "last", "increasing", "_ints")

    def __init__(self, raw, first, last, increasing):
        self.raw = raw
        self.first = first
        self.last = last
        self.increasing = increasing
        self._ints = None

    def __len__(self):
        return len(self.raw) >> 3

    def __getitem__(self, i):
        return self.ints()[i]

    def __iter__(self):
        return iter(self.ints())

    def ints(self):
        """The ids as a list of ints (built on first use)."""
        if self._ints is None:
            self._ints = list(struct.unpack(f">{len(self.raw) >> 3}Q", self.raw))
        return self._ints


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
# stream arguments

_AGE_UNITS = {"Y": 365 * 86400, "M": 30 * 86400, "D": 86400, "h": 3600, "m": 60, "s": 1}
_AGE_RE = re.compile(r"^(\d+)([YMDhms])$")
_IGNORED_ARGS = {"stream-max-segment-size-bytes", "initial-cluster-size", "queue-leader-locator", "queue-type"}


def parse_max_age(text):
    """RabbitMQ ``x-max-age`` ("7D", "12h", "30m", "10s", "1Y", "2M") to milliseconds."""
    m = _AGE_RE.match(str(text).strip())
    if not m:
        raise InvalidArgument(f"max-age {text!r} is not <number><Y|M|D|h|m|s>, e.g. 7D or 12h")
    return int(m.group(1)) * _AGE_UNITS[m.group(2)] * 1000


def normalize_arguments(arguments):
    """Validate stream arguments (RabbitMQ names, with or without the ``x-`` prefix) and return them as
    a canonical ``dict[str, str]`` without prefix. Raises InvalidArgument."""
    out = {}
    for key, value in (arguments or {}).items():
        name = key[2:] if key.startswith("x-") else key
        value = str(value)
        if name in ("max-length-bytes", "chunk-max-bytes", "chunk-max-records"):
            if not value.isdigit() or int(value) <= 0:
                raise InvalidArgument(f"{key} must be a positive integer of bytes, not {value!r}")
        elif name == "max-age":
            parse_max_age(value)
        elif name == "stream-filter-size-bytes":
            if not value.isdigit() or not BLOOM_MIN_SIZE <= int(value) <= BLOOM_MAX_SIZE:
                raise InvalidArgument(f"{key} must be {BLOOM_MIN_SIZE}..{BLOOM_MAX_SIZE}, not {value!r}")
        elif name not in _IGNORED_ARGS:
            raise InvalidArgument(f"unknown stream argument {key!r}")
        out[name] = value
    return out


def _check_name(name, what="stream name"):
    if not isinstance(name, str) or not name:
        raise InvalidArgument(f"{what} must be a non-empty string")
    raw = name.encode("utf-8")
    if len(raw) > MAX_STREAM_NAME:
        raise InvalidArgument(f"{what} is {len(raw)} bytes of UTF-8, over the {MAX_STREAM_NAME}-byte limit")
    return raw


# --------------------------------------------------------------------------------------------------------
# per-stream state


class _Stream:
    """Committed (or, inside the writer, staged) state of one stream."""

    __slots__ = ("name", "sid", "args", "next_offset", "first_chunk", "last_chunk", "bytes", "records",
                 "chunks", "last_ts", "max_bytes", "max_age_ms", "chunk_max", "chunk_max_records", "bloom_size")

    def __init__(self, name, sid, args):
        self.name = name
        self.sid = sid
        self.args = args
        self.next_offset = 0
        self.first_chunk = -1
        self.last_chunk = -1
        self.bytes = 0
        self.records = 0
        self.chunks = 0
        self.last_ts = -1
        self.max_bytes = int(args["max-length-bytes"]) if "max-length-bytes" in args else None
        self.max_age_ms = parse_max_age(args["max-age"]) if "max-age" in args else None
        self.chunk_max = int(args.get("chunk-max-bytes", DEFAULT_CHUNK_MAX_BYTES))
        self.chunk_max_records = int(args.get("chunk-max-records", DEFAULT_CHUNK_MAX_RECORDS))
        self.bloom_size = int(args.get("stream-filter-size-bytes", BLOOM_DEFAULT_SIZE))

    @classmethod
    def decode(cls, name, raw):
        sid, _, nxt, first, last, nbytes, records, chunks, last_ts = _STATE.unpack_from(raw, 0)
        s = cls(name, sid, json.loads(bytes(raw[LEN_STATE:])))
        s.next_offset, s.first_chunk, s.last_chunk = nxt, first, last
        s.bytes, s.records, s.chunks, s.last_ts = nbytes, records, chunks, last_ts
        return s

    def encode(self):
        return _STATE.pack(self.sid, 0, self.next_offset, self.first_chunk, self.last_chunk, self.bytes,
                           self.records, self.chunks, self.last_ts) + json.dumps(self.args).encode()

    def copy(self):
        c = _Stream.__new__(_Stream)
        for k in _Stream.__slots__:
            setattr(c, k, getattr(self, k))
        return c

    def info(self, first_ts):
        return StreamInfo(self.name, dict(self.args), self.first_chunk, self.last_chunk, self.last_chunk,
                          self.first_chunk, self.next_offset - 1 if self.chunks else -1, self.next_offset,
                          self.bytes, self.records, self.chunks, first_ts, self.last_ts if self.chunks else -1)


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


# --------------------------------------------------------------------------------------------------------
# requests queued to the writer

(_OP_APPEND, _OP_OFFSET, _OP_CREATE, _OP_DELETE, _OP_SYNC, _OP_STOP, _OP_RETENTION, _OP_TXN, _OP_SUPER_CREATE,
 _OP_SUPER_DELETE) = range(10)


class _Append:
    __slots__ = ("stream", "data", "ids", "publisher", "filters", "entries", "records", "sealed", "crc_pending")

    def __init__(self, stream, data, ids, publisher, filters, entries, records, sealed=False, crc_pending=False):
        self.sealed = sealed    # data is a whole chunk (bytearray) with its CRC, from encode_chunk_buffer
        self.crc_pending = crc_pending   # ... but its header CRC is still to be computed (0 in the header)
        self.stream = stream
        self.data = data
        self.ids = ids
        self.publisher = publisher
        self.filters = filters
        self.entries = entries
        self.records = records


class _Pending:
    """Entries of one stream collected for the chunk being built in this transaction."""

    __slots__ = ("parts", "size", "entries", "records", "filters", "unfiltered")

    def __init__(self):
        self.parts = []
        self.size = 0
        self.entries = 0
        self.records = 0
        self.filters = set()
        self.unfiltered = False


class Engine:
    """A data directory: its LMDB environment, its streams and its single writer thread.

    Every method is thread-safe. Writer operations (create, delete, append, store_offset) return
    ``concurrent.futures.Future`` objects completed on the writer thread after the commit (and the
    fsync the policy asks for); from asyncio, ``await asyncio.wrap_future(f)``. Reads run on the
    calling thread in their own read transaction and block only for LMDB page access.

    ``readonly=True`` opens without a writer (for ``riverbed dump`` and Spark executors); writer
    operations then raise RiverbedError. Only one read-write Engine may use a data directory at a time
    (a second one raises RiverbedError naming the lock file).
    """

    def __init__(self, path, *, fsync=DEFAULT_FSYNC, map_size=DEFAULT_MAP_SIZE, readonly=False,
                 retention_interval=1.0, max_batch_bytes=64 << 20, clock=None):
        if fsync not in FSYNC_POLICIES:
            raise InvalidArgument(f"fsync must be one of {', '.join(FSYNC_POLICIES)}, not {fsync!r}")
        self.path = os.fspath(path)
        self.fsync = fsync
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
            sync=fsync != "never", metasync=fsync == "always", writemap=WRITEMAP, readahead=True,
            lock=True, create=not readonly)
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
        self._waiters = {}                   # sid -> list of (offset, callback)
        self._delete_listeners = []
        self._load()
        self._writer = None
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
            if txn.get(b"format", db=self._db_meta) not in (None, _SID.pack(FORMAT_VERSION)):
                raise RiverbedError(f"{self.path}: unknown data format version")
            for key, raw in txn.cursor(db=self._db_streams):
                name = bytes(key).decode()
                self._streams[name] = _Stream.decode(name, raw)

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
            for _, cb in items:
                cb(EngineClosed("engine closed"))
        self.env.close()
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
            return None if raw is None else _Stream.decode(name, raw)

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
                cur = txn.cursor(db=self._db_time)
                if cur.set_range(_TIME_KEY.pack(s.sid, max(spec.value + TS_BIAS, 0), 0)):
                    sid, _, chunk_id = _TIME_KEY.unpack(cur.key())
                    if sid == s.sid:
                        return chunk_id
            return s.next_offset
        raise InvalidArgument(f"unknown offset spec {spec!r}")

    def read_chunks(self, name, from_offset, max_chunks=1):
        """Up to ``max_chunks`` committed chunks, in order, as ``(chunk_id, bytes)`` pairs: first the
        chunk holding ``from_offset`` (or, when retention removed it, the first chunk after it).

        The bytes are the chunk as stored (header, bloom, data). Raises StreamNotFound, and ChunkError
        (naming stream and chunk id) for a chunk whose header or CRC is bad.
        """
        s = self._current(name)
        sid = s.sid
        out = []
        with self.read_txn() as txn:
            cur = txn.cursor(db=self._db_chunks)
            ok = self._seek(cur, name, sid, from_offset)
            while ok and len(out) < max_chunks:
                ksid, chunk_id = _CHUNK_KEY.unpack(cur.key())
                if ksid != sid:
                    break
                out.append((chunk_id, self._checked(name, chunk_id, cur.value())))
                ok = cur.next()
        return out

    def _checked(self, name, chunk_id, raw):
        try:
            h = core.check_chunk(raw)
        except ChunkError as e:
            raise ChunkError(e.reason, name, chunk_id) from None
        if h[H_CHUNK_ID] != chunk_id:
            raise ChunkError(f"header says chunk id {h[H_CHUNK_ID]}", name, chunk_id)
        return bytes(raw)

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
        """``[(chunk_id, timestamp_ms), ...]`` of the committed chunks in ``[from_offset, to_offset)``,
        read from the timestamp index alone (no chunk page is touched): for planning parallel scans."""
        s = self._current(name)
        out = []
        with self.read_txn() as txn:
            cur = txn.cursor(db=self._db_time)
            ok = cur.set_range(_SID.pack(s.sid))
            while ok:
                sid, ts, chunk_id = _TIME_KEY.unpack(cur.key())
                if sid != s.sid:
                    break
                if chunk_id >= from_offset and (to_offset is None or chunk_id < to_offset):
                    out.append((chunk_id, ts - TS_BIAS))
                ok = cur.next()
        out.sort()
        return out

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
        """The last publishing id stored for ``publisher`` on ``name`` (0 when none)."""
        v = self._tracking(name, TRACKING_SEQUENCE, publisher)
        return 0 if v is None else v

    def _tracking(self, name, kind, reference):
        s = self._current(name)
        with self.read_txn() as txn:
            raw = txn.get(_tracking_key(s.sid, kind, reference), db=self._db_tracking)
        return None if raw is None else _U64.unpack(raw)[0]

    # ------------------------------------------------------------------------------------------ waiting

    def watch(self, name, offset, callback):
        """Call ``callback(None)`` once a committed chunk holds ``offset`` (at once, on this thread, if
        one does already), or ``callback(exc)`` with StreamNotFound when the stream is deleted or
        EngineClosed. Later calls come from the writer thread. Returns a cancel function."""
        with self._lock:
            s = self._streams.get(name)
            if s is None:
                exc = StreamNotFound(f"stream {name!r} does not exist")
            elif offset < s.next_offset:
                exc = None
            else:
                entry = (offset, callback)
                self._waiters.setdefault(s.sid, []).append(entry)
                return lambda: self._unwatch(s.sid, entry)
        callback(exc)
        return lambda: None

    def _unwatch(self, sid, entry):
        with self._lock:
            items = self._waiters.get(sid)
            if items and entry in items:
                items.remove(entry)

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

    # ----------------------------------------------------------------------------------------- writing

    def _submit(self, op, *args):
        if self._writer is None:
            raise RiverbedError("engine was opened read-only")
        fut = Future()
        if self._closed or self._writer.stopping:
            fut.set_exception(EngineClosed("engine closed"))
            return fut
        self._writer.queue.put((op, args, fut))
        return fut

    def create_stream(self, name, arguments=None):
        """Create stream ``name`` with RabbitMQ-style ``arguments`` (see normalize_arguments).

        Returns a Future of None. Raises (through the future) StreamExists if the name is taken and
        InvalidArgument for a bad name or argument (the latter two also directly)."""
        _check_name(name)
        return self._submit(_OP_CREATE, name, normalize_arguments(arguments))

    def delete_stream(self, name):
        """Delete ``name`` and all of its records and tracking. Future of None; StreamNotFound."""
        return self._submit(_OP_DELETE, name)

    def append(self, stream, records, *, publishing_ids=None, publisher=None, filter_values=None):
        """Append ``records`` (bytes-like), one simple entry each. See append_entries."""
        if filter_values is None and 0 < len(records) <= MAX_CHUNK_ENTRIES:
            # build the chunk here, CRC included, so the writer thread only stamps and stores it
            if publisher is not None:
                _check_name(publisher, "publisher reference")
            return self._submit(_OP_APPEND, _Append(stream, core.encode_chunk_buffer(records), publishing_ids,
                                                    publisher, None, len(records), len(records), True))
        return self.append_entries(stream, core.encode_entries(records), publishing_ids=publishing_ids,
                                   publisher=publisher, filter_values=filter_values,
                                   num_entries=len(records), num_records=len(records))

    def append_chunk(self, stream, chunk, *, num_entries, num_records, publishing_ids=None, publisher=None,
                     crc_done=True):
        """Append a chunk the caller built whole: a ``bytearray`` laid out as :func:`core.encode_chunk_buffer`
        or :func:`core.publish_chunk` make it (48-byte header with the data CRC, length and counts, then
        the data section; no bloom, no filter values). The writer stamps chunk id and timestamp into it in
        place, so the caller hands it over and must not use it again.

        ``num_entries`` and ``num_records`` must be exact. Over 65535 entries (more than a header can
        count), or over the stream's records or bytes per chunk, the data section is appended as entries
        and split over several chunks. ``crc_done=False`` says the header CRC is not filled in yet
        (``core.publish_chunk(..., crc=False)``): the writer computes it only if the chunk is stored whole.
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
                                                    publisher, None, num_entries, num_records))
        return self._submit(_OP_APPEND, _Append(stream, chunk, publishing_ids, publisher, None, num_entries,
                                                num_records, True, not crc_done))

    def append_entries(self, stream, data, *, publishing_ids=None, publisher=None, filter_values=None,
                       num_entries=None, num_records=None):
        """Append an Osiris data section (simple and/or sub-batch entries, format.py) to ``stream``.

        ``publishing_ids`` and ``filter_values`` are per entry. With a ``publisher`` reference, an
        entry whose id is at or below the publisher's stored sequence is dropped and listed in
        ``AppendResult.duplicates``; the sequence is stored in the same transaction as the records.
        ``num_entries`` and ``num_records``, when the caller knows them (it built the entries), spare the
        writer a walk over the section; they must then be right. Without them the section is walked and
        checked. Returns a Future of AppendResult; errors through it: StreamNotFound, ChunkError
        (malformed entries), EngineClosed.
        """
        if publisher is not None:
            _check_name(publisher, "publisher reference")
        if (num_entries is None) != (num_records is None):
            raise InvalidArgument("give both num_entries and num_records, or neither")
        return self._submit(_OP_APPEND, _Append(stream, data, publishing_ids, publisher, filter_values,
                                                num_entries, num_records))

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
        """``{"partitions": [...], "binding_keys": [...], "arguments": {...}}`` or None."""
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


def _tracking_key(sid, kind, reference):
    return _SID.pack(sid) + bytes((kind,)) + reference.encode("utf-8")


def _take_writer_lock(path):
    import fcntl
    f = open(os.path.join(path, "writer.lock"), "a+")
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        f.close()
        raise RiverbedError(f"{path} is in use by another riverbed process (writer.lock is held)") from None
    return f


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


# --------------------------------------------------------------------------------------------------------
# the writer thread


class _Writer(threading.Thread):
    """Applies queued operations in group commits. Only this thread writes to the environment."""

    def __init__(self, engine, retention_interval, max_batch_bytes):
        super().__init__(name="riverbed-writer", daemon=True)
        self.engine = engine
        self.queue = queue.SimpleQueue()
        self.stopping = False
        self.retention_interval = retention_interval
        self.max_batch_bytes = max_batch_bytes
        self._next_retention = time.monotonic() + retention_interval
        self._seq_cache = {}      # (sid, publisher) -> last publishing id, committed
        self._purge = []          # sids of deleted streams whose keys are still to be removed
        self._stopped = threading.Event()

    def stop(self):
        self.stopping = True
        self.queue.put((_OP_STOP, (), None))
        self._stopped.wait()
        self.join()

    # ------------------------------------------------------------------------------------------ the loop

    def run(self):
        eng = self.engine
        try:
            self._find_orphans()
            stop = False
            while not stop:
                try:
                    first = self.queue.get(timeout=self._idle_timeout())
                except queue.Empty:
                    self._housekeeping()
                    continue
                batch = [first]
                size = 0
                while len(batch) < 100000 and size < self.max_batch_bytes:
                    try:
                        item = self.queue.get_nowait()
                    except queue.Empty:
                        break
                    batch.append(item)
                    if item[0] == _OP_APPEND:
                        size += len(item[1][0].data)
                stop = any(op == _OP_STOP for op, _, _ in batch)
                if any(op == _OP_RETENTION for op, _, _ in batch):
                    self._commit_batch([b for b in batch if b[0] != _OP_RETENTION])
                    self._housekeeping(force_retention=True)
                    for op, _, fut in batch:
                        if op == _OP_RETENTION:
                            fut.set_result(None)
                else:
                    self._commit_batch(batch)
                    self._housekeeping()
            eng.env.sync(True)
        except BaseException:
            log.exception("writer thread stopped by an error")
            self.stopping = True
            self._fail_pending(RiverbedError("the writer stopped after an error; see the log"))
        finally:
            self._stopped.set()

    def _idle_timeout(self):
        if self._purge:
            return 0.001
        return max(0.01, self._next_retention - time.monotonic()) if self.retention_interval else None

    def _fail_pending(self, exc):
        while True:
            try:
                _, _, fut = self.queue.get_nowait()
            except queue.Empty:
                return
            if fut is not None and not fut.done():
                fut.set_exception(exc)

    def _housekeeping(self, force_retention=False):
        if self._purge:
            self._purge_step()
        if force_retention or (self.retention_interval and time.monotonic() >= self._next_retention):
            self._next_retention = time.monotonic() + self.retention_interval
            self._retention()

    # ----------------------------------------------------------------------------------- group commit

    def _commit_batch(self, batch):
        try:
            staged, results = self._commit(batch)
        except BaseException as exc:
            # an LMDB failure we cannot recover from (disk full, I/O error): fail this batch, and
            # (stopping) everything after it, rather than leave any caller waiting
            self.stopping = True
            err = RiverbedError(f"write failed, engine stopped: {type(exc).__name__}: {exc}")
            for _, _, fut in batch:
                if fut is not None and not fut.done():
                    fut.set_exception(err)
            raise
        self._publish(staged)
        for cb in staged.on_commit:
            try:
                cb()
            except Exception:  # a broken callback must not take the writer down
                log.exception("on_commit callback failed")
        for (op, args, fut), res in zip(batch, results):
            if fut is None:
                continue
            if isinstance(res, _Deferred):
                res = res.resolve()
            if isinstance(res, BaseException):
                fut.set_exception(res)
            else:
                fut.set_result(res)

    def _commit(self, batch):
        """Apply ``batch`` in one write transaction, growing the map and retrying when it is full. A
        ``transact`` function that raises is taken out and the transaction redone without it (LMDB has
        no nested transactions under WRITEMAP, so this is how its partial writes are undone)."""
        eng = self.engine
        failed = {}     # batch index -> exception of a transact function, kept across the redo
        while True:
            staged = _Staged(eng, self)
            results = []
            try:
                eng._gate.enter()
                try:
                    with eng.env.begin(write=True, buffers=True) as txn:
                        staged.txn = txn
                        for i, (op, args, fut) in enumerate(batch):
                            if i in failed:
                                results.append(failed[i])
                            elif op == _OP_TXN:
                                results.append(self._run_txn(staged, i, args[0]))
                            else:
                                results.append(self._apply(staged, op, args))
                        staged.flush_all()
                        staged.write_states()
                finally:
                    eng._gate.leave()
            except _TxnFailed as f:
                failed[f.index] = f.exc
                continue
            except lmdb.MapFullError:
                self._grow(staged.bytes_written)
                continue
            except lmdb.MapResizedError:
                eng._gate.exclusive(lambda: eng.env.set_mapsize(0))
                continue
            return staged, results

    @staticmethod
    def _run_txn(staged, index, fn):
        try:
            return fn(WriteContext(staged))
        except (lmdb.MapFullError, lmdb.MapResizedError):
            raise
        except RiverbedError as e:
            raise _TxnFailed(index, e) from None
        except Exception as e:  # noqa: BLE001 - the caller's bug fails the caller, not the batch
            log.debug("transact function failed", exc_info=True)
            raise _TxnFailed(index, e) from None

    def _grow(self, need):
        eng = self.engine
        old = eng.env.info()["map_size"]
        new = max(old * 2, old + 2 * need)
        log.info("LMDB map full at %d MiB; growing to %d MiB", old >> 20, new >> 20)
        eng._gate.exclusive(lambda: eng.env.set_mapsize(new))

    def _apply(self, staged, op, args):
        try:
            if op == _OP_APPEND:
                return staged.append(args[0])
            if op == _OP_OFFSET:
                stream, reference, offset = args
                s = staged.stream(stream)
                staged.txn.put(_tracking_key(s.sid, TRACKING_OFFSET, reference), _U64.pack(offset),
                               db=self.engine._db_tracking)
                staged.dirty = True
                return None
            if op == _OP_CREATE:
                return staged.create(*args)
            if op == _OP_DELETE:
                return staged.delete(args[0])
            if op == _OP_SUPER_CREATE:
                return staged.create_super(*args)
            if op == _OP_SUPER_DELETE:
                return staged.delete_super(args[0])
            return None  # SYNC and STOP: completing after this commit is their whole job
        except RiverbedError as e:
            return e
        except lmdb.Error:
            raise   # MapFullError & co. concern the whole transaction: _commit_batch handles them
        except Exception as e:  # noqa: BLE001 - one bad request fails alone; the writer goes on
            return InvalidArgument(f"{type(e).__name__}: {e}")

    def _publish(self, staged):
        """Make the commit visible: swap in the new stream states, complete waiters, fire listeners."""
        eng = self.engine
        self._seq_cache.update(staged.seqs)
        wake = []
        with eng._lock:
            for name in staged.deleted:
                old = eng._streams.pop(name, None)
                if old is not None:
                    self._purge.append(old.sid)
                    for _, cb in eng._waiters.pop(old.sid, ()):
                        wake.append((cb, StreamNotFound(f"stream {name!r} was deleted")))
            for name, s in staged.streams.items():
                if name in staged.deleted:
                    continue
                eng._streams[name] = s
                items = eng._waiters.get(s.sid)
                if items:
                    keep = []
                    for entry in items:
                        if entry[0] < s.next_offset:
                            wake.append((entry[1], None))
                        else:
                            keep.append(entry)
                    eng._waiters[s.sid] = keep
            listeners = list(eng._delete_listeners) if staged.deleted else ()
        for cb, exc in wake:
            try:
                cb(exc)
            except Exception:  # a broken callback must not take the writer down
                log.exception("commit waiter failed")
        for name in staged.deleted:
            for cb in listeners:
                try:
                    cb(name)
                except Exception:
                    log.exception("delete listener failed")

    # --------------------------------------------------------------------------- retention and purging

    def _retention(self):
        eng = self.engine
        now = eng.clock()
        for name, s in list(eng._streams.items()):
            if s.chunks <= 1:
                continue
            over_bytes = s.max_bytes is not None and s.bytes > s.max_bytes
            if not over_bytes and s.max_age_ms is None:
                continue
            self._trim(name, s, now)

    def _trim(self, name, s, now):
        """Remove whole chunks from the head of ``s`` until it is within its limits, keeping the last
        chunk, in transactions of at most 1,000 chunks so appends are not held up for long."""
        eng = self.engine
        while True:
            new = s.copy()
            removed = 0
            eng._gate.enter()
            try:
                with eng.env.begin(write=True, buffers=True) as txn:
                    cur = txn.cursor(db=eng._db_chunks)
                    ok = cur.set_range(_CHUNK_KEY.pack(s.sid, 0))
                    while ok and removed < 1000 and new.chunks > 1:
                        sid, chunk_id = _CHUNK_KEY.unpack(cur.key())
                        if sid != s.sid:
                            break
                        h = core.read_header(cur.value())
                        size = len(cur.value())
                        too_big = new.max_bytes is not None and new.bytes > new.max_bytes
                        too_old = new.max_age_ms is not None and h[H_TIMESTAMP] < now - new.max_age_ms
                        if not (too_big or too_old):
                            break
                        txn.delete(_TIME_KEY.pack(sid, h[H_TIMESTAMP] + TS_BIAS, chunk_id), db=eng._db_time)
                        ok = cur.delete()
                        new.bytes -= size
                        new.records -= h[H_RECORDS]
                        new.chunks -= 1
                        removed += 1
                    if removed:
                        new.first_chunk = _CHUNK_KEY.unpack(cur.key())[1] if ok else new.last_chunk
                        txn.put(name.encode(), new.encode(), db=eng._db_streams)
            finally:
                eng._gate.leave()
            if not removed:
                return
            with eng._lock:
                cur_s = eng._streams.get(name)
                if cur_s is None or cur_s.sid != s.sid:
                    return
                # appends may have committed meanwhile; only the head moved here
                merged = cur_s.copy()
                merged.first_chunk = new.first_chunk
                merged.bytes -= s.bytes - new.bytes
                merged.records -= s.records - new.records
                merged.chunks -= s.chunks - new.chunks
                eng._streams[name] = merged
            log.debug("retention removed %d chunks from %s; first chunk now %d", removed, name,
                      new.first_chunk)
            s = merged
            if removed < 1000:
                return

    def _find_orphans(self):
        """Stream ids with keys but no stream (a delete interrupted by a crash) are purged again."""
        eng = self.engine
        live = {s.sid for s in eng._streams.values()}
        found = set()
        with eng.read_txn() as txn:
            for db in (eng._db_chunks, eng._db_tracking, eng._db_time):
                cur = txn.cursor(db=db)
                ok = cur.first()
                while ok:
                    sid = _SID.unpack_from(cur.key())[0]
                    if sid not in live:
                        found.add(sid)
                    ok = cur.set_range(_SID.pack(sid + 1)) if sid < 0xFFFFFFFF else False
        self._purge.extend(sorted(found))

    def _purge_step(self):
        """Remove up to 1,000 keys of a deleted stream per transaction."""
        eng = self.engine
        sid = self._purge[0]
        prefix = _SID.pack(sid)
        removed = 0
        eng._gate.enter()
        try:
            with eng.env.begin(write=True, buffers=True) as txn:
                for db in (eng._db_chunks, eng._db_time, eng._db_tracking):
                    cur = txn.cursor(db=db)
                    ok = cur.set_range(prefix)
                    while ok and removed < 1000 and bytes(cur.key()[:4]) == prefix:
                        ok = cur.delete()
                        removed += 1
        finally:
            eng._gate.leave()
        if removed < 1000:
            self._purge.pop(0)
        self._seq_cache = {k: v for k, v in self._seq_cache.items() if k[0] != sid}


class _TxnFailed(Exception):
    def __init__(self, index, exc):
        super().__init__(index, exc)
        self.index = index
        self.exc = exc


class WriteContext:
    """What a :meth:`Engine.transact` function gets: the writer's transaction for this group commit.

    ``txn`` is the LMDB write transaction (buffers=True: values read are memoryviews valid only inside
    it); ``db_docs``, ``db_docidx`` and ``db_collections`` are the document store's databases. Writer
    thread only, and only during the call."""

    __slots__ = ("txn", "engine", "_staged")

    def __init__(self, staged):
        self._staged = staged
        self.txn = staged.txn
        self.engine = staged.engine

    @property
    def db_docs(self):
        return self.engine._db_docs

    @property
    def db_docidx(self):
        return self.engine._db_docidx

    @property
    def db_collections(self):
        return self.engine._db_collections

    def has_stream(self, name):
        """Whether ``name`` exists as staged in this transaction."""
        st = self._staged
        return name in st.streams or (name in self.engine._streams and name not in st.deleted)

    def store_offset(self, stream, reference, offset):
        """Stage consumer/position ``offset`` of ``reference`` on ``stream`` (StreamNotFound)."""
        _check_name(reference, "consumer reference")
        s = self._staged.stream(stream)
        self.txn.put(_tracking_key(s.sid, TRACKING_OFFSET, reference), _U64.pack(int(offset)),
                     db=self.engine._db_tracking)
        self._staged.dirty = True

    def query_offset(self, stream, reference):
        """The offset of ``reference`` as staged in this transaction, or None."""
        s = self._staged.stream(stream)
        raw = self.txn.get(_tracking_key(s.sid, TRACKING_OFFSET, reference), db=self.engine._db_tracking)
        return None if raw is None else _U64.unpack(raw)[0]

    def delete_offset(self, stream, reference):
        """Remove the stored offset of ``reference`` (no error when there is none)."""
        s = self._staged.stream(stream)
        self.txn.delete(_tracking_key(s.sid, TRACKING_OFFSET, reference), db=self.engine._db_tracking)

    def append(self, stream, records):
        """Stage ``records`` (bytes-like) for ``stream``, contiguous and in order. Returns an object
        whose ``first`` and ``last`` offsets are set once the transaction's chunks are built (read them
        in an ``on_commit`` callback). Raises StreamNotFound."""
        records = list(records)
        req = _Append(stream, core.encode_entries(records), None, None, None, len(records), len(records))
        return self._staged.append(req)

    def on_commit(self, cb):
        """Call ``cb()`` on the writer thread once this transaction has committed (not on a redo)."""
        self._staged.on_commit.append(cb)


class _Deferred:
    """An append result whose offsets are known only once its chunk is flushed."""

    __slots__ = ("first", "last", "duplicates")

    def __init__(self, duplicates):
        self.first = -1
        self.last = -1
        self.duplicates = duplicates

    def resolve(self):
        return AppendResult(self.first, self.last, self.duplicates)


class _Staged:
    """Everything one write transaction changes, kept aside until it commits: a MapFullError retry
    starts again from the committed state."""

    def __init__(self, engine, writer):
        self.engine = engine
        self.writer = writer
        self.txn = None
        self.streams = {}         # name -> staged _Stream copy
        self.pending = {}         # name -> _Pending
        self.seqs = {}            # (sid, publisher) -> staged sequence
        self.deleted = []
        self.dirty = False
        self.bytes_written = 0
        self.next_sid = None
        self.on_commit = []

    def stream(self, name):
        s = self.streams.get(name)
        if s is None:
            if name in self.deleted:
                raise StreamNotFound(f"stream {name!r} does not exist")
            s = self.engine._get_stream(name).copy()
            self.streams[name] = s
        return s

    # ------------------------------------------------------------------------------------------ admin

    def create(self, name, args):
        eng = self.engine
        if (name in eng._streams and name not in self.deleted) or (name in self.streams):
            raise StreamExists(f"stream {name!r} already exists")
        if self.next_sid is None:
            raw = self.txn.get(b"next-sid", db=eng._db_meta)
            self.next_sid = _SID.unpack(raw)[0] if raw is not None else 1
            self.txn.put(b"format", _SID.pack(FORMAT_VERSION), db=eng._db_meta)
        s = _Stream(name, self.next_sid, args)
        self.next_sid += 1
        self.txn.put(b"next-sid", _SID.pack(self.next_sid), db=eng._db_meta)
        if name in self.deleted:
            self.deleted.remove(name)
        self.streams[name] = s
        self.dirty = True
        return None

    def delete(self, name):
        s = self.stream(name)
        self.pending.pop(name, None)
        self.txn.delete(name.encode(), db=self.engine._db_streams)
        del self.streams[name]
        self.deleted.append(name)
        self.dirty = True
        # the stream's keys are purged after the commit in small transactions; its sid is never reused
        return None

    def _exists(self, name):
        return (name in self.engine._streams and name not in self.deleted) or name in self.streams

    def create_super(self, name, partitions, binding_keys, args, adopt):
        eng = self.engine
        key = name.encode("utf-8")
        if self.txn.get(key, db=eng._db_supers) is not None:
            raise StreamExists(f"super stream {name!r} already exists")
        if not adopt:
            for p in partitions:
                if self._exists(p):
                    raise StreamExists(f"stream {p!r} already exists")
        for p in partitions:
            if not self._exists(p):
                self.create(p, args)
        self.txn.put(key, json.dumps({"partitions": partitions, "binding_keys": binding_keys,
                                      "arguments": args}).encode(), db=eng._db_supers)
        return None

    def delete_super(self, name):
        eng = self.engine
        key = name.encode("utf-8")
        raw = self.txn.get(key, db=eng._db_supers)
        if raw is None:
            raise StreamNotFound(f"super stream {name!r} does not exist")
        for p in json.loads(bytes(raw))["partitions"]:
            if self._exists(p):
                self.delete(p)
        self.txn.delete(key, db=eng._db_supers)
        self.dirty = True
        return None

    # ----------------------------------------------------------------------------------------- append

    def seq(self, sid, publisher):
        key = (sid, publisher)
        v = self.seqs.get(key)
        if v is None:
            v = self.writer._seq_cache.get(key)
            if v is None:
                raw = self.txn.get(_tracking_key(sid, TRACKING_SEQUENCE, publisher), db=self.engine._db_tracking)
                v = _U64.unpack(raw)[0] if raw is not None else 0
        return v

    def append(self, req):
        s = self.stream(req.stream)
        data = req.data
        sealed = req.sealed
        if sealed:
            # a whole chunk built by the caller; its data section starts after the header
            data = memoryview(data)[LEN_CHUNK_HEADER:]
        ids = req.ids
        filters = req.filters
        entries, records = req.entries, req.records
        dups = []
        ends = counts = None
        if req.publisher is not None and ids is not None:
            last = self.seq(s.sid, req.publisher)
            if type(ids) is PublishingIds:
                # summarised by the caller: no per-id work unless some entry is a duplicate
                fresh = ids.increasing and len(ids) > 0 and ids.first > last
            else:
                fresh = ids and ids[0] > last and all(ids[i] < ids[i + 1] for i in range(len(ids) - 1))
            if fresh:
                new_last = ids.last if type(ids) is PublishingIds else ids[-1]
            else:
                data, ends, counts, filters, dups, new_last = self._drop_duplicates(data, ids, filters, last)
                sealed = False
                entries = records = None
            if new_last != last:
                self.seqs[(s.sid, req.publisher)] = new_last
                self.txn.put(_tracking_key(s.sid, TRACKING_SEQUENCE, req.publisher), _U64.pack(new_last),
                             db=self.engine._db_tracking)
        res = _Deferred(dups)
        if not data:
            return res
        p = self.pending.get(s.name)
        if p is None:
            p = self.pending[s.name] = _Pending()
        if sealed and filters is None and OWN_CHUNK_MIN <= len(data) <= s.chunk_max and records <= s.chunk_max_records:
            # big enough to be a chunk of its own: stamp the caller's buffer, no copy
            self._flush(s, p)
            res.first = s.next_offset
            res.last = s.next_offset + records - 1
            if req.crc_pending:
                _CRC.pack_into(req.data, H_CRC_OFFSET, core.crc32(data))
            self._write(s, req.data, records)
            return res
        if ends is None and entries is not None and entries <= MAX_CHUNK_ENTRIES:
            # the common case: the caller counted the entries and they fit in one chunk
            if filters is not None and len(filters) != entries:
                raise ChunkError(f"{len(filters)} filter values for {entries} entries")
            if p.entries and (p.size + len(data) > s.chunk_max or p.entries + entries > MAX_CHUNK_ENTRIES
                              or p.records + records > s.chunk_max_records):
                self._flush(s, p)
            if (len(data) <= s.chunk_max and records <= s.chunk_max_records) or entries == 1:
                p.parts.append(data)
                p.size += len(data)
                p.entries += entries
                res.first = s.next_offset + p.records
                p.records += records
                res.last = s.next_offset + p.records - 1
                self._note_filters(p, filters)
                return res
        if ends is None and filters is None and not p.entries:
            # the common split (one big Publish frame over the chunk bounds): the core finds the cuts
            self._add_cut(s, p, data, res)
            return res
        if ends is None:
            ends, counts = core.scan_entries(data)
        if filters is not None and len(filters) != len(ends):
            raise ChunkError(f"{len(filters)} filter values for {len(ends)} entries")
        self._add(s, p, data, ends, counts, filters, res)
        return res

    @staticmethod
    def _drop_duplicates(data, ids, filters, last):
        """Keep the entries whose publishing id is above ``last`` (and above every id kept before it)."""
        ends, counts = core.scan_entries(data)
        if len(ends) != len(ids):
            raise ChunkError(f"{len(ids)} publishing ids for {len(ends)} entries")
        mv = memoryview(data)
        keep_parts, keep_ends, keep_counts, keep_filters, dups = [], [], [], [], []
        pos = start = 0
        for i, end in enumerate(ends):
            if ids[i] > last:
                last = ids[i]
                keep_parts.append(mv[start:end])
                pos += end - start
                keep_ends.append(pos)
                keep_counts.append(counts[i])
                if filters is not None:
                    keep_filters.append(filters[i])
            else:
                dups.append(ids[i])
            start = end
        return (b"".join(keep_parts), keep_ends, keep_counts, keep_filters if filters is not None else None,
                dups, last)

    @staticmethod
    def _note_filters(p, filters):
        if filters is None:
            p.unfiltered = True
            return
        for f in filters:
            if f is None:
                p.unfiltered = True
            else:
                p.filters.add(bytes(f))

    def _add(self, s, p, data, ends, counts, filters, res):
        """Add entries that may need splitting over several chunks (by bytes, entries or records)."""
        start = 0
        n = len(ends)
        i = 0
        mv = memoryview(data)
        # records before entry k: cum[k]; so entries i..j-1 hold cum[j] - cum[i] records
        cum = list(itertools.accumulate(counts, initial=0))
        while i < n:
            j = bisect.bisect_right(ends, start + s.chunk_max - p.size, i)
            j = min(j, i + MAX_CHUNK_ENTRIES - p.entries)
            j = min(j, max(bisect.bisect_right(cum, cum[i] + s.chunk_max_records - p.records, i) - 1, i))
            if j == i and p.entries == 0:
                j = i + 1   # an entry larger than a whole chunk gets a chunk of its own
            if j == i:
                self._flush(s, p)
                continue
            end = ends[j - 1]
            p.parts.append(mv[start:end])
            p.size += end - start
            p.entries += j - i
            if res.first < 0:
                res.first = s.next_offset + p.records
            p.records += sum(counts[i:j])
            res.last = s.next_offset + p.records - 1
            self._note_filters(p, filters[i:j] if filters is not None else None)
            start = end
            i = j

    def _add_cut(self, s, p, data, res):
        """Entries of one append into an empty pending chunk, cut where the core says; every piece but the
        last becomes a chunk now, the last stays pending (later appends of this commit may join it)."""
        cuts = core.cut_entries(data, s.chunk_max, MAX_CHUNK_ENTRIES, s.chunk_max_records)
        mv = memoryview(data)
        start = 0
        res.first = s.next_offset
        for k, (end, entries, records) in enumerate(cuts):
            if k:
                self._flush(s, p)
            p.parts.append(mv[start:end])
            p.size = end - start
            p.entries = entries
            p.records = records
            start = end
        p.unfiltered = True
        res.last = s.next_offset + p.records - 1

    def _flush(self, s, p):
        """Turn the pending entries of ``s`` into one chunk."""
        if not p.entries:
            return
        data = p.parts[0] if len(p.parts) == 1 else b"".join(p.parts)
        bloom = core.build_bloom(list(p.filters), p.unfiltered, s.bloom_size) if p.filters else b""
        ts, chunk_id = self._stamp(s)
        # built with its final header, so it needs no writable copy to be stamped
        chunk = core.build_chunk(data, p.entries, p.records, ts, chunk_id, CHUNK_EPOCH, 0, bloom, b"")
        self._store(s, chunk, p.records, ts, chunk_id)
        p.__init__()   # callers keep using the same object for the next chunk

    def _stamp(self, s):
        """Timestamp (ms, never below the stream's last) and id of the next chunk of ``s``."""
        now = self.engine.clock()
        return (now if now > s.last_ts else s.last_ts), s.next_offset

    def _write(self, s, chunk, records):
        """Stamp chunk id, epoch and timestamp into the caller's sealed ``chunk`` (a bytearray) and store it."""
        ts, chunk_id = self._stamp(s)
        _STAMP_TS.pack_into(chunk, 8, ts)
        _STAMP_ID.pack_into(chunk, 16, CHUNK_EPOCH)
        _STAMP_ID.pack_into(chunk, 24, chunk_id)
        self._store(s, chunk, records, ts, chunk_id)

    def _store(self, s, chunk, records, ts, chunk_id):
        """Put a stamped chunk and its index entry, and advance the staged stream state."""
        eng = self.engine
        txn = self.txn
        txn.put(_CHUNK_KEY.pack(s.sid, chunk_id), chunk, db=eng._db_chunks)
        txn.put(_TIME_KEY.pack(s.sid, ts + TS_BIAS, chunk_id), b"", db=eng._db_time)
        self.bytes_written += len(chunk)
        s.next_offset += records
        if s.first_chunk < 0:
            s.first_chunk = chunk_id
        s.last_chunk = chunk_id
        s.bytes += len(chunk)
        s.records += records
        s.chunks += 1
        s.last_ts = ts
        self.dirty = True

    def flush_all(self):
        for name, p in list(self.pending.items()):
            self._flush(self.streams[name], p)

    def write_states(self):
        for name, s in self.streams.items():
            self.txn.put(name.encode(), s.encode(), db=self.engine._db_streams)
