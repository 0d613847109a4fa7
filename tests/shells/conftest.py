"""Harness for sans-I/O tests of the RabbitMQ Stream session: a real Engine in a temp dir, a fake
``io`` that records bytes, and a ``post`` queue drained by the test instead of an event loop.

Client frames are built, and server frames parsed, with the real client's codec (rstream 1.1.1's
``encoding``/``schema``) wherever it knows the command, so every reply is checked against what rstream
accepts (its decoder refuses extra or missing bytes).
"""

import struct

import pytest
from rstream import schema
from rstream.encoding import decode_frame, encode_frame, encode_publish

from riverbed.shells import rmq_stream as rs

from .harness import FakeIO, Loop


def split_out(buf):
    """Complete frames in ``buf`` as payloads (key+version+body); consumes them."""
    frames = []
    while len(buf) >= 4:
        n = struct.unpack_from(">I", buf, 0)[0]
        if len(buf) < 4 + n:
            break
        frames.append(bytes(buf[4:4 + n]))
        del buf[:4 + n]
    return frames


class Conn:
    """One client connection to a session."""

    def __init__(self, harness, loopback=True):
        self.h = harness
        self.io = FakeIO()
        self.s = rs.RmqStreamSession(harness.shell, self.io, peer="test", local_host="127.0.0.1",
                                     peer_loopback=loopback)
        self.corr = 0

    def next_corr(self):
        self.corr += 1
        return self.corr

    def send_raw(self, data):
        self.s.data_received(data)

    def send(self, frame, version=1):
        self.s.data_received(encode_frame(frame, version))

    def publish(self, publisher_id, messages, version=1):
        """messages: [(publishing id, bytes)] or [(id, filter, bytes)] for v2."""
        msgs = [schema.Message(m[0], m[1] if len(m) == 3 else None, m[-1]) for m in messages]
        self.s.data_received(encode_publish(schema.Publish(publisher_id, msgs), version))

    def raw_frames(self):
        self.h.settle()
        return split_out(self.io.out)

    def frames(self):
        """Server frames decoded by rstream's decoder (raw payload for keys it does not know)."""
        out = []
        for payload in self.raw_frames():
            key, version = struct.unpack_from(">HH", payload)
            try:
                out.append(decode_frame(payload, version))
            except (ValueError, KeyError):
                out.append(payload)
        return out

    def one(self, cls=None):
        fs = self.frames()
        assert len(fs) == 1, fs
        if cls is not None:
            assert isinstance(fs[0], cls), fs[0]
        return fs[0]

    def request(self, frame, resp_cls):
        self.send(frame)
        fs = self.frames()
        matches = [f for f in fs if isinstance(f, resp_cls)]
        assert len(matches) == 1, fs
        return matches[0]

    def handshake(self, user="guest", password="guest", heartbeat=60, frame_max=1048576):
        self.request(schema.PeerProperties(self.next_corr(), [schema.Property("product", "test")]),
                     schema.PeerPropertiesResponse)
        r = self.request(schema.SaslHandshake(self.next_corr()), schema.SaslHandshakeResponse)
        assert "PLAIN" in r.mechanisms
        self.send(schema.SaslAuthenticate(self.next_corr(), "PLAIN",
                                          b"\0" + user.encode() + b"\0" + password.encode()))
        fs = self.frames()
        assert fs[0].response_code == rs.RC_OK, fs
        assert isinstance(fs[1], schema.Tune)
        self.send(schema.Tune(frame_max, heartbeat))
        r = self.request(schema.Open(self.next_corr(), "/"), schema.OpenResponse)
        assert r.response_code == rs.RC_OK
        return {p.key: p.value for p in r.properties}

    def create(self, stream, args=None):
        r = self.request(schema.Create(self.next_corr(), stream,
                                       [schema.Property(k, v) for k, v in (args or {}).items()]),
                         schema.CreateResponse)
        return r.response_code

    def declare(self, publisher_id, stream, ref=""):
        return self.request(schema.DeclarePublisher(self.next_corr(), publisher_id, ref, stream),
                            schema.DeclarePublisherResponse).response_code

    def subscribe(self, sub_id, stream, offset_type=1, offset=None, credit=10, props=None):
        spec = schema.OffsetSpec.from_params(rs_offset_type(offset_type), offset)
        self.send(schema.Subscribe(self.next_corr(), sub_id, stream, spec, credit,
                                   [schema.Property(k, v) for k, v in (props or {}).items()]))
        return self.frames()


def rs_offset_type(t):
    from rstream.constants import OffsetType
    return OffsetType(t)


class Harness(Loop):
    """The engine and broker of harness.Loop, plus a RabbitMQ Stream listener's shell. Connections' ios
    are not settled automatically: tests of deferred delivery run them by hand."""

    def __init__(self, tmp_path, auth=None, **shell_options):
        super().__init__(tmp_path, auth=auth)
        self.shell = rs.RmqShell(self.broker, **shell_options)

    def connect(self, **kw):
        return Conn(self, **kw)


@pytest.fixture
def h(tmp_path):
    harness = Harness(tmp_path)
    yield harness
    harness.close()


@pytest.fixture
def conn(h):
    c = h.connect()
    c.handshake()
    return c
