"""The session kernel: the one shape of a protocol connection, whatever its protocol and transport.

A *session* is one client connection as a sans-I/O state machine (the asyncpg ``coreproto`` role). Its
protocol package gives it commands; this module gives it everything else: the connection states, the
dispatch-table form, the io contract, the lifecycle (handshake -> auth -> open -> closing -> closed),
heartbeats and idle timeouts, back-pressure (transport, per-connection, broker-wide), the shutdown drain
and the containment of a session's bugs.

Layers (README, "How it is built")::

    transport adapter (TCP listener, ZeroMQ ROUTER, aiohttp WebSocket)   -- implements the io contract
      -> SessionKernel subclass (protocol commands, error rendering)    -- codec.py: pure functions
        -> Broker (streams, tails, offsets, budget)  -> Engine (log, LMDB)

States (:class:`State`): ``HANDSHAKE`` (connected, not authenticated) -> ``AUTH`` (authenticated, the
protocol still negotiating, e.g. RabbitMQ Tune/Open; protocols without that step go straight on) ->
``OPEN`` -> ``CLOSING`` (a goodbye or a held refusal is on its way; input is ignored) -> ``CLOSED``
(released; nothing is written any more). A protocol that needs no login starts at ``OPEN``.

Dispatch: each protocol module declares ``COMMANDS = commands(TheSession, {key: (name, min_state,
...)})``: ``key`` is whatever its codec yields for a request (a command key, a frame type, a (noun,
verb) pair), ``name`` the command's name as the protocol spells it, and the handler is the session's
method ``_on_<name in snake_case>`` (checked when the table is built). A request whose state is below
``min_state`` is refused in the protocol's terms.

The io contract (what a session calls; every transport adapter implements it)::

    io.write(data)              # one unit of output, queued by the transport, never blocks: bytes on a
                                #   stream (TCP); one message on a message transport (WebSocket: str or
                                #   bytes; ZeroMQ: a list of frames, sent to this session's identity)
    io.writelines(units)        # several, in order (TCP: one syscall; a message transport: one each)
    io.close(code=None, reason="")  # flush what is queued, then close (idempotent); code/reason for a
                                #   transport that has them (WebSocket 1001 "going away"), else ignored
    io.abort(internal=False)    # drop at once, discarding what is queued; internal=True: a session bug
    io.pause_reading()          # stop delivering input to data_received (idempotent)
    io.resume_reading()
    io.defer(fn, *args)         # run fn(*args) soon on the loop thread, under the session's guard
    io.call_later(delay, fn, *args) -> handle with .cancel()   # seconds; under the session's guard

and what the adapter calls (all on the loop thread; wrap each in :meth:`SessionKernel.guard`)::

    session.data_received(data)     # input: any slice of the byte stream (TCP), or one message as the
                                    # transport has it (a WebSocket str/bytes, a ZeroMQ list of frames);
                                    # the protocol's _received(data) frames and dispatches it
    session.pause_writing()         # the transport's output is over its high mark (back-pressure) ...
    session.resume_writing()        # ... and back under its low mark
    session.connection_lost()       # the peer is gone (or the adapter closed it); idempotent
    session.tick(now)               # every TICK_INTERVAL, broker clock seconds: heartbeats, timeouts
    session.begin_shutdown()        # server shutdown, step 1: stop reading, finish in-flight work
    session.pending_ops             # in-flight engine operations (the drain waits for 0)
    session.close_gracefully(reason)    # step 2: the protocol's goodbye, then close
    session.close_by_admin(reason)  # the management API's DELETE /api/connections/{name}
    session.peer                    # "host:port" (or an identity), for logs

How the other transports adapt: a ZeroMQ ROUTER has one session per identity (built on its first
message, kept in a dict by the adapter): ``write`` sends to that identity with ``NOBLOCK``, a full pipe
(BLOCKED) calls ``pause_writing`` and the adapter calls ``resume_writing`` when the socket polls
writable again, a vanished peer (GONE) is ``connection_lost``; ``pause_reading`` keeps that identity's
messages queued in the adapter until ``resume_reading``. An aiohttp WebSocket adapter writes each unit
with ``send_str``/``send_bytes`` (no await: the transport buffers), calls ``pause_writing`` when the
transport's write buffer passes its high mark (``transport.get_write_buffer_size()``, checked after
each write) and ``resume_writing`` below the low mark (checked on drain), and maps ``pause_reading`` to
not awaiting the next ``receive()``. Nothing here knows sockets: sessions run under a fake io in tests
(``tests/shells/harness.py``), whose ``abort`` and ``call_later`` the kernel never needs for a plain
run (``call_later`` is optional: the kernel's own timers run on :meth:`~SessionKernel.tick`).

Everything in this module runs on the event loop's thread (no locks).
"""

