"""Bad input over raw sockets against ``riverbed serve``: each gets the right reply and a clean close,
while a well-behaved client stays connected and working, and the server's RSS stays flat."""

import socket
import struct
import time

import pytest

import rawwire
from procs import ServerProcess
from rawwire import RawClient, frame, s

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def good(server):
    """A well-behaved client connected for the whole module; checked after every test."""
    c = RawClient(server.port)
    assert c.handshake(heartbeat=60) == rawwire.OK
    assert c.create("good") == rawwire.OK
    assert c.declare_publisher(1, "good") == rawwire.OK
    c.next_id = 1
    yield c
    c.close()


@pytest.fixture(autouse=True)
def good_client_keeps_working(good, server):
    yield
    ids = list(range(good.next_id, good.next_id + 10))
    good.next_id += 10
    confirmed, errors = good.publish_confirmed(1, [(i, b"ok-%d" % i) for i in ids])
    assert confirmed == set(ids) and not errors
    code, _ = good.request(0x0F, struct.pack(">i", 1) + s("good"))   # Metadata
    assert server.proc.poll() is None


def connect(server):
    return RawClient(server.port)


def test_garbage_bytes(server):
    c = connect(server)
    c.send(b"GET / HTTP/1.1\r\nHost: localhost\r\n\r\n")
    assert c.expect_close() == 0x0E          # "GET " read as a 1.2 GB frame size
    c.close()
    c = connect(server)
    c.send(struct.pack(">I", 12) + bytes(range(12)))   # a small frame with a nonsense key
    assert c.expect_close() == 0x0D
    c.close()


def test_truncated_frame_then_eof(server):
    c = connect(server)
    c.send(struct.pack(">I", 200) + b"\x00\x11\x00\x01" + b"\x00" * 10)
    c.sock.shutdown(socket.SHUT_WR)
    assert c.closed_within(5)
    c.close()


def test_truncated_frame_hits_the_handshake_timeout(server):
    c = connect(server)
    c.send(struct.pack(">I", 200) + b"\x00\x11")
    t0 = time.monotonic()
    assert c.closed_within(10)                 # the fixture runs the server with --handshake-timeout 3
    assert 2 < time.monotonic() - t0 < 8
    c.close()


def test_10_mb_frame_before_authentication(server):
    c = connect(server)
    c.send(struct.pack(">IHH", 10_000_000, 0x11, 1) + b"\x00" * 1000)
    assert c.expect_close() == 0x0E
    c.close()
    # and a client that keeps streaming the whole 10 MB: the server closes, nothing is buffered
    c = connect(server)
    try:
        c.send(struct.pack(">IHH", 10_000_000, 0x11, 1))
        for _ in range(160):
            c.send(b"\x00" * 65536)
    except OSError:
        pass                                   # reset once the server has closed: expected
    assert c.closed_within(5)
    c.close()


def test_unknown_key_and_version(server):
    c = connect(server)
    c.send(frame(0x0077, b"\x00\x00\x00\x01"))
    assert c.expect_close() == 0x0D
    c.close()
    c = connect(server)
    c.send(frame(0x0011, struct.pack(">Ii", 1, 0), version=7))
    assert c.expect_close() == 0x0D
    c.close()
    c = connect(server)                        # after Open too
    assert c.handshake() == rawwire.OK
    c.send(frame(0x0040, b""))
    assert c.expect_close() == 0x0D
    c.close()
    c = connect(server)
    assert c.handshake() == rawwire.OK
    c.send(frame(0x0007, b"\x00" * 20, version=9))
    assert c.expect_close() == 0x0D
    c.close()


def test_command_before_authentication_is_refused(server):
    c = connect(server)
    c.send(frame(0x0D, struct.pack(">I", 1) + s("sneaky") + struct.pack(">i", 0)))
    assert c.expect_close() == 0x10
    c.close()


def test_publish_errors(server):
    c = connect(server)
    assert c.handshake() == rawwire.OK
    # undeclared publisher
    confirmed, errors = c.publish_confirmed(7, [(1, b"a"), (2, b"b")])
    assert not confirmed and errors == {1: 0x12, 2: 0x12}
    # declare on a missing stream
    assert c.declare_publisher(3, "no-such-stream") == 0x02
    # a stream deleted under a declared publisher: MetadataUpdate, then PublishError 0x02
    assert c.create("short-lived") == rawwire.OK
    assert c.declare_publisher(4, "short-lived") == rawwire.OK
    other = connect(server)
    assert other.handshake() == rawwire.OK
    assert other.delete("short-lived") == rawwire.OK
    other.close()
    update = c.wait_for(0x10)
    assert struct.unpack_from(">H", update)[0] == 0x06 and update[2:] == s("short-lived")
    confirmed, errors = c.publish_confirmed(4, [(9, b"z")])
    assert errors == {9: 0x02}
    # an unsupported sub-batch codec (type 6): PublishError, the connection goes on
    assert c.create("codecs") == rawwire.OK
    assert c.declare_publisher(5, "codecs") == rawwire.OK
    inner = struct.pack(">I", 1) + b"q"
    body = struct.pack(">BiQBHII", 5, 1, 11, 0x80 | 6 << 4, 1, len(inner), len(inner)) + inner
    c.send(frame(0x02, body))
    f = c.wait_for(0x04)
    assert struct.unpack_from(">BiQH", f) == (5, 1, 11, 0x11)
    confirmed, errors = c.publish_confirmed(5, [(12, b"fine")])
    assert confirmed == {12}
    c.close()


