"""A cluster node's two loops: the control loop (local timers) and the reconcile loop (issue 23).

Owns the loops that :meth:`~riverbed.shells.cluster.node.ClusterNode.start` runs beside the lease's
keep-alive (lease.py):

* the control loop (:meth:`ControlLoops._control_loop`): what changes with time alone on the streams this
  node leads (confirms past --replication-timeout, learners to promote, a leader cut off from its members
  resigning, a member fallen behind reported at once), forwarded requests and single-active-consumer upkeep
  (:meth:`ControlLoops._upkeep`), and a periodic reconcile when one is wanted. When it runs is pace.py's
  decision: at its old pace only while something it times is under way, else it rests;
  :meth:`ControlLoops.tick_soon` wakes it when such work begins;
* the reconcile loop (:meth:`ControlLoops._reconcile_loop`): runs the node's reconcile with the cluster
  state (node.py ``_refresh``) once per :meth:`ControlLoops.kick`, coalesced; the etcd watch kicks it for a
  change under ``REACT_DIRS`` (:meth:`ControlLoops._view_changed`).

Why a module of its own: the two loops are the node's scheduling, apart from what each step does (roles.py,
node.py, membership.py). :class:`ControlLoops` is a mixin of :class:`~riverbed.shells.cluster.node.ClusterNode`
(it uses the node's ``leading``, ``etcd_view``, ``forwarding``, ``sac``, ``_changing``, ...).

Loop thread only (the broker's loop).
"""

import logging
import time

from riverbed.shells.cluster import membership, pace, view
from riverbed.shells.cluster.etcd import EtcdError
from riverbed.shells.cluster.superstreams import KEY_DIR as SUPERSTREAMS_DIR

log = logging.getLogger("riverbed.cluster")

TICK_MAX = 0.25            # seconds between two runs of the local timers (confirm timeouts, resigning, SAC), at most
RECONCILE_EVERY = 0.5      # lease TTLs between two reconciles with the cluster state that no change in etcd asked for
# the directories whose changes the node reacts to at once (progress/ only while it waits for an election)
REACT_DIRS = frozenset(("nodes/", "streams/", "deleted/", SUPERSTREAMS_DIR))


class ControlLoops:
    """The loop methods of ClusterNode (a mixin: see the module docstring)."""

    async def _control_loop(self):
        """The local timers: confirms past --replication-timeout, learners to promote, a leader cut off
        from its members resigning, forwarded requests and SAC upkeep; and a reconcile every
        RECONCILE_EVERY lease TTLs (what changes with time alone: abstentions, idle observer copies,
        progress reports). etcd is not read here: its changes arrive by the watch (etcdview.py). When it
        runs: pace.py (at most every min(TTL/6, TICK_MAX), and only while something it times is under way)."""
        next_reconcile = time.monotonic() + RECONCILE_EVERY * self.ttl
        while True:
            await pace.rest(self, min(self.ttl / 6, TICK_MAX), next_reconcile)
            now = time.monotonic()
            try:
                for st in list(self.leading.values()):
                    st.expire(now)
                    if not self.lease_valid():
                        continue
                    st.recompute()
                    if st.learners or self._cut_off(st, now):
                        async with self._changing:     # not while a reconcile changes the same state
                            if st.learners:
                                await membership.promote(self, st)
                            if self._cut_off(st, now):
                                await self._resign(st)
                # a live member fell behind (paused, slow): the leader reports its position on every
                # tick, so the member's lag shows at once (view.member_behind), not at the next reconcile
                if self.etcd_view.current and any(view.member_behind(st, st.local_next(), self.nodes)
                                                  for st in list(self.leading.values())):
                    await self._report_progress()
            except EtcdError as e:
                log.debug("cluster: control loop: %s", e)
            except Exception:
                log.exception("cluster: control loop failed")
            if now >= next_reconcile:
                next_reconcile = now + RECONCILE_EVERY * self.ttl
                if pace.reconcile_wanted(self, now):
                    self.kick()
            self._upkeep()

    def _upkeep(self):
        self.forwarding.route_changed()
        try:
            self.sac.tick()
        except Exception:
            log.exception("cluster: single-active-consumer upkeep failed")

    def kick(self):
        """Reconcile with the cluster state soon (coalesced): a change in etcd, a leader found gone."""
        self._kicked.set()

    def tick_soon(self):
        """Run the control loop now if it rests (pace.py): work it times has begun (a held confirm, a
        forwarded request). Cheap when it does not."""
        if self._resting:
            self._tick_now.set()

    def _view_changed(self, dirs):
        # progress reports matter at once only to a member waiting for an election (the detached reports)
        if not dirs.isdisjoint(REACT_DIRS) or (self.detached and "progress/" in dirs):
            self._kicked.set()

    async def _reconcile_loop(self):
        while True:
            await self._kicked.wait()
            self._kicked.clear()
            try:
                async with self._changing:
                    # never act on a copy older than this node's own last write (it would undo it)
                    await self.etcd_view.catch_up(self.etcd.written)
                    await self._refresh()
            except EtcdError as e:
                log.debug("cluster: reconcile: %s", e)     # the view logs an outage once
            except Exception:
                log.exception("cluster: reconciling with the cluster state failed")
            self._upkeep()
            self.tick_soon()        # it may have made work the control loop times (a stream led, learners)
