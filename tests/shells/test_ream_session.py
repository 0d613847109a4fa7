"""The REAM session as a sans-I/O state machine: a real engine, a fake ``io``, engine completions
drained by the test. Framing, strict reply order, read-your-writes, sizes, bad input, keep-alive,
subscriptions and flow control."""

import json

import pytest

from riverbed.shells.auth import Authenticator, add_user
from riverbed.shells.ream_text import ReamSession, ReamShell
from riverbed.shells.ream_text import events as E
from riverbed.shells.ream_text import session as S

from .harness import FakeIO, Loop


class Harness(Loop):
    def __init__(self, tmp_path, auth=None, **shell_options):
        super().__init__(tmp_path, auth=auth)
        self.shell = ReamShell(self.broker, **shell_options)

    def connect(self, loopback=True):
        io = self.new_io()
        s = ReamSession(self.shell, io, peer="test", local=("127.0.0.1", 7461), remote=("127.0.0.1", 5555),
                        peer_loopback=loopback)
        return Client(self, s, io)


class Client:
    def __init__(self, h, s, io):
        self.h, self.s, self.io = h, s, io
        banner = self.take()
        self.banner = banner

    def send(self, data):
        self.s.data_received(data)

    def take(self):
        self.h.settle() if hasattr(self.h, "q") else None
        data = bytes(self.io.out)
        self.io.out.clear()
        return data

    def lines(self):
        return self.take().decode().splitlines()


def sized(head, payload):
    if isinstance(payload, str):
        payload = payload.encode()
    return head.encode() + b" %d\n" % len(payload) + payload + b"\n"


def publish(stream, obj):
    return sized(f"EVENT PUBLISH {stream}", json.dumps(obj, ensure_ascii=False))


@pytest.fixture
def h(tmp_path):
    harness = Harness(tmp_path)
    yield harness
    harness.close()


@pytest.fixture
def c(h):
    return h.connect()


def test_banner_ping_and_empty_lines(c):
    assert c.banner == b"REAM 1.0\n"
    c.send(b"\n\r\nPING\r\n\n")
    assert c.take() == b"PONG\n"
    c.send(b"PONG\n")          # an answer, not a request: no reply
    assert c.take() == b""


def test_pipelined_replies_in_order(c):
    data = b"".join(publish("orders", {"n": i}) for i in range(50))
    data += b"EVENT LIST\n" + sized("AGGREGATE SET carts 7", '{"v":1}') + b"AGGREGATE GET carts 7\nPING\n"
    data += b"".join(publish("orders", {"n": i}) for i in range(50, 60))
    c.send(data)
    lines = c.lines()
    assert lines[:50] == [f"EVENT PUBLISHED orders {i + 1}" for i in range(50)]
    assert lines[50:55] == ["EVENT LISTED 1 orders", "AGGREGATE SET DONE carts 7", "AGGREGATE GOT carts 7 7",
                            '{"v":1}', "PONG"]
    assert lines[55:] == [f"EVENT PUBLISHED orders {i + 1}" for i in range(50, 60)]


def test_byte_at_a_time(c):
    data = publish("bytes1", {"a": "é"}) + b"EVENT SUBSCRIBE bytes1 1\n"
    for i in range(len(data)):
        c.send(data[i:i + 1])
    assert c.lines() == ["EVENT PUBLISHED bytes1 1", "EVENT SUBSCRIBED bytes1 1 1", "EVENT bytes1 1 11",
                         '{"a": "é"}']


def test_size_mismatch_keeps_connection(c):
    c.send(b'EVENT PUBLISH sizes 20\n{"name":"peter"}\n')
    c.send(b'EVENT PUBLISH sizes 5\n{"name":"peter"}\n')
    c.send(publish("sizes", {"ok": 1}))
    assert c.lines() == [
        'EVENT NON PUBLISHED sizes "Invalid message, provided size (20) is different from content size (16)"',
        'EVENT NON PUBLISHED sizes "Invalid message, provided size (5) is different from content size (16)"',
        "EVENT PUBLISHED sizes 1",       # rejected publishes took no id
    ]


