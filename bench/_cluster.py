"""The replicated brokers of ``bench.compare``'s cluster rows (issue 23): a three-node Riverbed cluster and
a three-server NATS JetStream cluster, both on loopback, started and always stopped by the harness.

- ``RiverbedCluster``: a private etcd and three ``riverbed serve --node nK --etcd URL`` processes with
  ``--fsync never`` (the headline single node's policy), started by the very helpers the cluster tests use
  (``tests/cluster/etcdproc.py`` and ``clusterproc.py``, imported from there, not copied). The clients
  connect to n1 and create their streams with ``queue-leader-locator=client-local``, so n1 leads and n2,
  n3 replicate; a confirm means a majority stored the batch. ``pid`` is n1; ``pids`` all three: the
  harness sums their RSS and the clients their utime+stime (``bench._client --also-server-pid``).
- ``NatsCluster``: three ``nats-server -js`` processes (Debian's package, ``ci/nats.sh install``) joined by
  ``--cluster``/``--routes``, each with its own JetStream store; the NATS client code is ``bench._nats``'s,
  the ``nats-r3-*`` workloads make their stream with ``num_replicas=3``. Its CPU and RSS are summed over
  the three servers likewise.

A three-node RabbitMQ cluster is not started here: the machine has one Debian RabbitMQ 3.10 node (no
Docker), so the cluster rows have no RabbitMQ column.
"""

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench._procs import ROOT

CLUSTER_TESTS = os.path.join(ROOT, "tests", "cluster")
INTEGRATION_TESTS = os.path.join(ROOT, "tests", "integration")
NATS_SH = os.path.join(ROOT, "ci", "nats.sh")


def _cluster_helpers():
    """The cluster tests' process helpers (etcdproc.EtcdProcess, clusterproc.Cluster)."""
    for p in (CLUSTER_TESTS, INTEGRATION_TESTS):
        if p not in sys.path:
            sys.path.insert(0, p)
    from clusterproc import Cluster
    from etcdproc import EtcdProcess
    return EtcdProcess, Cluster


