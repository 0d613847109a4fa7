"""The Streamr v28 session, sans-I/O: a real Engine in a temp dir, a fake ``io``, and a queue for the
broker's loop hand-offs (drained by the test)."""

import json
import struct

import pytest

from riverbed.engine import record as rec
from riverbed.shells import auth as _auth
from riverbed.shells.ws_json import WsSession, WsShell, codec, partitions
from riverbed.shells.ws_json import session as ws_session

from .harness import Loop


def parse_frames(buf):
    """Complete unmasked WebSocket text frames in ``buf`` as decoded JSON; consumes them."""
    out = []
    while len(buf) >= 2:
        assert buf[0] == 0x81
        n, pos = buf[1], 2
        if n == 126:
            n, pos = struct.unpack_from(">H", buf, 2)[0], 4
        elif n == 127:
            n, pos = struct.unpack_from(">Q", buf, 2)[0], 10
        out.append(json.loads(bytes(buf[pos:pos + n]).decode()))
        del buf[:pos + n]
    return out


class FakeIO:
    def __init__(self, h):
        self.h = h
        self.out = bytearray()
        self.writes = []
        self.closed = None
        self.aborted = None
        self.unsent = 0         # what buffer_size() says
        self.paused = self.resumed = 0

    def write(self, data):
        self.writes.append(data)
        self.out += data

    def buffer_size(self):
        return self.unsent

    def close(self, code, reason):
        self.closed = (code, reason)

    def abort(self, reason):
        self.aborted = reason

    def defer(self, fn):
        self.h.q.put((fn, ()))

    def call_later(self, seconds, fn):
        self.h.q.put((fn, ()))

    def pause_reading(self):
        self.paused += 1

    def resume_reading(self):
        self.resumed += 1


class Client:
    def __init__(self, h, loopback=True):
        self.h = h
        self.io = FakeIO(h)
        self.s = WsSession(h.shell, self.io, peer=("127.0.0.1", 5000), local=("127.0.0.1", 8890),
                           peer_loopback=loopback)

    def send(self, req):
        self.s.text_received(req if isinstance(req, str) else json.dumps(req))
        self.h.settle()

    def frames(self):
        return parse_frames(self.io.out)


class Harness(Loop):
    def __init__(self, tmp_path, auth=None, **shell_kw):
        super().__init__(tmp_path, auth=auth)
        self.shell = WsShell(self.broker, defer=lambda fn: self.q.put((fn, ())), **shell_kw)


@pytest.fixture
def h(tmp_path):
    harness = Harness(tmp_path)
    yield harness
    harness.close()


def pub(c, stream, i, **kw):
    c.send(dict({"type": "publish", "stream": stream, "msg": json.dumps({"i": i})}, **kw))


def test_subscribe_publish_broadcast_encoded_once(h):
    a, b, p = Client(h), Client(h), Client(h)
    a.send({"type": "subscribe", "stream": "s"})
    b.send({"type": "subscribe", "stream": "s", "partition": 0})
    assert a.frames() == [[0, 2, "", {"stream": "s", "partition": 0}]]
    assert b.frames() == [[0, 2, "", {"stream": "s", "partition": 0}]]
    for i in range(3):
        pub(p, "s", i, ts=1000 + i)
    fa, fb = a.frames(), b.frames()
    assert fa == fb
    assert [f[3] for f in fa] == [[28, "s", 0, 1000 + i, 0, i, i - 1 if i else None, 27, json.dumps({"i": i})]
                                  for i in range(3)]
    assert p.frames() == []                       # no reply to a successful publish
    # the very same bytes object went to both subscribers: framed once per chunk, not per connection
    assert a.io.writes[-1] is b.io.writes[-1]


def test_publish_stored_as_amqp_json(h):
    c = Client(h)
    c.send({"type": "publish", "stream": "s", "msg": '{"a": 1}', "ts": 1234, "pkey": "dev"})
    (cid, raw), = h.eng.read_chunks("s", 0, 1)
    from riverbed.engine import core
    r = rec.decode_record(core.chunk_records(raw)[0])
    assert r.amqp and r.content_type == "application/json" and r.creation_time == 1234
    assert r.app_properties == {"pkey": "dev"} and r.sections == [b'{"a": 1}']


def test_publisher_gets_own_messages_in_order(h):
    c = Client(h)
    c.send({"type": "subscribe", "stream": "s"})
    c.frames()
    for i in range(50):
        c.s.text_received(json.dumps({"type": "publish", "stream": "s", "msg": json.dumps({"i": i})}))
    h.settle()
    got = c.frames()
    assert [json.loads(f[3][8])["i"] for f in got] == list(range(50))
    assert [f[3][5] for f in got] == list(range(50))


