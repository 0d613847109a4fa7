"""Hypothesis strategies for structurally valid frames of every protocol with hostile values: right
framing, known commands, fields of the right wire type holding what a buggy or hostile client would
put there (nulls where a string is expected, lone surrogates, deep nesting, huge and negative numbers,
wrong BSON types, oversize counts). Each strategy draws one fuzz input (flag byte + body) for the target
of the same name, so ``test_strategies.py`` feeds them to the same invariants as the coverage-guided
fuzzing, and ``runner seed --hypothesis`` can add examples to the corpus.
"""

import json
import struct

from hypothesis import strategies as st

from riverbed.shells import rmq_stream as rs

from . import t_bson, t_rmq, t_ws, t_zmq
from .harness import FLAG_PRELUDE

# --------------------------------------------------------------------------------------- hostile atoms

HOSTILE_TEXT = st.one_of(
    st.sampled_from(["", " ", "\x00", "\x1c", "\ud800", "\udfff", "a" * 300, "../../etc", "%s%n", "é", "\u202e",
                     "s1", "__fuzz_probe", "null", "-1", "9" * 30, "\n", "EVENT", "$where", "$date"]),
    st.text(max_size=12),
)
HOSTILE_INT = st.one_of(
    st.sampled_from([0, -1, 1, 2**31 - 1, -2**31, 2**32, 2**63 - 1, -2**63, 2**64, 10**30]),
    st.integers(min_value=-2**70, max_value=2**70),
)
HOSTILE_FLOAT = st.sampled_from([float("nan"), float("inf"), -float("inf"), 1e308, -0.0, 0.5])


def nested(leaf, depth):
    """A value nested ``depth`` levels (dicts and lists alternating) around ``leaf``."""
    v = leaf
    for i in range(depth):
        v = {"k": v} if i % 2 else [v]
    return v


JSONISH = st.recursive(
    st.one_of(st.none(), st.booleans(), HOSTILE_INT, HOSTILE_TEXT, HOSTILE_FLOAT),
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(HOSTILE_TEXT, inner, max_size=3)),
    max_leaves=8,
)
DEEP = st.builds(nested, st.just(1), st.sampled_from([50, 200, 600, 1200, 5000]))
HOSTILE_VALUE = st.one_of(JSONISH, DEEP)


def _wire_string(s):
    """An RMQ ``string``: None is the null string (-1); text may hold lone surrogates (sent as UTF-8
    with surrogatepass, i.e. invalid UTF-8 on the wire)."""
    if s is None:
        return struct.pack(">h", -1)
    b = s.encode("utf-8", "surrogatepass") if isinstance(s, str) else s
    return struct.pack(">h", len(b)) + b


RMQ_STR = st.one_of(st.none(), HOSTILE_TEXT, st.binary(max_size=8))


