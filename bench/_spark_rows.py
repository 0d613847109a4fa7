"""bench.compare's Spark rows (issue 26): the ``riverbed`` data source on ``local[2]`` reading a stream the
broker holds, Riverbed only.

- ``spark-raw``: ``--n`` records of ``--size`` bytes (the load generator's publish, untimed), read with
  ``decode=raw``; the query is ``count(*)``, ``sum(length(body))``, as ``bench/bench_spark.py`` runs it
  (every body reaches the JVM). Goal: >= 5M rows/s.
- ``spark-json``: ``--n`` JSON records as the shells store them (content-type application/json,
  ``bench_spark.json_doc``, Publish frames built with the project's codec, untimed), read with
  ``decode=json`` and ``bench_spark.JSON_SCHEMA``; the query is bench_spark's json aggregate over every
  column. Goal: >= 1M rows/s.

Run by ``bench._client`` like every workload (READY/GO, CPU snapshots, RESULT). Before READY, untimed:
the stream is filled through the broker, the SparkSession starts (the JVM, ``SPARK_CONF``), the data
source is created (``load()``), and the same query runs once over the whole stream (JIT warm-up, Python
workers forked and their imports done); the fixed cost of a query is timed on a one-chunk read (best of
``FIXED_RUNS``). The timed window is one ``collect()`` of the query, planning included; the result is
checked against what was published (a wrong count fails the run).

The reader opens the broker's data directory read-only (option ``path``: the executors read LMDB
directly, as bench_spark does; the broker is not involved in the read). The directory is the broker's
``--data-dir``, read from its command line (``/proc/PID/cmdline`` of ``--server-pid``).

CPU: the client's figure is its whole process tree (this process, the JVM and the Python workers under
it), so the harness's "other busy cores" stays the machine's other work; the result also carries the
JVM's own CPU and the Python workers' apart (``jvm_us_per_row``, ``pyworkers_us_per_row``). A Python
worker that exits during the window (the pyspark daemon ignores SIGCHLD, so nobody is charged for it)
is counted up to the last of ``TreeCpu``'s samples.

:func:`prepare` leaves the rows out, with the reason, when pyspark/pyarrow cannot be imported or no Java
runtime is on PATH after ``ci/ensure-java.sh``.
"""

import importlib.util
import os
import shutil
import struct
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

MASTER = "local[2]"
RAW_GOAL = 5_000_000.0       # rows/s, issue 26
JSON_GOAL = 1_000_000.0      # rows/s, issue 26
FIXED_RUNS = 3               # one-chunk queries; the best is the query's fixed cost
FIXED_RECORDS = 1000         # the one-chunk query reads at most this many records
SAMPLE_EVERY_S = 0.1         # TreeCpu's period
FRAME_RECORDS = 2000         # records per Publish frame of the JSON fill
FILL_INFLIGHT = 8            # JSON fill frames unconfirmed at most
JAVA_TIMEOUT_S = 600         # ci/ensure-java.sh may apt-get install a JRE
# more setup time than the harness's 120 s: a JVM start, a warm-up read of the whole stream and the one-chunk
# queries took over 2 minutes at load 13 on this machine
SETUP_S = 480

SPARK_CONF = {
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.driver.host": "127.0.0.1",
    "spark.driver.bindAddress": "127.0.0.1",
    "spark.sql.shuffle.partitions": "2",
    "spark.default.parallelism": "2",
    "spark.driver.memory": "2g",
    "spark.sql.session.timeZone": "UTC",
}

WORKLOADS = {
    "spark-raw": dict(
        label="Spark local[2] read decode=raw: count, sum(length(body))", client="spark-raw", kind="spark",
        rabbitmq=False),
    "spark-json": dict(
        label="Spark local[2] read decode=json: count, sums of every column", client="spark-json", kind="spark",
        rabbitmq=False),
}
GOALS = {("spark-raw", "msgs_per_s"): ("abs", ">=", RAW_GOAL),
         ("spark-json", "msgs_per_s"): ("abs", ">=", JSON_GOAL)}
METRICS = {
    "jvm_us_per_row": ("JVM CPU s/M rows", "{:.3f}", False),
    "pyworkers_us_per_row": ("Python workers CPU s/M rows", "{:.3f}", False),
    "spark_fixed_s": ("one-chunk query s (fixed cost)", "{:.3f}", False),
}
KIND_METRICS = ["msgs_per_s", "client_us_per_msg", "jvm_us_per_row", "pyworkers_us_per_row", "spark_fixed_s"]


