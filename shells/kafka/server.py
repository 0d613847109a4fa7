"""The Kafka listener: a broker-layer TcpListener whose sessions are KafkaSessions."""

from riverbed.shells import tls as _tls
from riverbed.shells.broker import TcpListener
from riverbed.shells.kafka.session import KafkaSession
from riverbed.shells.kafka.shell import KafkaShell
from riverbed.shells.protocols import KAFKA


class KafkaServer(TcpListener):
    """A Kafka listener over the shared broker. Create it with :func:`serve`. ``port`` is the bound port
    (useful with port 0); ``shell`` the listener's :class:`KafkaShell`. Loop-thread only."""

    name = KAFKA
    session_class = KafkaSession

    def __init__(self, broker, *, host="127.0.0.1", port=9092, ssl=None, advertised_host=None,
                 advertised_port=None, **groups):
        self.shell = KafkaShell(broker, advertised_host=advertised_host, advertised_port=advertised_port,
                                call_later=self._call_later, **groups)
        super().__init__(broker, shell=self.shell, host=host, port=port, ssl=ssl)

    def _call_later(self, delay, fn):
        return self.loop.call_later(delay, fn).cancel

    async def start(self):
        await super().start()
        self.shell.listen_port = self.port
        return self


async def serve(broker, *, host="127.0.0.1", port=9092, config=None, advertised_host=None):
    """Start a Kafka listener on ``host:port`` (0 = any free port) over ``broker``.

    ``config`` (a :mod:`riverbed.shells.config` Config), when given, supplies ``advertised_host`` (what
    Metadata names as the broker's host; default: the address each client connected to), the TLS
    context (``--tls-cert``: the port speaks TLS only) and the KIP-848 groups' session timeout and
    heartbeat interval. Metadata advertises the bound port. Returns the
    started :class:`KafkaServer`; stop it with ``await server.shutdown()``. Raises OSError when the
    address cannot be bound, TlsError for unusable TLS files.
    """
    ssl = None
    groups = {}
    if config is not None:
        advertised_host = config.advertised_host
        ssl = _tls.context_for(config)
        groups = {"group_session_timeout_ms": config.kafka_group_session_timeout_ms,
                  "group_heartbeat_interval_ms": config.kafka_group_heartbeat_interval_ms}
    server = KafkaServer(broker, host=host, port=port, ssl=ssl, advertised_host=advertised_host, **groups)
    return await server.start()
