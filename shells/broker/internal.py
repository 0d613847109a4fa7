"""The server's own streams: one reserved name prefix, one rule for every protocol.

A stream whose name starts with :data:`INTERNAL_PREFIX` belongs to the server (today the cluster's
document changelog, ``__riverbed_docs``: shells/cluster/docs.py). Such a stream is never listed to a
client (``Broker.list_streams``: the RabbitMQ Stream and Kafka metadata, the management API, the
dashboard, ``riverbed streams ls``, Spark's listing) and no client may create, delete, publish to or
read it: :meth:`riverbed.shells.auth.User.can` refuses every permission on it, so each protocol answers
with its own access-refused error, on a lone node as on a cluster. The server writes it through the
broker's own API, which asks no permission.

(Document collections have their own reserved prefix, ``_riverbed``: the server's collections, hidden
from the BSON and REAM shells' listings; that is a name space of the document store, not of streams.)

No imports: auth.py and the broker both use it. Thread-safe.
"""

INTERNAL_PREFIX = "__riverbed_"


def is_internal(name):
    """Whether stream ``name`` (a str, or None) is the server's own."""
    return name is not None and name.startswith(INTERNAL_PREFIX)