def register(workloads, goals, metrics, kind_metrics, chart):
    """Add the Spark rows to ``bench._workloads``' tables (called there once)."""
    workloads.update(WORKLOADS)
    goals.update(GOALS)
    metrics.update(METRICS)
    kind_metrics["spark"] = list(KIND_METRICS)
    chart["spark"] = ["msgs_per_s"]


# --------------------------------------------------------------------------------------------- harness

def unavailable():
    """Why the Spark rows cannot run here (a sentence), or None. Runs ``ci/ensure-java.sh``, which
    installs Debian's JRE when none is on PATH and it may (root, apt-get), as the tests do."""
    for mod in ("pyspark", "pyarrow"):
        if importlib.util.find_spec(mod) is None:
            return f"{mod} is not installed (make install installs the spark extra)"
    if shutil.which("java") is None:
        try:
            r = subprocess.run(["bash", os.path.join(ROOT, "ci", "ensure-java.sh")], capture_output=True,
                               text=True, timeout=JAVA_TIMEOUT_S)
        except (OSError, subprocess.SubprocessError) as e:
            return f"ci/ensure-java.sh could not run: {e}"
        if r.returncode != 0 or shutil.which("java") is None:
            tail = " ".join((r.stderr or r.stdout).strip().splitlines()[-2:])
            return f"no Java runtime on PATH (ci/ensure-java.sh: {tail or 'exit %d' % r.returncode})"
    return None


def prepare(workloads, log=print):
    """``(workloads, None)``, or ``(workloads without the Spark rows, the reason)`` when they cannot run
    here (the reason is also logged)."""
    if not set(workloads) & set(WORKLOADS):
        return workloads, None
    why = unavailable()
    if why is None:
        return workloads, None
    log(f"leaving out the Spark rows: {why}")
    return [w for w in workloads if w not in WORKLOADS], why


def metrics(results):
    """The Spark figures of one run (one client) for the harness's record."""
    r = results[0]
    n = r["n"]
    return {"jvm_us_per_row": r["jvm_cpu_s"] / n * 1e6, "pyworkers_us_per_row": r["pyworkers_cpu_s"] / n * 1e6,
            "spark_fixed_s": r["fixed_query_s"]}


def report_lines(summary, skipped=None):
    """Lines printed after the table: each Spark row's median rate against its goal, its CPU per row and
    its fixed cost; or why the rows were skipped."""
    if skipped:
        return [f"Spark rows ({', '.join(WORKLOADS)}): skipped: {skipped}"]
    out = []
    for wname, (_, op, target) in ((w, GOALS[(w, "msgs_per_s")]) for w in WORKLOADS):
        d = summary.get((wname, "riverbed"))
        if not d or "msgs_per_s" not in d:
            continue
        rate = d["msgs_per_s"]["med"]
        ok = rate >= target
        med = {k: d[k]["med"] for k in ("jvm_us_per_row", "pyworkers_us_per_row", "spark_fixed_s") if k in d}
        out.append(f"Spark (issue 26) {wname}: {rate / 1e6:.2f}M rows/s, goal {op} {target / 1e6:g}M: "
                   f"{'met' if ok else 'MISSED'}; CPU per row: JVM {med.get('jvm_us_per_row', 0):.3f} µs, "
                   f"Python workers {med.get('pyworkers_us_per_row', 0):.3f} µs; a one-chunk query takes "
                   f"{med.get('spark_fixed_s', 0):.2f} s ({MASTER}, medians of {d['rounds']} round(s))")
    return out


# ---------------------------------------------------------------------------------------------- client

def server_data_dir(pid):
    """The ``--data-dir`` of the ``riverbed serve`` process ``pid`` (absolute). Raises RuntimeError."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = [a.decode() for a in f.read().split(b"\0")]
        cwd = os.readlink(f"/proc/{pid}/cwd")
    except OSError as e:
        raise RuntimeError(f"cannot read the broker's command line (--server-pid {pid}): {e}") from None
    for i, arg in enumerate(argv):
        if arg == "--data-dir" and i + 1 < len(argv):
            return os.path.join(cwd, argv[i + 1])
        if arg.startswith("--data-dir="):
            return os.path.join(cwd, arg.split("=", 1)[1])
    raise RuntimeError(f"the broker (pid {pid}) has no --data-dir on its command line")


def _stat(pid):
    """(ppid, comm, utime + stime in s) of ``pid``, or None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            head, rest = f.read().rsplit(")", 1)
    except OSError:
        return None
    fields = rest.split()
    return int(fields[1]), head.split("(", 1)[1], (int(fields[11]) + int(fields[12])) / _TICK


