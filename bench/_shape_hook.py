"""Request and commit shape counters inside a ``riverbed serve`` process, for ``bench.produce_counts --shape``.

Not imported by the server itself: ``produce_counts`` starts the server with ``PYTHONPATH`` holding a
``sitecustomize.py`` that calls :func:`install` when ``RIVERBED_SHAPE_FILE`` is set. The counters wrap a
few functions (no change to what they do) and are written as JSON to that file every 50 ms by a daemon
thread, so the bench reads them before and after its timed part:

- ``api``: Kafka requests by API key (``codec.decode_header``);
- ``produce_parts`` / ``batches`` / ``records``: partitions decoded from Produce requests
  (``codec.stored_batches``), their record batches and records;
- ``batch_attrs`` / ``batch_ts_spread``: the batches' attributes, and how many had records with different
  timestamps (``max_timestamp != base_timestamp``);
- ``reads`` / ``read_bytes``: socket reads handed to a session (``SessionKernel.data_received``, every
  protocol) and their bytes;
- ``commits`` / ``commit_appends`` / ``commit_records``: group commits (one LMDB write transaction each,
  ``_Writer._commit``), the appends and records they stored; ``alone``: one-append commits taken by
  ``_Writer._commit_alone``; ``inline``: commits run on the caller's thread (``commit_inline``).
"""

import json
import os
import threading
import time

COUNTS = {"api": {}, "produce_parts": 0, "batches": 0, "records": 0, "batch_attrs": {}, "batch_ts_spread": 0,
          "commits": 0, "commit_appends": 0, "commit_records": 0, "alone": 0, "inline": 0, "reads": 0,
          "read_bytes": 0}
PERIOD_S = 0.05


def _bump(d, k, n=1):
    d[k] = d.get(k, 0) + n


def install(path):
    """Wrap the counted functions and start the thread that writes :data:`COUNTS` to ``path``."""
    from riverbed.engine import writer as W
    from riverbed.shells.kafka import codec as C

    decode_header, stored_batches = C.decode_header, C.stored_batches

    def counted_header(frame):
        hdr = decode_header(frame)
        _bump(COUNTS["api"], str(hdr.api_key))
        return hdr

    def counted_batches(data, limit, to_stored):
        out = stored_batches(data, limit, to_stored)
        COUNTS["produce_parts"] += 1
        for b in out[2]:
            COUNTS["batches"] += 1
            COUNTS["records"] += b.records
            _bump(COUNTS["batch_attrs"], str(b.attributes))
            if b.max_timestamp != b.base_timestamp:
                COUNTS["batch_ts_spread"] += 1
        return out
    C.decode_header, C.stored_batches = counted_header, counted_batches

    commit, alone, inline = W._Writer._commit, W._Writer._commit_alone, W._Writer.commit_inline

    def counted_commit(self, batch):
        COUNTS["commits"] += 1
        for op, args, _ in batch:
            if op == W._OP_APPEND:
                COUNTS["commit_appends"] += 1
                COUNTS["commit_records"] += args[0].records
        return commit(self, batch)

    def counted_alone(self, req):
        COUNTS["alone"] += 1
        return alone(self, req)

    def counted_inline(self, item):
        done = inline(self, item)
        if done:
            COUNTS["inline"] += 1
        return done
    W._Writer._commit, W._Writer._commit_alone, W._Writer.commit_inline = counted_commit, counted_alone, counted_inline

    from riverbed.shells.broker.session import SessionKernel
    received = SessionKernel.data_received

    def counted_received(self, data):
        COUNTS["reads"] += 1
        COUNTS["read_bytes"] += len(data)
        return received(self, data)
    SessionKernel.data_received = counted_received

    def dump():
        while True:
            tmp = f"{path}.tmp"
            with open(tmp, "w") as f:
                json.dump(COUNTS, f)
            os.replace(tmp, path)
            time.sleep(PERIOD_S)
    threading.Thread(target=dump, name="shape-counts", daemon=True).start()


SITECUSTOMIZE = """\
import os
if os.environ.get("RIVERBED_SHAPE_FILE"):
    from bench import _shape_hook
    _shape_hook.install(os.environ["RIVERBED_SHAPE_FILE"])
"""