def test_unsubscribe(h):
    c = Client(h)
    c.send({"type": "unsubscribe", "stream": "s"})
    assert c.frames() == [[0, 7, "", {"error": "Not subscribed", "request": {"type": "unsubscribe", "stream": "s"}}]]
    c.send({"type": "subscribe", "stream": "s"})
    c.send({"type": "unsubscribe", "stream": "s"})
    assert c.frames()[-1] == [0, 3, "", {"stream": "s", "partition": 0}]
    assert not h.shell.fanouts
    pub(c, "s", 1)
    assert c.frames() == []


def resend(c, sub, **kw):
    c.send(dict({"type": "resend", "stream": "s", "sub": sub}, **kw))
    return c.frames()


def test_resend_variants(h):
    c = Client(h)
    for i in range(10):
        pub(c, "s", i, ts=1000 + 10 * i)
    offs = lambda frames: [f[3][5] for f in frames[1:-1]]   # noqa: E731
    f = resend(c, "a", resend_all=True)
    assert f[0] == [0, 4, "", {"stream": "s", "partition": 0, "sub": "a"}]
    assert f[-1] == [0, 5, "", {"stream": "s", "partition": 0, "sub": "a"}]
    assert all(x[:3] == [0, 1, "a"] for x in f[1:-1]) and offs(f) == list(range(10))
    assert offs(resend(c, "b", resend_last=3)) == [7, 8, 9]
    assert offs(resend(c, "c", resend_from=4)) == list(range(4, 10))
    assert offs(resend(c, "d", resend_from=2, resend_to=5)) == [2, 3, 4, 5]
    assert offs(resend(c, "e", resend_from_time=1065)) == [7, 8, 9]
    assert resend(c, "f", resend_from=20) == [[0, 6, "", {"stream": "s", "partition": 0, "sub": "f"}]]
    assert resend(c, "g", resend_from_time=10 ** 13) == [[0, 6, "", {"stream": "s", "partition": 0, "sub": "g"}]]
    assert resend(c, "h") == [[0, 6, "", {"stream": "s", "partition": 0, "sub": "h"}]]
    assert resend(c, "i", resend_all=True, resend_last=2)[0][1] == codec.TYPE_NO_RESEND
    c.send({"type": "resend", "stream": "nope", "sub": "j", "resend_all": True})
    assert c.frames() == [[0, 6, "", {"stream": "nope", "partition": 0, "sub": "j"}]]


def test_resend_from_time_filters_per_message(h):
    c = Client(h)
    # one chunk whose messages carry timestamps out of order: the filter is per message
    c.s.text_received(json.dumps({"type": "publish", "stream": "s", "msg": "1", "ts": 5000}))
    c.s.text_received(json.dumps({"type": "publish", "stream": "s", "msg": "2", "ts": 100}))
    c.s.text_received(json.dumps({"type": "publish", "stream": "s", "msg": "3", "ts": 6000}))
    h.settle()
    f = resend(c, "t", resend_from_time=4000)
    assert [x[3][8] for x in f[1:-1]] == ["1", "3"]


def test_errors_keep_connection_usable(h):
    c = Client(h)
    for bad, expect in [("not json", codec.ERR_NOT_A_REQUEST), ({"type": "dance"}, "Unknown request type: dance"),
                        ({"type": "publish", "msg": "{}"}, codec.ERR_MISSING_STREAM),
                        ({"type": "publish", "stream": "s", "msg": {"a": 1}}, codec.ERR_NOT_JSON_MSG),
                        ({"type": "publish", "stream": "s", "msg": "{x"}, codec.ERR_NOT_JSON_MSG),
                        ({"type": "subscribe"}, "subscribe request is missing the stream id!"),
                        ({"type": "subscribe", "stream": "s", "partition": "0"}, 'Invalid partition: "0"')]:
        c.send(bad)
        assert c.frames() == [[0, 7, "", expect]]
    c.s.binary_received(b"\xff\x00")
    assert c.frames() == [[0, 7, "", codec.ERR_NOT_A_REQUEST]]
    c.send({"type": "subscribe", "stream": "s"})
    assert c.frames() == [[0, 2, "", {"stream": "s", "partition": 0}]]


