"""A test setting: hold a node's view of the cluster state where it is.

``RIVERBED_CLUSTER_HOLD_DIR=DIR`` (unset in production): while a file named after the node (``DIR/<node>``)
exists, the node reads no new state of nodes and placements from etcd (its control loop skips the read and
what follows from it; leases, leading and replication go on). A test uses it to stand for a node that has
not yet seen a change made a moment ago on another node (a slow poll, a late watch event), so that a read
through that node right after a stream is made elsewhere is checked deterministically, not by luck of
timing. Reads of etcd made on purpose by a request (``Forwarder.lookup``, ``Observers``) still go to etcd.

The same directory holds a second setting: while ``DIR/<node>.pause`` exists, each reconcile of that node
pauses for the number of seconds the file holds, after it read the cluster state and before it takes the
role each placement gives the node: a test stands for a loaded node whose reconcile is slow, so that a
change a client makes meanwhile (a stream deleted and made again through that node) races it
deterministically.
"""

import os

HOLD_DIR = os.environ.get("RIVERBED_CLUSTER_HOLD_DIR") or None


def held(node_name):
    """Whether the view of node ``node_name`` is held now (one ``stat`` when the setting is on, else none)."""
    return HOLD_DIR is not None and os.path.exists(os.path.join(HOLD_DIR, node_name))


def pause(node_name):
    """Seconds a reconcile of node ``node_name`` pauses (``DIR/<node>.pause``), 0.0 when none (one
    ``open`` attempt when the setting is on, else nothing)."""
    if HOLD_DIR is None:
        return 0.0
    try:
        with open(os.path.join(HOLD_DIR, node_name + ".pause"), encoding="utf-8") as f:
            return max(0.0, float(f.read().strip() or 0))
    except (OSError, ValueError):
        return 0.0
