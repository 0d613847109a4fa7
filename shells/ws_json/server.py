"""The WebSocket JSON listener: aiohttp serving the Streamr v28 WebSocket at ``/api/v1/ws`` and the REST
data API under ``/api/v1`` on one port.

Transport glue only: each WebSocket gets a sans-I/O :class:`~riverbed.shells.ws_json.session.WsSession`
whose output is written straight to the connection's transport as ready-made WebSocket frames (the
listener asks aiohttp for no compression, so a server frame is the bytes of ``codec.ws_text_frame``, and
a broadcast frame built once can go to every subscriber). aiohttp still reads, answers pings and runs
the closing handshake. A client frame over ``max_frame`` bytes closes the connection with 1009 (Message
Too Big).

The REST data API on the same port is :mod:`riverbed.shells.ws_json.rest`.
"""

import asyncio
import logging

from aiohttp import WSCloseCode, WSMsgType, web

from riverbed.shells import tls as _tls
from riverbed.shells.auth import is_loopback
from riverbed.shells.broker import limits as _limits
from riverbed.shells.broker.session import State, drain
from riverbed.shells.broker.stats import ERR_WEBSOCKET
from riverbed.shells.http.server import body_limit
from riverbed.shells.webtext import guard_server
from riverbed.shells.ws_json.rest import RestApi, error_response
from riverbed.shells.ws_json.session import (
    DEFAULT_SEND_BUFFER_MAX, RESEND_HIGH_WATER, WsSession, WsShell,
)
from riverbed.shells.protocols import WS

log = logging.getLogger("riverbed.ws")

WS_PATH = "/api/v1/ws"
DEFAULT_PORT = 8890
DEFAULT_MAX_FRAME = 1 << 20        # bytes of one client frame
CLOSE_GRACE = 1.0                  # seconds a closing handshake may take at shutdown


class WsIO:
    """The aiohttp adapter of one session to the kernel's io contract: writes go straight to the
    transport; when a write takes the transport over its high mark (:data:`RESEND_HIGH_WATER`) the
    session hears ``pause_writing()``, and ``resume_writing()`` once aiohttp's protocol has drained
    under the low mark (asyncio's flow control, no polling)."""

    __slots__ = ("ws", "transport", "protocol", "loop", "close_task", "readable", "session", "_drain_task")

    def __init__(self, ws, request, loop):
        self.ws = ws
        self.transport = request.transport
        self.protocol = request.protocol
        self.loop = loop
        self.close_task = None
        self.readable = None       # an asyncio.Event while reading is paused
        self.session = None
        self._drain_task = None
        self.transport.set_write_buffer_limits(high=RESEND_HIGH_WATER)

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
            if self.protocol.writing_paused and self._drain_task is None and self.session is not None:
                self.session.pause_writing()
                self._drain_task = self.loop.create_task(self._drained())

    def writelines(self, parts):
        self.write(b"".join(parts))

    async def _drained(self):
        try:
            # aiohttp's protocol resolves this once asyncio calls its resume_writing (under the low mark)
            await self.protocol._drain_helper()
        except (ConnectionError, RuntimeError):
            self.resume_reading()       # the peer is gone: the handler must see it and end the session
            return
        finally:
            self._drain_task = None
        s = self.session
        if s is not None and s.state < State.CLOSED:
            s.guard(s.resume_writing)

    def buffer_size(self):
        t = self.transport
        return t.get_write_buffer_size() if t is not None else 0

    def close(self, code=1000, reason=""):
        self.resume_reading()       # the handler must see the close, not wait for commits
        if self.close_task is None and not self.ws.closed:
            self.close_task = self.loop.create_task(
                self.ws.close(code=code, message=reason.encode("utf-8")[:120]))

    def abort(self, reason=None):
        self.resume_reading()
        t, self.transport = self.transport, None
        if t is not None:
            t.abort()

    def defer(self, fn, *args):
        self.loop.call_soon(fn, *args)

    def call_later(self, seconds, fn, *args):
        return self.loop.call_later(seconds, fn, *args)


class WsJsonServer:
    """The listener. Create it with :func:`serve`. ``port`` is the bound port. Loop-thread only."""

    name = WS

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
        RestApi(self.broker, self.loop).add_routes(app)
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
        closing = lambda: any(s.io.close_task is not None and not s.io.close_task.done()  # noqa: E731
                              for s in self.sessions)
        left = await drain(self.loop, lambda: list(self.sessions), drain_timeout=drain_timeout,
                           close_grace=CLOSE_GRACE, alive=closing)
        for s in left:
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
            return error_response(403, "Only loopback clients are served without a users file")
        if self._stopping:
            return error_response(503, "server shutting down")
        ws = web.WebSocketResponse(compress=False, max_msg_size=self.max_frame, autoping=True)
        await ws.prepare(request)
        io = WsIO(ws, request, self.loop)
        session = io.session = WsSession(self.shell, io, peer=tuple(peer[:2]), local=tuple(local[:2]),
                                         peer_loopback=loopback)
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
                if session.state == State.CLOSED:      # dropped (send buffer over its bound)
                    break
        finally:
            session.connection_lost()
            self.sessions.discard(session)
        return ws


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
