"""Single active consumer across the nodes of a cluster (issue 25, shells/cluster/sac.py): the consumers
of one group, connected to different nodes, see exactly one active consumer cluster-wide (for a super
stream, one per partition, spread by RabbitMQ's partition-index rule), and when the active consumer's node
is killed -9 another node's consumer becomes active within the lease TTL + 2 s and resumes at the stored
offset + 1. Real etcd and three ``riverbed serve`` nodes (one cluster for the module), RabbitMQ Stream
consumers on the project's raw client (each pinned to the node it dials, which rstream's Consumer is not:
it picks a replica from Metadata)."""

import socket
import struct
import time

import pytest

import rawwire
from clusterfixtures import module_cluster
from test_replication import connect, leader_of, publish_batches, wait_placed

pytestmark = pytest.mark.integration

KEY_SUBSCRIBE, KEY_DELIVER, KEY_CREDIT, KEY_STORE_OFFSET, KEY_QUERY_OFFSET = 0x07, 0x08, 0x09, 0x0A, 0x0B
KEY_CREATE_SUPER, KEY_CONSUMER_UPDATE = 0x1D, 0x1A
OFFSET_FIRST, OFFSET_OFFSET = 1, 4
LEASE_TTL = 1.0


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with module_cluster(tmp_path_factory, "sac", lease_ttl=LEASE_TTL) as c:
        yield c


class SacConsumer:
    """One RabbitMQ Stream connection to one node, its SAC subscriptions and what reached them:
    ``updates`` [(sub id, active, correlation id, monotonic time)], ``chunks`` {sub id: [(first offset,
    records, monotonic time)]}. Blocking; the test drives it with :meth:`pump`."""

    def __init__(self, port, label):
        self.label = label
        self.c = connect(port)
        self.updates = []
        self.chunks = {}
        self.taken = set()       # correlation ids of the updates wait_update returned
        self.answered = set()    # correlation ids of the updates answered
        self.answers = []        # [(sub id, active, monotonic time)] of the answers sent

    def subscribe(self, sub_id, stream, group, super_stream=None, credit=100):
        props = {"single-active-consumer": "true", "name": group}
        if super_stream:
            props["super-stream"] = super_stream
        body = (struct.pack(">B", sub_id) + rawwire.s(stream) + struct.pack(">HH", OFFSET_FIRST, credit)
                + rawwire.props(props))
        code, _ = self.c.request(KEY_SUBSCRIBE, body)
        assert code == rawwire.OK, (self.label, stream, code)
        self.chunks.setdefault(sub_id, [])

    def pump(self, seconds):
        """Read for ``seconds``: ConsumerUpdates are recorded (answered by :meth:`answer`), Delivers
        recorded and given their credit back."""
        deadline = time.monotonic() + seconds
        while True:
            if self.c.pushed:
                f = self.c.pushed.pop(0)
            else:
                left = deadline - time.monotonic()
                if left <= 0:
                    return
                try:
                    f = self.c.recv_frame(left)
                except socket.timeout:
                    return
            assert f is not None, f"{self.label}: connection closed"
            key, _, body = f
            now = time.monotonic()
            if key == KEY_CONSUMER_UPDATE:
                corr, sub_id, active = struct.unpack_from(">IBB", body)
                self.updates.append((sub_id, active, corr, now))
            elif key == KEY_DELIVER:
                sub_id = body[0]
                records, = struct.unpack_from(">I", body, 1 + 4)
                first, = struct.unpack_from(">Q", body, 1 + 24)
                self.chunks.setdefault(sub_id, []).append((first, records, now))
                self.c.send(rawwire.frame(KEY_CREDIT, struct.pack(">BH", sub_id, 1)))

    def answer(self, corr, offset=None, sub_id=None, active=None):
        """Answer a ConsumerUpdate: start at ``offset`` (None: as subscribed, FIRST)."""
        self.answered.add(corr)
        self.answers.append((sub_id, active, time.monotonic()))
        spec = struct.pack(">HQ", OFFSET_OFFSET, offset) if offset is not None else struct.pack(">HQ", OFFSET_FIRST, 0)
        self.c.send(rawwire.frame(KEY_CONSUMER_UPDATE | 0x8000, struct.pack(">IH", corr, rawwire.OK) + spec))

    def store_offset(self, reference, stream, offset):
        body = rawwire.s(reference) + rawwire.s(stream) + struct.pack(">Q", offset)
        self.c.send(rawwire.frame(KEY_STORE_OFFSET, body))

    def query_offset(self, reference, stream):
        code, rest = self.c.request(KEY_QUERY_OFFSET, rawwire.s(reference) + rawwire.s(stream))
        return struct.unpack_from(">Q", rest)[0] if code == rawwire.OK else None

    def active_subs(self):
        """{sub id: the last ConsumerUpdate's active flag}."""
        out = {}
        for sub_id, active, _, _ in self.updates:
            out[sub_id] = active
        return out

    def active_at(self, sub_id, t):
        """Whether ``sub_id`` was active at monotonic time ``t``: activated before it, and not yet stepped
        down by then (a step-down counts once this client answered it)."""
        state = False
        events = [(at, 1) for (sid, a, _, at) in self.updates if sid == sub_id and a == 1]
        events += [(at, 0) for (sid, a, at) in self.answers if sid == sub_id and a == 0]
        for at, a in sorted(events):
            if at < t:
                state = bool(a)
        return state

    def close(self):
        self.c.close()


