"""A cluster leader's confirm path, cut to what a majority's store needs (issue 23: confirm p50 <= 2x one node).

One publish at a time, a confirm waits for: the leader's store, the chunk's trip to a member, the member's
store, its ACK's trip back. Two things here keep the leader's own work off that path:

* :class:`SendAhead` (``Engine.replica_feed``): the one-message inline commit (engine/writer.py
  ``_commit_alone``) hands over the chunk once it is stamped and staged, BEFORE LMDB commits it; the chunk
  (with the publisher sequence it moves, and a moved committed offset) leaves at once on every member
  connection that is parked, caught up to exactly that chunk, has an empty socket buffer and was sent the
  whole publisher sequence table once (the first chunk after a connection goes the usual way: a member
  that truncated its log dropped its table). The members store it while the leader commits it. Only as
  many members as a majority needs get it at once (the one whose ACK made the last majority first); the
  others get the same frames right after the local commit, so that on this 2-core machine they do not
  take a core from the processes the confirm waits on. Anything else (a member behind, a batch committed by the
  writer thread) is sent after the local commit as before (``_Feed.send``, replication.py).
* :class:`AckReader`: after a member's HELLO, its connection's protocol is swapped for one that handles
  each ACK in ``data_received``: the committed offset moves, and the confirms it completes are written,
  in the loop turn that read the ACK (no StreamReader, no task wake-up in between).
* :func:`poll_acks`: the confirm of a chunk sent ahead that is the only one its node waits for (one
  publisher at a time) polls for that ACK for at most ACK_POLL (200 µs) instead of letting the loop sleep,
  so that neither the member's ACK nor this node pays for waking an idle CPU (see there).

Why this stays safe (``Leading.recompute``): the committed offset is at most the leader's own committed
log end, so a chunk counts only once the leader has stored it AND a majority (the leader included) holds
it, as before; a member's readers see only what a COMMIT frame allows, which is that offset. A leader
that dies between the send and its own commit leaves members holding a chunk it never confirmed, with its
publisher sequence (sent with it), so the member elected next (the highest (epoch, last chunk)) keeps it
and drops a publisher's re-send of it as a duplicate, and the old leader, back, finds its log a prefix of
the new leader's and follows (tests/cluster/test_send_ahead.py). A local commit that fails after the send
(``unsealed``: an I/O error at LMDB's commit) stops the engine, as any failed commit does, so this node
never stores another chunk at that id; and it closes every member connection of the stream and forgets
their positions past that chunk before anything else runs on the loop: a member that reconnects names a
last chunk this leader does not hold, and is told to TRUNCATE it.

Loop thread only: the hooks do nothing when the engine commits on another thread.
"""

import asyncio
import logging
import os
import select
import threading
import time

from riverbed.shells.cluster import wire

log = logging.getLogger("riverbed.cluster")

# send a chunk ahead to a majority's worth of members only, the others after the local commit (see
# SendAhead.sealed); False: to every member connection that is ready
MAJORITY_FIRST = True
# seconds a confirm that is the only one its node waits for polls for its member's ACK (poll_acks); 0: never.
# RIVERBED_ACK_POLL_US sets it in µs (0 turns the poll off: a node that should never spend CPU waiting)
ACK_POLL = float(os.environ.get("RIVERBED_ACK_POLL_US", "200")) / 1e6
SEQS_NONE = wire.json_frame(wire.SEQS, {})


class SendAhead:
    """``Engine.replica_feed`` of a cluster node: writes a freshly stamped chunk to the members that are
    waiting for exactly that chunk, before the local commit (see the module docstring)."""

    def __init__(self, node):
        self.node = node
        self.loop_thread = threading.get_ident()
        self.sent = 0        # chunks sent ahead of their local commit (tests, diagnostics)

    def sealed(self, name, chunk_id, records, chunk, sequences):
        """Send ``chunk`` (stamped, staged, not yet committed here) to the caught-up members of ``name``;
        ``sequences`` ({publisher: last id}) are the publisher sequences the chunk moves. True when any
        member connection got it (the engine then reports a failed commit through :meth:`unsealed`).
        Never raises."""
        sent = False
        try:
            if threading.get_ident() != self.loop_thread:
                return False
            st = self.node.leading.get(name)
            if st is None or not st.feeds:
                return False
            ready = [feed for feed in st.feeds if feed.can_send_ahead(chunk_id)]
            if not ready:
                return False
            # SEQS first: a member stores a chunk only with the sequences that cover it (its other
            # sequences it holds already: it got every chunk before this one)
            # SEQS {} (no named publisher) is one constant frame: no JSON per publish
            seqs = wire.json_frame(wire.SEQS, sequences) if sequences else SEQS_NONE
            frames = [seqs, wire.head(wire.CHUNK, len(chunk)), bytes(chunk)]
            end = chunk_id + max(records, 1)
            later = []
            if MAJORITY_FIRST:
                # as many counting members as a majority needs besides this node, the one whose ACK made
                # the last majority first; the rest get the same frames once this node has committed
                # (Leading.poke_behind), so on a machine with fewer cores than busy processes they do not
                # take a core from this node or the first member while the confirm waits on them
                need = len(st.members) // 2
                ready.sort(key=lambda f: (f.member not in st.members, f.member != st.fastest))
                ready, later = ready[:need], ready[need:]
            for feed in ready:
                sent = True
                feed.send_ahead(frames, end)
            st.ahead = (chunk_id, end, frames) if later else None
            if sent:
                self.sent += 1
                st.ahead_end = end
        except Exception:   # noqa: BLE001 - the commit goes on; the serving tasks send what is missing
            log.exception("cluster: sending a chunk of %s ahead of its commit failed", name)
        return sent

    def unsealed(self, name, chunk_id):
        """The local commit of a chunk :meth:`sealed` sent failed: no member may keep or count it."""
        st = self.node.leading.get(name)
        if st is not None:
            log.warning("cluster: the commit of chunk %d of %s failed after it went to the members; "
                        "they reconnect and drop it", chunk_id, name)
            st.drop_members(chunk_id)


