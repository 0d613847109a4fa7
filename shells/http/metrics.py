"""``GET /metrics``: the broker in Prometheus' text format (0.0.4), with ``prometheus-client``.

The listener, engine and process families are prometheus-client metric families written by its
encoder; the per-stream families, thousands of samples with many streams, are rendered here in the
same format (see ``STREAM_FAMILIES``). The whole answer parses with prometheus-client's own parser.

Every value is read at scrape time from counters and state the process keeps in memory anyway: the
engine's committed stream states and group-commit counters (:mod:`riverbed.engine.stats`; records
published are how far a stream's next offset moved since the engine opened), the broker's delivery and
listener counters (:mod:`riverbed.shells.broker.stats`), and /proc for the process.
No LMDB read transaction, no scan: a scrape of 1,000 streams takes a few milliseconds of the loop.

Families (``stream``, ``listener`` and ``kind`` are labels; counters count since the process started)::

    riverbed_streams                                   streams that exist
    riverbed_stream_records{stream}                    records stored (after retention)
    riverbed_stream_bytes{stream}                      chunk bytes stored, headers included
    riverbed_stream_chunks{stream}                     chunks stored
    riverbed_stream_first_offset{stream}               first stored offset (-1 when empty)
    riverbed_stream_last_offset{stream}                last stored offset (-1 when empty)
    riverbed_stream_published_records_total{stream}    records appended (every protocol and path)
    riverbed_stream_delivered_records_total{stream}    records delivered to subscribers (every protocol)
    riverbed_listener_up{listener}                     1 while the listener accepts connections
    riverbed_listener_connections_open{listener}       connections open now
    riverbed_listener_connections_accepted_total{listener}
    riverbed_listener_reads_total{listener}            transport reads: TCP reads, WebSocket messages,
                                                       ZeroMQ messages
    riverbed_listener_received_bytes_total{listener}   bytes of TCP reads
    riverbed_listener_errors_total{listener,kind}      internal, transport, refused, websocket
    riverbed_rejected_total{listener,reason}           requests refused by a named limit (limits.py) or
                                                       a validation rule (depth, field, encoding)
    riverbed_inflight_bytes                            published bytes not yet committed, all connections
    riverbed_inflight_budget_bytes                     the broker-wide budget (--max-inflight-bytes)
    riverbed_inflight_peak_bytes                       the most in flight at once since the start
    riverbed_inflight_paused_total                     times a publisher was paused by that budget
    riverbed_render_fallback_total{target,reason}      records delivered raw ({"base64"} / {"data"})
                                                       instead of as JSON or BSON: depth, invalid, error
    riverbed_engine_writer_up                          1 while the writer thread runs
    riverbed_engine_group_commits_total
    riverbed_engine_operations_total                   operations applied by group commits
    riverbed_engine_written_bytes_total                chunk bytes written
    riverbed_engine_commit_seconds                     histogram: one group commit, whole
    riverbed_engine_fsync_seconds                      histogram: LMDB's commit (and fsync) alone
    riverbed_engine_map_size_bytes / riverbed_engine_map_used_bytes
    riverbed_disk_free_bytes                           free space for the data (the filesystem's, plus pages
                                                       freed inside the data file), as of the disk alarm's
                                                       last look (once a second)
    riverbed_disk_free_limit_bytes                     --disk-free-limit
    riverbed_disk_max_bytes / riverbed_disk_data_bytes --max-disk (only when set) / data in the data file
    riverbed_disk_alarm                                1 while publishes are refused for want of space
    riverbed_disk_refused_appends_total                appends (a publish frame or batch each) the alarm refused
    process_cpu_seconds_total, process_resident_memory_bytes, ...   (prometheus-client's ProcessCollector;
                                                       refreshed at most once a second)

Access follows the users file as every listener does: without one, loopback clients scrape without
credentials (or as guest/guest); with one, HTTP basic auth, and the per-stream series list only the
streams the user may read. Bad credentials: 401 with a JSON body.
"""

import time

from aiohttp import hdrs, web
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.exposition import generate_latest
from prometheus_client.platform_collector import PlatformCollector
from prometheus_client.process_collector import ProcessCollector

