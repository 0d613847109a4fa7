"""Reaching a server from the admin CLI: the ``--uri`` / ``--http-uri`` settings, the rstream connection
and the HTTP JSON API (``/api/streams``, ``/api/stream/consumers``), and the one error type every
command maps to an exit status.

Nothing here speaks the RabbitMQ Stream protocol by hand: :func:`producer` and :func:`consumer` make
the real ``rstream`` client objects; the HTTP calls use aiohttp. Everything is asyncio: call from one
event loop (not thread-safe).
"""

import asyncio
import ipaddress
import logging
from urllib.parse import quote, unquote, urlsplit

EXIT_OK = 0
EXIT_SERVER = 1       # the server answered with an error: no such stream, access refused, bad argument
EXIT_USAGE = 2        # bad flags or values (argparse uses 2 as well)
EXIT_CONNECT = 3      # no server at the address, or it did not answer in time

DEFAULT_URI = "rabbitmq-stream://localhost:5552"
DEFAULT_STREAM_PORT = 5552
DEFAULT_STREAM_TLS_PORT = 5551
DEFAULT_HTTP_PORT = 15692
DEFAULT_USER = "guest"
SCHEME_PLAIN = "rabbitmq-stream"
SCHEME_TLS = "rabbitmq-stream+tls"
SCHEMES = (SCHEME_PLAIN, SCHEME_TLS)
DISCOVER_HEARTBEAT = 0     # the discovery connection lives for one request: no heartbeats


class AdminError(Exception):
    """A failure to report as one line on stderr and exit with ``code`` (one of ``EXIT_*``)."""

    def __init__(self, message, code=EXIT_SERVER):
        super().__init__(message)
        self.code = code


class NoApiError(AdminError):
    """The HTTP listener answered, but without the JSON API route (an older or differently built server)."""


class Target:
    """Where the server is: ``host``, ``port`` (RabbitMQ Stream), ``username``, ``password``, ``vhost``,
    ``http`` (base URL of the JSON API, no trailing slash; None until :func:`http_base` asks the server),
    ``ssl`` (the ``ssl.SSLContext`` of a ``rabbitmq-stream+tls://`` URI, else None: plain) and
    ``https_ssl`` (the context for an ``https://`` JSON API: ``--tls-ca``'s, else None for the system's
    CAs)."""

    __slots__ = ("host", "port", "username", "password", "vhost", "http", "ssl", "https_ssl")

    def __init__(self, host, port, username, password, vhost, http, ssl=None, https_ssl=None):
        self.host = host
        self.port = port
        self.username = username
        self.password = password
        self.vhost = vhost
        self.http = http
        self.ssl = ssl
        self.https_ssl = https_ssl

    def __repr__(self):
        return (f"Target(host={self.host!r}, port={self.port}, username={self.username!r}, "
                f"vhost={self.vhost!r}, http={self.http!r}, tls={self.ssl is not None})")


def _url_host(host):
    try:
        if ipaddress.ip_address(host).version == 6:
            return f"[{host}]"
    except ValueError:
        pass
    return host


def tls_context(ca_file=None):
    """A client ``ssl.SSLContext`` that checks the server's certificate and host name against
    ``ca_file`` (PEM; default: the system's trusted CAs). Raises AdminError (EXIT_USAGE) for an
    unreadable or non-PEM file."""
    import ssl
    try:
        return ssl.create_default_context(cafile=ca_file)
    except (OSError, ssl.SSLError) as e:
        raise AdminError(f"bad --tls-ca {ca_file!r}: {getattr(e, 'strerror', None) or e}", EXIT_USAGE) from None


