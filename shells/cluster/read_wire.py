"""The frame a reader's node sends to a stream's leader to learn its committed offset (remote_read.py:
read-your-writes across nodes). It travels on the forwarding connection (forward_wire.py framing and
FWD_HELLO) and is answered with a FWD_RESULT whose ``first`` is the offset::

    READ_COMMITTED  node -> leader   rid u64 | stream str (len u16 | UTF-8): the leader's committed
                                     offset of ``stream`` (the next offset a majority holds)

Type numbers from 64, apart from the replication (1, ...), forwarding (32, ...) and single active
consumer (48, ...) frames.
"""

import struct

from riverbed.shells.cluster.wire import WireError, frame

READ_COMMITTED = 64

_U16 = struct.Struct(">H")
_U64 = struct.Struct(">Q")


def encode_committed(rid, stream):
    name = stream.encode()
    if not name or len(name) > 0xFFFF:
        raise ValueError("bad stream name")
    return frame(READ_COMMITTED, _U64.pack(rid) + _U16.pack(len(name)) + name)


def decode_committed(payload):
    """``(rid, stream)`` of a READ_COMMITTED payload. WireError when malformed."""
    mv = memoryview(payload).cast("B")
    if len(mv) < 10:
        raise WireError("truncated READ_COMMITTED")
    (rid,) = _U64.unpack_from(mv, 0)
    (n,) = _U16.unpack_from(mv, 8)
    if len(mv) != 10 + n or n == 0:
        raise WireError("READ_COMMITTED: the stream name's length does not match the frame")
    try:
        stream = bytes(mv[10:]).decode()
    except UnicodeDecodeError:
        raise WireError("a name that is not UTF-8") from None
    return rid, stream


DECODERS = {READ_COMMITTED: decode_committed}
