"""The LMDB layout of the log: key and value formats, per-stream state, stream arguments.

LMDB layout (one environment per data directory; keys are prefixed by the stream id, because one named
database per stream makes every transaction pay for all of them)::

    named db   key                                              value
    ---------  -----------------------------------------------  ----------------------------------------
    streams    name (UTF-8)                                     STATE (below) + arguments as JSON; saved
                                                                every 64 chunks, rolled forward over the
                                                                chunks after it when read (engine/sparse.py)
    chunks     sid u32 BE | chunk id u64 BE          (12 B)     the chunk: 48-byte header | bloom | data
    timeidx    sid u32 BE | timestamp u64 BE | chunk id u64 BE  empty; timestamp stored as ms + 2**63 so
                                                     (20 B)     that negative times sort first. Sparse:
                                                                only chunks holding a multiple of 64
                                                                offsets (engine/sparse.py)
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
    after a time" from the entries on either side of it and the chunk headers between them (sparse.py).
"""

import json
import re
import struct
from collections import namedtuple

from riverbed.engine.errors import InvalidArgument
from riverbed.engine.format import BLOOM_DEFAULT_SIZE, BLOOM_MAX_SIZE, BLOOM_MIN_SIZE

DEFAULT_CHUNK_MAX_BYTES = (1 << 20) - 1024   # data bytes; a chunk + Deliver prefix fits a 1 MiB frame_max
# Records per chunk of a commit's last chunk of a stream (the chunks before it: staged.CHUNK_BODY_RECORDS).
# A reader at "last" starts at the last chunk, so the bound is how far back "last" reaches.
DEFAULT_CHUNK_MAX_RECORDS = 1000
MAX_STREAM_NAME = 255                 # bytes of UTF-8, as RabbitMQ queue names
MAX_REFERENCE = 255                   # bytes of UTF-8 (publisher and consumer references)
# 2: the sparse timestamp index and lazily saved state records (sparse.py). A format-1 directory reads
# as it is (a dense index, a record per commit) and is marked 2 by its first writable open: an older
# version would trust a state record that is behind its chunks, and append over them
FORMAT_VERSION = 2
FORMATS_READ = (1, 2)
TS_BIAS = 1 << 63
STATE_FORCE = 1 << 62    # _Stream.unsaved of a state whose record must be written with its next commit
CHUNK_EPOCH = 1      # Osiris starts a new stream's leader epoch at 1, and clients assert it

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
MAX_CHUNK_ENTRIES = 0xFFFF      # NumEntries is a uint16
assert _STATE.size == LEN_STATE

StreamInfo = namedtuple("StreamInfo", (
    "name arguments first_chunk_id committed_chunk_id last_chunk_id first_offset last_offset next_offset "
    "bytes records chunks first_timestamp last_timestamp"))
StreamInfo.__doc__ = """Committed statistics of one stream. Offsets and chunk ids are -1 when there is none;
bytes are stored chunk bytes (headers included); timestamps are ms since the epoch (-1 when empty)."""

AppendResult = namedtuple("AppendResult", "first_offset last_offset duplicates")
AppendResult.__doc__ = """Outcome of an append: the offsets given to the stored records (-1, -1 when every
entry was a duplicate) and the publishing ids dropped as duplicates."""


_new_object = object.__new__


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

    @staticmethod
    def of(raw, first, last, increasing):
        """``PublishingIds(raw, first, last, increasing)`` without the class call (type_call ->
        slot_tp_init -> the Python __init__), which costs more than the object on the one-message path."""
        ids = _new_object(PublishingIds)
        ids.raw, ids.first, ids.last, ids.increasing, ids._ints = raw, first, last, increasing, None
        return ids

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



# --------------------------------------------------------------------------------------------------------
# stream arguments

