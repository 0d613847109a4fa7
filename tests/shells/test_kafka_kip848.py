"""KIP-848 on the Kafka session, sans I/O over a real engine: Metadata 12 with topic ids (by name and by
id), ConsumerGroupHeartbeat (join, member epochs, revocation before assignment so that no partition is
ever owned twice, fencing, leaving, the session timeout), OffsetCommit 9 with member epochs,
ConsumerGroupDescribe, ListGroups/DescribeGroups, and classic and consumer groups kept apart."""

import pytest

from riverbed.shells.kafka import codec as C
from riverbed.shells.kafka.shell import KafkaShell

from .test_kafka_session import Harness, create


@pytest.fixture
def h(tmp_path):
    harness = Harness(tmp_path)
    harness.shell = KafkaShell(harness.broker, call_later=harness._call_later, group_session_timeout_ms=3000,
                               group_heartbeat_interval_ms=500)
    yield harness
    harness.eng.close()


def hb(c, group, member="", epoch=0, topics=None, owned=None, version=1, **more):
    body = {"group_id": group, "member_id": member, "member_epoch": epoch, "instance_id": None, "rack_id": None,
            "rebalance_timeout_ms": 10000 if epoch == 0 else -1, "subscribed_topic_names": topics,
            "subscribed_topic_regex": None, "server_assignor": None, "topic_partitions": owned, **more}
    return c.call(C.API_CONSUMER_GROUP_HEARTBEAT, version, body)


def parts(res, tid):
    """The partitions of topic id ``tid`` in a heartbeat answer's assignment (None: no assignment sent)."""
    if res["assignment"] is None:
        return None
    return sorted(p for tp in res["assignment"]["topic_partitions"] if tp["topic_id"] == tid for p in tp["partitions"])


def owned(tid, ps):
    return [{"topic_id": tid, "partitions": sorted(ps)}]


def test_metadata_12_names_topics_by_id_and_the_id_is_stable(h):
    c = h.connect()
    create(c, "t", 3)
    create(c, "solo", 1)
    md = c.call(C.API_METADATA, 12, {"topics": None, "allow_auto_topic_creation": False,
                                     "include_topic_authorized_operations": False})
    ids = {t["name"]: bytes(t["topic_id"]) for t in md["topics"]}
    assert set(ids) == {"t", "solo"} and len(set(ids.values())) == 2 and b"\0" * 16 not in ids.values()
    by_id = c.call(C.API_METADATA, 12, {"topics": [{"topic_id": ids["t"], "name": None},
                                                   {"topic_id": b"\x01" * 16, "name": None}],
                                        "allow_auto_topic_creation": False})["topics"]
    assert (by_id[0]["error_code"], by_id[0]["name"], len(by_id[0]["partitions"])) == (0, "t", 3)
    assert (by_id[1]["error_code"], by_id[1]["name"]) == (C.ERR_UNKNOWN_TOPIC_ID, None)
    # the id is the same for another broker process (a restart, another node of a cluster)
    assert KafkaShell(h.broker).topic_id("t") == ids["t"]
    # classic versions still answer by name (Metadata 9 has no ids)
    md9 = c.call(C.API_METADATA, 9, {"topics": [{"name": "t"}], "allow_auto_topic_creation": False})
    assert md9["topics"][0]["name"] == "t" and len(md9["topics"][0]["partitions"]) == 3


def test_nullable_assignment_struct_round_trips():
    for assignment in (None, {"topic_partitions": [{"topic_id": b"\x07" * 16, "partitions": [0, 2]}]}):
        body = {"error_code": 0, "member_id": "m", "member_epoch": 3, "heartbeat_interval_ms": 5,
                "assignment": assignment}
        frame = C.encode_response(C.API_CONSUMER_GROUP_HEARTBEAT, 1, 9, body)
        _, got = C.decode_response(C.API_CONSUMER_GROUP_HEARTBEAT, 1, frame[4:])
        assert got["assignment"] == assignment and got["member_epoch"] == 3


