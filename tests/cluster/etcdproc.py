"""A private etcd for tests: Debian's ``etcd`` on two free loopback ports in a temporary directory,
started and stopped by the test that wants it (never the machine's own etcd, never port 2379)."""

import os
import shutil
import socket
import subprocess
import time
import urllib.request


def free_port():
    """A loopback port free right now (the kernel picks it; above 20000 on Linux's default range)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class EtcdProcess:
    """One single-member etcd: ``url`` is its client URL once :meth:`start` returns."""

    def __init__(self, data_dir):
        self.data_dir = str(data_dir)
        self.proc = None
        self.client_port = None
        self.peer_port = None
        self.log_path = os.path.join(self.data_dir, "etcd.log")

    @property
    def url(self):
        return f"http://127.0.0.1:{self.client_port}"

    def start(self, timeout=20):
        os.makedirs(self.data_dir, exist_ok=True)
        if self.client_port is None:
            self.client_port, self.peer_port = free_port(), free_port()
        client = f"http://127.0.0.1:{self.client_port}"
        peer = f"http://127.0.0.1:{self.peer_port}"
        cmd = [shutil.which("etcd") or "/usr/bin/etcd", "--name", "riverbed-test",
               "--data-dir", os.path.join(self.data_dir, "member"),
               "--listen-client-urls", client, "--advertise-client-urls", client,
               "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
               "--initial-cluster", f"riverbed-test={peer}", "--log-level", "warn"]
        self._log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=self._log, stderr=self._log)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError("etcd exited:\n" + self.log())
            try:
                with urllib.request.urlopen(client + "/health", timeout=1) as r:
                    if b"true" in r.read():
                        return self
            except OSError:
                pass
            time.sleep(0.1)
        self.stop()
        raise RuntimeError("etcd did not become healthy:\n" + self.log())

    def log(self):
        try:
            with open(self.log_path, encoding="utf-8", errors="replace") as f:
                return f.read()[-4000:]
        except OSError:
            return ""

    def stop(self):
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if getattr(self, "_log", None) is not None:
            self._log.close()
            self._log = None
