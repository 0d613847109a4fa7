"""The admin CLI (``riverbed streams|tail|publish|consumers``) as a subprocess against a real server."""

import json
import os
import socket
import subprocess
import sys
import time

import pytest

from procs import ServerProcess

pytestmark = pytest.mark.integration

CLI = [sys.executable, "-m", "riverbed.shells.cli"]


@pytest.fixture(scope="module")
def srv(tmp_path_factory):
    s = ServerProcess(tmp_path_factory.mktemp("admin") / "data", "--http-port", "0").start()
    yield s
    code = s.stop()
    assert code == 0, s.log()


def addr(s, user="guest", password="guest"):
    return ["--uri", f"rabbitmq-stream://{user}:{password}@127.0.0.1:{s.port}",
            "--http-uri", f"http://127.0.0.1:{s.ports['http']}"]


def rb(*args, input=None, timeout=60):
    r = subprocess.run([*CLI, *args], input=input, capture_output=True, timeout=timeout)
    r.out = r.stdout.decode("utf-8", "replace")
    r.err = r.stderr.decode("utf-8", "replace")
    return r


def ok(*args, **kw):
    r = rb(*args, **kw)
    assert r.returncode == 0, (r.returncode, r.out, r.err)
    assert r.err == "", r.err
    return r


def failed(code, *args, **kw):
    """Run, expect exit ``code`` and a one-line message on stderr (no traceback)."""
    r = rb(*args, **kw)
    assert r.returncode == code, (r.returncode, r.out, r.err)
    assert r.err.count("\n") == 1 and "Traceback" not in r.err, r.err
    return r


def jlines(text):
    return [json.loads(line) for line in text.splitlines()]


def dead_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_create_ls_stats_rm_with_json(srv):
    a = addr(srv)
    r = ok("streams", "create", "adm-life", "--max-age", "7D", "--max-length-bytes", "20GB", *a)
    assert r.out == "created stream adm-life\n"
    r = failed(1, "streams", "create", "adm-life", *a)
    assert r.err == "riverbed streams create: stream 'adm-life' already exists\n"
    rows = json.loads(ok("streams", "ls", "--json", *a).out)
    row = next(x for x in rows if x["name"] == "adm-life")
    assert row["arguments"] == {"max-age": "7D", "max-length-bytes": "20000000000"}
    assert row["records"] == 0
    table = ok("streams", "ls", *a).out.splitlines()
    assert table[0].split() == ["NAME", "RECORDS", "BYTES", "CHUNKS", "FIRST", "LAST", "CONSUMERS", "PUBLISHERS"]
    assert any(line.split()[0] == "adm-life" for line in table[1:])
    ok("publish", "adm-life", *a, input=b"1\n2\n3\n")
    stats = json.loads(ok("streams", "stats", "adm-life", "--json", *a).out)
    assert (stats["records"], stats["first_offset"], stats["last_offset"]) == (3, 0, 2)
    assert stats["committed_chunk_id"] == 0
    assert "committed_chunk_id" in ok("streams", "stats", "adm-life", *a).out
    assert json.loads(ok("streams", "rm", "adm-life", "--json", *a).out) == {"stream": "adm-life", "deleted": True}
    assert "adm-life" not in [x["name"] for x in json.loads(ok("streams", "ls", "--json", *a).out)]


def test_missing_stream_exits_1_with_one_line(srv):
    a = addr(srv)
    for cmd in (["streams", "stats"], ["streams", "rm"], ["tail"], ["consumers"], ["publish"]):
        r = failed(1, *cmd, "adm-none", *a, input=b"x\n")
        assert "stream 'adm-none' does not exist" in r.err, (cmd, r.err)


def test_super_stream_partitions_and_rm(srv):
    a = addr(srv)
    assert ok("streams", "create", "adm-sup", "--partitions", "3", *a).out == \
        "created super stream adm-sup (3 partitions)\n"
    names = [x["name"] for x in json.loads(ok("streams", "ls", "--json", *a).out)]
    assert {"adm-sup-0", "adm-sup-1", "adm-sup-2"} <= set(names)
    r = json.loads(ok("streams", "rm", "adm-sup", "--json", *a).out)
    assert r == {"stream": "adm-sup", "deleted": True, "super_stream": True}
    names = [x["name"] for x in json.loads(ok("streams", "ls", "--json", *a).out)]
    assert not [n for n in names if n.startswith("adm-sup")]


