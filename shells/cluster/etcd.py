"""The one etcd client of the cluster: etcd v3's gRPC gateway (JSON over HTTP) through aiohttp.

etcd does all consensus for a Riverbed cluster (leases, leaders, epochs, membership), so this module
only needs the gateway's plain calls: range, put, delete, compare-and-swap transactions, leases and one
watch. etcd 3.4 (Debian's ``etcd-server``) serves them at ``/v3/...``; keys and values travel
base64-encoded, 64-bit integers as decimal strings. Several endpoints may be given: a call that cannot
reach one tries the next (etcd forwards writes to its leader itself).

:meth:`Etcd.watch` streams the changes of a key prefix (``POST /v3/watch``: the gateway answers with
one JSON object per line for as long as the watch lives). A node keeps its copy of the cluster's keys
with it (etcdview.py) instead of polling them; a stream that breaks (etcd restarted or stopped, the
endpoint gone, the start revision compacted) raises :class:`WatchLost`, after which the caller reads
the keys again (:meth:`Etcd.read_prefix`, which gives the revision to watch from) and watches anew.

Everything here is asyncio and must be used from one event loop (the client's aiohttp session belongs
to it). Errors: :class:`EtcdError` (no endpoint answered, or etcd refused the request).
"""

import asyncio
import base64
import json

import aiohttp

from riverbed.shells.cluster.etcd_lease import LeaseLine, LeaseRefused, LineBroken

DEFAULT_TIMEOUT = 3.0      # seconds one HTTP call may take before the next endpoint is tried
_JSON_HEADERS = {"Content-Type": "application/json"}


class EtcdError(RuntimeError):
    """etcd could not be reached on any endpoint, or answered with an error."""


class WatchLost(EtcdError):
    """A watch stream ended: etcd closed it or went away, refused it, or its start revision was compacted.
    Nothing after the last event delivered is known: read the keys again and watch from that read."""


def _b64(data):
    if isinstance(data, str):
        data = data.encode()
    return base64.b64encode(data).decode("ascii")


def _unb64(text):
    return base64.b64decode(text) if text else b""


def _prefix_end(prefix):
    """The range end that selects every key starting with ``prefix`` (etcd's prefix convention)."""
    end = bytearray(prefix)
    for i in range(len(end) - 1, -1, -1):
        if end[i] < 0xFF:
            end[i] += 1
            return bytes(end[:i + 1])
    return b"\0"


class KeyValue:
    """One key as etcd holds it: ``key``, ``value`` (bytes), ``mod_revision``, ``create_revision`` and
    ``lease`` (0 when none)."""

    __slots__ = ("key", "value", "mod_revision", "create_revision", "lease")

    def __init__(self, kv):
        self.key = _unb64(kv.get("key"))
        self.value = _unb64(kv.get("value"))
        self.mod_revision = int(kv.get("mod_revision", 0))
        self.create_revision = int(kv.get("create_revision", 0))
        self.lease = int(kv.get("lease", 0))

    def json(self):
        """The value parsed as JSON."""
        return json.loads(self.value)


class Event:
    """One change a watch delivered: ``kv`` (a :class:`KeyValue`; for a deletion only ``key`` and
    ``mod_revision``, the revision of the deletion, are set) and ``deleted``."""

    __slots__ = ("kv", "deleted")

    def __init__(self, ev):
        self.kv = KeyValue(ev.get("kv") or {})
        # the gateway omits the default (PUT, 0) and names the other
        self.deleted = ev.get("type") in ("DELETE", 1)


