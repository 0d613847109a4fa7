"""The replication data plane of a cluster node: the leader serving its members, the members following it.

A leader accepts each member's connection on the replication port (wire.py for the frames), sends the
chunks of its log as stored (a member checks each CRC), the publisher sequences that cover them, the
consumer offsets and the committed offset; the member answers with the offset it holds durably. The
committed offset is the highest one a majority of the members hold (:class:`Leading`); confirms wait for
it, and every node's readers are limited to it. The control plane (leases, elections, placement) is in
node.py; :class:`ReplicationPlane` is the part of :class:`~riverbed.shells.cluster.node.ClusterNode` that
moves bytes.

Loop thread only (the broker's loop), except the engine completions posted back to it.
"""

import asyncio
import functools
import logging
import math
import os
import threading
import time

from riverbed.engine import core
from riverbed.engine.errors import RiverbedError, StreamNotFound
from riverbed.engine.format import H_CHUNK_ID, H_CRC, H_EPOCH, H_RECORDS
from riverbed.shells.cluster import forward_wire, membership, sac_wire, wire
from riverbed.shells.cluster.leader_path import AckReader

log = logging.getLogger("riverbed.cluster")

RETRY_DELAY = 0.2          # seconds before a member dials its leader again
MAX_UNSEQUENCED = 64 << 20  # bytes of chunks a member holds back until their publisher sequences arrive
ACK_QUIET = 0.05           # seconds: a COMMIT gets its own ACK only when no ACK went out for this long
HEARTBEAT_EVERY = 0.25     # lease TTLs: a member not heard from for this long is sent a COMMIT, which it answers
TIMER_SLACK = 0.005        # seconds: the loop's timers round to the millisecond and may fire this much early
# seconds: heartbeats fall due on this grid, so one wake-up serves every member connection (their ACKs
# arrive a few milliseconds apart, which would otherwise give each its own timer and wake-up)
HEARTBEAT_GRID = 0.05
# seconds a moved committed offset waits for a chunk to ride with: one publish at a time then costs each member
# one wake-up (chunk + the last COMMIT) instead of two; a member's readers see a record this much later at most
COMMIT_DELAY = 0.005
# seconds a chunk sent ahead to a majority's worth of members waits, at most, before the other members get
# it too (Leading.poke_behind): they get it as soon as the majority holds it, so on a machine with fewer
# cores than busy processes their store runs beside the client's next step, not beside the confirm path;
# this bound is for a first member that does not answer (dead, stopped, slow)
BEHIND_WAIT = 0.001
# bytes of a chunk copied when the socket takes only part of a send: queued on the transport, they wake the
# serving task once the socket has room again; the rest of the chunk is written from LMDB's map then
PIECE = 16 << 10


def _raw_fd(transport):
    """The socket's descriptor under a plain (not TLS) transport, for writes that bypass its buffer while
    that buffer is empty; -1 when there is none to use."""
    if transport.get_extra_info("sslcontext") is not None:
        return -1
    sock = transport.get_extra_info("socket")
    try:
        return sock.fileno() if sock is not None else -1
    except (AttributeError, OSError):
        return -1


class ReplicationTimeout(RiverbedError):
    """A majority of the stream's members did not hold the chunk within --replication-timeout."""


