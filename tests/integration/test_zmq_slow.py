"""A stalled ZeroMQ subscriber with a 1 GB backlog: the broker reads the stream at the subscriber's pace
and ZeroMQ's high-water mark bounds what is queued, so the server's heap stays flat and other clients
are served."""

import time

import pytest
import zmq

from procs import ServerProcess

pytestmark = [pytest.mark.integration, pytest.mark.slow]

HWM = 100
BODY = 512 * 1024
COUNT = 2048          # 1 GiB of bodies


def dealer(ctx, port, **opts):
    s = ctx.socket(zmq.DEALER)
    s.linger = 0
    for k, v in opts.items():
        s.setsockopt(getattr(zmq, k), v)
    s.connect(f"tcp://127.0.0.1:{port}")
    return s


def call(s, *frames, timeout=30):
    s.send_multipart([b""] + list(frames))
    assert s.poll(timeout * 1000), "no reply"
    return s.recv_multipart()


def test_stalled_subscriber_with_1gb_backlog(tmp_path):
    srv = ServerProcess(tmp_path / "data", "--zmq-port", "0", "--zmq-hwm", str(HWM), "--fsync", "never").start()
    ctx = zmq.Context()
    try:
        port = srv.ports["zmq"]
        pub = dealer(ctx, port)
        body = bytes(range(256)) * (BODY // 256)
        for i in range(COUNT):
            pub.send_multipart([b"", b"PUT", b"TOPIC", b"backlog", b"X-I", b"%d" % i, b"", body])
            if i % 64 == 63:
                assert call(pub, b"NOOP", b"ID", b"%d" % i) == [b"", b"OK", b"ID", b"%d" % i]
        assert call(pub, b"NOOP", b"ID", b"end") == [b"", b"OK", b"ID", b"end"]
        time.sleep(0.5)
        base = srv.anon_kb()
        slow = dealer(ctx, port, RCVHWM=4, RCVBUF=64 * 1024)
        assert call(slow, b"SUB", b"X-OFFSET", b"0", b"ID", b"s", b"", b"backlog") == [b"", b"OK", b"ID", b"s"]
        peak = base
        other = dealer(ctx, port)
        for _ in range(20):
            time.sleep(0.25)
            peak = max(peak, srv.anon_kb())
            t0 = time.monotonic()
            assert call(other, b"NOOP", b"ID", b"x", timeout=5) == [b"", b"OK", b"ID", b"x"]
            assert time.monotonic() - t0 < 1.0
        # bound: the HWM's worth of messages in ZeroMQ's pipe and one read batch, far below the 1 GB backlog
        assert (peak - base) * 1024 < (HWM + 40) * BODY, (base, peak)
        # the subscriber resumes in order
        seen = []
        while len(seen) < 300:
            assert slow.poll(10_000)
            m = slow.recv_multipart()
            if m[1] == b"MESSAGE":
                assert m[2:6] == [b"TOPIC", b"backlog", b"X-I", b"%d" % len(seen)]
                assert m[-1] == body
                seen.append(m)
    finally:
        ctx.destroy(linger=0)
        code = srv.stop(timeout=60)
    assert code == 0, srv.log()