class AckReader(asyncio.Protocol):
    """The protocol of a member connection once its HELLO is read: ACK frames move ``st``'s committed
    offset as they arrive. The writing side (``pause_writing``, ``resume_writing``, the end of the
    connection) still goes to the stream protocol it replaced, so the serving task's ``drain`` works.
    ``closed`` once the connection ended or sent a bad frame; ``wake`` is set then."""

    def __init__(self, st, node, feed, reader, transport, wake):
        self.st = st
        self.node = node
        self.feed = feed
        self.transport = transport
        self.wake = wake
        self.closed = False
        self.buf = bytearray()
        self.inner = transport.get_protocol()
        transport.set_protocol(self)
        feed.acker = self
        left = bytes(getattr(reader, "_buffer", b""))   # read with the HELLO already (a member sends none)
        if left:
            reader._buffer.clear()
            self.data_received(left)

    def data_received(self, data):
        if self.closed:
            return
        buf = self.buf
        acked = None if buf else wire.lone_ack(data)    # one whole ACK, the usual read: no buffering
        if acked is None:
            buf += data
            try:
                frames, used = wire.split_frames(buf)
                if used:
                    del buf[:used]
                acked = None
                for kind, payload in frames:
                    if kind == wire.ACK:
                        acked = wire.u64(payload)
            except wire.WireError as e:
                log.debug("cluster: bad frame from member %s: %s", self.node, e)
                self._end()
                self.transport.close()
                return
        if acked is None or self.feed.dropped:
            return
        st = self.st
        st.acked[self.node] = acked
        st.heard[self.node] = time.monotonic()
        before = st.committed
        try:
            st.recompute()      # the confirms it completes are written now, in this loop turn
        except Exception:       # noqa: BLE001 - a confirm's callback failed: the connection is not to blame
            log.exception("cluster: moving the committed offset of %s failed", st.name)
        if st.committed > before:
            st.fastest = self.node      # its ACK made the majority: it gets the next chunk first

    def eof_received(self):
        self._end()
        return self.inner.eof_received()

    def connection_lost(self, exc):
        self._end()
        self.inner.connection_lost(exc)

    def pause_writing(self):
        self.inner.pause_writing()

    def resume_writing(self):
        self.inner.resume_writing()

    def _end(self):
        self.closed = True
        self.wake.set()


def poll_acks(st, end, budget):
    """Wait up to ``budget`` seconds on this thread for the ACK that commits ``end`` from the members
    ``end``'s chunk went ahead to, polling their sockets and handling what they send in place
    (:meth:`AckReader.data_received`: the confirm is written from here). Returns at once when none of
    them can be polled (TLS), when the committed offset reaches ``end``, or when a connection ends (its
    end of file is left for the loop's transport). True when ``end`` was committed here.

    Why (issue 23, confirm p50 <= 2x one node, on a 2-core VM): a process whose CPU has gone idle is
    woken through an inter-processor interrupt, which on this machine's hypervisor costs the sender and
    the woken ~15-40 µs each, twice per confirm on top of a lone node's path. The member's ACK comes
    ~50-150 µs after the send; a leader that polls for it meanwhile is not asleep when it comes, so the
    ACK costs neither. It is the trade Erlang's schedulers make (busy wait before sleep): CPU for
    latency, and only where it pays: ClusterNode.hold calls it only for a one-message publish whose chunk
    went ahead of its commit (:class:`SendAhead`), when it is the only confirm the node waits for (one
    publisher at a time; under load, or with batches in flight, the loop has other work and never polls),
    and for at most ACK_POLL. Loop thread only; blocks the loop for at most ``budget``."""
    readers = {}
    for feed in st.feeds:
        acks = feed.acker
        if feed.fd >= 0 and feed.pos >= end and acks is not None and not acks.closed:
            readers[feed.fd] = acks
    if not readers:
        return False
    poller = select.poll()
    for fd in readers:
        poller.register(fd, select.POLLIN)
    clock = time.perf_counter
    deadline = clock() + budget
    while st.committed < end:
        if clock() >= deadline:
            return False
        for fd, _ in poller.poll(0):
            try:
                data = os.read(fd, 65536)
            except BlockingIOError:
                continue
            except OSError:
                return False        # the transport meets the error too, and ends the connection
            if not data:
                return False        # the end of the connection: left for the transport
            readers[fd].data_received(data)
    return True
