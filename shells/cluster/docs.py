"""The document store on a cluster: one replicated changelog, applied in log order on every node.

The promise (issue 25): **a document write acknowledged on any node is readable on every node, and
survives the loss of any one node of three.** Without ``--etcd`` none of this is imported: the broker's
``docs`` is the plain :class:`~riverbed.engine.docstore.DocStore` and ``Broker.transact`` goes straight
to the engine, as before.

How (the design this module implements):

* **One changelog stream**, :data:`CHANGELOG`, replicated like any stream (its leader appends, a majority
  holds a record before it is confirmed, readers on every node stop at the committed offset). One stream
  for the whole store, not one per collection: a REAM projection's CREATE writes its schema and its
  collection together, a mewbase projection its binder and its position, and one log gives every
  write, unique keys included, one order that every node agrees on.
* **Every node applies the committed changelog in log order** to its own DocStore (indexes are built
  locally by the store), in engine transactions that also keep this node's applied position
  (collection :data:`STATE_COLLECTION`, never logged). The leader applies exactly as the others do: no
  node's documents ever hold a write that is not committed, so a failover never has to undo one.
* **A write is planned, logged, then applied.** The shell's staging function (REAM aggregates and
  projections, a mewbase projection step, CREATEBINDER, ...) runs on this node against its applied
  state, inside an engine transaction that records what it did and is then rolled back: the record
  holds the writes as after-images (document bytes put, ids deleted, collections created or dropped,
  projection positions) and the version (changelog offset + 1 of the last record that wrote it) of
  every collection the function read or wrote. The record is appended to the changelog through the
  broker's append API, so a node that does not lead the changelog forwards it to the leader
  (shells/cluster/forward.py); a record whose leader went away unanswered is sent again (a second copy
  changes nothing: its versions no longer match). The write is acknowledged once
  the record is committed and this node has applied it, so the writer reads its own write at once.
* **Conflicts are decided once, by the log's order.** Applying a record first compares its versions
  with the node's: the same on every node, since every node applied the same records before it. A
  record planned against an older state (another write to one of its collections came first) changes
  nothing anywhere, and its writer plans again against the newer state (at most :data:`MAX_RETRIES`
  times). So of two nodes racing for one unique key, the first record in the log wins on every node and
  the other writer, planning again, meets the unique index and gets the protocol's own refusal (REAM
  ``PROJECTION NON SET``, a BSON RESPONSE with an errCode).
* **Projections over a stream** (mewbase CREATEPROJECTION) run once per cluster, on the node that leads
  their channel (:meth:`DocLog.runs_projection`; it reads the channel from its own log, committed
  records only), and write through the changelog like any writer. They start there once that node has
  applied the committed changelog, from the positions the changelog carried (a projection's position
  and its documents are one record), stop on every other node, and move with the channel's leadership.
  Two runners for a moment (the old leader's last step still in flight) change nothing twice: each step
  is refused (PositionMoved) unless the stored position is still the one it continues from, and of two
  steps planned against one state the second in the log conflicts and is planned again, so refused.
* **Compaction** (compaction.py): the changelog's leader appends a snapshot of the applied documents
  every ``--docs-snapshot-every`` records; once one is whole and committed, every node drops the head
  of its copy before it, and a node whose copy starts after its applied position loads it.
* **Read your writes.** A write is answered once this node has applied it, so the connection that
  wrote it (one connection is one node) reads it on its next request. Another node answers from what
  it has applied: usually within milliseconds on loopback, but a read there does not wait for the
  writer's position (a client wanting that reads through the node it wrote through).

Transactions of events (``broker.transact`` with ``ctx.append``: BSON COMMITTX over several channels) are
not documents: they commit here, on a node that leads every stream they append to (else NotLeader, and
nothing is stored), and are acknowledged once a majority of each stream's members holds them
(``ClusterNode.hold``). The events of one channel in one transaction are one chunk when they fit in one,
so all or nothing of them survives a failover.

Limits: a node's document
writes take turns (each is planned once the one before it is applied here: one replication round trip
each); a version is per collection, so concurrent writes to one collection from several nodes plan
again (slower under contention, never wrong); planning rolls an engine transaction back, which redoes
the group commit it was in.

Loop thread only, except the staging and applying functions, which run on the engine's writer thread.
"""

import asyncio
import collections
import itertools
import logging
import os
import threading

import bson

