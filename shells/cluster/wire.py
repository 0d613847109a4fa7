"""The replication port's frames: how a member copies its leader's chunks (the chunk bytes as stored).

Every frame is ``| length u32 | type u8 | payload |`` (big-endian; length counts type and payload)::

    HELLO     member -> leader   JSON {"node", "stream", "epoch", "next", "last": [chunk id, epoch, crc] | null,
                                 "observer": true when a node that is no member copies it for its readers
                                 (remote_read.py; optional, default false)}
    CHUNK     leader -> member   one whole chunk as the leader stores it (header, bloom, data)
    SEQS      leader -> member   JSON {publisher: last id}: stored with the next CHUNK (dedup survives failover);
                                 before the last chunk of every batch that reaches the log end (the member
                                 holds the chunks before it until then), and before each chunk a leader
                                 sends ahead of its own commit (leader_path.py: only the publisher that
                                 chunk moves, {} for none; the member holds every earlier sequence)
    COMMIT    leader -> member   u64 committed offset (held by a majority): how far readers may see; sent
                                 again as a heartbeat when the member was not heard from for TTL / 4
    ACK       member -> leader   u64 the member's next offset, durable under its own fsync policy; also
                                 the answer to every COMMIT, so the leader knows who still hears it
    TRUNCATE  leader -> member   u64 offset: drop every chunk from there (an older epoch's unconfirmed tail);
                                 CUT_ALL: drop the whole copy (it ends before the leader's log starts)
    REFUSE    leader -> member   JSON {"reason"}: not (or no longer) the leader of that stream at that epoch
    OFFSETS   leader -> member   JSON {reference: offset}: consumer offsets (StoreOffset) that changed
"""

import asyncio
import json
import struct
import threading

# at module level: imported inside decode_chunk they cost three imports per replicated chunk
from riverbed.engine import core
from riverbed.engine.errors import RiverbedError
from riverbed.engine.format import LEN_CHUNK_HEADER

HELLO, CHUNK, SEQS, COMMIT, ACK, TRUNCATE, REFUSE, OFFSETS = range(1, 9)
CUT_ALL = (1 << 64) - 1    # TRUNCATE's offset for "every chunk you hold"
LEN_FRAME_HEADER = 5
MAX_FRAME = 256 << 20        # a chunk is at most the stream's chunk size; this bounds a hostile length
_HEAD = struct.Struct(">IB")
_U64 = struct.Struct(">Q")


class WireError(Exception):
    """A malformed frame on the replication port: the connection is dropped."""


def frame(kind, payload=b""):
    return _HEAD.pack(len(payload) + 1, kind) + payload


def head(kind, length):
    """The header of a frame of type ``kind`` whose payload (sent after it) is ``length`` bytes."""
    return _HEAD.pack(length + 1, kind)


def json_frame(kind, obj):
    return frame(kind, json.dumps(obj, separators=(",", ":")).encode())


def u64_frame(kind, value):
    return frame(kind, _U64.pack(value))


async def read_frame(reader):
    """``(type, payload)`` of the next frame; raises asyncio.IncompleteReadError at EOF, WireError."""
    head = await reader.readexactly(LEN_FRAME_HEADER)
    length, kind = _HEAD.unpack(head)
    if not 1 <= length <= MAX_FRAME:
        raise WireError(f"frame length {length}")
    payload = await reader.readexactly(length - 1) if length > 1 else b""
    return kind, payload


def u64(payload):
    if len(payload) != 8:
        raise WireError("expected a u64")
    return _U64.unpack(payload)[0]


def parse_json(payload):
    if type(payload) is memoryview:      # a large payload as FrameReader hands it out: json takes no views
        payload = bytes(payload)
    try:
        obj = json.loads(payload)
    except (ValueError, RecursionError) as e:     # RecursionError: arrays nested a thousand deep
        raise WireError(f"bad JSON: {type(e).__name__}") from None
    if not isinstance(obj, dict):
        raise WireError("expected a JSON object")
    return obj


# ------------------------------------------------------------------------------------------- decoders
# What a peer sent, checked before anything acts on it: every malformed payload is a WireError (the
# connection is dropped), never a TypeError or KeyError out of the node's loops. Fuzzed by
# tests/fuzz/t_replication.py.

