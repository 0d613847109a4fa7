"""Three ``riverbed serve`` nodes joined to a private etcd, for the cluster tests."""

import sys

from procs import ServerProcess


class Cluster:
    """etcd plus ``riverbed serve`` nodes n1..nN joined to it (RabbitMQ Stream and replication ports 0,
    every other listener off). ``node(name)`` is a ServerProcess; ``status()`` the status JSON."""

    def __init__(self, tmp_path, etcd, n=3, lease_ttl=1.0, extra=(), node_extra=None):
        self.tmp_path = tmp_path
        self.etcd = etcd
        self.lease_ttl = lease_ttl
        self.extra = list(extra)
        self.node_extra = node_extra or {}
        self.nodes = {}
        self._make = ServerProcess
        for i in range(1, n + 1):
            self.nodes[f"n{i}"] = self._new(f"n{i}")

    def _new(self, name):
        return self._make(self.tmp_path / name, "--node", name, "--etcd", self.etcd.url, "--cluster", "test",
                          "--replication-port", "0", "--lease-ttl", str(self.lease_ttl), "--fsync", "never",
                          "--http-port", "0", *self.extra, *self.node_extra.get(name, ()))

    def start(self):
        for srv in self.nodes.values():
            srv.start()
        self.wait(lambda st: all(n["up"] for n in st["nodes"]) and len(st["nodes"]) == len(self.nodes))
        return self

    def restart(self, name):
        srv = self.nodes[name]
        srv.kill()
        self.nodes[name] = self._new(name)
        self.nodes[name].start()
        return self.nodes[name]

    def data_dir(self, name):
        return self.nodes[name].data_dir

    def status(self):
        """The ``riverbed cluster status --json`` document, read in-process (cluster/node.py read_status:
        what the command prints), so that waiting loops cost no interpreter start each."""
        import asyncio

        from riverbed.shells.cluster.status import read_status
        return asyncio.run(read_status(self.etcd.url, "test"))

    def status_cli(self):
        """The same document through the real command."""
        import json
        import subprocess
        out = subprocess.run([sys.executable, "-m", "riverbed.shells.cli", "cluster", "status", "--json",
                              "--etcd", self.etcd.url, "--cluster", "test"], capture_output=True, text=True,
                             timeout=30)
        assert out.returncode == 0, out.stderr
        return json.loads(out.stdout)

    def wait(self, cond, timeout=20, what="the cluster state"):
        import time
        deadline = time.monotonic() + timeout
        st = None
        while time.monotonic() < deadline:
            st = self.status()
            if cond(st):
                return st
            time.sleep(0.05)
        raise AssertionError(f"timed out waiting for {what}: {st}")

    def stop(self):
        for srv in self.nodes.values():
            srv.kill()