from riverbed.engine.docstore import DocStore
from riverbed.engine.dockeys import id_from_key, id_key
from riverbed.engine.errors import InvalidArgument, RiverbedError, StreamExists, StreamNotFound
from riverbed.shells.cluster import compaction as _compaction
from riverbed.shells.cluster.node import NotLeader, ReplicationTimeout

log = logging.getLogger("riverbed.cluster.docs")

CHANGELOG = "__riverbed_docs"               # the replicated changelog stream of the whole document store
CHANGELOG_ARGS = {"queue-leader-locator": "client-local"}
STATE_COLLECTION = "_riverbed_changelog"    # this node's apply position: {"next": offset}; never logged
VERSIONS_COLLECTION = "_riverbed_versions"  # collection name -> {"v": changelog offset + 1 of its last write}
APPLIED_ID = "applied"
RECORD_VERSION = 1
MAX_RETRIES = 50          # plans of one write, each against a newer state, before it is refused
APPLY_BATCH = 64          # changelog chunks read per apply transaction
POLL = 0.2                # seconds before the changelog is looked at again when it went away under a watch
# seconds between two looks at the changelog when nothing woke the loop: a committed record, the changelog's
# creation and a change of the streams this node leads wake it at once; the fallback look rides on the node's
# lease renewals (TTL/3 apart: ClusterNode.beat_hooks), this timer only backs them up
POLL_FALLBACK = 5.0
RETRY_DELAY = 0.2         # seconds before a changelog record whose leader went away is sent again
try:   # a forwarded append its leader did not confirm (shells/cluster/forward.py): stored or not
    from riverbed.shells.broker.core import NotLeaderError as _ForwardNotLeader
except ImportError:
    _ForwardNotLeader = NotLeader
RETRY_ERRORS = (NotLeader, ReplicationTimeout, _ForwardNotLeader)

OP_CREATE, OP_DROP, OP_PUT, OP_DELETE, OP_OFFSET = "create", "drop", "put", "del", "offset"
OUT_OK, OUT_CONFLICT = "ok", "conflict"
_LOCAL = (STATE_COLLECTION, VERSIONS_COLLECTION)


class WriteConflict(RiverbedError):
    """A document write kept meeting newer writes to its collections: planned MAX_RETRIES times."""


class _Planned(RiverbedError):
    """Raised at the end of a planning transaction so that the engine keeps nothing of it."""

    def __init__(self, result, rec):
        super().__init__("planned")
        self.result = result
        self.rec = rec


class _Write:
    """One document transaction of this node: its staging function, callback and plans so far."""

    __slots__ = ("stage", "cb", "attempts")

    def __init__(self, stage, cb):
        self.stage = stage
        self.cb = cb
        self.attempts = 0


class _Recording:
    """What one staging function did: document writes (after-images), collections touched, appends."""

    __slots__ = ("ops", "touched", "appends")

    def __init__(self):
        self.ops = []
        self.touched = {}         # collection -> None (ordered set)
        self.appends = []         # (stream, deferred append result)


class _Ctx:
    """The WriteContext a staging function sees on a cluster: the engine's, with its stream writes
    recorded (projection positions go into the changelog record; appends are checked against the
    leadership of their stream)."""

    __slots__ = ("_ctx", "_rec", "_cluster", "txn", "engine")

    def __init__(self, ctx, rec, cluster):
        self._ctx = ctx
        self._rec = rec
        self._cluster = cluster
        self.txn = ctx.txn
        self.engine = ctx.engine

    def __getattr__(self, name):
        return getattr(self._ctx, name)

    def store_offset(self, stream, reference, offset):
        self._ctx.store_offset(stream, reference, offset)       # checks the names, as a single node does
        self._rec.ops.append([OP_OFFSET, stream, reference, int(offset)])

    def append(self, stream, records):
        refusal = self._cluster.check_write(stream)
        if refusal is not None:
            raise refusal
        res = self._ctx.append(stream, records)
        self._rec.appends.append((stream, res))
        return res


