"""REAM 1.0 over raw sockets against the real ``riverbed serve --text-port 0`` (issue 15)."""

import asyncio
import base64
import json
import os
import random
import socket
import sys
import time

import pytest

sys.path.insert(0, os.path.dirname(__file__))
from procs import ServerProcess  # noqa: E402

pytestmark = pytest.mark.integration

_seq = iter(range(1, 1 << 30))


def fresh(prefix="s"):
    return f"{prefix}{os.getpid() % 1000}x{next(_seq)}"


class Ream:
    """A raw REAM client: ``send`` bytes, ``msg()`` one reply (line, payload bytes or None)."""

    def __init__(self, port, timeout=10):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        self.buf = bytearray()
        self.banner = self.line()

    def close(self):
        self.sock.close()

    def send(self, data):
        self.sock.sendall(data)

    def _fill(self):
        data = self.sock.recv(1 << 20)
        if not data:
            raise EOFError("connection closed")
        self.buf += data

    def line(self):
        while b"\n" not in self.buf:
            self._fill()
        i = self.buf.index(b"\n")
        out = bytes(self.buf[:i])
        del self.buf[:i + 1]
        return out.decode()

    def exact(self, n):
        while len(self.buf) < n + 1:
            self._fill()
        out = bytes(self.buf[:n])
        assert self.buf[n:n + 1] == b"\n"
        del self.buf[:n + 1]
        return out

    def msg(self):
        line = self.line()
        w = line.split(" ")
        sized = (w[0] == "EVENT" and len(w) == 4 and w[1] not in ("SUBSCRIBED", "PUBLISHED", "NON", "LISTED")) \
            or (w[:2] == ["AGGREGATE", "GOT"] and len(w) == 5) or (w[:2] == ["PROJECTION", "SELECTED"] and len(w) == 4)
        return (line, self.exact(int(w[-1])) if sized else None)

    def lines(self, n):
        return [self.msg()[0] for _ in range(n)]

    def closed_within(self, seconds):
        self.sock.settimeout(seconds)
        try:
            while True:
                if not self.sock.recv(65536):
                    return True
        except socket.timeout:
            return False
        except ConnectionResetError:
            return True

    def request(self, data):
        self.send(data)
        return self.msg()


def sized(head, payload):
    if isinstance(payload, str):
        payload = payload.encode()
    return head.encode() + b" %d\n" % len(payload) + payload + b"\n"


def pub(stream, obj):
    return sized(f"EVENT PUBLISH {stream}", json.dumps(obj, separators=(",", ":")))


def expr_req(verb, name, e):
    return sized(f"PROJECTION {verb} {name}", e)


def update_req(name, where, values):
    w, v = where.encode(), values.encode()
    return b"PROJECTION UPDATE %s %d %d\n%s\n%s\n" % (name.encode(), len(w), len(v), w, v)


@pytest.fixture(scope="module")
def srv(tmp_path_factory):
    s = ServerProcess(tmp_path_factory.mktemp("ream") / "data", "--text-port", "0", "--bson-port", "0").start()
    yield s
    assert s.stop() == 0, s.log()


@pytest.fixture
def c(srv):
    cl = Ream(srv.ports["ream"])
    yield cl
    cl.close()


def test_banner_and_ping(c):
    assert c.banner == "REAM 1.0"
    assert c.request(b"PING\n") == ("PONG", None)
    c.send(b"\n\r\n")
    assert c.request(b"PING\r\n") == ("PONG", None)


# ------------------------------------------------------------------------------------------ events

