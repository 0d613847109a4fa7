"""The ``riverbed`` PySpark data source: batch and streaming reads of Riverbed streams.

Options (all strings, as Spark passes them):

    path               data directory to read directly (LMDB, read-only; safe while ``riverbed serve``
                       writes to it: only committed chunks are seen)
    uri                ``rabbitmq-stream://[user:pass@]host:port[/vhost]`` instead of ``path``: every
                       executor reads its range from the broker, no shared disk needed
    nodes              ``host:port,host:port,...``: read from a cluster's nodes (replicas preferred, in
                       parallel across nodes, a partition retried on another member when a node goes
                       away mid-read); ``uri`` may come too, for credentials and vhost
                       (:mod:`riverbed.spark.cluster`)
    stream             a stream, a comma list, or a super stream (all of its partitions, in order)
    startingOffset     ``earliest`` (default), ``latest``, a number, or JSON ``{"stream": n, ...}``;
                       inclusive
    endingOffset       ``latest`` (default: the committed end when the query is planned), a number or
                       JSON; exclusive. Batch only
    startingTimestamp  ms since the epoch or ISO-8601 (UTC when naive): from the first chunk stamped at
                       or after it (a record's timestamp is its chunk's)
    endingTimestamp    the same, exclusive: up to the first chunk stamped at or after it. Batch only
    decode             ``raw`` (default) | ``amqp`` | ``json`` | ``bson``. ``json`` and ``bson`` read each
                       record by the one record format (riverbed.engine.record): AMQP-wrapped or raw,
                       JSON or BSON, a record published over any protocol loads as its columns (BSON
                       converted to JSON for ``json``, JSON to BSON for ``bson``; bytes are
                       ``{"base64": ...}`` / ``{"data": ...}``)
    schema             DDL of the typed columns for ``json`` and ``bson`` (required for those)
    numPartitions      Spark partitions to split the ranges into (default: the CPU count, which is
                       ``spark.default.parallelism`` for local[*]; a Python data source cannot read the
                       Spark conf, so set it on a cluster)
    maxRecordsPerTrigger  streaming: records per micro-batch, shared out over the streams
    verifyCrc          ``true`` (default) checks every chunk's CRC on read
    batchBytes         body bytes per Arrow batch (default 16 MiB)

Columns: ``stream`` string, ``partition`` int (a super stream partition's number; for a plain stream,
its position among all the streams read, 0 when there is one), ``offset`` bigint, ``timestamp`` timestamp
(UTC, the chunk's), ``chunk_id`` bigint, then ``body`` binary (raw), ``body`` + ``properties``
map<string,string> (amqp), or the ``schema`` columns (json, bson).

Super streams: their partition lists are read from the engine's super stream table (remote: the
Partitions command).

Filter pushdown (``spark.sql.python.filterPushdown.enabled=true``): comparisons of ``offset`` and
``timestamp`` with literals and ``stream =``/``IN`` are applied to the planned ranges,
exactly (records share their chunk's timestamp), and Spark does not evaluate them again.
"""

import json
import os
import sys
from datetime import datetime, timezone

from pyspark.sql.datasource import DataSource, DataSourceReader, DataSourceStreamReader, InputPartition

try:    # filter pushdown arrived in pyspark 4.1; on 4.0 every filter stays with Spark
    from pyspark.sql.datasource import (
        EqualTo, GreaterThan, GreaterThanOrEqual, In, IsNotNull, LessThan, LessThanOrEqual,
    )
    HAS_PUSHDOWN = True
except ImportError:  # pragma: no cover - pyspark 4.0
    HAS_PUSHDOWN = False

from riverbed.spark import batches

NAME = "riverbed"
DECODES = ("raw", "amqp", "json", "bson")
FIXED_DDL = "stream string, partition int, offset bigint, timestamp timestamp, chunk_id bigint"
INT64_MAX = (1 << 63) - 1


class OptionError(ValueError):
    """An option is missing or malformed; the message names it."""


# ------------------------------------------------------------------------------------------- options

def _parse_time_ms(name, text):
    text = str(text).strip()
    if text.lstrip("-").isdigit():
        return int(text)
    try:
        dt = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise OptionError(f"{name} {text!r} is neither ms since the epoch nor ISO-8601") from None
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=timezone.utc)
    return int(dt.timestamp() * 1000)


