"""What one produced record costs the server, Kafka shell against the RabbitMQ Stream shell, on one log.

    .venv/bin/python -m bench.produce_counts --shell kafka [--n 300000] [--size 100] [--callgrind OUT]
    .venv/bin/python -m bench.produce_counts --shell rstream [--n 300000] [--size 100] [--callgrind OUT]

Starts ``riverbed serve`` (fsync=never, as the bench's headline rows; only the one listener), makes the
topic (one partition) or stream, sends one untimed record, then the timed ``--n`` records with the bench's
own clients and settings: confluent-kafka (acks=all, idempotent, batches of 5,000, ``bench._kafka``'s
producer) or rstream ``send_batch`` of 5,000 with 16 batches in flight (``bench._client``). Prints, per
record, the server's /proc counters over the timed part: CPU (schedstat's on-CPU ns summed over the threads,
and user and system ticks), read and
write syscalls, bytes read and written, page faults, context switches.

With ``--callgrind OUT`` the server runs under ``valgrind --tool=callgrind --instr-atstart=no`` and
collection is switched on just for the timed part (``callgrind_control -i``): instructions per record
(every thread of the server), and the top functions (``OUT.top``). Under valgrind the /proc figures are
valgrind's, not the server's.
"""

import argparse
import asyncio
import glob
import os
import re
import subprocess
import sys
import tempfile
import time
import types

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests",
                                "integration"))
from procs import ServerProcess  # noqa: E402

CLK_TCK = os.sysconf("SC_CLK_TCK")
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


def kafka_produce(port, n, body):
    from confluent_kafka.admin import AdminClient, NewTopic

    from bench import _kafka
    a = types.SimpleNamespace(host="127.0.0.1", port=port)
    admin = AdminClient({"bootstrap.servers": f"127.0.0.1:{port}"})
    admin.create_topics([NewTopic("counts", 1, 1)])["counts"].result(600)
    p = _kafka._producer(a)
    _kafka._produce(p, "counts", 1, body)

    def timed():
        _kafka._produce(p, "counts", n, body)
    return timed


def rstream_produce(port, n, body):
    from bench import _client
    a = types.SimpleNamespace(host="127.0.0.1", port=port, stream="counts", stream_arg=[])
    loop = asyncio.new_event_loop()
    prod = _client.rstream_producer(a)
    loop.run_until_complete(prod.start())
    loop.run_until_complete(prod.create_stream("counts", exists_ok=True))
    loop.run_until_complete(_client.publish_rstream_batches(prod, "counts", 1, body, BATCH, INFLIGHT))

    def timed():
        loop.run_until_complete(_client.publish_rstream_batches(prod, "counts", n, body, BATCH, INFLIGHT))
    return timed


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shell", choices=("kafka", "rstream"), required=True)
    ap.add_argument("--n", type=int, default=300_000)
    ap.add_argument("--size", type=int, default=100)
    ap.add_argument("--callgrind", metavar="OUT", help="run the server under callgrind, write its profile here")
    a = ap.parse_args(argv)
    body = b"x" * a.size
    wrap = []
    if a.callgrind:
        wrap = ["valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={a.callgrind}"]
    with tempfile.TemporaryDirectory(prefix="riverbed-counts-") as d:
        args = ["--fsync", "never"] + (["--kafka-port", "0"] if a.shell == "kafka" else [])
        srv = ServerProcess(os.path.join(d, "data"), *args, wrap=wrap).start(timeout=900)
        try:
            if a.shell == "kafka":
                timed = kafka_produce(srv.ports["kafka"], a.n, body)
            else:
                timed = rstream_produce(srv.port, a.n, body)
            time.sleep(0.5)
            if a.callgrind:
                subprocess.run(["callgrind_control", "-i", "on", str(srv.pid)], check=True, capture_output=True)
            c0, t0 = counters(srv.pid), time.perf_counter()
            timed()
            t1, c1 = time.perf_counter(), counters(srv.pid)
            if a.callgrind:
                subprocess.run(["callgrind_control", "-i", "off", str(srv.pid)], check=True, capture_output=True)
        finally:
            pid = srv.pid
            srv.stop(timeout=900)
    n = a.n
    load = os.getloadavg()[0]
    print(f"{a.shell}: {n:,} records of {a.size} B in {t1 - t0:.2f} s ({n / (t1 - t0):,.0f}/s), load {load:.1f}")
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
    if a.callgrind:
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