import asyncio
import logging
import re
from enum import IntEnum
from typing import Callable, NamedTuple

log = logging.getLogger("riverbed.broker")

TICK_INTERVAL = 0.25         # seconds between heartbeat/timeout checks of all sessions
CLOSE_GRACE = 1.0            # seconds a graceful close may take before the transport is aborted
PENDING_OPS_HIGH = 10_000    # engine operations in flight before a connection stops being read ...
PENDING_OPS_LOW = 5_000      # ... and at or under which it is read again


class State(IntEnum):
    """Connection states, in order: a comparison (``state >= State.CLOSING``) asks "at least"."""
    HANDSHAKE = 0       # connected; not authenticated
    AUTH = 1            # authenticated; the protocol still negotiating (RabbitMQ: Tune, Open)
    OPEN = 2
    CLOSING = 3         # closing: a goodbye or held refusal is on its way; input is ignored
    CLOSED = 4          # released; nothing is written any more


# the management API's names of the states (RabbitMQ's words)
STATE_NAMES = {State.HANDSHAKE: "starting", State.AUTH: "tuning", State.OPEN: "running",
               State.CLOSING: "closing", State.CLOSED: "closed"}


class Command(NamedTuple):
    """One entry of a protocol's ``COMMANDS`` table."""
    handler: Callable   # the session's unbound ``_on_<name>`` method
    min_state: State    # lowest state in which the command is taken
    name: str           # as the protocol spells it (logs, errors)
    versions: tuple = (1,)    # accepted versions, for protocols that version their commands


def handler_name(name):
    """``"PeerProperties"`` -> ``"_on_peer_properties"``, ``"EVENT PUBLISH"`` -> ``"_on_event_publish"``,
    ``"LISTCHANNELS"`` -> ``"_on_listchannels"``: the one pattern of handler names."""
    snake = re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", name.strip())
    return "_on_" + re.sub(r"[^0-9a-zA-Z]+", "_", snake).lower()


# the kernel's own ``_on_*`` hooks; no command may be named so that its handler would be one of them
KERNEL_HOOKS = frozenset({"_on_tick", "_on_shutdown", "_on_writable"})


def commands(cls, table):
    """Build a ``COMMANDS`` mapping for session class ``cls`` from ``{key: (name, min_state[, versions])}``.
    Raises AttributeError at import when ``cls`` lacks a handler (a table that names a missing command
    fails loudly, not on the first request), ValueError for a command whose handler name is a kernel
    hook's."""
    out = {}
    for key, (name, min_state, *versions) in table.items():
        if handler_name(name) in KERNEL_HOOKS:
            raise ValueError(f"command {name!r}: {handler_name(name)} is a kernel hook")
        handler = getattr(cls, handler_name(name))
        out[key] = Command(handler, State(min_state), name, tuple(versions[0]) if versions else (1,))
    return out


