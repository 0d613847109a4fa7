"""Spark reader throughput: 10M x 100-byte records from one data directory on local[2].

    .venv/bin/python bench/bench_spark.py [--records N] [--data-dir DIR] [--runs 2] [--decodes raw,amqp,json]
        [--option batchBytes=N ...] [--conf spark.key=value ...] [--out FILE.json]

Each record of stream ``bench`` is a bare AMQP 1.0 message (a data section of 95 bytes: 100 bytes
stored), as rstream publishes them, so the same stream serves ``decode=raw`` and ``decode=amqp``. Stream
``bench_json`` holds as many JSON records as the shells store them (content-type application/json, about
100 bytes each: ``{"id":..,"name":..,"price":..,"ok":..}``), read with ``decode=json`` and the schema
``id bigint, name string, price double, ok boolean``.

For each decode it prints:

- the same read in process (``batches.read_local`` building the Arrow batches, no JVM; CPU time, less
  noisy), also with each batch written as an Arrow IPC stream as a Python worker sends it, the rows per
  Arrow batch and the partitions planned; for json also the per-record path on a sample;
- the fixed cost of a query: the best of 3 reading one chunk (planning in a Python planner worker, task
  start, the aggregate's second stage);
- Spark rows/s, best of ``--runs``, timed around ``collect()`` of an aggregate over every column (so
  every value reaches the JVM). The SparkSession's start, the data source's creation (``load()``) and a
  warm-up query are not in the time; planning the query is. Also the rate without the fixed cost.
- CPU seconds per million rows of the JVM (its own threads) and of the Python workers (everything the
  JVM started: daemon, workers, planners; read from /proc, so exited workers count too), and the rate two
  idle cores would give at that cost: the machine is shared, so wall-clock figures vary from run to run.

Also the scan done in plain Python through the engine (``Engine.scan_chunks``, one ``bytes`` per record),
with the ratio. The directory is kept between runs when ``--data-dir`` is given and already holds the
records.
"""

import argparse
import json
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


def in_process(path, stream, decode, records, extra=None):
    """The reader's own work in this process, no JVM: ``{"rows_per_s", "ipc_rows_per_s", "rows_per_batch",
    "partitions", "per_record_rows_per_s"}``. ``rows_per_s``: ``batches.read_local`` over the whole stream
    (CPU time); ``ipc_rows_per_s``: the same with every batch written as an Arrow IPC stream to /dev/null,
    as a Python worker writes it to the JVM's socket; ``partitions``: what the source plans with these
    options; json: the per-record path's rows/s on a 20,000-record sample (what every record cost before
    the bulk path)."""
    import pyarrow as pa
    from pyspark.sql.types import StructType
    from riverbed.spark import amqp, batches, source
    opts = source.Options({"path": path, "stream": stream, "decode": decode,
                           **({"schema": JSON_SCHEMA} if decode == "json" else {}), **(extra or {})})
    from pyspark.sql.types import _parse_datatype_string
    schema = _parse_datatype_string(opts.ddl())
    assert isinstance(schema, StructType)
    arrow_schema = source._arrow_schema(schema)
    decoded = [f.name for f in schema.fields[len(batches.FIXED_COLUMNS):]] if decode == "json" else ()
    builder = batches.BatchBuilder(arrow_schema, stream, 0, decode, decoded)
    out = {}
    c = time.process_time()
    sizes = [b.num_rows for b in batches.read_local(path, stream, 0, records, builder, opts.batch_bytes, opts.verify)]
    out["rows_per_s"] = sum(sizes) / (time.process_time() - c)
    assert sum(sizes) == records, (sum(sizes), records)
    out["rows_per_batch"] = sum(sizes) // len(sizes)
    with open(os.devnull, "wb") as sink:
        c = time.process_time()
        writer = None
        for b in batches.read_local(path, stream, 0, records, builder, opts.batch_bytes, opts.verify):
            if writer is None:
                writer = pa.ipc.new_stream(sink, b.schema)
            writer.write_batch(b)
        writer.close()
        out["ipc_rows_per_s"] = records / (time.process_time() - c)
    backend = source.backend_for(opts)
    try:
        out["partitions"] = len(source.split_ranges(source.plan_ranges(opts, backend), backend, opts.num_partitions))
    finally:
        backend.close()
    out["per_record_rows_per_s"] = None
    if decode == "json":
        sample = next(batches.read_local(path, stream, 0, 20_000, batches.BatchBuilder(
            pa.schema(list(arrow_schema)[:5] + [pa.field("body", pa.binary())]), stream, 0, "raw")))
        c = time.process_time()
        amqp.decode_documents(sample.column("body"), "json", [arrow_schema.field(f) for f in decoded])
        out["per_record_rows_per_s"] = sample.num_rows / (time.process_time() - c)
    return out


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


