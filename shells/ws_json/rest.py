"""The REST data API of the WebSocket JSON listener (Streamr's ``/api/v1`` data endpoints), on the
same port as the WebSocket.

``Authorization: token KEY`` when there is a users file::

    GET  /api/v1/streams/:id/data/partitions/:p/last?count=N          (default 1, at most REST_MAX_RECORDS)
    GET  /api/v1/streams/:id/data/partitions/:p/range?fromOffset=A[&toOffset=B]
    GET  /api/v1/streams/:id/data/partitions/:p/range?fromTimestamp=T1[&toTimestamp=T2]
    POST /api/v1/streams/:id/data[?ts=MS][&pkey=KEY]     body: a JSON object or a list of them

The GETs answer a JSON array of v28 MSG arrays in offset order; POST answers 200 once the messages are
committed. Errors: 400 (bad parameters or body, or a read over its bound), 401 (no or a wrong key), 403
(not permitted), 404 (no such stream or partition), each with ``{"error": "..."}``.

The requests take the WebSocket session's paths, so the two cannot drift: the user is
:func:`~riverbed.shells.ws_json.session.authenticate`'s, a publish goes where
:func:`~riverbed.shells.ws_json.session.publish_target` says, as
:func:`~riverbed.shells.ws_json.session.publish_record` builds it, through ``broker.append_or_create``;
reads walk the log with :func:`~riverbed.shells.ws_json.session.read_messages`, the resends' walk.

Reads are bounded: an answer holds at most :data:`REST_MAX_RECORDS` messages and
:data:`REST_MAX_BYTES` bytes of JSON. A request that asks for more (``count`` over the bound, an offset
range wider than it, or a range whose matching messages pass either bound) is refused with 400 and a
text naming the bound, never cut short in silence; the walk stops at the bound, and yields to the loop
every :data:`READ_CHUNKS` chunks so a long timestamp scan does not hold other connections back.

Loop-thread only.
"""

import asyncio
import json
import logging

from aiohttp import web

from riverbed.engine import OffsetSpec
from riverbed.engine import record as _record
from riverbed.engine.errors import RiverbedError, StorageFull
from riverbed.shells.auth import is_loopback
from riverbed.shells.broker import READ, WRITE
from riverbed.shells.broker import limits as _limits
from riverbed.shells.ws_json import codec
from riverbed.shells.ws_json.codec import RequestError
from riverbed.shells.ws_json.partitions import log_streams
from riverbed.shells.ws_json.session import (
    authenticate, previous_offset, publish_error, publish_record, publish_target, read_messages,
)
from riverbed.shells.protocols import WS

log = logging.getLogger("riverbed.ws")
LISTENER = WS   # the one name (protocols.py): the listener label of riverbed_rejected_total

REST_MAX_RECORDS = codec.RESEND_LAST_MAX   # messages of one GET answer
REST_MAX_BYTES = 16 << 20                  # bytes of JSON of one GET answer
READ_CHUNKS = 16                           # chunks one read step takes before yielding to the loop


class RestError(Exception):
    """A request refused with HTTP ``status`` and ``{"error": text}``."""

    def __init__(self, status, text):
        super().__init__(text)
        self.status = status
        self.text = text


def over_records():
    """The 400 of a read whose answer would pass REST_MAX_RECORDS."""
    return RestError(400, f"The answer would hold more than {REST_MAX_RECORDS} messages: ask for a narrower range")


def over_bytes():
    """The 400 of a read whose answer would pass REST_MAX_BYTES."""
    return RestError(400, f"The answer would be larger than {REST_MAX_BYTES} bytes: ask for a narrower range")


def _json_response(status, body_text):
    return web.Response(status=status, text=body_text, content_type="application/json")


def error_response(status, text):
    """The JSON error answer of this API (also the WebSocket endpoint's refusals before the upgrade)."""
    return _json_response(status, json.dumps({"error": text}))


def int_param(request, name, default=None, required=False):
    """Query parameter ``name`` as an int; RestError 400 when missing (``required``) or not an integer."""
    v = request.query.get(name)
    if v is None or v == "":
        if required:
            raise RestError(400, f"Query parameter {name} is required")
        return default
    try:
        return int(v)
    except ValueError:
        raise RestError(400, f"Query parameter {name} must be an integer, not {v!r}") from None