def _parse_offsets(name, text, default):
    """``earliest`` | ``latest`` | n | {"stream": n|"earliest"|"latest"} -> (default value, per stream)."""
    if text is None:
        return default, {}
    text = str(text).strip()
    if text.startswith("{"):
        try:
            per = json.loads(text)
        except ValueError:
            raise OptionError(f"{name} is not valid JSON: {text!r}") from None
        return default, {k: _one_offset(name, v) for k, v in per.items()}
    return _one_offset(name, text), {}


def _one_offset(name, v):
    if isinstance(v, int) and v >= 0:
        return v
    s = str(v).strip().lower()
    if s in ("earliest", "latest"):
        return s
    if s.isdigit():
        return int(s)
    raise OptionError(f"{name} {v!r} is not earliest, latest or an offset >= 0")


def _truthy(v, default):
    return default if v is None else str(v).strip().lower() in ("1", "true", "yes", "on")


class Options:
    """Validated reader options. Picklable; built on the driver and shipped to executors."""

    def __init__(self, options):
        o = {k.lower(): v for k, v in dict(options).items()}
        self.path = o.get("path")
        self.uri = o.get("uri")
        self.nodes = o.get("nodes")
        if bool(self.path) == bool(self.uri or self.nodes):
            raise OptionError("give exactly one of option('path', DATA_DIR) and option('uri', "
                              "'rabbitmq-stream://host:5552') (or option('nodes', 'host:port,...'))")
        if self.uri:
            from riverbed.spark.remote import parse_uri
            parse_uri(self.uri)
        if self.nodes:
            from riverbed.spark.cluster import parse_nodes
            try:
                parse_nodes(self.nodes)
            except ValueError as e:
                raise OptionError(str(e)) from None
        names = [s.strip() for s in str(o.get("stream") or "").split(",") if s.strip()]
        if not names:
            raise OptionError("option('stream', ...) is required: a stream, a comma list or a super stream")
        self.names = names
        self.start_default, self.start_per = _parse_offsets("startingOffset", o.get("startingoffset"), "earliest")
        self.end_default, self.end_per = _parse_offsets("endingOffset", o.get("endingoffset"), "latest")
        st, et = o.get("startingtimestamp"), o.get("endingtimestamp")
        self.start_ts = _parse_time_ms("startingTimestamp", st) if st not in (None, "") else None
        self.end_ts = _parse_time_ms("endingTimestamp", et) if et not in (None, "") else None
        self.decode = str(o.get("decode") or "raw").strip().lower()
        if self.decode not in DECODES:
            raise OptionError(f"decode {self.decode!r} is not one of {', '.join(DECODES)}")
        self.schema_ddl = o.get("schema")
        if self.decode in ("json", "bson") and not self.schema_ddl:
            raise OptionError(f"decode={self.decode} needs option('schema', DDL) naming the typed columns, "
                              "e.g. 'id bigint, name string'")
        try:
            self.num_partitions = int(o.get("numpartitions") or os.cpu_count() or 2)
            self.max_records = int(o["maxrecordspertrigger"]) if o.get("maxrecordspertrigger") else None
            self.batch_bytes = int(o.get("batchbytes") or batches.DEFAULT_BATCH_BYTES)
        except ValueError as e:
            raise OptionError(f"numPartitions, maxRecordsPerTrigger and batchBytes take integers: {e}") from None
        if self.num_partitions < 1 or self.batch_bytes < 1 or (self.max_records is not None and self.max_records < 1):
            raise OptionError("numPartitions, maxRecordsPerTrigger and batchBytes must be positive")
        self.verify = _truthy(o.get("verifycrc"), True)

    def ddl(self):
        if self.decode == "raw":
            return FIXED_DDL + ", body binary"
        if self.decode == "amqp":
            return FIXED_DDL + ", body binary, properties map<string,string>"
        return FIXED_DDL + ", " + self.schema_ddl


# ------------------------------------------------------------------------------------------ backends

