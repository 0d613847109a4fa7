"""``riverbed spark-load``: bulk-load streams into Parquet, Delta Lake or a Spark table, with a progress bar.

    riverbed spark-load orders --path riverbed-data --to parquet --output /lake/orders
    riverbed spark-load orders,refunds --uri rabbitmq-stream://broker:5552 --to table --table raw.orders \\
        --master spark://head:7077 --partitions 64
    riverbed spark-load orders --nodes n1:5552,n2:5552,n3:5552 --to parquet --output /lake/orders
    riverbed spark-load invoices --path d --to delta --output /lake/invoices --packages io.delta:delta-spark_2.13:4.0.0

It runs the ``riverbed`` data source (:mod:`riverbed.spark.source`) in a local SparkSession
(``local[*]``) unless ``--master`` names a cluster. The progress bar counts records: the planned total is
known before the job starts, and completed Spark tasks are turned into records as they finish. Exit
status 0 on success, 1 when the load fails, 2 for bad arguments.

Delta Lake needs its jars on the Spark classpath (``--packages`` fetches them from Maven, ``--jars``
takes local files); the Delta SQL extension and catalog are configured for ``--to delta``.
"""

import argparse
import os
import sys
import threading
import time

TARGETS = ("parquet", "delta", "table")


def build_parser():
    p = argparse.ArgumentParser(prog="riverbed spark-load", description=__doc__.splitlines()[0])
    p.add_argument("stream", help="a stream, a comma list, or a super stream")
    src = p.add_mutually_exclusive_group()
    src.add_argument("--path", metavar="DATA_DIR", help="read the data directory directly (read-only)")
    src.add_argument("--uri", help="read from a broker: rabbitmq-stream://[user:pass@]host:5552[/vhost]")
    p.add_argument("--nodes", metavar="HOST:PORT,...",
                   help="read from a cluster: the nodes' stream addresses (replicas preferred, a partition "
                        "goes on on another node when one fails); --uri may add credentials and vhost")
    p.add_argument("--to", choices=TARGETS, required=True, help="where to load the records")
    p.add_argument("--output", metavar="PATH", help="directory to write (parquet, delta)")
    p.add_argument("--table", metavar="NAME", help="table to write (table)")
    p.add_argument("--mode", default="errorifexists", choices=("errorifexists", "overwrite", "append", "ignore"),
                   help="when the output exists (default: errorifexists)")
    p.add_argument("--partition-by", metavar="COLS", help="comma list of columns to partition the output by")
    p.add_argument("--decode", default="raw", choices=("raw", "amqp", "json", "bson"))
    p.add_argument("--schema", metavar="DDL", help="typed columns for --decode json|bson")
    p.add_argument("--starting-offset", help="earliest (default), latest, N or JSON per stream")
    p.add_argument("--ending-offset", help="latest (default), N or JSON per stream; exclusive")
    p.add_argument("--starting-timestamp", help="ms since the epoch or ISO-8601")
    p.add_argument("--ending-timestamp", help="ms since the epoch or ISO-8601; exclusive")
    p.add_argument("--partitions", type=int, metavar="N", help="Spark read partitions (default: parallelism)")
    p.add_argument("--master", default="local[*]", help="Spark master (default: local[*])")
    p.add_argument("--packages", help="spark.jars.packages, e.g. io.delta:delta-spark_2.13:4.0.0")
    p.add_argument("--jars", help="spark.jars: comma list of local jar files")
    p.add_argument("--warehouse", metavar="DIR", help="spark.sql.warehouse.dir for --to table")
    p.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE", help="extra Spark conf (repeatable)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    return p


def reader_options(args, parallelism):
    """Data source options from the command line."""
    opts = {"stream": args.stream, "decode": args.decode, "numPartitions": str(args.partitions or parallelism)}
    if args.path:
        opts["path"] = os.path.abspath(args.path)
    if args.uri:
        opts["uri"] = args.uri
    if args.nodes:
        opts["nodes"] = args.nodes
    for key, value in (("schema", args.schema), ("startingOffset", args.starting_offset),
                       ("endingOffset", args.ending_offset), ("startingTimestamp", args.starting_timestamp),
                       ("endingTimestamp", args.ending_timestamp)):
        if value is not None:
            opts[key] = value
    return opts


def planned_records(opts):
    """Records the load will read, from the same planning the data source does (read-only)."""
    from riverbed.spark import source
    o = source.Options(opts)
    backend = source.backend_for(o)
    try:
        return sum(end - start for _, _, start, end in source.plan_ranges(o, backend) if end > start)
    finally:
        backend.close()


