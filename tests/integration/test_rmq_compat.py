"""RabbitMQ Stream compatibility: what the clients' own integration suites found (issue 14).

Each finding is checked with rstream 1.1.1 (in this process, asyncio), with the older rstream 0.20.x (a
subprocess running ``_old_rstream_client.py`` with the python of ci/rstream-old.sh's venv; both client
lines are in use) and, where the order of frames on one connection matters, with raw frames:

1. Deleting a stream the client consumes: the DeleteResponse comes before the MetadataUpdate (rstream
   0.20 closes a consumer connection on the MetadataUpdate of its last stream, so the response must not
   come after it).
2. Single active consumer on a super stream, three rounds on one server with the super stream deleted
   and re-created in between: every message exactly once, one active consumer per partition, each round.
3. OffsetType.LAST after one Publish frame of 4,999 messages: at most 1,000 (chunks are bounded), the tail.
4. OffsetType.NEXT right after an unconfirmed batch: only what was published after the Subscribe.
5. Chunks carry epoch 1 (bytes 16..24 of the 48-byte chunk header in a Deliver).
6. RabbitMQ's management API, connections: list, get, close (``--http-port``), basic auth.

The old client's venv: ``$RIVERBED_RSTREAM_OLD_PYTHON`` if set, else whatever ci/rstream-old.sh prints
(it installs the pinned 0.20.x into the test cache the first time; `make test` runs it beforehand).
"""

import asyncio
import base64
import json
import os
import queue
import socket
import struct
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
import rstream
from rstream import (
    Consumer, ConsumerOffsetSpecification, OffsetSpecification, OffsetType, Producer, RouteType,
    SuperStreamConsumer, SuperStreamCreationOption, SuperStreamProducer,
)
from rstream.recovery import BackOffRecoveryStrategy

import rawwire
from procs import ServerProcess
from rawwire import frame, props, s

pytestmark = pytest.mark.integration

HOST = "127.0.0.1"
CREDS = dict(username="guest", password="guest")
ROOT = Path(__file__).resolve().parents[2]
RSTREAM_OLD_SH = ROOT / "ci" / "rstream-old.sh"
OLD_CLIENT = Path(__file__).with_name("_old_rstream_client.py")

KEY_DELIVER = 0x0008
KEY_DELETE = 0x000E
KEY_METADATA = 0x000F
KEY_METADATA_UPDATE = 0x0010
KEY_CLOSE = 0x0016
KEY_SUBSCRIBE = 0x0007
KEY_CREDIT = 0x0009
RESPONSE = 0x8000
OFFSET_FIRST, OFFSET_LAST, OFFSET_NEXT = 1, 2, 3
CHUNK_HEADER = struct.Struct(">BBHIqQQIIIB3s")      # the 48-byte Osiris chunk header


# ------------------------------------------------------------------------------------- plumbing

def run(coro, timeout=120):
    async def bounded():
        return await asyncio.wait_for(coro, timeout)
    return asyncio.run(bounded())


async def wait_until(pred, timeout, step=0.05):
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not pred():
        if loop.time() >= deadline:
            return False
        await asyncio.sleep(step)
    return True


def start_server(data_dir, *args, http=False):
    """``riverbed serve`` on port 0; with ``http``, also ``--http-port 0`` and its port in ports["http"]
    (without, the HTTP listener is off, whatever its default port)."""
    args = (*args, "--http-port", "0" if http else "off")
    srv = ServerProcess(data_dir, *args)
    try:
        srv.start()
    except RuntimeError as e:
        pytest.fail(f"riverbed serve {' '.join(args)} did not start: {e}")
    if http and ("http" not in srv.ports or srv.proc.poll() is not None):
        log = srv.log()
        srv.kill()
        pytest.fail("riverbed serve --http-port 0 started no HTTP listener (no `listening http HOST:PORT` log "
                    "line): cli.py must start riverbed.shells.http with serve(broker, host=..., port=..., "
                    "config=cfg). Server log:\n" + log[-4000:])
    return srv


def stop_server(srv):
    code = srv.stop()
    assert code == 0, srv.log()


@pytest.fixture(scope="module")
def fsync_server(tmp_path_factory):
    """A broker that fsyncs every commit, so an append stays uncommitted for a while (finding 4)."""
    srv = start_server(tmp_path_factory.mktemp("fsync") / "data", "--fsync", "always")
    yield srv
    stop_server(srv)


@pytest.fixture(scope="module")
def http_server(tmp_path_factory):
    """A broker with the HTTP listener on a free port, guest/guest from loopback (no users file)."""
    srv = start_server(tmp_path_factory.mktemp("http") / "data", "--handshake-timeout", "3", http=True)
    yield srv
    stop_server(srv)


# ---------------------------------------------------------------------------- the old rstream

