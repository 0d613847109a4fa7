"""Projections: server-side tails that turn a channel's events into a binder's documents, exactly once.

A projection ``{name, channel, binder, docID, matcher, mode}`` reads its channel from the first event
(or from its stored position) one chunk at a time. For each chunk it builds the document writes of the
events its matcher accepts (document id = the value at the dotted path ``docID``; ``replace`` stores the
event as the document, ``merge`` shallow-merges it into the existing one; no field is added) and commits
them together with its position (the offset after the chunk) in one engine transaction
(:meth:`DocStore.apply`); only then does it read the next chunk. After a crash or a restart it resumes
from the stored position, so no event is applied twice and none is skipped.

Storage of the definitions: documents of the reserved collection ``_riverbed_projections`` (id = the
projection's name), written before the projection starts; the position is a named offset
``mewbase-projection:<name>`` on the channel (the engine's consumer-offset table), so it lives and dies
with the channel. An event whose ``docID`` is missing or not a valid id (an int64 or a 1..255-byte
string) is skipped.

Loop-thread only; the document writes happen on the engine's writer thread.
"""

import logging

from riverbed.engine.errors import InvalidArgument, PositionMoved, RiverbedError, StreamNotFound
from riverbed.engine.predicate import MISSING, compile_predicate, from_mongo, get_path, split_path
from riverbed.engine.record import to_bson_document
from riverbed.shells.broker import MODE_CREDIT, Tail

log = logging.getLogger("riverbed.bson")

PROJECTIONS_COLLECTION = "_riverbed_projections"
RESERVED_PREFIX = "_riverbed"
POSITION_PREFIX = "mewbase-projection:"
MODES = ("merge", "replace")
MAX_NAME = 200


def valid_id(v):
    if isinstance(v, bool):
        return False
    if isinstance(v, int):
        return -(1 << 63) <= v < (1 << 63)
    if isinstance(v, str):
        return 0 < len(v.encode("utf-8", "surrogatepass")) <= 255
    return False


def normalize_definition(f):
    """The stored form of a CREATEPROJECTION frame (a dict), or InvalidArgument naming the bad field."""
    name, channel, binder, doc_id = f.get("name"), f.get("channel"), f.get("binder"), f.get("docID")
    for key, v in (("name", name), ("channel", channel), ("binder", binder), ("docID", doc_id)):
        if not isinstance(v, str) or not v:
            raise InvalidArgument(f"CREATEPROJECTION needs a non-empty string {key!r}")
    if len(name.encode("utf-8")) > MAX_NAME:
        raise InvalidArgument(f"projection name over {MAX_NAME} bytes")
    if binder.startswith(RESERVED_PREFIX):
        raise InvalidArgument(f"binder names starting with {RESERVED_PREFIX!r} are reserved")
    split_path(doc_id)
    matcher = f.get("matcher")
    if matcher is None:
        matcher = {}
    if not isinstance(matcher, dict):
        raise InvalidArgument("matcher must be a document")
    from_mongo(matcher)
    mode = f.get("mode") or "merge"
    if mode not in MODES:
        raise InvalidArgument(f"mode must be one of {MODES}, not {mode!r}")
    return {"name": name, "channel": channel, "binder": binder, "docID": doc_id, "matcher": matcher, "mode": mode}


class Projection:
    """One running projection (see the module docstring)."""

    def __init__(self, owner, definition):
        self.owner = owner
        self.definition = definition
        self.name = definition["name"]
        self.channel = definition["channel"]
        self.binder = definition["binder"]
        self.path = split_path(definition["docID"])
        self.match = compile_predicate(from_mongo(definition["matcher"]))
        self.replace = definition["mode"] == "replace"
        self.reference = POSITION_PREFIX + self.name
        self.tail = None
        self.applied = 0          # events applied since this process started (for tests and logs)
        self.at = None            # the stored position the next step continues from (None: none stored)

    def start(self, offset, stored=None):
        self.at = stored
        b = self.owner.broker
        self.tail = Tail(b, self.channel, offset, self._on_records, defer=b.post, on_gone=self._gone,
                         mode=MODE_CREDIT, credit=1, records=True)
        self.tail.start()

    def stop(self):
        if self.tail is not None:
            self.tail.close()

    def _gone(self, exc):
        log.warning("projection %r stopped: channel %r: %s", self.name, self.channel, exc)
        self.owner.running.pop(self.name, None)

    def _ops(self, batch):
        ops = []
        for _offset, _ts, view in batch.records():
            doc = to_bson_document(view)
            try:
                if not self.match(doc):
                    continue
            except Exception:  # noqa: BLE001 - a matcher must never stop the projection
                continue
            doc_id = get_path(doc, self.path)
            if doc_id is MISSING or not valid_id(doc_id):
                continue
            ops.append(("put" if self.replace else "merge", self.binder, doc_id, doc))
        return ops, batch.next_offset

    def _on_records(self, tail, batch):
        ops, next_pos = self._ops(batch)
        self._commit(ops, next_pos)
        return 1          # one chunk of credit: the next is read once this one has committed

    def _commit(self, ops, next_pos):
        docs, b = self.owner.docs, self.owner.broker
        try:
            fut = docs.apply(ops, position=(self.channel, self.reference, next_pos), after=self.at)
        except RiverbedError as e:
            self._one_by_one(ops, next_pos, e)
            return

        def done(res, exc):
            if exc is None:
                self.applied += len(ops)
                self.at = next_pos
                if not self.tail.closed:
                    self.tail.grant(1)
            elif isinstance(exc, StreamNotFound):
                self._gone(exc)
            elif isinstance(exc, PositionMoved):
                # another node ran this projection meanwhile (its channel's leadership moved): go on
                # from the position it stored, never from ours
                log.info("projection %r: %s; resuming from the stored position", self.name, exc)
                self.owner.restart(self)
            else:
                self._one_by_one(ops, next_pos, exc)
        b.then(fut, done)

    def _one_by_one(self, ops, next_pos, exc):
        # A write the store refuses (a unique index of a REAM binder, a document BSON cannot hold) must
        # not stop the projection: apply the others one at a time, each with the position it implies,
        # skipping the ones refused (logged).
        log.warning("projection %r: a write was refused (%s); applying the chunk's events one by one",
                    self.name, exc)
        docs, b = self.owner.docs, self.owner.broker
        pending = list(ops)

        def step(res=None, err=None):
            if err is not None:
                if isinstance(err, StreamNotFound):
                    self._gone(err)
                    return
                log.warning("projection %r: skipped an event: %s", self.name, err)
            if not pending:
                try:
                    fut = docs.apply([], position=(self.channel, self.reference, next_pos))
                except RiverbedError as e:
                    self._gone(e)
                    return
                b.then(fut, lambda r, e: self._gone(e) if e else (not self.tail.closed and self.tail.grant(1)))
                return
            op = pending.pop(0)
            try:
                fut = docs.apply([op])
            except RiverbedError as e:
                step(None, e)
                return
            b.then(fut, step)
        step()


