"""The broker layer: what every protocol shell needs from the log, said once.

    transport -> session (sans-I/O, one per connection) -> codec
                    |
                    v
                 Broker (this module: one per ``riverbed serve``, shared by every listener)
                    |
                    v
                 Engine (the log and the document store; its own writer thread)

A session never touches LMDB and never blocks: it calls the broker with a callback, and the broker
runs that callback on the loop thread once the engine has answered. The engine completes its futures on
its writer thread; the broker hands them to the loop through ``post`` (``loop.call_soon_threadsafe``
in a server, a queue in sans-I/O tests).

What lives here, protocol-neutral:

* streams and super streams: create and delete, with the permission checks of the one Authenticator;
  a deletion is heard by every session of every protocol (``session.stream_deleted(name)``), after the
  deleting request has been answered (RabbitMQ answers first, and rstream 0.20 closes a consumer
  connection on the notification of its last stream);
* publishing with completion callbacks, the disk alarm (disk.py: refused with StorageFull while the disk
  is short of space), publisher dedup, and read-your-writes barriers (a query of a
  publisher sequence or consumer offset waits for that reference's writes in flight; a NEXT position is
  resolved after every append already accepted has committed);
* reading: offset specs, records (records.py: each with its offset, timestamp and decoded view; chunks
  only for RabbitMQ Stream), watches for the next commit, and :class:`~riverbed.shells.broker.tail.Tail`
  (tailing subscriptions of records or chunks, with per-chunk credit or a byte window);
* consumer offsets and named durable positions;
* in a cluster (``self.cluster``), forwarding: an append, StoreOffset or publisher-sequence query for a
  stream another node leads goes to that leader (shells/cluster/forward.py), whatever the protocol,
  unless the caller says ``forward=False`` (Kafka);
* the one document store of the engine (``docs``) and transactions over it and the log (``transact``);
* monitoring reads of the engine's committed state (``stream_states``, ``engine_stats``, ...);
* the session registry (every protocol's connections, for the management API and shutdown).

Loop-thread only, except :meth:`post`-ed completions, which arrive from the writer thread.
"""

import collections
import json
import logging
import os
import threading
import time

from riverbed.engine import OffsetSpec
from riverbed.engine import core
from riverbed.engine import stats as _engine_stats
from riverbed.engine.docstore import DocStore
from riverbed.engine.errors import RiverbedError, StorageFull, StreamExists, StreamNotFound
from riverbed.engine.format import LEN_CHUNK_HEADER
from riverbed.shells import auth as _auth
from riverbed.shells.broker import limits as _limits
from riverbed.shells.broker.internal import is_internal
from riverbed.shells.broker import records as _records
from riverbed.shells.broker.stats import BrokerStats

log = logging.getLogger("riverbed.broker")

LEGACY_SUPER_STREAMS_FILE = "rmq-super-streams.json"   # where super streams lived before the engine table

CONFIGURE, WRITE, READ = "configure", "write", "read"


class NotLeaderError(RiverbedError):
    """In a cluster: another node leads the stream and this write was not taken here. Raised when the
    caller asked for no forwarding (the Kafka shell: its clients route themselves and hear
    NOT_LEADER_OR_FOLLOWER), and by a forwarded write its leader did not confirm (then it may or may not
    be stored: retry, with the same publishing ids where the protocol has them)."""