def test_super_stream_partitions_and_pkey(h):
    done = []
    h.broker.create_super_stream("sup", ["sup-0", "sup-1", "sup-2"], ["0", "1", "2"], {}, done.append)
    h.settle()
    assert done == [None]
    c = Client(h)
    for p in range(3):
        c.send({"type": "subscribe", "stream": "sup", "partition": p})
    c.send({"type": "subscribe", "stream": "sup", "partition": 3})
    f = c.frames()
    assert f[:3] == [[0, 2, "", {"stream": "sup", "partition": p}] for p in range(3)]
    assert f[3][1] == codec.TYPE_ERROR and "partition 3" in f[3][3]
    keys = [f"k{i}" for i in range(12)]
    for k in keys:
        c.send({"type": "publish", "stream": "sup", "msg": json.dumps(k), "pkey": k})
    c.send({"type": "publish", "stream": "sup", "msg": '"nokey"'})
    got = c.frames()
    for fr in got[:-1]:
        k = json.loads(fr[3][8])
        assert fr[3][2] == partitions.partition_for_key(k, 3), k
    assert json.loads(got[-1][3][8]) == "nokey" and got[-1][3][2] == 0
    assert h.eng.stream_info("sup-0").committed_chunk_id >= 0


def test_stream_deleted_ends_subscription(h):
    c = Client(h)
    c.send({"type": "subscribe", "stream": "s"})
    pub(c, "s", 1)
    c.frames()
    done = []
    h.broker.delete_stream("s", done.append)
    h.settle()
    assert done == [None]
    assert c.frames() == [[0, 3, "", {"stream": "s", "partition": 0}]]
    assert not c.s.subscriptions and not h.shell.fanouts


def test_stalled_client_dropped_others_unaffected(tmp_path):
    h = Harness(tmp_path, send_buffer_max=10_000)
    try:
        slow, fast, p = Client(h), Client(h), Client(h)
        slow.send({"type": "subscribe", "stream": "s"})
        fast.send({"type": "subscribe", "stream": "s"})
        slow.io.unsent = 20_000            # the slow peer's transport says: not sent
        pub(p, "s", 1)
        assert slow.io.aborted and slow.s.state == ws_session.ST_CLOSED      # was the literal 2, ST_CLOSED before the kernel
        assert len(h.shell.fanouts[("s", 0)].subscribers) == 1
        for i in range(5):
            pub(p, "s", i)
        assert len(fast.frames()) == 1 + 6
    finally:
        h.close()


def test_api_keys(tmp_path):
    users = tmp_path / "users.toml"
    rk, wk, ak = _auth.new_api_key(), _auth.new_api_key(), _auth.new_api_key()
    _auth.add_user(str(users), "reader", None, configure="", write="", read="^pub", api_key=rk)
    _auth.add_user(str(users), "writer", None, configure="", write="^pub", read="", api_key=wk)
    _auth.add_user(str(users), "admin", "pw", api_key=ak)
    h = Harness(tmp_path, auth=_auth.Authenticator(str(users)))
    try:
        c = Client(h, loopback=False)
        c.send({"type": "subscribe", "stream": "pub1"})
        assert c.frames() == [[0, 7, "", "Not authorized to subscribe to stream pub1 and partition 0"]]
        c.send({"type": "subscribe", "stream": "pub1", "authKey": "wrong"})
        assert c.frames() == [[0, 7, "", "Authentication failed."]]
        c.send({"type": "publish", "stream": "pub1", "msg": "{}", "authKey": wk})   # may not create it
        assert c.frames() == [[0, 7, "", "Stream pub1 not found."]]
        assert not h.eng.has_stream("pub1")
        c.send({"type": "subscribe", "stream": "pub1", "authKey": ak})   # answered; waits, creates nothing
        assert c.frames() == [[0, 2, "", {"stream": "pub1", "partition": 0}]]
        assert not h.eng.has_stream("pub1")
        c.send({"type": "publish", "stream": "pub1", "msg": '{"n":0}', "authKey": ak})   # admin creates it
        assert [f[3][8] for f in c.frames()] == ['{"n":0}']     # the waiting subscription got it
        c.send({"type": "publish", "stream": "pub1", "msg": '{"n":1}', "authKey": rk})
        assert c.frames() == [[0, 7, "", "Not authorized to publish to stream pub1"]]
        c.send({"type": "publish", "stream": "pub1", "msg": '{"n":2}', "authKey": wk})
        assert [f[3][8] for f in c.frames()] == ['{"n":2}']
        c.send({"type": "resend", "stream": "pub1", "sub": "1", "resend_all": True, "authKey": wk})
        assert c.frames() == [[0, 7, "", "Not authorized to request resend from stream pub1 and partition 0"]]
        c.send({"type": "resend", "stream": "pub1", "sub": "1", "resend_all": True, "authKey": rk})
        assert [f[1] for f in c.frames()] == [4, 1, 1, 5]
        assert h.broker.auth.user_for_api_key(ak).name == "admin"
        assert h.broker.auth.check_password("admin", "pw", False).outcome == _auth.OK
        assert h.broker.auth.check_password("reader", "", False).outcome != _auth.OK
    finally:
        h.close()