def test_publish_subscribe_history_live_unsubscribe(srv, c):
    s = fresh("ev")
    c.send(b"".join(pub(s, {"i": i}) for i in range(10)))
    assert c.lines(10) == [f"EVENT PUBLISHED {s} {i}" for i in range(1, 11)]
    sub = Ream(srv.ports["ream"])
    sub.send(f"EVENT SUBSCRIBE {s} 4\n".encode())
    assert sub.msg() == (f"EVENT SUBSCRIBED {s} 4 10", None)
    for i in range(4, 11):
        assert sub.msg() == (f"EVENT {s} {i} {len(json.dumps({'i': i - 1}, separators=(',', ':')))}",
                             json.dumps({"i": i - 1}, separators=(",", ":")).encode())
    c.send(pub(s, {"live": True}))
    assert c.msg()[0] == f"EVENT PUBLISHED {s} 11"
    assert sub.msg() == (f"EVENT {s} 11 13", b'{"live":true}')
    assert sub.request(f"EVENT UNSUBSCRIBE {s}\n".encode()) == (f"EVENT UNSUBSCRIBED {s}", None)
    c.send(pub(s, {"after": 1}))
    c.msg()
    assert sub.request(b"PING\n") == ("PONG", None)       # nothing of the stream after UNSUBSCRIBED
    sub.close()


def test_unsubscribe_while_events_flow(srv, c):
    s = fresh("fl")
    c.send(b"".join(pub(s, {"i": i}) for i in range(2000)))
    c.lines(2000)
    sub = Ream(srv.ports["ream"])
    sub.send(f"EVENT SUBSCRIBE {s} 1\nEVENT UNSUBSCRIBE {s}\nPING\n".encode())
    msgs = []
    while True:
        m = sub.msg()
        msgs.append(m)
        if m[0] == "PONG":
            break
    assert msgs[0][0] == f"EVENT SUBSCRIBED {s} 1 2000"
    assert msgs[-2][0] == f"EVENT UNSUBSCRIBED {s}"
    events = [m for m in msgs if m[0].startswith(f"EVENT {s} ")]
    assert [int(m[0].split()[2]) for m in events] == list(range(1, len(events) + 1))
    assert len(events) + 3 == len(msgs)
    sub.close()


def test_subscribe_missing_stream_then_appears(srv, c):
    s = fresh("ap")
    sub = Ream(srv.ports["ream"])
    assert sub.request(f"EVENT SUBSCRIBE {s} 1\n".encode()) == (f"EVENT SUBSCRIBED {s} EMPTY", None)
    c.send(pub(s, {"first": 1}) + pub(s, {"second": 2}))
    c.lines(2)
    assert sub.msg() == (f"EVENT {s} 1 11", b'{"first":1}')
    assert sub.msg() == (f"EVENT {s} 2 12", b'{"second":2}')
    sub.close()


def test_list_and_remove(srv, c):
    s = fresh("rm")
    c.send(pub(s, {}) + b"EVENT LIST\n")
    assert c.msg()[0] == f"EVENT PUBLISHED {s} 1"
    listed = c.msg()[0].split()
    assert listed[:2] == ["EVENT", "LISTED"] and int(listed[2]) == len(listed) - 3 and s in listed[3:]
    assert c.request(f"EVENT REMOVE {s}\n".encode()) == (f"EVENT REMOVED {s}", None)
    assert s not in c.request(b"EVENT LIST\n")[0].split()
    assert c.request(f"EVENT REMOVE {s}\n".encode()) == (f'EVENT NON REMOVED {s} "Not found"', None)
    # ids start again at 1 in a new stream of the same name
    assert c.request(pub(s, {})) == (f"EVENT PUBLISHED {s} 1", None)


def test_publish_refusals_take_no_id(c):
    s = fresh("rf")
    c.send(sized(f"EVENT PUBLISH {s}", "[1]") + sized(f"EVENT PUBLISH {s}", "nope") + pub(s, {"ok": 1})
           + b'EVENT PUBLISH ' + s.encode() + b' 30\n{"name":"peter"}\n' + pub(s, {"ok": 2}))
    lines = c.lines(5)
    assert lines[0] == f'EVENT NON PUBLISHED {s} "Invalid JSON: not an object"'
    assert lines[1].startswith(f'EVENT NON PUBLISHED {s} "Invalid JSON')
    assert lines[2] == f"EVENT PUBLISHED {s} 1"
    assert lines[3] == (f'EVENT NON PUBLISHED {s} "Invalid message, provided size (30) is different from '
                        f'content size (16)"')
    assert lines[4] == f"EVENT PUBLISHED {s} 2"