def _proc_table():
    """``{pid: (ppid, comm, own CPU-s, reaped children's CPU-s)}`` of every process, from /proc."""
    tick = os.sysconf("SC_CLK_TCK")
    table = {}
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                with open(f"/proc/{pid}/stat") as f:
                    head, rest = f.read().rsplit(")", 1)
            except OSError:
                continue
            fields = rest.split()
            table[int(pid)] = (int(fields[1]), head.split("(", 1)[1],
                               (int(fields[11]) + int(fields[12])) / tick,
                               (int(fields[13]) + int(fields[14])) / tick)
    return table


def tree_cpu():
    """CPU seconds (user + system) of this process's descendants: ``{"jvm": s, "python": {pid: s}}``, the
    JVM's own threads and each process under it (the pyspark daemon, its Python workers and planners,
    with the time of their reaped children). The machine is shared, so CPU time says more about the
    reader's cost than the wall clock. Subtract two readings with :func:`cpu_between`."""
    table = _proc_table()
    children = {}
    for pid, (ppid, _, _, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    out = {"jvm": 0.0, "python": {}}

    def subtree(pid):
        todo = [pid]
        while todo:
            p = todo.pop()
            out["python"][p] = table[p][2] + table[p][3]
            todo.extend(children.get(p, ()))

    for pid in children.get(os.getpid(), ()):
        _, comm, own, reaped = table[pid]
        if comm == "java":
            out["jvm"] += own
            out["python"][pid] = reaped
            for c in children.get(pid, ()):
                subtree(c)
        else:
            subtree(pid)
    return out


def cpu_between(before, after):
    """``{"jvm": s, "python": s}`` spent between two :func:`tree_cpu` readings. A Python worker that
    exits in between takes its time with it (the pyspark daemon ignores SIGCHLD, so the kernel adds it
    nowhere): workers are reused, so this is rare, and it can only make the Python figure smaller."""
    py = sum(cpu - before["python"].get(pid, 0.0) for pid, cpu in after["python"].items())
    return {"jvm": after["jvm"] - before["jvm"], "python": py}


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


def _pairs(items, flag):
    out = {}
    for kv in items:
        key, sep, value = kv.partition("=")
        if not sep or not key:
            raise SystemExit(f"{flag} takes KEY=VALUE, not {kv!r}")
        out[key] = value
    return out


def _load():
    return [round(x, 1) for x in os.getloadavg()]


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--records", type=int, default=10_000_000)
    p.add_argument("--data-dir")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--master", default="local[2]")
    p.add_argument("--decodes", default="raw,amqp,json", help="comma list of raw, amqp, json")
    p.add_argument("--option", action="append", default=[], metavar="KEY=VALUE",
                   help="a reader option for every read, e.g. batchBytes=4194304 or numPartitions=4 (repeatable)")
    p.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE", help="a Spark conf (repeatable)")
    p.add_argument("--out", metavar="FILE.json", help="also write the figures as JSON")
    args = p.parse_args(argv)
    decodes = [d.strip() for d in args.decodes.split(",") if d.strip()]
    options = _pairs(args.option, "--option")
    confs = _pairs(args.conf, "--conf")

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
        result = {"records": args.records, "master": args.master, "options": options, "conf": confs,
                  "load_start": _load(), "decodes": {}}
        print("load: %.1f %.1f %.1f" % tuple(result["load_start"]), flush=True)

        n, size, dt = python_scan(path)
        assert n == args.records, (n, args.records)
        py_rate = result["python_scan_rows_per_s"] = n / dt
        print(f"python scan (Engine.scan_chunks): {py_rate / 1e6:.2f}M rows/s ({dt:.2f} s)", flush=True)

        from pyspark.sql import SparkSession
        from riverbed.spark import RiverbedDataSource
        builder = (SparkSession.builder.master(args.master).appName("riverbed-bench")
                   .config("spark.ui.enabled", "false").config("spark.driver.host", "127.0.0.1")
                   .config("spark.driver.bindAddress", "127.0.0.1").config("spark.sql.shuffle.partitions", "2")
                   .config("spark.driver.memory", "2g"))
        for key, value in confs.items():
            builder = builder.config(key, value)
        spark = builder.getOrCreate()
        spark.sparkContext.setLogLevel("ERROR")
        spark.dataSource.register(RiverbedDataSource)

        def reader(stream, decode, **more):
            r = spark.read.format("riverbed").option("path", path).option("stream", stream).option("decode", decode)
            if decode == "json":
                r = r.option("schema", JSON_SCHEMA)
            for key, value in {**options, **more}.items():
                r = r.option(key, value)
            return r.load()

        # one untimed query first: the JVM's JIT warm-up would otherwise land in the first row's figures
        reader("bench", "raw", endingOffset=str(min(n, 500_000))).selectExpr("sum(length(body))").collect()
        rates = {}
        for decode in decodes:
            stream = JSON_STREAM if decode == "json" else "bench"
            ip = in_process(path, stream, decode, n, options)
            print(f"in process decode={decode} (batches.read_local, CPU time): {ip['rows_per_s'] / 1e6:.2f}M rows/s, "
                  f"{ip['ipc_rows_per_s'] / 1e6:.2f}M rows/s with the Arrow IPC write; {ip['rows_per_batch']:,} rows "
                  f"per Arrow batch, {ip['partitions']} partitions"
                  + (f"; per-record path: {ip['per_record_rows_per_s'] / 1e3:.1f}k rows/s, "
                     f"{ip['rows_per_s'] / ip['per_record_rows_per_s']:.0f}x" if ip["per_record_rows_per_s"] else ""),
                  flush=True)
            # The fixed cost of a query, whatever it reads: planning (a Python planner worker), task start,
            # the hand-off to the Python workers, the aggregate's second stage. Measured on one chunk.
            fixed = None
            for _ in range(3):
                df = reader(stream, decode, endingOffset="1000")
                t = time.perf_counter()
                df.selectExpr(*QUERIES[decode]).collect()
                dt = time.perf_counter() - t
                fixed = dt if fixed is None else min(fixed, dt)
            runs = []
            for _ in range(args.runs):
                df = reader(stream, decode)
                c0, t = tree_cpu(), time.perf_counter()
                row = df.selectExpr(*QUERIES[decode]).collect()[0]
                dt, c1 = time.perf_counter() - t, cpu_between(c0, tree_cpu())
                if decode == "json":
                    want_ids = n * (n - 1) // 2
                    assert row.n == n and row.ids == want_ids and row.oks == n // 2, (row, n)
                else:
                    want = size if decode == "raw" else size - 5 * n
                    assert row.n == n and row.bytes == want, (decode, row, n, want)
                runs.append({"wall_s": round(dt, 3), "jvm_cpu_s": round(c1["jvm"], 3),
                             "python_cpu_s": round(c1["python"], 3), "load": _load()})
            best = min(runs, key=lambda r: r["wall_s"])
            jvm = min(r["jvm_cpu_s"] for r in runs) / n * 1e6
            pyw = min(r["python_cpu_s"] for r in runs) / n * 1e6
            rates[decode] = n / best["wall_s"]
            result["decodes"][decode] = {
                "in_process": ip, "fixed_query_s": round(fixed, 3), "runs": runs,
                "rows_per_s": round(rates[decode]),
                "rows_per_s_without_fixed": round(n / max(1e-9, best["wall_s"] - fixed)),
                "cpu_s_per_million_rows": {"jvm": round(jvm, 3), "python_workers": round(pyw, 3)},
                "rows_per_s_on_2_idle_cores": round(2e6 / (jvm + pyw)),
            }
            print(f"spark {args.master} decode={decode}: {rates[decode] / 1e6:.2f}M rows/s ({best['wall_s']:.2f} s wall; "
                  f"{n / max(1e-9, best['wall_s'] - fixed) / 1e6:.2f}M rows/s without the {fixed:.2f} s a one-chunk "
                  f"query takes); CPU-s per 1M rows: JVM {jvm:.3f}, Python workers {pyw:.3f} "
                  f"= {2 / (jvm + pyw):.2f}M rows/s on 2 idle cores", flush=True)
        spark.stop()
        print("; ".join(f"spark {d} / python scan: {rates[d] / py_rate:.1f}x" for d in decodes))
        result["load_end"] = _load()
        print("load: %.1f %.1f %.1f" % tuple(result["load_end"]), flush=True)
        if args.out:
            with open(args.out, "w") as f:
                json.dump(result, f, indent=1)
                f.write("\n")
        return 0
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
