"""CURVE on the ZeroMQ listener: ``riverbed zmq-keygen``, ``--zmq-curve-secret`` and the
``--zmq-curve-clients`` allow-list (ZAP), against the real ``riverbed serve``."""

import subprocess
import sys

import pytest
import zmq

from procs import ServerProcess

pytestmark = pytest.mark.integration


def keygen(prefix):
    out = subprocess.run([sys.executable, "-m", "riverbed.shells.cli", "zmq-keygen", str(prefix)],
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    return (open(f"{prefix}.pub", "rb").read().strip(), open(f"{prefix}.key", "rb").read().strip())


@pytest.fixture(scope="module")
def curve(tmp_path_factory):
    base = tmp_path_factory.mktemp("curve")
    server_pub, _ = keygen(base / "server")
    allowed = base / "clients"
    allowed.mkdir()
    good_pub, good_sec = zmq.curve_keypair()
    (allowed / "good").write_bytes(good_pub + b"\n")
    (allowed / ".hidden").write_bytes(zmq.curve_keypair()[0])     # ignored: starts with a dot
    srv = ServerProcess(base / "data", "--zmq-port", "0", "--zmq-curve-secret", str(base / "server.key"),
                        "--zmq-curve-clients", str(allowed)).start()
    yield srv, server_pub, (good_pub, good_sec), allowed
    assert srv.stop() == 0, srv.log()


@pytest.fixture
def ctx():
    c = zmq.Context()
    yield c
    c.destroy(linger=0)


def client(ctx, port, server_pub, keys=None):
    s = ctx.socket(zmq.DEALER)
    s.linger = 0
    if keys is not None:
        s.curve_serverkey = server_pub
        s.curve_publickey, s.curve_secretkey = keys
    s.connect(f"tcp://127.0.0.1:{port}")
    return s


def noop(s, timeout=2.0):
    s.send_multipart([b"", b"NOOP", b"ID", b"n"])
    if not s.poll(int(timeout * 1000)):
        return None
    return s.recv_multipart()


def test_allowed_key_is_served(curve, ctx):
    srv, server_pub, good, _ = curve
    s = client(ctx, srv.ports["zmq"], server_pub, good)
    assert noop(s) == [b"", b"OK", b"ID", b"n"]
    t = b"curve-topic"
    s.send_multipart([b"", b"SUB", b"ID", b"s", b"", t])
    assert s.recv_multipart() == [b"", b"OK", b"ID", b"s"]
    s.send_multipart([b"", b"PUT", b"TOPIC", t, b"ID", b"p", b"", b"secret"])
    got = [s.recv_multipart() for _ in range(2)]
    assert [b"", b"OK", b"ID", b"p"] in got and [b"", b"MESSAGE", b"TOPIC", t, b"X-OFFSET", b"0", b"X-CONTENT-TYPE", b"application/octet-stream", b"", b"secret"] in got


def test_unlisted_key_is_refused(curve, ctx):
    srv, server_pub, _, _ = curve
    s = client(ctx, srv.ports["zmq"], server_pub, zmq.curve_keypair())
    assert noop(s, 1.0) is None
    assert "client key not allowed" in srv.log()


def test_plaintext_client_is_refused(curve, ctx):
    srv, server_pub, _, _ = curve
    s = client(ctx, srv.ports["zmq"], server_pub, None)
    assert noop(s, 1.0) is None


def test_wrong_server_key_is_refused(curve, ctx):
    srv, _, good, _ = curve
    s = client(ctx, srv.ports["zmq"], zmq.curve_keypair()[0], good)
    assert noop(s, 1.0) is None


def test_allow_list_is_reread(curve, ctx):
    srv, server_pub, _, allowed = curve
    keys = zmq.curve_keypair()
    s = client(ctx, srv.ports["zmq"], server_pub, keys)
    assert noop(s, 1.0) is None
    (allowed / "late").write_bytes(keys[0])
    s.close(linger=0)
    s = client(ctx, srv.ports["zmq"], server_pub, keys)
    assert noop(s, 3.0) == [b"", b"OK", b"ID", b"n"]
    (allowed / "late").unlink()
    s.close(linger=0)
    s = client(ctx, srv.ports["zmq"], server_pub, keys)
    assert noop(s, 1.0) is None


def test_bad_secret_key_file_stops_the_start(tmp_path):
    (tmp_path / "bad.key").write_text("not a key\n")
    srv = ServerProcess(tmp_path / "data", "--zmq-port", "0", "--zmq-curve-secret", str(tmp_path / "bad.key"))
    try:
        try:
            srv.start()
        except RuntimeError:
            pass
        assert srv.proc.wait(10) == 2
        assert "Z85 key is 40 characters" in srv.log()
    finally:
        srv.kill()
