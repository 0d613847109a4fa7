"""What one produced record costs the server, Kafka shell against the RabbitMQ Stream shell, on one log.

    .venv/bin/python -m bench.produce_counts --shell kafka [--n 300000] [--size 100] [--callgrind OUT]
    .venv/bin/python -m bench.produce_counts --shell rstream [--n 300000] [--size 100] [--callgrind OUT]
    .venv/bin/python -m bench.produce_counts --shell kafka,kafka-native,rstream --n 1000000 --shape [--perf OUT]

Starts ``riverbed serve`` (fsync=never, as the bench's headline rows; the RabbitMQ Stream and Kafka
listeners), then runs each row of ``--shell`` in turn on that one server. ``kafka`` is confluent-kafka
(acks=all, idempotent, batches of 5,000, ``bench._kafka``'s producer); ``kafka-native`` is
``bench/kafka_native.c`` (the same librdkafka and settings, ``bench._kafka_native``); ``rstream`` is
rstream ``send_batch`` of 5,000 with 16 batches in flight (``bench._client``). For each row, it makes the
row's own topic or stream (one partition), sends one untimed record, then the timed ``--n`` records. It
then deletes the topic, so a later row reuses its pages, as ``bench.compare``'s rows do. Rows run one
after another on one server, so A and B share the load; the order matters, because the first row grows
the data file onto fresh pages.

Printed per record, for the timed part of each row: the server's /proc counters (CPU from schedstat's
on-CPU ns summed over the threads, and from user and system ticks; read and write syscalls, bytes read
and written, page faults, context switches). Also the data file's size and how much of it is in the page
cache (util-linux ``fincore``).

- ``--shape`` counts, inside the server, the requests by Kafka API key, the record batches and records
  per Produce, their attributes, socket reads, and LMDB commits and records per commit
  (``bench/_shape_hook.py``, loaded through a ``sitecustomize`` on the server's ``PYTHONPATH``).
- ``--perf OUT`` records the server with ``perf record -g`` (kernel included) over each timed part, into
  ``OUT.<i>``.
- ``--callgrind OUT`` (one row only) runs the server under ``valgrind --tool=callgrind
  --instr-atstart=no``, with collection switched on just for the timed part (``callgrind_control -i``).
  It prints instructions per record (every thread of the server) and writes the top functions to
  ``OUT.top``. Under valgrind the /proc figures are valgrind's, not the server's.
"""

import argparse
import asyncio
import glob
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import types

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests",
                                "integration"))
from procs import ServerProcess  # noqa: E402

CLK_TCK = os.sysconf("SC_CLK_TCK")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BATCH = 5_000
INFLIGHT = 16


def _fields(path):
    with open(path) as f:
        return f.read().rsplit(")", 1)[1].split()


def counters(pid):
    """The server's /proc counters now (all threads)."""
    st = _fields(f"/proc/{pid}/stat")
    c = {"utime": int(st[11]) / CLK_TCK, "stime": int(st[12]) / CLK_TCK, "minflt": int(st[7]),
         "majflt": int(st[9])}
    with open(f"/proc/{pid}/io") as f:
        for line in f:
            k, v = line.split(":")
            c[k] = int(v)
    vol = nonvol = 0
    threads = {}
    for task in glob.glob(f"/proc/{pid}/task/*"):
        try:
            with open(f"{task}/status") as f:
                s = f.read()
            name = re.search(r"^Name:\s*(.*)$", s, re.M).group(1)
            vol += int(re.search(r"^voluntary_ctxt_switches:\s*(\d+)", s, re.M).group(1))
            nonvol += int(re.search(r"^nonvoluntary_ctxt_switches:\s*(\d+)", s, re.M).group(1))
            with open(f"{task}/schedstat") as f:
                ran_ns = int(f.read().split()[0])     # on-CPU time, ns (utime/stime are 10 ms ticks)
            threads[f"{name}/{os.path.basename(task)}"] = ran_ns / 1e9
        except (OSError, AttributeError):
            continue
    c["voluntary_ctxt"] = vol
    c["nonvoluntary_ctxt"] = nonvol
    c["threads"] = threads
    return c


def _kafka_admin(port):
    from confluent_kafka.admin import AdminClient
    return AdminClient({"bootstrap.servers": f"127.0.0.1:{port}"})


def kafka_produce(port, n, body, topic):
    """kafka-produce's client (bench._kafka: confluent-kafka, its producer and produce_batch loop): the
    topic and one untimed record before this returns; returns (timed, cleanup)."""
    from confluent_kafka.admin import NewTopic

    from bench import _kafka
    a = types.SimpleNamespace(host="127.0.0.1", port=port)
    admin = _kafka_admin(port)
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(600)
    p = _kafka._producer(a)
    _kafka._produce(p, topic, 1, body)

    def timed():
        _kafka._produce(p, topic, n, body)

    def cleanup():
        admin.delete_topics([topic])[topic].result(600)
    return timed, cleanup


