"""REAM's publish-run fast path: ``wire.ream_publish_run`` (shells/ream.pxi / shells/_pyream.py) and the
session that uses it.

The splitter's twins must agree on any input, its golden bytes are spelled out, and a session with the
fast path must answer any pipelined mix of good and bad requests, in one buffer or in pieces, with
exactly the bytes (and store exactly the events) of the per-request path.
"""

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from riverbed.shells import _pyream, _pywire, wire
from riverbed.shells.auth import Authenticator, add_user
from riverbed.shells.ream_text import codec as C
from riverbed.shells.ream_text import session as S

from .test_ream_session import Harness, publish, sized

run_py = _pyream.ream_publish_run
LIMIT = 1 << 20


def both(buf, pos=0, max_payload=LIMIT, max_count=1 << 30):
    """The twins' result, which must agree."""
    expected = run_py(buf, pos, max_payload, max_count)
    assert wire.ream_publish_run(buf, pos, max_payload, max_count) == expected
    assert _pywire.ream_publish_run is run_py
    return expected


# ---- golden bytes ---------------------------------------------------------------------------------------

GOLDEN = bytes.fromhex(
    "4556454e54205055424c49534820"   # "EVENT PUBLISH "                               0..13
    "616263"                         # stream name "abc"                             14..16
    "20" "37" "0a"                   # " 7\n": the declared size                      17..19
    "7b2261223a317d" "0a"            # '{"a":1}' and its newline                     20..27
    "4556454e54205055424c49534820"   # "EVENT PUBLISH "                              28..41
    "616263" "20" "3032" "0a"        # "abc 02\n": leading zeros are a size as well 42..48
    "7b7d" "0a"                      # '{}' newline: ends at 52                      49..51
    "4556454e54205055424c49534820"   # "EVENT PUBLISH "                              52..65
    "616264" "20" "32" "0a"          # "abd 2\n": another stream ends the run
    "7b7d" "0a"
)


def test_golden_run():
    assert both(GOLDEN) == (b"abc", [b'{"a":1}', b"{}"], [28, 52])
    assert both(GOLDEN, 52) == (b"abd", [b"{}"], [len(GOLDEN)])
    assert both(GOLDEN, 0, LIMIT, 1) == (b"abc", [b'{"a":1}'], [28])
    assert both(bytearray(GOLDEN)) == both(GOLDEN)
    assert both(memoryview(GOLDEN)) == both(GOLDEN)


@pytest.mark.parametrize("data", [
    b"",
    b"EVENT PUBLISH abc 7\n{\"a\":1}",          # the payload's newline has not arrived
    b"EVENT PUBLISH abc 7\n{\"a\":1}\r\n",      # CRLF after the payload: the per-request path strips it
    b"EVENT PUBLISH abc 7\r\n{\"a\":1}\n",      # CRLF request line
    b"EVENT PUBLISH abc 8\n{\"a\":1}\n",        # shorter than declared
    b"EVENT PUBLISH abc 6\n{\"a\":1}\n",        # longer than declared
    b"EVENT PUBLISH abc 3\n{\n}\n",             # a newline inside the declared bytes
    b"EVENT PUBLISH abc  7\n{\"a\":1}\n",       # two spaces
    b"EVENT PUBLISH \"a b\" 7\n{\"a\":1}\n",    # a quoted name
    b"EVENT PUBLISH ab\xc3\xa9 7\n{\"a\":1}\n",  # a non-ASCII name
    b"EVENT PUBLISH abc 7 x\n{\"a\":1}\n",      # an extra word
    b"EVENT PUBLISH abc -7\n{\"a\":1}\n",
    b"EVENT PUBLISH abc 0000000000007\n{\"a\":1}\n",   # 13 digits
    b"EVENT PUBLISH abc 11\n{\"a\":\"bcd\"}\n",  # over max_payload below
    b" EVENT PUBLISH abc 7\n{\"a\":1}\n",
    b"event PUBLISH abc 7\n{\"a\":1}\n",
    b"EVENT LIST\n",
])
def test_not_plain(data):
    assert both(data, 0, 10) == (None, [], [])


