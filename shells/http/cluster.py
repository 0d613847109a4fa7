"""``GET /api/cluster``: the cluster as this node sees it (the dashboard's cluster view reads the same).

    {"cluster": NAME or null, "self": this node's name or null,
     "nodes": [{"name", "up", "stream_port", "replication_port", "http_port", "advertised_host", "leads"}],
     "streams": [{"name", "epoch", "leader", "members": [{"node", "committed_offset", "lag"}]}],
     "forwarded": {stream: publishes this node forwarded to the stream's leader}}

``nodes`` and ``streams`` are ``riverbed cluster status --json``'s document, read from etcd
(:mod:`riverbed.shells.cluster.view`), cut to the streams the user may read; ``forwarded`` is this
node's ``riverbed_forwarded_publishes_total{stream}`` when /metrics has that family, else ``{}``. A node
that runs alone answers ``cluster`` null and empty lists. 503 ``etcd_unreachable`` when etcd does not
answer. Needs an authenticated user, as every route of the listener.
"""

from aiohttp import web

from riverbed.shells.broker import READ
from riverbed.shells.http.auth import require_user
from riverbed.shells.http.server import BROKER, json_error

FORWARDED_FAMILIES = ("riverbed_forwarded_publishes", "riverbed_forwarded_publishes_total")

routes = web.RouteTableDef()


def setup(app):
    app.add_routes(routes)


def forwarded(broker):
    """``{stream: count}`` of this node's ``riverbed_forwarded_publishes_total``, ``{}`` without it."""
    from riverbed.shells.http.metrics import BrokerCollector
    out = {}
    try:
        for family in BrokerCollector(broker).collect():
            if family.name not in FORWARDED_FAMILIES:
                continue
            for sample in family.samples:
                stream = sample.labels.get("stream")
                if stream is not None and sample.name.endswith("_total"):
                    out[stream] = out.get(stream, 0) + int(sample.value)
    except Exception:  # noqa: BLE001 - a counter that cannot be read is shown as absent
        return {}
    return out


SINGLE_NODE = {"cluster": None, "self": None, "nodes": [], "streams": [], "forwarded": {}}


async def cluster_document(broker, user):
    """The document of the module docstring for ``user``. Raises EtcdError when etcd does not answer."""
    node = getattr(broker, "cluster", None)
    if node is None:        # alone: no cluster module is imported (as riverbed serve without --etcd)
        return dict(SINGLE_NODE)
    from riverbed.shells.cluster import view
    doc = dict(await view.read_view(node), forwarded=forwarded(broker))
    return view.for_user(doc, lambda name: user.can(READ, name))


@routes.get("/api/cluster")
async def get_cluster(request):
    user = await require_user(request)
    broker = request.app[BROKER]
    if getattr(broker, "cluster", None) is None:
        return web.json_response(await cluster_document(broker, user))
    from riverbed.shells.cluster.etcd import EtcdError
    try:
        return web.json_response(await cluster_document(broker, user))
    except EtcdError as e:
        raise json_error(web.HTTPServiceUnavailable, "etcd_unreachable", f"etcd does not answer: {e}") from None
