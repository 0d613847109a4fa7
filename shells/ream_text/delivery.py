"""The JSON text of a stored record as a REAM delivery carries it, with a fast path for the records REAM
itself stores.

An ``EVENT PUBLISH`` stores ``encode_message((payload,), CT_JSON)``: a fixed AMQP 1.0 head (properties
with only ``content-type application/json``, then a data section) followed by the payload. Decoding such
a record into a :class:`~riverbed.engine.record.Record` and rendering it costs microseconds per event
on delivery, most of a live subscriber's server CPU (issue 26, bench/ream_bench.py against a bare relay).
:func:`delivery_text` recognises the head by its bytes and hands the payload out as it is when the
general rendering would give the same bytes (ASCII, so valid UTF-8, and few enough brackets that the
nesting limit cannot be passed); anything else takes the general path. Pure; thread-safe.
"""

from riverbed.engine.core import encode_message
from riverbed.engine.record import CT_JSON, decode_record, max_depth, to_json_text

# the stored head of a REAM event up to its data section's length: encode_message of an empty payload
# ends with the data section's constructor 0xa0 (vbin8) and the length byte 0
_EMPTY = encode_message((b"",), CT_JSON)
assert _EMPTY.endswith(b"\xa0\x00")
HEAD = _EMPTY[:-2]
LEN_HEAD = len(HEAD)
_VBIN8 = 0xA0
_VBIN32 = 0xB0


def delivery_text(raw):
    """The UTF-8 JSON text (bytes) that ``to_json_text(decode_record(raw))`` gives, for one stored record
    ``raw`` (bytes-like: the pure core's chunk records are memoryviews). Never raises (as
    :func:`~riverbed.engine.record.to_json_text`)."""
    if type(raw) is not bytes:
        raw = bytes(raw)
    if raw.startswith(HEAD) and len(raw) > LEN_HEAD + 1:
        code = raw[LEN_HEAD]
        payload = None
        if code == _VBIN8:
            if raw[LEN_HEAD + 1] == len(raw) - LEN_HEAD - 2:
                payload = raw[LEN_HEAD + 2:]
        elif code == _VBIN32 and int.from_bytes(raw[LEN_HEAD + 1:LEN_HEAD + 5], "big") == len(raw) - LEN_HEAD - 5:
            payload = raw[LEN_HEAD + 5:]
        if payload is not None and payload.isascii() and payload.count(b"{") + payload.count(b"[") <= max_depth():
            return payload
    return to_json_text(decode_record(raw)).encode("utf-8")
