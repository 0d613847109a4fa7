"""The brokers as processes the bench harness starts, measures and always stops.

- ``RabbitMQ``: Debian's rabbitmq-server through ``ci/rabbitmq.sh`` (installed if missing, loopback only);
  the measured process is the node's ``beam.smp`` (and its few children).
- ``Riverbed``: ``riverbed serve`` on a fresh data directory, port 0 (any free port), loopback only.
- ``ScriptServer``: the base of the other peers (``bench._redis.Redis``, ``bench._nats.Nats``): a
  ``ci/<name>.sh`` script installs the Debian package if missing and runs the server on a free port in a
  temporary directory; the measured process is the server itself.
"""

import atexit
import collections
import ctypes
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

from bench._client import descendants

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RABBITMQ_SH = os.path.join(ROOT, "ci", "rabbitmq.sh")
# every listener but RabbitMQ Stream off: two servers of one run must not fight over default ports
OTHER_LISTENERS_OFF = ("--bson-port", "off", "--zmq-port", "off", "--ws-port", "off", "--ream-port", "off",
                       "--http-port", "off", "--kafka-port", "off")
LISTEN_RE = re.compile(r"listening stream (\S+):(\d+)")
KAFKA_RE = re.compile(r"listening kafka (\S+):(\d+)")


def become_subreaper():
    """Orphans below us (the daemonised RabbitMQ node, epmd) become our children, so that we can reap
    them when they exit instead of leaving zombies under a pid 1 that does not reap."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(36, 1, 0, 0, 0)   # PR_SET_CHILD_SUBREAPER
    except OSError:
        pass


def reap_orphans():
    """Collect exited children that no Popen object owns (called once everything is stopped)."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def rss_kb(pid, field="VmRSS"):
    """Resident memory of a process tree (sum over pid and its descendants), kB."""
    total = 0
    for p in descendants(pid):
        try:
            with open(f"/proc/{p}/status") as f:
                for line in f:
                    if line.startswith(field + ":"):
                        total += int(line.split()[1])
                        break
        except OSError:
            pass
    return total


class RabbitMQ:
    name = "rabbitmq"
    label = "RabbitMQ"

    def __init__(self, port=5552, keep=False, log=print):
        self.port = port
        self.keep = keep
        self.log = log
        self.started_here = False
        self.pid = None
        self.version = None

    def _sh(self, *args, check=True, capture=True):
        env = dict(os.environ, RABBITMQ_STREAM_PORT=str(self.port))
        # Own session: a Ctrl-C in the terminal reaches the harness only, never a half-done stop.
        return subprocess.run(["bash", RABBITMQ_SH, *args], env=env, check=check, text=True,
                              stdout=subprocess.PIPE if capture else None,
                              stderr=subprocess.PIPE if capture else None, stdin=subprocess.DEVNULL,
                              start_new_session=True)

    def running(self):
        return self._sh("status", check=False).returncode == 0

    def start(self):
        was_running = self.running()
        if was_running:
            self.log(f"RabbitMQ is already running on 127.0.0.1:{self.port}: using it, and leaving it running")
        else:
            self.log("starting RabbitMQ (ci/rabbitmq.sh start; installs rabbitmq-server first if missing)")
            r = self._sh("start", check=False)
            if r.returncode != 0:
                raise RuntimeError("ci/rabbitmq.sh start failed:\n" + r.stdout + r.stderr)
            self.started_here = True
        pid = self._sh("pid", check=False).stdout.strip()
        if not pid:
            raise RuntimeError("RabbitMQ runs but its beam.smp pid was not found")
        self.pid = int(pid)
        try:
            out = subprocess.run(["dpkg-query", "-W", "-f=${Version}", "rabbitmq-server"], text=True,
                                 capture_output=True).stdout
            erl = subprocess.run(["dpkg-query", "-W", "-f=${Version}", "erlang-base"], text=True,
                                 capture_output=True).stdout
            self.version = f"rabbitmq-server {out} (Debian), erlang-base {erl}"
        except OSError:
            self.version = "unknown"
        return self

    def stop(self):
        if self.started_here and not self.keep:
            self.log("stopping RabbitMQ")
            self._sh("stop", check=False)
            self.started_here = False


