"""The Kafka session as a sans-I/O state machine over a real engine: version negotiation, bad input
(closes this connection only), topics as streams and super streams, Produce (CRC checked before
anything is stored), Fetch with long polling, ListOffsets, answers in request order."""

import pytest

from riverbed.shells.kafka import codec as C
from riverbed.shells.kafka.session import KafkaSession
from riverbed.shells.kafka.shell import KafkaShell

from .harness import Loop


class Harness(Loop):
    def __init__(self, tmp_path):
        super().__init__(tmp_path)
        self.timers = []
        self.shell = KafkaShell(self.broker, call_later=self._call_later)

    def _call_later(self, delay, fn):
        entry = [delay, fn]
        self.timers.append(entry)
        return lambda: entry.__setitem__(1, None)

    def fire_timers(self):
        timers, self.timers = self.timers, []
        for _, fn in timers:
            if fn is not None:
                fn()

    def connect(self):
        io = self.new_io()
        return Client(self, KafkaSession(self.shell, io, peer="test", local=("127.0.0.1", 9092),
                                         remote=("127.0.0.1", 5555), peer_loopback=True), io)


class Client:
    def __init__(self, h, s, io):
        self.h, self.s, self.io = h, s, io
        self.corr = 0

    def send(self, key, version, body, *, raw=None):
        self.corr += 1
        self.s.data_received(raw if raw is not None else C.encode_request(key, version, self.corr, "t", body))
        return self.corr

    def answers(self, key, version):
        self.h.settle()
        frames, used = C.split_frames(bytes(self.io.out))
        del self.io.out[:used]
        return [C.decode_response(key, version, bytes(f)) for f in frames]

    def call(self, key, version, body):
        corr = self.send(key, version, body)
        (got,) = self.answers(key, version)
        assert got[0] == corr
        return got[1]


@pytest.fixture
def h(tmp_path):
    harness = Harness(tmp_path)
    yield harness
    harness.eng.close()


def produce_body(topic, partition, batch, acks=-1):
    return {"transactional_id": None, "acks": acks, "timeout_ms": 1000,
            "topic_data": [{"name": topic, "partition_data": [{"index": partition, "records": batch}]}]}


def fetch_body(topic, partition, offset, max_wait=0, min_bytes=1):
    return {"max_wait_ms": max_wait, "min_bytes": min_bytes, "max_bytes": 1 << 20, "isolation_level": 0,
            "topics": [{"topic": topic, "partitions": [{"partition": partition, "fetch_offset": offset,
                                                         "partition_max_bytes": 1 << 20}]}],
            "forgotten_topics_data": []}


def create(c, name, n):
    return c.call(C.API_CREATE_TOPICS, 5, {"topics": [{"name": name, "num_partitions": n, "replication_factor": -1,
                                                       "assignments": [], "configs": []}], "timeout_ms": 1000})


def test_api_versions_advertises_exactly_what_is_served(h):
    c = h.connect()
    for v in (0, 3):
        res = c.call(C.API_API_VERSIONS, v, {"client_software_name": "x", "client_software_version": "1"})
        assert res["error_code"] == 0
        assert {k["api_key"]: (k["min_version"], k["max_version"]) for k in res["api_keys"]} == C.SERVED


def test_api_versions_above_the_range_answers_35_with_ranges(h):
    c = h.connect()
    corr = c.send(C.API_API_VERSIONS, 4, {"client_software_name": "x", "client_software_version": "1"})
    ((got_corr, res),) = c.answers(C.API_API_VERSIONS, 0)
    assert got_corr == corr and res["error_code"] == C.ERR_UNSUPPORTED_VERSION
    assert {k["api_key"] for k in res["api_keys"]} == set(C.SERVED)
    assert not c.io.closed