def test_payload_overrun_without_newline_is_not_buffered(c):
    c.send(b"EVENT PUBLISH over 10\n")
    for _ in range(100):
        c.send(b"x" * 10000)
    assert len(c.s.buf) < 100
    c.send(b"\nPING\n")
    assert c.lines() == [
        'EVENT NON PUBLISHED over "Invalid message, provided size (10) is different from content size (1000000)"',
        "PONG"]


def test_crlf_payload_tolerated(c):
    c.send(b'EVENT PUBLISH crlf 7\r\n{"a":1}\r\n')
    assert c.lines() == ["EVENT PUBLISHED crlf 1"]


def test_oversize_declared_answers_at_once_and_closes(c):
    c.send(b"EVENT PUBLISH big 50000000\n")
    assert c.lines() == ['EVENT NON PUBLISHED big "Message too large: 50000000 bytes declared, the limit is 4194304"']
    assert c.io.closed
    assert len(c.s.buf) == 0


def test_bad_input_one_error_line_each(c):
    c.send(b"event list\nFOO BAR\nEVENT\nEVENT FLY x\n\xff\xfe\x00\nEVENT PUBLISH xx1 abc\nEVENT SUBSCRIBE s\n"
           b"EVENT SUBSCRIBE stream1 x\nAGGREGATE GET ab 1\nAGGREGATE GET agg1 not-an-id\n"
           b"PROJECTION CREATE pp1 x +a\nPROJECTION CREATE pp1 1 *a\nEVENT LIST extra\n")
    lines = c.lines()
    assert lines[0] == 'ERROR "Unknown command: event list (commands are UPPERCASE)"'
    assert lines[1] == 'ERROR "Unknown command: FOO BAR"'
    assert lines[2].startswith('ERROR "Unknown command')
    assert lines[3].startswith('ERROR "Unknown command')
    assert lines[4] == 'ERROR "Invalid request: not UTF-8"'
    assert lines[5].startswith('EVENT NON PUBLISHED xx1 "Invalid request')
    assert lines[6].startswith('EVENT NON SUBSCRIBED s "Invalid request: expected EVENT SUBSCRIBE')
    assert lines[7].startswith('EVENT NON SUBSCRIBED stream1 "Invalid event id')
    assert lines[8].startswith('AGGREGATE NON GOT "ab" 1 "Invalid name')
    assert lines[9].startswith('AGGREGATE NON GOT agg1 not-an-id "Invalid id')
    assert lines[10].startswith('PROJECTION NON CREATED pp1 "Invalid field count')
    assert lines[11].startswith('PROJECTION NON CREATED pp1 "A projection needs a unique')
    assert lines[12].startswith('EVENT NON LISTED "Invalid request')
    assert len(lines) == 13
    assert not c.io.closed
    c.send(b"PING\n")
    assert c.lines() == ["PONG"]


def test_publish_without_a_trailing_newline_is_answered(c):
    """The README once showed ``EVENT PUBLISH orders 16\\n{"name":"peter"}`` and a client that sent just
    that waited forever: the declared size ends the last payload, as in REAM's own server; a newline
    sent later is an empty line (ignored). Pieces that stop short of the size still wait for the rest."""
    c.send(b'EVENT PUBLISH nonl 16\n{"name":"peter"}')
    assert c.lines() == ["EVENT PUBLISHED nonl 1"]
    c.send(b"\n")
    c.send(b'EVENT PUBLISH nonl 16\n{"name":')
    assert c.lines() == []
    c.send(b'"peter"}')
    assert c.lines() == ["EVENT PUBLISHED nonl 2"]
    # an UPDATE's first payload still needs its newline (it separates the two); the last one does not
    c.send(b"PROJECTION CREATE people 6 +name +email position address city *country salary\n")
    assert c.lines() == ["PROJECTION CREATED people"]     # the protocol document's example: 6 for 7 fields


def test_stream_names_with_dashes_and_quoted_names(c):
    """Every name the log allows: bare with ``-`` (``invoices-0``, which ``streams create --partitions``
    makes) or quoted (spaces); replies quote only what cannot be read back bare."""
    c.send(b'EVENT PUBLISH invoices-0 7\n{"a":1}\nEVENT PUBLISH "my stream" 7\n{"a":2}\n')
    assert c.lines() == ["EVENT PUBLISHED invoices-0 1", 'EVENT PUBLISHED "my stream" 1']
    c.send(b"EVENT LIST\n")
    listed = c.lines()[0]
    assert "invoices-0" in listed.split() and '"my stream"' in listed
    c.send(b'EVENT SUBSCRIBE "my stream" 1\n')
    assert c.lines()[:3] == ['EVENT SUBSCRIBED "my stream" 1 1', 'EVENT "my stream" 1 7', '{"a":2}']
    c.send(b'EVENT SUBSCRIBE "open 1\n')
    assert c.lines() == ['ERROR "Invalid request: a quoted name has no closing quote"']