def test_limits_at_their_edges():
    twelve = b"EVENT PUBLISH abc 000000000007\n{\"a\":1}\n"
    assert both(twelve)[2] == [len(twelve)]
    ten = b"EVENT PUBLISH abc 10\n{\"a\":\"bc\"}\n"
    assert both(ten, 0, 10)[1] == [b'{"a":"bc"}']
    assert both(ten, 0, 9)[0] is None
    assert both(b"EVENT PUBLISH abc 0\n\n") == (b"abc", [b""], [21])
    assert both(ten, 0, 10, 0)[0] is None
    assert both(ten, 5)[0] is None
    assert both(ten, len(ten))[0] is None
    assert both(ten, -1)[0] is None


PIECES = st.sampled_from([
    b"EVENT PUBLISH ", b"abc", b"abd", b'"a b"', b" ", b"  ", b"7", b"07", b"2", b"0", b"\n", b"\r\n",
    b'{"a":1}', b"{}", b"{\n}", b"EVENT LIST\n", b"\xff", b"9999999999999", b"\x00",
])


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(PIECES, max_size=40), st.integers(0, 12), st.integers(-1, 40), st.integers(0, 5))
def test_twins_agree(pieces, max_payload, pos, max_count):
    data = b"".join(pieces)
    name, payloads, ends = both(data, pos, max_payload, max_count)
    # the spec, checked on the pure twin's answer: each taken request is exactly the plain form
    at = pos
    for payload, end in zip(payloads, ends):
        assert data[at:end] == b"EVENT PUBLISH %s %s\n%s\n" % (name, data[at + 15 + len(name):].split(b"\n")[0],
                                                               payload)
        assert b"\n" not in payload and len(payload) <= max_payload
        at = end
    assert len(ends) <= max_count


@given(st.binary(max_size=200), st.integers(-2, 210), st.integers(-1, 1 << 40), st.integers(-1, 3))
@settings(max_examples=400, deadline=None)
def test_twins_agree_on_any_bytes(data, pos, max_payload, max_count):
    both(data, pos, max_payload, max_count)
    both(b"EVENT PUBLISH abc 3\n" + data, pos, max_payload, max_count)


# ---- the session: fast path against the per-request path -----------------------------------------------

def replies(tmp_path, chunks, fast, auth=None, user=None):
    """What a session answers to ``chunks`` (each one data_received), then what a subscriber reads of
    every stream named in the replies: the per-request path when not ``fast``."""
    old = S.FAST_PUBLISH
    S.FAST_PUBLISH = fast
    opts = {} if user is None else {"text_user": user}
    h = Harness(tmp_path / ("fast" if fast else "slow"), auth=auth, **opts)
    try:
        c = h.connect()
        out = []
        for chunk in chunks:
            c.send(chunk)
            out.append(c.take())
        c.send(b"EVENT LIST\n")
        listed = c.take()
        out.append(listed)
        for name in listed.split()[3:]:
            c.send(b"EVENT SUBSCRIBE %s 1\n" % name)
            out.append(c.take())
        return out
    finally:
        S.FAST_PUBLISH = old
        h.close()


def mixed():
    """A pipelined mix of good and bad publishes, streams changing mid-run and other requests."""
    parts = []
    for i in range(40):
        parts.append(publish("orders", {"n": i}))
    parts += [
        sized("EVENT PUBLISH orders", "not json"),
        publish("orders", {"after": "bad"}),
        sized("EVENT PUBLISH orders", "[1,2]"),
        b"EVENT PUBLISH orders 9\n{\"a\":1}\n",                 # shorter than declared
        publish("orders", {"ok": 1}),
        b"EVENT PUBLISH orders 7\r\n{\"a\":1}\r\n",             # CRLF, taken by the per-request path
        publish("other-1", {"x": 1}),
        publish("orders", {"back": True}),
        sized("EVENT PUBLISH orders", b"\xff\xfe"),
        sized("EVENT PUBLISH orders", '{"deep":' + "[" * 300 + "]" * 300 + "}"),
        sized("EVENT PUBLISH orders", '{"nan":NaN}'),
        publish('"quoted name"', {"q": 1}),
        publish("orders", {"q": 2}),
        b"PING\n",
        publish("orders", {"q": 3}),
        b"EVENT PUBLISH orders 99999999\n",                     # over the limit: closes after the replies
    ]
    return b"".join(parts)