def test_unknown_api_key_and_unsupported_version_close_only_that_connection(h):
    a, b, d = h.connect(), h.connect(), h.connect()
    frame = bytearray(C.encode_request(C.API_METADATA, 1, 1, "x", {"topics": None}))
    frame[4:6] = (999).to_bytes(2, "big")
    a.s.data_received(bytes(frame))
    assert a.io.closed
    b.send(C.API_METADATA, 13, {"topics": None})        # Metadata 13 (a top-level error code): not served
    assert b.io.closed
    assert d.call(C.API_METADATA, 1, {"topics": None})["brokers"][0]["port"] == 9092
    assert not d.io.closed


def test_truncated_frames_wait_oversized_and_unparsable_close(h):
    c = h.connect()
    frame = C.encode_request(C.API_METADATA, 1, 1, "x", {"topics": None})
    for i in range(len(frame) - 1):
        c.s.data_received(frame[i:i + 1])
    assert not c.io.out and not c.io.closed
    c.s.data_received(frame[-1:])
    assert len(c.answers(C.API_METADATA, 1)) == 1
    c.s.data_received((h.broker.limits.max_frame_size + 1).to_bytes(4, "big"))
    assert c.io.closed
    d = h.connect()
    d.s.data_received(b"\x00\x00\x00\x0a" + C._HEAD.pack(3, 1, 1) + b"\x00\x05a")   # client id past the end
    assert d.io.closed


def test_topics_are_streams_and_super_streams(h):
    c = h.connect()
    assert create(c, "solo", 1)["topics"][0]["error_code"] == 0
    assert create(c, "multi", 3)["topics"][0]["error_code"] == 0
    assert create(c, "multi", 3)["topics"][0]["error_code"] == C.ERR_TOPIC_ALREADY_EXISTS
    assert h.broker.has_stream("solo") and h.broker.partitions("multi") == ["multi-0", "multi-1", "multi-2"]
    md = c.call(C.API_METADATA, 9, {"topics": None, "allow_auto_topic_creation": False})
    topics = {t["name"]: len(t["partitions"]) for t in md["topics"]}
    assert topics == {"solo": 1, "multi": 3}        # a super stream's partitions are not topics of their own
    md = c.call(C.API_METADATA, 9, {"topics": [{"name": "auto"}], "allow_auto_topic_creation": True})
    assert md["topics"][0]["error_code"] == 0 and h.broker.has_stream("auto")
    md = c.call(C.API_METADATA, 9, {"topics": [{"name": "nope"}], "allow_auto_topic_creation": False})
    assert md["topics"][0]["error_code"] == C.ERR_UNKNOWN_TOPIC_OR_PARTITION


def test_produce_fetch_round_trip_and_list_offsets(h):
    c = h.connect()
    create(c, "t", 2)
    batch = C.encode_batch(0, [(1000 + i, b"k%d" % i, b"v%d" % i, [("h", b"x")]) for i in range(5)],
                           compression=C.COMPRESSION_ZSTD)
    res = c.call(C.API_PRODUCE, 9, produce_body("t", 1, batch))
    part = res["responses"][0]["partition_responses"][0]
    assert (part["error_code"], part["base_offset"]) == (0, 0)
    res = c.call(C.API_PRODUCE, 9, produce_body("t", 1, C.encode_batch(0, [(2000, None, b"late", [])])))
    assert res["responses"][0]["partition_responses"][0]["base_offset"] == 5
    res = c.call(C.API_FETCH, 12, fetch_body("t", 1, 2))
    p = res["responses"][0]["partitions"][0]
    assert p["error_code"] == 0 and p["high_watermark"] == 6 and p["log_start_offset"] == 0
    got = [(b.base_offset, r) for b in C.decode_batches(p["records"], 1 << 20) for r in b.records]
    assert got[0] == (2, (1002, b"k2", b"v2", [("h", b"x")])) and got[-1][1][2] == b"late"
    assert sum(1 + b.last_offset_delta for b in C.decode_batches(p["records"], 1 << 20)) == 4

    def lo(ts):
        r = c.call(C.API_LIST_OFFSETS, 6, {"replica_id": -1, "isolation_level": 0, "topics": [
            {"name": "t", "partitions": [{"partition_index": 1, "timestamp": ts}]}]})
        return r["topics"][0]["partitions"][0]
    assert lo(-2)["offset"] == 0 and lo(-1)["offset"] == 6
    assert (lo(1003)["offset"], lo(1003)["timestamp"]) == (3, 1003)
    assert lo(1500)["offset"] == 5 and lo(9999)["offset"] == 6
    assert c.call(C.API_FETCH, 12, fetch_body("t", 1, 7))["responses"][0]["partitions"][0]["error_code"] == \
        C.ERR_OFFSET_OUT_OF_RANGE
    assert c.call(C.API_FETCH, 12, fetch_body("t", 5, 0))["responses"][0]["partitions"][0]["error_code"] == \
        C.ERR_UNKNOWN_TOPIC_OR_PARTITION


