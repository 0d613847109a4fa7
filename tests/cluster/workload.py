"""A confirmed-publishing and consuming workload for the cluster's failure tests, and its checker.

* :class:`Publisher`: a named publisher (RabbitMQ Stream ``DeclarePublisher`` reference, so the broker
  deduplicates by publishing id) publishing numbered messages in batches to whichever node the cluster
  status names leader. When its connection ends, a publish is refused or confirms stop coming, it finds
  the leader again and re-sends every unconfirmed message with the same publishing ids.
* :class:`Consumer`: reads the stream from any live node with Subscribe at an offset, notes every
  ``(offset, message)`` it is delivered, and resumes on another node after the next offset it needs.
* :func:`read_log` / :func:`check`: the final log of a node, and the checks every failure test makes:
  every confirmed message in it exactly once, nothing stored twice, everything the consumer saw at the
  same offset in it.

Blocking sockets and threads (rawwire), so a test keeps the server processes as real as they get.
"""

import random
import socket
import struct
import threading
import time

import rawwire
from rawwire import KEY_CREDIT, KEY_DELIVER, KEY_SUBSCRIBE, delivered_chunk, frame, props, s

OFFSET_AT = 4


def body_of(ref, seq):
    return b"%s-%d" % (ref.encode(), seq)


def parse_body(body):
    ref, _, seq = body.rpartition(b"-")
    return ref.decode(), int(seq)


def connect(port, host="127.0.0.1", timeout=3.0):
    return rawwire.connect(port, host=host, timeout=timeout)


class Leaders:
    """Who leads ``stream`` and the ports of the live nodes, from ``cluster.status()`` (cached briefly so
    that several threads polling it do not load etcd)."""

    def __init__(self, cluster, stream, ttl=0.05):
        self.cluster = cluster
        self.stream = stream
        self.ttl = ttl
        self._lock = threading.Lock()
        self._at = 0.0
        self._doc = None

    def doc(self):
        with self._lock:
            if self._doc is None or time.monotonic() - self._at > self.ttl:
                try:
                    self._doc = self.cluster.status()
                except Exception:           # etcd restarting (nemesis): no answer this time
                    self._doc = None
                self._at = time.monotonic()
            return self._doc

    def leader(self):
        """``(name, port)`` of the leader if it is up, else None."""
        doc = self.doc()
        if doc is None:
            return None
        st = next((x for x in doc["streams"] if x["name"] == self.stream), None)
        if st is None:
            return None
        for n in doc["nodes"]:
            if n["name"] == st["leader"] and n["up"] and n["stream_port"]:
                return n["name"], n["stream_port"]
        return None

    def live(self):
        doc = self.doc()
        return [] if doc is None else [(n["name"], n["stream_port"]) for n in doc["nodes"]
                                       if n["up"] and n["stream_port"]]


class Publisher(threading.Thread):
    """Publishes ``ref-0``, ``ref-1``, ... in batches of ``batch`` (publishing id = the number) until
    :meth:`stop`. ``confirmed``: {id: (monotonic time, node)} of every confirm received."""

    def __init__(self, leaders, stream, ref, batch=20, timeout=3.0, pace=0.0):
        super().__init__(daemon=True, name=f"publisher-{ref}")
        self.leaders = leaders
        self.stream = stream
        self.ref = ref
        self.batch = batch
        self.timeout = timeout
        self.pace = pace
        self.confirmed = {}
        self.next_seq = 0
        self.pending = []
        self.refusals = 0
        self.reconnects = 0
        self._halt = threading.Event()
        self.lock = threading.Lock()

    def stop(self):
        self._halt.set()
        self.join(30)

    def confirms_after(self, t0, not_node=None):
        """The first confirm time after ``t0`` from a node other than ``not_node``, or None."""
        with self.lock:
            times = [t for t, n in self.confirmed.values() if t > t0 and n != not_node]
        return min(times) if times else None

    def run(self):
        while not self._halt.is_set():
            lead = self.leaders.leader()
            if lead is None:
                time.sleep(0.05)
                continue
            node, port = lead
            try:
                c = connect(port)
            except (OSError, ConnectionError, AssertionError):
                time.sleep(0.05)
                continue
            self.reconnects += 1
            try:
                if c.declare_publisher(1, self.stream, self.ref) != rawwire.OK:
                    time.sleep(0.05)
                    continue
                self._publish_on(c, node)
            except (OSError, ConnectionError, AssertionError, struct.error):
                pass
            finally:
                c.close()

    def _publish_on(self, c, node):
        while not self._halt.is_set():
            if not self.pending:
                self.pending = list(range(self.next_seq, self.next_seq + self.batch))
                self.next_seq += self.batch
            ok, bad = c.publish_confirmed(1, [(i, body_of(self.ref, i)) for i in self.pending], timeout=self.timeout)
            now = time.monotonic()
            with self.lock:
                for i in ok:
                    self.confirmed.setdefault(i, (now, node))
            self.pending = [i for i in self.pending if i not in ok]
            if bad:
                self.refusals += 1
                time.sleep(0.05)
                return          # not the leader (any more), or no majority in time: find the leader again
            if self.pace:
                time.sleep(self.pace)


