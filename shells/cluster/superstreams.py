"""Super stream definitions shared by every node of a cluster, through etcd.

A super stream's definition (its partitions, binding keys, orders and arguments) lives in each node's
engine; the partition streams themselves are placed and replicated like any stream (node.py). This
module keeps the definitions the same on every node: etcd holds one key per super stream,
``<prefix>superstreams/<name>``, whose JSON value is ``{"name", "definition"}`` (the engine's dict) or
``{"name", "deleted": true}`` (a tombstone, so that a node that was away drops its copy instead of
publishing it again).

* A client's change on any node (RabbitMQ CreateSuperStream/DeleteSuperStream, the management API's
  exchanges and bindings, Kafka CreateTopics/DeleteTopics/CreatePartitions: all go through the broker's
  super stream methods) is announced before it is made (:meth:`SuperStreams.begin`) and, once committed
  here, written to etcd (:meth:`SuperStreams.changed`) as **the change itself** (an :class:`Op`: bind,
  unbind, delete) applied to the definition etcd holds now, by compare-and-swap on the key's revision
  (retried when another node changed it meanwhile). Writing the node's whole definition instead lost
  updates: a node that had not yet seen another node's bindings wrote its own list over them, and the
  last writer's list was the cluster's (issue 23: a Kafka topic that lost a partition on every node). A
  creation never overwrites a live definition another node wrote first: this node takes that one.
* Every reconcile (:meth:`SuperStreams.refresh`) applies what etcd holds to the local engine
  (definitions only: the partitions come with their placements), except to a name with a change of this
  node under way (from ``begin`` until its write to etcd ended: applying etcd's older copy would undo
  it), and publishes definitions etcd has never seen (made before the cluster, or while etcd was away).
* A deleted definition leaves a tombstone ``{"name", "deleted": true, "holders", "at"}``: ``holders``
  are the nodes that ever joined (every node keeps every definition). It is collected as a stream's
  tombstone is (deletion.py): each holder that no longer has the definition takes itself off by
  compare-and-swap and the last one deletes it; one older than ``--tombstone-max-age`` goes whoever is
  still listed. A node that comes back after that still holds the definition, which etcd then neither
  holds nor tombstones: as with a stream's copy (incarnation.py), the node records, in its engine's
  ``meta`` database under ``cluster-superstream/<name>``, the cluster id of the etcd data a definition
  was in, so such a definition is an **orphan** and goes, while one never in etcd (made before the
  cluster or while etcd was away) is published.

Everything runs on the node's event loop.
"""

import asyncio
import logging
import time

from riverbed.engine.errors import RiverbedError
from riverbed.engine.supers import with_binding, without_binding
from riverbed.shells.cluster import deletion
from riverbed.shells.cluster.etcd import EtcdError

log = logging.getLogger("riverbed.cluster")

KEY_DIR = "superstreams/"
RECORD_PREFIX = b"cluster-superstream/"    # engine meta key: this definition was in this cluster's etcd
CAS_TRIES = 5          # compare-and-swap rounds before a write gives up until the next poll
# seconds after which a change begun here, neither written nor ended (a caller that failed in between),
# no longer keeps etcd's copy from being applied here
BEGUN_STALE = 60.0
SETTLE_TTLS = 2        # lease TTLs a creation waits for this node to drop what the cluster deleted
SETTLE_POLL = 0.02     # seconds between two looks while it waits


class Op:
    """One client change to a super stream's definition, as it is applied to the copy etcd holds:
    ``bind`` (partition, binding key, order), ``unbind`` (partition, or a tuple of partitions; binding
    key, or None: all of each partition's), ``delete`` (the definition goes: a tombstone). Immutable."""

    __slots__ = ("kind", "partition", "binding_key", "order")

    def __init__(self, kind, partition=None, binding_key=None, order=None):
        if kind not in ("bind", "unbind", "delete"):
            raise ValueError(f"no such change to a super stream: {kind!r}")
        if kind == "bind":
            binding_key, order = str(binding_key), None if order is None else int(order)
        self.kind, self.partition, self.binding_key, self.order = kind, partition, binding_key, order

    def apply(self, held):
        """The definition after this change to ``held`` (etcd's live definition, or None when etcd holds
        none or a tombstone): a dict, None for a tombstone, or ``held`` itself when nothing changes. A
        binding on a definition deleted meanwhile on another node changes nothing: the deletion wins, as
        a binding to an exchange deleted a moment before fails on RabbitMQ."""
        if self.kind == "delete":
            return None
        if held is None:
            return held
        if self.kind == "bind":
            return with_binding(held, self.partition, self.binding_key, self.order)[0]
        d = held
        for p in self.partition if isinstance(self.partition, tuple) else (self.partition,):
            d = without_binding(d, p, self.binding_key)[0]
        return d


