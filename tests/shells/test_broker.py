"""The protocol-neutral broker layer over a real engine: deletion notices, super streams, tails with
credit and with byte windows, read-your-writes and NEXT barriers. Engine completions are drained by the
test (the ``post`` queue of the harness) instead of an event loop."""

import pytest

from riverbed.engine import Engine, OffsetSpec, core
from riverbed.engine.errors import RiverbedError, StreamExists, StreamNotFound
from riverbed.shells.broker import MODE_WINDOW, Broker, Tail

from .harness import Loop


class Listener:
    """A session of some protocol: records what the broker tells it."""

    def __init__(self, log, name):
        self.log = log
        self.name = name

    def stream_deleted(self, stream):
        self.log.append((self.name, "deleted", stream))


@pytest.fixture
def lp(tmp_path):
    loop = Loop(tmp_path)
    loop.io = loop.new_io()       # Tails defer through it; settle() runs what they deferred
    yield loop
    loop.close()


def test_delete_is_answered_before_any_session_hears_of_it(lp):
    events = []
    for name in ("rmq", "bson"):
        lp.broker.register(Listener(events, name))
    lp.broker.create_stream("s", {}, lambda exc: events.append(("create", exc)))
    lp.settle()
    lp.broker.delete_stream("s", lambda exc: events.append(("answer", exc)))
    lp.settle()
    assert events[:2] == [("create", None), ("answer", None)]
    assert sorted(events[2:]) == [("bson", "deleted", "s"), ("rmq", "deleted", "s")]


def test_a_delete_made_elsewhere_is_heard_by_every_session(lp):
    events = []
    lp.broker.register(Listener(events, "ws"))
    lp.eng.create_stream("s").result()
    lp.eng.delete_stream("s").result()      # not through this broker (another process part, say)
    lp.settle()
    assert events == [("ws", "deleted", "s")]


def test_super_stream_lives_in_the_engine_and_delete_notifies_each_partition(lp):
    events = []
    lp.broker.register(Listener(events, "rmq"))
    lp.broker.create_super_stream("o", ["o-0", "o-1"], ["a", "b"], {}, lambda exc: events.append(("made", exc)))
    lp.settle()
    assert lp.broker.partitions("o") == ["o-0", "o-1"] and lp.broker.route("o", "b") == ["o-1"]
    assert lp.eng.super_stream("o")["binding_keys"] == ["a", "b"]
    lp.broker.create_super_stream("o", ["o-2"], ["c"], {}, lambda exc: events.append(("again", type(exc))))
    lp.settle()
    lp.broker.delete_super_stream("o", lambda exc: events.append(("gone", exc)))
    lp.settle()
    assert events == [("made", None), ("again", StreamExists), ("gone", None), ("rmq", "deleted", "o-0"),
                      ("rmq", "deleted", "o-1")]
    assert lp.broker.partitions("o") is None and not lp.eng.has_stream("o-0")


def test_legacy_super_stream_file_is_imported_once(tmp_path):
    data = tmp_path / "data"
    with Engine(data) as eng:
        for p in ("x-0", "x-1"):
            eng.create_stream(p).result()
    (data / "rmq-super-streams.json").write_text(
        '{"super_streams": {"x": {"partitions": ["x-0", "x-1"], "binding_keys": ["0", "1"], "arguments": {}}}}')
    with Engine(data) as eng:
        broker = Broker(eng, post=lambda fn, *a: fn(*a), data_dir=str(data))
        assert broker.partitions("x") == ["x-0", "x-1"]
    assert not (data / "rmq-super-streams.json").exists()
    assert (data / "rmq-super-streams.json.imported").exists()


def test_resolve_next_waits_for_appends_already_accepted(lp):
    lp.eng.create_stream("s").result()
    got = []
    lp.broker.append_records("s", [b"a"] * 10, lambda res, exc: got.append(("appended", res.last_offset)))
    lp.broker.resolve_after_writes("s", OffsetSpec.next(), lambda off, exc: got.append(("next", off)))
    lp.settle()
    assert got == [("appended", 9), ("next", 10)]


def chunk_records(raw):
    return core.chunk_records(raw)


def test_tail_in_credit_mode_delivers_one_chunk_per_credit(lp):
    lp.eng.create_stream("s").result()
    for i in range(5):
        lp.eng.append("s", [b"r%d" % i]).result()
    seen = []
    tail = Tail(lp.broker, "s", 0, lambda t, cid, raw, start: seen.append(cid) or 1, defer=lp.io.defer,
                credit=2)
    tail.start()
    lp.settle()
    assert seen == [0, 1]
    tail.grant(10)
    lp.settle()
    assert seen == [0, 1, 2, 3, 4]
    lp.eng.append("s", [b"live"]).result()     # the armed watch wakes it
    lp.settle()
    assert seen == [0, 1, 2, 3, 4, 5]


