"""Executor side of the Spark reader: Arrow RecordBatches from chunks, read from LMDB or from a broker.

Each range ``[start, end)`` of one stream is read chunk by chunk; the compiled core's ``chunk_to_arrow``
appends every record in range to five growing buffers (offset, timestamp, chunk id, value offsets, body
bytes) in one C pass per chunk, and once the body bytes reach ``batch_bytes`` the buffers are wrapped by
``pyarrow.Array.from_buffers`` without a copy and a batch goes out. No Python object is made per record
on the ``raw`` path.

Local reads open the data directory's LMDB environment read-only once per process (:func:`engine_for`):
an open environment cannot be pickled, and LMDB must not be opened twice by one process.
"""

import ctypes
import os
import threading

import pyarrow as pa

from riverbed.engine import Engine, core
from riverbed.spark import jsonbatch

FIXED_COLUMNS = ("stream", "partition", "offset", "timestamp", "chunk_id")
DEFAULT_BATCH_BYTES = 16 << 20     # body bytes per Arrow batch: ~160k rows of 100 B, ~15 ms of work
CHUNKS_PER_TXN = 1024              # chunks visited per LMDB read transaction (bounded by bytes too)
BYTES_PER_TXN = 1 << 20            # stored bytes per LMDB read transaction, at most

_engines = {}
_engines_lock = threading.Lock()
_malloc_tuned = False


def engine_for(path):
    """The read-only Engine of ``path`` for this process, opened on first use and kept until the process
    exits (Spark reuses its Python workers across tasks). Thread-safe."""
    key = os.path.realpath(path)
    with _engines_lock:
        eng = _engines.get(key)
        if eng is None:
            eng = _engines[key] = Engine(key, readonly=True)
        return eng


def tune_malloc():
    """Keep freed batch memory in this process instead of giving it back to the OS at once.

    Every batch is a set of fresh multi-megabyte buffers. With glibc's defaults those are mmapped and
    unmapped per batch, and touching fresh pages costs more than building the batch (measured: 4M vs
    20M+ records/s for the core alone). Raising the trim and mmap thresholds lets the next batch reuse
    the pages. Only the calling worker process is affected; a no-op off glibc. Idempotent.
    """
    global _malloc_tuned
    if _malloc_tuned:
        return
    _malloc_tuned = True
    try:
        libc = ctypes.CDLL(None)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return
    M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
    mallopt(M_TRIM_THRESHOLD, 512 << 20)
    mallopt(M_MMAP_THRESHOLD, 32 << 20)      # glibc's largest accepted value on 64-bit


class BatchBuilder:
    """Turns core buffers into RecordBatches of ``arrow_schema`` for one stream and partition index."""

    def __init__(self, arrow_schema, stream, partition, decode="raw", decoded_fields=()):
        self.schema = arrow_schema
        self.stream = stream
        self.partition = partition
        self.decode = decode
        self.decoded_fields = list(decoded_fields)
        self._constant = None       # (stream column, partition column), sliced for every batch

    def _constants(self, n):
        # The stream and partition columns repeat one value: made once, a batch takes a zero-copy slice
        # from the start (which the Arrow IPC writer sends as is), not n fresh values every batch.
        if self._constant is None or len(self._constant[0]) < n:
            size = max(n, 2 * len(self._constant[0])) if self._constant is not None else n
            self._constant = (pa.repeat(pa.scalar(self.stream, pa.string()), size),
                              pa.repeat(pa.scalar(self.partition, pa.int32()), size))
        stream, partition = self._constant
        return (stream, partition) if len(stream) == n else (stream.slice(0, n), partition.slice(0, n))

    def build(self, bufs):
        offsets, timestamps, chunk_ids, value_offsets, data = bufs
        n = len(offsets) // 8
        body = pa.Array.from_buffers(pa.binary(), n, [None, pa.py_buffer(value_offsets), pa.py_buffer(data)])
        cols = [
            *self._constants(n),
            pa.Array.from_buffers(pa.int64(), n, [None, pa.py_buffer(offsets)]),
            pa.Array.from_buffers(pa.timestamp("us", tz="UTC"), n, [None, pa.py_buffer(timestamps)]),
            pa.Array.from_buffers(pa.int64(), n, [None, pa.py_buffer(chunk_ids)]),
        ]
        if self.decode == "raw":
            cols.append(body)
        elif self.decode == "amqp":
            from riverbed.spark import amqp
            out_body, props = amqp.decode_batch(body, self.schema.field("properties").type)
            cols += [out_body, props]
        else:
            # json and bson: by the one record format, so a record from any protocol loads as its columns
            fields = [self.schema.field(f) for f in self.decoded_fields]
            if self.decode == "json" and jsonbatch.supported(fields):
                cols += jsonbatch.decode_json(value_offsets, data, body, fields)
            else:
                from riverbed.spark import amqp
                cols += amqp.decode_documents(body, self.decode, fields)
        return pa.RecordBatch.from_arrays(cols, schema=self.schema)


def read_local(path, stream, start, end, builder, batch_bytes=DEFAULT_BATCH_BYTES, verify=True):
    """Yield RecordBatches of the committed records of ``stream`` with offsets in ``[start, end)`` from the
    data directory ``path``, each of about ``batch_bytes`` of bodies (it ends with the read transaction
    that takes it past that: at most BYTES_PER_TXN more). No LMDB read transaction outlives a yield. Raises StreamNotFound and ChunkError (naming stream and chunk id)."""
    tune_malloc()
    eng = engine_for(path)
    state = [core.new_arrow_buffers()]

    def add(chunk_id, view):
        # map_chunks has checked the header and CRC already (verify=...); only the walk is left
        core.chunk_to_arrow(view, start, end, state[0], False)

    # A batch is cut only between transactions (map_chunks calls ``add`` for a whole transaction before it
    # yields): short transactions keep a batch within BYTES_PER_TXN of ``batch_bytes``.
    for _ in eng.map_chunks(stream, add, start, end, chunks_per_txn=CHUNKS_PER_TXN,
                            bytes_per_txn=min(batch_bytes, BYTES_PER_TXN), verify=verify):
        if len(state[0][4]) >= batch_bytes:
            bufs, state[0] = state[0], core.new_arrow_buffers()
            if len(bufs[0]):
                yield builder.build(bufs)
    if len(state[0][0]):
        yield builder.build(state[0])


def read_remote(uri, stream, start, end, builder, batch_bytes=DEFAULT_BATCH_BYTES, verify=True):
    """As :func:`read_local`, over the RabbitMQ Stream protocol from the broker at ``uri``."""
    from riverbed.spark.remote import StreamClient
    tune_malloc()
    bufs = core.new_arrow_buffers()
    with StreamClient(uri) as client:
        for chunk in client.read_chunks(stream, start, end):
            core.chunk_to_arrow(chunk, start, end, bufs, verify, True)
            if len(bufs[4]) >= batch_bytes:
                if len(bufs[0]):
                    yield builder.build(bufs)
                bufs = core.new_arrow_buffers()
    if len(bufs[0]):
        yield builder.build(bufs)
