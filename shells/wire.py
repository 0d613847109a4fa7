"""Picks the compiled wire parsers (``_wire``) or their pure-Python twin (``_pywire``).

The protocols' frame parsers live in the shells, not the engine: the RabbitMQ Stream frame splitter and
Publish v1 -> sealed chunk pass, the BSON document splitter, the mewbase PUB recogniser and the Kafka
shell's record loops (Produce's records -> stored records, Fetch's stored records -> a record batch). The switch is
the engine's: ``RIVERBED_NO_EXTENSIONS=1`` forces the twin; otherwise the compiled module must import. A
silent fallback would make every benchmark and the "both twins pass" guarantee meaningless, so the test
suite asserts ``COMPILED`` here as it does for :mod:`riverbed.engine.core` (see tests/conftest.py).
Outside tests a missing build only logs a warning. Every name is a pure function and thread-safe.
"""

import logging
import os

NO_EXTENSIONS = os.environ.get("RIVERBED_NO_EXTENSIONS") == "1"

if NO_EXTENSIONS:
    from riverbed.shells import _pywire as impl
else:
    try:
        from riverbed.shells import _wire as impl
    except ImportError as exc:  # pragma: no cover - exercised only on a broken install
        logging.getLogger("riverbed").warning("compiled wire parsers unavailable (%s); using the pure-Python twin",
                                              exc)
        from riverbed.shells import _pywire as impl

COMPILED = impl.COMPILED

split_frames = impl.split_frames            # RabbitMQ Stream: u32 BE size | payload
split_bson_frames = impl.split_bson_frames  # BSON/TCP: whole documents, i32 LE size first
publish_chunk = impl.publish_chunk          # RabbitMQ Stream Publish v1 -> a sealed chunk in one pass
publish_alone = impl.publish_alone          # ... when one read is that one frame, with its PublishConfirm
bson_pub = impl.bson_pub                    # a mewbase PUB frame recognised without decoding it
kafka_stored = impl.kafka_stored            # Kafka Produce: a batch's records -> stored records (chunk entries)
kafka_batch = impl.kafka_batch              # Kafka Fetch: a chunk's stored records -> one record batch v2
kafka_chunk_batch = impl.kafka_chunk_batch  # Kafka Fetch: a stored chunk -> one record batch v2, into a buffer
kafka_chunk_batch_at = impl.kafka_chunk_batch_at    # the same, written at a position of a reserved buffer
kafka_reserve = impl.kafka_reserve          # Kafka Fetch: room for the batches of chunks read in place
kafka_sequence_ids = impl.kafka_sequence_ids    # Kafka Produce: idempotent sequences -> publishing ids
ream_publish_run = impl.ream_publish_run  # REAM: a run of plain pipelined EVENT PUBLISH requests