_TICK = os.sysconf("SC_CLK_TCK")


def _children(pid):
    out = []
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            try:
                with open(f"/proc/{pid}/task/{tid}/children") as f:
                    out.extend(int(c) for c in f.read().split())
            except OSError:
                pass
    except OSError:
        pass
    return out


class TreeCpu(threading.Thread):
    """CPU seconds of the processes under this one, apart: ``{"jvm", "python"}`` (the JVM's own threads;
    every process under the JVM: the pyspark daemon, its workers and planners). Samples every
    ``every`` s from :meth:`begin` to :meth:`end`, remembering each process's last figure, so one that
    exits in between (reaped by nobody: the daemon ignores SIGCHLD) keeps what it had used by its last
    sample."""

    def __init__(self, every=SAMPLE_EVERY_S):
        super().__init__(daemon=True)
        self.every = every
        self.first = {}
        self.last = {}
        self.jvm = set()
        self.halt = threading.Event()

    def _sample(self):
        seen = {}
        todo = [(c, False) for c in _children(os.getpid())]
        while todo:
            pid, under_jvm = todo.pop()
            st = _stat(pid)
            if st is None:
                continue
            _, comm, cpu = st
            is_jvm = comm == "java" and not under_jvm
            if is_jvm:
                self.jvm.add(pid)
            seen[pid] = cpu
            todo.extend((c, under_jvm or is_jvm) for c in _children(pid))
        return seen

    def begin(self):
        self.first = self._sample()
        self.last = dict(self.first)
        self.start()

    def run(self):
        while not self.halt.wait(self.every):
            self.last.update(self._sample())

    def end(self):
        """``{"jvm": s, "python": s}`` used since :meth:`begin`."""
        self.halt.set()
        self.join()
        self.last.update(self._sample())
        used = {pid: cpu - self.first.get(pid, 0.0) for pid, cpu in self.last.items()}
        jvm = sum(v for pid, v in used.items() if pid in self.jvm)
        return {"jvm": jvm, "python": sum(used.values()) - jvm}


def json_frames(n, batch):
    """Publish frames (publisher 0) of the JSON records ``bench_spark.json_doc(0..n-1)`` stored as the
    shells store JSON (``record.from_json_text``), ``batch`` records a frame."""
    from bench import _loadgen
    from bench.bench_spark import json_doc
    from riverbed.engine import record
    from riverbed.shells.rmq_stream import codec
    from riverbed.shells.rmq_stream.constants import CMD_PUBLISH
    pack_id, pack_len = struct.Struct(">Q").pack, struct.Struct(">I").pack
    for lo in range(0, n, batch):
        hi = min(n, lo + batch)
        parts = [struct.pack(">BI", _loadgen.PUBLISHER_ID, hi - lo)]
        for i in range(lo, hi):
            body = record.from_json_text(json_doc(i))
            parts += (pack_id(i + 1), pack_len(len(body)), body)
        yield hi - lo, codec.frame(CMD_PUBLISH, b"".join(parts))