def test_long_line_closes(c):
    c.send(b"A" * (70 << 10))
    assert c.lines()[0].startswith('ERROR "Request line longer')
    assert c.io.closed


def test_invalid_json_publish(c):
    c.send(sized("EVENT PUBLISH js1", "[1,2]") + sized("EVENT PUBLISH js1", "{bad") + publish("js1", {"a": 1}))
    lines = c.lines()
    assert lines[0] == 'EVENT NON PUBLISHED js1 "Invalid JSON: not an object"'
    assert lines[1].startswith('EVENT NON PUBLISHED js1 "Invalid JSON')
    assert lines[2] == "EVENT PUBLISHED js1 1"


def test_subscribe_history_live_unsubscribe(h, c):
    c.send(b"".join(publish("hist", {"i": i}) for i in range(5)))
    c.take()
    c.send(b"EVENT SUBSCRIBE hist 3\n")
    assert c.lines() == ["EVENT SUBSCRIBED hist 3 5", "EVENT hist 3 8", '{"i": 2}', "EVENT hist 4 8", '{"i": 3}',
                         "EVENT hist 5 8", '{"i": 4}']
    other = h.connect()
    other.send(publish("hist", {"i": 5}))
    assert other.lines() == ["EVENT PUBLISHED hist 6"]
    assert c.lines() == ["EVENT hist 6 8", '{"i": 5}']
    c.send(b"EVENT UNSUBSCRIBE hist\n")
    assert c.lines() == ["EVENT UNSUBSCRIBED hist"]
    other.send(publish("hist", {"i": 6}))
    other.take()
    assert c.take() == b""
    c.send(b"EVENT UNSUBSCRIBE hist\n")
    assert c.lines() == ['EVENT NON UNSUBSCRIBED hist "Not subscribed to hist"']


def test_unsubscribe_flushes_queued_events_first(h, c):
    # a slow request holds the head of the queue: events and the UNSUBSCRIBED reply queue behind it
    c.send(b"".join(publish("flush", {"i": i}) for i in range(3)))
    c.take()
    c.send(b"EVENT SUBSCRIBE flush 1\n")
    c.take()
    blocker = S._Slot()
    c.s.out.append(blocker)
    h.connect().send(b"".join(publish("flush", {"i": i}) for i in range(3, 6)))
    h.settle()
    c.send(b"EVENT UNSUBSCRIBE flush\nPING\n")
    blocker.data = b""
    c.s._flush()
    lines = c.lines()
    assert lines == ["EVENT flush 4 8", '{"i": 3}', "EVENT flush 5 8", '{"i": 4}', "EVENT flush 6 8", '{"i": 5}',
                     "EVENT UNSUBSCRIBED flush", "PONG"]


def test_subscribe_empty_then_stream_appears(h, c):
    c.send(b"EVENT SUBSCRIBE later 1\n")
    assert c.lines() == ["EVENT SUBSCRIBED later EMPTY"]
    p = h.connect()
    p.send(publish("later", {"x": 1}))
    p.take()
    assert c.lines() == ["EVENT later 1 8", '{"x": 1}']
    # deleted and created again (by another protocol: the tick notices): from its first event
    h.broker.delete_stream("later", lambda exc: None)
    h.settle()
    h.broker.create_stream("later", {}, lambda exc: None)
    h.settle()
    h.broker.append_records("later", [b'{"y":2}'], lambda r, e: None)
    h.settle()
    c.s.tick(h.now)
    assert c.lines() == ["EVENT later 1 7", '{"y":2}']


