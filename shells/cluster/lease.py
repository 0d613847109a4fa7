"""A cluster node's etcd lease: taking it, renewing it, and what this node may do while it holds it (issue 23).

Owns the node's lease (``lease``) and how long this node trusts it (``_lease_until``): the node key
``nodes/<node>`` and the progress reports live under it, and a leader confirms only while
:meth:`LeaseHolder.lease_valid` (replication.py's ``Leading`` asks). The lease is renewed every TTL/3
(:meth:`LeaseHolder._keepalive_loop`, over etcd_lease.py's kept-open connection: that module is the wire
side of a renewal, this one its policy); a renewal etcd answers with "expired" means this node was paused
or cut off, so it steps down from every stream it led before it takes a new lease. Each renewal's wake-up
also carries the node's fallback looks (:meth:`LeaseHolder._beat`: the control loop's periodic checks,
docs.py's ``beat_hooks``), so that a node at rest wakes for nothing else (pace.py).

Why a module of its own: whether a leader may still confirm rests on this timing alone ("a leader cut off
from etcd stops confirming when its lease would have expired"), so it is read in one place.
:class:`LeaseHolder` is a mixin of :class:`~riverbed.shells.cluster.node.ClusterNode` (it uses the node's
``etcd``, ``ttl``, ``leading``, ``progress_sent``, ``address``, ...).

Loop thread only (the broker's loop).
"""

import asyncio
import logging
import math
import time

from riverbed.shells.cluster.etcd import EtcdError

log = logging.getLogger("riverbed.cluster")

KEEPALIVES_PER_TTL = 3     # lease renewals per lease TTL


class LeaseHolder:
    """The lease methods of ClusterNode (a mixin: see the module docstring)."""

    def lease_valid(self):
        return time.monotonic() < self._lease_until

    async def _new_lease(self):
        t0 = time.monotonic()
        # etcd leases are whole seconds: ask for the TTL rounded UP, so etcd never lets the lease go before
        # this node stops trusting it (round(2.5) == 2 would have let a cut-off leader confirm for 0.5 s
        # after etcd had expired its lease and another node could lead)
        self.lease = await self.etcd.grant(math.ceil(self.ttl))
        self._lease_until = t0 + self.ttl
        self.progress_sent.clear()      # the progress keys went with the old lease: write them again
        await self.etcd.put(self.prefix + "nodes/" + self.name, self.address, lease=self.lease)

    async def _keepalive_loop(self):
        while True:
            # every TTL/3, as etcd's own client renews: a renewal two thirds of a TTL late still keeps it
            await asyncio.sleep(self.ttl / KEEPALIVES_PER_TTL)
            self._beat()
            t0 = time.monotonic()
            try:
                ttl = await self.etcd.keepalive(self.lease)
            except EtcdError as e:
                log.debug("cluster: etcd keepalive failed: %s", e)
                self.etcd_view.suspect()     # the watch may hang on the same etcd: read and watch anew
                continue
            if ttl > 0:
                self._lease_until = t0 + self.ttl
                continue
            # the lease expired (this node was paused or cut off): every stream it led may have a new
            # leader by now, so it stops confirming and takes a new lease as a plain member
            log.warning("cluster: lease lost; stepping down from %d stream(s)", len(self.leading))
            self._lease_until = 0
            for name in list(self.leading):
                self._step_down(name)
            try:
                await self._new_lease()
            except EtcdError as e:
                log.warning("cluster: cannot take a new lease: %s", e)

    def _beat(self):
        """On each renewal's wake-up: the fallback looks (the control loop's periodic checks, docs.py's look
        at the changelog) ride on it instead of waking the process on timers of their own (pace.py)."""
        self.tick_soon()
        for fn in self.beat_hooks:
            fn()
