"""The dashboard's JSON API: streams, consumers, publishers and a stream's recent records.

Every route needs an authenticated user (:func:`riverbed.shells.http.auth.require_user`) and shows only
the streams that user may read (its ``read`` pattern). Errors are JSON ``{"error", "reason"}``: 400
``bad_request`` for a bad query parameter, 403 ``not_authorized`` for a stream the user may not read, 404
``not_found`` for a stream that does not exist.

``GET /api/streams``
    ``[{"name", "records", "bytes", "chunks", "first_offset", "last_offset", "committed_chunk_id",
    "arguments", "consumers", "publishers"}]`` sorted by name. ``records`` are the records stored (after
    retention), ``bytes`` the stored chunk bytes (headers included), ``first_offset`` the first stored
    offset (the next offset when the stream is empty), ``last_offset`` the last committed offset (null
    when empty), ``committed_chunk_id`` the id of the last committed chunk (-1 when empty),
    ``arguments`` the stream's arguments (``max-age``, ``max-length-bytes``, ...), ``consumers`` and
    ``publishers`` the counts of live subscriptions and declared publishers, every protocol together.

``GET /api/streams/{name}``
    One such object.

``GET /api/stream/consumers[?stream=NAME]`` (RabbitMQ's stream management path)
    ``[{"stream", "protocol", "connection", "subscription_id", "reference", "offset", "lag",
    "credits"}]``: ``protocol`` is ``stream``, ``bson``, ``zmq``, ``ws`` or ``ream``; ``connection`` the
    connection's name as ``/api/connections`` shows it; ``subscription_id`` the protocol's id (a number,
    or the topic, stream id or stream name); ``reference`` the consumer's name (RabbitMQ single active
    consumer name, BSON durable subscription) or null; ``offset`` the next offset it will be delivered;
    ``lag`` the records between it and the stream's last committed offset (0 when caught up);
    ``credits`` the chunks a RabbitMQ Stream consumer may still take (null for other protocols). Each
    also carries RabbitMQ's fields (``queue``, ``connection_details``, ``properties``, ``active``,
    ``activity_status``, ``offset_lag``; see :mod:`.mgmt_stream`).

``GET /api/stream/publishers[?stream=NAME]``
    ``[{"stream", "protocol", "connection", "publisher_id", "reference", "published"}]``: the declared
    publishers of RabbitMQ Stream connections (other protocols publish without declaring one);
    ``published`` is null (not counted per publisher).

``GET /api/streams/{name}/records[?last=N]``
    The last N (1..100, default 20) records: ``[{"offset", "timestamp", "content_type", "kind", "body",
    "truncated"}]`` oldest first. ``timestamp`` is the record's creation-time in ms, else its chunk's
    (the broker's one rule, records.py);
    ``content_type`` as stored (null when none); ``kind`` says how ``body`` was rendered: ``json``
    (pretty-printed), ``bson`` (relaxed Extended JSON, pretty-printed), ``text`` (a payload labeled
    ``text/*``, or an unlabeled one that is printable UTF-8), ``hex`` (anything else, 16 bytes a line).
    ``body`` is cut at ``BODY_MAX`` characters (``truncated`` true). Offsets taken by the log's own
    chunks (offset tracking) are skipped, so fewer than N may come back.
"""

import asyncio
import json

from aiohttp import web

from riverbed.engine import record as _record
from riverbed.engine.errors import ChunkError, StreamNotFound
from riverbed.shells.broker import READ, introspect
from riverbed.shells.broker.records import record_timestamp
from riverbed.shells.http import mgmt_stream      # RabbitMQ's fields of consumers and publishers
from riverbed.shells.http.auth import require_user
from riverbed.shells.http.server import BROKER, json_error

BODY_MAX = 4096            # characters of a rendered record body
LAST_DEFAULT = 20          # records of GET .../records without ?last
LAST_MAX = 100
READ_BATCH = 4             # chunks read at a time for .../records (a chunk may be ~1 MiB)
HEX_LINE = 16              # bytes per line of a hex body

routes = web.RouteTableDef()


def setup(app):
    app.add_routes(routes)


def _may_read(user, name):
    return user.can(READ, name)


def _readable_stream(request, user):
    """The ``{name}`` of the path when it exists and ``user`` may read it; 404 / 403 otherwise."""
    name = request.match_info["name"]
    if not request.app[BROKER].has_stream(name):
        raise json_error(web.HTTPNotFound, "not_found", f"stream {name!r} does not exist")
    if not _may_read(user, name):
        raise json_error(web.HTTPForbidden, "not_authorized", f"no read permission on stream {name!r}")
    return name


async def _up_to_date(request):
    """On a cluster node: the path's stream copied here first when this node holds no copy, then up to
    what its leader has committed (shells/cluster/remote_read.py), so that a stream's stats and records
    answer on any node as on its leader. Nothing on a lone node."""
    broker = request.app[BROKER]
    if broker.cluster is None:
        return
    name = request.match_info["name"]
    loop = asyncio.get_running_loop()
    ready = loop.create_future()
    broker.when_readable(name, lambda exc: ready.done() or ready.set_result(None))
    await ready
    caught = loop.create_future()
    broker.catch_up(name, lambda: caught.done() or caught.set_result(None))
    await caught


