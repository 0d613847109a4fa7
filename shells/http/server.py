"""The HTTP listener: one aiohttp application, one route module per feature, one asyncio server.

A feature is a module with ``setup(app)`` that adds its routes (and, if it needs them, startup or
cleanup hooks) to the application. ``FEATURES`` lists them in order; a new feature (``/metrics``,
``/healthz``, a dashboard) is a new module and one more line there. Every route finds the broker in
``request.app[BROKER]`` and the server's settings in ``request.app[CONFIG]``; routes that need a user
call :func:`riverbed.shells.http.auth.require_user`.

Lifecycle, as every listener of ``riverbed serve``: :func:`serve` binds and returns an
:class:`HttpServer` whose ``port`` is the bound port; ``stop_accepting()`` closes the listening socket
and ``await shutdown()`` lets running requests finish (at most ``SHUTDOWN_TIMEOUT`` seconds) and closes
every connection.
"""

import asyncio
import importlib
import json

from aiohttp import hdrs, web

from riverbed.shells import tls as _tls
from riverbed.shells.broker import limits as _limits
from riverbed.shells.webtext import guard_server
from riverbed.shells.protocols import HTTP

DEFAULT_PORT = 15692            # RabbitMQ's Prometheus port; the management API shares the listener here
SHUTDOWN_TIMEOUT = 2.0          # seconds running requests get to finish at shutdown

BROKER = web.AppKey("broker", object)    # the shared broker (shells/broker)
CONFIG = web.AppKey("config", object)    # the resolved settings of `riverbed serve` (or None)

FEATURES = (
    "riverbed.shells.http.mgmt",          # /api/connections: RabbitMQ's management API, connection part
    "riverbed.shells.http.mgmt_queues",   # /api/queues, /api/exchanges, /api/bindings: streams, super streams
    "riverbed.shells.http.mgmt_stream",   # /api/stream/*, /api/consumers, /api/overview|whoami|nodes|vhosts
    "riverbed.shells.http.metrics",       # /metrics: Prometheus text (prometheus-client)
    "riverbed.shells.http.health",        # /healthz, /readyz: probes, no auth
    "riverbed.shells.http.api",           # /api/streams, /api/stream/consumers|publishers: dashboard JSON
    "riverbed.shells.http.dashboard",     # GET /, /static/*, /api/events (server-sent snapshots)
    "riverbed.shells.http.cluster",       # /api/cluster: nodes, each stream's leader, members and lag
)


def json_error(cls, error, reason, **kw):
    """An aiohttp HTTP exception of class ``cls`` with RabbitMQ's error body ``{"error", "reason"}``."""
    return cls(text=json.dumps({"error": error, "reason": reason}), content_type="application/json", **kw)


@web.middleware
async def _json_errors(request, handler):
    """Errors under /api/ (an unknown path, a wrong method) answer JSON, as RabbitMQ's API does."""
    try:
        return await handler(request)
    except web.HTTPException as e:
        if e.status < 400 or e.content_type == "application/json" or not request.path.startswith("/api/"):
            raise
        headers = {k: v for k, v in e.headers.items() if k not in (hdrs.CONTENT_TYPE, hdrs.CONTENT_LENGTH)}
        return web.json_response({"error": e.reason, "reason": e.reason}, status=e.status, headers=headers)


def body_limit(listener, max_size):
    """An aiohttp middleware refusing request bodies over ``max_size`` bytes with 413 before the handler
    reads them (a declared Content-Length), or when reading passes it (chunked: aiohttp's
    ``client_max_size``, which the application must be given the same value); each refusal is counted in
    ``riverbed_rejected_total{listener,reason="frame_size"}``."""
    @web.middleware
    async def _body_limit(request, handler):
        n = request.content_length
        if n is not None and n > max_size:
            _limits.reject(listener, _limits.REASON_FRAME_SIZE, f"request body of {n} bytes is over "
                           f"{max_size}", request.remote)
            raise web.HTTPRequestEntityTooLarge(max_size=max_size, actual_size=n)
        try:
            return await handler(request)
        except web.HTTPRequestEntityTooLarge:
            _limits.reject(listener, _limits.REASON_FRAME_SIZE, f"request body over {max_size}", request.remote)
            raise
    return _body_limit


def build_app(broker, config=None, features=FEATURES):
    """The aiohttp application with every feature's routes."""
    max_body = getattr(broker, "limits", _limits.DEFAULT).http_max_body
    app = web.Application(middlewares=[body_limit("http", max_body), _json_errors], client_max_size=max_body)
    app[BROKER] = broker
    app[CONFIG] = config
    for name in features:
        importlib.import_module(name).setup(app)
    return app


class HttpServer:
    """The HTTP listener over one broker. Create it with :func:`serve`. Loop-thread only."""

    name = HTTP

    def __init__(self, broker, *, host="127.0.0.1", port=DEFAULT_PORT, config=None, features=FEATURES):
        self.broker = broker
        self.host = host
        self.port = port
        self.config = config
        self.app = build_app(broker, config, features)
        self._runner = None
        self._server = None
        self.scheme = "http"

    async def start(self):
        runner = web.AppRunner(self.app, access_log=None, shutdown_timeout=SHUTDOWN_TIMEOUT)
        await runner.setup()
        guard_server(runner.server, lambda: _limits.reject(self.name, "encoding"))
        try:
            ctx = _tls.context_for(self.config)
            if ctx is None:
                self._server = await asyncio.get_running_loop().create_server(
                    runner.server, self.host, self.port, reuse_address=True, backlog=128)
            else:                       # with --tls-cert the port is HTTPS only
                self._server = await _tls.create_server(runner.server, self.host, self.port, ctx, self.name,
                                                        backlog=128)
        except BaseException:
            await runner.cleanup()
            raise
        self._runner = runner
        self.port = self._server.sockets[0].getsockname()[1]
        self.scheme = "http" if ctx is None else "https"     # told to RabbitMQ Stream clients (http-url)
        return self

    def stop_accepting(self):
        if self._server is not None:
            self._server.close()

    async def shutdown(self):
        self.stop_accepting()
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()


async def serve(broker, *, host="127.0.0.1", port=DEFAULT_PORT, config=None):
    """Start the HTTP listener on ``host:port`` (0 = any free port) for ``broker``; returns the started
    :class:`HttpServer`. Raises OSError when the address cannot be bound."""
    return await HttpServer(broker, host=host, port=port, config=config).start()