from riverbed.engine.record import render_fallbacks
from riverbed.shells.auth import is_loopback
from riverbed.shells.broker import READ
from riverbed.shells.broker import limits as _limits
from riverbed.shells.http.auth import EVERYTHING, require_user
from riverbed.shells.http.health import ACCEPTING, listener_state
from riverbed.shells.http.server import BROKER

PROCESS = web.AppKey("metrics_process", object)    # the app's ProcessFamilies
PROCESS_TTL = 1.0       # seconds the process families (read from /proc) are served from memory
# every name here is a classic one, so the classic format; prometheus-client's "latest" is 1.0.0
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


# The per-stream families: (name, type, help, value of a committed stream state). They are rendered
# straight into the text format (render_streams): with 1,000 streams they are 7,000 samples, which
# prometheus-client's encoder takes 20-45 ms of the loop to write (it validates and escapes each one);
# rendered here, with each stream's label escaped once, they take ~3 ms. Everything else (a few dozen
# samples) goes through prometheus-client.
STREAM_FAMILIES = (
    ("riverbed_stream_records", "gauge", "Records stored (after retention).", lambda s: s.records),
    ("riverbed_stream_bytes", "gauge", "Chunk bytes stored, headers included.", lambda s: s.bytes),
    ("riverbed_stream_chunks", "gauge", "Chunks stored.", lambda s: s.chunks),
    ("riverbed_stream_first_offset", "gauge", "First stored offset (-1 when empty).",
     lambda s: s.first_chunk if s.chunks else -1),
    ("riverbed_stream_last_offset", "gauge", "Last stored offset (-1 when empty).",
     lambda s: s.next_offset - 1 if s.chunks else -1),
)
PUBLISHED = ("riverbed_stream_published_records_total",
             "Records appended since the server started, every protocol (how far the next offset moved).")
DELIVERED = ("riverbed_stream_delivered_records_total",
             "Records delivered to subscribers since the server started, every protocol.")


def _label_value(text):
    """``text`` escaped as a label value of the text format (backslash, double quote, newline)."""
    if "\\" in text or '"' in text or "\n" in text:
        text = text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return text


def render_streams(broker, can_read=None):
    """The per-stream families of ``broker`` in Prometheus' text format 0.0.4 (str), streams sorted by
    name; only those ``can_read(name)`` accepts when it is given. Memory only. Loop thread."""
    states = broker.stream_states()
    total = len(states)
    if can_read is not None:
        states = [s for s in states if can_read(s.name)]
    states.sort(key=lambda s: s.name)
    labels = [f'{{stream="{_label_value(s.name)}"}} ' for s in states]
    out = ["# HELP riverbed_streams Streams that exist.\n# TYPE riverbed_streams gauge\n",
           f"riverbed_streams {total}\n"]
    for name, kind, doc, value in STREAM_FAMILIES:
        out.append(f"# HELP {name} {doc}\n# TYPE {name} {kind}\n")
        out.extend([f"{name}{label}{value(s)}\n" for s, label in zip(states, labels)])
    name, doc = PUBLISHED
    opened_at = broker.engine_stats.opened_at       # published_since_open, inlined: 1,000 calls saved
    out.append(f"# HELP {name} {doc}\n# TYPE {name} counter\n")
    out.extend([f"{name}{label}{s.next_offset - opened_at.get(s.sid, 0)}\n" for s, label in zip(states, labels)])
    name, doc = DELIVERED
    delivered = broker.stats.delivered
    out.append(f"# HELP {name} {doc}\n# TYPE {name} counter\n")
    out.extend([f"{name}{label}{delivered.get(s.name, 0)}\n" for s, label in zip(states, labels)])
    return "".join(out)


