"""One check every aiohttp listener (the HTTP listener and the WebSocket JSON listener's REST and upgrade
requests) makes before routing a request: its target and header values must be text UTF-8 can write.

aiohttp reads header bytes that are not UTF-8 with ``surrogateescape``, so a header value of ``\\xff``
becomes a lone surrogate; aiohttp itself then echoes some of them into error texts (an unknown
``Expect``, a bad ``Upgrade``) whose encoding fails, and the client got a 500 after an "Error handling
request" traceback. Such a request is answered 400 here, before aiohttp's own Expect handling and before
any route, middleware or WebSocket handshake sees it. Requests aiohttp's parser itself refuses (400)
no longer log a traceback at ERROR (see :class:`_MalformedRequests`).
"""

import logging

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

BAD_TEXT = "request target or header is not valid UTF-8"

log = logging.getLogger("riverbed.http")


class _MalformedRequests(logging.Filter):
    """aiohttp answers a request its parser refuses (a header name that is not a token, a bad request
    line, ...) with 400 itself, then logs the parser's exception with a traceback at ERROR as "Error
    handling request". That is the client's fault, answered in HTTP's own terms: one debug line here
    instead of the traceback."""

    def filter(self, record):
        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, HttpProcessingError) and 400 <= (exc.code or 0) < 500:
            log.debug("malformed HTTP request refused (%s): %s", exc.code, exc.message)
            return False
        return True


_FILTER = _MalformedRequests()


def _encodable(text):
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def request_text_ok(request):
    """True when the request's target (path and query, as received) and every header name and value
    encode as UTF-8."""
    if not _encodable(request.raw_path):
        return False
    for name, value in request.headers.items():
        if not _encodable(name) or not _encodable(value):
            return False
    return True


def guard_server(server, on_reject=None):
    """Wrap the request handler of ``server`` (an aiohttp ``web.Server``, e.g. ``AppRunner.server``
    after ``setup()``) so a request failing :func:`request_text_ok` is answered 400 with
    ``{"error": "bad_request", "reason": ...}``; ``on_reject()`` is called for each (a metric). Call
    before the server accepts connections."""
    handler = server.request_handler

    async def guarded(request):
        if not request_text_ok(request):
            if on_reject is not None:
                on_reject()
            return web.json_response({"error": "bad_request", "reason": BAD_TEXT}, status=400)
        return await handler(request)
    server.request_handler = guarded
    server_log = logging.getLogger("aiohttp.server")
    if _FILTER not in server_log.filters:
        server_log.addFilter(_FILTER)
