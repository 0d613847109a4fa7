"""Lease keep-alives over one persistent HTTP/1.1 connection with a request built once.

Why: every cluster node renews its etcd lease every TTL/3 for as long as it runs. Through aiohttp each
renewal cost the node about 300 us of CPU (a request object, headers, timeouts, a response object, the
connection pool), which at rest was the largest single cost of a cluster node. The request never
changes for one lease (``POST /v3/lease/keepalive`` with ``{"ID": "<lease>"}``), so it is built once as
bytes and written on a connection kept open between renewals, and the answer is parsed in place: one
write, one read and a small JSON body per renewal (about a fifth of the CPU).

Why not etcd's streaming keep-alive (the gRPC LeaseKeepAlive stream that etcd's own clients keep open):
etcd 3.4's JSON gateway serves it over HTTP/1.1, where Go's server reads a request body to its end
before it answers, so a request body kept open for further renewals gets no answer at all (tried).

:class:`LeaseLine` is one such connection to one endpoint; :class:`~riverbed.shells.cluster.etcd.Etcd`
keeps one and tries its endpoints in turn as for any call. A line that breaks (closed, timed out, an
answer it cannot parse) is dropped; the next renewal dials a new one. Errors: :class:`LineBroken` (the
endpoint did not answer properly: try another), :class:`LeaseRefused` (etcd answered with an error).

Loop thread only (the Etcd client's event loop).
"""

import asyncio
import json
import re

MAX_ANSWER = 64 << 10      # bytes: an answer longer than this is not etcd's keep-alive answer
_HEADERS = re.compile(rb"\r\n(content-length|transfer-encoding|connection)[ \t]*:[ \t]*([^\r\n]*)", re.I)


class LineBroken(ConnectionError):
    """The connection closed, timed out, or sent something that is not an HTTP answer."""


class LeaseRefused(RuntimeError):
    """etcd answered the renewal with an error (an HTTP status other than 200, or an error body)."""


class LeaseLine(asyncio.Protocol):
    """One open connection to ``host:port`` for renewals (:meth:`keepalive`), one at a time."""

    def __init__(self, host, port):
        self.host = host
        self.port = port
        self.transport = None
        self._buf = bytearray()
        self._head = None          # the parsed headers of the answer being read (_head)
        self._waiter = None
        self._requests = {}        # lease id -> its request bytes
        self.closed = False

    @classmethod
    async def open(cls, url, timeout):
        """A line to ``url`` (``http://host:port``); LineBroken when it cannot be dialled in ``timeout``
        seconds (OSError as LineBroken too)."""
        hostport = url[len("http://"):]
        host, _, port = hostport.rpartition(":")
        line = cls(host.strip("[]") or "127.0.0.1", int(port or 80))
        loop = asyncio.get_running_loop()
        try:
            await asyncio.wait_for(loop.create_connection(lambda: line, line.host, line.port), timeout)
        except (OSError, asyncio.TimeoutError) as e:
            raise LineBroken(f"cannot dial {url}: {type(e).__name__}: {e}") from e
        return line

    # ------------------------------------------------------------------------------ protocol

    def connection_made(self, transport):
        self.transport = transport

    def connection_lost(self, exc):
        self.closed = True
        self._fail(LineBroken(f"etcd closed the keep-alive connection: {exc}"))

    def data_received(self, data):
        w = self._waiter
        if w is None or w.done():
            self.close()        # nothing was asked: not etcd's answer
            return
        buf = self._buf
        buf += data
        try:
            # the headers parsed once, the body only once it may be whole (a chunked one ends with an
            # empty line): etcd's answer comes in two or three segments
            head = self._head
            if head is None:
                head = self._head = _head(buf)
            got = None if head is None or (head[2] and not buf.endswith(b"\r\n\r\n")) else _body(buf, head)
        except ValueError as e:
            self._fail(LineBroken(f"etcd's keep-alive answer: {e}"))
            self.close()
            return
        if got is None:
            if len(buf) > MAX_ANSWER:
                self._fail(LineBroken("etcd's keep-alive answer is too long"))
                self.close()
            return
        status, body, used, close = got
        del buf[:used]
        self._head = None
        w.set_result((status, body))
        if close:
            self.close()

    def _timed_out(self, timeout):
        self._fail(LineBroken(f"no keep-alive answer in {timeout}s"))

    def _fail(self, exc):
        w = self._waiter
        if w is not None and not w.done():
            w.set_exception(exc)

    def close(self):
        self.closed = True
        if self.transport is not None:
            self.transport.close()

    # ------------------------------------------------------------------------------ the call

    async def keepalive(self, lease, timeout):
        """Renew ``lease`` (an id) once: its TTL in seconds, 0 when it has expired. LineBroken when the
        line breaks or no whole answer comes within ``timeout`` seconds (the line is then closed);
        LeaseRefused when etcd answers with an error."""
        if self.closed:
            raise LineBroken("the keep-alive connection is closed")
        req = self._requests.get(lease)
        if req is None:
            body = b'{"ID":"%d"}' % lease
            req = self._requests[lease] = (
                b"POST /v3/lease/keepalive HTTP/1.1\r\nHost: %s:%d\r\nContent-Type: application/json\r\n"
                b"Content-Length: %d\r\n\r\n%s" % (self.host.encode(), self.port, len(body), body))
        loop = asyncio.get_running_loop()
        w = self._waiter = loop.create_future()
        self._buf.clear()
        self._head = None
        self.transport.write(req)
        # a timer that fails the future costs less than wait_for's task
        timer = loop.call_later(timeout, self._timed_out, timeout)
        try:
            status, body = await w
        except LineBroken:
            self.close()
            raise
        finally:
            timer.cancel()
            self._waiter = None
        if status != 200:
            raise LeaseRefused(f"etcd /v3/lease/keepalive: HTTP {status}: {body[:200].decode('utf-8', 'replace')}")
        try:
            msg = json.loads(body.split(b"\n", 1)[0]) if body.strip() else {}
        except ValueError as e:
            self.close()
            raise LineBroken(f"etcd's keep-alive answer is not JSON: {e}") from e
        if not isinstance(msg, dict):
            raise LeaseRefused(f"etcd answered the keep-alive with {type(msg).__name__}")
        if "error" in msg:
            raise LeaseRefused(f"etcd refused the keep-alive: {msg['error']}")
        return int((msg.get("result") or {}).get("TTL", 0))