def parse_uri(uri, http_uri=None, tls_ca=None):
    """A :class:`Target` from ``rabbitmq-stream://[user[:pass]@]host[:port][/vhost]`` or
    ``rabbitmq-stream+tls://...`` (TLS; default port 5551) (user and password percent-decoded; defaults
    guest/guest, port 5552, vhost ``/``), an optional ``http(s)://host:port`` for the JSON API (default:
    asked of the server when first needed, see :func:`http_base`) and an optional CA file to trust for
    TLS (``tls_ca``; default the system's CAs). Raises AdminError (EXIT_USAGE) for a malformed URI."""
    try:
        parts = urlsplit(uri)
        port = parts.port
    except ValueError as e:
        raise AdminError(f"bad --uri {uri!r}: {e}", EXIT_USAGE) from None
    if parts.scheme not in SCHEMES:
        raise AdminError(f"bad --uri {uri!r}: the scheme must be rabbitmq-stream:// or rabbitmq-stream+tls://",
                         EXIT_USAGE)
    if not parts.hostname:
        raise AdminError(f"bad --uri {uri!r}: no host", EXIT_USAGE)
    if parts.query or parts.fragment:
        raise AdminError(f"bad --uri {uri!r}: no query or fragment allowed", EXIT_USAGE)
    username = unquote(parts.username) if parts.username is not None else DEFAULT_USER
    password = unquote(parts.password) if parts.password is not None else (
        DEFAULT_USER if parts.username is None else "")
    path = parts.path.lstrip("/")
    vhost = unquote(path) if path else "/"
    host = parts.hostname
    tls = parts.scheme == SCHEME_TLS
    http = None
    if http_uri is not None:
        try:
            hp = urlsplit(http_uri)
            hp.port
        except ValueError as e:
            raise AdminError(f"bad --http-uri {http_uri!r}: {e}", EXIT_USAGE) from None
        if hp.scheme not in ("http", "https") or not hp.hostname:
            raise AdminError(f"bad --http-uri {http_uri!r}: expected http://host:port", EXIT_USAGE)
        http = f"{hp.scheme}://{hp.netloc.rpartition('@')[2]}{hp.path.rstrip('/')}"
    ca_ctx = tls_context(tls_ca) if tls_ca else None
    stream_ctx = (ca_ctx or tls_context()) if tls else None
    default_port = DEFAULT_STREAM_TLS_PORT if tls else DEFAULT_STREAM_PORT
    return Target(host, port if port is not None else default_port, username, password, vhost, http,
                  stream_ctx, ca_ctx)


async def http_base(target, timeout):
    """The JSON API's base URL: ``--http-uri`` when given, else what the server says in PeerProperties
    (``http-port``, ``http-scheme``) on the ``--uri`` host, so one URI reaches any port layout; a server
    that does not say gets port 15692, a Riverbed without an HTTP listener an AdminError (EXIT_CONNECT).
    Remembered in ``target.http``. Raises AdminError."""
    if target.http is not None:
        return target.http
    from rstream.client import Client
    _quiet_rstream()
    client = Client(target.host, target.port, ssl_context=target.ssl, frame_max=1 << 20,
                    heartbeat=DISCOVER_HEARTBEAT, connection_name="riverbed-admin")
    props = {}
    try:
        await asyncio.wait_for(client.start(), timeout)
        await asyncio.wait_for(client.authenticate(target.vhost, target.username, target.password), timeout)
        props = dict(client.server_properties or {})
    except asyncio.TimeoutError:
        raise AdminError(f"no answer from the server within {timeout:g} s", EXIT_CONNECT) from None
    except Exception as e:
        raise server_error(e) or e
    finally:
        await close_quietly(client)
    port = props.get("http-port")
    if port is None and "riverbed-version" in props:
        # a Riverbed that names no HTTP port has none: never guess a port another server may hold
        raise AdminError("the server's HTTP listener is off (riverbed serve --http-port); listing, stats and "
                         "consumers need it, or --data-dir DIR", EXIT_CONNECT)
    if port is None:        # a server that does not say (another broker, an older Riverbed): the default
        target.http = f"http://{_url_host(target.host)}:{DEFAULT_HTTP_PORT}"
    else:
        scheme = "https" if props.get("http-scheme") == "https" else "http"
        target.http = f"{scheme}://{_url_host(target.host)}:{port}"
    return target.http


# ---- RabbitMQ Stream, through rstream --------------------------------------------------------------------

def server_error(exc, stream=None):
    """An AdminError for an rstream or socket exception (the one-line messages the CLI prints)."""
    from rstream import exceptions as rx
    what = f"stream {stream!r}" if stream else "the stream"
    if isinstance(exc, AdminError):
        return exc
    if isinstance(exc, rx.StreamDoesNotExist):
        return AdminError(f"{what} does not exist")
    if isinstance(exc, rx.StreamAlreadyExists):
        return AdminError(f"{what} already exists")
    if isinstance(exc, (rx.AuthenticationFailure, rx.SASLAuthenticationFailureLoopback, rx.SASLError)):
        return AdminError("authentication failed (check the user and password in --uri)")
    if isinstance(exc, rx.AccessRefused):
        return AdminError(f"access to {what} refused for this user")
    if isinstance(exc, rx.VirtualHostAccessFailure):
        return AdminError("access to the virtual host refused")
    if isinstance(exc, rx.PreconditionFailed):
        return AdminError(f"the server refused the arguments for {what}")
    if isinstance(exc, rx.ServerError):
        return AdminError(f"the server answered {type(exc).__name__}")
    if isinstance(exc, (OSError, asyncio.TimeoutError, rx.ClientError, ConnectionError)):
        return AdminError(f"cannot reach the server: {exc or type(exc).__name__}", EXIT_CONNECT)
    return None