def test_pipelining_and_size_mismatch(c):
    s = fresh("pp")
    parts = []
    for i in range(3000):
        if i % 500 == 7:
            parts.append(b'EVENT PUBLISH %s 20\n{"name":"peter"}\n' % s.encode())
        elif i % 500 == 9:
            parts.append(sized(f"EVENT PUBLISH {s}", "[1]"))
        elif i % 700 == 3:
            parts.append(b"PING\n")
        else:
            parts.append(pub(s, {"i": i, "pad": "x" * 60}))
    c.send(b"".join(parts))
    next_id = 1
    for i in range(3000):
        line = c.msg()[0]
        if i % 500 == 7:
            assert line == (f'EVENT NON PUBLISHED {s} "Invalid message, provided size (20) is different from '
                            f'content size (16)"')
        elif i % 500 == 9:
            assert line == f'EVENT NON PUBLISHED {s} "Invalid JSON: not an object"'
        elif i % 700 == 3:
            assert line == "PONG"
        else:
            assert line == f"EVENT PUBLISHED {s} {next_id}"
            next_id += 1


def test_oversize_and_bystander(srv, c):
    bad = Ream(srv.ports["ream"])
    t0 = time.monotonic()
    bad.send(b"EVENT PUBLISH huge 50000000\n")
    line = bad.msg()[0]
    assert time.monotonic() - t0 < 2
    assert line == 'EVENT NON PUBLISHED huge "Message too large: 50000000 bytes declared, the limit is 4194304"'
    assert bad.closed_within(5)
    assert c.request(b"PING\n") == ("PONG", None)
    bad.close()


@pytest.mark.parametrize("garbage", [
    b"event publish abc 3\n",
    b"FOO\n",
    b"\xff\xfe\xfd\n",
    bytes(range(256)).replace(b"\n", b"") * 4 + b"\n",
    b"EVENT PUBLISH abc 1x\n",
    b"AGGREGATE GET abc 12345678-zzzz\n",
    b"PROJECTION SELECT abc -1\n",
])
def test_bad_input_one_error_line(srv, c, garbage):
    bad = Ream(srv.ports["ream"])
    bad.send(garbage)
    line = bad.msg()[0]
    assert line.startswith("ERROR ") or " NON " in line, line
    assert bad.request(b"PING\n") == ("PONG", None)
    assert c.request(b"PING\n") == ("PONG", None)
    bad.close()


def test_binary_flood_closes_or_answers(srv, c):
    bad = Ream(srv.ports["ream"])
    rnd = random.Random(3)
    blob = bytes(rnd.randrange(256) for _ in range(200_000)).replace(b"\n", b"")
    try:
        bad.send(blob)
    except OSError:
        pass
    line = bad.msg()[0]
    assert line.startswith('ERROR "Request line longer')
    assert bad.closed_within(5)
    assert c.request(b"PING\n") == ("PONG", None)
    bad.close()


# --------------------------------------------------------------------------------------- aggregates