class LocalBackend:
    """Planning reads against a data directory (this process's read-only Engine)."""

    def __init__(self, opts):
        self.opts = opts
        self.engine = batches.engine_for(opts.path)

    def expand(self, name):
        d = self.engine.super_stream(name)
        return list(d["partitions"]) if d else None

    def exists(self, name):
        return self.engine.has_stream(name)

    def bounds(self, name):
        from riverbed.engine import OffsetSpec
        return self.engine.resolve(name, OffsetSpec.first()), self.engine.resolve(name, OffsetSpec.next())

    def at_timestamp(self, name, ms):
        from riverbed.engine import OffsetSpec
        return self.engine.resolve(name, OffsetSpec.timestamp(ms))

    def split_points(self, name, start, end):
        """Chunk ids in (start, end): cutting there means no chunk is read by two tasks."""
        return [cid for cid, _ in self.engine.chunk_index(name, start + 1, end)]

    def close(self):
        pass    # the Engine stays open for the process (batches.engine_for)


class RemoteBackend:
    """Planning reads against a broker over the RabbitMQ Stream protocol."""

    def __init__(self, opts, client=None):
        from riverbed.spark.remote import StreamClient
        self.client = client or StreamClient(opts.uri)

    def expand(self, name):
        return self.client.partitions(name)

    def exists(self, name):
        from riverbed.spark.remote import RemoteError
        try:
            self.client.resolve(name, "next")
            return True
        except RemoteError as e:
            if e.code == 0x02:
                return False
            raise

    def bounds(self, name):
        return self.client.resolve(name, "first"), self.client.resolve(name, "next")

    def at_timestamp(self, name, ms):
        return self.client.resolve(name, "timestamp", ms)

    def split_points(self, name, start, end):
        return None     # no chunk index over the wire: split by offsets, a straddling chunk is read twice

    def close(self):
        self.client.close()


def backend_for(opts):
    if opts.nodes:
        from riverbed.spark.cluster import ClusterBackend
        return ClusterBackend(opts)
    return RemoteBackend(opts) if opts.uri else LocalBackend(opts)


def resolve_streams(opts, backend):
    """``[(stream, partition index)]`` for what ``opts.names`` names. Raises OptionError."""
    out = []
    for name in opts.names:
        parts = backend.expand(name)
        if parts:
            out.extend((p, i) for i, p in enumerate(parts))
        elif backend.exists(name):
            out.append((name, len(out) if len(opts.names) > 1 else 0))
        else:
            raise OptionError(f"stream {name!r} does not exist (neither a stream nor a super stream)")
    return out


def _offset_for(value, first, nxt):
    if value == "earliest":
        return first
    if value == "latest":
        return nxt
    return value


# --------------------------------------------------------------------------------------- partitions

class RangePartition(InputPartition):
    """Records of ``stream`` with offsets in ``[start, end)``; ``partition`` is the partition column;
    ``nodes`` the stream URIs to read it from, in order (cluster reads), else None."""

    def __init__(self, stream, partition, start, end, nodes=None):
        super().__init__((stream, partition, start, end))
        self.stream = stream
        self.partition = partition
        self.start = start
        self.end = end
        self.nodes = nodes


def split_ranges(ranges, backend, pieces):
    """Cut ``[(stream, partition, start, end)]`` into about ``pieces`` RangePartitions of even record
    counts, cutting at chunk boundaries when the backend knows them."""
    ranges = [r for r in ranges if r[3] > r[2]]
    total = sum(e - s for _, _, s, e in ranges)
    if not total:
        return []
    out = []
    for stream, part, start, end in ranges:
        k = max(1, round(pieces * (end - start) / total))
        points = backend.split_points(stream, start, end)
        cuts = []
        for j in range(1, k):
            target = start + (end - start) * j // k
            if points is None:
                cuts.append(target)
            elif points:
                cuts.append(min(points, key=lambda c: abs(c - target)))
        edges = sorted({start, end, *cuts})
        out.extend(RangePartition(stream, part, a, b) for a, b in zip(edges, edges[1:]))
    assign = getattr(backend, "assign", None)       # a cluster: each partition's nodes, replicas first
    return assign(out) if assign is not None else out


# ---------------------------------------------------------------------------------------- pushdown

