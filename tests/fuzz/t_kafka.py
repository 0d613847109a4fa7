"""Kafka: the codec (frames, headers, bodies at every served version, record batches v2) and
KafkaSession.

Input: flag byte, then raw client bytes (size-prefixed requests). Kafka has no handshake; FLAG_PRELUDE
creates topic ``kkk`` (2 partitions) and produces one record to partition 0 first.
"""

from riverbed.shells.kafka import codec as C
from riverbed.shells.kafka.session import KafkaSession
from riverbed.shells.kafka.shell import KafkaShell

from .harness import FLAG_PRELUDE, FakeIO, SessionTarget


def _req(key, version, body, corr=1):
    return C.encode_request(key, version, corr, "fuzz", body)


def _produce(topic, partition, batch, acks=-1):
    return {"transactional_id": None, "acks": acks, "timeout_ms": 1000,
            "topic_data": [{"name": topic, "partition_data": [{"index": partition, "records": batch}]}]}


def _fetch(topic, partition, offset, max_wait=0):
    return {"max_wait_ms": max_wait, "min_bytes": 1, "max_bytes": 1 << 20, "isolation_level": 0,
            "topics": [{"topic": topic, "partitions": [{"partition": partition, "fetch_offset": offset,
                                                         "partition_max_bytes": 1 << 16}]}],
            "forgotten_topics_data": []}


BATCH = C.encode_batch(0, [(1000, b"k", b"v", [("h", b"x")]), (1001, None, b'{"a":1}', [])])
PRELUDE = (_req(C.API_CREATE_TOPICS, 5, {"topics": [{"name": "kkk", "num_partitions": 2, "replication_factor": 1,
                                                      "assignments": [], "configs": []}], "timeout_ms": 100})
           + _req(C.API_PRODUCE, 9, _produce("kkk", 0, BATCH), 2))
JOIN = {"group_id": "gg", "session_timeout_ms": 6000, "rebalance_timeout_ms": 6000, "member_id": "",
        "group_instance_id": None, "protocol_type": "consumer", "protocols": [{"name": "range", "metadata": b"m"}]}
PROBE = _req(C.API_API_VERSIONS, 0, {}, 0x7FFF)
KKK_ID = C.topic_uuid("kkk")


def _cg_heartbeat(member, epoch, topics=None, owned=None, regex=None, assignor=None):
    return {"group_id": "cg", "member_id": member, "member_epoch": epoch, "instance_id": None, "rack_id": None,
            "rebalance_timeout_ms": 5000, "subscribed_topic_names": topics, "subscribed_topic_regex": regex,
            "server_assignor": assignor, "topic_partitions": owned}