class ClusterDocStore(DocStore):
    """The broker's DocStore on a cluster node: reads as ever (this node's applied state); every write
    (``put``, ``apply``, ``create_collection``, ...) goes through :meth:`DocLog.submit`, and the
    writer-thread internals record what a staging function does while :class:`DocLog` plans it."""

    def __init__(self, engine, doclog):
        super().__init__(engine)
        self._doclog = doclog
        self._rec = None          # the recording of the function being planned (writer thread only)

    def _submit(self, fn):
        return self._doclog.submit(fn)

    def _state(self, ctx):
        st = super()._state(ctx)
        st.ctx = ctx              # the recording context when planning (the cached state may hold another)
        return st

    def _coll_w(self, st, name, create):
        rec = self._rec
        if rec is not None and name not in _LOCAL:
            rec.touched[name] = None
        return super()._coll_w(st, name, create)

    def _create(self, st, name, indexes, key_field):
        c = super()._create(st, name, indexes, key_field)
        if self._rec is not None:
            self._rec.ops.append([OP_CREATE, name, [[f, bool(u)] for f, u in indexes], key_field])
        return c

    def _stage_drop(self, st, name):
        existed = super()._stage_drop(st, name)
        if existed and self._rec is not None:
            self._rec.ops.append([OP_DROP, name])
        return existed

    def _put_raw(self, st, c, doc_id, raw):
        out = super()._put_raw(st, c, doc_id, raw)
        if self._rec is not None:
            self._rec.ops.append([OP_PUT, c.name, out[0], bytes(raw)])
        return out

    def _delete_raw(self, st, c, idk):
        existed = super()._delete_raw(st, c, idk)
        if existed and self._rec is not None:
            self._rec.ops.append([OP_DELETE, c.name, id_from_key(bytes(idk))])
        return existed


