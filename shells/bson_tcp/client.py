"""A small asyncio client for Riverbed's BSON/TCP (mewbase) protocol.

::

    from riverbed.shells.bson_tcp.client import BsonClient

    async with await BsonClient.connect("127.0.0.1", 7451) as cl:     # username=, password= with --users
        await cl.publish("orders", {"id": 1, "total": 9.5})
        acks = [cl.publish_nowait("orders", {"id": i}) for i in range(1000)]   # pipelined
        await asyncio.gather(*acks)

        sub = await cl.subscribe("orders", start_pos=0, matcher={"total": {"$gt": 5}})
        async for ev in sub:                 # ev.pos, ev.timestamp (ms), ev.event (dict); ACKEVs are sent
            ...                              # automatically every ack_bytes bytes (default 256 KiB)
        await sub.close()                    # SUBCLOSE (durable state kept); sub.unsubscribe() deletes it

        async with cl.transaction() as tx:   # STARTTX ... COMMITTX (ABORTTX if the block raises)
            await tx.publish("orders", {"id": 2})

        await cl.create_projection("by-id", channel="orders", binder="orders_view", doc_id="id")
        docs = [d async for d in cl.query("orders_view", {"total": {"$gt": 5}})]   # QUERYACK automatic
        doc = await cl.find_by_id("orders_view", 1)

Errors from the server raise :class:`BsonError` (``code`` = errCode). One client is one connection;
its methods may be called concurrently from tasks of the loop it was connected on. Not thread-safe.
"""

import asyncio
import itertools
import struct

import bson
from bson.codec_options import CodecOptions

__all__ = ["BsonClient", "BsonError", "Event", "Subscription", "Transaction"]

_LEN = struct.Struct("<i")
DEFAULT_ACK_BYTES = 256 << 10
DEFAULT_PING_INTERVAL = 10.0
PROTOCOL_VERSION = "0.1"


class BsonError(Exception):
    """The server refused a request: ``code`` is its errCode (1 auth failed, 2 not authorised, 3 no such
    channel, 4 no such binder, 5 no such query, 6 not processed, 100 server error)."""

    def __init__(self, code, message):
        super().__init__(f"errCode {code}: {message}")
        self.code = code
        self.message = message


def _client_ssl(ssl_option, tls_ca):
    """The SSLContext for :meth:`BsonClient.connect`'s ``ssl``/``tls_ca`` options, or None (plain TCP)."""
    import ssl as _ssl
    if isinstance(ssl_option, _ssl.SSLContext):
        if tls_ca is not None:
            ssl_option.load_verify_locations(cafile=tls_ca)
        return ssl_option
    if ssl_option or tls_ca is not None:
        return _ssl.create_default_context(cafile=tls_ca)
    return None


class Event:
    """A RECEV: ``pos`` (the channel offset), ``timestamp`` (ms, when stored), ``event`` (dict),
    ``size`` (bytes of the frame, what an ACKEV gives back)."""

    __slots__ = ("pos", "timestamp", "event", "size")

    def __init__(self, pos, timestamp, event, size):
        self.pos, self.timestamp, self.event, self.size = pos, timestamp, event, size

    def __repr__(self):
        return f"Event(pos={self.pos}, timestamp={self.timestamp}, event={self.event!r})"


class Subscription:
    """A SUBSCRIBE: iterate it (``async for``) or call :meth:`get`. With ``auto_ack`` the client sends
    ACKEV once ``ack_bytes`` bytes have been taken out of the queue (and on :meth:`ack`)."""

    def __init__(self, client, sub_id, auto_ack, ack_bytes):
        self.client = client
        self.sub_id = sub_id
        self.auto_ack = auto_ack
        self.ack_bytes = ack_bytes
        self.queue = asyncio.Queue()
        self._unacked = 0
        self._last_pos = None
        self.closed = False

    def _deliver(self, ev):
        self.queue.put_nowait(ev)

    async def get(self, timeout=None):
        """The next event (waits; ``asyncio.TimeoutError`` after ``timeout`` seconds)."""
        ev = await asyncio.wait_for(self.queue.get(), timeout)
        if ev is None:
            raise StopAsyncIteration
        self._taken(ev)
        return ev

    def _taken(self, ev):
        self._unacked += ev.size
        self._last_pos = ev.pos
        if self.auto_ack and self._unacked >= self.ack_bytes:
            self.ack()

    def ack(self, nbytes=None, pos=None):
        """Send ACKEV for the bytes taken so far (or ``nbytes``) and the last position taken (or ``pos``)."""
        n = self._unacked if nbytes is None else nbytes
        p = self._last_pos if pos is None else pos
        self._unacked = max(0, self._unacked - n)
        if self.client._closed or p is None and not n:
            return
        frame = {"subID": self.sub_id, "bytes": n}
        if p is not None:
            frame["pos"] = p
        self.client._send("ACKEV", frame)

    def __aiter__(self):
        return self

    async def __anext__(self):
        ev = await self.queue.get()
        if ev is None:
            raise StopAsyncIteration
        self._taken(ev)
        return ev

    async def close(self):
        """SUBCLOSE: stop; a durable subscription's state is kept."""
        await self._end("SUBCLOSE")

    async def unsubscribe(self):
        """UNSUBSCRIBE: stop and delete the durable state."""
        await self._end("UNSUBSCRIBE")

    async def _end(self, ftype):
        if self.closed:
            return
        if self._unacked and self.auto_ack:
            self.ack()
        self.closed = True
        await self.client._request(ftype, {"subID": self.sub_id})
        self.client._subs.pop(self.sub_id, None)
        self.queue.put_nowait(None)


