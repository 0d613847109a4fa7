"""One Riverbed node in a cluster: membership in etcd, stream placement and leadership, replication.

:class:`ClusterNode` is this module's state, life cycle (``start``, ``register``, ``stop``), reconcile with
the cluster state (``_refresh``) and placement of the streams made or deleted here, plus one mixin per
role, each in its own module:

* lease.py (:class:`~riverbed.shells.cluster.lease.LeaseHolder`): the etcd lease and its keep-alive;
* control.py (:class:`~riverbed.shells.cluster.control.ControlLoops`): the control loop and the reconcile loop;
* roles.py (:class:`~riverbed.shells.cluster.roles.Roles`): a stream's role here: follow, elect, lead, resign;
* shell_hooks.py (:class:`~riverbed.shells.cluster.shell_hooks.ShellHooks`): what the broker and the
  shells call (``check_write``, ``hold``, Metadata, ...), and :class:`NotLeader`;
* replication.py (:class:`~riverbed.shells.cluster.replication.ReplicationPlane`): the data plane.

etcd holds, under ``/riverbed/<cluster>/``:

* ``nodes/<node>``: its addresses, under the node's lease (the key goes when the node does);
* ``known/<node>``: every node that ever joined (no lease), so the CLI tells "down" from "unknown";
* ``streams/<stream>``: ``{"epoch", "leader", "members", "arguments"}``, changed only by compare-and-swap
  (and, while a change is under way, ``learners``, ``leaving``, ``given``: see membership.py and
  placement.py);
* ``progress/<stream>/<node>``: how far that member holds the log (``next``, last chunk epoch, committed
  offset, whether it follows a live leader), under the node's lease: for elections and ``cluster status``.

The leader of a stream is the only node that appends to it; its members copy its chunks over the
replication port (replication.py, wire.py) and acknowledge their durable offset. The committed offset is
the highest one a majority of the members hold: the leader's confirms wait for it (``ClusterNode.hold``,
shell_hooks.py: the one hook in the broker) and every node's readers are limited to it (``Engine.set_read_limit``).

When a leader's node key expires, the live members that have lost it report their final position; once
a majority of the members has done so, the one with the highest (epoch of its last chunk, next offset)
takes the stream at epoch + 1 by compare-and-swap and stamps that epoch into its chunks. A member whose
tail does not match the new leader's log truncates it (those chunks were never confirmed). A member
refuses chunks of an epoch older than one it has seen, and a leader whose lease may have expired stops
confirming at once. A member whose dial of a killed leader is refused need not wait for the lease: see
failover.py (the fast path, with its safety argument).

The node does not poll etcd: one watch over the cluster's prefix keeps a copy of its keys
(etcdview.py), and a change to ``nodes/``, ``streams/``, ``deleted/`` or ``superstreams/`` (and to
``progress/`` while the node waits for an election) wakes the reconcile (:meth:`ClusterNode._refresh`)
at once: an expired lease's node key is acted on within milliseconds instead of at the next poll. What
changes with time alone (confirm timeouts, a leader cut off from its members, abstentions, idle observer
copies, progress reports) runs on local timers, and a full read every few TTLs backs the watch up.

Loop thread only (the broker's loop), except the engine completions posted back to it.
"""

import asyncio
import logging
import time

from riverbed.engine.errors import RiverbedError, StreamNotFound
from riverbed.shells.cluster import deletion, incarnation, membership, placement, viewhold
from riverbed.shells.cluster.control import TICK_MAX, ControlLoops
from riverbed.shells.cluster.etcd import Etcd, EtcdError
from riverbed.shells.cluster.etcdview import EtcdView
from riverbed.shells.cluster.failover import LeaderWatch
from riverbed.shells.cluster.forward import Forwarder
from riverbed.shells.cluster.leader_path import SendAhead
from riverbed.shells.cluster.lease import LeaseHolder
from riverbed.shells.cluster.remote_read import Observers
from riverbed.shells.cluster.replication import ReplicationPlane, ReplicationTimeout  # noqa: F401 (re-exported)
from riverbed.shells.cluster.roles import Roles
from riverbed.shells.cluster.sac import ClusterSac
from riverbed.shells.cluster.shell_hooks import NotLeader, ShellHooks
from riverbed.shells.cluster.superstreams import KEY_DIR as SUPERSTREAMS_DIR, SuperStreams

