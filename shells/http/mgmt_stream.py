"""RabbitMQ's management API, the rest of what stream tools read: the stream plugin's listings of
connections, consumers and publishers, and the node-level objects (overview, whoami, nodes, vhosts).

    GET    /api/stream/connections[/{vhost}]                 RabbitMQ Stream connections
    GET    /api/stream/connections/{vhost}/{name}            one (404 when none)
    DELETE /api/stream/connections/{vhost}/{name}            close it as /api/connections does
    GET    /api/stream/connections/{vhost}/{name}/consumers  its subscriptions
    GET    /api/stream/connections/{vhost}/{name}/publishers its publishers
    GET    /api/stream/consumers/{vhost}                     RabbitMQ Stream subscriptions
    GET    /api/stream/publishers/{vhost}[/{stream}]         RabbitMQ Stream publishers (of one stream)
    GET    /api/consumers[/{vhost}]                          the same subscriptions as RabbitMQ lists
                                                             stream consumers among all consumers
                                                             (``consumer_tag`` ``stream.subid-N``)
    PUT    /api/stream/super-streams/{vhost}/{name}         create a super stream with its partitions in
                                                             one step: ``{"partitions": N}`` (streams
                                                             NAME-0.., keys "0"..) or ``{"binding-keys":
                                                             "a,b"}`` (streams NAME-a, ...), ``arguments``
                                                             for the partitions; 204, 400 with the reason
    GET    /api/overview, /api/whoami, /api/nodes[/{node}], /api/vhosts[/{vhost}]

A consumer is RabbitMQ's object (``queue`` {name, vhost}, ``connection_details`` {name, user, node,
peer_host, peer_port}, ``subscription_id``, ``credits``, ``offset``, ``offset_lag``, ``active``,
``activity_status``, ``properties``: the Subscribe properties, e.g. ``name``, ``single-active-consumer``,
``identifier`` from the JS client) plus Riverbed's own fields (``stream``, ``protocol``, ``connection``,
``reference``, ``lag``); a publisher likewise (``queue``, ``connection_details``, ``publisher_id``,
``reference``). Riverbed's ``GET /api/stream/consumers`` and ``/api/stream/publishers`` (no vhost:
every protocol's, :mod:`.api`) carry the same RabbitMQ fields. Not counted here: ``consumed``,
``published``, ``confirmed``, ``errored``.

Users and tags: the users are the broker's (the users file, else guest from loopback); a user whose
``configure`` pattern covers everything is an ``administrator`` (:func:`.auth.is_admin`), any other
``management``. Non-administrators see only their own connections, consumers and publishers, as on
RabbitMQ. The one node is ``riverbed@HOST``, the one virtual host ``/``.
"""

import os
import time

from aiohttp import web

from riverbed.engine.errors import RiverbedError, StreamExists
from riverbed.shells.broker import CONFIGURE, READ, introspect
from riverbed.shells.http import mgmt
from riverbed.shells.http.auth import is_admin, require_user
from riverbed.shells.http.mgmt import NODE, VHOST, broker_call, check_vhost, connection_json, not_found, read_json
from riverbed.shells.http.server import BROKER, json_error
from riverbed.shells.protocols import HTTP, STREAM, STREAM_TLS
from riverbed.shells.rmq_stream.constants import RABBITMQ_VERSION
from riverbed.shells.version import VERSION

routes = web.RouteTableDef()

STREAM_PROTOCOL = STREAM
CONSUMER_TAG_PREFIX = "stream.subid-"     # rabbit_stream_metrics's CTAG_PREFIX
STARTED = time.time()


def setup(app):
    app.add_routes(routes)


def tags(user):
    """RabbitMQ user tags of ``user``."""
    return ["administrator"] if is_admin(user) else ["management"]


def _details(info):
    return {"name": info["name"], "user": info.get("user", ""), "node": NODE,
            "peer_host": info.get("peer_host"), "peer_port": info.get("peer_port")}


def with_rabbit_fields(entry, infos):
    """A consumer or publisher dict of :mod:`riverbed.shells.broker.introspect` with RabbitMQ's fields
    added (``infos``: connection name -> connection_info())."""
    out = dict(entry)
    info = infos.get(entry["connection"]) or {"name": entry["connection"]}
    out["queue"] = {"name": entry["stream"], "vhost": VHOST}
    out["connection_details"] = _details(info)
    if "subscription_id" in entry:
        out.setdefault("properties", {})
        out.setdefault("active", True)
        out.setdefault("activity_status", "up")
        out["offset_lag"] = entry.get("lag") or 0
    return out


def connection_infos(request):
    """connection name -> connection_info() of every live connection (the oldest of a shared name)."""
    out = {}
    for _, info in mgmt._connections(request):
        out.setdefault(info["name"], info)
    return out


def _own(user, entry):
    return is_admin(user) or entry["connection_details"].get("user") == user.name


