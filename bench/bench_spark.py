"""Spark reader throughput: 10M x 100-byte records from one data directory on local[2].

    .venv/bin/python bench/bench_spark.py [--records N] [--data-dir DIR] [--runs 2] [--decodes raw,amqp,json]

Each record of stream ``bench`` is a bare AMQP 1.0 message (a data section of 95 bytes: 100 bytes
stored), as rstream publishes them, so the same stream serves ``decode=raw`` and ``decode=amqp``. Stream
``bench_json`` holds as many JSON records as the shells store them (content-type application/json, about
100 bytes each: ``{"id":..,"name":..,"price":..,"ok":..}``), read with ``decode=json`` and the schema
``id bigint, name string, price double, ok boolean``. Prints rows/s for each decode (best of ``--runs``;
the Spark query aggregates every column, so every value reaches the JVM), the same reads in process
(``batches.read_local`` building the Arrow batches, no JVM: less noisy; for json also the per-record
path on a sample, which is what every record cost before the bulk path), and the scan done in plain
Python through the engine (``Engine.scan_chunks``, one ``bytes`` per record), with the ratio. Also printed: the CPU seconds the
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
JSON_STREAM = "bench_json"
JSON_SCHEMA = "id bigint, name string, price double, ok boolean"
QUERIES = {
    "raw": ("count(*) AS n", "sum(length(body)) AS bytes"),
    "amqp": ("count(*) AS n", "sum(length(body)) AS bytes"),
    "json": ("count(*) AS n", "sum(id) AS ids", "sum(length(name)) AS names", "sum(price) AS prices",
             "count_if(ok) AS oks"),
}


def json_doc(i):
    return b'{"id":%d,"name":"user-%d","price":%d.25,"ok":%s,"tags":["a","b"]}' % (
        i, i, i % 1000, b"true" if i % 2 else b"false")


def build_json(path, records):
    from riverbed.engine import Engine, record
    with Engine(path, fsync="never") as eng:
        if eng.has_stream(JSON_STREAM) and eng.stream_info(JSON_STREAM).records == records:
            return False
        if eng.has_stream(JSON_STREAM):
            eng.delete_stream(JSON_STREAM).result()
        eng.create_stream(JSON_STREAM).result()
        futs = []
        for i in range(0, records, 1000):
            futs.append(eng.append(JSON_STREAM, [record.from_json_text(json_doc(j))
                                                 for j in range(i, min(i + 1000, records))]))
            if len(futs) > 200:
                futs.pop(0).result()
        for f in futs:
            f.result()
        eng.sync().result()
    return True


def in_process(path, stream, decode, records):
    """rows/s of ``batches.read_local`` over the whole stream in this process (CPU time), and for json
    the per-record path's rows/s on a 20,000-record sample (CPU time)."""
    import pyarrow as pa
    from pyspark.sql.types import StructType
    from riverbed.spark import amqp, batches, source
    opts = source.Options({"path": path, "stream": stream, "decode": decode,
                           **({"schema": JSON_SCHEMA} if decode == "json" else {})})
    from pyspark.sql.types import _parse_datatype_string
    schema = _parse_datatype_string(opts.ddl())
    assert isinstance(schema, StructType)
    arrow_schema = source._arrow_schema(schema)
    decoded = [f.name for f in schema.fields[len(batches.FIXED_COLUMNS):]] if decode == "json" else ()
    builder = batches.BatchBuilder(arrow_schema, stream, 0, decode, decoded)
    c = time.process_time()
    n = sum(b.num_rows for b in batches.read_local(path, stream, 0, records, builder))
    rate = n / (time.process_time() - c)
    assert n == records, (n, records)
    per_record = None
    if decode == "json":
        sample = next(batches.read_local(path, stream, 0, 20_000, batches.BatchBuilder(
            pa.schema(list(arrow_schema)[:5] + [pa.field("body", pa.binary())]), stream, 0, "raw")))
        c = time.process_time()
        amqp.decode_documents(sample.column("body"), "json", [arrow_schema.field(f) for f in decoded])
        per_record = sample.num_rows / (time.process_time() - c)
    return rate, per_record


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
    p.add_argument("--decodes", default="raw,amqp,json", help="comma list of raw, amqp, json")
    args = p.parse_args(argv)
    decodes = [d.strip() for d in args.decodes.split(",") if d.strip()]

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
        if "json" in decodes:
            t = time.perf_counter()
            if build_json(path, args.records):
                print(f"wrote {args.records:,} JSON records in {time.perf_counter() - t:.1f} s", flush=True)
        print(f"load: {os.getloadavg()[0]:.1f} {os.getloadavg()[1]:.1f} {os.getloadavg()[2]:.1f}", flush=True)

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
        # one untimed query first: the JVM's JIT warm-up would otherwise land in the first row's figures
        spark.read.format("riverbed").option("path", path).option("stream", "bench") \
            .option("endingOffset", str(min(n, 500_000))).load().selectExpr("sum(length(body))").collect()
        rates = {}
        for decode in decodes:
            stream = JSON_STREAM if decode == "json" else "bench"
            rate, per_record = in_process(path, stream, decode, n)
            print(f"in process decode={decode} (batches.read_local, CPU time): {rate / 1e6:.2f}M rows/s"
                  + (f"; per-record path: {per_record / 1e3:.1f}k rows/s, {rate / per_record:.0f}x"
                     if per_record else ""), flush=True)
            best = cpu_best = None
            for _ in range(args.runs):
                reader = spark.read.format("riverbed").option("path", path).option("stream", stream) \
                    .option("decode", decode)
                if decode == "json":
                    reader = reader.option("schema", JSON_SCHEMA)
                df = reader.load()
                c0, t = tree_cpu(), time.perf_counter()
                row = df.selectExpr(*QUERIES[decode]).collect()[0]
                dt, cpu = time.perf_counter() - t, tree_cpu() - c0
                if decode == "json":
                    want_ids = n * (n - 1) // 2
                    assert row.n == n and row.ids == want_ids and row.oks == n // 2, (row, n)
                else:
                    want = size if decode == "raw" else size - 5 * n
                    assert row.n == n and row.bytes == want, (decode, row, n, want)
                best = dt if best is None else min(best, dt)
                cpu_best = cpu if cpu_best is None else min(cpu_best, cpu)
            rates[decode] = n / best
            print(f"spark {args.master} decode={decode}: {rates[decode] / 1e6:.2f}M rows/s ({best:.2f} s wall; "
                  f"{cpu_best:.2f} CPU-s in JVM + Python workers = {n / cpu_best * 2 / 1e6:.2f}M rows/s "
                  f"on 2 idle cores)", flush=True)
        spark.stop()
        print("; ".join(f"spark {d} / python scan: {rates[d] / py_rate:.1f}x" for d in decodes))
        print(f"load: {os.getloadavg()[0]:.1f} {os.getloadavg()[1]:.1f} {os.getloadavg()[2]:.1f}", flush=True)
        return 0
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