def native_produce(port, n, body, topic):
    """kafka-produce-native's client (bench/kafka_native.c: the same librdkafka and settings): the topic
    and its one untimed record before this returns; returns (timed, cleanup)."""
    from confluent_kafka.admin import NewTopic

    from bench import _kafka_native
    admin = _kafka_admin(port)
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(600)
    argv = [_kafka_native.binary(), "produce", f"127.0.0.1:{port}", topic, str(n), str(len(body)),
            *_kafka_native._props(_kafka_native.producer_conf())]
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    _kafka_native._line(proc, "READY", "setup")

    def timed():
        proc.stdin.write("GO\n")
        proc.stdin.flush()
        _kafka_native._line(proc, "DONE ", "run")
        proc.stdin.close()
        proc.wait(60)

    def cleanup():
        admin.delete_topics([topic])[topic].result(600)
    return timed, cleanup


def rstream_produce(port, n, body, stream):
    """publish-rstream-raw's client (bench._client: rstream send_batch of 5,000, 16 in flight); returns
    (timed, cleanup)."""
    from bench import _client
    a = types.SimpleNamespace(host="127.0.0.1", port=port, stream=stream, stream_arg=[])
    loop = asyncio.new_event_loop()
    prod = _client.rstream_producer(a)
    loop.run_until_complete(prod.start())
    loop.run_until_complete(prod.create_stream(stream, exists_ok=True))
    loop.run_until_complete(_client.publish_rstream_batches(prod, stream, 1, body, BATCH, INFLIGHT))

    def timed():
        loop.run_until_complete(_client.publish_rstream_batches(prod, stream, n, body, BATCH, INFLIGHT))

    def cleanup():
        loop.run_until_complete(prod.delete_stream(stream, missing_ok=True))
        loop.run_until_complete(prod.close())
        loop.close()
    return timed, cleanup


CLIENTS = {"kafka": kafka_produce, "kafka-native": native_produce, "rstream": rstream_produce}


def _cached_mib(path):
    """MiB of ``path`` in the page cache (util-linux fincore), or '?'."""
    r = subprocess.run(["fincore", "-b", "-n", "-o", "RES", path], capture_output=True, text=True)
    try:
        return int(r.stdout.split()[0]) >> 20
    except (IndexError, ValueError):
        return "?"


def _shape(path, on):
    if not on:
        return None
    import json
    with open(path) as f:
        return json.load(f)


def _delta(a, b):
    if isinstance(b, dict):
        return {k: _delta(a.get(k, 0), v) for k, v in b.items() if _delta(a.get(k, 0), v)}
    return b - a


def print_shape(s0, s1, n):
    """The shape counters' differences over the timed part (bench/_shape_hook.py), per 100k records."""
    d = _delta(s0, s1)
    per = 100_000 / n
    print(f"  shape (per 100k records): requests by API key {({k: round(v * per, 1) for k, v in d.get('api', {}).items()})}")
    parts, batches, recs = d.get("produce_parts", 0), d.get("batches", 0), d.get("records", 0)
    if parts:
        print(f"    produce partitions {parts * per:.1f}, record batches {batches * per:.1f} "
              f"({batches / parts:.2f} per partition), {recs / max(batches, 1):,.0f} records per batch; "
              f"attributes {d.get('batch_attrs')}, batches with spread timestamps {d.get('batch_ts_spread', 0)}")
    reads = d.get("reads", 0)
    if reads:
        print(f"    socket reads {reads * per:.1f}, {d.get('read_bytes', 0) / reads:,.0f} bytes each")
    commits = d.get("commits", 0) + d.get("alone", 0)
    print(f"    commits {commits * per:.1f} (group {d.get('commits', 0) * per:.1f}, alone {d.get('alone', 0) * per:.1f}, "
          f"inline {d.get('inline', 0) * per:.1f}); appends per group commit "
          f"{d.get('commit_appends', 0) / max(d.get('commits', 0), 1):.2f}, records per commit "
          f"{d.get('commit_records', 0) / max(commits, 1):,.0f}")