def rabbit_entries(request, user, collect, stream=None, protocol=None):
    """``collect(broker, stream)`` (introspect.consumers or .publishers) in RabbitMQ's shape, of the
    streams ``user`` may read and (unless an administrator) of its own connections."""
    infos = connection_infos(request)
    out = []
    for e in collect(request.app[BROKER], stream):
        if protocol is not None and e["protocol"] != protocol:
            continue
        if not user.can(READ, e["stream"]):
            continue
        e = with_rabbit_fields(e, infos)
        if _own(user, e):
            out.append(e)
    return out


# ------------------------------------------------------------------------------- stream connections

def _stream_connections(request, user):
    return [(s, i) for s, i in mgmt._connections(request)
            if i.get("protocol") == STREAM_PROTOCOL and mgmt._visible(user, i)]


@routes.get("/api/stream/connections")
@routes.get("/api/stream/connections/{vhost}")
async def list_stream_connections(request):
    user = await require_user(request)
    check_vhost(request)
    return web.json_response([connection_json(i) for _, i in _stream_connections(request, user)])


def _stream_connection(request, user):
    check_vhost(request)
    name = request.match_info["name"]
    found = [(s, i) for s, i in _stream_connections(request, user) if name in (i["name"], mgmt.address_name(i))]
    if not found:
        raise not_found()
    return found


@routes.get("/api/stream/connections/{vhost}/{name}")
async def get_stream_connection(request):
    user = await require_user(request)
    return web.json_response(connection_json(_stream_connection(request, user)[0][1]))


@routes.delete("/api/stream/connections/{vhost}/{name}")
async def close_stream_connection(request):
    user = await require_user(request)
    reason = request.headers.get("X-Reason") or mgmt.DEFAULT_CLOSE_REASON
    for session, info in _stream_connection(request, user):
        mgmt.log.info("closing connection %r at the request of %r: %s", info["name"], user.name, reason)
        session.close_by_admin(reason)
    return web.Response(status=204)


@routes.get("/api/stream/connections/{vhost}/{name}/consumers")
async def stream_connection_consumers(request):
    user = await require_user(request)
    session, info = _stream_connection(request, user)[0]
    entries = [dict(e, lag=None) for e in session.consumer_infos()] if hasattr(session, "consumer_infos") else []
    return web.json_response([with_rabbit_fields(e, {info["name"]: info}) for e in entries])


@routes.get("/api/stream/connections/{vhost}/{name}/publishers")
async def stream_connection_publishers(request):
    user = await require_user(request)
    session, info = _stream_connection(request, user)[0]
    entries = session.publisher_infos() if hasattr(session, "publisher_infos") else []
    return web.json_response([with_rabbit_fields(e, {info["name"]: info}) for e in entries])


# ------------------------------------------------------------------------------ consumers, publishers

@routes.get("/api/stream/consumers/{vhost}")
async def stream_consumers(request):
    user = await require_user(request)
    check_vhost(request)
    return web.json_response(rabbit_entries(request, user, introspect.consumers, protocol=STREAM_PROTOCOL))


@routes.get("/api/stream/publishers/{vhost}")
async def stream_publishers(request):
    user = await require_user(request)
    check_vhost(request)
    return web.json_response(rabbit_entries(request, user, introspect.publishers, protocol=STREAM_PROTOCOL))


@routes.get("/api/stream/publishers/{vhost}/{stream}")
async def stream_publishers_of(request):
    user = await require_user(request)
    check_vhost(request)
    stream = request.match_info["stream"]
    if not request.app[BROKER].has_stream(stream):
        raise not_found()
    return web.json_response(rabbit_entries(request, user, introspect.publishers, stream, STREAM_PROTOCOL))


@routes.get("/api/consumers")
@routes.get("/api/consumers/{vhost}")
async def consumers(request):
    user = await require_user(request)
    check_vhost(request)
    out = []
    for e in rabbit_entries(request, user, introspect.consumers, protocol=STREAM_PROTOCOL):
        d = e["connection_details"]
        out.append({"consumer_tag": f"{CONSUMER_TAG_PREFIX}{e['subscription_id']}", "queue": e["queue"],
                    "channel_details": {"connection_name": d["name"], "name": f"{d['name']} (1)", "node": NODE,
                                        "number": 1, "peer_host": d["peer_host"], "peer_port": d["peer_port"],
                                        "user": d["user"]},
                    "ack_required": False, "exclusive": False, "prefetch_count": 0, "active": e["active"],
                    "activity_status": e["activity_status"], "arguments": e["properties"]})
    return web.json_response(out)


MAX_PARTITIONS = 1024      # partitions one super-streams PUT may ask for