class Leading:
    """A stream this node leads: member positions, the committed offset, confirms waiting for it."""

    def __init__(self, node, name, epoch, members):
        self.node = node
        self.name = name
        self.epoch = epoch
        self.members = list(members)
        self.acked = {}            # member -> next offset it holds durably
        self.committed = 0
        self.waiting = []          # [offset, deadline, fn(exc)] in offset order
        self.since = time.monotonic()
        self.heard = {}            # member -> monotonic time of its last ack or connection
        self.connected = {}        # member -> open connections from it
        self.feeds = set()         # the _Feed of each connection serving a member
        self.conns = set()         # their writers, closed on resignation
        self._commit_timer = None  # sends a moved committed offset no chunk took along (COMMIT_DELAY)
        # nodes copying the log that do not count toward the majority yet (membership.py)
        self.learners = membership.learners_of(node.placements.get(name, ({}, 0))[0])
        self.frozen = False        # handing leadership over: the committed offset stays where it is
        self.fastest = None        # the member whose ACK last made the majority (leader_path.py)
        self.ahead = None          # (chunk id, end, frames) of the chunk sent ahead to some members only
        self.ahead_end = -1        # the end offset of the last chunk sent ahead of its commit (leader_path.py)
        self.copied = 0            # bytes of chunks copied out of LMDB to send them (see _Feed.send)
        self._behind = None        # [end, timer]: poke_behind(end) held until end is committed (BEHIND_WAIT)

    def local_next(self):
        try:
            return self.node.engine._current(self.name).next_offset
        except StreamNotFound:
            return 0

    def recompute(self):
        local = self.local_next()
        offsets = sorted([local] + [self.acked.get(m, 0) for m in self.members if m != self.node.name],
                         reverse=True)
        majority = len(self.members) // 2 + 1
        # never past the leader's own committed log: a chunk sent ahead of its local commit
        # (leader_path.py) counts once this node has stored it too, and a majority holds it
        committed = min(offsets[min(majority, len(offsets)) - 1], local)
        if committed > self.committed and self.node.lease_valid() and not self.frozen:
            self.committed = committed
            # the confirms first, then the readers: the latency a publisher waits on is the first
            self.release()
            self.node.engine.set_read_limit(self.name, committed)
            behind = self._behind
            if behind is not None and committed >= behind[0]:
                self._poke_behind_now()     # after the confirms: the other members' copies go out now
            if self._commit_timer is None and self.feeds:
                self._commit_timer = asyncio.get_running_loop().call_later(COMMIT_DELAY, self._send_commit)

    def _send_commit(self):
        self._commit_timer = None
        behind = self._behind
        for feed in list(self.feeds):
            # a member held back by poke_behind gets its chunk, and this offset with it, within BEHIND_WAIT
            if feed.sent_commit != self.committed and (behind is None or feed.pos >= behind[0]):
                feed.poke()

    def release(self):
        while self.waiting and self.waiting[0][0] <= self.committed:
            _, _, fn = self.waiting.pop(0)
            fn(None)

    def wait(self, offset, fn):
        if offset <= self.committed:
            fn(None)
            return
        entry = [offset, time.monotonic() + self.node.replication_timeout, fn]
        i = len(self.waiting)
        while i and self.waiting[i - 1][0] > offset:
            i -= 1
        self.waiting.insert(i, entry)

    def expire(self, now):
        keep = []
        for entry in self.waiting:
            if entry[1] <= now:
                entry[2](ReplicationTimeout(f"no majority of {self.name!r}'s members held the publish in time"))
            else:
                keep.append(entry)
        self.waiting = keep

    def fail_all(self, exc):
        waiting, self.waiting = self.waiting, []
        for _, _, fn in waiting:
            fn(exc)

    def poke(self):
        """New chunks (or a committed offset) for the members: each connection sends them now."""
        for feed in list(self.feeds):
            feed.poke()

    def poke_behind(self, end):
        """After the local commit of a publish ending at ``end``: the connections a chunk was not sent ahead
        to get the frames the first members got (leader_path.py; no read), and those still behind ``end``
        or with consumer offsets to send are poked. When that chunk went ahead to a majority's worth of
        members and is not committed yet, this waits until it is (:meth:`recompute`), or BEHIND_WAIT."""
        ahead = self.ahead
        if ahead is not None and ahead[1] == end and self.committed < end:
            behind = self._behind
            if behind is not None:      # an earlier one still waits: it goes now, this one waits
                behind[1].cancel()
                self._poke_behind(behind[0])
            self._behind = [end, asyncio.get_running_loop().call_later(BEHIND_WAIT, self._poke_behind_now)]
            return
        self._poke_behind(end)

    def _poke_behind_now(self):
        behind, self._behind = self._behind, None
        if behind is not None:
            behind[1].cancel()
            self._poke_behind(behind[0])

    def _poke_behind(self, end):
        version = self.node.engine.offsets_version
        ahead = self.ahead
        for feed in list(self.feeds):
            if ahead is not None and feed.pos == ahead[0] and feed.can_send_ahead(ahead[0]):
                feed.send_ahead(ahead[2], ahead[1])     # the frames the first members got: no read
            if feed.pos < end or feed.offsets_seen != version:
                feed.poke()

    def drop_members(self, chunk_id):
        """Close every member connection of this stream and forget how far they are past ``chunk_id``: that
        chunk was sent to them and not committed here (leader_path.SendAhead.unsealed). Each member
        reconnects, and its HELLO's last chunk, which this log lacks, gets it a TRUNCATE."""
        for feed in list(self.feeds):
            feed.dropped = True
            feed.writer.close()
        self.feeds.clear()
        for m in list(self.acked):
            self.acked[m] = min(self.acked[m], chunk_id)


