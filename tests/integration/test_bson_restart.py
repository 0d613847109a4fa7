"""The BSON/TCP shell across restarts, crashes and configurations: durable subscriptions and projections
after a restart, SIGKILL during a 10,000-event COMMITTX, the users file, the idle timeout."""

import asyncio
import re
import signal
import socket
import struct
import time

import bson
import pytest

from procs import ServerProcess
from riverbed.shells import auth
from riverbed.shells.bson_tcp.client import BsonClient, BsonError

pytestmark = pytest.mark.integration


def run(coro, timeout=180):
    async def bounded():
        return await asyncio.wait_for(coro, timeout)
    return asyncio.run(bounded())


def start(data, *flags):
    return ServerProcess(data, "--bson-port", "0", *flags).start()


@pytest.fixture
def servers():
    started = []

    def make(data, *flags):
        s = start(data, *flags)
        started.append(s)
        return s
    yield make
    for s in started:
        s.kill()


async def drain(sub, t=0.5):
    out = []
    while True:
        try:
            out.append(await sub.get(t))
        except asyncio.TimeoutError:
            return out


def test_durable_subscription_and_projection_survive_a_restart(tmp_path, servers):
    data = tmp_path / "data"
    srv = servers(data)

    async def before(port):
        async with await BsonClient.connect(port=port) as cl:
            await asyncio.gather(*[cl.publish_nowait("orders", {"id": i % 10, "n": i}) for i in range(1000)])
            await cl.create_projection("totals", channel="orders", binder="by_id", doc_id="id")
            sub = await cl.subscribe("orders", start_pos=0, durable_id="reader-1", auto_ack=False)
            evs = [await sub.get(5) for _ in range(400)]
            sub.ack(sum(e.size for e in evs), evs[-1].pos)
            await cl.ping()
            for _ in range(200):
                if (await cl.find_by_id("by_id", 9) or {}).get("n") == 999:
                    break
                await asyncio.sleep(0.05)
            assert await cl.find_by_id("by_id", 9) == {"id": 9, "n": 999}
    run(before(srv.ports["bson"]))
    assert srv.stop() == 0
    srv = servers(data)
    # the projection resumes from its stored position: nothing is applied again
    m = re.search(r"projection 'totals' on 'orders' -> 'by_id' from position (\d+)", srv.log())
    assert m and int(m.group(1)) == 1000, srv.log()

    async def after(port):
        async with await BsonClient.connect(port=port) as cl:
            sub = await cl.subscribe("orders", start_pos=0, durable_id="reader-1")
            e = await sub.get(5)
            assert e.pos == 400
            rest = [e] + await drain(sub)
            assert [x.pos for x in rest] == list(range(400, 1000))
            await cl.publish("orders", {"id": 3, "n": "new"})
            for _ in range(100):
                if (await cl.find_by_id("by_id", 3) or {}).get("n") == "new":
                    break
                await asyncio.sleep(0.05)
            assert await cl.find_by_id("by_id", 3) == {"id": 3, "n": "new"}
            assert len([d async for d in cl.query("by_id")]) == 10
    run(after(srv.ports["bson"]))
    assert srv.stop() == 0


@pytest.mark.slow
def test_sigkill_during_a_10000_event_commit_leaves_all_or_none(tmp_path, servers):
    data = tmp_path / "data"
    outcomes = []
    for attempt, delay in enumerate([0.0, 0.002, 0.01, 0.03, 0.1]):
        srv = servers(data)
        port = srv.ports["bson"]
        s = socket.create_connection(("127.0.0.1", port))
        frames = [bson.encode({"type": "CONNECT", "frame": {"version": "0.1"}}),
                  bson.encode({"type": "STARTTX", "frame": {"sessID": 1, "rID": 1}})]
        frames += [bson.encode({"type": "PUB", "frame": {"channel": "tx", "sessID": 1, "rID": 2 + i,
                                                         "event": {"attempt": attempt, "i": i, "pad": "p" * 50}}})
                   for i in range(10_000)]
        s.sendall(b"".join(frames))
        # wait for the 10,001 answers (STARTTX + every PUB at once), then COMMITTX and kill
        need, buf = 10_002, b""
        while need:
            buf += s.recv(1 << 20)
            while len(buf) >= 4 and len(buf) >= struct.unpack_from("<i", buf)[0]:
                n = struct.unpack_from("<i", buf)[0]
                assert bson.decode(buf[:n])["frame"]["ok"]
                buf = buf[n:]
                need -= 1
        s.sendall(bson.encode({"type": "COMMITTX", "frame": {"sessID": 1, "rID": 99_999}}))
        time.sleep(delay)
        srv.kill()
        s.close()
        srv = servers(data)

        async def count(port):
            async with await BsonClient.connect(port=port) as cl:
                if "tx" not in await cl.list_channels():
                    return 0
                sub = await cl.subscribe("tx", start_pos=0, matcher={"attempt": attempt})
                evs = await drain(sub, 1.0)
                if evs:
                    assert [e.event["i"] for e in evs] == list(range(10_000))
                    assert [e.pos for e in evs] == list(range(evs[0].pos, evs[0].pos + 10_000))
                return len(evs)
        n = run(count(srv.ports["bson"]))
        assert n in (0, 10_000), n
        outcomes.append(n)
        srv.kill()
    print("outcomes", outcomes)