class RiverbedCluster:
    """etcd and three ``riverbed serve`` nodes; ``port`` is n1's RabbitMQ Stream port."""

    name = "riverbed-cluster"
    label = "Riverbed 3-node cluster"
    kafka_port = None

    def __init__(self, log=print, n=3):
        self.log = log
        self.n = n
        self.tmp = None
        self.etcd = None
        self.cluster = None
        self.port = None
        self.pid = None
        self.pids = []
        self.version = None

    def start(self):
        if shutil.which("etcd") is None:
            raise RuntimeError("etcd is not installed (ci/ensure-etcd.sh installs Debian's etcd-server)")
        EtcdProcess, Cluster = _cluster_helpers()
        self.tmp = tempfile.mkdtemp(prefix="riverbed-bench-cluster-")
        self.log(f"starting etcd and {self.n} riverbed serve nodes (fsync never) in {self.tmp}")
        try:
            self.etcd = EtcdProcess(Path(self.tmp) / "etcd").start()
            # the product's default lease TTL (`riverbed serve --lease-ttl`, 3 s): the nodes' timers (lease
            # keep-alive, heartbeats) run at the rate a user's cluster runs them, and their CPU counts in the rows
            self.cluster = Cluster(Path(self.tmp), self.etcd, n=self.n, lease_ttl=3.0,
                                   extra=("--host", "127.0.0.1"))
            self.cluster.start()
        except BaseException:
            self.stop()
            raise
        n1 = self.cluster.nodes["n1"]
        self.port, self.pid = n1.port, n1.pid
        self.pids = [srv.pid for srv in self.cluster.nodes.values()]
        try:
            rev = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], text=True,
                                 capture_output=True).stdout.strip()
            self.version = f"riverbed git {rev}, {self.n} nodes + etcd"
        except OSError:
            self.version = "riverbed cluster"
        return self

    @property
    def lines(self):
        """The last log lines of every node, each prefixed with its name, an equal share of 30 each (a
        failed run keeps them: bench.compare's ``server_log``)."""
        nodes = list(self.cluster.nodes.items()) if self.cluster is not None else []
        out = []
        for name, srv in nodes:
            out += [f"{name}: {line}" for line in list(srv.lines)[-(30 // len(nodes)):]]
        return out

    def client_args(self):
        """Extra ``bench._client`` arguments: n1 leads the stream; CPU of n2 and n3 summed in."""
        out = ["--stream-arg", "queue-leader-locator=client-local"]
        for p in self.pids[1:]:
            out += ["--also-server-pid", str(p)]
        return out

    def stop(self):
        if self.cluster is not None:
            self.cluster.stop()
            self.cluster = None
        if self.etcd is not None:
            self.etcd.stop()
            self.etcd = None
        if self.tmp:
            shutil.rmtree(self.tmp, ignore_errors=True)
            self.tmp = None


def _free_port():
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class NatsCluster:
    """Three ``nats-server -js`` in one cluster on loopback; ``port`` is the first server's client port."""

    name = "nats-r3"
    label = "NATS JetStream R3 (3 servers)"
    kafka_port = None

    def __init__(self, log=print, n=3):
        self.log = log
        self.n = n
        self.tmp = None
        self.procs = []
        self.logs = []
        self.port = None
        self.pid = None
        self.pids = []
        self.version = None

    def start(self, timeout=60):
        if shutil.which("nats-server") is None:
            r = subprocess.run(["bash", NATS_SH, "install"], capture_output=True, text=True,
                               stdin=subprocess.DEVNULL, start_new_session=True)
            if r.returncode != 0 or shutil.which("nats-server") is None:
                raise RuntimeError("ci/nats.sh install failed:\n" + r.stdout[-500:] + r.stderr[-500:])
        self.tmp = tempfile.mkdtemp(prefix="riverbed-bench-nats-r3-")
        client = [_free_port() for _ in range(self.n)]
        route = [_free_port() for _ in range(self.n)]
        routes = ",".join(f"nats://127.0.0.1:{p}" for p in route)
        self.log(f"starting {self.n} nats-server -js in a cluster in {self.tmp}")
        try:
            for i in range(self.n):
                d = os.path.join(self.tmp, f"s{i + 1}")
                os.makedirs(d)
                logf = os.path.join(d, "nats.log")
                self.logs.append(logf)
                cmd = ["nats-server", "-a", "127.0.0.1", "-p", str(client[i]), "-js", "-sd", d,
                       "-n", f"s{i + 1}", "--cluster_name", "riverbed-bench",
                       "--cluster", f"nats://127.0.0.1:{route[i]}", "--routes", routes, "-l", logf]
                self.procs.append(subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                                   stderr=subprocess.DEVNULL, start_new_session=True))
            deadline = time.monotonic() + timeout
            while True:
                texts = [self._read(f) for f in self.logs]
                if all("Server is ready" in t for t in texts) and any("metadata leader" in t for t in texts):
                    break
                dead = [p for p in self.procs if p.poll() is not None]
                if dead or time.monotonic() > deadline:
                    raise RuntimeError("the NATS cluster did not come up:\n" + texts[0][-1500:])
                time.sleep(0.2)
        except BaseException:
            self.stop()
            raise
        self.port, self.pid = client[0], self.procs[0].pid
        self.pids = [p.pid for p in self.procs]
        out = subprocess.run(["nats-server", "--version"], capture_output=True, text=True).stdout.strip()
        self.version = f"{out} × {self.n}"
        return self

    @staticmethod
    def _read(path):
        try:
            with open(path, encoding="utf-8", errors="replace") as f:
                return f.read()
        except OSError:
            return ""

    def client_args(self):
        out = []
        for p in self.pids[1:]:
            out += ["--also-server-pid", str(p)]
        return out

    def stop(self):
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in self.procs:
            try:
                p.wait(15)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        self.procs = []
        if self.tmp:
            shutil.rmtree(self.tmp, ignore_errors=True)
            self.tmp = None