def test_wrong_crc_is_corrupt_message_and_nothing_is_stored(h):
    c = h.connect()
    create(c, "t", 1)
    bad = bytearray(C.encode_batch(0, [(1, None, b"v", [])]))
    bad[-1] ^= 0x40
    res = c.call(C.API_PRODUCE, 7, produce_body("t", 0, bytes(bad)))
    assert res["responses"][0]["partition_responses"][0]["error_code"] == C.ERR_CORRUPT_MESSAGE
    assert h.shell.offsets("t") == (0, 0)
    assert not c.io.closed


def test_fetch_long_polls_and_answers_stay_in_order(h):
    c = h.connect()
    create(c, "t", 1)
    waiting = c.send(C.API_FETCH, 12, fetch_body("t", 0, 0, max_wait=500))
    after = c.send(C.API_METADATA, 1, {"topics": None})
    assert c.answers(C.API_FETCH, 12) == []            # the Fetch waits, and the Metadata after it with it
    assert h.timers and h.timers[0][0] == 0.5
    p = h.connect()
    p.call(C.API_PRODUCE, 9, produce_body("t", 0, C.encode_batch(0, [(1, None, b"wake", [])])))
    h.settle()
    frames, used = C.split_frames(bytes(c.io.out))
    assert len(frames) == 2
    corr, res = C.decode_response(C.API_FETCH, 12, bytes(frames[0]))
    assert corr == waiting
    (b,) = C.decode_batches(res["responses"][0]["partitions"][0]["records"], 1 << 20)
    assert b.records[0][2] == b"wake"
    assert C.decode_response(C.API_METADATA, 1, bytes(frames[1]))[0] == after
    assert h.timers[0][1] is None                      # the timer was cancelled


def test_empty_fetch_answers_when_max_wait_expires(h):
    c = h.connect()
    create(c, "t", 1)
    c.send(C.API_FETCH, 12, fetch_body("t", 0, 0, max_wait=200))
    assert c.answers(C.API_FETCH, 12) == []
    h.fire_timers()
    ((_, res),) = c.answers(C.API_FETCH, 12)
    assert res["responses"][0]["partitions"][0]["records"] == b""


def join_body(group, member_id="", protocols=(("range", b"meta"),)):
    return {"group_id": group, "session_timeout_ms": 6000, "rebalance_timeout_ms": 6000, "member_id": member_id,
            "group_instance_id": None, "protocol_type": "consumer",
            "protocols": [{"name": n, "metadata": m} for n, m in protocols]}


