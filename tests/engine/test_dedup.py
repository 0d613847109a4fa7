"""Publisher deduplication in the engine (issue 19, item 1).

The rule (DESIGN.md, "A confirm means stored"): deduplication drops only a true duplicate, an id at or
below the highest id stored for that reference; a reference that stored nothing has seen nothing, so its
id 0 is new. QueryPublisherSequence still answers 0 for such a reference, as RabbitMQ does.

Every path of the writer that decides a duplicate is driven: ``append`` (a chunk sealed by the caller,
ids as a list), ``append`` with filter values and ``append_entries`` (the entry walk), sub-batch entries,
``append_chunk`` with the PublishingIds summary of ``publish_chunk`` (each twin of the shells' wire
parsers builds the chunk), several appends in one group commit (the staged sequence), after a restart
(the sequence cache is cold), and after a stream is deleted and created again. The hypothesis test
checks the rule itself over random publishes of several references on two streams, with restarts and
re-creations in between.
"""

import struct
import tempfile

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from riverbed.engine import Engine, PublishingIds, core


@pytest.fixture
def eng(tmp_path):
    e = Engine(tmp_path / "data", fsync="never", retention_interval=0)
    yield e
    e.close()


def records(e, stream):
    return [r for _, r in e.scan(stream)]


def publish_frame(entries, publisher_id=0):
    """A Publish v1 payload (key and version included) from ``[(id, entry bytes)]``."""
    return struct.pack(">HHBi", 2, 1, publisher_id, len(entries)) + b"".join(
        struct.pack(">Q", pid) + entry for pid, entry in entries)


def append_frame(e, wire_twin, stream, entries, publisher):
    """The broker's Publish v1 path: ``wire_twin.publish_chunk`` then ``append_chunk`` with the id summary."""
    _, count, chunk, ids, first, last, increasing, nrec, _ = wire_twin.publish_chunk(publish_frame(entries), False)
    return e.append_chunk(stream, chunk, num_entries=count, num_records=nrec, crc_done=False,
                          publishing_ids=PublishingIds(ids, first, last, increasing), publisher=publisher)


def simple(body):
    return struct.pack(">I", len(body)) + body


# ------------------------------------------------------------------------------------ each path

def test_unknown_reference_keeps_id_0_on_the_sealed_append(eng):
    eng.create_stream("s").result()
    assert eng.query_publisher_sequence("s", "ref-1") == 0
    r = eng.append("s", [b"m0", b"m1", b"m2"], publisher="ref-1", publishing_ids=[0, 1, 2]).result()
    assert (r.first_offset, r.last_offset, r.duplicates) == (0, 2, [])
    assert records(eng, "s") == [b"m0", b"m1", b"m2"]
    assert eng.query_publisher_sequence("s", "ref-1") == 2


def test_id_0_stored_once_then_a_duplicate(eng):
    eng.create_stream("s").result()
    assert eng.append("s", [b"a"], publisher="p", publishing_ids=[0]).result().duplicates == []
    r = eng.append("s", [b"again"], publisher="p", publishing_ids=[0]).result()
    assert (r.first_offset, r.last_offset, r.duplicates) == (-1, -1, [0])
    assert records(eng, "s") == [b"a"]
    assert eng.query_publisher_sequence("s", "p") == 0


def test_unknown_reference_keeps_id_0_with_filter_values(eng):
    eng.create_stream("s").result()
    r = eng.append("s", [b"a", b"b", b"c"], publisher="p", publishing_ids=[0, 0, 1],
                   filter_values=[b"eu", b"us", None]).result()
    assert r.duplicates == [0]
    assert records(eng, "s") == [b"a", b"c"]