class Broker:
    """The protocol-neutral broker over one engine. Create one per process and hand it to every listener.

    ``post(fn, *args)`` must run ``fn(*args)`` on the loop thread (thread-safe). ``auth`` is the one
    :class:`~riverbed.shells.auth.Authenticator` (default: guest/guest from loopback). ``clock`` is in
    seconds (monotonic; heartbeats and timeouts), ``wall_clock`` in ms since the epoch. ``data_dir``,
    when given, is searched once for a legacy ``rmq-super-streams.json`` to import into the engine.

    ``docs`` is the one :class:`~riverbed.engine.docstore.DocStore` of ``engine``, made here: every
    shell reads and writes documents through it (its reads may run on any thread; its writes go through
    :meth:`transact` or its own futures, handed to :meth:`then`). Shells never touch ``engine`` itself.

    Callbacks given to the methods below run on the loop thread, possibly before the method returns
    (when the answer is known at once), never in the middle of another callback.
    """

    def __init__(self, engine, *, post, post_local=None, auth=None, clock=time.monotonic, wall_clock=None,
                 data_dir=None):
        self.engine = engine
        self.docs = DocStore(engine)
        self.post = post
        # ``post_local`` (the loop's call_soon) is ``post`` without the wake-up, for use on the loop
        # thread itself: an inline commit (fsync=never) completes there
        self.post_local = post_local or post
        self._loop_thread = threading.get_ident()
        self._inbox = collections.deque()   # (fn, args) completed by any thread, run in order by _drain
        self._inbox_armed = False
        self._flushes = None                # session -> flush, while _drain runs
        self.auth = auth or _auth.Authenticator()
        self.clock = clock
        self.wall_clock = wall_clock or (lambda: int(time.time() * 1000))
        self.sessions = set()
        self.readers = {}          # stream -> open Tails (tail.py): a cluster drops an idle observer copy
        self._closed = False
        self._offset_writes = {}   # (stream, reference) -> [in-flight count, waiting callbacks]
        self._seq_writes = {}      # (stream, publisher) -> [in-flight count, waiting callbacks]
        self._deleting = {}        # stream -> deletes requested through this broker, not yet answered
        self._creating = {}        # stream -> callbacks waiting for its creation by ensure_stream
        self._delete_hooks = []    # fn(stream) run before sessions hear of a deletion (SAC groups, ...)
        self.extensions = {}       # per-protocol state shared by that protocol's listeners (by name)
        self._create_hooks = []    # fn(stream) run when a stream is created, before sessions hear of it
        self.stats = BrokerStats()     # counters for GET /metrics (stats.py)
        self.limits = _limits.current()     # the named limits in force (limits.py); see set_limits
        self.inflight = _limits.InflightBudget(self.limits.max_inflight_bytes)   # broker-wide memory budget
        self._delete_hooks.append(self.stats.forget_stream)
        self.listeners = []        # (name, server) of every listener `riverbed serve` started (GET /healthz)
        self.ready = False         # `riverbed serve` has started every listener and is not stopping (/readyz)
        self.disk = None           # the DiskMonitor (disk.py) whose alarm refuses publishes; None: no alarm
        self.cluster = None        # the ClusterNode (shells/cluster) with --etcd: confirms wait for a majority
        # with --etcd, the DocLog (shells/cluster/docs.py): transactions and document writes go through
        # the replicated changelog; None on a lone node (transact goes straight to the engine)
        self.transactions = None
        engine.add_delete_listener(self._deleted_on_writer)
        engine.add_create_listener(lambda name: self._post(self.stream_created, name))
        if data_dir and not engine.readonly:
            self._import_legacy_super_streams(os.path.join(data_dir, LEGACY_SUPER_STREAMS_FILE))

    def set_limits(self, limits):
        """Use ``limits`` (a :class:`~riverbed.shells.broker.limits.Limits`) for connections and
        listeners started from now on, and size the in-flight budget to it. Call before listeners start."""
        self.limits = limits
        self.inflight.limit = limits.max_inflight_bytes
        self.inflight.low = limits.max_inflight_bytes // 2

    def close(self):
        """Stop delivering engine completions (the process is stopping)."""
        self._closed = True

    # ------------------------------------------------------------------------------- loop hand-off

    def _post(self, fn, *args):
        """Run ``fn(*args)`` on the loop thread, after everything posted before it. Thread-safe.

        Completions queue in one inbox that a single loop callback drains: a group commit of many
        appends wakes the loop once, and their confirms go out in the same loop turn (one write per
        connection). The arming flag needs no lock: a producer appends before it reads the flag, and
        the drain clears the flag before it empties the inbox, so every item is drained."""
        if self._closed:
            return
        self._inbox.append((fn, args))
        if self._inbox_armed:
            return
        self._inbox_armed = True
        try:
            if threading.get_ident() == self._loop_thread:
                self.post_local(self._drain)
            else:
                self.post(self._drain)
        except RuntimeError:  # the loop is closed: the process is stopping, nobody waits for this
            pass

    def _drain(self):
        self._inbox_armed = False
        inbox = self._inbox
        flushes = self._flushes = {}
        try:
            while inbox:
                fn, args = inbox.popleft()
                try:
                    fn(*args)
                except Exception:  # one session's broken callback must not starve the others' completions
                    log.exception("broker callback failed")
        finally:
            self._flushes = None
        for flush in flushes.values():
            try:
                flush()
            except Exception:
                log.exception("session flush failed")

    def flush_soon(self, key, flush):
        """Run ``flush()`` once after the completions being delivered now, or at once outside a
        delivery. A session passes its output flush here so that the confirms of one group commit leave
        in one write per connection (``key``: the session)."""
        if self._flushes is None:
            flush()
        else:
            self._flushes[key] = flush

    def then(self, fut, cb):
        """Run ``cb(result, exc)`` on the loop thread once the engine future ``fut`` completes."""
        def done(f):
            try:
                res, exc = f.result(), None
            except BaseException as e:  # the engine reports every failure through the future
                res, exc = None, e
            self._post(cb, res, exc)
        fut.add_done_callback(done)

    def _done(self, cb):
        """An engine ``on_done`` that runs ``cb(result, exc)`` on the loop thread (through the inbox). An
        engine refusal for want of space (StorageFull) makes the disk alarm look at once, before ``cb``."""
        post = self._post

        def done(res, exc):
            if exc is not None and self.disk is not None and isinstance(exc, StorageFull):
                post(self.disk.check)
            post(cb, res, exc)
        return done

    def _call(self, submit, cb):
        """``submit()`` an engine operation and ``cb(result, exc)`` on the loop; an error raised at once
        (a bad name, a closed engine) goes to ``cb`` too."""
        try:
            fut = submit()
        except RiverbedError as e:
            cb(None, e)
            return
        self.then(fut, cb)

    # ------------------------------------------------------------------------------------ sessions

    def register(self, session):
        """Add a live connection (any protocol). It must offer ``stream_deleted(name)``; for the
        management API also ``connection_info()`` and ``close_by_admin(reason)``."""
        self.sessions.add(session)

    def unregister(self, session):
        self.sessions.discard(session)
        self.inflight.cancel(session)

    def hold_if_over_budget(self, session, pause, resume):
        """Back-pressure of the broker-wide in-flight budget, for a session that just handed appends on:
        when the budget is exceeded, ``pause()`` (stop reading the client) now and ``resume()`` once
        in-flight bytes are back at the low mark (sessions resume in the order they paused). Returns
        whether it paused. A session that unregisters meanwhile is never resumed. Loop thread."""
        if not self.inflight.over():
            return False
        pause()
        self.inflight.wait(session, resume)
        return True

    def connections(self):
        """``connection_info()`` of every live connection that has one."""
        return [s.connection_info() for s in list(self.sessions) if hasattr(s, "connection_info")]

    @staticmethod
    def allowed(user, what, resource):
        """Whether ``user`` (an auth.User, or None for nobody) holds ``what`` on stream ``resource``."""
        return user is not None and user.can(what, resource)

    # ---------------------------------------------------------------------------------- streams

    def has_stream(self, name):
        return bool(name) and self.engine.has_stream(name)

    def list_streams(self):
        """The streams a client may see: every stream of this node but the server's own
        (internal.py)."""
        return [n for n in self.engine.list_streams() if not is_internal(n)]

    def stream_info(self, name):
        """Committed statistics (engine StreamInfo). Raises StreamNotFound, ChunkError."""
        return self.engine.stream_info(name)

    def create_stream(self, name, arguments, cb):
        """``cb(exc)`` once created (exc None) or refused (StreamExists, InvalidArgument, ...). In a
        cluster a stream is created only when etcd places none of that name (it may live on other nodes
        only): then StreamExists; else it is made here and placed in etcd (shells/cluster), and answered
        once the node its leader locator chose leads it."""
        cluster = self.cluster
        if cluster is not None:
            cb = cluster.hold_create([name], cb)
        if cluster is None or self.engine.has_stream(name):
            self._call(lambda: self.engine.create_stream(name, arguments), lambda res, exc: cb(exc))
            return

        def looked_up(placed, exc):
            if placed:
                cb(StreamExists(f"stream {name!r} already exists on the cluster"))
            else:
                self._call(lambda: self.engine.create_stream(name, arguments), lambda res, exc: cb(exc))
        cluster.forwarding.lookup(name, looked_up)

    def ensure_stream(self, name, cb):
        """``cb(exc)`` once stream ``name`` exists: at once when it does, else after creating it with
        default arguments (exc None; a creation that lost a race to another one counts as success) or
        failing to (exc). Concurrent callers share one creation and are called back in the order they
        asked, so work queued behind a creation keeps its order. Permission checks are the caller's."""
        waiting = self._creating.get(name)
        if waiting is not None:
            waiting.append(cb)
            return
        if self.has_stream_anywhere(name):
            cb(None)
            return
        self._creating[name] = [cb]
        if self.cluster is not None:      # made by a publish: led where it is published (client-local)
            self.cluster.pending_leaders.setdefault(name, self.cluster.name)

        def created(exc):
            if isinstance(exc, StreamExists):
                exc = None
            callbacks = self._creating.pop(name, ())
            if self.cluster is not None:      # the leader chosen above is no longer needed, unless placing
                self.cluster.creation_ended([name])
            for fn in callbacks:
                try:
                    fn(exc)
                except Exception:
                    log.exception("stream creation callback failed for %r", name)
        # in a cluster the stream may exist on other nodes only (made there a moment ago, or this node is
        # no member of it): then StreamExists, and a publish to it is forwarded to its leader
        self.create_stream(name, {}, created)

    def has_stream_anywhere(self, name):
        """Whether ``name`` exists here or, in a cluster, is placed on other nodes (as this node last read
        etcd): a publish to it is taken (forwarded to its leader when that is another node)."""
        if self.engine.has_stream(name):
            return True
        return self.cluster is not None and self.cluster.forwarding.placed(name)

    def find_stream(self, name, cb):
        """``cb(found)`` with :meth:`has_stream_anywhere`'s answer; in a cluster, a miss is asked of etcd
        first (a stream made on another node a moment ago is placed there before this node's next poll of
        the cluster state sees it). ``cb`` runs on the loop, at once when no lookup is needed."""
        found = self.has_stream_anywhere(name)
        if found or self.cluster is None:
            cb(found)
            return
        self.cluster.forwarding.lookup(name, lambda placed, exc: cb(bool(placed)))

    def find_streams(self, names, cb):
        """``cb(found)``: the set of ``names`` that exist here or, in a cluster, are placed on other
        nodes, each miss asked of etcd first as :meth:`find_stream` does (all at once): the one check for
        a request that answers "no such stream" (Metadata of every protocol). The server's own streams
        (internal.py) are never found. ``cb`` runs on the loop, at once when no lookup is needed."""
        found, ask = set(), []
        for name in set(names):
            if not name or is_internal(name):
                continue
            if self.has_stream_anywhere(name):
                found.add(name)
            elif self.cluster is not None:
                ask.append(name)
        if not ask:
            cb(found)
            return
        left = [len(ask)]

        def one(name, placed):
            if placed:
                found.add(name)
            left[0] -= 1
            if left[0] == 0:
                cb(found)
        for name in ask:
            self.cluster.forwarding.lookup(name, lambda placed, exc, name=name: one(name, placed))

    def needs_copy(self, name):
        """Whether a reader of ``name`` here must first wait for :meth:`when_readable`: only in a cluster,
        on a node that holds no copy of it (or a copy still catching up for its first reader). False on a
        lone node and wherever a copy is there: the read goes on at once, no extra hop."""
        cluster = self.cluster
        if cluster is None or not name:
            return False
        if self.engine.has_stream(name):
            return not cluster.observers.ready(name)
        return name not in self._creating

    def when_readable(self, name, cb):
        """``cb(exc)`` on the loop once ``name`` can be read here: at once where :meth:`needs_copy` is
        false; else after this node made a copy of it, followed its leader and caught up to the
        committed offset (shells/cluster/remote_read.py: the node observes the stream, no vote), or with
        StreamNotFound when the cluster has no such stream or no copy was ready within
        ``--replication-timeout``. Readers then read the local copy, limited to the committed offset."""
        if not self.needs_copy(name):
            cb(None)
            return
        self.cluster.observers.observe(name, cb)

    def catch_up(self, name, cb):
        """``cb()`` on the loop once this node's copy of ``name`` holds what its leader has committed now
        (read-your-writes for a one-shot read, e.g. a WebSocket resend, on a node that does not lead the
        stream: a client that published through another node sees its write here). At once on a lone
        node and on the leader; at most ``--replication-timeout`` later elsewhere."""
        cluster = self.cluster
        if cluster is None or cluster.check_write(name) is None or not self.engine.has_stream(name):
            cb()
            return
        cluster.observers.catch_up(name, cb)

    def creating(self, name):
        """Whether an :meth:`ensure_stream` creation of ``name`` is in flight."""
        return name in self._creating

    def delete_stream(self, name, cb, copy_only=False):
        """``cb(exc)`` once deleted; then every session hears ``stream_deleted(name)``, so the request is
        answered before any notification goes out. A partition of super streams leaves them in the same
        transaction (the engine's delete; as a deleted queue's bindings go with it on RabbitMQ). In a
        cluster the stream is deleted on every node, also one this node holds no copy of: answered once
        etcd holds the deletion (shells/cluster/deletion.py); ``copy_only``: the cluster layer drops this
        node's copy alone (the stream lives on elsewhere, and so do its super stream bindings)."""
        self._deleting_enter([name])
        done = lambda res, exc: self._deleted_then([name], cb, exc)   # noqa: E731
        if self.cluster is not None:
            if copy_only:
                self._call(lambda: self.engine.delete_stream(name, keep_bindings=True), done)
                return
            if not self.engine.has_stream(name):
                self.cluster.delete_remote(name, lambda exc: done(None, exc))
                return
            done = self.cluster.hold_delete([name], done)
        self._call(lambda: self.engine.delete_stream(name), done)

    def _deleting_enter(self, names):
        for n in names:
            self._deleting[n] = self._deleting.get(n, 0) + 1

    def _deleted_then(self, names, cb, exc):
        try:
            cb(exc)
        finally:
            for n in names:
                left = self._deleting.get(n, 0) - 1
                if left > 0:
                    self._deleting[n] = left
                else:
                    self._deleting.pop(n, None)
                    # notify once the request is answered: deletions by this broker were held back
                    if exc is None or not self.engine.has_stream(n):
                        self.stream_deleted(n)

    def _deleted_on_writer(self, name):
        self._post(self._engine_deleted, name)

    def _engine_deleted(self, name):
        if name not in self._deleting:   # else the request's completion notifies, after its answer
            self.stream_deleted(name)

    def on_stream_deleted(self, hook):
        """Run ``hook(name)`` on the loop thread when a stream is deleted, before sessions hear of it."""
        self._delete_hooks.append(hook)

    def on_stream_created(self, hook):
        """Run ``hook(name)`` on the loop thread when a stream is created through any protocol."""
        self._create_hooks.append(hook)

    def stream_created(self, name):
        """Tell the hooks, and every session that has a ``stream_created(name)``, that ``name`` now
        exists: subscriptions waiting for a stream start at once instead of polling for it."""
        for hook in self._create_hooks:
            try:
                hook(name)
            except Exception:
                log.exception("stream creation hook failed for %r", name)
        for s in list(self.sessions):
            fn = getattr(s, "stream_created", None)
            if fn is not None:
                try:
                    fn(name)
                except Exception:
                    log.exception("session failed to handle the creation of %r", name)

    def stream_deleted(self, name):
        """Forget per-stream state and tell every session of every protocol."""
        for hook in self._delete_hooks:
            try:
                hook(name)
            except Exception:
                log.exception("stream deletion hook failed for %r", name)
        for s in list(self.sessions):
            try:
                s.stream_deleted(name)
            except Exception:
                log.exception("session failed to handle the deletion of %r", name)

    # ------------------------------------------------------------------------------ super streams

    def partitions(self, name):
        """Partition stream names in order, or None when there is no such super stream."""
        d = self.engine.super_stream(name) if name else None
        return list(d["partitions"]) if d else None

    def route(self, name, routing_key):
        """Partitions whose binding key equals ``routing_key`` ([] when none), or None when there is no
        such super stream."""
        d = self.engine.super_stream(name) if name else None
        if d is None:
            return None
        return [p for p, k in zip(d["partitions"], d["binding_keys"]) if k == routing_key]

    def super_stream(self, name):
        """Super stream ``name`` as ``{"partitions", "binding_keys", "orders"}`` (lists in partition
        order; ``orders`` the partition order of each binding, None where it has none), or None."""
        d = self.engine.super_stream(name) if name else None
        if d is None:
            return None
        parts = list(d["partitions"])
        orders = d.get("orders")
        return {"partitions": parts, "binding_keys": list(d["binding_keys"]),
                "orders": list(orders) if orders is not None else list(range(len(parts)))}

    def list_super_streams(self):
        """Names of every super stream, sorted."""
        return self.engine.list_super_streams()

    def declare_super_stream(self, name, cb):
        """Record super stream ``name`` without partitions (RabbitMQ's management API declares its
        exchange, then binds partitions one by one); ``cb(created, exc)``: created is False when it
        existed already."""
        self._call(lambda: self.engine.declare_super_stream(name), self._super_changed(name, cb, created=True))

    def bind_partition(self, name, partition, binding_key, order, cb):
        """Add existing stream ``partition`` to super stream ``name`` under ``binding_key``, placed by
        ``order`` (int or None: after the ordered ones); ``cb(added, exc)``: added is False when that
        binding existed. StreamNotFound when either is missing."""
        self._call(lambda: self.engine.bind_super_stream(name, partition, binding_key, order),
                   self._super_changed(name, cb, op=("bind", partition, binding_key, order)))

    def unbind_partition(self, name, partition, binding_key, cb):
        """Remove the binding(s) of ``partition`` (with ``binding_key``, or all when None) from super
        stream ``name``; the stream stays. ``cb(removed count, exc)``."""
        self._call(lambda: self.engine.unbind_super_stream(name, partition, binding_key),
                   self._super_changed(name, cb, op=("unbind", partition, binding_key)))

    def forget_super_stream(self, name, cb):
        """Remove super stream ``name``'s definition, keeping its partition streams (RabbitMQ deleting
        the exchange); ``cb(exc)``."""
        self._call(lambda: self.engine.forget_super_stream(name),
                   self._super_changed(name, lambda res, exc: cb(exc), op=("delete",)))

    def create_super_stream(self, name, partitions, binding_keys, arguments, cb):
        """Create the partitions and the definition in one engine transaction; ``cb(exc)``. In a cluster,
        StreamExists also when etcd holds a definition of ``name`` this node has not applied yet."""
        cluster = self.cluster
        if cluster is not None:
            cb = cluster.hold_create(list(partitions), cb)

        def create():
            self._call(lambda: self.engine.create_super_stream(name, partitions, binding_keys, arguments),
                       self._super_changed(name, lambda res, exc: cb(exc), created=True))
        if cluster is None:
            create()
            return
        # (also when this node holds a definition: it may be one the cluster deleted a moment ago)
        cluster.superstreams.lookup(name, lambda defined: cb(StreamExists(
            f"super stream {name!r} already exists on the cluster")) if defined else create(), partitions)

    def delete_super_stream(self, name, cb):
        """Delete the definition and its partitions in one engine transaction; ``cb(exc)``; then the
        sessions hear of each partition's deletion. In a cluster every partition goes on every node, also
        those this node holds no copy of (answered once etcd holds it: shells/cluster/deletion.py)."""
        parts = [p for p in (self.partitions(name) or ()) if self.cluster is not None or self.engine.has_stream(p)]
        self._deleting_enter(parts)
        done = lambda res, exc: self._deleted_then(parts, cb, exc)   # noqa: E731
        if self.cluster is not None:
            done = self.cluster.hold_delete(parts, done)
        self._call(lambda: self.engine.delete_super_stream(name), self._super_changed(name, done, op=("delete",)))

    def _super_changed(self, name, cb, created=False, op=None):
        # in a cluster, a definition changed here is written to etcd for every node (shells/cluster/superstreams.py):
        # the change (``op``) is announced before the engine makes it, so that no reconcile undoes it meanwhile
        if self.cluster is None:
            return cb
        self.cluster.superstreams.begin(name)

        def done(res, exc):
            if exc is None:
                self.cluster.superstreams.changed(name, created, op)
            else:
                self.cluster.superstreams.ended(name)
            cb(res, exc)
        return done

    def _import_legacy_super_streams(self, path):
        # Super streams used to live in a JSON file beside LMDB; adopt them once, then rename the file.
        if not os.path.exists(path):
            return
        try:
            with open(path, encoding="utf-8") as f:
                defs = json.load(f).get("super_streams", {})
            for name, d in defs.items():
                if self.engine.super_stream(name) is None:
                    self.engine.create_super_stream(name, d["partitions"], d["binding_keys"], d.get("arguments"),
                                                    adopt=True).result(timeout=60)
            os.replace(path, path + ".imported")
            log.info("imported %d super stream definition(s) from %s", len(defs), path)
        except (OSError, ValueError, KeyError, RiverbedError) as e:
            log.error("cannot import the super streams of %s: %s", path, e)

    # -------------------------------------------------------------------------- reading, waiting

    def resolve(self, stream, spec):
        """The offset a reader of ``spec`` (an engine OffsetSpec) starts at. Raises StreamNotFound,
        InvalidArgument."""
        return self.engine.resolve(stream, spec)

    def resolve_after_writes(self, stream, spec, cb):
        """``cb(offset, exc)`` with ``spec`` resolved once every write the engine had already accepted
        has committed: a NEXT reader then starts after every message the broker received before it
        asked, not just the committed ones. In a cluster, on a node that does not lead ``stream``, NEXT
        is also resolved only once this node's copy holds what the leader has committed now
        (:meth:`catch_up`; at most ``--replication-timeout`` later)."""
        def resolved(res, exc):
            if exc is None:
                try:
                    res = self.engine.resolve(stream, spec)
                except RiverbedError as e:
                    res, exc = None, e
            cb(res, exc)
        if spec.kind != "next":
            resolved(None, None)
            return
        # in a cluster, on a node that does not lead the stream, NEXT is the committed end as the leader
        # knows it: this node's copy catches up to it first (catch_up), so a subscriber on a member a few
        # chunks behind does not start before records the leader had confirmed when it asked
        self.catch_up(stream, lambda: self._call(self.engine.sync, resolved))

    def read_chunks(self, stream, offset, n):
        """Up to ``n`` committed chunks from the one holding ``offset`` (engine.read_chunks)."""
        return self.engine.read_chunks(stream, offset, n)

    def read_chunk_views(self, stream, offset, fn, n, max_bytes):
        """``fn(chunks)`` over up to ``n`` committed chunks from the one holding ``offset``, read in place:
        memoryviews valid only during ``fn`` (engine.read_chunk_views)."""
        return self.engine.read_chunk_views(stream, offset, fn, n, max_bytes)

    def committed_chunk_id(self, stream):
        try:
            return self.engine.committed_chunk_id(stream)
        except StreamNotFound:
            return 0

    def watch(self, stream, offset, cb):
        """``cb(exc)`` on the loop thread once a committed chunk holds ``offset`` (exc None), or the
        stream is deleted (StreamNotFound). Returns a cancel function."""
        return self.engine.watch(stream, offset, lambda exc: self._post(cb, exc))

    def first_matching_chunk(self, stream, offset, filters, match_unfiltered):
        """The id of the first user chunk at or after ``offset`` whose bloom filter may match
        ``filters``, or the stream's next offset when none does."""
        pos = offset
        while True:
            chunks = self.engine.read_chunks(stream, pos, 64)
            if not chunks:
                return self.engine.resolve(stream, OffsetSpec.next())
            for chunk_id, raw in chunks:
                if core.chunk_bloom_match(raw, filters, match_unfiltered):
                    return chunk_id
                pos = chunk_id + _records.chunk_span(raw)[1]

    def read_records(self, stream, offset, max_chunks, stop=None):
        """Committed records of ``stream`` from ``offset``, at most ``max_chunks`` chunks' worth:
        ``(batches, next_offset)`` (:func:`riverbed.shells.broker.records.read_records`: a list of
        :class:`~riverbed.shells.broker.records.RecordBatch`, each record with its offset, timestamp and
        decoded view). Raises StreamNotFound, ChunkError. Any thread (a read transaction of its own)."""
        return _records.read_records(self, stream, offset, max_chunks, stop)

    def scan_records(self, stream, start, stop, batch_chunks=16):
        """Yield ``(offset, timestamp, view)`` for every committed record in ``[start, stop)``, reading
        ``batch_chunks`` chunks at a time (:func:`riverbed.shells.broker.records.scan_records`). Raises
        StreamNotFound, ChunkError."""
        return _records.scan_records(self, stream, start, stop, batch_chunks)

    # -------------------------------------------------------------------------- appends, barriers

    @staticmethod
    def _barrier_enter(table, key):
        entry = table.get(key)
        if entry is None:
            entry = table[key] = [0, []]
        entry[0] += 1

    @staticmethod
    def _barrier_leave(table, key):
        entry = table[key]
        entry[0] -= 1
        if entry[0] == 0:
            del table[key]
            for fn in entry[1]:
                fn()

    @staticmethod
    def _after_writes(table, key, read, cb):
        # read-your-writes: answer ``cb(read(), None)`` once the writes in flight under ``key`` commit
        def answer():
            try:
                cb(read(), None)
            except RiverbedError as e:
                cb(None, e)
        entry = table.get(key)
        if entry is None:
            answer()
        else:
            entry[1].append(answer)

    # Every append below takes ``forward``: in a cluster, a stream another node leads gets the append
    # forwarded to that leader (shells/cluster/forward.py) and ``cb`` has the leader's offsets once its
    # majority holds the records. ``forward=False`` refuses it instead with NotLeaderError (the Kafka
    # shell, whose clients find the leader themselves). Without a cluster ``forward`` changes nothing.

    def append(self, stream, data, ids, publisher, filters, cb, num_entries=None, num_records=None, *,
               forward=True):
        """Append an Osiris data section; ``cb(AppendResult, exc)`` after the commit. ``num_entries`` and
        ``num_records``, when given, must be exact."""
        self._appended(lambda on_done: self.engine.append_entries(
            stream, data, publishing_ids=ids, publisher=publisher, filter_values=filters,
            num_entries=num_entries, num_records=num_records, on_done=on_done), stream, publisher, cb, len(data),
            forward and (lambda: (ids, filters, num_entries, num_records, data)))

    def append_chunk(self, stream, chunk, ids, publisher, cb, num_entries, num_records, crc_done=True, *,
                     forward=True):
        """Append a sealed chunk (wire.publish_chunk); ``cb(AppendResult, exc)`` after the commit. The
        counts must be exact; the chunk belongs to the engine from here on. ``crc_done=False``: its
        header CRC is left for the engine to compute (Engine.append_chunk)."""
        self._appended(lambda on_done: self.engine.append_chunk(
            stream, chunk, num_entries=num_entries, num_records=num_records, publishing_ids=ids,
            publisher=publisher, crc_done=crc_done, on_done=on_done), stream, publisher, cb, len(chunk),
            forward and (lambda: (ids, None, num_entries, num_records, memoryview(chunk)[LEN_CHUNK_HEADER:])))

    def append_chunk_now(self, stream, chunk, ids, publisher, num_entries, num_records, crc_done=True,
                         replicated=False):
        """:meth:`append_chunk` done before this returns, or not at all: ``(AppendResult, None)`` or
        ``(None, exc)`` once the engine committed it (or refused it) on this thread, else None (the disk
        alarm on, completions not yet delivered, the engine cannot commit it inline: Engine.append_chunk_now,
        or a cluster, see below); then nothing was done and the caller uses :meth:`append_chunk`. Nothing
        is in flight in between, so no budget or barrier is taken. In a cluster only on the stream's leader
        and only with ``replicated``: the caller then confirms a committed append through
        :meth:`hold_replicated`, not at once. Loop thread only."""
        disk = self.disk
        cluster = self.cluster
        if ((cluster is not None and (not replicated or cluster.check_write(stream) is not None))
                or (disk is not None and disk.alarm) or self._inbox):
            # completions still to deliver go first: a confirm never overtakes an earlier one
            return None
        got = self.engine.append_chunk_now(stream, chunk, num_entries=num_entries, num_records=num_records,
                                           publishing_ids=ids, publisher=publisher, crc_done=crc_done)
        if got is not None and disk is not None and isinstance(got[1], StorageFull):
            self._post(disk.check)
        return got

    def hold_replicated(self, stream, publisher, result, cb):
        """After :meth:`append_chunk_now` (``replicated``) committed ``result`` on a cluster leader:
        ``cb(result, exc)`` once a majority of the stream's members hold it (shells/cluster: the member
        ACK that makes the majority runs it), or with the error that ends the wait (ReplicationTimeout,
        NotLeader). A named publisher's QueryPublisherSequence waits for it meanwhile, as for
        :meth:`append_chunk`. Loop thread only."""
        if publisher:
            key = (stream, publisher)
            self._barrier_enter(self._seq_writes, key)
            inner = cb

            def cb(res, exc):
                self._barrier_leave(self._seq_writes, key)
                inner(res, exc)
        self.cluster.hold(stream, cb)(result, None)

    def append_records(self, stream, records, cb, *, forward=True):
        """Append ``records`` (bytes each, e.g. :func:`riverbed.engine.record.encode_record`), contiguous
        and in order; ``cb(AppendResult, exc)`` after the commit."""
        self._appended(lambda on_done: self.engine.append(stream, records, on_done=on_done), stream, None, cb,
                       sum(map(len, records)),
                       forward and (lambda: (None, None, len(records), len(records), core.encode_entries(records))))

    def append_or_create(self, stream, records, cb, *, forward=True):
        """Append ``records`` as :meth:`append_records` does, creating ``stream`` with default arguments
        first when it does not exist (:meth:`ensure_stream`): the one way a shell publishes to a stream
        that may not exist yet. ``cb(AppendResult, exc)`` after the commit; exc is the creation's error
        when the stream could not be made (InvalidArgument for a bad name, ...), else the append's.
        Appends to one stream are submitted in call order, also across a creation in flight. Permission
        checks (write, and configure for the creation) are the caller's."""
        if stream not in self._creating and self.has_stream_anywhere(stream):
            self.append_records(stream, records, cb, forward=forward)
            return

        def ready(exc):
            if exc is not None:
                cb(None, exc)
            else:
                self.append_records(stream, records, cb, forward=forward)
        self.ensure_stream(stream, ready)

    def write_refusal(self):
        """The StorageFull every publish gets now (the disk alarm is on: disk.py), or None. A shell that
        writes records without :meth:`append` and its siblings (a transaction) asks this first."""
        disk = self.disk
        return disk.error() if disk is not None and disk.alarm else None

    def _appended(self, submit, stream, publisher, cb, size, forwarded=None):
        disk = self.disk
        if disk is not None and disk.alarm:
            # below the disk-free limit (or at --max-disk): refused before the engine, nothing stored
            disk.refused += 1
            cb(None, disk.error())
            return
        cluster = self.cluster
        if cluster is not None:
            # a replicated stream: only its leader appends, and a confirm waits for a majority of members
            refusal = cluster.check_write(stream)
            if refusal is not None:
                if not forwarded:
                    cb(None, refusal)
                    return
                # another node leads it: the leader stores it and confirms (``forwarded()`` is what to send)
                ids, filters, num_entries, num_records, data = forwarded()
                forwarding = cluster.forwarding
                # the forwarder answers on the loop thread already: its callback needs no hand-off
                self._appended_counted(lambda on_done: forwarding.append(
                    stream, publisher, ids, filters, num_entries, num_records, data, on_done),
                    stream, publisher, cb, size, local=False)
                return
            cb = cluster.hold(stream, cb)
        self._appended_counted(submit, stream, publisher, cb, size)

    def _appended_counted(self, submit, stream, publisher, cb, size, local=True):
        # every append counts against the broker-wide in-flight budget until it completes, whoever asked
        # for it and whether or not that connection is still there (sessions check inflight.over())
        budget = self.inflight
        budget.acquire(size)
        counted = cb

        def cb(res, exc):
            budget.release(size)
            counted(res, exc)
        # a named publisher's in-flight appends hold back QueryPublisherSequence (read-your-writes)
        key = (stream, publisher) if publisher else None
        if key is not None:
            inner = cb

            def cb(res, exc):
                self._barrier_leave(self._seq_writes, key)
                inner(res, exc)
            self._barrier_enter(self._seq_writes, key)
        try:
            submit(self._done(cb) if local else cb)
        except RiverbedError as e:
            cb(None, e)

    def query_publisher_sequence(self, stream, publisher, cb, *, forward=True):
        """``cb(sequence, exc)``, after this broker's in-flight appends of that publisher commit. In a
        cluster, on a node that does not lead ``stream``, the leader answers (forwarded, after those
        appends): a member's copy of the sequences may be behind the leader's."""
        cluster = self.cluster
        if forward and cluster is not None and cluster.check_write(stream) is not None:
            entry = self._seq_writes.get((stream, publisher))
            ask = lambda: cluster.forwarding.query_sequence(stream, publisher, cb)   # noqa: E731
            if entry is None:
                ask()
            else:
                entry[1].append(ask)
            return
        self._after_writes(self._seq_writes, (stream, publisher),
                           lambda: self.engine.query_publisher_sequence(stream, publisher), cb)

    # ------------------------------------------------------------------- offsets, durable positions

    def store_offset(self, stream, reference, offset, cb=None, *, forward=True):
        """Store a consumer offset (a named durable position); ``cb(exc)`` after the commit. In a cluster,
        on a node that does not lead ``stream``, it is stored by the leader (forwarded: it then reaches
        every member with the log) and here too once the leader has it, so a query here reads it back;
        ``forward=False`` keeps it on this node only."""
        key = (stream, reference)
        cluster = self.cluster
        if forward and cluster is not None and cluster.check_write(stream) is not None:
            self._barrier_enter(self._offset_writes, key)

            def answered(exc):
                self._barrier_leave(self._offset_writes, key)
                if exc is not None:
                    log.info("storing offset %r on %r through its leader failed: %s", reference, stream, exc)
                if cb is not None:
                    cb(exc)

            def forwarded(exc):
                if exc is not None:
                    answered(exc)
                    return
                try:
                    # here too, so that a query on this node reads it back at once
                    self.then(self.engine.store_offset(stream, reference, offset), lambda res, e: answered(None))
                except RiverbedError:
                    answered(None)      # no local copy yet: this member gets it with the log
            cluster.forwarding.store_offset(stream, reference, offset, forwarded)
            return
        try:
            fut = self.engine.store_offset(stream, reference, offset)
        except RiverbedError as e:
            log.info("storing offset %r on %r refused: %s", reference, stream, e)
            if cb is not None:
                cb(e)
            return
        self._barrier_enter(self._offset_writes, key)

        def done(res, exc):
            self._barrier_leave(self._offset_writes, key)
            if exc is not None:
                log.info("storing offset %r on %r failed: %s", reference, stream, exc)
            if cb is not None:
                cb(exc)
        self.then(fut, done)

    def query_offset(self, stream, reference, cb):
        """``cb(offset or None, exc)``, after in-flight stores of that reference commit, so a client
        reads back what it (or a consumer it replaced) just stored."""
        self._after_writes(self._offset_writes, (stream, reference),
                           lambda: self.engine.query_offset(stream, reference), cb)

    def delete_offset(self, stream, reference, cb=None):
        """Forget the stored offset of ``reference``; ``cb(exc)`` after the commit."""
        def drop(ctx):
            if ctx.has_stream(stream):
                ctx.delete_offset(stream, reference)
        self.transact(drop, lambda res, exc: cb and cb(exc))

    # ---------------------------------------------------------------------------- transactions

    def transact(self, stage, cb):
        """Run ``stage(ctx)`` on the engine's writer thread inside one transaction of the log and the
        document store (:meth:`riverbed.engine.Engine.transact`): ``ctx.append``, ``ctx.store_offset``
        and ``self.docs.stage_*`` staged there commit together or not at all. ``cb(result, exc)`` runs on
        the loop thread after the commit and the fsync the policy asks for (a success means stored),
        with ``stage``'s return value; if ``stage`` raises, nothing it staged is kept and ``exc`` is
        what it raised. An error known at once (a closed engine: RiverbedError) goes to ``cb`` too.

        ``stage`` may run more than once (a retried transaction when the map grows) and on another
        thread: it must touch nothing but ``ctx`` and the document store's ``stage_*`` functions.

        On a cluster (shells/cluster/docs.py) a transaction of documents is acknowledged once its
        changelog record is committed and applied here; one of events once a majority of each stream's
        members holds them, and only on a node that leads every stream it appends to (else NotLeader)."""
        if self.transactions is not None:
            self.transactions.transact(stage, cb)
            return
        self._call(lambda: self.engine.transact(stage), cb)

    # ---------------------------------------------------------------------- monitoring (read only)

    def stream_states(self):
        """The committed state of every stream (engine ``layout._Stream`` objects: ``name``, ``sid``,
        ``records``, ``bytes``, ``chunks``, ``first_chunk``, ``next_offset``), as a new list. Memory
        only, never blocks; any thread. [] on a read-only engine."""
        return _engine_stats.stream_states(self.engine)

    @property
    def engine_stats(self):
        """The engine's group-commit counters and latencies, and ``opened_at`` (stream id -> next offset
        when the engine opened): a :class:`riverbed.engine.stats.EngineStats`. Read it, never write it."""
        return self.engine.stats

    def writer_alive(self):
        """Whether the engine's writer thread runs and takes writes (False after a fatal error, during
        shutdown, and for a read-only engine). Any thread."""
        return _engine_stats.writer_alive(self.engine)

    def map_usage(self):
        """``(LMDB map size, bytes in use)``, or None once the engine is closed. Any thread."""
        return _engine_stats.map_usage(self.engine)
