"""Picks the compiled core (``_core``) or its pure-Python twin (``_pycore``).

``RIVERBED_NO_EXTENSIONS=1`` forces the twin. Otherwise the compiled module must import: a silent
fallback would make every benchmark and the "both twins pass" guarantee meaningless, so the test suite
asserts ``COMPILED`` (see tests/conftest.py). Outside tests a missing build only logs a warning.

The protocols' frame parsers are not here: :mod:`riverbed.shells.wire` picks those the same way.
"""

import logging
import os

NO_EXTENSIONS = os.environ.get("RIVERBED_NO_EXTENSIONS") == "1"

if NO_EXTENSIONS:
    from riverbed.engine import _pycore as impl
else:
    try:
        from riverbed.engine import _core as impl
    except ImportError as exc:  # pragma: no cover - exercised only on a broken install
        logging.getLogger("riverbed").warning("compiled core unavailable (%s); using the pure-Python twin", exc)
        from riverbed.engine import _pycore as impl

COMPILED = impl.COMPILED

crc32 = impl.crc32
encode_entries = impl.encode_entries
encode_sub_batch = impl.encode_sub_batch
build_chunk = impl.build_chunk
encode_chunk = impl.encode_chunk
encode_chunk_buffer = impl.encode_chunk_buffer
read_header = impl.read_header
stamp_chunk = impl.stamp_chunk     # the one-message commit: a sealed chunk's CRC and stamps in one call
check_chunk = impl.check_chunk
receive_buffer = impl.receive_buffer     # a bytearray left uninitialised (compiled) for a socket read to fill
data_records = impl.data_records
scan_entries = impl.scan_entries
walk_simple_entries = impl.walk_simple_entries
cut_entries = impl.cut_entries
chunk_records = impl.chunk_records
build_bloom = impl.build_bloom
bloom_match = impl.bloom_match
chunk_bloom_match = impl.chunk_bloom_match
new_arrow_buffers = impl.new_arrow_buffers
chunk_to_arrow = impl.chunk_to_arrow
json_lines = impl.json_lines     # decode=json: a batch's JSON payloads as newline-delimited JSON
# the one record format (AMQP 1.0 bare messages): riverbed.engine.record is the layer shells call
encode_message = impl.encode_message
decode_message = impl.decode_message
payload_kind = impl.payload_kind
BODY_DATA = impl.BODY_DATA
BODY_VALUE_BINARY = impl.BODY_VALUE_BINARY
BODY_VALUE_STRING = impl.BODY_VALUE_STRING
BODY_VALUE = impl.BODY_VALUE
BODY_SEQUENCE = impl.BODY_SEQUENCE
KIND_BYTES = impl.KIND_BYTES
KIND_JSON = impl.KIND_JSON
KIND_BSON = impl.KIND_BSON
# the document store: predicates over raw BSON and index values read out of it (docs.pxi / _pydocs.py)
DocMatcher = impl.DocMatcher
bson_values = impl.bson_values
bson_index_keys = impl.bson_index_keys