def pump_all(consumers, seconds):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        for c in consumers:
            c.pump(0.02)


def wait_update(consumers, what, timeout=10.0):
    """Pump until some consumer has a ConsumerUpdate not returned before that matches ``what(update)``;
    returns (consumer, update)."""
    deadline = time.monotonic() + timeout
    while True:
        for c in consumers:
            for u in c.updates:
                if u[2] not in c.taken and what(u):
                    c.taken.add(u[2])
                    return c, u
        if time.monotonic() >= deadline:
            raise AssertionError(f"no ConsumerUpdate as expected within {timeout} s: "
                                 f"{[(c.label, c.updates) for c in consumers]}")
        for c in consumers:
            c.pump(0.02)


def create_super_stream(port, name, partitions, keys):
    c = connect(port)
    try:
        body = (rawwire.s(name) + struct.pack(">i", len(partitions)) + b"".join(rawwire.s(p) for p in partitions)
                + struct.pack(">i", len(keys)) + b"".join(rawwire.s(k) for k in keys) + struct.pack(">i", 0))
        assert c.request(KEY_CREATE_SUPER, body)[0] == rawwire.OK
    finally:
        c.close()


def test_super_stream_group_one_active_per_partition_across_nodes(cluster):
    names = sorted(cluster.nodes)
    parts = ["ss-0", "ss-1", "ss-2"]
    create_super_stream(cluster.nodes["n1"].port, "ss", parts, ["0", "1", "2"])
    for p in parts:
        wait_placed(cluster, p)
    leaders = {p: leader_of(cluster, p) for p in parts}
    assert len(set(leaders.values())) > 1, f"partition leaders not spread: {leaders}"   # several coordinators
    consumers = {n: SacConsumer(cluster.nodes[n].port, n) for n in names}
    try:
        # the three join one after the other, each on every partition, each through its own node: with k
        # members, partition i is active on the (i mod k)-th to join (RabbitMQ's partition-index rule);
        # each move is a step-down, answered, before the activation elsewhere
        for k, n in enumerate(names, 1):
            for i, p in enumerate(parts):
                consumers[n].subscribe(i, p, "app", super_stream="ss")
            want = {i: [names[i % k]] for i in range(len(parts))}
            deadline = time.monotonic() + 15
            while True:
                for c in consumers.values():
                    c.pump(0.02)
                    for sub_id, active, corr, _ in c.updates:
                        if corr not in c.answered:
                            c.answer(corr, sub_id=sub_id, active=active)
                now = {i: [m for m in names if consumers[m].active_subs().get(i) == 1] for i in want}
                if now == want:
                    break
                assert time.monotonic() < deadline, f"after {n} joined: active {now}, want {want}"
        pump_all(consumers.values(), 0.5)
        assert all(u[2] in c.answered for c in consumers.values() for u in c.updates)    # nothing more came
        final = {n: c.active_subs() for n, c in consumers.items()}
        for i, p in enumerate(parts):
            active_on = [n for n in names if final[n].get(i) == 1]
            assert active_on == [names[i]], f"partition {p}: active on {active_on}; updates {final}"
            # never two active at once: each activation came after the step-down before it was answered
            timeline = sorted((t, n, a) for n in names for (sub_id, a, _, t) in consumers[n].updates if sub_id == i)
            for (t, n, a) in timeline:
                if a == 1:
                    holders = [m for m in names if m != n and consumers[m].active_at(i, t)]
                    assert holders == [], f"{p}: {n} activated at {t} while {holders} active"
        # what is published to each partition reaches its one active consumer only
        for p in parts:
            confirmed, _ = publish_batches(cluster.nodes[leaders[p]].port, p, 0, 30, batch=30)
            assert len(confirmed) == 30
        pump_all(consumers.values(), 1.5)
        for i, p in enumerate(parts):
            got = {n: sum(r for _, r, _ in consumers[n].chunks.get(i, [])) for n in names}
            assert got == {n: (30 if n == names[i] else 0) for n in names}, f"{p}: {got}"
    finally:
        for c in consumers.values():
            c.close()



