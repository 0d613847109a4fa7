"""The session kernel (shells/broker/session.py) on its own: the COMMANDS form, the one lifecycle every
protocol session inherits (guard, idle and handshake timeouts, held refusals, read pausing, release),
the one shutdown drain, and that each TCP protocol's session is built on it."""

import asyncio

import pytest

from riverbed.shells.broker.session import (
    Command, SessionKernel, State, commands, drain, handler_name,
)
from riverbed.shells.bson_tcp.session import COMMANDS as BSON_COMMANDS
from riverbed.shells.bson_tcp.session import BsonSession
from riverbed.shells.ream_text.session import COMMANDS as REAM_COMMANDS
from riverbed.shells.ream_text.session import ReamSession
from riverbed.shells.rmq_stream.session import COMMANDS as RMQ_COMMANDS
from riverbed.shells.rmq_stream.session import RmqStreamSession

from .harness import FakeIO, Loop


class AbortingIO(FakeIO):
    """FakeIO plus ``abort``, which the kernel's guard uses; deferred calls run at once."""

    def __init__(self):
        super().__init__()
        self.aborted = None

    def abort(self, internal=False):
        self.aborted = internal

    def defer(self, fn, *args):
        fn(*args)


class Shell:
    def __init__(self, broker):
        self.broker = broker


class Echo(SessionKernel):
    """A minimal protocol: lines ``NAME`` answered ``ok NAME``; ``LOGIN`` opens; idle 5 s; login 2 s."""
    PROTOCOL = "echo"
    subscriptions = {}

    def _received(self, data):
        for line in bytes(data).split(b"\n"):
            if not line:
                continue
            cmd = COMMANDS.get(line.decode())
            if cmd is None or cmd.min_state > self.state:
                self._send(b"error\n")
            else:
                cmd.handler(self)
        self._flush()

    def _on_login(self):
        self.state = State.OPEN
        self._send(b"ok LOGIN\n")

    def _on_ping(self):
        self._send(b"ok PING\n")

    def _on_crash(self):
        raise RuntimeError("a bug")

    def _on_refuse(self):
        self._refuse_later(b"refused\n", 3.0)

    def _handshake_timeout(self):
        return 2.0

    def _idle_timeout(self):
        return 5.0


COMMANDS = commands(Echo, {"LOGIN": ("LOGIN", State.HANDSHAKE), "PING": ("PING", State.OPEN),
                           "CRASH": ("CRASH", State.HANDSHAKE), "REFUSE": ("REFUSE", State.HANDSHAKE)})


@pytest.fixture
def loop(tmp_path):
    lp = Loop(tmp_path)
    yield lp
    lp.close()


def echo(loop):
    io = AbortingIO()
    return Echo(Shell(loop.broker), io, peer="test:1", local=("127.0.0.1", 9), remote=("127.0.0.1", 1)), io


def test_handler_names_follow_one_pattern():
    assert handler_name("PeerProperties") == "_on_peer_properties"
    assert handler_name("EVENT PUBLISH") == "_on_event_publish"
    assert handler_name("LISTCHANNELS") == "_on_listchannels"
    assert handler_name("ConsumerUpdateResponse") == "_on_consumer_update_response"


def test_a_table_naming_a_missing_handler_fails_at_build():
    with pytest.raises(AttributeError):
        commands(Echo, {"NOPE": ("NOPE", State.OPEN)})


def test_every_tcp_protocol_session_is_a_kernel_with_a_table_of_one_form():
    for cls, table in ((RmqStreamSession, RMQ_COMMANDS), (BsonSession, BSON_COMMANDS), (ReamSession, REAM_COMMANDS)):
        assert issubclass(cls, SessionKernel)
        assert table and all(isinstance(c, Command) for c in table.values())
        for c in table.values():
            assert c.handler.__name__ == handler_name(c.name), (cls, c)
            assert isinstance(c.min_state, State)


def test_states_are_ordered_and_named_for_the_management_api(loop):
    assert State.HANDSHAKE < State.AUTH < State.OPEN < State.CLOSING < State.CLOSED
    s, io = echo(loop)
    assert s.connection_info()["state"] == "starting" and s in loop.broker.sessions
    s.data_received(b"PING\nLOGIN\nPING\n")
    assert bytes(io.out) == b"error\nok LOGIN\nok PING\n"
    info = s.connection_info()
    assert info["state"] == "running" and info["protocol"] == "echo" and info["name"] == "127.0.0.1:1 -> 127.0.0.1:9"


