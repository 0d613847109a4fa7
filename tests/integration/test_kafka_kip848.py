"""KIP-848 consumer groups with librdkafka's ``group.protocol=consumer`` (confluent-kafka, unchanged) on
the real server: a group of two on a three-partition topic (each partition to one member, every record
once), commit and resume, a third member joining, one leaving, one killed and removed after the broker's
session timeout; ListGroups, DescribeGroups (ConsumerGroupDescribe) through the admin client."""

import os
import signal
import subprocess
import sys
import threading
import time

import pytest

sys.path.insert(0, os.path.dirname(__file__))
from test_kafka_groups import fresh, produce, wait_for  # noqa: E402

pytestmark = [pytest.mark.integration, pytest.mark.filterwarnings("ignore::DeprecationWarning")]

SESSION_TIMEOUT_MS = 3000


# conftest.kafka_server: short group timers
KAFKA_SERVER_ARGS = ("--kafka-group-session-timeout-ms", str(SESSION_TIMEOUT_MS),
                     "--kafka-group-heartbeat-interval-ms", "300")


@pytest.fixture(scope="module")
def srv(kafka_server):
    return kafka_server


class Owners:
    """Which member owns which partition, checked on every change: never two owners at once."""

    def __init__(self):
        self.lock = threading.Lock()
        self.by_partition = {}
        self.violations = []

    def take(self, who, parts):
        with self.lock:
            for p in parts:
                if self.by_partition.get(p) not in (None, who):
                    self.violations.append((p, self.by_partition[p], who))
                self.by_partition[p] = who

    def give(self, who, parts):
        with self.lock:
            for p in parts:
                if self.by_partition.get(p) == who:
                    del self.by_partition[p]


class Member(threading.Thread):
    """A confluent-kafka consumer with ``group.protocol=consumer``, polling in a thread, committing each
    record it takes; the partitions it owns follow its assign/revoke callbacks (incremental here)."""

    def __init__(self, bootstrap, topic, group, owners, name, commit_every=1):
        super().__init__(daemon=True)
        self.commit_every = commit_every
        from confluent_kafka import Consumer
        self.c = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "group.protocol": "consumer",
                           "auto.offset.reset": "earliest", "enable.auto.commit": False})
        self.topic, self.owners, self.name = topic, owners, name
        self.values = []
        self.owned = set()
        self.stopping = threading.Event()
        self.error = None

    def run(self):
        from confluent_kafka import KafkaException
        self.c.subscribe([self.topic], on_assign=self._assigned, on_revoke=self._revoked, on_lost=self._revoked)
        try:
            while not self.stopping.is_set():
                m = self.c.poll(0.1)
                if m is None or m.error():
                    continue
                self.values.append(int(m.value()))
                if len(self.values) % self.commit_every:
                    continue
                try:
                    self.c.commit(m, asynchronous=False)
                except KafkaException:
                    pass        # a commit racing an epoch change is refused (STALE_MEMBER_EPOCH); the next goes
        except Exception as e:  # noqa: BLE001 - reported by the test
            self.error = e
        finally:
            self.c.close()       # leaves the group (epoch -1) after revoking what it owns

    def _assigned(self, consumer, parts):
        ps = {p.partition for p in parts}
        self.owners.take(self.name, ps)
        self.owned |= ps

    def _revoked(self, consumer, parts):
        ps = {p.partition for p in parts}
        self.owned -= ps
        self.owners.give(self.name, ps)

    def stop(self):
        self.stopping.set()
        self.join(30)
        assert not self.is_alive()


def settled(members, sizes):
    return lambda: sorted(len(m.owned) for m in members) == sorted(sizes) and \
        sorted(p for m in members for p in m.owned) == [0, 1, 2]


