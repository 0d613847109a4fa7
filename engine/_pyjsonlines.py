"""Pure-Python twin of ``jsonlines.pxi``: the JSON payloads of a batch of stored records as one
newline-delimited JSON buffer, for one ``pyarrow.json.read_json`` call (the Spark reader's
``decode=json``, :mod:`riverbed.spark.jsonbatch`).

The fast path must give what the per-record path gives (``record.decode_record`` then
``record.to_json_value``), so a record is taken only when both of these hold:

* its payload is JSON by the one record format: a raw record (not a complete AMQP 1.0 message) whose
  bytes are the payload, or a message read by ``decode_message`` whose body is one data section with
  content-type ``application/json`` (exactly), none, ``""`` or ``application/octet-stream``;
* the payload passes :func:`scan_payload`: one JSON object, nothing a parser other than Python's could
  read another way.

Everything else (BSON, text, several data sections, another content-type spelling, empty records) is left
out and read by the per-record path. Taking a record does not decide that it parses: that is the Arrow
parser's job, and a line Arrow refuses goes to the per-record path too. What the scan guarantees is the
other direction: whatever Arrow accepts among the lines, Python's ``json`` accepts with the same values.

Same names, results and errors as the compiled part; pure; thread-safe.
"""

import struct

from riverbed.engine._pyrecord import BODY_DATA, decode_message

MAX_EXACT_DIGITS = 15       # integer literals up to 15 digits are exact in a double (below 2**53)
DEFAULT_MAX_DEPTH = 64
CT_JSON = "application/json"
SNIFFED = (None, "", "application/octet-stream")

_BARE = frozenset(b"0123456789:,-+.eEtrufalsn")
_WHITE = frozenset(b" \t")
_NEWLINES = frozenset(b"\r\n")
_HEX_SURROGATE_2 = frozenset(b"89abcdefABCDEF")


def _utf8_len(p, i):
    """Length of the strict UTF-8 sequence at ``p[i]`` (a byte >= 0x80), 0 when it is not one Python's
    decoder accepts (overlongs, surrogates and code points past U+10FFFF are refused)."""
    c = p[i]
    lo, hi = 0x80, 0xBF
    if 0xC2 <= c <= 0xDF:
        k = 2
    elif 0xE0 <= c <= 0xEF:
        k = 3
        lo, hi = (0xA0, 0xBF) if c == 0xE0 else (0x80, 0x9F) if c == 0xED else (lo, hi)
    elif 0xF0 <= c <= 0xF4:
        k = 4
        lo, hi = (0x90, 0xBF) if c == 0xF0 else (0x80, 0x8F) if c == 0xF4 else (lo, hi)
    else:
        return 0
    if len(p) - i < k or not lo <= p[i + 1] <= hi:
        return 0
    if any(not 0x80 <= b <= 0xBF for b in p[i + 2:i + k]):
        return 0
    return k


def scan_payload(payload, max_depth=DEFAULT_MAX_DEPTH, long_ints=True):
    """The payload as one line of newline-delimited JSON (bytes of the same length: CR and LF outside
    strings become spaces), or None when the fast path must leave it to the per-record path. Taken:
    one JSON object and nothing after it but whitespace, with

    * strict UTF-8 (what ``bytes.decode("utf-8")`` accepts) and no control character inside strings;
    * outside strings, only JSON's whitespace, brackets, punctuation, number characters and the letters
      of ``true``/``false``/``null`` (so no ``NaN``/``Infinity``, which Python reads and Arrow reads
      otherwise);
    * no string starting with ``$`` (Extended JSON such as ``{"$date": ...}``, which the per-record path
      unwraps) and no ``\\uD800``-``\\uDFFF`` escape (a lone surrogate is read differently);
    * brackets nested at most ``max_depth`` deep (``record.max_depth()``: deeper payloads render as
      bytes);
    * when ``long_ints`` is False, no integer literal of more than 15 digits (pass False when a column
      is floating point: pyarrow refuses a Python int that a double cannot hold exactly, and Arrow's
      parser would round it).

    Whether the JSON grammar holds is left to the Arrow parser. Pure.
    """
    p = bytes(payload)
    n = len(p)
    out = bytearray(p)
    i = depth = digits = 0
    started = done = in_number = integral = False
    while i < n:
        c = p[i]
        if in_number:
            if 0x30 <= c <= 0x39:
                digits += 1
            elif c in b".eE":
                integral = False
            elif c not in b"+-":
                in_number = False
                if integral and digits > MAX_EXACT_DIGITS and not long_ints:
                    return None
        elif 0x30 <= c <= 0x39 or c == 0x2D:
            in_number = integral = True
            digits = 0 if c == 0x2D else 1
        if c == 0x22:
            if done or not started:
                return None
            i += 1
            if i < n and p[i] == 0x24:
                return None
            while True:
                if i >= n:
                    return None
                c = p[i]
                if c == 0x22:
                    i += 1
                    break
                if c < 0x20:
                    return None
                if c == 0x5C:
                    if i + 1 >= n:
                        return None
                    if p[i + 1] == 0x75:
                        if i + 5 >= n or (p[i + 2] in b"dD" and p[i + 3] in _HEX_SURROGATE_2):
                            return None
                        i += 6
                    else:
                        i += 2
                    continue
                if c < 0x80:
                    i += 1
                    continue
                k = _utf8_len(p, i)
                if not k:
                    return None
                i += k
            continue
        if c in _NEWLINES:
            out[i] = 0x20
        elif c in _WHITE:
            pass
        elif c in b"{[":
            if done or (not started and c != 0x7B):
                return None
            started = True
            depth += 1
            if depth > max_depth:
                return None
        elif c in b"}]":
            if depth == 0:
                return None
            depth -= 1
            done = depth == 0
        elif c in _BARE:
            if done or not started:
                return None
        else:
            return None
        i += 1
    return bytes(out) if done else None


