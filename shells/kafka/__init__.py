"""The Kafka shell: the Kafka wire protocol over the one log (codec, sans-I/O session, thin server).

A topic with one partition is the stream of that name; a topic with N > 1 partitions is the super
stream of that name with partitions ``<topic>-<i>``. Offsets are the log's offsets.
"""

from riverbed.shells.kafka.server import KafkaServer, serve

__all__ = ["KafkaServer", "serve"]
