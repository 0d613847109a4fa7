"""CURVE keys (riverbed.shells.zmq_mc0.keys) and the ZAP decisions of the listener."""

import os

import pytest
import zmq

from riverbed.shells.zmq_mc0 import keys
from riverbed.shells.zmq_mc0.server import McServer
from riverbed.shells.zmq_mc0.session import McShell


def test_parse_key_and_files(tmp_path):
    pub, sec = zmq.curve_keypair()
    assert keys.parse_key(pub) == keys.parse_key(b"  " + pub + b"\n\n") and len(keys.parse_key(pub)) == 32
    for bad in (b"", b"short", pub[:-1] + b" ", b"\xff" * 40, pub + b"x"):
        with pytest.raises(keys.KeyError_):
            keys.parse_key(bad)
    (tmp_path / "s.key").write_bytes(sec + b"\n")
    assert keys.load_server_keys(str(tmp_path / "s.key")) == (pub, sec)
    with pytest.raises(keys.KeyError_, match="cannot read"):
        keys.read_key_file(str(tmp_path / "missing"))


def test_generate_key_pair(tmp_path):
    prefix = str(tmp_path / "k")
    public_path, secret_path, public = keys.generate_key_pair(prefix)
    assert os.stat(secret_path).st_mode & 0o777 == 0o600
    sec = keys.read_key_file(secret_path)
    assert zmq.curve_public(sec).decode() == public == open(public_path).read().strip()
    with pytest.raises(FileExistsError):
        keys.generate_key_pair(prefix)


def test_allow_list_rereads(tmp_path):
    d = tmp_path / "clients"
    d.mkdir()
    a, b = zmq.curve_keypair()[0], zmq.curve_keypair()[0]
    (d / "alice").write_bytes(a + b"\n")
    (d / ".b").write_bytes(b)
    (d / "junk").write_bytes(b"nope")
    (d / "sub").mkdir()
    allow = keys.AllowList(str(d))
    assert allow.lookup(keys.parse_key(a)) == "alice"
    assert allow.lookup(keys.parse_key(b)) is None
    assert len(allow) == 1 and any("junk" in e for e in allow.errors)
    (d / "bob").write_bytes(b)
    assert allow.lookup(keys.parse_key(b)) == "bob"
    (d / "alice").unlink()
    assert allow.lookup(keys.parse_key(a)) is None
    os.rmdir(d / "sub")
    for f in d.iterdir():
        f.unlink()
    d.rmdir()
    assert allow.lookup(keys.parse_key(b)) is None


class _Broker:
    def clock(self):
        return 0.0


def _zap(server, mechanism, address="127.0.0.1", creds=(), identity=b"me"):
    msg = [b"peer", b"", b"1.0", b"7", b"riverbed", address.encode(), identity, mechanism, *creds]
    reply = server.zap_reply(msg)
    assert reply[:4] == [b"peer", b"", b"1.0", b"7"]
    return reply[4], reply[6]


def _server(tmp_path, curve=False, allowed=()):
    s = McServer.__new__(McServer)
    s.shell = McShell.__new__(McShell)
    s.shell.peers = {}
    s.curve = None
    s.allow = None
    if curve:
        s.curve = zmq.curve_keypair()
        if allowed is not None:
            d = tmp_path / "allowed"
            d.mkdir()
            for i, k in enumerate(allowed):
                (d / f"k{i}").write_bytes(k)
            s.allow = keys.AllowList(str(d))
    return s


def test_zap_without_curve_serves_loopback_only(tmp_path):
    s = _server(tmp_path)
    assert _zap(s, b"NULL")[0] == b"200"
    assert _zap(s, b"NULL", "::1")[0] == b"200"
    assert _zap(s, b"NULL", "10.1.2.3")[0] == b"400"
    assert _zap(s, b"PLAIN", creds=(b"u", b"p"))[0] == b"400"
    assert s.shell.peers == {b"me": (None, "::1")}


def test_zap_with_curve_and_allow_list(tmp_path):
    good = zmq.curve_keypair()[0]
    s = _server(tmp_path, curve=True, allowed=[good])
    assert _zap(s, b"CURVE", "10.0.0.9", [keys.parse_key(good)]) == (b"200", b"k0")
    assert _zap(s, b"CURVE", "127.0.0.1", [keys.parse_key(zmq.curve_keypair()[0])])[0] == b"400"
    assert _zap(s, b"NULL")[0] == b"400"
    assert s.shell.peers[b"me"] == ("k0", "10.0.0.9")
    open_curve = _server(tmp_path / "x", curve=True, allowed=None)
    assert _zap(open_curve, b"CURVE", "10.0.0.9", [keys.parse_key(good)])[0] == b"200"


def test_zap_malformed(tmp_path):
    s = _server(tmp_path)
    assert s.zap_reply([b"peer", b"", b"1.0"])[4] == b"500"
    assert _zap(s, b"NULL")[0] == b"200"