@pytest.mark.slow
def test_publish_then_tail_renders_by_content_type(srv):
    a = addr(srv)
    ok("streams", "create", "adm-tail", *a)
    r = ok("publish", "adm-tail", "--content-type", "application/json", *a, input=b'{"a": 1}\n[2, 3]\r\n')
    assert r.out == "published 2 records to adm-tail\n"
    ok("publish", "adm-tail", "--content-type", "text/plain", *a, input="héllo\n".encode())
    ok("publish", "adm-tail", *a, input=b'{"sniffed": true}\n\xff\xfe\n')
    recs = jlines(ok("tail", "adm-tail", "--from", "first", *a).out)
    assert [r["offset"] for r in recs] == [0, 1, 2, 3, 4]
    assert [r["value"] for r in recs] == [{"a": 1}, [2, 3], "héllo", {"sniffed": True}, {"base64": "//4="}]
    assert [r["content_type"] for r in recs] == ["application/json"] * 2 + ["text/plain"] + \
        ["application/octet-stream"] * 2
    assert all(r["timestamp"].endswith("Z") for r in recs)
    raw = ok("tail", "adm-tail", "--from", "first", "--format", "raw", *a).stdout
    assert raw == b'{"a": 1}\n[2, 3]\n' + "héllo\n".encode() + b'{"sniffed": true}\n\xff\xfe\n'
    assert [r["offset"] for r in jlines(ok("tail", "adm-tail", "--from", "3", *a).out)] == [3, 4]
    assert ok("tail", "adm-tail", "--from", "next", *a).out == ""
    assert ok("tail", "adm-tail", "--from", "99", *a).out == ""
    assert len(jlines(ok("tail", "adm-tail", "--from=-10m", *a).out)) == 5
    assert ok("tail", "adm-tail", "--from", "2999-01-01T00:00:00Z", *a).out == ""
    # the default is the last chunk, as in RabbitMQ
    assert [r["offset"] for r in jlines(ok("tail", "adm-tail", *a).out)] == [3, 4]


