"""The engine's one record format and its chunk parser, compiled core against its pure-Python twin.

``record``: input = flag byte + one stored record's bytes. Decoded by both twins (they must agree), then
rendered for every protocol: JSON text and value (WebSocket, REAM, HTTP), BSON document and bytes
(BSON/TCP), mc0 MESSAGE frames (ZeroMQ), the HTTP records route. The renderers are documented as never
raising, so any exception is a finding.

``chunk``: input = flag byte + a chunk. With FLAG_PRELUDE (bit 0) the body is ``u16 entries | u16
records | data section`` and the harness seals it into a chunk with a right CRC, so the fuzz reaches
the entry walk instead of dying at the checksum. Both twins must agree on the result or the error type.
"""

import struct

from riverbed.engine import _pycore
from riverbed.engine import record as rec
from riverbed.engine.errors import RiverbedError
from riverbed.engine.core import impl as compiled
from riverbed.shells import _pywire
from riverbed.shells.wire import impl as compiled_wire
from riverbed.shells.http import api as http_api
from riverbed.shells.zmq_mc0 import codec as zmq_codec

from .harness import FLAG_PRELUDE, InvariantBroken


def _outcome(fn, *args, **kw):
    try:
        return ("ok", fn(*args, **kw))
    except (RiverbedError, OverflowError) as e:    # OverflowError: documented (ids and times past int64)
        return ("error", type(e).__name__)


def _norm(value):
    """Results of both twins in one comparable shape (memoryviews, bytearrays and tuples vary)."""
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    if isinstance(value, (list, tuple)):
        return [_norm(v) for v in value]
    if isinstance(value, dict):
        return {k: _norm(v) for k, v in value.items()}
    return value


def _agree(what, a, b):
    if _norm(a) != _norm(b):
        raise InvariantBroken(f"{what}: compiled {str(_norm(a))[:200]} != pure {str(_norm(b))[:200]}")


class RecordTarget:
    name = "record"

    def __init__(self, root=None):
        pass

    def run(self, data):
        body = bytes(data[1:])
        a = compiled.decode_message(body)
        b = _pycore.decode_message(body)
        _agree("decode_message", a, b)
        _agree("payload_kind", compiled.payload_kind(body), _pycore.payload_kind(body))
        r = rec.decode_record(body)
        rec.to_json_text(r)
        rec.to_json_value(r)
        rec.to_bson_document(r)
        rec.to_bson_bytes(r)
        http_api.render_record(0, 0, body)
        zmq_codec.record_message(b"topic", body, 0)

    def seeds(self):
        import bson

        return [
            b"\x00" + rec.encode_record(b'{"a":1,"b":[true,null]}', rec.CT_JSON, 1234, {"k": "v", "n": "5"}),
            b"\x00" + rec.encode_record(bson.encode({"a": 1, "d": {"e": "f"}}), rec.CT_BSON),
            b"\x00" + rec.encode_record(b"plain bytes", None),
            b"\x00" + rec.encode_record([b"part1", b"part2"], "text/plain"),
            b"\x00" + rec.from_json_text('{"x":"y"}', creation_time=5),
            b"\x00" + b'{"raw":"json"}',
            b"\x00" + bson.encode({"raw": "bson", "n": [1, 2.5, None]}),
            b"\x00" + b"\x00\x53\x70\xc0\x01\x00",
        ]

    def close(self):
        pass


class ChunkTarget:
    name = "chunk"

    def __init__(self, root=None):
        pass

    def run(self, data):
        flags = data[0] if data else 0
        body = bytes(data[1:])
        if flags & FLAG_PRELUDE and len(body) >= 4:
            entries, records = struct.unpack_from(">HH", body, 0)
            chunk = _pycore.build_chunk(body[4:], entries, records, 1000, 7)
        else:
            chunk = body
        _agree("check_chunk", _outcome(compiled.check_chunk, chunk), _outcome(_pycore.check_chunk, chunk))
        for verify in (True, False):
            _agree("chunk_records", _outcome(compiled.chunk_records, chunk, verify),
                   _outcome(_pycore.chunk_records, chunk, verify))
        data_section = body[4:] if flags & FLAG_PRELUDE else body
        _agree("scan_entries", _outcome(compiled.scan_entries, data_section), _outcome(_pycore.scan_entries, data_section))
        _agree("cut_entries", _outcome(compiled.cut_entries, data_section, 100, 3, 5),
               _outcome(_pycore.cut_entries, data_section, 100, 3, 5))
        for wire in (False, True):
            a = _outcome(compiled.chunk_to_arrow, chunk, 7, None, None, True, wire)
            b = _outcome(_pycore.chunk_to_arrow, chunk, 7, None, None, True, wire)
            _agree("chunk_to_arrow", a, b)
        # the same bytes as a RabbitMQ Stream Publish v1 payload (key 2, version 1), for the shells' wire
        # parser that seals such a payload into a chunk
        payload = b"\x00\x02\x00\x01" + body
        _agree("publish_chunk", _outcome(compiled_wire.publish_chunk, payload),
               _outcome(_pywire.publish_chunk, payload))

    def seeds(self):
        import zlib

        from riverbed.engine import format as fmt

        simple = b"".join(struct.pack(">I", len(r)) + r for r in (b"a", b"bc", b"def"))
        inner = b"".join(struct.pack(">I", len(r)) + r for r in (b"x" * 20, b"y"))
        gz = zlib.compress(inner)
        sub = struct.pack(">BHII", 0x80 | (fmt.COMPRESSION_GZIP << 4), 2, len(inner), len(gz)) + gz
        plain_sub = struct.pack(">BHII", 0x80, 2, len(inner), len(inner)) + inner
        return [
            bytes([FLAG_PRELUDE]) + struct.pack(">HH", 3, 3) + simple,
            bytes([FLAG_PRELUDE]) + struct.pack(">HH", 2, 3) + struct.pack(">I", 1) + b"z" + sub,
            bytes([FLAG_PRELUDE]) + struct.pack(">HH", 1, 2) + plain_sub,
            b"\x00" + _pycore.encode_chunk([b"r1", b"r2"], 1, 1000),
            b"\x00" + struct.pack(">Bi", 1, 2) + struct.pack(">QI", 1, 1) + b"a" + struct.pack(">QI", 2, 2) + b"bc",
        ]

    def close(self):
        pass
