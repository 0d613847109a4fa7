"""What the broker layer counts for monitoring (``broker.stats``), read by ``GET /metrics``.

Counters are plain ints and dicts updated on the loop thread, on paths that already run per append,
per delivered chunk or per transport read: no lock (one thread writes them), no metrics library on
the hot path. The HTTP listener turns them into Prometheus families at scrape time
(shells/http/metrics.py). They count since the process started.

Per stream: ``delivered`` (stream -> records handed to subscribers by
:class:`~riverbed.shells.broker.tail.Tail`, every protocol; a chunk a filter skipped is not counted; a
deleted stream's entry is dropped). Records published need no counter here: the engine's stream state
holds them (:func:`riverbed.engine.stats.published_since_open`).

Per listener (:class:`ListenerStats`, by the listener's name): connections accepted, connections open,
transport reads and bytes received, and errors by kind.
"""

ERR_INTERNAL = "internal"      # a session raised: the connection was aborted (a bug, logged)
ERR_TRANSPORT = "transport"    # the connection was lost with an error (reset, broken pipe, TLS failure)
ERR_REFUSED = "refused"        # the transport refused a connection (ZeroMQ ZAP: not loopback, bad key)
ERR_WEBSOCKET = "websocket"    # a WebSocket closed on a protocol error (a frame over the size limit, ...)


class ListenerStats:
    """Counters of one listener, shared by every listener of that name. Loop-thread only.

    ``connections_total``: connections accepted; ``reads``: transport reads (a TCP ``data_received``,
    one WebSocket message, one ZeroMQ message); ``bytes_in``: bytes those reads carried (not counted for
    ZeroMQ); ``errors``: kind -> count (``ERR_*``). Open connections are not counted here but asked of
    the listener at scrape time (``open_sources``), so they are right even after a crash of a session.
    """

    __slots__ = ("name", "connections_total", "reads", "bytes_in", "errors", "open_sources")

    def __init__(self, name):
        self.name = name
        self.connections_total = 0
        self.reads = 0
        self.bytes_in = 0
        self.errors = {}
        self.open_sources = []

    def error(self, kind):
        """Count one error of ``kind`` (a short lower-case word; see the ``ERR_*`` constants)."""
        self.errors[kind] = self.errors.get(kind, 0) + 1

    def connections_open(self):
        """Connections open now, summed over the listeners of this name."""
        return sum(fn() for fn in self.open_sources)


class BrokerStats:
    """Every counter of one broker. ``delivered`` maps stream -> records. Loop-thread only."""

    __slots__ = ("delivered", "listeners")

    def __init__(self):
        self.delivered = {}
        self.listeners = {}        # name -> ListenerStats

    def listener(self, name, open_connections=None):
        """The :class:`ListenerStats` for listeners named ``name`` (created on first use).
        ``open_connections``, a function returning how many connections that listener has open now, is
        added to the ones the scrape sums."""
        st = self.listeners.get(name)
        if st is None:
            st = self.listeners[name] = ListenerStats(name)
        if open_connections is not None:
            st.open_sources.append(open_connections)
        return st

    def forget_stream(self, name):
        """Drop the counters of a deleted stream (a stream created again under its name starts at 0)."""
        self.delivered.pop(name, None)