def test_subscribe_twice_and_remove(h, c):
    # the event is committed before the subscription starts: whether a tail reads an uncommitted record
    # before the REMOVE below deletes its stream is the engine writer's timing, not the session's
    c.send(publish("twice", {}))
    assert c.lines() == ["EVENT PUBLISHED twice 1"]
    c.send(b"EVENT SUBSCRIBE twice 1\nEVENT SUBSCRIBE twice 1\nEVENT REMOVE twice\n"
           b"EVENT REMOVE twice\nEVENT LIST\n")
    # events are not replies: the subscription's first event follows every reply already queued
    assert c.lines() == ["EVENT SUBSCRIBED twice 1 1",
                         'EVENT NON SUBSCRIBED twice "Already subscribed to twice"', "EVENT REMOVED twice",
                         'EVENT NON REMOVED twice "Not found"', "EVENT LISTED 0", "EVENT twice 1 2", "{}"]


def test_window_flow_control_pauses_tail(h, c):
    big = {"pad": "x" * 5000}
    c.send(b"".join(publish("win", big) for i in range(400)))
    c.take()
    c.s.pause_writing()
    c.send(b"EVENT SUBSCRIBE win 1\n")
    h.settle()
    c.io.out.clear()
    c.s.resume_writing()
    h.settle()
    lines = c.lines()
    assert lines.count("EVENT win 400 5011") == 1
    # paused transport: nothing beyond the window is queued
    c.s.pause_writing()
    p = h.connect()
    p.send(b"".join(publish("win", big) for i in range(400)))
    p.take()
    h.settle()
    assert sum(s.size for s in c.s.out) <= E.WINDOW_HIGH + 1024 * 1024


def test_aggregates(c):
    c.send(sized("AGGREGATE SET emails 27d1b5a0-c54f-4664-a549-b876b0bb3661", '{"emails":1002}')
           + b"AGGREGATE GET emails 27D1B5A0C54F4664A549B876B0BB3661\n"
           + sized("AGGREGATE SET emails 27d1b5a0c54f4664a549b876b0bb3661", '{"emails":1003}')
           + b"AGGREGATE GET emails 27d1b5a0-c54f-4664-a549-b876b0bb3661\n"
           + sized("AGGREGATE SET emails 42", '{"n":42}') + b"AGGREGATE GET emails 42\nAGGREGATE LIST\n"
           + b"AGGREGATE REMOVE emails 42\nAGGREGATE REMOVE emails 42\nAGGREGATE GET emails 42\n"
           + sized("AGGREGATE SET emails 1", "[]") + b"AGGREGATE GET nothing 1\n")
    assert c.lines() == [
        "AGGREGATE SET DONE emails 27d1b5a0-c54f-4664-a549-b876b0bb3661",
        "AGGREGATE GOT emails 27D1B5A0C54F4664A549B876B0BB3661 15", '{"emails":1002}',
        "AGGREGATE SET DONE emails 27d1b5a0c54f4664a549b876b0bb3661",
        "AGGREGATE GOT emails 27d1b5a0-c54f-4664-a549-b876b0bb3661 15", '{"emails":1003}',
        "AGGREGATE SET DONE emails 42", "AGGREGATE GOT emails 42 8", '{"n":42}', "AGGREGATE LISTED 1 emails",
        "AGGREGATE REMOVED emails 42", "AGGREGATE REMOVED emails 42", 'AGGREGATE NON GOT emails 42 "Not found"',
        'AGGREGATE NON SET emails 1 "Invalid JSON: not an object"', 'AGGREGATE NON GOT nothing 1 "Not found"']
    assert c.h.shell.docs.get("emails", "27d1b5a0-c54f-4664-a549-b876b0bb3661") == {"emails": 1003}


def test_projection_rows(c):
    c.send(b"PROJECTION CREATE users 6 +name +email position address city *country\n")
    rows = [{"name": "peter", "email": "p@m.com", "position": "dev", "address": "s1", "city": "London",
             "country": "UK"},
            {"name": "tom", "email": "t@m.com", "position": "dev", "address": "s2", "city": "Madrid",
             "country": "ES"}]
    for r in rows:
        c.send(sized("PROJECTION SET users", json.dumps(r)))
    c.send(sized("PROJECTION SET users", "{}"))
    c.send(sized("PROJECTION SET users", json.dumps(dict(rows[1], name="x"))))   # email taken
    c.send(sized("PROJECTION SELECT users", 'country = "UK"'))
    c.send(sized("PROJECTION UPDATE users 18", '{"name": "tim"}').replace(b"18 ", b""))  # malformed sizes
    lines = c.lines()
    assert lines[:3] == ["PROJECTION CREATED users", 'PROJECTION SET DONE users "peter"', 'PROJECTION SET DONE users "tom"']
    assert lines[3] == 'PROJECTION NON SET users "Missing required fields"'
    assert lines[4].startswith('PROJECTION NON SET users "Unique constraint violated')
    assert lines[5].startswith("PROJECTION SELECTED users ")
    assert json.loads(lines[6]) == [rows[0]]