class OldClient:
    """Runs ``_old_rstream_client.py`` scenarios with rstream 0.20.x's python."""

    def __init__(self, python):
        self.python = python

    def _cmd(self, scenario, port, args):
        return [self.python, str(OLD_CLIENT), scenario, str(port), json.dumps(args)]

    def run(self, scenario, port, timeout=150, **args):
        """The scenario's result (a dict); fails the test with its output if it crashed or reported an
        error."""
        try:
            proc = subprocess.run(self._cmd(scenario, port, args), capture_output=True, text=True, timeout=timeout,
                                  stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired as e:
            pytest.fail(f"rstream 0.20 scenario {scenario} did not finish in {timeout} s:\n{e.stderr}")
        return self._result(scenario, proc.returncode, proc.stdout, proc.stderr)

    @staticmethod
    def _result(scenario, code, stdout, stderr):
        lines = [ln for ln in (stdout or "").splitlines() if ln.startswith("{")]
        if code != 0 or not lines:
            pytest.fail(f"rstream 0.20 scenario {scenario} exited {code}:\n{stdout}\n{(stderr or '')[-3000:]}")
        result = json.loads(lines[-1])
        if result.get("error"):
            pytest.fail(f"rstream 0.20 scenario {scenario} broke: {result['error']}\n{result.get('traceback', '')}")
        return result

    def start(self, scenario, port, **args):
        return OldSession(self, scenario, port, args)


class OldSession:
    """An interactive scenario: read its ``{"event": ...}`` lines, then its result. Always ``stop()``."""

    def __init__(self, client, scenario, port, args):
        self.scenario = scenario
        self.proc = subprocess.Popen(client._cmd(scenario, port, args), stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True)
        self.lines = queue.Queue()
        self.stdout = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self):
        for line in self.proc.stdout:
            self.stdout.append(line)
            if line.startswith("{"):
                self.lines.put(json.loads(line))
        self.lines.put(None)

    def next(self, timeout):
        try:
            item = self.lines.get(timeout=timeout)
        except queue.Empty:
            item = None
        if item is None or item.get("error"):
            self.stop()
            pytest.fail(f"rstream 0.20 scenario {self.scenario}: no further output in {timeout} s or it broke:\n"
                        f"{''.join(self.stdout)}\n{self.proc.stderr.read()[-3000:]}")
        return item

    def stop(self):
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        self._reader.join(2)
        self.proc.stdout.close()
        self.proc.stderr.close()


