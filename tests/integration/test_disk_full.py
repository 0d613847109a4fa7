"""A full disk under every protocol, on a real small filesystem (a 48 MiB tmpfs the test mounts).

The server runs with its data directory on the tmpfs. The tests fill the filesystem with a filler file
(or with messages), then check, per protocol: the server does not crash; a publish gets the protocol's
own error (never a closed connection, never a confirm of what was not stored); consumers keep reading;
``/healthz`` is 503 naming the disk and ``/metrics`` says it; publishing resumes on the same connection
once space returns; every confirmed message is there after a restart.
"""

import asyncio
import json
import os
import signal
import socket
import sys
import time
import urllib.error
import urllib.request

import aiohttp
import pytest
import zmq
from rstream import (
    ConfirmationStatus, Consumer, ConsumerOffsetSpecification, OffsetType, Producer, RawMessage,
)

from riverbed.engine import Engine

sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from procs import ServerProcess  # noqa: E402
from smallfs import MIB, small_tmpfs  # noqa: E402

pytestmark = pytest.mark.integration

CREDS = dict(username="guest", password="guest")
ALL_LISTENERS = ("--bson-port", "0", "--zmq-port", "0", "--ws-port", "0", "--text-port", "0", "--http-port", "0")
LIMIT = 8 * MIB


def run(coro, timeout=120):
    return asyncio.run(asyncio.wait_for(coro, timeout))


