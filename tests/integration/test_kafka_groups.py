"""Classic consumer groups on the Kafka listener with real clients: a group of two consumers shares a
three-partition topic (each partition to one member, every record once), commits and resumes; members
joining, leaving and being killed rebalance the group; ListGroups/DescribeGroups; a Kafka commit is the
RabbitMQ Stream consumer offset C - 1 and the other way round."""

import asyncio
import os
import subprocess
import sys
import threading
import time

import pytest

sys.path.insert(0, os.path.dirname(__file__))
from procs import fresh  # noqa: E402

pytestmark = [pytest.mark.integration, pytest.mark.filterwarnings("ignore::DeprecationWarning")]


@pytest.fixture(scope="module")
def srv(kafka_server):
    return kafka_server


def produce(bootstrap, topic, values, partitions=None, idempotent=False):
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic
    if partitions:
        admin = AdminClient({"bootstrap.servers": bootstrap})      # kept alive until the result is in
        admin.create_topics([NewTopic(topic, partitions, 1)])[topic].result(15)
    p = Producer({"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": idempotent, "linger.ms": 5})
    for v in values:
        while True:
            try:
                p.produce(topic, key=b"key-%d" % v, value=b"%d" % v)
                break
            except BufferError:
                p.poll(0.01)
    assert p.flush(120) == 0


class GroupMember(threading.Thread):
    """A confluent-kafka consumer of a group, polling in a thread; commits each record it takes."""

    def __init__(self, bootstrap, topic, group, commit_every=1, **conf):
        super().__init__(daemon=True)
        self.commit_every = commit_every
        from confluent_kafka import Consumer
        self.c = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "auto.offset.reset": "earliest",
                           "enable.auto.commit": False, "session.timeout.ms": 6000,
                           "heartbeat.interval.ms": 300, **conf})
        self.topic = topic
        self.values = []
        self.assigned = []
        self.owned = set()
        self.commit_errors = []
        self.stopping = threading.Event()
        self.error = None

    def run(self):
        from confluent_kafka import KafkaException
        self.c.subscribe([self.topic], on_assign=self._assigned, on_revoke=self._revoked)
        try:
            while not self.stopping.is_set():
                m = self.c.poll(0.1)
                if m is None or m.error():
                    continue
                self.values.append(int(m.value()))
                if len(self.values) % self.commit_every == 0:
                    try:
                        self.c.commit(m, asynchronous=False)
                    except KafkaException as e:
                        # a commit during a rebalance is refused (REBALANCE_IN_PROGRESS), as on Kafka;
                        # the next one after it goes through
                        self.commit_errors.append(e)
        except Exception as e:  # noqa: BLE001 - reported by the test
            self.error = e
        finally:
            self.c.close()

    # eager assignors revoke everything, then assign the whole new set; cooperative ones revoke and
    # assign only what moves: the partitions owned are tracked either way (the client applies them)
    def _assigned(self, consumer, parts):
        self.owned |= {p.partition for p in parts}
        self.assigned.append(sorted(self.owned))

    def _revoked(self, consumer, parts):
        self.owned -= {p.partition for p in parts}
        self.assigned.append(sorted(self.owned))

    def stop(self):
        self.stopping.set()
        self.join(20)


def wait_for(cond, timeout=30):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if cond():
            return True
        time.sleep(0.1)
    return False


@pytest.mark.parametrize("n", [3000, pytest.param(100_000, marks=pytest.mark.slow)])
def test_confluent_group_of_two_every_record_once_then_resume_from_commit(srv, bootstrap, n):
    topic, group = fresh("t"), fresh("grp")
    produce(bootstrap, topic, range(n), partitions=3, idempotent=True)
    members = [GroupMember(bootstrap, topic, group, commit_every=1 if n <= 3000 else 1000) for _ in range(2)]
    for m in members:
        m.start()
    assert wait_for(lambda: sum(len(m.values) for m in members) >= n, timeout=30 + n / 1000)
    final = [m.assigned[-1] for m in members]
    assert sorted(final[0] + final[1]) == [0, 1, 2]                # each partition to one member
    for m in members:
        m.stop()
        assert m.error is None
    seen = members[0].values + members[1].values
    assert sorted(seen) == list(range(n))                         # every record once
    if n > 3000:
        return

    # the commits are the engine's consumer offsets: a Kafka commit C is stored as C - 1
    from confluent_kafka import Consumer, TopicPartition
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
    committed = c.committed([TopicPartition(topic, i) for i in range(3)], timeout=10)
    c.close()
    assert sum(tp.offset for tp in committed) == 3000
    stored = asyncio.run(rstream_query(srv.port, [f"{topic}-{i}" for i in range(3)], group))
    assert stored == [tp.offset - 1 for tp in committed]

    # a restarted member resumes from the commit: only what came after
    produce(bootstrap, topic, range(3000, 3100))
    again = GroupMember(bootstrap, topic, group)
    again.start()
    assert wait_for(lambda: len(again.values) >= 100)
    time.sleep(0.5)
    again.stop()
    assert sorted(again.values) == list(range(3000, 3100))


def test_cooperative_sticky_group_of_two_then_a_third(bootstrap):
    topic, group = fresh("t"), fresh("coop")
    produce(bootstrap, topic, range(600), partitions=3)
    conf = {"partition.assignment.strategy": "cooperative-sticky"}
    members = [GroupMember(bootstrap, topic, group, **conf) for _ in range(2)]
    for m in members:
        m.start()
    assert wait_for(lambda: sum(len(m.values) for m in members) >= 600)
    assert sorted(members[0].assigned[-1] + members[1].assigned[-1]) == [0, 1, 2]
    third = GroupMember(bootstrap, topic, group, **conf)
    third.start()
    members.append(third)
    assert wait_for(lambda: all(m.assigned and len(m.assigned[-1]) == 1 for m in members), timeout=40)
    assert sorted(sum((m.assigned[-1] for m in members), [])) == [0, 1, 2]
    for m in members:
        m.stop()
        assert m.error is None
    assert sorted(members[0].values + members[1].values + third.values) == list(range(600))


