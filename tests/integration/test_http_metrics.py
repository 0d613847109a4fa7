"""GET /metrics, /healthz and /readyz of the real ``riverbed serve`` process, with the real rstream
client publishing and consuming between scrapes; every scrape is parsed with prometheus-client's own
parser. (tests/shells/test_http_health.py kills the writer thread of an in-process server.)"""

import asyncio
import json
import urllib.error
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families
from rstream import Consumer, ConsumerOffsetSpecification, OffsetType, Producer

from procs import ServerProcess

pytestmark = pytest.mark.integration

CREDS = dict(username="guest", password="guest")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    srv = ServerProcess(tmp_path_factory.mktemp("metrics") / "data", "--http-port", "0").start()
    yield srv
    assert srv.stop() == 0, srv.log()


def http_get(srv, path):
    """(status, content type, body text) of GET ``path`` on the server's HTTP listener."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{srv.ports['http']}{path}", timeout=10) as r:
            return r.status, r.headers["Content-Type"], r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.headers["Content-Type"], e.read().decode()


def scrape(srv):
    """{sample name: {frozenset of labels: value}} of one /metrics answer, parsed by prometheus-client."""
    status, ctype, text = http_get(srv, "/metrics")
    assert status == 200, text
    assert ctype.startswith("text/plain; version=0.0.4"), ctype
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out.setdefault(s.name, {})[frozenset(s.labels.items())] = s.value
    return out


def stream_value(fams, name, stream):
    return fams[name][frozenset({("stream", stream)})]


def listener_value(fams, name, listener="stream"):
    return fams[name][frozenset({("listener", listener)})]


async def publish(port, stream, n, batch=500):
    confirmed = 0
    done = asyncio.Event()

    def on_confirm(status):
        nonlocal confirmed
        assert status.is_confirmed
        confirmed += 1
        if confirmed == n:
            done.set()

    async with Producer("127.0.0.1", port, **CREDS) as p:
        await p.create_stream(stream, exists_ok=True)
        for start in range(0, n, batch):
            await p.send_batch(stream, [b"m-%06d" % i for i in range(start, min(n, start + batch))],
                               on_publish_confirm=on_confirm)
        await asyncio.wait_for(done.wait(), 60)


async def consume(port, stream, n):
    got = 0
    done = asyncio.Event()

    async def on_message(msg, ctx):
        nonlocal got
        got += 1
        if got >= n:
            done.set()

    async with Consumer("127.0.0.1", port, **CREDS) as c:
        await c.subscribe(stream, on_message, offset_specification=ConsumerOffsetSpecification(OffsetType.FIRST))
        await asyncio.wait_for(done.wait(), 60)


def test_metrics_move_when_records_are_published_and_consumed(server):
    asyncio.run(publish(server.port, "m-before", 1))       # the stream exists in the first scrape
    before = scrape(server)
    asyncio.run(publish(server.port, "m-one", 3000))
    after = scrape(server)
    asyncio.run(consume(server.port, "m-one", 3000))
    consumed = scrape(server)

    assert frozenset({("stream", "m-one")}) not in before["riverbed_stream_records"]
    assert stream_value(after, "riverbed_stream_published_records_total", "m-one") == 3000
    assert stream_value(after, "riverbed_stream_records", "m-one") == 3000
    assert stream_value(after, "riverbed_stream_first_offset", "m-one") == 0
    assert stream_value(after, "riverbed_stream_last_offset", "m-one") == 2999
    assert stream_value(after, "riverbed_stream_chunks", "m-one") >= 3      # 1,000 records a chunk at most
    assert stream_value(after, "riverbed_stream_bytes", "m-one") > 3000 * 8
    assert stream_value(after, "riverbed_stream_delivered_records_total", "m-one") == 0
    assert stream_value(consumed, "riverbed_stream_delivered_records_total", "m-one") == 3000
    assert stream_value(after, "riverbed_stream_published_records_total", "m-before") == \
        stream_value(before, "riverbed_stream_published_records_total", "m-before") == 1
    assert after["riverbed_streams"][frozenset()] == before["riverbed_streams"][frozenset()] + 1

    for name in ("riverbed_engine_group_commits_total", "riverbed_engine_written_bytes_total",
                 "riverbed_engine_commit_seconds_count", "riverbed_engine_fsync_seconds_count"):
        assert after[name][frozenset()] > before[name][frozenset()], name
    assert after["riverbed_engine_commit_seconds_sum"][frozenset()] > 0
    assert after["riverbed_engine_writer_up"][frozenset()] == 1
    assert after["riverbed_engine_map_used_bytes"][frozenset()] > before["riverbed_engine_map_used_bytes"][frozenset()]
    for name in ("riverbed_listener_connections_accepted_total", "riverbed_listener_reads_total",
                 "riverbed_listener_received_bytes_total"):
        assert listener_value(after, name) > listener_value(before, name), name
    assert listener_value(consumed, "riverbed_listener_connections_open") == 0
    assert listener_value(after, "riverbed_listener_up", "http") == 1
    assert after["process_cpu_seconds_total"][frozenset()] >= before["process_cpu_seconds_total"][frozenset()]
    assert after["process_resident_memory_bytes"][frozenset()] > 0


def test_healthz_and_readyz_of_a_running_server(server):
    status, ctype, text = http_get(server, "/healthz")
    assert status == 200 and ctype.startswith("application/json")
    body = json.loads(text)
    assert body["status"] == "ok" and body["writer"] == "running"
    assert body["listeners"] == {"stream": "accepting", "http": "accepting"}
    status, _, text = http_get(server, "/readyz")
    assert status == 200 and json.loads(text) == {"status": "ready"}