def test_paused_nodes_active_consumer_replaced_on_its_lease_and_stepped_down_when_it_resumes(cluster):
    """SIGSTOP of the node holding the active consumer (its connections stay open): once its etcd key
    expires the leader drops its members and activates the next consumer; when it resumes, its consumer,
    which still believes it is active, registers again and is told to step down (ConsumerUpdate
    inactive) while the other one stays active."""
    import os
    import signal
    cl = connect(cluster.nodes["n1"].port)
    try:
        assert cl.create("sac-p", {"queue-leader-locator": "client-local"}) == rawwire.OK
    finally:
        cl.close()
    wait_placed(cluster, "sac-p")
    assert leader_of(cluster, "sac-p") == "n1"
    paused, other = SacConsumer(cluster.nodes["n3"].port, "n3"), SacConsumer(cluster.nodes["n2"].port, "n2")
    try:
        paused.subscribe(0, "sac-p", "p")
        _, (_, active, corr, _) = wait_update([paused], lambda u: u[0] == 0)
        assert active == 1
        paused.answer(corr)
        other.subscribe(0, "sac-p", "p")
        pump_all([paused, other], 0.5)
        assert other.updates == []
        os.kill(cluster.nodes["n3"].pid, signal.SIGSTOP)
        stopped = time.monotonic()
        try:
            _, (_, active, corr, at) = wait_update([other], lambda u: u[0] == 0, timeout=15)
            assert active == 1
            other.answer(corr)
            replaced = at - stopped
        finally:
            os.kill(cluster.nodes["n3"].pid, signal.SIGCONT)
        resumed = time.monotonic()
        _, (_, active, corr, at) = wait_update([paused, other], lambda u: True, timeout=15)
        assert (active, at > resumed) == (0, True) and (0, 0, corr, at) in paused.updates, (paused.updates,
                                                                                            other.updates)
        paused.answer(corr)
        pump_all([paused, other], 1.0)
        assert [u[1] for u in other.updates] == [1] and [u[1] for u in paused.updates] == [1, 0]
        print(f"SIGSTOP: the other consumer active {replaced:.2f} s after the pause; the paused one told to "
              f"step down {at - resumed:.2f} s after SIGCONT")
    finally:
        paused.close()
        other.close()


