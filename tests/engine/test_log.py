"""The engine over real LMDB files: streams, appends, seeks, retention, dedup, tracking, waiting."""

import asyncio
import subprocess
import sys
import threading

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from riverbed.engine import (
    Engine, InvalidArgument, OffsetSpec, StreamExists, StreamNotFound, core, parse_max_age,
)
from riverbed.engine.format import COMPRESSION_GZIP, gzip_compress


class FakeClock:
    """Milliseconds since the epoch, moved by the test."""

    def __init__(self, now=1_700_000_000_000):
        self.now = now

    def __call__(self):
        return self.now


@pytest.fixture
def clock():
    return FakeClock()


@pytest.fixture
def eng(tmp_path, clock):
    e = Engine(tmp_path / "data", fsync="never", retention_interval=0, clock=clock)
    yield e
    e.close()


def rec(i, size=100):
    return i.to_bytes(8, "big") + bytes([i & 0xFF]) * (size - 8)


# ------------------------------------------------------------------------------------------ streams


def test_streams_are_created_listed_deleted_and_survive_restart(tmp_path):
    with Engine(tmp_path / "d") as e:
        e.create_stream("orders", {"x-max-length-bytes": "1000000", "x-max-age": "7D"}).result()
        e.create_stream("clicks").result()
        e.append("orders", [b"a", b"b"]).result()
        assert e.list_streams() == ["clicks", "orders"]
        with pytest.raises(StreamExists):
            e.create_stream("orders").result()
        e.delete_stream("clicks").result()
        with pytest.raises(StreamNotFound):
            e.delete_stream("clicks").result()
    with Engine(tmp_path / "d") as e:
        assert e.list_streams() == ["orders"]
        info = e.stream_info("orders")
        assert info.arguments == {"max-length-bytes": "1000000", "max-age": "7D"}
        assert (info.records, info.next_offset, info.first_chunk_id) == (2, 2, 0)
        assert [r for _, r in e.scan("orders")] == [b"a", b"b"]


def test_deleted_stream_name_can_be_reused_with_fresh_offsets(eng):
    eng.create_stream("s").result()
    eng.append("s", [b"old"] * 3).result()
    eng.store_offset("s", "c", 2).result()
    eng.delete_stream("s").result()
    eng.create_stream("s").result()
    assert eng.stream_info("s").next_offset == 0
    assert eng.query_offset("s", "c") is None
    assert list(eng.scan("s")) == []
    eng.append("s", [b"new"]).result()
    assert list(eng.scan("s")) == [(0, b"new")]


@pytest.mark.parametrize("args", [
    {"x-max-age": "7 days"}, {"max-length-bytes": "-1"}, {"x-stream-filter-size-bytes": "8"},
    {"x-bogus": "1"},
])
def test_bad_stream_arguments_are_refused(eng, args):
    with pytest.raises(InvalidArgument):
        eng.create_stream("s", args)


def test_bad_stream_names_are_refused(eng):
    for name in ("", "x" * 256):
        with pytest.raises(InvalidArgument):
            eng.create_stream(name)


def test_max_age_units():
    assert parse_max_age("7D") == 7 * 86400_000
    assert parse_max_age("12h") == 12 * 3600_000
    assert parse_max_age("30m") == 30 * 60_000
    assert parse_max_age("10s") == 10_000
    with pytest.raises(InvalidArgument):
        parse_max_age("7d")


def test_unknown_stream_errors(eng):
    with pytest.raises(StreamNotFound):
        eng.append("nope", [b"x"]).result()
    with pytest.raises(StreamNotFound):
        eng.stream_info("nope")
    with pytest.raises(StreamNotFound):
        eng.read_chunks("nope", 0)


# ------------------------------------------------------------------------------------ append & read


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(batches=st.lists(st.lists(st.binary(max_size=300), min_size=1, max_size=60), min_size=1, max_size=12),
       start=st.integers(min_value=0, max_value=800), chunk_max=st.integers(min_value=64, max_value=5000))