def test_unknown_reference_keeps_id_0_on_append_entries_with_sub_batches(eng):
    eng.create_stream("s").result()
    data = core.encode_sub_batch([b"a", b"b", b"c"]) + simple(b"d") + core.encode_sub_batch([b"e"])
    r = eng.append_entries("s", data, publisher="p", publishing_ids=[0, 1, 2]).result()
    assert (r.first_offset, r.last_offset, r.duplicates) == (0, 4, [])
    r = eng.append_entries("s", core.encode_sub_batch([b"dup"]) + core.encode_sub_batch([b"f", b"g"]),
                           publisher="p", publishing_ids=[2, 3]).result()
    assert r.duplicates == [2]
    assert records(eng, "s") == [b"a", b"b", b"c", b"d", b"e", b"f", b"g"]


def test_unknown_reference_keeps_id_0_on_append_chunk(eng, wire_twin):
    """The Publish v1 fast path: the summary (first id 0, increasing) is fresh without a per-id walk."""
    eng.create_stream("s").result()
    r = append_frame(eng, wire_twin, "s", [(0, simple(b"a")), (1, core.encode_sub_batch([b"b", b"c"]))], "p").result()
    assert (r.first_offset, r.last_offset, r.duplicates) == (0, 2, [])
    r = append_frame(eng, wire_twin, "s", [(0, simple(b"x")), (1, simple(b"y")), (2, simple(b"z"))], "p").result()
    assert r.duplicates == [0, 1]
    assert records(eng, "s") == [b"a", b"b", b"c", b"z"]


def test_appends_in_one_group_commit_share_the_staged_sequence(tmp_path):
    """Queued behind a blocking transaction, so all of them commit together: the second id 0 sees the
    first one staged (not yet in LMDB or the cache)."""
    import threading
    with Engine(tmp_path / "d", fsync="never", retention_interval=0) as e:
        e.create_stream("s").result()
        gate = threading.Event()
        blocker = e.transact(lambda ctx: gate.wait(5))
        futs = [e.append("s", [b"%d" % i], publisher="p", publishing_ids=[i]) for i in (0, 0, 1, 0, 2)]
        gate.set()
        blocker.result()
        assert [f.result().duplicates for f in futs] == [[], [0], [], [0], []]
        assert records(e, "s") == [b"0", b"1", b"2"]


def test_after_a_restart_the_sequence_comes_from_lmdb(tmp_path):
    with Engine(tmp_path / "d", fsync="never") as e:
        e.create_stream("s").result()
        e.append("s", [b"k0", b"k1"], publisher="known", publishing_ids=[0, 1]).result()
        e.append("s", [b"z0"], publisher="zero", publishing_ids=[0]).result()
    with Engine(tmp_path / "d", fsync="never") as e:
        assert e.query_publisher_sequence("s", "known") == 1
        assert e.query_publisher_sequence("s", "zero") == 0
        assert e.query_publisher_sequence("s", "fresh") == 0
        assert e.append("s", [b"f0"], publisher="fresh", publishing_ids=[0]).result().duplicates == []
        assert e.append("s", [b"z0-dup"], publisher="zero", publishing_ids=[0]).result().duplicates == [0]
        assert e.append("s", [b"k1-dup", b"k2"], publisher="known", publishing_ids=[1, 2]).result().duplicates == [1]
        assert records(e, "s") == [b"k0", b"k1", b"z0", b"f0", b"k2"]


def test_a_recreated_stream_has_no_sequence(eng):
    eng.create_stream("s").result()
    eng.append("s", [b"old%d" % i for i in range(5)], publisher="p", publishing_ids=list(range(5))).result()
    eng.delete_stream("s").result()
    eng.create_stream("s").result()
    assert eng.query_publisher_sequence("s", "p") == 0
    r = eng.append("s", [b"new0", b"new1"], publisher="p", publishing_ids=[0, 1]).result()
    assert r.duplicates == []
    assert records(eng, "s") == [b"new0", b"new1"]