def test_projection_update_key_change_and_conflicts(c):
    c.send(b"PROJECTION CREATE staff 3 +id +email salary\n")
    for i in range(3):
        c.send(sized("PROJECTION SET staff", json.dumps({"id": i, "email": f"e{i}", "salary": 100 * i})))
    c.take()

    def update(where, values):
        w, v = where.encode(), values.encode()
        c.send(b"PROJECTION UPDATE staff %d %d\n%s\n%s\n" % (len(w), len(v), w, v))
        return c.lines()

    assert update("id = 0", '{"id": id + 10, "salary": salary + 5}') == ["PROJECTION UPDATED staff 1"]
    assert c.h.shell.docs.get("staff", 10) == {"id": 10, "email": "e0", "salary": 5}
    assert c.h.shell.docs.get("staff", 0) is None
    assert update("id = 1", '{"id": 2}')[0].startswith('PROJECTION NON UPDATED staff "Unique constraint')
    assert update("id = 1", '{"email": "e2"}')[0].startswith('PROJECTION NON UPDATED staff "Unique constraint')
    assert update("id >= 0", '{"salary": email + 1}')[0].startswith(
        'PROJECTION NON UPDATED staff "Invalid update: cannot apply +')
    assert update("id >= 0", '{"salary": salary}') == ["PROJECTION UPDATED staff 3"]
    assert update("id > 100", '{"salary": 1}') == ["PROJECTION UPDATED staff 0"]
    assert update("id = ", '{"salary": 1}')[0].startswith(
        'PROJECTION NON UPDATED staff "Invalid expression: dangling operator = at position 4')
    assert update("id = 1", '{"salary": 1')[0].startswith('PROJECTION NON UPDATED staff "Invalid update')


def test_projection_missing_and_drop(c):
    e = sized("PROJECTION SELECT ghost", "a = 1") + sized("PROJECTION DELETE ghost", "a = 1") \
        + sized("PROJECTION SET ghost", '{"a":1}') + b"PROJECTION UPDATE ghost 5 2\na = 1\n{}\nPROJECTION DROP ghost\n"
    c.send(e)
    assert c.lines() == ['PROJECTION NON SELECTED ghost "Not found"', 'PROJECTION NON DELETED ghost "Not found"',
                         'PROJECTION NON SET ghost "Not found"', 'PROJECTION NON UPDATED ghost "Not found"',
                         "PROJECTION DROPPED ghost"]
    c.send(b"PROJECTION CREATE pp1 1 +k\nPROJECTION CREATE pp1 1 +k\nPROJECTION CREATE pp1 2 +k *j\n"
           b"PROJECTION DROP pp1\nPROJECTION CREATE pp1 2 +k *j\n")
    lines = c.lines()
    assert lines[:2] == ["PROJECTION CREATED pp1", "PROJECTION CREATED pp1"]
    assert lines[2].startswith('PROJECTION NON CREATED pp1 "pp1 exists with another definition')
    assert lines[3:] == ["PROJECTION DROPPED pp1", "PROJECTION CREATED pp1"]
    # an aggregate is not a projection
    c.send(sized("AGGREGATE SET agg9 1", "{}") + b"PROJECTION DROP agg9\n" + sized("PROJECTION SELECT agg9", "TRUE"))
    lines = c.lines()
    assert lines[1].startswith("PROJECTION NON DROPPED agg9")
    assert lines[2] == 'PROJECTION NON SELECTED agg9 "Not found"'