def post_items(body):
    """The JSON texts (compact, UTF-8 encodable) of a POST body holding one JSON object or a list of
    them: the REST publish's one validation step. Raises RestError 400 for a body that is not UTF-8,
    not JSON (NaN is not), not objects, nested deeper than the depth limit (each object; the list
    around them does not count), or holding a lone surrogate escape."""
    limit = _record.max_depth()
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        raise RestError(400, "Request body must be UTF-8 JSON") from None
    if not _record.json_within_depth(text, limit + 1):
        _limits.reject(LISTENER, "depth")
        raise RestError(400, f"Request body nests deeper than the limit of {limit}")
    try:
        value = codec.parse_json(text)
    except ValueError:
        raise RestError(400, "Request body must be a JSON object or a list of them") from None
    items = value if isinstance(value, list) else [value]
    if not all(isinstance(x, dict) for x in items):
        raise RestError(400, "Request body must be a JSON object or a list of them")
    if not all(_record.value_within_depth(x, limit) for x in items):
        _limits.reject(LISTENER, "depth")
        raise RestError(400, f"Request body nests deeper than the limit of {limit}")
    out = []
    for x in items:
        t = json.dumps(x, separators=(",", ":"), ensure_ascii=False)
        try:
            t.encode("utf-8")
        except UnicodeEncodeError:
            _limits.reject(LISTENER, "encoding")
            raise RestError(400, codec.ERR_BAD_TEXT) from None
        out.append(t)
    return out


