"""A cluster node's role in each stream it is a member of: follow, stand for election, lead, resign (issue 23).

Owns what the node does with one stream's placement (``streams/<stream>`` in etcd) once the reconcile
(node.py ``_refresh``) has read it: :meth:`Roles._take_role` follows the leader it names, leads where it
names this node, and, when the leader's lease is gone, reports this member's final position
(``progress/<stream>/<node>``, :meth:`Roles._report_progress`) and, once a majority of the members has
reported, elects the one with the highest (epoch of its last chunk, next offset) by compare-and-swap
(:meth:`Roles._maybe_elect`). Leading (:meth:`Roles._lead`) starts a
:class:`~riverbed.shells.cluster.replication.Leading` at the stream's epoch; a leader that has not heard
from a majority of its members for a lease TTL (:meth:`Roles._cut_off`) leaves the seat empty at a new
epoch (:meth:`Roles._resign`); stepping down fails the confirms it held (:meth:`Roles._step_down`). Every
change of a placement is a CAS in etcd.

Why a module of its own: these are the safety-critical transitions of issue 23 (who may confirm, at which
epoch), read best together and apart from the node's life cycle and loops. :class:`Roles` is a mixin of
:class:`~riverbed.shells.cluster.node.ClusterNode`: its methods use and change the node's state
(``leading``, ``following``, ``placements``, ``max_epoch``, ``detached``, ``abstain``, ``progress_sent``, ...).

Loop thread only (the broker's loop).
"""

import asyncio
import logging
import time

from riverbed.engine import core
from riverbed.engine.errors import RiverbedError, StreamNotFound
from riverbed.engine.format import H_EPOCH
from riverbed.shells.cluster import incarnation, membership, view
from riverbed.shells.cluster.etcd import EtcdError
from riverbed.shells.cluster.replication import Leading
from riverbed.shells.cluster.shell_hooks import NotLeader

log = logging.getLogger("riverbed.cluster")

PROGRESS_EVERY = 0.5       # lease TTLs between two progress reports that only move offsets forward