def test_aggregates(c):
    a = fresh("ag")
    uid = "27d1b5a0-c54f-4664-a549-b876b0bb3661"
    assert c.request(sized(f"AGGREGATE SET {a} {uid}", '{"emails":1002}')) == (f"AGGREGATE SET DONE {a} {uid}", None)
    hexid = uid.replace("-", "").upper()
    assert c.request(f"AGGREGATE GET {a} {hexid}\n".encode()) == (f"AGGREGATE GOT {a} {hexid} 15", b'{"emails":1002}')
    assert c.request(sized(f"AGGREGATE SET {a} {hexid}", '{"emails":1003}'))[0] == f"AGGREGATE SET DONE {a} {hexid}"
    assert c.request(f"AGGREGATE GET {a} {uid}\n".encode())[1] == b'{"emails":1003}'
    assert c.request(sized(f"AGGREGATE SET {a} 12", '{"n":12}'))[0] == f"AGGREGATE SET DONE {a} 12"
    listed = c.request(b"AGGREGATE LIST\n")[0].split()
    assert a in listed[3:] and int(listed[2]) == len(listed) - 3
    assert c.request(f"AGGREGATE REMOVE {a} 12\n".encode())[0] == f"AGGREGATE REMOVED {a} 12"
    assert c.request(f"AGGREGATE REMOVE {a} 12\n".encode())[0] == f"AGGREGATE REMOVED {a} 12"
    assert c.request(f"AGGREGATE GET {a} 12\n".encode())[0] == f'AGGREGATE NON GOT {a} 12 "Not found"'
    assert c.request(sized(f"AGGREGATE SET {a} 13", '"str"'))[0] == \
        f'AGGREGATE NON SET {a} 13 "Invalid JSON: not an object"'


# -------------------------------------------------------------------------------------- projections

CITIES = ["London", "Madrid", "Paris", "Miami"]
POSITIONS = ["developer", "manager", "commercial", "director"]


def make_rows(n=300):
    rnd = random.Random(1515)
    return [{"name": f"user{i:04d}", "email": f"user{i}@{rnd.choice(['mail.com', 'corp.org'])}",
             "city": rnd.choice(CITIES), "position": rnd.choice(POSITIONS), "salary": rnd.randrange(500, 5000, 50),
             "a": rnd.randrange(3), "b": rnd.randrange(3), "c": rnd.randrange(3), "x": rnd.randrange(3),
             "y": rnd.randrange(5)} for i in range(n)]


PRECEDENCE = [
    ("a = 1 OR b = 1 AND c = 1", lambda r: r["a"] == 1 or (r["b"] == 1 and r["c"] == 1)),
    ("NOT x = 1 AND y > 2", lambda r: (not r["x"] == 1) and r["y"] > 2),
    ("NOT x = 1 OR y > 2", lambda r: (not r["x"] == 1) or r["y"] > 2),
    ("a = 1 AND b = 1 OR c = 1", lambda r: (r["a"] == 1 and r["b"] == 1) or r["c"] == 1),
    ("(a = 1 OR b = 1) AND NOT (c = 1)", lambda r: (r["a"] == 1 or r["b"] == 1) and r["c"] != 1),
    ('city IN ("London","Madrid") AND position != "commercial" AND email =~ "@mail.com$"',
     lambda r: r["city"] in ("London", "Madrid") and r["position"] != "commercial" and r["email"].endswith("@mail.com")),
    ('city = "Paris" OR city = "Miami" AND salary >= 2000',
     lambda r: r["city"] == "Paris" or (r["city"] == "Miami" and r["salary"] >= 2000)),
    ('email CONTAINS "corp" AND NOT salary < 1000 + 1000', lambda r: "corp" in r["email"] and r["salary"] >= 2000),
]


@pytest.fixture(scope="module")
def people(srv):
    cl = Ream(srv.ports["ream"])
    name = fresh("pe")
    cl.send(f"PROJECTION CREATE {name} 10 +name +email *city position salary a b *c x y\n".encode())
    assert cl.msg()[0] == f"PROJECTION CREATED {name}"
    rows = make_rows()
    cl.send(b"".join(sized(f"PROJECTION SET {name}", json.dumps(r)) for r in rows))
    assert cl.lines(len(rows)) == [f'PROJECTION SET DONE {name} "{r["name"]}"' for r in rows]
    cl.close()
    return name, rows


@pytest.mark.parametrize("text,ref", PRECEDENCE, ids=[p[0] for p in PRECEDENCE])
def test_select_precedence_against_reference(c, people, text, ref):
    name, rows = people
    line, payload = c.request(expr_req("SELECT", name, text))
    assert line == f"PROJECTION SELECTED {name} {len(payload)}"
    got = json.loads(payload)
    expected = [r for r in rows if ref(r)]
    assert 0 < len(expected) < len(rows)
    assert sorted(g["name"] for g in got) == sorted(r["name"] for r in expected)
    assert all(g == next(r for r in rows if r["name"] == g["name"]) for g in got)   # whole rows


