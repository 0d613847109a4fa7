"""Issue 19, items 2 to 4, with raw frames and HTTP against ``riverbed serve``:

2. the server's version: PeerProperties ``version`` is the RabbitMQ release whose stream protocol is served
   (4.3.0; clients gate features on it) and ``riverbed-version`` Riverbed's own, which ``riverbed --version``
   and the dashboard show too; every command of RabbitMQ 4.3's table is answered;
3. how the broker ends a connection, as RabbitMQ's rabbit_stream_reader does: no Close frame on a heartbeat
   timeout, a refused authentication answered after the 3 s tarpit, a deleted stream is a MetadataUpdate and
   the connection stays (the management close and shutdown: test_rmq_compat.py f6 and test_cli.py);
4. RabbitMQ's management API for streams: queues of type stream, super streams as an exchange bound to its
   partitions (a real super stream for Partitions and Route), the stream plugin's listings, overview,
   whoami, nodes, vhosts; RabbitMQ's users, tags and error bodies.
"""

import asyncio
import base64
import json
import struct
import subprocess
import sys
import time
from importlib.metadata import version as package_version

import aiohttp
import pytest

import rawwire
from procs import ServerProcess
from rawwire import OK, frame, props, s
from riverbed.shells import auth

pytestmark = pytest.mark.integration

def basic(user, password):
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


GUEST = basic("guest", "guest")
NOT_FOUND = {"error": "Object Not Found", "reason": "Not Found"}
# rabbit_stream_utils:command_versions/0 of RabbitMQ 4.3: (key, min, max) in its order
RABBITMQ_4_3_COMMANDS = [(0x01, 1, 1), (0x02, 1, 2), (0x05, 1, 1), (0x06, 1, 1), (0x07, 1, 1), (0x09, 1, 1),
                         (0x0A, 1, 1), (0x0B, 1, 1), (0x0C, 1, 1), (0x0D, 1, 1), (0x0E, 1, 1), (0x0F, 1, 1),
                         (0x16, 1, 1), (0x17, 1, 1), (0x18, 1, 1), (0x19, 1, 1), (0x1C, 1, 1), (0x1D, 1, 1),
                         (0x1E, 1, 1), (0x1F, 1, 1)]


@pytest.fixture(scope="module")
def srv(tmp_path_factory):
    s_ = ServerProcess(tmp_path_factory.mktemp("mgmt") / "data", "--http-port", "0").start()
    yield s_
    assert s_.stop() == 0, s_.log()


def run(coro, timeout=60):
    async def bounded():
        return await asyncio.wait_for(coro, timeout)
    return asyncio.run(bounded())


async def call(srv, method, path, body=None, auth_=GUEST, raw=None):
    """(status, JSON body or None, headers) of one request to the HTTP listener."""
    url = f"http://127.0.0.1:{srv.ports['http']}{path}"
    data = raw if raw is not None else (json.dumps(body) if body is not None else None)
    async with aiohttp.ClientSession(headers={"Authorization": auth_}) as session:
        async with session.request(method, aiohttp.client.URL(url, encoded=True), data=data) as resp:
            text = await resp.text()
            return resp.status, (json.loads(text) if text else None), resp.headers


def http(srv, method, path, body=None, **kw):
    return run(call(srv, method, path, body, **kw))


def parse_props(body, pos=0):
    (n,) = struct.unpack_from(">i", body, pos)
    pos += 4
    out = {}
    for _ in range(n):
        (kl,) = struct.unpack_from(">h", body, pos)
        k = body[pos + 2:pos + 2 + kl].decode()
        pos += 2 + kl
        (vl,) = struct.unpack_from(">h", body, pos)
        out[k] = body[pos + 2:pos + 2 + vl].decode()
        pos += 2 + vl
    return out


def parse_strings(body, pos=0):
    (n,) = struct.unpack_from(">i", body, pos)
    pos += 4
    out = []
    for _ in range(n):
        (ln,) = struct.unpack_from(">h", body, pos)
        out.append(body[pos + 2:pos + 2 + ln].decode())
        pos += 2 + ln
    return out


