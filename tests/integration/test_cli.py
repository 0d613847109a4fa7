"""``riverbed`` as users run it: serve with a TOML config and env vars, SIGINT, users add, dump."""

import os
import signal
import subprocess
import sys

import pytest

import rawwire
from procs import OTHER_LISTENERS_OFF, ServerProcess

pytestmark = pytest.mark.integration


def riverbed(*args, input=None, cwd=None, env=None):
    e = dict(os.environ)
    e.update(env or {})
    return subprocess.run([sys.executable, "-m", "riverbed.shells.cli", *args], input=input, capture_output=True,
                          text=True, timeout=60, cwd=cwd, env=e)


def test_users_add_then_serve_with_a_toml_config_and_env(tmp_path):
    users = tmp_path / "users.toml"
    r = riverbed("users", "--users", str(users), "add", "carol", "--password-stdin", "--read", "^pub-", "--configure", "", "--write", "",
                 input="p@ss\n")
    assert r.returncode == 0, r.stderr
    r = riverbed("users", "--users", str(users), "list")
    assert "carol" in r.stdout and "^pub-" in r.stdout
    cfg = tmp_path / "riverbed.toml"
    cfg.write_text(f'users = "{users}"\nstream_port = 1\nheartbeat = 5\n')
    # the env var overrides the file's port; the flag (set by ServerProcess) overrides both
    srv = ServerProcess(tmp_path / "data", "--config", str(cfg), env={"RIVERBED_STREAM_PORT": "2"}).start()
    try:
        c = rawwire.RawClient(srv.port)
        assert c.handshake("carol", "p@ss") == rawwire.OK
        assert c.create("pub-1") == 0x10               # read-only user
        c.close()
    finally:
        assert srv.stop(signal.SIGINT) == 0, srv.log()
    assert "stopped" in srv.log()


def test_default_data_dir_is_created_under_the_working_directory(tmp_path):
    proc = subprocess.Popen([sys.executable, "-m", "riverbed.shells.cli", "serve", "--stream-port", "0",
                             *OTHER_LISTENERS_OFF, "--http-port", "0"],
                            cwd=tmp_path, stderr=subprocess.PIPE, text=True)
    try:
        for line in proc.stderr:
            if line.rstrip().endswith(" ready"):
                break
        assert (tmp_path / "riverbed-data").is_dir()
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(15) == 0


def test_listener_off_and_bad_config(tmp_path):
    proc = subprocess.Popen([sys.executable, "-m", "riverbed.shells.cli", "serve", "--data-dir",
                             str(tmp_path / "data"), "--stream-port", "off", *OTHER_LISTENERS_OFF],
                            stderr=subprocess.PIPE, text=True)
    try:
        lines = []
        for line in proc.stderr:
            lines.append(line)
            if line.rstrip().endswith(" ready"):
                break
        assert not any("listening" in x for x in lines)
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(15) == 0
    r = riverbed("serve", "--stream-port", "99999")
    assert r.returncode == 2 and "--stream-port" in r.stderr
    r = riverbed("serve", "--data-dir", str(tmp_path / "d2"), "--fsync", "nope")
    assert r.returncode == 2


def test_shutdown_closes_client_connections_as_rabbitmq_does(tmp_path):
    # RabbitMQ stopping: the reader's terminate/3 -> close/3 shuts the socket, no Close frame
    # (shells/rmq_stream/session.py's docstring); what was confirmed before still arrives
    srv = ServerProcess(tmp_path / "data").start()
    c = rawwire.RawClient(srv.port)
    try:
        assert c.handshake() == rawwire.OK
        assert c.create("bye") == rawwire.OK and c.declare_publisher(1, "bye") == rawwire.OK
        assert c.publish_confirmed(1, [(1, b"kept")])[0] == {1}
        srv.proc.send_signal(signal.SIGTERM)
        frames = []
        while (f := c.recv_frame(10)) is not None:
            frames.append(f)
        assert [k for k, _, _ in frames if k != 0x17] == [], frames    # nothing but heartbeats, then EOF
        assert srv.proc.wait(15) == 0
    finally:
        c.close()
        srv.kill()