def test_group_join_sync_heartbeat_and_session_timeout(h):
    a, b = h.connect(), h.connect()
    first = a.call(C.API_JOIN_GROUP, 4, join_body("g"))
    assert first["error_code"] == 79 and first["member_id"]        # MEMBER_ID_REQUIRED (KIP-394)
    ja = a.call(C.API_JOIN_GROUP, 4, join_body("g", first["member_id"]))
    assert (ja["error_code"], ja["generation_id"], ja["leader"]) == (0, 1, first["member_id"])
    mb = b.call(C.API_JOIN_GROUP, 4, join_body("g"))["member_id"]
    b.send(C.API_JOIN_GROUP, 4, join_body("g", mb))                  # a rebalance: waits for a to join again
    assert b.answers(C.API_JOIN_GROUP, 4) == []
    hb = {"group_id": "g", "generation_id": 1, "member_id": ja["member_id"], "group_instance_id": None}
    assert a.call(C.API_HEARTBEAT, 3, hb)["error_code"] == 27       # REBALANCE_IN_PROGRESS: join again
    ja = a.call(C.API_JOIN_GROUP, 4, join_body("g", ja["member_id"], (("range", b"ma"), ("roundrobin", b"r"))))
    ((_, jb),) = b.answers(C.API_JOIN_GROUP, 4)
    assert ja["generation_id"] == jb["generation_id"] == 2 and ja["protocol_name"] == "range"
    assert sorted(m["member_id"] for m in ja["members"]) == sorted([ja["member_id"], mb]) and jb["members"] == []
    b.send(C.API_SYNC_GROUP, 3, {"group_id": "g", "generation_id": 2, "member_id": mb, "assignments": []})
    assert b.answers(C.API_SYNC_GROUP, 3) == []                      # waits for the leader's assignment
    sa = a.call(C.API_SYNC_GROUP, 3, {"group_id": "g", "generation_id": 2, "member_id": ja["member_id"],
                                      "assignments": [{"member_id": ja["member_id"], "assignment": b"A"},
                                                      {"member_id": mb, "assignment": b"B"}]})
    assert sa["assignment"] == b"A" and b.answers(C.API_SYNC_GROUP, 3)[0][1]["assignment"] == b"B"
    d = a.call(C.API_DESCRIBE_GROUPS, 5, {"groups": ["g", "nope"]})["groups"]
    assert d[0]["group_state"] == "Stable" and len(d[0]["members"]) == 2 and d[1]["group_state"] == "Dead"
    # b stops heart-beating: removed after its session timeout (6 s), and a must join again
    h.now += 3
    assert a.call(C.API_HEARTBEAT, 3, dict(hb, generation_id=2))["error_code"] == 0
    h.now += 4
    a.s.tick(h.now)
    assert a.call(C.API_HEARTBEAT, 3, dict(hb, generation_id=2))["error_code"] == 27
    ja = a.call(C.API_JOIN_GROUP, 4, join_body("g", ja["member_id"]))
    assert ja["generation_id"] == 3 and [m["member_id"] for m in ja["members"]] == [ja["member_id"]]
    assert a.call(C.API_LEAVE_GROUP, 3, {"group_id": "g", "members": [{"member_id": ja["member_id"]}]})[
        "members"][0]["error_code"] == 0
    assert c_groups(a) == {"g": "Empty"}


def c_groups(c):
    return {g["group_id"]: g["group_state"] for g in c.call(C.API_LIST_GROUPS, 4, {"states_filter": []})["groups"]}


def test_offset_commit_is_the_stream_offset_minus_one(h):
    c = h.connect()
    create(c, "t", 2)
    commit = {"group_id": "grp", "generation_id_or_member_epoch": -1, "member_id": "", "topics": [
        {"name": "t", "partitions": [{"partition_index": 0, "committed_offset": 42, "committed_metadata": ""},
                                     {"partition_index": 1, "committed_offset": 0, "committed_metadata": ""}]}]}
    res = c.call(C.API_OFFSET_COMMIT, 8, commit)
    assert [p["error_code"] for p in res["topics"][0]["partitions"]] == [0, 0]
    got = []
    h.broker.query_offset("t-0", "grp", lambda off, exc: got.append(off))
    h.broker.query_offset("t-1", "grp", lambda off, exc: got.append(off))
    assert got == [41, None]
    h.broker.store_offset("t-1", "grp", 6)       # as RabbitMQ Stream's StoreOffset does
    h.settle()
    fetched = c.call(C.API_OFFSET_FETCH, 7, {"group_id": "grp", "topics": [{"name": "t", "partition_indexes": [0, 1]}]})
    assert [p["committed_offset"] for p in fetched["topics"][0]["partitions"]] == [42, 7]
    every = c.call(C.API_OFFSET_FETCH, 7, {"group_id": "grp", "topics": None})
    assert {(t["name"], p["partition_index"], p["committed_offset"]) for t in every["topics"]
            for p in t["partitions"]} == {("t", 0, 42), ("t", 1, 7)}
    # a commit with a generation of a group it is not a member of
    bad = dict(commit, generation_id_or_member_epoch=3, member_id="ghost")
    assert c.call(C.API_OFFSET_COMMIT, 8, bad)["topics"][0]["partitions"][0]["error_code"] == 25


