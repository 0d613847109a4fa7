"""Settings precedence (flags > env > TOML > defaults), the users file and SASL checks."""

import os
import stat

import pytest

from riverbed.shells import auth, config


def test_defaults():
    cfg = config.load({}, env={})
    assert (cfg.data_dir, cfg.host, cfg.stream_port, cfg.fsync, cfg.users) == \
        ("riverbed-data", "127.0.0.1", 5552, "batch", None)
    # the listener ports of shared/DESIGN.md: every listener that exists is on by default
    assert (cfg.bson_port, cfg.zmq_port, cfg.ws_port, cfg.text_port, cfg.http_port) == (7451, 61616, 8890, 7461, 15692)
    assert cfg.advertised_port is None


def test_precedence_flags_over_env_over_file(tmp_path):
    f = tmp_path / "r.toml"
    f.write_text('data_dir = "/file"\nstream-port = 7000\nhost = "0.0.0.0"\nfsync = "always"\nws_port = 0\n')
    env = {"RIVERBED_STREAM_PORT": "7001", "RIVERBED_HOST": "127.0.0.2"}
    cfg = config.load({"host": "127.0.0.3", "config": str(f)}, env=env)
    assert cfg.data_dir == "/file" and cfg.sources["data_dir"].startswith("file")
    assert cfg.stream_port == 7001 and cfg.sources["stream_port"] == "environment"
    assert cfg.host == "127.0.0.3" and cfg.sources["host"] == "flag"
    assert cfg.fsync == "always" and cfg.ws_port == 0
    cfg = config.load({}, env={"RIVERBED_CONFIG": str(f), "RIVERBED_STREAM_PORT": "off"})
    assert cfg.stream_port is None and cfg.data_dir == "/file"


@pytest.mark.parametrize("flags,env,text", [
    ({"stream_port": "70000"}, {}, "--stream-port"),
    ({}, {"RIVERBED_STREAM_PORT": "abc"}, "RIVERBED_STREAM_PORT"),
    ({"fsync": "sometimes"}, {}, "fsync"),
    ({"advertised_port": "0"}, {}, "--advertised-port"),
    ({"heartbeat": "-1"}, {}, "--heartbeat"),
])
def test_bad_values_name_the_setting(flags, env, text):
    with pytest.raises(config.ConfigError, match=text):
        config.load(flags, env=env)


@pytest.mark.parametrize("opt", [o for o in config.OPTIONS
                                 if o.parse not in (str, config._opt_str, config.parse_bool)])
def test_every_numeric_flag_says_which_flag_and_what_it_wants(opt):
    """``--stream-port abc`` once said "invalid literal for int() with base 10": every port and number
    flag names itself and says in words what it expects."""
    flag = "--" + opt.name.replace("_", "-")
    with pytest.raises(config.ConfigError) as e:
        config.load({opt.name: "abc"}, env={})
    message = str(e.value)
    assert flag in message, message
    assert "literal" not in message and "could not convert" not in message and "base 10" not in message, message


def test_bad_config_file(tmp_path):
    f = tmp_path / "r.toml"
    f.write_text("stream_prot = 1\n")
    with pytest.raises(config.ConfigError, match="unknown setting"):
        config.load({"config": str(f)}, env={})
    f.write_text("this is = = not toml")
    with pytest.raises(config.ConfigError, match="r.toml"):
        config.load({"config": str(f)}, env={})
    with pytest.raises(config.ConfigError, match="cannot read"):
        config.load({"config": str(tmp_path / "missing.toml")}, env={})


def test_ports():
    assert config.parse_port("off") is None and config.parse_port("0") == 0 and config.parse_port(5552) == 5552
    with pytest.raises(ValueError):
        config.parse_port("-1")


def test_default_guest_is_loopback_only():
    a = auth.Authenticator()
    assert a.authenticate("PLAIN", b"\0guest\0guest", True).outcome == auth.OK
    assert a.authenticate("PLAIN", b"\0guest\0guest", False).outcome == auth.LOOPBACK_ONLY
    assert a.authenticate("PLAIN", b"\0guest\0nope", True).outcome == auth.FAILURE
    assert a.authenticate("PLAIN", b"no-nulls", True).outcome == auth.SASL_ERROR
    assert a.authenticate("ANONYMOUS", b"", True).outcome == auth.NO_MECHANISM
    assert a.mechanisms() == ["PLAIN"]
    u = a.authenticate("PLAIN", b"\0guest\0guest", True).user
    assert u.can("configure", "anything") and u.can("read", "x") and u.can("write", "y")


