"""The chunk shape (issue 26, staged.CHUNK_BODY_RECORDS): the appends of one commit to a stream are stored in
chunks of up to CHUNK_BODY_RECORDS records (and the stream's bytes per chunk), except the commit's last chunk
of that stream, which holds at most the stream's chunk-max-records (1,000 by default). Offset spec LAST
delivers the last chunk, so it reaches back at most 1,000 records, while a reader from the start gets
thousands of records per chunk (clients pay per chunk). Offsets, confirms and dedup do not depend on it."""

import threading

import pytest

from riverbed.engine import Engine, OffsetSpec, core
from riverbed.engine.format import H_RECORDS
from riverbed.engine.writer import CHUNK_BODY_RECORDS

LAST_MAX = 1000


def rec(i, size=100):
    return i.to_bytes(8, "big") + bytes([i & 0xFF]) * (size - 8)


def shape(eng, stream):
    """Records per chunk, in order; every chunk's CRC checked."""
    return [core.check_chunk(raw)[H_RECORDS] for _, raw in eng.read_chunks(stream, 0, 10_000)]


def in_one_commit(eng, submit):
    """Call ``submit()`` (which queues appends and returns their futures) while the writer thread is held
    inside a transact function, so that everything it queued is applied in the next commit, together."""
    entered, release = threading.Event(), threading.Event()

    def hold(ctx):
        entered.set()
        release.wait(10)
    held = eng.transact(hold)
    assert entered.wait(10)
    try:
        futures = submit()
    finally:
        release.set()
    held.result(10)
    return [f.result(10) for f in futures]


@pytest.fixture
def eng(tmp_path):
    with Engine(tmp_path / "d", fsync="never", retention_interval=0) as e:
        e.create_stream("s").result()
        yield e


def test_frames_that_commit_together_keep_their_size_and_only_the_last_chunk_is_small(eng):
    frames = [[rec(k * 5000 + i) for i in range(5000)] for k in range(4)]
    results = in_one_commit(eng, lambda: [
        eng.append_chunk("s", core.encode_chunk_buffer(f), num_entries=5000, num_records=5000) for f in frames])
    # the confirms are the same whatever the chunks: each append's own offsets
    assert [(r.first_offset, r.last_offset) for r in results] == [(k * 5000, k * 5000 + 4999) for k in range(4)]
    # three frames stored whole, the closing one as a head and 1,000 (was: twenty chunks of 1,000)
    assert shape(eng, "s") == [5000, 5000, 5000, 4000, 1000]
    last = eng.resolve("s", OffsetSpec.last())
    assert last == 20_000 - LAST_MAX
    assert [r for _, r in eng.scan("s")] == [r for f in frames for r in f]


def test_small_appends_of_one_commit_merge_past_1000_and_close_with_at_most_1000(eng):
    n = 3000
    in_one_commit(eng, lambda: [eng.append("s", [rec(i)]) for i in range(n)])
    assert shape(eng, "s") == [n - LAST_MAX, LAST_MAX]
    assert eng.resolve("s", OffsetSpec.last()) == n - LAST_MAX
    # the next commit closes with its own small chunk
    eng.append("s", [rec(n)]).result()
    assert shape(eng, "s")[-1] == 1 and eng.resolve("s", OffsetSpec.last()) == n
    assert [r for _, r in eng.scan("s")] == [rec(i) for i in range(n + 1)]


def test_the_body_bound_caps_merged_appends(eng):
    n = CHUNK_BODY_RECORDS + 2500
    in_one_commit(eng, lambda: [eng.append("s", [rec(i, 20)]) for i in range(n)])
    assert shape(eng, "s") == [CHUNK_BODY_RECORDS, 1500, LAST_MAX]


def test_a_big_unsealed_append_closes_small_too(eng):
    eng.append_entries("s", core.encode_entries([rec(i) for i in range(4999)])).result()
    assert shape(eng, "s") == [3999, LAST_MAX]


def test_an_explicit_chunk_max_records_bounds_every_chunk(eng):
    eng.create_stream("t", {"chunk-max-records": "700"}).result()
    frames = [[rec(k * 2000 + i) for i in range(2000)] for k in range(2)]
    in_one_commit(eng, lambda: [
        eng.append_chunk("t", core.encode_chunk_buffer(f), num_entries=2000, num_records=2000) for f in frames])
    assert max(shape(eng, "t")) <= 700 and sum(shape(eng, "t")) == 4000


def test_dedup_and_confirms_are_per_id_whatever_the_chunks(eng):
    def frame(k):
        return core.encode_chunk_buffer([rec(k * 5000 + i) for i in range(5000)])

    def send(k):
        return eng.append_chunk("s", frame(k), num_entries=5000, num_records=5000,
                                publishing_ids=list(range(k * 5000 + 1, k * 5000 + 5001)), publisher="p")
    first = send(0).result(10)
    assert (first.first_offset, first.last_offset, first.duplicates) == (0, 4999, [])
    # a publisher that reconnects resends frame 0 (every id a duplicate), then sends frame 1, in one commit
    again, second = in_one_commit(eng, lambda: [send(0), send(1)])
    assert sorted(again.duplicates) == list(range(1, 5001))
    assert (second.first_offset, second.last_offset, second.duplicates) == (5000, 9999, [])
    assert shape(eng, "s") == [4000, LAST_MAX, 4000, LAST_MAX]
    assert [r for _, r in eng.scan("s")] == [rec(i) for i in range(10_000)]


def test_filtered_appends_split_at_the_close_keep_a_matching_bloom(eng):
    n = 2500
    in_one_commit(eng, lambda: [eng.append("s", [rec(i)], filter_values=[b"blue" if i % 2 else b"red"])
                                for i in range(n)])
    chunks = eng.read_chunks("s", 0, 100)
    assert [core.check_chunk(raw)[H_RECORDS] for _, raw in chunks] == [n - LAST_MAX, LAST_MAX]
    for _, raw in chunks:
        assert core.chunk_bloom_match(raw, [b"blue"], False) and core.chunk_bloom_match(raw, [b"red"], False)
