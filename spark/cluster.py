"""Reading a stream from a Riverbed cluster: the ``nodes`` option of the data source.

    spark.read.format("riverbed").option("nodes", "n1:5552,n2:5552,n3:5552").option("stream", "orders")

``nodes`` is a comma list of ``host:port`` RabbitMQ Stream addresses (any nodes of the cluster, not
necessarily all); user, password and vhost come from ``uri`` when it is given too (its host is then one
more node), else guest/guest and ``/``.

Planning (driver) asks the first node that answers, as a single-node ``uri`` read does, plus Metadata
for each stream: its leader and members' advertised stream addresses. Each planned partition gets an
ordered list of nodes to read from: the stream's replicas first (rotated by the partition's index, so
consecutive partitions go to different members and the read runs on every node in parallel), then the
leader, then any other node of ``nodes``. Planned ends never pass the committed offset seen while
planning, which a majority of the members hold, so every member can serve the whole range (a member
behind it catches up and delivers the rest).

Reading (executors, :func:`read_nodes`): a partition is read from its first node; when that node
disappears mid-read (connection refused or reset, closed, or silent for ``READ_TIMEOUT`` seconds) the
read goes on from the first offset not yet handed to Spark on the next node of the list, and so on,
round after round, up to ``MAX_ROUNDS`` times over the list. Records are cut by offset, so a record is
produced once whatever the chunk boundaries of the retry. Only a partition whose every node failed
``MAX_ROUNDS`` times fails the task.
"""

import logging
import time
from urllib.parse import quote

from riverbed.spark.remote import RemoteError, StreamClient, parse_uri

log = logging.getLogger("riverbed.spark")

READ_TIMEOUT = 10.0       # seconds a node may stay silent (connect or read) before the next one is tried
MAX_ROUNDS = 5            # passes over a partition's node list before the read fails
ROUND_DELAY = 1.0         # seconds between two passes: a failover elects a new leader within ~lease TTL


def parse_nodes(text):
    """``[(host, port)]`` from ``"h1:5552,h2:5552"`` (``[v6]:port`` accepted). Raises ValueError."""
    out = []
    for item in str(text or "").split(","):
        item = item.strip()
        if not item:
            continue
        host, sep, port = item.rpartition(":")
        host = host.strip("[]")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"nodes: {item!r} is not host:port")
        out.append((host, int(port)))
    if not out:
        raise ValueError("nodes: give at least one host:port")
    return out


def node_uris(nodes_text, uri=None):
    """The ``rabbitmq-stream://`` URI of every node: the ``nodes`` list, then ``uri``'s own host when it
    is not in it, each with ``uri``'s credentials and vhost (default guest/guest, ``/``)."""
    user, password, vhost, addrs = "guest", "guest", "/", parse_nodes(nodes_text)
    if uri:
        host, port, user, password, vhost = parse_uri(uri)
        if (host, port) not in addrs:
            addrs.append((host, port))
    return [_uri(h, p, user, password, vhost) for h, p in addrs]


def _uri(host, port, user, password, vhost):
    h = f"[{host}]" if ":" in host else host
    path = "" if vhost == "/" else "/" + quote(vhost, safe="")
    return f"rabbitmq-stream://{quote(user, safe='')}:{quote(password, safe='')}@{h}:{port}{path}"


def _with_address(template_uri, addr):
    _, _, user, password, vhost = parse_uri(template_uri)
    return _uri(addr[0], addr[1], user, password, vhost)


def connect_any(uris, timeout=READ_TIMEOUT):
    """A StreamClient to the first of ``uris`` that answers. Raises RemoteError naming every failure."""
    problems = []
    for uri in uris:
        try:
            return StreamClient(uri, timeout=timeout)
        except (OSError, RemoteError) as e:
            problems.append(f"{_where(uri)}: {e}")
    raise RemoteError("no node answered: " + "; ".join(problems))


def _where(uri):
    host, port, *_ = parse_uri(uri)
    return f"{host}:{port}"


class ClusterBackend:
    """Planning against a cluster: a RemoteBackend on the first node that answers, plus each stream's
    members (Metadata) to give every partition its nodes (:meth:`assign`)."""

    def __init__(self, opts):
        from riverbed.spark.source import RemoteBackend
        self.uris = node_uris(opts.nodes, opts.uri)
        self.remote = RemoteBackend(opts, client=connect_any(self.uris))
        self._members = {}

    def __getattr__(self, name):        # expand, exists, bounds, at_timestamp, split_points, close
        return getattr(self.remote, name)

    def members(self, stream):
        """URIs to read ``stream`` from, replicas first, then the leader, then the other given nodes."""
        got = self._members.get(stream)
        if got is None:
            leader, replicas = self.remote.client.metadata([stream]).get(stream, (None, []))
            placed = [_with_address(self.uris[0], a) for a in replicas + ([leader] if leader else [])]
            got = self._members[stream] = (len(replicas), placed + [u for u in self.uris if u not in placed])
        return got

    def assign(self, partitions):
        """Give each RangePartition its ordered node list (``partition.nodes``), spreading the streams'
        partitions over their replicas."""
        seen = {}
        for part in partitions:
            n_replicas, uris = self.members(part.stream)
            k = seen[part.stream] = seen.get(part.stream, -1) + 1
            if n_replicas > 1:
                i = k % n_replicas
                uris = uris[i:n_replicas] + uris[:i] + uris[n_replicas:]
            part.nodes = uris
        return partitions


def read_nodes(uris, stream, start, end, builder, batch_bytes, verify):
    """Yield RecordBatches of ``stream``'s records ``[start, end)`` read from the first of ``uris`` that
    serves them, going on from where it stopped on the next one when a node fails (module docstring).
    Raises RemoteError once every node failed ``MAX_ROUNDS`` times."""
    from riverbed.engine import core
    from riverbed.engine import format as fmt
    from riverbed.spark.batches import tune_malloc
    tune_malloc()
    bufs = core.new_arrow_buffers()
    pos = start
    problems = []
    attempt = 0
    while pos < end:
        uri = uris[attempt % len(uris)]
        try:
            with StreamClient(uri, timeout=READ_TIMEOUT) as client:
                for chunk in client.read_chunks(stream, pos, end):
                    core.chunk_to_arrow(chunk, pos, end, bufs, verify, True)
                    header = core.read_header(chunk)
                    pos = max(pos, header[fmt.H_CHUNK_ID] + header[fmt.H_RECORDS])
                    if len(bufs[4]) >= batch_bytes:
                        if len(bufs[0]):
                            yield builder.build(bufs)
                        bufs = core.new_arrow_buffers()
        except (OSError, RemoteError) as e:
            if isinstance(e, RemoteError) and e.code == 0x02 and pos == start and attempt + 1 >= len(uris):
                raise       # no node has the stream at all
            problems.append(f"{_where(uri)} at offset {pos}: {e}")
            log.warning("riverbed spark: reading %s from %s failed at offset %d (%s); trying the next node",
                        stream, _where(uri), pos, e)
            attempt += 1
            if attempt >= MAX_ROUNDS * len(uris):
                raise RemoteError(f"cannot read {stream!r} [{start}, {end}): every node failed: "
                                  + "; ".join(problems[-len(uris):])) from e
            if attempt % len(uris) == 0:
                time.sleep(ROUND_DELAY)
    if len(bufs[0]):
        yield builder.build(bufs)