class PushedFilters:
    """Bounds from pushed filters: offsets and timestamps (µs) as half-open ranges, and stream names."""

    def __init__(self):
        self.offset = [0, INT64_MAX]
        self.ts_us = [-INT64_MAX, INT64_MAX]
        self.streams = None

    def accept(self, f):
        """Fold filter ``f`` in; False when it is not one this source applies exactly."""
        col = f.attribute[0] if len(f.attribute) == 1 else None
        if isinstance(f, IsNotNull) and col in ("stream", "partition", "offset", "timestamp", "chunk_id"):
            return True       # never null
        if not hasattr(f, "value"):
            return False
        if col == "stream":
            if isinstance(f, EqualTo) and isinstance(f.value, str):
                vals = {f.value}
            elif isinstance(f, In) and all(isinstance(v, str) for v in f.value):
                vals = set(f.value)
            else:
                return False
            self.streams = vals if self.streams is None else self.streams & vals
            return True
        if col == "offset":
            v = f.value
            if not isinstance(v, int) or isinstance(v, bool):
                return False
            return self._bound(self.offset, f, v)
        if col == "timestamp":
            v = f.value
            if not isinstance(v, datetime):
                return False
            if v.tzinfo is None:
                v = v.replace(tzinfo=timezone.utc)     # Spark hands timestamps over in UTC
            delta = v - datetime(1970, 1, 1, tzinfo=timezone.utc)
            us = (delta.days * 86400 + delta.seconds) * 1_000_000 + delta.microseconds
            return self._bound(self.ts_us, f, us)
        return False

    @staticmethod
    def _bound(rng, f, v):
        if isinstance(f, GreaterThan):
            rng[0] = max(rng[0], v + 1)
        elif isinstance(f, GreaterThanOrEqual):
            rng[0] = max(rng[0], v)
        elif isinstance(f, LessThan):
            rng[1] = min(rng[1], v)
        elif isinstance(f, LessThanOrEqual):
            rng[1] = min(rng[1], v + 1)
        elif isinstance(f, EqualTo):
            rng[0] = max(rng[0], v)
            rng[1] = min(rng[1], v + 1)
        else:
            return False
        return True