class SessionKernel:
    """The lifecycle every protocol session shares; a protocol subclasses it and adds its commands.

    A subclass sets ``LISTENER`` (its metric label) and ``PROTOCOL`` (the management API's protocol
    name), both its protocol's one name from :mod:`riverbed.shells.protocols`, its ``COMMANDS`` table (module level), and implements :meth:`_received` (framing and dispatch). It
    may override the hooks (each documented where it is defined): :meth:`_handshake_timeout`,
    :meth:`_idle_timeout`, :meth:`_heartbeat_interval`/:meth:`_heartbeat_frame`, :meth:`_on_tick`,
    :meth:`_outgoing`, :meth:`_backlogged`/:meth:`_drained`, :meth:`_reading_resumed`,
    :meth:`_tails`, :meth:`_on_writable`, :meth:`_on_shutdown`, :meth:`_goodbye`, :meth:`_before_close`,
    :meth:`_drop_all`, :meth:`_info`; it builds its management rows with :meth:`_consumer_info`. Loop thread only; never raises out of the io entry points for bad
    input (the subclass renders it as a protocol error).
    """

    LISTENER = "?"          # the listener label of riverbed_rejected_total
    PROTOCOL = "?"          # "protocol" of connection_info / consumer_infos
    INITIAL_STATE = State.HANDSHAKE
    PENDING_OPS_HIGH = PENDING_OPS_HIGH
    PENDING_OPS_LOW = PENDING_OPS_LOW
    pending_ops = 0         # engine operations not completed yet (an int attribute once counted, or a property)

    def __init__(self, shell, io, *, peer="?", local=None, remote=None, peer_loopback=False):
        self.shell = shell
        self.broker = broker = shell.broker
        self.io = io
        self.peer = peer
        self.local = local or (None, 0)
        # "host:port" by default; an identity transport (ZeroMQ) passes what it has as remote
        self.remote = remote or ((peer.rpartition(":")[0] or peer) if isinstance(peer, str) else repr(peer), 0)
        self.peer_loopback = peer_loopback
        self.state = self.INITIAL_STATE
        now = broker.clock()
        self.created = now
        self.connected_at = broker.wall_clock()
        self.last_recv = now
        self.last_sent = now
        self.user = None
        self.username = None
        self.client_properties = {}
        self.limits = broker.limits     # the named limits (limits.py), as they were when it connected
        self._out = []                  # output of this turn, written by _flush
        self._inflight_bytes = 0        # appended data handed to the engine and not committed yet
        self._write_paused = False      # the transport's output is over its high mark
        self._read_paused = False       # we asked the transport to stop reading
        self._budget_paused = False     # reading stopped by the broker-wide in-flight budget
        self._shutting_down = False
        self._released = False
        self._close_deadline = None     # a held refusal (_refuse_later) goes out at this clock
        self._held_refusal = None
        broker.register(self)

    # -------------------------------------------------------------------------------- io entry points

    def guard(self, fn, *args):
        """Run ``fn(*args)``; a bug in it costs this connection only: logged, and the transport aborted
        (``io.abort(internal=True)``, which the adapter counts). Adapters route every call in here."""
        try:
            return fn(*args)
        except Exception:  # a bug must cost this connection only, never the server
            log.exception("%s: internal error; closing the connection", self.peer)
            self.state = State.CLOSED
            try:
                self._release()
            except Exception:
                log.exception("%s: internal error while releasing", self.peer)
            abort = getattr(self.io, "abort", None)     # the tests' plain fake io has none: close it
            if abort is not None:
                abort(internal=True)
            else:
                self.io.close()

    def data_received(self, data):
        """Input from the peer: framed and dispatched by :meth:`_received`; then the budgets are checked
        (a read that published may stop this connection's reading)."""
        if self.state >= State.CLOSING:
            return              # closed, or holding a refusal before closing: the peer's input is moot
        self.last_recv = self.broker.clock()
        budget = self.broker.inflight
        before = budget.used
        self._received(data)
        if budget.used > before and self.state < State.CLOSED:
            self._after_publish()

    def _received(self, data):
        """Frame ``data`` (a slice of the stream, or one message) and dispatch each request through the
        protocol's ``COMMANDS`` (the protocol's part)."""
        raise NotImplementedError

    def pause_writing(self):
        """The transport's output is over its high mark: stop delivering and stop reading (a peer that
        does not read its replies must not make us buffer them without bound)."""
        self._write_paused = True
        for tail in self._tails():
            tail.pause()
        self._update_reading()

    def resume_writing(self):
        self._write_paused = False
        self._update_reading()
        for tail in list(self._tails()):
            tail.resume()
        self._on_writable()
        self._flush()

    def connection_lost(self):
        """The transport is gone (peer closed, reset, or we closed it). Idempotent."""
        self.state = State.CLOSED
        self._release()

    # ------------------------------------------------------------------------------------- output

    def _send(self, data):
        self._out.append(data)

    def _flush(self):
        """Write what this turn queued, in one ``writelines``."""
        if self._out and self.state < State.CLOSED:
            out, self._out = self._out, []
            self.io.writelines(self._outgoing(out))
            self.last_sent = self.broker.clock()

    def _outgoing(self, out):
        """Hook: ``out`` as it goes to the transport (RabbitMQ merges confirms here)."""
        return out

    # ------------------------------------------------------------------------- completions and flow

    def _later(self, fn):
        """Wrap an engine completion: counted (flow control, shutdown drain), dropped once the
        connection is gone, output flushed after it runs (once per completion batch: ``flush_soon``)."""
        self.pending_ops += 1
        if self.pending_ops > self.PENDING_OPS_HIGH and not self._read_paused:
            self._update_reading()

        def run(*args):
            self.pending_ops -= 1
            if self.state >= State.CLOSED:
                return
            fn(*args)
            if self._read_paused:
                self._update_reading()
            self.broker.flush_soon(self, self._flush)
        return run

    def _inflight(self, size, done):
        """``done`` wrapped as :meth:`_later` does, with ``size`` bytes counted against this connection
        (``max_pending_bytes``) until the append completes (the broker counts every append against the
        broker-wide budget itself)."""
        self._inflight_bytes += size
        run = self._later(done)

        def complete(*args):
            self._inflight_bytes -= size
            run(*args)
        return complete

    def _after_publish(self):
        """After a read that handed appends on: pause reading past the broker's budget (resumed in turn
        once it is back at its low mark) or this connection's ``max_pending_bytes``."""
        if not self._budget_paused and self._hold_if_over_budget():
            return
        if self._inflight_bytes > self.limits.max_pending_bytes:
            self._update_reading()

    def _hold_if_over_budget(self):
        """Stop reading while the broker-wide in-flight budget is exceeded; True when it paused."""
        return self.broker.hold_if_over_budget(self, self._budget_pause, self._budget_resume)

    def _budget_pause(self):
        self._budget_paused = True
        self._update_reading()

    def _budget_resume(self):
        self._budget_paused = False
        if self.state < State.CLOSED:
            self._update_reading()

    def _update_reading(self):
        """Pause or resume the transport's reading from the one set of reasons: transport output full,
        shutdown, the broker's budget, this connection's backlog (:meth:`_backlogged`)."""
        want_pause = self._write_paused or self._shutting_down or self._budget_paused or self._backlogged()
        if want_pause and not self._read_paused:
            self._read_paused = True
            self.io.pause_reading()
        elif self._read_paused and not want_pause and self._drained():
            self._read_paused = False
            self.io.resume_reading()
            self._reading_resumed()

    def _backlogged(self):
        """Hook: this connection has too much work in flight to take more."""
        return self.pending_ops > self.PENDING_OPS_HIGH or self._inflight_bytes > self.limits.max_pending_bytes

    def _drained(self):
        """Hook: a paused connection's backlog is low enough to read again (hysteresis)."""
        return self.pending_ops <= self.PENDING_OPS_LOW and self._inflight_bytes <= self.limits.max_pending_bytes // 4

    def _reading_resumed(self):
        """Hook: reading resumed (a session that stopped mid-buffer picks its input up again)."""

    def _tails(self):
        """Hook: the broker Tails delivering to this connection (paused with the transport); by default
        those of ``self.subscriptions``' :class:`~riverbed.shells.broker.subscription.Subscription` values."""
        return [sub.tail for sub in self.subscriptions.values() if sub.tail is not None]

    def _on_writable(self):
        """Hook: the transport takes output again (after the tails resumed)."""

    # ------------------------------------------------------------------------------------- timers

    def tick(self, now):
        """Clock tick (seconds, the broker's clock): a held refusal that is due, the handshake
        timeout, the idle timeout, heartbeats, then the protocol's own timers (:meth:`_on_tick`)."""
        if self.state >= State.CLOSED:
            return
        if self.state == State.CLOSING:
            if self._close_deadline is not None and now >= self._close_deadline:
                if self._held_refusal is not None:
                    self._send(self._held_refusal)
                self._hard_close()
            return
        if self.state < State.OPEN:
            limit = self._handshake_timeout()
            if limit and now - self.created > limit:
                log.info("%s: handshake not done within %.0f s; closing", self.peer, limit)
                self._hard_close()
                return
        limit = self._idle_timeout()
        if limit and now - self.last_recv > limit:
            if self.pending_ops or self._read_paused:
                # the peer waits on us (answers owed: a publisher whose window is full of unconfirmed
                # messages sends nothing until they are confirmed), or its input waits unread because we
                # stopped reading it: that silence is ours, so it counts only from now on
                self.last_recv = now
            else:
                silent = now - self.last_recv
                log.info("%s: nothing received for %.1f s; closing the idle connection", self.peer, silent)
                self._idle_close(silent)
                return
        hb = self._heartbeat_interval()
        if hb and now - self.last_sent >= hb:
            self._send(self._heartbeat_frame())
            self._flush()
        self._on_tick(now)

    def _handshake_timeout(self):
        """Hook: seconds a connection may stay before OPEN (None: no limit)."""
        return None

    def _idle_timeout(self):
        """Hook: seconds without input before the connection is closed (None: never). Time during which
        the connection has engine operations pending or its reading paused does not count."""
        return None

    def _idle_close(self, silent):
        """Hook: close a connection that sent nothing for ``silent`` seconds (default: flush, then close;
        a protocol that can say why first does so)."""
        self._hard_close()

    def _heartbeat_interval(self):
        """Hook: seconds without output before a heartbeat frame is sent (None: none; only when OPEN)."""
        return None

    def _heartbeat_frame(self):
        raise NotImplementedError

    def _on_tick(self, now):
        """Hook: the protocol's own timers."""

    # ---------------------------------------------------------------------------------- lifecycle

    def begin_shutdown(self):
        """Server shutdown, step 1: stop reading; in-flight work still completes and is answered."""
        self._shutting_down = True
        self._on_shutdown()
        self._update_reading()

    def _on_shutdown(self):
        """Hook: hand on what was read and held back (a gathered batch) before the drain."""

    def close_gracefully(self, reason="server shutdown"):
        """Server shutdown, step 2 (once :attr:`pending_ops` drained): the protocol's goodbye, what is
        queued goes out, then the transport closes."""
        if self.state >= State.CLOSED:
            return
        log.debug("%s: closing connection: %s", self.peer, reason)
        self._goodbye(reason)

    def close_by_admin(self, reason="closed via management API"):
        """Closed through the management API: as a graceful close."""
        if self.state >= State.CLOSED:
            return
        log.info("%s: closing connection %r: %s", self.peer, self.name, reason)
        self._goodbye(reason)

    def _goodbye(self, reason):
        """Hook: end the connection in the protocol's terms (default: flush, then close; no frame)."""
        self._hard_close()

    def _refuse_later(self, frame, delay):
        """Hold the refusing ``frame`` for ``delay`` seconds (reading nothing meanwhile), then send it and
        close (RabbitMQ's ``silent_close`` tarpit against credential guessing)."""
        if not delay:
            self._send(frame)
            self._hard_close()
            return
        self._flush()
        self._held_refusal = frame
        self.state = State.CLOSING
        self._close_deadline = self.broker.clock() + delay

    def _hard_close(self):
        """Flush what is queued, release, and close the transport. Idempotent."""
        if self.state >= State.CLOSED:
            return
        self.state = State.CLOSING      # from here input is moot, and a flush may not close again
        self._before_close()
        self._flush()
        self.state = State.CLOSED
        self._release()
        self.io.close()

    def _before_close(self):
        """Hook: output held back that must still go out (replies waiting for an ordering point)."""

    def _release(self):
        """Drop everything this connection holds in the broker (subscriptions, budget waits,
        registration). Runs once, on the first close or loss."""
        if self._released:
            return
        self._released = True
        self._drop_all()
        self._out = []
        self.broker.unregister(self)    # also cancels a budget wait

    def _drop_all(self):
        """Hook: end the protocol's subscriptions and per-connection state."""

    # ----------------------------------------------------------------------------- management API

    @property
    def name(self):
        """The connection's name (RabbitMQ's form ``"peer -> local"``)."""
        return f"{self.remote[0]}:{self.remote[1]} -> {self.local[0]}:{self.local[1]}"

    def connection_info(self):
        """What the management API shows of this connection (RabbitMQ's field names); the protocol's own
        fields come from :meth:`_info`."""
        info = {
            "name": self.name, "protocol": self.PROTOCOL, "peer_host": self.remote[0], "peer_port": self.remote[1],
            "host": self.local[0], "port": self.local[1], "user": self.username or "",
            "client_properties": dict(self.client_properties), "connected_at": self.connected_at,
            "state": STATE_NAMES.get(self.state, "closed"),
        }
        info.update(self._info())
        return info

    def _info(self):
        """Hook: protocol fields of :meth:`connection_info`."""
        return {}

    def consumer_infos(self):
        """This connection's subscriptions for the dashboard and ``/api/stream/consumers``: a list of
        :meth:`_consumer_info` dicts (see the RabbitMQ Stream session's for the fields). Loop-thread only."""
        return []

    def _consumer_info(self, stream, subscription_id, offset, reference=None, credits=None, **extra):
        """One entry of :meth:`consumer_infos`: ``offset`` is the next offset to deliver, ``reference``
        the consumer's name (None without one), ``credits`` what the client may still take (None for a
        protocol without credits); ``extra`` are the protocol's own fields."""
        info = {"stream": stream, "protocol": self.PROTOCOL, "connection": self.name,
                "subscription_id": subscription_id, "reference": reference, "offset": offset, "credits": credits}
        info.update(extra)
        return info

    def stream_deleted(self, name):
        """The broker deleted stream ``name`` (any protocol). Default: nothing to do."""


