"""The bench's Kafka rows (bench._kafka: confluent-kafka against Riverbed's Kafka port) against the real
server: what the produce row counts is what the log holds, what the consume row counts is every record,
and bench.compare sets their server CPU per record beside the RabbitMQ Stream rows'."""

import json
import os
import subprocess
import sys

import pytest

from procs import ServerProcess

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
N = 7_777
SIZE = 100

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    srv = ServerProcess(tmp_path_factory.mktemp("kbench") / "data", "--fsync", "never", "--kafka-port", "0").start()
    yield srv
    assert srv.stop() == 0, srv.log()


def run_client(workload, srv, stream, *extra):
    p = subprocess.run([sys.executable, "-m", "bench._client", workload, "--port", str(srv.ports["kafka"]),
                        "--stream", stream, "--n", str(N), "--size", str(SIZE), "--no-sync",
                        "--server-pid", str(srv.pid), *extra], cwd=ROOT, capture_output=True, text=True,
                       timeout=180)
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")]
    assert p.returncode == 0 and lines, p.stderr[-3000:]
    return json.loads(lines[0][len("RESULT "):])


def test_kafka_produce_row_stores_what_it_counts(server):
    from confluent_kafka import Consumer, TopicPartition
    r = run_client("kafka-produce", server, "kb-produce", "--keep-stream")
    assert r["n"] == N and r["s1"]["t"] > r["s0"]["t"] and r["s1"]["server"] >= r["s0"]["server"]
    c = Consumer({"bootstrap.servers": f"127.0.0.1:{server.ports['kafka']}", "group.id": "kb-check"})
    try:
        lo, hi = c.get_watermark_offsets(TopicPartition("kb-produce", 0), timeout=30)
    finally:
        c.close()
    assert (lo, hi) == (0, N + 1)          # the untimed first record, then the timed N


def test_kafka_consume_row_reads_every_record_and_deletes_its_topic(server):
    from confluent_kafka.admin import AdminClient
    r = run_client("kafka-consume", server, "kb-consume")
    assert r["received"] == N and r["received_bytes"] == N * SIZE
    topics = AdminClient({"bootstrap.servers": f"127.0.0.1:{server.ports['kafka']}"}).list_topics(timeout=30).topics
    assert "kb-consume" not in topics


def test_compare_sets_kafka_cost_beside_the_rabbitmq_stream_rows():
    from bench.compare import same_log_costs
    summary = {("kafka-produce", "riverbed"): {"server_us_per_msg": {"med": 0.9}},
               ("publish-rstream-raw", "riverbed"): {"server_us_per_msg": {"med": 0.6}},
               ("kafka-consume", "riverbed"): {"server_us_per_msg": {"med": 0.5}},
               ("loadgen-consume", "riverbed"): {"server_us_per_msg": {"med": 0.25}}}
    got = same_log_costs(summary)
    assert [(s["workload"], s["rmq_workload"], round(s["ratio"], 2)) for s in got] == [
        ("kafka-produce", "publish-rstream-raw", 1.5), ("kafka-consume", "loadgen-consume", 2.0)]
