"""The HTTP listener's management API over a fake broker (sessions with ``connection_info()`` and
``close_by_admin()``) and the real Authenticator; tests/integration/test_rmq_compat.py drives the real
server."""

import asyncio
import base64

import aiohttp
import pytest

from riverbed.shells import auth
from riverbed.shells.http import serve


class FakeSession:
    def __init__(self, name, user, peer_port, props=None, connected_at=1000):
        self.info = dict(name=name, protocol="stream", peer_host="127.0.0.1", peer_port=peer_port,
                         host="127.0.0.1", port=5552, user=user, client_properties=props or {},
                         connected_at=connected_at, state="running")
        self.closed = []

    def connection_info(self):
        return dict(self.info)

    def close_by_admin(self, reason):
        self.closed.append(reason)


class FakeBroker:
    def __init__(self, authenticator, sessions):
        self.auth = authenticator
        self.sessions = set(sessions)


def basic(user, password):
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 30))


async def with_server(broker, fn):
    srv = await serve(broker, host="127.0.0.1", port=0, config=None)
    try:
        async with aiohttp.ClientSession(f"http://127.0.0.1:{srv.port}") as http:
            return await fn(http)
    finally:
        srv.stop_accepting()
        await srv.shutdown()


GUEST = basic("guest", "guest")


def test_list_get_delete_with_guest():
    named = FakeSession("app-1", "guest", 40001, {"connection_name": "app-1", "product": "x"}, 2000)
    unnamed = FakeSession("127.0.0.1:40002 -> 127.0.0.1:5552", "guest", 40002, {"product": "y"}, 1000)
    broker = FakeBroker(auth.Authenticator(), [named, unnamed])

    async def scenario(http):
        async with http.get("/api/connections", headers=GUEST) as r:
            assert r.status == 200
            items = await r.json()
        assert [c["name"] for c in items] == [unnamed.info["name"], "app-1"]    # oldest first
        one = items[1]
        assert one["user_provided_name"] == "app-1" and one["client_properties"]["product"] == "x"
        for key in ("user", "peer_host", "peer_port", "host", "port", "protocol", "connected_at", "state",
                    "vhost"):
            assert key in one, key
        assert "user_provided_name" not in items[0]
        async with http.get("/api/connections/app-1", headers=GUEST) as r:
            assert r.status == 200 and (await r.json())["peer_port"] == 40001
        # the generated name finds a named connection too (client-chosen names need not be unique)
        async with http.get("/api/connections/127.0.0.1:40001 -> 127.0.0.1:5552", headers=GUEST) as r:
            assert r.status == 200 and (await r.json())["name"] == "app-1"
        async with http.delete("/api/connections/app-1", headers={**GUEST, "X-Reason": "bye"}) as r:
            assert r.status == 204
        assert named.closed == ["bye"] and unnamed.closed == []
        async with http.delete("/api/connections/127.0.0.1:40002 -> 127.0.0.1:5552", headers=GUEST) as r:
            assert r.status == 204
        assert unnamed.closed == ["Closed via management plugin"]
        async with http.get("/api/connections/nope", headers=GUEST) as r:
            assert r.status == 404 and (await r.json())["error"] == "Object Not Found"
        async with http.delete("/api/connections/nope", headers=GUEST) as r:
            assert r.status == 404
        async with http.get("/api/nothing-here", headers=GUEST) as r:
            assert r.status == 404 and r.content_type == "application/json"
    run(with_server(broker, scenario))


def test_authentication_failures():
    broker = FakeBroker(auth.Authenticator(), [FakeSession("a", "guest", 1)])

    async def scenario(http):
        # no header at all is guest on loopback without a users file (DESIGN.md "Auth"); a bad one is refused
        async with http.get("/api/connections") as r:
            assert r.status == 200
        for headers in (basic("guest", "wrong"), basic("nobody", "guest"), {"Authorization": "Basic !!"},
                        {"Authorization": "Bearer x"}):
            for method, path in (("GET", "/api/connections"), ("GET", "/api/connections/a"),
                                 ("DELETE", "/api/connections/a")):
                async with http.request(method, path, headers=headers) as r:
                    assert r.status == 401, (headers, method, path)
                    assert r.headers["WWW-Authenticate"].startswith("Basic ")
                    assert (await r.json())["error"] == "not_authorized"
        assert broker.sessions.pop().closed == []
    run(with_server(broker, scenario))


def test_users_file_permissions(tmp_path):
    users = tmp_path / "users.toml"
    auth.add_user(str(users), "admin", "s3cret")
    auth.add_user(str(users), "alice", "pw", configure="^alice-")
    mine = FakeSession("alice-conn", "alice", 2)
    other = FakeSession("admin-conn", "admin", 3)
    broker = FakeBroker(auth.Authenticator(str(users)), [mine, other])

    async def scenario(http):
        async with http.get("/api/connections", headers=basic("guest", "guest")) as r:
            assert r.status == 401                      # no built-in guest once there is a users file
        async with http.get("/api/connections") as r:
            assert r.status == 401                      # and no login-free loopback either
        async with http.get("/api/connections", headers=basic("admin", "s3cret")) as r:
            assert sorted(c["name"] for c in await r.json()) == ["admin-conn", "alice-conn"]
        async with http.get("/api/connections", headers=basic("alice", "pw")) as r:
            assert [c["name"] for c in await r.json()] == ["alice-conn"]
        async with http.get("/api/connections/admin-conn", headers=basic("alice", "pw")) as r:
            assert r.status == 403
        async with http.delete("/api/connections/admin-conn", headers=basic("alice", "pw")) as r:
            assert r.status == 403
        assert other.closed == []
        async with http.delete("/api/connections/alice-conn", headers=basic("alice", "pw")) as r:
            assert r.status == 204
        async with http.delete("/api/connections/admin-conn", headers=basic("admin", "s3cret")) as r:
            assert r.status == 204
        assert mine.closed and other.closed
    run(with_server(broker, scenario))


def test_guest_only_from_loopback():
    """The HTTP peer's address goes to the Authenticator: guest (loopback-only) is refused elsewhere."""
    from riverbed.shells.http import auth as http_auth

    class Req:
        remote = "192.0.2.7"
        headers = basic("guest", "guest")
        app = {}

    from riverbed.shells.http.server import BROKER
    Req.app = {BROKER: FakeBroker(auth.Authenticator(), [])}

    async def scenario():
        with pytest.raises(aiohttp.web.HTTPUnauthorized) as e:
            await http_auth.require_user(Req())
        assert "localhost" in e.value.text
        Req.remote = "127.0.0.1"
        assert (await http_auth.require_user(Req())).name == "guest"
    run(scenario())


def test_port_zero_and_shutdown():
    async def scenario():
        srv = await serve(FakeBroker(auth.Authenticator(), []), host="127.0.0.1", port=0, config=None)
        assert srv.port > 0
        srv.stop_accepting()
        await srv.shutdown()
        with pytest.raises(OSError):
            await asyncio.open_connection("127.0.0.1", srv.port)
    run(scenario())