U64_MAX = (1 << 64) - 1
_ACK_HEAD = _HEAD.pack(9, ACK)
LEN_ACK_FRAME = LEN_FRAME_HEADER + 8


def lone_ack(data):
    """The offset of ``data`` when it is exactly one whole ACK frame (what a leader reads from a member
    almost every time), else None: then :func:`split_frames` reads it. Never raises."""
    if len(data) == LEN_ACK_FRAME and data[:LEN_FRAME_HEADER] == _ACK_HEAD:
        return _U64.unpack_from(data, LEN_FRAME_HEADER)[0]
    return None


def split_frames(buf):
    """``([(type, payload)], consumed)``: the whole frames at the start of ``buf`` (bytes-like) and how
    many bytes they take; a partial frame at the end is left for the next read. Raises WireError for a
    length outside 1..MAX_FRAME (the same rule as :func:`read_frame`)."""
    view = memoryview(buf)
    frames, pos, end = [], 0, len(view)
    while end - pos >= LEN_FRAME_HEADER:
        length, kind = _HEAD.unpack_from(view, pos)
        if not 1 <= length <= MAX_FRAME:
            raise WireError(f"frame length {length}")
        if end - pos - 4 < length:
            break
        frames.append((kind, bytes(view[pos + LEN_FRAME_HEADER:pos + 4 + length])))
        pos += 4 + length
    return frames, pos


SLAB_MIN = 64 << 10          # the least receive buffer a large payload gets (FrameReader)
SPARE_MAX = 16 << 20         # bytes of released receive buffers a SlabPool keeps for reuse


class SlabPool:
    """Receive buffers (*slabs*) that :class:`FrameReader`\\ s read large payloads into, kept once released
    for the next payloads of any reader that shares the pool (all of one loop thread's: see
    :func:`thread_pool`), so a member's steady stream of chunks allocates and zeroes no memory per chunk
    and a node holds at most ``keep`` bytes of idle slabs however many streams it follows. A slab is a
    power of two of at least SLAB_MIN bytes, uninitialised when new (only bytes a read filled are ever
    handed out). Not thread-safe: one thread's."""

    __slots__ = ("spare", "spare_bytes", "keep")

    def __init__(self, keep=SPARE_MAX):
        self.spare = {}           # slab size -> released slabs of that size, the last released (warmest) last
        self.spare_bytes = 0
        self.keep = keep

    def view(self, size):
        """A writable memoryview of exactly ``size`` (> 0) bytes over a released slab of the size class
        that holds them, else over a new one."""
        cls = max(SLAB_MIN, 1 << (size - 1).bit_length())
        free = self.spare.get(cls)
        if free:
            self.spare_bytes -= cls
            return memoryview(free.pop())[:size]
        # not zeroed (core.receive_buffer): the socket fills every byte of the view before it is handed out
        return memoryview(core.receive_buffer(cls))[:size]

    def give(self, slab):
        """Keep ``slab`` (a bytearray :meth:`view` made) for reuse, unless the pool holds ``keep`` bytes."""
        cls = len(slab)
        if self.spare_bytes + cls <= self.keep and cls >= SLAB_MIN and cls & (cls - 1) == 0:
            self.spare.setdefault(cls, []).append(slab)
            self.spare_bytes += cls


_threads = threading.local()


def thread_pool():
    """The calling thread's :class:`SlabPool` (made on first use): every FrameReader of one event loop
    shares it."""
    pool = getattr(_threads, "pool", None)
    if pool is None:
        pool = _threads.pool = SlabPool()
    return pool


