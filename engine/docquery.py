"""Query planning and evaluation for the document store (:mod:`riverbed.engine.docstore`).

A plan says where the candidate documents of a predicate come from::

    empty   nothing can match (an empty In, contradictory ranges on one field, an impossible key value)
    ids     point lookups by id: Eq/In on the collection's key field
    index   key ranges of one index: Eq (a point), In (one point per value), Lt/Le/Gt/Ge (a range up to
            the end of the literal's type), and inside an And, the intersection of the ranges of all the
            conjuncts on one indexed field
    union   an Or whose every branch has one of the plans above (candidates deduplicated)
    scan    every document of the collection, in id order

Inside an And the cheapest conjunct wins (score: ids 0, unique Eq 0.5, Eq 1, In 2, intersected range
2.5, one-sided range 4, union 5); the other conjuncts are filtered. Whatever the plan, every candidate
is checked against the whole predicate: first by the raw-BSON matcher (:class:`core.DocMatcher`,
without decoding), then, when that says "unknown", by the Python evaluator on the decoded document. So an
index narrows the work, never the answer, and long strings sharing a truncated key are harmless.
"""

from itertools import islice

from riverbed.engine import core
from riverbed.engine.dockeys import BRACKETS, HIGH, id_key, is_truncated, value_key, value_key_len
from riverbed.engine.predicate import (
    And, Always, Eq, Ge, Gt, In, Le, Lt, Or, compile_predicate, conjuncts, raw_program,
)

try:
    from bson import DEFAULT_CODEC_OPTIONS as _OPTS
    from bson._cbson import _bson_to_dict as _c_decode

    def decode(raw):
        """bson.decode of a bytes-like BSON document (the C decoder, called directly)."""
        return _c_decode(raw, _OPTS)
except ImportError:  # pragma: no cover - pymongo without its C extension
    from bson import decode  # noqa: F401


def as_id(v):
    """The id a key-field literal stands for (an integral float gives its int), or None when no valid
    id equals it."""
    if isinstance(v, float) and v.is_integer() and -(1 << 63) <= v < (1 << 63):
        v = int(v)
    if isinstance(v, (int, str)) and not isinstance(v, bool):
        try:
            id_key(v)
        except Exception:  # noqa: BLE001 - InvalidArgument: not an id
            return None
        return v
    return None


class Plan:
    """A query plan (see the module docstring); ``describe()`` is what DocStore.explain returns."""

    __slots__ = ("kind", "index", "ranges", "ids", "subs", "score")

    def __init__(self, kind, score, index=None, ranges=(), ids=(), subs=()):
        self.kind = kind          # "scan" | "index" | "ids" | "empty" | "union"
        self.score = score        # lower is better
        self.index = index
        self.ranges = ranges      # [(lo, hi)] value-key bounds, lo inclusive, hi exclusive
        self.ids = ids            # id keys
        self.subs = subs          # union: the plans of the Or's branches

    def describe(self):
        if self.kind == "index":
            return {"plan": "index", "index": self.index.field, "unique": self.index.unique,
                    "ranges": len(self.ranges)}
        if self.kind == "ids":
            return {"plan": "ids", "ids": len(self.ids)}
        if self.kind == "union":
            return {"plan": "union", "branches": [s.describe() for s in self.subs]}
        return {"plan": self.kind}


SCAN = Plan("scan", 100)
EMPTY = Plan("empty", -1)


def plan(c, node):
    """The plan for ``node`` over collection ``c`` (a scan when no index helps)."""
    p = _plan_node(c, node)
    return SCAN if p is None else p


