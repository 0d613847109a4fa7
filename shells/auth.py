"""Users, passwords and per-stream permissions, shared by every protocol shell.

A users file is TOML, written by ``riverbed users add NAME`` (hand edits are fine)::

    [users."alice"]
    password = "scrypt$16384$8$1$<salt, base64>$<hash, base64>"
    configure = "^alice-"      # regular expressions over stream names, as RabbitMQ permissions:
    write = ".*"               # a pattern matches anywhere unless anchored; "" grants nothing
    read = ".*"
    loopback_only = false      # true: this user may only connect from 127.0.0.0/8 or ::1
    api_key = "sha256$<hex>"   # optional: hash of the user's API key (WebSocket ``authKey``, REST token)

Operations need: create/delete (super) streams -> configure; publish -> write; subscribe, offsets,
stream stats -> read.

Without a users file the only user is ``guest``/``guest`` with every permission, from loopback only
(as RabbitMQ's default). SASL mechanisms: PLAIN always, ANONYMOUS when enabled (it logs in as the
configured anonymous user, ``guest`` by default, under that user's loopback rule).

Passwords are stored as salted scrypt hashes (stdlib ``hashlib.scrypt``). Verifying one costs tens of
milliseconds, and clients such as rstream open a short-lived connection per admin call, so successful
verifications are remembered for the life of the process as an HMAC of the password under a random
per-process key (never the password itself); the memo is dropped when the file changes.

API keys (``riverbed users add NAME --api-key``) are random 256-bit tokens; the file keeps only their
SHA-256 (a slow hash buys nothing for a secret of that entropy, and a lookup by hash is a dict lookup, cheap
enough to run on every WebSocket request). A user made with ``--api-key`` and no password cannot log in
with a password.
"""

import base64
import hashlib
import hmac
import ipaddress
import json
import os
import re
import secrets
import threading
try:
    import tomllib
except ImportError:  # Python 3.10
    import tomli as tomllib
from typing import NamedTuple

from riverbed.shells.broker.internal import is_internal

OK = "ok"
NO_MECHANISM = "no-mechanism"
FAILURE = "failure"
LOOPBACK_ONLY = "loopback-only"
SASL_ERROR = "sasl-error"

PERMISSIONS = ("configure", "write", "read")
SCRYPT_N, SCRYPT_R, SCRYPT_P, SCRYPT_LEN = 1 << 14, 8, 1, 32
GUEST = "guest"


class AuthResult(NamedTuple):
    """Outcome of an authentication: ``outcome`` is one of OK, NO_MECHANISM, FAILURE, LOOPBACK_ONLY,
    SASL_ERROR; ``user`` is set when OK; ``reason`` is for the log, never for the client."""
    outcome: str
    user: "User | None"
    username: "str | None"
    reason: str


class User:
    """An authenticated principal and its permissions. Immutable; thread-safe."""

    __slots__ = ("name", "patterns", "loopback_only", "password_hash", "api_key_hash")

    def __init__(self, name, configure=".*", write=".*", read=".*", loopback_only=False, password_hash=None,
                 api_key_hash=None):
        self.name = name
        self.patterns = {}
        for what, pattern in zip(PERMISSIONS, (configure, write, read)):
            # RabbitMQ semantics: re:run (search), and the empty pattern grants nothing
            self.patterns[what] = re.compile(pattern) if pattern else None
        self.loopback_only = loopback_only
        self.password_hash = password_hash
        self.api_key_hash = api_key_hash

    def can(self, what, resource):
        """Whether this user has permission ``what`` ("configure", "write", "read") on stream
        ``resource``. Unknown permission names are refused, and so is every permission on the server's
        own streams (shells/broker/internal.py: one rule for every protocol)."""
        p = self.patterns.get(what)
        return p is not None and resource is not None and p.search(resource) is not None and \
            not is_internal(resource)

    def __repr__(self):
        return f"User({self.name!r})"


def hash_password(password, *, salt=None):
    """A salted scrypt hash string for ``password`` (str), as stored in the users file."""
    salt = salt or secrets.token_bytes(16)
    digest = hashlib.scrypt(password.encode("utf-8"), salt=salt, n=SCRYPT_N, r=SCRYPT_R, p=SCRYPT_P,
                            dklen=SCRYPT_LEN, maxmem=64 << 20)
    b64 = base64.b64encode
    return f"scrypt${SCRYPT_N}${SCRYPT_R}${SCRYPT_P}${b64(salt).decode()}${b64(digest).decode()}"


