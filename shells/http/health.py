"""``GET /healthz`` and ``GET /readyz``: probes for a supervisor or a load balancer.

``/healthz``: 200 when the engine's writer thread is alive and every listener ``riverbed serve``
started (``broker.listeners``) still accepts connections; 503 otherwise. The body is JSON either way::

    {"status": "ok" | "failing", "reasons": [...], "writer": "running" | "stopped",
     "listeners": {"stream": "accepting", "http": "accepting", "zmq": "closed", ...},
     "disk": {"alarm": false, "free_bytes": ..., "free_limit_bytes": ..., "max_disk_bytes": null,
              "data_bytes": ...}}

The disk alarm (``riverbed serve --disk-free-limit`` / ``--max-disk``, see broker/disk.py) makes it 503
too, with a reason that starts with ``disk``: publishes are refused until space returns, and it is 200
again by itself once they are accepted.

``reasons`` says, one line each, why it fails (empty when ok). A listener is asked ``accepting()`` when it
has that method; otherwise its listening socket is looked at: an asyncio server (every TCP listener,
HTTP and WebSocket) must be serving with its sockets open, the ZeroMQ ROUTER bound and read.

``/readyz``: 200 ``{"status": "ready"}`` once every listener is up, 503 ``{"status": "not ready",
"reason": "starting" | "stopping"}`` before that and from the moment a stop was asked for.

No authentication, whatever the users file says: probes carry no credentials, and the answers name
only listeners and the writer's state, never a stream or a user. (``/metrics`` follows the users file.)
Both answer on the loop thread from memory; neither touches LMDB.
"""

from aiohttp import web

from riverbed.shells.http.server import BROKER

ACCEPTING, CLOSED, UNKNOWN = "accepting", "closed", "unknown"
_NO_STORE = {"Cache-Control": "no-store"}


def _asyncio_server(server):
    """The asyncio Server under a listener, if it has one (TcpListener and HttpServer keep it in
    ``_server``, the WebSocket listener in its aiohttp site)."""
    srv = getattr(server, "_server", None)
    if srv is None:
        site = getattr(server, "_site", None)
        srv = getattr(site, "_server", None)
    return srv if hasattr(srv, "is_serving") else None


def listener_state(server):
    """``ACCEPTING``, ``CLOSED`` or ``UNKNOWN`` (a listener of a shape not known here; it is not
    counted as failing) for one started listener. Loop thread."""
    fn = getattr(server, "accepting", None)
    if callable(fn):
        return ACCEPTING if fn() else CLOSED
    srv = _asyncio_server(server)
    if srv is not None:
        socks = srv.sockets or ()
        ok = srv.is_serving() and bool(socks) and all(s.fileno() >= 0 for s in socks)
        return ACCEPTING if ok else CLOSED
    sock = getattr(server, "sock", None)       # the ZeroMQ ROUTER: bound (endpoint) and read by the loop
    if sock is not None and hasattr(server, "endpoint"):
        ok = not sock.closed and bool(server.endpoint) and getattr(server, "_reading", True)
        return ACCEPTING if ok else CLOSED
    return UNKNOWN


def check(broker):
    """``(healthy, body)`` for ``broker``: see the module docstring for the body. Loop thread."""
    reasons = []
    alive = broker.writer_alive()
    if not alive:
        reasons.append("the engine's writer thread has stopped: no write can commit (see the server log)")
    states = {}
    for name, server in getattr(broker, "listeners", ()):
        state = listener_state(server)
        states[name] = state
        if state == CLOSED:
            reasons.append(f"listener {name} is not accepting connections")
    body = {"status": "failing" if reasons else "ok", "reasons": reasons,
            "writer": "running" if alive else "stopped", "listeners": states}
    disk = getattr(broker, "disk", None)
    if disk is not None:      # as of the disk alarm's last look (once a second): no statvfs here
        if disk.alarm:
            reasons.append(f"disk alarm: {disk.reason}; publishes are refused until space returns")
            body["status"] = "failing"
        body["disk"] = {"alarm": disk.alarm, "free_bytes": disk.free, "free_limit_bytes": disk.free_limit,
                        "max_disk_bytes": disk.max_disk, "data_bytes": disk.data_bytes}
    return not reasons, body


async def healthz(request):
    healthy, body = check(request.app[BROKER])
    return web.json_response(body, status=200 if healthy else 503, headers=_NO_STORE)


async def readyz(request):
    broker = request.app[BROKER]
    if getattr(broker, "ready", False):
        return web.json_response({"status": "ready"}, headers=_NO_STORE)
    # listeners are registered when all are up, so having some means a stop was asked for
    reason = "stopping" if getattr(broker, "listeners", None) else "starting"
    return web.json_response({"status": "not ready", "reason": reason}, status=503, headers=_NO_STORE)


def setup(app):
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
