"""mc0 framing (MCollective over ZeroMQ), pure functions: frame lists in, requests out, replies as frame lists.

A request, as the ROUTER hands it over after the routing identity (the DEALER sends the empty delimiter
first)::

    ["", VERB, K1, V1, ..., Kn, Vn, "", P1, P2, ...]

Header names are case-sensitive upper-case byte strings, values are opaque; the headers run to the next
empty frame, everything after it is the body (any frames, empty and binary ones included). The empty
frame and the body are optional. Every reply starts with the empty delimiter too: ``["", VERB, ...]``.

Every function here is pure and thread-safe. :func:`parse_request` raises :class:`RequestError` (with a
text for the client and the request's ``ID`` when one could be read) and never anything else for any list
of byte strings.
"""

from riverbed.engine import record as _record

VERB_CONNECT = b"CONNECT"
VERB_DISCONNECT = b"DISCONNECT"
VERB_SUB = b"SUB"
VERB_UNSUB = b"UNSUB"
VERB_PUT = b"PUT"
VERB_NOOP = b"NOOP"
VERB_OK = b"OK"
VERB_ERROR = b"ERROR"
VERB_MESSAGE = b"MESSAGE"
VERBS = frozenset((VERB_CONNECT, VERB_DISCONNECT, VERB_SUB, VERB_UNSUB, VERB_PUT, VERB_NOOP))

HDR_ID = b"ID"
HDR_TTL = b"TTL"
HDR_VERSION = b"VERSION"
HDR_TOPIC = b"TOPIC"
HDR_MESSAGE = b"MESSAGE"
HDR_OFFSET = b"X-OFFSET"     # SUB: replay the topic's stream from this offset (0 = first), then live;
                             # MESSAGE: the record's offset (resume with SUB X-OFFSET offset+1)
HDR_CONTENT_TYPE = b"X-CONTENT-TYPE"   # MESSAGE: what the body is (application/json, application/bson, ...)
_SERVER_HEADERS = frozenset(("X-OFFSET", "X-CONTENT-TYPE"))   # MESSAGE's own: a PUT's headers of these names
                                                              # are not repeated
_KIND_TYPES = {_record.KIND_JSON: _record.CT_JSON.encode(), _record.KIND_BSON: _record.CT_BSON.encode()}
_CT_OCTET = _record.CT_OCTET.encode()

DELIM = b""
FRAMES_NOOP = [DELIM, VERB_NOOP]
MAX_ERROR_TEXT = 400         # bytes of an echoed client value in an error text


class RequestError(ValueError):
    """A request the protocol cannot accept. ``text`` goes to the client in ERROR; ``id`` is the
    request's ID header (bytes) when it could be read, else None."""

    def __init__(self, text, id=None):
        super().__init__(text)
        self.text = text
        self.id = id


class Request:
    """A parsed request: ``verb`` (bytes), ``headers`` (list of (name, value) bytes pairs, in order,
    ``ID`` included), ``body`` (list of bytes frames; for SUB/UNSUB the topics), ``id`` (bytes or None)."""

    __slots__ = ("verb", "headers", "body", "id")

    def __init__(self, verb, headers, body, id):
        self.verb = verb
        self.headers = headers
        self.body = body
        self.id = id

    def header(self, name, default=None):
        """The value of the last header called ``name`` (bytes), or ``default``."""
        for k, v in reversed(self.headers):
            if k == name:
                return v
        return default

    def __repr__(self):
        return f"Request({self.verb!r}, {self.headers!r}, {len(self.body)} body frames)"


def shown(value):
    """A client-supplied byte string as text for an error message (bounded, never raises)."""
    text = bytes(value[:MAX_ERROR_TEXT]).decode("utf-8", "replace")
    return text + ("..." if len(value) > MAX_ERROR_TEXT else "")


def _find_id(frames, start, end):
    # best effort for an ERROR reply: the value after the first ID name at a header position
    for i in range(start, end - 1, 2):
        if frames[i] == HDR_ID:
            return bytes(frames[i + 1])
    return None


def parse_request(frames):
    """Split ``frames`` (the message after the routing identity; bytes-like each) into a :class:`Request`.

    Raises RequestError for a message without the leading empty delimiter, a lone delimiter (or an empty
    verb), an odd number of header frames and an unknown verb.
    """
    n = len(frames)
    if n == 0 or len(frames[0]) != 0:
        raise RequestError("malformed message: it must begin with an empty delimiter frame")
    if n == 1 or len(frames[1]) == 0:
        raise RequestError("malformed message: no verb after the empty delimiter frame")
    verb = bytes(frames[1])
    end = 2
    while end < n and len(frames[end]) != 0:
        end += 1
    if (end - 2) % 2:
        raise RequestError(f"malformed message: odd number of header frames ({end - 2}) after {shown(verb)}",
                           _find_id(frames, 2, end))
    headers = [(bytes(frames[i]), bytes(frames[i + 1])) for i in range(2, end, 2)]
    rid = None
    for k, v in headers:
        if k == HDR_ID:
            rid = v
    if verb not in VERBS:
        raise RequestError(f"Unknown verb '{shown(verb)}'", rid)
    body = [bytes(f) for f in frames[end + 1:]]
    return Request(verb, headers, body, rid)


