"""The sans-I/O mc0 shell (riverbed.shells.zmq_mc0.session) over a real engine, with a fake io and a
fake clock: request order behind PUT commits, fan-out through tails, TTL timers, blocked peers."""

import pytest

from riverbed.shells.zmq_mc0 import session as ses
from riverbed.shells.zmq_mc0.session import BLOCKED, GONE, SENT, McShell

from .harness import Loop


class FakeIO:
    def __init__(self):
        self.sent = []            # (identity, frames)
        self.deferred = []
        self.blocked = set()      # identities whose pipe is full
        self.gone = set()

    def send(self, identity, frames):
        if identity in self.gone:
            return GONE
        if identity in self.blocked:
            return BLOCKED
        self.sent.append((identity, list(frames)))
        return SENT

    def defer(self, fn, *args):
        self.deferred.append((fn, args))

    def take(self, identity=None):
        out = [f for i, f in self.sent if identity is None or i == identity]
        self.sent = [(i, f) for i, f in self.sent if not (identity is None or i == identity)]
        return out


class Harness(Loop):
    def __init__(self, tmp_path):
        super().__init__(tmp_path)
        self.io = FakeIO()          # the ROUTER's io: frames per identity
        self.ios.append(self.io)
        self.shell = McShell(self.broker, self.io)

    def req(self, ident, *frames):
        self.shell.handle(ident, [b""] + [f if isinstance(f, bytes) else f.encode() for f in frames])

    def close(self):
        self.shell.close()
        super().close()


@pytest.fixture
def h(tmp_path):
    harness = Harness(tmp_path)
    yield harness
    harness.close()


def msg(topic, body, *hdrs, offset=0):
    return [b"", b"MESSAGE", b"TOPIC", topic, *hdrs, b"X-OFFSET", b"%d" % offset,
            b"X-CONTENT-TYPE", b"application/octet-stream", b"", *body]



def test_order_put_then_noop_waits_for_commit(h):
    h.req(b"S", "SUB", "ID", "s", "", "t")
    h.settle()
    assert h.io.take(b"S") == [[b"", b"OK", b"ID", b"s"]]
    h.req(b"P", "PUT", "TOPIC", "t", "X-K", "v", "", "b1")
    h.req(b"P", "NOOP", "ID", "n")
    assert h.io.take(b"P") == []            # the NOOP waits behind the PUT's commit
    h.settle()
    assert h.io.take(b"P") == [[b"", b"OK", b"ID", b"n"]]
    assert h.io.take(b"S") == [msg(b"t", [b"b1"], b"X-K", b"v")]
    assert h.eng.stream_info("t").records == 1


def test_waiting_subscription_and_exact_match(h):
    h.req(b"S", "SUB", "", "t", "t2")
    h.req(b"S", "UNSUB", "ID", "u", "", "t2")
    assert h.io.take(b"S") == [[b"", b"OK", b"ID", b"u"]]
    for i in range(5):
        h.req(b"P", "PUT", "TOPIC", "t", "", f"m{i}")
        h.req(b"P", "PUT", "TOPIC", "t2", "", f"x{i}")
        h.req(b"P", "PUT", "TOPIC", "tt", "", f"y{i}")
    h.settle()
    assert h.io.take(b"S") == [msg(b"t", [f"m{i}".encode()], offset=i) for i in range(5)]
    assert h.io.take(b"P") == []


def test_replay_from_offset_then_live(h):
    for i in range(10):
        h.req(b"P", "PUT", "TOPIC", "t", "", str(i))
        h.settle()
    h.req(b"S", "SUB", "X-OFFSET", "3", "ID", "1", "", "t")
    h.req(b"P", "PUT", "TOPIC", "t", "", "10")
    h.settle()
    got = h.io.take(b"S")
    assert got[0] == [b"", b"OK", b"ID", b"1"]
    assert [m[-1] for m in got[1:]] == [str(i).encode() for i in range(3, 11)]


def test_blocked_peer_holds_and_resumes(h):
    h.req(b"S", "SUB", "", "t")
    h.io.blocked.add(b"S")
    for i in range(20):
        h.req(b"P", "PUT", "TOPIC", "t", "", str(i))
    h.settle()
    assert h.io.take(b"S") == []
    client = h.shell.clients[b"S"]
    assert client.blocked and h.shell.blocked == {client}
    h.req(b"S", "NOOP", "ID", "q")          # a reply to a blocked client waits in its outbox
    h.io.blocked.clear()
    h.shell.tick()
    h.settle()
    got = h.io.take(b"S")
    assert got[0] == [b"", b"OK", b"ID", b"q"]
    assert [m[-1] for m in got[1:]] == [str(i).encode() for i in range(20)]
    assert not client.blocked


