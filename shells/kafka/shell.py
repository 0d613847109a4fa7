"""What the Kafka connections of one broker share: settings, the advertised address, the topic view of
the log (a topic with one partition is the stream of that name; a topic with N > 1 partitions is the
super stream of that name, partitions ``<topic>-<i>``), and a timer for Fetch long polling."""

from riverbed.engine import OffsetSpec
from riverbed.engine.errors import RiverbedError
from riverbed.shells.kafka.codec import topic_uuid
from riverbed.shells.kafka.consumer_groups import (DEFAULT_HEARTBEAT_INTERVAL_MS, DEFAULT_SESSION_TIMEOUT_MS,
                                                   ConsumerCoordinator)
from riverbed.shells.kafka.groups import Coordinator

NODE_ID = 0
CLUSTER_ID = "riverbed"
RECENT_PRODUCERS = 10000          # (partition, producer) pairs whose recent batches are remembered
MAX_CACHED_IDS = 100000           # topic ids kept computed
RECENT_BATCHES = 8                # per producer and partition: Kafka keeps 5 (max.in.flight)
# Partitions one topic may have (the HTTP API's bound for a super stream): a CreateTopics or CreatePartitions
# asking for more is INVALID_PARTITIONS before any stream is made, not millions of streams (atheris kafka)
MAX_TOPIC_PARTITIONS = 1024


def partition_name(topic, i):
    """The stream of partition ``i`` of a topic with several partitions (RabbitMQ's naming)."""
    return f"{topic}-{i}"


def retention_arguments(configs):
    """Stream arguments from Kafka topic configs (``retention.ms``, ``retention.bytes``); other names are
    accepted and not kept. Raises ValueError for a value that is not an integer."""
    args = {}
    for c in configs or ():
        name, value = c.get("name"), c.get("value")
        if value is None:
            continue
        if name == "retention.ms":
            ms = int(value)
            if ms > 0:
                args["max-age"] = f"{max(1, ms // 1000)}s"
        elif name == "retention.bytes":
            n = int(value)
            if n > 0:
                args["max-length-bytes"] = n
    return args


class KafkaShell:
    """Per-broker state of the Kafka listener(s). ``call_later(delay s, fn) -> cancel()`` is the loop's
    timer (the server sets it; sans-I/O tests give their own). ``group_session_timeout_ms`` and
    ``group_heartbeat_interval_ms`` are the KIP-848 groups' (the broker sets them there, not the client).
    Loop-thread only."""

    def __init__(self, broker, *, advertised_host=None, advertised_port=None, call_later=None,
                 group_session_timeout_ms=DEFAULT_SESSION_TIMEOUT_MS,
                 group_heartbeat_interval_ms=DEFAULT_HEARTBEAT_INTERVAL_MS):
        self.broker = broker
        self.advertised_host = advertised_host
        self.advertised_port = advertised_port
        self.listen_port = 0
        self.call_later = call_later
        self.groups = Coordinator(broker.clock)
        self.consumer_groups = ConsumerCoordinator(
            broker.clock, self.topics, lambda t: len(self.partitions(t) or ()), topic_id=self.topic_id,
            session_timeout_ms=group_session_timeout_ms, heartbeat_interval_ms=group_heartbeat_interval_ms)
        self._ids = {}          # topic -> its id (a cache)
        self._batches = {}      # (stream, publisher) -> {base sequence: base offset} of its last batches

    def remember_batch(self, stream, publisher, base_sequence, base_offset):
        """Keep where an idempotent producer's batch was stored, so its retry (dropped as a duplicate)
        is answered with the same offset, as Kafka does for a producer's last 5 batches."""
        if (stream, publisher) not in self._batches and len(self._batches) >= RECENT_PRODUCERS:
            del self._batches[next(iter(self._batches))]     # the oldest producer's memory goes first
        seen = self._batches.setdefault((stream, publisher), {})
        seen[base_sequence] = base_offset
        while len(seen) > RECENT_BATCHES:
            del seen[next(iter(seen))]

    def batch_offset(self, stream, publisher, base_sequence):
        """The base offset of a recent batch of that producer, or -1 when it is not remembered."""
        return self._batches.get((stream, publisher), {}).get(base_sequence, -1)

    # ------------------------------------------------------------------------------ the topic view

    def topic_id(self, topic):
        """The topic id of ``topic`` (16 bytes; Metadata 10+, KIP-848 assignments): derived from the name
        alone, so it is the same on every node of a cluster and across restarts with nothing to store."""
        tid = self._ids.get(topic)
        if tid is None:
            if len(self._ids) >= MAX_CACHED_IDS:
                self._ids.clear()
            tid = self._ids[topic] = topic_uuid(topic)
        return tid

    def partitions(self, topic):
        """The streams of ``topic``'s partitions in order, or None when there is no such topic."""
        if not topic:
            return None
        parts = self.broker.partitions(topic)
        if parts:
            return parts
        # in a cluster, also a stream placed on other nodes only: Metadata names its leader
        if self.broker.has_stream_anywhere(topic):
            return [topic]
        return None

    def stream_of(self, topic, partition):
        """The stream of one partition, or None when there is no such topic or partition."""
        parts = self.partitions(topic)
        if parts is None or not 0 <= partition < len(parts):
            return None
        return parts[partition]

    def topics(self):
        """Every topic: super streams, and streams that are no super stream's partition."""
        supers = self.broker.list_super_streams()
        inside = set()
        for s in supers:
            inside.update(self.broker.partitions(s) or ())
        names = set(supers)
        names.update(n for n in self.broker.list_streams() if n not in inside)
        return sorted(names)

    def offsets(self, stream):
        """(log start offset, high watermark) of ``stream``. Raises StreamNotFound."""
        return self.broker.resolve(stream, OffsetSpec.first()), self.broker.resolve(stream, OffsetSpec.next())

    def create_topic(self, name, partitions, args, cb):
        """Create topic ``name`` with ``partitions`` (>= 1); ``cb(exc)``."""
        if partitions == 1:
            self.broker.create_stream(name, args, cb)
            return
        parts = [partition_name(name, i) for i in range(partitions)]
        try:
            self.broker.create_super_stream(name, parts, [str(i) for i in range(partitions)], args, cb)
        except RiverbedError as e:
            cb(e)
