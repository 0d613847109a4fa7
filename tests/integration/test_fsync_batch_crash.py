"""kill -9 of a broker under fsync=batch while a publisher sends one message per Publish frame, each
confirmed before the next (issue 26's durable row): the writer thread commits each alone, the stream's
state record is saved only every 64 chunks (engine/sparse.py) and rolled forward over the chunks after it
at the restart. Every confirmed message is there, in order, once, and the publisher sequence stored with
the chunks agrees with them."""

import struct

import pytest

import rawwire
from procs import ServerProcess
from test_rmq_crash import publish_then_kill, read_all

pytestmark = pytest.mark.integration


def test_sigkill_while_publishing_one_message_per_frame_with_fsync_batch(tmp_path):
    data = tmp_path / "data"
    confirmed_file = tmp_path / "confirmed.txt"
    confirmed = publish_then_kill(ServerProcess(data, "--fsync", "batch").start(), "onemsg", "_crash_onemsg.py",
                                  confirmed_file, 300 * 4)
    assert len(confirmed) >= 300 and confirmed == list(range(1, len(confirmed) + 1))

    srv = ServerProcess(data, "--fsync", "batch").start()
    try:
        stored = read_all(srv.port, "onemsg")
        c = rawwire.RawClient(srv.port)
        assert c.handshake() == rawwire.OK
        code, rest = c.request(0x05, rawwire.s("p") + rawwire.s("onemsg"))   # QueryPublisherSequence
        # one more confirmed after the restart: the rolled-forward state gives it the next offset
        assert c.declare_publisher(1, "onemsg", ref="p") == rawwire.OK
        nxt = len(stored) + 1
        assert c.publish_confirmed(1, [(nxt, b"crash-%d" % nxt)]) == ({nxt}, {})
        c.close()
        again = read_all(srv.port, "onemsg")
    finally:
        assert srv.stop() == 0, srv.log()
    ids = [int(r.split(b"-")[1]) for r in stored]
    assert ids == list(range(1, len(ids) + 1)), "a gap, a duplicate or a reordering"
    assert len(ids) >= len(confirmed), f"{len(confirmed) - len(ids)} confirmed messages lost"
    assert len(ids) <= len(confirmed) + 1          # at most the one in flight when the server died
    assert code == rawwire.OK and struct.unpack_from(">Q", rest)[0] == len(ids)
    assert [int(r.split(b"-")[1]) for r in again] == list(range(1, nxt + 1))