def build_session(args):
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession
    b = SparkSession.builder.master(args.master).appName("riverbed spark-load") \
        .config("spark.ui.showConsoleProgress", "false")
    if args.master.startswith("local"):
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        b = b.config("spark.driver.host", "127.0.0.1").config("spark.driver.bindAddress", "127.0.0.1") \
            .config("spark.ui.enabled", "false")
    if args.packages:
        b = b.config("spark.jars.packages", args.packages)
    if args.jars:
        b = b.config("spark.jars", args.jars)
    if args.warehouse:
        b = b.config("spark.sql.warehouse.dir", os.path.abspath(args.warehouse))
    if args.to == "delta":
        b = b.config("spark.sql.extensions", "io.delta.sql.DeltaSparkSessionExtension") \
            .config("spark.sql.catalog.spark_catalog", "org.apache.spark.sql.delta.catalog.DeltaCatalog")
    for kv in args.conf:
        key, _, value = kv.partition("=")
        b = b.config(key, value)
    return b.getOrCreate()


def write(df, args):
    w = df.write.mode(args.mode)
    if args.partition_by:
        w = w.partitionBy(*[c.strip() for c in args.partition_by.split(",") if c.strip()])
    if args.to == "parquet":
        w.parquet(args.output)
    elif args.to == "delta":
        w.format("delta").save(args.output)
    else:
        w.saveAsTable(args.table)


def _progress(sc, total, done_event, enabled):
    """Advance a tqdm bar (records) from the status of the running Spark job until ``done_event``."""
    from tqdm import tqdm
    bar = tqdm(total=total, unit="rec", unit_scale=True, disable=not enabled, dynamic_ncols=True,
               desc="spark-load")
    tracker = sc.statusTracker()
    shown = 0
    while not done_event.wait(0.5):
        done = tasks = 0
        for sid in tracker.getActiveStageIds():
            info = tracker.getStageInfo(sid)
            if info is not None:
                done += info.numCompletedTasks
                tasks += info.numTasks
        if tasks:
            now = min(total, total * done // tasks)
            if now > shown:
                bar.update(now - shown)
                shown = now
    return bar, shown


def main(argv=None):
    """Run the load. Returns the exit status."""
    args = build_parser().parse_args(argv)
    if not (args.path or args.uri or args.nodes) or (args.path and args.nodes):
        print("riverbed spark-load: give one of --path DATA_DIR, --uri URI or --nodes HOST:PORT,...",
              file=sys.stderr)
        return 2
    if args.to in ("parquet", "delta") and not args.output:
        print(f"riverbed spark-load: --to {args.to} needs --output PATH", file=sys.stderr)
        return 2
    if args.to == "table" and not args.table:
        print("riverbed spark-load: --to table needs --table NAME", file=sys.stderr)
        return 2
    from riverbed.spark import RiverbedDataSource
    from riverbed.spark.source import OptionError

    from pyspark.sql import SparkSession
    # inside an application that already has a session (a notebook, a test), use it and leave it running
    own = SparkSession.getActiveSession() is None
    spark = build_session(args)
    try:
        spark.dataSource.register(RiverbedDataSource)
        opts = reader_options(args, spark.sparkContext.defaultParallelism)
        try:
            total = planned_records(opts)
        except (OptionError, ValueError) as e:
            print(f"riverbed spark-load: {e}", file=sys.stderr)
            return 2
        reader = spark.read.format("riverbed")
        for k, v in opts.items():
            reader = reader.option(k, v)
        df = reader.load()
        started = time.monotonic()
        done = threading.Event()
        failure = []

        def run():
            try:
                write(df, args)
            except BaseException as e:  # noqa: BLE001 - reported by the main thread
                failure.append(e)
            finally:
                done.set()

        worker = threading.Thread(target=run, name="spark-load", daemon=True)
        worker.start()
        bar, shown = _progress(spark.sparkContext, total, done, not args.no_progress and sys.stderr.isatty())
        worker.join()
        if failure:
            bar.close()
            e = failure[0]
            msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            if args.to == "delta" and "delta" in str(e).lower():
                msg += " (is Delta Lake on the classpath? use --packages or --jars)"
            print(f"riverbed spark-load: {msg}", file=sys.stderr)
            return 1
        bar.update(total - shown)
        bar.close()
        dt = time.monotonic() - started
        where = args.output if args.to != "table" else args.table
        print(f"loaded {total:,} records into {args.to} {where} in {dt:.1f} s "
              f"({total / dt if dt else 0:,.0f} records/s)", file=sys.stderr)
        return 0
    finally:
        if own:
            spark.stop()


if __name__ == "__main__":
    sys.exit(main())