def test_keepalive(tmp_path):
    h = Harness(tmp_path, keepalive=10)
    try:
        c = h.connect()
        h.now += 5
        c.s.tick(h.now)
        assert c.take() == b""
        h.now += 6
        c.s.tick(h.now)
        assert c.take() == b"PING\n"
        h.now += 3
        c.send(b"PONG\n")
        c.s.tick(h.now)
        assert not c.io.closed
        h.now += 11
        c.s.tick(h.now)
        assert c.take() == b"PING\n"
        h.now += 5.1
        c.s.tick(h.now)
        assert c.io.closed
    finally:
        h.close()


def test_users_file_acts_as_text_user(tmp_path):
    users = tmp_path / "users.toml"
    add_user(str(users), "writer", "pw", write="^ok", read="^ok", configure="^ok")
    h = Harness(tmp_path, auth=Authenticator(str(users)), text_user="writer")
    try:
        c = h.connect(loopback=False)
        c.send(publish("okstream", {}) + publish("nostream", {}))
        assert c.lines() == ["EVENT PUBLISHED okstream 1", 'EVENT NON PUBLISHED nostream "Access refused: write on nostream"']
    finally:
        h.close()


def test_loopback_only_without_users(h):
    io = FakeIO()
    ReamSession(h.shell, io, peer="x", peer_loopback=False)
    assert io.out.startswith(b'ERROR "Only loopback')
    assert io.closed


def test_graceful_close_waits_for_replies(h, c):
    c.send(publish("grace", {"a": 1}))
    c.s.begin_shutdown()
    assert c.s.pending_ops == 1
    h.settle()
    assert c.s.pending_ops == 0
    c.s.close_gracefully("server shutdown")
    assert c.take() == b"EVENT PUBLISHED grace 1\n"
    assert c.io.closed
    info = c.s.connection_info()
    assert info["protocol"] == "ream" and info["user"] == "guest"


def test_payload_not_utf8_or_not_json(c):
    c.send(sized("EVENT PUBLISH utf8", b'{"a":"\xff"}') + sized("EVENT PUBLISH utf8", '{"a":NaN}')
           + b"PROJECTION CREATE utf8p 1 +k\n" + sized("PROJECTION SELECT utf8p", b'k = "\xff"'))
    lines = c.lines()
    assert lines[0] == 'EVENT NON PUBLISHED utf8 "Invalid JSON: not UTF-8"'
    assert lines[1].startswith('EVENT NON PUBLISHED utf8 "Invalid JSON: NaN is not JSON')
    assert lines[3] == 'PROJECTION NON SELECTED utf8p "Invalid expression: not UTF-8"'


def test_projection_expressions_use_indexes(h, c):
    from riverbed.shells.ream_text import expr as X
    c.send(b"PROJECTION CREATE ixp 4 +name +email *city salary\n")
    assert c.lines() == ["PROJECTION CREATED ixp"]
    docs = h.shell.docs
    assert docs.collection_info("ixp").key_field == "name"
    plan = lambda e: docs.explain("ixp", X.compile_where(e))  # noqa: E731
    assert plan('name = "a"')["plan"] in ("ids", "index")
    assert plan('email = "a"') == {**plan('email = "a"'), "plan": "index", "index": "email", "unique": True}
    assert plan('city IN ("a", "b") AND salary > 3')["index"] == "city"
    assert plan("salary > 3")["plan"] == "scan"


def test_publish_to_new_stream_needs_configure(tmp_path):
    users = tmp_path / "users.toml"
    add_user(str(users), "pub", "pw", write=".*", read=".*", configure="^mine")
    h = Harness(tmp_path, auth=Authenticator(str(users)), text_user="pub")
    try:
        c = h.connect()
        c.send(publish("mine1", {}) + publish("other", {}))
        assert c.lines() == ["EVENT PUBLISHED mine1 1", 'EVENT NON PUBLISHED other "Access refused: configure on other"']
    finally:
        h.close()


def test_reading_pauses_when_replies_pile_up(h, c):
    blocker = S._Slot()
    c.s.out.append(blocker)
    c.send(b"PING\n" * (S.MAX_QUEUED + 5000))
    assert not c.io.reading
    assert len(c.s.out) <= S.MAX_QUEUED + 2
    blocker.data = b""
    c.s._flush()
    h.settle()
    assert c.io.reading
    assert c.take() == b"PONG\n" * (S.MAX_QUEUED + 5000)