class Riverbed:
    def __init__(self, fsync="never", name=None, label=None, log=print):
        self.fsync = fsync
        self.name = name or f"riverbed-{fsync}"
        self.label = label or f"Riverbed fsync={fsync}"
        self.log = log
        self.proc = None
        self.port = None
        self.kafka_port = None
        self.pid = None
        self.lines = collections.deque(maxlen=2000)    # the server's last log lines (a failed run keeps some)
        self.tmp = None
        self.version = None

    def start(self, timeout=60):
        self.tmp = tempfile.mkdtemp(prefix=f"riverbed-bench-{self.fsync}-")
        data = os.path.join(self.tmp, "data")
        cmd = [sys.executable, "-m", "riverbed.shells.cli", "serve", "--data-dir", data, "--host", "127.0.0.1",
               "--stream-port", "0", *OTHER_LISTENERS_OFF, "--kafka-port", "0", "--fsync", self.fsync]
        self.log(f"starting riverbed serve --fsync {self.fsync} on a fresh data directory {data}")
        self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.PIPE, start_new_session=True, cwd=self.tmp)
        self.pid = self.proc.pid
        ready = threading.Event()

        def read():
            for raw in self.proc.stderr:
                line = raw.decode("utf-8", "replace").rstrip()
                self.lines.append(line)
                m = LISTEN_RE.search(line)
                if m:
                    self.port = int(m.group(2))
                m = KAFKA_RE.search(line)
                if m:
                    self.kafka_port = int(m.group(2))    # the Kafka rows (bench._kafka)
                if line.endswith(" ready"):
                    ready.set()
            ready.set()

        threading.Thread(target=read, daemon=True).start()
        if not ready.wait(timeout) or self.port is None:
            self.stop()
            raise RuntimeError("riverbed serve did not start:\n" + "\n".join(list(self.lines)[-30:]))
        try:
            rev = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], text=True,
                                 capture_output=True).stdout.strip()
            # dirty = the server's own sources differ from the commit (bench/ edits do not count)
            dirty = subprocess.run(["git", "-C", ROOT, "status", "--porcelain", "--", "engine", "shells",
                                    "setup.py"], text=True, capture_output=True).stdout.strip()
            self.version = f"riverbed git {rev}{'+dirty' if dirty else ''}"
        except OSError:
            self.version = "riverbed"
        return self

    def stop(self):
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None
        if self.tmp:
            shutil.rmtree(self.tmp, ignore_errors=True)
            self.tmp = None


def kill_tree(proc, grace=3.0):
    """Stop a client process (its own session) and everything it started."""
    if proc is None or proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except OSError:
        pass
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.05)
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except OSError:
            pass
        proc.wait()


def free_port():
    """A TCP port on 127.0.0.1 that nothing listens on now (the server started next binds it)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ScriptServer:
    """A peer server that a ``ci/<name>.sh`` script installs (Debian package, if missing), starts on
    127.0.0.1 and a free port with its data in a fresh temporary directory, and stops by the pid in that
    directory (Redis, NATS). ``start`` raises RuntimeError when the package cannot be installed or the
    server does not come up (the harness then skips the peer); ``stop`` is idempotent, and is also
    registered with atexit so that a harness that dies of an exception still stops it."""

    name = label = script = package = ""
    port_env = dir_env = ""

    def __init__(self, log=print):
        self.log = log
        self.port = None
        self.pid = None
        self.tmp = None
        self.version = None

    def _sh(self, *args):
        env = dict(os.environ, **{self.port_env: str(self.port), self.dir_env: self.tmp})
        # Own session: a Ctrl-C in the terminal reaches the harness only.
        return subprocess.run(["bash", os.path.join(ROOT, "ci", self.script), *args], env=env, text=True,
                              capture_output=True, stdin=subprocess.DEVNULL, start_new_session=True)

    def start(self):
        # The scripts stop "every server this script started" by the pid files under /tmp/riverbed-<name>-*.
        self.tmp = tempfile.mkdtemp(prefix=f"riverbed-{self.name}-", dir="/tmp")
        atexit.register(self.stop)
        self.port = free_port()
        r = self._sh("install")
        if r.returncode != 0:
            self.stop()
            raise RuntimeError(f"ci/{self.script} install failed:\n{(r.stdout + r.stderr).strip()}")
        for attempt in range(3):   # a free port can be taken between our probe and the server's bind
            self.port = free_port()
            self.log(f"starting {self.label} (ci/{self.script} start) on 127.0.0.1:{self.port}")
            r = self._sh("start")
            if r.returncode == 0:
                break
        else:
            self.stop()
            raise RuntimeError(f"ci/{self.script} start failed:\n{(r.stdout + r.stderr).strip()}")
        pid = self._sh("pid").stdout.strip()
        if not pid:
            self.stop()
            raise RuntimeError(f"{self.label} runs but its pid was not found")
        self.pid = int(pid)
        self.version = self._version()
        return self

    def _version(self):
        try:
            v = subprocess.run(["dpkg-query", "-W", "-f=${Version}", self.package], text=True,
                               capture_output=True).stdout
        except OSError:
            v = ""
        return f"{self.package} {v or 'unknown'} (Debian)"

    def stop(self):
        if self.tmp is None:
            return
        self._sh("stop")
        self.pid = None
        shutil.rmtree(self.tmp, ignore_errors=True)
        self.tmp = None