class DocLog:
    """The changelog of ``broker``'s documents on cluster node ``cluster`` (a ClusterNode). Made after
    ``cluster.start()`` and before the listeners (it replaces ``broker.docs``); :meth:`start` runs the
    apply loop, ``await stop()`` ends it. Loop thread only."""

    def __init__(self, broker, cluster, snapshot_every=_compaction.DEFAULT_EVERY):
        self.broker = broker
        self.cluster = cluster
        self.engine = broker.engine
        self.docs = ClusterDocStore(broker.engine, self)
        broker.docs = self.docs
        broker.transactions = self
        self.applied = 0                   # changelog offset this node's documents reflect up to
        self.waiting = {}                  # record token -> fn(outcome) of this node's writes
        self._token = f"{cluster.name}:{os.urandom(6).hex()}:"
        self._seq = itertools.count(1)
        self._task = None
        self._wake = None
        self._loop_thread = threading.get_ident()
        self._projection_hooks = []
        self._projections_on = False
        self._led = frozenset()            # the streams this node led when the hooks were last told
        self._watched = set()              # collections whose writes the projection hooks hear of
        self._written = set()              # collections the last apply transaction wrote
        self._turn = None                  # the _Write of this node being planned, logged and applied
        self._queue = collections.deque()  # _Writes waiting for their turn, in the order they came
        self.stats = {"planned": 0, "conflicts": 0, "applied": 0}
        self.compaction = _compaction.Compaction(snapshot_every)   # snapshots and the head's trimming
        self._trims = []                   # bases whose head the last apply transaction may drop

    def start(self):
        doc = self.docs.get(STATE_COLLECTION, APPLIED_ID)
        self.applied = int(doc["next"]) if doc else 0
        self.compaction.last_base = int(doc.get("snap", 0)) if doc else 0
        self._wake = asyncio.Event()
        # what the apply loop (and the projections' readiness) depends on besides committed records
        self.broker.on_stream_created(lambda name: name == CHANGELOG and self._wake.set())
        for hooks in (getattr(self.cluster, "role_hooks", None), getattr(self.cluster, "beat_hooks", None)):
            if hooks is not None:                               # (a stand-in node in tests has none)
                hooks.append(self._wake.set)
        self._task = asyncio.get_running_loop().create_task(self._apply_loop())

    async def stop(self):
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except (asyncio.CancelledError, Exception):
                pass
        queued, self._queue = list(self._queue), collections.deque()
        for w in queued:
            w.cb(None, RiverbedError("the node is stopping"))
        for fn in list(self.waiting.values()):
            fn(RiverbedError("the node is stopping"))
        self.waiting.clear()

    # ------------------------------------------------------------------------------ writing

    def submit(self, fn):
        """A DocStore write ``fn(txn state)`` through the changelog: a concurrent Future of its result,
        completed on the loop thread once this node has applied it (errors through the future)."""
        import concurrent.futures
        fut = concurrent.futures.Future()

        def done(res, exc):
            if exc is None:
                fut.set_result(res)
            else:
                fut.set_exception(exc)
        docs = self.docs
        self._on_loop(self.transact, lambda ctx: fn(docs._state(ctx)), done)
        return fut

    def _on_loop(self, fn, *args):
        if threading.get_ident() == self._loop_thread:
            fn(*args)
        else:
            self.broker.post(fn, *args)

    def transact(self, stage, cb):
        """``Broker.transact`` on a cluster node: see the module docstring. ``cb(result, exc)`` on the loop
        thread: after this node applied the write (documents), or after a majority of every stream
        appended to holds the events (event transactions).

        This node's document transactions take turns, in the order they came: each is planned once the
        one before it is applied here, so a write pipelined behind another (a REAM SET behind its
        PROJECTION CREATE, a REMOVE behind a SET) sees it, as on a lone node. Transactions that touch no
        document (events, offsets) never wait for a turn."""
        self._plan(_Write(stage, cb))

    def _plan(self, w):
        cluster, docs, stage = self.cluster, self.docs, w.stage

        def plan(ctx):
            rec = _Recording()
            docs._rec = rec
            try:
                result = stage(_Ctx(ctx, rec, cluster))
            finally:
                docs._rec = None
            if not rec.ops or all(op[0] == OP_OFFSET for op in rec.ops) and not rec.touched:
                # events, offsets, a read of documents or nothing: kept as staged
                return result, rec.appends, bool(rec.touched)
            if rec.appends:
                raise InvalidArgument("a transaction on a cluster writes documents or events, not both")
            rec.touched = [[name, self._version(ctx, name)] for name in rec.touched]
            raise _Planned(result, rec)
        try:
            fut = self.engine.transact(plan)
        except RiverbedError as e:
            self._planned(w, None, e)
            return
        self.broker.then(fut, lambda res, exc: self._planned(w, res, exc))

    def _version(self, ctx, name):
        doc = self.docs.stage_get(ctx, VERSIONS_COLLECTION, name)
        return int(doc["v"]) if doc else 0

    def _planned(self, w, res, exc):
        if exc is None and not res[2]:
            # no document touched: events wait for their majorities, never for a turn
            result, appends, _ = res
            if self._turn is w:
                self._turn = None
                self._next()
            self._hold(appends, lambda err: w.cb(result, None) if err is None else w.cb(None, err))
            return
        if self._turn is not w and (self._turn is not None or self._queue):
            self._queue.append(w)          # planned against a state an earlier write here may change
            return
        self._turn = w
        if exc is None:
            self._finish(w, res[0], None)
            return
        if not isinstance(exc, _Planned):
            self._finish(w, None, exc)
            return
        self.stats["planned"] += 1
        token = self._token + str(next(self._seq))
        record = bson.encode({"v": RECORD_VERSION, "token": token, "node": self.cluster.name,
                              "reads": exc.rec.touched, "ops": exc.rec.ops})
        state = {"done": False, "timer": None}

        def outcome(out):
            if state["done"]:
                return
            state["done"] = True
            self.waiting.pop(token, None)
            if state["timer"] is not None:
                state["timer"].cancel()
            if out == OUT_OK:
                self._finish(w, exc.result, None)
            elif out == OUT_CONFLICT:
                self.stats["conflicts"] += 1
                w.attempts += 1
                if w.attempts >= MAX_RETRIES:
                    self._finish(w, None, WriteConflict(f"the write met newer writes {MAX_RETRIES} times; try again"))
                else:
                    self._plan(w)          # against the newer state, keeping its turn
            else:
                self._finish(w, None, out)
        self.waiting[token] = outcome
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.cluster.replication_timeout

        def append():
            self._ensure_changelog(lambda err: appended(None, err) if err is not None else
                                   self.broker.append_records(CHANGELOG, [record], appended))

        def appended(res, err):
            if state["done"]:
                return             # applied here already (the commit reached this node first)
            if err is not None:
                if isinstance(err, RETRY_ERRORS) and loop.time() + RETRY_DELAY < deadline:
                    # the leader went away (or the node is no leader): the record may be stored or not;
                    # sent again, a copy logged twice changes nothing the second time (its versions
                    # no longer match), and this write is answered by whichever copy applies first
                    loop.call_later(RETRY_DELAY, append)
                    return
                outcome(err)
                return
            # committed on the cluster: answered once this node has applied it
            state["timer"] = loop.call_later(
                self.cluster.replication_timeout, outcome,
                ReplicationTimeout("the write is stored on the cluster but this node has not applied it in time"))
            self._wake.set()
        append()

    def _finish(self, w, res, exc):
        if self._turn is w:
            self._turn = None
        try:
            w.cb(res, exc)
        finally:
            self._next()

    def _next(self):
        if self._turn is None and self._queue:
            w = self._queue.popleft()
            self._turn = w
            self._plan(w)

    def _ensure_changelog(self, cb):
        if self.engine.has_stream(CHANGELOG) or CHANGELOG in self.cluster.placements:
            cb(None)
            return
        # the first document write of the cluster makes the changelog; its node leads it (the broker
        # asks etcd first: StreamExists when another node made it a moment ago)
        self.broker.create_stream(CHANGELOG, dict(CHANGELOG_ARGS),
                                  lambda exc: cb(None if exc is None or isinstance(exc, StreamExists) else exc))

    def _hold(self, appends, done):
        """``done(None)`` once a majority of each stream's members holds what ``appends`` staged, or
        ``done(exc)`` for the first that fails."""
        if not appends:
            done(None)
            return
        left = [len(appends)]
        failed = []

        def one(res, exc):
            if failed:
                return
            if exc is not None:
                failed.append(exc)
                done(exc)
                return
            left[0] -= 1
            if left[0] == 0:
                done(None)
        for stream, staged in appends:
            self.cluster.hold(stream, one)(staged.resolve() if hasattr(staged, "resolve") else staged, None)

    # ------------------------------------------------------------------------------ applying

    async def _apply_loop(self):
        while True:
            try:
                progressed = await self._apply_some()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("cluster: applying the document changelog failed")
                progressed = False
            self._check_projections()
            if progressed:
                self._maybe_snapshot()
                continue
            self._wake.clear()
            cancel = None
            # the fallback look as a timer that sets the event: wait_for made a task and a future on
            # every look (five a second on every cluster node, documents or not, when it was the way the
            # loop learned of the changelog's creation and of leadership changes)
            poll = asyncio.get_running_loop().call_later(POLL_FALLBACK, self._wake.set)
            try:
                if self.engine.has_stream(CHANGELOG):
                    # woken by the next record past what was read: while loading a snapshot that is
                    # past the applied position (compaction.py), else the loop would spin
                    scan = self.compaction.scan
                    cancel = self.broker.watch(CHANGELOG, self.applied if scan is None else scan,
                                               lambda exc: self._wake.set())
                await self._wake.wait()
            except StreamNotFound:
                await asyncio.sleep(POLL)
            finally:
                poll.cancel()
                if cancel is not None:
                    cancel()

    async def _apply_some(self):
        if not self.engine.has_stream(CHANGELOG) or self.engine.read_limit(CHANGELOG) is None:
            # no limit yet (a restarted node before its role is known): its tail may not be committed
            return False
        first = self.engine._current(CHANGELOG).first_chunk
        if first > self.applied:
            # this node's copy starts after what its documents reflect (a new node, a wiped data dir, a
            # copy behind its leader's compaction): load a snapshot first (compaction.py)
            return await self._load_some(first)
        batches, nxt = self.broker.read_records(CHANGELOG, self.applied, APPLY_BATCH)
        records = [(off, bytes(raw)) for b in batches for off, raw in b]
        if not records:
            if nxt > self.applied:
                self.applied = nxt          # offsets of no record (the log's own chunks)
            return False
        try:
            outcomes = await asyncio.wrap_future(self.engine.transact(
                lambda ctx: self._apply_records(ctx, records, nxt)))
        except RiverbedError as e:
            # one record the store refuses (it never should: every node has the same state) must not
            # stop the log: apply them one by one, skipping the one that fails, on every node alike
            log.error("cluster: document changelog batch at %d failed (%s); applying one by one", self.applied, e)
            outcomes = []
            for i, (off, raw) in enumerate(records):
                end = records[i + 1][0] if i + 1 < len(records) else nxt
                try:
                    outcomes += await asyncio.wrap_future(self.engine.transact(
                        lambda ctx, r=[(off, raw)], e=end: self._apply_records(ctx, r, e)))
                except RiverbedError as e1:
                    log.error("cluster: document changelog record %d skipped: %s", off, e1)
                    await asyncio.wrap_future(self.engine.transact(lambda ctx, e=end: self._mark(ctx, e)))
                    outcomes.append((_token_of(raw), e1))
        self.applied = nxt
        self.stats["applied"] += len(records)
        trims, self._trims = self._trims, []
        for base in trims:
            # every node drops the head of its own copy that a whole, committed snapshot covers
            self.compaction.stats["trims"] += 1
            self.broker.then(self.engine.trim_head(CHANGELOG, base),
                             lambda res, exc: exc is None or log.warning("cluster: changelog trim: %s", exc))
        if self._projections_on and not self._watched.isdisjoint(self._written):
            self._tell_projections(True)     # a definition made through another node: start it here
        for token, out in outcomes:
            fn = self.waiting.get(token)
            if fn is not None:
                fn(out)
        return True

    def _mark(self, ctx, nxt):
        self.docs.stage_put(ctx, STATE_COLLECTION, APPLIED_ID, {"next": nxt, "snap": self.compaction.last_base})

    def _apply_records(self, ctx, records, nxt):
        """Writer thread: apply changelog ``records`` [(offset, BSON)] in order; ``[(token, outcome)]``."""
        docs = self.docs
        st = docs._state(ctx)
        out = []
        self._written = changed = set()     # read on the loop once this transaction's future is done
        for off, raw in records:
            try:
                rec = bson.decode(raw)
            except Exception:  # noqa: BLE001 - not a changelog record: nothing to apply
                log.error("cluster: document changelog record %d is not BSON; skipped", off)
                continue
            if "snap" in rec:
                # a snapshot (compaction.py): nothing to apply for a node that applied the log before it
                base = self.compaction.note(rec)
                if base is not None:
                    self._trims.append(base)
                continue
            token = rec.get("token")
            if any(self._version(ctx, name) != v for name, v in rec.get("reads") or ()):
                out.append((token, OUT_CONFLICT))
                continue
            written = set()
            for op in rec.get("ops") or ():
                kind = op[0]
                if kind == OP_PUT:
                    docs._put_one(st, op[1], op[2], bytes(op[3]))
                    written.add(op[1])
                elif kind == OP_DELETE:
                    docs._delete_one(st, op[1], id_key(op[2]))
                    written.add(op[1])
                elif kind == OP_CREATE:
                    docs._stage_create(st, op[1], tuple((f, bool(u)) for f, u in op[2]), op[3])
                    written.add(op[1])
                elif kind == OP_DROP:
                    docs._stage_drop(st, op[1])
                    written.add(op[1])
                elif kind == OP_OFFSET:
                    if ctx.has_stream(op[1]):      # a node holding no copy of the channel has no position
                        ctx.store_offset(op[1], op[2], op[3])
                    # kept among the documents too, so that a snapshot carries it
                    docs._put_one(st, _compaction.POSITIONS_COLLECTION, _compaction.position_id(op[1], op[2]),
                                  bson.encode({"s": op[1], "r": op[2], "o": op[3]}))
            for name in written:
                docs.stage_put(ctx, VERSIONS_COLLECTION, name, {"v": off + 1})
            changed |= written
            out.append((token, OUT_OK))
        self._mark(ctx, nxt)
        return out

    # ------------------------------------------------------------------------------ compaction

    def _maybe_snapshot(self):
        """On the changelog's leader, every ``snapshot_every`` applied records: append a snapshot of the
        applied documents (compaction.py), in one append."""
        comp = self.compaction
        if not self.leads() or not comp.due(self.applied):
            return
        comp.taking = True

        async def take():
            try:
                base, colls = await asyncio.to_thread(_compaction.read_state, self.docs, ())
                token, records = _compaction.snapshot_records(base, colls, self.cluster.name)
                log.info("cluster: taking document snapshot %s at changelog offset %d", token, base)
                fut = asyncio.get_running_loop().create_future()
                self.broker.append_records(CHANGELOG, records,
                                           lambda res, exc: fut.done() or fut.set_result(exc))
                exc = await fut
                if exc is not None:
                    raise exc
                comp.stats["snapshots"] += 1
                comp.last_base = max(comp.last_base, base)
                log.info("cluster: document snapshot %s at changelog offset %d: %d collections, %d records",
                         token, base, len(colls), len(records))
            except Exception as e:  # noqa: BLE001 - the next due point tries again
                log.warning("cluster: document snapshot failed: %s", e)
            finally:
                comp.taking = False
        asyncio.get_running_loop().create_task(take())

    async def _load_some(self, first):
        """Read this node's copy from its first chunk to the first whole snapshot based at or after it,
        loading its parts as they come; True while it made progress."""
        comp = self.compaction
        if comp.scan is None or comp.scan < first:
            comp.scan, comp.loading = first, None
            log.info("cluster: %s loads a document snapshot (applied %d, changelog copy from %d)",
                     self.cluster.name, self.applied, first)
        batches, nxt = self.broker.read_records(CHANGELOG, comp.scan, APPLY_BATCH)
        records = [(off, bytes(raw)) for b in batches for off, raw in b]
        if not records:
            comp.scan = max(comp.scan, nxt)
            return False
        docs = self.docs
        loaded = []

        def load(ctx):
            st = docs._state(ctx)
            for _off, raw in records:
                try:
                    rec = bson.decode(raw)
                except Exception:  # noqa: BLE001 - not a changelog record
                    comp.loading = None
                    continue
                token, cur = rec.get("snap"), comp.loading
                if token is None:
                    comp.loading = None            # a snapshot cut short (no end): look for the next
                elif "end" in rec:
                    if cur is not None and cur[0] == token and cur[1] == rec["end"]:
                        comp.last_base = max(comp.last_base, int(rec["base"]))
                        self._mark(ctx, int(rec["base"]))
                        loaded.append(int(rec["base"]))
                        return
                    comp.loading = None
                elif rec.get("part") == 0 and int(rec["base"]) >= first:
                    comp.loading = [token, 1]
                    _compaction.load_part(docs, st, ctx, rec, True)
                elif cur is not None and cur[0] == token and cur[1] == rec.get("part"):
                    cur[1] += 1
                    _compaction.load_part(docs, st, ctx, rec, False)
                else:
                    comp.loading = None
        try:
            await asyncio.wrap_future(self.engine.transact(load))
        except RiverbedError as e:
            log.error("cluster: loading a document snapshot failed (%s); starting the load again", e)
            comp.scan, comp.loading = None, None
            return False
        if loaded:
            self.applied = loaded[0]
            comp.scan, comp.loading, comp.seen = None, None, None
            comp.stats["loads"] += 1
            log.info("cluster: %s loaded the document snapshot at changelog offset %d", self.cluster.name,
                     self.applied)
            if self._projections_on:
                self._tell_projections(True)
            return True
        comp.scan = nxt
        return True

    # ------------------------------------------------------------------------------ projections

    def leads(self):
        """Whether this node leads the changelog (it takes document writes without forwarding)."""
        return CHANGELOG in self.cluster.leading

    def runs_projection(self, channel):
        """Whether a projection over stream ``channel`` runs on this node now: this node leads the
        channel (it reads it from its own log, and a leadership change moves the projection with it) and
        has applied all of the changelog that it knows committed (so it goes on from the position the
        last runner logged)."""
        return self._projections_on and channel in self._led

    def _projections_ready(self):
        if not self.engine.has_stream(CHANGELOG):
            return True                 # no document written yet: no position to catch up with
        limit = self.engine.read_limit(CHANGELOG)
        if limit is None:
            return self.leads()         # a restarted member does not know what is committed yet
        return self.applied >= limit

    def on_projections(self, fn, definitions=None):
        """``fn(ready)`` whenever what :meth:`runs_projection` answers may have changed (this node caught
        up with the changelog or fell behind, the streams it leads changed); called once now, and again
        while it is caught up whenever collection ``definitions`` (where projections are defined)
        changes."""
        self._projection_hooks.append(fn)
        if definitions is not None:
            self._watched.add(definitions)
        fn(self._projections_on)

    def _check_projections(self):
        on = self._projections_ready()
        led = frozenset(self.cluster.leading) if on else frozenset()
        if on == self._projections_on and led == self._led:
            return
        self._projections_on, self._led = on, led
        self._tell_projections(on)

    def _tell_projections(self, on):
        for fn in self._projection_hooks:
            try:
                fn(on)
            except Exception:
                log.exception("cluster: projection hook failed")


def _token_of(raw):
    try:
        return bson.decode(raw).get("token")
    except Exception:  # noqa: BLE001
        return None


__all__ = ["CHANGELOG", "DocLog", "ClusterDocStore", "WriteConflict"]
