"""What the RabbitMQ Stream connections of one listener share beyond the broker layer: the settings
offered in Tune and Open, the server properties, and single-active-consumer groups.

Single active consumer: a group is (stream, name), decided in the broker layer
(:mod:`riverbed.shells.broker.sac`: first registered is active; on a super stream partition, named in the
subscription's ``super-stream``, members[partition index mod N], with step-down before activation). A
group lives exactly as long as its members and its stream: a deleted stream takes its groups along, so a
re-created stream of the same name starts with none. In a cluster the group is one per stream across the
nodes, decided by the stream's leader (:mod:`riverbed.shells.cluster.sac`).
"""

import logging
import platform

from riverbed.engine import OffsetSpec
from riverbed.engine.errors import InvalidArgument
from riverbed.shells.broker.sac import SacGroups as BrokerSacGroups
from riverbed.shells.rmq_stream.constants import (
    AUTH_FAILURE_DELAY, DEFAULT_FRAME_MAX, DEFAULT_HANDSHAKE_TIMEOUT, DEFAULT_HEARTBEAT, OFFSET_TYPE_FIRST,
    OFFSET_TYPE_LAST, OFFSET_TYPE_NEXT, OFFSET_TYPE_OFFSET, OFFSET_TYPE_TIMESTAMP, PRODUCT, RABBITMQ_VERSION,
)
from riverbed.shells.version import VERSION

log = logging.getLogger("riverbed.rmq")

_SPEC_BUILDERS = {
    OFFSET_TYPE_FIRST: lambda v: OffsetSpec.first(),
    OFFSET_TYPE_LAST: lambda v: OffsetSpec.last(),
    OFFSET_TYPE_NEXT: lambda v: OffsetSpec.next(),
    OFFSET_TYPE_OFFSET: OffsetSpec.offset,
    OFFSET_TYPE_TIMESTAMP: OffsetSpec.timestamp,
}


class RmqShell:
    """Per-listener RabbitMQ Stream state over the shared ``broker``. Loop-thread only.

    ``advertised_host``/``advertised_port`` override the address given in OpenResponse and Metadata;
    ``frame_max`` (bytes) and ``heartbeat`` (seconds) are offered in Tune; ``handshake_timeout``
    (seconds) bounds the time from accept to Open; ``auth_failure_delay`` (seconds) is how long a refused
    authentication is held before it is answered and the connection closed (RabbitMQ's tarpit).
    """

    def __init__(self, broker, *, advertised_host=None, advertised_port=None, frame_max=DEFAULT_FRAME_MAX,
                 heartbeat=DEFAULT_HEARTBEAT, handshake_timeout=DEFAULT_HANDSHAKE_TIMEOUT,
                 auth_failure_delay=AUTH_FAILURE_DELAY):
        self.broker = broker
        self.advertised_host = advertised_host
        self.advertised_port = advertised_port
        self.listen_host = None
        self.listen_port = None
        self.frame_max = frame_max
        self.heartbeat = heartbeat
        self.handshake_timeout = handshake_timeout
        self.auth_failure_delay = auth_failure_delay
        self.sac = SacGroups(broker)

    def server_properties(self):
        """PeerProperties of the server: ``version`` is the RabbitMQ release whose stream protocol is
        implemented (clients compare it to decide what the server supports), ``riverbed-version``
        Riverbed's own."""
        return {"product": PRODUCT, "version": RABBITMQ_VERSION, "riverbed-version": VERSION,
                "cluster_name": "riverbed",
                "platform": f"Python {platform.python_version()}",
                "copyright": "Copyright (c) the Riverbed authors",
                "information": "Licensed under the Apache 2.0 license, see https://www.apache.org/licenses/"}

    def http_properties(self):
        """Where this server's HTTP listener is, for PeerProperties: ``http-port`` (the bound port) and
        ``http-scheme`` (``http``, or ``https`` with --tls-cert), so a client that knows only the stream
        port (``riverbed streams ls --uri ...``) finds the JSON API on the host it dialed. Empty when
        the HTTP listener is off."""
        for name, server in self.broker.listeners:
            if name == "http":
                return {"http-port": str(server.port), "http-scheme": getattr(server, "scheme", "http")}
        return {}

    def advertised(self, local_host=None):
        """``(host, port)`` for OpenResponse and Metadata: the configured advertised address, else the
        address the client reached us on (always reachable by that client), else the listen address."""
        host = self.advertised_host or local_host or self.listen_host or "localhost"
        if host.startswith("::ffff:") and "." in host:
            host = host[7:]
        return host, self.advertised_port or self.listen_port or 5552

    @staticmethod
    def offset_spec(offset_type, value=None):
        """The engine OffsetSpec of a protocol offset type. Raises InvalidArgument for an unknown type."""
        build = _SPEC_BUILDERS.get(offset_type)
        if build is None:
            raise InvalidArgument(f"offset type {offset_type}")
        return build(value)


class SacGroups:
    """Single-active-consumer groups of one listener's connections, decided by the broker layer's
    :class:`~riverbed.shells.broker.sac.SacGroups` (members are this shell's subscriptions). In a cluster
    (``broker.cluster``) a group spans the nodes: the registration goes to the cluster's
    :class:`~riverbed.shells.cluster.sac.ClusterSac`, which has the stream's leader decide."""

    def __init__(self, broker):
        self.broker = broker
        self.local = BrokerSacGroups()
        broker.on_stream_deleted(self.local.forget_stream)

    def _groups(self):
        cluster_sac = getattr(self.broker.cluster, "sac", None)
        return self.local if cluster_sac is None else cluster_sac

    def register(self, stream, name, session, sub, super_stream=None):
        """Join the group ``(stream, name)``; the chosen member gets ``session.sac_activate(sub)``."""
        index = -1
        parts = self.broker.partitions(super_stream) if super_stream else None
        if parts and stream in parts:
            index = parts.index(stream)
        self._groups().register(stream, name, sub, index)

    def unregister(self, stream, name, session, sub):
        """Leave the group; a new active member is chosen when needed."""
        self._groups().unregister(stream, name, sub)

    def stepped_down(self, stream, name, session, sub):
        """The member told to step down has answered: activate the member that should now be active."""
        self._groups().stepped_down(stream, name, sub)
