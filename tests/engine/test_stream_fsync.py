"""The ``fsync`` stream argument: one stream asks for more durability than the engine's policy (issue 23:
replication and fsync together). A commit touching such a stream is synced before it is acknowledged;
other streams keep the engine's policy and its inline commits; the argument is stored with the stream."""

import threading

import pytest

from riverbed.engine import Engine
from riverbed.engine.errors import InvalidArgument


def test_a_stream_asking_for_always_is_synced_the_others_are_not(tmp_path):
    eng = Engine(tmp_path / "d", fsync="never", retention_interval=0)
    try:
        eng.create_stream("safe", {"x-fsync": "always"}).result(10)
        eng.create_stream("fast", {}).result(10)
        before = eng.stats.stream_syncs
        eng.append("fast", [b"a", b"b"]).result(10)
        assert eng.stats.stream_syncs == before
        eng.append("safe", [b"a", b"b"]).result(10)
        assert eng.stats.stream_syncs == before + 1
        eng.store_offset("safe", "c1", 1).result(10)
        assert eng.stats.stream_syncs == before + 2
        assert eng.stream_fsync("safe") == "always" and eng.stream_fsync("fast") == "never"
        assert eng.stream_info("safe").arguments == {"fsync": "always"}
    finally:
        eng.close()
    # stored with the stream
    eng = Engine(tmp_path / "d", fsync="never", retention_interval=0)
    try:
        assert eng.stream_fsync("safe") == "always"
    finally:
        eng.close()


def test_a_synced_stream_is_never_committed_on_the_callers_thread(tmp_path):
    """With fsync=never a small append may commit inline, on the caller's thread (an event loop); one to a
    stream that syncs goes to the writer thread, so the loop never waits for an fsync."""
    eng = Engine(tmp_path / "d", fsync="never", retention_interval=0)
    try:
        eng.create_stream("safe", {"fsync": "batch"}).result(10)
        eng.create_stream("fast").result(10)
        threads = {}

        def idle():
            eng.sync().result(10)
            while eng._writer._outstanding:      # the writer counts an operation done just after it completes
                pass
        done = threading.Event()

        def on_done(name):
            def cb(res, exc):
                threads[name] = threading.current_thread()
                if name == "safe":
                    done.set()
            return cb
        idle()
        eng.append("fast", [b"x"], on_done=on_done("fast"))
        assert threads["fast"] is threading.current_thread()     # inline: run before append returned
        idle()
        eng.append("safe", [b"x"], on_done=on_done("safe"))
        assert done.wait(10)
        assert threads["safe"] is not threading.current_thread()
    finally:
        eng.close()


def test_a_stream_never_gets_less_than_the_engine(tmp_path):
    eng = Engine(tmp_path / "d", fsync="always", retention_interval=0)
    try:
        eng.create_stream("s", {"fsync": "never"}).result(10)
        eng.append("s", [b"a"]).result(10)
        assert eng.stream_fsync("s") == "always" and eng.stats.stream_syncs == 0
    finally:
        eng.close()


@pytest.mark.parametrize("value", ["sometimes", "", "ALWAYS"])
def test_a_bad_value_is_refused(tmp_path, value):
    eng = Engine(tmp_path / "d", fsync="batch", retention_interval=0)
    try:
        with pytest.raises(InvalidArgument, match="fsync"):
            eng.create_stream("s", {"fsync": value})
        with pytest.raises(InvalidArgument, match="queue-leader-locator"):
            eng.create_stream("t", {"queue-leader-locator": "anywhere"})
    finally:
        eng.close()