class _Feed:
    """What a leader has sent one member connection, and how it sends more: from the connection's serving
    task (catching up, heartbeats, a full socket buffer), or at once on a poke while that task is parked
    and the socket's buffer is empty, so a publish's chunk leaves in the same loop turn as its append,
    with no task wake-up in between. Every frame of one send goes in one ``writev`` (one syscall; the
    member wakes once for the chunk, its sequences and the committed offset). Loop thread only."""

    __slots__ = ("plane", "st", "name", "writer", "transport", "ev", "pos", "parked", "sent_commit",
                 "sent_at", "sent_offsets", "offsets_seen", "dropped", "seqs_sent", "member", "fd", "tail", "undo",
                 "resume", "acker")

    def __init__(self, plane, st, writer, pos, ev):
        self.plane = plane
        self.st = st
        self.name = st.name
        self.writer = writer
        self.transport = writer.transport
        self.ev = ev              # wakes the serving task
        self.pos = pos            # the next offset the member gets
        self.parked = False       # the serving task waits on ev: a poke may send itself
        self.sent_commit = -1
        self.sent_at = 0.0
        self.sent_offsets = {}
        self.offsets_seen = -1
        self.dropped = False      # its leader closed it (drop_members): its ACKs no longer count
        self.member = None        # the node at the other end
        # the whole publisher sequence table went out (with a chunk) on this connection: only then may a
        # chunk go ahead with just the sequence it moves (a member that truncated lost its table)
        self.seqs_sent = False
        self.fd = _raw_fd(self.transport)   # chunks are written here straight from LMDB's map (send)
        self.tail = None
        self.undo = None
        self.resume = None      # (chunk id, its SEQS frame or b"", bytes of its frames written): send goes on there
        self.acker = None

    def can_send_ahead(self, chunk_id):
        """Whether chunk ``chunk_id`` may go out now, ahead of its local commit (leader_path.py): the
        serving task is parked, everything before the chunk was sent, and the socket's buffer is empty."""
        t = self.transport
        return (self.parked and self.pos == chunk_id and self.seqs_sent and not self.dropped
                and not t.get_write_buffer_size() and not t.is_closing())

    def send_ahead(self, frames, end):
        """Write ``frames`` (SEQS and CHUNK of the chunk ending at ``end``), with the committed offset if it
        moved, in one write."""
        out = list(frames)
        committed = self.st.committed
        if committed != self.sent_commit:
            self.sent_commit, self.sent_at = committed, time.monotonic()
            out.append(wire.u64_frame(wire.COMMIT, committed))
        self.pos = end
        self.writer.writelines(out)

    def heartbeat_due(self):
        """The monotonic time this connection's next heartbeat COMMIT is due: HEARTBEAT_EVERY lease TTLs
        after the later of the last COMMIT sent and the last ACK heard from its member, rounded up to
        HEARTBEAT_GRID (one wake-up for every connection of the node). An ACK proves the
        member alive as well as a heartbeat's answer would, so while chunks flow (each batch is
        acknowledged) no heartbeat goes out at all, and at rest one round trip per interval does;
        the leader's cut-off test (one TTL without a majority's word) gets the same evidence as before."""
        heard = self.st.heard.get(self.member, 0.0)
        due = max(self.sent_at, heard) + self.plane.ttl * HEARTBEAT_EVERY
        return math.ceil(due / HEARTBEAT_GRID) * HEARTBEAT_GRID

    def poke(self):
        t = self.transport
        if (self.parked and not t.get_write_buffer_size() and not t.is_closing()
                and self.plane.leading.get(self.name) is self.st):
            try:
                if not self.send():
                    return
            except Exception:       # noqa: BLE001 - the serving task meets it again and ends the connection
                pass
        self.ev.set()

    def send(self):
        """Write what the member lacks: chunks from ``pos`` (with the publisher sequences before the last
        chunk of a batch that reaches the log end), the committed offset if it moved or a heartbeat is
        due, consumer offsets that changed. True when more chunks are waiting (the batch was cut short,
        or the socket did not take all of it: the caller drains the transport, then sends again). Raises
        StreamNotFound, ConnectionResetError (the chunk a frame was cut in is no longer in the log)."""
        plane = self.plane
        engine = plane.engine
        name = self.name
        tail = []
        undo = (self.sent_commit, self.sent_at, self.offsets_seen, self.sent_offsets)
        committed = self.st.committed
        now = time.monotonic()
        if committed != self.sent_commit or now >= self.heartbeat_due() - TIMER_SLACK:
            # also a heartbeat: the member answers a COMMIT with an ACK when it sent none for ACK_QUIET,
            # so a connection gone silent (a partition leaves it open) does not count as hearing from it
            self.sent_commit, self.sent_at = committed, now
            tail.append(wire.u64_frame(wire.COMMIT, committed))
        version = engine.offsets_version
        if version != self.offsets_seen:
            # read only when a commit stored or deleted a consumer offset (of any stream): the read was a
            # transaction and a dict compare on every wake
            self.offsets_seen = version
            offsets = engine.stored_offsets(name)
            if offsets != self.sent_offsets:
                # consumer offsets reach the members too, so a consumer resumes after a failover
                tail.append(wire.json_frame(wire.OFFSETS, {k: v for k, v in offsets.items()
                                                           if self.sent_offsets.get(k) != v}))
                self.sent_offsets = offsets
        if self.pos < engine._current(name).next_offset:
            self.tail, self.undo = tail, undo
            return engine.read_replica_views(name, self.pos, self._send_views)
        if self.resume is not None:
            raise ConnectionResetError(f"chunk {self.resume[0]} of {name!r}, cut mid-frame, left the log")
        # caught up with the committed log (a COMMIT after a batch, a heartbeat): no read transaction
        # and no scan of the publisher sequences for a read that would find no chunk
        if tail:
            self.writer.writelines(tail)
        return False

    def _send_views(self, chunks, seqs):
        """Inside the read transaction of ``send``: the frames of ``chunks`` (memoryviews in LMDB's map),
        then ``self.tail``, in ONE writev straight from the map (nothing is queued on the transport then:
        the serving task drains it fully first). A chunk is never copied whole: when the socket takes
        only part of the frames, the chunks past the one it stopped in are sent again later (``pos``
        goes back to it), and the frame it stopped in goes on from where it stopped (``resume``: that
        chunk is read again from the map), after a piece of at most PIECE bytes queued on the transport,
        which is what wakes the serving task once the socket has room (drain). The bytes on the wire are
        exactly those of an uncut send. True when more is to be sent."""
        resume, self.resume = self.resume, None
        tail, self.tail = self.tail, None
        out = []
        # per chunk: (index of its first buffer in out, chunk id, end, its SEQS frame or b"", bytes of its
        # frames written before this send, bytes of its frames)
        units = []
        last = len(chunks) - 1
        for i, (chunk_id, view) in enumerate(chunks):
            end = chunk_id + max(core.read_header(view)[H_RECORDS], 1)
            head = wire.head(wire.CHUNK, len(view))
            if i == 0 and resume is not None:
                if chunk_id != resume[0]:
                    raise ConnectionResetError(f"chunk {resume[0]} of {self.name!r}, cut mid-frame, left the log")
                prefix, done = resume[1], resume[2]
                units.append((len(out), chunk_id, end, prefix, done, len(prefix) + len(head) + len(view)))
                for buf in (prefix, head, view):       # the unit from where the socket stopped
                    if done >= len(buf):
                        done -= len(buf)
                        continue
                    out.append(buf[done:] if done else buf)
                    done = 0
                continue
            # even {}: it ends the batch (a resumed chunk's SEQS, sent already in part, covers it)
            prefix = wire.json_frame(wire.SEQS, seqs) if seqs is not None and i == last else b""
            units.append((len(out), chunk_id, end, prefix, 0, len(prefix) + len(head) + len(view)))
            if prefix:
                out.append(prefix)
            out.append(head)
            out.append(view)
        first_tail = len(out)
        out += tail
        sent = 0
        t = self.transport
        # never once the transport is closing: its descriptor may be closed, and then reused, at any moment
        if self.fd >= 0 and not t.get_write_buffer_size() and not t.is_closing():
            try:
                sent = os.writev(self.fd, out)
            except (BlockingIOError, InterruptedError):
                pass
            except OSError:
                pass        # the transport meets the error with the piece below and ends the connection
        j = 0
        n = len(out)
        while j < n and sent >= len(out[j]):
            sent -= len(out[j])
            j += 1
        if j >= first_tail:
            # every chunk went (the common case): what is left of the small tail frames is queued as it is
            if units:
                self.pos = units[-1][2]
                if units[-1][3]:
                    self.seqs_sent = True
            if j < n:
                self.writer.writelines([out[j][sent:] if sent else out[j]] + out[j + 1:])
            return bool(chunks) and seqs is None
        # cut in chunk unit u: the chunks before it went; it goes on later from where the socket stopped
        u = len(units) - 1
        while units[u][0] > j:
            u -= 1
        start, chunk_id, end, prefix, done, size = units[u]
        done += sum(len(out[k]) for k in range(start, j)) + sent
        piece = out[j][sent:sent + PIECE]
        if type(piece) is not bytes:
            piece = bytes(piece)
            self.st.copied += len(piece)
        done += len(piece)
        if prefix:
            self.seqs_sent = True       # its SEQS goes out whole, before anything else on this connection
        if done < size:
            self.pos, self.resume = chunk_id, (chunk_id, prefix, done)
        else:
            self.pos = end              # the piece ends the chunk's frame
        # the tail (COMMIT, OFFSETS) did not go: it goes with the next send
        self.sent_commit, self.sent_at, self.offsets_seen, self.sent_offsets = self.undo
        self.writer.writelines([piece])
        return True