def test_malformed_publish_closes_only_that_connection(server):
    c = connect(server)
    assert c.handshake() == rawwire.OK
    c.send(frame(0x02, struct.pack(">BiQI", 1, 5, 1, 999999)))
    assert c.expect_close() == 0x0D
    c.close()


def test_wrong_password(server):
    c = connect(server)
    assert c.handshake(password="wrong") == 0x08
    assert c.closed_within(5)
    c.close()


def test_heartbeat_timeout_closes_a_silent_peer(server):
    c = connect(server)
    assert c.handshake(heartbeat=1) == rawwire.OK
    f = c.recv_frame(3)
    assert f is not None and f[0] == 0x17            # the server heartbeats an idle connection
    t0 = time.monotonic()
    assert c.closed_within(6)                        # and drops a peer silent for > 2 intervals
    assert time.monotonic() - t0 < 5
    c.close()


def test_rss_stays_flat_under_repeated_abuse(server):
    def abuse():
        for payload in (b"GET / HTTP/1.1\r\n\r\n", struct.pack(">IHH", 10_000_000, 0x11, 1) + b"\x00" * 4096,
                        frame(0x0077), struct.pack(">I", 50) + b"\x00\x11"):
            c = connect(server)
            try:
                c.send(payload)
                c.sock.shutdown(socket.SHUT_WR)
                c.closed_within(5)
            except OSError:
                pass
            finally:
                c.close()
        c = connect(server)              # a refused login, left without waiting out the 3 s tarpit
        c.request(0x11, rawwire.props({}))
        c.send(frame(0x13, struct.pack(">I", 99) + s("PLAIN") + struct.pack(">i", 10) + b"\0guest\0nope"))
        c.close()
        c = connect(server)
        assert c.handshake() == rawwire.OK
        c.publish_confirmed(9, [(i, b"x" * 100) for i in range(50)])
        c.close()

    for _ in range(10):
        abuse()
    before = server.anon_kb()
    for _ in range(40):
        abuse()
    after = server.anon_kb()
    assert after - before < 8 * 1024, (before, after)


def test_slow_consumer_does_not_grow_broker_memory(server):
    pub = connect(server)
    assert pub.handshake() == rawwire.OK
    assert pub.create("firehose") == rawwire.OK
    assert pub.declare_publisher(1, "firehose") == rawwire.OK
    record = b"r" * 1000
    for k in range(12):                           # 60 MB in 5 MB Publish frames (over frame_max: allowed)
        ids = range(k * 5000 + 1, (k + 1) * 5000 + 1)
        confirmed, errors = pub.publish_confirmed(1, [(i, record) for i in ids], timeout=30)
        assert len(confirmed) == 5000 and not errors
    pub.close()
    before = server.anon_kb()
    slow = connect(server)
    try:
        assert slow.handshake() == rawwire.OK
        slow.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
        code, _ = slow.request(0x07, struct.pack(">B", 1) + s("firehose") + struct.pack(">HHi", 1, 65535, 0))
        assert code == rawwire.OK
        time.sleep(2.0)                           # never reads: the broker must stop, not buffer 60 MB
        grown = server.anon_kb() - before
        assert grown < 20 * 1024, f"broker grew {grown} KiB for a consumer that does not read"
    finally:
        slow.close()


def test_no_permission_on_a_stream(tmp_path):
    from riverbed.shells import auth
    users = tmp_path / "users.toml"
    auth.add_user(str(users), "alice", "s3cret", configure="^alice-", write="^alice-", read="^alice-")
    auth.add_user(str(users), "admin", "adm1n")
    srv = ServerProcess(tmp_path / "data", "--users", str(users)).start()
    try:
        admin = RawClient(srv.port)
        assert admin.handshake("admin", "adm1n") == rawwire.OK
        assert admin.create("payroll") == rawwire.OK
        c = RawClient(srv.port)
        assert c.handshake("alice", "s3cret") == rawwire.OK
        assert c.create("alice-orders") == rawwire.OK
        assert c.create("payroll-2") == 0x10
        assert c.declare_publisher(1, "payroll") == 0x10
        code, _ = c.request(0x07, struct.pack(">B", 1) + s("payroll") + struct.pack(">HHi", 1, 10, 0))
        assert code == 0x10
        assert c.delete("payroll") == 0x10
        c.close()
        g = RawClient(srv.port)
        assert g.handshake("guest", "guest") == 0x08      # no built-in guest once a users file is used
        assert g.closed_within(5)
        g.close()
        admin.close()
    finally:
        assert srv.stop() == 0, srv.log()
