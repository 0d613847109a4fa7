"""The WebSocket JSON listener: aiohttp serving the Streamr v28 WebSocket at ``/api/v1/ws`` and the REST
data API under ``/api/v1`` on one port.

Transport glue only: each WebSocket gets a sans-I/O :class:`~riverbed.shells.ws_json.session.WsSession`
whose output is written straight to the connection's transport as ready-made WebSocket frames (the
listener asks aiohttp for no compression, so a server frame is the bytes of ``codec.ws_text_frame``, and
a broadcast frame built once can go to every subscriber). aiohttp still reads, answers pings and runs
the closing handshake. A client frame over ``max_frame`` bytes closes the connection with 1009 (Message
Too Big).

REST (``Authorization: token KEY`` when there is a users file)::

    GET  /api/v1/streams/:id/data/partitions/:p/last?count=N                 (default 1, at most 100,000)
    GET  /api/v1/streams/:id/data/partitions/:p/range?fromOffset=A[&toOffset=B]
    GET  /api/v1/streams/:id/data/partitions/:p/range?fromTimestamp=T1[&toTimestamp=T2]   (at most 100,000)
    POST /api/v1/streams/:id/data[?ts=MS][&pkey=KEY]     body: a JSON object or a list of them

The GETs answer a JSON array of v28 MSG arrays in offset order; POST answers 200 once the messages are
committed. Errors: 400 (bad parameters or body), 401 (no or a wrong key), 403 (not permitted), 404 (no
such stream or partition), each with ``{"error": "..."}``.
"""

import asyncio
import json
import logging

from aiohttp import WSCloseCode, WSMsgType, web

from riverbed.engine import OffsetSpec
from riverbed.engine import record as _record
from riverbed.engine.errors import RiverbedError, StorageFull
from riverbed.shells import tls as _tls
from riverbed.shells.auth import is_loopback
from riverbed.shells.broker import limits as _limits
from riverbed.shells.broker.stats import ERR_WEBSOCKET
from riverbed.shells.http.server import body_limit
from riverbed.shells.broker import CONFIGURE, READ, WRITE
from riverbed.shells.webtext import guard_server
from riverbed.shells.ws_json import codec
from riverbed.shells.ws_json.partitions import log_streams, partition_for_key
from riverbed.shells.ws_json.session import (
    DEFAULT_SEND_BUFFER_MAX, ST_CLOSED, WsSession, WsShell, batch_messages, previous_offset,
)

log = logging.getLogger("riverbed.ws")

WS_PATH = "/api/v1/ws"
DEFAULT_PORT = 8890
DEFAULT_MAX_FRAME = 1 << 20        # bytes of one client frame
REST_MAX_COUNT = codec.RESEND_LAST_MAX
CLOSE_GRACE = 1.0                  # seconds a closing handshake may take at shutdown


class WsIO:
    """The ``io`` of one session (see session.py): writes go straight to the transport."""

    __slots__ = ("ws", "transport", "loop", "close_task", "readable")

    def __init__(self, ws, transport, loop):
        self.ws = ws
        self.transport = transport
        self.loop = loop
        self.close_task = None
        self.readable = None       # an asyncio.Event while reading is paused

    def pause_reading(self):
        if self.readable is None:
            self.readable = asyncio.Event()

    def resume_reading(self):
        ev, self.readable = self.readable, None
        if ev is not None:
            ev.set()

    def write(self, data):
        t = self.transport
        if t is not None and not t.is_closing():
            t.write(data)

    def buffer_size(self):
        t = self.transport
        return t.get_write_buffer_size() if t is not None else 0

    def close(self, code, reason):
        self.resume_reading()       # the handler must see the close, not wait for commits
        if self.close_task is None and not self.ws.closed:
            self.close_task = self.loop.create_task(
                self.ws.close(code=code, message=reason.encode("utf-8")[:120]))

    def abort(self, reason):
        self.resume_reading()
        t, self.transport = self.transport, None
        if t is not None:
            t.abort()

    def defer(self, fn):
        self.loop.call_soon(fn)

    def call_later(self, seconds, fn):
        self.loop.call_later(seconds, fn)


class RestError(Exception):
    def __init__(self, status, text):
        super().__init__(text)
        self.status = status
        self.text = text


def _json_response(status, body_text):
    return web.Response(status=status, text=body_text, content_type="application/json")


