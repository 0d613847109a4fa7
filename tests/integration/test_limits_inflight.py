"""The broker-wide in-flight budget (``--max-inflight-bytes``) against the real ``riverbed serve``: many
RabbitMQ Stream connections publish big frames as fast as they can without reading their confirms; the
server pauses reading them past the budget (TCP back-pressure), its anonymous memory stays under the
budget plus a bounded slack, and every message confirmed is there after a restart."""

import socket
import struct
import threading
import time

import pytest

import rawwire
from procs import ServerProcess
from rawwire import RawClient, frame
from test_limits_rmq import metrics

pytestmark = pytest.mark.integration

CONNECTIONS = 8
FRAMES = 24                     # per connection
FRAME_BYTES = 512 << 10         # one message per frame
BUDGET = 8 << 20


def gauge(text, name):
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[-1])
    raise KeyError(name)


def stored_records(text, stream):
    key = f'riverbed_stream_records{{stream="{stream}"}} '
    for line in text.splitlines():
        if line.startswith(key):
            return int(float(line.split()[-1]))
    return 0


class AnonPeak:
    """Samples the server's RssAnon (heap and buffers, not the LMDB map's file pages) every 10 ms."""

    def __init__(self, pid):
        self.pid = pid
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self._stop.is_set():
            try:
                with open(f"/proc/{self.pid}/status") as f:
                    for line in f:
                        if line.startswith("RssAnon:"):
                            self.peak = max(self.peak, int(line.split()[1]))
            except OSError:
                return
            time.sleep(0.01)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join(5)


def test_publishers_get_back_pressure_and_memory_stays_under_budget(tmp_path):
    srv = ServerProcess(tmp_path / "data", "--http-port", "0", "--fsync", "batch",
                        "--max-inflight-bytes", str(BUDGET), "--max-pending-bytes", "4MiB").start()
    try:
        setup = RawClient(srv.port)
        assert setup.handshake() == rawwire.OK
        assert setup.create("flood") == rawwire.OK
        setup.close()
        clients = []
        for _ in range(CONNECTIONS):
            c = RawClient(srv.port, timeout=60)
            assert c.handshake() == rawwire.OK
            assert c.declare_publisher(1, "flood") == rawwire.OK
            clients.append(c)
        time.sleep(0.2)
        base = srv.anon_kb()
        payload = b"p" * FRAME_BYTES

        def flood(c, k):
            for i in range(FRAMES):
                body = struct.pack(">BiQI", 1, 1, k * FRAMES + i, len(payload)) + payload
                c.send(frame(0x02, body))          # never reads its confirms meanwhile

        with AnonPeak(srv.pid) as anon:
            threads = [threading.Thread(target=flood, args=(c, k)) for k, c in enumerate(clients)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(120)
        # now read every confirm: all of them come
        confirmed = set()
        for c in clients:
            deadline = time.monotonic() + 60
            mine = set()
            while len(mine) < FRAMES and time.monotonic() < deadline:
                f = c.recv_frame(30)
                assert f is not None
                k, _, body = f
                if k == 0x03:
                    n = struct.unpack_from(">i", body, 1)[0]
                    mine.update(struct.unpack_from(">%dQ" % n, body, 5))
                assert k != 0x04, "a publish error"
            confirmed |= mine
            c.close()
        assert len(confirmed) == CONNECTIONS * FRAMES
        m = metrics(srv)
        paused = gauge(m, "riverbed_inflight_paused_total")
        peak_inflight = gauge(m, "riverbed_inflight_peak_bytes")
        extra_mb = (anon.peak - base) / 1024
        print(f"anon RSS base {base / 1024:.0f} MB, peak extra {extra_mb:.0f} MB; in flight peak "
              f"{peak_inflight / 2**20:.1f} MiB (budget {BUDGET >> 20} MiB), publishers paused {paused:.0f} times")
        assert paused > 0, "the budget never paused a publisher"
        # past the budget by at most what the connections had already read: about one read each
        assert peak_inflight <= BUDGET + CONNECTIONS * (FRAME_BYTES + (256 << 10))
        # memory: the budget, the frames each connection is in the middle of, and allocator slack
        assert extra_mb < (BUDGET >> 20) + CONNECTIONS * 2 * FRAME_BYTES / 2**20 + 40, f"{extra_mb:.0f} MB"
        assert srv.stop() == 0, srv.log()
        srv.start()
        assert stored_records(metrics(srv), "flood") == len(confirmed)
    finally:
        srv.stop()


def test_budget_holds_bson_publishers_too(tmp_path):
    """The budget is broker-wide and protocol-neutral: BSON/TCP publishers flooding big events are paused
    past it as well, and every acknowledged event is stored."""
    import bson
    srv = ServerProcess(tmp_path / "data", "--http-port", "0", "--bson-port", "0",
                        "--max-inflight-bytes", "2MiB").start()
    try:
        socks = []
        for _ in range(6):
            s = socket.create_connection(("127.0.0.1", srv.ports["bson"]), timeout=60)
            s.sendall(bson.encode({"type": "CONNECT", "frame": {"version": "0.1"}}))
            socks.append(s)
        event = {"blob": bson.Binary(b"e" * (256 << 10))}
        n = 24

        def flood(s, k):
            s.sendall(b"".join(bson.encode({"type": "PUB", "frame": {"channel": "bflood", "event": event,
                                                                      "rID": k * n + i}}) for i in range(n)))

        threads = [threading.Thread(target=flood, args=(s, k)) for k, s in enumerate(socks)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        acked = 0
        for s in socks:
            buf, got = b"", 0
            while got < n + 1:                   # CONNECT's answer, then one per PUB
                while len(buf) < 4 or len(buf) < struct.unpack_from("<i", buf)[0]:
                    chunk = s.recv(1 << 16)
                    assert chunk, "closed"
                    buf += chunk
                size = struct.unpack_from("<i", buf)[0]
                doc, buf = bson.decode(buf[:size]), buf[size:]
                assert doc["frame"]["ok"] is True, doc
                got += 1
            acked += got - 1
            s.close()
        m = metrics(srv)
        print(f"BSON: in flight peak {gauge(m, 'riverbed_inflight_peak_bytes') / 2**20:.1f} MiB (budget 2 MiB), "
              f"paused {gauge(m, 'riverbed_inflight_paused_total'):.0f} times")
        assert acked == 6 * n
        assert gauge(m, "riverbed_inflight_paused_total") > 0
        assert stored_records(m, "bflood") == acked
    finally:
        srv.stop()
