"""The BSON/TCP (mewbase) listener: a broker-layer TcpListener whose sessions are BsonSessions; its
shell runs the stored projections for as long as it listens."""

from riverbed.shells import tls as _tls
from riverbed.shells.broker import TcpListener
from riverbed.shells.bson_tcp.session import BsonSession
from riverbed.shells.bson_tcp.shell import DEFAULT_IDLE_TIMEOUT, BsonShell
from riverbed.shells.protocols import BSON

DEFAULT_PORT = 7451


class BsonServer(TcpListener):
    """A mewbase listener over the shared broker. Create it with :func:`serve`. ``port`` is the bound
    port; ``shell`` the listener's :class:`BsonShell`. Loop-thread only."""

    name = BSON
    session_class = BsonSession

    def __init__(self, broker, *, host="127.0.0.1", port=DEFAULT_PORT, idle_timeout=DEFAULT_IDLE_TIMEOUT, ssl=None):
        super().__init__(broker, shell=BsonShell(broker, idle_timeout=idle_timeout), host=host, port=port, ssl=ssl)


async def serve(broker, *, host="127.0.0.1", port=DEFAULT_PORT, config=None, idle_timeout=DEFAULT_IDLE_TIMEOUT):
    """Start a BSON/TCP listener on ``host:port`` (0 = any free port) over ``broker`` and the stored
    projections. ``config`` (a Config), when given, supplies ``bson_idle_timeout`` (seconds) and, with
    ``tls_cert``, makes the port TLS-only. Returns the started :class:`BsonServer`; stop it with ``await
    server.shutdown()``. Raises OSError when the address cannot be bound, TlsError for unusable TLS files."""
    if config is not None:
        idle_timeout = getattr(config, "bson_idle_timeout", idle_timeout)
    server = BsonServer(broker, host=host, port=port, idle_timeout=idle_timeout, ssl=_tls.context_for(config))
    return await server.start()