def test_rstream_consumers_on_the_replicas_one_active_then_the_next_from_the_stored_offset(cluster):
    """rstream 1.1.1 consumers, bootstrapped from the three nodes, each connect to a replica of their own
    choosing (Metadata): none is on the leader, so every registration crosses nodes. Exactly one of the
    three is delivered to; when it closes, another takes over at the stored offset + 1."""
    import asyncio

    from rstream import Consumer, OffsetNotFound, OffsetSpecification, OffsetType

    creds = dict(username="guest", password="guest")
    n, stored, group = 1000, 499, "rs"
    cl = connect(cluster.nodes["n1"].port)
    try:
        assert cl.create("sac-r", {"queue-leader-locator": "client-local"}) == rawwire.OK
    finally:
        cl.close()
    wait_placed(cluster, "sac-r")
    assert leader_of(cluster, "sac-r") == "n1"
    confirmed, _ = publish_batches(cluster.nodes["n1"].port, "sac-r", 0, n, batch=100)
    assert len(confirmed) == n
    props = {"single-active-consumer": "true", "name": group}

    async def scenario():
        got = {}
        half, done = asyncio.Event(), asyncio.Event()

        async def listener(is_active, ctx):
            try:
                offset = await ctx.consumer.query_offset(ctx.stream, ctx.reference)
            except OffsetNotFound:
                return OffsetSpecification(OffsetType.FIRST, 0)
            return OffsetSpecification(OffsetType.OFFSET, offset + 1)

        def on_message_of(name, first):
            async def on_message(msg, ctx):
                if first and half.is_set():
                    return                          # stopped processing; not acknowledged
                got.setdefault(name, []).append(ctx.offset)
                if first and ctx.offset == stored:
                    await ctx.consumer.store_offset(ctx.stream, group, ctx.offset)
                    half.set()
                if ctx.offset == n - 1:
                    done.set()
            return on_message

        consumers = {name: Consumer("127.0.0.1", cluster.nodes[name].port, **creds) for name in ("n1", "n2", "n3")}
        for c in consumers.values():
            await c.start()
        try:
            for name, c in consumers.items():
                await c.subscribe("sac-r", on_message_of(name, name == "n1"), properties=props,
                                  subscriber_name=group, consumer_update_listener=listener)
                if name == "n1":
                    await asyncio.wait_for(half.wait(), 20)
            await asyncio.sleep(1.0)
            assert list(got) == ["n1"], {k: len(v) for k, v in got.items()}
            # the stored offset reaches every replica before the active consumer leaves
            deadline = time.monotonic() + 10
            for node in ("n2", "n3"):
                q = SacConsumer(cluster.nodes[node].port, node)
                try:
                    while q.query_offset(group, "sac-r") != stored:
                        assert time.monotonic() < deadline, f"{node} never had the stored offset"
                        await asyncio.sleep(0.05)
                finally:
                    q.close()
            await consumers.pop("n1").close()
            await asyncio.wait_for(done.wait(), 20)
            await asyncio.sleep(0.5)
            # (taken before the others close: closing the active one activates the last, as it should)
            return {k: list(v) for k, v in got.items()}
        finally:
            for c in consumers.values():
                await c.close()

    got = asyncio.run(asyncio.wait_for(scenario(), 90))
    assert got["n1"] == list(range(stored + 1))
    takers = [k for k in got if k != "n1"]
    assert len(takers) == 1 and got[takers[0]] == list(range(stored + 1, n)), {k: v[:3] for k, v in got.items()}


def consumed(c, sub_id):
    return sum(r for _, r, _ in c.chunks.get(sub_id, []))