def test_idempotent_producer_retry_is_stored_once_with_its_offset(h):
    c = h.connect()
    create(c, "t", 1)
    ip = c.call(C.API_INIT_PRODUCER_ID, 4, {"transactional_id": None, "transaction_timeout_ms": 1000,
                                             "producer_id": -1, "producer_epoch": -1})
    assert ip["error_code"] == 0 and ip["producer_id"] >= 0 and ip["producer_epoch"] == 0
    pid = ip["producer_id"]

    def batch(seq, n):
        return C.encode_batch(0, [(1, None, b"%d" % (seq + i), []) for i in range(n)], producer_id=pid,
                              producer_epoch=0, base_sequence=seq)

    def send(data):
        return c.call(C.API_PRODUCE, 9, produce_body("t", 0, data))["responses"][0]["partition_responses"][0]
    assert send(batch(0, 3))["base_offset"] == 0
    assert send(batch(3, 2))["base_offset"] == 3
    retry = send(batch(3, 2))                       # the broker's answer was lost: the client sends it again
    assert (retry["error_code"], retry["base_offset"]) == (0, 3)
    assert send(batch(5, 1))["base_offset"] == 5
    assert h.shell.offsets("t") == (0, 6)           # stored once
    txn = c.call(C.API_INIT_PRODUCER_ID, 4, {"transactional_id": "tx", "transaction_timeout_ms": 1000,
                                              "producer_id": -1, "producer_epoch": -1})
    assert txn["error_code"] == 53                  # transactions are out of scope


def test_create_partitions_grows_a_stream_into_a_super_stream_and_delete_topics(h):
    c = h.connect()
    create(c, "t", 1)
    c.call(C.API_PRODUCE, 9, produce_body("t", 0, C.encode_batch(0, [(1, None, b"kept", [])])))
    res = c.call(C.API_CREATE_PARTITIONS, 3, {"topics": [{"name": "t", "count": 3, "assignments": None}],
                                               "timeout_ms": 1000, "validate_only": False})
    assert res["results"][0]["error_code"] == 0
    assert h.broker.partitions("t") == ["t", "t-1", "t-2"]     # partition 0 is the stream it was
    p0 = c.call(C.API_FETCH, 12, fetch_body("t", 0, 0))["responses"][0]["partitions"][0]
    assert C.decode_batches(p0["records"], 1 << 20)[0].records[0][2] == b"kept"
    res = c.call(C.API_CREATE_PARTITIONS, 3, {"topics": [{"name": "t", "count": 2, "assignments": None}],
                                               "timeout_ms": 1000, "validate_only": False})
    assert res["results"][0]["error_code"] == C.ERR_INVALID_PARTITIONS
    cfg = c.call(C.API_DESCRIBE_CONFIGS, 4, {"resources": [{"resource_type": 2, "resource_name": "t",
                                                             "configuration_keys": None}]})
    assert {x["name"] for x in cfg["results"][0]["configs"]} == {"retention.ms", "retention.bytes", "cleanup.policy"}
    res = c.call(C.API_DELETE_TOPICS, 5, {"topic_names": ["t", "nope"], "timeout_ms": 1000})
    assert [r["error_code"] for r in res["responses"]] == [0, C.ERR_UNKNOWN_TOPIC_OR_PARTITION]
    assert h.shell.partitions("t") is None and not h.broker.has_stream("t-1")
    # a Fetch of the deleted topic is a Kafka error, not a crash
    assert c.call(C.API_FETCH, 12, fetch_body("t", 0, 0))["responses"][0]["partitions"][0]["error_code"] == \
        C.ERR_UNKNOWN_TOPIC_OR_PARTITION


