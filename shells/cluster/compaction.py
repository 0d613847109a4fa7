"""Compaction of the document changelog (shells/cluster/docs.py): snapshots in the log, then its head goes.

The changelog would grow forever, and a node that joins (or whose copy was wiped) would replay all of it.
The design, and why:

* **A snapshot is records of the changelog itself**, not a second stream. The changelog's leader, every
  ``--docs-snapshot-every`` records it has applied, reads its whole document state in one LMDB read
  transaction (every collection with its key field, indexes and documents, the versions of
  :data:`~riverbed.shells.cluster.docs.VERSIONS_COLLECTION`, the projection positions of
  :data:`POSITIONS_COLLECTION`) together with the changelog offset that state reflects (the *base*), and
  appends it as parts plus an end record **in one append**. One append is one engine commit, contiguous
  in the log, and a stream's committed offset is a prefix of its log: so an end record that is
  committed has every part of its snapshot right before it, and a snapshot cut short by a failover
  simply has no end (it is ignored; the next leader takes another). One stream keeps one order and one
  replication path, so no second stream can be ahead of or behind the first, and a snapshot needs no
  placement, no etcd key and no cleaning up of its own.
* **The head goes once a snapshot is complete.** Every node, applying a committed end record whose
  parts it saw just before it, removes the chunks of its own copy that end at or before that
  snapshot's base (``Engine.trim_head``: retention at a chosen point, keeping the chunk that holds the
  base). No node drops a record its documents have not applied (it applied the end record, which comes
  after), and what is dropped is covered by a snapshot that a majority holds.
* **A node whose copy starts after its applied position loads the snapshot.** A new node or a wiped
  data dir (applied 0), or a member so far behind that its leader no longer holds what would continue
  its copy (replication.py then drops that copy and sends the log from its first chunk): its applied
  offset is before its copy's first chunk. It reads its copy from there, skipping ordinary records, to
  the first snapshot whose base is at or after the copy's start; its first part drops every document
  collection of this node and each part writes its documents (a node killed mid-load starts the load
  again: its applied position only moves at the end); the end record sets the applied position to the
  base. It then replays from the base as every node does (the snapshot's own records change nothing
  there), so the writes logged while the snapshot was taken are applied after it, in log order.
* Nothing acknowledged is lost: a write is acknowledged once its record is committed and applied on
  the writer's node, and a committed record is either after the base of every snapshot that could
  replace it (replayed) or before it (in the snapshot, read after it was applied). Unique keys stay
  decided once: the snapshot carries the documents, their indexes and the versions that decide
  conflicts, so a loaded node decides every later record exactly as the others do.

Limits: a snapshot is built in memory on the leader (the whole document state, in parts of about
:data:`PART_BYTES`) and appended while the leader's writes go on; a node loading one serves partial
documents until the end record. Loop thread only, except the functions named for the writer thread.
"""

import logging
import os

import bson

from riverbed.engine.docstore import _Coll
from riverbed.engine.dockeys import id_from_key

log = logging.getLogger("riverbed.cluster.docs")

POSITIONS_COLLECTION = "_riverbed_positions"   # "stream\0reference" -> {"s", "r", "o"}: projection positions
PART_BYTES = 256 << 10     # about this many document bytes per snapshot part
DEFAULT_EVERY = 10_000     # changelog records between two snapshots (--docs-snapshot-every)


def position_id(stream, reference):
    return f"{stream}\0{reference}"


def read_state(docs, skip):
    """``(base, [(name, key_field, [[field, unique]...], [(id, raw bytes)...])...])``: every document
    collection of ``docs`` but those in ``skip``, and the changelog offset they reflect (the applied
    position stored beside them), all in one read transaction. Any thread."""
    from riverbed.shells.cluster.docs import APPLIED_ID, STATE_COLLECTION
    eng = docs.engine
    colls = []
    base = 0
    with eng.read_txn() as txn:
        cur = txn.cursor(db=docs._db_colls)
        found = []
        if cur.set_range(b"N"):
            for k, v in cur:
                k = bytes(k)
                if not k.startswith(b"N"):
                    break
                found.append((k[1:].decode("utf-8"), bytes(v)))
        for name, raw in found:
            c = _Coll.decode(name, raw)
            rows = []
            dcur = txn.cursor(db=docs._db_docs)
            if dcur.set_range(c.prefix):
                for k, v in dcur:
                    if k[:4] != c.prefix:
                        break
                    rows.append((id_from_key(bytes(k[4:])), bytes(v)))
            if name == STATE_COLLECTION:
                for doc_id, v in rows:
                    if doc_id == APPLIED_ID:
                        base = int(bson.decode(v)["next"])
                continue
            if name in skip:
                continue
            colls.append((name, c.key_field, [[ix.field, bool(ix.unique)] for ix in c.indexes], rows))
    return base, colls


