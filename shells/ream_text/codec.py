"""REAM 1.0 wire format: line framing with sized payloads, request parsing and reply formatting.

Pure functions and constants; no I/O, no state. The format (issue 15, FACTS.md § 002)::

    server banner      REAM 1.0\\n
    request line       WORD WORD ... \\n            (a trailing \\r is tolerated; empty lines are ignored)
    sized payload      <size bytes of UTF-8>\\n      (after a request line that declares <size>)
    reply line         WORD ... \\n
    sized reply        WORD ... <size>\\n<size bytes>\\n

A payload is one line: its length is checked against the declared size when its ``\\n`` arrives, so a
payload shorter or longer than declared is answered (``... NON ... "Invalid message, provided size (N)
is different from content size (M)"``) and the next line is a request again, never swallowed. JSON
never needs a raw newline (newlines in strings are escaped), so this loses nothing.
"""

import json
import logging
import re
import uuid

import msgspec
from bson import json_util
from bson.json_util import RELAXED_JSON_OPTIONS

from riverbed.engine.record import json_within_depth, max_depth

from riverbed.engine.errors import RiverbedError, UniqueViolation
from riverbed.shells.ream_text.expr import ExprError
from riverbed.shells.broker.session import State

log = logging.getLogger("riverbed.ream")

BANNER = b"REAM 1.0\n"
PING = b"PING\n"
PONG = b"PONG\n"
PUBLISH_PREFIX = b"EVENT PUBLISH "     # the request the publish-run fast path looks for (wire.ream_publish_run)

DEFAULT_MAX_PAYLOAD = 4 << 20     # bytes: the default --ream-max-payload
MAX_LINE = 64 << 10               # bytes: a request line longer than this closes the connection
PONG_TIMEOUT = 5.0                # seconds a keep-alive PING waits for PONG before the connection closes

NAME_RE = re.compile(r"[A-Za-z][A-Za-z0-9_]{2,19}\Z")
FIELD_RE = re.compile(r"[A-Za-z][A-Za-z0-9_]{0,63}\Z")
INT_RE = re.compile(r"-?[0-9]{1,19}\Z")
SIZE_RE = re.compile(r"[0-9]{1,12}\Z")
UUID_DASHED_RE = re.compile(r"[0-9A-Fa-f]{8}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{12}\Z")
UUID_HEX_RE = re.compile(r"[0-9A-Fa-f]{32}\Z")

INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1

# request kinds by their two leading words: (noun, verb) -> (past form for NON replies, payload count)
EVENT, AGGREGATE, PROJECTION = "EVENT", "AGGREGATE", "PROJECTION"
COMMANDS = {
    (EVENT, "PUBLISH"): "PUBLISHED",
    (EVENT, "SUBSCRIBE"): "SUBSCRIBED",
    (EVENT, "UNSUBSCRIBE"): "UNSUBSCRIBED",
    (EVENT, "LIST"): "LISTED",
    (EVENT, "REMOVE"): "REMOVED",
    (AGGREGATE, "SET"): "SET",
    (AGGREGATE, "GET"): "GOT",
    (AGGREGATE, "REMOVE"): "REMOVED",
    (AGGREGATE, "LIST"): "LISTED",
    (PROJECTION, "CREATE"): "CREATED",
    (PROJECTION, "SET"): "SET",
    (PROJECTION, "SELECT"): "SELECTED",
    (PROJECTION, "UPDATE"): "UPDATED",
    (PROJECTION, "DELETE"): "DELETED",
    (PROJECTION, "DROP"): "DROPPED",
}
# where the sizes of the payload(s) are in the request's words (index into line.split())
SIZE_POSITIONS = {
    (EVENT, "PUBLISH"): (3,),
    (AGGREGATE, "SET"): (4,),
    (PROJECTION, "SET"): (3,),
    (PROJECTION, "SELECT"): (3,),
    (PROJECTION, "DELETE"): (3,),
    (PROJECTION, "UPDATE"): (3, 4),
}


# connection states: the session kernel's (a REAM connection is open from its banner on)
ST_OPEN, ST_CLOSING, ST_CLOSED = State.OPEN, State.CLOSING, State.CLOSED

# request kinds, for ordering effects within a connection (see session.py)
K_READ, K_WRITE, K_NEUTRAL = "read", "write", "neutral"
KINDS = {
    (EVENT, "SUBSCRIBE"): K_READ, (EVENT, "LIST"): K_READ, (AGGREGATE, "GET"): K_READ,
    (AGGREGATE, "LIST"): K_READ, (PROJECTION, "SELECT"): K_READ,
    (EVENT, "UNSUBSCRIBE"): K_WRITE,   # after its SUBSCRIBE has resolved (reads in flight)
}   # everything else: K_WRITE; PING: answered in place

