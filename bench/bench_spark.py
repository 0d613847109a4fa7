"""Spark reader throughput: 10M x 100-byte records from one data directory on local[2].

    .venv/bin/python bench/bench_spark.py [--records N] [--data-dir DIR] [--runs 2]

Each record is a bare AMQP 1.0 message (a data section of 95 bytes: 100 bytes stored), as rstream
publishes them, so the same directory serves ``decode=raw`` and ``decode=amqp``. Prints rows/s for
``raw`` and ``amqp`` (best of ``--runs``; the Spark query computes count(*) and sum(length(body)), so
every body reaches the JVM), and the same scan done in plain Python through the engine
(``Engine.scan_chunks``, one ``bytes`` per record), with the ratio. Also printed: the CPU seconds the
JVM and its Python workers spent, and the rate 2 idle cores would give at that cost (the development
machine is shared, so wall-clock figures vary from run to run). The directory is kept between runs
when ``--data-dir`` is given and already holds the records.
"""

import argparse
import os
import shutil
import sys
import tempfile
import time

PAYLOAD = 95


def build(path, records):
    from riverbed.engine import Engine
    with Engine(path, fsync="never") as eng:
        if eng.has_stream("bench") and eng.stream_info("bench").records == records:
            return False
        if eng.has_stream("bench"):
            eng.delete_stream("bench").result()
        eng.create_stream("bench").result()
        batch = 1000
        futs = []
        for i in range(0, records, batch):
            n = min(batch, records - i)
            recs = [b"\x00\x53\x75\xa0" + bytes([PAYLOAD]) + (b"%019d" % (i + j)) + b"." * (PAYLOAD - 19)
                    for j in range(n)]
            futs.append(eng.append("bench", recs))
            if len(futs) > 200:
                futs.pop(0).result()
        for f in futs:
            f.result()
        eng.sync().result()
    return True


def tree_cpu():
    """CPU seconds (user + system) of this process's descendants: the JVM and its Python workers. The
    machine is shared, so CPU time says more about the reader's cost than the wall clock."""
    tick = os.sysconf("SC_CLK_TCK")
    children = {}
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                with open(f"/proc/{pid}/stat") as f:
                    name, rest = f.read().rsplit(")", 1)
            except OSError:
                continue
            fields = rest.split()
            children.setdefault(int(fields[1]), []).append((int(pid), (int(fields[11]) + int(fields[12])) / tick))
    total, todo = 0.0, [os.getpid()]
    while todo:
        for pid, cpu in children.get(todo.pop(), ()):
            total += cpu
            todo.append(pid)
    return total


def python_scan(path):
    from riverbed.engine import Engine
    eng = Engine(path, readonly=True)
    try:
        t = time.perf_counter()
        n = size = 0
        for _, records in eng.scan_chunks("bench"):
            n += len(records)
            for r in records:
                size += len(r)
        return n, size, time.perf_counter() - t
    finally:
        eng.close()


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--records", type=int, default=10_000_000)
    p.add_argument("--data-dir")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--master", default="local[2]")
    args = p.parse_args(argv)

    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    tmp = None
    path = args.data_dir
    if path is None:
        tmp = path = tempfile.mkdtemp(prefix="riverbed-bench-spark-")
    try:
        t = time.perf_counter()
        if build(path, args.records):
            print(f"wrote {args.records:,} records in {time.perf_counter() - t:.1f} s", flush=True)

        n, size, dt = python_scan(path)
        assert n == args.records, (n, args.records)
        py_rate = n / dt
        print(f"python scan (Engine.scan_chunks): {py_rate / 1e6:.2f}M rows/s ({dt:.2f} s)", flush=True)

        from pyspark.sql import SparkSession
        from riverbed.spark import RiverbedDataSource
        spark = (SparkSession.builder.master(args.master).appName("riverbed-bench")
                 .config("spark.ui.enabled", "false").config("spark.driver.host", "127.0.0.1")
                 .config("spark.driver.bindAddress", "127.0.0.1").config("spark.sql.shuffle.partitions", "2")
                 .config("spark.driver.memory", "2g").getOrCreate())
        spark.sparkContext.setLogLevel("ERROR")
        spark.dataSource.register(RiverbedDataSource)
        rates = {}
        for decode in ("raw", "amqp"):
            best = cpu_best = None
            for _ in range(args.runs):
                df = spark.read.format("riverbed").option("path", path).option("stream", "bench") \
                    .option("decode", decode).load()
                c0, t = tree_cpu(), time.perf_counter()
                row = df.selectExpr("count(*) AS n", "sum(length(body)) AS bytes").collect()[0]
                dt, cpu = time.perf_counter() - t, tree_cpu() - c0
                want = size if decode == "raw" else size - 5 * n
                assert row.n == n and row.bytes == want, (decode, row, n, want)
                best = dt if best is None else min(best, dt)
                cpu_best = cpu if cpu_best is None else min(cpu_best, cpu)
            rates[decode] = n / best
            print(f"spark {args.master} decode={decode}: {rates[decode] / 1e6:.2f}M rows/s ({best:.2f} s wall; "
                  f"{cpu_best:.2f} CPU-s in JVM + Python workers = {n / cpu_best * 2 / 1e6:.2f}M rows/s "
                  f"on 2 idle cores)", flush=True)
        spark.stop()
        print(f"ratio spark raw / python scan: {rates['raw'] / py_rate:.1f}x; "
              f"spark amqp / python scan: {rates['amqp'] / py_rate:.1f}x")
        return 0
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