def publish_frames(conn, frames, n, inflight=FILL_INFLIGHT):
    """Send ``(records, frame)`` pairs on a load-generator connection with at most ``inflight`` frames
    unconfirmed, until ``n`` records are confirmed; a second thread counts the confirms (the broker must
    be able to write them while this one writes frames). Raises LoadgenError on a PublishError."""
    from bench import _loadgen
    from riverbed.shells.rmq_stream.constants import CMD_PUBLISH_CONFIRM, CMD_PUBLISH_ERROR
    state = {"confirmed": 0, "errors": 0}
    cond = threading.Condition()
    failure = []

    def on_frame(buf, pos, size):
        key = struct.unpack_from(">H", buf, pos + 4)[0]
        if key in (CMD_PUBLISH_CONFIRM, CMD_PUBLISH_ERROR):
            with cond:
                count = struct.unpack_from(">I", buf, pos + 9)[0]
                state["confirmed"] += count
                if key == CMD_PUBLISH_ERROR:
                    state["errors"] += count
                cond.notify()

    def reader():
        try:
            conn.headers(on_frame, lambda: state["confirmed"] >= n)
        except Exception as e:   # handed to the writer, which raises it
            failure.append(e)
            with cond:
                cond.notify()

    t = threading.Thread(target=reader, daemon=True)
    t.start()
    upto = []           # records sent up to and including each frame
    for k, frame in frames:
        if len(upto) >= inflight:
            need = upto[len(upto) - inflight]
            with cond:
                while state["confirmed"] < need and not failure:
                    cond.wait()
        if failure:
            break
        conn.sock.sendall(frame)
        upto.append((upto[-1] if upto else 0) + k)
    t.join()
    if failure:
        raise failure[0]
    if state["errors"]:
        raise _loadgen.LoadgenError(f"{state['errors']} records answered with PublishError")


def fill(a, decode, body):
    """Create ``a.stream`` on the broker and put ``a.n`` records in it (untimed)."""
    from bench import _loadgen
    conn = _loadgen._setup(a)
    try:
        if decode == "json":
            publish_frames(conn, json_frames(a.n, FRAME_RECORDS), a.n)
        else:
            batch = max(1, min(a.batch, 5000))
            _loadgen.publish(conn, a.n, batch, body, a.inflight)
    finally:
        conn.close()


def start_session():
    """The ``local[2]`` SparkSession with the ``riverbed`` source registered (the JVM starts here)."""
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession
    from riverbed.spark import RiverbedDataSource
    builder = SparkSession.builder.master(MASTER).appName("riverbed-bench-compare")
    for key, value in SPARK_CONF.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    spark.dataSource.register(RiverbedDataSource)
    return spark


def expect(decode, n, size):
    """A check of the query's one result row for ``n`` records: raises RuntimeError when it is wrong."""
    def check(row):
        if decode == "json":
            ok = row.n == n and row.ids == n * (n - 1) // 2 and row.oks == n // 2
        else:
            ok = row.n == n and row.bytes == n * size
        if not ok:
            raise RuntimeError(f"the Spark read of {n:,} records gave {row}")
    return check


async def run(runner):
    """Run ``runner.a.workload`` (spark-raw or spark-json) against the broker at ``--host``/``--port``
    (filling ``--stream``) and its data directory (reading it); the stream is deleted at the end."""
    from bench import _loadgen
    from bench.bench_spark import JSON_SCHEMA, QUERIES
    a = runner.a
    if a.workload not in WORKLOADS:
        raise ValueError(f"not a Spark workload: {a.workload}")
    decode = "json" if a.workload == "spark-json" else "raw"
    path = server_data_dir(a.server_pid)
    try:
        fill(a, decode, runner.body)
        spark = start_session()

        def frame(**more):
            r = (spark.read.format("riverbed").option("path", path).option("stream", a.stream)
                 .option("decode", decode))
            if decode == "json":
                r = r.option("schema", JSON_SCHEMA)
            for key, value in more.items():
                r = r.option(key, value)
            return r.load()

        query = QUERIES[decode]
        check = expect(decode, a.n, a.size)
        check(frame().selectExpr(*query).collect()[0])        # untimed: JIT, workers, imports warm
        fixed = None
        for _ in range(FIXED_RUNS):
            df = frame(endingOffset=str(min(FIXED_RECORDS, a.n)))
            t = time.perf_counter()
            df.selectExpr(*query).collect()
            dt = time.perf_counter() - t
            fixed = dt if fixed is None else min(fixed, dt)
        df = frame()
        runner.wait_go()
        tree = TreeCpu()
        tree.begin()
        runner.start()
        row = df.selectExpr(*query).collect()[0]
        runner.stop()
        used = tree.end()
        check(row)
        # the client's CPU is the whole tree: this process's own (in the snapshots) and everything under it
        runner.s1["client"] += used["jvm"] + used["python"]
        runner.result.update(jvm_cpu_s=used["jvm"], pyworkers_cpu_s=used["python"], fixed_query_s=fixed,
                             decode=decode, master=MASTER, path_read=True)
        spark.stop()
    finally:
        if not a.keep_stream:
            _loadgen._delete(a)