class FrameReader:
    """The frames of a byte stream read straight into this reader's buffers (for an
    ``asyncio.BufferedProtocol``: :meth:`get_buffer` is the protocol's ``get_buffer``, :meth:`feed` its
    ``buffer_updated``), with no copy of a large payload: a payload of at least ``big`` bytes is read into
    a slab of its own (from ``pool``, by default the thread's :func:`thread_pool`) and handed out as a
    ``memoryview`` of exactly its bytes, which the caller may keep (a member hands a replicated chunk to
    the engine as it came off the socket). :meth:`release` gives the slab back once nothing reads the
    payload any more (the engine stored it), and a next large payload is read into it (issue 23: a fresh
    zeroed ``bytearray`` per chunk was a third of a member's instructions); a payload never released is
    simply garbage-collected. Smaller frames come out of one scratch buffer as ``bytes``; it is small
    (16 KiB) because the start of a large payload that a read brings into it is copied once. A payload
    over ``grow`` bytes gets a ``bytearray`` that doubles as it arrives (never a slab), so a hostile
    length reserves little up front.

    The same frames as :func:`split_frames` and :func:`read_frame` for the same bytes, whatever the reads
    (tests/fuzz/t_replication.py checks it). Not thread-safe: one connection's loop thread (release
    too)."""

    __slots__ = ("big", "grow", "scratch", "view", "have", "payload", "payload_view", "kind", "size", "filled",
                 "pool")

    def __init__(self, scratch=16 << 10, big=4 << 10, grow=4 << 20, pool=None):
        if scratch < big + LEN_FRAME_HEADER:
            raise ValueError("the scratch buffer must hold a whole small frame")
        self.big = big
        self.grow = grow
        self.scratch = bytearray(scratch)
        self.view = memoryview(self.scratch)
        self.have = 0             # bytes of scratch holding data not yet split into frames
        self.payload = None       # the large payload being read into its own buffer (a slab's view or,
        self.payload_view = None  # over ``grow``, a bytearray)
        self.kind = 0
        self.size = 0             # bytes of that payload in all
        self.filled = 0           # bytes of it read so far
        self.pool = pool if pool is not None else thread_pool()

    def release(self, payload):
        """Hand back a large payload :meth:`feed` gave (its slab is read into again): call it once the
        payload is no longer read by anyone, at most once per payload. Anything else (a ``bytes`` or
        ``bytearray`` payload) is ignored. The payload's memoryview is released, so a use after this raises
        ValueError instead of reading other bytes."""
        if type(payload) is not memoryview:
            return
        slab = payload.obj
        try:
            payload.release()
        except BufferError:     # something still holds a buffer of it: never reused
            return
        if type(slab) is bytearray:
            self.pool.give(slab)

    def get_buffer(self):
        """Where the next read goes: the rest of a large payload, else the scratch buffer's free part
        (never empty)."""
        if self.payload is not None:
            if self.filled == len(self.payload):
                # more of a payload over ``grow`` bytes: a buffer twice as large (a copy, never a resize:
                # the loop may still hold a view of the old one)
                payload = bytearray(min(self.size, 2 * self.filled))
                payload[:self.filled] = self.payload
                self.payload, self.payload_view = payload, memoryview(payload)
            return self.payload_view[self.filled:]
        return self.view[self.have:]

    def feed(self, nbytes):
        """``[(type, payload)]``: the frames completed by the ``nbytes`` just read into :meth:`get_buffer`'s
        buffer (a large payload as a ``memoryview`` of its slab, or a ``bytearray`` over ``grow`` bytes;
        the others as ``bytes``). Raises WireError for a length outside 1..MAX_FRAME; the reader is then
        unusable."""
        if self.payload is not None:
            self.filled += nbytes
            if self.filled < self.size:
                return []
            done = (self.kind, self.payload)
            self.payload = self.payload_view = None
            return [done]
        self.have += nbytes
        view, pos, end = self.view, 0, self.have
        frames = []
        while end - pos >= LEN_FRAME_HEADER:
            length, kind = _HEAD.unpack_from(view, pos)
            if not 1 <= length <= MAX_FRAME:
                raise WireError(f"frame length {length}")
            size = length - 1
            start = pos + LEN_FRAME_HEADER
            if size >= self.big:
                # its own buffer: what of it is here now is copied once (memoryview to memoryview: one
                # memcpy), the rest is read straight into it
                got = min(end - start, size)
                if size <= self.grow:
                    payload = payload_view = self.pool.view(size)
                else:
                    payload = bytearray(max(self.grow, got))
                    payload_view = memoryview(payload)
                payload_view[:got] = view[start:start + got]
                pos = start + got
                if got == size:
                    frames.append((kind, payload))
                    continue
                self.payload, self.payload_view = payload, payload_view
                self.kind, self.size, self.filled = kind, size, got
                break
            if end - start < size:
                break
            frames.append((kind, bytes(view[start:start + size])))
            pos = start + size
        rest = end - pos
        if rest and pos:
            # the start of a small frame (under ``big`` + a header): moved to the front for the next read
            self.scratch[:rest] = bytes(view[pos:end])
        self.have = rest
        return frames