def test_projection_row_operations(c):
    p = fresh("pr")
    c.send(f"PROJECTION CREATE {p} 6 +name +email position address city *country\n".encode())
    assert c.msg()[0] == f"PROJECTION CREATED {p}"
    peter = {"name": "peter", "email": "peter@mail.com", "position": "developer", "address": "street 1",
             "city": "London", "country": "UK", "salary": 1000}
    tom = dict(peter, name="tom", email="tom@mail.com", city="Madrid", salary=2000)
    assert c.request(sized(f"PROJECTION SET {p}", json.dumps(peter)))[0] == f'PROJECTION SET DONE {p} "peter"'
    assert c.request(sized(f"PROJECTION SET {p}", json.dumps(tom)))[0] == f'PROJECTION SET DONE {p} "tom"'
    assert c.request(sized(f"PROJECTION SET {p}", "{}"))[0] == f'PROJECTION NON SET {p} "Missing required fields"'
    # unique conflict: nothing stored
    line = c.request(sized(f"PROJECTION SET {p}", json.dumps(dict(tom, name="tim"))))[0]
    assert line.startswith(f'PROJECTION NON SET {p} "Unique constraint violated'), line
    # the pk of an existing row replaces it
    assert c.request(sized(f"PROJECTION SET {p}", json.dumps(dict(tom, city="Paris"))))[0] == \
        f'PROJECTION SET DONE {p} "tom"'
    rows = json.loads(c.request(expr_req("SELECT", p, "TRUE"))[1])
    assert sorted(r["name"] for r in rows) == ["peter", "tom"]
    assert next(r for r in rows if r["name"] == "tom")["city"] == "Paris"
    # UPDATE with expressions; unlisted keys keep their values
    assert c.request(update_req(p, 'city IN ("London")', '{"position":"manager","salary":salary+1000}'))[0] == \
        f"PROJECTION UPDATED {p} 1"
    rows = json.loads(c.request(expr_req("SELECT", p, 'name = "peter"'))[1])
    assert rows == [dict(peter, position="manager", salary=2000)]
    # unique rules hold in UPDATE
    line = c.request(update_req(p, 'name = "peter"', '{"email": "tom@mail.com"}'))[0]
    assert line.startswith(f'PROJECTION NON UPDATED {p} "Unique constraint violated'), line
    assert c.request(update_req(p, 'name = "nobody"', '{"salary": 0}'))[0] == f"PROJECTION UPDATED {p} 0"
    line = c.request(update_req(p, "salary >", '{"salary": 0}'))[0]
    assert line == f'PROJECTION NON UPDATED {p} "Invalid expression: dangling operator > at position 8"'
    assert c.request(expr_req("DELETE", p, 'city = "Paris"'))[0] == f"PROJECTION DELETED {p} 1"
    assert json.loads(c.request(expr_req("SELECT", p, "TRUE"))[1]) == [dict(peter, position="manager", salary=2000)]
    assert c.request(f"PROJECTION DROP {p}\n".encode())[0] == f"PROJECTION DROPPED {p}"
    assert c.request(f"PROJECTION DROP {p}\n".encode())[0] == f"PROJECTION DROPPED {p}"
    for req, verb in [(expr_req("SELECT", p, "TRUE"), "SELECTED"), (expr_req("DELETE", p, "TRUE"), "DELETED"),
                      (sized(f"PROJECTION SET {p}", json.dumps(peter)), "SET"),
                      (update_req(p, "TRUE", "{}"), "UPDATED")]:
        assert c.request(req)[0] == f'PROJECTION NON {verb} {p} "Not found"'


