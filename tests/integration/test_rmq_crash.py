"""SIGKILL the broker while rstream publishes with confirms: after a restart every confirmed message is
there (the default fsync policy, batch, loses nothing acknowledged on a process crash)."""

import os
import signal
import struct
import subprocess
import sys
import time

import pytest

import rawwire
from procs import ServerProcess

pytestmark = pytest.mark.integration

HERE = os.path.dirname(__file__)


def read_all(port, stream):
    """Every record of ``stream`` through the protocol (raw client: Subscribe first, big credit)."""
    import struct
    from riverbed.engine import core
    c = rawwire.RawClient(port)
    try:
        assert c.handshake() == rawwire.OK
        code, rest = c.request(0x1C, rawwire.s(stream))
        assert code == rawwire.OK
        code, _ = c.request(0x07, struct.pack(">B", 1) + rawwire.s(stream) + struct.pack(">HHi", 1, 1000, 0))
        assert code == rawwire.OK
        n_stats = struct.unpack_from(">i", rest)[0]
        pos, stats = 4, {}
        for _ in range(n_stats):
            ln = struct.unpack_from(">h", rest, pos)[0]
            name = rest[pos + 2:pos + 2 + ln].decode()
            stats[name] = struct.unpack_from(">q", rest, pos + 2 + ln)[0]
            pos += 10 + ln
        records = []
        last = stats["committed_chunk_id"]
        if last < 0:
            return records
        while True:
            key, _, body = c.recv_frame(10)
            if key == 0x08:
                chunk = body[1:]
                records.extend(core.chunk_records(chunk))
                chunk_id = struct.unpack_from(">Q", chunk, 24)[0]
                c.send(rawwire.frame(0x09, struct.pack(">BH", 1, 1)))
                if chunk_id == last:
                    return records
    finally:
        c.close()


def publish_then_kill(srv, stream, publisher, confirmed_file, min_bytes):
    """Create ``stream`` on the started ``srv``, run the ``publisher`` script (it appends each confirmed id to
    ``confirmed_file``) until that file holds ``min_bytes``, kill -9 the server, stop the publisher; returns
    the confirmed ids."""
    pub = None
    try:
        c = rawwire.RawClient(srv.port)
        assert c.handshake() == rawwire.OK and c.create(stream) == rawwire.OK
        c.close()
        pub = subprocess.Popen([sys.executable, os.path.join(HERE, publisher), str(srv.port), stream,
                                str(confirmed_file)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if confirmed_file.exists() and confirmed_file.stat().st_size > min_bytes:
                break
            time.sleep(0.02)
        else:
            pytest.fail("publisher confirmed too little:\n" + srv.log())
        os.kill(srv.pid, signal.SIGKILL)
        srv.proc.wait(5)
        time.sleep(0.3)
    finally:
        if pub is not None:
            pub.kill()
            pub.wait()
        srv.kill()
    return [int(x) for x in confirmed_file.read_text().split()]


def test_sigkill_while_publishing_keeps_every_confirmed_message(tmp_path):
    data = tmp_path / "data"
    confirmed_file = tmp_path / "confirmed.txt"
    # mid-stream: frames in flight, commits pending
    confirmed = publish_then_kill(ServerProcess(data).start(), "crash", "_crash_publisher.py", confirmed_file,
                                  20_000 * 6)
    assert len(confirmed) >= 20_000

    srv = ServerProcess(data).start()               # restart on the same data directory
    try:
        stored = read_all(srv.port, "crash")
    finally:
        assert srv.stop() == 0, srv.log()
    ids = [int(r.split(b"-")[1]) for r in stored]
    assert len(ids) == len(set(ids)), "duplicated records"
    missing = set(confirmed) - set(ids)
    assert not missing, f"{len(missing)} confirmed messages lost, e.g. {sorted(missing)[:5]}"
    assert len(ids) >= len(confirmed)


def test_sigkill_while_publishing_one_message_per_frame_with_fsync_never(tmp_path):
    """fsync=never commits a small Publish frame on the event loop's thread and confirms it in the same
    read (the one-message path): a kill -9 still loses no confirmed message (the page cache holds what
    was committed), and the publisher sequence stored with each keeps up with what was stored."""
    data = tmp_path / "data"
    confirmed_file = tmp_path / "confirmed.txt"
    # between a commit and its confirm, or inside one
    confirmed = publish_then_kill(ServerProcess(data, "--fsync", "never").start(), "onemsg", "_crash_onemsg.py",
                                  confirmed_file, 2_000 * 5)
    assert len(confirmed) >= 2_000 and confirmed == list(range(1, len(confirmed) + 1))

    srv = ServerProcess(data, "--fsync", "never").start()
    try:
        stored = read_all(srv.port, "onemsg")
        c = rawwire.RawClient(srv.port)
        assert c.handshake() == rawwire.OK
        code, rest = c.request(0x05, rawwire.s("p") + rawwire.s("onemsg"))   # QueryPublisherSequence
        c.close()
    finally:
        assert srv.stop() == 0, srv.log()
    ids = [int(r.split(b"-")[1]) for r in stored]
    assert ids == list(range(1, len(ids) + 1)), "a gap, a duplicate or a reordering"
    assert len(ids) >= len(confirmed), f"{len(confirmed) - len(ids)} confirmed messages lost"
    assert len(ids) <= len(confirmed) + 1          # at most the one in flight when the server died
    assert code == rawwire.OK and struct.unpack_from(">Q", rest)[0] == len(ids)
