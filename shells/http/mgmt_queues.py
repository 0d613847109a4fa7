"""RabbitMQ's management API for streams and super streams: queues, exchanges and bindings.

A stream is a queue of type ``stream``; a super stream is what RabbitMQ makes it, a ``direct`` exchange
bound to its partition streams, the binding's routing key being the partition's binding key and its
``x-stream-partition-order`` argument the partition's place (what Partitions answers, in that order,
and Route matches). Tools build one with ``PUT /api/exchanges``, ``PUT /api/queues`` per partition and
``POST /api/bindings`` per partition, in that order; each call lands in the broker at once (the
exchange is a super stream with no partitions yet, each binding adds one), so RabbitMQ Stream clients
see the super stream grow exactly as they would on RabbitMQ. What RabbitMQ does, this does:

    PUT    /api/queues/{vhost}/{name}        create a stream (201; 204 when an equivalent one exists; 400
                                             ``inequivalent arg`` when its arguments differ). ``arguments``:
                                             ``x-queue-type: stream`` (required: only streams are served),
                                             ``x-max-length-bytes``, ``x-max-age``,
                                             ``x-stream-max-segment-size-bytes``, ``x-initial-cluster-size``,
                                             ``x-queue-leader-locator``, ``x-stream-filter-size-bytes``
    GET    /api/queues[/{vhost}]             every stream, RabbitMQ's queue objects
    GET    /api/queues/{vhost}/{name}        one: ``messages`` (records stored), ``arguments``, ``type``,
                                             ``node``, ``leader``, ``members``, ``consumers``, ...
    DELETE /api/queues/{vhost}/{name}        delete the stream (204) and its bindings, as RabbitMQ
    GET    /api/queues/{vhost}/{name}/bindings
    PUT    /api/exchanges/{vhost}/{name}     declare a super stream (``type`` ``direct``): 201 / 204
    GET    /api/exchanges[/{vhost}[/{name}]] the super streams as exchanges
    DELETE /api/exchanges/{vhost}/{name}     forget the super stream; its partition streams stay (204)
    GET    /api/exchanges/{vhost}/{name}/bindings/source
    POST   /api/bindings/{vhost}/e/{exchange}/q/{queue}   bind a partition: ``routing_key`` and
                                             ``arguments`` (``x-stream-partition-order``); 201 with
                                             ``Location``
    GET    /api/bindings[/{vhost}], /api/bindings/{vhost}/e/{exchange}/q/{queue}[/{props}]
    DELETE /api/bindings/{vhost}/e/{exchange}/q/{queue}/{props}   unbind (204)

``{vhost}`` is ``%2F`` (``/``), the one virtual host; any other answers 404, as an unknown vhost does on
RabbitMQ. Errors are RabbitMQ's bodies: 404 ``{"error": "Object Not Found", "reason": "Not Found"}``,
400 ``bad_request``, 403 ``access_refused``. Permissions as RabbitMQ maps them onto the user's patterns:
``configure`` on a stream or super stream to create or delete it, ``write`` on the partition and
``read`` on the super stream to bind.

Only the broker layer is called (create/delete stream, declare/bind/unbind/forget super stream); each
handler answers after the engine has committed the change.
"""

import base64
import hashlib
import json
import urllib.parse

from aiohttp import web

from riverbed.engine.errors import InvalidArgument, RiverbedError, StreamExists, StreamNotFound
from riverbed.shells.broker import CONFIGURE, READ, WRITE, introspect
from riverbed.shells.http.auth import require_user
from riverbed.shells.http.mgmt import NODE, VHOST, broker_call, check_vhost, not_found, read_json
from riverbed.shells.http.server import BROKER, json_error

routes = web.RouteTableDef()

QUEUE_TYPE = "x-queue-type"
PARTITION_ORDER = "x-stream-partition-order"
EXCHANGE_TYPE = "direct"
# stream arguments whose RabbitMQ value is a number (the engine keeps every argument as text)
_NUMERIC_ARGS = {"max-length-bytes", "stream-max-segment-size-bytes", "initial-cluster-size",
                 "stream-filter-size-bytes", "chunk-max-bytes", "chunk-max-records"}


def setup(app):
    app.add_routes(routes)


# ------------------------------------------------------------------------------------------- helpers

def _access_refused(kind, name, user):
    return json_error(web.HTTPForbidden, "access_refused",
                      f"access to {kind} '{name}' in vhost '{VHOST}' refused for user '{user.name}'")


