"""Lease keep-alives over one persistent connection (shells/cluster/etcd_lease.py) against a real etcd
3.4, and the parser of its answers on its own."""

import asyncio

import pytest

from riverbed.shells.cluster.etcd import Etcd, EtcdError
from riverbed.shells.cluster.etcd_lease import _answer

BODY = b'{"result":{"ID":"7","TTL":"3"}}\n'
# the gateway's shape: headers, one chunk per message, the last (empty) chunk
CHUNKED = (b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
           b"%x\r\n%s\r\n0\r\n\r\n" % (len(BODY), BODY))


def test_answer_is_parsed_only_once_whole_in_any_split():
    for cut in range(len(CHUNKED)):
        assert _answer(bytearray(CHUNKED[:cut])) is None, cut
    status, body, used, close = _answer(bytearray(CHUNKED + b"HTTP/1.1 ..."))
    assert (status, body, used, close) == (200, BODY, len(CHUNKED), False)


def test_answer_with_length_trailers_and_close():
    busy = b"HTTP/1.1 503 Service Unavailable\r\ncontent-length: 4\r\nConnection: close\r\n\r\nbusy"
    assert _answer(bytearray(busy + b"more")) == (503, b"busy", len(busy), True)
    assert _answer(bytearray(busy[:-1])) is None
    two = (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n3\r\n[1]\r\n0\r\nX-T: 1\r\n\r\n")
    assert _answer(bytearray(two)) == (200, b"{}[1]", len(two), False)
    assert _answer(bytearray(two[:-2])) is None           # the trailer's end is not the answer's end


@pytest.mark.parametrize("bad", [b"SSH-2.0-OpenSSH\r\n\r\n", b"HTTP/1.1 200 OK\r\nX: y\r\n\r\nbody",
                                 b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n"])
def test_answer_refuses_what_is_not_an_http_answer(bad):
    with pytest.raises(ValueError):
        _answer(bytearray(bad))


def test_renewals_share_one_connection_and_survive_its_loss(etcd):
    """Many renewals over ONE connection; a connection etcd closes is dialled again by the next renewal
    (no renewal is lost to it); an expired lease answers 0, not an error."""
    async def go():
        c = Etcd(etcd.url)
        try:
            lease = await c.grant(5)
            assert await c.keepalive(lease) == 5
            line = c._line[1]
            for _ in range(20):
                assert await c.keepalive(lease) == 5
            assert c._line[1] is line and not line.closed
            line.transport.close()                 # as etcd closing an idle connection
            await asyncio.sleep(0.05)
            assert await c.keepalive(lease) == 5
            assert c._line[1] is not line
            await c.revoke(lease)
            assert await c.keepalive(lease) == 0
        finally:
            await c.close()
    asyncio.run(go())


def test_renewal_tries_the_next_endpoint_then_fails_clearly(etcd):
    async def go():
        c = Etcd(f"http://127.0.0.1:1,{etcd.url}", timeout=1.0)
        try:
            lease = await c.grant(5)
            assert await c.keepalive(lease) == 5          # the dead endpoint skipped
        finally:
            await c.close()
        c = Etcd("http://127.0.0.1:1", timeout=0.5)
        try:
            with pytest.raises(EtcdError, match="no etcd endpoint answered"):
                await c.keepalive(12345)
        finally:
            await c.close()
    asyncio.run(go())


def test_renewal_gets_no_answer_in_time_from_a_silent_endpoint():
    """An endpoint that accepts and never answers (a stopped etcd) costs one timeout, then EtcdError."""
    async def go():
        server = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        c = Etcd(f"http://127.0.0.1:{port}", timeout=0.3)
        try:
            loop = asyncio.get_running_loop()
            t0 = loop.time()
            with pytest.raises(EtcdError, match="no keep-alive answer"):
                await c.keepalive(12345)
            assert loop.time() - t0 < 2
            assert c._line is None
        finally:
            await c.close()
            server.close()
    asyncio.run(go())


def test_a_fractional_lease_ttl_is_granted_whole_seconds_rounded_up(tmp_path, etcd):
    """``--lease-ttl 2.5``: etcd grants whole seconds, and the node trusts its lease for 2.5 s, so etcd's
    lease must be 3 s (round(2.5) gave 2: etcd expired it, and another node could lead, while this one
    still confirmed)."""
    from clusterfixtures import running_cluster

    async def granted():
        c = Etcd(etcd.url)
        try:
            kv = await c.get("/riverbed/test/nodes/n1")
            assert kv is not None and kv.lease
            r = await c._call("/v3/lease/timetolive", {"ID": str(kv.lease)})
            return int(r["grantedTTL"])
        finally:
            await c.close()
    with running_cluster(tmp_path, etcd, n=1, lease_ttl=2.5):
        assert asyncio.run(granted()) == 3
