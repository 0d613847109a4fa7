"""REAM aggregates: JSON documents by id in the engine's document store. An aggregate NAME is the
collection NAME (a mewbase binder of the same name is the same data; DESIGN.md, one document namespace).

Every operation answers through ``cb(result, exc)`` on the loop thread: writes through the broker's
transactions (``broker.transact``), reads at once (single-document reads are one short LMDB lookup).
"""

from riverbed.engine.errors import RiverbedError
from riverbed.shells.ream_text.codec import ReamError

SCHEMA_COLLECTION = "_ream_projections"   # projection schemas (declared fields); never a REAM name
RESERVED_PREFIX = "_riverbed"             # the server's own collections (mewbase projections, the cluster's)


class Aggregates:
    """Aggregate operations over ``docs`` (the broker's DocStore). ``transact(stage, cb)`` is
    ``broker.transact``. Loop-thread only."""

    def __init__(self, docs, transact):
        self.docs = docs
        self.transact = transact

    def _is_projection(self, ctx, name):
        return self.docs.stage_get(ctx, SCHEMA_COLLECTION, name) is not None

    def _submit(self, fn, cb):
        self.transact(fn, cb)

    def set(self, name, doc_id, doc, cb):
        """Store ``doc`` (a dict) as aggregate ``doc_id`` of ``name``, replacing it; ``cb(doc_id, exc)``.
        A projection of that name refuses (checked in the write's own transaction)."""
        docs = self.docs

        def run(ctx):
            if self._is_projection(ctx, name):
                raise ReamError(f"{name} is a projection")
            return docs.stage_put(ctx, name, doc_id, doc)
        self._submit(run, cb)

    def get(self, name, doc_id, cb):
        """``cb(doc or None, exc)``."""
        try:
            doc = self.docs.get(name, doc_id)
        except RiverbedError as e:
            cb(None, e)
            return
        cb(doc, None)

    def remove(self, name, doc_id, cb):
        """Delete the aggregate (also when missing); ``cb(existed, exc)``."""
        docs = self.docs

        def run(ctx):
            if self._is_projection(ctx, name):
                raise ReamError(f"{name} is a projection")
            return docs.stage_delete(ctx, name, doc_id)
        self._submit(run, cb)

    def list(self):
        """Names of the collections holding at least one aggregate (not projections, not the schema
        collection), sorted."""
        out = []
        for name in self.docs.list_collections():
            if name == SCHEMA_COLLECTION or name.startswith(RESERVED_PREFIX):
                continue
            info = self.docs.collection_info(name)
            if info is not None and info.count > 0 and self.docs.get(SCHEMA_COLLECTION, name) is None:
                out.append(name)
        return out