def test_tail_stops_at_the_end_it_saw_and_follow_keeps_going(srv):
    a = addr(srv)
    ok("streams", "create", "adm-follow", *a)
    ok("publish", "adm-follow", *a, input=b"".join(b"%d\n" % i for i in range(2000)))
    t0 = time.monotonic()
    assert len(ok("tail", "adm-follow", "--from", "first", *a).out.splitlines()) == 2000
    assert time.monotonic() - t0 < 10
    p = subprocess.Popen([*CLI, "tail", "adm-follow", "--from", "1998", "--follow", "--format", "raw", *a],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert p.stdout.readline() == b"1998\n"
        assert p.stdout.readline() == b"1999\n"
        ok("publish", "adm-follow", *a, input=b"new-1\nnew-2\n")
        assert p.stdout.readline() == b"new-1\n"
        assert p.stdout.readline() == b"new-2\n"
        assert p.poll() is None
    finally:
        p.terminate()
        p.wait(10)
        p.stdout.close()
        p.stderr.close()


@pytest.mark.slow
def test_consumers_lists_a_live_tail(srv):
    a = addr(srv)
    ok("streams", "create", "adm-cons", *a)
    assert json.loads(ok("consumers", "adm-cons", "--json", *a).out) == []
    assert ok("consumers", "adm-cons", *a).out.split() == \
        ["PROTOCOL", "CONNECTION", "ID", "REFERENCE", "OFFSET", "LAG", "CREDITS"]
    ok("publish", "adm-cons", *a, input=b"a\nb\n")
    p = subprocess.Popen([*CLI, "tail", "adm-cons", "--from", "first", "--follow", *a],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert p.stdout.readline() and p.stdout.readline()
        rows = json.loads(ok("consumers", "adm-cons", "--json", *a).out)
        assert len(rows) == 1
        assert rows[0]["stream"] == "adm-cons" and rows[0]["connection"] == "riverbed-admin"
        assert rows[0]["lag"] == 0
        table = ok("consumers", "adm-cons", *a).out.splitlines()
        assert len(table) == 2 and "riverbed-admin" in table[1]
    finally:
        p.terminate()
        p.wait(10)
        p.stdout.close()
        p.stderr.close()


def test_publish_json_stops_at_a_bad_line_keeping_the_ones_before(srv):
    a = addr(srv)
    ok("streams", "create", "adm-badjson", *a)
    r = failed(2, "publish", "adm-badjson", "--content-type", "application/json", "--json", *a,
               input=b'{"ok": 1}\n{"ok": 2}\nnot json\n{"never": 3}\n')
    assert json.loads(r.out)["published"] == 2
    assert "line 3 is not JSON" in r.err
    assert [x["value"] for x in jlines(ok("tail", "adm-badjson", "--from", "first", *a).out)] == \
        [{"ok": 1}, {"ok": 2}]


def test_publish_many_lines_with_a_progress_bar(srv, tmp_path):
    a = addr(srv)
    ok("streams", "create", "adm-bulk", *a)
    src = tmp_path / "lines.txt"
    src.write_bytes(b"".join(b"line-%06d\n" % i for i in range(20000)))
    with open(src, "rb") as f:
        r = subprocess.run([*CLI, "publish", "adm-bulk", "--progress", "--json", *a], stdin=f, capture_output=True,
                           timeout=120)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == {"stream": "adm-bulk", "published": 20000}
    assert b"publish: 100%" in r.stderr             # tqdm's bar over the file's bytes
    stats = json.loads(ok("streams", "stats", "adm-bulk", "--json", *a).out)
    assert stats["records"] == 20000
    # no bar when stderr is not a terminal and none was asked for
    assert rb("publish", "adm-bulk", *a, input=b"x\n").err == ""


@pytest.mark.slow
def test_data_dir_reads_beside_the_running_server(srv):
    a = addr(srv)
    ok("streams", "create", "adm-dir", *a)
    ok("publish", "adm-dir", *a, input=b"one\ntwo\n")
    d = ["--data-dir", srv.data_dir]
    rows = json.loads(ok("streams", "ls", "--json", *d).out)
    row = next(x for x in rows if x["name"] == "adm-dir")
    assert (row["records"], row["last_offset"]) == (2, 1)
    stats = json.loads(ok("streams", "stats", "adm-dir", "--json", *d).out)
    remote = json.loads(ok("streams", "stats", "adm-dir", "--json", *a).out)
    for key in ("records", "bytes", "chunks", "first_offset", "last_offset", "committed_chunk_id"):
        assert stats[key] == remote[key], key
    assert ok("tail", "adm-dir", "--from", "first", "--format", "raw", *d).stdout == b"one\ntwo\n"
    assert "adm-dir" in ok("streams", "ls", *d).out
    failed(1, "streams", "stats", "adm-none", *d)
    failed(2, "tail", "adm-dir", "--follow", *d)


def test_dead_server_exits_3(srv):
    port = dead_port()
    dead = ["--uri", f"rabbitmq-stream://127.0.0.1:{port}", "--http-uri", f"http://127.0.0.1:{port}"]
    for cmd in (["streams", "ls"], ["streams", "create", "x"], ["streams", "rm", "x"], ["streams", "stats", "x"],
                ["tail", "x"], ["publish", "x"], ["consumers", "x"]):
        r = failed(3, *cmd, *dead, input=b"x\n")
        assert "cannot reach" in r.err, (cmd, r.err)
    # the stream port alive but no HTTP API there: listing cannot work, the message says where it looked
    r = failed(3, "streams", "ls", *addr(srv)[:2], "--http-uri", f"http://127.0.0.1:{port}")
    assert f"http://127.0.0.1:{port}" in r.err


def test_usage_errors_exit_2(srv):
    a = addr(srv)
    failed(2, "streams", "create", "x", "--max-age", "7X", *a)
    failed(2, "streams", "create", "x", "--max-length-bytes", "20XB", *a)
    failed(2, "streams", "create", "x", "--partitions", "0", *a)
    failed(2, "tail", "x", "--from", "yesterday", *a)
    failed(2, "streams", "ls", "--uri", "http://127.0.0.1:1")
    assert rb("streams", "frobnicate").returncode == 2


@pytest.mark.slow
def test_users_file_credentials_and_permissions(tmp_path):
    users = tmp_path / "users.toml"
    for args in (["admin", "--password", "s3cret"], ["reader", "--password", "r", "--configure", "", "--write", ""]):
        r = rb("users", "--users", str(users), "add", *args)
        assert r.returncode == 0, r.err
    s = ServerProcess(tmp_path / "data", "--http-port", "0", "--users", str(users)).start()
    try:
        ok("streams", "create", "adm-auth", *addr(s, "admin", "s3cret"))
        r = failed(1, "streams", "create", "adm-other", *addr(s, "reader", "r"))
        assert "refused" in r.err
        r = failed(1, "streams", "ls", *addr(s, "admin", "wrong"))
        r = failed(1, "streams", "stats", "adm-auth", *addr(s, "admin", "wrong"))
        assert "authentication failed" in r.err
        assert "adm-auth" in [x["name"] for x in json.loads(ok("streams", "ls", "--json", *addr(s, "reader", "r")).out)]
    finally:
        assert s.stop() == 0, s.log()
    assert os.path.exists(users)


def _follow(a, stream):
    p = subprocess.Popen([*CLI, "tail", stream, "--from", "first", "--follow", "--format", "raw", *a],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert p.stdout.readline() == b"x\n"       # subscribed and delivering
    return p


@pytest.mark.slow
def test_follow_ends_when_the_stream_is_deleted_or_the_server_stops(srv, tmp_path):
    a = addr(srv)
    ok("streams", "create", "adm-gone", *a)
    ok("publish", "adm-gone", *a, input=b"x\n")
    p = _follow(a, "adm-gone")
    try:
        ok("streams", "rm", "adm-gone", *a)
        assert p.wait(20) == 1
        assert p.stderr.read().decode() == "riverbed tail: stream 'adm-gone' was deleted\n"
    finally:
        p.kill()
        p.wait()
        p.stdout.close()
        p.stderr.close()
    s = ServerProcess(tmp_path / "data", "--http-port", "0").start()
    try:
        b = addr(s)
        ok("streams", "create", "adm-stop", *b)
        ok("publish", "adm-stop", *b, input=b"x\n")
        p = _follow(b, "adm-stop")
        assert s.stop() == 0, s.log()
        assert p.wait(20) == 3
        err = p.stderr.read().decode()
        assert err.startswith("riverbed tail: lost the connection") and err.count("\n") == 1, err
    finally:
        s.kill()
        p.kill()
        p.wait()
        p.stdout.close()
        p.stderr.close()


def test_publish_from_a_slow_pipe_sends_each_line_as_it_comes(srv):
    a = addr(srv)
    ok("streams", "create", "adm-slow", *a)
    p = subprocess.Popen([*CLI, "publish", "adm-slow", "--json", *a], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        p.stdin.write(b"first\n")
        p.stdin.flush()
        deadline = time.monotonic() + 20
        while json.loads(ok("streams", "stats", "adm-slow", "--json", *a).out)["records"] < 1:
            assert time.monotonic() < deadline, "a line was held back until more input came"
            time.sleep(0.2)
        p.stdin.write(b"second")           # no newline at the end: still one record
        p.stdin.close()
        assert p.wait(30) == 0, p.stderr.read()
        assert json.loads(p.stdout.read()) == {"stream": "adm-slow", "published": 2}
    finally:
        if not p.stdin.closed:
            p.stdin.close()
        p.kill()
        p.wait()
        p.stdout.close()
        p.stderr.close()
    assert ok("tail", "adm-slow", "--from", "first", "--format", "raw", *a).stdout == b"first\nsecond\n"


def test_a_server_that_never_answers_times_out_with_exit_3():
    with socket.socket() as mute:
        mute.bind(("127.0.0.1", 0))
        mute.listen(8)                  # connections complete in the backlog; nothing ever answers
        port = mute.getsockname()[1]
        a = ["--uri", f"rabbitmq-stream://127.0.0.1:{port}", "--http-uri", f"http://127.0.0.1:{port}",
             "--timeout", "1"]
        for cmd in (["streams", "create", "x"], ["tail", "x"], ["publish", "x"], ["streams", "ls"]):
            t0 = time.monotonic()
            r = failed(3, *cmd, *a, input=b"x\n")
            assert time.monotonic() - t0 < 15, cmd
            assert "within 1 s" in r.err or "cannot reach" in r.err, (cmd, r.err)


def test_one_uri_is_enough_the_server_names_its_http_port(srv):
    """``--uri`` alone: the HTTP listener is on a free port (not 15692), and the server names it in
    PeerProperties (``http-port``), so listing, stats and consumers work without ``--http-uri``."""
    assert srv.ports["http"] != 15692
    uri = ["--uri", f"rabbitmq-stream://guest:guest@127.0.0.1:{srv.port}"]
    ok("streams", "create", "adm-one-uri", *uri)
    assert "adm-one-uri" in ok("streams", "ls", *uri).out
    assert json.loads(ok("streams", "stats", "adm-one-uri", "--json", *uri).out)["name"] == "adm-one-uri"
    ok("consumers", "adm-one-uri", *uri)
    # a wrong password fails at the stream port, before any HTTP request, with the usual one line
    r = failed(1, "streams", "ls", "--uri", f"rabbitmq-stream://guest:nope@127.0.0.1:{srv.port}")
    assert "authentication failed" in r.err


def test_publish_checks_a_file_whole_and_a_pipe_says_how_far_it_got(srv, tmp_path):
    a = addr(srv)
    ok("streams", "create", "adm-check", *a)
    src = tmp_path / "lines.json"
    src.write_bytes(b'{"n": 1}\n{bad\n{"n": 3}\n')
    with open(src, "rb") as f:
        r = subprocess.run([*CLI, "publish", "adm-check", "--content-type", "application/json", *a], stdin=f,
                           capture_output=True, timeout=60)
    err = r.stderr.decode()
    assert r.returncode == 2 and "line 2 is not JSON" in err and "nothing was published" in err, err
    assert json.loads(ok("streams", "stats", "adm-check", "--json", *a).out)["records"] == 0
    # a pipe is published as it comes: the message says what went out
    r = failed(2, "publish", "adm-check", "--content-type", "application/json", *a, input=src.read_bytes())
    assert "line 2 is not JSON" in r.err and "line 1 is published, nothing from line 2 on" in r.err, r.err
    assert "published 1 record" in r.out


def test_tail_raw_on_a_terminal_shows_binary_as_hex(srv):
    """``tail --format raw`` writes payloads as they are to a pipe, but a BSON or binary payload to a
    terminal as hex (with one note on stderr): raw bytes would garble it."""
    import pty
    a = addr(srv)
    ok("streams", "create", "adm-tty", *a)
    ok("publish", "adm-tty", *a, input=b"plain text\n\x00\x01\xffbinary\n")
    master, slave = pty.openpty()
    try:
        r = subprocess.run([*CLI, "tail", "adm-tty", "--from", "first", "--format", "raw", *a], stdout=slave,
                           stderr=subprocess.PIPE, timeout=60)
        os.close(slave)
        slave = None
        out = b""
        while True:
            try:
                chunk = os.read(master, 4096)
            except OSError:
                break
            if not chunk:
                break
            out += chunk
    finally:
        if slave is not None:
            os.close(slave)
        os.close(master)
    assert r.returncode == 0, r.stderr
    lines = out.replace(b"\r\n", b"\n").split(b"\n")
    assert lines[:2] == [b"plain text", b"\x00\x01\xffbinary".hex().encode()], out
    assert b"binary: shown as hex" in r.stderr
    # into a pipe: the bytes themselves
    assert ok("tail", "adm-tty", "--from", "first", "--format", "raw", *a).stdout == b"plain text\n\x00\x01\xffbinary\n"


def test_a_server_without_http_listener_says_so_and_tail_still_works(tmp_path):
    """A Riverbed with ``--http-port off`` names no HTTP port: listing says the listener is off (never
    guesses 15692, where another server may be), and tail falls back to stopping when idle."""
    s = ServerProcess(tmp_path / "data").start()          # every listener but RabbitMQ Stream off
    try:
        uri = ["--uri", f"rabbitmq-stream://127.0.0.1:{s.port}"]
        r = failed(3, "streams", "ls", *uri)
        assert "HTTP listener is off" in r.err, r.err
        ok("streams", "create", "adm-nohttp", *uri)
        ok("publish", "adm-nohttp", *uri, input=b"a\n")
        r = rb("tail", "adm-nohttp", "--from", "first", "--format", "raw", *uri)
        assert (r.returncode, r.stdout) == (0, b"a\n") and "HTTP listener is off" in r.err, r.err
    finally:
        assert s.stop() == 0
