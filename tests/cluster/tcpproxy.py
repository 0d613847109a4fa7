"""A TCP proxy that a test can cut: in front of a node's replication port, it makes a partition
between that node and the members that dial it, while every process still reaches etcd."""

import socket
import threading


class CuttableProxy:
    """Forwards 127.0.0.1:``port`` to 127.0.0.1:``target``; :meth:`cut` drops every connection and
    closes new ones at once, :meth:`heal` forwards again. :meth:`close` stops it."""

    def __init__(self, target=None):
        self.target = target
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.port = self.sock.getsockname()[1]
        self.cut_off = False
        self._open = set()
        self._lock = threading.Lock()
        self._closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while not self._closed:
            try:
                client, _ = self.sock.accept()
            except OSError:
                return
            if self.cut_off or self.target is None:
                client.close()
                continue
            try:
                upstream = socket.create_connection(("127.0.0.1", self.target), timeout=5)
            except OSError:
                client.close()
                continue
            with self._lock:
                self._open.update((client, upstream))
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    def _pipe(self, src, dst):
        try:
            while True:
                data = src.recv(65536)
                if not data or self.cut_off:
                    break
                dst.sendall(data)
        except OSError:
            pass
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()

    def cut(self):
        self.cut_off = True
        with self._lock:
            socks, self._open = list(self._open), set()
        for s in socks:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def heal(self):
        self.cut_off = False

    def close(self):
        self._closed = True
        self.cut()
        self.sock.close()