log = logging.getLogger("riverbed.cluster")

DEFAULT_CLUSTER_SIZE = 3
STARTUP_WAIT = 10.0        # seconds a starting node waits for etcd before it gives up
SAFETY_READ_EVERY = 5      # lease TTLs between two full reads of the cluster's keys (the watch's safety net)


def prefix_of(cluster):
    return f"/riverbed/{cluster}/"


class ClusterNode(LeaseHolder, ControlLoops, Roles, ShellHooks, ReplicationPlane):
    """This process as a member of cluster ``cfg.cluster`` (etcd ``cfg.etcd``, name ``cfg.node``).

    ``await start()`` before the listeners start (joins etcd, takes its streams' roles), ``await
    register(addresses)`` once they listen, ``await stop()`` when stopping."""

    def __init__(self, broker, cfg):
        self.broker = broker
        self.engine = broker.engine
        self.name = cfg.node
        self.cluster = cfg.cluster
        self.prefix = prefix_of(cfg.cluster)
        self.etcd = Etcd(cfg.etcd)
        self.ttl = cfg.lease_ttl
        self.replication_timeout = cfg.replication_timeout
        self.tombstone_max_age = getattr(cfg, "tombstone_max_age", None) or deletion.DEFAULT_TOMBSTONE_MAX_AGE
        self.host = cfg.host
        self.replication_port = cfg.replication_port
        self.advertised_replication_port = cfg.advertised_replication_port
        self.address = {"name": self.name, "advertised_host": cfg.advertised_host or cfg.host}
        self.lease = None
        self._lease_until = 0.0       # monotonic time the lease surely lasts until (last keepalive + TTL)
        self.placements = {}          # stream -> (placement dict, mod_revision)
        self.incarnations = {}        # stream -> its placement key's creation revision (incarnation.py)
        self.cluster_id = 0           # the id of the cluster's etcd data (incarnation.py), once started
        self.nodes = {}               # live node -> its registration
        self.leading = {}             # stream -> Leading (replication.py)
        self.following = {}           # stream -> (leader node, epoch, task)
        self.max_epoch = {}           # stream -> highest epoch seen (chunks of older ones are refused)
        self.progress_sent = {}       # stream -> last progress value written
        self.progress_at = {}         # stream -> monotonic time of that write
        self.detached = {}            # stream -> epoch whose leader this member lost
        self.watch = LeaderWatch()    # leaders found gone by a refused dial (failover.py)
        self._server = None
        self._tasks = []
        self._stopping = False
        self.abstain = {}                 # stream -> monotonic time until which this node is no candidate
        self._member_creating = set()     # streams this node creates as a member copy
        self._member_deleting = set()     # streams this node deletes because the cluster did
        self._cluster_deleting = set()    # streams a client deleted here, being removed from etcd
        self.removed_here = set()         # ... and removed from etcd already: the deletion hook leaves etcd alone
        self.pending_leaders = {}         # stream made here -> the node chosen to lead it (placement.py)
        self.placing = set()              # streams whose placement another node is to lead, in flight
        self._placing_here = set()        # streams this node leads whose placement is in flight
        self.handing_off = set()          # streams this leader is giving to another member (membership.py)
        self.forwarding = Forwarder(self)  # publishes and StoreOffsets of streams led elsewhere (forward.py)
        self.superstreams = SuperStreams(self)   # super stream definitions shared through etcd (superstreams.py)
        self.observers = Observers(self)   # streams copied here for readers, without being a member (remote_read.py)
        self.sac = ClusterSac(self, TICK_MAX)     # single-active-consumer groups across the nodes (sac.py)
        # the cluster's keys, kept by one etcd watch (etcdview.py); a change wakes the reconcile loop
        self.etcd_view = EtcdView(self.etcd, self.prefix, self._view_changed, SAFETY_READ_EVERY * self.ttl)
        self._kicked = asyncio.Event()
        self._tick_now = asyncio.Event()  # wakes the control loop (tick_soon)
        self._resting = False             # the control loop sleeps until pace.next_run
        self.holding = 0                  # confirms waiting for a majority, on every stream led here (hold)
        self.role_hooks = []              # fn() after this node begins or stops leading a stream (docs.py)
        self.beat_hooks = []              # fn() on every lease renewal's wake-up, TTL/3 apart (docs.py)
        self._changing = asyncio.Lock()   # a reconcile, a promotion or a resignation: one at a time

    # ------------------------------------------------------------------------------ life cycle

    async def start(self):
        self._server = await asyncio.start_server(self._serve_member, self.host, self.replication_port)
        self.replication_port = self._server.sockets[0].getsockname()[1]
        self.address["replication_port"] = self.advertised_replication_port or self.replication_port
        deadline = time.monotonic() + STARTUP_WAIT
        while True:
            try:
                await self._new_lease()
                self.cluster_id = await incarnation.cluster_id(self)
                break
            except EtcdError as e:
                # etcd busy or still starting: wait a little before giving up (exit status 2)
                if time.monotonic() >= deadline:
                    raise
                log.warning("cluster: etcd not answering yet: %s", e)
                await asyncio.sleep(0.5)
        self.broker.cluster = self
        # a one-message publish's chunk leaves for the members before this node commits it (leader_path.py)
        self.engine.replica_feed = SendAhead(self)
        self.broker.on_stream_created(self._stream_created)
        self.broker.on_stream_deleted(self._stream_deleted)
        await self.etcd_view.resync()
        await self._refresh()
        self.etcd_view.start()          # watches from the revision of the read above: nothing missed
        loop = asyncio.get_running_loop()
        self._tasks = [loop.create_task(self._keepalive_loop()), loop.create_task(self._control_loop()),
                       loop.create_task(self._reconcile_loop())]
        log.info("listening replication %s:%d", self.host, self.replication_port)
        log.info("cluster %s: node %s joined (etcd lease %.1fs)", self.cluster, self.name, self.ttl)

    async def register(self, addresses):
        """Publish this node's listener addresses (``stream_port``, ``http_port``, ...)."""
        self.address.update(addresses)
        try:
            await self.etcd.put(self.prefix + "nodes/" + self.name, self.address, lease=self.lease)
        except EtcdError:
            # the lease expired while the listeners started (a loaded machine, a short TTL: etcd answers
            # "lease not found"): a new one, which registers the addresses too
            await self._new_lease()
        await self.etcd.put(self.prefix + "known/" + self.name, {"name": self.name})   # no lease: "down", not "unknown"

    async def stop(self):
        self._stopping = True
        self.engine.replica_feed = None
        for t in self._tasks:
            t.cancel()
        self.etcd_view.close()
        self.forwarding.close()
        self.sac.close()
        for _, _, task in list(self.following.values()):
            task.cancel()
        for st in list(self.leading.values()):
            st.fail_all(NotLeader("the node is stopping"))
            for w in list(st.conns):
                w.close()
        if self._server is not None:
            self._server.close()
        try:
            if self.lease:
                await self.etcd.revoke(self.lease)
        except EtcdError:
            pass
        await self.etcd.close()

    # ------------------------------------------------------------------------------ etcd state

    async def _refresh(self):
        """Take nodes and placements from the watched copy of etcd's keys (etcdview.py) and take the role
        each stream gives this node."""
        if viewhold.held(self.name):
            return          # a test holds this node's view where it is (viewhold.py)
        if self.etcd_view.revision < self.etcd.written:
            # a write of this node landed while the reconcile waited for the watch (a stream made and
            # placed here a moment ago): acting on a copy without it would undo it; the watch brings it
            self.kick()
            return
        # the super stream definitions are read again by superstreams.refresh if this node changed one
        # after this point
        generation = self.superstreams.generation
        view = self.etcd_view
        node_kvs, stream_kvs, deleted_kvs, super_kvs = (
            view.items(d) for d in ("nodes/", "streams/", "deleted/", SUPERSTREAMS_DIR))
        nodes = {}
        for kv in node_kvs:
            try:
                reg = kv.json()
                nodes[reg["name"]] = reg
            except (ValueError, KeyError):
                continue
        self.nodes = nodes
        placements, incarnations = {}, {}
        for kv in stream_kvs:
            try:
                placements[kv.json()["name"]] = (kv.json(), kv.mod_revision)
                incarnations[kv.json()["name"]] = kv.create_revision
            except (ValueError, KeyError):
                continue
        self.incarnations = incarnations
        before, self.placements = self.placements, placements
        read = dict(placements)         # as read now (self.placements changes under the awaits below)
        tombstones = {kv.key.decode()[len(self.prefix) + len("deleted/"):]
                      for kv in deleted_kvs}
        # local streams no placement names: deleted on the cluster while this node was away (a
        # tombstone says so; or, collected since, the copy records it was placed once: an orphan,
        # incarnation.py), else made before the cluster or while etcd was away: this node leads them.
        # A stream this node leads is deleted here too once its placement, which it knew, gave way to a
        # tombstone (a client deleted it through another member); one it leads but has not placed yet is
        # a new stream, whatever tombstone an older one of that name left
        for name in self.engine.list_streams():
            if name in placements or name in self.placing or name in self._member_deleting:
                continue
            orphan = incarnation.orphan(self, name)
            if name in self.leading and not (name in before and (name in tombstones or orphan)):
                continue
            if name in tombstones:
                self._member_deleting.add(name)
                log.info("cluster: %s deletes %s (deleted on the cluster)", self.name, name)
                self.broker.delete_stream(name, lambda exc, name=name: self._copy_deleted(name, exc),
                                          copy_only=True)
            elif orphan:
                log.info("cluster: %s deletes %s (an orphan: placed once, now neither placed nor in a "
                         "tombstone)", self.name, name)
                incarnation.drop(self, name)
            else:
                await self._place(name)
        deletion.forget_gone(self, before, placements)
        await deletion.collect(self, deleted_kvs, placements)
        self.creation_ended(list(self.pending_leaders))
        pause = viewhold.pause(self.name)
        if pause:
            await asyncio.sleep(pause)      # a test's stand-in for a slow reconcile (viewhold.py)
        for name, entry in list(self.placements.items()):
            if name in self._cluster_deleting:
                continue
            if read.get(name) is not entry or self.placements.get(name) is not entry:
                # changed here since this reconcile read the cluster state (the awaits above let a client
                # delete the name and make it again here): the incarnation read with that state is the
                # old stream's, and checking the new copy against it would record it as the old one's
                # (then drop it and empty its seat). The change's own write brings the next reconcile.
                continue
            p, rev = entry
            if self.engine.has_stream(name) and name not in self.placing and not incarnation.check(
                    self, name, self.incarnations.get(name)):
                continue          # a copy of an earlier stream of that name: dropped, copied anew
            if not membership.take_part(self, name, p):
                if self.observers.observing(name):
                    self.observers.follow(name, p)        # a copy for readers here: no vote, no progress
                    continue
                if self.engine.has_stream(name) or name in self.following or name in self.leading:
                    membership.drop_copy(self, name)      # taken off it (delete-replica)
                continue
            self.observers.became_member(name)
            await self._take_role(name, p, rev)
        await self.superstreams.refresh(super_kvs, generation)
        await self._report_progress()

    def _copy_deleted(self, name, exc):
        # the tombstone is collected on the next reconcile (a failed deletion is tried again there)
        if exc is not None:
            self._member_deleting.discard(name)
        self.kick()

    def _choose_members(self, name=None, leader=None):
        """``leader`` (default this node), this node, and more live ones (fewest streams first): a new
        stream's members, as many as its ``initial-cluster-size`` argument asks (default 3), at most the
        live nodes."""
        size = DEFAULT_CLUSTER_SIZE
        try:
            size = max(1, int(self.engine._current(name).args.get("initial-cluster-size", size)))
        except (StreamNotFound, ValueError, TypeError, AttributeError, KeyError):
            pass
        leader = leader or self.name
        load = {n: 0 for n in self.nodes if n != leader}
        load[self.name] = -1          # the node the stream was made on holds a copy already
        load.pop(leader, None)
        for p, _ in self.placements.values():
            for m in p["members"]:
                if m in load and m != self.name:
                    load[m] += 1
        others = sorted(load, key=lambda n: (load[n], n))
        return [leader] + others[:size - 1]

    async def _place(self, name, arguments=None, members=None):
        """Register local stream ``name`` in etcd, led by this node with up to two more members."""
        members = members or self._choose_members(name)
        try:
            args = arguments if arguments is not None else self.engine._current(name).args
        except (StreamNotFound, AttributeError):
            args = {}
        p = {"name": name, "epoch": 1, "leader": self.name, "members": members, "arguments": args}
        if await self.etcd.create(self.prefix + "streams/" + name, p):
            await self.etcd.delete(self.prefix + "deleted/" + name)
            log.info("cluster: stream %s placed on %s (leader %s)", name, ",".join(members), self.name)
            kv = await self.etcd.get(self.prefix + "streams/" + name)
            self.placements[name] = (p, kv.mod_revision if kv else 0)

    # ------------------------------------------------------------------------------ streams made or deleted here

    def _stream_created(self, name):
        """Broker create hook: a stream made here by a client is placed in etcd, led by this node."""
        if name in self._member_creating:
            self._member_creating.discard(name)
            return
        if name in self.placements or name in self.leading:
            return
        leader = placement.leader_for(self, name)       # the queue-leader-locator argument
        if leader != self.name:
            self.engine.set_read_limit(name, 0)
            asyncio.get_running_loop().create_task(placement.place_remote(self, name, leader))
            return
        members = self._choose_members(name)
        self._lead(name, 1, members)
        asyncio.get_running_loop().create_task(self._place_and_refresh(name, members))

    def _stream_deleted(self, name):
        """Broker delete hook: a client's deletion here deletes the stream on the cluster (placement
        removed, a tombstone left for members that are away: deletion.py, which the broker's request has
        done already where it could); a member copy deleted because of that tombstone, or a stream this
        node held no copy of, only forgets its state."""
        st = self.leading.pop(name, None)
        if st is not None:
            # (a copy dropped alone steps down first: a leader deleting is the cluster's deletion)
            st.fail_all(StreamNotFound(f"stream {name!r} was deleted"))
            for w in list(st.conns):
                w.close()
        f = self.following.pop(name, None)
        if f is not None:
            f[2].cancel()
        self.engine.set_read_limit(name, None)
        self.engine.epochs.pop(name, None)
        for per_stream in (self.max_epoch, self.progress_sent, self.progress_at, self.detached, self.abstain):
            per_stream.pop(name, None)
        self.handing_off.discard(name)
        if name not in self.placing and not self.broker.creating(name):
            self.pending_leaders.pop(name, None)
        self.watch.forget(name)
        incarnation.forget(self, name)
        if name in self._member_deleting:
            self._member_deleting.discard(name)
            return
        self.placements.pop(name, None)
        if name in self.removed_here:
            self.removed_here.discard(name)
            return
        self._cluster_deleting.add(name)
        asyncio.get_running_loop().create_task(self._delete_placement(name))

    async def _delete_placement(self, name):
        try:
            await deletion.remove_placement(self, name)
        except (EtcdError, RiverbedError) as e:
            log.warning("cluster: cannot delete %s in etcd: %s", name, e)
        finally:
            self._cluster_deleting.discard(name)

    async def _place_and_refresh(self, name, members):
        self._placing_here.add(name)
        try:
            # the live nodes as etcd knows them now (this node's view may be a poll behind)
            nodes = {}
            for kv in await self.etcd.get_prefix(self.prefix + "nodes/"):
                try:
                    nodes[kv.json()["name"]] = kv.json()
                except (ValueError, KeyError):
                    continue
            self.nodes = nodes
            members = self._choose_members(name)
            await self._place(name, members=members)
            p = self.placements.get(name)
            if p is not None and name in self.leading:
                self.leading[name].members = list(p[0]["members"])
        except EtcdError as e:
            log.warning("cluster: cannot place %s yet: %s", name, e)
        finally:
            self._placing_here.discard(name)
            self.pending_leaders.pop(name, None)
