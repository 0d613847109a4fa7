"""The document store: named collections of BSON documents by id, with unique and secondary indexes, in
the log's own LMDB environment and written by its writer thread. mewbase binders, REAM aggregates and
REAM projections are all collections of this store.

LMDB layout (three named databases of the engine's environment; one key prefix per collection, never a
named database per collection; key encodings in :mod:`riverbed.engine.dockeys`)::

    collections  +-----+------------------+
                 | "N" | name (UTF-8)     |  ->  record, JSON {"cid": n, "key_field": f|null,
                 +-----+------------------+        "indexes": [[field, unique], ...]} (index no = position + 1)
                 +-----+------------------+
                 | "C" | cid u32 BE       |  ->  document count u64 BE
                 +-----+------------------+
                 | "M" | "next-cid"       |  ->  next collection id u32 BE (ids are never reused)
                 +-----+------------------+

    docs         +------------+----------------------------------+
                 | cid u32 BE | id key  0x10 | id + 2**63 u64 BE |  ->  the document, BSON
                 |            |         0x20 | UTF-8             |
                 +------------+----------------------------------+

    docidx       +------------+-------------+-----------+--------+
                 | cid u32 BE | index no u8 | value key | id key |  ->  empty
                 +------------+-------------+-----------+--------+
                   value key: 0x05 null | 0x10 number (F 8 B, n, E) | 0x20 string ... 00 00 | 0x30 bool

So a collection's documents are one contiguous key range in id order (ints numerically, then strings by
UTF-8 bytes), an index is one contiguous range in value order (null < numbers < strings < booleans,
ties in id order), and a lookup is one B-tree descent. A document whose indexed field is missing, NaN, or
of another type (document, list, binary, date, ...) has no entry in that index; a unique index refuses
two documents with equal values (1 and 1.0 are equal; null is a value; missing is not).

Transactions. Every write runs inside :meth:`Engine.transact` on the writer thread, so a write and its
index entries, the count and (with :meth:`DocStore.apply` or the ``stage_*`` functions inside a caller's
own transact function) a stream position commit atomically: after a crash a projection's documents and
its position agree exactly. A write that raises (UniqueViolation, InvalidArgument, a caller's function)
leaves nothing behind.

Thread safety. Reads (get, find, scan, count, explain, collection_info, list_collections) may run on any
thread, each in its own LMDB read transaction (``find`` sees one snapshot; ``scan`` one per batch).
Writes return ``concurrent.futures.Future`` objects completed on the writer thread after the commit;
from asyncio, ``await asyncio.wrap_future(f)``. Once a write's future is done, every read sees it. The
``stage_*`` functions run only inside a transact function, on the writer thread.
"""

import json
import threading
from collections import namedtuple
from collections.abc import Mapping

import bson
from bson.errors import InvalidBSON, InvalidDocument

from riverbed.engine import core, docquery
from riverbed.engine.dockeys import (
    INT_ID_MAX, INT_ID_MIN, MAX_STR_ID, check_name, id_from_key, id_key, is_truncated, read_u32, read_u64, u32,
    u64, value_key,
)
from riverbed.engine.errors import InvalidArgument, PositionMoved, RiverbedError, UniqueViolation
from riverbed.engine.predicate import (
    MISSING, TRUE, Always, Node, from_mongo, get_path, split_path,
)

__all__ = ["DocStore", "CollectionInfo", "MAX_INDEXES"]

MAX_INDEXES = 64
SCAN_BATCH = 1000             # documents per read transaction in scan()
_NEXT_CID = b"Mnext-cid"
_UNSET = object()
_decode = docquery.decode


def _get(doc, field):
    v = get_path(doc, split_path(field))
    return ... if v is MISSING else v


CollectionInfo = namedtuple("CollectionInfo", "name key_field indexes count")
CollectionInfo.__doc__ = """A collection as committed: ``indexes`` is a list of ``(field, unique)`` pairs in
index order, ``key_field`` the field holding each document's id (or None), ``count`` its documents."""


def _encode(doc):
    if not isinstance(doc, Mapping):
        raise InvalidArgument(f"a document must be a dict (a mapping), not {type(doc).__name__}")
    try:
        return bson.encode(doc)
    except (InvalidDocument, OverflowError, TypeError, ValueError) as e:
        raise InvalidArgument(f"cannot store the document as BSON: {e}") from None


def _as_node(predicate):
    if predicate is None:
        return TRUE
    if isinstance(predicate, Node):
        return predicate
    if isinstance(predicate, Mapping):
        return from_mongo(predicate)
    raise InvalidArgument(f"a predicate is a predicate node or a MongoDB matcher dict, not {type(predicate).__name__}")


def _valid_id(v):
    t = type(v)
    if t is int or (isinstance(v, int) and t is not bool):
        return INT_ID_MIN <= v <= INT_ID_MAX
    if t is str:
        return 0 < len(v.encode("utf-8", "surrogatepass")) <= MAX_STR_ID
    return False


