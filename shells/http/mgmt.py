"""RabbitMQ's management API, the connection part, over every protocol's connections.

    GET    /api/connections          the connections the user may see, as a JSON array
    GET    /api/connections/{name}   one connection (404 when there is none of that name)
    DELETE /api/connections/{name}   close it (the protocol's Close, then the socket): 204

A connection is shown in RabbitMQ's shape: ``name``, ``user``, ``vhost``, ``protocol``, ``host``,
``port``, ``peer_host``, ``peer_port``, ``connected_at`` (ms since the epoch), ``state``,
``client_properties``, and ``user_provided_name`` when the client sent ``connection_name`` (plus any
other field the protocol's ``connection_info()`` gives).

Names: the broker names a connection after the client's ``client_properties.connection_name`` when it
sent one, otherwise ``"PEER_HOST:PEER_PORT -> HOST:PORT"`` as RabbitMQ does. A client-chosen name need
not be unique (rstream names every consumer connection ``rstream-consumer`` unless told otherwise), so
``{name}`` also matches a connection's generated ``"peer -> local"`` name, which is unique; GET of a shared
name answers the oldest such connection and DELETE closes all of them. The ``X-Reason`` header of a
DELETE is the reason sent in the Close (default ``Closed via management plugin``, as RabbitMQ).

Permissions (see :mod:`.auth`): any authenticated user may list; an administrator sees and closes every
connection, another user only its own (403 for someone else's).
"""

import asyncio
import json
import logging
import socket

from aiohttp import web

from riverbed.shells.http.auth import is_admin, require_user
from riverbed.shells.http.server import BROKER, json_error

log = logging.getLogger("riverbed.http")

DEFAULT_CLOSE_REASON = "Closed via management plugin"
VHOST = "/"                       # the one virtual host served
NODE = f"riverbed@{socket.gethostname().split('.')[0] or 'localhost'}"   # RabbitMQ's "rabbit@host" form

routes = web.RouteTableDef()


def setup(app):
    app.add_routes(routes)


def not_found():
    """RabbitMQ's 404 body."""
    return json_error(web.HTTPNotFound, "Object Not Found", "Not Found")


def check_vhost(request):
    """The ``{vhost}`` of the path (URL-decoded by aiohttp: ``%2F`` is ``/``); 404 unless it is ``/``."""
    vhost = request.match_info.get("vhost", VHOST)
    if vhost != VHOST:
        raise not_found()
    return vhost


async def read_json(request):
    """The request's JSON object body ({} when empty); 400 ``bad_request`` when it is not one."""
    raw = await request.read()
    if not raw.strip():
        return {}
    try:
        body = json.loads(raw)
    except ValueError as e:
        raise json_error(web.HTTPBadRequest, "bad_request", f"invalid JSON body: {e}") from None
    if not isinstance(body, dict):
        raise json_error(web.HTTPBadRequest, "bad_request", "the body must be a JSON object")
    return body


async def broker_call(method, *args):
    """Await a broker method that reports through a callback (its last argument): ``cb(result, exc)``
    or, for the methods whose callback takes only ``exc``, ``cb(exc)``. Returns the result; raises
    the exception."""
    fut = asyncio.get_running_loop().create_future()

    def cb(*outcome):
        if fut.done():
            return
        res, exc = outcome if len(outcome) == 2 else (None, outcome[0])
        if exc is not None:
            fut.set_exception(exc)
        else:
            fut.set_result(res)
    method(*args, cb)
    return await fut


def _hostport(host, port):
    host = str(host)
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def address_name(info):
    """RabbitMQ's generated connection name, ``"PEER_HOST:PEER_PORT -> HOST:PORT"``."""
    return f"{_hostport(info['peer_host'], info['peer_port'])} -> {_hostport(info['host'], info['port'])}"


def connection_json(info):
    """A ``connection_info()`` dict in the shape of RabbitMQ's ``/api/connections`` items: every field the
    session gives (so a protocol can add its own), ``vhost`` "/" unless it says otherwise, and
    ``user_provided_name`` when the client chose a name."""
    out = dict(info)
    props = out["client_properties"] = dict(info.get("client_properties") or {})
    out.setdefault("vhost", "/")
    if props.get("connection_name"):
        out["user_provided_name"] = props["connection_name"]
    return out


def _connections(request):
    """(session, info) of every live connection, oldest first."""
    found = []
    for session in list(request.app[BROKER].sessions):
        if hasattr(session, "connection_info"):
            found.append((session, session.connection_info()))
    found.sort(key=lambda si: (si[1].get("connected_at") or 0, si[1]["name"]))
    return found


def _visible(user, info):
    return is_admin(user) or info.get("user") == user.name


def _named(request, user, name):
    """The connections called ``name`` that ``user`` may see; 404 when there are none at all, 403 when
    there are some but none of them is the user's."""
    matches = [(s, i) for s, i in _connections(request) if name in (i["name"], address_name(i))]
    if not matches:
        raise json_error(web.HTTPNotFound, "Object Not Found", "Not Found")
    mine = [(s, i) for s, i in matches if _visible(user, i)]
    if not mine:
        raise json_error(web.HTTPForbidden, "not_authorized", "Not administrator user")
    return mine


@routes.get("/api/connections")
async def list_connections(request):
    user = await require_user(request)
    return web.json_response([connection_json(i) for _, i in _connections(request) if _visible(user, i)])


@routes.get("/api/connections/{name}")
async def get_connection(request):
    user = await require_user(request)
    _, info = _named(request, user, request.match_info["name"])[0]
    return web.json_response(connection_json(info))


@routes.delete("/api/connections/{name}")
async def close_connection(request):
    user = await require_user(request)
    reason = request.headers.get("X-Reason") or DEFAULT_CLOSE_REASON
    for session, info in _named(request, user, request.match_info["name"]):
        log.info("closing connection %r at the request of %r: %s", info["name"], user.name, reason)
        try:
            result = session.close_by_admin(reason)
            if hasattr(result, "__await__"):
                await result
        except Exception:
            log.exception("closing connection %r", info["name"])
    return web.Response(status=204)
