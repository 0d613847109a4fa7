"""The engine's replication support (a cluster member, issue 23): chunks stored byte for byte at their
own ids, the leader epoch stamped into new chunks, truncation of an unconfirmed tail, and the read limit
(no reader sees past the committed offset)."""

import threading

import pytest

from riverbed.engine import Engine, OffsetSpec, core
from riverbed.engine.errors import ChunkError
from riverbed.engine.format import H_CHUNK_ID, H_EPOCH


@pytest.fixture
def pair(tmp_path):
    a = Engine(tmp_path / "a", fsync="never", retention_interval=0)
    b = Engine(tmp_path / "b", fsync="never", retention_interval=0)
    a.create_stream("s").result()
    b.create_stream("s").result()
    yield a, b
    a.close()
    b.close()


def chunks(e, name="s"):
    return e.read_chunks(name, 0, 1000, limited=False)


def test_replicated_chunks_are_byte_identical(pair):
    a, b = pair
    a.set_epoch("s", 4)
    for i in range(5):
        a.append("s", [b"m%d-%d" % (i, j) for j in range(3)], publishing_ids=[3 * i + j for j in range(3)],
                 publisher="p").result()
    src, seqs = a.read_for_replica("s", 0)
    assert seqs == {"p": 14}
    assert all(core.read_header(raw)[H_EPOCH] == 4 for _, raw in src)
    for _, raw in src:
        b.replicate_chunk("s", raw, sequences=seqs).result()
    assert chunks(b) == chunks(a)
    assert b.stream_info("s").next_offset == a.stream_info("s").next_offset == 15
    assert b.query_publisher_sequence("s", "p") == 14
    # a member that becomes leader deduplicates as the old leader did
    res = b.append("s", [b"again"], publishing_ids=[14], publisher="p").result()
    assert res.duplicates == [14]


def test_replica_refuses_gaps_overlaps_and_bad_crc(pair):
    a, b = pair
    for i in range(3):
        a.append("s", [b"x%d" % i]).result()
    src = chunks(a)
    with pytest.raises(ChunkError):
        b.replicate_chunk("s", src[1][1]).result()          # a gap: chunk 1 before chunk 0
    b.replicate_chunk("s", src[0][1]).result()
    with pytest.raises(ChunkError):
        b.replicate_chunk("s", src[0][1]).result()          # an overlap
    bad = bytearray(src[1][1])
    bad[-1] ^= 0xFF
    with pytest.raises(ChunkError):
        b.replicate_chunk("s", bytes(bad))                   # the CRC is checked before anything is queued
    assert [c for c, _ in chunks(b)] == [0]


def test_truncate_drops_the_tail_and_its_sequences(pair):
    a, _ = pair
    for i in range(4):
        a.append("s", [b"y%d" % i, b"z%d" % i], publishing_ids=[2 * i, 2 * i + 1], publisher="p").result()
    assert a.truncate("s", 4).result() == 4
    assert [c for c, _ in chunks(a)] == [0, 2]
    info = a.stream_info("s")
    assert (info.next_offset, info.records, info.chunks, info.last_chunk_id) == (4, 4, 2, 2)
    # the sequence of the removed ids is gone: publishing them again stores them (no loss)
    res = a.append("s", [b"y2", b"z2"], publishing_ids=[4, 5], publisher="p").result()
    assert res.duplicates == [] and (res.first_offset, res.last_offset) == (4, 5)
    with pytest.raises(Exception):
        a.truncate("s", 5).result()                          # not a chunk boundary
    assert a.truncate("s", 0).result() == 0
    assert chunks(a) == [] and a.stream_info("s").chunks == 0