def _answer(buf):
    """``(status, body bytes, bytes used, close after)`` of the whole HTTP answer at the start of
    ``buf``, or None while it is incomplete. A body comes with Content-Length or chunked (the gateway
    streams: one chunk per message, then the last, empty one). ValueError: not an HTTP/1.x answer."""
    head = _head(buf)
    return None if head is None else _body(buf, head)


def _head(buf):
    """``(status, Content-Length or None, chunked, close after, where the body starts)`` of the answer at
    the start of ``buf``, or None while its headers are incomplete. ValueError: not an HTTP/1.x answer."""
    end = buf.find(b"\r\n\r\n")
    if end < 0:
        return None
    if buf[:7] != b"HTTP/1." or buf[8:9] != b" ":
        raise ValueError(f"not an HTTP answer: {bytes(buf[:40])!r}")
    status = int(buf[9:12])
    length, chunked, close = None, False, buf[:8] == b"HTTP/1.0"
    # one regex pass over the headers (they are parsed on every renewal)
    for name, value in _HEADERS.findall(buf, 0, end + 2):
        name = name.lower()
        if name == b"content-length":
            length = int(value)
        elif name == b"transfer-encoding":
            chunked = b"chunked" in value.lower()
        else:
            close = value.strip().lower() == b"close"
    if not chunked and length is None:
        raise ValueError("an answer with neither Content-Length nor chunks")
    return status, length, chunked, close, end + 4


def _body(buf, head):
    """:func:`_answer` of ``buf`` whose headers are ``head`` (:func:`_head`)."""
    status, length, chunked, close, pos = head
    if not chunked:
        if len(buf) < pos + length:
            return None
        return status, bytes(buf[pos:pos + length]), pos + length, close
    body = bytearray()
    while True:
        eol = buf.find(b"\r\n", pos)
        if eol < 0:
            return None
        size = int(bytes(buf[pos:eol]).split(b";", 1)[0], 16)
        start = eol + 2
        if size == 0:
            # the last chunk, then trailer lines (the gateway sends none) up to an empty one
            while True:
                tail = buf.find(b"\r\n", start)
                if tail < 0:
                    return None
                if tail == start:
                    return status, bytes(body), tail + 2, close
                start = tail + 2
        if len(buf) < start + size + 2:
            return None
        body += buf[start:start + size]
        pos = start + size + 2