def test_users_file_hashes_permissions_and_reload(tmp_path):
    path = str(tmp_path / "users.toml")
    auth.add_user(path, "alice", "pw1", configure="^alice-", write="^alice-", read=".*")
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    text = open(path).read()
    assert "pw1" not in text and "scrypt$" in text
    a = auth.Authenticator(path)
    r = a.authenticate("PLAIN", b"\0alice\0pw1", False)
    assert r.outcome == auth.OK and r.username == "alice"
    assert r.user.can("configure", "alice-1") and not r.user.can("configure", "bob-1")
    assert r.user.can("read", "bob-1") and not r.user.can("delete", "alice-1")
    assert a.authenticate("PLAIN", b"\0alice\0pw2", False).outcome == auth.FAILURE
    assert a.authenticate("PLAIN", b"\0guest\0guest", True).outcome == auth.FAILURE
    # the running authenticator picks up changes to the file
    auth.add_user(path, "bob", "pw", read="", loopback_only=True)
    os.utime(path, ns=(1, 1))
    r = a.authenticate("PLAIN", b"\0bob\0pw", True)
    assert r.outcome == auth.OK and not r.user.can("read", "anything")
    assert a.authenticate("PLAIN", b"\0bob\0pw", False).outcome == auth.LOOPBACK_ONLY
    assert auth.delete_user(path, "bob") and not auth.delete_user(path, "bob")


def test_anonymous(tmp_path):
    a = auth.Authenticator(anonymous=True)
    assert a.mechanisms() == ["PLAIN", "ANONYMOUS"]
    assert a.authenticate("ANONYMOUS", b"", True).outcome == auth.OK
    assert a.authenticate("ANONYMOUS", b"", False).outcome == auth.LOOPBACK_ONLY


def test_password_hash_roundtrip():
    h = auth.hash_password("sécret")
    assert auth.verify_password("sécret", h) and not auth.verify_password("secret", h)
    assert not auth.verify_password("x", "garbage") and not auth.verify_password("x", "md5$1$2$3$4$5")


def test_loopback_detection():
    assert auth.is_loopback("127.0.0.1") and auth.is_loopback("127.8.9.1") and auth.is_loopback("::1")
    assert auth.is_loopback("::ffff:127.0.0.1")
    assert not auth.is_loopback("10.0.0.1") and not auth.is_loopback("nonsense")


def test_check_password_never_logs_in_without_a_password(tmp_path):
    path = str(tmp_path / "users.toml")
    auth.add_user(path, "alice", "pw")
    a = auth.Authenticator(path)
    assert a.check_password("alice", "pw", True).outcome == auth.OK
    for bad in (None, b"pw", 7):
        assert a.check_password("alice", bad, True).outcome == auth.FAILURE
    assert a.check_password(None, "pw", True).outcome == auth.FAILURE


# ------------------------------------------------------------------------------------- named limits

def test_limits_flags_sizes_and_defaults():
    from riverbed.shells.broker import limits as _limits
    cfg = config.load({"max_frame_size": "8MiB", "max_inflight_bytes": "1g", "zmq_max_parts": "3"}, env={})
    lim = _limits.Limits.from_config(cfg)
    assert lim.max_frame_size == 8 << 20 and lim.max_inflight_bytes == 1 << 30 and lim.zmq_max_parts == 3
    assert lim.max_decompressed_size == _limits.DEFAULT.max_decompressed_size
    # every field of Limits is a setting of `riverbed serve` with the same default
    import dataclasses
    for f in dataclasses.fields(_limits.Limits):
        assert f.name in config.BY_NAME, f.name
        assert config.BY_NAME[f.name].default == f.default, f.name
    with pytest.raises(config.ConfigError):
        config.load({"max_pending_bytes": "lots"}, env={})


def test_reject_counts_and_rate_limits_its_log(caplog):
    from riverbed.shells.broker import limits as _limits
    clock = iter([100.0, 101.0, 102.0, 200.0]).__next__
    before = _limits.rejected_count("unit-test", "frame_size")
    with caplog.at_level("WARNING", logger="riverbed.limits"):
        for _ in range(4):
            _limits.reject("unit-test", "frame_size", "a 9 MiB frame", clock=clock)
    assert _limits.rejected_count("unit-test", "frame_size") == before + 4
    lines = [r.getMessage() for r in caplog.records if r.name == "riverbed.limits"]
    assert len(lines) == 2 and "2 more since the last line" in lines[1]
