"""The named limits against the real ``riverbed serve`` over RabbitMQ Stream (issue 21, class 1): a
Publish frame whose compressed sub-batch inflates to 64 MiB is refused with PublishError 0x11 while it
costs the server under 20 MB of extra peak memory and stalls another connection under 50 ms; frames over
the size or entry limits get Close 0x0e; every refusal shows in ``riverbed_rejected_total``.

Peak memory is the server's VmHWM (reset through /proc/PID/clear_refs before the bombs); the stall is
the longest Metadata round trip of a second connection, timed in a thread while the bombs are processed.
"""

import struct
import threading
import time
import urllib.request
import zlib

import cramjam
import lz4.frame
import pytest
import zstandard

import rawwire
from procs import ServerProcess
from rawwire import RawClient, frame, s

pytestmark = pytest.mark.integration

BOMB = 64 << 20                 # bytes of zeros every bomb inflates to
SNAPPY_BOMB = 1300 << 10        # ... except snappy's: the most a 64 KiB snappy body can inflate to
MAX_EXTRA_PEAK_KB = 20 * 1024   # the bound on extra peak memory
MAX_STALL = 0.050               # the bound on another connection's stall, seconds
RC_PRECONDITION_FAILED = 0x11
RC_FRAME_TOO_LARGE = 0x0E

GZIP, SNAPPY, LZ4, ZSTD = 1, 2, 3, 4


def compress(code, data):
    if code == GZIP:
        c = zlib.compressobj(9, zlib.DEFLATED, 31)
        return c.compress(data) + c.flush()
    if code == SNAPPY:
        return bytes(cramjam.snappy.compress(data))
    if code == LZ4:
        return lz4.frame.compress(data)
    return zstandard.ZstdCompressor(level=3).compress(data)


class _Bodies(dict):
    """codec -> the compressed 64 MiB of zeros, made on first use (only the tests here need them)."""

    def __missing__(self, code):
        # snappy cannot expand a body more than ~21 times: its 64 KiB bomb inflates to 1.3 MiB (a body that
        # inflates to 64 MiB is a 3 MiB frame, refused as cheaply: tests/shells/test_rmq_codec.py)
        body = self[code] = compress(code, bytes(SNAPPY_BOMB if code == SNAPPY else BOMB))
        return body


BODIES = _Bodies()


def sub_batch_publish(pid, pub_id, code, body, nrec, usize):
    """A Publish v1 frame with one sub-batch entry."""
    entry = struct.pack(">QBHII", pub_id, 0x80 | code << 4, nrec, usize, len(body)) + body
    return frame(0x02, struct.pack(">Bi", pid, 1) + entry)


def proc_status(pid, field):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise KeyError(field)


def reset_peak(pid):
    """Reset the process's VmHWM to its current RSS (Linux: ``echo 5 > /proc/PID/clear_refs``)."""
    with open(f"/proc/{pid}/clear_refs", "w") as f:
        f.write("5")


class Stall:
    """Metadata round trips on a connection of its own, back to back in a thread; ``worst`` is the
    longest, in seconds."""

    def __init__(self, port):
        self.client = RawClient(port)
        assert self.client.handshake() == rawwire.OK
        self.times = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        body = struct.pack(">i", 1) + s("good")
        while not self._stop.is_set():
            t = time.perf_counter()
            try:
                self.client.request(0x0F, body, timeout=30)
            except (OSError, ConnectionError):     # a timeout or a lost connection is a stall too
                self.times.append(float("inf"))
                return
            self.times.append(time.perf_counter() - t)
            time.sleep(0.002)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join(10)
        self.client.close()

    @property
    def worst(self):
        return max(self.times)


def metrics(server):
    with urllib.request.urlopen(f"http://127.0.0.1:{server.ports['http']}/metrics", timeout=10) as r:
        return r.read().decode()


def rejected(text, listener, reason):
    key = f'riverbed_rejected_total{{listener="{listener}",reason="{reason}"}} '
    for line in text.splitlines():
        if line.startswith(key):
            return float(line.split()[-1])
    return 0.0


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    srv = ServerProcess(tmp_path_factory.mktemp("limits") / "data", "--http-port", "0").start()
    yield srv
    assert srv.stop() == 0, srv.log()


@pytest.fixture(scope="module")
def good(server):
    c = RawClient(server.port)
    assert c.handshake() == rawwire.OK
    assert c.create("good") == rawwire.OK
    assert c.declare_publisher(1, "good") == rawwire.OK
    yield c
    c.close()


def bomb_cases(code):
    """(nrec, declared uncompressed size) of the bombs of one codec: the declared size of the issue
    (64 MiB, all of it), the most the ratio cap lets a body of this size declare (or what it inflates
    to, when less), and a small declared size with the rest inflating behind it."""
    body = BODIES[code]
    inflates = SNAPPY_BOMB if code == SNAPPY else BOMB
    return [(65535, BOMB), (65535, min(inflates, 200 * len(body))), (3, 4096)]


