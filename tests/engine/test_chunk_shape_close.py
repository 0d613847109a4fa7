"""The closing-chunk invariant (staged.CHUNK_BODY_RECORDS): after every commit, the last chunk of a stream
holds at most its chunk-max-records (1,000 by default; an entry that alone holds more excepted), so offset
spec LAST never delivers more than that, however the commit's appends came out.

The holes these tests close: a commit's appends are shaped assuming its last append to the stream closes
it, so the appends before it may store body-sized chunks (up to 8,192 records) at once. When that last
append then adds nothing (all duplicates, or it failed), or a trim or truncate in the same commit turned
the pending entries into a chunk, a body-sized chunk was the stream's last one."""

import itertools
import threading

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from riverbed.engine import Engine, OffsetSpec, core
from riverbed.engine.errors import ChunkError
from riverbed.engine.format import H_CHUNK_ID, H_RECORDS

LAST_MAX = 1000


def rec(i, size=40):
    return i.to_bytes(8, "big") + bytes([i & 0xFF]) * (size - 8)


def in_one_commit(eng, submit):
    """Call ``submit()`` (it queues operations and returns their futures) while the writer thread is held
    in a transact function, so all it queued is applied in the next commit. The futures, unresolved."""
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
    for f in futures:
        f.exception(10)      # wait for each; the caller looks at results and errors
    return futures


def chunk_records(eng, stream):
    """Records per chunk, in order, with every chunk's CRC and id checked."""
    out, offset = [], 0
    for chunk_id, raw in eng.read_chunks(stream, 0, 100_000):
        h = core.check_chunk(raw)
        assert h[H_CHUNK_ID] == chunk_id == offset
        out.append(h[H_RECORDS])
        offset += h[H_RECORDS]
    return out


def assert_closed(eng, stream, records):
    """The invariant: the last chunk holds at most LAST_MAX records, LAST reaches back no further, and
    the stream holds ``records`` in order."""
    shape = chunk_records(eng, stream)
    assert shape and shape[-1] <= LAST_MAX, shape
    nxt = eng.stream_info(stream).next_offset
    assert eng.resolve(stream, OffsetSpec.last()) >= nxt - LAST_MAX
    assert [r for _, r in eng.scan(stream)] == records


@pytest.fixture(scope="module")
def eng(tmp_path_factory):
    with Engine(tmp_path_factory.mktemp("close") / "d", fsync="never", retention_interval=0) as e:
        yield e


_names = itertools.count()


@pytest.fixture
def stream(eng):
    name = f"s{next(_names)}"
    eng.create_stream(name).result(10)
    return name


def sealed(eng, stream, first, n, ids=None):
    return eng.append_chunk(stream, core.encode_chunk_buffer([rec(first + i) for i in range(n)]), num_entries=n,
                            num_records=n, publishing_ids=ids, publisher="p" if ids is not None else None)


def ids_of(first, n):
    return list(range(first + 1, first + n + 1))


@pytest.mark.parametrize("n", [5000, 8192])
def test_a_body_chunk_then_an_all_duplicate_append_still_closes_small(eng, stream, n):
    # a chunk stored whole: 5,000 records, or the body bound itself
    sealed(eng, stream, 0, 10, ids_of(0, 10)).result(10)
    fresh, again = in_one_commit(eng, lambda: [sealed(eng, stream, 10, n, ids_of(10, n)),
                                               sealed(eng, stream, 0, 10, ids_of(0, 10))])
    assert (fresh.result().first_offset, fresh.result().last_offset) == (10, 10 + n - 1)
    assert sorted(again.result().duplicates) == ids_of(0, 10)
    assert_closed(eng, stream, [rec(i) for i in range(10 + n)])


def test_a_cut_in_place_append_then_duplicates_closes_small(eng, stream):
    n = 12_000
    fresh, again = in_one_commit(eng, lambda: [sealed(eng, stream, 0, n, ids_of(0, n)),
                                               sealed(eng, stream, 0, 5, ids_of(0, 5))])
    assert fresh.result().last_offset == n - 1 and len(again.result().duplicates) == 5
    assert_closed(eng, stream, [rec(i) for i in range(n)])


def test_a_failed_last_append_leaves_the_close_small(eng, stream):
    n = 5000
    fresh, bad = in_one_commit(eng, lambda: [
        sealed(eng, stream, 0, n),
        eng.append_entries(stream, b"\xff\x00\x01not entries")])
    assert fresh.result().last_offset == n - 1
    assert isinstance(bad.exception(), ChunkError)
    assert_closed(eng, stream, [rec(i) for i in range(n)])


@pytest.mark.parametrize("op", ["trim", "truncate"])
def test_a_trim_or_truncate_after_appends_in_the_same_commit_closes_small(eng, stream, op):
    n = 3000
    eng.append(stream, [rec(0)]).result(10)

    def submit():
        futures = [eng.append(stream, [rec(i)]) for i in range(1, n)]
        futures.append(eng.trim_head(stream, 0) if op == "trim" else eng.truncate(stream, n))
        return futures
    futures = in_one_commit(eng, submit)
    assert [f.result().last_offset for f in futures[:-1]] == list(range(1, n))
    assert_closed(eng, stream, [rec(i) for i in range(n)])