def test_dump_subcommand(tmp_path):
    srv = ServerProcess(tmp_path / "data").start()
    try:
        c = rawwire.RawClient(srv.port)
        assert c.handshake() == rawwire.OK and c.create("dumped") == rawwire.OK
        assert c.declare_publisher(1, "dumped") == rawwire.OK
        assert c.publish_confirmed(1, [(1, b"hello")])[0] == {1}
        c.close()
    finally:
        assert srv.stop() == 0
    r = riverbed("dump", str(tmp_path / "data"))
    assert r.returncode == 0, r.stderr
    assert "dumped" in r.stdout


def test_a_second_server_on_the_same_data_dir_exits_2(tmp_path):
    srv = ServerProcess(tmp_path / "data").start()
    try:
        r = riverbed("serve", "--data-dir", str(tmp_path / "data"), "--stream-port", "0", *OTHER_LISTENERS_OFF)
        assert r.returncode == 2 and "in use" in r.stderr
    finally:
        assert srv.stop() == 0


def test_port_already_bound_exits_2(tmp_path):
    srv = ServerProcess(tmp_path / "a").start()
    try:
        r = riverbed("serve", "--data-dir", str(tmp_path / "b"), "--stream-port", str(srv.port), *OTHER_LISTENERS_OFF)
        assert r.returncode == 2 and "cannot start" in r.stderr
    finally:
        assert srv.stop() == 0


def test_sigterm_confirms_what_it_received_then_closes(tmp_path):
    import struct
    srv = ServerProcess(tmp_path / "data").start()
    c = rawwire.RawClient(srv.port)
    confirmed = set()
    try:
        assert c.handshake() == rawwire.OK
        assert c.create("drain") == rawwire.OK and c.declare_publisher(1, "drain") == rawwire.OK
        for k in range(20):
            c.publish(1, [(k * 1000 + i + 1, b"d" * 100) for i in range(1000)])
        srv.proc.send_signal(signal.SIGTERM)
        close_seen = False
        while True:
            f = c.recv_frame(10)
            if f is None:
                break
            key, _, body = f
            if key == 0x03:
                n = struct.unpack_from(">i", body, 1)[0]
                confirmed.update(struct.unpack_from(">%dQ" % n, body, 5))
            elif key == 0x16:
                close_seen = True
        # as RabbitMQ: confirms of what was received, then the socket closes without a Close frame
        assert confirmed and not close_seen
        assert srv.proc.wait(15) == 0
    finally:
        c.close()
        srv.kill()
    srv = ServerProcess(tmp_path / "data").start()
    try:
        c = rawwire.RawClient(srv.port)
        assert c.handshake() == rawwire.OK
        code, stats = c.stream_stats("drain")
        c.close()
    finally:
        assert srv.stop() == 0
    # offsets are contiguous from 0 and ids were published in order: every confirmed id is stored
    assert code == rawwire.OK and stats["committed_chunk_id"] >= 0
    from riverbed.engine import Engine
    with Engine(str(tmp_path / "data"), readonly=True) as eng:
        stored = eng.stream_info("drain").records
    assert stored >= len(confirmed)


def test_users_add_api_key_with_a_password_on_stdin_keeps_both(tmp_path):
    """``echo pw | riverbed users add NAME --api-key`` once ignored the password: now both are kept, and
    the output says which the user has."""
    from riverbed.shells import auth
    users = tmp_path / "users.toml"
    r = riverbed("users", "--users", str(users), "add", "dora", "--api-key", input="s3cret\n")
    assert r.returncode == 0, r.stderr
    assert "with a password and an API key" in r.stdout
    key = r.stdout.strip().splitlines()[-1]
    a = auth.Authenticator(str(users))
    assert a.check_password("dora", "s3cret", True).outcome == auth.OK
    assert a.user_for_api_key(key).name == "dora"
    r = riverbed("users", "--users", str(users), "add", "eve", "--api-key", input="")
    assert r.returncode == 0 and "API key only" in r.stdout, r.stdout + r.stderr
    assert auth.Authenticator(str(users)).check_password("eve", "", True).outcome != auth.OK
