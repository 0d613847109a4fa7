"""ZeroMQ topics are streams: they survive a restart, and a graceful stop answers the PUTs it took in."""

import threading

import pytest
import zmq

from procs import ServerProcess

pytestmark = pytest.mark.integration


def dealer(ctx, port):
    s = ctx.socket(zmq.DEALER)
    s.linger = 0
    # a DEALER blocks in send once its peer is gone and the queue is full: never wait for ever
    s.sndtimeo = 2000
    s.connect(f"tcp://127.0.0.1:{port}")
    return s


def replay(ctx, port, topic, n):
    s = dealer(ctx, port)
    s.send_multipart([b"", b"SUB", b"X-OFFSET", b"0", b"ID", b"r", b"", topic])
    assert s.poll(10_000) and s.recv_multipart() == [b"", b"OK", b"ID", b"r"]
    got = []
    while s.poll(1000 if len(got) >= n else 10_000):
        got.append(s.recv_multipart()[-1])
    s.close()
    return got


def test_topics_survive_restart_and_stop_answers_inflight_puts(tmp_path):
    ctx = zmq.Context()
    data = tmp_path / "data"
    srv = ServerProcess(data, "--zmq-port", "0").start()
    try:
        port = srv.ports["zmq"]
        pub = dealer(ctx, port)
        for i in range(1000):
            pub.send_multipart([b"", b"PUT", b"TOPIC", b"kept", b"", b"%d" % i])
        pub.send_multipart([b"", b"NOOP", b"ID", b"sync"])
        assert pub.poll(10_000) and pub.recv_multipart() == [b"", b"OK", b"ID", b"sync"]
        # PUTs with IDs still flowing when SIGTERM arrives
        oks = []
        stop_sent = threading.Event()

        def read_oks():
            while pub.poll(3000):
                m = pub.recv_multipart()
                if m[1] == b"OK":
                    oks.append(int(m[3]))
        reader = threading.Thread(target=read_oks)
        reader.start()
        for i in range(1000, 4000):
            try:
                pub.send_multipart([b"", b"PUT", b"TOPIC", b"kept", b"ID", b"%d" % i, b"", b"%d" % i])
            except zmq.Again:       # the server has stopped and the send queue is full
                break
            if i == 2000:
                stop_sent.set()
                threading.Thread(target=srv.stop).start()
        reader.join(30)
        pub.close()
        srv.proc.wait(30)
        assert srv.proc.returncode == 0, srv.log()
        assert oks, "no PUT was answered before the stop"
        assert oks == sorted(oks) and (not oks or oks == list(range(1000, oks[-1] + 1)))
    finally:
        srv.kill()
    srv = ServerProcess(data, "--zmq-port", "0").start()
    try:
        got = replay(ctx, srv.ports["zmq"], b"kept", 1000 + len(oks))
        assert got[:1000 + len(oks)] == [b"%d" % i for i in range(1000 + len(oks))]
        assert got == [b"%d" % i for i in range(len(got))]      # whatever else was stored: in order, no gap
    finally:
        ctx.destroy(linger=0)
        assert srv.stop() == 0, srv.log()


def test_port_flags_and_management_api(tmp_path):
    import base64
    import json
    import urllib.parse
    import urllib.request

    off = ServerProcess(tmp_path / "off", "--zmq-port", "0", "--zmq-port", "off").start()
    try:
        assert "zmq" not in off.ports                 # the last flag wins
    finally:
        assert off.stop() == 0
    srv = ServerProcess(tmp_path / "data", "--zmq-port", "0", "--http-port", "0").start()
    ctx = zmq.Context()
    auth = {"Authorization": "Basic " + base64.b64encode(b"guest:guest").decode()}

    def http(method, path):
        req = urllib.request.Request(f"http://127.0.0.1:{srv.ports['http']}{path}", method=method, headers=auth)
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, r.read()
    try:
        c = dealer(ctx, srv.ports["zmq"])
        c.send_multipart([b"", b"CONNECT", b"ID", b"c", b"TTL", b"60000", b"VERSION", b"0.2"])
        assert c.poll(5000) and c.recv_multipart() == [b"", b"OK", b"ID", b"c"]
        status, body = http("GET", "/api/connections")
        (info,) = [i for i in json.loads(body) if i["protocol"] == "zmq"]
        assert info["user"] == "guest" and info["client_properties"]["ttl_ms"] == 60000
        status, _ = http("DELETE", "/api/connections/" + urllib.parse.quote(info["name"]))
        assert status == 204
        assert c.poll(5000)
        assert c.recv_multipart()[:3] == [b"", b"ERROR", b"MESSAGE"]
        status, body = http("GET", "/api/connections")
        assert not [i for i in json.loads(body) if i["protocol"] == "zmq"]
    finally:
        ctx.destroy(linger=0)
        assert srv.stop() == 0, srv.log()
