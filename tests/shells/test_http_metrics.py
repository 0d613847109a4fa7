"""GET /metrics against ``riverbed serve`` run in this process: who may scrape, what each user sees,
the listener and engine families, 1,000 streams in one scrape. Every answer is parsed with
prometheus-client's own parser. tests/integration/test_http_metrics.py drives the real server process
with a real client."""

import asyncio
import base64
import socket
import statistics
import struct
import time
import types

import aiohttp
import pytest
import zmq
import zmq.asyncio
from prometheus_client.parser import text_string_to_metric_families

from riverbed.engine.stats import LatencyHistogram
from riverbed.shells import auth
from riverbed.shells.broker import Tail
from riverbed.shells.http import metrics as _metrics
from riverbed.shells.http.server import BROKER

from .test_http_health import get, http_port, run, running


def basic(user, password):
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}


def parse(text):
    """{family name: {labels as a sorted tuple of pairs: value}} (a histogram's samples under its name)."""
    out = {}
    for fam in text_string_to_metric_families(text):
        d = out.setdefault(fam.name, {})
        for s in fam.samples:
            key = (s.name,) + tuple(sorted(s.labels.items())) if fam.type == "histogram" else \
                tuple(sorted(s.labels.items()))
            assert key not in d, f"duplicate sample {fam.name} {key}"
            d[key] = s.value
    return out


async def scrape(broker, **kw):
    status, ctype, text = await get(broker, "/metrics", **kw)
    assert status == 200, text
    assert ctype.startswith("text/plain; version=0.0.4"), ctype
    return parse(text)


async def until(broker, read, want, timeout=10):
    """Scrape until ``read(families) == want`` (the server handles other connections' bytes in its own
    time); returns that scrape, or fails with the last value."""
    deadline = time.monotonic() + timeout
    while True:
        fams = await scrape(broker)
        got = read(fams)
        if got == want:
            return fams
        assert time.monotonic() < deadline, f"still {got}, waiting for {want}"
        await asyncio.sleep(0.02)


def per_stream(fams, family):
    return {dict(k)["stream"]: v for k, v in fams[family].items()}


async def create(broker, *names):
    for n in names:
        await asyncio.wrap_future(broker.engine.create_stream(n))


async def append(broker, stream, records):
    fut = asyncio.get_running_loop().create_future()
    broker.append_records(stream, records, lambda res, exc: fut.set_result((res, exc)))
    res, exc = await fut
    assert exc is None, exc
    return res


def test_stream_families_follow_appends_deliveries_and_deletions(tmp_path):
    async def main():
        async with running(tmp_path) as broker:
            odd = 'we"ird\\na\nme ü'
            await create(broker, "s-a", "s-b", odd)
            before = await scrape(broker)
            assert before["riverbed_streams"] == {(): 3}
            assert per_stream(before, "riverbed_stream_records") == {"s-a": 0, "s-b": 0, odd: 0}
            assert per_stream(before, "riverbed_stream_first_offset")["s-a"] == -1
            await append(broker, "s-a", [b"x" * 10] * 7)
            await append(broker, "s-a", [b"y" * 10] * 3)
            await append(broker, odd, [b"z"])
            after = await scrape(broker)
            assert per_stream(after, "riverbed_stream_published_records") == {"s-a": 10, "s-b": 0, odd: 1}
            assert per_stream(after, "riverbed_stream_records") == {"s-a": 10, "s-b": 0, odd: 1}
            assert per_stream(after, "riverbed_stream_last_offset") == {"s-a": 9, "s-b": -1, odd: 0}
            assert per_stream(after, "riverbed_stream_first_offset") == {"s-a": 0, "s-b": -1, odd: 0}
            assert per_stream(after, "riverbed_stream_chunks")["s-a"] >= 1
            assert per_stream(after, "riverbed_stream_bytes")["s-a"] > 100
            engine = after["riverbed_engine_group_commits"][()] - before["riverbed_engine_group_commits"][()]
            assert engine >= 2       # two appends of s-a that waited for each other, at least
            assert after["riverbed_engine_written_bytes"][()] > before["riverbed_engine_written_bytes"][()]

            # deliveries: a tail of s-a from 3, through the broker layer as every protocol's subscription
            got = []
            tail = Tail(broker, "s-a", 3, lambda t, cid, raw, start: got.append(start) or 1,
                        defer=asyncio.get_running_loop().call_soon, credit=10)
            tail.start()
            assert got
            tail.close()
            fams = await scrape(broker)
            assert per_stream(fams, "riverbed_stream_delivered_records") == {"s-a": 7, "s-b": 0, odd: 0}

            # a deleted stream leaves every family, and one created again under its name starts at 0
            await asyncio.wrap_future(broker.engine.delete_stream("s-a"))
            await until(broker, lambda f: "s-a" in per_stream(f, "riverbed_stream_records"), False)
            await until(broker, lambda f: "s-a" in broker.stats.delivered, False)   # heard on the loop
            await create(broker, "s-a")
            fams = await scrape(broker)
            assert per_stream(fams, "riverbed_stream_published_records")["s-a"] == 0
            assert per_stream(fams, "riverbed_stream_delivered_records")["s-a"] == 0
    run(main())