@st.composite
def rmq(draw):
    """One or more RabbitMQ Stream frames of known keys with hostile fields, after the handshake."""
    s = _wire_string
    frames = []
    for _ in range(draw(st.integers(1, 3))):
        c = t_rmq.corr(draw(st.integers(0, 2**32 - 1)))
        props = b"".join(s(draw(RMQ_STR)) + s(draw(RMQ_STR)) for _ in range(draw(st.integers(0, 2))))
        nprops = struct.pack(">i", draw(st.sampled_from([0, 1, 2, -1, 2**31 - 1])))
        name = s(draw(RMQ_STR))
        offset = struct.pack(">H", draw(st.sampled_from([1, 2, 3, 4, 5, 6, 0, 9]))) + struct.pack(">q", draw(st.integers(-2**63, 2**63 - 1)))
        body = draw(st.sampled_from([
            ("create", rs.CMD_CREATE, c + name + nprops + props),
            ("subscribe", rs.CMD_SUBSCRIBE, c + bytes([draw(st.integers(0, 255))]) + name + offset
             + struct.pack(">H", draw(st.integers(0, 65535))) + nprops + props),
            ("declare", rs.CMD_DECLARE_PUBLISHER, c + bytes([draw(st.integers(0, 255))]) + s(draw(RMQ_STR)) + name),
            ("peer", rs.CMD_PEER_PROPERTIES, c + nprops + props),
            ("metadata", rs.CMD_METADATA, c + nprops + name),
            ("store", rs.CMD_STORE_OFFSET, s(draw(RMQ_STR)) + name + struct.pack(">q", draw(st.integers(-2**63, 2**63 - 1)))),
            ("query", rs.CMD_QUERY_OFFSET, c + s(draw(RMQ_STR)) + name),
            ("seq", rs.CMD_QUERY_PUBLISHER_SEQUENCE, c + s(draw(RMQ_STR)) + name),
            ("super", rs.CMD_CREATE_SUPER_STREAM, c + name + struct.pack(">i", 1) + s(draw(RMQ_STR))
             + struct.pack(">i", 1) + s(draw(RMQ_STR)) + nprops + props),
            ("route", rs.CMD_ROUTE, c + s(draw(RMQ_STR)) + name),
            ("resolve", rs.CMD_RESOLVE_OFFSET_SPEC, c + name + offset + nprops + props),
            ("credit", rs.CMD_CREDIT, bytes([draw(st.integers(0, 255))]) + struct.pack(">H", draw(st.integers(0, 65535)))),
            ("close", rs.CMD_CLOSE, c + struct.pack(">H", draw(st.integers(0, 65535))) + s(draw(RMQ_STR))),
            ("stats", rs.CMD_STREAM_STATS, c + name),
            ("delete", rs.CMD_DELETE, c + name),
            ("versions", rs.CMD_EXCHANGE_COMMAND_VERSIONS, c + struct.pack(">i", draw(st.integers(-1, 3)))
             + struct.pack(">HHH", draw(st.integers(0, 65535)), draw(st.integers(0, 65535)), draw(st.integers(0, 65535)))),
        ]))
        frames.append(t_rmq.frame(body[1], body[2], version=draw(st.sampled_from([1, 1, 1, 2]))))
    # and a Publish with a hostile sub-batch (a compressed body that inflates, lying sizes)
    if draw(st.booleans()):
        import zlib

        n = draw(st.sampled_from([0, 1, 1000, 100000]))
        inner = b"\x00\x00\x00\x00" * n
        z = zlib.compress(inner, 9)
        usize = draw(st.sampled_from([len(inner), 0, 2**31, len(inner) + 1]))
        nrec = draw(st.sampled_from([n & 0xFFFF, 0, 65535]))
        code = draw(st.sampled_from([0, 1, 2, 3, 4, 5, 7]))
        entry = struct.pack(">QBHII", 1, 0x80 | (code << 4), nrec, usize, len(z)) + z
        frames.append(t_rmq.frame(rs.CMD_DECLARE_PUBLISHER, t_rmq.corr(5) + b"\x01" + _wire_string("") + _wire_string("s1")))
        frames.append(t_rmq.frame(rs.CMD_PUBLISH, struct.pack(">Bi", 1, 1) + entry))
    create = t_rmq.frame(rs.CMD_CREATE, t_rmq.corr(1) + _wire_string("s1") + struct.pack(">i", 0))
    return bytes([FLAG_PRELUDE]) + create + b"".join(frames)


BSON_SCALAR = st.one_of(st.none(), st.booleans(), st.integers(-2**63, 2**63 - 1), HOSTILE_FLOAT,
                        HOSTILE_TEXT.filter(lambda t: "\x00" not in t and not any(0xD800 <= ord(ch) <= 0xDFFF for ch in t)),
                        st.binary(max_size=8))
BSON_VALUE = st.one_of(
    st.recursive(BSON_SCALAR, lambda inner: st.one_of(
        st.lists(inner, max_size=3),
        st.dictionaries(st.sampled_from(["a", "b", "$gt", "$date", "", "rID", "x.y"]), inner, max_size=3)),
        max_leaves=6),
    st.builds(nested, st.just(1), st.sampled_from([50, 99, 101, 200, 600])),
)
BSON_FIELDS = ["rID", "channel", "event", "sessID", "subID", "startPos", "startTimestamp", "durableID", "name",
               "binder", "docID", "queryID", "matcher", "bytes", "pos", "sequence", "type", "version", "username",
               "password", "eventFilter", "identityExpression", "filterName", "documentID"]


