"""The real npm ``streamr-client@0.12.2`` (under Node) against the WebSocket JSON listener of ``riverbed
serve``: live delivery, resends with gap detection quiet, a second client resending then going live, and
API keys (``riverbed users add NAME --api-key``).

The client comes from ci/npm-test-deps.sh (installed into a cache outside the work tree on first use);
the scenarios are in js/streamr_scenarios.js.
"""

import json
import os
import subprocess
import sys

import pytest

from procs import ServerProcess

pytestmark = pytest.mark.integration

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "js", "streamr_scenarios.js")


def js(node_modules, srv, scenario, timeout=60, **cfg):
    port = srv.ports["ws"]
    cfg = dict(cfg, scenario=scenario, url=f"ws://127.0.0.1:{port}/api/v1/ws",
               restUrl=f"http://127.0.0.1:{port}/api/v1", timeoutMs=int(timeout * 1000 * 0.8))
    out = subprocess.run(["node", SCRIPT, json.dumps(cfg)], capture_output=True, text=True, timeout=timeout,
                         env=dict(os.environ, NODE_PATH=node_modules))
    assert out.returncode == 0, out.stderr
    res = json.loads(out.stdout.strip().splitlines()[-1])
    assert "exception" not in res and not res.get("timeout"), (res, out.stderr)
    return res


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    srv = ServerProcess(tmp_path_factory.mktemp("wsjs") / "data", "--ws-port", "0").start()
    yield srv
    assert srv.stop() == 0, srv.log()


def test_1000_live_and_resend_all_gap_detection_quiet(node_modules, server):
    r = js(node_modules, server, "liveAndResend", stream="js-live", n=1000, m=100)
    assert r["liveOk"] and r["resendOk"] and r["laterOk"], r
    assert r["countA"] == 1100 and r["countB"] == 1100
    assert r["orderA"] and r["orderB"] and r["chainA"] and r["chainB"]
    assert r["gapRequestsA"] == 0 and r["gapRequestsB"] == 0 and r["resendRequestsB"] == 1
    assert r["resendingB"] is False           # the second client is live, not stuck in "resending"
    assert r["firstB"][:2] == [0, None]
    assert r["errors"] == []


def test_resend_last_then_own_publish_live(node_modules, server):
    js(node_modules, server, "publish", stream="js-last", messages=[{"k": i} for i in range(5)])
    r = js(node_modules, server, "collect", stream="js-last", n=3, resend={"resend_last": 2},
           publish=[{"k": "live"}])
    assert r["ok"] and r["errors"] == [], r
    assert [g["content"]["k"] for g in r["got"]] == [3, 4, "live"]
    assert [g["meta"][:2] for g in r["got"]] == [[3, 2], [4, 3], [5, 4]]
    assert r["resendRequests"] == 1


def test_resend_from_and_from_time(node_modules, server):
    js(node_modules, server, "publish", stream="js-from", messages=[{"k": i} for i in range(6)])
    r = js(node_modules, server, "collect", stream="js-from", n=2, resend={"resend_from": 4})
    assert [g["content"]["k"] for g in r["got"]] == [4, 5]
    r = js(node_modules, server, "collect", stream="js-from", n=6, resend={"resend_from_time": 0})
    assert [g["content"]["k"] for g in r["got"]] == list(range(6))
    ts = r["got"][3]["meta"][2]
    r = js(node_modules, server, "collect", stream="js-from", n=0, resend={"resend_from_time": ts + 10 ** 7})
    assert r["got"] == [] and r["errors"] == []        # no_resend: the subscription simply goes live


def test_publish_errors_reach_the_client(node_modules, server):
    # produceToStream stringifies for us; a subscription to a partition that does not exist is an error
    r = js(node_modules, server, "collect", stream="js-err", partition=3, n=0, timeout=20)
    assert r["subscribed"] is False
    assert any("partition 3 does not exist" in e for e in r["errors"]), r


@pytest.fixture(scope="module")
def keys(tmp_path_factory):
    """A users file made with the real CLI; returns (path, {name: api key})."""
    d = tmp_path_factory.mktemp("wsusers")
    path = str(d / "users.toml")
    made = {}
    for name, perms in [("reader", ["--configure", "", "--write", "", "--read", "^pub"]),
                        ("writer", ["--configure", "", "--write", "^pub", "--read", ""]),
                        ("admin", [])]:
        out = subprocess.run([sys.executable, "-m", "riverbed.shells.cli", "users", "--users", path, "add", name,
                              "--api-key", *perms], capture_output=True, text=True, stdin=subprocess.DEVNULL,
                             timeout=60)
        assert out.returncode == 0, out.stderr
        made[name] = out.stdout.strip().splitlines()[-1]
        assert len(made[name]) >= 40 and " " not in made[name]
    text = open(path).read()
    assert all(k not in text for k in made.values()) and text.count("api_key = \"sha256$") == 3
    return path, made


@pytest.fixture(scope="module")
def auth_server(tmp_path_factory, keys):
    srv = ServerProcess(tmp_path_factory.mktemp("wsauth") / "data", "--ws-port", "0", "--users", keys[0]).start()
    yield srv
    assert srv.stop() == 0, srv.log()