def _bad_request(reason):
    return json_error(web.HTTPBadRequest, "bad_request", reason)


def rabbit_arguments(args):
    """The engine's stream arguments (no ``x-`` prefix, text values) as RabbitMQ shows a stream's:
    ``x-queue-type`` first, numbers as numbers."""
    out = {QUEUE_TYPE: "stream"}
    for key, value in sorted((args or {}).items()):
        if key == "queue-type":
            continue
        out[f"x-{key}"] = int(value) if key in _NUMERIC_ARGS and str(value).isdigit() else value
    return out


def queue_json(broker, name, consumers=None):
    """RabbitMQ's queue object for stream ``name``. Raises StreamNotFound."""
    st = introspect.stream_state(broker, name)
    if consumers is None:
        consumers = sum(1 for c in introspect.consumers(broker, name))
    records = st["records"]
    return {
        "name": name, "vhost": VHOST, "type": "stream", "durable": True, "auto_delete": False,
        "exclusive": False, "arguments": rabbit_arguments(st["arguments"]), "node": NODE, "leader": NODE,
        "members": [NODE], "online": [NODE], "state": "running", "messages": records,
        "messages_ready": records, "messages_unacknowledged": 0, "consumers": consumers,
        "committed_offset": st["last_offset"] if st["last_offset"] is not None else 0,
        "committed_chunk_id": max(st["committed_chunk_id"], 0), "first_offset": st["first_offset"],
        "segments": 1, "memory": 0, "policy": None, "operator_policy": None,
        "effective_policy_definition": {},
    }


def _stream_arguments(body):
    """The ``arguments`` of a queue PUT as stream arguments for the broker; 400 unless it asks for a
    stream."""
    args = body.get("arguments") or {}
    if not isinstance(args, dict):
        raise _bad_request("arguments must be a JSON object")
    if args.get(QUEUE_TYPE) != "stream":
        raise _bad_request("Riverbed serves queues of type stream only: give arguments "
                           '{"x-queue-type": "stream"} (classic and quorum queues are AMQP 0.9.1)')
    return {k: v for k, v in args.items() if k != QUEUE_TYPE}


def _same_arguments(wanted, existing):
    """The first argument whose value differs (as text), or None."""
    have = {k: str(v) for k, v in rabbit_arguments(existing).items()}
    for key, value in wanted.items():
        name = key if key.startswith("x-") else f"x-{key}"
        if have.get(name) != str(value):
            return name, value, have.get(name)
    return None


def props_key(routing_key, arguments):
    """RabbitMQ's ``properties_key`` of a binding: the quoted routing key, plus ``~`` and a digest of
    the arguments when there are any (``~`` alone for an empty key without arguments)."""
    quoted = urllib.parse.quote_plus(routing_key).replace("~", "%7E")
    if not arguments:
        return quoted or "~"
    digest = hashlib.sha1(json.dumps(arguments, sort_keys=True).encode()).digest()
    return f"{quoted}~{base64.urlsafe_b64encode(digest).decode().rstrip('=')}"


def bindings_of(broker, exchange):
    """RabbitMQ's binding objects of super stream ``exchange``, in partition order ([] when none)."""
    d = broker.super_stream(exchange)
    if d is None:
        return []
    out = []
    for partition, key, order in zip(d["partitions"], d["binding_keys"], d["orders"]):
        args = {PARTITION_ORDER: order} if order is not None else {}
        out.append({"source": exchange, "vhost": VHOST, "destination": partition, "destination_type": "queue",
                    "routing_key": key, "arguments": args, "properties_key": props_key(key, args)})
    return out


def all_bindings(broker):
    return [b for name in broker.list_super_streams() for b in bindings_of(broker, name)]


def exchange_json(name):
    return {"name": name, "vhost": VHOST, "type": EXCHANGE_TYPE, "durable": True, "auto_delete": False,
            "internal": False, "arguments": {"x-super-stream": True}, "user_who_performed_action": ""}


# -------------------------------------------------------------------------------------------- queues

@routes.get("/api/queues")
@routes.get("/api/queues/{vhost}")
async def list_queues(request):
    await require_user(request)
    check_vhost(request)
    broker = request.app[BROKER]
    counts = {}
    for c in introspect.consumers(broker):
        counts[c["stream"]] = counts.get(c["stream"], 0) + 1
    out = []
    for name in sorted(broker.list_streams()):
        try:
            out.append(queue_json(broker, name, counts.get(name, 0)))
        except StreamNotFound:
            continue
    return web.json_response(out)


