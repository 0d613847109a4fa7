"""The RabbitMQ Stream session as a sans-I/O state machine over a real engine: bytes in, bytes out."""

import dataclasses
import struct
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rstream import schema
from rstream.encoding import decode_frame, encode_frame, encode_publish

from riverbed.engine import core
from riverbed.engine.log import INLINE_MAX_BYTES
from riverbed.shells import auth
from riverbed.shells import rmq_stream as rs
from riverbed.shells.broker import tail

from .conftest import Harness, split_out


def close_code(frames):
    closes = [f for f in frames if isinstance(f, schema.Close)]
    assert closes, frames
    return closes[-1].code


def deliveries(frames):
    return [f for f in frames if isinstance(f, schema.Deliver)]


def after_the_tarpit(h, c):
    """The frames of a refusal RabbitMQ holds for its tarpit delay (SILENT_CLOSE_DELAY, 3 s): nothing
    comes and the socket stays open until the delay has passed; then the answer, and the socket closes."""
    assert c.frames() == [] and not c.io.closed
    h.now += rs.AUTH_FAILURE_DELAY - 0.1
    c.s.tick(h.now)
    assert c.frames() == [] and not c.io.closed
    c.send(schema.Heartbeat())                  # the peer's frames meanwhile are ignored
    h.now += 0.2
    c.s.tick(h.now)
    fs = c.frames()
    assert c.io.closed, fs
    return fs


def messages(frames):
    out = []
    for d in deliveries(frames):
        out.extend((d.chunk_first_offset + i, m) for i, m in enumerate(d.get_messages()))
    return out


# ------------------------------------------------------------------------------------------- handshake

def test_handshake_advertises_the_address_the_client_used(h):
    h.shell.listen_port = 5599
    c = h.connect()
    props = c.handshake()
    assert props == {"advertised_host": "127.0.0.1", "advertised_port": "5599"}
    assert c.s.state == rs.ST_OPEN and c.s.heartbeat == 60 and c.s.frame_max == 1048576


def test_heartbeat_right_after_open_like_rstream(h):
    c = h.connect()
    c.request(schema.PeerProperties(1, []), schema.PeerPropertiesResponse)
    c.send(schema.SaslAuthenticate(2, "PLAIN", b"\0guest\0guest"))
    c.frames()
    c.send_raw(encode_frame(schema.Tune(1048576, 5)) + encode_frame(schema.Open(3, "/")) +
               encode_frame(schema.Heartbeat()))
    r = c.one(schema.OpenResponse)
    assert r.response_code == rs.RC_OK and c.s.heartbeat == 5 and not c.io.closed


def test_wrong_password_is_refused_after_the_tarpit_and_closed(h):
    c = h.connect()
    c.send(schema.SaslAuthenticate(1, "PLAIN", b"\0guest\0nope"))
    [r] = after_the_tarpit(h, c)
    assert isinstance(r, schema.SaslAuthenticateResponse) and r.response_code == rs.RC_AUTHENTICATION_FAILURE


def test_wrong_password_without_a_tarpit(tmp_path):
    h = Harness(tmp_path, auth_failure_delay=0)
    try:
        c = h.connect()
        c.send(schema.SaslAuthenticate(1, "PLAIN", b"\0guest\0nope"))
        r = c.one(schema.SaslAuthenticateResponse)
        assert r.response_code == rs.RC_AUTHENTICATION_FAILURE and c.io.closed
    finally:
        h.close()


def test_guest_only_from_loopback(h):
    c = h.connect(loopback=False)
    c.send(schema.SaslAuthenticate(1, "PLAIN", b"\0guest\0guest"))
    assert c.one().response_code == rs.RC_SASL_AUTHENTICATION_FAILURE_LOOPBACK and c.io.closed


def test_unknown_mechanism_keeps_the_connection(h):
    c = h.connect()
    c.send(schema.SaslAuthenticate(1, "EXTERNAL", b""))
    assert c.one().response_code == rs.RC_SASL_MECHANISM_NOT_SUPPORTED and not c.io.closed
    c.send(schema.SaslAuthenticate(2, "PLAIN", b"garbage"))
    assert c.frames()[0].response_code == rs.RC_SASL_ERROR and c.io.closed


def test_anonymous_when_enabled(tmp_path):
    h = Harness(tmp_path, auth=auth.Authenticator(anonymous=True))
    try:
        c = h.connect()
        r = c.request(schema.SaslHandshake(1), schema.SaslHandshakeResponse)
        assert r.mechanisms == ["PLAIN", "ANONYMOUS"]
        c.send(schema.SaslAuthenticate(2, "ANONYMOUS", b""))
        fs = c.frames()
        assert fs[0].response_code == rs.RC_OK and isinstance(fs[1], schema.Tune)
    finally:
        h.close()