def _norm_indexes(indexes):
    out = []
    seen = set()
    for spec in indexes or ():
        if isinstance(spec, str):
            field, unique = spec, False
        elif isinstance(spec, (tuple, list)) and len(spec) == 2:
            field, unique = spec
        else:
            raise InvalidArgument(f"an index is a field path or a (field, unique) pair, not {spec!r}")
        split_path(field)
        if field in seen:
            raise InvalidArgument(f"field {field!r} is indexed twice")
        seen.add(field)
        out.append((field, bool(unique)))
    if len(out) > MAX_INDEXES:
        raise InvalidArgument(f"at most {MAX_INDEXES} indexes per collection")
    return tuple(out)


# ------------------------------------------------------------------------------------------ metadata


class _Index:
    __slots__ = ("no", "field", "bparts", "unique", "prefix")

    def __init__(self, cid, no, field, unique):
        self.no = no
        self.field = field
        self.bparts = tuple(p.encode("utf-8", "surrogatepass") for p in split_path(field))
        self.unique = unique
        self.prefix = u32(cid) + bytes((no,))


class _Coll:
    """One collection's metadata; immutable for the collection's life (its cid is never reused)."""

    __slots__ = ("name", "cid", "key_field", "kf_bparts", "indexes", "by_field", "prefix", "count_key", "raw",
                 "ipaths", "paths", "spec", "has_unique", "ix_prefixes")

    def __init__(self, name, cid, key_field, indexes, raw):
        self.name = name
        self.cid = cid
        self.key_field = key_field
        self.indexes = tuple(_Index(cid, no + 1, f, u) for no, (f, u) in enumerate(indexes))
        self.by_field = {ix.field: ix for ix in self.indexes}
        self.prefix = u32(cid)
        self.count_key = b"C" + self.prefix
        self.raw = raw
        self.ipaths = tuple(ix.bparts for ix in self.indexes)
        self.kf_bparts = None
        if key_field is not None:
            self.kf_bparts = tuple(p.encode("utf-8", "surrogatepass") for p in split_path(key_field))
        self.paths = self.ipaths + ((self.kf_bparts,) if key_field is not None else ())
        self.spec = (key_field, tuple((ix.field, ix.unique) for ix in self.indexes))
        self.has_unique = any(ix.unique for ix in self.indexes)
        self.ix_prefixes = tuple(ix.prefix for ix in self.indexes)

    @staticmethod
    def encode(cid, key_field, indexes):
        return json.dumps({"cid": cid, "key_field": key_field, "indexes": [list(i) for i in indexes]},
                          separators=(",", ":")).encode()

    @classmethod
    def decode(cls, name, raw):
        rec = json.loads(bytes(raw))
        return cls(name, rec["cid"], rec.get("key_field"), [tuple(i) for i in rec.get("indexes", ())], bytes(raw))


class _Shared:
    """State shared by every DocStore of one engine: the committed collections (kept current by the
    writer's on-commit callbacks) and the writer's per-transaction state.

    It must be one per engine, not one per DocStore: a writable store answers reads from ``committed``
    alone, so a store that did not hear of another's create or drop would miss a collection, or read a
    dropped one's successor under its old id. It lives on the engine (``engine._doc_shared``, made by
    the first DocStore), beside the engine's own committed stream table, and dies with it."""

    def __init__(self, engine):
        self.lock = threading.Lock()
        self.committed = {}          # name -> _Coll; replaced whole (copy on write) by the writer
        self.wstate = None           # writer thread only
        if not engine.readonly and engine._db_collections is not None:
            with engine.read_txn() as txn:
                cur = txn.cursor(db=engine._db_collections)
                if cur.set_range(b"N"):
                    for k, v in cur:
                        k = bytes(k)
                        if not k.startswith(b"N"):
                            break
                        name = k[1:].decode("utf-8")
                        self.committed[name] = _Coll.decode(name, v)

    def publish(self, name, coll):
        with self.lock:
            d = dict(self.committed)
            if coll is None:
                d.pop(name, None)
            else:
                d[name] = coll
            self.committed = d


_SHARED_LOCK = threading.Lock()    # makes an engine's _Shared once when two threads open stores at once


class _TxnState:
    """The writer's view of one write transaction: collections as staged in it, a docidx cursor."""

    __slots__ = ("ctx", "txn", "colls", "_icur")

    def __init__(self, ctx):
        self.ctx = ctx
        self.txn = ctx.txn
        self.colls = {}
        self._icur = None

    def idx_cursor(self, db):
        if self._icur is None:
            self._icur = self.txn.cursor(db=db)
        return self._icur


# ---------------------------------------------------------------------------------------------- store