class WsJsonServer:
    """The listener. Create it with :func:`serve`. ``port`` is the bound port. Loop-thread only."""

    name = "ws"

    def __init__(self, broker, *, host="127.0.0.1", port=DEFAULT_PORT, max_frame=DEFAULT_MAX_FRAME,
                 send_buffer_max=DEFAULT_SEND_BUFFER_MAX, ssl=None):
        self.broker = broker
        self.host = host
        self.port = port
        self.ssl = ssl                  # an ssl.SSLContext: wss:// and https:// only
        self.max_frame = max_frame
        self.loop = None
        self.shell = None
        self.send_buffer_max = send_buffer_max
        self.sessions = set()
        self._runner = None
        self._site = None
        self._server = None             # the asyncio server (the site's, or our own for TLS)
        self._stopping = False

    async def start(self):
        self.loop = asyncio.get_running_loop()
        self.stats = self.broker.stats.listener(self.name, self.sessions.__len__)     # metrics
        self.shell = WsShell(self.broker, defer=self.loop.call_soon, send_buffer_max=self.send_buffer_max)
        max_body = self.broker.limits.http_max_body
        app = web.Application(middlewares=[body_limit("ws", max_body)], client_max_size=max_body)
        app.router.add_get(WS_PATH, self._ws_handler)
        base = "/api/v1/streams/{id:.+}/data"
        app.router.add_get(base + r"/partitions/{p:-?\d+}/last", self._rest_last)
        app.router.add_get(base + r"/partitions/{p:-?\d+}/range", self._rest_range)
        app.router.add_post(base, self._rest_post)
        self._runner = web.AppRunner(app, handle_signals=False, access_log=None, shutdown_timeout=CLOSE_GRACE)
        await self._runner.setup()
        guard_server(self._runner.server, lambda: _limits.reject(self.name, "encoding"))
        if self.ssl is None:
            self._site = web.TCPSite(self._runner, self.host, self.port, reuse_address=True)
            await self._site.start()
            self._server = self._site._server
        else:   # with --tls-cert the port is wss:// (and https:// for REST) only
            self._server = await _tls.create_server(self._runner.server, self.host, self.port, self.ssl, self.name)
        server = self._server
        if server is not None and server.sockets:
            self.port = server.sockets[0].getsockname()[1]
        return self

    def stop_accepting(self):
        """No new connections (sync; the listening socket closes)."""
        self._stopping = True
        if self._server is not None:
            self._server.close()

    async def shutdown(self, drain_timeout=10.0):
        """Stop taking requests, let accepted publishes commit (up to ``drain_timeout`` s), close every
        WebSocket with 1001, then stop the HTTP server."""
        self.stop_accepting()
        for s in list(self.sessions):
            s.begin_shutdown()
        deadline = self.loop.time() + drain_timeout
        while any(s.pending_ops for s in self.sessions) and self.loop.time() < deadline:
            await asyncio.sleep(0.01)
        for s in list(self.sessions):
            s.close_gracefully("server shutdown")
        tasks = [s.io.close_task for s in self.sessions if s.io.close_task is not None]
        if tasks:
            await asyncio.wait(tasks, timeout=CLOSE_GRACE)
        for s in list(self.sessions):
            s.io.abort("shutdown")
            s.connection_lost()
        if self._runner is not None:
            await self._runner.cleanup()

    # -------------------------------------------------------------------------------- WebSocket

    async def _ws_handler(self, request):
        transport = request.transport
        peer = transport.get_extra_info("peername") or ("", 0)
        local = transport.get_extra_info("sockname") or ("", 0)
        loopback = is_loopback(peer[0])
        if self.broker.auth.open_to_loopback and not loopback:
            return _json_response(403, json.dumps({"error": "Only loopback clients are served without a users file"}))
        if self._stopping:
            return _json_response(503, json.dumps({"error": "server shutting down"}))
        ws = web.WebSocketResponse(compress=False, max_msg_size=self.max_frame, autoping=True)
        await ws.prepare(request)
        io = WsIO(ws, request.transport, self.loop)
        session = WsSession(self.shell, io, peer=tuple(peer[:2]), local=tuple(local[:2]), peer_loopback=loopback)
        self.sessions.add(session)
        self.stats.connections_total += 1      # metrics
        try:
            while True:
                if io.readable is not None:      # the session's publishes are not committed yet
                    await io.readable.wait()
                msg = await ws.receive()
                t = msg.type
                if t is WSMsgType.TEXT or t is WSMsgType.BINARY:
                    self.stats.reads += 1      # metrics
                if t is WSMsgType.TEXT:
                    session.text_received(msg.data)
                elif t is WSMsgType.BINARY:
                    session.binary_received(msg.data)
                elif t is WSMsgType.ERROR:
                    if getattr(msg.data, "code", None) == WSCloseCode.MESSAGE_TOO_BIG:
                        # aiohttp refused the message at max_msg_size, before buffering past it; closed 1009
                        _limits.reject("ws", _limits.REASON_FRAME_SIZE, str(msg.data), session.peer)
                    else:
                        log.info("%s: WebSocket closed: %s", session.peer, msg.data)
                    self.stats.error(ERR_WEBSOCKET)     # metrics
                    break
                else:      # CLOSE, CLOSING, CLOSED
                    break
                if session.state == ST_CLOSED:      # dropped (send buffer over its bound)
                    break
        finally:
            session.connection_lost()
            self.sessions.discard(session)
        return ws

    # ------------------------------------------------------------------------------------- REST

    def _rest_user(self, request):
        peer = request.transport.get_extra_info("peername") if request.transport else None
        loopback = is_loopback(peer[0]) if peer else False
        auth = self.broker.auth
        if auth.open_to_loopback:
            if not loopback:
                raise RestError(403, "Only loopback clients are served without a users file")
            return auth.implicit_user(True)
        h = request.headers.get("Authorization", "")
        if not h:
            return None
        scheme, _, key = h.partition(" ")
        user = auth.user_for_api_key(key.strip()) if scheme.lower() == "token" else None
        if user is None or (user.loopback_only and not loopback):
            raise RestError(401, codec.ERR_AUTH_FAILED)
        return user

    def _rest_check(self, user, what, stream, text):
        if not self.broker.allowed(user, what, stream):
            raise RestError(401 if user is None else 403, text)

    def _rest_partition(self, request, what, denied):
        user = self._rest_user(request)
        stream = request.match_info["id"]
        p = int(request.match_info["p"])
        self._rest_check(user, what, stream, denied.format(stream=stream, p=p))
        logs = log_streams(self.broker, stream)
        if p < 0 or p >= len(logs) or not self.broker.has_stream(logs[p]):
            raise RestError(404, f"Stream {stream} not found." if p < len(logs) and p >= 0 else
                            f"Stream {stream} has no partition {p}.")
        return stream, p, logs[p]

    @staticmethod
    def _int_param(request, name, default=None, required=False):
        v = request.query.get(name)
        if v is None or v == "":
            if required:
                raise RestError(400, f"Query parameter {name} is required")
            return default
        try:
            return int(v)
        except ValueError:
            raise RestError(400, f"Query parameter {name} must be an integer, not {v!r}") from None

    async def _collect(self, log_stream, prefix, lo, hi, min_ts=None, max_ts=None):
        """MSG JSON texts of offsets lo..hi (inclusive) whose timestamps are within [min_ts, max_ts], at
        most REST_MAX_COUNT of them (the first ones)."""
        out = []
        pos = lo
        while pos <= hi and len(out) < REST_MAX_COUNT:
            batches, nxt = self.broker.read_records(log_stream, pos, 16, hi + 1)
            for batch in batches:
                for offset, ts, text in batch_messages(batch, hi):
                    if (min_ts is not None and ts < min_ts) or (max_ts is not None and ts > max_ts):
                        continue
                    out.append(codec.encode_msg(prefix, ts, offset, previous_offset(offset), text))
            if nxt == pos:
                break
            pos = nxt
            await asyncio.sleep(0)       # a long range yields to the other connections between batches
        return out[:REST_MAX_COUNT]

    async def _rest(self, fn, request):
        try:
            return await fn(request)
        except RestError as e:
            return _json_response(e.status, json.dumps({"error": e.text}))
        except RiverbedError as e:
            return _json_response(500, json.dumps({"error": str(e)}))
        except (ValueError, TypeError, LookupError, OverflowError, RecursionError) as e:
            # a request value the checks above let through: the request's fault, answered as such
            log.info("REST %s %s refused: %r", request.method, request.rel_url, e)
            return _json_response(400, json.dumps({"error": f"Invalid request: {type(e).__name__}"}))

    async def _rest_last(self, request):
        return await self._rest(self._last, request)

    async def _rest_range(self, request):
        return await self._rest(self._range, request)

    async def _rest_post(self, request):
        return await self._rest(self._post, request)

    async def _last(self, request):
        stream, p, log_stream = self._rest_partition(
            request, READ, "Not authorized to read stream {stream} and partition {p}")
        count = self._int_param(request, "count", 1)
        if count < 1:
            raise RestError(400, "count must be at least 1")
        count = min(count, REST_MAX_COUNT)
        nxt = self.broker.resolve(log_stream, OffsetSpec.next())
        first = self.broker.resolve(log_stream, OffsetSpec.first())
        msgs = await self._collect(log_stream, codec.msg_prefix(stream, p), max(first, nxt - count), nxt - 1)
        return _json_response(200, "[" + ",".join(msgs) + "]")

    async def _range(self, request):
        stream, p, log_stream = self._rest_partition(
            request, READ, "Not authorized to read stream {stream} and partition {p}")
        q = request.query
        nxt = self.broker.resolve(log_stream, OffsetSpec.next())
        first = self.broker.resolve(log_stream, OffsetSpec.first())
        prefix = codec.msg_prefix(stream, p)
        if "fromOffset" in q:
            a = self._int_param(request, "fromOffset", required=True)
            b = self._int_param(request, "toOffset", nxt - 1)
            msgs = await self._collect(log_stream, prefix, max(first, a), min(b, nxt - 1))
        elif "fromTimestamp" in q:
            t1 = self._int_param(request, "fromTimestamp", required=True)
            t2 = self._int_param(request, "toTimestamp")
            msgs = await self._collect(log_stream, prefix, first, nxt - 1, t1, t2)
        else:
            raise RestError(400, "Query parameter fromOffset or fromTimestamp is required")
        return _json_response(200, "[" + ",".join(msgs) + "]")

    async def _post(self, request):
        user = self._rest_user(request)
        stream = request.match_info["id"]
        self._rest_check(user, WRITE, stream, f"Not authorized to publish to stream {stream}")
        ts = self._int_param(request, "ts")
        if ts is not None and not 0 <= ts < 1 << 62:
            raise RestError(400, "Query parameter ts must be a number of milliseconds since the epoch")
        pkey = request.query.get("pkey")
        items = self._post_items(await request.read())
        logs = log_streams(self.broker, stream)
        log_stream = logs[partition_for_key(pkey, len(logs)) if pkey is not None else 0]
        if not self.broker.has_stream(log_stream):
            if len(logs) > 1 or not self.broker.allowed(user, CONFIGURE, stream):
                raise RestError(404, f"Stream {stream} not found.")
            exc = await self._wait(lambda cb: self.shell.ensure_stream(log_stream, cb))
            if exc is not None:
                raise RestError(500, f"Cannot create stream {stream}: {exc}")
        when = self.broker.wall_clock() if ts is None else ts
        props = {"pkey": pkey} if pkey is not None else None
        records = [_record.from_json_text(text, when, props) for text in items]
        if records:
            exc = await self._wait(lambda cb: self.broker.append_records(log_stream, records,
                                                                         lambda res, e: cb(e)))
            if exc is not None:
                # 503 for a full disk or the disk alarm: nothing was stored, the same request may be retried
                raise RestError(503 if isinstance(exc, StorageFull) else 500, f"Publish failed: {exc}")
        return web.Response(status=200)

    @staticmethod
    def _post_items(body):
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
            _limits.reject(WsJsonServer.name, "depth")
            raise RestError(400, f"Request body nests deeper than the limit of {limit}")
        try:
            value = codec.parse_json(text)
        except ValueError:
            raise RestError(400, "Request body must be a JSON object or a list of them") from None
        items = value if isinstance(value, list) else [value]
        if not all(isinstance(x, dict) for x in items):
            raise RestError(400, "Request body must be a JSON object or a list of them")
        if not all(_record.value_within_depth(x, limit) for x in items):
            _limits.reject(WsJsonServer.name, "depth")
            raise RestError(400, f"Request body nests deeper than the limit of {limit}")
        out = []
        for x in items:
            t = json.dumps(x, separators=(",", ":"), ensure_ascii=False)
            try:
                t.encode("utf-8")
            except UnicodeEncodeError:
                _limits.reject(WsJsonServer.name, "encoding")
                raise RestError(400, codec.ERR_BAD_TEXT) from None
            out.append(t)
        return out

    async def _wait(self, start):
        fut = self.loop.create_future()

        def done(exc):
            if not fut.done():
                fut.set_result(exc)
        start(done)
        return await fut


async def serve(broker, *, host="127.0.0.1", port=DEFAULT_PORT, config=None, max_frame=None, send_buffer_max=None):
    """Start the WebSocket JSON listener on ``host:port`` (0 = any free port) over ``broker``.

    ``config`` (a :mod:`riverbed.shells.config` Config), when given, supplies ``ws_max_frame`` (bytes of
    one client frame) and ``ws_send_buffer`` (bytes a connection may have unsent before it is dropped);
    the keyword arguments override it. Returns the started :class:`WsJsonServer` (``port``,
    ``stop_accepting()``, ``async shutdown()``). Raises OSError when the address cannot be bound.
    """
    if config is not None:
        max_frame = max_frame or getattr(config, "ws_max_frame", None)
        send_buffer_max = send_buffer_max or getattr(config, "ws_send_buffer", None)
    server = WsJsonServer(broker, host=host, port=port, max_frame=max_frame or DEFAULT_MAX_FRAME,
                          send_buffer_max=send_buffer_max or DEFAULT_SEND_BUFFER_MAX,
                          ssl=_tls.context_for(config))    # with tls_cert the port is TLS-only
    return await server.start()