def connect(srv, **kw):
    c = rawwire.RawClient(srv.port)
    assert c.handshake(**kw) == OK
    return c


def subscribe(c, sub_id, stream, properties=None, credit=10):
    body = struct.pack(">B", sub_id) + s(stream) + struct.pack(">HH", 1, credit) + props(properties or {})
    return c.request(0x07, body)[0]


# ------------------------------------------------------------------------------------- 2. versions

def test_peer_properties_report_the_rabbitmq_release_and_riverbeds_version(srv):
    c = rawwire.RawClient(srv.port)
    try:
        code, rest = c.request(0x11, props({"product": "raw"}))
        assert code == OK
        server = parse_props(rest)
        assert server["version"] == "4.3.0"
        assert server["riverbed-version"] == package_version("riverbed")
        assert server["product"] == "Riverbed"
    finally:
        c.close()


def test_riverbed_version_flag():
    out = subprocess.run([sys.executable, "-m", "riverbed.shells.cli", "--version"], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0
    assert out.stdout.strip() == f"riverbed {package_version('riverbed')} (RabbitMQ Stream protocol of RabbitMQ 4.3.0)"


def test_dashboard_shows_the_versions(srv):
    async def scenario():
        base = f"http://127.0.0.1:{srv.ports['http']}"
        async with aiohttp.ClientSession(headers={"Authorization": GUEST}) as session:
            async with session.get(base + "/") as resp:
                assert 'id="version"' in await resp.text()
            async with session.get(base + "/static/dashboard.js") as resp:
                assert "snap.version" in await resp.text()
            async with session.get(base + "/api/events") as resp:
                async for line in resp.content:
                    if line.startswith(b"data: "):
                        return json.loads(line[6:])
    snap = run(scenario(), 20)
    assert snap["version"] == package_version("riverbed") and snap["rabbitmq_version"] == "4.3.0"


def test_every_command_of_rabbitmq_4_3_is_answered(srv):
    c = connect(srv)
    try:
        # ExchangeCommandVersions: exactly RabbitMQ 4.3's list, in its order
        code, rest = c.request(0x1B, struct.pack(">i", 1) + struct.pack(">HHH", 0x08, 1, 2))
        assert code == OK
        (n,) = struct.unpack_from(">i", rest)
        got = [struct.unpack_from(">HHH", rest, 4 + 6 * i) for i in range(n)]
        assert got == RABBITMQ_4_3_COMMANDS
        # each request key of the table, with a valid body, gets its response (never Close 0x0d)
        assert c.create("every") == OK                                                       # 0x0d
        assert c.declare_publisher(1, "every", "ref-every") == OK                           # 0x01
        assert c.publish_confirmed(1, [(1, b"x"), (2, b"y")])[0] == {1, 2}                   # 0x02, 0x03
        code, rest = c.request(0x05, s("ref-every") + s("every"))                           # 0x05
        assert code == OK and struct.unpack(">Q", rest)[0] == 2
        assert c.request(0x06, struct.pack(">B", 1))[0] == OK                               # 0x06
        assert subscribe(c, 3, "every") == OK                                               # 0x07
        c.wait_for(0x08)                                                                     # Deliver
        c.send(frame(0x09, struct.pack(">BH", 3, 1)))                                       # 0x09: no reply
        c.send(frame(0x0A, s("app") + s("every") + struct.pack(">Q", 1)))                   # 0x0a: no reply
        code, rest = c.request(0x0B, s("app") + s("every"))                                 # 0x0b
        assert code == OK and struct.unpack(">Q", rest)[0] == 1
        assert c.request(0x0C, struct.pack(">B", 3))[0] == OK                               # 0x0c
        corr = c.next_corr()                                                                 # 0x0f
        c.send(frame(0x0F, struct.pack(">I", corr) + struct.pack(">i", 1) + s("every")))
        assert c.wait_for(0x800F, corr)
        parts = struct.pack(">i", 2) + s("every-ss-0") + s("every-ss-1")
        keys = struct.pack(">i", 2) + s("a") + s("b")
        assert c.request(0x1D, s("every-ss") + parts + keys + props({}))[0] == OK           # 0x1d
        code, rest = c.request(0x18, s("b") + s("every-ss"))                                # 0x18
        assert code == OK and parse_strings(rest) == ["every-ss-1"]
        code, rest = c.request(0x19, s("every-ss"))                                         # 0x19
        assert code == OK and parse_strings(rest) == ["every-ss-0", "every-ss-1"]
        code, rest = c.stream_stats("every")                                                 # 0x1c
        assert code == OK and set(rest) == {"first_chunk_id", "committed_chunk_id", "last_chunk_id"}
        code, rest = c.request(0x1F, s("every") + struct.pack(">H", 1) + props({}))         # 0x1f FIRST
        assert code == OK and struct.unpack_from(">HQ", rest) == (4, 0)
        assert c.request(0x1E, s("every-ss"))[0] == OK                                      # 0x1e
        c.send(frame(0x17))                                                                  # 0x17
        code, rest = c.request(0x13, s("PLAIN") + struct.pack(">i", 12) + b"\0guest\0guest")  # 0x13 again
        assert code == OK
        assert c.delete("every") == OK                                                       # 0x0e
        assert c.request(0x16, struct.pack(">H", 1) + s("bye"))[0] == OK                    # 0x16
        assert c.closed_within(5)
    finally:
        c.close()


# ------------------------------------------------------------------------------ 3. ending connections

def test_heartbeat_timeout_closes_the_socket_without_a_close_frame(srv):
    c = connect(srv, heartbeat=1)
    try:
        t0 = time.monotonic()
        frames = []
        while (f := c.recv_frame(10)) is not None:
            frames.append(f[0])
        assert 1.5 < time.monotonic() - t0 < 6
        assert set(frames) <= {0x17}, frames          # its heartbeats, then EOF: no Close (0x16)
    finally:
        c.close()


def test_refused_authentication_is_answered_after_the_tarpit_then_closed(srv):
    c = rawwire.RawClient(srv.port)
    try:
        c.request(0x11, props({}))
        c.request(0x12, b"")
        t0 = time.monotonic()
        creds = b"\0guest\0wrong"
        code, _ = c.request(0x13, s("PLAIN") + struct.pack(">i", len(creds)) + creds, timeout=10)
        waited = time.monotonic() - t0
        assert code == 0x08 and 2.8 < waited < 6, waited
        assert c.closed_within(2)
    finally:
        c.close()


def test_deleted_stream_is_a_metadata_update_and_the_connection_stays(srv):
    c, admin = connect(srv), connect(srv)
    try:
        assert admin.create("doomed") == OK
        assert subscribe(c, 1, "doomed") == OK
        assert admin.delete("doomed") == OK
        body = c.wait_for(0x10)
        assert struct.unpack_from(">H", body)[0] == 0x06 and body[4:4 + 6] == b"doomed"
        assert c.create("after-doomed") == OK         # still open
    finally:
        c.close()
        admin.close()


# ------------------------------------------------------------------------------- 4. management API

def test_queue_of_type_stream_lifecycle(srv):
    args = {"x-queue-type": "stream", "x-max-length-bytes": 20_000_000, "x-max-age": "7D",
            "x-stream-max-segment-size-bytes": 1_000_000, "x-initial-cluster-size": 1,
            "x-queue-leader-locator": "client-local"}
    st, body, _ = http(srv, "PUT", "/api/queues/%2F/q1", {"durable": True, "auto_delete": False, "arguments": args})
    assert st == 201, body
    assert http(srv, "PUT", "/api/queues/%2F/q1", {"durable": True, "arguments": args})[0] == 204
    st, body, _ = http(srv, "PUT", "/api/queues/%2F/q1", {"arguments": dict(args, **{"x-max-age": "1D"})})
    assert st == 400 and body["error"] == "bad_request" and "inequivalent arg 'x-max-age'" in body["reason"]
    c = connect(srv)
    try:                                               # a real stream for RabbitMQ Stream clients
        assert c.declare_publisher(1, "q1") == OK
        assert c.publish_confirmed(1, [(i, b"m") for i in range(1, 8)])[0] == set(range(1, 8))
    finally:
        c.close()
    st, q, _ = http(srv, "GET", "/api/queues/%2F/q1")
    assert st == 200 and q["messages"] == 7 and q["type"] == "stream" and q["vhost"] == "/"
    assert q["arguments"] == args and q["durable"] is True
    assert q["node"].startswith("riverbed@") and q["leader"] == q["node"] and q["members"] == [q["node"]]
    st, listed, _ = http(srv, "GET", "/api/queues")
    assert st == 200 and [x["messages"] for x in listed if x["name"] == "q1"] == [7]
    assert http(srv, "GET", "/api/queues/%2F")[1] == listed
    assert http(srv, "DELETE", "/api/queues/%2F/q1")[0] == 204
    assert http(srv, "GET", "/api/queues/%2F/q1")[:2] == (404, NOT_FOUND)
    assert http(srv, "DELETE", "/api/queues/%2F/q1")[:2] == (404, NOT_FOUND)


def test_queue_errors_as_rabbitmq(srv):
    st, body, _ = http(srv, "PUT", "/api/queues/%2F/classic", {"durable": True})
    assert st == 400 and body["error"] == "bad_request" and "stream" in body["reason"]
    st, body, _ = http(srv, "PUT", "/api/queues/%2F/bad", {"arguments": {"x-queue-type": "stream", "x-nope": 1}})
    assert st == 400 and body["error"] == "bad_request"
    st, body, _ = http(srv, "PUT", "/api/queues/%2F/bad", raw="{not json")
    assert st == 400 and body["error"] == "bad_request"
    assert http(srv, "PUT", "/api/queues/other/x", {"arguments": {"x-queue-type": "stream"}})[:2] == (404, NOT_FOUND)
    assert http(srv, "GET", "/api/queues/other")[:2] == (404, NOT_FOUND)
    st, body, hdrs = http(srv, "GET", "/api/queues", auth_=basic("guest", "wrong"))
    assert st == 401 and body["error"] == "not_authorized" and hdrs["WWW-Authenticate"].startswith("Basic")


def test_super_stream_as_an_exchange_bound_to_its_partitions(srv):
    assert http(srv, "PUT", "/api/exchanges/%2F/inv", {"type": "direct", "durable": True,
                                                       "arguments": {"x-super-stream": True}})[0] == 201
    assert http(srv, "PUT", "/api/exchanges/%2F/inv", {"type": "direct"})[0] == 204
    for i in range(3):
        assert http(srv, "PUT", f"/api/queues/%2F/inv-{i}", {"arguments": {"x-queue-type": "stream"}})[0] == 201
    c = connect(srv)
    try:
        code, rest = c.request(0x19, s("inv"))          # the exchange alone: a super stream with no partition
        assert code == OK and parse_strings(rest) == []
        for i in (2, 0, 1):                              # bound out of order: x-stream-partition-order decides
            st, _, hdrs = http(srv, "POST", f"/api/bindings/%2F/e/inv/q/inv-{i}",
                               {"routing_key": f"k{i}", "arguments": {"x-stream-partition-order": str(i)}})
            assert st == 201 and hdrs["Location"].startswith(f"/api/bindings/%2F/e/inv/q/inv-{i}/k{i}")
        code, rest = c.request(0x19, s("inv"))
        assert code == OK and parse_strings(rest) == ["inv-0", "inv-1", "inv-2"]
        code, rest = c.request(0x18, s("k1") + s("inv"))
        assert code == OK and parse_strings(rest) == ["inv-1"]
        st, bindings, _ = http(srv, "GET", "/api/exchanges/%2F/inv/bindings/source")
        assert st == 200 and [(b["destination"], b["routing_key"], b["arguments"]) for b in bindings] == [
            (f"inv-{i}", f"k{i}", {"x-stream-partition-order": i}) for i in range(3)]
        assert all(b["source"] == "inv" and b["destination_type"] == "queue" and b["vhost"] == "/" for b in bindings)
        assert http(srv, "GET", "/api/bindings/%2F/e/inv/q/inv-1")[1] == [bindings[1]]
        assert http(srv, "GET", "/api/queues/%2F/inv-2/bindings")[1] == [bindings[2]]
        assert [b for b in http(srv, "GET", "/api/bindings")[1] if b["source"] == "inv"] == bindings
        st, ex, _ = http(srv, "GET", "/api/exchanges/%2F/inv")
        assert st == 200 and ex["type"] == "direct" and ex["name"] == "inv"
        assert "inv" in [e["name"] for e in http(srv, "GET", "/api/exchanges")[1]]
        # unbind one, delete a partition queue: its binding goes with it, as on RabbitMQ
        key = bindings[1]["properties_key"]
        assert http(srv, "DELETE", f"/api/bindings/%2F/e/inv/q/inv-1/{key}")[0] == 204
        assert http(srv, "DELETE", "/api/queues/%2F/inv-2")[0] == 204
        code, rest = c.request(0x19, s("inv"))
        assert parse_strings(rest) == ["inv-0"]
        # deleting the exchange leaves the partition streams, as deleting an exchange does
        assert http(srv, "DELETE", "/api/exchanges/%2F/inv")[0] == 204
        code, _ = c.request(0x19, s("inv"))
        assert code == 0x02
        assert http(srv, "GET", "/api/queues/%2F/inv-0")[0] == 200
        assert http(srv, "GET", "/api/exchanges/%2F/inv")[:2] == (404, NOT_FOUND)
    finally:
        c.close()


def test_binding_errors(srv):
    assert http(srv, "POST", "/api/bindings/%2F/e/none/q/none", {"routing_key": "a"})[:2] == (404, NOT_FOUND)
    assert http(srv, "PUT", "/api/exchanges/%2F/topicx", {"type": "topic"})[0] == 400
    assert http(srv, "PUT", "/api/exchanges/%2F/be", {"type": "direct"})[0] == 201
    assert http(srv, "POST", "/api/bindings/%2F/e/be/q/missing", {"routing_key": "a"})[:2] == (404, NOT_FOUND)
    assert http(srv, "PUT", "/api/queues/%2F/be-0", {"arguments": {"x-queue-type": "stream"}})[0] == 201
    st, body, _ = http(srv, "POST", "/api/bindings/%2F/e/be/q/be-0",
                       {"routing_key": "a", "arguments": {"x-stream-partition-order": "first"}})
    assert st == 400 and body["error"] == "bad_request"


def test_stream_consumers_publishers_and_connections(srv):
    c = rawwire.RawClient(srv.port)
    c.request(0x11, props({"product": "raw", "connection_name": "mgmt-listing"}))
    try:
        c.request(0x12, b"")
        creds = b"\0guest\0guest"
        assert c.request(0x13, s("PLAIN") + struct.pack(">i", len(creds)) + creds)[0] == OK
        tune = c.wait_for(0x14)
        c.send(frame(0x14, tune))
        assert c.request(0x15, s("/"))[0] == OK
        assert c.create("listed") == OK
        assert c.declare_publisher(4, "listed", "pub-ref") == OK
        assert subscribe(c, 2, "listed", {"identifier": "my-consumer", "name": "app",
                                          "single-active-consumer": "true"}) == OK
        update = c.wait_for(0x1A)                       # ConsumerUpdate: activated once answered (FIRST)
        assert update[4:6] == b"\x02\x01"
        c.send(frame(0x801A, update[:4] + struct.pack(">HH", OK, 1)))
        deadline = time.monotonic() + 5
        while True:
            st, cons, _ = http(srv, "GET", "/api/stream/consumers/%2F")
            if any(x["active"] for x in cons if x["queue"]["name"] == "listed") or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        [mine] = [x for x in cons if x["queue"]["name"] == "listed"]
        assert mine["queue"] == {"name": "listed", "vhost": "/"} and mine["subscription_id"] == 2
        assert mine["properties"]["identifier"] == "my-consumer" and mine["properties"]["name"] == "app"
        assert mine["connection_details"]["name"] == "mgmt-listing" and mine["connection_details"]["user"] == "guest"
        assert mine["active"] is True and mine["activity_status"] == "single_active"
        assert mine["credits"] >= 0 and "offset" in mine and "offset_lag" in mine
        st, pubs, _ = http(srv, "GET", "/api/stream/publishers/%2F/listed")
        assert st == 200 and [(p["reference"], p["publisher_id"], p["queue"]["name"]) for p in pubs] == \
            [("pub-ref", 4, "listed")]
        assert http(srv, "GET", "/api/stream/publishers/%2F/nope")[:2] == (404, NOT_FOUND)
        assert [p["reference"] for p in http(srv, "GET", "/api/stream/publishers/%2F")[1]
                if p["queue"]["name"] == "listed"] == ["pub-ref"]
        tags = [x["consumer_tag"] for x in http(srv, "GET", "/api/consumers/%2F")[1] if x["queue"]["name"] == "listed"]
        assert tags == ["stream.subid-2"]
        st, conns, _ = http(srv, "GET", "/api/stream/connections")
        assert st == 200 and "mgmt-listing" in [x["name"] for x in conns]
        assert all(x["protocol"] == "stream" for x in conns)
        assert http(srv, "GET", "/api/stream/connections/%2F/mgmt-listing")[1]["user"] == "guest"
        sub = http(srv, "GET", "/api/stream/connections/%2F/mgmt-listing/consumers")[1]
        assert [x["properties"]["identifier"] for x in sub] == ["my-consumer"]
        pub = http(srv, "GET", "/api/stream/connections/%2F/mgmt-listing/publishers")[1]
        assert [x["reference"] for x in pub] == ["pub-ref"]
        assert http(srv, "DELETE", "/api/stream/connections/%2F/mgmt-listing")[0] == 204
        assert c.closed_within(5)
    finally:
        c.close()


def test_overview_whoami_nodes_vhosts(srv):
    st, ov, _ = http(srv, "GET", "/api/overview")
    assert st == 200 and ov["rabbitmq_version"] == "4.3.0" and ov["management_version"] == "4.3.0"
    assert ov["product_version"] == package_version("riverbed") and ov["node"].startswith("riverbed@")
    assert {"connections", "queues", "exchanges", "consumers"} <= set(ov["object_totals"])
    assert {"node": ov["node"], "protocol": "stream", "ip_address": "127.0.0.1", "port": srv.port} in ov["listeners"]
    assert http(srv, "GET", "/api/whoami")[1] == {"name": "guest", "tags": ["administrator"]}
    st, nodes, _ = http(srv, "GET", "/api/nodes")
    assert st == 200 and [n["name"] for n in nodes] == [ov["node"]] and nodes[0]["running"] is True
    assert http(srv, "GET", f"/api/nodes/{ov['node']}")[1]["name"] == ov["node"]
    assert http(srv, "GET", "/api/nodes/rabbit@elsewhere")[:2] == (404, NOT_FOUND)
    st, vhosts, _ = http(srv, "GET", "/api/vhosts")
    assert st == 200 and [v["name"] for v in vhosts] == ["/"]
    assert http(srv, "GET", "/api/vhosts/%2F")[1]["name"] == "/"
    assert http(srv, "GET", "/api/vhosts/other")[:2] == (404, NOT_FOUND)


def test_users_tags_and_permissions(tmp_path):
    users = tmp_path / "users.toml"
    auth.add_user(str(users), "alice", "s3cret", configure="^alice-", write="^alice-", read="^alice-")
    auth.add_user(str(users), "root", "r00t")
    srv = ServerProcess(tmp_path / "data", "--http-port", "0", "--users", str(users)).start()
    alice, root = basic("alice", "s3cret"), basic("root", "r00t")
    try:
        assert http(srv, "GET", "/api/whoami", auth_=alice)[1] == {"name": "alice", "tags": ["management"]}
        assert http(srv, "GET", "/api/whoami", auth_=root)[1] == {"name": "root", "tags": ["administrator"]}
        assert http(srv, "GET", "/api/whoami", auth_=GUEST)[0] == 401        # no built-in guest with a file
        q = {"arguments": {"x-queue-type": "stream"}}
        assert http(srv, "PUT", "/api/queues/%2F/alice-1", q, auth_=alice)[0] == 201
        st, body, _ = http(srv, "PUT", "/api/queues/%2F/bob-1", q, auth_=alice)
        assert st == 403 and body["error"] == "access_refused"
        assert http(srv, "PUT", "/api/exchanges/%2F/bob-x", {"type": "direct"}, auth_=alice)[0] == 403
        assert http(srv, "PUT", "/api/queues/%2F/bob-1", q, auth_=root)[0] == 201
        assert http(srv, "DELETE", "/api/queues/%2F/bob-1", auth_=alice)[0] == 403
        assert http(srv, "DELETE", "/api/queues/%2F/bob-1", auth_=root)[0] == 204
    finally:
        assert srv.stop() == 0, srv.log()


def test_deleting_a_partition_stream_drops_its_binding(srv):
    # as RabbitMQ, where a deleted queue's bindings go with it: Partitions and Route stop naming it
    c = connect(srv)
    try:
        parts = struct.pack(">i", 2) + s("drop-0") + s("drop-1")
        keys = struct.pack(">i", 2) + s("a") + s("b")
        assert c.request(0x1D, s("drop") + parts + keys + props({}))[0] == OK
        assert c.delete("drop-1") == OK
        code, rest = c.request(0x19, s("drop"))
        assert code == OK and parse_strings(rest) == ["drop-0"]
        code, rest = c.request(0x18, s("b") + s("drop"))
        assert code == OK and parse_strings(rest) == []
        assert [b["destination"] for b in http(srv, "GET", "/api/exchanges/%2F/drop/bindings/source")[1]] == ["drop-0"]
        assert c.request(0x1E, s("drop"))[0] == OK
    finally:
        c.close()


def test_super_streams_endpoint_of_the_stream_plugin(srv):
    assert http(srv, "PUT", "/api/stream/super-streams/%2F/plug", {"partitions": 2})[0] == 204
    assert http(srv, "PUT", "/api/stream/super-streams/%2F/keyed",
                {"binding-keys": "eu, us", "arguments": {"x-max-age": "1D"}})[0] == 204
    c = connect(srv)
    try:
        code, rest = c.request(0x19, s("plug"))
        assert code == OK and parse_strings(rest) == ["plug-0", "plug-1"]
        code, rest = c.request(0x18, s("us") + s("keyed"))
        assert code == OK and parse_strings(rest) == ["keyed-us"]
    finally:
        c.close()
    assert http(srv, "GET", "/api/queues/%2F/keyed-eu")[1]["arguments"]["x-max-age"] == "1D"
    for body in ({}, {"partitions": 2, "binding-keys": "a"}, {"partitions": "many"}, {"partitions": 0},
                 {"partitions": 2}):          # the last one: it exists
        st, err, _ = http(srv, "PUT", "/api/stream/super-streams/%2F/plug", body)
        assert st == 400 and err["error"] == "bad_request", (body, err)
