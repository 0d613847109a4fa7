"""Stream ids to log streams, and partition-key routing.

A WebSocket stream id that names a super stream has that super stream's partitions, in its order; any
other stream id is one partition, the log stream of that name (DESIGN.md, "Names and partitions").

A ``pkey`` picks partition ``murmur3_x86_32(UTF-8 of pkey, seed 104729) as unsigned % n``: the hash
routing of the Java, Go, .NET and JS RabbitMQ Stream clients for super streams, so one key lands in one
partition from either protocol. (rstream 1.1.1 hashes differently; it is deliberately not followed.)
``mmh3.hash(data, seed, signed=False)`` is that function (MurmurHash3 x86 32-bit).
"""

import mmh3

PKEY_SEED = 104729


def pkey_hash(key):
    """MurmurHash3 x86 32-bit of the UTF-8 of ``key`` (str) with seed 104729, unsigned."""
    return mmh3.hash(key.encode("utf-8"), PKEY_SEED, signed=False)


def partition_for_key(key, n):
    """The partition (0..n-1) a partition key routes to among ``n`` partitions."""
    return pkey_hash(key) % n if n > 1 else 0


def log_streams(broker, stream_id):
    """The log streams of a WebSocket stream id, by partition: the super stream's partitions, else
    ``[stream_id]`` (which may not exist yet)."""
    parts = broker.partitions(stream_id)
    return parts if parts else [stream_id]
