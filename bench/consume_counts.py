"""What one consumed record costs the server, Kafka Fetch against the RabbitMQ Stream shell's Deliver, on
one log (issue 24's consume goal: Kafka's per-record server cost <= 1.5x the RabbitMQ Stream shell's).

    .venv/bin/python -m bench.consume_counts [--n 200000] [--size 100] [--callgrind OUT] [--json FILE]

Starts ``riverbed serve`` (fsync=never, as the bench's headline rows; the RabbitMQ Stream and Kafka
listeners only), makes a topic of one partition and fills it, untimed, with ``--n`` records of ``--size``
bytes from confluent-kafka's producer (acks=all, idempotent, batches of 5,000: ``bench._kafka``, as the
``kafka-consume`` rows fill theirs). Then the same stored log is read twice, each read timed:

- ``kafka``: the native librdkafka consumer of the ``kafka-consume-native`` row (``bench/kafka_native.c``,
  the row's fetch settings ``bench._kafka.CONSUME_CONF``), partition 0 from offset 0, every record;
- ``rstream``: the load generator's consumer of the ``loadgen-consume`` row (``bench._loadgen.consume``,
  credit 16), Subscribe from ``first``, every record.

Prints per record, for each read, the server's /proc counters over it (``bench.produce_counts.counters``).
With ``--callgrind OUT`` the server runs under ``valgrind --tool=callgrind --instr-atstart=no``; collection
is on for each read alone and dumped after it (``OUT.1``: kafka, ``OUT.2``: rstream): instructions per
record and the ratio, and each dump's top functions (``OUT.N.top``). Under valgrind the /proc figures are
valgrind's, not the server's. ``--json FILE`` writes the figures.
"""

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import types

from bench.produce_counts import counters

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests",
                                "integration"))
from procs import ServerProcess  # noqa: E402

CREDIT = 16
TOPIC = "counts"


def fill(port, n, body):
    from confluent_kafka.admin import AdminClient, NewTopic

    from bench import _kafka
    a = types.SimpleNamespace(host="127.0.0.1", port=port)
    admin = AdminClient({"bootstrap.servers": f"127.0.0.1:{port}"})
    admin.create_topics([NewTopic(TOPIC, 1, 1)])[TOPIC].result(600)
    p = _kafka._producer(a)
    _kafka._produce(p, TOPIC, n, body)


def kafka_read(port, n):
    """A ``timed()`` that reads the ``n`` records with the native consumer (set up and connected first)."""
    from bench import _kafka, _kafka_native
    argv = [_kafka_native.binary(), "consume", f"127.0.0.1:{port}", TOPIC, str(n),
            *[f"{k}={v}" for k, v in _kafka.CONSUME_CONF.items()]]
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    _kafka_native._line(proc, "READY", "setup")

    def timed():
        proc.stdin.write("GO\n")
        proc.stdin.flush()
        done = json.loads(_kafka_native._line(proc, "DONE ", "run"))
        proc.wait(_kafka_native.DONE_TIMEOUT_S)
        if done["records"] != n or done["errors"]:
            raise RuntimeError(f"kafka_native read {done['records']} of {n} records, {done['errors']} errors")
    return timed


def rstream_read(port, n):
    from bench import _loadgen
    conn = _loadgen.Conn("127.0.0.1", port)

    def timed():
        try:
            state = _loadgen.consume(conn, TOPIC, n, CREDIT)
        finally:
            conn.close()
        if state["records"] < n:
            raise RuntimeError(f"the load generator read {state['records']} of {n} records")
    return timed