def test_append_and_read_at_arbitrary_offsets(tmp_path_factory, batches, start, chunk_max):
    with Engine(tmp_path_factory.mktemp("h"), fsync="never", retention_interval=0) as e:
        e.create_stream("s", {"chunk-max-bytes": str(chunk_max)}).result()
        futs = [e.append("s", b) for b in batches]
        results = [f.result() for f in futs]
        flat = [r for b in batches for r in b]
        # offsets are contiguous across appends, in submission order
        expect = 0
        for b, res in zip(batches, results):
            assert (res.first_offset, res.last_offset) == (expect, expect + len(b) - 1)
            expect += len(b)
        assert list(e.scan("s", start)) == [(i, r) for i, r in enumerate(flat) if i >= start]
        chunks = e.read_chunks("s", start, 10**6)
        if start < len(flat):
            first_id, first = chunks[0]
            n = core.read_header(first)[3]
            assert first_id <= start < first_id + n
        else:
            assert chunks == []
        for chunk_id, raw in chunks:
            h = core.check_chunk(raw)
            assert h[6] == chunk_id
            assert len(raw) - 48 - h[10] <= max(chunk_max, max(map(len, flat), default=0) + 4)
        info = e.stream_info("s")
        assert info.records == len(flat) and info.next_offset == len(flat)