def report(shell, n, size, t0, t1, c0, c1, pid, s0, s1):
    """Print one row's figures: rate, the server's CPU per record (schedstat, ticks, per thread), the
    /proc counters per record and, when counted, the request and commit shape."""
    load = os.getloadavg()[0]
    print(f"{shell}: {n:,} records of {size} B in {t1 - t0:.2f} s ({n / (t1 - t0):,.0f}/s), load {load:.1f}")
    cpu = (c1["utime"] + c1["stime"] - c0["utime"] - c0["stime"]) * 1e6 / n
    ran = sum(c1["threads"].values()) - sum(c0["threads"].get(k, 0.0) for k in c1["threads"])
    print(f"  server CPU {ran * 1e6 / n:.3f} us/record by schedstat; by ticks {cpu:.3f} "
          f"(user {(c1['utime'] - c0['utime']) * 1e6 / n:.3f}, system {(c1['stime'] - c0['stime']) * 1e6 / n:.3f})")
    for k in sorted(c1["threads"]):
        d_t = c1["threads"][k] - c0["threads"].get(k, 0.0)
        if d_t > 0:
            role = " (main: the event loop)" if k.endswith(f"/{pid}") else ""
            print(f"    thread {k}{role}: {d_t * 1e6 / n:.3f} us/record")
    for k in ("syscr", "syscw", "rchar", "wchar", "minflt", "majflt", "voluntary_ctxt", "nonvoluntary_ctxt"):
        print(f"  {k}: {(c1[k] - c0[k]) / n:.5f}/record ({c1[k] - c0[k]:,})")
    if s0 is not None:
        print_shape(s0, s1, n)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shell", required=True,
                    help="kafka, kafka-native or rstream; several, comma-separated, run one after the other on "
                         "one server, each on its own topic deleted after it (A and B under the same load)")
    ap.add_argument("--n", type=int, default=300_000)
    ap.add_argument("--size", type=int, default=100)
    ap.add_argument("--shape", action="store_true",
                    help="count requests, batches and commits inside the server (bench/_shape_hook.py)")
    ap.add_argument("--server-arg", action="append", default=[], metavar="ARG",
                    help="one more argument for riverbed serve (repeat the option for each)")
    ap.add_argument("--callgrind", metavar="OUT", help="run the server under callgrind, write its profile here")
    ap.add_argument("--perf", metavar="OUT", help="perf record -g the server (kernel included) over each timed "
                                                  "part, to OUT.<i> (i: the row's place in --shell)")
    a = ap.parse_args(argv)
    shells = a.shell.split(",")
    for sh in shells:
        if sh not in CLIENTS:
            ap.error(f"unknown shell {sh!r}: one of {', '.join(CLIENTS)}")
    if a.callgrind and len(shells) > 1:
        ap.error("--callgrind takes one shell")
    body = b"x" * a.size
    wrap = []
    if a.callgrind:
        wrap = ["valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={a.callgrind}"]
    with tempfile.TemporaryDirectory(prefix="riverbed-counts-") as d:
        args = ["--fsync", "never", "--kafka-port", "0", *a.server_arg]
        env = None
        shape = os.path.join(d, "shape.json")
        if a.shape:
            from bench import _shape_hook
            site = os.path.join(d, "site")
            os.makedirs(site)
            with open(os.path.join(site, "sitecustomize.py"), "w") as f:
                f.write(_shape_hook.SITECUSTOMIZE)
            env = {"RIVERBED_SHAPE_FILE": shape,
                   "PYTHONPATH": os.pathsep.join([site, ROOT, os.environ.get("PYTHONPATH", "")])}
        srv = ServerProcess(os.path.join(d, "data"), *args, wrap=wrap, env=env).start(timeout=900)
        try:
            for i, sh in enumerate(shells):
                port = srv.port if sh == "rstream" else srv.ports["kafka"]
                timed, cleanup = CLIENTS[sh](port, a.n, body, f"counts-{i}")
                time.sleep(0.5)
                if a.callgrind:
                    subprocess.run(["callgrind_control", "-i", "on", str(srv.pid)], check=True, capture_output=True)
                s0 = _shape(shape, a.shape)
                rec = None
                if a.perf:
                    rec = subprocess.Popen(["perf", "record", "-g", "-q", "-o", f"{a.perf}.{i}", "-p", str(srv.pid)],
                                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                    time.sleep(1.0)     # perf attached to every thread
                c0, t0 = counters(srv.pid), time.perf_counter()
                timed()
                t1, c1 = time.perf_counter(), counters(srv.pid)
                if rec is not None:
                    rec.send_signal(signal.SIGINT)
                    rec.wait(120)
                if a.shape:
                    time.sleep(0.2)
                s1 = _shape(shape, a.shape)
                if a.callgrind:
                    subprocess.run(["callgrind_control", "-i", "off", str(srv.pid)], check=True, capture_output=True)
                report(sh, a.n, a.size, t0, t1, c0, c1, srv.pid, s0, s1)
                data = os.path.join(d, "data", "data.mdb")
                print(f"  data file: {os.path.getsize(data) >> 20} MiB, page cache: {_cached_mib(data)} MiB")
                cleanup()
                time.sleep(1.0)     # the deleted stream's keys are purged while idle
        finally:
            srv.stop(timeout=900)
    if a.callgrind:
        n = a.n
        ann = subprocess.run(["callgrind_annotate", "--inclusive=no", a.callgrind], capture_output=True,
                             text=True).stdout
        with open(a.callgrind + ".top", "w") as f:
            f.write(ann)
        m = re.search(r"([\d,]+) \(100.0%\)\s+PROGRAM TOTALS", ann) or re.search(r"([\d,]+)\s+PROGRAM TOTALS", ann)
        if m:
            total = int(m.group(1).replace(",", ""))
            print(f"  callgrind: {total:,} instructions, {total / n:,.0f} per record (top functions: "
                  f"{a.callgrind}.top)")


if __name__ == "__main__":
    main()