def _stream_filter(request, user):
    """The ``?stream=`` of the query (None when absent); 404 / 403 as for a path's stream."""
    name = request.query.get("stream")
    if name is None:
        return None
    if not request.app[BROKER].has_stream(name):
        raise json_error(web.HTTPNotFound, "not_found", f"stream {name!r} does not exist")
    if not _may_read(user, name):
        raise json_error(web.HTTPForbidden, "not_authorized", f"no read permission on stream {name!r}")
    return name


def visible_streams(broker, user):
    """The names of the streams ``user`` may read, sorted."""
    return [n for n in broker.list_streams() if _may_read(user, n)]


@routes.get("/api/streams")
async def list_streams(request):
    user = await require_user(request)
    broker = request.app[BROKER]
    return web.json_response(introspect.streams(broker, visible_streams(broker, user)))


@routes.get("/api/streams/{name}")
async def get_stream(request):
    user = await require_user(request)
    await _up_to_date(request)
    name = _readable_stream(request, user)
    found = introspect.streams(request.app[BROKER], [name])
    if not found:
        raise json_error(web.HTTPNotFound, "not_found", f"stream {name!r} does not exist")
    return web.json_response(found[0])


async def _readable_entries(request, collect):
    """``collect(broker, stream or None)``'s dicts (consumers, publishers) of the streams the user may
    read, filtered by ``?stream=``."""
    user = await require_user(request)
    stream = _stream_filter(request, user)
    found = collect(request.app[BROKER], stream)
    infos = mgmt_stream.connection_infos(request)
    return web.json_response([mgmt_stream.with_rabbit_fields(e, infos) for e in found if _may_read(user, e["stream"])])


@routes.get("/api/stream/consumers")
async def list_consumers(request):
    return await _readable_entries(request, introspect.consumers)


@routes.get("/api/stream/publishers")
async def list_publishers(request):
    return await _readable_entries(request, introspect.publishers)


@routes.get("/api/streams/{name}/records")
async def recent_records(request):
    user = await require_user(request)
    await _up_to_date(request)
    name = _readable_stream(request, user)
    raw_last = request.query.get("last", str(LAST_DEFAULT))
    try:
        last = int(raw_last)
    except ValueError:
        last = 0
    if not 1 <= last <= LAST_MAX:
        raise json_error(web.HTTPBadRequest, "bad_request",
                         f"last must be a whole number from 1 to {LAST_MAX}, not {raw_last!r}")
    try:
        found = last_records(request.app[BROKER], name, last)
    except StreamNotFound:
        raise json_error(web.HTTPNotFound, "not_found", f"stream {name!r} does not exist") from None
    except ChunkError as e:
        raise json_error(web.HTTPInternalServerError, "chunk_error", str(e)) from None
    return web.json_response(found)


def last_records(broker, name, n):
    """The last ``n`` committed user records of stream ``name``, rendered (see the module docstring),
    oldest first. Reads at most the chunks holding those offsets, ``READ_BATCH`` at a time. Raises
    StreamNotFound, ChunkError."""
    st = introspect.stream_state(broker, name)
    if st["last_offset"] is None:
        return []
    end = st["next_offset"]
    start = max(st["first_offset"], end - n)
    out = [render_view(offset, ts, view) for offset, ts, view in broker.scan_records(name, start, end, READ_BATCH)]
    return out[-n:]


def render_record(offset, chunk_ts, raw):
    """One stored record (bytes, from a chunk of timestamp ``chunk_ts``) as the records route shows it."""
    rec = _record.decode_record(raw)
    return render_view(offset, record_timestamp(rec, chunk_ts), rec)


def render_view(offset, timestamp, rec):
    """One decoded record as the records route shows it (see the module docstring); ``timestamp`` by the
    broker's one rule (records.py)."""
    kind, body = _render_body(rec)
    truncated = len(body) > BODY_MAX
    return {"offset": offset, "timestamp": timestamp,
            "content_type": rec.content_type, "kind": kind, "body": body[:BODY_MAX] if truncated else body,
            "truncated": truncated}


def _render_body(rec):
    if rec.kind in (_record.KIND_JSON, _record.KIND_BSON):
        value = _record.to_json_value(rec)
        # a labeled payload that does not parse comes back as {"base64": ...}: show its bytes instead
        if not (isinstance(value, dict) and set(value) == {"base64"}):
            return rec.kind, json.dumps(value, indent=2, ensure_ascii=False)
    payload = rec.payload
    media = _record.media_type(rec.content_type) if rec.content_type else None
    if media is None or media == _record.CT_OCTET or media.startswith("text/"):
        text = _printable_text(payload[:BODY_MAX * 4 + 4])
        if text is not None and (media is not None and media.startswith("text/") or _looks_like_text(text)):
            return "text", text
    return "hex", _hex(payload[:BODY_MAX // 3 + HEX_LINE])


def _printable_text(payload):
    """``payload`` decoded as UTF-8 (a character cut at the end forgiven), or None."""
    try:
        return payload.decode("utf-8")
    except UnicodeDecodeError as e:
        if e.start >= len(payload) - 3 and e.reason == "unexpected end of data":
            return payload[:e.start].decode("utf-8")
        return None


def _looks_like_text(text):
    return all(ch.isprintable() or ch in "\n\r\t" for ch in text)


def _hex(payload):
    return "\n".join(payload[i:i + HEX_LINE].hex(" ") for i in range(0, len(payload), HEX_LINE))