def _quiet_rstream():
    # rstream logs the server's Close and reconnect attempts with tracebacks; without a handler of its
    # own Python would print them on stderr. The CLI reports what matters itself, in one line.
    log = logging.getLogger("rstream")
    if not log.handlers:
        log.addHandler(logging.NullHandler())
        log.propagate = False


def _client_kw(target):
    _quiet_rstream()
    return dict(username=target.username, password=target.password, vhost=target.vhost,
                connection_name="riverbed-admin")


def producer(target, **kw):
    """A not yet started ``rstream.Producer`` for ``target`` (use ``async with``)."""
    from rstream import Producer
    return Producer(target.host, target.port, max_retries=1, ssl_context=target.ssl, **_client_kw(target), **kw)


def consumer(target, **kw):
    """A not yet started ``rstream.Consumer`` for ``target`` (use ``async with``)."""
    from rstream import Consumer
    return Consumer(target.host, target.port, max_retries=1, ssl_context=target.ssl, **_client_kw(target), **kw)


async def start(client, timeout):
    """``await client.start()`` (an rstream Producer or Consumer) within ``timeout`` seconds: a server
    that accepts but never answers the handshake is a connection failure. Raises AdminError."""
    try:
        await asyncio.wait_for(client.start(), timeout)
    except asyncio.TimeoutError:
        raise AdminError(f"no answer from the server within {timeout:g} s", EXIT_CONNECT) from None
    except Exception as e:
        raise server_error(e) or e


async def close_quietly(client, timeout=5.0):
    """Close an rstream Producer or Consumer, ignoring its errors: after the server deleted the stream
    or went away, rstream 1.1.1's close can raise (KeyError in unsubscribe) or wait on a dead socket,
    and by then the command has its outcome already."""
    try:
        await asyncio.wait_for(client.close(), timeout)
    except Exception:
        pass


# ---- the HTTP JSON API -----------------------------------------------------------------------------------

async def http_get(target, path, params=None, timeout=10.0, stream=None):
    """GET ``target.http + path`` with basic auth and return the decoded JSON.

    Raises AdminError: EXIT_SERVER for 404 (``stream`` names what was missing), 401/403 and other
    error statuses (with the server's ``reason`` when its body has one); EXIT_CONNECT when nothing
    answers or the body is not JSON."""
    import aiohttp
    url = await http_base(target, timeout) + path
    auth = aiohttp.BasicAuth(target.username, target.password)
    ssl = target.https_ssl if url.startswith("https:") else None     # None: aiohttp's default checks
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout)) as session:
            async with session.get(url, params=params, auth=auth, ssl=ssl) as resp:
                text = await resp.text()
                status = resp.status
    except (aiohttp.ClientError, OSError, asyncio.TimeoutError) as e:
        raise AdminError(f"cannot reach the HTTP API at {target.http} ({e or type(e).__name__}); "
                         f"is the server's --http-port on? (--http-uri names another)", EXIT_CONNECT) from None
    import json
    body = None
    try:
        body = json.loads(text) if text else None
    except ValueError:
        if status < 400:
            raise AdminError(f"{url} did not answer JSON (HTTP {status})", EXIT_CONNECT) from None
    if status == 404:
        # a JSON body is the API's own answer; aiohttp's plain-text 404 means the route itself is missing
        if stream is not None and body is not None:
            raise AdminError(f"stream {stream!r} does not exist")
        raise NoApiError(f"{url}: not found (HTTP 404); does this server have the JSON API?")
    reason = body.get("reason") if isinstance(body, dict) else None
    if status in (401, 403):
        raise AdminError(reason or f"the HTTP API refused the user {target.username!r} (HTTP {status})")
    if status >= 400:
        raise AdminError(f"{url}: HTTP {status}" + (f": {reason}" if reason else ""))
    return body


def stream_path(name):
    """``/api/streams/<name>`` with the name percent-encoded (a stream name may hold ``/``)."""
    return "/api/streams/" + quote(name, safe="")