def healthz(srv):
    """``(status, body)`` of GET /healthz."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{srv.ports['http']}/healthz", timeout=5) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def metric(srv, name):
    with urllib.request.urlopen(f"http://127.0.0.1:{srv.ports['http']}/metrics", timeout=5) as r:
        for line in r.read().decode().splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
    return None


def wait_health(srv, healthy, timeout=10):
    deadline = time.monotonic() + timeout
    while True:
        status, body = healthz(srv)
        if (status == 200) == healthy:
            return body
        if time.monotonic() > deadline:
            pytest.fail(f"/healthz stayed {status}: {body}\n{srv.log()}")
        time.sleep(0.1)


class Disk:
    """The tmpfs and the server on it. ``alarm()`` fills the filesystem under the disk-free limit and waits
    for /healthz to say so; ``space()`` frees it and waits for /healthz to be 200 again."""

    def __init__(self, fs, srv):
        self.fs = fs
        self.srv = srv
        self.confirmed = {}       # stream -> markers of the messages the server confirmed

    def alarm(self):
        self.fs.fill(leave=LIMIT // 2)
        body = wait_health(self.srv, False)
        assert any(r.startswith("disk alarm: disk space low") for r in body["reasons"]), body
        assert body["disk"]["alarm"] is True and body["disk"]["free_limit_bytes"] == LIMIT, body
        assert self.srv.proc.poll() is None
        return body

    def space(self):
        self.fs.unfill()
        body = wait_health(self.srv, True)
        assert body["disk"]["alarm"] is False
        return body

    def confirm(self, stream, marker):
        self.confirmed.setdefault(stream, []).append(marker)


@pytest.fixture(scope="module")
def disk():
    with small_tmpfs("48m") as fs:
        d = Disk(fs, ServerProcess(os.path.join(fs.path, "data"), *ALL_LISTENERS, "--disk-free-limit",
                                   "8MiB").start())
        try:
            yield d
        finally:
            fs.unfill()
            d.srv.kill()        # the restart test replaces d.srv: the server running now is the one to stop


# ------------------------------------------------------------------------------------ RabbitMQ Stream


def test_rabbitmq_stream_publish_below_the_disk_free_limit_gets_stream_not_available_and_resumes(disk):
    srv = disk.srv

    async def scenario():
        async with Producer("127.0.0.1", srv.port, **CREDS) as p:
            await p.create_stream("rmq")
            for i in range(10):
                await p.send_wait("rmq", RawMessage(b"rmq-%d" % i))
                disk.confirm("rmq", "rmq-%d" % i)
            await asyncio.to_thread(disk.alarm)
            assert metric(srv, "riverbed_disk_alarm") == 1.0
            assert metric(srv, "riverbed_disk_free_limit_bytes") == LIMIT
            assert metric(srv, "riverbed_disk_free_bytes") < LIMIT
            # (rstream 1.1.1's send_wait never completes on a PublishError: its error path only serves
            # callbacks, so the refusal is checked through on_publish_confirm)
            statuses = []
            await p.send_batch("rmq", [RawMessage(b"refused-%d" % i) for i in range(5)],
                               on_publish_confirm=statuses.append)
            for _ in range(50):
                if len(statuses) == 5:
                    break
                await asyncio.sleep(0.1)
            assert [(s.is_confirmed, s.response_code) for s in statuses] == [(False, 0x06)] * 5
            assert metric(srv, "riverbed_disk_refused_appends_total") >= 1
            # consumers keep reading
            got = []
            async with Consumer("127.0.0.1", srv.port, **CREDS) as c:
                await c.subscribe("rmq", lambda m, ctx: got.append(bytes(m)),
                                  offset_specification=ConsumerOffsetSpecification(OffsetType.FIRST))
                for _ in range(50):
                    if len(got) >= 10:
                        break
                    await asyncio.sleep(0.1)
            assert got == [b"rmq-%d" % i for i in range(10)]
            await asyncio.to_thread(disk.space)
            assert metric(srv, "riverbed_disk_alarm") == 0.0
            await p.send_wait("rmq", RawMessage(b"rmq-after"))     # the same connection publishes again
            disk.confirm("rmq", "rmq-after")
    run(scenario())
    assert "disk alarm set: disk space low" in srv.log() and "disk alarm cleared" in srv.log()


# -------------------------------------------------------------------------------------------- BSON


def test_bson_publish_below_the_disk_free_limit_gets_errcode_6_and_resumes(disk):
    from riverbed.shells.bson_tcp.client import BsonClient, BsonError

    async def scenario():
        async with await BsonClient.connect(port=disk.srv.ports["bson"]) as c:
            for i in range(5):
                await c.publish("bson", {"m": f"bson-{i}"})
                disk.confirm("bson", f"bson-{i}")
            await asyncio.to_thread(disk.alarm)
            with pytest.raises(BsonError) as info:
                await c.publish("bson", {"m": "refused"})
            assert info.value.code == 6 and "disk alarm" in str(info.value)
            tx = c.transaction()
            await c.start_tx(tx.sess_id)
            await tx.publish("bson", {"m": "refused-in-tx"})
            with pytest.raises(BsonError) as info:
                await tx.commit()
            assert info.value.code == 6
            sub = await c.subscribe("bson", start_pos=0)           # the consumer reads on
            events = [await sub.get(timeout=5) for _ in range(5)]
            assert [e.event["m"] for e in events] == [f"bson-{i}" for i in range(5)]
            await asyncio.to_thread(disk.space)
            await c.publish("bson", {"m": "bson-after"})
            disk.confirm("bson", "bson-after")
            assert (await sub.get(timeout=5)).event["m"] == "bson-after"
    run(scenario())


# ------------------------------------------------------------------------------------------ ZeroMQ


def test_zeromq_put_below_the_disk_free_limit_gets_an_error_reply_and_resumes(disk):
    ctx = zmq.Context()
    try:
        pub, sub = ctx.socket(zmq.DEALER), ctx.socket(zmq.DEALER)
        for s in (pub, sub):
            s.linger = 0
            s.connect(f"tcp://127.0.0.1:{disk.srv.ports['zmq']}")

        def call(sock, *frames):
            sock.send_multipart([b""] + [f if isinstance(f, bytes) else f.encode() for f in frames])
            assert sock.poll(5000), "no reply"
            msg = sock.recv_multipart()
            assert msg[0] == b""
            return msg[1:]

        assert call(sub, "SUB", "ID", "s", "", "zmq") == [b"OK", b"ID", b"s"]
        assert call(pub, "PUT", "TOPIC", "zmq", "ID", "1", "", "zmq-1") == [b"OK", b"ID", b"1"]
        disk.confirm("zmq", "zmq-1")
        assert sub.poll(5000) and sub.recv_multipart()[-1] == b"zmq-1"
        disk.alarm()
        reply = call(pub, "PUT", "TOPIC", "zmq", "ID", "2", "", "refused")
        assert reply[:2] == [b"ERROR", b"MESSAGE"] and b"disk alarm" in reply[2] and reply[3:] == [b"ID", b"2"]
        assert not sub.poll(300)                  # nothing was stored, so nothing is delivered
        disk.space()
        assert call(pub, "PUT", "TOPIC", "zmq", "ID", "3", "", "zmq-3") == [b"OK", b"ID", b"3"]
        disk.confirm("zmq", "zmq-3")
        assert sub.poll(5000) and sub.recv_multipart()[-1] == b"zmq-3"
    finally:
        ctx.destroy(linger=0)


# ---------------------------------------------------------------------------------- WebSocket JSON


def test_websocket_publish_below_the_disk_free_limit_gets_an_error_message_and_resumes(disk):
    async def scenario():
        async with aiohttp.ClientSession() as s:
            url = f"http://127.0.0.1:{disk.srv.ports['ws']}/api/v1/ws"
            pub, sub = await s.ws_connect(url), await s.ws_connect(url)

            async def recv(ws, timeout=5):
                return json.loads((await ws.receive(timeout)).data)

            await pub.send_json({"type": "publish", "stream": "ws", "msg": json.dumps({"m": "ws-0"})})
            # a Streamr publish has no answer: wait until ws-0 is stored, so the live subscription (from
            # the end) starts after it whatever the order the two connections are served in
            last = f"http://127.0.0.1:{disk.srv.ports['ws']}/api/v1/streams/ws/data/partitions/0/last"
            for _ in range(100):
                async with s.get(last) as r:
                    if r.status == 200 and await r.json():
                        break
                await asyncio.sleep(0.05)
            await sub.send_json({"type": "subscribe", "stream": "ws"})
            assert (await recv(sub))[1] == 2                   # subscribed
            await pub.send_json({"type": "publish", "stream": "ws", "msg": json.dumps({"m": "ws-1"})})
            got = await recv(sub)
            assert got[1] == 0 and json.loads(got[3][-1]) == {"m": "ws-1"}
            disk.confirm("ws", "ws-0")
            disk.confirm("ws", "ws-1")
            await asyncio.to_thread(disk.alarm)
            await pub.send_json({"type": "publish", "stream": "ws", "msg": json.dumps({"m": "refused"})})
            err = await recv(pub)
            assert err[:3] == [0, 7, ""] and "disk alarm" in err[3], err
            # a reader still reads the history
            await pub.send_json({"type": "resend", "stream": "ws", "sub": "r", "resend_last": 5})
            frames = [await recv(pub) for _ in range(4)]
            assert [f[1] for f in frames] == [4, 1, 1, 5], frames
            assert [json.loads(f[3][-1]) for f in frames[1:3]] == [{"m": "ws-0"}, {"m": "ws-1"}]
            # the REST publish says 503
            async with s.post(f"http://127.0.0.1:{disk.srv.ports['ws']}/api/v1/streams/ws/data",
                              json={"m": "refused-rest"}) as r:
                assert r.status == 503 and "disk alarm" in await r.text()
            await asyncio.to_thread(disk.space)
            await pub.send_json({"type": "publish", "stream": "ws", "msg": json.dumps({"m": "ws-2"})})
            got = await recv(sub)
            assert got[1] == 0 and json.loads(got[3][-1]) == {"m": "ws-2"}    # only ws-2: nothing refused was kept
            disk.confirm("ws", "ws-2")
            assert not pub.closed and not sub.closed
    run(scenario())


# ------------------------------------------------------------------------------------------ REAM text


def test_ream_publish_below_the_disk_free_limit_gets_event_non_published_and_resumes(disk):
    sock = socket.create_connection(("127.0.0.1", disk.srv.ports["ream"]), timeout=10)
    f = sock.makefile("rb")
    try:
        f.readline()                                          # the banner

        def publish(obj):
            payload = json.dumps(obj).encode()
            sock.sendall(b"EVENT PUBLISH ream %d\n%s\n" % (len(payload), payload))
            return f.readline().decode().rstrip("\n")

        assert publish({"m": "ream-1"}) == "EVENT PUBLISHED ream 1"
        disk.confirm("ream", "ream-1")
        disk.alarm()
        line = publish({"m": "refused"})
        assert line.startswith('EVENT NON PUBLISHED ream "disk alarm: disk space low'), line
        sock.sendall(b"EVENT SUBSCRIBE ream 1\n")             # a reader still reads
        assert f.readline().decode().startswith("EVENT SUBSCRIBED ream 1 1")
        disk.space()
        got = []
        sock.settimeout(10)
        payload = json.dumps({"m": "ream-2"}).encode()
        sock.sendall(b"EVENT PUBLISH ream %d\n%s\n" % (len(payload), payload))
        while not any(x.startswith("EVENT PUBLISHED ream") for x in got):
            got.append(f.readline().decode().rstrip("\n"))
        assert "EVENT PUBLISHED ream 2" in got, got             # event 2: the refused one took no id
        disk.confirm("ream", "ream-2")
    finally:
        f.close()
        sock.close()


# -------------------------------------------------------------------------------- after the restart


def _stored(data_dir, stream):
    with Engine(data_dir, readonly=True) as eng:
        return [bytes(r) for _, r in eng.scan(stream)]


def test_every_confirmed_message_is_there_after_a_restart_and_nothing_refused(disk):
    srv = disk.srv
    assert srv.stop() == 0, srv.log()
    assert disk.confirmed, "the protocol tests above did not run"
    for stream, markers in disk.confirmed.items():
        records = _stored(srv.data_dir, stream)
        assert len(records) == len(markers), (stream, records)
        for marker, rec in zip(markers, records):
            assert marker.encode() in rec, (stream, marker, rec)
        assert not any(b"refused" in r for r in records)
    again = ServerProcess(srv.data_dir, *ALL_LISTENERS, "--disk-free-limit", "8MiB").start()
    disk.srv = again
    assert wait_health(again, True)["disk"]["alarm"] is False


# ---------------------------------------------------------------- filling the disk with messages


async def _publish_until_refused(port, stream, confirmed, refused, size=1024, batch=200, limit=200_000):
    """Publish ``size``-byte messages with rstream until the server refuses some; ``confirmed`` and
    ``refused`` collect publishing ids."""
    async with Producer("127.0.0.1", port, **CREDS) as p:
        if stream not in confirmed:
            await p.create_stream(stream)

        def on_confirm(st: ConfirmationStatus):
            (confirmed if st.is_confirmed else refused).setdefault(stream, {})[st.message_id] = st.response_code

        sent = 0
        while not refused.get(stream) and sent < limit:
            msgs = [RawMessage(b"%010d" % (sent + i) + b"x" * (size - 10), publishing_id=sent + i + 1)
                    for i in range(batch)]
            await p.send_batch(stream, msgs, on_publish_confirm=on_confirm)
            sent += batch
            if sent % (batch * 20) == 0:
                await asyncio.sleep(0.05)       # let confirms (and refusals) catch up
        for _ in range(100):
            if len(confirmed.get(stream, {})) + len(refused.get(stream, {})) >= sent:
                break
            await asyncio.sleep(0.1)
        return sent


@pytest.mark.slow
@pytest.mark.parametrize("limit", ["0", "8MB"], ids=["engine-refuses", "disk-alarm"])
def test_rstream_filling_a_48mb_disk_with_1kb_messages_gets_publish_errors_not_a_bus_error(limit):
    """The issue's scenario: rstream publishing 1 KB messages onto a 48 MB filesystem. ``0``: no disk
    alarm, so the engine itself refuses when the filesystem cannot give the data file more room."""
    with small_tmpfs("48m") as fs:
        data = os.path.join(fs.path, "data")
        srv = ServerProcess(data, "--http-port", "0", "--disk-free-limit", limit).start()
        try:
            confirmed, refused = {}, {}
            run(_publish_until_refused(srv.port, "fill", confirmed, refused), timeout=240)
            assert srv.proc.poll() is None, f"the server died (exit {srv.proc.returncode}):\n{srv.log()}"
            assert refused.get("fill"), "nothing was refused on a full disk"
            assert set(refused["fill"].values()) == {0x06}
            n = len(confirmed["fill"])
            assert n > 20_000                     # most of the 48 MB held messages before the refusals
            if limit == "0":
                assert healthz(srv)[0] == 200     # no alarm asked for: the engine refused on its own
            else:
                assert wait_health(srv, False)["disk"]["alarm"] is True
            fs.resize("96m")                      # space returns
            if limit != "0":
                wait_health(srv, True)
            more_confirmed, more_refused = dict(confirmed), {}
            more_confirmed["fill"] = {}
            run(_publish_until_refused(srv.port, "fill", more_confirmed, more_refused, limit=2000), timeout=120)
            assert not more_refused.get("fill") and len(more_confirmed["fill"]) == 2000
            assert srv.stop(signal.SIGTERM) == 0, srv.log()
            assert "Bus error" not in srv.log()
            records = _stored(data, "fill")
            # every confirmed message is there, at its place; nothing after a refusal slipped in
            ok = sorted(confirmed["fill"]) + sorted(more_confirmed["fill"])
            assert len(records) == len(ok)
            assert all(len(r) == 1024 for r in records)
        finally:
            srv.kill()


def test_max_disk_refuses_publishes_at_the_cap_and_a_deletion_gives_the_room_back(tmp_path):
    srv = ServerProcess(tmp_path / "data", "--http-port", "0", "--max-disk", "12MiB",
                        "--disk-free-limit", "0").start()
    try:
        confirmed, refused = {}, {}
        run(_publish_until_refused(srv.port, "capped", confirmed, refused), timeout=120)
        assert set(refused["capped"].values()) == {0x06}
        assert 8_000 < len(confirmed["capped"]) < 12_000
        body = wait_health(srv, False)
        assert any(r.startswith("disk alarm: data at its cap") for r in body["reasons"]), body
        assert body["disk"]["max_disk_bytes"] == 12 << 20
        assert metric(srv, "riverbed_disk_max_bytes") == 12 << 20
        assert os.path.getsize(tmp_path / "data" / "data.mdb") <= 12 << 20

        async def delete():
            async with Producer("127.0.0.1", srv.port, **CREDS) as p:
                await p.delete_stream("capped")
        run(delete())
        wait_health(srv, True)
        more, more_refused = {}, {}
        run(_publish_until_refused(srv.port, "again", more, more_refused, limit=4000), timeout=120)
        assert not more_refused.get("again") and len(more["again"]) == 4000
        assert srv.stop() == 0, srv.log()
    finally:
        srv.kill()
