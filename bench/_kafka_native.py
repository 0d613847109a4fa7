"""Native Kafka workloads of ``bench.compare``: librdkafka driven from C (``bench/kafka_native.c``), so the
rows measure the broker, not a Python binding.

confluent-kafka's ``Consumer.consume`` makes one Python ``Message`` per record, ~1.7 µs of client CPU
each on the bench machine: its consume row (``bench._kafka``) tops out near 600k records/s whatever the
broker does. ``kafka_native`` counts records and value bytes in C with no output per record; it is
linked against the very librdkafka confluent-kafka ships when the wheel has one (so the two rows differ
only by the binding), else against Debian's.

- ``kafka-consume-native``: the topic filled first (untimed, confluent-kafka's producer as in
  ``kafka-consume``), then ``kafka_native consume``: partition 0 assigned from offset 0,
  ``rd_kafka_consume_batch_queue`` (the call under ``Consumer.consume``) until every record arrived,
  with the Python row's fetch settings (``bench._kafka.CONSUME_CONF``).
- ``kafka-produce-native``: ``kafka_native produce``: ``rd_kafka_produce_batch`` of ``--size``-byte
  records, acks=all, idempotent, with the Python row's batching (``bench._kafka`` ``LINGER_MS``,
  ``BATCH_RECORDS``...), until every record is acknowledged.

Setup (connection, metadata, the first record) is untimed: the program says READY, and the timed
window runs from GO to its DONE line. The client CPU of a run is the program's own (getrusage, every
librdkafka thread included) plus this process's, which only waits meanwhile.

The program is built once per source and library (``binary``) with the system's ``cc`` into
``build/bench/``; its header comes from Debian's librdkafka-dev (``ci/ensure-librdkafka.sh`` installs
it). Without a compiler or the header the rows cannot run: ``prepare`` (called by ``bench.compare``
before the first run) leaves them out and says why.
"""

import glob
import hashlib
import json
import os
import shutil
import subprocess

from bench import _kafka

WORKLOADS = ("kafka-produce-native", "kafka-consume-native")
HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
SOURCE = os.path.join(HERE, "kafka_native.c")
HEADER = "/usr/include/librdkafka/rdkafka.h"
ENSURE = os.path.join(ROOT, "ci", "ensure-librdkafka.sh")
BUILD_DIR = os.path.join(ROOT, "build", "bench")
DONE_TIMEOUT_S = 60     # the program exits this soon after DONE


class Unavailable(RuntimeError):
    """The native client cannot be built here (no compiler, no librdkafka header or library)."""


def bundled_library():
    """The librdkafka shared library inside the confluent-kafka wheel, or None (a build from source
    links the system's)."""
    try:
        import confluent_kafka
    except ImportError:
        return None
    site = os.path.dirname(os.path.dirname(os.path.abspath(confluent_kafka.__file__)))
    libs = sorted(glob.glob(os.path.join(site, "confluent_kafka.libs", "librdkafka*.so*")))
    return libs[0] if libs else None


def binary(ensure=True):
    """Path of the built ``kafka_native``, built first when this source and library have no build yet
    (atomically: concurrent callers each build and the last rename wins). ``ensure``: install Debian's
    librdkafka-dev when its header is missing. Raises :class:`Unavailable` with the reason."""
    lib = bundled_library()
    cc = shutil.which(os.environ.get("CC") or "cc")
    with open(SOURCE, "rb") as f:
        key = hashlib.sha256(f.read() + f"\0{lib}\0{cc}".encode()).hexdigest()[:12]
    out = os.path.join(BUILD_DIR, f"kafka_native-{key}")
    if os.access(out, os.X_OK):
        return out
    if cc is None:
        raise Unavailable("no C compiler (cc) to build bench/kafka_native.c")
    if not os.path.exists(HEADER) and ensure:
        subprocess.run([ENSURE], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=600, check=False)
    if not os.path.exists(HEADER):
        raise Unavailable(f"no librdkafka header ({HEADER}: Debian's librdkafka-dev, ci/ensure-librdkafka.sh)")
    link = [lib, f"-Wl,-rpath,{os.path.dirname(lib)}"] if lib else ["-lrdkafka"]
    os.makedirs(BUILD_DIR, exist_ok=True)
    tmp = f"{out}.{os.getpid()}.tmp"
    r = subprocess.run([cc, "-O2", "-Wall", "-o", tmp, SOURCE, *link], capture_output=True, text=True,
                       timeout=300)
    if r.returncode:
        raise Unavailable(f"cc could not build bench/kafka_native.c: {r.stderr.strip()[-500:]}")
    os.replace(tmp, out)
    return out


