"""The bare relays the shell benches measure riverbed against (issue 26): each starts, relays N events to
its subscribers in order, answers every publish, and stops; each bench prints the riverbed/relay ratios."""

import bson
import pytest

from bench import bson_bench, ream_bench

N = 500


def test_bson_relay_forwards_every_pub_to_every_subscriber():
    relay = bson_bench.Relay()
    try:
        port = relay.ports["bson"]
        subs = []
        for _ in range(2):
            s = bson_bench.connect(port)
            s.sendall(bson.encode({"type": "SUBSCRIBE", "frame": {"channel": "ch", "rID": 7}}))
            subs.append(s)
        pub = bson_bench.connect(port)
        pub.sendall(b"".join(bson.encode({"type": "PUB", "frame": {"channel": "ch", "rID": i,
                                                                   "event": bson_bench.event(i, 100)}})
                             for i in range(N)))
        replies = _frames(pub, N)
        assert [r["frame"] for r in replies] == [{"ok": True, "rID": i} for i in range(N)]
        for s in subs:
            got = _frames(s, N + 1)
            assert got[0] == {"type": "SUBRESPONSE", "frame": {"ok": True, "rID": 7, "subID": 0}}
            assert [f["type"] for f in got[1:]] == ["RECEV"] * N
            assert [f["frame"]["pos"] for f in got[1:]] == list(range(N))
            assert [f["frame"]["event"]["i"] for f in got[1:]] == list(range(N))
            assert len(bson.encode(got[1]["frame"]["event"])) == 100
        assert relay.cpu_seconds() >= 0
    finally:
        relay.stop()
    assert relay.proc.poll() is not None


def _frames(sock, n):
    sock.settimeout(20)
    buf, out = b"", []
    while len(out) < n:
        while len(buf) < 4 or len(buf) < bson_bench._I32.unpack_from(buf)[0]:
            chunk = sock.recv(1 << 16)
            assert chunk, "relay closed"
            buf += chunk
        k = bson_bench._I32.unpack_from(buf)[0]
        out.append(bson.decode(buf[:k]))
        buf = buf[k:]
    return out


def test_ream_relay_forwards_every_publish_as_a_delivery_line():
    relay = ream_bench.Relay()
    try:
        port = relay.ports["ream"]
        sub = ream_bench.Conn(port)
        sub.sock.settimeout(20)
        sub.sock.sendall(b"EVENT SUBSCRIBE ev 1\n")
        assert sub.line() == b"EVENT SUBSCRIBED ev EMPTY"
        pub = ream_bench.Conn(port)
        pub.sock.settimeout(20)
        events = [ream_bench.event(i) for i in range(N)]
        # sent in odd-sized pieces, so requests and payloads are split across reads
        data = b"".join(b"EVENT PUBLISH ev %d\n%s\n" % (len(e), e) for e in events)
        for i in range(0, len(data), 997):
            pub.sock.sendall(data[i:i + 997])
        assert [pub.line() for _ in range(N)] == [b"EVENT PUBLISHED ev %d" % (i + 1) for i in range(N)]
        for i, e in enumerate(events):
            head, body = sub.sized()
            assert head == b"EVENT ev %d %d" % (i + 1, len(e)) and body == e
    finally:
        relay.stop()
    assert relay.proc.poll() is not None


@pytest.mark.integration
def test_bson_bench_prints_the_relay_ratios(capsys, monkeypatch):
    monkeypatch.setattr("sys.argv", ["bson_bench.py", "--n", "2000", "--no-rmq", "--subscribers", "1"])
    bson_bench.main()
    out = capsys.readouterr().out
    assert "BSON pipelined PUB" in out and "relay ev/s" in out and "ratio" in out


@pytest.mark.integration
def test_ream_bench_prints_the_relay_ratios(capsys, monkeypatch):
    monkeypatch.setattr("sys.argv", ["ream_bench.py", "--events", "2000", "--window", "500", "--relay-only"])
    ream_bench.main()
    out = capsys.readouterr().out
    assert "pipelined EVENT PUBLISH" in out and "publish -> 1 live subscriber" in out and "relay ev/s" in out