USAGE = {
    (EVENT, "PUBLISH"): "EVENT PUBLISH <stream> <size>",
    (EVENT, "SUBSCRIBE"): "EVENT SUBSCRIBE <stream> <first-id>",
    (EVENT, "UNSUBSCRIBE"): "EVENT UNSUBSCRIBE <stream>",
    (EVENT, "LIST"): "EVENT LIST",
    (EVENT, "REMOVE"): "EVENT REMOVE <stream>",
    (AGGREGATE, "SET"): "AGGREGATE SET <name> <id> <size>",
    (AGGREGATE, "GET"): "AGGREGATE GET <name> <id>",
    (AGGREGATE, "REMOVE"): "AGGREGATE REMOVE <name> <id>",
    (AGGREGATE, "LIST"): "AGGREGATE LIST",
    (PROJECTION, "CREATE"): "PROJECTION CREATE <name> <n> <field>...",
    (PROJECTION, "SET"): "PROJECTION SET <name> <size>",
    (PROJECTION, "SELECT"): "PROJECTION SELECT <name> <size>",
    (PROJECTION, "UPDATE"): "PROJECTION UPDATE <name> <size1> <size2>",
    (PROJECTION, "DELETE"): "PROJECTION DELETE <name> <size>",
    (PROJECTION, "DROP"): "PROJECTION DROP <name>",
}


class ReamError(Exception):
    """A request the server refuses; ``reason`` goes to the client in quotes; ``rejected``, when set, is
    the ``riverbed_rejected_total`` reason the refusal counts under (``"depth"``, ...)."""

    def __init__(self, reason, rejected=None):
        super().__init__(reason)
        self.reason = reason
        self.rejected = rejected


def usage_error(key):
    return ReamError(f"Invalid request: expected {USAGE[key]}")


def reason_of(exc):
    """The client-facing reason of an error from a request (ReamError, ExprError, engine errors)."""
    if isinstance(exc, ReamError):
        return exc.reason
    if isinstance(exc, ExprError):
        return f"Invalid update: {exc}"
    if isinstance(exc, UniqueViolation):
        return f"Unique constraint violated: {exc}"
    if isinstance(exc, RiverbedError):
        return str(exc) or type(exc).__name__
    log.error("unexpected error: %r", exc)
    return f"Internal error: {type(exc).__name__}"


def quote(text):
    """A reason or string value as a double-quoted token (JSON string escaping, so it stays one line)."""
    return json.dumps(str(text), ensure_ascii=False)


def line(*words):
    """One reply line as bytes."""
    return (" ".join(str(w) for w in words) + "\n").encode("utf-8")


def sized(head, payload):
    """A reply with a payload: ``head <size>\\n<payload>\\n`` (size in UTF-8 bytes)."""
    if isinstance(payload, str):
        payload = payload.encode("utf-8")
    return b"%s %d\n%s\n" % (head.encode("utf-8"), len(payload), payload)


def error_line(reason):
    return line("ERROR", quote(reason))


def non(noun, past, name, reason, *extra):
    """The refusal form of a command: ``NOUN NON PAST name [extra...] "reason"``."""
    words = [noun, "NON", past]
    if name is not None:
        words.append(name)
    words.extend(extra)
    words.append(quote(reason))
    return line(*words)


def size_mismatch_reason(declared, actual):
    return f"Invalid message, provided size ({declared}) is different from content size ({actual})"


def check_name(name, what="name"):
    """Raise ReamError unless ``name`` is a REAM name: ``[A-Za-z][A-Za-z0-9_]*``, 3..20 characters."""
    if not NAME_RE.match(name):
        raise ReamError(f"Invalid {what} {name!r}: 3-20 characters, a letter then letters, digits or _")


BARE_STREAM_RE = re.compile(r'[^\s"]+\Z')


_ASCII_SPACE = frozenset(" \t\n\r\x0b\x0c")


def split_words(text):
    """The words of a request line, split on whitespace; a word that starts with ``"`` runs to its closing
    quote (JSON string escapes inside), so a quoted stream name may hold spaces. Quoted words are kept
    as written (with their quotes): :func:`stream_name` decodes them. ReamError for an unclosed quote."""
    words = []
    i, n = 0, len(text)
    # ASCII whitespace only, as the line is framed: str.isspace() is also true of \x1c-\x1f and Unicode
    # spaces, and a line of those alone would have had no words at all
    while i < n:
        if text[i] in _ASCII_SPACE:
            i += 1
            continue
        if text[i] == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            if j >= n:
                raise ReamError("Invalid request: a quoted name has no closing quote")
            words.append(text[i:j + 1])
            i = j + 1
            continue
        j = i
        while j < n and text[j] not in _ASCII_SPACE:
            j += 1
        words.append(text[i:j])
        i = j
    return words