@routes.get("/api/queues/{vhost}/{name}")
async def get_queue(request):
    await require_user(request)
    check_vhost(request)
    try:
        return web.json_response(queue_json(request.app[BROKER], request.match_info["name"]))
    except StreamNotFound:
        raise not_found() from None


@routes.put("/api/queues/{vhost}/{name}")
async def put_queue(request):
    user = await require_user(request)
    check_vhost(request)
    name = request.match_info["name"]
    args = _stream_arguments(await read_json(request))
    if not user.can(CONFIGURE, name):
        raise _access_refused("queue", name, user)
    broker = request.app[BROKER]
    if broker.has_stream(name):
        return _existing_queue(broker, name, args)
    try:
        await broker_call(broker.create_stream, name, args)
    except StreamExists:
        return _existing_queue(broker, name, args)
    except InvalidArgument as e:
        raise _bad_request(str(e)) from None
    return web.Response(status=201)


def _existing_queue(broker, name, args):
    try:
        existing = introspect.stream_state(broker, name)["arguments"]
    except StreamNotFound:
        raise json_error(web.HTTPConflict, "conflict", f"queue '{name}' was deleted meanwhile") from None
    diff = _same_arguments(args, existing)
    if diff is not None:
        key, got, have = diff
        raise _bad_request(f"inequivalent arg '{key}' for queue '{name}' in vhost '{VHOST}': received "
                           f"{got!r} but current is {have!r}")
    return web.Response(status=204)


@routes.delete("/api/queues/{vhost}/{name}")
async def delete_queue(request):
    user = await require_user(request)
    check_vhost(request)
    name = request.match_info["name"]
    broker = request.app[BROKER]
    if not broker.has_stream_anywhere(name):      # in a cluster, also one held by other nodes only
        raise not_found()
    if not user.can(CONFIGURE, name):
        raise _access_refused("queue", name, user)
    try:
        await broker_call(broker.delete_stream, name)   # its bindings go with it (the broker unbinds it)
    except StreamNotFound:
        raise not_found() from None
    return web.Response(status=204)


@routes.get("/api/queues/{vhost}/{name}/bindings")
async def queue_bindings(request):
    await require_user(request)
    check_vhost(request)
    name = request.match_info["name"]
    broker = request.app[BROKER]
    if not broker.has_stream(name):
        raise not_found()
    return web.json_response([b for b in all_bindings(broker) if b["destination"] == name])


# ----------------------------------------------------------------------------------------- exchanges

@routes.get("/api/exchanges")
@routes.get("/api/exchanges/{vhost}")
async def list_exchanges(request):
    await require_user(request)
    check_vhost(request)
    return web.json_response([exchange_json(n) for n in request.app[BROKER].list_super_streams()])


@routes.get("/api/exchanges/{vhost}/{name}")
async def get_exchange(request):
    await require_user(request)
    check_vhost(request)
    name = request.match_info["name"]
    if request.app[BROKER].super_stream(name) is None:
        raise not_found()
    return web.json_response(exchange_json(name))


@routes.put("/api/exchanges/{vhost}/{name}")
async def put_exchange(request):
    user = await require_user(request)
    check_vhost(request)
    name = request.match_info["name"]
    body = await read_json(request)
    kind = body.get("type", EXCHANGE_TYPE)
    if kind != EXCHANGE_TYPE:
        raise _bad_request(f"Riverbed serves exchanges of type direct only, as super streams (not {kind!r}): "
                           "other exchange types are AMQP 0.9.1")
    if not name or name.startswith("amq."):
        raise _access_refused("exchange", name, user)
    if not user.can(CONFIGURE, name):
        raise _access_refused("exchange", name, user)
    try:
        created = await broker_call(request.app[BROKER].declare_super_stream, name)
    except InvalidArgument as e:
        raise _bad_request(str(e)) from None
    return web.Response(status=201 if created else 204)


@routes.delete("/api/exchanges/{vhost}/{name}")
async def delete_exchange(request):
    user = await require_user(request)
    check_vhost(request)
    name = request.match_info["name"]
    broker = request.app[BROKER]
    if broker.super_stream(name) is None:
        raise not_found()
    if not user.can(CONFIGURE, name):
        raise _access_refused("exchange", name, user)
    try:
        await broker_call(broker.forget_super_stream, name)
    except StreamNotFound:
        raise not_found() from None
    return web.Response(status=204)


