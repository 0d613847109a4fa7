"""A test setting: hold a node's view of the cluster state where it is.

``RIVERBED_CLUSTER_HOLD_DIR=DIR`` (unset in production): while a file named after the node (``DIR/<node>``)
exists, the node reads no new state of nodes and placements from etcd (its control loop skips the read and
what follows from it; leases, leading and replication go on). A test uses it to stand for a node that has
not yet seen a change made a moment ago on another node (a slow poll, a late watch event), so that a read
through that node right after a stream is made elsewhere is checked deterministically, not by luck of
timing. Reads of etcd made on purpose by a request (``Forwarder.lookup``, ``Observers``) still go to etcd.
"""

import os

HOLD_DIR = os.environ.get("RIVERBED_CLUSTER_HOLD_DIR") or None


def held(node_name):
    """Whether the view of node ``node_name`` is held now (one ``stat`` when the setting is on, else none)."""
    return HOLD_DIR is not None and os.path.exists(os.path.join(HOLD_DIR, node_name))