@pytest.mark.parametrize("text,pos,words", [
    ('city IN ("London", "Madrid"', 9, "unterminated list"),
    ('city = "London', 8, "unterminated string"),
    ("salary > 10 AND", 13, "dangling operator AND"),
])
def test_select_parse_errors(c, people, text, pos, words):
    name, _ = people
    line = c.request(expr_req("SELECT", name, text))[0]
    assert line.startswith(f'PROJECTION NON SELECTED {name} "Invalid expression: {words}')
    assert f"at position {pos}" in line


# ------------------------------------------------------------------------------------ keep-alive

def test_keepalive(tmp_path):
    s = ServerProcess(tmp_path / "data", "--text-port", "0", "--text-keepalive", "1").start()
    try:
        good, silent = Ream(s.ports["ream"]), Ream(s.ports["ream"])
        assert silent.msg()[0] == "PING"
        t0 = time.monotonic()
        pings = 0
        good.send(b"PING\n")
        while True:                 # a client that answers every PING stays connected
            line = good.msg()[0]
            if line == "PING":
                pings += 1
                good.send(b"PONG\n")
                if pings == 3:
                    break
            else:
                assert line == "PONG"
        assert silent.closed_within(10)
        assert 3.5 < time.monotonic() - t0 < 8
        good.send(b"PING\n")
        while good.msg()[0] != "PONG":
            good.send(b"PONG\n")
        good.close()
        silent.close()
    finally:
        assert s.stop() == 0


# ----------------------------------------------------------------------------------- durability

@pytest.mark.slow
@pytest.mark.parametrize("how", ["term", "kill"])
def test_survives_restart(tmp_path, how):
    s = ServerProcess(tmp_path / "data", "--text-port", "0").start()
    try:
        c = Ream(s.ports["ream"])
        c.send(b"".join(pub("durable", {"i": i}) for i in range(100)))
        c.lines(100)
        c.send(sized("AGGREGATE SET carts 7", '{"items":3}') + b"PROJECTION CREATE people 2 +name *city\n"
               + sized("PROJECTION SET people", '{"name":"ann","city":"Oslo"}'))
        assert c.lines(3) == ["AGGREGATE SET DONE carts 7", "PROJECTION CREATED people", 'PROJECTION SET DONE people "ann"']
        c.close()
        if how == "term":
            assert s.stop() == 0
        else:
            s.kill()
        s = ServerProcess(tmp_path / "data", "--text-port", "0").start()
        c = Ream(s.ports["ream"])
        c.send(b"EVENT SUBSCRIBE durable 100\n")
        assert c.msg()[0] == "EVENT SUBSCRIBED durable 100 100"
        assert c.msg() == ("EVENT durable 100 8", b'{"i":99}')
        assert c.request(b"AGGREGATE GET carts 7\n") == ("AGGREGATE GOT carts 7 11", b'{"items":3}')
        assert json.loads(c.request(expr_req("SELECT", "people", 'city = "Oslo"'))[1]) == [{"name": "ann", "city": "Oslo"}]
        assert c.request(b"EVENT UNSUBSCRIBE durable\n")[0] == "EVENT UNSUBSCRIBED durable"
        assert c.request(pub("durable", {}))[0] == "EVENT PUBLISHED durable 101"
        assert c.request(sized("PROJECTION SET people", '{"name":"bob"}'))[0] == \
            'PROJECTION NON SET people "Missing required fields"'
        c.close()
    finally:
        s.stop()