# -------------------------------------------------------------------------------- listener side

def tick_all(sessions, now):
    """Tick every session in ``sessions`` (an iterable), each under its own guard."""
    for s in sessions:
        s.guard(s.tick, now)


async def drain(loop, sessions, *, drain_timeout=10.0, close_grace=CLOSE_GRACE, alive=None):
    """The one shutdown drain of a listener's sessions. ``sessions()`` returns the live sessions.

    Every session stops reading (:meth:`~SessionKernel.begin_shutdown`); in-flight work completes and
    is answered (at most ``drain_timeout`` seconds); each session then closes gracefully; the caller's
    ``alive()`` (default: any session left) is awaited for at most ``close_grace`` seconds. Returns the
    sessions still there, for the adapter to abort. Never raises for a session's error (logged)."""
    for s in sessions():
        s.guard(s.begin_shutdown)
    deadline = loop.time() + drain_timeout
    while any(s.pending_ops for s in sessions()) and loop.time() < deadline:
        await asyncio.sleep(0.01)
    for s in sessions():
        try:
            s.close_gracefully("server shutdown")
        except Exception:
            log.exception("%s: error while closing", s.peer)
    alive = alive or (lambda: bool(sessions()))
    deadline = loop.time() + close_grace
    while alive() and loop.time() < deadline:
        await asyncio.sleep(0.01)
    return sessions()