def unbind(partition, binding_key=None):
    """The :class:`Op` unbinding ``partition`` (or each of a tuple of partitions)."""
    return Op("unbind", partition, binding_key)


class SuperStreams:
    """The super stream definitions of one node (``node``: a ClusterNode) kept in step with etcd."""

    def __init__(self, node):
        self.node = node
        self.engine = node.engine
        self.dirty = {}            # name -> changes made here (begun) whose write to etcd has not ended
        self._begun_at = {}        # name -> when its latest change began (time.monotonic())
        self.generation = 0        # raised by every local change and every end of its write to etcd
        self._pushes = {}          # name -> the task writing its latest local change to etcd
        self._lock = asyncio.Lock()

    def _key(self, name):
        return self.node.prefix + KEY_DIR + name

    # --------------------------------------------------------------------------- local changes

    def begin(self, name):
        """Broker hook, on the loop, before a client's change to super stream ``name`` is submitted to the
        engine: from now until its write to etcd ends, no reconcile applies etcd's copy of ``name`` here
        (the change may commit before its completion reaches the loop; an apply in between would undo
        it). Each call is closed by one :meth:`changed` or :meth:`ended`."""
        self.dirty[name] = self.dirty.get(name, 0) + 1
        self._begun_at[name] = time.monotonic()
        self.generation += 1

    def ended(self, name):
        """Close a :meth:`begin` whose change failed here (nothing to write)."""
        n = self.dirty.get(name, 0) - 1
        if n > 0:
            self.dirty[name] = n
        else:
            self.dirty.pop(name, None)
            self._begun_at.pop(name, None)
        self.generation += 1

    def busy(self, name):
        """Whether a change to ``name`` is under way here (begun, its write to etcd not ended): then etcd's
        copy is not applied here. One begun over BEGUN_STALE seconds ago with no write running was never
        closed (its caller failed): it is dropped, so that the node does not stop following etcd."""
        if name not in self.dirty:
            return False
        if name in self._pushes or time.monotonic() - self._begun_at.get(name, 0.0) < BEGUN_STALE:
            return True
        log.warning("cluster: a change to super stream %s began here and never ended; following etcd again", name)
        self.dirty.pop(name, None)
        self._begun_at.pop(name, None)
        return False

    def changed(self, name, created=False, op=None):
        """Broker hook, on the loop, after a client's change to super stream ``name`` committed here
        (closing its :meth:`begin`): write it to etcd. ``op`` (an :class:`Op`, or the tuple of its
        arguments): the change, applied to etcd's copy; None: the node's whole definition is written
        (``created``: the change made the super stream; a live definition in etcd is then left as it is
        and taken here)."""
        if isinstance(op, tuple):
            op = Op(*op)        # as the broker names it: ("bind", partition, key, order), ("delete",), ...
        self.generation += 1
        task = self._pushes[name] = asyncio.get_running_loop().create_task(self._push(name, created, op))
        task.add_done_callback(lambda t: self._pushes.pop(name, None) if self._pushes.get(name) is t else None)

    async def written(self, name):
        """Return once the latest local change to ``name`` is written to etcd (or its write gave up: it
        logged why), at once when none is under way: a deletion is answered only after its tombstone is
        there, so the name is free on every node."""
        task = self._pushes.get(name)
        if task is not None:
            await asyncio.wait([task])      # its outcome is the push's to log, not the waiter's

    async def _push(self, name, created, op):
        try:
            async with self._lock:      # one write at a time, in the order the changes were made here
                for _ in range(CAS_TRIES):
                    outcome = await self._write(name, created, op)
                    if outcome is not None:
                        self._record(name, outcome)
                        break
                else:
                    log.warning("cluster: super stream %s kept changing in etcd; this node's change to it "
                                "was not written", name)
        except EtcdError as e:
            log.warning("cluster: cannot write super stream %s to etcd: %s", name, e)
        finally:
            self.ended(name)
            if name not in self.dirty:
                self.node.kick()        # take etcd's copy here now (it may hold other nodes' changes)

    def _tombstone(self, name):
        return {"name": name, "deleted": True, "holders": deletion.known_nodes(self.node), "at": time.time()}

    async def _write(self, name, created, op):
        """One compare-and-swap round of a change's write: None when it lost the race (try again), else
        whether etcd now holds a live definition (written, or nothing to write)."""
        kv = await self.node.etcd.get(self._key(name))
        held = {}
        if kv is not None:
            try:
                held = kv.json()
            except ValueError:
                pass
        if not isinstance(held, dict):
            held = {}
        deleted = kv is not None and bool(held.get("deleted"))
        live = held.get("definition") if not deleted and _well_formed(held.get("definition")) else None
        if op is not None and (live is not None or deleted or op.kind == "delete"):
            d = op.apply(live)
            if d is live and kv is not None:
                return live is not None      # nothing changes (a binding there already, or the deletion won)
        else:
            # a creation; or a change to a definition etcd has never held (its first write failed, or it
            # was made while etcd was away): the whole definition, unless another node made one first
            if created and live is not None:
                return True      # the reconcile brings that definition here
            d = self.engine.super_stream(name)
        if d is None:
            if deleted:
                return False     # deleted already: its tombstone (and its collection) stays as it is
            value = self._tombstone(name)
        else:
            value = {"name": name, "definition": d}
            if held == value:
                return True
        if kv is None:
            done = await self.node.etcd.create(self._key(name), value)
        else:
            done = await self.node.etcd.replace(self._key(name), kv.mod_revision, value)
        return (d is not None) if done else None

    def _record(self, name, in_etcd):
        """Record (``in_etcd``) or forget that this node's definition of ``name`` is in this cluster's etcd
        (staged in the next group commit; errors only logged: a missing record makes an orphan look like
        a definition made offline, published again, as before records existed)."""
        cluster = self.node.cluster_id
        if not cluster:
            return

        def stage(ctx):
            _stage_record(ctx, name, cluster if in_etcd else None)
        self.node.broker.transact(stage, lambda res, exc: exc is not None and log.warning(
            "cluster: cannot record super stream %s: %s", name, exc))

    def _orphan(self, name):
        """Whether the local definition of ``name``, which etcd neither holds nor tombstones, was in this
        cluster's etcd once (its tombstone collected since, past --tombstone-max-age): then it goes."""
        cluster = self.node.cluster_id
        raw = self.engine.get_value(self.engine._db_meta, RECORD_PREFIX + name.encode("utf-8"))
        return bool(cluster) and raw == str(cluster).encode()

    def lookup(self, name, cb, partitions=()):
        """``cb(defined)`` on the loop: whether etcd holds a live definition of super stream ``name`` (a
        creation here must not shadow one another node made since this node's last poll). False when
        etcd does not answer: the creation goes on, and the poll reconciles once etcd is back. Each of
        ``partitions`` that etcd no longer places is forgotten here first (deleted a moment ago, before
        this node's reconcile saw it: the new partition must be placed anew, not taken for the old one).
        What the cluster deleted a moment ago and this node still holds (the definition, whose tombstone
        is in etcd, or copies of the partitions, whose tombstones are) is waited for, up to SETTLE_TTLS
        lease TTLs, while the node's reconcile drops it: the name is free on every node once a deletion
        is answered, also on one whose watch is a moment behind."""
        async def ask():
            try:
                kv = await self.node.etcd.get(self._key(name))
                held = kv.json() if kv is not None else {}
                defined = isinstance(held, dict) and not held.get("deleted") and held.get("definition") is not None
                stale_def = (not defined and isinstance(held, dict) and bool(held.get("deleted"))
                             and self.engine.super_stream(name) is not None)
                stale = []
                for p in partitions:
                    if await self.node.etcd.get(self.node.prefix + "streams/" + p) is None:
                        self.node.placements.pop(p, None)
                        if (self.engine.has_stream(p)
                                and await self.node.etcd.get(self.node.prefix + "deleted/" + p) is not None):
                            stale.append(p)
                if not defined and (stale_def or stale):
                    await self._settle(name, stale_def, stale)
            except (EtcdError, ValueError) as e:
                log.warning("cluster: cannot ask etcd about super stream %s: %s", name, e)
                defined = False
            cb(defined)
        asyncio.get_running_loop().create_task(ask())

    async def _settle(self, name, stale_def, stale):
        """Wait (bounded) until this node's reconcile has dropped the definition of ``name`` (when
        ``stale_def``) and its copies of the streams ``stale``, all deleted on the cluster."""
        self.node.kick()
        deadline = time.monotonic() + SETTLE_TTLS * self.node.ttl
        while time.monotonic() < deadline:
            if not (stale_def and self.engine.super_stream(name) is not None) and not any(
                    self.engine.has_stream(p) for p in stale):
                return
            await asyncio.sleep(SETTLE_POLL)

    # ------------------------------------------------------------------------------------ poll

    async def refresh(self, kvs=None, generation=None):
        """Apply etcd's definitions here; publish local ones etcd has never held. ``kvs``: the keys under
        KEY_DIR as the node's poll read them when :attr:`generation` was ``generation``; they are used
        only if no local change began or ended since (else they may predate this node's own write, and
        applying them would undo it): then, or without them, they are read here. EtcdError when etcd
        does not answer (the node's control loop logs it)."""
        held, tombstones = {}, []
        if kvs is None or generation != self.generation:
            kvs = await self.node.etcd.get_prefix(self.node.prefix + KEY_DIR)
        for kv in kvs:
            try:
                v = kv.json()
                held[v["name"]] = v
                if v.get("deleted"):
                    tombstones.append((kv, v))
            except (ValueError, KeyError, TypeError, AttributeError):
                continue
        for name, v in held.items():
            if self.busy(name):
                continue
            local = self.engine.super_stream(name)
            if v.get("deleted"):
                if local is not None:
                    log.info("cluster: %s forgets super stream %s (deleted on the cluster)", self.node.name, name)
                    await self._apply(name, None)
            elif not _well_formed(v.get("definition")):
                log.warning("cluster: etcd holds a malformed definition of super stream %s; ignored", name)
            elif local != v["definition"]:
                await self._apply(name, v["definition"])
        for name in self.engine.list_super_streams():
            if name not in held and not self.busy(name):
                if self._orphan(name):
                    log.info("cluster: %s forgets super stream %s (deleted on the cluster while it was away: "
                             "an orphan)", self.node.name, name)
                    await self._apply(name, None)
                else:
                    self.begin(name)
                    self.changed(name, created=True)
        # tombstones: this node takes itself off once the definition is gone here (applied above)
        await deletion.collect_tombstones(self.node, tombstones, lambda name: (
            self.busy(name) or self.engine.super_stream(name) is not None))

    async def _apply(self, name, definition):
        try:
            await asyncio.wrap_future(self.engine.transact(self._applier(name, definition)))
        except RiverbedError as e:      # an engine closing under the poll: the next poll tries again
            log.warning("cluster: cannot apply super stream %s here: %s", name, e)

    def _applier(self, name, definition):
        def put(ctx):
            if name in self.dirty:      # a client changed it here meanwhile: that change wins
                return
            if definition is None:
                if ctx.super_stream(name) is not None:
                    ctx.drop_super_stream(name)
            else:
                ctx.put_super_stream(name, definition)
            _stage_record(ctx, name, self.node.cluster_id if definition is not None else None)
        return put


def _stage_record(ctx, name, cluster):
    """Stage the record of ``name``'s definition: in the etcd data of ``cluster`` (an id), or none."""
    key = RECORD_PREFIX + name.encode("utf-8")
    if cluster:
        ctx.txn.put(key, str(cluster).encode(), db=ctx.engine._db_meta)
        ctx._staged.dirty = True
    elif ctx.txn.delete(key, db=ctx.engine._db_meta):
        ctx._staged.dirty = True


def _well_formed(d):
    """Whether ``d`` is a definition the engine can hold (etcd is shared: anything may have written it)."""
    if not isinstance(d, dict):
        return False
    parts, keys, orders = d.get("partitions"), d.get("binding_keys"), d.get("orders")
    return (isinstance(parts, list) and isinstance(keys, list) and len(parts) == len(keys)
            and all(isinstance(x, str) for x in parts + keys)
            and (orders is None or isinstance(orders, list) and len(orders) == len(parts))
            and isinstance(d.get("arguments") or {}, dict))