class BrokerCollector:
    """A prometheus-client collector of the listener and engine families of one broker (the per-stream
    ones are :func:`render_streams`'): ``collect()`` builds them from memory at each call. Loop thread
    (it reads loop-thread counters)."""

    def __init__(self, broker):
        self.broker = broker

    def collect(self):
        yield from self._listeners()
        yield from self._engine()
        yield from self._hostile_input()
        if getattr(self.broker, "cluster", None) is not None:
            yield from self._cluster()

    def _cluster(self):
        # on the leader of each stream: how many records each member is behind (shells/cluster)
        lag = GaugeMetricFamily("riverbed_replica_lag_records", "Records a member of a stream this node leads "
                                "holds fewer than the leader.", labels=["stream", "node"])
        for stream, node, records in self.broker.cluster.replica_lag():
            lag.add_metric([stream, node], records)
        yield lag
        # on the node a client published to: records it forwarded to each stream's leader (cluster/forward.py)
        forwarded = CounterMetricFamily("riverbed_forwarded_publishes", "Records published to this node for a "
                                        "stream another node leads, forwarded to that leader and confirmed by it.",
                                        labels=["stream"])
        for stream, n in sorted(self.broker.cluster.forwarding.forwarded.items()):
            forwarded.add_metric([stream], n)
        yield forwarded
        # streams made here whose chosen leader is not yet placed in etcd: creations under way, so it
        # stays near 0 (a value that only grows is state kept for streams that no longer need it)
        yield GaugeMetricFamily("riverbed_cluster_pending_leaders", "Streams made on this node whose placement "
                                "in etcd is still under way.", value=len(self.broker.cluster.pending_leaders))

    @staticmethod
    def _hostile_input():
        fallbacks = CounterMetricFamily("riverbed_render_fallback", "Records delivered in the raw form because "
                                        "they cannot be rendered as the target format (JSON or BSON), by reason.",
                                        labels=["target", "reason"])
        for (target, reason), n in sorted(render_fallbacks().items()):
            fallbacks.add_metric([target, reason], n)
        yield fallbacks

    def _listeners(self):
        up = GaugeMetricFamily("riverbed_listener_up", "1 while the listener accepts connections.",
                               labels=("listener",))
        for name, server in getattr(self.broker, "listeners", ()):
            up.add_metric([name], 1 if listener_state(server) == ACCEPTING else 0)
        yield up
        opened = GaugeMetricFamily("riverbed_listener_connections_open", "Connections open now.",
                                   labels=("listener",))
        accepted = CounterMetricFamily("riverbed_listener_connections_accepted", "Connections accepted.",
                                       labels=("listener",))
        reads = CounterMetricFamily("riverbed_listener_reads",
                                    "Transport reads: TCP reads, WebSocket messages, ZeroMQ messages.",
                                    labels=("listener",))
        received = CounterMetricFamily("riverbed_listener_received_bytes", "Bytes received by TCP reads.",
                                       labels=("listener",))
        errors = CounterMetricFamily("riverbed_listener_errors", "Connection errors by kind.",
                                     labels=("listener", "kind"))
        for name, st in sorted(self.broker.stats.listeners.items()):
            opened.add_metric([name], st.connections_open())
            accepted.add_metric([name], st.connections_total)
            reads.add_metric([name], st.reads)
            received.add_metric([name], st.bytes_in)
            for kind, n in sorted(st.errors.items()):
                errors.add_metric([name, kind], n)
        yield from (opened, accepted, reads, received, errors)
        rejected = CounterMetricFamily("riverbed_rejected", "Requests refused by a named limit or a validation "
                                       "rule, by reason.",
                                       labels=("listener", "reason"))
        for (name, reason), n in sorted(_limits.rejected().items()):
            rejected.add_metric([name, reason], n)
        yield rejected
        budget = getattr(self.broker, "inflight", None)
        if budget is not None:
            yield GaugeMetricFamily("riverbed_inflight_bytes", "Published bytes read and not yet committed, "
                                    "every connection together.", value=budget.used)
            yield GaugeMetricFamily("riverbed_inflight_budget_bytes", "The broker-wide in-flight budget.",
                                    value=budget.limit)
            yield GaugeMetricFamily("riverbed_inflight_peak_bytes", "The most published bytes in flight at "
                                    "once since the server started.", value=budget.peak)
            yield CounterMetricFamily("riverbed_inflight_paused", "Times a publisher was paused by the "
                                      "in-flight budget.", value=budget.paused_total)

    def _engine(self):
        broker = self.broker
        es = broker.engine_stats
        yield GaugeMetricFamily("riverbed_engine_writer_up", "1 while the engine's writer thread runs.",
                                value=1 if broker.writer_alive() else 0)
        yield CounterMetricFamily("riverbed_engine_group_commits", "Group commits (write transactions).",
                                  value=es.group_commits)
        yield CounterMetricFamily("riverbed_engine_operations", "Operations applied by group commits.",
                                  value=es.operations)
        yield CounterMetricFamily("riverbed_engine_written_bytes", "Chunk bytes written.", value=es.bytes_written)
        for metric, hist, doc in (
                ("riverbed_engine_commit_seconds", es.commit,
                 "One group commit, from taking the batch to the end of LMDB's commit."),
                ("riverbed_engine_fsync_seconds", es.fsync,
                 "LMDB's commit alone, which includes the fsync the policy asks for.")):
            buckets, total = hist.snapshot()
            yield HistogramMetricFamily(metric, doc, buckets=buckets, sum_value=total)
        usage = broker.map_usage()
        if usage is not None:
            yield GaugeMetricFamily("riverbed_engine_map_size_bytes", "Size of the LMDB map (grows by doubling).",
                                    value=usage[0])
            yield GaugeMetricFamily("riverbed_engine_map_used_bytes", "Bytes of the LMDB map in use.",
                                    value=usage[1])
        yield from self._disk()

    def _disk(self):
        disk = getattr(self.broker, "disk", None)
        if disk is None or disk.free is None:
            return
        yield GaugeMetricFamily("riverbed_disk_free_bytes", "Bytes free for the data: the filesystem's free "
                                "space plus pages freed inside the data file.", value=disk.free)
        yield GaugeMetricFamily("riverbed_disk_free_limit_bytes", "Publishes are refused below this free space "
                                "(--disk-free-limit).", value=disk.free_limit)
        if disk.max_disk is not None:
            yield GaugeMetricFamily("riverbed_disk_max_bytes", "Cap on the data (--max-disk).", value=disk.max_disk)
        yield GaugeMetricFamily("riverbed_disk_data_bytes", "Bytes of data in the data file.", value=disk.data_bytes)
        yield GaugeMetricFamily("riverbed_disk_alarm", "1 while publishes are refused for want of disk space.",
                                value=1 if disk.alarm else 0)
        yield CounterMetricFamily("riverbed_disk_refused_appends", "Appends (a publish frame or batch each) "
                                  "refused by the disk alarm.", value=disk.refused)