def test_tail_in_window_mode_pauses_above_high_and_resumes_at_low(lp):
    lp.eng.create_stream("s").result()
    for i in range(20):
        lp.eng.append("s", [b"x" * 1000]).result()
    seen = []

    def on_chunk(t, cid, raw, start):
        seen.append(cid)
        return 1000      # bytes sent
    tail = Tail(lp.broker, "s", 0, on_chunk, defer=lp.io.defer, mode=MODE_WINDOW, window_high=4000,
                window_low=2000)
    tail.start()
    lp.settle()
    assert len(seen) == 5                       # 5,000 > 4,000 unacknowledged: paused
    tail.ack(2000)                              # 3,000 outstanding: still above the low mark
    lp.settle()
    assert len(seen) == 5
    tail.ack(1000)                              # 2,000: resumes
    lp.settle()
    assert len(seen) == 8 and seen == list(range(8))


def test_tail_starting_inside_a_chunk_is_told_where(lp):
    lp.eng.create_stream("s").result()
    lp.eng.append("s", [b"a", b"b", b"c"]).result()
    starts = []
    tail = Tail(lp.broker, "s", 2, lambda t, cid, raw, start: starts.append((cid, start)) or 1,
                defer=lp.io.defer, credit=5)
    tail.start()
    lp.settle()
    assert starts == [(0, 2)]


def test_tail_hears_of_deletion(lp):
    lp.eng.create_stream("s").result()
    gone = []
    tail = Tail(lp.broker, "s", 0, lambda *a: 1, defer=lp.io.defer, credit=5, on_gone=gone.append)
    tail.start()
    lp.settle()
    lp.eng.delete_stream("s").result()
    lp.settle()
    assert len(gone) == 1 and isinstance(gone[0], StreamNotFound)


def test_offsets_read_back_what_was_just_stored(lp):
    lp.eng.create_stream("s").result()
    got = []
    lp.broker.store_offset("s", "app", 41)
    lp.broker.store_offset("s", "app", 42)
    lp.broker.query_offset("s", "app", lambda v, exc: got.append(v))    # before any commit was drained
    lp.settle()
    assert got == [42]
    lp.broker.delete_offset("s", "app", lambda exc: got.append(exc))
    lp.settle()
    lp.broker.query_offset("s", "app", lambda v, exc: got.append(v))
    assert got == [42, None, None]


# ---- one record format, through the broker layer -------------------------------------------------------

def _published_records():
    """(what a shell or client publishes, what every reader must get back) for each kind of payload."""
    import json

    import bson
    from bson.binary import Binary

    from riverbed.engine import record as rec
    doc = {"order": 7, "items": ["a", "b"], "paid": True}
    text = json.dumps(doc, separators=(",", ":"))
    return [
        # a WebSocket/REAM publish: JSON with a creation time and a header
        (rec.from_json_text(text, 1_700_000_000_123, {"pkey": "k1"}), "json", doc, doc, 1_700_000_000_123),
        # a BSON/TCP PUB
        (rec.from_bson(doc), "bson", doc, doc, None),
        # a ZeroMQ PUT: octet-stream, three frames, one empty, X- headers
        (rec.encode_record([b"\x00\x01", b"", b"tail"], rec.CT_OCTET, None, {"X-Kind": "bin"}), "bytes",
         {"base64": "AAF0YWls"}, {"data": Binary(b"\x00\x01tail")}, None),
        # RabbitMQ Stream raw bodies, stored as sent: a JSON object, a BSON document, plain bytes
        (text.encode(), "json", doc, doc, None),
        (bson.encode(doc), "bson", doc, doc, None),
        (b"\xffnot json", "bytes", {"base64": "/25vdCBqc29u"}, {"data": Binary(b"\xffnot json")}, None),
    ]


def test_a_record_of_each_content_type_reads_back_the_same_through_the_broker(lp):
    from riverbed.engine import record as rec
    cases = _published_records()
    lp.eng.create_stream("mixed").result()
    lp.broker.append_records("mixed", [c[0] for c in cases], lambda res, exc: None)
    lp.settle()
    got = []

    def on_chunk(t, chunk_id, raw, start):
        for i, body in enumerate(core.chunk_records(raw)):
            if chunk_id + i >= start:
                got.append((chunk_id + i, body))
        return 1
    tail = Tail(lp.broker, "mixed", 0, on_chunk, defer=lp.io.defer, credit=10)
    tail.start()
    lp.settle()
    assert [o for o, _ in got] == list(range(len(cases)))
    for (stored, kind, as_json, as_bson, ctime), (_, body) in zip(cases, got):
        assert body == stored                      # stored exactly as the shell or client gave it
        r = rec.decode_record(body)
        assert r.kind == kind, r
        assert rec.to_json_value(r) == as_json
        assert rec.to_bson_document(r) == as_bson
        assert r.creation_time == ctime
    zmq = rec.decode_record(got[2][1])
    assert zmq.sections == [b"\x00\x01", b"", b"tail"] and zmq.app_properties == {"X-Kind": "bin"}
    assert rec.decode_record(got[0][1]).app_properties == {"pkey": "k1"}


