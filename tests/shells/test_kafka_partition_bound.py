"""A topic has at most MAX_TOPIC_PARTITIONS partitions: a CreateTopics or CreatePartitions asking for more
is INVALID_PARTITIONS, answered before any stream is made (atheris kafka found a CreateTopics with 3,080,195
partitions making a stream each until the process ran out of memory; tests/fuzz/test_regressions.py)."""

from riverbed.shells.kafka import codec as C
from riverbed.shells.kafka.shell import MAX_TOPIC_PARTITIONS

from .test_kafka_session import create, h  # noqa: F401 - h: the Kafka session harness fixture


def test_create_topics_over_the_bound_is_invalid_partitions(h):  # noqa: F811
    c = h.connect()
    for n in (MAX_TOPIC_PARTITIONS + 1, 3_080_195, 2**31 - 1):
        res = create(c, "big", n)["topics"][0]
        assert res["error_code"] == C.ERR_INVALID_PARTITIONS and str(MAX_TOPIC_PARTITIONS) in res["error_message"]
    assert not h.broker.has_stream("big") and not h.broker.has_stream("big-0")


def test_create_partitions_over_the_bound_is_invalid_partitions(h):  # noqa: F811
    c = h.connect()
    assert create(c, "t", 2)["topics"][0]["error_code"] == 0
    res = c.call(C.API_CREATE_PARTITIONS, 3, {"topics": [{"name": "t", "count": MAX_TOPIC_PARTITIONS + 1,
                                                          "assignments": None}],
                                               "timeout_ms": 1000, "validate_only": False})
    assert res["results"][0]["error_code"] == C.ERR_INVALID_PARTITIONS
    assert h.broker.partitions("t") == ["t-0", "t-1"] and not h.broker.has_stream("t-2")