def test_a_flood_of_waiting_requests_stops_reading_until_answers_drain(h):
    from riverbed.shells.kafka import session as S
    c = h.connect()
    create(c, "t", 1)
    waiting = C.encode_request(C.API_FETCH, 12, 1, "t", fetch_body("t", 0, 0, max_wait=500))
    c.s.data_received(waiting * S.PENDING_HIGH)
    assert not c.io.reading
    h.fire_timers()
    h.settle()
    assert c.io.reading and len(C.split_frames(bytes(c.io.out))[0]) == S.PENDING_HIGH


def test_a_batch_that_inflates_past_the_limit_is_message_too_large_and_counted(h):
    from riverbed.shells.broker import limits
    c = h.connect()
    create(c, "t", 1)
    before = limits.rejected_count("kafka", limits.REASON_DECOMPRESSED_SIZE)
    bomb = C.encode_batch(0, [(1, None, b"\0" * (h.broker.limits.max_decompressed_size + 1), [])],
                          compression=C.COMPRESSION_ZSTD)
    res = c.call(C.API_PRODUCE, 9, produce_body("t", 0, bomb))
    assert res["responses"][0]["partition_responses"][0]["error_code"] == C.ERR_MESSAGE_TOO_LARGE
    assert limits.rejected_count("kafka", limits.REASON_DECOMPRESSED_SIZE) == before + 1
    assert h.shell.offsets("t") == (0, 0)


def test_an_empty_group_is_forgotten_after_a_while(h):
    from riverbed.shells.kafka import groups as G
    c = h.connect()
    mid = c.call(C.API_JOIN_GROUP, 4, join_body("gone"))["member_id"]
    c.call(C.API_JOIN_GROUP, 4, join_body("gone", mid))
    c.call(C.API_LEAVE_GROUP, 3, {"group_id": "gone", "members": [{"member_id": mid}]})
    assert c_groups(c) == {"gone": "Empty"}
    h.now += G.EMPTY_GROUP_KEPT + 1
    c.s.tick(h.now)
    assert c_groups(c) == {}


def test_list_offsets_by_time_decodes_a_bounded_number_of_records(h, monkeypatch):
    from riverbed.shells.kafka import session as S
    c = h.connect()
    create(c, "t", 1)
    for k in range(3):
        c.call(C.API_PRODUCE, 9, produce_body("t", 0, C.encode_batch(0, [(100 * k + i, None, b"v", [])
                                                                           for i in range(10)])))
    body = {"replica_id": -1, "isolation_level": 0, "topics": [{"name": "t", "partitions": [
        {"partition_index": 0, "timestamp": 205}, {"partition_index": 0, "timestamp": 105}]}]}
    parts = c.call(C.API_LIST_OFFSETS, 6, body)["topics"][0]["partitions"]
    assert [(p["offset"], p["timestamp"]) for p in parts] == [(25, 205), (15, 105)]
    # the first lookup decodes 26 records; the second runs out of the request's budget and answers with
    # the first chunk stored at or after its time (every chunk here was stored now: the first one)
    monkeypatch.setattr(S, "TIME_SCAN_BUDGET", 30)
    parts = c.call(C.API_LIST_OFFSETS, 6, body)["topics"][0]["partitions"]
    assert [(p["offset"], p["timestamp"]) for p in parts] == [(25, 205), (0, -1)]


def test_a_bug_in_a_handler_costs_that_connection_only(h, monkeypatch):
    from riverbed.shells.kafka import session as S

    def broken(session, hdr, req):
        raise RuntimeError("a bug")
    a, b = h.connect(), h.connect()
    monkeypatch.setitem(S.COMMANDS, C.API_LIST_GROUPS, broken)
    a.s.guard(a.s.data_received, C.encode_request(C.API_LIST_GROUPS, 4, 1, "t", {"states_filter": []}))
    assert a.io.closed or getattr(a.io, "aborted", False)
    assert a.s not in h.broker.sessions
    assert b.call(C.API_METADATA, 1, {"topics": None})["brokers"]