def test_a_second_member_gets_partitions_only_once_the_first_revoked_them(h):
    a, b = h.connect(), h.connect()
    create(a, "t", 3)
    tid = h.shell.topic_id("t")
    ra = hb(a, "g", topics=["t"])
    ma, ea = ra["member_id"], ra["member_epoch"]
    assert ra["error_code"] == 0 and ma and ea > 0 and parts(ra, tid) == [0, 1, 2]
    assert ra["heartbeat_interval_ms"] == 500
    rb = hb(b, "g", topics=["t"])
    mb, eb = rb["member_id"], rb["member_epoch"]
    assert eb > ea and parts(rb, tid) == []          # its target is still owned by a: nothing yet
    ra = hb(a, "g", ma, ea, owned=owned(tid, [0, 1, 2]))
    keep = parts(ra, tid)
    assert ra["member_epoch"] == ea and len(keep) == 2      # revoke one first, at the same epoch
    # that answer lost: a still says it owns all three, and is told again
    assert parts(hb(a, "g", ma, ea, owned=owned(tid, [0, 1, 2])), tid) == keep
    assert parts(hb(b, "g", mb, eb, owned=[]), tid) is None  # not released yet: nothing new for b
    ra = hb(a, "g", ma, ea, owned=owned(tid, keep))          # a acknowledges the revocation
    assert ra["member_epoch"] == eb
    rb = hb(b, "g", mb, eb, owned=[])
    got = parts(rb, tid)
    assert sorted(keep + got) == [0, 1, 2] and len(got) == 1
    d = a.call(C.API_CONSUMER_GROUP_DESCRIBE, 0, {"group_ids": ["g", "none"],
                                                  "include_authorized_operations": False})["groups"]
    assert d[0]["error_code"] == 0 and d[0]["group_state"] == "Stable" and len(d[0]["members"]) == 2
    assert {m["member_id"]: sum(len(tp["partitions"]) for tp in m["assignment"]["topic_partitions"])
            for m in d[0]["members"]} == {ma: 2, mb: 1}
    assert d[1]["error_code"] == C.ERR_GROUP_ID_NOT_FOUND
    listed = a.call(C.API_LIST_GROUPS, 5, {"states_filter": [], "types_filter": ["consumer"]})["groups"]
    assert [(g["group_id"], g["group_type"], g["group_state"]) for g in listed] == [("g", "consumer", "Stable")]
    classic = a.call(C.API_DESCRIBE_GROUPS, 5, {"groups": ["g"]})["groups"][0]
    assert classic["group_state"] == "Stable" and len(classic["members"]) == 2


def test_fencing_unknown_members_leaving_and_the_session_timeout(h):
    a, b = h.connect(), h.connect()
    create(a, "t", 2)
    tid = h.shell.topic_id("t")
    ra = hb(a, "g", topics=["t"])
    ma, ea = ra["member_id"], ra["member_epoch"]
    assert hb(a, "g", ma, ea + 5, owned=[])["error_code"] == C.ERR_FENCED_MEMBER_EPOCH
    assert hb(a, "g", "nobody", 3, owned=[])["error_code"] == 25                 # UNKNOWN_MEMBER_ID
    assert hb(a, "", topics=["t"])["error_code"] == C.ERR_INVALID_REQUEST
    assert hb(a, "g", topics=["t"], server_assignor="sticky")["error_code"] == C.ERR_UNSUPPORTED_ASSIGNOR
    rb = hb(b, "g", topics=["t"])
    mb = rb["member_id"]
    keep = parts(hb(a, "g", ma, ea, owned=owned(tid, [0, 1])), tid)
    ea = hb(a, "g", ma, ea, owned=owned(tid, keep))["member_epoch"]
    assert len(keep) == 1 and parts(hb(b, "g", mb, rb["member_epoch"], owned=[]), tid) is not None
    # b goes silent: removed after the session timeout (3 s); a gets everything back
    h.now += 2
    hb(a, "g", ma, ea, owned=owned(tid, keep))
    h.now += 2
    a.s.tick(h.now)
    ra = hb(a, "g", ma, ea, owned=owned(tid, keep))
    assert ra["member_epoch"] > ea and parts(ra, tid) == [0, 1]
    assert hb(b, "g", mb, rb["member_epoch"], owned=[])["error_code"] == 25
    # leaving: epoch -1 answers -1 and the group empties
    left = hb(a, "g", ma, -1)
    assert (left["error_code"], left["member_epoch"]) == (0, -1)
    assert a.call(C.API_LIST_GROUPS, 4, {"states_filter": []})["groups"][0]["group_state"] == "Empty"