def test_subscribe_to_a_missing_stream_waits_and_creates_nothing(h):
    """A misspelled stream id used to be created by the subscribe. Only publishes (and explicit creation)
    make streams: the subscribe is answered, the stream stays missing, and once anyone creates it the
    subscriber gets everything in it from the first record; unsubscribing a waiting one works."""
    c, other = Client(h), Client(h)
    c.send({"type": "subscribe", "stream": "ordrs"})
    assert c.frames() == [[0, 2, "", {"stream": "ordrs", "partition": 0}]]
    h.settle()
    assert not h.eng.has_stream("ordrs")
    other.send({"type": "publish", "stream": "ordrs", "msg": '{"n":1}'})
    other.send({"type": "publish", "stream": "ordrs", "msg": '{"n":2}'})
    h.settle()
    assert [f[3][8] for f in c.frames()] == ['{"n":1}', '{"n":2}']
    c.send({"type": "subscribe", "stream": "never"})
    c.send({"type": "unsubscribe", "stream": "never"})
    assert [f[1] for f in c.frames()] == [2, 3]
    assert not h.eng.has_stream("never")


def test_no_users_file_refuses_remote(h):
    c = Client(h, loopback=False)
    c.send({"type": "subscribe", "stream": "s"})
    assert c.frames() == [[0, 7, "", "Not authorized to subscribe to stream s and partition 0"]]


def test_foreign_records_rendered(h):
    import bson
    h.eng.create_stream("s", {}).result(timeout=10)
    h.eng.append("s", [b'{"raw": true}', rec.from_bson({"b": 1}, creation_time=777), b"\x00\x01bytes",
                       rec.encode_record(b'{"amqp": 1}', rec.CT_JSON)]).result(timeout=10)
    assert bson  # BSON rendering needs pymongo's bson
    c = Client(h)
    f = resend(c, "x", resend_all=True)
    msgs = [x[3] for x in f[1:-1]]
    assert [m[8] for m in msgs] == ['{"raw": true}', '{"b":1}', '{"base64":"AAFieXRlcw=="}', '{"amqp": 1}']
    assert msgs[1][3] == 777 and [m[6] for m in msgs] == [None, 0, 1, 2]
    assert all(m[7] == 27 for m in msgs)


def test_connection_info_and_lifecycle(h):
    c = Client(h)
    c.send({"type": "subscribe", "stream": "s"})
    info = c.s.connection_info()
    assert info["protocol"] == "ws" and info["peer_host"] == "127.0.0.1" and info["state"] == "running"
    assert info["user"] == "guest" and info["subscriptions"] == 1
    assert c.s in h.broker.sessions
    c.s.close_by_admin("bye")
    assert c.io.closed == (1001, "bye")
    c.s.connection_lost()
    assert c.s not in h.broker.sessions and not h.shell.fanouts


def test_publisher_paused_while_appends_pile_up(h):
    from riverbed.shells.ws_json import session as ws_session
    c = Client(h)
    c.send({"type": "publish", "stream": "s", "msg": "0"})       # creates the stream
    for i in range(ws_session.MAX_IN_FLIGHT + 5):
        c.s.text_received(json.dumps({"type": "publish", "stream": "s", "msg": str(i)}))
        c.s._flush()                                             # one append each, none committed yet
    assert c.io.paused == 1 and c.io.resumed == 0
    h.settle()
    assert c.io.resumed == 1 and c.s.pending_ops == 0
    assert h.eng.stream_info("s").committed_chunk_id >= 0


def test_subscribe_behind_own_publishes_that_create_the_stream_gets_none_of_them(h):
    """Publishes that create a stream, then a subscribe while the creation is in flight: the subscription
    starts after them (as on an existing stream), never replays what this client sent before it."""
    c = Client(h)
    for i in range(5):      # one read's worth: nothing settles in between, the creation is in flight
        c.s.text_received(json.dumps({"type": "publish", "stream": "own", "msg": json.dumps({"i": i})}))
    c.s.text_received(json.dumps({"type": "subscribe", "stream": "own"}))
    h.settle()
    assert [f[1] for f in c.frames()] == [2]
    c.send({"type": "publish", "stream": "own", "msg": '{"i":5}'})
    h.settle()
    assert [f[3][8] for f in c.frames()] == ['{"i":5}']