class ReplicationPlane:
    """The replication methods of ClusterNode (a mixin: they use the node's state, ``leading``,
    ``following``, ``engine``, ...)."""

    # ------------------------------------------------------------------------------ leader side
    async def _serve_member(self, reader, writer):
        st = None
        connected = None
        feed = None
        ev = asyncio.Event()
        try:
            kind, payload = await wire.read_frame(reader)
            if kind == forward_wire.FWD_HELLO:
                await self.forwarding.serve(reader, writer, payload)
                return
            if kind == sac_wire.SAC_HELLO:
                await self.sac.serve(reader, writer, payload)       # single active consumer (sac.py)
                return
            if kind != wire.HELLO:
                return
            hello = wire.decode_hello(payload)
            name, node = hello["stream"], hello["node"]
            st = self.leading.get(name)
            # an observer (remote_read.py) copies the log for its readers: served, never counted
            if (st is None or (node not in st.members and node not in st.learners and not hello["observer"])
                    or hello["epoch"] > st.epoch):
                writer.write(wire.json_frame(wire.REFUSE, {"reason": f"{self.name} does not lead {name!r}"}))
                await writer.drain()
                st = None
                return
            pos, last = hello["next"], hello["last"]
            if not last:
                pos = 0        # an empty copy holds nothing: it gets the log from wherever it starts here
            cut = self._divergence(name, pos, last)
            if cut is not None:
                writer.write(wire.u64_frame(wire.TRUNCATE, cut))
                await writer.drain()
                st = None
                return
            writer.transport.set_write_buffer_limits(high=0)     # drain() waits until nothing is queued
            feed = _Feed(self, st, writer, pos, ev)
            feed.member = node
            st.feeds.add(feed)
            st.conns.add(writer)
            st.acked[node] = pos
            st.connected[node] = st.connected.get(node, 0) + 1
            st.heard[node] = time.monotonic()
            connected = node
            loop = asyncio.get_running_loop()
            # ACKs are handled as they arrive, by the connection's protocol (leader_path.py)
            acks = AckReader(st, node, feed, reader, writer.transport, ev)
            while not acks.closed and not feed.dropped and self.leading.get(name) is st:
                ev.clear()
                # until what the socket did not take is gone (the buffer limits are 0): a send then writes
                # straight from LMDB's map, and copies at most what the socket does not take at once
                await writer.drain()
                more = feed.send()
                if more:
                    await asyncio.sleep(0)
                    continue       # more to send at once
                # woken by a poke that could not send itself, or when the heartbeat is due (not before:
                # a parked connection used to wake five times a second to find none due): a timer that
                # sets the event costs less than wait_for's task and future
                timer = loop.call_later(max(feed.heartbeat_due() - time.monotonic(), 0.0), ev.set)
                feed.parked = True
                try:
                    await ev.wait()
                finally:
                    feed.parked = False
                    timer.cancel()
        except (asyncio.IncompleteReadError, ConnectionError, wire.WireError, OSError, StreamNotFound):
            pass
        except Exception:
            log.exception("cluster: serving a member failed")
        finally:
            if st is not None:
                if feed is not None:
                    st.feeds.discard(feed)
                st.conns.discard(writer)
                if connected is not None:
                    st.connected[connected] -= 1
                    st.heard[connected] = time.monotonic()
            writer.close()

    def _divergence(self, name, pos, last):
        """None when the member's log is a prefix of this leader's, else the offset it must cut at
        (wire.CUT_ALL when all of it ends before this log's first chunk: retention or the document
        changelog's compaction removed what it would continue, so it starts again from here)."""
        if not last:
            return None
        chunk_id, epoch, crc = last
        first = self.engine._current(name).first_chunk
        if first >= 0 and chunk_id < first:
            return wire.CUT_ALL
        got = self.engine.read_chunks(name, chunk_id, 1, limited=False)
        if got and got[0][0] == chunk_id:
            h = core.read_header(got[0][1])
            if h[H_EPOCH] == epoch and h[H_CRC] == crc and chunk_id + max(h[H_RECORDS], 1) == pos:
                return None
        return chunk_id        # the member's last chunk is not ours: it drops it and asks again

    # ------------------------------------------------------------------------------ member side

    async def _follow(self, name, leader, epoch):
        while not self._stopping:
            reg = self.nodes.get(leader)
            if reg is None or self.following.get(name, (None,))[0] != leader:
                return
            try:
                await self._follow_once(name, leader, epoch, reg)
            except asyncio.CancelledError:
                raise
            except ConnectionRefusedError:
                # nothing listens on the leader's replication port: its process is gone (failover.py);
                # this member never follows it at this epoch again and reports for an election at once
                log.info("cluster: %s finds %s gone (leader of %s at epoch %d)", self.name, leader, name, epoch)
                self.watch.refused(name, leader, epoch)
                self.kick()
                return
            except (ConnectionError, OSError, asyncio.IncompleteReadError, wire.WireError) as e:
                log.debug("cluster: following %s on %s: %s", name, leader, e)
            except RiverbedError as e:      # a chunk refused (bad CRC, not at the log's end)
                log.warning("cluster: %s refused a chunk of %s from %s: %s", self.name, name, leader, e)
            except Exception:
                log.exception("cluster: following %s on %s failed", name, leader)
            await asyncio.sleep(RETRY_DELAY)

    async def _follow_once(self, name, leader, epoch, reg):
        host = reg.get("advertised_host") or "127.0.0.1"
        loop = asyncio.get_running_loop()
        transport, conn = await loop.create_connection(lambda: _Following(self, name, epoch), host,
                                                       reg["replication_port"])
        try:
            s = self.engine._current(name)
            last = None
            if s.last_chunk >= 0:
                raw = self.engine.read_chunks(name, s.last_chunk, 1, limited=False)[0][1]
                h = core.read_header(raw)
                last = [h[H_CHUNK_ID], h[H_EPOCH], h[H_CRC]]
            hello = {"node": self.name, "stream": name, "epoch": epoch, "next": s.next_offset, "last": last}
            if self.observers.observing(name):
                hello["observer"] = True
            conn.begin(s.next_offset, last is None)
            transport.write(wire.json_frame(wire.HELLO, hello))
            cut = await conn.done            # the frames are handled as they arrive (_Following)
            if cut is not None:
                if cut == wire.CUT_ALL:
                    cut = max(self.engine._current(name).first_chunk, 0)
                log.info("cluster: %s truncates %s at %d to follow %s (epoch %d)", self.name, name, cut,
                         leader, epoch)
                await asyncio.wrap_future(self.engine.truncate(name, cut))
        finally:
            transport.close()

    @staticmethod
    def _ack(writer, offset, durable):
        durable[0] = max(durable[0], offset)
        durable[1] = time.monotonic()
        if not writer.is_closing():
            writer.write(wire.u64_frame(wire.ACK, offset))