def _count(obj, key, default=None):
    value = obj.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= U64_MAX:
        raise WireError(f"{key!r} must be an integer 0..2**64-1, not {str(value)[:40]!r}")
    return value


def _text(obj, key):
    value = obj.get(key)
    if not isinstance(value, str) or not value:
        raise WireError(f"{key!r} must be a non-empty string")
    return value


def decode_hello(payload):
    """HELLO as ``{"node": str, "stream": str, "epoch": int, "next": int, "last": None | [chunk id,
    epoch, crc], "observer": bool}`` (integers 0..2**64-1). Raises WireError."""
    obj = parse_json(payload)
    last = obj.get("last")
    if last is not None:
        if not isinstance(last, list) or len(last) != 3:
            raise WireError("'last' must be null or [chunk id, epoch, crc]")
        last = [_count({"last": v}, "last") for v in last]
    observer = obj.get("observer", False)
    if not isinstance(observer, bool):
        raise WireError("'observer' must be true or false")
    return {"node": _text(obj, "node"), "stream": _text(obj, "stream"), "epoch": _count(obj, "epoch", 0),
            "next": _count(obj, "next", 0), "last": last, "observer": observer}


def _counts_by_name(payload):
    obj = parse_json(payload)
    for k in obj:
        if not k:
            raise WireError("an empty reference")
    return {k: _count(obj, k) for k in obj}


def decode_seqs(payload):
    """SEQS as ``{publisher reference: last publishing id}``. Raises WireError."""
    if payload == b"{}":
        return {}       # a chunk sent ahead with no named publisher (leader_path.py): one per publish
    return _counts_by_name(payload)


def decode_offsets(payload):
    """OFFSETS as ``{consumer reference: offset}``. Raises WireError."""
    return _counts_by_name(payload)


def decode_refuse(payload):
    """REFUSE's reason (str). Raises WireError."""
    reason = parse_json(payload).get("reason", "")
    if not isinstance(reason, str):
        raise WireError("'reason' must be a string")
    return reason


def decode_chunk(payload):
    """CHUNK's header tuple (engine format H_*): the magic and the lengths are checked here, the data
    CRC by the engine as it stores the chunk (``Engine.replicate_chunk``). Raises WireError."""
    try:
        h = core.read_header(payload)
    except RiverbedError as e:
        raise WireError(f"bad chunk: {e}") from None
    if LEN_CHUNK_HEADER + h[10] + h[8] + h[9] != len(payload):
        raise WireError(f"chunk lengths do not add up to the {len(payload)} bytes sent")
    return h


DECODERS = {HELLO: decode_hello, CHUNK: decode_chunk, SEQS: decode_seqs, COMMIT: u64, ACK: u64, TRUNCATE: u64,
            REFUSE: decode_refuse, OFFSETS: decode_offsets}


def decode(kind, payload):
    """The payload of a frame of type ``kind``, decoded by its DECODERS entry. Raises WireError (an
    unknown type too)."""
    fn = DECODERS.get(kind)
    if fn is None:
        raise WireError(f"unknown frame type {kind}")
    return fn(payload)


async def open_node(cluster_node, name, timeout=2.0):
    """``(reader, writer)`` of a new connection to node ``name``'s replication port, as ``cluster_node`` (a
    ClusterNode) last read its registration. Raises ConnectionError when the node is not live, and what the
    dial raises (OSError, asyncio.TimeoutError after ``timeout`` seconds)."""
    reg = cluster_node.nodes.get(name)
    if reg is None or not reg.get("replication_port"):
        raise ConnectionError(f"{name} is not a live node")
    host = reg.get("advertised_host") or "127.0.0.1"
    return await asyncio.wait_for(asyncio.open_connection(host, reg["replication_port"]), timeout)
