"""A raw BSON/TCP (mewbase) connection for tests: length-prefixed BSON documents ``{"type", "frame"}``
over a blocking socket, written from the protocol's framing (not from the shell's codec), for bad-input
tests and for publishers that must see every frame (tests/cluster/fwdclients.py)."""

import socket
import struct

import bson


class RawBson:
    """One connection to a BSON/TCP listener; with ``connect`` it sends CONNECT 0.1 and checks the answer.
    ``recv`` raises EOFError when the server closed the connection, socket.timeout past ``timeout``."""

    def __init__(self, port, connect=True, timeout=10):
        self.s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        self.buf = b""
        if connect:
            self.send("CONNECT", {"version": "0.1"})
            r = self.recv()
            assert r == {"type": "RESPONSE", "frame": {"ok": True}}, r

    def send(self, ftype, frame):
        self.s.sendall(bson.encode({"type": ftype, "frame": frame}))

    def sendraw(self, data):
        self.s.sendall(data)

    def recv(self, timeout=10):
        """The next document, decoded."""
        return self.recv_raw_len(timeout)[0]

    def recv_raw_len(self, timeout=10):
        """(decoded document, its encoded length)."""
        self.s.settimeout(timeout)
        while True:
            if len(self.buf) >= 4:
                n = struct.unpack_from("<i", self.buf)[0]
                if len(self.buf) >= n:
                    doc, self.buf = self.buf[:n], self.buf[n:]
                    return bson.decode(doc), n
            chunk = self.s.recv(1 << 20)
            if not chunk:
                raise EOFError
            self.buf += chunk

    def closed(self, timeout=5):
        """True when the server closed the connection (after any frames still queued)."""
        self.s.settimeout(timeout)
        try:
            while True:
                chunk = self.s.recv(65536)
                if not chunk:
                    return True
                self.buf += chunk
        except (ConnectionResetError, BrokenPipeError):
            return True
        except socket.timeout:
            return False

    def quiet(self, t=0.3):
        """No frame within ``t`` seconds."""
        try:
            f = self.recv(t)
        except socket.timeout:
            return True
        raise AssertionError(f"unexpected frame {f}")

    def close(self):
        self.s.close()