def test_read_limit_hides_uncommitted_chunks(pair):
    a, _ = pair
    a.set_read_limit("s", 0)
    a.append("s", [b"r0", b"r1"]).result()
    a.append("s", [b"r2"]).result()
    assert a.read_chunks("s", 0, 10) == []
    assert [c for c, _ in a.read_chunks("s", 0, 10, limited=False)] == [0, 2]
    assert list(a.scan("s")) == []
    assert a.resolve("s", OffsetSpec.next()) == 0
    seen = threading.Event()
    a.watch("s", 0, lambda exc: seen.set())
    assert not seen.is_set()
    a.set_read_limit("s", 2)                                # the first chunk is committed by a majority
    assert seen.wait(1)
    assert [c for c, _ in a.read_chunks("s", 0, 10)] == [0]
    assert [r for _, r in a.scan("s")] == [b"r0", b"r1"]
    assert a.resolve("s", OffsetSpec.next()) == 2
    assert a.resolve("s", OffsetSpec.last()) == 0
    late = threading.Event()
    a.watch("s", 2, lambda exc: late.set())
    a.append("s", [b"r3"]).result()                         # a commit alone does not pass the limit
    assert not late.is_set()
    a.set_read_limit("s", None)
    assert late.is_set()
    assert a.resolve("s", OffsetSpec.next()) == 4


def test_a_batch_of_chunks_is_stored_in_one_commit_or_not_at_all(pair):
    """replicate_chunks: every CRC checked, the ids checked against the log's end before anything is
    staged, the sequences stored with the batch, one group commit for all of it."""
    a, b = pair
    for i in range(4):
        a.append("s", [b"q%d" % i], publishing_ids=[i], publisher="p").result()
    src, seqs = a.read_for_replica("s", 0)
    raws = [raw for _, raw in src]
    with pytest.raises(ChunkError):
        b.replicate_chunks("s", [raws[0], raws[2]], sequences=seqs).result()   # a gap inside the batch
    assert chunks(b) == [] and b.query_publisher_sequence("s", "p") == 0       # nothing of it stored
    bad = bytearray(raws[3])
    bad[-1] ^= 0xFF
    with pytest.raises(ChunkError):
        b.replicate_chunks("s", raws[:3] + [bytes(bad)], sequences=seqs)       # checked before queueing
    assert chunks(b) == []
    commits = b.stats.group_commits
    assert b.replicate_chunks("s", raws, sequences=seqs).result() == 4
    assert b.stats.group_commits == commits + 1
    assert chunks(b) == chunks(a)
    assert b.query_publisher_sequence("s", "p") == 3


def test_chunks_in_a_reused_receive_buffer_are_stored_as_they_were(pair):
    """A member hands the engine memoryviews of its receive buffers (shells/cluster/wire.py) and reads
    the next chunk into the same buffer once the completion ran: what is stored is the view's bytes
    (not the buffer's), and nothing the engine stored changes when the buffer is read into again, on
    the inline path (a callback) and through the writer thread (a future)."""
    a, b = pair
    for i in range(6):
        a.append("s", [b"r%d-%d" % (i, j) * (i + 1) for j in range(4)], publishing_ids=[4 * i + j for j in range(4)],
                 publisher="p").result()
    raws = [raw for _, raw in chunks(a)]
    slab = core.receive_buffer(4096)
    done = []
    for i, raw in enumerate(raws):
        view = memoryview(slab)[:len(raw)]
        view[:] = raw
        if i % 2:
            b.replicate_chunks("s", [view], sequences={"p": 4 * i + 3}).result()
        else:
            b.replicate_chunks("s", [view], sequences={"p": 4 * i + 3}, on_done=lambda r, e: done.append((r, e)))
            assert done[-1][1] is None          # inline (fsync=never, writer idle): done before it returns
        view.release()
        slab[:] = b"\xee" * len(slab)           # the next read into the same buffer
    assert chunks(b) == chunks(a)
    assert b.query_publisher_sequence("s", "p") == 23
    words = memoryview(bytes(raws[-1])).cast("I") if len(raws[-1]) % 4 == 0 else memoryview(raws[-1])
    with pytest.raises(ChunkError):
        b.replicate_chunks("s", [words]).result()    # any other buffer is read as its bytes: an overlap here


def test_receive_buffer_is_a_bytearray_of_the_size_asked():
    buf = core.receive_buffer(100_000)
    assert type(buf) is bytearray and len(buf) == 100_000
    assert len(core.receive_buffer(0)) == 0
    with pytest.raises(ValueError):
        core.receive_buffer(-1)


def test_offsets_version_rises_after_an_offset_commit(pair):
    a, _ = pair
    v = a.offsets_version
    a.append("s", [b"o"]).result()
    assert a.offsets_version == v                   # records alone: no consumer offset changed
    a.store_offset("s", "c", 0).result()
    assert a.offsets_version == v + 1
    assert a.stored_offsets("s") == {"c": 0}
