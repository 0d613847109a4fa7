"""RabbitMQ Stream: the frame splitter and Publish decoders (codec), and RmqStreamSession (session).

Input: flag byte, then raw client bytes (size-prefixed frames). With FLAG_PRELUDE the harness first runs
the handshake (PeerProperties, SaslHandshake, SaslAuthenticate PLAIN guest, Tune, Open), so the fuzz bytes
reach the commands of an open connection.
"""

import struct

from riverbed.engine.errors import FrameError
from riverbed.shells import rmq_stream as rs
from riverbed.shells import wire

from .harness import FLAG_PRELUDE, FakeIO, SessionTarget

_U32 = struct.Struct(">I")
PROBE_STREAM = b"__fuzz_probe"


def frame(key, body=b"", version=1):
    return struct.pack(">IHH", len(body) + 4, key, version) + body


def string(s):
    if s is None:
        return struct.pack(">h", -1)
    b = s if isinstance(s, bytes) else s.encode()
    return struct.pack(">h", len(b)) + b


def strings(items):
    return struct.pack(">i", len(items)) + b"".join(string(s) for s in items)


def properties(props):
    return struct.pack(">i", len(props)) + b"".join(string(k) + string(v) for k, v in props)


def corr(n):
    return struct.pack(">I", n)


PRELUDE = (
    frame(rs.CMD_PEER_PROPERTIES, corr(1) + properties([("product", "fuzz")]))
    + frame(rs.CMD_SASL_HANDSHAKE, corr(2))
    + frame(rs.CMD_SASL_AUTHENTICATE, corr(3) + string("PLAIN") + struct.pack(">i", 12) + b"\0guest\0guest")
    + frame(rs.CMD_TUNE, struct.pack(">II", 1048576, 60))
    + frame(rs.CMD_OPEN, corr(4) + string("/"))
)

PROBE_OPEN = frame(rs.CMD_METADATA, corr(0x7FFF0001) + strings([PROBE_STREAM]))
PROBE_HANDSHAKE = frame(rs.CMD_PEER_PROPERTIES, corr(0x7FFF0002) + properties([]))


def response_keys(out, start):
    """Keys of the complete frames in ``out`` from ``start``."""
    keys = []
    pos = start
    while len(out) - pos >= 8:
        n = _U32.unpack_from(out, pos)[0]
        if len(out) - pos - 4 < n:
            break
        keys.append(struct.unpack_from(">H", out, pos + 4)[0])
        pos += 4 + n
    return keys


def publish_v1(publisher_id, messages):
    body = struct.pack(">Bi", publisher_id, len(messages))
    for pid, data in messages:
        body += struct.pack(">QI", pid, len(data)) + data
    return frame(rs.CMD_PUBLISH, body)


def sub_batch_entry(pid, records, codec_code, compress):
    inner = b"".join(struct.pack(">I", len(r)) + r for r in records)
    body = compress(inner)
    return struct.pack(">QBHII", pid, 0x80 | (codec_code << 4), len(records), len(inner), len(body)) + body