def send_bombs(server, c, frames, cases, first_id):
    """Send each bomb frame and wait for its PublishError; returns (extra peak RSS in kB, worst round trip of
    another connection in seconds, server CPU seconds spent)."""
    time.sleep(0.2)
    base_rss = proc_status(server.pid, "VmRSS")
    reset_peak(server.pid)
    cpu = server.cpu_seconds()
    with Stall(server.port) as stall:
        time.sleep(0.1)
        for i, f in enumerate(frames):
            c.send(f)
            confirmed, errors = set(), {}
            while not errors and not confirmed:
                k, _, body = c.recv_frame(30)
                if k == 0x04:
                    _, n = struct.unpack_from(">Bi", body)
                    errors.update(struct.unpack_from(">QH", body, 5 + 10 * j) for j in range(n))
                elif k == 0x03:
                    confirmed.add(first_id + i)
            assert errors == {first_id + i: RC_PRECONDITION_FAILED}, (cases[i], errors, confirmed)
        time.sleep(0.1)
    cpu = server.cpu_seconds() - cpu
    return proc_status(server.pid, "VmHWM") - base_rss, stall.worst, cpu


@pytest.mark.parametrize("code", [GZIP, ZSTD, LZ4, SNAPPY], ids=["gzip", "zstd", "lz4", "snappy"])
def test_decompression_bomb_is_refused_cheaply(server, good, code):
    before = metrics(server)
    c = RawClient(server.port, timeout=30)
    assert c.handshake() == rawwire.OK
    assert c.declare_publisher(7, "good") == rawwire.OK
    cases = bomb_cases(code)
    stalls = []
    # The machine is shared: a round trip can wait on the scheduler for reasons of its own. Noise only ever
    # adds, so the stall is the best of up to three rounds; memory is checked in every round.
    for attempt in range(3):
        first = 1 + attempt * len(cases)
        frames = [sub_batch_publish(7, first + i, code, BODIES[code], nrec, usize)
                  for i, (nrec, usize) in enumerate(cases)]
        extra_kb, worst, cpu = send_bombs(server, c, frames, cases, first)
        print(f"codec {code}: body {len(BODIES[code])} B, extra peak {extra_kb} kB, worst Metadata round "
              f"trip {worst * 1000:.1f} ms, server CPU {cpu * 1000:.0f} ms for {len(cases)} bombs + round trips")
        assert extra_kb < MAX_EXTRA_PEAK_KB, f"extra peak memory {extra_kb} kB"
        stalls.append(worst)
        if worst < MAX_STALL:
            break
    assert min(stalls) < MAX_STALL, f"another connection stalled {[round(t * 1000, 1) for t in stalls]} ms"
    # the connection is still usable and nothing of the bombs was stored
    confirmed, errors = c.publish_confirmed(7, [(100, b"after the bombs")])
    assert confirmed == {100} and not errors
    after = metrics(server)
    refused = sum(rejected(after, "stream", r) - rejected(before, "stream", r)
                  for r in ("decompressed_size", "decompression_ratio", "entries"))
    assert refused == len(cases) * len(stalls)
    c.close()


def test_frame_over_max_frame_size_is_closed_and_counted(tmp_path):
    srv = ServerProcess(tmp_path / "data", "--http-port", "0", "--max-frame-size", "1MiB",
                        "--max-entries-per-frame", "100").start()
    try:
        before = metrics(srv)
        c = RawClient(srv.port)
        assert c.handshake() == rawwire.OK
        assert c.create("s") == rawwire.OK
        assert c.declare_publisher(1, "s") == rawwire.OK
        confirmed, errors = c.publish_confirmed(1, [(i, b"x" * 1000) for i in range(100)])
        assert len(confirmed) == 100 and not errors        # at the limits: fine
        c.send(struct.pack(">I", (1 << 20) + 1) + b"\x00\x02\x00\x01")   # only the size: refused at once
        assert c.expect_close() == RC_FRAME_TOO_LARGE
        c.close()
        c = RawClient(srv.port)
        assert c.handshake() == rawwire.OK
        assert c.declare_publisher(1, "s") == rawwire.OK
        c.publish(1, [(i, b"") for i in range(101)])
        assert c.expect_close() == RC_FRAME_TOO_LARGE
        c.close()
        after = metrics(srv)
        assert rejected(after, "stream", "frame_size") == rejected(before, "stream", "frame_size") + 1
        assert rejected(after, "stream", "entries") == rejected(before, "stream", "entries") + 1
        assert srv.log_has("refused (entries)"), srv.log()
    finally:
        assert srv.stop() == 0, srv.log()