@pytest.mark.parametrize("n", [5000, 12_000])
def test_a_held_piece_is_stored_from_the_callers_buffer(eng, stream, monkeypatch, n):
    # held whole (5,000) or as the last piece of a cut (12,000): stored as views of the caller's buffer,
    # the copying chunk builder never runs for them
    sealed(eng, stream, 0, 1, ids_of(0, 1)).result(10)

    def no_copy(*args, **kwargs):
        raise AssertionError("a held piece was copied into a new chunk")
    monkeypatch.setattr(core, "build_chunk", no_copy)
    in_one_commit(eng, lambda: [sealed(eng, stream, 1, n, ids_of(1, n)), sealed(eng, stream, 0, 1, ids_of(0, 1))])
    monkeypatch.undo()
    assert_closed(eng, stream, [rec(i) for i in range(1 + n)])


def test_a_redone_transaction_stores_a_held_piece_unchanged(tmp_path):
    # a 1 MiB map: 600 records of 300 B, then a commit of a held 2,900-record chunk (cut at the close) that
    # overfills it; the writer grows the map and redoes the transaction from the same caller buffer, whose
    # bytes the first try put back
    with Engine(tmp_path / "d", fsync="never", retention_interval=0, map_size=1 << 20) as e:
        e.create_stream("s").result(10)
        records = [rec(i, 300) for i in range(3500)]
        e.append("s", records[:600], publishing_ids=list(range(1, 601)), publisher="p").result(10)
        assert e.env.info()["map_size"] == 1 << 20
        in_one_commit(e, lambda: [
            e.append_chunk("s", core.encode_chunk_buffer(records[600:]), num_entries=2900, num_records=2900,
                           publishing_ids=list(range(601, 3501)), publisher="p"),
            e.append("s", [records[0]], publishing_ids=[1], publisher="p")])
        assert e.env.info()["map_size"] > 1 << 20
        assert chunk_records(e, "s") == [600, 1900, 1000]
        assert_closed(e, "s", records)


# ----------------------------------------------------------------------------------- random commit shapes

SIZES = [1, 3, 999, 1000, 1001, 2500, 5000, 8192, 8193, 12_000]
OPS = st.one_of(
    st.tuples(st.just("sealed"), st.sampled_from(SIZES), st.booleans()),   # append_chunk, with ids or not
    st.tuples(st.just("small"), st.integers(1, 40), st.booleans()),         # append: merged into pending
    st.tuples(st.just("entries"), st.sampled_from(SIZES), st.booleans()),   # append_entries: unsealed
    st.tuples(st.just("dup"), st.integers(1, 50), st.just(True)),           # ids the publisher stored
    st.tuples(st.just("bad"), st.just(0), st.just(False)),                  # malformed: fails alone
    st.tuples(st.just("trim"), st.just(0), st.just(False)),                 # flushes pending mid-commit
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                 HealthCheck.too_slow])
@given(commits=st.lists(st.lists(OPS, min_size=1, max_size=6), min_size=1, max_size=3),
       size=st.sampled_from([12, 40, 300]))
def test_every_commit_closes_with_at_most_chunk_max_records(eng, commits, size):
    """Whatever mix of appends, duplicates, failures and trims a commit holds, its stream's last chunk
    keeps to the closing bound, and every record is there once, in order."""
    name = f"h{next(_names)}"
    eng.create_stream(name).result(10)
    stored = []             # the records the stream must hold
    last_id = 0             # publisher "p"'s highest stored id

    def submit(ops):
        nonlocal last_id
        futures = []
        for kind, n, with_ids in ops:
            first = len(stored)
            records = [rec(first + i, size) for i in range(n)]
            ids = None
            if kind == "dup":
                if last_id == 0:
                    continue
                n = min(n, last_id)
                ids = list(range(last_id - n + 1, last_id + 1))
                futures.append(eng.append(name, [rec(0, size)] * n, publishing_ids=ids, publisher="p"))
                continue
            if kind == "bad":
                futures.append(eng.append_entries(name, b"\xff\x00\x01not entries"))
                continue
            if kind == "trim":
                futures.append(eng.trim_head(name, 0))
                continue
            if with_ids:
                ids = list(range(last_id + 1, last_id + n + 1))
                last_id += n
            publisher = "p" if with_ids else None
            if kind == "sealed":
                futures.append(eng.append_chunk(name, core.encode_chunk_buffer(records), num_entries=n,
                                                num_records=n, publishing_ids=ids, publisher=publisher))
            elif kind == "small":
                futures.append(eng.append(name, records, publishing_ids=ids, publisher=publisher))
            else:
                futures.append(eng.append_entries(name, core.encode_entries(records), publishing_ids=ids,
                                                  publisher=publisher))
            stored.extend(records)
        return futures

    for ops in commits:
        before = len(stored)
        futures = in_one_commit(eng, lambda: submit(ops))
        offsets = [f.result() for f in futures if f.exception() is None and hasattr(f.result(), "first_offset")
                   and f.result().first_offset >= 0]
        # the confirms tile exactly what this commit stored
        got = sorted((r.first_offset, r.last_offset) for r in offsets)
        assert (got[0][0] if got else before) == before
        assert all(a[1] + 1 == b[0] for a, b in zip(got, got[1:]))
        assert (got[-1][1] + 1 if got else before) == len(stored)
        if stored:
            assert_closed(eng, name, stored)
