"""TLS for the listeners of ``riverbed serve``: one server-side ``ssl.SSLContext`` built from
``--tls-cert``/``--tls-key`` (and ``--tls-ca`` to require client certificates), shared by every
listener that speaks TLS.

Which listener does what when a certificate is given:

- RabbitMQ Stream keeps its plain port (``--stream-port``, 5552) and adds a TLS port
  (``--stream-tls-port``, 5551), as RabbitMQ does; a client of the TLS port is advertised the TLS port.
- BSON/TCP, REAM text, WebSocket (``wss://``) and HTTP (``https://``) switch their one port to TLS.
- ZeroMQ is not affected: it has CURVE (``--zmq-curve-secret``), not TLS.

A client that does not complete the TLS handshake (a plaintext client, a client without an accepted
certificate when ``--tls-ca`` is given) is closed before any session exists, and one line says why
(:class:`TlsServer`); the other connections of the listener are not affected.
"""

import asyncio
import logging
import os
import socket
import ssl

log = logging.getLogger("riverbed.tls")

MIN_VERSION = ssl.TLSVersion.TLSv1_2
HANDSHAKE_TIMEOUT = 10.0       # seconds a new connection has to complete the TLS handshake
# what a client that connected and left (a port probe, a health check) ends in: not worth an info line
_QUIET_REASONS = ("UNEXPECTED_EOF_WHILE_READING", "EOF occurred")


class TlsError(ValueError):
    """A TLS setting is missing or a certificate, key or CA file cannot be used; the message names the
    setting and the file. ``riverbed serve`` reports it on one line and exits 2."""


def server_context(cert, key, ca=None):
    """A server ``ssl.SSLContext``: TLS 1.2 or newer, Python's default (secure) cipher choice, the
    certificate chain ``cert`` (PEM) with its private key ``key`` (PEM, unencrypted); with ``ca`` (a PEM
    bundle), a client must present a certificate signed by it (CERT_REQUIRED).

    Raises TlsError naming the file when one is missing, unreadable or does not fit. The context is
    safe to share between listeners and threads once built.
    """
    for path, flag in ((cert, "--tls-cert"), (key, "--tls-key"), (ca, "--tls-ca")):
        if path and not os.path.isfile(path):
            raise TlsError(f"{flag} {path}: no such file")
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.minimum_version = MIN_VERSION
    asked = []

    def no_password():      # else OpenSSL would prompt on the terminal: a service must not wait there
        asked.append(True)
        return b""
    try:
        ctx.load_cert_chain(cert, key, password=no_password)
    except ssl.SSLError as e:       # before OSError: SSLError is one
        if asked:
            raise TlsError(f"--tls-key {key} is encrypted; give an unencrypted key (file mode 0600)") from None
        raise TlsError(f"--tls-cert {cert} / --tls-key {key}: not a PEM certificate and its matching "
                       f"unencrypted private key ({e.reason or e})") from None
    except OSError as e:
        raise TlsError(f"cannot read --tls-cert {cert} / --tls-key {key}: {e.strerror or e}") from None
    if ca:
        try:
            ctx.load_verify_locations(cafile=ca)
        except ssl.SSLError as e:
            raise TlsError(f"--tls-ca {ca}: not a PEM CA bundle ({e.reason or e})") from None
        except OSError as e:
            raise TlsError(f"cannot read --tls-ca {ca}: {e.strerror or e}") from None
        ctx.verify_mode = ssl.CERT_REQUIRED
    return ctx


def context_for(config):
    """The server context of a resolved ``riverbed serve`` Config, or None when TLS is not configured
    (``config`` None or no ``tls_cert``). Built once per Config and then cached on it, so every listener
    shares one context. Raises TlsError for a key or CA without a certificate, a certificate without a
    key, or a file that cannot be used."""
    if config is None:
        return None
    cached = config.__dict__.get("_tls_context", False)
    if cached is not False:
        return cached
    cert, key, ca = (getattr(config, name, None) for name in ("tls_cert", "tls_key", "tls_ca"))
    if not cert:
        if key or ca:
            raise TlsError("--tls-key and --tls-ca need --tls-cert")
        ctx = None
    elif not key:
        raise TlsError("--tls-cert needs --tls-key")
    else:
        ctx = server_context(cert, key, ca)
    config.__dict__["_tls_context"] = ctx
    return ctx