def stream_name(word):
    """A stream name token -> the name. Every name the log allows can be written: bare (any characters
    but whitespace, not starting with ``"``: ``orders``, ``invoices-0``, ``auto-ws``) or as a
    double-quoted JSON string (``"my stream"``). ReamError for an empty or malformed one."""
    if word.startswith('"'):
        try:
            name = json.loads(word)
        except ValueError:
            raise ReamError(f"Invalid stream name {word}: a bad quoted string") from None
        if not isinstance(name, str) or not name:
            raise ReamError("Invalid stream name: empty")
        return name
    return word


def name_token(name):
    """A stream name as it goes out in a reply or an EVENT line: bare when it can be read back bare,
    else double-quoted (JSON escaping), so the line keeps its word count."""
    return name if BARE_STREAM_RE.match(name) else quote(name)


def parse_size(word):
    """A declared payload size (int >= 0), or None when ``word`` is not one."""
    return int(word) if word is not None and SIZE_RE.match(word) else None


def parse_id(word):
    """An aggregate id token -> the document id: an integer (int64) as int, a UUID with or without dashes
    as the dashed lower-case string (DESIGN.md, one document namespace). ReamError otherwise."""
    if INT_RE.match(word):
        v = int(word)
        if INT64_MIN <= v <= INT64_MAX:
            return v
    elif UUID_DASHED_RE.match(word) or UUID_HEX_RE.match(word):
        return str(uuid.UUID(word))
    raise ReamError(f"Invalid id {word!r}: a UUID (with or without dashes) or an integer")


def _no_constant(name):
    # Python's json reads NaN/Infinity, which JSON does not have: other protocols' readers would choke
    raise ValueError(f"{name} is not JSON")


_DECODER = json.JSONDecoder(parse_constant=_no_constant)   # made once: json.loads with options makes one per call


def parse_json_object(payload):
    """A payload (bytes) parsed as a JSON object (dict). ReamError "Invalid JSON..." otherwise: not UTF-8,
    nested deeper than the depth limit (``--max-depth``), not JSON, not an object. A payload holding a
    lone surrogate escape (``"\\ud800"``) is valid JSON text and is kept as sent."""
    try:
        text = payload.decode("utf-8")
    except UnicodeDecodeError:
        raise ReamError("Invalid JSON: not UTF-8", "encoding") from None
    if not json_within_depth(text):
        raise ReamError(f"Invalid JSON: nested deeper than the limit of {max_depth()}", "depth")
    try:
        value = _DECODER.decode(text)
    except (ValueError, RecursionError) as e:
        raise ReamError(f"Invalid JSON: {e}") from None
    if not isinstance(value, dict):
        raise ReamError("Invalid JSON: not an object")
    return value


_FAST_OBJECT = msgspec.json.Decoder(dict)


def check_json_object(payload):
    """Raise as :func:`parse_json_object` unless ``payload`` (bytes) is a JSON object: the same inputs
    accepted, the same errors. msgspec's decoder (about 5x faster here) accepts a subset of what
    ``json`` accepts (it also refuses lone surrogate escapes and out-of-range floats, which ``json``
    takes): whatever it refuses, or what is nested too deep, goes through :func:`parse_json_object`,
    which decides and words the error."""
    try:
        _FAST_OBJECT.decode(payload)
    except (msgspec.DecodeError, ValueError, RecursionError):
        parse_json_object(payload)
        return
    if not json_within_depth(payload):
        parse_json_object(payload)


def leading_json_objects(payloads):
    """How many of ``payloads`` (bytes), from the first, :func:`check_json_object` accepts: the count
    before the first it refuses. The loop of a pipelined run, without a call per payload where
    msgspec and the length tell (a text of at most 2 x limit + 1 bytes cannot nest deeper than the limit)."""
    decode = _FAST_OBJECT.decode
    shallow = 2 * max_depth() + 1
    fails = (msgspec.DecodeError, ValueError, RecursionError)
    count = 0
    for payload in payloads:
        try:
            decode(payload)
        except fails:
            try:
                parse_json_object(payload)
            except ReamError:
                return count
        else:
            if len(payload) > shallow and not json_within_depth(payload):
                return count
        count += 1
    return count


_COMPACT = {"separators": (",", ":"), "ensure_ascii": False}


def dumps(value):
    """A stored value (document or list of documents) as compact JSON text. Plain JSON types go through
    ``json``; anything else (a mewbase document's ObjectId, datetime, binary, ...) as relaxed Extended
    JSON, as every JSON protocol renders BSON."""
    try:
        return json.dumps(value, allow_nan=False, **_COMPACT)
    except (TypeError, ValueError):
        return json_util.dumps(value, json_options=RELAXED_JSON_OPTIONS, **_COMPACT)


def format_pk(pk):
    """A projection key as a reply token: an integer as is, a string in double quotes (FACTS § 002)."""
    return str(pk) if isinstance(pk, int) and not isinstance(pk, bool) else quote(pk)
