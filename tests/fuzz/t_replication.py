"""The cluster's replication port (shells/cluster/wire.py): its frame splitter, the asyncio frame reader
the nodes use, and the decoder of every frame type (wire.DECODERS).

Input: flag byte, then bytes as a peer would send them on the replication port. Without FLAG_PRELUDE
they are split into frames (both by ``split_frames`` and by ``read_frame`` over a StreamReader fed in
the 1..4 reads the flags ask for: both must agree, and the frames must re-encode to the bytes consumed),
then each frame's payload goes to ``decode``. With FLAG_PRELUDE the bytes are one payload handed to every
decoder, so the fuzz reaches the JSON and chunk checks without having to find the framing first.

Only WireError may come out of the parser; anything else is a finding.
"""

import asyncio
import struct

from riverbed.shells.cluster import wire

from .harness import FLAG_PRELUDE, InvariantBroken, flags_and_body, pieces

MAX_FRAMES = 64        # frames decoded per input (the split is still checked over all of them)


class ReplicationTarget:
    name = "replication"

    def __init__(self, root=None):
        self.loop = asyncio.new_event_loop()

    def run(self, data):
        flags, body = flags_and_body(bytes(data))
        if flags & FLAG_PRELUDE:
            for kind in sorted(wire.DECODERS):
                self._decode(kind, body)
            self._decode(0, body)
            return
        try:
            frames, used = wire.split_frames(body)
            split_error = None
        except wire.WireError as e:
            frames, used, split_error = None, 0, e
        if frames is not None:
            again = b"".join(wire.frame(k, p) for k, p in frames)
            if again != body[:used] or used > len(body):
                raise InvariantBroken("split_frames: the frames do not re-encode to the bytes consumed")
        read = self.loop.run_until_complete(self._read_all(pieces(flags, body)))
        if split_error is None:
            if read != frames:
                raise InvariantBroken(f"read_frame gave {len(read)} frames, split_frames {len(frames)}")
        elif read != wire.split_frames(body[:self._good_prefix(body)])[0]:
            raise InvariantBroken("read_frame and split_frames disagree before a bad length")
        for kind, payload in (frames or read)[:MAX_FRAMES]:
            self._decode(kind, payload)

    @staticmethod
    def _good_prefix(body):
        """The bytes of the whole frames before the first bad length."""
        pos = 0
        while len(body) - pos >= wire.LEN_FRAME_HEADER:
            length = struct.unpack_from(">I", body, pos)[0]
            if not 1 <= length <= wire.MAX_FRAME or len(body) - pos - 4 < length:
                break
            pos += 4 + length
        return pos

    @staticmethod
    async def _read_all(parts):
        reader = asyncio.StreamReader(limit=1 << 16)
        for p in parts:
            reader.feed_data(p)
        reader.feed_eof()
        out = []
        while True:
            try:
                out.append(await wire.read_frame(reader))
            except (asyncio.IncompleteReadError, wire.WireError):
                return out

    @staticmethod
    def _decode(kind, payload):
        try:
            wire.decode(kind, payload)
        except wire.WireError:
            pass

    def seeds(self):
        from riverbed.engine import _pycore

        chunk = _pycore.encode_chunk([b"r1", b"r2", b"r3"], 1, 1000)
        hello = wire.json_frame(wire.HELLO, {"node": "n2", "stream": "orders", "epoch": 3, "next": 3,
                                             "last": [0, 2, 123456]})
        seq = [
            hello,
            wire.json_frame(wire.SEQS, {"p1": 17, "p2": 0}) + wire.frame(wire.CHUNK, chunk),
            wire.u64_frame(wire.COMMIT, 3) + wire.u64_frame(wire.ACK, 3),
            wire.u64_frame(wire.TRUNCATE, 0),
            wire.json_frame(wire.REFUSE, {"reason": "n1 does not lead 'orders'"}),
            wire.json_frame(wire.OFFSETS, {"c1": 41}),
        ]
        out = [b"\x00" + s for s in seq]
        out.append(b"\x06" + b"".join(seq))                       # all of them, in four reads
        out.append(b"\x00" + struct.pack(">IB", 0, 1))              # a zero length
        out.append(b"\x00" + struct.pack(">IB", wire.MAX_FRAME + 1, 2))
        out.append(b"\x00" + hello[:7])                             # cut short
        out += [bytes([FLAG_PRELUDE]) + p for p in (
            b'{"node":"n","stream":"s","epoch":1,"next":0,"last":null}', b'{"a":1,"b":18446744073709551615}',
            b'{"reason":"x"}', chunk, struct.pack(">Q", 7), b"[1,2]", b'{"last":[1,2]}')]
        return out

    def close(self):
        self.loop.close()