class Etcd:
    """An etcd v3 client over its JSON gateway. ``endpoints``: URLs (``http://127.0.0.1:2379``) or one
    comma-separated string. Use from one event loop; :meth:`close` when done."""

    def __init__(self, endpoints, *, timeout=DEFAULT_TIMEOUT):
        if isinstance(endpoints, str):
            endpoints = [e for e in endpoints.split(",") if e.strip()]
        self.endpoints = [e.strip().rstrip("/") for e in endpoints]
        if not self.endpoints:
            raise ValueError("no etcd endpoint given")
        for e in self.endpoints:
            if not e.startswith(("http://", "https://")):
                raise ValueError(f"etcd endpoint {e!r} is not an http(s) URL")
        self.timeout = timeout
        self._session = None
        self._timeouts = {}    # seconds -> aiohttp.ClientTimeout (immutable: one per value)
        self._current = 0      # the endpoint that answered last: tried first
        self._line = None      # (endpoint index, LeaseLine): the lease keep-alives' own connection
        # the highest store revision any write of this client was answered at: a copy of the keys kept
        # by a watch reflects every write this client made once it has reached this revision
        self.written = 0

    async def close(self):
        self._drop_line()
        if self._session is not None:
            await self._session.close()
            self._session = None

    def _timeout_of(self, seconds):
        seconds = seconds or self.timeout
        t = self._timeouts.get(seconds)
        if t is None:
            t = self._timeouts[seconds] = aiohttp.ClientTimeout(total=seconds)
        return t

    def _open(self):
        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self.timeout))
        return self._session

    async def _call(self, path, body, timeout=None, write=False):
        self._open()
        errors = []
        n = len(self.endpoints)
        for k in range(n):
            i = (self._current + k) % n
            url = self.endpoints[i] + path
            try:
                # the body as bytes and the answer read as bytes: aiohttp's JSON payload and its charset
                # guess for text() were a good part of each call (a lease keep-alive runs several a second)
                async with self._session.post(url, data=json.dumps(body).encode(), headers=_JSON_HEADERS,
                                              timeout=self._timeout_of(timeout)) as r:
                    raw = await r.read()
                    if r.status != 200:
                        # etcd answered: a refusal, not an unreachable endpoint
                        raise EtcdError(f"etcd {path}: HTTP {r.status}: {raw[:200].decode('utf-8', 'replace')}")
                    self._current = i
                    answer = json.loads(raw) if raw else {}
                    if write:
                        rev = int((answer.get("header") or {}).get("revision", 0))
                        if rev > self.written:
                            self.written = rev
                    return answer
            except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as e:
                errors.append(f"{url}: {type(e).__name__}: {e}")
        raise EtcdError("no etcd endpoint answered: " + "; ".join(errors))

    # ------------------------------------------------------------------------------------ key/value

    async def get(self, key):
        """The :class:`KeyValue` at ``key`` or None."""
        r = await self._call("/v3/kv/range", {"key": _b64(key)})
        kvs = r.get("kvs") or ()
        return KeyValue(kvs[0]) if kvs else None

    async def get_prefix(self, prefix):
        """Every :class:`KeyValue` whose key starts with ``prefix``, in key order."""
        p = prefix.encode() if isinstance(prefix, str) else prefix
        r = await self._call("/v3/kv/range", {"key": _b64(p), "range_end": _b64(_prefix_end(p))})
        return [KeyValue(kv) for kv in r.get("kvs") or ()]

    async def get_prefixes(self, prefixes):
        """``[[KeyValue, ...] per prefix]``: every key under each of ``prefixes``, read in ONE request (a
        transaction of range reads, so one consistent revision): a poll of several directories costs one
        HTTP round trip, not one per directory."""
        ops = []
        for prefix in prefixes:
            p = prefix.encode() if isinstance(prefix, str) else prefix
            ops.append({"request_range": {"key": _b64(p), "range_end": _b64(_prefix_end(p))}})
        r = await self._call("/v3/kv/txn", {"success": ops})
        answers = r.get("responses") or ()
        if len(answers) != len(ops):
            raise EtcdError(f"etcd answered {len(answers)} of {len(ops)} range reads")
        return [[KeyValue(kv) for kv in (a.get("response_range") or {}).get("kvs") or ()] for a in answers]

    async def read_prefix(self, prefix):
        """``(revision, [KeyValue, ...])``: every key starting with ``prefix`` in key order, and the store
        revision they were read at (watch from ``revision + 1`` to miss nothing after this read)."""
        p = prefix.encode() if isinstance(prefix, str) else prefix
        r = await self._call("/v3/kv/range", {"key": _b64(p), "range_end": _b64(_prefix_end(p))})
        rev = int((r.get("header") or {}).get("revision", 0))
        return rev, [KeyValue(kv) for kv in r.get("kvs") or ()]

    async def watch(self, prefix, start_revision):
        """Async iterator over the changes of the keys starting with ``prefix`` from ``start_revision``
        (inclusive; etcd replays older ones it still holds): a list of :class:`Event` per etcd answer,
        in revision order. It never ends by itself: :class:`WatchLost` when the stream breaks (etcd
        restarted, stopped or lost its own leader, the connection dropped, the revision compacted, a
        refusal), :class:`EtcdError` when no endpoint accepts it. One HTTP connection for its whole
        life, read without a timeout (a quiet watch is a healthy one); the caller bounds how long it
        trusts one (etcdview.py)."""
        p = prefix.encode() if isinstance(prefix, str) else prefix
        body = {"create_request": {"key": _b64(p), "range_end": _b64(_prefix_end(p)),
                                   "start_revision": str(max(1, int(start_revision)))}}
        session = self._open()
        # no total or read timeout (events may be minutes apart); a connect that hangs tries the next endpoint
        timeout = aiohttp.ClientTimeout(total=None, sock_read=None, sock_connect=self.timeout)
        # etcd cancels the watch when its member loses the raft leader, instead of leaving it silent
        headers = {"Grpc-Metadata-hasleader": "true"}
        errors, resp = [], None
        n = len(self.endpoints)
        for k in range(n):
            i = (self._current + k) % n
            url = self.endpoints[i] + "/v3/watch"
            try:
                resp = await session.post(url, json=body, timeout=timeout, headers=headers)
            except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as e:
                errors.append(f"{url}: {type(e).__name__}: {e}")
                continue
            if resp.status == 200:
                break
            text = (await resp.text())[:200]
            resp.release()
            raise EtcdError(f"etcd /v3/watch: HTTP {resp.status}: {text}")
        else:
            raise EtcdError("no etcd endpoint answered: " + "; ".join(errors))
        try:
            buf = b""
            async for data in resp.content.iter_any():
                buf += data
                if b"\n" not in data:
                    continue
                *lines, buf = buf.split(b"\n")
                batch = []
                for line in lines:
                    if line.strip():
                        batch.extend(_watch_events(json.loads(line)))
                if batch:
                    yield batch
            raise WatchLost("etcd closed the watch stream")
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError, ValueError) as e:
            raise WatchLost(f"the watch stream broke: {type(e).__name__}: {e}") from e
        finally:
            resp.close()      # never back to the pool: the stream is still open on etcd's side

    async def put(self, key, value, lease=0):
        """Set ``key`` to ``value`` (bytes, str, or anything else as JSON), attached to ``lease`` (an id;
        0: none, the key stays until deleted)."""
        body = {"key": _b64(key), "value": _b64(_encode(value))}
        if lease:
            body["lease"] = str(lease)
        await self._call("/v3/kv/put", body, write=True)

    async def delete(self, key):
        await self._call("/v3/kv/deleterange", {"key": _b64(key)}, write=True)

    async def delete_prefix(self, prefix):
        p = prefix.encode() if isinstance(prefix, str) else prefix
        await self._call("/v3/kv/deleterange", {"key": _b64(p), "range_end": _b64(_prefix_end(p))}, write=True)

    async def create(self, key, value, lease=0):
        """Put ``key`` only if it does not exist (compare-and-swap on its creation). True when this call
        created it."""
        return await self._txn(key, "CREATE", "create_revision", 0, value, lease)

    async def replace(self, key, mod_revision, value, lease=0):
        """Put ``key`` only if it still has ``mod_revision`` (it was not changed since it was read).
        True when this call changed it."""
        return await self._txn(key, "MOD", "mod_revision", mod_revision, value, lease)

    async def remove(self, key, mod_revision, puts=(), delete_prefixes=()):
        """Delete ``key`` only if it still has ``mod_revision`` and, in the same transaction, put each
        ``(key, value)`` of ``puts`` (no lease) and delete every key under each of ``delete_prefixes``.
        True when this call deleted it (nothing is written otherwise)."""
        ops = [{"request_delete_range": {"key": _b64(key)}}]
        ops += [{"request_put": {"key": _b64(k), "value": _b64(_encode(v))}} for k, v in puts]
        for prefix in delete_prefixes:
            p = prefix.encode() if isinstance(prefix, str) else prefix
            ops.append({"request_delete_range": {"key": _b64(p), "range_end": _b64(_prefix_end(p))}})
        body = {"compare": [{"key": _b64(key), "result": "EQUAL", "target": "MOD",
                             "mod_revision": str(mod_revision)}], "success": ops}
        r = await self._call("/v3/kv/txn", body, write=True)
        return bool(r.get("succeeded"))

    async def _txn(self, key, target, field, revision, value, lease):
        put = {"key": _b64(key), "value": _b64(_encode(value))}
        if lease:
            put["lease"] = str(lease)
        body = {"compare": [{"key": _b64(key), "result": "EQUAL", "target": target, field: str(revision)}],
                "success": [{"request_put": put}]}
        r = await self._call("/v3/kv/txn", body, write=True)
        return bool(r.get("succeeded"))

    # ---------------------------------------------------------------------------------------- leases

    async def grant(self, ttl):
        """A new lease of ``ttl`` seconds (int, at least 1); returns its id."""
        r = await self._call("/v3/lease/grant", {"TTL": str(max(1, int(ttl)))})
        if "ID" not in r:
            raise EtcdError(f"etcd refused a lease: {r}")
        return int(r["ID"])

    async def keepalive(self, lease):
        """Renew ``lease`` once; returns its TTL in seconds, 0 when it has expired (it is gone). Over a
        connection of its own with a request built once (etcd_lease.py: a node renews every TTL/3 for as
        long as it runs), the endpoints tried in turn as for any call; EtcdError when none answers or
        etcd refuses (an error is not an expiry: only an answer without a TTL says the lease is gone)."""
        errors = []
        n = len(self.endpoints)
        for k in range(n):
            i = (self._current + k) % n
            url = self.endpoints[i]
            if not url.startswith("http://"):
                r = await self._call("/v3/lease/keepalive", {"ID": str(lease)})    # TLS: through aiohttp
                if "error" in r:
                    raise EtcdError(f"etcd refused the keep-alive: {r['error']}")
                return int((r.get("result") or {}).get("TTL", 0))
            try:
                line = self._line[1] if self._line is not None and self._line[0] == i else None
                if line is None or line.closed:
                    self._drop_line()
                    line = await LeaseLine.open(url, self.timeout)
                    self._line = (i, line)
                ttl = await line.keepalive(lease, self.timeout)
                self._current = i
                return ttl
            except LeaseRefused as e:
                raise EtcdError(str(e)) from e      # etcd answered: a refusal, not an unreachable endpoint
            except (LineBroken, OSError) as e:
                self._drop_line()
                errors.append(f"{url}: {type(e).__name__}: {e}")
        raise EtcdError("no etcd endpoint answered: " + "; ".join(errors))

    def _drop_line(self):
        if self._line is not None:
            self._line[1].close()
            self._line = None

    async def revoke(self, lease):
        """End ``lease`` now: every key attached to it goes."""
        await self._call("/v3/lease/revoke", {"ID": str(lease)}, write=True)


def _watch_events(msg):
    """The :class:`Event` list of one line of a watch stream; WatchLost for an error or a cancellation."""
    if not isinstance(msg, dict):
        raise WatchLost(f"etcd sent {type(msg).__name__} on the watch stream")
    if "error" in msg:
        err = msg["error"] if isinstance(msg["error"], dict) else {"message": msg["error"]}
        raise WatchLost(f"etcd ended the watch: {err.get('message', err)}")
    res = msg.get("result") or {}
    if res.get("canceled") or int(res.get("compact_revision", 0) or 0):
        raise WatchLost(f"etcd canceled the watch (compacted at {res.get('compact_revision', 0)}): "
                        f"{res.get('cancel_reason', '')}")
    return [Event(ev) for ev in res.get("events") or ()]


def _encode(value):
    if isinstance(value, (bytes, bytearray)):
        return bytes(value)
    if isinstance(value, str):
        return value.encode()
    return json.dumps(value, sort_keys=True).encode()
