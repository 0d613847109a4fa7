"""The replication port's frames: how a member copies its leader's chunks (the chunk bytes as stored).

Every frame is ``| length u32 | type u8 | payload |`` (big-endian; length counts type and payload)::

    HELLO     member -> leader   JSON {"node", "stream", "epoch", "next", "last": [chunk id, epoch, crc] | null}
    CHUNK     leader -> member   one whole chunk as the leader stores it (header, bloom, data)
    SEQS      leader -> member   JSON {publisher: last id}: stored with the next CHUNK (dedup survives failover);
                                 before the last chunk of every batch that reaches the log end (the member
                                 holds the chunks before it until then)
    COMMIT    leader -> member   u64 committed offset (held by a majority): how far readers may see; sent
                                 again every lease TTL / 4 as a heartbeat
    ACK       member -> leader   u64 the member's next offset, durable under its own fsync policy; also
                                 the answer to every COMMIT, so the leader knows who still hears it
    TRUNCATE  leader -> member   u64 offset: drop every chunk from there (an older epoch's unconfirmed tail)
    REFUSE    leader -> member   JSON {"reason"}: not (or no longer) the leader of that stream at that epoch
    OFFSETS   leader -> member   JSON {reference: offset}: consumer offsets (StoreOffset) that changed
"""

import json
import struct

HELLO, CHUNK, SEQS, COMMIT, ACK, TRUNCATE, REFUSE, OFFSETS = range(1, 9)
LEN_FRAME_HEADER = 5
MAX_FRAME = 256 << 20        # a chunk is at most the stream's chunk size; this bounds a hostile length
_HEAD = struct.Struct(">IB")
_U64 = struct.Struct(">Q")


class WireError(Exception):
    """A malformed frame on the replication port: the connection is dropped."""


def frame(kind, payload=b""):
    return _HEAD.pack(len(payload) + 1, kind) + payload


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
    try:
        obj = json.loads(payload)
    except ValueError as e:
        raise WireError(f"bad JSON: {e}") from None
    if not isinstance(obj, dict):
        raise WireError("expected a JSON object")
    return obj
