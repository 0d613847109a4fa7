"""The bench's Kafka rows (bench._kafka: confluent-kafka; bench._kafka_native: librdkafka driven from C,
against Riverbed's Kafka port) against the real server: what the produce rows count is what the log
holds, what the consume rows count is every record, and bench.compare sets their server CPU per record
beside the RabbitMQ Stream rows'."""

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


def native_or_skip():
    from bench import _kafka_native
    try:
        return _kafka_native.binary(ensure=False)
    except _kafka_native.Unavailable as e:
        pytest.skip(f"the native Kafka client cannot be built here ({e}; ci/ensure-librdkafka.sh)")


def test_native_consume_row_reads_every_record_with_the_wheels_librdkafka(server):
    import confluent_kafka
    from confluent_kafka.admin import AdminClient
    from bench import _kafka_native
    native_or_skip()
    r = run_client("kafka-consume-native", server, "kb-consume-native")
    assert r["received"] == N and r["received_bytes"] == N * SIZE
    # the run's client CPU is the C program's (every librdkafka thread) on top of the waiting Python's
    assert r["native_cpu_s"] > 0 and r["s1"]["client"] - r["s0"]["client"] >= r["native_cpu_s"]
    if _kafka_native.bundled_library():      # the same librdkafka as the confluent-kafka rows
        assert r["librdkafka"] == confluent_kafka.libversion()[0]
    topics = AdminClient({"bootstrap.servers": f"127.0.0.1:{server.ports['kafka']}"}).list_topics(timeout=30).topics
    assert "kb-consume-native" not in topics


def test_native_produce_row_stores_what_it_counts(server):
    from confluent_kafka import Consumer, TopicPartition
    native_or_skip()
    r = run_client("kafka-produce-native", server, "kb-produce-native", "--keep-stream")
    assert r["n"] == N and r["native_cpu_s"] > 0 and r["s1"]["t"] > r["s0"]["t"]
    c = Consumer({"bootstrap.servers": f"127.0.0.1:{server.ports['kafka']}", "group.id": "kb-check"})
    try:
        lo, hi = c.get_watermark_offsets(TopicPartition("kb-produce-native", 0), timeout=30)
    finally:
        c.close()
    assert (lo, hi) == (0, N + 1)          # the untimed first record, then the timed N


def test_native_client_dies_with_its_parent_mid_run(server):
    # the harness kills a client that overruns its run: the program it started, still consuming (the
    # topic never gets the records it waits for), must not stay behind
    import subprocess as sp
    import textwrap
    import time
    from confluent_kafka.admin import AdminClient, NewTopic
    exe = native_or_skip()
    bs = f"127.0.0.1:{server.ports['kafka']}"
    admin = AdminClient({"bootstrap.servers": bs})
    admin.create_topics([NewTopic("kb-orphan", 1, 1)])["kb-orphan"].result(30)
    parent = sp.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import subprocess, time
        p = subprocess.Popen([{exe!r}, "consume", {bs!r}, "kb-orphan", "5"], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
        assert p.stdout.readline() == "READY\\n"
        p.stdin.write("GO\\n")
        p.stdin.flush()
        print(p.pid, flush=True)
        time.sleep(120)
        """)], stdout=sp.PIPE, text=True)
    try:
        pid = int(parent.stdout.readline())
        time.sleep(0.5)
        assert state(pid) not in (None, "Z")       # consuming, waiting for records that never come
        parent.kill()
        parent.wait()
        deadline = time.monotonic() + 10
        while state(pid) not in (None, "Z") and time.monotonic() < deadline:
            time.sleep(0.05)
        assert state(pid) in (None, "Z")
    finally:
        if parent.poll() is None:
            parent.kill()
        admin.delete_topics(["kb-orphan"])["kb-orphan"].result(30)


def state(pid):
    """A process's state letter (Z: exited, not yet reaped), or None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return None


def test_compare_sets_the_native_rows_cost_beside_the_rabbitmq_stream_rows_and_judges_the_goals():
    from bench._workloads import goal
    from bench.compare import same_log_costs
    summary = {("kafka-consume-native", "riverbed"): {"server_us_per_msg": {"med": 0.3}},
               ("consume-rstream", "riverbed"): {"server_us_per_msg": {"med": 0.4}},
               ("kafka-produce-native", "riverbed"): {"server_us_per_msg": {"med": 0.6}},
               ("loadgen-publish", "riverbed"): {"server_us_per_msg": {"med": 0.3}}}
    got = {s["workload"]: (s["rmq_workload"], round(s["ratio"], 2)) for s in same_log_costs(summary)}
    assert got == {"kafka-consume-native": ("consume-rstream", 0.75),
                   "kafka-produce-native": ("loadgen-publish", 2.0)}
    assert goal("kafka-consume-native", "msgs_per_s") == ("abs", ">=", 1_000_000.0)
    assert goal("kafka-produce-native", "msgs_per_s") == ("abs", ">=", 500_000.0)
