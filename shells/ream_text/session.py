"""One REAM 1.0 connection as a sans-I/O state machine: bytes in, replies out through ``io``.

Replies are strictly in request order, whatever completes first: every request takes a slot at the end
of the output queue when it is parsed, and the queue is written from its head as far as slots are
filled. Event deliveries (and keep-alive PINGs) are appended as filled slots, so a subscription's events
always follow its ``EVENT SUBSCRIBED`` line; ``EVENT UNSUBSCRIBE`` closes the tail at once and queues its
reply behind every event already queued, so nothing of that stream follows it.

Publishes that arrive together (one ``data_received``) for one stream go to the engine as one append
(one commit); the reply of each carries its own id. Subscriptions are broker Tails in window mode: a
delivery counts against the window until it is written to the transport, and the transport's own buffer
pauses every tail (and the reading of requests) when it is full.

Effects are ordered too (read-your-writes on one connection): a read (GET, LIST, SELECT, SUBSCRIBE) starts
once this connection's earlier writes have committed, a write once its earlier reads still running have
taken their snapshot; writes pipeline freely among themselves (the engine applies them in order).

The request handlers (``_on_<noun>_<verb>``, table :data:`COMMANDS`) live in :mod:`.events` and
:mod:`.documents` (mixins); this module is the framing, the output queue, ordering and keep-alive. The
lifecycle, flow control and io contract are the session kernel's (:mod:`riverbed.shells.broker.session`).

Loop-thread only; never touches sockets or LMDB writes (reads of single documents and stream metadata
are short LMDB lookups through the broker/DocStore).
"""

import logging
from collections import deque

from riverbed.engine.errors import RiverbedError
from riverbed.shells.broker import limits as _limits
from riverbed.shells.broker.session import SessionKernel, commands
from riverbed.shells.ream_text import codec as C
from riverbed.shells.ream_text import expr as X
from riverbed.shells.ream_text.codec import (
    AGGREGATE, EVENT, K_READ, K_WRITE, KINDS, PROJECTION, ST_CLOSED, ST_CLOSING, ST_OPEN, ReamError, reason_of,
    usage_error,
)
from riverbed.shells.ream_text.documents import DocumentRequests
from riverbed.shells.ream_text.events import EventRequests
from riverbed.shells import wire
from riverbed.shells.protocols import REAM

log = logging.getLogger("riverbed.ream")
LISTENER = REAM   # the one name (protocols.py): the listener label of riverbed_rejected_total

MAX_QUEUED = 8192        # reply slots a connection may have outstanding before its reading pauses
RESUME_QUEUED = 2048
FAST_PUBLISH = True      # runs of plain pipelined EVENT PUBLISHes in one pass (tests turn it off to compare)


class _Slot:
    """One entry of the output queue: ``data`` (bytes) once filled; a delivery's ``tail`` and ``size``
    are acknowledged to the tail when written. ``replies``: how many requests' replies ``data`` holds
    (a run of pipelined publishes has one slot for all of them)."""
    __slots__ = ("data", "tail", "size", "replies")

    def __init__(self, data=None, tail=None, size=0, replies=1):
        self.data = data
        self.tail = tail
        self.size = size
        self.replies = replies


class _Request:
    __slots__ = ("noun", "verb", "words", "sizes", "payloads", "extra", "slot")

    def __init__(self, noun, verb, words, sizes, slot):
        self.noun, self.verb, self.words, self.sizes, self.slot = noun, verb, words, sizes, slot
        self.payloads = []
        self.extra = 0          # bytes of the current payload line dropped while it overran its size