def test_gone_peer_is_forgotten(h):
    h.req(b"S", "SUB", "", "t")
    h.io.gone.add(b"S")
    h.req(b"P", "PUT", "TOPIC", "t", "", "x")
    h.settle()
    assert b"S" not in h.shell.clients
    assert not any(hasattr(s, "identity") and s.identity == b"S" for s in h.broker.sessions)


def test_ttl_noop_and_expiry(h):
    h.req(b"C", "CONNECT", "ID", "c", "TTL", "1000", "VERSION", "0.2")
    assert h.io.take(b"C") == [[b"", b"OK", b"ID", b"c"]]
    h.now += 0.90
    h.shell.tick()
    assert h.io.take(b"C") == []
    h.now += 0.06                       # 0.96 s of send-silence
    h.shell.tick()
    assert h.io.take(b"C") == [[b"", b"NOOP"]]
    h.req(b"C", "NOOP")                 # heard at 0.96
    h.now += 1.0                        # 1.0 s since: NOOP due again, not expired
    h.shell.tick()
    assert h.io.take(b"C") == [[b"", b"NOOP"]]
    assert b"C" in h.shell.clients
    h.now += 0.1                        # 1.1 s of receive-silence > 1.05 x TTL
    h.shell.tick()
    assert b"C" not in h.shell.clients


def test_no_ttl_never_expires_but_empty_idle_is_forgotten(h):
    h.req(b"A", "SUB", "", "t")
    h.req(b"B", "NOOP")
    h.now += ses.IDLE_FORGET + 1
    h.shell._next_idle_sweep = 0
    h.shell.tick()
    assert b"A" in h.shell.clients and b"B" not in h.shell.clients


def test_disconnect_and_stream_deleted(h):
    h.req(b"S", "SUB", "", "t")
    h.req(b"P", "PUT", "TOPIC", "t", "", "a")
    h.settle()
    assert len(h.io.take(b"S")) == 1
    done = []
    h.broker.delete_stream("t", done.append)
    h.settle()
    assert done == [None]
    h.req(b"P", "PUT", "TOPIC", "t", "", "b")      # recreated: the waiting subscription starts at 0
    h.settle()
    assert h.io.take(b"S") == [msg(b"t", [b"b"])]
    h.req(b"S", "DISCONNECT", "ID", "d")
    assert h.io.take(b"S") == [[b"", b"OK", b"ID", b"d"]]
    assert b"S" not in h.shell.clients
    h.req(b"P", "PUT", "TOPIC", "t", "", "c")
    h.settle()
    assert h.io.take(b"S") == []


def test_errors_keep_order_and_no_state_for_garbage(h):
    h.shell.handle(b"G", [b"junk"])
    assert h.io.take(b"G") == [[b"", b"ERROR", b"MESSAGE",
                                b"malformed message: it must begin with an empty delimiter frame"]]
    assert b"G" not in h.shell.clients
    h.req(b"P", "PUT", "TOPIC", "t", "", "a")
    h.req(b"P", "FROB", "ID", "f")
    h.req(b"P", "PUT", "ID", "p", "", "no topic")
    h.req(b"P", "SUB", "X-OFFSET", "-1", "ID", "s", "", "t")
    assert h.io.take(b"P") == []
    h.settle()
    assert h.io.take(b"P") == [
        [b"", b"ERROR", b"MESSAGE", b"Unknown verb 'FROB'", b"ID", b"f"],
        [b"", b"ERROR", b"MESSAGE", b"PUT without a TOPIC header", b"ID", b"p"],
        [b"", b"ERROR", b"MESSAGE", b"bad X-OFFSET '-1': not a non-negative integer", b"ID", b"s"],
    ]


def test_connection_info_and_admin_close(h):
    h.req(b"C", "CONNECT", "TTL", "5000")
    info = [i for i in h.broker.connections() if i["protocol"] == "zmq"]
    assert len(info) == 1 and info[0]["client_properties"]["ttl_ms"] == 5000
    h.shell.clients[b"C"].close_by_admin("maintenance")
    assert h.io.take(b"C") == [[b"", b"ERROR", b"MESSAGE", b"closed by the administrator: maintenance"]]
    assert b"C" not in h.shell.clients


def test_requests_queued_behind_a_disconnect_belong_to_a_new_client(h):
    h.req(b"C", "SUB", "", "old")
    h.req(b"C", "PUT", "TOPIC", "t", "ID", "p", "", "x")
    h.req(b"C", "DISCONNECT", "ID", "d")
    h.req(b"C", "SUB", "ID", "s", "", "new")
    assert h.io.take(b"C") == []
    h.settle()
    assert h.io.take(b"C") == [[b"", b"OK", b"ID", b"p"], [b"", b"OK", b"ID", b"d"], [b"", b"OK", b"ID", b"s"]]
    assert list(h.shell.clients[b"C"].subs) == [b"new"]