def snapshot_records(base, colls, node):
    """The changelog records of one snapshot: parts of about PART_BYTES, then the end record."""
    token = f"{node}:{os.urandom(6).hex()}"
    parts, docs, size = [], [], 0

    def part(colls_meta):
        nonlocal docs, size
        parts.append(bson.encode({"v": 1, "snap": token, "base": base, "part": len(parts),
                                  "colls": colls_meta, "docs": docs}))
        docs, size = [], 0
    meta = [[name, key_field, indexes] for name, key_field, indexes, _ in colls]
    first = True
    for name, _, _, rows in colls:
        for doc_id, raw in rows:
            docs.append([name, doc_id, raw])
            size += len(raw) + 32
            if size >= PART_BYTES:
                part(meta if first else [])
                first = False
    part(meta if first else [])
    return token, parts + [bson.encode({"v": 1, "snap": token, "base": base, "end": len(parts)})]


def load_part(docs, st, ctx, rec, drop_first):
    """Writer thread: write one snapshot part into this node's store (``st``: its transaction state);
    the first part first drops every collection but the node's own apply position."""
    from riverbed.shells.cluster.docs import STATE_COLLECTION
    if drop_first:
        names = []
        cur = ctx.txn.cursor(db=docs._db_colls)
        if cur.set_range(b"N"):
            for k in cur.iternext(values=False):
                k = bytes(k)
                if not k.startswith(b"N"):
                    break
                names.append(k[1:].decode("utf-8"))
        for name in names:
            if name != STATE_COLLECTION:
                docs._stage_drop(st, name)
    for name, key_field, indexes in rec.get("colls") or ():
        docs._stage_create(st, name, tuple((f, bool(u)) for f, u in indexes), key_field)
    for name, doc_id, raw in rec.get("docs") or ():
        docs._put_one(st, name, doc_id, bytes(raw))
        if name == POSITIONS_COLLECTION:
            p = bson.decode(bytes(raw))
            if ctx.has_stream(p["s"]):
                ctx.store_offset(p["s"], p["r"], int(p["o"]))


class Compaction:
    """The compaction state of one node's DocLog: which snapshot's parts it has just seen (to know an
    end record is whole), the base of the last one, whether it is taking one, and a load in progress."""

    def __init__(self, every):
        self.every = every
        self.seen = None           # [token, parts seen] of the snapshot being read in log order
        self.last_base = 0         # base of the last whole snapshot applied here (0: none known)
        self.taking = False        # this node is appending a snapshot
        self.loading = None        # [token, parts loaded, base] while loading one
        self.scan = None           # offset the load reads from next (None: not loading)
        self.stats = {"snapshots": 0, "loads": 0, "trims": 0}

    def note(self, rec):
        """A snapshot record applied in log order: the base whose head may go when it ends a whole
        snapshot, else None."""
        token = rec.get("snap")
        if "end" in rec:
            whole = self.seen is not None and self.seen[0] == token and self.seen[1] == rec["end"]
            self.seen = None
            if whole:
                self.last_base = max(self.last_base, int(rec["base"]))
                return int(rec["base"])
            return None
        if rec.get("part") == 0:
            self.seen = [token, 1]
        elif self.seen is not None and self.seen[0] == token and self.seen[1] == rec.get("part"):
            self.seen[1] += 1
        else:
            self.seen = None
        return None

    def due(self, applied):
        return self.every > 0 and not self.taking and applied - self.last_base >= self.every


__all__ = ["Compaction", "POSITIONS_COLLECTION", "read_state", "snapshot_records", "load_part"]