@routes.get("/api/exchanges/{vhost}/{name}/bindings/source")
async def exchange_bindings(request):
    await require_user(request)
    check_vhost(request)
    name = request.match_info["name"]
    broker = request.app[BROKER]
    if broker.super_stream(name) is None:
        raise not_found()
    return web.json_response(bindings_of(broker, name))


@routes.get("/api/exchanges/{vhost}/{name}/bindings/destination")
async def exchange_bindings_destination(request):
    await require_user(request)
    check_vhost(request)
    if request.app[BROKER].super_stream(request.match_info["name"]) is None:
        raise not_found()
    return web.json_response([])        # exchange-to-exchange bindings are AMQP 0.9.1


# ------------------------------------------------------------------------------------------ bindings

@routes.get("/api/bindings")
@routes.get("/api/bindings/{vhost}")
async def list_bindings(request):
    await require_user(request)
    check_vhost(request)
    return web.json_response(all_bindings(request.app[BROKER]))


def _pair(request):
    """(exchange, queue) of a ``/e/{exchange}/q/{queue}`` path; 404 when either is missing."""
    check_vhost(request)
    broker = request.app[BROKER]
    exchange, queue = request.match_info["exchange"], request.match_info["queue"]
    if broker.super_stream(exchange) is None or not broker.has_stream(queue):
        raise not_found()
    return exchange, queue


@routes.get("/api/bindings/{vhost}/e/{exchange}/q/{queue}")
async def list_pair_bindings(request):
    await require_user(request)
    exchange, queue = _pair(request)
    return web.json_response([b for b in bindings_of(request.app[BROKER], exchange) if b["destination"] == queue])


@routes.post("/api/bindings/{vhost}/e/{exchange}/q/{queue}")
async def post_binding(request):
    user = await require_user(request)
    exchange, queue = _pair(request)
    body = await read_json(request)
    key = body.get("routing_key", "")
    args = body.get("arguments") or {}
    if not isinstance(key, str) or not isinstance(args, dict):
        raise _bad_request("routing_key must be a string and arguments a JSON object")
    order = args.get(PARTITION_ORDER)
    if order is not None:
        try:
            order = int(order)
        except (TypeError, ValueError):
            raise _bad_request(f"{PARTITION_ORDER} must be a whole number, not {order!r}") from None
    if not user.can(WRITE, queue):
        raise _access_refused("queue", queue, user)
    if not user.can(READ, exchange):
        raise _access_refused("exchange", exchange, user)
    try:
        await broker_call(request.app[BROKER].bind_partition, exchange, queue, key, order)
    except StreamNotFound:
        raise not_found() from None
    except (InvalidArgument, RiverbedError) as e:
        raise _bad_request(str(e)) from None
    shown = {PARTITION_ORDER: order} if order is not None else {}
    location = "/api/bindings/%2F/e/{}/q/{}/{}".format(
        urllib.parse.quote(exchange, safe=""), urllib.parse.quote(queue, safe=""), props_key(key, shown))
    return web.Response(status=201, headers={"Location": location})


def _one_binding(request, exchange, queue):
    wanted = request.match_info["props"]
    for b in bindings_of(request.app[BROKER], exchange):
        if b["destination"] == queue and b["properties_key"] == wanted:
            return b
    raise not_found()


@routes.get("/api/bindings/{vhost}/e/{exchange}/q/{queue}/{props}")
async def get_binding(request):
    await require_user(request)
    exchange, queue = _pair(request)
    return web.json_response(_one_binding(request, exchange, queue))


@routes.delete("/api/bindings/{vhost}/e/{exchange}/q/{queue}/{props}")
async def delete_binding(request):
    user = await require_user(request)
    exchange, queue = _pair(request)
    b = _one_binding(request, exchange, queue)
    if not user.can(WRITE, queue):
        raise _access_refused("queue", queue, user)
    if not user.can(READ, exchange):
        raise _access_refused("exchange", exchange, user)
    try:
        await broker_call(request.app[BROKER].unbind_partition, exchange, queue, b["routing_key"])
    except StreamNotFound:
        raise not_found() from None
    return web.Response(status=204)