class RestApi:
    """The REST routes of one listener over ``broker``; :meth:`add_routes` puts them on an aiohttp app.
    ``loop`` is the listener's event loop."""

    def __init__(self, broker, loop):
        self.broker = broker
        self.loop = loop

    def add_routes(self, app):
        base = "/api/v1/streams/{id:.+}/data"
        app.router.add_get(base + r"/partitions/{p:-?\d+}/last", self.get_last)
        app.router.add_get(base + r"/partitions/{p:-?\d+}/range", self.get_range)
        app.router.add_post(base, self.post_data)

    # ------------------------------------------------------------------------------------- handlers

    async def get_last(self, request):
        return await self._answer(self._last, request)

    async def get_range(self, request):
        return await self._answer(self._range, request)

    async def post_data(self, request):
        return await self._answer(self._post, request)

    async def _answer(self, fn, request):
        try:
            return await fn(request)
        except RestError as e:
            return error_response(e.status, e.text)
        except RiverbedError as e:
            return error_response(500, str(e))
        except (ValueError, TypeError, LookupError, OverflowError, RecursionError) as e:
            # a request value the checks let through: the request's fault, answered as such
            log.info("REST %s %s refused: %r", request.method, request.rel_url, e)
            return error_response(400, f"Invalid request: {type(e).__name__}")

    # ----------------------------------------------------------------------------------------- auth

    def _user(self, request):
        """The user of a request, by the WebSocket session's rule (:func:`authenticate`) with the key
        of ``Authorization: token KEY``; None without the header."""
        peer = request.transport.get_extra_info("peername") if request.transport else None
        loopback = is_loopback(peer[0]) if peer else False
        auth = self.broker.auth
        if auth.open_to_loopback and not loopback:
            raise RestError(403, "Only loopback clients are served without a users file")
        h = request.headers.get("Authorization", "")
        key = None
        if h:
            scheme, _, key = h.partition(" ")
            key = key.strip() if scheme.lower() == "token" else ""     # another scheme: a wrong key
        try:
            return authenticate(auth, key, loopback)
        except RequestError as e:
            raise RestError(401, str(e)) from None

    def _check(self, user, what, stream, text):
        if not self.broker.allowed(user, what, stream):
            raise RestError(401 if user is None else 403, text)

    async def _partition(self, request):
        user = self._user(request)
        stream = request.match_info["id"]
        p = int(request.match_info["p"])
        self._check(user, READ, stream, f"Not authorized to read stream {stream} and partition {p}")
        logs = log_streams(self.broker, stream)
        if 0 <= p < len(logs) and self.broker.cluster is not None:
            # a cluster node: a copy made here first when it holds none (remote_read.py), then up to what
            # the leader has committed (read-your-writes across nodes); a lone node goes on at once
            ready = self.loop.create_future()
            self.broker.when_readable(logs[p], lambda exc: ready.done() or ready.set_result(None))
            await ready
            caught = self.loop.create_future()
            self.broker.catch_up(logs[p], lambda: caught.done() or caught.set_result(None))
            await caught
        if p < 0 or p >= len(logs) or not self.broker.has_stream(logs[p]):
            raise RestError(404, f"Stream {stream} not found." if 0 <= p < len(logs) else
                            f"Stream {stream} has no partition {p}.")
        return stream, p, logs[p]

    # ---------------------------------------------------------------------------------------- reads

    async def _collect(self, log_stream, prefix, lo, hi, min_ts=None, max_ts=None):
        """The MSG JSON texts of offsets ``lo..hi`` (inclusive) whose timestamps are within [min_ts,
        max_ts]. Raises RestError 400 once they pass REST_MAX_RECORDS or REST_MAX_BYTES."""
        out = []
        size = 0
        pos = lo
        while pos <= hi:
            messages, nxt = read_messages(self.broker, log_stream, pos, hi, READ_CHUNKS)
            for offset, ts, text in messages:
                if (min_ts is not None and ts < min_ts) or (max_ts is not None and ts > max_ts):
                    continue
                if len(out) == REST_MAX_RECORDS:
                    raise over_records()
                msg = codec.encode_msg(prefix, ts, offset, previous_offset(offset), text)
                size += len(msg) + 1
                if size > REST_MAX_BYTES:
                    raise over_bytes()
                out.append(msg)
            if nxt == pos:
                break
            pos = nxt
            await asyncio.sleep(0)       # a long range yields to the other connections between steps
        return out

    async def _last(self, request):
        stream, p, log_stream = await self._partition(request)
        count = int_param(request, "count", 1)
        if count < 1:
            raise RestError(400, "count must be at least 1")
        if count > REST_MAX_RECORDS:
            raise RestError(400, f"count must be at most {REST_MAX_RECORDS}")
        nxt = self.broker.resolve(log_stream, OffsetSpec.next())
        first = self.broker.resolve(log_stream, OffsetSpec.first())
        msgs = await self._collect(log_stream, codec.msg_prefix(stream, p), max(first, nxt - count), nxt - 1)
        return _json_response(200, "[" + ",".join(msgs) + "]")

    async def _range(self, request):
        stream, p, log_stream = await self._partition(request)
        q = request.query
        nxt = self.broker.resolve(log_stream, OffsetSpec.next())
        first = self.broker.resolve(log_stream, OffsetSpec.first())
        prefix = codec.msg_prefix(stream, p)
        if "fromOffset" in q:
            a = max(first, int_param(request, "fromOffset", required=True))
            b = min(int_param(request, "toOffset", nxt - 1), nxt - 1)
            if b - a + 1 > REST_MAX_RECORDS:      # known before reading: refused without a read
                raise over_records()
            msgs = await self._collect(log_stream, prefix, a, b)
        elif "fromTimestamp" in q:
            t1 = int_param(request, "fromTimestamp", required=True)
            t2 = int_param(request, "toTimestamp")
            msgs = await self._collect(log_stream, prefix, first, nxt - 1, t1, t2)
        else:
            raise RestError(400, "Query parameter fromOffset or fromTimestamp is required")
        return _json_response(200, "[" + ",".join(msgs) + "]")

    # -------------------------------------------------------------------------------------- publish

    async def _post(self, request):
        user = self._user(request)
        stream = request.match_info["id"]
        self._check(user, WRITE, stream, f"Not authorized to publish to stream {stream}")
        ts = int_param(request, "ts")
        if ts is not None and not 0 <= ts < 1 << 62:
            raise RestError(400, "Query parameter ts must be a number of milliseconds since the epoch")
        pkey = request.query.get("pkey")
        items = post_items(await request.read())
        try:
            log_stream = publish_target(self.broker, user, stream, pkey)
        except RequestError as e:
            raise RestError(404, str(e)) from None
        records = [publish_record(self.broker, text, ts, pkey) for text in items]
        if not records:
            return web.Response(status=200)
        missing = not self.broker.has_stream(log_stream)
        fut = self.loop.create_future()

        def done(res, exc):
            if not fut.done():
                fut.set_result(exc)
        self.broker.append_or_create(log_stream, records, done)
        exc = await fut
        if exc is not None:
            created, text = publish_error(self.broker, stream, log_stream, exc, missing)
            # 503 for a full disk or the disk alarm: nothing was stored, the same request may be retried
            raise RestError(503 if isinstance(exc, StorageFull) and not created else 500, text)
        return web.Response(status=200)