@routes.put("/api/stream/super-streams/{vhost}/{name}")
async def put_super_stream(request):
    user = await require_user(request)
    check_vhost(request)
    name = request.match_info["name"]
    body = await read_json(request)

    def bad(reason):
        return json_error(web.HTTPBadRequest, "bad_request", reason)
    count, keys = body.get("partitions"), body.get("binding-keys")
    if count is None and keys is None:
        raise bad("Must specify partitions or binding keys")
    if count is not None and keys is not None:
        raise bad("Specify partitions or binding keys, not both")
    if count is not None:
        try:
            count = int(count)
        except (TypeError, ValueError):
            raise bad("The partitions must be a number") from None
        if not 1 <= count <= MAX_PARTITIONS:
            raise bad(f"The partition number must be from 1 to {MAX_PARTITIONS}")
        keys = [str(i) for i in range(count)]
    else:
        keys = [k.strip() for k in str(keys).split(",") if k.strip()][:MAX_PARTITIONS + 1]
        if not keys or len(keys) > MAX_PARTITIONS:
            raise bad(f"The number of binding keys must be from 1 to {MAX_PARTITIONS}")
    partitions = [f"{name}-{k}" for k in keys]
    if not all(user.can(CONFIGURE, x) for x in [name] + partitions):
        raise json_error(web.HTTPForbidden, "not_authorized", "Access refused.")
    args = body.get("arguments") or {}
    if not isinstance(args, dict):
        raise bad("arguments must be a JSON object")
    try:
        await broker_call(request.app[BROKER].create_super_stream, name, partitions, keys, args)
    except StreamExists as e:
        raise bad(f"{{already_exists, \"{e}\"}}") from None
    except RiverbedError as e:
        raise bad(str(e)) from None
    return web.Response(status=204)


# --------------------------------------------------------------------------- node-level objects

@routes.get("/api/overview")
async def overview(request):
    user = await require_user(request)
    broker = request.app[BROKER]
    streams = introspect.streams(broker, [n for n in broker.list_streams() if user.can(READ, n)])
    messages = sum(s["records"] for s in streams)
    conns = [i for _, i in mgmt._connections(request) if mgmt._visible(user, i)]
    listeners = [{"node": NODE, "protocol": _LISTENER_PROTOCOLS.get(name, name), "ip_address": _host(server),
                  "port": getattr(server, "port", None)} for name, server in getattr(broker, "listeners", [])]
    return web.json_response({
        "management_version": RABBITMQ_VERSION, "rabbitmq_version": RABBITMQ_VERSION,
        "product_name": "Riverbed", "product_version": VERSION, "riverbed_version": VERSION,
        "cluster_name": "riverbed", "node": NODE, "rates_mode": "none", "disable_stats": False,
        "exchange_types": [{"name": "direct", "description": "super stream", "enabled": True}],
        "object_totals": {"connections": len(conns), "channels": 0, "queues": len(streams),
                          "exchanges": len(broker.list_super_streams()),
                          "consumers": sum(s["consumers"] for s in streams)},
        "queue_totals": {"messages": messages, "messages_ready": messages, "messages_unacknowledged": 0},
        "message_stats": {}, "listeners": listeners,
        "contexts": [{"node": NODE, "description": "RabbitMQ Management", "path": "/",
                      "port": str(request.url.port or "")}],
    })


# our listener names (protocols.py) -> RabbitMQ's listener protocols
_LISTENER_PROTOCOLS = {STREAM: "stream", STREAM_TLS: "stream/ssl", HTTP: "http"}


def _host(server):
    return getattr(server, "host", None) or "127.0.0.1"


@routes.get("/api/whoami")
async def whoami(request):
    user = await require_user(request)
    return web.json_response({"name": user.name, "tags": tags(user)})


def node_json():
    return {"name": NODE, "type": "disc", "running": True, "being_drained": False, "os_pid": str(os.getpid()),
            "uptime": int((time.time() - STARTED) * 1000), "rates_mode": "none",
            "applications": [{"name": "riverbed", "description": "Riverbed", "version": VERSION},
                             {"name": "rabbitmq_stream", "description": "RabbitMQ Stream protocol (as served "
                              "by Riverbed)", "version": RABBITMQ_VERSION}]}


@routes.get("/api/nodes")
async def nodes(request):
    await require_user(request)
    return web.json_response([node_json()])


@routes.get("/api/nodes/{node}")
async def node(request):
    await require_user(request)
    if request.match_info["node"] != NODE:
        raise not_found()
    return web.json_response(node_json())


def vhost_json(broker):
    streams = introspect.streams(broker)
    messages = sum(s["records"] for s in streams)
    return {"name": VHOST, "description": "Default virtual host", "tags": [], "metadata": {
        "description": "Default virtual host", "tags": [], "default_queue_type": "stream"},
        "default_queue_type": "stream", "tracing": False, "cluster_state": {NODE: "running"},
        "messages": messages, "messages_ready": messages, "messages_unacknowledged": 0}


@routes.get("/api/vhosts")
async def vhosts(request):
    await require_user(request)
    return web.json_response([vhost_json(request.app[BROKER])])


@routes.get("/api/vhosts/{vhost}")
async def vhost(request):
    await require_user(request)
    check_vhost(request)
    return web.json_response(vhost_json(request.app[BROKER]))