class Consumer(threading.Thread):
    """Reads ``stream`` from live nodes (a random one each time it (re)connects), from offset 0 on.
    ``seen``: [(offset, message)] in delivery order."""

    def __init__(self, leaders, stream):
        super().__init__(daemon=True, name=f"consumer-{stream}")
        self.leaders = leaders
        self.stream = stream
        self.seen = []
        self.next_offset = 0
        self.reconnects = 0
        self._halt = threading.Event()

    def stop(self):
        self._halt.set()
        self.join(30)

    def run(self):
        while not self._halt.is_set():
            live = self.leaders.live()
            if not live:
                time.sleep(0.05)
                continue
            _, port = random.choice(live)
            try:
                c = connect(port)
            except (OSError, ConnectionError, AssertionError):
                time.sleep(0.05)
                continue
            self.reconnects += 1
            try:
                self._consume_on(c)
            except (OSError, ConnectionError, AssertionError, struct.error):
                pass
            finally:
                c.close()
            time.sleep(0.05)

    def _consume_on(self, c):
        code, _ = c.request(KEY_SUBSCRIBE, struct.pack(">B", 0) + s(self.stream)
                            + struct.pack(">HQH", OFFSET_AT, self.next_offset, 10) + props({}))
        if code != rawwire.OK:
            return
        while not self._halt.is_set():
            if c.pushed:
                f = c.pushed.pop(0)
            else:
                try:
                    f = c.recv_frame(0.5)
                except socket.timeout:
                    continue
            if f is None:
                return
            key, _, body = f
            if key != KEY_DELIVER or body[0] != 0:
                continue
            first, records = delivered_chunk(body)
            for k, rec in enumerate(records):
                if first + k >= self.next_offset:
                    self.seen.append((first + k, rec))
                    self.next_offset = first + k + 1
            c.send(frame(KEY_CREDIT, struct.pack(">BH", 0, 1)))


def read_log(port, stream, settle=0.5, timeout=30.0, client=None):
    """Every record of ``stream`` on the node at ``port`` (its readers stop at the committed offset),
    as a list indexed by offset. ``client``: a connected, authenticated RawClient to use instead."""
    c = client or connect(port, timeout=5.0)
    try:
        return c.read_from_first(stream, settle, timeout)
    finally:
        c.close()


def check(log, publishers, consumers=()):
    """Assert the failure tests' guarantees on the final ``log``; returns a summary dict."""
    where = {}
    dups = []
    for off, body in enumerate(log):
        key = parse_body(body)
        if key in where:
            dups.append((key, where[key], off))
        where[key] = off
    assert not dups, f"{len(dups)} message(s) stored twice, e.g. {dups[:5]}"
    lost = []
    confirmed = 0
    for p in publishers:
        with p.lock:
            ids = list(p.confirmed)
        confirmed += len(ids)
        lost += [(p.ref, i) for i in ids if (p.ref, i) not in where]
    assert not lost, f"{len(lost)} confirmed message(s) lost, e.g. {sorted(lost)[:5]}"
    seen = 0
    for cons in consumers:
        wrong = [(off, body) for off, body in cons.seen if off >= len(log) or log[off] != body]
        assert not wrong, f"the consumer saw {len(wrong)} record(s) that the final log does not hold there: {wrong[:5]}"
        seen += len(cons.seen)
    return {"log": len(log), "confirmed": confirmed, "consumed": seen}
