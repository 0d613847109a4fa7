"""Output of the admin CLI: aligned plain-text tables for people, JSON for scripts, and one stored record
rendered by its content type (through :mod:`riverbed.engine.record`, the one record format).

Pure functions; thread-safe.
"""

import base64
import json
from datetime import datetime, timezone

FMT_JSON = "json"
FMT_RAW = "raw"
FORMATS = (FMT_JSON, FMT_RAW)
TABLE_GAP = "  "
NONE_CELL = "-"


def cell(value):
    """One table cell as text: None as ``-``, dicts as ``k=v`` pairs, everything else ``str``."""
    if value is None:
        return NONE_CELL
    if isinstance(value, dict):
        return ",".join(f"{k}={v}" for k, v in value.items()) or NONE_CELL
    if isinstance(value, bool):
        return "yes" if value else "no"
    return str(value)


def table(rows, columns):
    """Plain aligned text: ``columns`` is a list of ``(heading, key)``; ``rows`` a list of dicts. Numbers
    are right-aligned, text left-aligned; a heading line always comes first. Returns the text, lines
    joined by newlines, no trailing newline."""
    cells = [[cell(row.get(key)) for _, key in columns] for row in rows]
    numeric = [all(isinstance(row.get(key), (int, float)) and not isinstance(row.get(key), bool)
                   or row.get(key) is None for row in rows) and rows for _, key in columns]
    widths = [max([len(h)] + [len(c[i]) for c in cells]) for i, (h, _) in enumerate(columns)]

    def line(values):
        out = [v.rjust(w) if num else v.ljust(w) for v, w, num in zip(values, widths, numeric)]
        return TABLE_GAP.join(out).rstrip()
    return "\n".join([line([h for h, _ in columns])] + [line(c) for c in cells])


def key_values(pairs):
    """``key: value`` lines, keys padded to one width, for one object (``stats``)."""
    pairs = list(pairs)
    width = max((len(k) for k, _ in pairs), default=0)
    return "\n".join(f"{k.ljust(width)}  {cell(v)}" for k, v in pairs)


def to_json(value):
    """Compact one-line JSON (UTF-8 kept as is), for ``--json`` output and ``tail --format json``."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), default=_json_default)


def _json_default(value):
    if isinstance(value, (bytes, bytearray, memoryview)):
        return {"base64": base64.b64encode(bytes(value)).decode("ascii")}
    if isinstance(value, datetime):
        return value.isoformat()
    return str(value)


def iso_ms(ms):
    """An ISO-8601 UTC time with milliseconds for ``ms`` since the epoch; None for None or negative."""
    if ms is None or ms < 0:
        return None
    return datetime.fromtimestamp(ms / 1000, timezone.utc).isoformat(timespec="milliseconds").replace(
        "+00:00", "Z")


def record_json(offset, raw, chunk_ms=None):
    """One stored record as a dict for ``tail --format json``: ``offset``, ``timestamp`` (ISO-8601 UTC, by
    the broker's one rule: the record's creation-time when it has one, else ``chunk_ms``, its chunk's
    time, when known), ``content_type`` (as stored, or null), ``kind`` (json, bson,
    bytes), ``creation_time`` (ISO, when the message has one), ``app_properties`` (when any) and
    ``value``: a JSON payload parsed, BSON as relaxed Extended JSON, bytes as ``{"base64": ...}``
    (``riverbed.engine.record.to_json_value``), and a UTF-8 ``text/*`` payload as a string. Never raises
    for any bytes."""
    from riverbed.engine.record import decode_record, to_json_value
    from riverbed.shells.broker.records import record_timestamp
    rec = decode_record(bytes(raw))
    out = {"offset": offset}
    ts = record_timestamp(rec, chunk_ms)
    if ts is not None:
        out["timestamp"] = iso_ms(ts)
    out["content_type"] = rec.content_type
    out["kind"] = rec.kind
    if rec.creation_time is not None:
        out["creation_time"] = iso_ms(rec.creation_time)
    if rec.app_properties:
        out["app_properties"] = {str(k): v for k, v in rec.app_properties.items()}
    out["value"] = text_value(rec)
    if out["value"] is None:
        out["value"] = to_json_value(rec)
    return out


def text_value(rec):
    """The payload as a str when the record says it is text (``text/*``) and it is UTF-8, else None:
    the one content type the record format leaves as bytes that people want to read as text."""
    from riverbed.engine.record import media_type
    mt = media_type(rec.content_type)
    if mt is None or not mt.startswith("text/"):
        return None
    try:
        return rec.payload.decode("utf-8")
    except UnicodeDecodeError:
        return None


def record_raw(raw):
    """The payload of one stored record as bytes (the data sections joined, or the whole raw record)."""
    from riverbed.engine.record import decode_record
    return decode_record(bytes(raw)).payload