def prepare(workloads, log=print):
    """Build the program when ``workloads`` (names) has a native row. Returns ``(workloads, None)``, or,
    when it cannot be built here, ``(workloads without the native rows, the reason)`` (also logged)."""
    if not set(workloads) & set(WORKLOADS):
        return workloads, None
    try:
        binary()
    except (Unavailable, OSError, subprocess.SubprocessError) as e:
        log(f"leaving out the native Kafka rows: {e}")
        return [w for w in workloads if w not in WORKLOADS], str(e)
    return workloads, None


def _props(conf):
    return [f"{k}={v}" for k, v in conf.items()]


def _line(proc, prefix, what):
    line = proc.stdout.readline()
    if not line.startswith(prefix):
        proc.kill()
        raise RuntimeError(f"kafka_native {what}: no {prefix.strip()} line (exit {proc.wait()})")
    return line[len(prefix):]


def producer_conf():
    """The native producer's settings: those of confluent-kafka's produce row (``bench._kafka``)."""
    return {"linger.ms": _kafka.LINGER_MS, "batch.size": _kafka.MAX_BATCH_BYTES,
            "batch.num.messages": _kafka.BATCH_RECORDS, "queue.buffering.max.messages": _kafka.QUEUE_MESSAGES,
            "queue.buffering.max.kbytes": 1 << 20}


async def run(runner):
    """Run ``runner.a.workload`` (kafka-consume-native or kafka-produce-native) against the Kafka
    listener at ``--host``/``--port``; the topic is ``--stream``, one partition, deleted at the end."""
    from confluent_kafka.admin import NewTopic
    a = runner.a
    if a.workload not in WORKLOADS:
        raise ValueError(f"not a native Kafka workload: {a.workload}")
    exe = binary()
    topic = a.stream
    bootstrap = f"{a.host}:{a.port}"
    admin = _kafka._admin(a)
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(60)
    try:
        if a.workload == "kafka-consume-native":
            p = _kafka._producer(a)
            _kafka._produce(p, topic, a.n, runner.body)        # untimed
            del p
            argv = [exe, "consume", bootstrap, topic, str(a.n), *_props(_kafka.CONSUME_CONF)]
        else:
            argv = [exe, "produce", bootstrap, topic, str(a.n), str(a.size), *_props(producer_conf())]
        proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        try:
            _line(proc, "READY", "setup")
            runner.wait_go()
            runner.start()
            proc.stdin.write("GO\n")
            proc.stdin.flush()
            done = json.loads(_line(proc, "DONE ", "run"))
            runner.stop()
            rc = proc.wait(DONE_TIMEOUT_S)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        if rc or done["errors"] or done["records"] != a.n:
            raise RuntimeError(f"kafka_native: {done['records']} of {a.n} records, {done['errors']} errors, "
                               f"exit {rc}")
        runner.s1["client"] += done["cpu_s"]
        runner.result.update(native_cpu_s=done["cpu_s"], native_wall_s=done["wall_s"],
                             librdkafka=done["librdkafka"])
        if a.workload == "kafka-consume-native":
            runner.result["received"] = done["records"]
            runner.result["received_bytes"] = done["bytes"]
    finally:
        if not a.keep_stream:
            admin.delete_topics([topic])[topic].result(60)
