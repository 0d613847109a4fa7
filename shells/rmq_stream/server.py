"""The RabbitMQ Stream listener: a broker-layer TcpListener whose sessions are RmqStreamSessions."""

from riverbed.shells import tls as _tls
from riverbed.shells.broker import TcpListener
from riverbed.shells.rmq_stream.constants import DEFAULT_FRAME_MAX, DEFAULT_HANDSHAKE_TIMEOUT, DEFAULT_HEARTBEAT
from riverbed.shells.rmq_stream.session import RmqStreamSession
from riverbed.shells.rmq_stream.shell import RmqShell
from riverbed.shells.protocols import STREAM, STREAM_TLS

SHELL_KEY = STREAM     # broker.extensions key of the shell both listeners share


class RmqStreamServer(TcpListener):
    """A RabbitMQ Stream listener over the shared broker. Create it with :func:`serve`.

    ``port`` is the bound port (useful with port 0); ``shell`` the listener's :class:`RmqShell`.
    With ``ssl`` (an ``ssl.SSLContext``) it is the TLS listener: it shares ``shell`` (settings,
    single-active-consumer groups) with the plain listener when one is given, and its clients are
    advertised its own port. Loop-thread only.
    """

    name = STREAM
    session_class = RmqStreamSession

    def __init__(self, broker, *, host="127.0.0.1", port=5552, ssl=None, shell=None, **shell_options):
        super().__init__(broker, shell=shell if shell is not None else RmqShell(broker, **shell_options),
                         host=host, port=port, ssl=ssl)
        if ssl is not None:
            self.name = STREAM_TLS

    def session_options(self):
        # a client of the TLS listener is advertised the TLS port
        return {"tls_port": self.port if self.ssl is not None else None}

    async def start(self):
        await super().start()
        if self.ssl is None:
            self.shell.listen_host = self.host if self.host not in ("", "0.0.0.0", "::") else None
            self.shell.listen_port = self.port
        return self


async def serve(broker, *, host="127.0.0.1", port=5552, config=None, advertised_host=None, advertised_port=None,
                frame_max=DEFAULT_FRAME_MAX, heartbeat=DEFAULT_HEARTBEAT, handshake_timeout=DEFAULT_HANDSHAKE_TIMEOUT):
    """Start a RabbitMQ Stream listener on ``host:port`` (0 = any free port) over ``broker``.

    ``config`` (a :mod:`riverbed.shells.config` Config), when given, supplies the advertised address,
    ``frame_max``, ``heartbeat`` and ``handshake_timeout``; otherwise the keyword arguments do. The
    advertised address (OpenResponse, Metadata) defaults to the address each client connected to and the
    bound port; ``frame_max`` (bytes) and ``heartbeat`` (seconds) are offered in Tune.

    Returns the started :class:`RmqStreamServer`; stop it with ``await server.shutdown()``. Must be
    awaited on the loop that will run it. Raises OSError when the address cannot be bound.
    """
    if config is not None:
        advertised_host, advertised_port = config.advertised_host, config.advertised_port
        frame_max, heartbeat, handshake_timeout = config.frame_max, config.heartbeat, config.handshake_timeout
    server = RmqStreamServer(broker, host=host, port=port, advertised_host=advertised_host,
                             advertised_port=advertised_port, frame_max=frame_max, heartbeat=heartbeat,
                             handshake_timeout=handshake_timeout)
    await server.start()
    # the TLS listener of the same process shares this shell (SAC groups span both ports)
    broker.extensions.setdefault(SHELL_KEY, server.shell)
    return server


async def serve_tls(broker, *, host="127.0.0.1", port=5551, config):
    """Start the RabbitMQ Stream TLS listener on ``host:port`` (0 = any free port) over ``broker``, with
    the context of ``config``'s ``tls_cert``/``tls_key``/``tls_ca`` (:func:`riverbed.shells.tls.context_for`).

    It shares the plain listener's shell when that was started first on ``broker``; its clients are
    advertised ``config.advertised_host`` (else the address they dialled) and this listener's port.
    Returns the started :class:`RmqStreamServer`. Raises TlsError when TLS is not configured or a file
    cannot be used, OSError when the address cannot be bound.
    """
    ctx = _tls.context_for(config)
    if ctx is None:
        raise _tls.TlsError("the RabbitMQ Stream TLS listener needs --tls-cert and --tls-key")
    shell = broker.extensions.get(SHELL_KEY)
    if shell is None:
        shell = broker.extensions[SHELL_KEY] = RmqShell(
            broker, advertised_host=config.advertised_host, advertised_port=config.advertised_port,
            frame_max=config.frame_max, heartbeat=config.heartbeat, handshake_timeout=config.handshake_timeout)
    server = RmqStreamServer(broker, host=host, port=port, ssl=ctx, shell=shell)
    return await server.start()