def new_api_key():
    """A new random API key (str, URL-safe, 256 bits)."""
    return secrets.token_urlsafe(32)


def hash_api_key(key):
    """The stored form of an API key: ``sha256$<hex digest of its UTF-8>``."""
    return "sha256$" + hashlib.sha256(key.encode("utf-8")).hexdigest()


def verify_password(password, stored):
    """Whether ``password`` matches the ``stored`` hash string. A malformed hash never matches."""
    try:
        scheme, n, r, p, salt, digest = stored.split("$")
        if scheme != "scrypt":
            return False
        want = base64.b64decode(digest)
        got = hashlib.scrypt(password.encode("utf-8"), salt=base64.b64decode(salt), n=int(n), r=int(r),
                             p=int(p), dklen=len(want), maxmem=256 << 20)
    except (ValueError, TypeError):
        return False
    return hmac.compare_digest(got, want)


def is_loopback(host):
    """Whether a peer address string is loopback (127.0.0.0/8, ::1, or IPv4-mapped loopback)."""
    try:
        ip = ipaddress.ip_address(host.split("%", 1)[0])
    except (ValueError, AttributeError):
        return False
    mapped = getattr(ip, "ipv4_mapped", None)
    return ip.is_loopback or (mapped is not None and mapped.is_loopback)


def load_users(path):
    """The users of a users file as ``{name: User}``. Raises OSError, ValueError (bad TOML or bad
    regular expression)."""
    with open(path, "rb") as f:
        doc = tomllib.load(f)
    users = {}
    for name, entry in (doc.get("users") or {}).items():
        if not isinstance(entry, dict):
            raise ValueError(f"{path}: users.{name} is not a table")
        try:
            users[name] = User(name, entry.get("configure", ""), entry.get("write", ""), entry.get("read", ""),
                               bool(entry.get("loopback_only", False)), entry.get("password"),
                               entry.get("api_key") or None)
        except re.error as e:
            raise ValueError(f"{path}: bad permission pattern for user {name!r}: {e}") from None
    return users


def _toml_users(users):
    lines = ["# Riverbed users file. Written by `riverbed users add`; permissions are regular expressions",
             "# over stream names (\"\" grants nothing). Passwords are salted scrypt hashes.", ""]
    for name in sorted(users):
        e = users[name]
        lines.append(f"[users.{json.dumps(name)}]")
        for key in ("password", "configure", "write", "read"):
            lines.append(f"{key} = {json.dumps(e.get(key, ''))}")
        lines.append(f"loopback_only = {'true' if e.get('loopback_only') else 'false'}")
        if e.get("api_key"):
            lines.append(f"api_key = {json.dumps(e['api_key'])}")
        lines.append("")
    return "\n".join(lines)


def add_user(path, name, password, *, configure=".*", write=".*", read=".*", loopback_only=False, api_key=None):
    """Add or replace user ``name`` in the users file at ``path`` (created if missing, mode 0600),
    atomically. ``password`` None: no password login. ``api_key`` (str): store its hash (see
    :func:`new_api_key`). Raises ValueError for an empty name or a bad regular expression."""
    if not name:
        raise ValueError("user name must not be empty")
    for pattern in (configure, write, read):
        re.compile(pattern)
    raw = {}
    if os.path.exists(path):
        with open(path, "rb") as f:
            raw = tomllib.load(f).get("users") or {}
    raw[name] = {"password": hash_password(password) if password is not None else "", "configure": configure,
                 "write": write, "read": read, "loopback_only": loopback_only}
    if api_key is not None:
        raw[name]["api_key"] = hash_api_key(api_key)
    _write_atomically(path, _toml_users(raw))


def delete_user(path, name):
    """Remove ``name`` from the users file. Returns False when there was no such user."""
    with open(path, "rb") as f:
        raw = tomllib.load(f).get("users") or {}
    if name not in raw:
        return False
    del raw[name]
    _write_atomically(path, _toml_users(raw))
    return True


def _write_atomically(path, text):
    tmp = f"{path}.tmp.{os.getpid()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