def test_largest_id_then_nothing_is_new(eng):
    eng.create_stream("s").result()
    top = (1 << 64) - 1
    assert eng.append("s", [b"top"], publisher="p", publishing_ids=[top]).result().duplicates == []
    assert eng.append("s", [b"0"], publisher="p", publishing_ids=[0]).result().duplicates == [0]
    assert eng.query_publisher_sequence("s", "p") == top


# ------------------------------------------------------------------------------------ the rule

STREAMS = ("s1", "s2")
REFS = ("a", "b", "c")
IDS = st.one_of(st.integers(0, 6), st.sampled_from([1 << 63, (1 << 64) - 1]))
PATHS = ("records", "filtered", "entries", "frame")

publish = st.tuples(st.just("publish"), st.sampled_from(STREAMS), st.sampled_from(REFS), st.sampled_from(PATHS),
                    st.lists(st.tuples(IDS, st.integers(0, 3)), min_size=1, max_size=5))
step = st.one_of(
    st.lists(publish, min_size=1, max_size=3),                      # submitted together: one group commit
    st.just([("restart",)]),
    st.tuples(st.just("recreate"), st.sampled_from(STREAMS)).map(lambda t: [t]),
)


def submit(e, wire_twin, op, tag):
    """Submit one publish; returns (future, the records of each entry in order, ids)."""
    _, stream, ref, path, entries = op
    ids = [i for i, _ in entries]
    if path in ("records", "filtered"):
        recs = [[b"%s.%d" % (tag, j)] for j in range(len(entries))]
        flat = [r[0] for r in recs]
        fv = [None if j % 2 else b"f%d" % j for j in range(len(entries))] if path == "filtered" else None
        return e.append(stream, flat, publisher=ref, publishing_ids=ids, filter_values=fv), recs, ids
    # a sub-batch of n records when n > 0, else a simple entry
    recs = [[b"%s.%d.%d" % (tag, j, k) for k in range(n)] if n else [b"%s.%d" % (tag, j)]
            for j, (_, n) in enumerate(entries)]
    encoded = [core.encode_sub_batch(r) if n else simple(r[0]) for r, (_, n) in zip(recs, entries)]
    if path == "entries":
        return e.append_entries(stream, b"".join(encoded), publisher=ref, publishing_ids=ids), recs, ids
    return append_frame(e, wire_twin, stream, list(zip(ids, encoded)), ref), recs, ids


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(steps=st.lists(step, min_size=1, max_size=8))
def test_kept_records_are_exactly_those_above_the_highest_stored_id(wire_twin, steps):
    highest = {}                          # (stream, ref) -> highest id stored; absent = stored nothing
    expected = {s: [] for s in STREAMS}
    with tempfile.TemporaryDirectory() as d:
        e = Engine(d, fsync="never", retention_interval=0)
        try:
            for s in STREAMS:
                e.create_stream(s).result()
            for n, ops in enumerate(steps):
                if ops[0][0] == "restart":
                    e.close()
                    e = Engine(d, fsync="never", retention_interval=0)
                    continue
                if ops[0][0] == "recreate":
                    s = ops[0][1]
                    e.delete_stream(s).result()
                    e.create_stream(s).result()
                    expected[s] = []
                    highest = {k: v for k, v in highest.items() if k[0] != s}
                    continue
                pending = [(op, *submit(e, wire_twin, op, b"%d.%d" % (n, m))) for m, op in enumerate(ops)]
                for op, fut, recs, ids in pending:
                    _, s, ref, _, _ = op
                    want_dups = []
                    for i, r in zip(ids, recs):
                        top = highest.get((s, ref))
                        if top is None or i > top:
                            highest[(s, ref)] = i
                            expected[s].extend(r)
                        else:
                            want_dups.append(i)
                    assert list(fut.result().duplicates) == want_dups, (op, highest)
            for s in STREAMS:
                assert records(e, s) == expected[s]
                for ref in REFS:
                    assert e.query_publisher_sequence(s, ref) == highest.get((s, ref), 0)
        finally:
            e.close()
