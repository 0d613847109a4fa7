"""The live web dashboard: ``GET /``, its static files and the once-a-second snapshot stream.

    GET /                  the page (shells/http/static/index.html)
    GET /static/{file}     its script and style, served from the package (no build step, no CDN)
    GET /api/events        server-sent events: one ``data: {snapshot}`` line every ``INTERVAL`` seconds

The page draws everything from the snapshots (its charts are SVG drawn by its own script) and asks
``GET /api/streams/{name}/records`` (:mod:`.api`) for a stream's recent records when one is picked.
It is read-only: nothing on it creates, deletes or closes anything.

A snapshot (JSON)::

    {"t": ms since the epoch, "interval": seconds between snapshots, "version": Riverbed's version,
     "rabbitmq_version": the RabbitMQ release whose stream protocol is served,
     "streams": [{"name", "records", "bytes", "next_offset", "last_offset", "consumers", "publishers",
                  "rate" (records/s published over the last interval), "byte_rate" (stored bytes/s)}],
     "connections": {protocol: count},
     "consumers": [{"stream", "protocol", "connection", "subscription_id", "reference", "offset", "lag",
                    "credits", "rate" (records/s delivered over the last interval)}],
     "cluster": on a cluster node, GET /api/cluster's document (:mod:`.cluster`): nodes up/down and their
                addresses, each stream's leader, members and their lag, this node's forwarded publishes;
                absent on a node that runs alone, and when etcd did not answer in time}

Cost: one :class:`Sampler` per application takes a snapshot once per interval for every client
together, from memory only (:mod:`riverbed.shells.broker.introspect`: the engine's committed stream
state and the sessions' subscriptions; no LMDB read), and only while at least one client listens. Each
client gets the streams its user may read (the JSON is built once per user name and interval). A
client that has not taken the previous snapshot when the next is ready skips to the newest.

Auth: every route needs a user (:func:`riverbed.shells.http.auth.require_user`), as the rest of the
listener. Loop-thread only.
"""

import asyncio
import json
import logging
import os

from aiohttp import web

from riverbed.shells.broker import READ, introspect
from riverbed.shells.http.auth import require_user
from riverbed.shells.http.server import BROKER
from riverbed.shells.rmq_stream.constants import RABBITMQ_VERSION
from riverbed.shells.version import VERSION

log = logging.getLogger("riverbed.http")

INTERVAL = 1.0                    # seconds between snapshots
RETRY_MS = 2000                   # how long a browser waits before reconnecting a dropped event stream
STATIC_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "static")
CONTENT_TYPES = {".html": "text/html", ".js": "text/javascript", ".css": "text/css", ".svg": "image/svg+xml"}
# The page loads nothing from elsewhere; the policy makes the browser hold it to that.
CSP = ("default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
       "frame-ancestors 'none'")

SAMPLER = web.AppKey("dashboard_sampler", object)

routes = web.RouteTableDef()


def setup(app):
    app[SAMPLER] = Sampler(app[BROKER])
    app.add_routes(routes)
    app.on_shutdown.append(_on_shutdown)


async def _on_shutdown(app):
    app[SAMPLER].close()


class Snapshot:
    """One sample of the broker; ``json_for(user)`` is its JSON text for that user (built once per
    user name)."""

    __slots__ = ("data", "_texts")

    def __init__(self, data):
        self.data = data
        self._texts = {}

    def json_for(self, user):
        text = self._texts.get(user.name)
        if text is None:
            d = self.data
            streams = [s for s in d["streams"] if user.can(READ, s["name"])]
            names = {s["name"] for s in streams}
            out = {"t": d["t"], "interval": d["interval"], "version": VERSION,
                   "rabbitmq_version": RABBITMQ_VERSION, "streams": streams,
                   "connections": d["connections"],
                   "consumers": [c for c in d["consumers"] if c["stream"] in names]}
            if d.get("cluster") is not None:
                from riverbed.shells.cluster.view import for_user
                out["cluster"] = for_user(d["cluster"], lambda name: user.can(READ, name))
            text = json.dumps(out, separators=(",", ":"))
            self._texts[user.name] = text
        return text