def test_a_bug_costs_the_connection_only(loop):
    s, io = echo(loop)
    s.guard(s.data_received, b"CRASH\n")
    assert io.aborted is True and s.state == State.CLOSED and s not in loop.broker.sessions
    s.guard(s.data_received, b"PING\n")         # input after the abort is ignored, never raises
    assert bytes(io.out) == b""


def test_handshake_and_idle_timeouts_close_through_tick(loop):
    s, io = echo(loop)
    s.tick(loop.now + 1.9)
    assert not io.closed
    s.tick(loop.now + 2.1)
    assert io.closed and s.state == State.CLOSED
    s2, io2 = echo(loop)
    s2.data_received(b"LOGIN\n")
    s2.tick(loop.now + 4.9)
    assert not io2.closed
    s2.tick(loop.now + 5.1)
    assert io2.closed and s not in loop.broker.sessions


def test_a_held_refusal_goes_out_after_its_delay_and_input_meanwhile_is_moot(loop):
    s, io = echo(loop)
    s.data_received(b"REFUSE\n")
    assert s.state == State.CLOSING and bytes(io.out) == b""
    s.data_received(b"LOGIN\n")
    s.tick(loop.now + 2.9)
    assert bytes(io.out) == b"" and not io.closed
    s.tick(loop.now + 3.0)
    assert bytes(io.out) == b"refused\n" and io.closed


def test_reading_pauses_for_a_full_transport_and_shutdown_and_backlog(loop):
    s, io = echo(loop)
    s.pause_writing()
    assert not io.reading
    s.resume_writing()
    assert io.reading
    done = [s._later(lambda: None) for _ in range(s.PENDING_OPS_HIGH + 1)]
    assert not io.reading and s.pending_ops == s.PENDING_OPS_HIGH + 1
    for fn in done[:s.PENDING_OPS_HIGH - s.PENDING_OPS_LOW]:
        fn()
    assert not io.reading              # hysteresis: not until the low mark
    done[s.PENDING_OPS_HIGH - s.PENDING_OPS_LOW]()
    assert io.reading
    s.begin_shutdown()
    assert not io.reading


def test_the_drain_waits_for_pending_ops_then_closes_gracefully(loop):
    s, io = echo(loop)
    s.data_received(b"LOGIN\n")
    finish = s._later(lambda: s._send(b"late answer\n"))

    async def run():
        aloop = asyncio.get_running_loop()
        aloop.call_later(0.05, finish)
        live = [s]
        left = await drain(aloop, lambda: [x for x in live if x.state < State.CLOSED], drain_timeout=5, close_grace=0.1)
        return left
    assert asyncio.run(run()) == []
    assert bytes(io.out).endswith(b"late answer\n") and io.closed and not io.reading


def test_the_tcp_adapter_contains_a_bug_in_a_session_or_its_set_up(loop):
    """Over a real socket: a session that raises (in a command, or while it is built) costs its own
    connection (closed, counted as an internal error), and the listener serves the next one."""
    from riverbed.shells.broker import TcpListener

    def factory(io, **where):
        if len(built) == 1:
            built.append(None)
            raise RuntimeError("a bug in set-up")
        built.append(Echo(Shell(loop.broker), io, **where))
        return built[-1]
    built = []

    async def talk(port, data):
        r, w = await asyncio.open_connection("127.0.0.1", port)
        w.write(data)
        got = await asyncio.wait_for(r.read(), 5)       # to EOF: the server closed or aborted
        w.close()
        return got

    async def run():
        lst = TcpListener(loop.broker, factory, name="echo-test")
        await lst.start()
        try:
            crashed = await talk(lst.port, b"LOGIN\nCRASH\n")
            refused = await talk(lst.port, b"LOGIN\n")
            r, w = await asyncio.open_connection("127.0.0.1", lst.port)
            w.write(b"LOGIN\nPING\n")
            ok = await asyncio.wait_for(r.readexactly(len(b"ok LOGIN\nok PING\n")), 5)
            w.close()
            return crashed, refused, ok, dict(lst.stats.errors)
        finally:
            await lst.shutdown(drain_timeout=1)
    crashed, refused, ok, errors = asyncio.run(run())
    assert refused == b"" and ok == b"ok LOGIN\nok PING\n"
    assert errors.get("internal") == 2
