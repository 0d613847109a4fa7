"""CURVE keys for the ZeroMQ listener: Z85 key files, the client allow-list, ``riverbed zmq-keygen``.

A key file holds one key as 40 Z85 characters; surrounding whitespace (a trailing newline) is ignored.
The allow-list is a directory with one client public key per regular file whose name does not start
with ``.``; :class:`AllowList` re-reads it whenever a file in it (or the directory) changes.

Thread-safety: the functions are pure apart from file access; an AllowList is used from the loop thread.
"""

import os

import zmq
from zmq.utils import z85

LEN_Z85_KEY = 40


class KeyError_(ValueError):
    """A key file is unreadable or does not hold a 40-character Z85 key; the message names the file."""


def parse_key(text, where="key"):
    """The 32-byte key of a Z85 key text (bytes or str, whitespace around it ignored). Raises KeyError_."""
    if isinstance(text, bytes):
        try:
            text = text.decode("ascii")
        except UnicodeDecodeError:
            raise KeyError_(f"{where}: not a Z85 key (non-ASCII bytes)") from None
    text = text.strip()
    if len(text) != LEN_Z85_KEY:
        raise KeyError_(f"{where}: a Z85 key is {LEN_Z85_KEY} characters, not {len(text)}")
    try:
        raw = z85.decode(text)
    except (ValueError, KeyError, IndexError, TypeError):
        raise KeyError_(f"{where}: not a valid Z85 key") from None
    return raw


def read_key_file(path):
    """The Z85 text (40 characters, bytes) of the key in ``path``. Raises KeyError_."""
    try:
        with open(path, "rb") as f:
            text = f.read(4096)
    except OSError as e:
        raise KeyError_(f"cannot read key file {path}: {e.strerror}") from None
    parse_key(text, path)
    return text.strip()


def load_server_keys(secret_path):
    """``(public_z85, secret_z85)`` (bytes) from the server's secret key file; the public key is derived
    from the secret. Raises KeyError_."""
    secret = read_key_file(secret_path)
    return zmq.curve_public(secret), secret


def generate_key_pair(prefix):
    """Write a new key pair: ``PREFIX.key`` (secret, mode 0600) and ``PREFIX.pub`` (public). Refuses to
    overwrite an existing secret key file. Returns ``(public_path, secret_path, public_z85)``. Raises
    OSError (FileExistsError when the secret key file exists)."""
    public, secret = zmq.curve_keypair()
    secret_path, public_path = prefix + ".key", prefix + ".pub"
    fd = os.open(secret_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(secret + b"\n")
    with open(public_path, "wb") as f:
        f.write(public + b"\n")
    return public_path, secret_path, public.decode("ascii")


class AllowList:
    """The client public keys allowed by a directory, re-read when it changes. ``lookup(key)`` with the
    32-byte key a ZAP request carries returns the name of the file that lists it, or None."""

    def __init__(self, directory):
        self.directory = directory
        self._signature = None
        self._keys = {}
        self.errors = []
        self.refresh()

    def _scan(self):
        entries = []
        with os.scandir(self.directory) as it:
            for e in it:
                if e.name.startswith(".") or not e.is_file():
                    continue
                st = e.stat()
                entries.append((e.name, st.st_mtime_ns, st.st_size))
        return sorted(entries)

    def refresh(self):
        """Re-read the directory if anything in it changed. A missing directory allows nobody."""
        try:
            st = os.stat(self.directory)
            signature = (st.st_mtime_ns, tuple(self._scan()))
        except OSError as e:
            self._keys, self._signature = {}, None
            self.errors = [f"cannot read {self.directory}: {e.strerror}"]
            return
        if signature == self._signature:
            return
        keys, errors = {}, []
        for name, _, _ in signature[1]:
            path = os.path.join(self.directory, name)
            try:
                keys[parse_key(read_key_file(path), path)] = name
            except KeyError_ as e:
                errors.append(str(e))
        self._keys, self._signature, self.errors = keys, signature, errors

    def lookup(self, key):
        self.refresh()
        return self._keys.get(bytes(key))

    def __len__(self):
        return len(self._keys)
