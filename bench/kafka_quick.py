"""Quick Kafka benchmark: confluent-kafka (librdkafka) against a local ``riverbed serve``.

Produces N keyed messages of SIZE bytes with acks=all and idempotence to a topic of PARTITIONS
partitions, then consumes them all (assigned partitions, from offset 0), and prints msgs/s both ways and
the server's CPU microseconds per message each way (utime+stime from /proc).

    .venv/bin/python bench/kafka_quick.py [--messages 200000] [--size 100] [--partitions 3] [--fsync never]
"""

import argparse
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests",
                                "integration"))
from procs import ServerProcess  # noqa: E402


def cpu_seconds(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--messages", type=int, default=200_000)
    ap.add_argument("--size", type=int, default=100)
    ap.add_argument("--partitions", type=int, default=3)
    ap.add_argument("--fsync", default="never")
    a = ap.parse_args(argv)
    from confluent_kafka import Consumer, Producer, TopicPartition
    from confluent_kafka.admin import AdminClient, NewTopic
    with tempfile.TemporaryDirectory(prefix="riverbed-kafka-bench-") as d:
        srv = ServerProcess(os.path.join(d, "data"), "--kafka-port", "0", "--fsync", a.fsync).start()
        try:
            bs = f"127.0.0.1:{srv.ports['kafka']}"
            admin = AdminClient({"bootstrap.servers": bs})
            admin.create_topics([NewTopic("bench", a.partitions, 1)])["bench"].result(30)
            p = Producer({"bootstrap.servers": bs, "acks": "all", "enable.idempotence": True, "linger.ms": 5,
                          "batch.size": 1 << 20, "queue.buffering.max.messages": 1_000_000})
            value = b"x" * a.size
            cpu0, t0 = cpu_seconds(srv.pid), time.perf_counter()
            for i in range(a.messages):
                while True:
                    try:
                        p.produce("bench", key=b"%d" % i, value=value)
                        break
                    except BufferError:
                        p.poll(0.005)
            assert p.flush(600) == 0
            t1, cpu1 = time.perf_counter(), cpu_seconds(srv.pid)
            c = Consumer({"bootstrap.servers": bs, "group.id": "bench", "fetch.max.bytes": 64 << 20,
                          "max.partition.fetch.bytes": 16 << 20})
            c.assign([TopicPartition("bench", i, 0) for i in range(a.partitions)])
            got = 0
            t2 = time.perf_counter()
            while got < a.messages:
                got += sum(1 for m in c.consume(10000, 1.0) if not m.error())
            t3, cpu2 = time.perf_counter(), cpu_seconds(srv.pid)
            c.close()
            del p, admin        # librdkafka handles let go before the server stops (no reconnect noise)
            n = a.messages
            print(f"kafka produce  {n / (t1 - t0):>10,.0f} msgs/s   server CPU {1e6 * (cpu1 - cpu0) / n:6.2f} us/msg")
            print(f"kafka consume  {n / (t3 - t2):>10,.0f} msgs/s   server CPU {1e6 * (cpu2 - cpu1) / n:6.2f} us/msg")
        finally:
            srv.stop()


if __name__ == "__main__":
    main()
