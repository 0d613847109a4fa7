"""One name per protocol (issue 22): the listener, its sessions' metric label and management API
protocol, its port setting and the log line all carry the name of ``riverbed.shells.protocols``; the
REAM settings' old ``text_*`` names still work, with a warning."""

import argparse
import importlib
import logging

import pytest

from riverbed.shells import cli, config, protocols
from riverbed.shells.protocols import BSON, HTTP, KAFKA, REAM, STREAM, STREAM_TLS, WS, ZMQ

# name -> (listener class, session class); HTTP has no protocol session
CLASSES = {
    STREAM: ("riverbed.shells.rmq_stream.server:RmqStreamServer", "riverbed.shells.rmq_stream.session:RmqStreamSession"),
    BSON: ("riverbed.shells.bson_tcp.server:BsonServer", "riverbed.shells.bson_tcp.session:BsonSession"),
    ZMQ: ("riverbed.shells.zmq_mc0.server:McServer", "riverbed.shells.zmq_mc0.session:McSession"),
    WS: ("riverbed.shells.ws_json.server:WsJsonServer", "riverbed.shells.ws_json.session:WsSession"),
    REAM: ("riverbed.shells.ream_text.server:ReamServer", "riverbed.shells.ream_text.session:ReamSession"),
    KAFKA: ("riverbed.shells.kafka.server:KafkaServer", "riverbed.shells.kafka.session:KafkaSession"),
    HTTP: ("riverbed.shells.http.server:HttpServer", None),
}


def _load(path):
    module, _, name = path.partition(":")
    return getattr(importlib.import_module(module), name)


def test_every_listener_is_covered():
    assert {name for name, _ in protocols.LISTENERS} == set(CLASSES)
    assert [name for _, name, _ in cli.SHELLS] == [name for name, _ in protocols.LISTENERS]


@pytest.mark.parametrize("name", sorted(CLASSES))
def test_one_name_everywhere(name):
    server_path, session_path = CLASSES[name]
    assert _load(server_path).name == name                    # log line, /healthz, listener metrics
    key = protocols.port_setting(name)
    assert key in config.BY_NAME                              # --<name>-port
    assert (key, name) in [(k, n) for k, n, _ in cli.SHELLS]
    if session_path is not None:
        session = _load(session_path)
        assert session.LISTENER == session.PROTOCOL == name   # riverbed_rejected_total, management API
        module = importlib.import_module(session.__module__)
        assert module.LISTENER == name


def test_stream_tls_listener_name():
    assert protocols.port_setting(STREAM_TLS) in config.BY_NAME        # --stream-tls-port


def test_protocol_settings_carry_the_name():
    """Every setting of one protocol's listener starts with that protocol's name (``ream_user``, not
    ``text_user``)."""
    assert not [o.name for o in config.OPTIONS if o.name.startswith("text_")]
    assert {"ream_port", "ream_user", "ream_keepalive", "ream_max_payload", "ream_max_line"} <= set(config.BY_NAME)


def test_old_ream_flags_are_aliases_that_warn(caplog):
    parser = argparse.ArgumentParser()
    config.add_arguments(parser)
    # the last flag given wins, old or new (tests put "--ream-port off" first, then their own)
    args = parser.parse_args(["--ream-port", "off", "--text-port", "0", "--text-max-line", "4KiB"])
    flags = {o.name: getattr(args, o.name) for o in config.OPTIONS}
    flags[config.DEPRECATED_FLAGS] = getattr(args, config.DEPRECATED_FLAGS)
    cfg = config.load(flags, env={})
    assert cfg.ream_port == 0 and cfg.ream_max_line == 4096
    assert cfg.text_port == 0                                   # old code reading the old name still works
    assert cfg.deprecated == [("--text-port", "--ream-port"), ("--text-max-line", "--ream-max-line")]
    args = parser.parse_args(["--text-port", "0", "--ream-port", "off"])
    assert args.ream_port == "off"

    with caplog.at_level(logging.WARNING, logger="riverbed"):
        cli.warn_deprecated(cfg)
    assert "--text-port is deprecated: use --ream-port" in caplog.text


def test_old_ream_names_in_environment_and_file(tmp_path):
    cfg = config.load({}, env={"RIVERBED_TEXT_USER": "app", "RIVERBED_TEXT_PORT": "off"})
    assert cfg.ream_user == "app" and cfg.ream_port is None
    assert ("RIVERBED_TEXT_USER", "RIVERBED_REAM_USER") in cfg.deprecated
    # the new name wins over the old one in the same layer
    cfg = config.load({}, env={"RIVERBED_TEXT_PORT": "off", "RIVERBED_REAM_PORT": "7999"})
    assert cfg.ream_port == 7999
    toml = tmp_path / "riverbed.toml"
    toml.write_text('text_keepalive = 2.5\n')
    cfg = config.load({"config": str(toml)}, env={})
    assert cfg.ream_keepalive == 2.5
    assert cfg.deprecated == [(f"text_keepalive in file {toml}", "ream_keepalive")]
    assert config.load({}, env={}).deprecated == []


SESSIONS = [path for _, path in CLASSES.values() if path is not None]


@pytest.mark.parametrize("path", SESSIONS)
def test_handlers_follow_the_one_pattern(path):
    """Every ``_on_*`` method of a protocol session is the handler of a command of its ``COMMANDS``
    table, named ``_on_<snake name>`` by the kernel, or one of the kernel's three hooks."""
    from riverbed.shells.broker.session import KERNEL_HOOKS, handler_name
    session = _load(path)
    table = importlib.import_module(session.__module__).COMMANDS
    handlers = {handler_name(c.name) for c in table.values()}
    assert all(c.handler.__name__ == handler_name(c.name) for c in table.values())
    methods = {n for n in dir(session) if n.startswith("_on_") and callable(getattr(session, n))}
    assert methods - KERNEL_HOOKS == handlers, sorted(methods ^ handlers)


def test_a_command_may_not_take_a_kernel_hook_name():
    from riverbed.shells.broker.session import SessionKernel, State, commands

    class Odd(SessionKernel):
        def _on_tick(self, now):
            pass

    with pytest.raises(ValueError, match="kernel hook"):
        commands(Odd, {1: ("Tick", State.OPEN)})