def _plan_node(c, node):
    t = type(node)
    if t is And or t is Always:
        cs = conjuncts(node)
        best = None
        bounds = {}                  # field -> [lo, hi] intersected over its range conjuncts
        for ch in cs:
            p = _plan_node(c, ch)
            if p is not None and (best is None or p.score < best.score):
                best = p
            if type(ch) in (Eq, Lt, Le, Gt, Ge) and ch.path in c.by_field:
                r = _range(ch)
                if r is not None:
                    b = bounds.setdefault(ch.path, [r[0], r[1], 0])
                    b[0], b[1], b[2] = max(b[0], r[0]), min(b[1], r[1]), b[2] + 1
        for field, (lo, hi, n) in bounds.items():
            if n < 2:
                continue
            if lo >= hi:
                return EMPTY
            if best is None or best.score > 2.5:
                best = Plan("index", 2.5, c.by_field[field], [(lo, hi)])
        return best
    if t is Or:
        subs = [_plan_node(c, ch) for ch in node.children]
        if any(s is None for s in subs):
            return None
        subs = [s for s in subs if s.kind != "empty"]
        if not subs:
            return EMPTY
        if len(subs) == 1:
            return subs[0]
        return Plan("union", 5 + max(s.score for s in subs) / 100, subs=subs)
    if t is Eq or t is In:
        values = (node.value,) if t is Eq else node.values
        if not values:
            return EMPTY
        if node.path == c.key_field:
            ids = [as_id(v) for v in values]
            keys = sorted({id_key(i) for i in ids if i is not None})
            return Plan("ids", 0, ids=keys) if keys else EMPTY
        ix = c.by_field.get(node.path)
        if ix is None:
            return None
        vks = [value_key(v) for v in values]
        if any(vk is None for vk in vks):
            return None
        ranges = sorted({(vk, vk + HIGH) for vk in vks})
        if t is Eq:
            return Plan("index", 0.5 if ix.unique else 1, ix, ranges)
        return Plan("index", 2 + len(ranges) / 1000, ix, ranges)
    if t in (Lt, Le, Gt, Ge):
        ix = c.by_field.get(node.path)
        r = _range(node) if ix is not None else None
        return None if r is None else Plan("index", 4, ix, [r])
    return None


def _range(node):
    """[lo, hi) value-key bounds holding every match of an Eq/Lt/Le/Gt/Ge node, or None."""
    vk = value_key(node.value)
    if vk is None:
        return None
    start, stop = BRACKETS[vk[0]]
    t = type(node)
    if t is Eq:
        return (vk, vk + HIGH)
    if t is Gt or t is Ge:
        return (vk, stop)
    return (start, vk + HIGH)


# ---------------------------------------------------------------------------------------- selecting


def candidates(txn, db_idx, c, plan):
    """Id keys of the documents a non-scan plan may match (no duplicates)."""
    if plan.kind == "ids":
        yield from plan.ids
        return
    if plan.kind == "union":
        seen = set()
        for s in plan.subs:
            for k in candidates(txn, db_idx, c, s):
                if k not in seen:
                    seen.add(k)
                    yield k
        return
    if plan.kind != "index":
        return
    cur = txn.cursor(db=db_idx)
    p = plan.index.prefix
    plen = len(p)
    for lo, hi in plan.ranges:
        start, stop = p + lo, p + hi
        fixed = plen + len(lo) if hi == lo + HIGH and not is_truncated(lo) else None
        if not cur.set_range(start):
            return
        while True:
            k = bytes(cur.key())
            if k >= stop:
                break
            yield k[fixed:] if fixed is not None else k[plen + value_key_len(k, plen):]
            if not cur.next():
                return


def select(txn, db_docs, db_idx, count, c, node, plan, limit, want_docs=True):
    """Yield ``(id key, doc)`` of the documents of ``c`` matching ``node``, following ``plan``, at most
    ``limit`` (doc None when ``want_docs`` is false and the raw matcher decided alone); ``count`` is the
    collection's document count in ``txn`` (used by a scan)."""
    if plan.kind == "empty" or limit is not None and limit <= 0:
        return
    m = None if isinstance(node, Always) else core.DocMatcher(raw_program(node))
    pyfn = None
    n = 0
    db = db_docs
    if plan.kind == "scan":
        total = count
        cur = txn.cursor(db=db)
        if not total or not cur.set_range(c.prefix):
            return
        rows = islice(cur.iternext(), total)
    else:
        get, p = txn.get, c.prefix
        rows = ((k, get(p + k, db=db)) for k in candidates(txn, db_idx, c, plan))
    match = m.match if m is not None else None
    scan = plan.kind == "scan"
    for k, raw in rows:
        if raw is None:
            continue
        r = match(raw) if match is not None else 1
        if not r:
            continue
        doc = None
        if r < 0:
            doc = decode(raw)
            if pyfn is None:
                pyfn = compile_predicate(node)
            if not pyfn(doc):
                continue
        elif want_docs:
            doc = decode(raw)
        yield (bytes(k[4:]) if scan else k), doc
        n += 1
        if limit is not None and n >= limit:
            return