def test_api_key_option_of_the_real_client(node_modules, auth_server, keys):
    _, k = keys
    # admin creates the stream on first subscribe; writer publishes; reader resends and goes live
    r = js(node_modules, auth_server, "collect", stream="pub-a", n=2, apiKey=k["admin"],
           publish=[{"n": 1}, {"n": 2}])
    assert r["ok"] and r["errors"] == [], r
    js(node_modules, auth_server, "publish", stream="pub-a", apiKey=k["writer"], messages=[{"n": 3}])
    r = js(node_modules, auth_server, "collect", stream="pub-a", n=3, apiKey=k["reader"],
           resend={"resend_all": True})
    assert [g["content"]["n"] for g in r["got"]] == [1, 2, 3] and r["errors"] == []
    # the reader may not publish: an error frame, nothing stored
    r = js(node_modules, auth_server, "publish", stream="pub-a", apiKey=k["reader"], messages=[{"n": 99}])
    assert r["errors"] == ["Not authorized to publish to stream pub-a"]
    r = js(node_modules, auth_server, "collect", stream="pub-a", n=3, apiKey=k["reader"],
           resend={"resend_all": True})
    assert [g["content"]["n"] for g in r["got"]] == [1, 2, 3]
    # a wrong key and no key
    r = js(node_modules, auth_server, "collect", stream="pub-a", n=0, apiKey="wrong-key", timeout=15)
    assert r["subscribed"] is False and r["errors"] == ["Authentication failed."]
    r = js(node_modules, auth_server, "collect", stream="pub-a", n=0, timeout=15)
    assert r["subscribed"] is False and r["errors"] == ["Not authorized to subscribe to stream pub-a and partition 0"]
    # the writer may not create streams
    r = js(node_modules, auth_server, "publish", stream="pub-new", apiKey=k["writer"], messages=[{"n": 1}])
    assert r["errors"] == ["Stream pub-new not found."]


def test_rest_with_api_keys(auth_server, keys):
    import asyncio

    import aiohttp
    _, k = keys
    base = f"http://127.0.0.1:{auth_server.ports['ws']}/api/v1/streams"

    async def go():
        async with aiohttp.ClientSession() as s:
            tok = lambda name: {"Authorization": f"token {k[name]}"}   # noqa: E731
            async with s.post(f"{base}/pub-rest/data", json={"a": 1}, headers=tok("writer")) as r:
                assert r.status == 404 and (await r.json())["error"] == "Stream pub-rest not found."
            async with s.post(f"{base}/pub-rest/data", json={"a": 1}, headers=tok("admin")) as r:
                assert r.status == 200
            async with s.post(f"{base}/pub-rest/data", json=[{"a": 2}], headers=tok("writer")) as r:
                assert r.status == 200
            async with s.post(f"{base}/pub-rest/data", json={"a": 3}, headers=tok("reader")) as r:
                assert r.status == 403
            async with s.post(f"{base}/pub-rest/data", json={"a": 3}) as r:
                assert r.status == 401
            async with s.get(f"{base}/pub-rest/data/partitions/0/last?count=5", headers=tok("reader")) as r:
                assert r.status == 200 and [m[8] for m in await r.json()] == ['{"a":1}', '{"a":2}']
            async with s.get(f"{base}/pub-rest/data/partitions/0/last", headers=tok("writer")) as r:
                assert r.status == 403
            async with s.get(f"{base}/pub-rest/data/partitions/0/last",
                             headers={"Authorization": "token nope"}) as r:
                assert r.status == 401 and (await r.json())["error"] == "Authentication failed."
            # authorisation before existence: a reader learns nothing about a stream it may not read
            async with s.get(f"{base}/secret/data/partitions/0/last", headers=tok("reader")) as r:
                assert r.status == 403
    asyncio.run(asyncio.wait_for(go(), 30))


def test_super_stream_partition_with_the_real_client(node_modules, server):
    """A stream id naming a super stream has its partitions; REST publishes with pkey land in the murmur3
    partition and the real client reads partition p (resend_all) with a sound offset chain."""
    import asyncio

    import aiohttp
    from rstream import SuperStreamCreationOption, SuperStreamProducer

    from riverbed.shells.ws_json import partition_for_key

    keys = [f"k{i}" for i in range(10)]

    async def setup():
        async with SuperStreamProducer("127.0.0.1", server.port, username="guest", password="guest",
                                       super_stream="js-sup",
                                       super_stream_creation_option=SuperStreamCreationOption(n_partitions=3),
                                       routing_extractor=lambda m: "k"):
            pass
        async with aiohttp.ClientSession() as s:
            for k in keys:
                async with s.post(f"http://127.0.0.1:{server.ports['ws']}/api/v1/streams/js-sup/data?pkey={k}",
                                  json={"k": k}) as r:
                    assert r.status == 200
    asyncio.run(asyncio.wait_for(setup(), 30))
    for p in range(3):
        mine = [k for k in keys if partition_for_key(k, 3) == p]
        r = js(node_modules, server, "collect", stream="js-sup", partition=p, n=len(mine), resend={"resend_all": True})
        assert r["ok"] and r["errors"] == [], r
        assert [g["content"]["k"] for g in r["got"]] == mine
        assert all(g["meta"][3] == p for g in r["got"])
        assert [g["meta"][0] for g in r["got"]] == list(range(len(mine)))
        assert [g["meta"][1] for g in r["got"]] == [None] + list(range(len(mine) - 1))