def test_users_file_auth_and_permissions(tmp_path, servers):
    users = tmp_path / "users.toml"
    auth.add_user(str(users), "alice", "s3cret", configure="^alice-", write="^alice-", read="^alice-")
    srv = servers(tmp_path / "data", "--users", str(users))
    port = srv.ports["bson"]

    async def main():
        for creds in ({}, {"username": "alice"}, {"username": "alice", "password": "nope"},
                      {"username": "bob", "password": "s3cret"}):
            with pytest.raises(BsonError) as ei:
                await BsonClient.connect(port=port, **creds)
            assert ei.value.code == 1
        async with await BsonClient.connect(port=port, username="alice", password="s3cret") as cl:
            await cl.publish("alice-1", {"ok": 1})
            with pytest.raises(BsonError) as ei:
                await cl.publish("bob-1", {"no": 1})
            assert ei.value.code == 2
            with pytest.raises(BsonError) as ei:
                await cl.subscribe("bob-1", start_pos=0)
            assert ei.value.code == 2
            with pytest.raises(BsonError) as ei:
                [d async for d in cl.query("bob-binder")]
            assert ei.value.code == 2
            with pytest.raises(BsonError) as ei:
                await cl.create_channel("bob-2")
            assert ei.value.code == 2
            # still open, nothing stored
            chans = await cl.list_channels()
            assert "alice-1" in chans and "bob-1" not in chans
            sub = await cl.subscribe("alice-1", start_pos=0)
            assert (await sub.get(5)).event == {"ok": 1}
    run(main())
    assert srv.stop() == 0


def test_idle_connections_are_closed(tmp_path, servers):
    srv = servers(tmp_path / "data", "--bson-idle-timeout", "1")
    port = srv.ports["bson"]
    idle = socket.create_connection(("127.0.0.1", port))
    idle.sendall(bson.encode({"type": "CONNECT", "frame": {"version": "0.1"}}))
    pinger = socket.create_connection(("127.0.0.1", port))
    pinger.sendall(bson.encode({"type": "CONNECT", "frame": {"version": "0.1"}}))
    t0 = time.monotonic()
    idle.settimeout(0.2)
    closed_at = None
    got = b""
    while time.monotonic() - t0 < 4:
        pinger.sendall(bson.encode({"type": "PING", "frame": {"type": 8, "sequence": 1}}))
        try:
            chunk = idle.recv(4096)
            if not chunk:
                closed_at = time.monotonic() - t0
                break
            got += chunk
        except socket.timeout:
            pass
    assert closed_at is not None and 0.9 < closed_at < 2.5, closed_at
    pinger.settimeout(2)
    pinger.sendall(bson.encode({"type": "LISTCHANNELS", "frame": {"rID": 5}}))
    data = b""
    while b"channels" not in data:
        chunk = pinger.recv(65536)
        assert chunk, "the pinging connection was closed"
        data += chunk
    idle.close()
    pinger.close()
    assert srv.stop(signal.SIGTERM) == 0


def test_sigterm_answers_in_flight_pubs_then_exits_0(tmp_path, servers):
    data = tmp_path / "data"
    srv = servers(data)
    s = socket.create_connection(("127.0.0.1", srv.ports["bson"]))
    s.sendall(bson.encode({"type": "CONNECT", "frame": {"version": "0.1"}}))
    s.sendall(b"".join(bson.encode({"type": "PUB", "frame": {"channel": "term", "rID": i, "event": {"i": i}}})
                       for i in range(20_000)))
    time.sleep(0.05)
    srv.proc.send_signal(signal.SIGTERM)
    buf, acked = b"", set()
    s.settimeout(15)
    while True:
        chunk = s.recv(1 << 20)
        if not chunk:
            break
        buf += chunk
        while len(buf) >= 4 and len(buf) >= struct.unpack_from("<i", buf)[0]:
            n = struct.unpack_from("<i", buf)[0]
            f = bson.decode(buf[:n])["frame"]
            buf = buf[n:]
            if f.get("ok") and "rID" in f:
                acked.add(f["rID"])
    s.close()
    assert srv.proc.wait(15) == 0
    srv = servers(data)

    async def stored(port):
        async with await BsonClient.connect(port=port) as cl:
            if "term" not in await cl.list_channels():
                return set()
            sub = await cl.subscribe("term", start_pos=0)
            return {e.event["i"] for e in await drain(sub)}
    got = run(stored(srv.ports["bson"]))
    assert acked <= got, len(acked - got)         # every answered PUB is stored
    assert got == set(range(len(got)))            # and what is stored is a prefix, in order