def callgrind_top(path, lines=40):
    """(total instructions, the top of callgrind_annotate's per-function table) of one dump."""
    ann = subprocess.run(["callgrind_annotate", "--inclusive=no", path], capture_output=True, text=True).stdout
    with open(path + ".top", "w") as f:
        f.write(ann)
    m = re.search(r"([\d,]+) \(100.0%\)\s+PROGRAM TOTALS", ann) or re.search(r"([\d,]+)\s+PROGRAM TOTALS", ann)
    total = int(m.group(1).replace(",", "")) if m else 0
    top = []
    for line in ann.splitlines():
        mm = re.match(r"\s*([\d,]+) \(\s*[\d.]+%\)\s+(\S.*)$", line)
        if mm and "PROGRAM TOTALS" not in line:
            top.append((int(mm.group(1).replace(",", "")), mm.group(2)))
    return total, top[:lines]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=200_000)
    ap.add_argument("--size", type=int, default=100)
    ap.add_argument("--callgrind", metavar="OUT", help="run the server under callgrind, its dumps OUT.1, OUT.2")
    ap.add_argument("--json", metavar="FILE", help="write the figures here")
    a = ap.parse_args(argv)
    body = b"x" * a.size
    wrap = []
    if a.callgrind:
        wrap = ["valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={a.callgrind}"]
    result = {"n": a.n, "size": a.size, "reads": {}}
    with tempfile.TemporaryDirectory(prefix="riverbed-counts-") as d:
        srv = ServerProcess(os.path.join(d, "data"), "--fsync", "never", "--kafka-port", "0",
                            wrap=wrap).start(timeout=900)
        try:
            fill(srv.ports["kafka"], a.n, body)
            for dump, (name, make) in enumerate((("kafka", lambda: kafka_read(srv.ports["kafka"], a.n)),
                                                 ("rstream", lambda: rstream_read(srv.port, a.n))), 1):
                timed = make()
                time.sleep(0.5)
                if a.callgrind:
                    subprocess.run(["callgrind_control", "-i", "on", str(srv.pid)], check=True, capture_output=True)
                c0, t0 = counters(srv.pid), time.perf_counter()
                timed()
                t1, c1 = time.perf_counter(), counters(srv.pid)
                if a.callgrind:
                    subprocess.run(["callgrind_control", "-i", "off", str(srv.pid)], check=True, capture_output=True)
                    subprocess.run(["callgrind_control", "-d", str(srv.pid)], check=True, capture_output=True)
                result["reads"][name] = _figures(a.n, t0, t1, c0, c1)
                if a.callgrind:
                    total, top = callgrind_top(f"{a.callgrind}.{dump}")
                    result["reads"][name].update(total_ir=total, ir_per_record=round(total / a.n, 1),
                                                 top_ir_per_record=[(round(ir / a.n, 1), fn) for ir, fn in top])
        finally:
            srv.stop(timeout=900)
    result["load"] = os.getloadavg()[0]
    k, r = result["reads"]["kafka"], result["reads"]["rstream"]
    for name, f in result["reads"].items():
        print(f"{name}: {a.n:,} records of {a.size} B in {f['wall_s']:.2f} s; server CPU {f['server_us']:.3f} us/record"
              f" (user {f['user_us']:.3f}, system {f['sys_us']:.3f}), wchar {f['wchar_per_record']:.1f} B/record"
              + (f"; callgrind {f['ir_per_record']:,.0f} instructions/record" if "ir_per_record" in f else ""))
    result["cpu_ratio"] = k["server_us"] / r["server_us"] if r["server_us"] else None
    if "ir_per_record" in k:
        result["ir_ratio"] = k["ir_per_record"] / r["ir_per_record"]
        print(f"Kafka / RabbitMQ Stream: {result['ir_ratio']:.2f}x instructions per record (goal <= 1.5x); "
              f"top functions in {a.callgrind}.1.top, {a.callgrind}.2.top")
    print(f"load {result['load']:.1f}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(result, f, indent=1)


def _figures(n, t0, t1, c0, c1):
    ran = sum(c1["threads"].values()) - sum(c0["threads"].get(k, 0.0) for k in c1["threads"])
    return {"wall_s": t1 - t0, "server_us": ran * 1e6 / n,
            "user_us": (c1["utime"] - c0["utime"]) * 1e6 / n, "sys_us": (c1["stime"] - c0["stime"]) * 1e6 / n,
            "wchar_per_record": (c1["wchar"] - c0["wchar"]) / n, "syscw_per_record": (c1["syscw"] - c0["syscw"]) / n,
            "minflt_per_record": (c1["minflt"] - c0["minflt"]) / n}


if __name__ == "__main__":
    main()