class Transaction:
    """STARTTX..COMMITTX on one session id; use ``async with client.transaction() as tx``."""

    def __init__(self, client, sess_id):
        self.client = client
        self.sess_id = sess_id

    async def publish(self, channel, event):
        return await self.client.publish(channel, event, sess_id=self.sess_id)

    def publish_nowait(self, channel, event):
        return self.client.publish_nowait(channel, event, sess_id=self.sess_id)

    async def commit(self):
        await self.client._request("COMMITTX", {"sessID": self.sess_id})

    async def abort(self):
        await self.client._request("ABORTTX", {"sessID": self.sess_id})

    async def __aenter__(self):
        await self.client._request("STARTTX", {"sessID": self.sess_id})
        return self

    async def __aexit__(self, et, ev, tb):
        if et is None:
            await self.commit()
        elif not self.client._closed:
            await self.abort()
        return False


class BsonClient:
    """One connection to a BSON/TCP server. Create it with ``await BsonClient.connect(...)``."""

    def __init__(self, reader, writer, *, ping_interval=DEFAULT_PING_INTERVAL, document_class=dict):
        self.reader = reader
        self.writer = writer
        self._opts = CodecOptions(document_class=document_class)
        self._rids = itertools.count(1)
        self._qids = itertools.count(1)
        self._sess = itertools.count(1)
        self._pending = {}        # rID -> future
        self._connect_fut = None
        self._subs = {}
        self._sub_opts = {}       # rID of a SUBSCRIBE in flight -> (auto_ack, ack_bytes)
        self._queries = {}
        self._closed = False
        self._ping_seq = 0
        self._pongs = {}
        self._reader_task = asyncio.ensure_future(self._read_loop())
        self._pinger = asyncio.ensure_future(self._ping_loop(ping_interval)) if ping_interval else None

    @classmethod
    async def connect(cls, host="127.0.0.1", port=7451, *, username=None, password=None, version=PROTOCOL_VERSION,
                      ping_interval=DEFAULT_PING_INTERVAL, timeout=10.0, ssl=None, tls_ca=None,
                      server_hostname=None):
        """Open a connection and send CONNECT; ``timeout`` seconds for each of the two steps.

        TLS (a server started with ``--tls-cert``, where the BSON port is TLS-only): ``ssl=True`` checks
        the server's certificate against the system's CAs, ``tls_ca="ca.pem"`` against that PEM file
        (either alone turns TLS on), or pass your own ``ssl.SSLContext`` as ``ssl`` (a client certificate
        for ``--tls-ca`` servers goes in it). The certificate must name ``host`` (or ``server_hostname``).

        Raises BsonError (code 1 wrong credentials, 100 version), ssl.SSLError (certificate refused) or
        OSError."""
        context = _client_ssl(ssl, tls_ca)
        kw = {"ssl": context, "server_hostname": server_hostname} if context is not None else {}
        reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port, limit=1 << 24, **kw), timeout)
        cl = cls(reader, writer, ping_interval=ping_interval)
        frame = {"version": version}
        if username is not None:
            frame["username"] = username
        if password is not None:
            frame["password"] = password
        cl._connect_fut = asyncio.get_running_loop().create_future()
        cl._send("CONNECT", frame)
        try:
            resp = await asyncio.wait_for(cl._connect_fut, timeout)
        except BaseException:
            await cl.close()
            raise
        if not resp.get("ok"):
            await cl.close()
            raise BsonError(resp.get("errCode"), resp.get("errMsg"))
        return cl

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        await self.close()

    async def close(self):
        """Close the connection (open transactions are discarded by the server)."""
        if self._closed:
            return
        self._closed = True
        for t in (self._pinger,):
            if t is not None:
                t.cancel()
        try:
            self.writer.close()
            await self.writer.wait_closed()
        except (OSError, ConnectionError):
            pass
        self._reader_task.cancel()
        try:
            await self._reader_task
        except (asyncio.CancelledError, Exception):  # noqa: BLE001
            pass
        self._fail_all(ConnectionError("connection closed"))

    # ---------------------------------------------------------------------------------- plumbing

    def _send(self, ftype, frame):
        if self._closed:
            raise ConnectionError("connection closed")
        self.writer.write(bson.encode({"type": ftype, "frame": frame}))

    def _request_nowait(self, ftype, frame):
        rid = next(self._rids) & 0x7FFFFFFF
        frame["rID"] = rid
        fut = asyncio.get_running_loop().create_future()
        self._pending[rid] = fut
        self._send(ftype, frame)
        return fut

    async def _request(self, ftype, frame):
        resp = await self._request_nowait(ftype, frame)
        if not resp.get("ok"):
            raise BsonError(resp.get("errCode"), resp.get("errMsg"))
        return resp

    async def drain(self):
        """Wait until the transport's buffer is flushed (back-pressure for long pipelines)."""
        await self.writer.drain()

    async def _read_loop(self):
        try:
            while True:
                head = await self.reader.readexactly(4)
                n = _LEN.unpack(head)[0]
                body = await self.reader.readexactly(n - 4)
                self._on_frame(head + body)
        except (asyncio.IncompleteReadError, ConnectionError, OSError) as e:
            self._fail_all(ConnectionError(f"connection lost: {e}"))
        except asyncio.CancelledError:
            raise

    def _fail_all(self, exc):
        if self._connect_fut is not None and not self._connect_fut.done():
            self._connect_fut.set_exception(exc)
        for fut in self._pending.values():
            if not fut.done():
                fut.set_exception(exc)
        self._pending.clear()
        for sub in self._subs.values():
            sub.queue.put_nowait(None)
        for q in self._queries.values():
            q.put_nowait(exc)
        for fut in self._pongs.values():
            if not fut.done():
                fut.set_exception(exc)

    def _on_frame(self, raw):
        doc = bson.decode(raw, self._opts)
        ftype, f = doc.get("type"), doc.get("frame") or {}
        if ftype == "RECEV":
            sub = self._subs.get(f.get("subID"))
            if sub is not None:
                sub._deliver(Event(f.get("pos"), f.get("timestamp"), f.get("event"), len(raw)))
        elif ftype in ("RESPONSE", "SUBRESPONSE"):
            rid = f.get("rID")
            fut = self._pending.pop(rid, None) if rid is not None else None
            if fut is None and rid is None and self._connect_fut is not None and not self._connect_fut.done():
                fut = self._connect_fut
            opts = self._sub_opts.pop(rid, None) if ftype == "SUBRESPONSE" else None
            if opts is not None and f.get("ok"):
                # registered now, before the RECEVs that follow this frame are read
                sub = Subscription(self, f.get("subID"), *opts)
                self._subs[sub.sub_id] = sub
                f = dict(f, _sub=sub)
            if fut is not None and not fut.done():
                fut.set_result(f)
        elif ftype == "QUERYRESULT":
            q = self._queries.get(f.get("queryID"))
            if q is not None:
                q.put_nowait((f, len(raw)))
        elif ftype == "PING":
            fut = self._pongs.pop(f.get("sequence"), None)
            if fut is not None and not fut.done():
                fut.set_result(True)

    async def _ping_loop(self, interval):
        while True:
            await asyncio.sleep(interval)
            if self._closed:
                return
            try:
                self._ping_seq += 1
                self._send("PING", {"type": 8, "sequence": self._ping_seq})
            except ConnectionError:
                return

    # -------------------------------------------------------------------------------------- API

    async def ping(self, timeout=10.0):
        """PING and wait for the reply (sequence + 1)."""
        self._ping_seq += 1
        seq = self._ping_seq
        fut = asyncio.get_running_loop().create_future()
        self._pongs[seq + 1] = fut
        self._send("PING", {"type": 8, "sequence": seq})
        await asyncio.wait_for(fut, timeout)

    def publish_nowait(self, channel, event, *, sess_id=None):
        """Send PUB now; returns a future of the RESPONSE (raises BsonError through it). For pipelines."""
        frame = {"channel": channel, "event": event}
        if sess_id is not None:
            frame["sessID"] = sess_id
        fut = self._request_nowait("PUB", frame)
        return asyncio.ensure_future(_checked(fut))

    async def publish(self, channel, event, *, sess_id=None):
        """PUB ``event`` (a dict) to ``channel``; returns once it is durable."""
        return await self.publish_nowait(channel, event, sess_id=sess_id)

    async def subscribe(self, channel, *, start_pos=None, start_timestamp=None, durable_id=None, matcher=None,
                        auto_ack=True, ack_bytes=DEFAULT_ACK_BYTES):
        """SUBSCRIBE; returns a :class:`Subscription`. Neither start field: only new events."""
        frame = {"channel": channel}
        if start_pos is not None:
            frame["startPos"] = bson.int64.Int64(start_pos)
        if start_timestamp is not None:
            frame["startTimestamp"] = bson.int64.Int64(start_timestamp)
        if durable_id is not None:
            frame["durableID"] = durable_id
        if matcher is not None:
            frame["matcher"] = matcher
        rid = next(self._rids) & 0x7FFFFFFF
        frame["rID"] = rid
        fut = asyncio.get_running_loop().create_future()
        self._pending[rid] = fut
        # the subscription must exist before its first RECEV is read: _on_frame registers it
        self._sub_opts[rid] = (auto_ack, ack_bytes)
        self._send("SUBSCRIBE", frame)
        resp = await fut
        if not resp.get("ok"):
            raise BsonError(resp.get("errCode"), resp.get("errMsg"))
        return resp["_sub"]

    def transaction(self, sess_id=None):
        """A :class:`Transaction` on ``sess_id`` (default: a new one)."""
        return Transaction(self, next(self._sess) if sess_id is None else sess_id)

    async def start_tx(self, sess_id):
        await self._request("STARTTX", {"sessID": sess_id})

    async def commit_tx(self, sess_id):
        await self._request("COMMITTX", {"sessID": sess_id})

    async def abort_tx(self, sess_id):
        await self._request("ABORTTX", {"sessID": sess_id})

    async def list_channels(self):
        return (await self._request("LISTCHANNELS", {}))["channels"]

    async def create_channel(self, name):
        """True when it already existed."""
        return (await self._request("CREATECHANNEL", {"name": name}))["exists"]

    async def list_binders(self):
        return (await self._request("LISTBINDERS", {}))["binders"]

    async def create_binder(self, name):
        """True when it already existed."""
        return (await self._request("CREATEBINDER", {"name": name}))["exists"]

    async def create_projection(self, name, *, channel, binder, doc_id, matcher=None, mode="merge"):
        frame = {"name": name, "channel": channel, "binder": binder, "docID": doc_id, "mode": mode}
        if matcher is not None:
            frame["matcher"] = matcher
        await self._request("CREATEPROJECTION", frame)

    async def find_by_id(self, binder, doc_id):
        """The document, or None."""
        return (await self._request("FINDBYID", {"binder": binder, "docID": doc_id})).get("doc")

    async def query(self, binder, matcher=None, *, doc_id=None, ack_bytes=DEFAULT_ACK_BYTES):
        """QUERY: an async iterator of the matching documents (QUERYACK sent every ``ack_bytes``)."""
        qid = next(self._qids) & 0x7FFFFFFF
        q = asyncio.Queue()
        self._queries[qid] = q
        frame = {"queryID": qid, "binder": binder}
        if doc_id is not None:
            frame["docID"] = doc_id
        else:
            frame["matcher"] = matcher or {}
        self._send("QUERY", frame)
        unacked = 0
        try:
            while True:
                item = await q.get()
                if isinstance(item, BaseException):
                    raise item
                f, size = item
                if f.get("ok") is False:
                    raise BsonError(f.get("errCode"), f.get("errMsg"))
                if "result" in f:
                    yield f["result"]
                if f.get("last"):
                    return
                unacked += size
                if unacked >= ack_bytes:
                    self._send("QUERYACK", {"queryID": qid, "bytes": unacked})
                    unacked = 0
        finally:
            self._queries.pop(qid, None)


async def _checked(fut):
    resp = await fut
    if not resp.get("ok"):
        raise BsonError(resp.get("errCode"), resp.get("errMsg"))
    return resp