class RmqTarget(SessionTarget):
    name = "rmq"
    codec_errors = (rs.DecodeError, FrameError)

    def make_shell(self):
        return rs.RmqShell(self.rig.broker)

    def codec(self, body):
        # the one-message path's parser takes a whole read: None or its tuple, never an exception
        wire.publish_alone(body, 1 << 20, 100_000)
        frames, _ = wire.split_frames(body, 1 << 20, rs.CMD_PUBLISH)
        for f in frames:
            wire.publish_alone(_U32.pack(len(f)) + f, 1 << 20, 100_000)
            if len(f) < 4:
                continue
            key, version = struct.unpack_from(">HH", f, 0)
            if key != rs.CMD_PUBLISH:
                continue
            try:
                batch = rs.decode_publish(f, version)
            except rs.DecodeError:
                batch = None
            if batch is not None:
                for _, flags, nrec, usize, sub in batch.sub_batches:
                    rs.check_sub_batch(flags, nrec, usize, sub)     # returns a reason, never raises
            if version == 1:
                try:
                    wire.publish_chunk(f, True)
                except FrameError:
                    pass

    def open_session(self):
        io = FakeIO()
        self.rig.ios = [io]
        return rs.RmqStreamSession(self.shell, io, peer="fuzz", local_host="127.0.0.1", peer_loopback=True)

    def prelude(self, s):
        s.data_received(PRELUDE)
        self.rig.settle()
        s.io.out.clear()

    def feed(self, s, piece):
        s.data_received(piece)

    def probe(self, s):
        if s.io.closed or s.state >= rs.ST_CLOSING or s._buf or not s.io.reading:
            return None
        if s.state == rs.ST_OPEN:
            probe, want = PROBE_OPEN, rs.CMD_METADATA | rs.RESPONSE
        elif s.state == rs.ST_HANDSHAKE:
            probe, want = PROBE_HANDSHAKE, rs.CMD_PEER_PROPERTIES | rs.RESPONSE
        else:
            return None
        mark = len(s.io.out)
        s.data_received(probe)
        self.rig.settle()
        return want in response_keys(s.io.out, mark) or s.io.closed

    def seeds(self):
        import gzip
        import zlib

        p = bytes([FLAG_PRELUDE])
        create = frame(rs.CMD_CREATE, corr(10) + string("s1") + properties([("max-length-bytes", "1000000")]))
        declare = frame(rs.CMD_DECLARE_PUBLISHER, corr(11) + b"\x01" + string("ref") + string("s1"))
        msgs = publish_v1(1, [(i, b'{"i":%d}' % i) for i in range(3)])
        sub = frame(rs.CMD_SUBSCRIBE, corr(12) + b"\x02" + string("s1") + struct.pack(">H", 1) + struct.pack(">H", 10)
                    + properties([("name", "x")]))
        out = [
            b"\x00" + PRELUDE,
            p + create,
            p + create + declare + msgs,
            p + create + declare + msgs + sub + frame(rs.CMD_CREDIT, b"\x02\x00\x05"),
            p + create + declare + msgs + frame(rs.CMD_QUERY_PUBLISHER_SEQUENCE, corr(13) + string("ref") + string("s1")),
            p + create + frame(rs.CMD_STORE_OFFSET, string("ref") + string("s1") + struct.pack(">Q", 5))
            + frame(rs.CMD_QUERY_OFFSET, corr(14) + string("ref") + string("s1")),
            p + create + frame(rs.CMD_STREAM_STATS, corr(15) + string("s1")),
            p + create + frame(rs.CMD_METADATA, corr(16) + strings(["s1", "nope"])),
            p + frame(rs.CMD_DELETE, corr(17) + string("s1")),
            p + frame(rs.CMD_CREATE_SUPER_STREAM, corr(18) + string("sup") + strings(["sup-0", "sup-1"])
                      + strings(["a", "b"]) + properties([])),
            p + frame(rs.CMD_ROUTE, corr(19) + string("a") + string("sup"))
            + frame(rs.CMD_PARTITIONS, corr(20) + string("sup")),
            p + frame(rs.CMD_EXCHANGE_COMMAND_VERSIONS, corr(21) + struct.pack(">i", 1) + struct.pack(">HHH", 2, 1, 2)),
            p + create + declare + sub_batch_frame(1, [(5, [b"a", b"bb"], 1, lambda d: gzip.compress(d))]),
            p + create + declare + sub_batch_frame(1, [(6, [b"x" * 100], 0, lambda d: d)]),
            p + create + declare + frame(rs.CMD_PUBLISH, struct.pack(">BiQh", 1, 1, 9, 1) + b"f"
                                         + struct.pack(">i", 3) + b"abc", version=2),
            p + frame(rs.CMD_RESOLVE_OFFSET_SPEC, corr(22) + string("s1") + struct.pack(">HQ", 4, 1)
                      + properties([])),
            p + frame(rs.CMD_HEARTBEAT) + frame(rs.CMD_CLOSE, corr(23) + struct.pack(">H", 1) + string("bye")),
            b"\x00" + frame(rs.CMD_SASL_AUTHENTICATE, corr(3) + string("PLAIN") + struct.pack(">i", 12)
                            + b"\0guest\0guest"),
            p + create + declare + frame(rs.CMD_PUBLISH, struct.pack(">Bi", 1, 1)
                                         + sub_batch_entry(7, [b"z" * 10], 1, lambda d: zlib.compress(d)[2:-4])),
        ]
        return out


def sub_batch_frame(publisher_id, entries):
    body = struct.pack(">Bi", publisher_id, len(entries))
    for pid, records, code, compress in entries:
        body += sub_batch_entry(pid, records, code, compress)
    return frame(rs.CMD_PUBLISH, body)