class _Following(asyncio.BufferedProtocol):
    """A member's connection to the leader of one stream. The socket is read straight into a
    :class:`wire.FrameReader`: a chunk lands in a receive buffer of the reader's, which goes to the engine
    as it is (checked once, by its CRC, and put once) and goes back to the reader, to be read into again,
    once the engine stored it (``stored``). The frames of one read are handled as it arrives, so a chunk
    is stored, and (committed inline, fsync=never) acknowledged, in the same loop turn that read it, with
    no task wake-up in between; every whole batch of that read (the chunks up to each SEQS's last chunk)
    goes to the engine in ONE transaction, acknowledged by one ACK. ``done`` resolves to None (REFUSE), to
    the offset a TRUNCATE asks to cut at, or to the error that ends the connection (the leader closed it, a
    bad frame, a refused chunk); :meth:`ReplicationPlane._follow_once` awaits it. Loop thread only, except
    ``stored`` (see there)."""

    def __init__(self, plane, name, epoch):
        self.plane = plane
        self.name = name
        self.epoch = epoch
        self.loop = asyncio.get_running_loop()
        self.loop_thread = threading.get_ident()
        self.done = self.loop.create_future()
        self.transport = None
        self.frames = wire.FrameReader()
        self.durable = [0, 0.0]     # the highest offset acknowledged here, and when the last ACK went out
        self.start = False          # an empty copy starts at the first chunk its leader sends
        self.seqs = None
        self.held = []              # chunks received without the sequences that cover them yet
        self.held_bytes = 0
        self.ready = []             # whole batches of this read, stored together at its end (_store)
        self.ready_seqs = None
        self.ack_asked = False      # a COMMIT of this read wants its heartbeat answer
        self.commit_after = None    # a COMMIT read behind chunks of this read: applied once they are stored

    def begin(self, next_offset, empty):
        self.durable[0] = next_offset
        self.start = empty

    def connection_made(self, transport):
        self.transport = transport

    def connection_lost(self, exc):
        self._finish(exc=exc or ConnectionResetError("the leader closed the replication connection"))

    def _finish(self, result=None, exc=None):
        if not self.done.done():
            if exc is None:
                self.done.set_result(result)
            else:
                self.done.set_exception(exc)

    def get_buffer(self, sizehint):
        return self.frames.get_buffer()

    def buffer_updated(self, nbytes):
        if self.done.done():
            return
        try:
            for kind, payload in self.frames.feed(nbytes):
                self._frame(kind, payload)
                if self.done.done():
                    return
            if self.ready:
                self._store()
            commit = self.commit_after
            if commit is not None:
                self.commit_after = None
                self._commit(commit)
            if self.ack_asked:
                self.ack_asked = False
                if time.monotonic() - self.durable[1] >= ACK_QUIET:
                    # the heartbeat's answer, unless this read's batch was acknowledged a moment ago
                    ReplicationPlane._ack(self.transport, self.durable[0], self.durable)
        except Exception as e:       # noqa: BLE001 - _follow tells the kinds apart (a bad frame, a refused chunk)
            self._finish(exc=e)
            self.transport.close()

    def stored(self, chunks, res, exc):
        """The engine's completion of a batch (``chunks``, the reader's buffers it stored): it runs once
        the batch is committed AND synced under the stream's fsync policy, on this thread when the engine
        committed inline (fsync=never, writer idle), so the ACK goes out at once, with no hop through the
        loop's wake-up pipe; else on the writer thread. The buffers go back to the reader only then
        (the engine no longer reads them), and only after a success: after an error the connection is
        closed and they are simply dropped."""
        t = self.transport
        if threading.get_ident() == self.loop_thread:
            if exc is None:
                ReplicationPlane._ack(t, res, self.durable)
                self._release(chunks)
            else:
                t.close()
        elif exc is None:
            if not t.is_closing():
                self.loop.call_soon_threadsafe(self._stored_later, res, chunks)
        else:
            self.loop.call_soon_threadsafe(t.close)

    def _stored_later(self, res, chunks):
        ReplicationPlane._ack(self.transport, res, self.durable)
        self._release(chunks)

    def _release(self, chunks):
        release = self.frames.release
        for chunk in chunks:
            release(chunk)

    def _store(self):
        """The whole batches of this read in ONE transaction (one commit, one sync, one ACK), with the
        publisher sequences of the last of them (each SEQS holds every publisher's sequence as of its
        batch's end, so the later one covers the earlier ones); a ChunkError (a bad CRC, a gap) stores none
        of them and drops the connection; the member then asks again."""
        chunks, self.ready = self.ready, []
        seqs, self.ready_seqs = self.ready_seqs, None
        start, self.start = self.start, False
        self.plane.engine.replicate_chunks(self.name, chunks, sequences=seqs, start=start,
                                           on_done=functools.partial(self.stored, chunks))

    def _commit(self, commit):
        """A COMMIT: this member's readers may see up to ``commit``."""
        self.plane.engine.set_read_limit(self.name, commit)
        self.plane.observers.heard_commit(self.name, commit)
        if time.monotonic() - self.durable[1] >= ACK_QUIET:
            # answered at the end of the read (a member that acknowledged a chunk a moment ago was
            # heard already: answering every COMMIT doubled the ACKs the leader reads)
            self.ack_asked = True

    def _frame(self, kind, payload):
        plane, name = self.plane, self.name
        if kind != wire.CHUNK and type(payload) is memoryview:
            # a large frame that is no chunk (a SEQS of many publishers): its bytes, and its slab back
            data = bytes(payload)
            self.frames.release(payload)
            payload = data
        if kind == wire.CHUNK:
            h = wire.decode_chunk(payload)      # the CRC is checked by replicate_chunks
            epoch = self.epoch
            if h[H_EPOCH] > epoch or epoch < plane.max_epoch.get(name, 0):
                # a leader of an older epoch than one this member has seen: refused
                raise wire.WireError(f"chunk of epoch {h[H_EPOCH]} from a leader at epoch {epoch}")
            if self.seqs is None and self.held_bytes + len(payload) <= MAX_UNSEQUENCED:
                # held until the publisher sequences that cover it arrive (SEQS comes with the last chunk
                # of a batch that reaches the leader's log end): a member whose leader dies mid-batch then
                # holds no chunk its dedup state does not count, so re-sent publishes are not stored twice
                # if it is elected
                self.held.append(payload)
                self.held_bytes += len(payload)
                return
            # the held chunks and this one are a whole batch: stored with the read's other batches
            self.ready += self.held
            self.ready.append(payload)
            self.held, self.held_bytes = [], 0
            seqs, self.seqs = self.seqs, None
            if seqs is not None:
                if self.ready_seqs is None:
                    self.ready_seqs = seqs
                else:
                    self.ready_seqs.update(seqs)
            return
        if kind == wire.SEQS:
            self.seqs = wire.decode_seqs(payload)
            return
        if kind == wire.COMMIT:
            if self.ready:
                # after this read's store and ACK (buffer_updated): the leader's confirm waits on the ACK,
                # not on this offset, which only covers chunks stored before the ones now ready
                self.commit_after = wire.u64(payload)
            else:
                self._commit(wire.u64(payload))
            return
        if self.ready:
            self._store()       # whatever comes after a batch acts after it is stored (as sent)
        if kind == wire.OFFSETS:
            for ref, off in wire.decode_offsets(payload).items():
                plane.engine.store_offset(name, ref, off)
        elif kind == wire.TRUNCATE:
            self._finish(wire.u64(payload))
        elif kind == wire.REFUSE:
            self._finish(None)