class Roles:
    """The role-taking methods of ClusterNode (a mixin: see the module docstring)."""

    # ------------------------------------------------------------------------------ taking a role

    async def _take_role(self, name, p, rev):
        leader, epoch = p["leader"], p["epoch"]
        if epoch < self.max_epoch.get(name, 0):
            return
        self.max_epoch[name] = epoch
        self.watch.forget(name, epoch)
        if leader == self.name:
            st = self.leading.get(name)
            if st is None and membership.given_to_me(self, p):
                await membership.take_given(self, name, p)
            elif st is None:
                # an earlier run of this node led it (a restart): leave the seat empty at a new epoch,
                # so that the member holding the most of the log is elected, not whoever restarts
                new = dict(p, epoch=epoch + 1, leader="")
                if await self.etcd.replace(self.prefix + "streams/" + name, rev, new):
                    log.info("cluster: %s restarted as leader of %s; election at epoch %d", self.name, name,
                             epoch + 1)
                    kv = await self.etcd.get(self.prefix + "streams/" + name)
                    self.placements[name] = (new, kv.mod_revision if kv else rev)
            elif st.epoch != epoch:
                self._lead(name, epoch, p["members"])
            else:
                st.members, st.learners = list(p["members"]), membership.learners_of(p)
                if p.get("leaving") == self.name:
                    membership.start_hand_off(self, name)
            return
        if name in self.leading:
            self._step_down(name)
        if not self.engine.has_stream(name):
            await self._create_local(name, p.get("arguments") or {})
        if leader in self.nodes and not self.watch.is_lost(name, leader, epoch):
            f = self.following.get(name)
            if f is None or f[0] != leader or f[1] != epoch or f[2].done():
                if f is not None:
                    f[2].cancel()
                self.detached.pop(name, None)
                if self.engine.read_limit(name) is None:
                    self.engine.set_read_limit(name, 0)
                task = asyncio.get_running_loop().create_task(self._follow(name, leader, epoch))
                self.following[name] = (leader, epoch, task)
            return
        # the leader's lease is gone (or its dial refused): report a final position, then elect once a
        # majority has
        f = self.following.pop(name, None)
        if f is not None:
            f[2].cancel()
        if self.name not in p["members"]:
            return          # a learner: it neither votes nor stands
        if self.abstain.get(name, 0) > time.monotonic():
            return          # it resigned this stream: the others elect
        if self.detached.get(name) != epoch:
            self.detached[name] = epoch
            await self._report_progress()      # at once: the other members wait for this report
        await self._maybe_elect(name, p, rev)

    async def _create_local(self, name, arguments):
        self._member_creating.add(name)
        self.engine.set_read_limit(name, 0)
        try:
            await asyncio.wrap_future(self.engine.create_stream(name, arguments))
        except RiverbedError as e:
            if self.engine.has_stream(name):
                return
            log.error("cluster: cannot create member copy of %s: %s", name, e)
            return
        # before it holds a chunk: a copy without a record is taken for the placement found next
        incarnation.record(self, name, self.incarnations.get(name))

    def _position(self, name):
        """``(epoch of the last chunk, next offset)`` of the local log of ``name``."""
        try:
            s = self.engine._current(name)
        except StreamNotFound:
            return 0, 0
        if s.last_chunk < 0:
            return 0, s.next_offset
        # the header only, read in place: every progress report asks, and a chunk is up to some MB
        epoch = self.engine.read_chunk_views(
            name, s.last_chunk, lambda got: core.read_header(got[0][1])[H_EPOCH] if got else 0, limited=False)
        return epoch, s.next_offset

    async def _report_progress(self):
        for name, (p, _) in list(self.placements.items()):     # a deletion may drop one meanwhile
            if not membership.take_part(self, name, p) or name in self._member_deleting:
                continue          # (a copy being dropped reports nothing: it may be another stream's)
            epoch, nxt = self._position(name)
            st = self.leading.get(name)
            value = {"node": self.name, "stream": name, "last_epoch": epoch, "next": nxt,
                     "committed": st.committed if st is not None else (self.engine.read_limit(name) or 0),
                     "detached": self.detached.get(name)}
            sent = self.progress_sent.get(name)
            if sent != value and not self._progress_can_wait(name, sent, value):
                await self.etcd.put(f"{self.prefix}progress/{name}/{self.name}", value, lease=self.lease)
                self.progress_sent[name] = value
                self.progress_at[name] = time.monotonic()

    def _progress_can_wait(self, name, sent, value):
        """A report that only moves ``next``/``committed`` forward waits up to PROGRESS_EVERY lease TTLs
        since the last one: under steady publishing every poll would write one (an etcd write and its
        raft round per node and poll) while only the status command reads those fields; elections read
        the ``detached`` reports, and a change of epoch or of ``detached`` is written at once."""
        if (sent is None or any(sent.get(k) != value[k] for k in ("last_epoch", "detached"))
                or value["next"] < sent.get("next", 0) or value["committed"] < sent.get("committed", 0)):
            return False
        st = self.leading.get(name)
        if st is not None and view.member_behind(st, value["next"], self.nodes):
            return False        # a live member fell behind: its lag shows now, not half a TTL later
        return time.monotonic() - self.progress_at.get(name, 0.0) < self.ttl * PROGRESS_EVERY

    async def _maybe_elect(self, name, p, rev):
        members = p["members"]
        majority = len(members) // 2 + 1
        reports = {}
        for kv in await self.etcd.get_prefix(f"{self.prefix}progress/{name}/"):
            try:
                r = kv.json()
            except ValueError:
                continue
            if r.get("node") in members and r.get("node") in self.nodes and r.get("detached") == p["epoch"]:
                reports[r["node"]] = r
        epoch, nxt = self._position(name)
        reports[self.name] = {"node": self.name, "last_epoch": epoch, "next": nxt}
        if len(reports) < majority:
            return
        best = max(reports.values(), key=lambda r: (r["last_epoch"], r["next"], r["node"]))
        if best["node"] != self.name:
            return
        new = dict(p, epoch=p["epoch"] + 1, leader=self.name)
        if await self.etcd.replace(self.prefix + "streams/" + name, rev, new):
            log.info("cluster: %s elected leader of %s at epoch %d (next offset %d)", self.name, name,
                     new["epoch"], nxt)
            self.max_epoch[name] = new["epoch"]
            self.detached.pop(name, None)
            kv = await self.etcd.get(self.prefix + "streams/" + name)
            self.placements[name] = (new, kv.mod_revision if kv else rev)
            self._lead(name, new["epoch"], members)

    # ------------------------------------------------------------------------------ leading

    def _lead(self, name, epoch, members):
        f = self.following.pop(name, None)
        if f is not None:
            f[2].cancel()
        old = self.leading.get(name)
        if old is not None:
            old.fail_all(NotLeader(f"{name!r} changed epoch"))
        self.engine.set_epoch(name, epoch)
        st = self.leading[name] = Leading(self, name, epoch, members)
        # what this node held before it led is committed only once a majority holds it again
        st.committed = self.engine.read_limit(name) or 0
        if self.engine.read_limit(name) is None:
            self.engine.set_read_limit(name, 0)
        st.recompute()
        log.info("cluster: leading %s at epoch %d, members %s", name, epoch, ",".join(members))
        self._roles_changed()

    def _roles_changed(self):
        for fn in self.role_hooks:
            fn()

    def _cut_off(self, st, now):
        """Whether this leader has not heard from a majority of ``st``'s members (itself included) for one
        lease TTL: a member counts while it acknowledged (a chunk or a COMMIT heartbeat) within the TTL; an
        open connection alone does not count (a partition leaves it open and silent)."""
        if len(st.members) < 2 or now - st.since < self.ttl:
            return False
        heard = 1 + sum(1 for m in st.members if m != self.name and now - st.heard.get(m, st.since) < self.ttl)
        return heard < len(st.members) // 2 + 1

    async def _resign(self, st):
        """Leave the seat of ``st`` empty at a new epoch (CAS) and stand aside from the next election, so
        that the side holding a majority elects a leader and goes on."""
        entry = self.placements.get(st.name)
        if entry is None:
            return
        p, rev = entry
        if p.get("leader") != self.name or p.get("epoch") != st.epoch:
            return
        new = dict(p, epoch=p["epoch"] + 1, leader="")
        try:
            ok = await self.etcd.replace(self.prefix + "streams/" + st.name, rev, new)
        except EtcdError:
            return
        if ok:
            log.warning("cluster: %s resigns %s: no word from a majority of its members for %.1fs", self.name,
                        st.name, self.ttl)
            self.abstain[st.name] = time.monotonic() + 3 * self.ttl
            self._step_down(st.name)
            self.placements[st.name] = (new, rev)

    def _step_down(self, name):
        st = self.leading.pop(name, None)
        if st is None:
            return
        st.fail_all(NotLeader(f"this node no longer leads {name!r}"))
        for w in list(st.conns):
            w.close()
        log.info("cluster: no longer leading %s (epoch %d)", name, st.epoch)
        self._roles_changed()