class _Scrape:
    """The collectors of one scrape, as prometheus-client's encoders want them (``collect()``)."""

    __slots__ = ("collectors",)

    def __init__(self, collectors):
        self.collectors = collectors

    def collect(self):
        for c in self.collectors:
            yield from c.collect()


async def _scraper(request):
    """The user a scrape acts as: without a users file a loopback client needs no credentials; otherwise
    HTTP basic auth (:func:`riverbed.shells.http.auth.require_user`; raises 401)."""
    if not request.headers.get(hdrs.AUTHORIZATION):
        user = request.app[BROKER].auth.implicit_user(is_loopback(request.remote or ""))
        if user is not None:
            return user
    return await require_user(request)


class ProcessFamilies:
    """The process families (prometheus-client's ProcessCollector: CPU, memory, file descriptors, start
    time; and PlatformCollector's python_info), encoded by prometheus-client and kept for ``ttl``
    seconds: they are read from /proc, which costs more than every other family together, and a
    process's CPU and memory a second old are as good to a monitoring system. Loop thread."""

    def __init__(self, ttl=PROCESS_TTL, clock=time.monotonic):
        self.ttl = ttl
        self.clock = clock
        self.collectors = _Scrape((ProcessCollector(registry=None), PlatformCollector(registry=None)))
        self._text = b""
        self._until = float("-inf")

    def text(self):
        now = self.clock()
        if now >= self._until:
            self._text = generate_latest(self.collectors)
            self._until = now + self.ttl
        return self._text


async def metrics(request):
    user = await _scraper(request)
    read = user.patterns.get(READ)
    if read is not None and read.pattern in EVERYTHING:
        can_read = None                 # every stream: spare a regex per stream
    else:
        def can_read(name):
            return user.can(READ, name)
    broker = request.app[BROKER]
    body = b"".join((render_streams(broker, can_read).encode(), generate_latest(BrokerCollector(broker)),
                     request.app[PROCESS].text()))
    return web.Response(body=body, headers={hdrs.CONTENT_TYPE: CONTENT_TYPE, "Cache-Control": "no-store"})


def setup(app):
    # registry=None: these collectors belong to this app only, never to prometheus-client's global one
    app[PROCESS] = ProcessFamilies()
    app.router.add_get("/metrics", metrics)