async def rstream_query(port, streams, reference):
    from rstream import Consumer
    consumer = Consumer("127.0.0.1", port, username="guest", password="guest")
    await consumer.start()
    try:
        return [await consumer.query_offset(s, reference) for s in streams]
    finally:
        await consumer.close()


def test_rstream_store_offset_resumes_a_kafka_group(srv, bootstrap):
    from kafka import KafkaConsumer
    from rstream import Consumer
    topic, group = fresh("t"), fresh("grp")
    produce(bootstrap, topic, range(20))

    async def store():
        consumer = Consumer("127.0.0.1", srv.port, username="guest", password="guest")
        await consumer.start()
        await consumer.store_offset(topic, group, 11)      # processed up to 11: the group goes on at 12
        await consumer.close()
    asyncio.run(store())
    c = KafkaConsumer(topic, bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False,
                      auto_offset_reset="earliest", consumer_timeout_ms=4000)
    assert [int(m.value) for m in c] == list(range(12, 20))
    c.close()


def test_kafka_python_group_commit_resume_list_and_describe(bootstrap):
    from kafka import KafkaConsumer
    from kafka.admin import KafkaAdminClient
    topic, group = fresh("t"), fresh("kp")
    produce(bootstrap, topic, range(300), partitions=2)
    c = KafkaConsumer(topic, bootstrap_servers=bootstrap, group_id=group, auto_offset_reset="earliest",
                      enable_auto_commit=False, consumer_timeout_ms=4000)
    assert sorted(int(m.value) for m in c) == list(range(300))
    c.commit()
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    described = admin.describe_groups([group])[group]
    assert described["group_state"] == "Stable" and described["protocol_data"] in ("range", "roundrobin")
    (member,) = described["members"]
    assert sorted(member["member_assignment"]["assigned_partitions"][0]["partitions"]) == [0, 1]
    assert group in {g["group_id"] for g in admin.list_groups()}
    c.close()
    assert admin.describe_groups([group])[group]["group_state"] == "Empty"
    offsets = admin.list_group_offsets(group)[group]
    assert sum(o.offset for o in offsets.values()) == 300
    produce(bootstrap, topic, range(300, 310))
    c = KafkaConsumer(topic, bootstrap_servers=bootstrap, group_id=group, auto_offset_reset="earliest",
                      enable_auto_commit=False, consumer_timeout_ms=4000)
    assert sorted(int(m.value) for m in c) == list(range(300, 310))
    c.close()
    admin.close()


def test_aiokafka_rebalances_when_members_join_and_leave(bootstrap):
    from aiokafka import AIOKafkaConsumer
    topic, group = fresh("t"), fresh("aio")
    produce(bootstrap, topic, range(30), partitions=3)

    async def main():
        def member():
            return AIOKafkaConsumer(topic, bootstrap_servers=bootstrap, group_id=group, auto_offset_reset="earliest",
                                    session_timeout_ms=6000, heartbeat_interval_ms=300)

        async def settle(cs, want):
            deadline = time.time() + 30
            while time.time() < deadline:
                for c in cs:
                    await c.getmany(timeout_ms=50)
                parts = [sorted(tp.partition for tp in c.assignment()) for c in cs]
                if sorted(len(p) for p in parts) == want and sorted(sum(parts, [])) == [0, 1, 2]:
                    return parts
            raise AssertionError(f"no balanced assignment: {parts}")
        a, b = member(), member()
        await a.start()
        await b.start()
        await settle([a, b], [1, 2])
        c = member()
        await c.start()
        await settle([a, b, c], [1, 1, 1])             # a third member joined
        await b.stop()
        await settle([a, c], [1, 2])                   # one left
        await a.stop()
        await c.stop()
    asyncio.run(asyncio.wait_for(main(), 90))


def test_a_killed_member_is_removed_after_its_session_timeout(bootstrap):
    topic, group = fresh("t"), fresh("kill")
    produce(bootstrap, topic, range(10), partitions=2)
    code = f"""
from kafka import KafkaConsumer
c = KafkaConsumer({topic!r}, bootstrap_servers={bootstrap!r}, group_id={group!r}, session_timeout_ms=3000,
                  heartbeat_interval_ms=300, auto_offset_reset="earliest")
while not c.assignment():
    c.poll(200)
print("assigned", flush=True)
while True:
    c.poll(200)         # polling: it takes part in rebalances until it is killed
"""
    victim = subprocess.Popen([sys.executable, "-W", "ignore", "-c", code], stdout=subprocess.PIPE,
                              stderr=subprocess.DEVNULL, text=True)
    try:
        assert victim.stdout.readline().strip() == "assigned"
        survivor = GroupMember(bootstrap, topic, group)
        survivor.start()
        assert wait_for(lambda: survivor.assigned and len(survivor.assigned[-1]) == 1)
        victim.kill()
        victim.wait()
        # no LeaveGroup: the coordinator removes the member once its session times out, and rebalances
        assert wait_for(lambda: survivor.assigned[-1] == [0, 1], timeout=20)
        survivor.stop()
    finally:
        if victim.poll() is None:
            victim.kill()
            victim.wait()