class Sampler:
    """Takes a :class:`Snapshot` every ``interval`` seconds while clients listen and hands it to each
    of them. Loop-thread only."""

    def __init__(self, broker, interval=INTERVAL):
        self.broker = broker
        self.interval = interval
        self.clients = set()          # asyncio.Queue(maxsize=1) per listening client
        self.latest = None
        self._task = None
        self._closed = False
        self._prev = None             # (monotonic s, {stream: (next_offset, bytes)}, {consumer key: offset})

    def subscribe(self):
        """A queue that receives every new Snapshot (None once the server stops)."""
        q = asyncio.Queue(maxsize=1)
        if self._closed:
            q.put_nowait(None)
            return q
        self.clients.add(q)
        if self.latest is not None:
            q.put_nowait(self.latest)
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run())
        return q

    def unsubscribe(self, q):
        self.clients.discard(q)

    def close(self):
        self._closed = True
        for q in list(self.clients):
            _offer(q, None)
        self.clients.clear()
        if self._task is not None:
            self._task.cancel()

    async def _run(self):
        while self.clients and not self._closed:
            try:
                snap = self.sample()
                if getattr(self.broker, "cluster", None) is not None:
                    snap.data["cluster"] = await self._cluster()
            except Exception:  # noqa: BLE001 - a broken sample must not end the stream for good
                log.exception("dashboard snapshot")
            else:
                self.latest = snap
                for q in list(self.clients):
                    _offer(q, snap)
            await asyncio.sleep(self.interval)
        self._prev = None     # rates restart from the next client's first sample
        self.latest = None

    async def _cluster(self):
        """The cluster document (``GET /api/cluster``'s, every stream), or None when etcd does not answer
        within half an interval: the snapshot goes out without it rather than late."""
        from riverbed.shells.cluster import view
        from riverbed.shells.cluster.etcd import EtcdError
        from riverbed.shells.http.cluster import forwarded
        try:
            doc = await asyncio.wait_for(view.read_view(self.broker.cluster), self.interval / 2)
        except (EtcdError, asyncio.TimeoutError):
            return None
        return dict(doc, forwarded=forwarded(self.broker))

    def sample(self):
        """A new Snapshot of the broker, with rates since the previous one."""
        broker = self.broker
        now = broker.clock()
        prev_t, prev_streams, prev_consumers = self._prev or (None, {}, {})
        dt = (now - prev_t) if prev_t is not None else 0.0
        consumers = introspect.consumers(broker)
        per_stream = {}
        for c in consumers:
            per_stream[c["stream"]] = per_stream.get(c["stream"], 0) + 1
        publishers = {}
        for p in introspect.publishers(broker):
            publishers[p["stream"]] = publishers.get(p["stream"], 0) + 1
        streams, seen = [], {}
        for name in broker.list_streams():
            try:
                st = introspect.stream_state(broker, name)
            except Exception:  # noqa: BLE001 - deleted between listing and reading
                continue
            seen[name] = (st["next_offset"], st["bytes"])
            before = prev_streams.get(name)
            rate = byte_rate = 0.0
            if before is not None and dt > 0:
                rate = max(0, st["next_offset"] - before[0]) / dt
                byte_rate = max(0, st["bytes"] - before[1]) / dt
            streams.append({"name": name, "records": st["records"], "bytes": st["bytes"],
                            "next_offset": st["next_offset"], "last_offset": st["last_offset"],
                            "consumers": per_stream.get(name, 0), "publishers": publishers.get(name, 0),
                            "rate": round(rate, 1), "byte_rate": round(byte_rate, 1)})
        offsets = {}
        for c in consumers:
            key = (c["stream"], c["protocol"], c["connection"], str(c["subscription_id"]))
            offsets[key] = c["offset"]
            before = prev_consumers.get(key)
            c["rate"] = (round(max(0, c["offset"] - before) / dt, 1)
                         if before is not None and c["offset"] is not None and dt > 0 else 0.0)
        self._prev = (now, seen, offsets)
        return Snapshot({"t": broker.wall_clock(), "interval": self.interval, "streams": streams,
                         "connections": introspect.connection_counts(broker), "consumers": consumers})


def _offer(q, item):
    """Put ``item`` in a one-slot queue, replacing what the client has not taken yet."""
    if q.full():
        q.get_nowait()
    q.put_nowait(item)


@routes.get("/api/events")
async def events(request):
    user = await require_user(request)
    sampler = request.app[SAMPLER]
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache",
                                       "X-Accel-Buffering": "no"})
    await resp.prepare(request)
    q = sampler.subscribe()
    try:
        await resp.write(f"retry: {RETRY_MS}\n\n".encode())
        while True:
            snap = await q.get()
            if snap is None:
                break
            await resp.write(f"data: {snap.json_for(user)}\n\n".encode())
    except ConnectionError:     # the client went away
        pass
    finally:
        sampler.unsubscribe(q)
    return resp


def _static_file(name):
    """(bytes, content type) of a file of the static folder; 404 for anything else."""
    ext = os.path.splitext(name)[1]
    if "/" in name or "\\" in name or name.startswith(".") or ext not in CONTENT_TYPES:
        raise web.HTTPNotFound()
    path = os.path.join(STATIC_DIR, name)
    try:
        with open(path, "rb") as f:
            return f.read(), CONTENT_TYPES[ext]
    except OSError:
        raise web.HTTPNotFound() from None


def _page(body, content_type):
    return web.Response(body=body, content_type=content_type,
                        headers={"Cache-Control": "no-cache", "Content-Security-Policy": CSP,
                                 "X-Content-Type-Options": "nosniff"})


@routes.get("/")
async def index(request):
    await require_user(request)
    return _page(*_static_file("index.html"))


@routes.get("/static/{file}")
async def static(request):
    await require_user(request)
    return _page(*_static_file(request.match_info["file"]))
