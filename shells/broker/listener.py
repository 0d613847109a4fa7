"""The TCP adapter of the session kernel's io contract (:mod:`riverbed.shells.broker.session`): asyncio
glue around a sans-I/O session, and a listener with the lifecycle ``riverbed serve`` drives (start,
stop accepting, graceful shutdown through the kernel's one :func:`~riverbed.shells.broker.session.drain`).

:class:`SessionProtocol` is a session's ``io`` (write, writelines, close, abort, pause_reading,
resume_reading, defer, call_later) and hands the session bytes and the transport's flow-control signals,
each under the session's :meth:`~riverbed.shells.broker.session.SessionKernel.guard`.
"""

import asyncio
import logging

from riverbed.shells import auth as _auth
from riverbed.shells import tls as _tls
from riverbed.shells.broker.session import CLOSE_GRACE, TICK_INTERVAL, drain, tick_all  # noqa: F401
from riverbed.shells.broker.stats import ERR_INTERNAL, ERR_TRANSPORT

log = logging.getLogger("riverbed.broker")

WRITE_BUFFER_HIGH = 4 << 20  # transport write buffer marks, bytes: delivery pauses above the high mark
WRITE_BUFFER_LOW = 1 << 20


class SessionProtocol(asyncio.Protocol):
    """Moves bytes and flow-control signals between an asyncio transport and a session; is its ``io``.
    A bug in a session costs that connection only: it is logged and the connection aborted."""

    __slots__ = ("listener", "loop", "transport", "session")

    def __init__(self, listener):
        self.listener = listener
        self.loop = listener.loop
        self.transport = None
        self.session = None

    def connection_made(self, transport):
        self.transport = transport
        peer = transport.get_extra_info("peername") or ("?", 0)
        local = transport.get_extra_info("sockname") or (None, 0)
        transport.set_write_buffer_limits(high=WRITE_BUFFER_HIGH, low=WRITE_BUFFER_LOW)
        self.listener.stats.connections_total += 1     # metrics
        try:
            self.session = self.listener.session_factory(
                self, peer=f"{peer[0]}:{peer[1]}", local=(local[0], local[1]), remote=(peer[0], peer[1]),
                peer_loopback=_auth.is_loopback(peer[0]))
        except Exception:  # a bug in a session's set-up costs this connection only, as one in its life
            log.exception("%s:%s: internal error while setting up a session; closing the connection", *peer[:2])
            self.abort(internal=True)
            return
        self.listener.protocols.add(self)

    def data_received(self, data):
        stats = self.listener.stats     # metrics: two int updates per read, no lock (loop thread)
        stats.reads += 1
        stats.bytes_in += len(data)
        session = self.session
        if session is not None:
            session.guard(session.data_received, data)

    def eof_received(self):
        return False

    def connection_lost(self, exc):
        self.listener.protocols.discard(self)
        if exc is not None:     # metrics: reset, broken pipe (a close by either side passes None)
            self.listener.stats.error(ERR_TRANSPORT)
        if self.session is not None:
            self.session.guard(self.session.connection_lost)

    def pause_writing(self):
        if self.session is not None:
            self.session.guard(self.session.pause_writing)

    def resume_writing(self):
        if self.session is not None:
            self.session.guard(self.session.resume_writing)

    # the session's io
    def write(self, data):
        self.transport.write(data)

    def writelines(self, parts):
        self.transport.writelines(parts)

    def close(self, code=None, reason=""):
        self.transport.close()      # TCP has no close code: the protocol said its goodbye already

    def abort(self, internal=False):
        if internal:
            self.listener.stats.error(ERR_INTERNAL)       # metrics
        self.transport.abort()

    def pause_reading(self):
        if not self.transport.is_closing():
            self.transport.pause_reading()

    def resume_reading(self):
        if not self.transport.is_closing():
            self.transport.resume_reading()

    def defer(self, fn, *args):
        self.loop.call_soon(self.session.guard, fn, *args)

    def call_later(self, delay, fn, *args):
        return self.loop.call_later(delay, self.session.guard, fn, *args)


class TcpListener:
    """One TCP listener of a shell over the shared :class:`~riverbed.shells.broker.core.Broker`.

    A protocol's listener names its ``session_class`` (a
    :class:`~riverbed.shells.broker.session.SessionKernel`) and passes its ``shell`` (the state the
    connections of one listener share): each connection gets ``session_class(shell, io, peer=...,
    local=..., remote=..., peer_loopback=..., **session_options())``; or pass a ``session_factory(io, *,
    peer, local, remote, peer_loopback)``. ``local``/``remote`` are (host, port). A shell that has
    ``start()`` / ``close()`` gets them once bound / after the shutdown drain. ``port`` is the bound port once :meth:`start` returned
    (useful with port 0). ``ssl``, an ``ssl.SSLContext`` (see :mod:`riverbed.shells.tls`), makes it a
    TLS listener: a session is built only once the handshake succeeded, and a client that fails it (a
    plaintext client) is closed and logged in one line (:class:`riverbed.shells.tls.TlsServer`).
    Loop-thread only.
    """

    name = "tcp"
    session_class = None

    def __init__(self, broker, session_factory=None, *, shell=None, host="127.0.0.1", port=0, name=None, ssl=None):
        self.broker = broker
        self.shell = shell
        self.session_factory = session_factory or self._new_session
        self.host = host
        self.port = port
        self.ssl = ssl
        if name:
            self.name = name
        self.loop = None
        self.protocols = set()
        self._server = None
        self._ticker = None

    async def start(self):
        """Bind and start accepting. Raises OSError when the address cannot be bound."""
        self.loop = asyncio.get_running_loop()
        # metrics: here, not in __init__, because a subclass may rename itself after super().__init__
        self.stats = self.broker.stats.listener(self.name, self.protocols.__len__)
        if self.ssl is None:
            self._server = await self.loop.create_server(lambda: SessionProtocol(self), self.host, self.port,
                                                         reuse_address=True, backlog=1024)
        else:
            self._server = await _tls.create_server(lambda: SessionProtocol(self), self.host, self.port, self.ssl,
                                                    self.name, backlog=1024)
        self.port = self._server.sockets[0].getsockname()[1]
        self._ticker = self.loop.call_later(TICK_INTERVAL, self._tick)
        start = getattr(self.shell, "start", None)
        if start is not None:
            start()
        return self

    def _new_session(self, io, **where):
        return self.session_class(self.shell, io, **where, **self.session_options())

    def session_options(self):
        """Keyword arguments every session of this listener gets besides where it is (default none)."""
        return {}

    def sessions(self):
        return [p.session for p in list(self.protocols) if p.session is not None]

    def _tick(self):
        tick_all(self.sessions(), self.broker.clock())
        self._ticker = self.loop.call_later(TICK_INTERVAL, self._tick)

    def stop_accepting(self):
        if self._server is not None:
            self._server.close()

    async def shutdown(self, drain_timeout=10.0):
        """Stop accepting, stop reading, let in-flight work complete and be answered (at most
        ``drain_timeout`` seconds), close every session gracefully, wait briefly, abort the rest."""
        self.stop_accepting()
        await drain(self.loop, self.sessions, drain_timeout=drain_timeout, alive=self.protocols.__len__)
        for p in list(self.protocols):
            p.transport.abort()
        if self._ticker is not None:
            self._ticker.cancel()
        close = getattr(self.shell, "close", None)
        if close is not None:
            close()
        await asyncio.sleep(0)
