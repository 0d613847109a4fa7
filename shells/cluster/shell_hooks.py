"""What the broker and the protocol shells call on a cluster node (issue 23), and the error they get.

Owns :class:`NotLeader` (a publish to a node that does not lead the stream) and the node's whole surface
towards the shells (shells/broker/core.py, the RabbitMQ Stream shell's Metadata, the HTTP status pages):

* writes: :meth:`ShellHooks.check_write` (may this node append to the stream) and :meth:`ShellHooks.hold`
  (a confirm waits until a majority of the members holds the records: "a confirm means stored");
* creations and deletions made through this node: ``hold_create``, ``hold_delete``, ``delete_remote``,
  ``creation_ended`` (the work is in placement.py and deletion.py);
* where a stream lives: ``metadata``, ``rmq_metadata``; status: ``replica_lag``, ``stream_roles``.

Why a module of its own: these are what the rest of the broker reaches of a cluster node, read in one
place; the node's own machinery (lease, loops, roles, placement) is elsewhere. :class:`ShellHooks` is a
mixin of :class:`~riverbed.shells.cluster.node.ClusterNode`: its methods read the node's state
(``leading``, ``placements``, ``nodes``, ``pending_leaders``, ...) and change none of it but ``holding``.

Loop thread only (the broker's loop), except the engine completions posted back to it.
"""

from riverbed.shells.broker.core import NotLeaderError
from riverbed.shells.cluster import deletion, leader_path, placement


class NotLeader(NotLeaderError):
    """This node does not lead the stream (or lost its lease): publish to the leader Metadata names."""


class ShellHooks:
    """The methods of ClusterNode that the broker and the shells call (a mixin: see the module docstring)."""

    def creation_ended(self, names):
        """Forget the leader chosen for each of ``names`` (:attr:`pending_leaders`) once it is no longer
        needed: etcd places the stream (its leader is known), or its creation here ended without a local
        stream (refused, or made on another node first). Kept while a placement of it is in flight or a
        creation of it waits. Called by the broker when an ensure_stream creation ends and on every
        reconcile, so the map holds only creations under way."""
        for name in names:
            if (name not in self.pending_leaders or name in self.placing or name in self._placing_here
                    or self.broker.creating(name)):
                continue
            if name in self.placements or not self.engine.has_stream(name):
                del self.pending_leaders[name]

    def hold_delete(self, names, cb):
        """Wrap a client deletion's engine completion ``cb(res, exc)``: answered once etcd no longer places
        ``names`` (deletion.py)."""
        return deletion.hold_delete(self, names, cb)

    def delete_remote(self, name, cb):
        """Delete ``name``, which this node holds no copy of, on the cluster; ``cb(exc)`` (deletion.py)."""
        deletion.delete_remote(self, name, cb)

    def check_write(self, stream):
        """The error a publish to ``stream`` gets on this node (NotLeader), or None to go on."""
        if stream in self.leading and stream not in self.handing_off:
            return None
        if stream in self.handing_off:
            return NotLeader(f"leadership of {stream!r} is moving from {self.name} to another member")
        p = self.placements.get(stream)
        if p is None:
            pending = self.pending_leaders.get(stream)
            if pending not in (None, self.name):
                return NotLeader(f"node {self.name} is not the leader of {stream!r} (leader: {pending})")
            return None       # a stream made here a moment ago: _stream_created leads it
        return NotLeader(f"node {self.name} is not the leader of {stream!r} (leader: {p[0]['leader']})")

    def hold_create(self, names, cb):
        """Wrap a create request's ``cb(exc)``: answered once the streams are led where they are placed
        (placement.hold_create)."""
        return placement.hold_create(self, names, cb)

    def hold(self, stream, cb):
        """Wrap an append's ``cb(result, exc)`` so that it runs only once a majority holds the records."""
        def held(res, exc):
            st = self.leading.get(stream)
            if exc is not None or st is None:
                cb(res, exc if exc is not None or st is not None else NotLeader(f"{stream!r} lost its leader"))
                return
            end = res.last_offset + 1 if res.last_offset >= 0 else st.local_next()
            self.holding += 1

            def done(err):
                self.holding -= 1
                cb(res, None) if err is None else cb(None, err)
            st.wait(end, done)
            if self._resting and st.waiting:
                self._tick_now.set()        # its --replication-timeout is timed from now (pace.py)
            st.recompute()
            st.poke_behind(end)     # a chunk sent ahead of its commit (leader_path.py) went already
            if st.committed < end and self.holding == 1 and st.ahead_end == end and leader_path.ACK_POLL:
                # a one-message publish sent ahead, the only confirm this node waits for: its ACK is polled
                # for, not slept for (leader_path.poll_acks)
                leader_path.poll_acks(st, end, leader_path.ACK_POLL)
        return held

    def metadata(self, stream):
        """``(leader registration or None, [replica registrations])`` of ``stream`` for Metadata."""
        p = self.placements.get(stream)
        if p is None:
            return None, []
        p = p[0]
        return self.nodes.get(p["leader"]), [self.nodes[m] for m in p["members"] if m != p["leader"] and
                                             m in self.nodes]

    def rmq_metadata(self, streams, has, local):
        """RabbitMQ Stream Metadata of ``streams``: ``(brokers [(ref, host, port)], entries [(stream, code,
        leader ref, [replica refs])])``. ``local`` is this node's (host, port) as its client was told;
        ``has(stream)`` says whether the stream exists here."""
        from riverbed.shells.rmq_stream.constants import RC_OK, RC_STREAM_DOES_NOT_EXIST
        refs, brokers, entries = {}, [], []

        def ref(reg):
            addr = local if reg is None or reg["name"] == self.name else (
                reg.get("advertised_host") or "127.0.0.1", reg.get("stream_port"))
            if addr[1] is None:
                return None
            if addr not in refs:
                refs[addr] = len(brokers)
                brokers.append((len(brokers), addr[0], addr[1]))
            return refs[addr]
        for s in streams:
            if not (s and has(s)):
                entries.append((s or "", RC_STREAM_DOES_NOT_EXIST, 0xFFFF, []))
                continue
            leader, replicas = self.metadata(s)
            lead = ref(leader)
            entries.append((s, RC_OK, 0xFFFF if lead is None else lead,
                            [r for r in (ref(x) for x in replicas) if r is not None]))
        if not brokers:
            ref(None)
        return brokers, entries

    # ------------------------------------------------------------------------------ status

    def replica_lag(self):
        """``[(stream, member, records behind the leader)]`` of every stream this node leads."""
        out = []
        for name, st in sorted(self.leading.items()):
            head = st.local_next()
            for m in st.members + st.learners:
                if m != self.name:
                    out.append((name, m, max(head - st.acked.get(m, 0), 0)))
        return out

    def stream_roles(self):
        """{stream: "leader" | "member" | "observer"} of this node (for logs and the dashboard)."""
        out = {n: "leader" for n in self.leading}
        out.update({n: "observer" if self.observers.observing(n) else "member" for n in self.following})
        return out