def test_offset_commit_9_checks_member_epochs_and_groups_stay_one_kind(h):
    a = h.connect()
    create(a, "t", 1)
    ra = hb(a, "g", topics=["t"])
    ma, ea = ra["member_id"], ra["member_epoch"]

    def commit(member, epoch):
        return a.call(C.API_OFFSET_COMMIT, 9, {
            "group_id": "g", "generation_id_or_member_epoch": epoch, "member_id": member, "group_instance_id": None,
            "topics": [{"name": "t", "partitions": [{"partition_index": 0, "committed_offset": 0,
                                                     "committed_metadata": None}]}]})["topics"][0]["partitions"][0][
            "error_code"]
    assert commit(ma, ea) == 0
    assert commit(ma, ea + 7) == C.ERR_STALE_MEMBER_EPOCH
    assert commit("nobody", ea) == 25
    # a consumer group's id is refused to classic members, and a classic group's to KIP-848 members
    join = {"group_id": "g", "session_timeout_ms": 6000, "rebalance_timeout_ms": 6000, "member_id": "",
            "group_instance_id": None, "protocol_type": "consumer", "protocols": [{"name": "range", "metadata": b""}]}
    assert a.call(C.API_JOIN_GROUP, 4, join)["error_code"] == 23                 # INCONSISTENT_GROUP_PROTOCOL
    b = h.connect()
    mid = b.call(C.API_JOIN_GROUP, 4, dict(join, group_id="classic"))["member_id"]
    assert b.call(C.API_JOIN_GROUP, 4, dict(join, group_id="classic", member_id=mid))["error_code"] == 0
    assert hb(a, "classic", topics=["t"])["error_code"] == C.ERR_GROUP_ID_NOT_FOUND


def test_a_member_that_does_not_revoke_in_time_is_removed(h):
    a, b = h.connect(), h.connect()
    create(a, "t", 2)
    tid = h.shell.topic_id("t")
    ra = hb(a, "g", topics=["t"], rebalance_timeout_ms=1000)
    ma, ea = ra["member_id"], ra["member_epoch"]
    rb = hb(b, "g", topics=["t"])
    assert len(parts(hb(a, "g", ma, ea, owned=owned(tid, [0, 1])), tid)) == 1      # one to revoke
    h.now += 1.5
    hb(b, "g", rb["member_id"], rb["member_epoch"], owned=[])     # b keeps heart-beating; a does not revoke
    a.s.tick(h.now)
    assert hb(a, "g", ma, ea, owned=owned(tid, [0, 1]))["error_code"] == 25
    rb = hb(b, "g", rb["member_id"], rb["member_epoch"], owned=[])
    assert parts(rb, tid) == [0, 1]


def test_a_regex_subscription_follows_topics_as_they_appear(h):
    a = h.connect()
    create(a, "kt", 2)
    create(a, "other", 1)
    ra = hb(a, "g", topics=None, subscribed_topic_regex="(^k.*)")       # as librdkafka sends "^k.*"
    ma, ea = ra["member_id"], ra["member_epoch"]
    assert parts(ra, h.shell.topic_id("kt")) == [0, 1] and len(ra["assignment"]["topic_partitions"]) == 1
    create(a, "k2", 1)
    ra = hb(a, "g", ma, ea, owned=owned(h.shell.topic_id("kt"), [0, 1]))
    assert ra["member_epoch"] > ea and parts(ra, h.shell.topic_id("k2")) == [0]
    assert hb(a, "g2", topics=None, subscribed_topic_regex="(")["error_code"] == C.ERR_INVALID_REGULAR_EXPRESSION


def test_an_assignment_whose_answer_was_lost_is_answered_again(h):
    a = h.connect()
    create(a, "t", 2)
    tid = h.shell.topic_id("t")
    ra = hb(a, "g", topics=["t"])
    ma, ea = ra["member_id"], ra["member_epoch"]
    assert parts(ra, tid) == [0, 1]
    # the client's request timed out and it never read that answer: it still says it owns nothing
    assert parts(hb(a, "g", ma, ea, owned=[]), tid) == [0, 1]
    # a full request (sent after an error) gets the assignment too, even when nothing changed
    full = hb(a, "g", ma, ea, topics=["t"], owned=owned(tid, [0, 1]), rebalance_timeout_ms=10000)
    assert parts(full, tid) == [0, 1]
    assert parts(hb(a, "g", ma, ea, owned=owned(tid, [0, 1])), tid) is None      # otherwise not repeated