class Projections:
    """The projections of a server process: their definitions (stored) and their tails (running)."""

    def __init__(self, broker, docs):
        self.broker = broker
        self.docs = docs
        self.running = {}

    def runs_here(self, channel):
        """Whether a projection over ``channel`` runs on this node: always on a lone node; on a cluster
        only on the node leading the channel, once it has applied the document changelog
        (shells/cluster/docs.py: once per cluster)."""
        gate = getattr(self.broker, "transactions", None)
        return gate is None or gate.runs_projection(channel)

    def follow_cluster(self):
        """On a cluster, start and stop the projections as their channels' leadership comes and goes
        (:meth:`sync` whenever the changelog says something changed); else start them now."""
        gate = getattr(self.broker, "transactions", None)
        if gate is None:
            self.load()
        else:
            gate.on_projections(lambda _on: self.sync(), PROJECTIONS_COLLECTION)

    def sync(self):
        """Stop the projections whose channel is no longer led here, start those that now are."""
        for p in list(self.running.values()):
            if not self.runs_here(p.channel):
                p.stop()
                self.running.pop(p.name, None)
        self.load()

    def restart(self, p):
        """Start ``p`` again from its stored position (another runner moved it)."""
        p.stop()
        if self.running.get(p.name) is p:
            del self.running[p.name]
        self._start(p.definition)

    def load(self):
        """Start every stored projection from its stored position (after a restart)."""
        for name, d in self.docs.scan(PROJECTIONS_COLLECTION):
            try:
                self._start(normalize_definition(d))
            except (RiverbedError, KeyError, TypeError) as e:
                log.error("projection %r cannot start: %s", name, e)

    def stored(self, name):
        return self.docs.get(PROJECTIONS_COLLECTION, name)

    def _start(self, d):
        if d["name"] in self.running or not self.runs_here(d["channel"]):
            return
        if not self.broker.has_stream(d["channel"]):
            log.warning("projection %r waits for no one: channel %r does not exist", d["name"], d["channel"])
            return
        p = Projection(self, d)
        pos = self.docs.position(p.channel, p.reference)
        self.running[p.name] = p
        p.start(pos or 0, pos)
        log.info("projection %r on %r -> %r from position %d", p.name, p.channel, p.binder, pos or 0)

    def create(self, d, cb):
        """Store definition ``d`` (normalized) and start it; ``cb(exc)``. The same definition again is
        fine; another one under the same name is InvalidArgument."""
        old = self.stored(d["name"])
        if old is not None:
            if normalize_definition(old) != d:
                cb(InvalidArgument(f"projection {d['name']!r} exists with another definition"))
                return
            if d["name"] not in self.running:
                self._start(d)
            cb(None)
            return

        def stored(res, exc):
            if exc is None:
                try:
                    self._start(d)
                except RiverbedError as e:
                    exc = e
            cb(exc)
        docs = self.docs

        def define(ctx):
            # checked again in the write's own transaction: of two CREATEPROJECTIONs of one name racing
            # (on two nodes of a cluster, say), the first stored wins and the other is refused
            old = docs.stage_get(ctx, PROJECTIONS_COLLECTION, d["name"])
            if old is not None:
                if normalize_definition(old) != d:
                    raise InvalidArgument(f"projection {d['name']!r} exists with another definition")
                return False
            docs.stage_put(ctx, PROJECTIONS_COLLECTION, d["name"], d)
            return True
        try:
            if self.docs.collection_info(d["binder"]) is None:
                # the binder exists (empty) from now on; the writer commits this before the definition
                self.broker.then(self.docs.create_collection(d["binder"]), lambda res, exc: None)
        except RiverbedError as e:
            cb(e)
            return
        self.broker.transact(define, stored)

    def stop_all(self):
        for p in list(self.running.values()):
            p.stop()
        self.running.clear()