def test_publish_without_trailing_newline_and_dashed_names_over_tcp(srv, c):
    """Over a real socket: an EVENT PUBLISH whose payload has no newline after it is answered, and a
    stream made by ``riverbed streams create --partitions`` (``inv-0``) is addressable."""
    c.send(b'EVENT PUBLISH nonl 16\n{"name":"peter"}')
    assert c.line() == "EVENT PUBLISHED nonl 1"
    import subprocess
    r = subprocess.run([sys.executable, "-m", "riverbed.shells.cli", "streams", "create", "inv", "--partitions", "2",
                        "--uri", f"rabbitmq-stream://127.0.0.1:{srv.port}"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    c.send(b'\nEVENT PUBLISH inv-0 7\n{"a":1}\nEVENT SUBSCRIBE inv-0 1\n')
    assert c.line() == "EVENT PUBLISHED inv-0 1"
    assert c.line() == "EVENT SUBSCRIBED inv-0 1 1"
    assert c.line() == "EVENT inv-0 1 7"


def test_users_file_needs_text_user(tmp_path):
    from riverbed.shells.auth import add_user
    users = tmp_path / "users.toml"
    add_user(str(users), "app", "pw", write="^app_", read="^app_", configure="^app_")
    bad = ServerProcess(tmp_path / "d1", "--text-port", "0", "--users", str(users))
    try:
        bad.start(timeout=20)
    except RuntimeError:
        pass
    assert bad.proc.wait(20) != 0
    assert "needs --ream-user" in bad.log()
    # checked before anything was bound: no listener came up and went down again
    assert "listening" not in bad.log(), bad.log()
    s = ServerProcess(tmp_path / "d2", "--text-port", "0", "--users", str(users), "--text-user", "app").start()
    try:
        c = Ream(s.ports["ream"])
        assert c.request(pub("app_orders", {}))[0] == "EVENT PUBLISHED app_orders 1"
        assert c.request(pub("orders", {}))[0] == 'EVENT NON PUBLISHED orders "Access refused: write on orders"'
        c.close()
    finally:
        assert s.stop() == 0


def test_the_readme_users_line_starts_a_server(tmp_path):
    """``riverbed serve --users riverbed-users.toml`` (the README's line: no --text-user, the text port
    left at its default) starts every other listener; REAM stays off and the log says why."""
    import subprocess
    import sys
    from riverbed.shells.auth import add_user
    add_user(str(tmp_path / "riverbed-users.toml"), "alice", "pw")
    env = {k: v for k, v in os.environ.items() if not k.startswith("RIVERBED_")}
    proc = subprocess.Popen([sys.executable, "-m", "riverbed.shells.cli", "serve", "--users", "riverbed-users.toml",
                             "--stream-port", "0", "--bson-port", "off", "--zmq-port", "off", "--ws-port", "off",
                             "--http-port", "0", "--kafka-port", "0"], cwd=tmp_path, env=env, stderr=subprocess.PIPE,
                            text=True)
    lines = []
    try:
        for line in proc.stderr:
            lines.append(line.rstrip())
            if line.rstrip().endswith(" ready"):
                break
        log = "\n".join(lines)
        assert log.endswith(" ready"), log
        assert "ream listener off" in log and "--ream-user" in log, log
        assert "listening stream " in log and "listening http" in log
        assert "listening text" not in log
    finally:
        proc.terminate()
        assert proc.wait(15) == 0


def test_two_listeners_on_one_port_fail_before_any_is_bound(tmp_path):
    bad = ServerProcess(tmp_path / "d", "--stream-port", "23457", "--text-port", "23457")
    with pytest.raises(RuntimeError):
        bad.start(timeout=20)
    assert bad.proc.wait(20) == 2
    assert "--stream-port and --ream-port both name port 23457" in bad.log()
    assert "listening" not in bad.log()


# -------------------------------------------------------------------------------- cross-protocol

def test_event_read_by_rstream_and_rstream_publish_delivered_here(srv, c):
    from rstream import AMQPMessage, Consumer, ConsumerOffsetSpecification, OffsetType, Producer

    from riverbed.engine.record import decode_record
    s = fresh("rs")
    assert c.request(pub(s, {"from": "ream"}))[0] == f"EVENT PUBLISHED {s} 1"
    sub = Ream(srv.ports["ream"])
    assert sub.request(f"EVENT SUBSCRIBE {s} 1\n".encode())[0] == f"EVENT SUBSCRIBED {s} 1 1"
    assert sub.msg() == (f"EVENT {s} 1 15", b'{"from":"ream"}')

    async def main():
        got = []
        done = asyncio.Event()

        async def on_message(msg, ctx):
            got.append((ctx.offset, bytes(msg)))
            done.set()
        consumer = Consumer("127.0.0.1", srv.port, username="guest", password="guest")
        await consumer.start()
        await consumer.subscribe(s, on_message, decoder=None,
                                 offset_specification=ConsumerOffsetSpecification(OffsetType.FIRST))
        await asyncio.wait_for(done.wait(), 10)
        await consumer.close()
        async with Producer("127.0.0.1", srv.port, username="guest", password="guest") as p:
            await p.send_wait(s, json.dumps({"from": "rstream"}).encode())
            await p.send_wait(s, AMQPMessage(body=b"\x00\x01binary"))
        return got
    got = asyncio.run(asyncio.wait_for(main(), 60))
    offset, raw = got[0]
    assert offset == 0
    rec = decode_record(raw)
    assert rec.amqp and rec.content_type == "application/json"
    assert rec.payload == b'{"from":"ream"}'
    assert sub.msg() == (f"EVENT {s} 2 19", b'{"from": "rstream"}')
    line, payload = sub.msg()
    assert line.startswith(f"EVENT {s} 3 ")
    assert json.loads(payload) == {"base64": base64.b64encode(b"\x00\x01binary").decode()}
    sub.close()


def test_aggregate_read_by_mewbase_query(srv, c):
    client = pytest.importorskip("riverbed.shells.bson_tcp.client")
    if "bson" not in srv.ports:
        pytest.skip("no BSON listener in this build")
    a = fresh("mw")
    assert c.request(sized(f"AGGREGATE SET {a} 5", '{"total":9,"who":"ream"}'))[0] == f"AGGREGATE SET DONE {a} 5"
    assert c.request(sized(f"AGGREGATE SET {a} 6", '{"total":1}'))[0] == f"AGGREGATE SET DONE {a} 6"

    async def main():
        async with await client.BsonClient.connect("127.0.0.1", srv.ports["bson"]) as cl:
            return [d async for d in cl.query(a, {"total": {"$gt": 5}})]
    docs = asyncio.run(asyncio.wait_for(main(), 30))
    assert [{k: v for k, v in d.items() if k != "_id"} for d in docs] == [{"total": 9, "who": "ream"}]


def test_mewbase_publish_delivered_as_extended_json(srv, c):
    client = pytest.importorskip("riverbed.shells.bson_tcp.client")
    if "bson" not in srv.ports:
        pytest.skip("no BSON listener in this build")
    import datetime
    s = fresh("mb")

    async def main():
        async with await client.BsonClient.connect("127.0.0.1", srv.ports["bson"]) as cl:
            await cl.publish(s, {"n": 1, "at": datetime.datetime(2024, 1, 2, tzinfo=datetime.timezone.utc)})
    asyncio.run(asyncio.wait_for(main(), 30))
    assert c.request(f"EVENT SUBSCRIBE {s} 1\n".encode())[0] == f"EVENT SUBSCRIBED {s} 1 1"
    line, payload = c.msg()
    assert line == f"EVENT {s} 1 {len(payload)}"
    assert json.loads(payload) == {"n": 1, "at": {"$date": "2024-01-02T00:00:00Z"}}
    assert c.request(f"EVENT UNSUBSCRIBE {s}\n".encode())[0] == f"EVENT UNSUBSCRIBED {s}"


def test_max_payload_option(tmp_path):
    s = ServerProcess(tmp_path / "data", "--text-port", "0", "--text-max-payload", "64").start()
    try:
        c = Ream(s.ports["ream"])
        assert c.request(pub("small", {"a": 1}))[0] == "EVENT PUBLISHED small 1"
        big = pub("small", {"a": "x" * 100})
        assert c.request(big)[0] == ('EVENT NON PUBLISHED small "Message too large: 108 bytes declared, the limit '
                                     'is 64"')
        assert c.closed_within(5)
        c.close()
    finally:
        assert s.stop() == 0