def test_ensure_stream_creates_once_and_calls_back_in_order(lp):
    got = []
    for i in range(3):
        lp.broker.ensure_stream("auto", lambda exc, i=i: got.append((i, exc, lp.broker.creating("auto"))))
    assert lp.broker.creating("auto") and got == []
    lp.settle()
    assert got == [(0, None, False), (1, None, False), (2, None, False)]
    lp.broker.ensure_stream("auto", lambda exc: got.append(("again", exc)))      # exists: at once
    assert got[-1] == ("again", None) and lp.eng.list_streams() == ["auto"]
    lp.broker.ensure_stream("", lambda exc: got.append(("bad", type(exc).__name__)))
    lp.settle()
    assert got[-1] == ("bad", "InvalidArgument")


def test_every_session_hears_of_a_new_stream_whoever_created_it(lp):
    heard = []

    class Waiting:
        def stream_created(self, name):
            heard.append(("session", name))

        def stream_deleted(self, name):
            pass
    lp.broker.register(Waiting())
    lp.broker.register(Listener([], "no-create-handler"))    # sessions without the method are skipped
    lp.broker.on_stream_created(lambda name: heard.append(("hook", name)))
    lp.eng.create_stream("made-elsewhere").result()           # not through this broker
    lp.broker.ensure_stream("made-here", lambda exc: None)
    lp.settle()
    assert heard == [("hook", "made-elsewhere"), ("session", "made-elsewhere"), ("hook", "made-here"),
                     ("session", "made-here")]


def _records_of(broker, stream):
    return [r for _, raw in broker.read_chunks(stream, 0, 100) for r in chunk_records(raw)]


def test_append_or_create_creates_once_and_keeps_call_order(lp):
    got = []
    for i in range(3):
        lp.broker.append_or_create("auto", [b"r%d" % i], lambda res, exc, i=i: got.append((i, exc)))
    assert lp.broker.creating("auto")          # the second and third queue behind the one creation
    lp.settle()
    lp.broker.append_or_create("auto", [b"r3"], lambda res, exc: got.append((3, exc)))   # exists: no creation
    assert not lp.broker.creating("auto")
    lp.settle()
    assert got == [(0, None), (1, None), (2, None), (3, None)] and lp.eng.list_streams() == ["auto"]
    assert _records_of(lp.broker, "auto") == [b"r0", b"r1", b"r2", b"r3"]
    lp.broker.append_or_create("", [b"x"], lambda res, exc: got.append(("bad", res, type(exc).__name__)))
    lp.settle()
    assert got[-1] == ("bad", None, "InvalidArgument")


def test_transact_commits_documents_and_records_together_or_not_at_all(lp):
    docs = lp.broker.docs
    lp.eng.create_stream("s").result()
    got = []

    def stage(ctx):
        docs.stage_put(ctx, "c", 1, {"n": 1})
        ctx.append("s", [b"a", b"b"])
        return "staged"
    # what the callback sees is what a client's confirm promises: both are stored
    lp.broker.transact(stage, lambda res, exc: got.append((res, exc, docs.get("c", 1), _records_of(lp.broker, "s"))))
    assert got == []                       # answered after the commit, on the loop (the test's post queue)
    lp.settle()
    assert got == [("staged", None, {"n": 1}, [b"a", b"b"])]

    def broken(ctx):
        docs.stage_put(ctx, "c", 2, {"n": 2})
        ctx.append("s", [b"lost"])
        raise ValueError("refused by the caller")
    lp.broker.transact(broken, lambda res, exc: got.append((res, repr(exc))))
    lp.settle()
    assert got[-1] == (None, "ValueError('refused by the caller')")
    assert docs.get("c", 2) is None and _records_of(lp.broker, "s") == [b"a", b"b"]
    assert docs.collection_info("c").count == 1

    lp.eng.close()                         # a closed engine's refusal reaches the callback too
    lp.broker.transact(stage, lambda res, exc: got.append((res, isinstance(exc, RiverbedError))))
    while not lp.q.empty():
        fn, args = lp.q.get_nowait()
        fn(*args)
    assert got[-1] == (None, True)