def test_published_counts_from_the_start_of_the_server_and_stored_records_survive_it(tmp_path):
    async def main():
        async with running(tmp_path) as broker:
            await create(broker, "kept")
            await append(broker, "kept", [b"a"] * 5)
            fams = await scrape(broker)
            assert per_stream(fams, "riverbed_stream_published_records")["kept"] == 5
        async with running(tmp_path) as broker:      # the same data directory, a new process's counters
            fams = await scrape(broker)
            assert per_stream(fams, "riverbed_stream_published_records")["kept"] == 0
            assert per_stream(fams, "riverbed_stream_records")["kept"] == 5
            await append(broker, "kept", [b"b"] * 2)
            fams = await scrape(broker)
            assert per_stream(fams, "riverbed_stream_published_records")["kept"] == 2
            assert per_stream(fams, "riverbed_stream_last_offset")["kept"] == 6
    run(main())


def test_engine_histograms_are_cumulative_and_count_every_group_commit(tmp_path):
    async def main():
        async with running(tmp_path) as broker:
            await create(broker, "h")
            for i in range(20):
                await append(broker, "h", [b"%d" % i])
            fams = await scrape(broker)
            commits = fams["riverbed_engine_group_commits"][()]
            assert commits >= 21
            for name in ("riverbed_engine_commit_seconds", "riverbed_engine_fsync_seconds"):
                h = fams[name]
                buckets = sorted(((float(dict(k[1:])["le"]), v) for k, v in h.items()
                                  if k[0] == name + "_bucket"))
                counts = [v for _, v in buckets]
                assert counts == sorted(counts) and buckets[-1][0] == float("inf")
                assert counts[-1] == h[(name + "_count",)] == commits
                assert 0 < h[(name + "_sum",)] < 60
            size = fams["riverbed_engine_map_size_bytes"][()]
            assert 0 < fams["riverbed_engine_map_used_bytes"][()] <= size
            assert fams["process_resident_memory_bytes"][()] > 10 << 20
            assert fams["process_cpu_seconds"][()] > 0
    run(main())


def test_histogram_buckets_hold_their_upper_bound():
    h = LatencyHistogram((0.001, 0.01))
    for v in (0.0005, 0.001, 0.002, 0.01, 5.0):
        h.observe(v)
    buckets, total = h.snapshot()
    assert buckets == [("0.001", 2), ("0.01", 4), ("+Inf", 5)]
    assert total == pytest.approx(5.0135)


def test_listener_families_count_connections_and_reads(tmp_path):
    ws, z, r = (("listener", "ws"),), (("listener", "zmq"),), (("listener", "stream"),)

    def value(key, family="riverbed_listener_reads"):
        return lambda fams: fams[family].get(key, 0)

    async def main():
        async with running(tmp_path, ws_port="0", zmq_port="0", stream_port="0") as broker:
            servers = dict(broker.listeners)
            before = await scrape(broker)
            assert before["riverbed_listener_connections_open"][ws] == 0
            async with aiohttp.ClientSession() as s:
                async with s.ws_connect(f"http://127.0.0.1:{servers['ws'].port}/api/v1/ws") as conn:
                    await conn.send_str("not a v28 request")
                    await conn.send_str("[]")
                    during = await until(broker, value(ws), 2)
                    assert during["riverbed_listener_connections_open"][ws] == 1
                    assert during["riverbed_listener_connections_accepted"][ws] == 1
            await until(broker, value(ws, "riverbed_listener_connections_open"), 0)

            ctx = zmq.asyncio.Context()
            try:
                dealer = ctx.socket(zmq.DEALER)
                dealer.linger = 0
                dealer.connect(f"tcp://127.0.0.1:{servers['zmq'].port}")
                await dealer.send_multipart([b"", b"NOT-A-COMMAND"])
                fams = await until(broker, value(z), 1)
                assert fams["riverbed_listener_connections_accepted"][z] == 1
                dealer.close()
            finally:
                ctx.term()

            reader, writer = await asyncio.open_connection("127.0.0.1", servers["stream"].port)
            writer.write(b"\x00\x00\x00")        # the start of a frame: the session waits for the rest
            await writer.drain()
            fams = await until(broker, value(r, "riverbed_listener_received_bytes"), 3)
            assert fams["riverbed_listener_connections_open"][r] == 1
            assert fams["riverbed_listener_reads"][r] >= 1
            writer.close()
            after = await until(broker, value(r, "riverbed_listener_connections_open"), 0)
            assert after["riverbed_listener_connections_accepted"][r] == 1
            assert set(dict(k)["listener"] for k in after["riverbed_listener_up"]) == \
                {"stream", "ws", "zmq", "http"}
    run(main())


