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

import logging

from aiohttp import web

from riverbed.shells.http.auth import is_admin, require_user
from riverbed.shells.http.server import BROKER, json_error

log = logging.getLogger("riverbed.http")

DEFAULT_CLOSE_REASON = "Closed via management plugin"

routes = web.RouteTableDef()


def setup(app):
    app.add_routes(routes)


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
