"""``riverbed serve`` as a subprocess for tests and benchmarks: start on port 0, read the port from the
log line, stop with a signal, read RSS and CPU time from /proc."""

import os
import re
import signal
import socket
import time
import subprocess
import sys
import threading

LISTEN_RE = re.compile(r"listening stream (\S+):(\d+)")
LISTEN_ANY_RE = re.compile(r"listening (\S+) (\S+):(\d+)")
OTHER_LISTENERS_OFF = ("--bson-port", "off", "--zmq-port", "off", "--ws-port", "off", "--ream-port", "off",
                       "--http-port", "off", "--kafka-port", "off")


class ServerProcess:
    """``riverbed serve`` in a subprocess. ``port`` (RabbitMQ Stream) is known once ``start()`` returns;
    ``ports`` maps every listener's name in its ``listening NAME HOST:PORT`` log line (``stream``,
    ``http``, ...) to its port."""

    def __init__(self, data_dir, *args, env=None, wrap=()):
        self.data_dir = str(data_dir)
        self.args = list(args)
        self.env = env
        self.wrap = list(wrap)      # a command prefix, e.g. ["ip", "netns", "exec", NS] (it execs the server)
        self.proc = None
        self.port = None
        self.ports = {}
        self.lines = []
        self._ready = threading.Event()
        self._reader = None

    def start(self, timeout=60):
        # 60 s: under make test's parallel workers on a busy 2-core machine an interpreter start and the
        # imports have taken over 20 s; a healthy server logs its ports in about one
        env = dict(os.environ)
        env.update(self.env or {})
        # every other listener off unless the test turns it on (the last flag given wins), so that servers
        # of parallel tests never fight over a default port
        cmd = [*self.wrap, sys.executable, "-m", "riverbed.shells.cli", "serve", "--data-dir", self.data_dir,
               "--stream-port", "0", *OTHER_LISTENERS_OFF, *self.args]
        self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.PIPE, env=env)
        self._ready.clear()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        if not self._ready.wait(timeout):
            self.kill()
            raise RuntimeError("server did not become ready:\n" + "\n".join(self.lines))
        if self.port is None or self.proc.poll() is not None:
            # no RabbitMQ Stream port, or the server died after logging it (another listener failed)
            self.kill()
            raise RuntimeError("server exited:\n" + "\n".join(self.lines))
        return self

    def _read(self):
        for raw in self.proc.stderr:
            line = raw.decode("utf-8", "replace").rstrip()
            self.lines.append(line)
            m = LISTEN_RE.search(line)
            if m:
                self.port = int(m.group(2))
            m = LISTEN_ANY_RE.search(line)
            if m:
                self.ports[m.group(1)] = int(m.group(3))
            if line.endswith(" ready"):
                self._ready.set()
        self._ready.set()

    @property
    def pid(self):
        return self.proc.pid

    def log(self):
        return "\n".join(self.lines)

    def log_has(self, text, timeout=10):
        """Whether ``text`` is in the server's log within ``timeout`` s: a reader thread copies the log
        lines, so a line the server has written may not be in :meth:`log` yet."""
        deadline = time.monotonic() + timeout
        while text not in self.log():
            if time.monotonic() > deadline:
                return False
            time.sleep(0.05)
        return True

    def stop(self, sig=signal.SIGTERM, timeout=15):
        """Signal the server and wait; returns its exit status."""
        if self.proc is None or self.proc.poll() is not None:
            return self.proc.returncode if self.proc else None
        self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError("server did not stop in time:\n" + self.log())
        finally:
            if self._reader is not None:
                self._reader.join(2)

    def kill(self):
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        if self._reader is not None:
            self._reader.join(2)

    def rss_kb(self):
        with open(f"/proc/{self.pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
        return 0

    def anon_kb(self):
        """Anonymous resident memory (heap and buffers, without the LMDB map's file pages)."""
        with open(f"/proc/{self.pid}/status") as f:
            for line in f:
                if line.startswith("RssAnon:"):
                    return int(line.split()[1])
        return 0

    def cpu_seconds(self):
        with open(f"/proc/{self.pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        tick = os.sysconf("SC_CLK_TCK")
        return (int(fields[11]) + int(fields[12])) / tick


_names = iter(range(1, 1 << 30))


def fresh(prefix="t"):
    """A stream/topic name no other test of this run uses: ``prefix``, the pid, a counter."""
    return f"{prefix}{os.getpid()}x{next(_names)}"


def free_ports(n):
    """``n`` distinct loopback ports free right now (held together while the kernel picks them, so no two
    are the same)."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()