@pytest.mark.parametrize("raw,code", [
    (struct.pack(">IHH", 4, 0x0063, 1), rs.RC_UNKNOWN_FRAME),               # unknown key
    (struct.pack(">IHHI", 8, rs.CMD_PEER_PROPERTIES, 9, 1), rs.RC_UNKNOWN_FRAME),   # unknown version
    (struct.pack(">IH", 2, 0x11), rs.RC_UNKNOWN_FRAME),                     # no room for key + version
    (struct.pack(">I", 10_000_000) + b"x" * 100, rs.RC_FRAME_TOO_LARGE),    # 10 MB frame before auth
    (b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", rs.RC_FRAME_TOO_LARGE),          # garbage
    (struct.pack(">IHHIH", 8, rs.CMD_CREATE, 1, 1, 0), rs.RC_ACCESS_REFUSED),   # command before auth
    (struct.pack(">IHHI", 8, rs.CMD_PEER_PROPERTIES, 1, 1), rs.RC_UNKNOWN_FRAME),  # truncated body
])
def test_bad_input_before_auth_gets_close_with_a_code(h, raw, code):
    c = h.connect()
    c.send_raw(raw)
    fs = c.frames()
    assert close_code(fs) == code and c.io.closed
    c.send_raw(b"more garbage after close")      # ignored, no crash
    assert c.frames() == []


def test_unknown_key_after_open_gets_close(conn):
    conn.send_raw(struct.pack(">IHHI", 8, 0x0040, 1, 5))
    assert close_code(conn.frames()) == rs.RC_UNKNOWN_FRAME and conn.io.closed


def test_frame_split_across_reads_and_many_per_read(conn):
    frames = b"".join(encode_frame(schema.Heartbeat()) for _ in range(3)) + \
        encode_frame(schema.Metadata(7, ["nope"]))
    for i in range(len(frames)):
        conn.send_raw(frames[i:i + 1])
    r = conn.one(schema.MetadataResponse)
    assert r.correlation_id == 7 and r.metadata[0].response_code == rs.RC_STREAM_DOES_NOT_EXIST


def test_truncated_frame_then_handshake_timeout(h):
    c = h.connect()
    c.send_raw(struct.pack(">I", 100) + b"\x00\x11\x00\x01")
    assert c.frames() == [] and not c.io.closed
    h.now += rs.DEFAULT_HANDSHAKE_TIMEOUT + 1
    c.s.tick(h.now)
    assert c.io.closed


def test_frame_over_frame_max_after_open_but_publish_may_exceed_it(h):
    c = h.connect()
    c.handshake(frame_max=4096)
    assert c.create("s") == rs.RC_OK and c.declare(1, "s") == rs.RC_OK
    c.publish(1, [(i, b"x" * 1000) for i in range(1, 21)])       # ~20 KB Publish frame
    r = c.one(schema.PublishConfirm)
    assert len(r.publishing_ids) == 20
    c.send(schema.Metadata(9, ["x" * 5000]))
    assert close_code(c.frames()) == rs.RC_FRAME_TOO_LARGE


def test_client_close(conn):
    r = conn.request(schema.Close(5, 1, "bye"), schema.CloseResponse)
    assert r.response_code == rs.RC_OK and conn.io.closed


def test_shutdown_closes_the_socket_without_a_close_frame(conn, h):
    # RabbitMQ's terminate/3 -> close/3: the socket is shut down, no Close frame (session.py's docstring)
    assert conn.create("s") == rs.RC_OK and conn.declare(1, "s") == rs.RC_OK
    conn.publish(1, [(1, b"a"), (2, b"b")])
    h.settle()
    conn.s.close_gracefully("shutdown")
    fs = conn.frames()
    assert conn.io.closed
    assert [type(f) for f in fs] == [schema.PublishConfirm], fs     # the confirms went out, then nothing


def test_closed_by_the_management_api_without_a_close_frame(conn, h):
    assert conn.subscribe(1, "nope")                # anything in flight
    conn.s.close_by_admin("Closed via management plugin")
    assert conn.io.closed
    assert not [f for f in conn.frames() if isinstance(f, schema.Close)]


# ---------------------------------------------------------------------------------------- heartbeats

def test_heartbeats_both_ways(h):
    c = h.connect()
    c.handshake(heartbeat=2)
    h.now += 2.1
    c.s.tick(h.now)
    assert isinstance(c.one(), schema.Heartbeat)
    c.send(schema.Heartbeat())                       # the client is alive
    h.now += 3.9
    c.s.tick(h.now)
    assert not c.io.closed
    h.now += 0.2                                    # > 2 intervals of silence
    c.s.tick(h.now)
    assert c.io.closed


# -------------------------------------------------------------------------------------------- admin

def test_create_delete_and_metadata(conn, h):
    assert conn.create("s", {"x-max-length-bytes": "1000000", "x-max-age": "7D"}) == rs.RC_OK
    assert conn.create("s") == rs.RC_STREAM_ALREADY_EXISTS
    assert conn.create("bad", {"x-max-age": "forever"}) == rs.RC_PRECONDITION_FAILED
    assert conn.create("") == rs.RC_PRECONDITION_FAILED
    r = conn.request(schema.Metadata(3, ["s", "nope"]), schema.MetadataResponse)
    assert [(m.name, m.response_code, m.leader_ref) for m in r.metadata] == [("s", 1, 0), ("nope", 2, 0xFFFF)]
    assert r.brokers[0].host == "127.0.0.1"
    r = conn.request(schema.Delete(4, "s"), schema.DeleteResponse)
    assert r.response_code == rs.RC_OK and not h.eng.has_stream("s")
    assert conn.request(schema.Delete(5, "s"), schema.DeleteResponse).response_code == rs.RC_STREAM_DOES_NOT_EXIST


def test_stream_stats_and_resolve_offset_spec(conn):
    conn.create("s")
    conn.declare(1, "s")
    conn.publish(1, [(1, b"a"), (2, b"b")])
    conn.frames()
    conn.publish(1, [(3, b"c")])
    conn.frames()
    conn.send_raw(struct.pack(">IHHI", 4 + 4 + 3, rs.CMD_STREAM_STATS, 1, 11) + rs.enc_string("s"))
    f = conn.raw_frames()[0]
    key, _, corr, code, n = struct.unpack_from(">HHIHi", f)
    r = rs.Reader(f, 14)
    stats = {r.string(): r.i64() for _ in range(n)}
    assert (key, corr, code) == (0x801C, 11, 1)
    assert stats == {"first_chunk_id": 0, "committed_chunk_id": 2, "last_chunk_id": 2}
    body = struct.pack(">I", 12) + rs.enc_string("s") + struct.pack(">H", rs.OFFSET_TYPE_LAST) + rs.enc_properties({})
    conn.send_raw(rs.frame(rs.CMD_RESOLVE_OFFSET_SPEC, body))
    f = conn.raw_frames()[0]
    assert struct.unpack_from(">HHIHHQ", f) == (0x801F, 1, 12, 1, 4, 2)


# --------------------------------------------------------------------------------------- publishing

def test_publish_confirm_after_commit(conn, h):
    conn.create("s")
    assert conn.declare(1, "s") == rs.RC_OK
    assert conn.declare(1, "s") == rs.RC_PRECONDITION_FAILED        # id taken
    assert conn.declare(2, "nope") == rs.RC_STREAM_DOES_NOT_EXIST
    conn.publish(1, [(i, b"m%d" % i) for i in range(1, 101)])
    r = conn.one(schema.PublishConfirm)
    assert r.publisher_id == 1 and r.publishing_ids == list(range(1, 101))
    assert [rec for _, rec in h.eng.scan("s")] == [b"m%d" % i for i in range(1, 101)]


def test_confirms_of_one_delivery_merge_into_one_frame_per_publisher(conn, h):
    conn.create("s")
    conn.create("t")
    assert conn.declare(1, "s") == rs.RC_OK and conn.declare(2, "t") == rs.RC_OK
    frames = [encode_publish(schema.Publish(p, [schema.Message(i, None, b"m%d" % i) for i in ids]), 1)
              for p, ids in ((1, [1, 2]), (2, [7]), (1, [3]), (1, [4, 5, 6]))]
    conn.io.writes = 0
    conn.send_raw(b"".join(frames))        # four Publish frames, completed in one loop turn
    raw = conn.raw_frames()
    assert len(raw) == 2 and conn.io.writes == 1
    confirms = [decode_frame(f, 1) for f in raw]
    assert [(c.publisher_id, c.publishing_ids) for c in confirms] == [(1, [1, 2, 3, 4, 5, 6]), (2, [7])]
    assert [rec for _, rec in h.eng.scan("s")] == [b"m%d" % i for i in range(1, 7)]


def test_merged_confirm_stays_within_the_clients_frame_max(tmp_path):
    h = Harness(tmp_path)
    try:
        c = h.connect()
        c.handshake(frame_max=8192)               # at most (8192 - 13) // 8 = 1022 ids per confirm
        c.create("s")
        c.declare(1, "s")
        c.send_raw(b"".join(encode_publish(schema.Publish(1, [schema.Message(b * 600 + i, None, b"x")
                                                               for i in range(600)]), 1) for b in range(3)))
        confirms = [decode_frame(f, 1) for f in c.raw_frames()]
        assert len(confirms) >= 2 and all(len(x.publishing_ids) <= 1022 for x in confirms)
        assert sorted(i for x in confirms for i in x.publishing_ids) == list(range(1800))
    finally:
        h.close()


def test_publish_errors(conn, h):
    conn.create("s")
    conn.publish(9, [(1, b"x"), (2, b"y")])
    r = conn.one(schema.PublishError)
    assert [(e.publishing_id, e.response_code) for e in r.errors] == [(1, 0x12), (2, 0x12)]
    conn.declare(1, "s")
    other = h.connect()
    other.handshake()
    assert other.request(schema.Delete(1, "s"), schema.DeleteResponse).response_code == rs.RC_OK
    fs = conn.frames()
    assert isinstance(fs[0], schema.MetadataUpdate) and fs[0].metadata_info.stream == "s"
    conn.publish(1, [(3, b"z")])
    r = conn.one(schema.PublishError)
    assert [(e.publishing_id, e.response_code) for e in r.errors] == [(3, rs.RC_STREAM_DOES_NOT_EXIST)]
    assert conn.request(schema.DeletePublisher(4, 1), schema.DeletePublisherResponse).response_code == rs.RC_OK
    assert conn.request(schema.DeletePublisher(5, 1), schema.DeletePublisherResponse).response_code == 0x12


def test_dedup_across_reconnect(h):
    a = h.connect()
    a.handshake()
    a.create("s")
    assert a.declare(0, "s", ref="app-1") == rs.RC_OK
    a.publish(0, [(i, b"%d" % i) for i in range(1, 6)])
    a.one(schema.PublishConfirm)
    a.s.connection_lost()
    b = h.connect()
    b.handshake()
    assert b.declare(0, "s", ref="app-1") == rs.RC_OK
    r = b.request(schema.QueryPublisherSequence(3, "app-1", "s"), schema.QueryPublisherSequenceResponse)
    assert r.sequence == 5
    b.publish(0, [(i, b"%d" % i) for i in range(3, 9)])
    r = b.one(schema.PublishConfirm)
    assert r.publishing_ids == [3, 4, 5, 6, 7, 8]             # duplicates are confirmed too
    assert [rec for _, rec in h.eng.scan("s")] == [b"%d" % i for i in range(1, 9)]


def test_query_publisher_sequence_waits_for_in_flight_appends(conn, h):
    conn.create("s")
    conn.declare(0, "s", ref="p")
    conn.publish(0, [(7, b"x")])
    conn.send(schema.QueryPublisherSequence(9, "p", "s"))       # no settle in between
    fs = conn.frames()
    assert [f.sequence for f in fs if isinstance(f, schema.QueryPublisherSequenceResponse)] == [7]


def test_unsupported_sub_batch_gets_publish_error_others_are_stored(conn, h):
    conn.create("s")
    conn.declare(1, "s")
    inner = core.encode_entries([b"a", b"b"])
    good = struct.pack(">QBHII", 1, 0x80, 2, len(inner), len(inner)) + inner
    bad = struct.pack(">QBHII", 2, 0x80 | 6 << 4, 2, len(inner), len(inner)) + inner
    simple = struct.pack(">QI", 3, 1) + b"c"
    body = struct.pack(">Bi", 1, 3) + good + bad + simple
    conn.send_raw(rs.frame(rs.CMD_PUBLISH, body))
    fs = conn.frames()
    err = [f for f in fs if isinstance(f, schema.PublishError)][0]
    ok = [f for f in fs if isinstance(f, schema.PublishConfirm)][0]
    assert [(e.publishing_id, e.response_code) for e in err.errors] == [(2, rs.RC_PRECONDITION_FAILED)]
    assert ok.publishing_ids == [1, 3]
    assert [rec for _, rec in h.eng.scan("s")] == [b"a", b"b", b"c"]


def test_publish_flow_control_pauses_reading(conn, h, monkeypatch):
    conn.s.limits = dataclasses.replace(conn.s.limits, max_pending_bytes=1000)
    conn.create("s")
    conn.declare(1, "s")
    # over INLINE_MAX_BYTES: the writer thread commits it, so it is in flight until the loop settles (a
    # small one is committed before data_received returns, and nothing is left pending)
    conn.publish(1, [(1, b"x" * (INLINE_MAX_BYTES + 1))])
    assert not conn.io.reading
    h.settle()
    assert conn.io.reading


def test_one_message_frame_is_committed_and_confirmed_within_the_read(conn, h):
    # fsync=never and an idle writer: the commit runs in data_received and its confirm goes out in the
    # same write, with no completion left for the loop to deliver
    conn.create("s")
    conn.declare(1, "s")
    conn.io.writes = 0
    conn.publish(1, [(5, b"one")])
    assert conn.io.writes == 1 and h.q.empty() and not h.broker._inbox
    (f,) = split_out(conn.io.out)
    r = decode_frame(f, 1)
    assert isinstance(r, schema.PublishConfirm) and r.publishing_ids == [5]
    assert [rec for _, rec in h.eng.scan("s")] == [b"one"]          # a confirm means stored


def test_one_message_frame_waits_its_turn_behind_completions_not_yet_delivered(conn, h):
    conn.create("s")
    conn.declare(1, "s", ref="p")
    writer = h.eng._writer
    with writer._claim:                 # the writer is busy: the first frame goes to its queue
        conn.publish(1, [(1, b"a")])
        assert split_out(conn.io.out) == []
    deadline = time.monotonic() + 10
    while writer._outstanding and time.monotonic() < deadline:
        time.sleep(0.001)
    # committed, its completion queued for the loop: the next frame must not be confirmed before it
    conn.publish(1, [(2, b"b")])
    assert split_out(conn.io.out) == []
    confirmed = [i for f in conn.frames() for i in f.publishing_ids]
    assert confirmed == [1, 2]
    assert [rec for _, rec in h.eng.scan("s")] == [b"a", b"b"]
    assert h.eng.query_publisher_sequence("s", "p") == 2


# ---------------------------------------------------------------------------------------- consuming

def fill(conn, stream, chunks, per_chunk=3, start=1):
    """Publish ``chunks`` separate commits (one chunk each)."""
    conn.declare(200, stream)
    n = start
    for _ in range(chunks):
        conn.publish(200, [(n + i, b"r%d" % (n + i - 1)) for i in range(per_chunk)])
        conn.frames()
        n += per_chunk
    conn.request(schema.DeletePublisher(conn.next_corr(), 200), schema.DeletePublisherResponse)


def test_subscribe_first_with_credit_one_chunk_per_credit(conn, h):
    conn.create("s")
    fill(conn, "s", 4)
    fs = conn.subscribe(1, "s", credit=2)
    assert fs[0].response_code == rs.RC_OK
    ds = deliveries(fs)
    assert [d.chunk_first_offset for d in ds] == [0, 3]
    conn.send(schema.Credit(1, 1))
    assert [d.chunk_first_offset for d in deliveries(conn.frames())] == [6]
    conn.send(schema.Credit(1, 5))
    assert [d.chunk_first_offset for d in deliveries(conn.frames())] == [9]
    # tail: a new chunk is delivered when committed
    conn.declare(3, "s")
    conn.publish(3, [(1, b"new")])
    fs = conn.frames()
    assert messages(fs) == [(12, b"new")]


@pytest.mark.parametrize("otype,offset,first_chunk", [(2, None, 9), (4, 7, 6), (4, 0, 0), (4, 1000, None)])
def test_subscribe_offset_types(conn, otype, offset, first_chunk):
    conn.create("s")
    fill(conn, "s", 4)
    ds = deliveries(conn.subscribe(1, "s", offset_type=otype, offset=offset))
    assert (ds[0].chunk_first_offset if ds else None) == first_chunk


def test_subscribe_next_gets_only_new(conn):
    conn.create("s")
    fill(conn, "s", 2)
    assert deliveries(conn.subscribe(1, "s", offset_type=3)) == []
    conn.declare(1, "s")
    conn.publish(1, [(1, b"later")])
    assert messages(conn.frames()) == [(6, b"later")]


def test_subscribe_timestamp(conn, h):
    conn.create("s")
    fill(conn, "s", 1)
    time.sleep(0.01)
    ts = int(time.time() * 1000)
    time.sleep(0.01)
    fill(conn, "s", 1, start=4)
    ds = deliveries(conn.subscribe(1, "s", offset_type=5, offset=ts))
    assert [d.chunk_first_offset for d in ds] == [3]


def test_subscription_errors_and_credit_to_unknown(conn):
    conn.create("s")
    assert conn.subscribe(1, "nope")[0].response_code == rs.RC_STREAM_DOES_NOT_EXIST
    assert conn.subscribe(1, "s")[0].response_code == rs.RC_OK
    assert conn.subscribe(1, "s")[0].response_code == rs.RC_SUBSCRIPTION_ID_ALREADY_EXISTS
    assert conn.subscribe(2, "s", props={"single-active-consumer": "true"})[0].response_code == \
        rs.RC_PRECONDITION_FAILED
    conn.send(schema.Credit(9, 1))
    r = conn.one(schema.CreditResponse)
    assert (r.response_code, r.subscription_id) == (rs.RC_SUBSCRIPTION_ID_DOES_NOT_EXIST, 9)
    assert conn.request(schema.Unsubscribe(5, 1), schema.UnsubscribeResponse).response_code == rs.RC_OK
    assert conn.request(schema.Unsubscribe(6, 1), schema.UnsubscribeResponse).response_code == 0x04


def test_filtering_skips_chunks_without_a_match(conn):
    conn.create("s")
    conn.declare(1, "s")
    conn.publish(1, [(1, "red", b"r1"), (2, "red", b"r2")], version=2)
    conn.frames()
    conn.publish(1, [(3, "blue", b"b1")], version=2)
    conn.frames()
    conn.publish(1, [(4, b"plain")])
    conn.frames()
    assert messages(conn.subscribe(1, "s", props={"filter.0": "blue", "match-unfiltered": "false"})) == [(2, b"b1")]
    assert messages(conn.subscribe(2, "s", props={"filter.0": "blue", "match-unfiltered": "true"})) == \
        [(2, b"b1"), (3, b"plain")]
    assert len(messages(conn.subscribe(3, "s"))) == 4


def test_deliver_v2_after_exchange_command_versions(conn):
    conn.create("s")
    fill(conn, "s", 1)
    r = conn.request(schema.ExchangeCommandVersionRequest(
        4, [schema.FrameHandlerInfo(rs.CMD_DELIVER, 1, 2)]), schema.ExchangeCommandVersionResponse)
    assert r.command_versions[1].max_version == 2
    conn.send(schema.Subscribe(9, 2, "s", schema.OffsetSpec.from_params(1, None), 1, []))
    fs = conn.raw_frames()
    deliver = [f for f in fs if struct.unpack_from(">H", f)[0] == rs.CMD_DELIVER][0]
    key, ver, sub, committed = struct.unpack_from(">HHBQ", deliver)
    assert (key, ver, sub, committed) == (8, 2, 2, 0)
    assert core.chunk_records(deliver[13:]) == [b"r0", b"r1", b"r2"]


def test_pause_writing_stops_delivery_until_resumed(conn):
    conn.create("s")
    fill(conn, "s", 3)
    conn.s.pause_writing()
    assert not conn.io.reading
    assert deliveries(conn.subscribe(1, "s", credit=10)) == []
    conn.s.resume_writing()
    assert conn.io.reading
    assert len(deliveries(conn.frames())) == 3


def test_deliver_budget_yields_to_other_connections(conn, monkeypatch):
    monkeypatch.setattr(tail, "DELIVER_BUDGET", 2)
    conn.create("s")
    fill(conn, "s", 5)
    assert len(deliveries(conn.subscribe(1, "s", credit=10))) == 2
    assert len(conn.io.deferred) == 1
    fn, args = conn.io.deferred.pop()
    fn(*args)
    assert len(deliveries(conn.frames())) == 2


# ------------------------------------------------------------------------------------------ offsets

def test_store_and_query_offset(conn):
    conn.create("s")
    r = conn.request(schema.QueryOffset(1, "app", "s"), schema.QueryOffsetResponse)
    assert r.response_code == rs.RC_NO_OFFSET
    conn.send(schema.StoreOffset("app", "s", 42))
    conn.send(schema.QueryOffset(2, "app", "s"))            # read-your-writes without settling first
    r = conn.one(schema.QueryOffsetResponse)
    assert (r.response_code, r.offset) == (rs.RC_OK, 42)
    r = conn.request(schema.QueryOffset(3, "app", "nope"), schema.QueryOffsetResponse)
    assert r.response_code == rs.RC_STREAM_DOES_NOT_EXIST
    conn.send(schema.StoreOffset("", "s", 1))                 # bad reference: dropped, no reply
    assert conn.frames() == []


# ------------------------------------------------------------------------------ single active consumer

def answer_update(c, offset_type=1):
    fs = c.frames()
    ups = [f for f in fs if isinstance(f, schema.ConsumerUpdateResponse)]
    assert len(ups) == 1 and ups[0].active == 1, fs
    c.send(schema.ConsumerUpdateServerResponse(ups[0].correlation_id, 1,
                                               schema.OffsetSpecification(offset_type, 0)))
    return ups[0]


def test_single_active_consumer_failover(h):
    a, b = h.connect(), h.connect()
    a.handshake()
    b.handshake()
    a.create("s")
    fill(a, "s", 2)
    props = {"single-active-consumer": "true", "name": "group"}
    a.send(schema.Subscribe(1, 0, "s", schema.OffsetSpec.from_params(1, None), 10,
                            [schema.Property(k, v) for k, v in props.items()]))
    up = answer_update(a)           # the first member is activated; nothing delivered before the answer
    assert up.subscription_id == 0
    assert len(deliveries(a.frames())) == 2
    fs = b.subscribe(5, "s", props=props)
    assert fs[0].response_code == rs.RC_OK and len(fs) == 1         # waiting: no update, no delivery
    b.send(schema.Credit(5, 1))
    assert b.one(schema.CreditResponse).response_code == rs.RC_PRECONDITION_FAILED
    a.s.connection_lost()            # the active consumer goes away
    up = answer_update(b, offset_type=4)   # rstream answers with the u64 offset always; OFFSET 0
    assert up.subscription_id == 5
    assert [d.chunk_first_offset for d in deliveries(b.frames())] == [0, 3]


# --------------------------------------------------------------------------------------- super streams

def test_super_stream_lifecycle(conn, h, tmp_path):
    r = conn.request(schema.CreateSuperStream(1, "orders", ["orders-eu", "orders-us"], ["eu", "us"], []),
                     schema.CreateSuperStreamResponse)
    assert r.response_code == rs.RC_OK and h.eng.has_stream("orders-eu") and h.eng.has_stream("orders-us")
    r = conn.request(schema.CreateSuperStream(2, "orders", ["orders-x"], ["x"], []), schema.CreateSuperStreamResponse)
    assert r.response_code == rs.RC_STREAM_ALREADY_EXISTS
    r = conn.request(schema.SuperStreamPartitions(3, "orders"), schema.SuperStreamPartitionsResponse)
    assert r.streams == ["orders-eu", "orders-us"]
    r = conn.request(schema.SuperStreamRoute(4, "us", "orders"), schema.SuperStreamRouteResponse)
    assert (r.response_code, r.streams) == (rs.RC_OK, ["orders-us"])
    r = conn.request(schema.SuperStreamRoute(5, "asia", "orders"), schema.SuperStreamRouteResponse)
    assert (r.response_code, r.streams) == (rs.RC_OK, [])
    r = conn.request(schema.SuperStreamPartitions(6, "nope"), schema.SuperStreamPartitionsResponse)
    assert r.response_code == rs.RC_STREAM_DOES_NOT_EXIST
    # kept in the engine's LMDB environment, committed with the partitions
    assert h.eng.super_stream("orders")["binding_keys"] == ["eu", "us"]
    r = conn.request(schema.DeleteSuperStream(7, "orders"), schema.DeleteSuperStreamResponse)
    assert r.response_code == rs.RC_OK and not h.eng.has_stream("orders-eu")
    r = conn.request(schema.DeleteSuperStream(8, "orders"), schema.DeleteSuperStreamResponse)
    assert r.response_code == rs.RC_STREAM_DOES_NOT_EXIST


def test_super_stream_with_an_existing_partition_is_refused(conn, h):
    conn.create("o-1")
    r = conn.request(schema.CreateSuperStream(1, "o", ["o-0", "o-1"], ["0", "1"], []), schema.CreateSuperStreamResponse)
    assert r.response_code == rs.RC_STREAM_ALREADY_EXISTS and not h.eng.has_stream("o-0")
    r = conn.request(schema.CreateSuperStream(2, "o", ["o-0", "o-2"], ["0"], []), schema.CreateSuperStreamResponse)
    assert r.response_code == rs.RC_PRECONDITION_FAILED


# ------------------------------------------------------------------------------------------ permissions

def test_permissions_from_a_users_file(tmp_path):
    users = tmp_path / "users.toml"
    auth.add_user(str(users), "alice", "secret", configure="^alice-", write="^alice-", read="^alice-|^shared$")
    h = Harness(tmp_path, auth=auth.Authenticator(str(users)))
    try:
        c = h.connect(loopback=False)
        c.handshake("alice", "secret")
        assert c.create("alice-1") == rs.RC_OK
        assert c.create("bob-1") == rs.RC_ACCESS_REFUSED
        h.eng.create_stream("shared").result()
        assert c.declare(1, "shared") == rs.RC_ACCESS_REFUSED
        assert c.subscribe(1, "shared")[0].response_code == rs.RC_OK
        h.eng.create_stream("bob-2").result()
        assert c.subscribe(2, "bob-2")[0].response_code == rs.RC_ACCESS_REFUSED
        guest = h.connect()
        guest.send(schema.SaslAuthenticate(1, "PLAIN", b"\0guest\0guest"))
        [r] = after_the_tarpit(h, guest)
        assert r.response_code == rs.RC_AUTHENTICATION_FAILURE      # no built-in guest with a file
    finally:
        h.close()


def test_open_unknown_vhost(h):
    c = h.connect()
    c.send(schema.SaslAuthenticate(1, "PLAIN", b"\0guest\0guest"))
    c.frames()
    c.send(schema.Open(2, "/other"))
    [r] = after_the_tarpit(h, c)
    assert isinstance(r, schema.OpenResponse) and r.response_code == rs.RC_VIRTUAL_HOST_ACCESS_FAILURE


def test_reauthentication_after_open(conn):
    conn.send(schema.SaslAuthenticate(10, "PLAIN", b"\0guest\0guest"))
    assert conn.one().response_code == rs.RC_OK and not conn.io.closed


@pytest.mark.parametrize("mechanism, creds, code", [
    ("PLAIN", b"\0guest\0nope", rs.RC_AUTHENTICATION_FAILURE),
    ("AMQPLAIN", b"", rs.RC_SASL_CANNOT_CHANGE_MECHANISM),
])
def test_failed_reauthentication_ends_the_connection_after_the_tarpit(conn, h, mechanism, creds, code):
    conn.send(schema.SaslAuthenticate(10, mechanism, creds))
    [r] = after_the_tarpit(h, conn)
    assert r.response_code == code


def test_reauthentication_as_another_user_ends_the_connection(tmp_path):
    users = tmp_path / "users.toml"
    auth.add_user(str(users), "alice", "secret")
    auth.add_user(str(users), "bob", "other")
    h = Harness(tmp_path, auth=auth.Authenticator(str(users)))
    try:
        c = h.connect()
        c.handshake("alice", "secret")
        c.send(schema.SaslAuthenticate(10, "PLAIN", b"\0bob\0other"))
        [r] = after_the_tarpit(h, c)
        assert r.response_code == rs.RC_SASL_CANNOT_CHANGE_USERNAME
    finally:
        h.close()


def test_single_active_consumer_spreads_super_stream_partitions(h):
    a, b = h.connect(), h.connect()
    a.handshake()
    b.handshake()
    r = a.request(schema.CreateSuperStream(1, "inv", ["inv-0", "inv-1"], ["0", "1"], []),
                  schema.CreateSuperStreamResponse)
    assert r.response_code == rs.RC_OK

    def sub(c, sub_id, part):
        props = {"single-active-consumer": "true", "name": "app", "super-stream": "inv"}
        c.send(schema.Subscribe(c.next_corr(), sub_id, part, schema.OffsetSpec.from_params(1, None), 10,
                                [schema.Property(k, v) for k, v in props.items()]))

    def updates(c):
        return [f for f in c.frames() if isinstance(f, schema.ConsumerUpdateResponse)]

    def answer(c, up):
        c.send(schema.ConsumerUpdateServerResponse(up.correlation_id, 1, schema.OffsetSpecification(3, 0)))

    sub(a, 0, "inv-0")
    sub(a, 1, "inv-1")
    ups = updates(a)
    assert [(u.subscription_id, u.active) for u in ups] == [(0, 1), (1, 1)]     # alone: active on both
    for u in ups:
        answer(a, u)
    sub(b, 0, "inv-0")
    sub(b, 1, "inv-1")
    assert updates(b) == []                      # B waits until A has stepped down on partition 1
    ups = updates(a)
    assert [(u.subscription_id, u.active) for u in ups] == [(1, 0)]
    answer(a, ups[0])
    ups = updates(b)
    assert [(u.subscription_id, u.active) for u in ups] == [(1, 1)]          # partition 1 -> B
    answer(b, ups[0])
    a.s.connection_lost()
    ups = updates(b)
    assert [(u.subscription_id, u.active) for u in ups] == [(0, 1)]          # A gone: B takes partition 0


def test_a_step_down_never_answered_does_not_leave_the_partition_without_a_consumer(h):
    # rstream 0.20 with a named super stream consumer leaves some ConsumerUpdate(inactive) unanswered;
    # the partition must still get an active consumer (the one that should have it) after the timeout
    a, b = h.connect(), h.connect()
    a.handshake()
    b.handshake()
    a.request(schema.CreateSuperStream(1, "sd", ["sd-0", "sd-1"], ["0", "1"], []), schema.CreateSuperStreamResponse)
    props = [schema.Property(k, v) for k, v in
             {"single-active-consumer": "true", "name": "app", "super-stream": "sd"}.items()]

    def updates(c):
        return [f for f in c.frames() if isinstance(f, schema.ConsumerUpdateResponse)]

    a.send(schema.Subscribe(a.next_corr(), 1, "sd-1", schema.OffsetSpec.from_params(1, None), 10, props))
    up = updates(a)[0]
    a.send(schema.ConsumerUpdateServerResponse(up.correlation_id, 1, schema.OffsetSpecification(3, 0)))
    b.send(schema.Subscribe(b.next_corr(), 1, "sd-1", schema.OffsetSpec.from_params(1, None), 10, props))
    assert [(u.subscription_id, u.active) for u in updates(a)] == [(1, 0)]     # A told to step down...
    assert updates(b) == []                                                    # ...and never answers
    h.now += rs.SAC_STEP_DOWN_TIMEOUT - 0.5
    a.s.tick(h.now)
    assert updates(b) == []
    h.now += 1.0
    a.s.tick(h.now)
    assert [(u.subscription_id, u.active) for u in updates(b)] == [(1, 1)]     # B takes partition 1


# ------------------------------------------------------------------------------------------- fuzzing

_KEYS = list(rs.COMMANDS) + [0x0008, 0x0003, 0x7FFF, 0xFFFF]


@st.composite
def frames_or_noise(draw):
    """Plausible frames (real keys and versions, random bodies, sometimes lying sizes) or raw noise."""
    if draw(st.booleans()):
        return draw(st.binary(max_size=300))
    key = draw(st.sampled_from(_KEYS))
    version = draw(st.sampled_from([1, 1, 1, 2, 0, 9]))
    body = draw(st.binary(max_size=200))
    size = len(body) + 4 + draw(st.sampled_from([0, 0, 0, -1, 1, 5000]))
    return struct.pack(">IHH", max(size, 0), key, version) + body


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(chunks=st.lists(frames_or_noise(), min_size=1, max_size=8), authenticated=st.booleans())
def test_arbitrary_input_never_raises(tmp_path_factory, chunks, authenticated):
    h = Harness(tmp_path_factory.mktemp("fuzz"))
    try:
        c = h.connect()
        if authenticated:
            c.handshake()
            c.create("s")
            c.declare(1, "s")
        for data in chunks:
            c.send_raw(data)
        h.settle()
        h.now += 100
        c.s.tick(h.now)
        out = split_out(c.io.out)
        assert not c.io.out                       # only whole frames were written
        for f in out:
            key = struct.unpack_from(">H", f)[0]
            assert key in (rs.CMD_CLOSE,) or key & rs.RESPONSE or key in (
                rs.CMD_TUNE, rs.CMD_HEARTBEAT, rs.CMD_DELIVER, rs.CMD_PUBLISH_CONFIRM, rs.CMD_PUBLISH_ERROR,
                rs.CMD_METADATA_UPDATE, rs.CMD_CONSUMER_UPDATE)
    finally:
        h.close()