@st.composite
def bson_frames(draw):
    """mewbase frames of every known type whose fields hold any BSON type, after CONNECT."""
    out = b""
    for _ in range(draw(st.integers(1, 4))):
        ftype = draw(st.sampled_from(["PUB", "STARTTX", "COMMITTX", "ABORTTX", "SUBSCRIBE", "UNSUBSCRIBE", "SUBCLOSE",
                                      "ACKEV", "QUERY", "QUERYACK", "PING", "FINDBYID", "LISTCHANNELS",
                                      "CREATECHANNEL", "LISTBINDERS", "CREATEBINDER", "CREATEPROJECTION", "CONNECT"]))
        frame = {k: draw(BSON_VALUE) for k in draw(st.lists(st.sampled_from(BSON_FIELDS), max_size=5, unique=True))}
        if ftype == "PUB" and draw(st.booleans()):
            frame.setdefault("channel", "ch")
            frame["event"] = draw(st.dictionaries(st.sampled_from(["a", "b", "c"]), BSON_VALUE, max_size=3))
        try:
            out += t_bson.envelope(ftype, frame)
        except Exception:   # noqa: BLE001 - a value pymongo cannot encode: skip that frame
            pass
    return bytes([FLAG_PRELUDE]) + out


ZMQ_WORD = st.one_of(st.sampled_from([b"", b"ID", b"TTL", b"TOPIC", b"X-OFFSET", b"VERSION", b"MESSAGE", b"X-K",
                                      b"-1", b"0", b"99999999999999999999", b"1e9", b"\xff\xfe", b"t", b"a" * 300]),
                     st.binary(max_size=6))


@st.composite
def zmq(draw):
    msgs = []
    for _ in range(draw(st.integers(1, 4))):
        verb = draw(st.sampled_from([b"CONNECT", b"DISCONNECT", b"SUB", b"UNSUB", b"PUT", b"NOOP"]))
        headers = []
        for _ in range(draw(st.integers(0, 3))):
            headers += [draw(ZMQ_WORD.filter(bool)), draw(ZMQ_WORD)]
        body = draw(st.lists(ZMQ_WORD, max_size=3))
        msgs.append((draw(st.integers(0, 3)), [b"", verb, *headers, b"", *body]))
    return bytes([draw(st.sampled_from([0, FLAG_PRELUDE]))]) + t_zmq.encode_messages(msgs)


WS_FIELDS = ["type", "stream", "partition", "msg", "ts", "pkey", "resendLast", "resendFrom", "resendTo", "sub",
             "authKey", "offset", "sequenceNumber", "publisherId", "msgChainId"]


def _json_text(value):
    try:
        return json.dumps(value, allow_nan=True)
    except (ValueError, RecursionError):
        return "{}"


@st.composite
def ws(draw):
    """Streamr requests of every type whose fields hold any JSON value (lone surrogates escaped)."""
    msgs = []
    for _ in range(draw(st.integers(1, 4))):
        req = {"type": draw(st.one_of(st.sampled_from(["subscribe", "unsubscribe", "publish", "resend"]), HOSTILE_TEXT))}
        for k in draw(st.lists(st.sampled_from(WS_FIELDS), max_size=5, unique=True)):
            req[k] = draw(HOSTILE_VALUE)
        if req["type"] == "publish" and draw(st.booleans()):
            req.setdefault("stream", "s")
            req["msg"] = _json_text(draw(HOSTILE_VALUE))
        msgs.append(_json_text(req))
    return bytes([draw(st.sampled_from([0, FLAG_PRELUDE]))]) + t_ws.encode_messages(msgs)


REAM_WORD = st.one_of(
    st.sampled_from(["EVENT", "AGGREGATE", "PROJECTION", "PUBLISH", "SUBSCRIBE", "UNSUBSCRIBE", "LIST", "REMOVE",
                     "SET", "GET", "CREATE", "SELECT", "UPDATE", "DELETE", "DROP", "PING", "PONG", "abc", "sss",
                     "0", "-1", "99999999999999999999", "1", "5", "\x1c", "\x00", "é", "\ud800", "x" * 30]),
    st.text(min_size=1, max_size=6).filter(lambda w: not any(c.isspace() for c in w)),
)


@st.composite
def ream(draw):
    """REAM request lines of known nouns and verbs with hostile words, sized payloads that may lie."""
    out = b""
    for _ in range(draw(st.integers(1, 4))):
        words = draw(st.lists(REAM_WORD, min_size=1, max_size=6))
        line = " ".join(words).encode("utf-8", "surrogatepass")
        out += line + draw(st.sampled_from([b"\n", b"\r\n"]))
        if draw(st.booleans()):
            payload = _json_text(draw(HOSTILE_VALUE)).encode("utf-8", "surrogatepass")
            out += payload + b"\n"
    return bytes([draw(st.sampled_from([0, FLAG_PRELUDE]))]) + out


