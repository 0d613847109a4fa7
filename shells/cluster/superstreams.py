"""Super stream definitions shared by every node of a cluster, through etcd.

A super stream's definition (its partitions, binding keys, orders and arguments) lives in each node's
engine; the partition streams themselves are placed and replicated like any stream (node.py). This
module keeps the definitions the same on every node: etcd holds one key per super stream,
``<prefix>superstreams/<name>``, whose JSON value is ``{"name", "definition"}`` (the engine's dict) or
``{"name", "deleted": true}`` (a tombstone, so that a node that was away drops its copy instead of
publishing it again).

* A client's change on any node (RabbitMQ CreateSuperStream/DeleteSuperStream, the management API's
  exchanges and bindings, Kafka CreateTopics/DeleteTopics/CreatePartitions: all go through the broker's
  super stream methods) calls :meth:`SuperStreams.changed`, which writes the node's definition to etcd by
  compare-and-swap on the key's revision (retried when another node changed it meanwhile). A creation
  never overwrites a live definition another node wrote first: this node takes that one on its next poll.
* Every poll (:meth:`SuperStreams.refresh`, from the node's control loop) applies what etcd holds to the
  local engine (definitions only: the partitions come with their placements), and publishes definitions
  etcd has never seen (made before the cluster, or while etcd was away).

Everything runs on the node's event loop.
"""

import asyncio
import logging

from riverbed.engine.errors import RiverbedError
from riverbed.shells.cluster.etcd import EtcdError

log = logging.getLogger("riverbed.cluster")

KEY_DIR = "superstreams/"
CAS_TRIES = 5          # compare-and-swap rounds before a write gives up until the next poll


class SuperStreams:
    """The super stream definitions of one node (``node``: a ClusterNode) kept in step with etcd."""

    def __init__(self, node):
        self.node = node
        self.engine = node.engine
        self.dirty = set()         # names changed here whose write to etcd is pending
        self.generation = 0        # raised by every local change and every end of its write to etcd
        self._pushes = {}          # name -> the task writing its latest local change to etcd
        self._lock = asyncio.Lock()

    def _key(self, name):
        return self.node.prefix + KEY_DIR + name

    # --------------------------------------------------------------------------- local changes

    def changed(self, name, created=False):
        """Broker hook, on the loop, after a client's change to super stream ``name`` committed here:
        write the node's definition (or a tombstone when it is gone) to etcd. ``created``: the change
        made the super stream (then a live definition in etcd is left as it is)."""
        self.dirty.add(name)
        self.generation += 1
        task = self._pushes[name] = asyncio.get_running_loop().create_task(self._push(name, created))
        task.add_done_callback(lambda t: self._pushes.pop(name, None) if self._pushes.get(name) is t else None)

    async def written(self, name):
        """Return once the latest local change to ``name`` is written to etcd (or its write gave up: it
        logged why), at once when none is under way: a deletion is answered only after its tombstone is
        there, so the name is free on every node."""
        task = self._pushes.get(name)
        if task is not None:
            await asyncio.wait([task])      # its outcome is the push's to log, not the waiter's

    async def _push(self, name, created):
        try:
            async with self._lock:
                for _ in range(CAS_TRIES):
                    if await self._write(name, created):
                        break
        except EtcdError as e:
            log.warning("cluster: cannot write super stream %s to etcd: %s", name, e)
        finally:
            self.dirty.discard(name)
            self.generation += 1

    async def _write(self, name, created):
        d = self.engine.super_stream(name)
        value = {"name": name, "definition": d} if d is not None else {"name": name, "deleted": True}
        kv = await self.node.etcd.get(self._key(name))
        if kv is None:
            return await self.node.etcd.create(self._key(name), value)
        try:
            held = kv.json()
        except ValueError:
            held = {}
        if created and not held.get("deleted") and held.get("definition") is not None:
            return True          # another node made it first: the poll brings its definition here
        if held == value:
            return True
        return await self.node.etcd.replace(self._key(name), kv.mod_revision, value)

    def lookup(self, name, cb, partitions=()):
        """``cb(defined)`` on the loop: whether etcd holds a live definition of super stream ``name`` (a
        creation here must not shadow one another node made since this node's last poll). False when
        etcd does not answer: the creation goes on, and the poll reconciles once etcd is back. Each of
        ``partitions`` that etcd no longer places is forgotten here first (deleted a moment ago, before
        this node's reconcile saw it: the new partition must be placed anew, not taken for the old one)."""
        async def ask():
            try:
                kv = await self.node.etcd.get(self._key(name))
                held = kv.json() if kv is not None else {}
                defined = isinstance(held, dict) and not held.get("deleted") and held.get("definition") is not None
                for p in partitions:
                    if p in self.node.placements and await self.node.etcd.get(self.node.prefix + "streams/" + p) is None:
                        self.node.placements.pop(p, None)
            except (EtcdError, ValueError) as e:
                log.warning("cluster: cannot ask etcd about super stream %s: %s", name, e)
                defined = False
            cb(defined)
        asyncio.get_running_loop().create_task(ask())

    # ------------------------------------------------------------------------------------ poll

    async def refresh(self, kvs=None, generation=None):
        """Apply etcd's definitions here; publish local ones etcd has never held. ``kvs``: the keys under
        KEY_DIR as the node's poll read them when :attr:`generation` was ``generation``; they are used
        only if no local change began or ended since (else they may predate this node's own write, and
        applying them would undo it): then, or without them, they are read here. EtcdError when etcd
        does not answer (the node's control loop logs it)."""
        held = {}
        if kvs is None or generation != self.generation:
            kvs = await self.node.etcd.get_prefix(self.node.prefix + KEY_DIR)
        for kv in kvs:
            try:
                v = kv.json()
                held[v["name"]] = v
            except (ValueError, KeyError, TypeError):
                continue
        for name, v in held.items():
            if name in self.dirty:
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
            if name not in held and name not in self.dirty:
                self.changed(name, created=True)

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
        return put


def _well_formed(d):
    """Whether ``d`` is a definition the engine can hold (etcd is shared: anything may have written it)."""
    if not isinstance(d, dict):
        return False
    parts, keys, orders = d.get("partitions"), d.get("binding_keys"), d.get("orders")
    return (isinstance(parts, list) and isinstance(keys, list) and len(parts) == len(keys)
            and all(isinstance(x, str) for x in parts + keys)
            and (orders is None or isinstance(orders, list) and len(orders) == len(parts))
            and isinstance(d.get("arguments") or {}, dict))