def test_a_batch_of_more_records_than_a_chunk_header_counts_is_stored_whole_and_idempotently(h):
    # one partition's batches become one chunk; over 65535 records (a header's u16) and over the stream's
    # records per chunk, the engine cuts it, and an idempotent producer's sequences follow every record
    c = h.connect()
    create(c, "t", 1)
    n = 70_000
    records = [(1_700_000_000_000, None, b"%d" % i, []) for i in range(n)]
    batch = C.encode_batch(0, records, producer_id=3, producer_epoch=0, base_sequence=0)
    part = c.call(C.API_PRODUCE, 9, produce_body("t", 0, batch))["responses"][0]["partition_responses"][0]
    assert (part["error_code"], part["base_offset"]) == (0, 0)
    retry = c.call(C.API_PRODUCE, 9, produce_body("t", 0, batch))["responses"][0]["partition_responses"][0]
    assert (retry["error_code"], retry["base_offset"]) == (0, 0)          # a retry: stored once
    seen = []
    offset = 0
    while offset < n:
        body = fetch_body("t", 0, offset)
        body["max_bytes"] = body["topics"][0]["partitions"][0]["partition_max_bytes"] = 8 << 20
        p = c.call(C.API_FETCH, 12, body)["responses"][0]["partitions"][0]
        assert p["error_code"] == 0 and p["high_watermark"] == n
        for b in C.decode_batches(p["records"], 1 << 26):
            seen += [(b.base_offset + i, r[2]) for i, r in enumerate(b.records)]
        offset = seen[-1][0] + 1
    assert seen == [(i, b"%d" % i) for i in range(n)]


def _fetched_batches(c, topic, offset, max_bytes=1 << 20):
    res = c.call(C.API_FETCH, 12, {**fetch_body(topic, 0, offset), "max_bytes": max_bytes,
                                   "topics": [{"topic": topic, "partitions": [{"partition": 0, "fetch_offset": offset,
                                                                               "partition_max_bytes": max_bytes}]}]})
    part = res["responses"][0]["partitions"][0]
    data = bytes(part["records"] or b"")
    out = []
    pos = 0
    while pos < len(data):          # batch by batch, empty ones too (decode_batches skips nothing)
        (b,) = C.decode_batches(data[pos:pos + 12 + C._I32.unpack_from(data, pos + 8)[0]], 1 << 20)
        out.append((b.base_offset, b.last_offset_delta, [r[2] for r in b.records]))
        pos += 12 + C._I32.unpack_from(data, pos + 8)[0]
    return part["high_watermark"], out


def test_fetch_covers_the_logs_own_chunks_with_empty_batches(h):
    # chunks of the log's own (offset tracking, as a RabbitMQ node writes them; here copied in as a
    # cluster member copies its leader's) take offsets in the stream: a Kafka consumer gets an empty batch
    # over them and goes on, whether they come before, between or after its records
    from riverbed.engine import core
    from riverbed.engine.format import CHUNK_TRACKING_DELTA
    from riverbed.shells.kafka import records as R
    c = h.connect()
    create(c, "t", 1)

    def own(at, n=1):
        h.eng.replicate_chunk("t", core.build_chunk(b"", 0, n, 5, at, chunk_type=CHUNK_TRACKING_DELTA)).result(10)

    def user(at, values):
        h.eng.replicate_chunk("t", core.encode_chunk([R.to_stored(None, v, [], 1) for v in values], at, 5)).result(10)
    own(0)
    user(1, [b"a", b"b", b"c"])
    own(4)
    own(5, 2)
    user(7, [b"d", b"e"])
    own(9)
    h.settle()
    hw, batches = _fetched_batches(c, "t", 0)
    assert hw == 10
    assert batches == [(0, 0, []), (1, 2, [b"a", b"b", b"c"]), (4, 2, []), (7, 1, [b"d", b"e"]), (9, 0, [])]
    assert _fetched_batches(c, "t", 2)[1] == [(2, 1, [b"b", b"c"]), (4, 2, []), (7, 1, [b"d", b"e"]), (9, 0, [])]
    assert _fetched_batches(c, "t", 5)[1] == [(5, 1, []), (7, 1, [b"d", b"e"]), (9, 0, [])]
    assert _fetched_batches(c, "t", 9)[1] == [(9, 0, [])]
    # a small limit: the first batch whole, then nothing more
    assert _fetched_batches(c, "t", 1, max_bytes=10)[1] == [(1, 2, [b"a", b"b", b"c"])]