def test_two_brokers_on_two_engines_keep_separate_document_stores(tmp_path):
    a, b = Loop(tmp_path / "a"), Loop(tmp_path / "b")
    try:
        assert a.broker.docs is not b.broker.docs
        a.broker.docs.create_collection("c", ["n"]).result(10)
        a.broker.docs.put("c", 1, {"n": "from a"}).result(10)
        assert b.broker.docs.list_collections() == [] and b.broker.docs.get("c", 1) is None
        b.broker.docs.create_collection("c", [("n", True)]).result(10)     # same name, another spec: its own
        b.broker.docs.put("c", 1, {"n": "from b"}).result(10)
        a.broker.docs.drop_collection("c").result(10)
        assert a.broker.docs.list_collections() == [] and a.broker.docs.get("c", 1) is None
        assert b.broker.docs.get("c", 1) == {"n": "from b"}
        assert b.broker.docs.collection_info("c") == ("c", None, [("n", True)], 1)
        got = []
        b.broker.transact(lambda ctx: b.broker.docs.stage_put(ctx, "c", 2, {"n": "b2"}),
                          lambda res, exc: got.append((res, exc)))
        b.settle()
        assert got == [(2, None)] and a.broker.docs.get("c", 2) is None and b.broker.docs.count("c") == 2
    finally:
        a.close()
        b.close()


# ---- record-level reads (records.py): offset, timestamp by the one rule, decoded view ------------------

def test_record_tail_hands_batches_with_offsets_timestamps_and_views(lp):
    from riverbed.engine.record import CT_JSON, encode_record
    lp.eng.create_stream("s").result()
    stamped = encode_record(b'{"n":1}', CT_JSON, 1234)           # a creation-time: that is its timestamp
    plain = encode_record(b'{"n":2}', CT_JSON)                   # none: its chunk's timestamp
    lp.eng.append("s", [b"skipped", stamped, plain]).result()
    lp.eng.append("s", [b"raw"]).result()
    got = []

    def on_records(t, batch):
        got.extend((off, ts, view.payload, batch.chunk_timestamp) for off, ts, view in batch.records())
        return 1
    tail = Tail(lp.broker, "s", 1, on_records, defer=lp.io.defer, credit=5, records=True)
    tail.start()
    lp.settle()
    chunk_ts = got[1][3]
    assert chunk_ts > 1_700_000_000_000
    assert [(o, ts, p) for o, ts, p, _ in got] == [(1, 1234, b'{"n":1}'), (2, chunk_ts, b'{"n":2}'),
                                                   (3, got[2][3], b"raw")]
    assert tail.offset == 4


def test_record_tail_stops_inside_a_chunk_and_resumes_there(lp):
    lp.eng.create_stream("s").result()
    lp.eng.append("s", [b"a", b"b", b"c", b"d"]).result()
    got = []

    def on_records(t, batch):
        for off, raw in batch:
            got.append((off, raw))
            if off == 1:
                t.offset = 2       # the window filled up: the rest is read again later
                return 1000
        return 1
    tail = Tail(lp.broker, "s", 0, on_records, defer=lp.io.defer, mode=MODE_WINDOW, window_high=500,
                window_low=100, records=True)
    tail.start()
    lp.settle()
    assert got == [(0, b"a"), (1, b"b")]
    tail.ack(1000)
    lp.settle()
    assert got == [(0, b"a"), (1, b"b"), (2, b"c"), (3, b"d")]


def test_read_records_starts_inside_a_chunk_and_stops_at_the_bound(lp):
    lp.eng.create_stream("s").result()
    lp.eng.append("s", [b"a", b"b"]).result()
    lp.eng.append("s", [b"c"]).result()
    lp.eng.append("s", [b"d"]).result()
    batches, nxt = lp.broker.read_records("s", 1, 10, stop=3)
    assert [[(o, r) for o, r in b] for b in batches] == [[(1, b"b")], [(2, b"c")]] and nxt == 3
    assert [o for o, _, _ in lp.broker.scan_records("s", 1, 3, batch_chunks=1)] == [1, 2]
    assert lp.broker.read_records("s", 4, 10) == ([], 4)


def test_the_timestamp_rule_is_creation_time_else_the_chunks():
    from riverbed.engine.record import decode_record, encode_record
    from riverbed.shells.broker import record_timestamp
    assert record_timestamp(decode_record(encode_record(b"x", "text/plain", 7)), 99) == 7
    assert record_timestamp(decode_record(encode_record(b"x", "text/plain")), 99) == 99
    assert record_timestamp(decode_record(b"not amqp"), 99) == 99