class TlsServer:
    """A listening TLS server like the ``asyncio.Server`` of ``loop.create_server(factory, host, port,
    ssl=ctx)`` (``sockets``, ``close()``), except that a client that fails the handshake (plaintext, no or
    an untrusted client certificate, too slow) is logged in one line: at info with the peer, the listener
    name and OpenSSL's reason, at debug when it connected and left without a word (a port probe).
    ``loop.create_server(ssl=...)`` drops those silently unless the loop runs in debug mode. The
    protocol from ``factory`` sees ``connection_made`` only after a successful handshake.

    Create it with :func:`create_server`. Loop-thread only.
    """

    def __init__(self, sockets, factory, ctx, listener, timeout):
        self.sockets = sockets
        self.factory = factory
        self.ctx = ctx
        self.listener = listener
        self.timeout = timeout
        self._handshakes = set()        # the loop keeps only weak references to tasks
        self._accepting = [asyncio.get_running_loop().create_task(self._accept(sock)) for sock in sockets]

    async def _accept(self, sock):
        loop = asyncio.get_running_loop()
        while True:
            try:
                conn, peer = await loop.sock_accept(sock)
            except asyncio.CancelledError:
                raise
            except OSError as e:    # out of file descriptors, ...: keep the listener, try again shortly
                log.warning("%s listener: accept failed: %s", self.listener, e)
                await asyncio.sleep(0.1)
                continue
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            task = loop.create_task(self._handshake(conn, peer))
            self._handshakes.add(task)
            task.add_done_callback(self._handshakes.discard)

    async def _handshake(self, conn, peer):
        try:
            await asyncio.get_running_loop().connect_accepted_socket(
                self.factory, conn, ssl=self.ctx, ssl_handshake_timeout=self.timeout)
        except asyncio.CancelledError:
            conn.close()
            raise
        except (OSError, asyncio.TimeoutError) as e:
            conn.close()
            reason = getattr(e, "reason", None) or str(e) or type(e).__name__
            quiet = isinstance(e, (ConnectionError, asyncio.TimeoutError)) or any(q in reason for q in _QUIET_REASONS)
            log.log(logging.DEBUG if quiet else logging.INFO, "%s:%s: TLS handshake failed on the %s listener "
                    "(%s); connection closed", peer[0], peer[1], self.listener, reason)

    def is_serving(self):
        return any(not t.done() for t in self._accepting)

    def close(self):
        """Stop accepting and close the listening sockets; connections already made are not touched,
        handshakes in progress are abandoned."""
        for task in self._accepting + list(self._handshakes):
            task.cancel()
        for sock in self.sockets:
            sock.close()


async def create_server(factory, host, port, ctx, listener, *, backlog=100, timeout=HANDSHAKE_TIMEOUT):
    """Bind ``host:port`` (0 = any free port; a name may give several addresses, each bound, as
    ``loop.create_server`` does) and serve ``factory``'s protocols over TLS with ``ctx``; returns the
    :class:`TlsServer`. ``listener`` names it in the log. Raises OSError when an address cannot be bound."""
    loop = asyncio.get_running_loop()
    infos = await loop.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    sockets = []
    try:
        for family, type_, proto, _, addr in dict.fromkeys(infos):
            sock = socket.socket(family, type_, proto)
            sockets.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)    # as asyncio does
            sock.bind(addr)
            sock.listen(backlog)
            sock.setblocking(False)
    except BaseException:
        for sock in sockets:
            sock.close()
        raise
    return TlsServer(sockets, factory, ctx, listener, timeout)