def message_payload(record):
    """``(label, payload)`` for a stored record that may carry JSON: label 1 when it is a message with
    one data section labeled ``application/json``, 2 when the payload is left to sniffing (a raw record,
    or a message with one data section and no telling content-type); None for any other record."""
    if not record:
        return None
    if record[0] != 0x00:
        return 2, bytes(record)
    msg = decode_message(record)
    if msg is None:
        return None
    content_type, _, _, sections, body_kind = msg
    if body_kind != BODY_DATA or len(sections) != 1:
        return None
    if content_type == CT_JSON:
        return 1, sections[0]
    if content_type in SNIFFED:
        return 2, sections[0]
    return None


def json_lines(value_offsets, data, max_depth=DEFAULT_MAX_DEPTH, long_ints=True):
    """The JSON payloads of ``n`` stored records as newline-delimited JSON.

    ``value_offsets``: ``n + 1`` little-endian int32 offsets into ``data`` (an Arrow binary array's
    buffers, as ``chunk_to_arrow`` fills them); ``data``: the records' bytes. ``max_depth`` and
    ``long_ints`` as :func:`scan_payload`.

    Returns ``(lines, rows, bounds)``, three bytearrays: ``lines``, each taken record's payload (see
    :func:`message_payload` and :func:`scan_payload`) followed by ``\\n``; ``rows``, the taken records'
    indices as little-endian int64, in order; ``bounds``, ``len(rows) + 1`` little-endian int64 offsets
    into ``lines`` (line ``k`` is ``lines[bounds[k]:bounds[k + 1]]``), so any run of lines is one slice.

    Raises ValueError when ``value_offsets`` is not ``n + 1`` offsets that rise within ``data``, or
    ``max_depth`` is not a positive int. Never raises for the records' contents. Pure; thread-safe.
    """
    if isinstance(max_depth, bool) or not isinstance(max_depth, int) or max_depth < 1:
        raise ValueError(f"max_depth must be a positive int, not {max_depth!r}")
    vo = bytes(value_offsets)
    d = bytes(data)
    if len(vo) < 4 or len(vo) % 4:
        raise ValueError("value_offsets must hold n + 1 int32 offsets (n >= 0)")
    offs = struct.unpack(f"<{len(vo) // 4}i", vo)
    if offs[0] < 0 or offs[0] > len(d):
        raise ValueError("value_offsets point outside data")
    for a, z in zip(offs, offs[1:]):
        if z < a or z > len(d):
            raise ValueError("value_offsets point outside data or go backwards")
    lines, rows, bounds = bytearray(), bytearray(), bytearray(struct.pack("<q", 0))
    for r in range(len(offs) - 1):
        found = message_payload(d[offs[r]:offs[r + 1]])
        if found is None:
            continue
        line = scan_payload(found[1], max_depth, long_ints)
        if line is None:
            continue
        lines += line + b"\n"
        rows += struct.pack("<q", r)
        bounds += struct.pack("<q", len(lines))
    return lines, rows, bounds