def test_active_consumers_node_killed_another_node_takes_over_from_the_stored_offset(cluster):
    """Three groups, each with a consumer on every node, then n1 is killed -9:

    * ``a``: on a stream n1 leads, active on n1: the coordinator dies with the consumer; the new leader
      rebuilds the group from the other nodes' registrations and activates the next consumer;
    * ``b``: on a stream n2 leads, active on n1: the coordinator sees n1's connection end;
    * ``c``: on a stream n1 leads, active on n2: the coordinator dies, the active consumer lives; it stays
      the active one (nobody gets a ConsumerUpdate) and is delivered what is published after the failover.

    For ``a`` and ``b``, one consumer on n2 or n3 becomes active within TTL + 2 s and is delivered from
    the stored offset + 1 (RabbitMQ's meaning: the stored offset is the last one processed), in order,
    to the end; the other consumer gets nothing."""
    n = 1000
    stored = 499
    # group: (its stream's leader, its stream, the node of its first (active) consumer)
    groups = {"a": ("n1", "sac-a", "n1"), "b": ("n2", "sac-b", "n1"), "c": ("n1", "sac-c", "n2")}
    sub_of = {g: i for i, g in enumerate(groups)}
    for leader, stream, _ in groups.values():
        cl = connect(cluster.nodes[leader].port)
        try:
            assert cl.create(stream, {"queue-leader-locator": "client-local"}) == rawwire.OK
        finally:
            cl.close()
    for leader, stream, _ in groups.values():
        wait_placed(cluster, stream)
        assert leader_of(cluster, stream) == leader
        confirmed, _ = publish_batches(cluster.nodes[leader].port, stream, 0, n, batch=100)
        assert len(confirmed) == n
    consumers = {n_: SacConsumer(cluster.nodes[n_].port, n_) for n_ in ("n1", "n2", "n3")}
    try:
        # the designated first consumer of each group joins first and is activated (nothing stored yet:
        # it starts from the first offset); then the consumers of the other two nodes join
        for g, (_, stream, first) in groups.items():
            consumers[first].subscribe(sub_of[g], stream, g)
            _, (_, active, corr, _) = wait_update([consumers[first]], lambda u, s=sub_of[g]: u[0] == s)
            assert active == 1
            consumers[first].answer(corr)
        for g, (_, stream, first) in groups.items():
            for other in consumers:
                if other != first:
                    consumers[other].subscribe(sub_of[g], stream, g)
        deadline = time.monotonic() + 20
        while any(consumed(consumers[first], sub_of[g]) < n for g, (_, _, first) in groups.items()):
            assert time.monotonic() < deadline, {c.label: c.chunks for c in consumers.values()}
            pump_all(consumers.values(), 0.1)
        pump_all(consumers.values(), 1.0)
        # exactly one active per group: its first; the others waited (no update, no delivery)
        for g, (_, _, first) in groups.items():
            for other, c in consumers.items():
                if other != first:
                    assert [u for u in c.updates if u[0] == sub_of[g]] == [] and not c.chunks[sub_of[g]], \
                        (g, other, c.updates, c.chunks)
        # the active consumers of a and b processed up to ``stored`` and store it; it reaches every node
        for g in ("a", "b"):
            consumers["n1"].store_offset(g, groups[g][1], stored)
        for node in ("n2", "n3"):
            for g in ("a", "b"):
                deadline = time.monotonic() + 10
                while consumers[node].query_offset(g, groups[g][1]) != stored:
                    assert time.monotonic() < deadline, f"{node} never had the stored offset of {g}"
                    time.sleep(0.05)
        consumers.pop("n1").close()
        cluster.nodes["n1"].kill()
        killed = time.monotonic()
        rest = [consumers["n2"], consumers["n3"]]
        took = {}
        for g in ("a", "b"):
            c, (_, _, corr, at) = wait_update(rest, lambda u, s=sub_of[g]: u[0] == s and u[1] == 1,
                                              timeout=LEASE_TTL + 2 + 5)
            took[g] = (c, at - killed)
            offset = c.query_offset(g, groups[g][1])
            assert offset == stored
            c.answer(corr, offset + 1)     # RabbitMQ's meaning: the stored offset is the last one processed
        deadline = time.monotonic() + 20
        while any(consumed(took[g][0], sub_of[g]) < n - stored - 1 for g in took):
            assert time.monotonic() < deadline, {g: took[g][0].chunks for g in took}
            pump_all(rest, 0.1)
        # c: its new leader has gathered and decided by now; its active consumer on n2 was told nothing
        new_leader = leader_of(cluster, "sac-c", not_this="n1")
        pump_all(rest, 1.0)
        confirmed, _ = publish_batches(cluster.nodes[new_leader].port, "sac-c", n, 100, batch=100)
        assert len(confirmed) == 100
        deadline = time.monotonic() + 10
        while consumed(consumers["n2"], sub_of["c"]) < n + 100:
            assert time.monotonic() < deadline, consumers["n2"].chunks[sub_of["c"]]
            pump_all(rest, 0.1)
        pump_all(rest, 0.5)
        for c in rest:
            assert [u for u in c.updates if u[0] == sub_of["c"] and u[3] > killed] == [], (c.label, c.updates)
        assert consumed(consumers["n3"], sub_of["c"]) == 0
        for g, (c, seconds) in took.items():
            assert seconds <= LEASE_TTL + 2, f"group {g}: {c.label} became active {seconds:.2f} s after the kill"
            chunks = c.chunks[sub_of[g]]
            first_chunk, records, _ = chunks[0]
            assert first_chunk <= stored + 1 < first_chunk + records, chunks
            ends = [f + r for f, r, _ in chunks]
            assert ends[-1] == n and [f for f, _, _ in chunks[1:]] == ends[:-1], chunks   # in order, no gap
            loser = next(x for x in rest if x is not c)
            assert [u for u in loser.updates if u[0] == sub_of[g]] == [] and not loser.chunks[sub_of[g]], \
                (g, loser.label, loser.updates)
            print(f"group {g}: {c.label} active {seconds:.2f} s after kill -9 n1, first chunk {first_chunk} "
                  f"(stored {stored})")
    finally:
        for c in consumers.values():
            c.close()
