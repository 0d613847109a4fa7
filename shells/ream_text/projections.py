"""REAM projections: collections of the engine's document store keyed by their first unique field.

``PROJECTION CREATE users 3 +name +email *city salary`` makes collection ``users`` with
``key_field="name"``, unique indexes on ``name`` and ``email`` and a secondary index on ``city``; the
declared fields (all four, in order, with their marks) are kept in the schema collection
``_ream_projections`` (document id = the projection name), written in the same transaction, because
the store itself records only indexes. Every declared field is required in a SET.

SELECT, UPDATE and DELETE compile their expression to the predicate tree (:mod:`.expr`), so the store's
planner reads the ``+``/``*`` indexes. Reads of possibly many rows (SELECT) run through ``offload``
(a worker thread in the server); writes are broker transactions (``transact``).
Every operation answers ``cb(result, exc)`` on the loop thread; ReamError/ExprError/RiverbedError
reasons go to the client. Loop-thread only.
"""

from riverbed.engine import predicate as P
from riverbed.engine.errors import InvalidArgument, UniqueViolation
from riverbed.shells.ream_text.aggregates import SCHEMA_COLLECTION
from riverbed.shells.ream_text.codec import FIELD_RE, ReamError

NOT_FOUND = "Not found"
MISSING_FIELDS = "Missing required fields"


class NotFound(ReamError):
    def __init__(self):
        super().__init__(NOT_FOUND)


def parse_fields(count_word, words):
    """``<n> <field>...`` of PROJECTION CREATE -> list of (mark, field), mark one of "+", "*", "".

    The field list defines the projection; ``<n>`` must be a whole number but is taken as given, not
    checked against the list (the protocol document's own example declares 6 for 7 fields).
    ReamError for a count that is not a number, a bad or repeated field name, or no unique (``+``) field."""
    if count_word is None or not count_word.isdigit():
        raise ReamError(f"Invalid field count {count_word!r}")
    out = []
    seen = set()
    for w in words:
        mark = w[0] if w[:1] in ("+", "*") else ""
        field = w[len(mark):]
        if not FIELD_RE.match(field):
            raise ReamError(f"Invalid field name {field!r}")
        if field in seen:
            raise ReamError(f"Field {field!r} declared twice")
        seen.add(field)
        out.append((mark, field))
    if not any(m == "+" for m, _ in out):
        raise ReamError("A projection needs a unique (+) field: the first one is its key")
    return out


class Projections:
    """Projection operations over ``docs`` (the broker's DocStore). ``transact(stage, cb)`` is
    ``broker.transact``;
    ``offload(fn, cb)`` runs ``fn()`` off the loop and ``cb(result, exc)`` on it.

    A projection exists when its schema document does (written in one transaction with the collection),
    and every write checks that inside its own engine transaction, so writes pipelined behind a CREATE or
    a DROP see it, and a concurrent DROP cannot leave a half-made collection behind."""

    def __init__(self, docs, transact, offload):
        self.docs = docs
        self.transact = transact
        self.offload = offload

    # ------------------------------------------------------------------------------------ schema

    def schema(self, name):
        """The declared fields (with their marks) of projection ``name`` as committed, or None."""
        doc = self.docs.get(SCHEMA_COLLECTION, name)
        return doc.get("fields") if doc else None

    def _staged_schema(self, ctx, name):
        doc = self.docs.stage_get(ctx, SCHEMA_COLLECTION, name)
        if doc is None or not isinstance(doc.get("fields"), list):
            raise NotFound()
        return doc["fields"]

    def _submit(self, fn, cb):
        self.transact(fn, cb)

    def create(self, name, fields, cb):
        """Create projection ``name`` from ``parse_fields`` output; ``cb(created, exc)``; the same spec
        again is fine (created False); another spec, or an aggregate of that name, is an error."""
        indexes = [(f, True) for m, f in fields if m == "+"] + [(f, False) for m, f in fields if m == "*"]
        key = next(f for m, f in fields if m == "+")
        specs = [m + f for m, f in fields]
        docs = self.docs

        def run(ctx):
            old = docs.stage_get(ctx, SCHEMA_COLLECTION, name)
            if old is not None:
                if old.get("fields") != specs:
                    raise ReamError(f"{name} exists with another definition")
                return False
            if docs.stage_find(ctx, name, None, 1):
                raise ReamError(f"{name} is an aggregate")
            try:
                docs.stage_drop_collection(ctx, name)      # an empty collection of that name: replace it
                docs.stage_create_collection(ctx, name, indexes, key_field=key)
            except InvalidArgument as e:
                raise ReamError(str(e)) from None
            docs.stage_put(ctx, SCHEMA_COLLECTION, name, {"fields": specs})
            return True
        self._submit(run, cb)

    def drop(self, name, cb):
        """Drop projection ``name`` and its schema (fine when missing); ``cb(existed, exc)``."""
        docs = self.docs

        def run(ctx):
            if docs.stage_get(ctx, SCHEMA_COLLECTION, name) is None:
                if docs.stage_find(ctx, name, None, 1):
                    raise ReamError(f"{name} is an aggregate, not a projection")
                return False
            docs.stage_drop_collection(ctx, name)
            docs.stage_delete(ctx, SCHEMA_COLLECTION, name)
            return True
        self._submit(run, cb)

    # ------------------------------------------------------------------------------------- rows

    def set(self, name, row, cb):
        """Store ``row`` (a dict holding every declared field); a row with the same key is replaced.
        ``cb(pk, exc)``: NotFound, ReamError (missing fields), UniqueViolation, InvalidArgument."""
        docs = self.docs

        def run(ctx):
            fields = self._staged_schema(ctx, name)
            if any(f.lstrip("+*") not in row for f in fields):
                raise ReamError(MISSING_FIELDS)
            return docs.stage_put(ctx, name, None, row)
        self._submit(run, cb)

    def select(self, name, pred, cb):
        """``cb([row, ...], exc)``: the rows matching ``pred`` (a predicate node), off the loop."""
        docs = self.docs

        def run():
            if self.schema(name) is None:
                raise NotFound()
            return [d for _, d in docs.find(name, pred)]
        self.offload(run, cb)

    def delete(self, name, pred, cb):
        """Delete the matching rows; ``cb(n, exc)``."""
        docs = self.docs

        def run(ctx):
            self._staged_schema(ctx, name)
            return docs.stage_delete_where(ctx, name, pred)
        self._submit(run, cb)

    def update(self, name, pred, spec, cb):
        """Replace each matching row by ``spec.apply(row)`` in one transaction; ``cb(n_matched, exc)``.
        A new key value moves the row (refused when another row holds it); unique indexes hold; any
        error (a type error in an expression, a unique conflict) updates nothing."""
        docs = self.docs

        def run(ctx):
            fields = self._staged_schema(ctx, name)
            key = next(f[1:] for f in fields if f.startswith("+"))
            rows = docs.stage_find(ctx, name, pred)
            moved = []
            for doc_id, old in rows:
                new = spec.apply(old)
                pk = new.get(key, P.MISSING)
                if pk is not P.MISSING and type(pk) is type(doc_id) and pk == doc_id:
                    docs.stage_put(ctx, name, doc_id, new)
                else:
                    docs.stage_delete(ctx, name, doc_id)
                    moved.append(new)
            for new in moved:
                pk = new.get(key)
                if isinstance(pk, (int, str)) and not isinstance(pk, bool) and \
                        docs.stage_get(ctx, name, pk) is not None:
                    raise UniqueViolation(name, key, pk, pk)
                docs.stage_put(ctx, name, None, new)
            return len(rows)
        self._submit(run, cb)