def _ceil_ms(us):
    return -((-us) // 1000)


def plan_ranges(opts, backend, pushed=None, streams=None):
    """``[(stream, partition, start, end)]`` of the batch read: options and pushed filters applied."""
    out = []
    for stream, part in streams or resolve_streams(opts, backend):
        if pushed is not None and pushed.streams is not None and stream not in pushed.streams:
            continue
        first, nxt = backend.bounds(stream)
        start = _offset_for(opts.start_per.get(stream, opts.start_default), first, nxt)
        end = _offset_for(opts.end_per.get(stream, opts.end_default), first, nxt)
        end = min(end, nxt)       # never past the committed end seen now
        start = max(start, first)
        if opts.start_ts is not None:
            start = max(start, backend.at_timestamp(stream, opts.start_ts))
        if opts.end_ts is not None:
            end = min(end, backend.at_timestamp(stream, opts.end_ts))
        if pushed is not None:
            start = max(start, pushed.offset[0])
            end = min(end, pushed.offset[1])
            lo, hi = pushed.ts_us
            if lo > -INT64_MAX:
                start = max(start, backend.at_timestamp(stream, _ceil_ms(lo)))
            if hi < INT64_MAX:
                end = min(end, backend.at_timestamp(stream, _ceil_ms(hi)))
        out.append((stream, part, start, end))
    return out


# ------------------------------------------------------------------------------------------ readers

def _arrow_schema(schema):
    from pyspark.sql.pandas.types import to_arrow_schema
    return to_arrow_schema(schema, timezone="UTC")


def read_partition(opts, schema, partition):
    """Arrow batches of one planned RangePartition (an empty iterator for the placeholder Spark uses
    when there is nothing to read)."""
    if not isinstance(partition, RangePartition):
        return iter(())
    arrow_schema = _arrow_schema(schema)
    decoded = [f.name for f in schema.fields[len(batches.FIXED_COLUMNS):]] if opts.decode in ("json", "bson") else ()
    builder = batches.BatchBuilder(arrow_schema, partition.stream, partition.partition, opts.decode, decoded)
    if opts.nodes:
        from riverbed.spark.cluster import node_uris, read_nodes
        return read_nodes(getattr(partition, "nodes", None) or node_uris(opts.nodes, opts.uri), partition.stream,
                          partition.start, partition.end, builder, opts.batch_bytes, opts.verify)
    if opts.uri:
        return batches.read_remote(opts.uri, partition.stream, partition.start, partition.end, builder,
                                   opts.batch_bytes, opts.verify)
    return batches.read_local(opts.path, partition.stream, partition.start, partition.end, builder,
                              opts.batch_bytes, opts.verify)


class RiverbedReader(DataSourceReader):
    """Batch reader: plans ranges on the driver, reads them in the executors' Python workers."""

    def __init__(self, opts, schema):
        self.opts = opts
        self.schema = schema
        self.pushed = None

    def partitions(self):
        backend = backend_for(self.opts)
        try:
            ranges = plan_ranges(self.opts, backend, self.pushed)
            return split_ranges(ranges, backend, self.opts.num_partitions)
        finally:
            backend.close()

    def read(self, partition):
        return read_partition(self.opts, self.schema, partition)


class RiverbedFilteringReader(RiverbedReader):
    """The batch reader with ``pushFilters``: used only when Spark plans with filter pushdown on (Spark
    refuses a reader that implements pushFilters while pushdown is off)."""

    def pushFilters(self, filters):
        self.pushed = PushedFilters()
        for f in filters:
            if not self.pushed.accept(f):
                yield f


def _planned_with_pushdown():
    # Spark 4.1+ plans a read with pushdown in pyspark.sql.worker.data_source_pushdown_filters and
    # without it in plan_data_source_read; it calls reader() in both and refuses, in the second, a
    # reader class that overrides pushFilters. Only the call stack tells the two apart.
    f = sys._getframe(1)
    while f is not None:
        if f.f_code.co_filename.endswith("data_source_pushdown_filters.py"):
            return True
        f = f.f_back
    return False


class RiverbedStreamReader(DataSourceStreamReader):
    """Micro-batch reader. An offset is ``{"stream": next offset to read, ...}``: a micro-batch reads
    ``[start[s], end[s])`` of every stream, so a batch replayed after a restart from the checkpoint
    reads exactly the same records (the log is append-only)."""

    def __init__(self, opts, schema):
        self.opts = opts
        self.schema = schema
        self._streams = None

    def _with_backend(self, fn):
        backend = backend_for(self.opts)
        try:
            if self._streams is None:
                self._streams = resolve_streams(self.opts, backend)
            return fn(backend)
        finally:
            backend.close()

    def initialOffset(self):
        def initial(backend):
            out = {}
            for stream, _ in self._streams:
                first, nxt = backend.bounds(stream)
                start = max(_offset_for(self.opts.start_per.get(stream, self.opts.start_default), first, nxt), first)
                if self.opts.start_ts is not None:
                    start = max(start, backend.at_timestamp(stream, self.opts.start_ts))
                out[stream] = start
            return out
        return self._with_backend(initial)

    def getDefaultReadLimit(self):
        from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows
        return ReadMaxRows(self.opts.max_records) if self.opts.max_records else ReadAllAvailable()

    def latestOffset(self, start=None, limit=None):
        cap = getattr(limit, "max_rows", None) if limit is not None else None
        if cap is None and limit is not None:
            cap = getattr(limit, "maxRows", None)

        def latest(backend):
            out = {}
            share = None if cap is None else max(1, -(-cap // max(1, len(self._streams))))
            for stream, _ in self._streams:
                nxt = backend.bounds(stream)[1]
                begin = (start or {}).get(stream, nxt)
                out[stream] = nxt if share is None else min(nxt, begin + share)
            return out
        return self._with_backend(latest)

    def partitions(self, start, end):
        def plan(backend):
            ranges = [(s, p, start.get(s, end.get(s, 0)), end.get(s, 0)) for s, p in self._streams]
            return split_ranges(ranges, backend, self.opts.num_partitions)
        return self._with_backend(plan)

    def read(self, partition):
        return read_partition(self.opts, self.schema, partition)

    def commit(self, end):
        pass    # nothing to release: the log keeps records until retention removes them


class RiverbedDataSource(DataSource):
    """``spark.read.format("riverbed")`` and ``spark.readStream.format("riverbed")``. See the module
    docstring for options and columns. Register with ``spark.dataSource.register(RiverbedDataSource)``."""

    def __init__(self, options):
        super().__init__(options)
        self.opts = Options(options)

    @classmethod
    def name(cls):
        return NAME

    def schema(self):
        return self.opts.ddl()

    def reader(self, schema):
        if HAS_PUSHDOWN and _planned_with_pushdown():
            return RiverbedFilteringReader(self.opts, schema)
        return RiverbedReader(self.opts, schema)

    def streamReader(self, schema):
        return RiverbedStreamReader(self.opts, schema)
