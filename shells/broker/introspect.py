"""What a running broker holds, for people and tools: streams with their sizes, consumers with their lag,
publishers, connections per protocol. The dashboard and its JSON API (shells/http/api.py), and anything
else that wants the same view (an admin CLI, metrics), read it from here.

Everything comes from memory: the engine's committed per-stream state (no LMDB transaction, no scan)
and the sessions the broker has registered. A session takes part by offering

* ``consumer_infos()``: a list of ``{"stream", "protocol", "connection", "subscription_id",
  "reference", "offset", "credits"}`` dicts, ``offset`` being the next offset it will deliver and
  ``credits`` None when the protocol has none;
* ``publisher_infos()``: a list of ``{"stream", "protocol", "connection", "publisher_id", "reference",
  "published"}`` dicts.

A session without them counts as having none. Loop-thread only (sessions change on the loop thread).
"""

from riverbed.engine.errors import StreamNotFound


def stream_state(broker, name):
    """The committed state of stream ``name`` as a dict: ``records``, ``bytes``, ``chunks``,
    ``first_offset`` (the first stored offset; the next offset when the stream is empty),
    ``last_offset`` (None when empty), ``next_offset``, ``committed_chunk_id`` (-1 when empty) and
    ``arguments``. Raises StreamNotFound.

    Reads the engine's in-memory stream state: a stream's committed counters are kept there, so this
    costs a few attribute reads (the engine's public ``stream_info`` also reads the first chunk's
    timestamp from LMDB, which nothing here needs)."""
    engine = broker.engine
    current = getattr(engine, "_current", None)
    if current is None or getattr(engine, "readonly", False):
        info = broker.stream_info(name)
        return {"records": info.records, "bytes": info.bytes, "chunks": info.chunks,
                "first_offset": info.first_offset if info.chunks else info.next_offset,
                "last_offset": info.last_offset if info.chunks else None, "next_offset": info.next_offset,
                "committed_chunk_id": info.committed_chunk_id, "arguments": dict(info.arguments)}
    s = current(name)
    chunks = s.chunks
    return {"records": s.records, "bytes": s.bytes, "chunks": chunks,
            "first_offset": s.first_chunk if chunks else s.next_offset,
            "last_offset": s.next_offset - 1 if chunks else None, "next_offset": s.next_offset,
            "committed_chunk_id": s.last_chunk, "arguments": dict(s.args)}


def _next_offsets(broker):
    """stream -> next offset, for lag; a cache for one call (streams looked up once each)."""
    cache = {}

    def next_offset(stream):
        if stream not in cache:
            try:
                cache[stream] = stream_state(broker, stream)["next_offset"]
            except StreamNotFound:
                cache[stream] = None
        return cache[stream]
    return next_offset


def _gather(broker, method):
    out = []
    for session in list(broker.sessions):
        fn = getattr(session, method, None)
        if fn is not None:
            out.extend(fn())
    return out


def consumers(broker, stream=None):
    """Every live subscription (of ``stream`` only, when given), each a session's ``consumer_infos()``
    dict plus ``lag``: records between its offset and the stream's last committed offset (0 when caught
    up; None when its stream is gone). Sorted by stream, protocol, connection, subscription id."""
    next_offset = _next_offsets(broker)
    out = []
    for info in _gather(broker, "consumer_infos"):
        if stream is not None and info["stream"] != stream:
            continue
        nxt = next_offset(info["stream"])
        info = dict(info)
        info["lag"] = None if nxt is None or info["offset"] is None else max(0, nxt - info["offset"])
        out.append(info)
    out.sort(key=lambda c: (c["stream"], c["protocol"], c["connection"], str(c["subscription_id"])))
    return out


def publishers(broker, stream=None):
    """Every declared publisher (of ``stream`` only, when given): the sessions' ``publisher_infos()``
    dicts, sorted by stream, protocol, connection, publisher id. Only protocols that declare publishers
    (RabbitMQ Stream) have any."""
    out = [dict(p) for p in _gather(broker, "publisher_infos") if stream is None or p["stream"] == stream]
    out.sort(key=lambda p: (p["stream"], p["protocol"], p["connection"], str(p["publisher_id"])))
    return out


def connection_counts(broker):
    """``{protocol: live connections}`` over every registered session that has ``connection_info()``."""
    counts = {}
    for info in broker.connections():
        proto = info.get("protocol") or "unknown"
        counts[proto] = counts.get(proto, 0) + 1
    return counts


def streams(broker, names=None):
    """``[{"name", "records", "bytes", "chunks", "first_offset", "last_offset", "committed_chunk_id",
    "arguments", "consumers", "publishers"}]`` for ``names`` (default: every stream), sorted by name;
    streams deleted meanwhile are left out. ``consumers`` and ``publishers`` are counts."""
    names = sorted(broker.list_streams() if names is None else names)
    subs, pubs = {}, {}
    for c in _gather(broker, "consumer_infos"):
        subs[c["stream"]] = subs.get(c["stream"], 0) + 1
    for p in _gather(broker, "publisher_infos"):
        pubs[p["stream"]] = pubs.get(p["stream"], 0) + 1
    out = []
    for name in names:
        try:
            st = stream_state(broker, name)
        except StreamNotFound:
            continue
        out.append({"name": name, "records": st["records"], "bytes": st["bytes"], "chunks": st["chunks"],
                    "first_offset": st["first_offset"], "last_offset": st["last_offset"],
                    "committed_chunk_id": st["committed_chunk_id"], "arguments": st["arguments"],
                    "consumers": subs.get(name, 0), "publishers": pubs.get(name, 0)})
    return out