def encode_ok(rid):
    """``["", "OK", "ID", rid]``."""
    return [DELIM, VERB_OK, HDR_ID, rid]


def encode_error(text, rid=None):
    """``["", "ERROR", "MESSAGE", text]`` plus ``"ID", rid`` when the request had one."""
    out = [DELIM, VERB_ERROR, HDR_MESSAGE, text.encode("utf-8") if isinstance(text, str) else text]
    if rid is not None:
        out += [HDR_ID, rid]
    return out


def encode_message(headers, body):
    """``["", "MESSAGE", K1, V1, ..., "", body...]`` from (name, value) bytes pairs and body frames."""
    out = [DELIM, VERB_MESSAGE]
    for k, v in headers:
        out.append(k)
        out.append(v)
    out.append(DELIM)
    out.extend(body)
    return out


def parse_ms(value):
    """A TTL in ms (decimal digits, > 0) as int. Raises ValueError."""
    if not value or not value.isdigit() or len(value) > 12:
        raise ValueError("not a positive integer")
    v = int(value)
    if v <= 0:
        raise ValueError("must be > 0")
    return v


def parse_offset(value):
    """An X-OFFSET (decimal digits, >= 0) as int. Raises ValueError."""
    if not value or not value.isdigit() or len(value) > 19:
        raise ValueError("not a non-negative integer")
    return int(value)


def topic_name(topic):
    """A topic frame as the stream name (UTF-8, 1..255 bytes). Raises ValueError."""
    if not topic:
        raise ValueError("empty topic")
    if len(topic) > 255:
        raise ValueError("topic over 255 bytes")
    return topic.decode("utf-8")   # UnicodeDecodeError is a ValueError


# ------------------------------------------------------------------------ stored records (DESIGN.md)

def put_record(headers, body):
    """The stored record of a PUT: an AMQP 1.0 message, content-type application/octet-stream, one data
    section per body frame (one empty section when there is no body: a message needs one), every header
    but ``ID`` as an application property in order (UTF-8 values as strings, others as binary). ``TOPIC``
    is left out when it is the first of them, as MESSAGE puts it first anyway; a TOPIC after another
    header is kept so that MESSAGE repeats the PUT's header order exactly.

    Raises RequestError for a header name that is not UTF-8.
    """
    props = {}
    first = True
    for k, v in headers:
        if k == HDR_ID:
            continue
        if first and k == HDR_TOPIC:
            first = False
            continue
        first = False
        try:
            name = k.decode("utf-8")
        except UnicodeDecodeError:
            raise RequestError(f"header name {shown(k)!r} is not UTF-8") from None
        try:
            props[name] = v.decode("utf-8")
        except UnicodeDecodeError:
            props[name] = v
    return _record.encode_record(body or [b""], _record.CT_OCTET, None, props or None)


def _header_value(v):
    if isinstance(v, bytes):
        return v
    if isinstance(v, str):
        return v.encode("utf-8")
    if isinstance(v, bool):
        return b"true" if v else b"false"
    return str(v).encode("utf-8")


def record_message(topic, raw, offset):
    """MESSAGE frames for the stored record at ``offset`` (int) of stream ``topic`` (bytes): ``TOPIC``
    first (unless the record keeps it among its properties), the application properties as headers,
    then ``X-OFFSET`` (the record's offset: a reader resumes with ``SUB X-OFFSET <offset+1>``) and
    ``X-CONTENT-TYPE`` (the stored content type, else what the payload is: ``application/json``,
    ``application/bson`` or ``application/octet-stream``), the data sections (or the raw record) as
    body frames."""
    rec = _record.decode_record(raw)
    props = rec.app_properties
    out = [DELIM, VERB_MESSAGE]
    if "TOPIC" not in props:
        out.append(HDR_TOPIC)
        out.append(topic)
    for k, v in props.items():
        if k in _SERVER_HEADERS:
            continue
        out.append(str(k).encode("utf-8"))
        out.append(_header_value(v))
    out.append(HDR_OFFSET)
    out.append(b"%d" % offset)
    out.append(HDR_CONTENT_TYPE)
    out.append(rec.content_type.encode("utf-8", "replace") if rec.content_type
               else _KIND_TYPES.get(rec.kind, _CT_OCTET))
    out.append(DELIM)
    out.extend(rec.sections)
    return out