def test_mixed_pipeline_matches_per_request_path(tmp_path):
    data = mixed()
    fast = replies(tmp_path, [data], True)
    assert fast == replies(tmp_path, [data], False)
    lines = fast[0].decode().splitlines()
    assert lines[:2] == ["EVENT PUBLISHED orders 1", "EVENT PUBLISHED orders 2"]
    assert lines[40].startswith("EVENT NON PUBLISHED orders \"Invalid JSON")
    assert lines[-1].startswith('EVENT NON PUBLISHED orders "Message too large')


@pytest.mark.parametrize("step", [1, 7, 64, 1000])
def test_pieces_match_per_request_path(tmp_path, step):
    data = mixed()
    chunks = [data[i:i + step] for i in range(0, len(data), step)]
    assert replies(tmp_path, chunks, True) == replies(tmp_path, chunks, False)


def test_access_refused_run_matches(tmp_path):
    users = tmp_path / "users.toml"
    add_user(str(users), "pub", "pw", write="^(mine|new)", read=".*", configure="^mine")
    data = b"".join(publish(s, {"i": i}) for i, s in enumerate(["mine1"] * 3 + ["other"] * 3 + ["new1"] * 2
                                                               + ["mine1"] * 2))
    auth = Authenticator(str(users))
    fast = replies(tmp_path, [data], True, auth, "pub")
    assert fast == replies(tmp_path, [data], False, auth, "pub")
    assert fast[0].count(b"Access refused") == 5


def test_a_plain_run_takes_the_fast_path(tmp_path, monkeypatch):
    """500 plain publishes in one read: no request line goes through the per-request parser, and the
    run is one engine append."""
    h = Harness(tmp_path)
    try:
        c = h.connect()
        calls, lines = [], []
        publish_ = h.shell.publish
        h.shell.publish = lambda stream, records, done: (calls.append(len(records)),
                                                         publish_(stream, records, done))
        request_line = S.ReamSession._request_line
        monkeypatch.setattr(S.ReamSession, "_request_line", lambda self, raw: (lines.append(raw),
                                                                               request_line(self, raw)))
        c.send(b"".join(publish("orders", {"n": i}) for i in range(500)) + b"PING\n")
        assert c.take() == b"".join(b"EVENT PUBLISHED orders %d\n" % (i + 1) for i in range(500)) + b"PONG\n"
        assert calls == [500] and lines == [b"PING"]
    finally:
        h.close()


REQUEST = st.one_of(
    st.builds(lambda s, n: publish(s, {"n": n}), st.sampled_from(["aaa", "bbb", '"c c"']), st.integers()),
    st.builds(lambda s, p: sized(f"EVENT PUBLISH {s}", p), st.sampled_from(["aaa", "bbb"]),
              st.sampled_from(["", "x", "[]", "{", '{"a":1} ', ' {"a":1}', "{}\r", '{"s":"\\ud800"}', "1e999"])),
    st.builds(lambda s, n: b"EVENT PUBLISH %s %d\n{}\n" % (s, n), st.sampled_from([b"aaa", b"bbb"]),
              st.integers(0, 4)),
    st.sampled_from([b"PING\n", b"\n", b"EVENT LIST\n", b"EVENT PUBLISH aaa\n", b"NONSENSE\n"]),
)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                  HealthCheck.too_slow])
@given(st.lists(REQUEST, min_size=1, max_size=30), st.integers(1, 200))
def test_any_mix_matches_per_request_path(tmp_path_factory, requests, step):
    data = b"".join(requests)
    chunks = [data[i:i + step] for i in range(0, len(data), step)]
    tmp = tmp_path_factory.mktemp("mix")
    assert replies(tmp, chunks, True) == replies(tmp, chunks, False)


# ---- the JSON check: exactly parse_json_object's verdicts ---------------------------------------------

def verdict(fn, payload):
    try:
        fn(payload)
        return None
    except C.ReamError as e:
        return (e.reason, e.rejected)


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=4), inner, max_size=4),
    max_leaves=12)