class KafkaTarget(SessionTarget):
    name = "kafka"
    codec_errors = (C.DecodeError, C.CorruptBatch, C.UnsupportedCompression)

    def make_shell(self):
        self._timers = []
        return KafkaShell(self.rig.broker, call_later=self._call_later)

    def _call_later(self, delay, fn):
        self._timers.append(fn)
        return lambda: None

    def codec(self, body):
        try:
            frames, _ = C.split_frames(body)
        except C.DecodeError:
            frames = [memoryview(body)[4:]]
        for f in frames[:16]:
            try:
                hdr = C.decode_header(f)
            except C.DecodeError:
                continue
            if hdr.body >= 0 and hdr.api_key in C.SERVED:
                try:
                    C.decode_request(hdr.api_key, hdr.version, f, hdr.body)
                except C.DecodeError:
                    pass
        C.decode_batches(body, 1 << 20)

    def open_session(self):
        io = FakeIO()
        self.rig.ios = [io]
        return KafkaSession(self.shell, io, peer="fuzz", local=("127.0.0.1", 9092), remote=("127.0.0.1", 5555),
                            peer_loopback=True)

    def prelude(self, s):
        s.data_received(PRELUDE)
        self.rig.settle()
        s.io.out.clear()

    def feed(self, s, piece):
        s.data_received(piece)

    def tick(self, s, now):
        timers, self._timers = self._timers, []
        for fn in timers:
            fn()

    def probe(self, s):
        if s.io.closed:
            return None
        if s._buf or (s._slots and s._slots[0].data is None):
            return None         # a partial request is buffered, or a long poll holds the answers back
        mark = len(s.io.out)
        s.data_received(PROBE)
        self.rig.settle()
        return len(s.io.out) > mark or s.io.closed

    def seeds(self):
        p = bytes([FLAG_PRELUDE])
        join = JOIN
        md = {"topics": [{"name": "kkk"}, {"name": "new"}], "allow_auto_topic_creation": True}
        lo = {"replica_id": -1, "isolation_level": 0, "topics": [{"name": "kkk", "partitions": [
            {"partition_index": 0, "timestamp": t} for t in (-1, -2, 1000, 5000)]}]}
        comp = C.encode_batch(0, [(1, b"a", b"b" * 50, [])] * 3, compression=C.COMPRESSION_GZIP)
        bad = bytearray(BATCH)
        bad[-1] ^= 1
        return [
            b"\x00" + _req(C.API_API_VERSIONS, 3, {"client_software_name": "f", "client_software_version": "1"})
            + _req(C.API_API_VERSIONS, 4, {}, 2) + _req(C.API_METADATA, 1, {"topics": None}, 3),
            b"\x00" + _req(C.API_METADATA, 9, md) + _req(C.API_METADATA, 4, md, 2),
            p + _req(C.API_FETCH, 12, _fetch("kkk", 0, 0)) + _req(C.API_FETCH, 4, _fetch("kkk", 1, 0), 2),
            p + _req(C.API_FETCH, 12, _fetch("kkk", 0, 2, max_wait=100)) + _req(C.API_PRODUCE, 3,
                                                                                 _produce("kkk", 0, comp), 3),
            p + _req(C.API_LIST_OFFSETS, 6, lo) + _req(C.API_LIST_OFFSETS, 1, lo, 2),
            p + _req(C.API_PRODUCE, 9, _produce("kkk", 1, bytes(bad))) + _req(C.API_PRODUCE, 9,
                                                                               _produce("kkk", 0, BATCH, 0), 2),
            b"\x00" + _req(C.API_CREATE_TOPICS, 0, {"topics": [{"name": "ct", "num_partitions": 3,
                                                                "replication_factor": 1, "assignments": [],
                                                                "configs": [{"name": "retention.ms",
                                                                             "value": "60000"}]}]}),
            b"\x00" + b"\x00\x00\x00\x08" + C._HEAD.pack(4242, 0, 1),
            b"\x00" + _req(C.API_FIND_COORDINATOR, 3, {"key": "gg", "key_type": 0}) + _req(C.API_JOIN_GROUP, 3, join)
            + _req(C.API_SYNC_GROUP, 3, {"group_id": "gg", "generation_id": 1, "member_id": "x", "assignments": []}, 2)
            + _req(C.API_HEARTBEAT, 3, {"group_id": "gg", "generation_id": 1, "member_id": "x"}, 3)
            + _req(C.API_LEAVE_GROUP, 3, {"group_id": "gg", "members": [{"member_id": "x"}]}, 4)
            + _req(C.API_LIST_GROUPS, 4, {"states_filter": ["Stable"]}, 5)
            + _req(C.API_DESCRIBE_GROUPS, 5, {"groups": ["gg"]}, 6),
            p + _req(C.API_OFFSET_COMMIT, 8, {"group_id": "gg", "generation_id_or_member_epoch": -1, "member_id": "",
                                              "topics": [{"name": "kkk", "partitions": [
                                                  {"partition_index": 0, "committed_offset": 1,
                                                   "committed_metadata": ""}]}]})
            + _req(C.API_OFFSET_FETCH, 7, {"group_id": "gg", "topics": None}, 2)
            + _req(C.API_OFFSET_FETCH, 1, {"group_id": "gg", "topics": [{"name": "kkk", "partition_indexes": [0, 1]}]},
                   3),
            # KIP-848: join (the client names itself, as librdkafka does), heartbeats owning and revoking,
            # a fenced epoch, a regex subscription, describe, list, commit with the member epoch, leave
            p + _req(C.API_CONSUMER_GROUP_HEARTBEAT, 1, _cg_heartbeat("m1", 0, ["kkk"], [], assignor="uniform"))
            + _req(C.API_CONSUMER_GROUP_HEARTBEAT, 0, _cg_heartbeat("", 0, ["kkk"]), 2)
            + _req(C.API_CONSUMER_GROUP_HEARTBEAT, 1, _cg_heartbeat(
                "m1", 2, owned=[{"topic_id": KKK_ID, "partitions": [0, 1]}]), 3)
            + _req(C.API_CONSUMER_GROUP_HEARTBEAT, 1, _cg_heartbeat("m1", 9, owned=[]), 4)
            + _req(C.API_CONSUMER_GROUP_DESCRIBE, 0, {"group_ids": ["cg", "gg"], "include_authorized_operations": True},
                   5)
            + _req(C.API_LIST_GROUPS, 5, {"states_filter": [], "types_filter": ["consumer"]}, 6)
            + _req(C.API_OFFSET_COMMIT, 9, {"group_id": "cg", "generation_id_or_member_epoch": 3, "member_id": "m1",
                                            "group_instance_id": None, "topics": [{"name": "kkk", "partitions": [
                                                {"partition_index": 1, "committed_offset": 1,
                                                 "committed_metadata": None}]}]}, 7)
            + _req(C.API_CONSUMER_GROUP_HEARTBEAT, 1, _cg_heartbeat("m1", -1), 8),
            p + _req(C.API_CONSUMER_GROUP_HEARTBEAT, 1, _cg_heartbeat("r1", 0, regex="k+", assignor="range"))
            + _req(C.API_CONSUMER_GROUP_HEARTBEAT, 1, _cg_heartbeat("r2", 0, regex="(", assignor="x"), 2)
            + _req(C.API_JOIN_GROUP, 4, dict(JOIN, group_id="cg"), 3),
            # Metadata 12: every topic, then topics by id (one unknown), Metadata 10 by name
            p + _req(C.API_METADATA, 12, {"topics": None, "allow_auto_topic_creation": False})
            + _req(C.API_METADATA, 12, {"topics": [{"topic_id": KKK_ID, "name": None},
                                                   {"topic_id": b"\x05" * 16, "name": None}]}, 2)
            + _req(C.API_METADATA, 10, {"topics": [{"name": "kkk"}], "include_cluster_authorized_operations": True},
                   3),
        ]