@st.composite
def record(draw):
    """Stored records: AMQP messages with hostile content types, properties and bodies (deep JSON and
    BSON, invalid UTF-8), and raw payloads."""
    import bson

    from riverbed.engine import record as rec

    kind = draw(st.sampled_from(["json", "bson", "raw", "text"]))
    if kind == "json":
        body = _json_text(draw(HOSTILE_VALUE)).encode("utf-8", "surrogatepass")
    elif kind == "bson":
        try:
            body = bson.encode({"v": draw(BSON_VALUE)})
        except Exception:   # noqa: BLE001
            body = b"\x05\x00\x00\x00\x00"
    else:
        body = draw(st.binary(max_size=64))
    if kind == "raw":
        return b"\x00" + body
    ct = draw(st.sampled_from([rec.CT_JSON, rec.CT_BSON, None, "text/plain", "application/json; charset=x", ""]))
    props = draw(st.dictionaries(st.text(max_size=5).filter(lambda t: not any(0xD800 <= ord(c) <= 0xDFFF for c in t)),
                                 st.text(max_size=5).filter(lambda t: not any(0xD800 <= ord(c) <= 0xDFFF for c in t)),
                                 max_size=2))
    try:
        return b"\x00" + rec.encode_record(body, ct, draw(st.one_of(st.none(), st.integers(0, 2**62))), props or None)
    except Exception:   # noqa: BLE001 - the encoder refused a value: a raw record instead
        return b"\x00" + body


@st.composite
def chunk(draw):
    """Data sections of simple and sub-batch entries with lying counts and sizes, sealed (right CRC)."""
    import zlib

    entries = b""
    n_entries = n_records = 0
    for _ in range(draw(st.integers(0, 4))):
        if draw(st.booleans()):
            body = draw(st.binary(max_size=16))
            ln = draw(st.sampled_from([len(body), len(body) + 1, 0, 2**31 - 1]))
            entries += struct.pack(">I", ln) + body
            n_entries += 1
            n_records += 1
        else:
            recs = draw(st.lists(st.binary(max_size=8), max_size=4))
            inner = b"".join(struct.pack(">I", len(r)) + r for r in recs)
            code = draw(st.sampled_from([0, 1, 2, 3, 4, 6]))
            body = zlib.compress(inner) if code == 1 else inner
            usize = draw(st.sampled_from([len(inner), len(inner) + 3, 0, 2**32 - 1]))
            entries += struct.pack(">BHII", 0x80 | (code << 4), len(recs), usize, len(body)) + body
            n_entries += 1
            n_records += len(recs)
    n_entries = draw(st.sampled_from([n_entries, n_entries + 1, 0, 65535]))
    n_records = draw(st.sampled_from([n_records, n_records + 1, 0, 65535]))
    return bytes([FLAG_PRELUDE]) + struct.pack(">HH", n_entries, n_records) + entries


@st.composite
def replication(draw):
    """Replication-port frames (shells/cluster/wire.py) of known types whose JSON holds hostile values:
    huge, negative and float counts, nulls and lists where strings or objects go, deep nesting."""
    from riverbed.shells.cluster import wire

    value = st.one_of(HOSTILE_INT, HOSTILE_FLOAT, HOSTILE_TEXT, st.none(), st.booleans(),
                      st.builds(nested, st.integers(0, 3), st.sampled_from([1, 50, 600])))
    frames = b""
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from([wire.HELLO, wire.SEQS, wire.OFFSETS, wire.REFUSE]))
        if kind == wire.HELLO:
            obj = {"node": draw(value), "stream": draw(st.one_of(HOSTILE_TEXT, value)), "epoch": draw(value),
                   "next": draw(value), "last": draw(st.one_of(value, st.lists(value, max_size=4)))}
        elif kind == wire.REFUSE:
            obj = {"reason": draw(value)}
        else:
            obj = draw(st.dictionaries(HOSTILE_TEXT, value, max_size=4))
        try:
            body = json.dumps(obj).encode("utf-8", "surrogatepass")
        except (ValueError, RecursionError):
            body = b"{}"
        frames += wire.frame(kind, body)
        if draw(st.booleans()):
            frames += wire.frame(draw(st.sampled_from([wire.COMMIT, wire.ACK, wire.TRUNCATE])),
                                 draw(st.binary(max_size=10)))
    return bytes([draw(st.sampled_from([0, 2, 4, 6]))]) + frames


STRATEGIES = {"rmq": rmq(), "bson": bson_frames(), "zmq": zmq(), "ws": ws(), "ream": ream(), "record": record(),
              "chunk": chunk(), "replication": replication()}