@pytest.mark.parametrize("n", [3000, pytest.param(100_000, marks=pytest.mark.slow)])
def test_group_of_two_every_record_once_commit_and_resume(srv, bootstrap, n):
    topic, group = fresh("t"), fresh("kip")
    produce(bootstrap, topic, range(n), partitions=3, idempotent=True)
    owners = Owners()
    members = [Member(bootstrap, topic, group, owners, f"m{i}", commit_every=1 if n <= 3000 else 1000)
               for i in range(2)]
    for m in members:
        m.start()
    assert wait_for(lambda: sum(len(m.values) for m in members) >= n, timeout=60 + n / 1000)
    assert wait_for(settled(members, [1, 2]))                       # each partition to one member
    for m in members:
        m.stop()
        assert m.error is None
    assert sorted(members[0].values + members[1].values) == list(range(n))      # every record once
    assert owners.violations == []
    if n > 3000:
        return

    from confluent_kafka import Consumer, TopicPartition
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "group.protocol": "consumer"})
    committed = c.committed([TopicPartition(topic, i) for i in range(3)], timeout=10)
    c.close()
    assert sum(tp.offset for tp in committed) == 3000

    # a member started again resumes from the commits: only what came after
    produce(bootstrap, topic, range(3000, 3100))
    again = Member(bootstrap, topic, group, owners, "again")
    again.start()
    assert wait_for(lambda: len(again.values) >= 100, timeout=30)
    time.sleep(0.5)
    again.stop()
    assert sorted(again.values) == list(range(3000, 3100))


def test_a_third_member_joins_then_one_leaves(bootstrap):
    topic, group = fresh("t"), fresh("kip")
    produce(bootstrap, topic, range(600), partitions=3)
    owners = Owners()
    members = [Member(bootstrap, topic, group, owners, f"m{i}") for i in range(2)]
    for m in members:
        m.start()
    assert wait_for(lambda: sum(len(m.values) for m in members) >= 600, timeout=60)
    assert wait_for(settled(members, [1, 2]))
    third = Member(bootstrap, topic, group, owners, "m2")
    third.start()
    members.append(third)
    assert wait_for(settled(members, [1, 1, 1]), timeout=30)      # the server moved one partition to it
    produce(bootstrap, topic, range(600, 900))
    assert wait_for(lambda: sum(len(m.values) for m in members) >= 900, timeout=30)
    assert len(third.values) > 0
    members[0].stop()                                               # leaves: its partition goes to another
    rest = members[1:]
    assert wait_for(settled(rest, [1, 2]), timeout=30)
    produce(bootstrap, topic, range(900, 1200))
    assert wait_for(lambda: sum(len(m.values) for m in members) >= 1200, timeout=30)
    for m in rest:
        m.stop()
    for m in members:
        assert m.error is None
    assert sorted(v for m in members for v in m.values) == list(range(1200))
    assert owners.violations == []

    # the admin client lists the group as a consumer group and describes it (ConsumerGroupDescribe)
    from confluent_kafka.admin import AdminClient
    admin = AdminClient({"bootstrap.servers": bootstrap})
    listed = admin.list_consumer_groups(request_timeout=10).result()
    assert group in [g.group_id for g in listed.valid]
    desc = admin.describe_consumer_groups([group], request_timeout=10)[group].result()
    assert desc.group_id == group and str(desc.state).endswith("EMPTY")


KILLED = """
import sys
from confluent_kafka import Consumer
c = Consumer({"bootstrap.servers": sys.argv[1], "group.id": sys.argv[2], "group.protocol": "consumer",
              "auto.offset.reset": "earliest"})
c.subscribe([sys.argv[3]], on_assign=lambda cons, parts: parts and print("assigned", flush=True))
while True:
    c.poll(0.2)
"""


def test_a_killed_member_is_removed_after_the_session_timeout(bootstrap):
    topic, group = fresh("t"), fresh("kill")
    produce(bootstrap, topic, range(30), partitions=3)
    victim = subprocess.Popen([sys.executable, "-W", "ignore", "-c", KILLED, bootstrap, group, topic],
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        assert victim.stdout.readline().strip() == "assigned"
        owners = Owners()
        survivor = Member(bootstrap, topic, group, owners, "survivor")
        survivor.start()
        assert wait_for(lambda: 0 < len(survivor.owned) < 3, timeout=30)
        os.kill(victim.pid, signal.SIGKILL)                         # no leave heartbeat
        victim.wait()
        t0 = time.monotonic()
        # removed once its session times out on the broker (3 s here): the survivor gets everything
        assert wait_for(lambda: survivor.owned == {0, 1, 2}, timeout=20)
        took = time.monotonic() - t0
        assert took >= SESSION_TIMEOUT_MS / 1000 - 1.0, took
        produce(bootstrap, topic, range(30, 60))
        assert wait_for(lambda: set(range(30, 60)) <= set(survivor.values), timeout=20)
        survivor.stop()
        assert survivor.error is None
    finally:
        if victim.poll() is None:
            victim.kill()
            victim.wait()