@pytest.mark.parametrize("window", [1, 2, 3])
def test_fetch_answer_is_the_same_whatever_chunks_one_read_takes(h, monkeypatch, window):
    # a Fetch reads the log in place in reads of at most READ_MAX_CHUNKS chunks (and about the bytes it
    # still has room for): where one read ends must not show in the answer, the log's own chunks included
    from riverbed.engine import core
    from riverbed.engine.format import CHUNK_TRACKING_DELTA
    from riverbed.shells.kafka import fetch_read
    from riverbed.shells.kafka import records as R
    c = h.connect()
    create(c, "t", 1)
    at = 0
    for k in range(7):
        if k % 3 == 1:
            h.eng.replicate_chunk("t", core.build_chunk(b"", 0, 1, 5, at, chunk_type=CHUNK_TRACKING_DELTA)).result(10)
            at += 1
        vals = [b"c%d-%d" % (k, i) for i in range(k + 1)]
        h.eng.replicate_chunk("t", core.encode_chunk([R.to_stored(None, v, [], 1) for v in vals], at, 5)).result(10)
        at += len(vals)
    h.settle()
    whole = {start: _fetched_batches(c, "t", start) for start in (0, 2, 5, at - 1)}
    assert sum(len(b[2]) for b in whole[0][1]) == 28
    monkeypatch.setattr(fetch_read, "READ_MAX_CHUNKS", window)
    for start, want in whole.items():
        assert _fetched_batches(c, "t", start) == want, start


def test_a_corrupt_chunk_ends_a_fetch_before_it_and_a_fetch_from_it_gets_no_records(h, tmp_path):
    import mmap

    from riverbed.engine.format import LEN_CHUNK_HEADER
    c = h.connect()
    create(c, "t", 1)
    values = [[b"chunk-%d-record-%d-" % (k, i) + bytes([65 + k]) * 40 for i in range(3)] for k in range(4)]
    for vals in values:             # one Produce, one chunk each
        c.call(C.API_PRODUCE, 9, produce_body("t", 0, C.encode_batch(0, [(1000, None, v, []) for v in vals])))
    chunks = h.eng.read_chunks("t", 0, 10)
    assert [cid for cid, _ in chunks] == [0, 3, 6, 9]
    h.eng.close()
    # a data byte of chunk 6 flipped on disk (every copy LMDB keeps): its CRC no longer matches
    with open(tmp_path / "data" / "data.mdb", "r+b") as f, mmap.mmap(f.fileno(), 0) as m:
        pos = m.find(chunks[2][1])
        assert pos >= 0
        while pos >= 0:
            m[pos + LEN_CHUNK_HEADER + 5] ^= 0xFF
            pos = m.find(chunks[2][1], pos + 1)
    h._open(tmp_path / "data")      # reopened: each chunk's CRC is checked at its first read
    h.shell = KafkaShell(h.broker, call_later=h._call_later)
    c = h.connect()

    def fetched(offset):
        p = c.call(C.API_FETCH, 12, fetch_body("t", 0, offset))["responses"][0]["partitions"][0]
        return p["error_code"], [r[2] for b in C.decode_batches(bytes(p["records"] or b""), 1 << 20) for r in b.records]
    assert fetched(0) == (0, values[0] + values[1])     # the records before the corrupt chunk
    assert fetched(3) == (0, values[1])
    for offset in (6, 7, 6):                            # from it: no records (never sent, never trusted)
        assert fetched(offset) == (0, [])
    assert fetched(9) == (0, values[3])                 # past it, the log reads on
    assert not c.io.closed
