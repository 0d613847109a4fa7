"""The cluster's replication port (shells/cluster/wire.py): its frame splitter, the asyncio frame reader
the nodes use, and the decoder of every frame type on that port: the ``DECODERS`` of every
``shells/cluster/*wire.py`` module (wire.py's replication frames, forward_wire.py's forwarding frames,
sac_wire.py's single-active-consumer frames), found at import so that a module adding frames is fuzzed
without editing this file; a module's ``sample_frames()``, where it has one, adds seeds.

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


def wire_modules():
    """Every ``riverbed.shells.cluster.*wire`` module that has a DECODERS table, wire.py first."""
    import importlib
    import pkgutil

    import riverbed.shells.cluster as pkg
    names = sorted((m.name for m in pkgutil.iter_modules(pkg.__path__) if m.name.endswith("wire")),
                   key=lambda n: (n != "wire", n))
    mods = [importlib.import_module(f"{pkg.__name__}.{n}") for n in names]
    return [m for m in mods if isinstance(getattr(m, "DECODERS", None), dict)]


def all_decoders():
    """{frame type: decoder} over every wire module (their types must not overlap)."""
    out = {}
    for m in wire_modules():
        for kind, fn in m.DECODERS.items():
            if kind in out:
                raise AssertionError(f"frame type {kind} decoded by two modules")
            out[kind] = fn
    return out


DECODERS = all_decoders()


class ReplicationTarget:
    name = "replication"

    def __init__(self, root=None):
        self.loop = asyncio.new_event_loop()

    def run(self, data):
        flags, body = flags_and_body(bytes(data))
        if flags & FLAG_PRELUDE:
            for kind in sorted(DECODERS):
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
        # the leader's shortcut for a read that is one ACK (leader_path.AckReader) says what split_frames says
        ack = wire.lone_ack(body)
        if ack is not None and (frames != [(wire.ACK, wire.u64_frame(wire.ACK, ack)[5:])] or used != len(body)):
            raise InvariantBroken("lone_ack read an ACK that split_frames does not")
        read = self.loop.run_until_complete(self._read_all(pieces(flags, body)))
        buffered, buffered_error = self._read_buffered(pieces(flags, body))
        if split_error is None:
            if read != frames:
                raise InvariantBroken(f"read_frame gave {len(read)} frames, split_frames {len(frames)}")
            if buffered != frames or buffered_error is not None:
                raise InvariantBroken(f"FrameReader gave {len(buffered)} frames ({buffered_error}), "
                                      f"split_frames {len(frames)}")
        else:
            good = wire.split_frames(body[:self._good_prefix(body)])[0]
            if read != good:
                raise InvariantBroken("read_frame and split_frames disagree before a bad length")
            if buffered_error is None or buffered != good[:len(buffered)]:
                raise InvariantBroken("FrameReader and split_frames disagree before a bad length")
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
    def _read_buffered(parts):
        """The frames a member's FrameReader makes of ``parts`` (each read as far as its buffers take
        it), as bytes, and the WireError that stopped it (or None)."""
        reader = wire.FrameReader()
        out = []
        try:
            for p in parts:
                pos = 0
                while pos < len(p):
                    buf = reader.get_buffer()
                    n = min(len(buf), len(p) - pos)
                    buf[:n] = p[pos:pos + n]
                    pos += n
                    out += [(k, bytes(v)) for k, v in reader.feed(n)]
        except wire.WireError as e:
            return out, e
        return out, None

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
        fn = DECODERS.get(kind)
        try:
            if fn is None:
                wire.decode(kind, payload)       # an unknown type: WireError
            else:
                fn(payload)
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
            wire.json_frame(wire.HELLO, {"node": "n3", "stream": "orders", "epoch": 3, "next": 0, "last": None,
                                         "observer": True}),
        ]
        out = [b"\x00" + s for s in seq]
        out.append(b"\x06" + b"".join(seq))                       # all of them, in four reads
        out.append(b"\x00" + struct.pack(">IB", 0, 1))              # a zero length
        out.append(b"\x00" + struct.pack(">IB", wire.MAX_FRAME + 1, 2))
        out.append(b"\x00" + hello[:7])                             # cut short
        out += [b"\x00" + f for f in _other_seeds()]
        out += [bytes([FLAG_PRELUDE]) + p for p in (
            b'{"node":"n","stream":"s","epoch":1,"next":0,"last":null}', b'{"a":1,"b":18446744073709551615}',
            b'{"reason":"x"}', chunk, struct.pack(">Q", 7), b"[1,2]", b'{"last":[1,2]}')]
        return out

    def close(self):
        self.loop.close()


def _other_seeds():
    """Frames of the other wire modules, built with their own encoders where they have them."""
    out = []
    for m in wire_modules():
        if m is wire:
            continue
        enc = {name: getattr(m, name) for name in ("encode_hello", "encode_append", "encode_offset",
                                                    "encode_sequence", "encode_result", "encode_committed")
               if callable(getattr(m, name, None))}
        try:
            if "encode_hello" in enc:
                out.append(bytes(enc["encode_hello"]("n2")))
            if "encode_append" in enc:
                data = struct.pack(">I", 2) + b"r1" + struct.pack(">I", 2) + b"r2"
                out.append(b"".join(bytes(x) for x in enc["encode_append"](7, "orders", "p1", [1, 2], None, 2, 2,
                                                                            data)))
                out.append(b"".join(bytes(x) for x in enc["encode_append"](8, "orders", None, None, [b"f", None], 2,
                                                                            2, data)))
            if "encode_offset" in enc:
                out.append(bytes(enc["encode_offset"](9, "orders", "c1", 41)))
            if "encode_sequence" in enc:
                out.append(bytes(enc["encode_sequence"](10, "orders", "p1")))
            if "encode_result" in enc:
                out.append(bytes(enc["encode_result"](7, 0, 0, 1, [3], "ok")))
            if "encode_committed" in enc:
                out.append(bytes(enc["encode_committed"](11, "orders")))
        except TypeError:       # an encoder whose signature changed: its frames come from mutation only
            pass
        if callable(getattr(m, "sample_frames", None)):     # a module that names its own examples
            out += [bytes(f) for f in m.sample_frames()]
    return out