def test_errors_by_kind_are_labelled(tmp_path):
    async def main():
        async with running(tmp_path, stream_port="0") as broker:
            st = broker.stats.listener("stream")
            # a reset connection: the peer aborts with SO_LINGER 0, so the server's read fails
            sock = socket.create_connection(("127.0.0.1", dict(broker.listeners)["stream"].port))
            await asyncio.sleep(0.1)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            sock.close()
            for _ in range(50):
                if st.errors.get("transport"):
                    break
                await asyncio.sleep(0.02)
            fams = await scrape(broker)
            errors = fams["riverbed_listener_errors"]
            assert errors[(("kind", "transport"), ("listener", "stream"))] == 1
    run(main())


def test_scrape_rules_without_a_users_file(tmp_path):
    async def main():
        async with running(tmp_path) as broker:
            await scrape(broker)                                     # loopback, no credentials
            await scrape(broker, headers=basic("guest", "guest"))   # or as guest
            status, ctype, text = await get(broker, "/metrics", headers=basic("guest", "wrong"))
            assert status == 401 and ctype.startswith("application/json"), text
            # from elsewhere: credentials required, and guest is loopback-only
            req = types.SimpleNamespace(remote="192.0.2.7", headers={}, app={BROKER: broker})
            with pytest.raises(aiohttp.web.HTTPUnauthorized):
                await _metrics._scraper(req)
            req.headers = basic("guest", "guest")
            with pytest.raises(aiohttp.web.HTTPUnauthorized) as e:
                await _metrics._scraper(req)
            assert "localhost" in e.value.text
    run(main())


def test_with_a_users_file_basic_auth_and_only_readable_streams(tmp_path):
    users = tmp_path / "users.toml"
    auth.add_user(str(users), "admin", "adminpw")
    auth.add_user(str(users), "alice", "alicepw", configure="^a-", write="^a-", read="^a-")

    async def main():
        async with running(tmp_path, users=str(users)) as broker:
            await create(broker, "a-one", "a-two", "b-secret")
            status, _, text = await get(broker, "/metrics")
            assert status == 401 and "Login required" in text
            status, _, _ = await get(broker, "/metrics", headers=basic("alice", "nope"))
            assert status == 401
            mine = await scrape(broker, headers=basic("alice", "alicepw"))
            assert set(per_stream(mine, "riverbed_stream_records")) == {"a-one", "a-two"}
            assert set(per_stream(mine, "riverbed_stream_published_records")) == {"a-one", "a-two"}
            assert mine["riverbed_streams"] == {(): 3}      # how many exist is not a secret; names are
            every = await scrape(broker, headers=basic("admin", "adminpw"))
            assert set(per_stream(every, "riverbed_stream_records")) == {"a-one", "a-two", "b-secret"}
            # the probes need no credentials even with a users file
            assert (await get(broker, "/healthz"))[0] == 200
            assert (await get(broker, "/readyz"))[0] == 200
    run(main())


def test_a_thousand_streams_scrape_well_under_100_ms(tmp_path):
    async def main():
        async with running(tmp_path, fsync="never") as broker:
            names = [f"stream-{i:04d}" for i in range(1000)]
            for f in [broker.engine.create_stream(n) for n in names]:
                await asyncio.wrap_future(f)
            for n in names[::10]:
                await append(broker, n, [b"r"] * 5)
            url = f"http://127.0.0.1:{http_port(broker)}/metrics"
            took = []
            async with aiohttp.ClientSession() as s:
                for _ in range(7):
                    t0 = time.perf_counter()
                    async with s.get(url) as r:
                        text = await r.text()
                    took.append(time.perf_counter() - t0)
            fams = parse(text)
            assert len(per_stream(fams, "riverbed_stream_records")) == 1000
            assert per_stream(fams, "riverbed_stream_published_records")["stream-0990"] == 5
            median = statistics.median(took)
            print(f"scrape of 1,000 streams: median {median * 1000:.1f} ms, best {min(took) * 1000:.1f} ms, "
                  f"{len(text)} bytes")
            assert median < 0.1, took
    run(main())


def test_rejections_and_the_inflight_budget_are_in_metrics(tmp_path):
    from riverbed.shells.broker import limits as _limits

    async def main():
        async with running(tmp_path, max_inflight_bytes="3MiB") as broker:
            before = (await scrape(broker)).get("riverbed_rejected", {})
            key = (("listener", "metrics-test"), ("reason", "frame_size"))
            _limits.reject("metrics-test", _limits.REASON_FRAME_SIZE, "test")
            _limits.reject("metrics-test", _limits.REASON_FRAME_SIZE, "test")
            fams = await scrape(broker)
            assert fams["riverbed_rejected"][key] == before.get(key, 0) + 2
            assert fams["riverbed_inflight_budget_bytes"] == {(): 3 << 20}
            assert fams["riverbed_inflight_bytes"] == {(): 0}
    run(main())