@pytest.fixture(scope="session")
def old_rstream():
    """rstream 0.20.x in its own venv (installed by ci/rstream-old.sh into the test cache if needed)."""
    python = os.environ.get("RIVERBED_RSTREAM_OLD_PYTHON")
    if not python:
        try:
            proc = subprocess.run(["bash", str(RSTREAM_OLD_SH)], capture_output=True, text=True, timeout=600,
                                  stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            pytest.fail("ci/rstream-old.sh did not finish in 600 s")
        if proc.returncode != 0 or not proc.stdout.strip():
            pytest.fail(f"ci/rstream-old.sh could not provide the old rstream client:\n{proc.stderr[-3000:]}")
        python = proc.stdout.strip().splitlines()[-1]
    try:
        check = subprocess.run([python, "-c", "import rstream; print(rstream.__version__)"], capture_output=True,
                               text=True, timeout=60)
    except OSError as e:
        pytest.fail(f"cannot run the old rstream client's python {python!r}: {e}")
    version = check.stdout.strip()
    assert check.returncode == 0 and version.startswith("0.20."), \
        f"{python} should have rstream 0.20.x, has {version!r} {check.stderr[-500:]}"
    return OldClient(python)


# ------------------------------------------------------------------------------------ raw frames

def raw_connect(port, connection_name=None, user="guest", password="guest", product="rawwire-compat"):
    """A RawClient through the whole handshake, with ``connection_name`` in its client properties."""
    c = rawwire.RawClient(port)
    peer = {"product": product}
    if connection_name is not None:
        peer["connection_name"] = connection_name
    c.request(0x11, props(peer))
    code, _ = c.request(0x12, b"")
    assert code == rawwire.OK
    creds = b"\0" + user.encode() + b"\0" + password.encode()
    code, _ = c.request(0x13, s("PLAIN") + struct.pack(">i", len(creds)) + creds)
    assert code == rawwire.OK, f"authentication of {user!r} failed: code 0x{code:02x}"
    frame_max, heartbeat = struct.unpack(">II", c.wait_for(0x14))
    c.send(frame(0x14, struct.pack(">II", frame_max, heartbeat)))
    code, _ = c.request(0x15, s("/"))
    assert code == rawwire.OK
    return c


def subscribe_body(sub_id, stream, offset_type, credit=10, properties=None):
    return (struct.pack(">B", sub_id) + s(stream) + struct.pack(">H", offset_type) + struct.pack(">H", credit)
            + props(properties or {}))


def parse_deliver(body):
    """(subscription id, chunk header fields, [(offset, message)]) of a Deliver v1 body."""
    sub_id = body[0]
    fields = CHUNK_HEADER.unpack_from(body, 1)
    chunk_id, data_len = fields[6], fields[8]
    data = body[1 + CHUNK_HEADER.size:1 + CHUNK_HEADER.size + data_len]
    messages, pos, offset = [], 0, chunk_id
    while pos < len(data):
        (n,) = struct.unpack_from(">I", data, pos)
        assert not n & 0x80000000, "sub-batch entries are not expected here"
        messages.append((offset, bytes(data[pos + 4:pos + 4 + n])))
        pos += 4 + n
        offset += 1
    return sub_id, fields, messages


def collect_deliveries(c, sub_id, until, timeout=10.0, settle=0.3):
    """Every (offset, message) delivered to ``sub_id`` (frames already in ``c.pushed`` first) until
    ``until(messages)`` holds, plus ``settle`` seconds; grants one credit per Deliver, as clients do."""
    got = []
    deadline = time.monotonic() + timeout
    settle_end = None
    while True:
        if c.pushed:
            f = c.pushed.pop(0)
        else:
            now = time.monotonic()
            end = settle_end if settle_end is not None else deadline
            if now >= end:
                return got
            try:
                f = c.recv_frame(end - now)
            except socket.timeout:
                return got
            if f is None:
                return got
        key, _, body = f
        if key == KEY_DELIVER and body[0] == sub_id:
            got.extend(parse_deliver(body)[2])
            c.send(frame(KEY_CREDIT, struct.pack(">BH", sub_id, 1)))
        if settle_end is None and until(got):
            settle_end = time.monotonic() + settle


def raw_publish_confirmed(port, stream, messages, *, create=True):
    c = raw_connect(port)
    try:
        if create:
            assert c.create(stream) == rawwire.OK
        assert c.declare_publisher(1, stream) == rawwire.OK
        confirmed, errors = c.publish_confirmed(1, list(enumerate(messages)), timeout=30)
        assert not errors and len(confirmed) == len(messages), (len(confirmed), errors)
    finally:
        c.close()


# ==================================================================== 1. delete what you consume

def test_f1_raw_delete_response_comes_before_the_metadata_update(server):
    stream = "f1-raw"
    c = raw_connect(server.port)
    try:
        assert c.create(stream) == rawwire.OK
        code, _ = c.request(KEY_SUBSCRIBE, subscribe_body(0, stream, OFFSET_FIRST))
        assert code == rawwire.OK
        corr = c.next_corr()
        c.send(frame(KEY_DELETE, struct.pack(">I", corr) + s(stream)))
        order = []
        deadline = time.monotonic() + 5
        while len(order) < 2 and time.monotonic() < deadline:
            try:
                f = c.recv_frame(max(0.01, deadline - time.monotonic()))
            except socket.timeout:
                break
            assert f is not None, f"the server closed the connection; frames so far: {order}"
            key, _, body = f
            if key == KEY_DELETE | RESPONSE and struct.unpack_from(">I", body)[0] == corr:
                order.append(("DeleteResponse", struct.unpack_from(">H", body, 4)[0]))
            elif key == KEY_METADATA_UPDATE:
                code, = struct.unpack_from(">H", body)
                order.append(("MetadataUpdate", code, body[4:].decode()))
    finally:
        c.close()
    names = [o[0] for o in order]
    assert "DeleteResponse" in names, f"no DeleteResponse (0x800e) within 5 s; got {order}"
    assert "MetadataUpdate" in names, f"no MetadataUpdate (0x0010) for the deleted stream within 5 s; got {order}"
    assert names == ["DeleteResponse", "MetadataUpdate"], (
        f"frames in this order: {order}. Finding 1: the broker must answer the Delete (0x800e) BEFORE it "
        f"sends the MetadataUpdate (0x0010) on the same connection, as RabbitMQ does; rstream 0.20 closes a "
        f"consumer connection on the MetadataUpdate of its last stream and never reads the response")
    assert order[0][1] == rawwire.OK
    assert order[1][1:] == (0x06, stream)


def test_f1_rstream_1_1_consumer_deletes_the_streams_it_consumes(server):
    """rstream 1.1.1 sends Delete on its locator connection, not the consuming one, so the order does not
    bite it; this keeps its path working."""
    streams = [f"f1-new-{k}" for k in range(3)]

    async def scenario():
        async with Producer(HOST, server.port, **CREDS) as p:
            for st in streams:
                await p.create_stream(st)
                confirmed = []
                await p.send_batch(st, [b"m%d" % i for i in range(10)], on_publish_confirm=confirmed.append)
                assert await wait_until(lambda: len(confirmed) == 10, 10)
        got = {st: 0 for st in streams}

        async def on_message(msg, ctx):
            got[ctx.stream] += 1

        c = Consumer(HOST, server.port, **CREDS, connection_name="compat-delete")
        try:
            for st in streams:
                await c.subscribe(st, on_message, offset_specification=ConsumerOffsetSpecification(OffsetType.FIRST))
            assert await wait_until(lambda: all(v == 10 for v in got.values()), 10), got
            for st in streams:
                try:
                    await asyncio.wait_for(c.delete_stream(st), 8)
                except asyncio.TimeoutError:
                    pytest.fail(f"delete_stream({st!r}) timed out (finding 1)")
        finally:
            await asyncio.wait_for(c.close(), 10)
        async with Producer(HOST, server.port, **CREDS) as p:
            for st in streams:
                assert not await p.stream_exists(st)
    run(scenario(), 60)


def test_f1_rstream_0_20_consumer_deletes_the_streams_it_consumes(server, old_rstream):
    streams = [f"f1-old-{k}" for k in range(3)]
    r = old_rstream.run("delete_consumed", server.port, streams=streams)
    assert r["received"] == 30, r
    assert r["timed_out"] is None, (
        f"rstream {r['rstream_version']}: delete_stream({r['timed_out']!r}) timed out after deleting "
        f"{r['deleted']}. Finding 1: the MetadataUpdate of the consumer's last stream reached it before the "
        f"DeleteResponse, and rstream 0.20 closed the connection on it")
    assert r["failed"] is None, r
    assert r["deleted"] == streams


# ========================================================== 2. SAC on a super stream, three rounds

SAC_MESSAGES = 10_000


async def delete_super_stream(port, ss):
    """Through a SuperStreamProducer of its own: by the time the routing producer has published, its
    locator connection is closed and its delete_super_stream fails on it (a client bug, both versions)."""
    async def no_routing(msg):
        return ""
    async with SuperStreamProducer(HOST, port, **CREDS, super_stream=ss, routing_extractor=no_routing,
                                   recovery_strategy=BackOffRecoveryStrategy(False)) as ssp:
        await ssp.delete_super_stream(ss)


async def sac_round(port, ss, group, n, rnd, delete_while_subscribed):
    """One round with rstream 1.1.1: create the super stream (3 partitions), three SAC consumers of it,
    wait until each partition has its own active consumer, publish ``n`` messages routed by hash, and
    collect. Ends by deleting the super stream (round 2: under its subscribed consumers)."""
    partitions = [f"{ss}-{k}" for k in range(3)]
    active, deliveries, confirmed = {}, [], []
    counting = [True]     # off before the consumers close: the survivors take over (from FIRST) meanwhile
    no_recovery = BackOffRecoveryStrategy(False)   # the test closes its consumers; never resubscribe later

    def on_message(i):
        async def cb(msg, ctx):
            if counting[0]:
                deliveries.append((int(bytes(msg).split(b"-")[1]), i, ctx.stream))
        return cb

    def on_update(i):
        async def cb(is_active, ctx):
            if is_active:
                active[ctx.stream] = i
            elif active.get(ctx.stream) == i:
                del active[ctx.stream]
            return OffsetSpecification(OffsetType.FIRST, 0)
        return cb

    async def routing_key(msg):
        return bytes(msg).split(b"-")[1].decode()

    ssp = SuperStreamProducer(HOST, port, **CREDS, super_stream=ss, routing_extractor=routing_key,
                              routing=RouteType.Hash, recovery_strategy=no_recovery,
                              super_stream_creation_option=SuperStreamCreationOption(n_partitions=3))
    await ssp.start()
    consumers = []
    try:
        sac = {"single-active-consumer": "true", "name": group, "super-stream": ss}
        for i in range(3):
            c = SuperStreamConsumer(HOST, port, **CREDS, super_stream=ss, connection_name=f"sac-{i}",
                                    recovery_strategy=no_recovery)
            await c.start()
            consumers.append(c)
            await c.subscribe(on_message(i), properties=dict(sac), consumer_update_listener=on_update(i),
                              offset_specification=ConsumerOffsetSpecification(OffsetType.FIRST))
        settled = await wait_until(
            lambda: sorted(active) == partitions and sorted(active.values()) == [0, 1, 2], 15)
        assert settled, (f"round {rnd}: the SAC group never settled to one active consumer per partition; "
                         f"active = {active} (finding 2: stale SAC groups, members or super stream definitions "
                         f"from the previous round?)")
        for i in range(n):
            await ssp.send(b"r%d-%06d" % (rnd, i), on_publish_confirm=confirmed.append)
        assert await wait_until(lambda: len(confirmed) >= n, 30), f"round {rnd}: {len(confirmed)}/{n} confirmed"
        assert all(c.is_confirmed for c in confirmed)
        await wait_until(lambda: len(deliveries) >= n, 30)
        await asyncio.sleep(0.5)                          # duplicates, if any, arrive meanwhile
    finally:
        counting[0] = False
        await asyncio.wait_for(ssp.close(), 10)
        if delete_while_subscribed:
            await delete_super_stream(port, ss)
        for c in consumers:
            await asyncio.wait_for(c.close(), 10)
        if not delete_while_subscribed:
            await delete_super_stream(port, ss)
    counts = {}
    for idx, _, _ in deliveries:
        counts[idx] = counts.get(idx, 0) + 1
    by_part = {}
    for _, i, part in deliveries:
        by_part.setdefault(part, set()).add(i)
    return {"round": rnd, "deliveries": len(deliveries), "unique": len(counts),
            "duplicates": sum(v - 1 for v in counts.values()), "missing": n - len(counts),
            "consumers_by_partition": {p: sorted(v) for p, v in by_part.items()}, "active": active}


def check_sac_round(r, n, version):
    where = f"rstream {version}, round {r['round']}"
    assert r["missing"] == 0 and r["duplicates"] == 0, (
        f"{where}: {r['unique']} of {n} messages arrived ({r['missing']} missing, {r['duplicates']} duplicate "
        f"deliveries); by partition: {r['consumers_by_partition']} (finding 2)")
    parts = r["consumers_by_partition"]
    assert all(len(v) == 1 for v in parts.values()), f"{where}: a partition had several consumers: {parts}"
    assert sorted(v[0] for v in parts.values()) == [0, 1, 2], \
        f"{where}: each consumer should own one partition: {parts}"


@pytest.mark.slow
def test_f2_sac_super_stream_three_rounds_rstream_1_1(server):
    """Round 1 closes the consumers, then deletes the super stream; round 2 deletes it under them (they
    get MetadataUpdates and drop their connections); round 3 as round 1."""
    async def scenario():
        results = []
        for rnd in (1, 2, 3):
            results.append(await sac_round(server.port, "f2-new", "f2-group", SAC_MESSAGES, rnd,
                                           delete_while_subscribed=(rnd == 2)))
            check_sac_round(results[-1], SAC_MESSAGES, rstream.__version__)
        return results
    run(scenario(), 240)


@pytest.mark.slow
def test_f2_sac_super_stream_three_rounds_rstream_0_20(server, old_rstream):
    r = old_rstream.run("sac_super_stream", server.port, timeout=240, super_stream="f2-old", group="f2-group",
                        n=SAC_MESSAGES, rounds=3)
    assert len(r["rounds"]) == 3
    for rnd in r["rounds"]:
        assert rnd["error"] is None, f"rstream {r['rstream_version']}, round {rnd['round']}: {rnd['error']}"
        assert rnd["confirmed"] == SAC_MESSAGES, rnd
        check_sac_round(rnd, SAC_MESSAGES, r["rstream_version"])


# ========================================================================= 3. LAST after a big frame

LAST_TOTAL = 4_999
CHUNK_RECORDS_MAX = 1_000


@pytest.fixture(scope="module")
def big_frame_stream(server):
    """A stream holding one Publish frame of 4,999 messages (offsets 0..4998)."""
    stream = "f3-big-frame"
    raw_publish_confirmed(server.port, stream, [b"big-%05d" % i for i in range(LAST_TOTAL)])
    return stream


def check_last(messages, complete, who):
    offsets = [o for o, _ in messages]
    assert complete and offsets and offsets[-1] == LAST_TOTAL - 1, \
        f"{who}: the tail (offset {LAST_TOTAL - 1}) never arrived at LAST; got offsets {offsets[:3]}..{offsets[-3:]}"
    assert len(offsets) <= CHUNK_RECORDS_MAX, (
        f"{who}: LAST delivered {len(offsets)} messages (offsets {offsets[0]}..{offsets[-1]}). Finding 3: one "
        f"Publish frame of {LAST_TOTAL} messages must be stored as chunks of at most {CHUNK_RECORDS_MAX} records, "
        f"so LAST starts within the last {CHUNK_RECORDS_MAX}")
    assert offsets == list(range(LAST_TOTAL - len(offsets), LAST_TOTAL)), f"{who}: not the contiguous tail"
    for o, m in messages:
        body = m if isinstance(m, bytes) else m.encode("latin-1")
        assert body == b"big-%05d" % o, (o, body)


def test_f3_raw_last_after_one_big_publish_frame(server, big_frame_stream):
    c = raw_connect(server.port)
    try:
        code, _ = c.request(KEY_SUBSCRIBE, subscribe_body(0, big_frame_stream, OFFSET_LAST))
        assert code == rawwire.OK
        got = collect_deliveries(c, 0, lambda msgs: any(o == LAST_TOTAL - 1 for o, _ in msgs), timeout=10)
    finally:
        c.close()
    check_last(got, True, "raw Subscribe LAST")


def test_f3_rstream_1_1_last_after_one_big_publish_frame(server, big_frame_stream):
    async def scenario():
        got = []

        async def on_message(msg, ctx):
            got.append((ctx.offset, bytes(msg)))

        async with Consumer(HOST, server.port, **CREDS) as c:
            await c.subscribe(big_frame_stream, on_message,
                              offset_specification=ConsumerOffsetSpecification(OffsetType.LAST))
            complete = await wait_until(lambda: any(o == LAST_TOTAL - 1 for o, _ in got), 10)
            await asyncio.sleep(0.5)
        return got, complete
    got, complete = run(scenario(), 60)
    check_last(got, complete, "rstream 1.1.1 LAST")


def test_f3_rstream_0_20_last_after_one_big_publish_frame(server, big_frame_stream, old_rstream):
    r = old_rstream.run("last", server.port, stream=big_frame_stream, last_offset=LAST_TOTAL - 1)
    check_last([(o, m) for o, m in r["messages"]], r["complete"], f"rstream {r['rstream_version']} LAST")


# ================================================================ 4. NEXT after an unconfirmed batch

NEXT_FAILURE = ("Finding 4: a NEXT subscription must be resolved only after every append the broker had "
                "already accepted for the stream has committed, so messages it received before the "
                "Subscribe are never delivered to it")


def test_f4_raw_next_on_the_connection_that_just_published(fsync_server):
    """Publish (10 messages) and Subscribe NEXT in one write on one connection: the broker reads the
    Publish first, so none of those 10 may reach the subscriber; then one more is published."""
    stream = "f4-raw-same"
    c = raw_connect(fsync_server.port)
    try:
        assert c.create(stream) == rawwire.OK
        assert c.declare_publisher(1, stream) == rawwire.OK
        early = [(i, b"early-%d" % i) for i in range(10)]
        publish = frame(0x02, struct.pack(">Bi", 1, len(early)) + b"".join(
            struct.pack(">QI", i, len(m)) + m for i, m in early))
        corr = c.next_corr()
        c.send(publish + frame(KEY_SUBSCRIBE, struct.pack(">I", corr) + subscribe_body(0, stream, OFFSET_NEXT)))
        resp = c.wait_for(KEY_SUBSCRIBE | RESPONSE, corr)
        assert struct.unpack_from(">H", resp, 4)[0] == rawwire.OK
        confirmed, errors = c.publish_confirmed(1, [(10, b"the-last")])
        assert 10 in confirmed and not errors
        got = collect_deliveries(c, 0, lambda msgs: any(m == b"the-last" for _, m in msgs), timeout=10, settle=0.5)
    finally:
        c.close()
    bodies = [m for _, m in got]
    assert bodies == [b"the-last"], f"NEXT subscriber got {bodies}. {NEXT_FAILURE}"


def test_f4_raw_next_on_another_connection(fsync_server):
    """A large batch is accepted on connection A (a Metadata round trip after it proves the broker read
    it), then B subscribes NEXT before that batch is likely to be committed (fsync always)."""
    stream = "f4-raw-other"
    a = raw_connect(fsync_server.port)
    b = raw_connect(fsync_server.port)
    try:
        assert a.create(stream) == rawwire.OK
        assert a.declare_publisher(1, stream) == rawwire.OK
        early = [(i, b"early-%05d-" % i + b"x" * 500) for i in range(2000)]
        publish = frame(0x02, struct.pack(">Bi", 1, len(early)) + b"".join(
            struct.pack(">QI", i, len(m)) + m for i, m in early))
        corr = a.next_corr()
        a.send(publish + frame(KEY_METADATA, struct.pack(">I", corr) + struct.pack(">i", 1) + s(stream)))
        a.wait_for(KEY_METADATA | RESPONSE, corr)
        code, _ = b.request(KEY_SUBSCRIBE, subscribe_body(0, stream, OFFSET_NEXT))
        assert code == rawwire.OK
        confirmed, errors = a.publish_confirmed(1, [(len(early), b"the-last")], timeout=30)
        assert len(early) in confirmed and not errors
        got = collect_deliveries(b, 0, lambda msgs: any(m == b"the-last" for _, m in msgs), timeout=15, settle=0.5)
    finally:
        a.close()
        b.close()
    bodies = [m for _, m in got]
    assert bodies == [b"the-last"], f"NEXT subscriber got {len(bodies)} messages, first {bodies[:1]}. {NEXT_FAILURE}"


def test_f4_rstream_1_1_next_after_unconfirmed_batch(fsync_server):
    """The issue's scenario as a client suite runs it. Without the fix it fails only when the batch is
    still uncommitted when the Subscribe arrives (timing); the raw tests above fail every time."""
    stream = "f4-new"

    async def scenario():
        got = []

        async def on_message(msg, ctx):
            got.append(bytes(msg))

        async with Producer(HOST, fsync_server.port, **CREDS) as p:
            await p.create_stream(stream)
            await p.send_batch(stream, [b"early-%d" % i for i in range(10)])      # confirms not awaited
            async with Consumer(HOST, fsync_server.port, **CREDS) as c:
                await c.subscribe(stream, on_message, offset_specification=ConsumerOffsetSpecification(OffsetType.NEXT))
                confirmed = []
                await p.send_batch(stream, [b"the-last"], on_publish_confirm=confirmed.append)
                assert await wait_until(lambda: confirmed, 10)
                await wait_until(lambda: b"the-last" in got, 10)
                await asyncio.sleep(0.7)
        return got
    got = run(scenario(), 60)
    assert got == [b"the-last"], f"rstream 1.1.1 NEXT subscriber got {got}. {NEXT_FAILURE}"


def test_f4_rstream_0_20_next_after_unconfirmed_batch(fsync_server, old_rstream):
    r = old_rstream.run("next_after_unconfirmed", fsync_server.port, stream="f4-old")
    bodies = [m for _, m in r["messages"]]
    assert bodies == ["the-last"], f"rstream {r['rstream_version']} NEXT subscriber got {bodies}. {NEXT_FAILURE}"


# ==================================================================================== 5. epoch 1

@pytest.fixture(scope="module")
def epoch_stream(server):
    stream = "f5-epoch"
    raw_publish_confirmed(server.port, stream, [b"e-%d" % i for i in range(3)])
    return stream


def test_f5_raw_deliver_carries_epoch_1(server, epoch_stream):
    c = raw_connect(server.port)
    try:
        code, _ = c.request(KEY_SUBSCRIBE, subscribe_body(0, epoch_stream, OFFSET_FIRST))
        assert code == rawwire.OK
        body = c.wait_for(KEY_DELIVER)
    finally:
        c.close()
    header = body[1:1 + CHUNK_HEADER.size]
    assert header[0] == 0x50 and header[1] == 0, header[:2].hex()
    epoch = struct.unpack(">Q", header[16:24])[0]
    assert epoch == 1, f"chunk header bytes 16..24 (epoch) = {epoch}; Osiris writes epoch 1 (finding 5)"


def test_f5_rstream_1_1_sees_epoch_1(server, epoch_stream):
    async def scenario():
        epochs, got = [], []

        async def on_message(msg, ctx):
            got.append(bytes(msg))

        c = Consumer(HOST, server.port, **CREDS)
        original = c._on_deliver

        async def probe(frame_, *args, **kwargs):     # the message callback never sees the chunk header
            epochs.append(frame_.epoch)
            return await original(frame_, *args, **kwargs)
        c._on_deliver = probe
        try:
            await c.subscribe(epoch_stream, on_message, offset_specification=ConsumerOffsetSpecification(OffsetType.FIRST))
            assert await wait_until(lambda: len(got) >= 3, 10), got
        finally:
            await asyncio.wait_for(c.close(), 10)
        return epochs
    epochs = run(scenario(), 30)
    assert epochs and set(epochs) == {1}, f"rstream 1.1.1 saw chunk epochs {epochs}; expected 1 (finding 5)"


def test_f5_rstream_0_20_sees_epoch_1(server, epoch_stream, old_rstream):
    r = old_rstream.run("epoch", server.port, stream=epoch_stream)
    assert r["complete"], r
    assert r["epochs"] == [1], f"rstream {r['rstream_version']} saw chunk epochs {r['epochs']}; expected [1] (finding 5)"


# ============================================================ 6. management API: connections

def conn_path(name=None):
    return "/api/connections" if name is None else "/api/connections/" + urllib.parse.quote(name, safe="")


def api(srv, method, path, auth=("guest", "guest"), headers=None, timeout=5):
    """(status, JSON body or None, headers) of an HTTP request to the server's HTTP listener."""
    req = urllib.request.Request(f"http://{HOST}:{srv.ports['http']}{path}", method=method)
    if auth is not None:
        req.add_header("Authorization", "Basic " + base64.b64encode(f"{auth[0]}:{auth[1]}".encode()).decode())
    for k, v in (headers or {}).items():
        req.add_header(k, v)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            status, raw, hdrs = r.status, r.read(), r.headers
    except urllib.error.HTTPError as e:
        status, raw, hdrs = e.code, e.read(), e.headers
    body = json.loads(raw) if raw and "json" in (hdrs.get("Content-Type") or "") else None
    return status, body, hdrs


def find(conns, name):
    return [c for c in conns if c["name"] == name]


def wait_gone(srv, name, timeout=5, auth=("guest", "guest")):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status, _, _ = api(srv, "GET", conn_path(name), auth=auth)
        if status == 404:
            return True
        time.sleep(0.05)
    return False


def read_close(c, timeout=5):
    """The reason of the server's Close frame (answered with CloseResponse), and whether the socket then
    closed; (None, closed) when no Close came."""
    reason = None
    deadline = time.monotonic() + timeout
    while True:
        try:
            f = c.recv_frame(max(0.01, deadline - time.monotonic()))
        except socket.timeout:
            return reason, False
        if f is None:
            return reason, True
        key, _, body = f
        if key == KEY_CLOSE:
            corr, _code = struct.unpack_from(">IH", body)
            (n,) = struct.unpack_from(">h", body, 6)
            reason = body[8:8 + n].decode()
            try:
                c.send(frame(KEY_CLOSE | RESPONSE, struct.pack(">IH", corr, rawwire.OK)))
            except OSError:
                pass


def test_f6_lists_and_gets_connections(http_server):
    named = raw_connect(http_server.port, connection_name="compat-raw-named")
    unnamed = raw_connect(http_server.port)
    try:
        before = int(time.time() * 1000)
        status, conns, _ = api(http_server, "GET", conn_path())
        assert status == 200, (status, conns)
        assert isinstance(conns, list)
        [c] = find(conns, "compat-raw-named")
        local_port = named.sock.getsockname()[1]
        assert c["client_properties"]["connection_name"] == "compat-raw-named"
        assert c["client_properties"]["product"] == "rawwire-compat"
        assert c["user"] == "guest"
        assert c["peer_host"] == "127.0.0.1" and c["peer_port"] == local_port
        assert c["host"] == "127.0.0.1" and c["port"] == http_server.port
        assert c["protocol"] and c["state"]
        assert abs(c["connected_at"] - before) < 60_000, c["connected_at"]
        generated = f"127.0.0.1:{unnamed.sock.getsockname()[1]} -> 127.0.0.1:{http_server.port}"
        [u] = find(conns, generated)
        assert u["client_properties"].get("connection_name") in (None, "")
        status, one, _ = api(http_server, "GET", conn_path("compat-raw-named"))
        assert status == 200 and one["peer_port"] == local_port
        status, one, _ = api(http_server, "GET", conn_path(generated))
        assert status == 200 and one["name"] == generated
        assert api(http_server, "GET", conn_path("no-such-connection"))[0] == 404
    finally:
        named.close()
        unnamed.close()


def test_f6_delete_closes_the_connection(http_server):
    # as RabbitMQ (rabbit_mgmt_wm_connection:force_close_connection/3 sends the reader {shutdown, Reason},
    # which stops and closes the socket): no Close frame, the TCP connection ends; X-Reason is only logged
    c = raw_connect(http_server.port, connection_name="compat-raw-doomed")
    try:
        status, _, _ = api(http_server, "DELETE", conn_path("compat-raw-doomed"),
                           headers={"X-Reason": "compat test says bye"})
        assert status == 204
        reason, closed = read_close(c)
        assert reason is None, f"the server sent a Close frame ({reason!r}); RabbitMQ sends none"
        assert closed, "the server kept the socket open"
    finally:
        c.close()
    assert wait_gone(http_server, "compat-raw-doomed"), "the closed connection is still listed"
    assert api(http_server, "DELETE", conn_path("compat-raw-doomed"))[0] == 404
    assert api(http_server, "DELETE", conn_path("never-was"))[0] == 404


def test_f6_basic_auth_required(http_server):
    # no credentials at all: guest on loopback without a users file (DESIGN.md "Auth"); bad ones refused
    assert api(http_server, "GET", conn_path(), auth=None)[0] == 200
    for auth in (("guest", "wrong"), ("nobody", "guest")):
        for method, path in (("GET", conn_path()), ("GET", conn_path("x")), ("DELETE", conn_path("x"))):
            status, _, hdrs = api(http_server, method, path, auth=auth)
            assert status == 401, (auth, method, path, status)
            assert (hdrs.get("WWW-Authenticate") or "").startswith("Basic"), dict(hdrs)


@pytest.mark.slow
def test_f6_rstream_1_1_connection_closed_through_the_api_recovers(http_server):
    stream, name = "f6-new", "compat-mgmt"

    async def scenario():
        got, closes = [], []

        async def on_message(msg, ctx):
            got.append(bytes(msg))

        async def on_close(info):
            closes.append(info)

        async with Producer(HOST, http_server.port, **CREDS) as p:
            await p.create_stream(stream)
        c = Consumer(HOST, http_server.port, **CREDS, connection_name=name, on_close_handler=on_close,
                     recovery_strategy=BackOffRecoveryStrategy(True, jitter=1))
        try:
            await c.subscribe(stream, on_message, offset_specification=ConsumerOffsetSpecification(OffsetType.FIRST))
            status, conns, _ = await asyncio.to_thread(api, http_server, "GET", conn_path())
            assert status == 200, (status, conns)
            mine = find(conns, name)
            assert len(mine) == 1, f"no single connection named {name!r}: {[x['name'] for x in conns]}"
            props_ = mine[0]["client_properties"]
            assert props_["connection_name"] == name and props_["product"] == "RabbitMQ Stream", props_
            old_port = mine[0]["peer_port"]
            status, _, _ = await asyncio.to_thread(api, http_server, "DELETE", conn_path(name))
            assert status == 204
            assert await wait_until(lambda: closes, 5), "rstream 1.1.1 did not notice its connection was closed"

            def recovered():
                return [x for x in find(api(http_server, "GET", conn_path())[1], name) if x["peer_port"] != old_port]
            deadline = asyncio.get_running_loop().time() + 20
            while not await asyncio.to_thread(recovered):
                assert asyncio.get_running_loop().time() < deadline, "rstream 1.1.1 did not reconnect in 20 s"
                await asyncio.sleep(0.2)
            async with Producer(HOST, http_server.port, **CREDS) as p:
                confirmed = []
                await p.send_batch(stream, [b"after"], on_publish_confirm=confirmed.append)
                assert await wait_until(lambda: confirmed, 10)
            assert await wait_until(lambda: b"after" in got, 10), f"nothing after the reconnect: {got}"
        finally:
            await asyncio.wait_for(c.close(), 10)
        return closes
    closes = run(scenario(), 90)
    assert closes[0].streams == [stream], closes


@pytest.mark.slow
def test_f6_rstream_0_20_connection_closed_through_the_api(http_server, old_rstream):
    stream, name = "f6-old", "compat-mgmt-old"
    session = old_rstream.start("mgmt_closed", http_server.port, stream=stream, name=name)
    try:
        ready = session.next(30)
        assert ready.get("event") == "ready", ready
        status, conns, _ = api(http_server, "GET", conn_path())
        mine = find(conns, name)
        assert len(mine) == 1, f"no single connection named {name!r}: {[x['name'] for x in conns]}"
        props_ = mine[0]["client_properties"]
        assert props_["connection_name"] == name and props_["version"].startswith("0.20."), props_
        assert api(http_server, "DELETE", conn_path(name))[0] == 204
        r = session.next(60)
    finally:
        session.stop()
    assert r["saw_close"], f"rstream {r['rstream_version']} did not notice the close: {r}"
    assert r["closed"][0]["streams"] == [stream], r
    assert r["after_received"], f"no message after reconnect_stream: {r}"


@pytest.mark.slow
def test_f6_users_file_credentials_and_permissions(tmp_path):
    users = tmp_path / "users.toml"
    for args in (["admin", "--password", "s3cret"], ["reader", "--password", "pw", "--configure", ""]):
        subprocess.run([sys.executable, "-m", "riverbed.shells.cli", "users", "--users", str(users), "add", *args],
                       check=True, capture_output=True, timeout=60, stdin=subprocess.DEVNULL)
    srv = start_server(tmp_path / "data", "--users", str(users), http=True)
    conns = []
    try:
        conns.append(raw_connect(srv.port, "admin-conn", "admin", "s3cret"))
        conns.append(raw_connect(srv.port, "reader-conn", "reader", "pw"))
        admin, reader = ("admin", "s3cret"), ("reader", "pw")
        assert api(srv, "GET", conn_path(), auth=("guest", "guest"))[0] == 401    # no guest with a users file
        assert api(srv, "GET", conn_path(), auth=("admin", "wrong"))[0] == 401
        status, listed, _ = api(srv, "GET", conn_path(), auth=admin)
        assert status == 200 and {"admin-conn", "reader-conn"} <= {c["name"] for c in listed}, listed
        assert find(listed, "reader-conn")[0]["user"] == "reader"
        status, listed, _ = api(srv, "GET", conn_path(), auth=reader)
        assert status == 200 and [c["name"] for c in listed] == ["reader-conn"], listed
        assert api(srv, "DELETE", conn_path("admin-conn"), auth=reader)[0] == 403
        assert api(srv, "DELETE", conn_path("reader-conn"), auth=reader)[0] == 204
        assert read_close(conns[1])[1]
        assert api(srv, "DELETE", conn_path("admin-conn"), auth=admin)[0] == 204
        assert read_close(conns[0])[1]
    finally:
        for c in conns:
            c.close()
        stop_server(srv)