class Authenticator:
    """Checks SASL responses against the users file (or the built-in guest).

    Thread-safe. The users file is re-read when its modification time changes, so ``riverbed users
    add`` takes effect without a restart; if a changed file fails to parse, the last good one stays in
    force (and the error is kept in ``last_error``).
    """

    def __init__(self, users_file=None, *, anonymous=False, anonymous_user=GUEST):
        self.users_file = os.fspath(users_file) if users_file else None
        self.anonymous = anonymous
        self.anonymous_user = anonymous_user
        self.last_error = None
        self._lock = threading.Lock()
        self._mtime = None
        self._users = {}
        self._memo = set()
        self._by_api_key = (None, {})   # (the users dict it was built from, {api key hash: User})
        self._key = secrets.token_bytes(32)
        if self.users_file:
            self._users = load_users(self.users_file)   # fail fast at start-up on a bad file
            self._mtime = os.stat(self.users_file).st_mtime_ns
        else:
            self._users = {GUEST: User(GUEST, loopback_only=True, password_hash=None)}

    def mechanisms(self):
        """SASL mechanism names offered in SaslHandshake."""
        return ["PLAIN", "ANONYMOUS"] if self.anonymous else ["PLAIN"]

    def _current_users(self):
        if not self.users_file:
            return self._users
        try:
            mtime = os.stat(self.users_file).st_mtime_ns
        except OSError as e:
            self.last_error = str(e)
            return self._users
        if mtime != self._mtime:
            with self._lock:
                if mtime != self._mtime:
                    try:
                        self._users = load_users(self.users_file)
                        self._memo = set()
                        self.last_error = None
                    except (OSError, ValueError) as e:
                        self.last_error = str(e)
                    self._mtime = mtime
        return self._users

    def authenticate(self, mechanism, response, peer_loopback):
        """Check a SASL ``response`` (bytes) for ``mechanism``. Returns an AuthResult."""
        if mechanism not in self.mechanisms():
            return AuthResult(NO_MECHANISM, None, None, f"mechanism {mechanism!r} not offered")
        if mechanism == "ANONYMOUS":
            return self._login(self.anonymous_user, None, peer_loopback)
        parts = bytes(response).split(b"\0")
        if len(parts) != 3:
            return AuthResult(SASL_ERROR, None, None, "PLAIN response is not [authzid]\\0user\\0password")
        try:
            name, password = parts[1].decode("utf-8"), parts[2].decode("utf-8")
        except UnicodeDecodeError:
            return AuthResult(SASL_ERROR, None, None, "PLAIN response is not UTF-8")
        return self._login(name, password, peer_loopback)

    def check_password(self, name, password, peer_loopback):
        """Username/password login for shells without SASL. Returns an AuthResult; a missing (None) or
        non-string password is a FAILURE, never a login without one."""
        if not isinstance(password, str) or not isinstance(name, str):
            return AuthResult(FAILURE, None, name if isinstance(name, str) else None, "no password given")
        return self._login(name, password, peer_loopback)

    @property
    def open_to_loopback(self):
        """True without a users file: every listener then serves loopback clients only, as guest."""
        return not self.users_file

    def user(self, name):
        """The current User named ``name``, or None (for shells that act as a configured user)."""
        return self._current_users().get(name)

    def user_for_api_key(self, key):
        """The current User whose API key is ``key`` (str), or None (no such key, or not a str)."""
        if not isinstance(key, str) or not key:
            return None
        users = self._current_users()
        built_from, index = self._by_api_key
        if built_from is not users:
            index = {u.api_key_hash: u for u in users.values() if u.api_key_hash}
            self._by_api_key = (users, index)
        return index.get(hash_api_key(key))

    def implicit_user(self, peer_loopback):
        """The user a connection without credentials acts as: guest (every permission) when there is no
        users file and the peer is on loopback; else None (refuse it)."""
        if self.users_file or not peer_loopback:
            return None
        return self._users.get(GUEST)

    def _login(self, name, password, peer_loopback):
        user = self._current_users().get(name)
        if user is None:
            return AuthResult(FAILURE, None, name, f"no user {name!r}")
        if password is not None:
            if not self._password_ok(user, password):
                return AuthResult(FAILURE, None, name, f"wrong password for {name!r}")
        if user.loopback_only and not peer_loopback:
            return AuthResult(LOOPBACK_ONLY, None, name, f"user {name!r} may only connect from loopback")
        return AuthResult(OK, user, name, "")

    def _password_ok(self, user, password):
        if user.password_hash is None:      # the built-in guest
            return user.name == GUEST and hmac.compare_digest(password.encode("utf-8"), b"guest")
        tag = (user.name, user.password_hash, hmac.new(self._key, password.encode("utf-8"), "sha256").digest())
        if tag in self._memo:
            return True
        if verify_password(password, user.password_hash):
            with self._lock:
                self._memo.add(tag)
            return True
        return False