JSON_CHARS = st.text(alphabet='{}[]":,0123456789.eE+-tfnrulsaINfy \t\r\\u\x00\x1f\x7f\ud800\udc00é€𝄞',
                     max_size=40)


def mutate(text, data):
    """Byte-level damage to a JSON text: a slice removed, a byte replaced, text spliced in."""
    raw = text.encode("utf-8", "surrogatepass")
    i = data.draw(st.integers(0, len(raw)))
    j = data.draw(st.integers(i, len(raw)))
    return raw[:i] + data.draw(st.sampled_from([b"", b"\xff", b"\\", b'"', b"]", b"}", b"[", b"1e999",
                                                b"\\ud800", b"NaN", b",", b" "])) + raw[j:]


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_json_check_gives_parse_json_objects_verdicts(data):
    kind = data.draw(st.integers(0, 3))
    if kind == 0:
        payload = json.dumps(data.draw(JSON_VALUES), ensure_ascii=data.draw(st.booleans())).encode()
    elif kind == 1:
        payload = mutate(json.dumps(data.draw(JSON_VALUES)), data)
    elif kind == 2:
        payload = data.draw(JSON_CHARS).encode("utf-8", "surrogatepass")
    else:
        payload = data.draw(st.binary(max_size=40))
    assert verdict(C.check_json_object, payload) == verdict(C.parse_json_object, payload)


@pytest.mark.parametrize("payload", [
    b'{"a":1}', b'{"s":"\\ud800"}', b'{"a":1e999}', b'{"a":NaN}', b"\xef\xbb\xbf{}", b'{"a":"\x01"}', b" {} ",
    b"{}\r", b'{"a":' + b"1" * 4300 + b"}", b'{"a":' + b"1" * 4301 + b"}", b'{"a":"\xff"}', b"[]", b"",
    b'{"d":' + b"[" * 200 + b"]" * 200 + b"}", b'{"a":1,"a":2}', b'{"a":-0.0e-0}',
])
def test_json_check_edges(payload):
    assert verdict(C.check_json_object, payload) == verdict(C.parse_json_object, payload)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.sampled_from([
    b'{"a":1}', b'{"s":"\\ud800"}', b'{"a":1e999}', b"[]", b"{", b"\xff", b"",
    b'{"d":' + b"[" * 200 + b"]" * 200 + b"}", b'{"d":' + b"[" * 20 + b"]" * 20 + b', "p":"' + b"x" * 300 + b'"}',
    b'{"p":"' + b"[" * 300 + b'"}']), max_size=8))
def test_leading_json_objects_counts_check_json_objects_accepts(payloads):
    count = 0
    for payload in payloads:
        if verdict(C.check_json_object, payload) is not None:
            break
        count += 1
    assert C.leading_json_objects(payloads) == count


@pytest.mark.parametrize("fast", [True, False])
def test_backlog_counts_every_reply_of_a_run(tmp_path, fast, monkeypatch):
    """A run's replies share one output slot, yet count one each against MAX_QUEUED, as per request."""
    monkeypatch.setattr(S, "FAST_PUBLISH", fast)
    monkeypatch.setattr(S, "MAX_QUEUED", 300)
    monkeypatch.setattr(S, "RESUME_QUEUED", 100)
    h = Harness(tmp_path)
    try:
        c = h.connect()
        blocker = S._Slot()
        c.s.out.append(blocker)
        c.send(b"EVENT PUBLISH orders 2\n{}\n" * 1000)
        h.settle()
        assert not c.io.reading
        assert len(c.s.out) + c.s.out_grouped == 301       # the blocker and 300 replies, the rest unread
        # unread: 700 requests (the per-request path has read the 300th's request line, not its payload)
        assert c.s.buf.count(b"\n") == 2 * 700 + (0 if fast else 1)
        blocker.data = b""
        c.s._flush()
        h.settle()
        assert c.io.reading and not c.s.buf and c.s.out_grouped == 0
        assert c.take() == b"".join(b"EVENT PUBLISHED orders %d\n" % i for i in range(1, 1001))
    finally:
        h.close()
