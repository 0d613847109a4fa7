"""The bench's server-bound load generator (bench._loadgen, issue 26) against the real server: what it
counts is what the broker stored and delivered, with a number of messages that is not a multiple of the
frame size (the last frame is shorter), and its rows come out of ``bench.compare`` beside the others."""

import asyncio
import json
import os
import subprocess
import sys

import pytest
from rstream import Consumer, ConsumerOffsetSpecification, OffsetType

from bench._loadgen import CONSUME_PASSES
from procs import ServerProcess

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
N = 12_345           # 2 frames of 5,000 and one of 2,345
SIZE = 64

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def never_server(tmp_path_factory):
    srv = ServerProcess(tmp_path_factory.mktemp("loadgen") / "data", "--fsync", "never").start()
    yield srv
    assert srv.stop() == 0, srv.log()


def run_client(workload, port, stream, *extra):
    p = subprocess.run([sys.executable, "-m", "bench._client", workload, "--port", str(port), "--stream", stream,
                        "--n", str(N), "--size", str(SIZE), "--no-sync", *extra],
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")]
    assert p.returncode == 0 and lines, p.stderr[-3000:]
    return json.loads(lines[0][len("RESULT "):])


async def count_with_rstream(port, stream, expect):
    """Every record in the stream, read by a real client (its own decoder), until none comes for 0.5 s."""
    got = []
    done = asyncio.Event()

    async def on_message(msg, ctx):
        got.append(bytes(msg))
        if len(got) >= expect:
            done.set()

    async with Consumer("127.0.0.1", port, username="guest", password="guest") as c:
        await c.subscribe(stream, on_message, offset_specification=ConsumerOffsetSpecification(OffsetType.FIRST, None))
        await asyncio.wait_for(done.wait(), 30)
        await asyncio.sleep(0.5)
        await c.delete_stream(stream)
    return got


def test_loadgen_publish_stores_every_message_it_counts_as_confirmed(never_server):
    r = run_client("loadgen-publish", never_server.port, "lg-pub", "--keep-stream")
    assert r["n"] == N and r["s1"]["t"] > r["s0"]["t"]
    got = asyncio.run(count_with_rstream(never_server.port, "lg-pub", N + 5000))
    # the untimed warm-up frame (5,000) and the timed N, nothing lost or doubled
    assert len(got) == N + 5000 and set(got) == {b"x" * SIZE}


def test_loadgen_consume_counts_every_record_from_the_chunk_headers(never_server):
    r = run_client("loadgen-consume", never_server.port, "lg-con")
    # every pass reads the whole stream, nothing more (a pass's unsubscribed leftovers are not counted)
    assert r["n"] == r["received"] == N * CONSUME_PASSES and r["received_bytes"] == N * SIZE * CONSUME_PASSES
    shape = r["chunk_shape"]
    # the fill's three frames, each alone in its commit here or not, stored as chunks the header counts
    # add up to N; the last chunk (what LAST delivers) holds at most 1,000 records
    assert shape["records_per_chunk"] * shape["chunks"] == N and r["chunks"] == shape["chunks"] * CONSUME_PASSES
    assert 0 < shape["last_chunk_records"] <= 1000 and shape["max_records"] <= 8192
    assert shape["bytes_per_chunk"] > shape["records_per_chunk"] * (SIZE + 4)


def test_a_consume_row_reports_the_chunk_shape_after_its_window(never_server):
    r = run_client("consume-rstream", never_server.port, "lg-census")
    assert r["received"] == N and r["chunk_shape"]["chunks"] * r["chunk_shape"]["records_per_chunk"] == N


def test_the_kernel_discards_what_the_consumer_skips():
    # the reader of loadgen-consume drops frame bodies with MSG_TRUNC: the bytes are gone from the socket
    # and none was written into the buffer
    import socket
    from bench._loadgen import _discarder
    srv = socket.create_server(("127.0.0.1", 0))
    try:
        c = socket.create_connection(srv.getsockname())
        s, _ = srv.accept()
        s.sendall(b"x" * 100_000 + b"END")
        buf = bytearray(4096)
        _discarder(c, memoryview(buf))(100_000)
        assert buf == bytearray(4096) and c.recv(3) == b"END"
        c.close()
        s.close()
    finally:
        srv.close()


def test_loadgen_latency_waits_for_each_confirm_and_stores_every_message(never_server):
    r = run_client("loadgen-latency", never_server.port, "lg-lat", "--keep-stream", "--warmup", "30",
                   "--timed", "300")
    assert r["n"] == 300
    assert 0 < r["lat_p50_us"] <= r["lat_p99_us"] <= r["lat_p999_us"] <= r["lat_max_us"] < 5e6
    got = asyncio.run(count_with_rstream(never_server.port, "lg-lat", 330))
    assert len(got) == 330 and set(got) == {b"x" * SIZE}              # one per frame, none lost or doubled


def test_bench_compare_runs_the_loadgen_rows(tmp_path):
    out = tmp_path / "run"
    r = subprocess.run([sys.executable, "-m", "bench.compare", "--peers", "none", "--no-floors",
                        "--workloads", "loadgen-publish,loadgen-publish-2,loadgen-consume,loadgen-latency",
                        "--n", "20000", "--warmup", "20", "--timed", "200",
                        "--rounds", "1", "--durable-fsync", "none", "--max-tries", "1", "--quiet-wait", "0",
                        "--no-chart", "--out", str(out)],
                       cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    doc = json.loads((tmp_path / "run.json").read_text())
    assert all(run["ok"] for run in doc["runs"]), [run.get("error") for run in doc["runs"]]
    by = {run["workload"]: run for run in doc["runs"]}
    assert by["loadgen-publish-2"]["n"] == 40000 and by["loadgen-publish-2"]["clients"] == 2
    for w in ("loadgen-publish", "loadgen-publish-2", "loadgen-consume"):
        assert by[w]["msgs_per_s"] > 0 and by[w]["client_cpu_s"] >= 0 and by[w]["server_cpu_s"] >= 0
    lat = by["loadgen-latency"]
    assert lat["n"] == 200 and 0 < lat["lat_p50_us"] <= lat["lat_p999_us"] and lat["server_cpu_s"] >= 0
    assert "loadgen publish" in r.stdout and "client CPU" in r.stdout and "loadgen stop-and-wait" in r.stdout