_AGE_UNITS = {"Y": 365 * 86400, "M": 30 * 86400, "D": 86400, "h": 3600, "m": 60, "s": 1}
_AGE_RE = re.compile(r"^(\d+)([YMDhms])$")
_IGNORED_ARGS = {"stream-max-segment-size-bytes", "initial-cluster-size", "queue-type"}
FSYNC_RANK = {"never": 0, "batch": 1, "always": 2}   # the durability policies, weakest first (engine/log.py)
# RabbitMQ's leader locators; its older names mean "balanced" there too (the cluster places by them)
LEADER_LOCATORS = {"client-local": "client-local", "balanced": "balanced", "least-leaders": "balanced",
                   "random": "balanced"}


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
        elif name == "fsync":
            if value not in FSYNC_RANK:
                raise InvalidArgument(f"{key} must be always, batch or never, not {value!r}")
        elif name == "queue-leader-locator":
            if value not in LEADER_LOCATORS:
                raise InvalidArgument(f"{key} must be client-local or balanced, not {value!r}")
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


_NO_ARGS_JSON = b"{}"


class _Stream:
    """Committed (or, inside the writer, staged) state of one stream. ``args`` is never changed in place
    (copies share it)."""

    __slots__ = ("name", "sid", "args", "next_offset", "first_chunk", "last_chunk", "bytes", "records",
                 "chunks", "last_ts", "max_bytes", "max_age_ms", "chunk_max", "chunk_max_records", "bloom_size",
                 "args_json", "unsaved")

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
        # the arguments never change, and the state is rewritten at every commit: encode them once (most
        # streams have none: they share one encoding, 10,000 streams being issue 26's memory row)
        self.args_json = json.dumps(args).encode() if args else _NO_ARGS_JSON
        # chunks stored since this state was last written to its ``streams`` record (engine/sparse.py:
        # the record is saved every STATE_SAVE_EVERY chunks); a new stream's record is still to be written
        self.unsaved = STATE_FORCE

    @classmethod
    def decode(cls, name, raw):
        sid, _, nxt, first, last, nbytes, records, chunks, last_ts = _STATE.unpack_from(raw, 0)
        s = cls(name, sid, json.loads(bytes(raw[LEN_STATE:])))
        s.next_offset, s.first_chunk, s.last_chunk = nxt, first, last
        s.bytes, s.records, s.chunks, s.last_ts = nbytes, records, chunks, last_ts
        s.unsaved = 0
        return s

    def encode(self):
        return _STATE.pack(self.sid, 0, self.next_offset, self.first_chunk, self.last_chunk, self.bytes,
                           self.records, self.chunks, self.last_ts) + self.args_json

    def advance(self, chunk_id, records, nbytes, ts):
        """Account one stored chunk (``records`` records, ``nbytes`` bytes, timestamp ``ts``) at ``chunk_id``."""
        self.next_offset = chunk_id + records
        if self.first_chunk < 0:
            self.first_chunk = chunk_id
        self.last_chunk = chunk_id
        self.bytes += nbytes
        self.records += records
        self.chunks += 1
        self.last_ts = ts
        self.unsaved += 1

    def copy(self):
        # spelled out: the writer copies the state of every stream it touches at every commit
        c = _new_stream(_Stream)
        c.name, c.sid, c.args, c.next_offset = self.name, self.sid, self.args, self.next_offset
        c.first_chunk, c.last_chunk, c.bytes = self.first_chunk, self.last_chunk, self.bytes
        c.records, c.chunks, c.last_ts = self.records, self.chunks, self.last_ts
        c.max_bytes, c.max_age_ms, c.chunk_max = self.max_bytes, self.max_age_ms, self.chunk_max
        c.chunk_max_records, c.bloom_size, c.args_json = self.chunk_max_records, self.bloom_size, self.args_json
        c.unsaved = self.unsaved
        return c

    def info(self, first_ts):
        return StreamInfo(self.name, dict(self.args), self.first_chunk, self.last_chunk, self.last_chunk,
                          self.first_chunk, self.next_offset - 1 if self.chunks else -1, self.next_offset,
                          self.bytes, self.records, self.chunks, first_ts, self.last_ts if self.chunks else -1)


_new_stream = object.__new__
assert len(_Stream.__slots__) == 17, "_Stream.copy names every slot"


def _tracking_key(sid, kind, reference):
    return _SID.pack(sid) + bytes((kind,)) + reference.encode("utf-8")
