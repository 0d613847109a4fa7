"""A private network for cluster tests, made of Linux network namespaces and veth links (``ip netns``).

Layout (every name carries a per-run tag, every address is inside namespaces made here)::

    hub namespace:  bridge brE 10.231.1.254/24 (etcd listens here), bridge brD (the data network)
    node i:         e0 10.231.1.i/24 --veth-- eI on brE   (its way to etcd)
                    d0 10.231.2.i/24 --veth-- dI on brD   (replication between nodes)
                    lo (its client listeners, reached by the test from inside that namespace)

:meth:`NetLab.cut` takes node i's data link down on the hub side: the node still reaches etcd, but no
packet passes between it and the other nodes (dials hang, open connections go silent: a partition,
not a crash). :meth:`NetLab.heal` brings it back. :meth:`NetLab.close` deletes every namespace, which
removes their links. :func:`in_netns` runs a function in a thread that entered a namespace, so a
socket it creates (a test's client) lives there.

Needs root (CAP_NET_ADMIN); :meth:`NetLab.setup` raises :class:`NetnsUnavailable` where ``ip netns add``
fails, and the tests skip with its reason.
"""

import ctypes
import os
import subprocess
import threading

CLONE_NEWNET = 0x40000000
ETCD_NET, DATA_NET = "10.231.1", "10.231.2"


class NetnsUnavailable(RuntimeError):
    """``ip netns`` cannot make namespaces here (not root, no CAP_NET_ADMIN, no iproute2)."""


def _ip(*args):
    out = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=20)
    if out.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {out.stderr.strip()}")


def in_netns(ns, fn):
    """``fn()`` run in a thread inside network namespace ``ns``; returns its result (or raises its error).
    Sockets keep the namespace they were made in, so a connected client can be used from any thread."""
    box = {}

    def run():
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            fd = os.open(f"/run/netns/{ns}", os.O_RDONLY)
            try:
                if libc.setns(fd, CLONE_NEWNET) != 0:
                    raise OSError(ctypes.get_errno(), f"setns {ns}")
            finally:
                os.close(fd)
            box["value"] = fn()
        except BaseException as e:       # handed to the caller's thread
            box["error"] = e
    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join()
    if "error" in box:
        raise box["error"]
    return box["value"]


class NetLab:
    """The namespaces and links above for ``n`` nodes; ``node_ns(i)``, ``hub``; :meth:`close` removes all."""

    def __init__(self, n=3):
        tag = f"{os.getpid() % 100000}"
        self.hub = f"rbh{tag}"
        self.nodes = [f"rbn{tag}x{i}" for i in range(1, n + 1)]
        self.made = []

    def setup(self):
        try:
            _ip("netns", "add", self.hub)
        except (RuntimeError, OSError) as e:
            raise NetnsUnavailable(f"ip netns add fails here: {e}") from None
        self.made.append(self.hub)
        h = ("-n", self.hub)
        _ip(*h, "link", "set", "lo", "up")
        for br in ("brE", "brD"):
            _ip(*h, "link", "add", br, "type", "bridge")
            _ip(*h, "link", "set", br, "up")
        _ip(*h, "addr", "add", f"{ETCD_NET}.254/24", "dev", "brE")
        for i, ns in enumerate(self.nodes, 1):
            _ip("netns", "add", ns)
            self.made.append(ns)
            _ip("-n", ns, "link", "set", "lo", "up")
            for side, net, br in (("e", ETCD_NET, "brE"), ("d", DATA_NET, "brD")):
                _ip(*h, "link", "add", f"{side}{i}", "type", "veth", "peer", "name", f"{side}0", "netns", ns)
                _ip(*h, "link", "set", f"{side}{i}", "master", br)
                _ip(*h, "link", "set", f"{side}{i}", "up")
                _ip("-n", ns, "addr", "add", f"{net}.{i}/24", "dev", f"{side}0")
                _ip("-n", ns, "link", "set", f"{side}0", "up")
        return self

    @property
    def etcd_host(self):
        return f"{ETCD_NET}.254"

    def data_host(self, i):
        return f"{DATA_NET}.{i}"

    def wrap(self, ns):
        return ["ip", "netns", "exec", ns]

    def cut(self, i):
        _ip("-n", self.hub, "link", "set", f"d{i}", "down")

    def heal(self, i):
        _ip("-n", self.hub, "link", "set", f"d{i}", "up")

    def close(self):
        for ns in reversed(self.made):
            try:
                _ip("netns", "del", ns)
            except (RuntimeError, OSError):
                pass
        self.made = []
