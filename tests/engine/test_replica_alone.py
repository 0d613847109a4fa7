"""A member's one-read store (engine/replica_alone.py, issue 23's confirm latency): a batch of leader chunks
stored by the short path leaves exactly what the writer's general group commit leaves (chunks, index
entries, sequences, the stream state, also after a reopen), wakes readers waiting on the stream, and hands
every case it does not cover (a gap, an overlap, a stream asking for a sync) to the general path."""

import threading

import pytest

from riverbed.engine import Engine, OffsetSpec, replica_alone
from riverbed.engine.errors import ChunkError


@pytest.fixture
def leader(tmp_path):
    a = Engine(tmp_path / "a", fsync="never", retention_interval=0)
    a.create_stream("s").result()
    # 150 chunks: more than two state-save periods (sparse.STATE_SAVE_EVERY) and index periods
    for i in range(150):
        a.append("s", [b"m%d-%d" % (i, j) for j in range(1 + i % 3)], publishing_ids=[10 * i + 1 + i % 3],
                 publisher="p" if i % 2 else "q").result()
    yield a
    a.close()


def _spy(monkeypatch):
    calls = []
    real = replica_alone.replicate_alone

    def spied(*args):
        res = real(*args)
        calls.append(res)
        return res
    import riverbed.engine.writer as writer
    monkeypatch.setattr(writer, "replicate_alone", spied)
    return calls


def _store_one_by_one(eng, a, inline):
    """Each chunk of ``a``'s log on its own, with a sequence, as a member stores one publish at a time;
    ``inline``: through on_done (committed on this thread, fsync=never), else through the writer thread."""
    src, _ = a.read_for_replica("s", 0, max_chunks=1000)
    done = []
    for chunk_id, raw in src:
        if inline:
            # a bytearray, as a member's chunk comes off the socket (stored as it is)
            eng.replicate_chunks("s", [bytearray(raw)], sequences={"p": chunk_id},
                                 on_done=lambda r, e: done.append((r, e)))
        else:
            done.append((eng.replicate_chunks("s", [raw], sequences={"p": chunk_id}).result(), None))
    return src, done


def _state(e):
    info = e.stream_info("s")
    return (info.first_chunk_id, info.last_chunk_id, info.next_offset, info.records, info.chunks, info.bytes,
            e.read_chunks("s", 0, 10_000, limited=False), e.query_publisher_sequence("s", "p"),
            [e.resolve("s", OffsetSpec.timestamp(ts)) for ts in (0, 1 << 40)])


@pytest.mark.parametrize("inline", [True, False])
def test_short_path_stores_what_the_general_path_stores(leader, tmp_path, monkeypatch, inline):
    calls = _spy(monkeypatch)
    short = Engine(tmp_path / "short", fsync="never", retention_interval=0)
    general = Engine(tmp_path / "general", fsync="never", retention_interval=0)
    try:
        for e in (short, general):
            e.create_stream("s").result()
        src, done = _store_one_by_one(short, leader, inline)
        assert [e for _, e in done] == [None] * len(src)
        assert len([c for c in calls if c is not None]) == len(src)     # every one took the short path
        del calls[:]
        # the same chunks through the writer's general group commit
        monkeypatch.setattr("riverbed.engine.writer.replicate_alone", lambda *a: None)
        for chunk_id, raw in src:
            general.replicate_chunks("s", [raw], sequences={"p": chunk_id}).result()
        assert _state(short) == _state(general)
        assert _state(short)[2] == leader.stream_info("s").next_offset
        assert short.read_chunks("s", 0, 10_000, limited=False) == leader.read_chunks("s", 0, 10_000, limited=False)
    finally:
        short.close()
        general.close()
    # reopened: the state record (saved every STATE_SAVE_EVERY chunks) rolls forward to the same place
    short = Engine(tmp_path / "short", fsync="never", retention_interval=0)
    general = Engine(tmp_path / "general", fsync="never", retention_interval=0)
    try:
        assert _state(short) == _state(general)
        # a member elected leader deduplicates with the sequences the short path stored
        last = src[-1][0]
        assert short.append("s", [b"again"], publishing_ids=[last], publisher="p").result().duplicates == [last]
    finally:
        short.close()
        general.close()


def test_short_path_wakes_a_waiting_reader(leader, tmp_path, monkeypatch):
    calls = _spy(monkeypatch)
    b = Engine(tmp_path / "b", fsync="never", retention_interval=0)
    try:
        b.create_stream("s").result()
        src, _ = leader.read_for_replica("s", 0, max_chunks=2)
        woke = threading.Event()
        b.watch("s", 0, lambda exc: woke.set())
        assert not woke.is_set()
        got = []
        b.replicate_chunks("s", [src[0][1]], on_done=lambda r, e: got.append((r, e)))
        assert got and got[0][1] is None and calls and calls[0] is not None
        assert woke.wait(5)
    finally:
        b.close()


def test_gaps_overlaps_and_sync_streams_go_the_general_way(leader, tmp_path, monkeypatch):
    calls = _spy(monkeypatch)
    b = Engine(tmp_path / "b", fsync="never", retention_interval=0)
    try:
        b.create_stream("s").result()
        b.create_stream("durable", {"fsync": "always"}).result()
        src, _ = leader.read_for_replica("s", 0, max_chunks=3)
        with pytest.raises(ChunkError):
            b.replicate_chunks("s", [src[1][1]]).result()          # a gap: refused, nothing stored
        assert calls == [None]
        b.replicate_chunks("s", [src[0][1]]).result()
        with pytest.raises(ChunkError):
            b.replicate_chunks("s", [src[0][1]]).result()          # an overlap
        assert calls[1] is not None and calls[2] is None
        assert [c for c, _ in b.read_chunks("s", 0, 100, limited=False)] == [src[0][0]]
        # a stream whose own fsync asks for more than the environment's: the general path (it syncs)
        syncs = b.stats.stream_syncs
        b.replicate_chunks("durable", [src[0][1]]).result()
        assert calls[3] is None and b.stats.stream_syncs == syncs + 1
        # an empty copy may start at the leader's first chunk (start=True), also on the short path
        b.create_stream("late").result()
        assert b.replicate_chunks("late", [src[2][1]], start=True).result() == src[2][0] + 3
        assert calls[4] is not None
        assert b.stream_info("late").first_chunk_id == src[2][0]
    finally:
        b.close()
