"""The RabbitMQ Stream listener: a broker-layer TcpListener whose sessions are RmqStreamSessions."""

from riverbed.shells.broker import TcpListener
from riverbed.shells.rmq_stream.constants import DEFAULT_FRAME_MAX, DEFAULT_HANDSHAKE_TIMEOUT, DEFAULT_HEARTBEAT
from riverbed.shells.rmq_stream.session import RmqStreamSession
from riverbed.shells.rmq_stream.shell import RmqShell


class RmqStreamServer(TcpListener):
    """A RabbitMQ Stream listener over the shared broker. Create it with :func:`serve`.

    ``port`` is the bound port (useful with port 0); ``shell`` the listener's :class:`RmqShell`.
    Loop-thread only.
    """

    name = "rabbitmq-stream"

    def __init__(self, broker, *, host="127.0.0.1", port=5552, **shell_options):
        self.shell = RmqShell(broker, **shell_options)
        super().__init__(broker, self._new_session, host=host, port=port)

    def _new_session(self, io, *, peer, local, remote, peer_loopback):
        return RmqStreamSession(self.shell, io, peer=peer, local=local, remote=remote, peer_loopback=peer_loopback)

    async def start(self):
        await super().start()
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
    return await server.start()