class DocStore:
    """Collections of documents in ``engine``'s environment. Whoever creates one owns it: in a server
    that is the broker (``broker.docs``, one per broker); ``riverbed dump`` and tests make their own.
    Every DocStore of one engine shares that engine's state (see ``_Shared``), so a second one on the
    same engine sees exactly what the first writes; stores of different engines share nothing.
    Read-only engines can read (and see what another process commits); their writes raise RiverbedError.

    Ids are ints (-2**63..2**63-1) or strs (1..255 bytes of UTF-8); collection names are 1..255 bytes of
    UTF-8; documents are dicts storable as BSON (pymongo's ``bson``; a RawBSONDocument is stored as is).
    Bad names, ids and documents raise InvalidArgument at once. Predicates are
    :mod:`riverbed.engine.predicate` nodes or MongoDB matcher dicts.

    Thread safety: every read method may run on any thread (its own read transaction). Every write
    method returns a ``concurrent.futures.Future`` completed on the writer thread after the commit (and
    the engine's fsync policy); errors come through it, except bad arguments, raised at once. The
    ``stage_*`` methods run only inside an ``engine.transact`` function, on the writer thread.
    """

    def __init__(self, engine):
        self.engine = engine
        self._db_docs = engine._db_docs
        self._db_idx = engine._db_docidx
        self._db_colls = engine._db_collections
        self._writable = not engine.readonly
        with _SHARED_LOCK:
            shared = engine._doc_shared
            if shared is None:
                shared = engine._doc_shared = _Shared(engine)
        self._shared = shared
        self._parsed = {}            # read-only engines: record bytes -> _Coll

    # ------------------------------------------------------------------------------------ metadata

    def _coll_r(self, txn, name):
        """The collection ``name`` for a reader (None when it does not exist)."""
        if self._writable and type(name) is str:
            c = self._shared.committed.get(name)
            if c is None:
                check_name(name)
            return c
        nb = check_name(name)
        if self._db_colls is None:
            return None
        raw = txn.get(b"N" + nb, db=self._db_colls)
        if raw is None:
            return None
        raw = bytes(raw)
        c = self._parsed.get((name, raw))
        if c is None:
            c = _Coll.decode(name, raw)
            if len(self._parsed) > 1000:
                self._parsed.clear()
            self._parsed[(name, raw)] = c
        return c

    def _count_in(self, txn, c):
        raw = txn.get(c.count_key, db=self._db_colls)
        return 0 if raw is None else read_u64(raw)

    def list_collections(self):
        """Names of all collections, sorted."""
        if self._writable:
            return sorted(self._shared.committed)
        if self._db_colls is None:
            return []
        out = []
        with self.engine.read_txn() as txn:
            cur = txn.cursor(db=self._db_colls)
            if cur.set_range(b"N"):
                for k in cur.iternext(values=False):
                    k = bytes(k)
                    if not k.startswith(b"N"):
                        break
                    out.append(k[1:].decode("utf-8"))
        return sorted(out)

    def collection_info(self, name):
        """A :class:`CollectionInfo` for ``name``, or None when there is no such collection."""
        with self.engine.read_txn() as txn:
            c = self._coll_r(txn, name)
            if c is None:
                return None
            return CollectionInfo(name, c.key_field, [(ix.field, ix.unique) for ix in c.indexes],
                                  self._count_in(txn, c))

    # --------------------------------------------------------------------------------------- reading

    def get(self, coll, doc_id):
        """The document ``doc_id`` of ``coll`` as a dict, or None (also when the collection does not
        exist). InvalidArgument for a bad name or id."""
        c = self._shared.committed.get(coll) if self._writable and type(coll) is str else None
        if c is not None:
            raw = self.engine.get_value(self._db_docs, c.prefix + id_key(doc_id))
            return None if raw is None else _decode(raw)
        k = id_key(doc_id)
        with self.engine.read_txn() as txn:
            c = self._coll_r(txn, coll)
            if c is None:
                return None
            raw = txn.get(c.prefix + k, db=self._db_docs)
            return None if raw is None else _decode(raw)

    def get_raw(self, coll, doc_id):
        """Document ``doc_id`` of ``coll`` as its stored BSON bytes (what the BSON shell sends as is), or
        None. Skips the decoding that dominates :meth:`get`."""
        c = self._shared.committed.get(coll) if self._writable and type(coll) is str else None
        k = id_key(doc_id)
        if c is not None:
            return self.engine.get_value(self._db_docs, c.prefix + k)
        with self.engine.read_txn() as txn:
            c = self._coll_r(txn, coll)
            if c is None:
                return None
            raw = txn.get(c.prefix + k, db=self._db_docs)
            return None if raw is None else bytes(raw)

    def get_many(self, coll, ids):
        """``[doc or None]`` for each of ``ids``, in one read transaction."""
        keys = [id_key(i) for i in ids]
        with self.engine.read_txn() as txn:
            c = self._coll_r(txn, coll)
            if c is None:
                return [None] * len(keys)
            get, db, p = txn.get, self._db_docs, c.prefix
            out = []
            for k in keys:
                raw = get(p + k, db=db)
                out.append(None if raw is None else _decode(raw))
            return out

    def scan(self, coll, start=None, limit=None, batch=SCAN_BATCH):
        """Iterate ``(id, doc)`` over ``coll`` in id order (ints numerically, then strings by UTF-8
        bytes), from id ``start`` (inclusive) on, at most ``limit`` of them. Reads ``batch`` documents per
        read transaction, so a long scan does not pin old pages; it is consistent within a batch only."""
        key = None if start is None else id_key(start)
        left = limit
        while left is None or left > 0:
            n = batch if left is None else min(batch, left)
            with self.engine.read_txn() as txn:
                c = self._coll_r(txn, coll)
                if c is None:
                    return
                rows = []
                cur = txn.cursor(db=self._db_docs)
                if not cur.set_range(c.prefix + (key or b"")):
                    return
                p = c.prefix
                for k, v in cur:
                    if k[:4] != p:
                        break
                    rows.append((bytes(k[4:]), _decode(v)))
                    if len(rows) >= n:
                        break
            for idk, doc in rows:
                yield id_from_key(idk), doc
            if len(rows) < n:
                return
            key = rows[-1][0] + b"\x00"
            if left is not None:
                left -= len(rows)

    def find(self, coll, predicate=None, limit=None, *, use_indexes=True):
        """The ``(id, doc)`` pairs of ``coll`` matching ``predicate`` (a node, a MongoDB matcher dict, or
        None for all), at most ``limit``. Uses an index when the planner finds one (see explain), in
        index order then; a full scan returns id order. ``use_indexes=False`` forces the scan (tests).
        One read transaction. InvalidArgument for a bad predicate or name."""
        node = _as_node(predicate)
        with self.engine.read_txn() as txn:
            c = self._coll_r(txn, coll)
            if c is None:
                return []
            plan = self._plan(c, node) if use_indexes else docquery.SCAN
            return [(id_from_key(k), d) for k, d in self._select(txn, c, node, plan, limit)]

    def find_one(self, coll, predicate=None):
        """The first ``(id, doc)`` :meth:`find` would return, or None."""
        r = self.find(coll, predicate, 1)
        return r[0] if r else None

    def count(self, coll, predicate=None):
        """How many documents of ``coll`` match ``predicate`` (all of them, from the stored count, when
        it is None)."""
        node = _as_node(predicate)
        with self.engine.read_txn() as txn:
            c = self._coll_r(txn, coll)
            if c is None:
                return 0
            if isinstance(node, Always):
                return self._count_in(txn, c)
            return sum(1 for _ in self._select(txn, c, node, self._plan(c, node), None, want_docs=False))

    def explain(self, coll, predicate=None):
        """How :meth:`find` would run ``predicate``: a dict with ``plan`` one of ``"index"`` (with
        ``index`` the field, ``unique``, ``ranges`` the number of key ranges read), ``"ids"`` (lookups by
        id through the key field; ``ids``), ``"union"`` (an Or of index/id plans; ``branches``),
        ``"empty"`` (nothing can match) or ``"scan"``. Every plan re-checks the whole predicate on each
        candidate document, so an index narrows the work, never the answer."""
        node = _as_node(predicate)
        with self.engine.read_txn() as txn:
            c = self._coll_r(txn, coll)
        if c is None:
            return {"plan": "empty", "collection": None}
        return self._plan(c, node).describe()

    def position(self, stream, reference):
        """The position stored with :meth:`apply` (or ``ctx.store_offset``) for ``reference`` on
        ``stream``, or None. StreamNotFound when the stream does not exist."""
        return self.engine.query_offset(stream, reference)

    # ----------------------------------------------------------------------------- planning, selecting

    def _plan(self, c, node):
        return docquery.plan(c, node)

    def _select(self, txn, c, node, plan, limit, want_docs=True):
        count = self._count_in(txn, c) if plan.kind == "scan" else 0
        return docquery.select(txn, self._db_docs, self._db_idx, count, c, node, plan, limit, want_docs)

    # -------------------------------------------------------------------------------------- checking

    def check_collection(self, name):
        """Problems found comparing ``name``'s documents, index entries and count (a list of strings;
        empty when they agree): every index entry must point at a document whose field has that value,
        every document's indexed values must be indexed, every key field must hold the id."""
        problems = []
        with self.engine.read_txn() as txn:
            c = self._coll_r(txn, name)
            if c is None:
                return [f"collection {name!r} does not exist"]
            expected = set()
            n = 0
            cur = txn.cursor(db=self._db_docs)
            if cur.set_range(c.prefix):
                for k, raw in cur:
                    if k[:4] != c.prefix:
                        break
                    n += 1
                    idk = bytes(k[4:])
                    try:
                        doc = _decode(raw)
                        vks = core.bson_index_keys(raw, c.ipaths)
                    except (ValueError, InvalidBSON) as e:
                        problems.append(f"document {id_from_key(idk)!r}: bad BSON ({e})")
                        continue
                    for ix, vk in zip(c.indexes, vks):
                        if vk != value_key(_get(doc, ix.field)):
                            problems.append(f"document {id_from_key(idk)!r}: raw and decoded values of "
                                            f"{ix.field!r} disagree")
                        if vk is not None:
                            expected.add(ix.prefix + vk + idk)
                    if c.key_field is not None:
                        kv = _get(doc, c.key_field)
                        if not _valid_id(kv) or id_key(kv) != idk:
                            problems.append(f"document {id_from_key(idk)!r}: key field holds {kv!r}")
            stored = self._count_in(txn, c)
            if stored != n:
                problems.append(f"count is {stored} but there are {n} documents")
            cur = txn.cursor(db=self._db_idx)
            if cur.set_range(c.prefix):
                for k in cur.iternext(values=False):
                    k = bytes(k)
                    if k[:4] != c.prefix:
                        break
                    if k in expected:
                        expected.discard(k)
                    else:
                        problems.append(f"stray index entry {k.hex()}")
            for k in sorted(expected):
                problems.append(f"missing index entry {k.hex()}")
        return problems

    def index_entries(self, txn, c, ix):
        """Number of entries of index ``ix`` of collection ``c`` (for dump)."""
        n = 0
        cur = txn.cursor(db=self._db_idx)
        if cur.set_range(ix.prefix):
            for k in cur.iternext(values=False):
                if k[:5] != ix.prefix:
                    break
                n += 1
        return n

    # --------------------------------------------------------------------------------------- writing

    def _state(self, ctx):
        st = self._shared.wstate
        if st is None or st.txn is not ctx.txn:
            st = self._shared.wstate = _TxnState(ctx)
        return st

    def _submit(self, fn):
        return self.engine.transact(lambda ctx: fn(self._state(ctx)))

    def create_collection(self, name, indexes=(), key_field=None):
        """Create collection ``name`` with ``indexes`` (field paths, or ``(field, unique)`` pairs; at most
        64) and an optional ``key_field``, the (dotted) field that holds each document's id: a document
        must then carry a valid id there, and ``put(name, None, doc)`` takes the id from it.

        Future of True when created, False when it exists with this very spec; InvalidArgument (through
        the future) when it exists with another, and at once for bad names or specs."""
        check_name(name)
        spec = _norm_indexes(indexes)
        if key_field is not None:
            split_path(key_field)
        return self._submit(lambda st: self._stage_create(st, name, spec, key_field))

    def drop_collection(self, name):
        """Remove ``name``: its documents, index entries, count and record, in one transaction. Future of
        True, or False when there was no such collection."""
        check_name(name)
        return self._submit(lambda st: self._stage_drop(st, name))

    def put(self, coll, doc_id, doc):
        """Store ``doc`` as document ``doc_id`` of ``coll`` (created when missing), replacing any old one
        and its index entries. ``doc_id`` None takes the id from the collection's key field. Future of the
        id; UniqueViolation or InvalidArgument through it (nothing written then)."""
        check_name(coll)
        if doc_id is not None:
            id_key(doc_id)
        raw = _encode(doc)
        return self._submit(lambda st: self._put_one(st, coll, doc_id, raw))

    def put_many(self, coll, items):
        """Store ``(id, doc)`` pairs in one transaction (later pairs win over earlier ones with the same
        id). Future of the number stored; any error refuses the whole batch."""
        check_name(coll)
        rows = []
        for doc_id, doc in items:
            if doc_id is not None:
                id_key(doc_id)
            rows.append((doc_id, _encode(doc)))
        return self._submit(lambda st: self._put_rows(st, coll, rows))

    def merge(self, coll, doc_id, doc):
        """Shallow-merge ``doc``'s fields into document ``doc_id`` (created when missing). Future of the
        merged document."""
        check_name(coll)
        id_key(doc_id)
        doc = dict(_check_mapping(doc))
        return self._submit(lambda st: self._merge(st, coll, doc_id, doc))

    def delete(self, coll, doc_id):
        """Delete document ``doc_id`` and its index entries. Future of True, or False if there was none."""
        check_name(coll)
        k = id_key(doc_id)
        return self._submit(lambda st: self._delete_one(st, coll, k))

    def delete_where(self, coll, predicate):
        """Delete every document matching ``predicate``. Future of the number deleted."""
        check_name(coll)
        node = _as_node(predicate)
        return self._submit(lambda st: self._delete_where(st, coll, node))

    def update_where(self, coll, predicate, fn):
        """Replace every document matching ``predicate`` by ``fn(old_doc)`` (a new dict; the id stays).
        ``fn`` runs on the writer thread and may run more than once for one call (a transaction can be
        redone), so it must be pure. Future of the number updated; if ``fn`` raises or a new document
        breaks a unique index, nothing is updated and the future raises that."""
        check_name(coll)
        node = _as_node(predicate)
        if not callable(fn):
            raise InvalidArgument("update_where needs a function old_doc -> new_doc")
        return self._submit(lambda st: self._update_where(st, coll, node, fn))

    def apply(self, ops, position=None, after=_UNSET):
        """Commit ``ops`` and a stream ``position`` in one transaction: a projection's exactly-once step.
        With ``after`` (an offset, or None for "none stored"), the step is refused whole with
        PositionMoved unless ``position``'s stored offset is ``after`` when it commits: of two runners of
        one projection, the one continuing from an older position changes nothing.

        ``ops`` is a list of ``("put", coll, id, doc)``, ``("merge", coll, id, doc)``, ``("delete", coll,
        id)``, ``("delete_where", coll, predicate)``, ``("update_where", coll, predicate, fn)``;
        ``position`` is ``(stream, reference, offset)``, stored as ``reference``'s offset on ``stream``
        (read it back with :meth:`position`). Future of the list of the ops' results; any error (also
        StreamNotFound for the position) refuses everything."""
        prepared = []
        for op in ops:
            if not isinstance(op, (tuple, list)) or not op:
                raise InvalidArgument(f"bad op {op!r}")
            kind, args = op[0], tuple(op[1:])
            if kind in ("put", "merge") and len(args) == 3:
                check_name(args[0])
                if args[1] is not None or kind == "merge":
                    id_key(args[1])
                data = _encode(args[2]) if kind == "put" else dict(_check_mapping(args[2]))
                prepared.append((kind, args[0], args[1], data))
            elif kind == "delete" and len(args) == 2:
                check_name(args[0])
                prepared.append((kind, args[0], id_key(args[1])))
            elif kind == "delete_where" and len(args) == 2:
                check_name(args[0])
                prepared.append((kind, args[0], _as_node(args[1])))
            elif kind == "update_where" and len(args) == 3 and callable(args[2]):
                check_name(args[0])
                prepared.append((kind, args[0], _as_node(args[1]), args[2]))
            else:
                raise InvalidArgument(f"bad op {op!r} (put/merge/delete/delete_where/update_where)")
        if position is not None:
            if not isinstance(position, (tuple, list)) or len(position) != 3:
                raise InvalidArgument("position is (stream, reference, offset)")
            stream, reference, offset = position
            offset = int(offset)
            if not 0 <= offset < (1 << 64):
                raise InvalidArgument(f"offset {offset} is outside 0..2**64-1")
            position = (stream, reference, offset)

        def run(st):
            out = []
            for op in prepared:
                kind = op[0]
                if kind == "put":
                    out.append(self._put_one(st, op[1], op[2], op[3]))
                elif kind == "merge":
                    out.append(self._merge(st, op[1], op[2], op[3]))
                elif kind == "delete":
                    out.append(self._delete_one(st, op[1], op[2]))
                elif kind == "delete_where":
                    out.append(self._delete_where(st, op[1], op[2]))
                else:
                    out.append(self._update_where(st, op[1], op[2], op[3]))
            if position is not None:
                if after is not _UNSET and st.ctx.query_offset(position[0], position[1]) != after:
                    raise PositionMoved(f"{position[1]!r} on {position[0]!r} is no longer at {after}")
                st.ctx.store_offset(*position)
            return out
        return self._submit(run)

    # ---------------------------------------------------------- staging (inside Engine.transact)

    def stage_put(self, ctx, coll, doc_id, doc):
        """Inside ``engine.transact(fn)``: stage a put (as :meth:`put`); returns the id."""
        check_name(coll)
        return self._put_one(self._state(ctx), coll, doc_id, _encode(doc))

    def stage_put_many(self, ctx, coll, items):
        """Inside a transact function: stage ``(id, doc)`` puts; returns how many."""
        check_name(coll)
        return self._put_rows(self._state(ctx), coll, [(i, _encode(d)) for i, d in items])

    def stage_merge(self, ctx, coll, doc_id, doc):
        """Inside a transact function: shallow-merge ``doc`` into document ``doc_id`` (created when
        missing); returns the merged document."""
        check_name(coll)
        return self._merge(self._state(ctx), coll, doc_id, dict(_check_mapping(doc)))

    def stage_delete(self, ctx, coll, doc_id):
        """Inside a transact function: stage a delete; returns whether the document existed."""
        check_name(coll)
        return self._delete_one(self._state(ctx), coll, id_key(doc_id))

    def stage_delete_where(self, ctx, coll, predicate):
        """Inside a transact function: delete the matching documents; returns how many."""
        check_name(coll)
        return self._delete_where(self._state(ctx), coll, _as_node(predicate))

    def stage_update_where(self, ctx, coll, predicate, fn):
        """Inside a transact function: as :meth:`update_where`; returns how many were updated."""
        check_name(coll)
        return self._update_where(self._state(ctx), coll, _as_node(predicate), fn)

    def stage_create_collection(self, ctx, name, indexes=(), key_field=None):
        """Inside a transact function: as :meth:`create_collection`; returns True when created."""
        check_name(name)
        if key_field is not None:
            split_path(key_field)
        return self._stage_create(self._state(ctx), name, _norm_indexes(indexes), key_field)

    def stage_drop_collection(self, ctx, name):
        """Inside a transact function: as :meth:`drop_collection`; returns whether it existed."""
        check_name(name)
        return self._stage_drop(self._state(ctx), name)

    def stage_get(self, ctx, coll, doc_id):
        """Inside a transact function: document ``doc_id`` as staged so far in this transaction, or None."""
        st = self._state(ctx)
        c = self._coll_w(st, coll, False)
        if c is None:
            return None
        raw = st.txn.get(c.prefix + id_key(doc_id), db=self._db_docs)
        return None if raw is None else _decode(raw)

    def stage_find(self, ctx, coll, predicate=None, limit=None):
        """Inside a transact function: :meth:`find` over the documents as staged so far."""
        st = self._state(ctx)
        c = self._coll_w(st, coll, False)
        if c is None:
            return []
        node = _as_node(predicate)
        return [(id_from_key(k), d) for k, d in self._select(st.txn, c, node, self._plan(c, node), limit)]

    # ------------------------------------------------------------------------ writer-thread internals

    def _coll_w(self, st, name, create):
        c = st.colls.get(name, _UNSET)
        if c is _UNSET:
            nb = check_name(name)
            raw = st.txn.get(b"N" + nb, db=self._db_colls)
            if raw is None:
                c = None
            else:
                raw = bytes(raw)
                cc = self._shared.committed.get(name)
                c = cc if cc is not None and cc.raw == raw else _Coll.decode(name, raw)
            st.colls[name] = c
        if c is None and create:
            c = self._create(st, name, (), None)
        return c

    def _create(self, st, name, indexes, key_field):
        txn = st.txn
        raw = txn.get(_NEXT_CID, db=self._db_colls)
        cid = 1 if raw is None else read_u32(raw)
        if cid > 0xFFFFFFFF - 1:
            raise RiverbedError("collection ids are exhausted")
        txn.put(_NEXT_CID, u32(cid + 1), db=self._db_colls)
        rec = _Coll.encode(cid, key_field, indexes)
        txn.put(b"N" + name.encode("utf-8"), rec, db=self._db_colls)
        c = _Coll(name, cid, key_field, indexes, rec)
        st.colls[name] = c
        shared = self._shared
        st.ctx.on_commit(lambda: shared.publish(name, c))
        return c

    def _stage_create(self, st, name, spec, key_field):
        c = self._coll_w(st, name, False)
        if c is not None:
            if c.spec == (key_field, spec):
                return False
            raise InvalidArgument(f"collection {name!r} exists with key field {c.key_field!r} and indexes "
                                  f"{list(c.spec[1])!r}")
        self._create(st, name, spec, key_field)
        return True

    def _stage_drop(self, st, name):
        c = self._coll_w(st, name, False)
        if c is None:
            return False
        txn = st.txn
        for db in (self._db_docs, self._db_idx):
            cur = txn.cursor(db=db)
            if cur.set_range(c.prefix):
                while cur.key()[:4] == c.prefix:
                    if not cur.delete():
                        break
        txn.delete(c.count_key, db=self._db_colls)
        txn.delete(b"N" + name.encode("utf-8"), db=self._db_colls)
        st.colls[name] = None
        shared = self._shared
        st.ctx.on_commit(lambda: shared.publish(name, None))
        return True

    def _bump(self, st, c, delta):
        if delta:
            txn = st.txn
            raw = txn.get(c.count_key, db=self._db_colls)
            n = (0 if raw is None else read_u64(raw)) + delta
            txn.put(c.count_key, u64(n), db=self._db_colls)

    def _put_one(self, st, coll, doc_id, raw):
        c = self._coll_w(st, coll, True)
        doc_id, added = self._put_raw(st, c, doc_id, raw)
        self._bump(st, c, added)
        return doc_id

    def _put_rows(self, st, coll, rows):
        c = self._coll_w(st, coll, True)
        added = 0
        put = self._put_raw
        for doc_id, raw in rows:
            added += put(st, c, doc_id, raw)[1]
        self._bump(st, c, added)
        return len(rows)

    def _put_raw(self, st, c, doc_id, raw):
        """Write one encoded document and its index entries; ``(id, 1 if new else 0)``."""
        txn = st.txn
        if c.kf_bparts is not None:
            kv = core.bson_values(raw, (c.kf_bparts,))[0]
            if not _valid_id(kv):
                raise InvalidArgument(f"collection {c.name!r}: the key field {c.key_field!r} must hold the "
                                      f"document's id (an int or a 1..255 byte str), not {kv!r}")
            if doc_id is None:
                doc_id = kv
            elif (type(doc_id) is str) != (type(kv) is str) or doc_id != kv:
                raise InvalidArgument(f"collection {c.name!r}: id {doc_id!r} differs from key field "
                                      f"{c.key_field!r} = {kv!r}")
        elif doc_id is None:
            raise InvalidArgument(f"collection {c.name!r} has no key field: a document id is required")
        idk = id_key(doc_id)
        key = c.prefix + idk
        db_docs = self._db_docs
        if not c.indexes:
            return doc_id, (1 if txn.replace(key, raw, db=db_docs) is None else 0)
        db_idx = self._db_idx
        news = core.bson_index_keys(raw, c.ipaths)
        # a unique violation below raises, and the transaction then keeps nothing of this function:
        # writing the document first is safe, and saves a lookup for a new id
        if txn.put(key, raw, db=db_docs, overwrite=False):
            if c.has_unique:
                for ix, nv in zip(c.indexes, news):
                    if ix.unique and nv is not None:
                        self._check_unique(st, c, ix, nv, idk, raw)
            put = txn.put
            for prefix, nv in zip(c.ix_prefixes, news):
                if nv is not None:
                    put(prefix + nv + idk, b"", db=db_idx)
            return doc_id, 1
        olds = core.bson_index_keys(txn.get(key, db=db_docs), c.ipaths)
        txn.put(key, raw, db=db_docs)
        if olds == news and not c.has_unique:
            return doc_id, 0
        for ix, nv, ov in zip(c.indexes, news, olds):
            if ix.unique and nv is not None and (nv != ov or is_truncated(nv)):
                self._check_unique(st, c, ix, nv, idk, raw)
        for ix, nv, ov in zip(c.indexes, news, olds):
            if nv != ov:
                if ov is not None:
                    txn.delete(ix.prefix + ov + idk, db=db_idx)
                if nv is not None:
                    txn.put(ix.prefix + nv + idk, b"", db=db_idx)
        return doc_id, 0

    def _check_unique(self, st, c, ix, vk, idk, raw):
        holder = self._unique_holder(st, c, ix, vk, idk, raw)
        if holder is not None:
            value = core.bson_values(raw, (ix.bparts,))[0]
            raise UniqueViolation(c.name, ix.field, value, id_from_key(holder))

    def _unique_holder(self, st, c, ix, vk, idk, raw):
        """Id key of another document holding the value (value key ``vk``) that document ``raw`` has in
        unique index ``ix``, or None. Long strings share keys: their stored values are compared."""
        cur = st.idx_cursor(self._db_idx)
        p = ix.prefix + vk
        if not cur.set_range(p):
            return None
        plen = len(p)
        value = core.bson_values(raw, (ix.bparts,))[0] if is_truncated(vk) else None
        while True:
            k = cur.key()
            if k[:plen] != p:
                return None
            other = bytes(k[plen:])
            if other != idk:
                if value is None:
                    return other
                raw2 = st.txn.get(c.prefix + other, db=self._db_docs)
                if raw2 is not None and core.bson_values(raw2, (ix.bparts,))[0] == value:
                    return other
            if not cur.next():
                return None

    def _delete_raw(self, st, c, idk):
        txn = st.txn
        key = c.prefix + idk
        if c.indexes:
            old = txn.get(key, db=self._db_docs)
            if old is None:
                return False
            for ix, vk in zip(c.indexes, core.bson_index_keys(old, c.ipaths)):
                if vk is not None:
                    txn.delete(ix.prefix + vk + idk, db=self._db_idx)
        return txn.delete(key, db=self._db_docs)

    def _delete_one(self, st, coll, idk):
        c = self._coll_w(st, coll, False)
        if c is None or not self._delete_raw(st, c, idk):
            return False
        self._bump(st, c, -1)
        return True

    def _matching(self, st, c, node):
        return list(self._select(st.txn, c, node, self._plan(c, node), None))

    def _delete_where(self, st, coll, node):
        c = self._coll_w(st, coll, False)
        if c is None:
            return 0
        n = 0
        for idk, _ in self._matching(st, c, node):
            n += self._delete_raw(st, c, idk)
        self._bump(st, c, -n)
        return n

    def _update_where(self, st, coll, node, fn):
        c = self._coll_w(st, coll, False)
        if c is None:
            return 0
        rows = self._matching(st, c, node)
        for idk, doc in rows:
            new = fn(doc)
            self._put_raw(st, c, id_from_key(idk), _encode(new))
        return len(rows)

    def _merge(self, st, coll, doc_id, fields):
        c = self._coll_w(st, coll, True)
        raw = st.txn.get(c.prefix + id_key(doc_id), db=self._db_docs)
        doc = {} if raw is None else _decode(raw)
        doc.update(fields)
        _, added = self._put_raw(st, c, doc_id, _encode(doc))
        self._bump(st, c, added)
        return doc


def _check_mapping(doc):
    if not isinstance(doc, Mapping):
        raise InvalidArgument(f"a document must be a dict (a mapping), not {type(doc).__name__}")
    return doc