def test_concurrent_appends_share_group_commits(eng):
    eng.create_stream("s").result()
    n_threads, per_thread = 4, 200
    results = [[] for _ in range(n_threads)]

    def work(k):
        futs = [eng.append("s", [rec(k * 1000 + i, 20)]) for i in range(per_thread)]
        results[k] = [f.result() for f in futs]

    threads = [threading.Thread(target=work, args=(k,)) for k in range(n_threads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    offsets = sorted(r.first_offset for rs in results for r in rs)
    assert offsets == list(range(n_threads * per_thread))
    info = eng.stream_info("s")
    assert info.records == n_threads * per_thread
    assert info.chunks < n_threads * per_thread, "appends that met in one transaction share a chunk"


def test_small_append_with_a_callback_commits_on_the_callers_thread_when_the_writer_is_idle(eng):
    eng.create_stream("s").result()
    seen = []
    assert eng.append("s", [rec(1)], on_done=lambda res, exc: seen.append(
        (res.first_offset, exc, threading.get_ident()))) is None
    assert seen == [(0, None, threading.get_ident())]           # done before append returned
    assert eng.committed_chunk_id("s") == 0


def test_callback_appends_from_many_threads_keep_each_threads_order(eng):
    # inline commits (caller's thread) and queued ones (writer thread) interleave; none may overtake
    # an append queued before it by the same thread
    eng.create_stream("s").result()
    n_threads, per_thread = 4, 300
    got = [[] for _ in range(n_threads)]
    threads_seen = set()

    def work(k):
        done = threading.Event()

        def cb(res, exc, i):
            assert exc is None
            got[k].append((i, res.first_offset))
            threads_seen.add(threading.get_ident())
            if i == per_thread - 1:
                done.set()
        for i in range(per_thread):
            eng.append("s", [rec(k * 1000 + i, 20)], on_done=lambda r, e, i=i: cb(r, e, i))
        assert done.wait(10)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(n_threads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for k in range(n_threads):
        assert [i for i, _ in got[k]] == list(range(per_thread))
        offsets = [o for _, o in got[k]]
        assert offsets == sorted(offsets)
        assert [r[:8] for o, r in eng.scan("s") if o in set(offsets)] == \
            [rec(k * 1000 + i, 20)[:8] for i in range(per_thread)]
    assert eng.stream_info("s").records == n_threads * per_thread


def test_callback_append_with_fsync_batch_goes_through_the_writer_thread(tmp_path):
    with Engine(tmp_path / "d", fsync="batch", retention_interval=0) as e:
        e.create_stream("s").result()
        seen = threading.Event()
        where = []
        e.append("s", [rec(1)], on_done=lambda res, exc: (where.append(threading.get_ident()), seen.set()))
        assert seen.wait(5) and where != [threading.get_ident()]


def test_big_callback_append_goes_to_the_writer_thread_even_when_it_is_idle(eng):
    from riverbed.engine.log import INLINE_MAX_BYTES
    eng.create_stream("s").result()
    seen = threading.Event()
    where = []
    big = [rec(i, 1000) for i in range(INLINE_MAX_BYTES // 1000 + 1)]
    assert eng.append("s", big, on_done=lambda res, exc: (where.append(threading.get_ident()), seen.set())) is None
    assert seen.wait(5) and where != [threading.get_ident()]
    assert eng.stream_info("s").records == len(big)


def test_callback_append_to_a_missing_stream_reports_the_error(eng):
    seen = []
    eng.append("nope", [rec(1)], on_done=lambda res, exc: seen.append(type(exc).__name__))
    eng.sync().result()
    assert seen == ["StreamNotFound"]


def test_sub_batch_entries_count_their_records(eng):
    eng.create_stream("s").result()
    plain = core.encode_sub_batch([b"a", b"b", b"c"])
    gz = core.encode_sub_batch([b"d", b"e"], COMPRESSION_GZIP, gzip_compress)
    data = plain + core.encode_entries([b"f"]) + gz
    res = eng.append_entries("s", data, publishing_ids=[1, 2, 3], publisher="p").result()
    assert (res.first_offset, res.last_offset) == (0, 5)
    assert [r for _, r in eng.scan("s")] == [b"a", b"b", b"c", b"f", b"d", b"e"]
    assert eng.stream_info("s").next_offset == 6


def test_malformed_entries_are_refused_without_harm(eng):
    eng.create_stream("s").result()
    with pytest.raises(Exception):
        eng.append_entries("s", b"\x00\x00\x00\x09abc").result()
    eng.append("s", [b"fine"]).result()
    assert list(eng.scan("s")) == [(0, b"fine")]


# ----------------------------------------------------------------------------------- offset specs


def test_offset_specs(eng, clock):
    eng.create_stream("s").result()
    assert eng.resolve("s", OffsetSpec.first()) == 0
    assert eng.resolve("s", OffsetSpec.next()) == 0
    for i in range(5):
        clock.now += 1000
        eng.append("s", [rec(i * 10 + j) for j in range(10)]).result()
    assert eng.resolve("s", OffsetSpec.first()) == 0
    assert eng.resolve("s", OffsetSpec.last()) == 40
    assert eng.resolve("s", OffsetSpec.next()) == 50
    assert eng.resolve("s", OffsetSpec.offset(17)) == 17
    assert eng.resolve("s", OffsetSpec.offset(500)) == 50
    assert eng.read_chunks("s", 17)[0][0] == 10


def test_timestamp_seek_finds_first_chunk_at_or_after(eng, clock):
    eng.create_stream("s").result()
    stamps = []
    for i in range(20):
        clock.now += 100
        stamps.append(clock.now)
        eng.append("s", [rec(i)] * 3).result()
    for i, ts in enumerate(stamps):
        assert eng.resolve("s", OffsetSpec.timestamp(ts)) == 3 * i
        assert eng.resolve("s", OffsetSpec.timestamp(ts - 50)) == 3 * i
    assert eng.resolve("s", OffsetSpec.timestamp(0)) == 0
    assert eng.resolve("s", OffsetSpec.timestamp(stamps[-1] + 1)) == 60


def test_chunk_timestamps_never_go_backwards(eng, clock):
    eng.create_stream("s").result()
    eng.append("s", [b"a"]).result()
    clock.now -= 10_000
    eng.append("s", [b"b"]).result()
    ts = [core.read_header(raw)[4] for _, raw in eng.read_chunks("s", 0, 10)]
    assert ts[0] == ts[1]


# -------------------------------------------------------------------------------------- retention


def test_retention_by_size_removes_whole_chunks_from_the_head(eng):
    eng.create_stream("s", {"max-length-bytes": "5000"}).result()
    for i in range(20):
        eng.append("s", [rec(i * 10 + j) for j in range(10)]).result()   # ~1.1 KB chunks
    eng.run_retention().result()
    info = eng.stream_info("s")
    assert info.bytes <= 5000 and info.chunks >= 1
    assert info.first_chunk_id % 10 == 0 and info.first_chunk_id > 0
    assert info.records == 200 - info.first_chunk_id
    # a read from a removed offset starts at the new first chunk
    assert eng.read_chunks("s", 0)[0][0] == info.first_chunk_id
    assert next(eng.scan("s", 0))[0] == info.first_chunk_id
    assert eng.resolve("s", OffsetSpec.offset(0)) == info.first_chunk_id
    assert eng.resolve("s", OffsetSpec.first()) == info.first_chunk_id
    assert eng.resolve("s", OffsetSpec.timestamp(0)) == info.first_chunk_id
    # appends go on at the right offset
    assert eng.append("s", [b"x"]).result().first_offset == 200


def test_retention_by_age_keeps_the_last_chunk(eng, clock):
    eng.create_stream("s", {"max-age": "10s"}).result()
    for i in range(5):
        eng.append("s", [rec(i)]).result()
        clock.now += 4000
    eng.run_retention().result()
    # chunks at t=0,4,8,12,16 s; now 20 s: the ones older than 10 s go
    assert eng.stream_info("s").first_chunk_id == 3
    clock.now += 3_600_000
    eng.run_retention().result()
    info = eng.stream_info("s")
    assert (info.first_chunk_id, info.chunks, info.records) == (4, 1, 1)


# --------------------------------------------------------------------------- dedup and tracking


def test_publisher_dedup_drops_ids_at_or_below_the_stored_sequence(eng):
    eng.create_stream("s").result()
    r1 = eng.append("s", [b"1", b"2", b"3"], publisher="p", publishing_ids=[1, 2, 3]).result()
    assert (r1.first_offset, r1.last_offset, r1.duplicates) == (0, 2, [])
    r2 = eng.append("s", [b"2", b"3", b"4"], publisher="p", publishing_ids=[2, 3, 4]).result()
    assert (r2.first_offset, r2.last_offset, r2.duplicates) == (3, 3, [2, 3])
    r3 = eng.append("s", [b"4"], publisher="p", publishing_ids=[4]).result()
    assert (r3.first_offset, r3.last_offset, r3.duplicates) == (-1, -1, [4])
    # another publisher and an anonymous one are independent
    eng.append("s", [b"x"], publisher="q", publishing_ids=[1]).result()
    eng.append("s", [b"y"], publishing_ids=[1]).result()
    assert eng.query_publisher_sequence("s", "p") == 4
    assert eng.query_publisher_sequence("s", "q") == 1
    assert eng.query_publisher_sequence("s", "nobody") == 0
    assert [r for _, r in eng.scan("s")] == [b"1", b"2", b"3", b"4", b"x", b"y"]


def test_dedup_within_one_group_commit(eng):
    eng.create_stream("s").result()
    futs = [eng.append("s", [b"%d" % i], publisher="p", publishing_ids=[i]) for i in (1, 2, 2, 3, 1)]
    dups = [f.result().duplicates for f in futs]
    assert dups == [[], [], [2], [], [1]]
    assert [r for _, r in eng.scan("s")] == [b"1", b"2", b"3"]


def test_dedup_survives_restart(tmp_path):
    with Engine(tmp_path / "d") as e:
        e.create_stream("s").result()
        e.append("s", [b"a", b"b"], publisher="p", publishing_ids=[10, 11]).result()
    with Engine(tmp_path / "d") as e:
        r = e.append("s", [b"b", b"c"], publisher="p", publishing_ids=[11, 12]).result()
        assert r.duplicates == [11]
        assert [x for _, x in e.scan("s")] == [b"a", b"b", b"c"]


def test_consumer_offsets(eng):
    eng.create_stream("s").result()
    assert eng.query_offset("s", "app") is None
    eng.store_offset("s", "app", 41).result()
    eng.store_offset("s", "app", 42).result()
    eng.store_offset("s", "other", 7).result()
    assert eng.query_offset("s", "app") == 42
    assert eng.query_offset("s", "other") == 7
    with pytest.raises(StreamNotFound):
        eng.store_offset("missing", "app", 1).result()


# ------------------------------------------------------------------------------------------ waiting


def test_tailing_reader_is_woken_by_commit_not_polling(eng):
    eng.create_stream("s").result()
    eng.append("s", [b"a"]).result()

    async def main():
        ready = eng.wait("s", 0)
        assert ready.done()
        fut = eng.wait("s", 1)
        await asyncio.sleep(0.05)
        assert not fut.done()
        eng.append("s", [b"b"])
        await asyncio.wait_for(fut, 5)
        gone = eng.wait("s", 5)
        eng.delete_stream("s")
        with pytest.raises(StreamNotFound):
            await asyncio.wait_for(gone, 5)

    asyncio.run(main())


def test_watch_callback_and_cancel(eng):
    eng.create_stream("s").result()
    seen = []
    cancel = eng.watch("s", 0, seen.append)
    cancel()
    eng.append("s", [b"a"]).result()
    assert seen == []
    eng.watch("s", 0, seen.append)
    assert seen == [None]


def test_an_idle_stream_keeps_no_waiter_list_and_one_name_string(eng):
    # issue 26 (10,000 streams): a woken or cancelled watch leaves nothing behind for its stream, and the
    # engine's name is the interned one every subscription and publisher shares
    name = "".join(["stream-", "interned"])     # built at run time: not a constant the compiler interned
    eng.create_stream(name).result()
    seen = []
    eng.watch(name, 0, seen.append)
    eng.append(name, [b"a"]).result()
    assert seen == [None]
    cancel = eng.watch(name, 1, seen.append)
    cancel()
    assert eng._waiters == {}
    assert next(n for n in eng._streams if n == name) is sys.intern("stream-interned")


def test_importing_the_engine_maps_no_compression_library():
    # cramjam alone maps ~3 MB into every broker; the codecs are imported on their first body
    code = ("import sys, riverbed.engine, riverbed.engine.format as f; "
            "assert not {'cramjam', 'lz4', 'zstandard'} & set(sys.modules), sorted(sys.modules); "
            "assert {f.COMPRESSION_LZ4, f.COMPRESSION_ZSTD, f.COMPRESSION_SNAPPY} <= set(f.SUB_BATCH_CODECS)")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_delete_listener_is_called(eng):
    eng.create_stream("s").result()
    names = []
    eng.add_delete_listener(names.append)
    eng.delete_stream("s").result()
    assert names == ["s"]


def test_closed_engine_refuses_writes(tmp_path):
    e = Engine(tmp_path / "d")
    e.create_stream("s").result()
    e.close()
    e.close()
    with pytest.raises(Exception):
        e.append("s", [b"x"]).result()


# ---------------------------------------------------------------------------------------- filters


def test_filter_values_build_a_bloom_that_skips_nonmatching_chunks(eng):
    eng.create_stream("s").result()
    eng.append("s", [b"a", b"b"], filter_values=[b"apple", b"banana"]).result()
    eng.append("s", [b"c"], filter_values=[b"cherry"]).result()
    eng.append("s", [b"d"]).result()
    chunks = eng.read_chunks("s", 0, 10)
    blooms = [raw[48:48 + raw[44]] for _, raw in chunks]
    assert [len(b) for b in blooms] == [16, 16, 0]
    assert core.bloom_match(blooms[0], [b"apple"], False)
    assert core.bloom_match(blooms[1], [b"cherry"], False)
    assert core.bloom_match(blooms[2], [b"apple"], True)
    assert not core.bloom_match(blooms[2], [b"apple"], False)


@pytest.mark.parametrize("how", ["records", "entries"])
def test_append_larger_than_a_chunk_is_split_at_entry_boundaries(eng, how):
    # rstream's send_batch sends 1.34 MB Publish frames: one append over chunk-max-bytes (~1 MiB)
    eng.create_stream("s").result()
    records = [rec(i, 1000) for i in range(3000)]
    if how == "records":
        res = eng.append("s", records).result()
    else:
        res = eng.append_entries("s", core.encode_entries(records), num_entries=3000, num_records=3000).result()
    assert (res.first_offset, res.last_offset) == (0, 2999)
    info = eng.stream_info("s")
    assert info.chunks == 3 and info.records == 3000
    assert [r for _, r in eng.scan("s")] == records
    for _, raw in eng.read_chunks("s", 0, 10):
        assert core.read_header(raw)[8] <= (1 << 20) - 1024


def test_more_than_65535_entries_are_split_over_chunks(eng):
    # NumEntries is a uint16
    eng.create_stream("s").result()
    records = [b"%d" % i for i in range(70000)]
    eng.append("s", records).result()
    assert [r for _, r in eng.scan("s")] == records
    assert all(core.read_header(raw)[2] <= 0xFFFF for _, raw in eng.read_chunks("s", 0, 10))