class ReamSession(EventRequests, DocumentRequests, SessionKernel):
    """A REAM connection on the session kernel. See the module docstring."""

    LISTENER = LISTENER
    PROTOCOL = LISTENER     # the management API's protocol: the same one name
    INITIAL_STATE = ST_OPEN     # no handshake: the banner says it is open

    def __init__(self, shell, io, *, peer, local=("", 0), remote=("", 0), peer_loopback=True):
        super().__init__(shell, io, peer=peer, local=local, remote=remote, peer_loopback=peer_loopback)
        self.buf = bytearray()
        self.out = deque()
        self.out_grouped = 0            # replies in self.out beyond one per slot (publish-run slots)
        self.req = None                 # a request waiting for its payload line(s)
        self.subs = {}                  # stream -> events.Subscription
        self.batch = None               # (stream, [slot], [record]): publishes of this read, not submitted
        self._running = 0               # operations in flight (engine writes, offloaded reads)
        self.pending_reads = 0          # reads in flight that must not see later writes (SELECT, SUBSCRIBE)
        self.pending_writes = 0         # writes in flight that later reads must see
        self.queue = deque()            # (kind, fn): requests waiting for the ones before them (ordering)
        self._stop_reading = False      # shutdown/close: input is ignored from now on
        self._close_after_flush = False
        self.ping_sent_at = None
        user, reason = shell.user_for(peer_loopback)
        self.user = user
        self.username = user.name if user is not None else None
        if user is None:
            log.info("%s: refused: %s", peer, reason)
            io.write(C.error_line(reason))
            self._hard_close()
            return
        io.write(C.BANNER)

    # ---------------------------------------------------------------------------- kernel hooks

    @property
    def pending_ops(self):
        """Requests accepted and not answered yet: in flight or queued behind others (shutdown waits)."""
        return self._running + len(self.queue)

    def _received(self, data):
        if self._stop_reading:
            return
        self.buf += data
        self._process()

    def _drop_all(self):
        self._stop_reading = True
        for sub in self.subs.values():
            self._end_sub(sub)
        self.subs.clear()
        self.out.clear()
        self.out_grouped = 0

    def _tails(self):
        return [sub.tail for sub in self.subs.values() if sub.tail is not None]

    def _backlogged(self):
        return len(self.out) + self.out_grouped > MAX_QUEUED

    def _drained(self):
        return len(self.out) + self.out_grouped <= RESUME_QUEUED and not self._stop_reading

    def _reading_resumed(self):
        self.io.defer(self._process)

    def _on_tick(self, now):
        ka = self.shell.keepalive
        if not ka:
            return
        if self.ping_sent_at is not None:
            if now - self.ping_sent_at >= C.PONG_TIMEOUT:
                log.info("%s: no PONG within %.0f s; closing", self.peer, C.PONG_TIMEOUT)
                self._hard_close()
        elif now - self.last_recv >= ka:
            self.ping_sent_at = now
            self._push(C.PING)

    def _on_shutdown(self):
        self._stop_reading = True

    def _goodbye(self, reason):
        """REAM has no goodbye message: flush what is queued, then close."""
        self._stop_reading = True
        if self.req is not None:        # a request whose payload never came: answer it, do not wait
            req, self.req = self.req, None
            self._refuse(req, "Server shutting down")
        self._close_after_flush = True
        self._flush()

    def _info(self):
        return {"subscriptions": len(self.subs)}

    def consumer_infos(self):
        """This connection's EVENT SUBSCRIBEs (see the RabbitMQ Stream session's): the subscription id
        is the stream; the offset is the tail's, or where it will start while it waits for the stream;
        no credits. Loop-thread only."""
        out = []
        for stream, sub in list(self.subs.items()):
            if sub.closed:
                continue
            offset = sub.tail.offset if sub.tail is not None else sub.start
            if offset is not None:
                out.append(self._consumer_info(stream, stream, offset))
        return out

    def stream_deleted(self, name):
        """A stream was deleted (any protocol): its subscription here waits for it to appear again and
        then reads it from its first event."""
        sub = self.subs.get(name)
        if sub is not None and not sub.closed and sub.tail is not None:
            sub.stop_tail()
            sub.start = 0

    def stream_created(self, name):
        """The broker says ``name`` now exists (created through any protocol): a subscription waiting
        for it starts."""
        sub = self.subs.get(name)
        if sub is not None and sub.tail is None and not sub.closed and sub.start is not None \
                and self.state == ST_OPEN:
            self._start_tail(sub)

    # ------------------------------------------------------------------------------------ output

    def _slot(self):
        s = _Slot()
        self.out.append(s)
        return s

    def _push(self, data, tail=None, size=0):
        self.out.append(_Slot(data, tail, size))
        self._flush()

    def _fill(self, slot, data):
        slot.data = data
        self._flush()

    def _flush(self):
        if self.state >= ST_CLOSED:
            return
        out = self.out
        if out and out[0].data is not None:
            parts = []
            acks = []
            while out and out[0].data is not None:
                s = out.popleft()
                parts.append(s.data)
                if s.replies != 1:
                    self.out_grouped -= s.replies - 1
                if s.tail is not None:
                    acks.append((s.tail, s.size))
            self.io.writelines(parts)
            for tail, n in acks:
                tail.ack(n)
        if self._close_after_flush and not out:
            if self.state < ST_CLOSING:
                self._hard_close()
            return
        if self._read_paused:
            self._update_reading()

    # ------------------------------------------------------------------------------------- input

    def _process(self):
        buf = self.buf
        pos = 0
        n = len(buf)
        budget = self.broker.inflight
        inflight_before = budget.used
        try:
            while pos < n and not self._stop_reading:
                if self._backlogged() or self._write_paused or self._budget_paused:
                    self._update_reading()
                    break
                if budget.used > inflight_before and self._hold_if_over_budget():
                    break       # this connection published: it waits until the broker is back at its low mark
                req = self.req
                if req is None and FAST_PUBLISH and buf.startswith(C.PUBLISH_PREFIX, pos):
                    end = self._publish_run(buf, pos)
                    if end > pos:
                        pos = end
                        continue
                nl = buf.find(b"\n", pos)
                if req is not None:
                    size = req.sizes[len(req.payloads)]
                    if nl < 0:
                        avail = n - pos
                        if avail == size and req.extra == 0 and len(req.payloads) == len(req.sizes) - 1:
                            # the last payload, all its declared bytes and no newline after them (yet): it
                            # is complete, as REAM's own server takes it ("everything after the first \n");
                            # a newline that follows is an empty line, which is ignored
                            self._payload_line(req, bytes(buf[pos:n]))
                            pos = n
                            continue
                        if avail > size + 1:
                            # longer than declared and still no end: drop it as it comes (no buffering)
                            req.extra += avail
                            pos = n
                        break
                    self._payload_line(req, bytes(buf[pos:nl]))
                    pos = nl + 1
                    continue
                if nl < 0:
                    max_line = self.shell.broker.limits.ream_max_line
                    if n - pos > max_line:
                        _limits.reject(LISTENER, _limits.REASON_STRING_LENGTH, f"request line over {max_line} "
                                       "bytes", self.peer)
                        self._push(C.error_line(f"Request line longer than {max_line} bytes"))
                        self._close_when_flushed()
                    break
                raw = bytes(buf[pos:nl])
                pos = nl + 1
                self._request_line(raw)
        finally:
            del buf[:pos]
            self._submit_batch()

    def _close_when_flushed(self):
        self._stop_reading = True
        self._close_after_flush = True
        self._flush()

    def _publish_run(self, buf, pos):
        """Take the run of plain pipelined EVENT PUBLISHes of one stream at ``buf[pos:]`` in one pass
        (:func:`riverbed.shells.wire.ream_publish_run`): permission and stream checked once, each payload
        validated as :meth:`_on_event_publish` does, the records added to this read's batch, and one output
        slot for the run's replies (each still counts against MAX_QUEUED). Returns where the taken requests end: ``pos`` when none was taken. The run stops before the
        first request that would be refused (or is not plain), which the per-request path then answers,
        so every reply is byte for byte the per-request path's."""
        max_count = MAX_QUEUED + 1 - len(self.out) - self.out_grouped   # what the backlog check lets through
        stream, payloads, ends = wire.ream_publish_run(buf, pos, self.shell.max_payload, max_count)
        if stream is None:
            return pos
        stream = stream.decode("ascii")
        if not self._publish_allowed(stream):
            return pos
        records = self._json_records(payloads)
        taken = len(records)
        if not taken:
            return pos
        slot = _Slot(replies=taken)      # one slot for the run: its replies are consecutive anyway
        self.out.append(slot)
        self.out_grouped += taken - 1
        self._batch_add(stream, [slot], records)
        return ends[taken - 1]

    def _payload_line(self, req, content):
        if content.endswith(b"\r") and len(content) == req.sizes[len(req.payloads)] + 1:
            content = content[:-1]
        req.payloads.append((content, req.extra + len(content)))
        req.extra = 0
        if len(req.payloads) == len(req.sizes):
            self.req = None
            for (content, actual), size in zip(req.payloads, req.sizes):
                if actual != size:
                    self._refuse(req, C.size_mismatch_reason(size, actual))
                    return
            self._dispatch(req, [p for p, _ in req.payloads])

    def _request_line(self, raw):
        if raw.endswith(b"\r"):
            raw = raw[:-1]
        if not raw.strip():
            return
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            self._push(C.error_line("Invalid request: not UTF-8"))
            return
        try:
            words = C.split_words(text)
            if words[0] == EVENT and len(words) > 2 and words[1] != "LIST":
                words[2] = C.stream_name(words[2])     # decoded once: every handler sees the name itself
        except ReamError as e:
            self._push(C.error_line(e.reason))
            return
        head = words[0]
        if head == "PING" and len(words) == 1:
            self._submit_batch()
            self._push(C.PONG)
            return
        if head == "PONG" and len(words) == 1:
            self.ping_sent_at = None     # an answer, not a request: no reply
            return
        key = (head, words[1] if len(words) > 1 else None)
        past = C.COMMANDS.get(key)
        if past is None:
            shown = text if len(text) <= 40 else text[:40] + "..."
            hint = " (commands are UPPERCASE)" if head.upper() in _NOUNS and head.upper() != head else ""
            self._push(C.error_line(f"Unknown command: {shown}{hint}"))
            return
        positions = C.SIZE_POSITIONS.get(key)
        if positions is None:
            self._dispatch(_Request(key[0], key[1], words, (), self._slot()), [])
            return
        slot = self._slot()
        req = _Request(key[0], key[1], words, None, slot)
        sizes = []
        for p in positions:
            size = C.parse_size(words[p]) if len(words) > p else None
            if size is None or len(words) != positions[-1] + 1:
                self._refuse(req, usage_error(key).reason)
                return
            if size > self.shell.max_payload:
                _limits.reject(LISTENER, _limits.REASON_FRAME_SIZE, f"{size} bytes declared", self.peer)
                self._refuse(req, f"Message too large: {size} bytes declared, the limit is "
                                  f"{self.shell.max_payload}")
                self._close_when_flushed()   # never wait for (or buffer) such a body
                return
            sizes.append(size)
        req.sizes = sizes
        self.req = req

    # ---------------------------------------------------------------------------------- replying

    def _refuse(self, req, reason):
        """Answer ``req`` with its command's NON form (or fill its slot)."""
        noun, past = req.noun, C.COMMANDS[(req.noun, req.verb)]
        words = req.words
        name = words[2] if len(words) > 2 and req.verb != "LIST" else None
        extra = ()
        if noun == AGGREGATE and req.verb in ("SET", "GET", "REMOVE") and len(words) > 3:
            extra = (words[3],)
        if name is not None and noun == EVENT:
            name = C.name_token(name)
        elif name is not None and not C.NAME_RE.match(name):
            name = C.quote(name)
        self._fill(req.slot, C.non(noun, past, name, reason, *extra))

    def _answer(self, req, data):
        self._fill(req.slot, data)

    # Ordering of effects (read-your-writes within a connection): a read starts once every earlier write
    # of this connection has committed, and a write once every earlier read that is still running (an
    # offloaded SELECT, a SUBSCRIBE resolving) has taken its snapshot; requests queue in order otherwise.

    def _can_start(self, kind):
        if kind == K_READ:
            return self.pending_writes == 0
        if kind == K_WRITE:
            return self.pending_reads == 0
        return True

    def _run(self, kind, fn):
        if self.queue or not self._can_start(kind):
            self.queue.append((kind, fn))
        else:
            fn()

    def _begin(self, kind):
        self._running += 1
        if kind == K_READ:
            self.pending_reads += 1
        elif kind == K_WRITE:
            self.pending_writes += 1

    def _end(self, kind):
        self._running -= 1
        if kind == K_READ:
            self.pending_reads -= 1
        elif kind == K_WRITE:
            self.pending_writes -= 1
        q = self.queue
        while q and self._can_start(q[0][0]) and self.state == ST_OPEN:
            _, fn = q.popleft()
            fn()

    # --------------------------------------------------------------------------------- dispatch

    def _dispatch(self, req, payloads):
        key = (req.noun, req.verb)
        if key != (EVENT, "PUBLISH"):
            self._submit_batch()
        if req.verb not in ("LIST",) and len(req.words) > 2 and req.noun != EVENT:   # any stream name is fine
            try:
                C.check_name(req.words[2])
            except ReamError as e:
                self._refuse(req, e.reason)
                return
        if key == (EVENT, "PUBLISH"):
            self._handle(req, payloads)    # validates now; the batch goes through _run when submitted
        else:
            self._run(KINDS.get(key, K_WRITE), lambda: self._handle(req, payloads))

    def _handle(self, req, payloads):
        try:
            COMMANDS[(req.noun, req.verb)].handler(self, req, payloads)
        except ReamError as e:
            if e.rejected is not None:
                _limits.reject(LISTENER, e.rejected, e.reason, self.peer)
            self._refuse(req, e.reason)
        except X.ExprError as e:
            self._refuse(req, f"Invalid expression: {e}")
        except RiverbedError as e:
            self._refuse(req, reason_of(e))
        except (ValueError, TypeError, LookupError, OverflowError, RecursionError) as e:
            # a request word or payload the checks let through: still this request's refusal
            _limits.reject(LISTENER, "field", f"{req.noun} {req.verb}: {e!r}", self.peer)
            self._refuse(req, f"Invalid request: {type(e).__name__}")

    def _need(self, req, nwords):
        if len(req.words) != nwords:
            raise usage_error((req.noun, req.verb))

    def _allow(self, what, name):
        if not self.broker.allowed(self.user, what, name):
            raise ReamError(f"Access refused: {what} on {name}")


_NOUNS = {EVENT, AGGREGATE, PROJECTION, "PING", "PONG"}

# (noun, verb) -> (name, lowest state); the handler is ``_on_<noun>_<verb>`` (events.py, documents.py)
COMMANDS = commands(ReamSession, {key: (f"{key[0]} {key[1]}", ST_OPEN) for key in C.COMMANDS})
