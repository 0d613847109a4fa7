"""Riverbed against RabbitMQ Streams, Redis Streams and NATS JetStream: comparable workloads, in one run.

    python -m bench.compare [--n 1000000] [--rounds 3] [--workloads a,b,...] [--peers rabbitmq,redis,nats]
    make bench-compare ARGS='--n 200000 --rounds 1'

What it does:
1. starts the peers (``--peers``, default all), each skipped with a message when it cannot be installed or
   started: the real RabbitMQ Streams server (``ci/rabbitmq.sh start``: installs Debian's rabbitmq-server
   if missing, enables rabbitmq_stream, binds 127.0.0.1 only, stream port 5552), Redis 7
   (``ci/redis.sh``: Debian's redis-server, ``appendonly yes``, ``appendfsync everysec``) and NATS
   (``ci/nats.sh``: Debian's nats-server ``-js``), the last two on free ports in temporary directories;
2. starts ``riverbed serve`` on a fresh data directory and a free port, with the fsync policy that
   matches RabbitMQ's durability (``never``: RabbitMQ/Osiris does not fsync per chunk, a confirm means
   "in the page cache"), and a second one with ``--durable-fsync`` (default ``batch``) for the
   separately labelled durable rows;
3. runs every workload against Riverbed and RabbitMQ (the same real clients; the Kafka rows, ``bench._kafka``
   with confluent-kafka and ``bench._kafka_native`` with librdkafka driven from C, against Riverbed's Kafka
   port, only against Riverbed), and each workload's Redis
   and NATS counterpart (their own clients: ``bench._redis``, ``bench._nats``; the mapping is
   ``bench._workloads.PEER_MAP``), interleaved, ``--rounds`` rounds, each run in its own client process
   (``bench._client``) on a fresh stream that is deleted afterwards; a run during which other processes
   kept more than ``--max-other`` of a core busy is repeated (up to ``--max-tries``), and the runs it
   replaced stay in the JSON marked discarded;
4. stops everything it started (also on Ctrl-C or an error) and prints the table: medians with min–max,
   and Riverbed ÷ each peer ("—" where a row has no counterpart), goals judged against RabbitMQ;
5. writes ``bench/results/<date>-<host>.json`` (every raw run) and ``.png`` (bar chart of the ratios,
   error bars from the min–max).

The cluster rows (``cluster-*``, issue 23; ``bench._cluster``) run each workload on the single node and
on a three-node Riverbed cluster (etcd + three ``riverbed serve --node``, n1 leading, server CPU summed
over the nodes), beside NATS JetStream R3 on three ``nats-server`` when ``nats`` is a peer; the goals
against the single node and NATS R3 (``_workloads.CLUSTER_GOALS``) are printed after the table. No
RabbitMQ cluster is started (one Debian node here).

Per run it measures msgs/s and MB/s (bodies), the server's CPU seconds per million messages
(utime+stime of the server's process tree from /proc over the timed window), the client's CPU, the
server's peak RSS (VmRSS sampled every 50 ms during the run) and the machine's other busy CPU
(/proc/stat busy minus server, client and harness). The ``memory-streams`` workload (Riverbed and
RabbitMQ) creates ``--memory-streams`` streams (RabbitMQ: at most ``--memory-peer-streams``, 1,000), gives
each a publisher and a consumer over ``--memory-connections`` connection pairs (one more per 200 streams
past that), publishes ``--memory-msgs`` to each, waits for every delivery and reports the server's RSS
then (and its peak) and the setup time, against the 150 MB goal at 1,000 streams, and at 10,000 against
issue 26's (``_workloads.use_memory_streams``). After the table come the floors
(``bench._floors``: a bare uvloop echo server, a bare LMDB fsync commit and the engine's in-process append,
each measured once a round in the same run, ``--no-floors`` to skip) and issue 26's goals judged against
them (``_floors.FLOOR_GOALS``); then each Kafka
row's server CPU per record is set beside the RabbitMQ Stream shell's on the same Riverbed
(``_workloads.SAME_LOG``), against issue 24's 1.5× goal.
"""

import argparse
import datetime as dt
import json
import os
import platform
import queue
import signal
import socket
import subprocess
import sys
import threading
import time

from bench import _floors, _kafka_native, _procs, _spark_rows
from bench._client import machine_stat
from bench._cluster import NatsCluster, RiverbedCluster
from bench._report import draw_chart, print_table, row_pairs, row_ratios, summarise, table_rows
from bench._scaleup import RiverbedPair, scaleup_goal_lines, setup_super_stream, teardown_super_stream
from bench._workloads import (CLUSTER_GOALS, CLUSTER_WORKLOADS, DEFAULT_DURABLE, KAFKA_COST_GOAL, METRICS,
                              PEER_MEMORY_STREAMS, use_memory_streams, PEER_LABELS, PEER_MAP, PEER_NAMES, PEER_W,
                              SAME_LOG, SCALEUP_WORKLOADS, W, spec)

HERE = os.path.dirname(os.path.abspath(__file__))
RESULTS = os.path.join(HERE, "results")
SOLO = "riverbed-solo"     # the cluster rows' one-node broker (see ``main``)


def log(msg):
    """Messages go to stderr above the progress bar."""
    try:
        from tqdm import tqdm
        tqdm.write(msg, file=sys.stderr)
    except ImportError:
        print(msg, file=sys.stderr, flush=True)


# --------------------------------------------------------------------------------------------------
# one run

class ClientProc:
    """A ``bench._client`` process, its stdout lines in a queue."""

    def __init__(self, argv):
        self.argv = argv
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True, start_new_session=True, cwd=os.path.dirname(HERE))
        self.lines = queue.Queue()
        self.err = []
        threading.Thread(target=self._out, daemon=True).start()
        threading.Thread(target=self._err, daemon=True).start()

    def _out(self):
        for line in self.proc.stdout:
            self.lines.put(line.rstrip("\n"))
        self.lines.put(None)

    def _err(self):
        for line in self.proc.stderr:
            if len(self.err) < 200:
                self.err.append(line.rstrip("\n"))

    def expect(self, prefix, deadline):
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"no {prefix} from client")
            try:
                line = self.lines.get(timeout=min(left, 1.0))
            except queue.Empty:
                continue
            if line is None:
                self.proc.wait(5)
                raise RuntimeError(f"client exited ({self.proc.returncode}) before {prefix}:\n"
                                   + "\n".join(self.err[-15:]))
            if line.startswith(prefix):
                return line[len(prefix):].strip()

    def go(self):
        self.proc.stdin.write("GO\n")
        self.proc.stdin.flush()

    def finish(self, timeout=120):
        try:
            self.proc.stdin.close()
        except OSError:
            pass
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            _procs.kill_tree(self.proc)
        return self.proc.returncode

    def kill(self):
        _procs.kill_tree(self.proc)


class RssSampler(threading.Thread):
    def __init__(self, pids, every=0.05):
        super().__init__(daemon=True)
        # a cluster: every node's RSS, summed at each sample
        self.pids, self.every = list(pids), every
        self.peak_kb = 0
        self.peak_anon_kb = 0
        self.halt = threading.Event()

    def sample(self):
        self.peak_kb = max(self.peak_kb, sum(_procs.rss_kb(p) for p in self.pids))
        # RssAnon: heap and buffers only; VmRSS also counts file pages the server has mapped (Riverbed's
        # LMDB map), which RabbitMQ, reading its segment files with read/sendfile, never has.
        self.peak_anon_kb = max(self.peak_anon_kb, sum(_procs.rss_kb(p, "RssAnon") for p in self.pids))

    def run(self):
        while not self.halt.is_set():
            self.sample()
            self.halt.wait(self.every)

    def stop(self):
        self.halt.set()
        self.join(2)
        self.sample()
        return self.peak_kb


ACTIVE = set()   # client processes that are running now (stopped on any exit)


def run_once(args, wname, broker, others, rnd, attempt, on_go=None):
    sp = spec(wname)
    nprocs = sp.get("procs", 1)
    if sp["kind"] == "memory":
        n = args.memory_msgs
    else:
        n = args.n_send if (args.n_send and sp["client"] in ("rbfly-raw", "rbfly-amqp")) else args.n
        n = int(n * sp.get("n_scale", 1))
    tag = f"{os.getpid()}-{rnd}-{attempt}-{int(time.time() * 1000) % 10**8}"
    clients = []
    rec = {"workload": wname, "broker": broker.name, "round": rnd, "attempt": attempt, "n_per_client": n,
           "clients": nprocs, "size": args.size, "started": dt.datetime.now().isoformat(timespec="seconds")}
    # the scale-up row: a super stream, one partition per client, each client on its partition's leader
    superstream = f"bench-{wname}-{broker.name}-{tag}" if sp.get("superstream") else None
    ports = None
    try:
        ports = setup_super_stream(broker, superstream, nprocs) if superstream else None
        if ports:
            rec["partition_ports"] = ports
        for i in range(nprocs):
            port = (broker.kafka_port if sp.get("protocol") == "kafka" else ports[i] if ports
                    else broker.client_port(i) if hasattr(broker, "client_port") else broker.port)
            argv = [sys.executable, "-m", "bench._client", sp["client"], "--host", "127.0.0.1",
                    "--port", str(port), "--stream", f"bench-{wname}-{broker.name}-{tag}-{i}",
                    "--n", str(n), "--size", str(args.size), "--batch", str(args.batch),
                    "--inflight", str(args.inflight), "--publishers", str(sp.get("publishers", 1)),
                    "--warmup", str(args.warmup), "--timed", str(args.timed), "--server-pid", str(broker.pid),
                    "--streams", str(memory_streams(args, broker)), "--connections", str(args.memory_connections)]
            # a cluster's other nodes count as the server (their CPU summed in: bench._cluster)
            argv += broker.client_args() if hasattr(broker, "client_args") else []
            argv += ["--keep-stream"] if superstream else []    # the super stream's deletion takes them
            for o in others:
                for pid in getattr(o, "pids", None) or [o.pid]:
                    argv += ["--idle-pid", str(pid)]
            c = ClientProc(argv)
            clients.append(c)
            ACTIVE.add(c)
        # Setup (connect, create, fill) is untimed; every client says READY, then all GO at once.
        setup_deadline = time.monotonic() + 120 + (n / 5_000 if sp["kind"] in ("consume", "spark") else 0) + (
            _spark_rows.SETUP_S if sp["kind"] == "spark" else 0) + (
            memory_streams(args, broker) * 0.1 if sp["kind"] == "memory" else 0)
        for c in clients:
            c.expect("READY", setup_deadline)
        sampler = RssSampler(getattr(broker, "pids", None) or [broker.pid])
        sampler.start()
        hwm0 = _procs.rss_kb(broker.pid, "VmHWM")
        if on_go is not None:
            on_go()
        for c in clients:
            c.go()
        # the memory row: rstream subscribes and closes its subscriptions one at a time (~10 ms each here)
        run_deadline = time.monotonic() + args.run_timeout + n / 1000 + (
            memory_streams(args, broker) * 0.1 if sp["kind"] == "memory" else 0)
        results = []
        try:
            for c in clients:
                results.append(json.loads(c.expect("RESULT", run_deadline)))
        finally:
            peak = sampler.stop()
            if on_go is not None:
                on_go(stop=True)
        for c in clients:
            c.finish()
        rec["results"] = results
        rec["server_peak_rss_kb"] = peak
        rec["server_peak_anon_kb"] = sampler.peak_anon_kb
        rec["server_vmhwm_kb"] = max(hwm0, _procs.rss_kb(broker.pid, "VmHWM"))
        rec.update(derive(results, sp["kind"], args.size, peak))
        rec["server_peak_anon_mb"] = sampler.peak_anon_kb / 1024
        rec["ok"] = True
    except Exception as e:   # a failed run is recorded, and the bench goes on
        rec["ok"] = False
        rec["error"] = f"{type(e).__name__}: {e}"
        rec["client_stderr"] = [line for c in clients for line in c.err[-20:]]
        # the broker's side of it (a closed connection is only explained there)
        rec["server_log"] = list(getattr(broker, "lines", ()))[-30:]
    finally:
        for c in clients:
            c.kill()
            ACTIVE.discard(c)
        if superstream:
            try:
                teardown_super_stream(broker, superstream)
            except Exception as e:   # the broker is gone (a failed run): nothing left to delete
                rec.setdefault("cleanup_error", f"{type(e).__name__}: {e}")
    return rec


def memory_streams(args, broker):
    """Streams of the memory row on ``broker``: ``--memory-streams`` on Riverbed, at most
    ``--memory-peer-streams`` on RabbitMQ (issue 26 judges Riverbed at 10,000 against RabbitMQ at 1,000)."""
    if broker.name == "rabbitmq":
        return min(args.memory_streams, args.memory_peer_streams)
    return args.memory_streams


def derive(results, kind, size, peak_kb):
    """Metrics of one run from the clients' snapshots (one or more clients at once)."""
    t0 = min(r["s0"]["t"] for r in results)
    t1 = max(r["s1"]["t"] for r in results)
    first = min(results, key=lambda r: r["s0"]["t"])["s0"]
    last = max(results, key=lambda r: r["s1"]["t"])["s1"]
    wall = t1 - t0
    n = sum(r["n"] for r in results)
    server = last["server"] - first["server"]
    client = sum(r["s1"]["client"] - r["s0"]["client"] for r in results)
    harness = last["harness"] - first["harness"]
    idle = last["idle_brokers"] - first["idle_brokers"]
    busy = last["stat"]["busy"] - first["stat"]["busy"]
    irq = last["stat"]["irq"] - first["stat"]["irq"]
    steal = last["stat"]["steal"] - first["stat"]["steal"]
    other = max(0.0, busy - server - client - harness)
    m = {
        "wall_s": wall, "n": n,
        "msgs_per_s": n / wall, "mb_per_s": n * size / wall / 1e6,
        "server_cpu_s": server, "server_us_per_msg": server / n * 1e6, "server_cores": server / wall,
        "client_cpu_s": client, "client_us_per_msg": client / n * 1e6, "client_cores": client / wall,
        "harness_cores": harness / wall, "idle_broker_cores": idle / wall,
        "other_cores": other / wall, "irq_cores": irq / wall, "steal_cores": steal / wall,
        "server_peak_rss_mb": peak_kb / 1024,
        # per server process (a cluster: the node the client speaks to first, then the others)
        "server_node_cpu_s": [b - a for a, b in zip(first.get("server_nodes", []), last.get("server_nodes", []))],
    }
    if kind == "latency":
        r = results[0]
        m.update({k: r.get(k) for k in ("lat_p50_us", "lat_p99_us", "lat_p999_us", "lat_max_us", "lat_mean_us")})
    elif kind == "memory":
        r = results[0]
        m.update(server_rss_mb=r["server_rss_kb"] / 1024, server_anon_mb=r["server_anon_kb"] / 1024,
                 setup_s=r["setup_s"], streams=r["streams"])
    elif kind == "spark":
        m.update(_spark_rows.metrics(results))
    return m


def wait_quiet(args, budget):
    """Wait (up to ``budget`` s) until everything but this harness (idle brokers included: they count as
    noise during a run too) uses less than --max-other of a core over 1 s. Returns what it saw."""
    deadline = time.monotonic() + budget
    while True:
        s0, c0, t0 = machine_stat(), _self_cpu(), time.monotonic()
        time.sleep(1.0)
        s1, c1, t1 = machine_stat(), _self_cpu(), time.monotonic()
        seen = max(0.0, (s1["busy"] - s0["busy"]) - (c1 - c0)) / (t1 - t0)
        if seen <= args.max_other or time.monotonic() >= deadline:
            return seen


def _self_cpu():
    t = os.times()
    return t.user + t.system


# --------------------------------------------------------------------------------------------------

def parse_args(argv=None):
    ap = argparse.ArgumentParser(prog="python -m bench.compare", description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=1_000_000, help="messages per run and client (default 1,000,000)")
    ap.add_argument("--n-send", type=int,
                    help="messages per run for the one-message-per-frame rbfly send workloads (stop-and-wait, "
                         "so latency-bound; default: --n)")
    ap.add_argument("--size", type=int, default=100, help="body size in bytes (default 100)")
    ap.add_argument("--rounds", type=int, default=3, help="rounds of every workload × broker (default 3)")
    ap.add_argument("--workloads", default="all",
                    help="comma-separated names, or all; choose from: " + ", ".join(W))
    ap.add_argument("--batch", type=int, default=5000, help="messages per batch (default 5,000)")
    ap.add_argument("--inflight", type=int, default=16, help="rstream batches in flight (default 16)")
    ap.add_argument("--warmup", type=int, default=100, help="latency: untimed messages first (default 100)")
    ap.add_argument("--timed", type=int, default=5000, help="latency: timed messages (default 5,000)")
    ap.add_argument("--riverbed-fsync", default="never",
                    help="Riverbed's policy for the headline rows (default never = RabbitMQ's durability)")
    ap.add_argument("--durable-fsync", default="batch",
                    help="policy of the separately labelled durable Riverbed rows (always|batch; none = skip)")
    ap.add_argument("--durable-workloads", default=",".join(DEFAULT_DURABLE),
                    help="workloads that also run against the durable Riverbed (default: %(default)s)")
    ap.add_argument("--max-other", type=float, default=0.15,
                    help="repeat a run if other processes used more than this many cores (default 0.15)")
    ap.add_argument("--max-tries", type=int, default=4, help="attempts per run before keeping the quietest")
    ap.add_argument("--quiet-wait", type=float, default=30.0,
                    help="seconds to wait for a quiet machine before each run (default 30)")
    ap.add_argument("--run-timeout", type=float, default=300.0, help="seconds per run, plus 1 ms per message")
    ap.add_argument("--peers", default=",".join(PEER_NAMES),
                    help="the brokers beside Riverbed, comma-separated (default %(default)s; none = Riverbed only)")
    ap.add_argument("--memory-streams", type=int, default=1000,
                    help="memory-streams: streams, each with a publisher and a consumer (default 1,000)")
    ap.add_argument("--memory-connections", type=int, default=10,
                    help="memory-streams: rstream Producer + Consumer connection pairs, at least (default 10; "
                         "one more pair per 200 streams past that, rstream's limit per connection)")
    ap.add_argument("--memory-peer-streams", type=int, default=PEER_MEMORY_STREAMS,
                    help="memory-streams: RabbitMQ runs the row with at most this many streams (default "
                         "%(default)s; issue 26's goal: Riverbed at 10,000 against RabbitMQ at 1,000)")
    ap.add_argument("--memory-msgs", type=int, default=10, help="memory-streams: messages per stream (default 10)")
    ap.add_argument("--floors", action=argparse.BooleanOptionalAction, default=True,
                    help="measure the floors (bench._floors: uvloop echo, LMDB fsync, engine append) once a "
                         "round and judge issue 26's floor goals (default on)")
    ap.add_argument("--floor-messages", type=int, default=20000, help="loop floor: round trips (default 20,000)")
    ap.add_argument("--floor-commits", type=int, default=2000, help="fsync floor: synced commits (default 2,000)")
    ap.add_argument("--floor-records", type=int, default=1_000_000,
                    help="append floor: records appended in process (default 1,000,000)")
    ap.add_argument("--rabbitmq-port", type=int, default=5552)
    ap.add_argument("--keep-rabbitmq", action="store_true", help="leave RabbitMQ running at the end")
    ap.add_argument("--out", help="results path without extension (default bench/results/<date>-<host>)")
    ap.add_argument("--no-chart", action="store_true")
    ap.add_argument("--profile", metavar="DIR",
                    help="py-spy the Riverbed server during its runs into DIR (runs are then not retried)")
    ap.add_argument("--profile-native", action="store_true", help="py-spy --native (C and Cython frames too)")
    a = ap.parse_args(argv)
    if a.workloads == "all":
        a.workload_list = list(W)
    else:
        a.workload_list = [w.strip() for w in a.workloads.split(",") if w.strip()]
        bad = [w for w in a.workload_list if w not in W]
        if bad:
            ap.error(f"unknown workloads {bad}; choose from {', '.join(W)}")
    a.peer_list = [] if a.peers.strip() == "none" else [p.strip() for p in a.peers.split(",") if p.strip()]
    bad = [p for p in a.peer_list if p not in PEER_NAMES]
    if bad:
        ap.error(f"unknown peers {bad}; choose from {', '.join(PEER_NAMES)} (or none)")
    a.peer_list = [p for p in PEER_NAMES if p in a.peer_list]   # column order
    if a.memory_connections < 1 or min(a.memory_streams, a.memory_peer_streams) < a.memory_connections:
        ap.error("--memory-streams and --memory-peer-streams must be at least --memory-connections (>= 1)")
    use_memory_streams(a.memory_streams, a.memory_peer_streams)
    a.durable_list = [] if a.durable_fsync == "none" else [
        w.strip() for w in a.durable_workloads.split(",") if w.strip() in a.workload_list]
    return a


def out_paths(args):
    if args.out:
        base = args.out
    else:
        os.makedirs(RESULTS, exist_ok=True)
        stem = f"{dt.date.today().isoformat()}-{socket.gethostname().split('.')[0]}"
        base = os.path.join(RESULTS, stem)
        k = 2
        while os.path.exists(base + ".json"):
            base = os.path.join(RESULTS, f"{stem}-{k}")
            k += 1
    return base + ".json", base + ".png"


def versions():
    v = {"python": platform.python_version()}
    for mod in ("rstream", "rbfly", "matplotlib", "tqdm"):
        try:
            from importlib.metadata import version
            v[mod] = version(mod)
        except Exception:
            v[mod] = None
    return v


class _Terminate(BaseException):
    pass


def _on_term(signum, frame):
    raise _Terminate(f"signal {signum}")


def main(argv=None):
    args = parse_args(argv)
    from tqdm import tqdm

    _procs.become_subreaper()
    signal.signal(signal.SIGTERM, _on_term)
    signal.signal(signal.SIGHUP, _on_term)
    signal.signal(signal.SIGINT, signal.default_int_handler)   # even if started with SIGINT ignored

    from bench._nats import Nats
    from bench._redis import Redis
    servers = {"rabbitmq": lambda: _procs.RabbitMQ(port=args.rabbitmq_port, keep=args.keep_rabbitmq, log=log),
               "redis": lambda: Redis(log=log), "nats": lambda: Nats(log=log)}
    peers = {name: servers[name]() for name in args.peer_list}
    headline = _procs.Riverbed(args.riverbed_fsync, name="riverbed", label=f"Riverbed fsync={args.riverbed_fsync}",
                               log=log)
    durable = (_procs.Riverbed(args.durable_fsync, name=f"riverbed-{args.durable_fsync}",
                               label=f"Riverbed fsync={args.durable_fsync}", log=log)
               if args.durable_list else None)
    # the cluster rows' brokers (bench._cluster), only when a cluster workload runs
    want_cluster = any(w in CLUSTER_WORKLOADS for w in args.workload_list)
    rb_cluster = RiverbedCluster(log=log) if want_cluster else None
    # the cluster rows' one-node half runs on a node of its own, started as the cluster's nodes are and
    # running only the cluster rows: the same history, so the same page state. On the headline node it ran
    # right after the Kafka rows had deleted their topics, into pages LMDB reuses (0.25 µs per message
    # there against 0.43 for the same workload on fresh pages in the same run), while the cluster's nodes
    # write fresh pages, which this VM makes costly to touch first (bench/results/2026-11-26-kprod.md)
    solo = (_procs.Riverbed(args.riverbed_fsync, name=SOLO, label=f"Riverbed one node for the cluster rows "
                            f"(fsync={args.riverbed_fsync})", log=log) if want_cluster else None)
    replicated = {"nats-r3": NatsCluster(log=log)} if want_cluster and "nats" in peers else {}
    rb_pair = RiverbedPair(log=log) if any(w in SCALEUP_WORKLOADS for w in args.workload_list) else None
    started = []
    runs = []
    floor_samples = []
    json_path, png_path = out_paths(args)
    meta = {
        "date": dt.datetime.now().isoformat(timespec="seconds"), "host": socket.gethostname(),
        "cpus": os.cpu_count(), "cpu_model": _cpu_model(), "kernel": platform.release(),
        "loadavg_start": os.getloadavg(), "args": {k: v for k, v in vars(args).items()},
        "clients": versions(), "skipped_peers": {},
    }
    # the native Kafka rows need their C client built (untimed, once): without a compiler or librdkafka's
    # header they are left out, and the reason is printed
    args.workload_list, meta["skipped_native"] = _kafka_native.prepare(args.workload_list, log)
    args.workload_list, meta["skipped_spark"] = _spark_rows.prepare(args.workload_list, log)
    bar = None
    try:
        for name, srv in list(peers.items()):
            try:
                srv.start()
            except Exception as e:   # a peer that cannot be installed or started is skipped, and said so
                msg = str(e).strip().splitlines()
                meta["skipped_peers"][name] = " ".join(msg[-3:])[:500]
                log(f"skipping {PEER_LABELS[name]}: could not install or start it: {meta['skipped_peers'][name]}")
                del peers[name]
                continue
            started.append(srv)
        for srv in (headline, durable, solo):
            if srv is not None:
                srv.start()
                started.append(srv)
        if rb_cluster is not None:
            try:
                rb_cluster.start()
                started.append(rb_cluster)
            except Exception as e:   # no etcd here: the cluster rows keep only their single-node half
                meta["skipped_cluster"] = " ".join(str(e).strip().splitlines()[-3:])[:500]
                log(f"skipping the 3-node Riverbed cluster: {meta['skipped_cluster']}")
                rb_cluster = None
        if rb_pair is not None:
            try:
                rb_pair.start()
                started.append(rb_pair)
            except Exception as e:   # no etcd here: the scale-up row keeps only its single-node half
                meta["skipped_pair"] = " ".join(str(e).strip().splitlines()[-3:])[:500]
                log(f"skipping the 2-node Riverbed: {meta['skipped_pair']}")
                rb_pair = None
        for name, srv in list(replicated.items()):
            try:
                srv.start()
            except Exception as e:
                msg = " ".join(str(e).strip().splitlines()[-3:])[:500]
                meta["skipped_peers"][name] = msg
                log(f"skipping {srv.label}: could not start it: {msg}")
                del replicated[name]
                continue
            started.append(srv)
        rabbit = peers.get("rabbitmq")
        brokers = (list(peers.values()) + [headline] + ([durable] if durable else []) + ([solo] if solo else [])
                   + ([rb_cluster] if rb_cluster else []) + ([rb_pair] if rb_pair else [])
                   + list(replicated.values()))
        meta["brokers"] = {b.name: {"label": b.label, "port": b.port, "pid": b.pid, "version": b.version}
                           for b in brokers}
        plan = []
        for rnd in range(1, args.rounds + 1):
            done = set()
            for wname in args.workload_list:
                on_rabbit = rabbit and W[wname].get("rabbitmq", True)
                one = solo if W[wname].get("cluster") and solo is not None else headline
                for b in ([rabbit] if on_rabbit else []) + [one] + ([durable] if durable else []):
                    if b is durable and wname not in args.durable_list:
                        continue
                    plan.append((rnd, wname, b))
                if W[wname].get("cluster") and rb_cluster is not None:
                    plan.append((rnd, wname, rb_cluster))
                if W[wname].get("scaleup") and rb_pair is not None:
                    plan.append((rnd, wname, rb_pair))
                for name, srv in peers.items():
                    pw = PEER_MAP.get(wname, {}).get(name)
                    if pw and PEER_W[pw].get("server"):    # a replicated peer: its own cluster of servers
                        srv = replicated.get(PEER_W[pw]["server"])
                        if srv is None:
                            continue
                    if pw and pw not in done:   # a peer workload mapped from several rows runs once a round
                        done.add(pw)
                        plan.append((rnd, pw, srv))
        log(f"{len(plan)} runs: {len(args.workload_list)} workloads × brokers × {args.rounds} rounds, "
            f"N = {args.n:,} × {args.size} B; load average now {os.getloadavg()[0]:.2f}")
        bar = tqdm(total=len(plan), unit="run", dynamic_ncols=True, file=sys.stderr)
        floor_round = 0
        for rnd, wname, b in plan:
            if args.floors and rnd != floor_round:
                # the floors of this round, measured while no broker is busy (bench._floors)
                floor_round = rnd
                bar.set_postfix_str(f"round {rnd} floors")
                wait_quiet(args, args.quiet_wait)
                try:
                    floor_samples.append(_floors.measure(rnd, args.floor_messages, args.floor_commits,
                                                         args.floor_records, _floors.data_fs_dir()))
                except Exception as e:   # a floor that cannot run costs its goals, not the run
                    log(f"floors: could not measure them ({e}); their goals are not judged")
                    args.floors = False
            bar.set_postfix_str(f"round {rnd} {wname} @ {b.label}")
            others = [o for o in brokers if o is not b]
            tries = []
            for attempt in range(1, (1 if args.profile else args.max_tries) + 1):
                if W.get(wname, {}).get("kind") == "memory" and b in (headline, durable):
                    # the memory row measures a broker holding 1,000 streams, not the LMDB map pages an
                    # earlier row's millions of records left mapped into the long-running server (file
                    # pages, counted in its RSS): it gets a server of its own, on a fresh data directory
                    b.stop()
                    b.start()
                pre = wait_quiet(args, args.quiet_wait)
                prof = _Profiler(args, b, wname, rnd) if args.profile and b in (headline, durable) else None
                rec = run_once(args, wname, b, others, rnd, attempt, on_go=prof)
                if prof and prof.out:
                    rec["profile"] = prof.out
                rec["pre_run_other_cores"] = pre
                rec["broker_label"] = b.label
                tries.append(rec)
                runs.append(rec)
                if not rec["ok"]:
                    log(f"run failed: round {rnd} {wname} @ {b.label}: {rec['error']}")
                    break
                if rec["other_cores"] <= args.max_other or args.profile:
                    break
                log(f"noisy: round {rnd} {wname} @ {b.label}: other processes used "
                    f"{rec['other_cores']:.2f} cores; repeating")
            good = [r for r in tries if r["ok"]]
            if good:
                quiet = [r for r in good if r["other_cores"] <= args.max_other]
                best = quiet[-1] if quiet else min(good, key=lambda r: r["other_cores"])
                best["kept"] = True
                best["noisy"] = best["other_cores"] > args.max_other and not args.profile
                for r in tries:
                    r.setdefault("kept", False)
            bar.update(1)
        bar.close()
        bar = None
    except (KeyboardInterrupt, _Terminate) as e:
        log(f"interrupted ({str(e) or 'Ctrl-C'}); stopping everything")
        meta["interrupted"] = True
    finally:
        # Cleanup must not be cut short by a second Ctrl-C or a TERM.
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, signal.SIG_IGN)
        if bar is not None:
            bar.close()
        for c in list(ACTIVE):
            c.kill()
        for srv in reversed(started):
            try:
                srv.stop()
            except Exception as e:   # keep stopping the others
                log(f"could not stop {srv.label}: {e}")
        _procs.reap_orphans()

    meta["loadavg_end"] = os.getloadavg()
    up = [p for p in PEER_NAMES if p in peers]
    rows = table_layout(args.workload_list, args.durable_list, durable.name if durable else None,
                        args.durable_fsync, peers, solo=SOLO if solo is not None else "riverbed")
    summary = summarise(runs, row_pairs(rows))
    lines = table_rows(summary, rows, up)
    same_log = same_log_costs(summary)
    cluster_goals = (cluster_goal_lines(summary, RiverbedCluster.name, NatsCluster.name,
                                        solo=SOLO if solo is not None else "riverbed") if want_cluster else [])
    scaleup_goals = scaleup_goal_lines(summary)
    floors = _floors.medians(floor_samples) if floor_samples else {}
    floor_goals = _floors.floor_goal_lines(summary, floors, durable.name if durable else "") if floors else []
    doc = {"meta": meta, "runs": runs, "same_log": same_log, "cluster_goals": cluster_goals,
           "floor_samples": floor_samples, "floors": floors, "floor_goals": floor_goals,
           "scaleup_goals": scaleup_goals,
           "summary": [{"workload": w, "broker": b, **{k: v for k, v in d.items()}}
                       for (w, b), d in sorted(summary.items())],
           "rows": [dict(row, ratios=row_ratios(summary, row)) for row in rows],
           "table": [list(r) for r in lines]}
    if runs and meta.get("interrupted") and not args.out:
        json_path = json_path[:-5] + "-interrupted.json"
        png_path = png_path[:-4] + "-interrupted.png"
    versions_txt = ", ".join(f"{PEER_LABELS[p]} {_short_version(meta, p)}" for p in up) or "no peer"
    if runs:
        os.makedirs(os.path.dirname(os.path.abspath(json_path)), exist_ok=True)
        with open(json_path, "w") as f:
            json.dump(doc, f, indent=1)
        if not args.no_chart and summary:
            title = (f"Riverbed (fsync={args.riverbed_fsync}) ÷ {versions_txt}\n"
                     f"N = {args.n:,} × {args.size} B"
                     + (f" (rbfly send rows {args.n_send:,})" if args.n_send else "")
                     + f", {args.rounds} round(s), each broker with its own client, "
                     f"{meta['host']} ({meta['cpus']} cores), {meta['date'][:10]}")
            draw_chart(summary, rows, up, png_path, title)
    print()
    print(f"Riverbed (fsync={args.riverbed_fsync}, headline rows) vs {versions_txt}: N = {args.n:,} × {args.size} B"
          + (f" (rbfly one-message-per-frame send rows: {args.n_send:,})" if args.n_send else "")
          + f", {args.rounds} round(s); median (min–max)")
    print_table(lines)
    print()
    if floors:
        print(f"Floors (bench/_floors.py; median (min–max) of {len(floor_samples)} sample(s), one a round, µs):")
        for line in _floors.floor_text(floors):
            print("  " + line)
        print("Issue 26's goals against the floors (medians):")
        for g in floor_goals:
            print("  " + g["text"])
    for g in scaleup_goals:
        print("Scale-up (issue 26, one node per core): " + g["text"])
    if meta.get("skipped_pair"):
        print(f"Scale-up: the 2-node Riverbed was not started ({meta['skipped_pair']})")
    for s in same_log:
        print(f"{W[s['workload']]['label']}: server CPU {s['kafka_us']:.2f} µs/record vs {s['rmq_us']:.2f} over "
              f"RabbitMQ Stream ({s['rmq_workload']}) on the same Riverbed: {s['ratio']:.2f}× "
              f"(goal <= {KAFKA_COST_GOAL}×: {'met' if s['ratio'] <= KAFKA_COST_GOAL else 'NOT met'})")
    if cluster_goals:
        print("Cluster rows (issue 23's goals; 3 nodes ÷ one node, 3 nodes ÷ NATS R3; server CPU summed over "
              "the nodes; medians):")
        for g in cluster_goals:
            print("  " + g["text"])
        if meta.get("skipped_cluster"):
            print(f"  Riverbed cluster: not started ({meta['skipped_cluster']})")
        print("  RabbitMQ: no three-node cluster is started here (one Debian RabbitMQ 3.10 node, no Docker), "
              "so the cluster rows have no RabbitMQ column.")
    for p in up:
        if p != "rabbitmq":
            print(f"{PEER_LABELS[p]} column (its own client, bench/_{p}.py): "
                  + "; ".join(f"{sp['label']} ({sp['kind']} rows)" for sp in PEER_W.values() if sp["peer"] == p))
    for p, why in meta["skipped_peers"].items():
        print(f"{PEER_LABELS[p]}: skipped, it could not be installed or started ({why})")
    if meta["skipped_native"]:
        print(f"Native Kafka rows ({', '.join(_kafka_native.WORKLOADS)}): left out ({meta['skipped_native']})")
    for line in _spark_rows.report_lines(summary, meta["skipped_spark"]):
        print(line)
    kept = [r for r in runs if r.get("kept")]
    noisy = [r for r in kept if r.get("noisy")]
    failed = [r for r in runs if not r["ok"]]
    print(f"{len(runs)} runs, {len(kept)} kept, {len(runs) - len(kept) - len(failed)} repeated for noise, "
          f"{len(failed)} failed" + (f"; * = {len(noisy)} kept run(s) still had other processes above "
                                     f"{args.max_other} of a core" if noisy else ""))
    if runs:
        print(f"raw runs: {os.path.relpath(json_path)}" +
              ("" if args.no_chart or not summary else f"   chart: {os.path.relpath(png_path)}"))
    return 1 if meta.get("interrupted") else 0



def table_layout(workload_list, durable_list, durable_name, durable_fsync, peers, solo=SOLO):
    """The table's rows, in order: ``{"workload", "riverbed" (the Riverbed broker's name), "label",
    "cols" ({peer: (peer workload, peer broker)})}``. A cluster or scale-up workload has two rows (one
    node, then the cluster); each durable workload gets one more row on the durable Riverbed, a copy of
    its single-node row. ``solo``: the cluster rows' one-node broker (``SOLO``; "riverbed", the headline
    node, in results made before it had its own)."""
    rows = []
    for wname in workload_list:
        if W[wname].get("cluster"):
            # one row on the single node, one on the cluster beside NATS R3
            rows.append({"workload": wname, "riverbed": solo, "label": W[wname]["label"] + " [one node]",
                         "cols": {}})
            cols = {p: (pw, PEER_W[pw]["server"]) for p, pw in PEER_MAP.get(wname, {}).items() if p in peers}
            rows.append({"workload": wname, "riverbed": RiverbedCluster.name, "cols": cols,
                         "label": W[wname]["label"] + " [3 nodes, R3]"})
            continue
        if W[wname].get("scaleup"):
            rows.append({"workload": wname, "riverbed": "riverbed", "label": W[wname]["label"] + " [one node]",
                         "cols": {}})
            rows.append({"workload": wname, "riverbed": RiverbedPair.name, "cols": {},
                         "label": W[wname]["label"] + " [2 nodes]"})
            continue
        cols = {"rabbitmq": (wname, "rabbitmq")} if "rabbitmq" in peers and W[wname].get("rabbitmq", True) else {}
        cols.update({p: (pw, p) for p, pw in PEER_MAP.get(wname, {}).items() if p in peers})
        rows.append({"workload": wname, "riverbed": "riverbed", "label": W[wname]["label"], "cols": cols})
    for wname in durable_list if durable_name else ():
        # the workload's own single-node row (not the list index: cluster rows come in pairs)
        base = next(r for r in rows if r["workload"] == wname and r["riverbed"] == "riverbed")
        rows.append(dict(base, riverbed=durable_name, label=f"{W[wname]['label']} [Riverbed fsync={durable_fsync}]"))
    return rows

def same_log_costs(summary):
    """The Kafka rows' server CPU per record beside the RabbitMQ Stream shell's on the same Riverbed
    (``SAME_LOG``; medians): a list of dicts, one per Kafka row that ran with a counterpart."""
    out = []
    for kafka, candidates in SAME_LOG.items():
        k = summary.get((kafka, "riverbed"), {}).get("server_us_per_msg")
        for rmq in candidates:
            r = summary.get((rmq, "riverbed"), {}).get("server_us_per_msg")
            if k and r and r["med"]:
                out.append({"workload": kafka, "kafka_us": k["med"], "rmq_workload": rmq, "rmq_us": r["med"],
                            "ratio": k["med"] / r["med"]})
                break
    return out


def cluster_goal_lines(summary, cluster, nats_r3, solo=SOLO):
    """Issue 23's goals of the cluster rows (``CLUSTER_GOALS``) judged on medians: one dict per
    (workload, metric): the three figures, each goal's ratio and verdict (ok None when a side did not
    run) and a printable ``text``."""
    out = []
    for (wname, key), goals in CLUSTER_GOALS.items():
        label, fmt, _ = METRICS[key]
        rb3 = summary.get((wname, cluster), {}).get(key)
        one = summary.get((wname, solo), {}).get(key)
        pw = PEER_MAP.get(wname, {}).get("nats")
        nats = summary.get((pw, nats_r3), {}).get(key) if pw else None
        if not rb3 and not one:
            continue
        def show(d):
            return fmt.format(d["med"]) if d else "—"
        text = f"{wname} {label}: 3 nodes {show(rb3)}, one node {show(one)}, NATS R3 {show(nats)}"
        per_round = None
        if rb3 and one and one["med"]:
            text += f"; 3 nodes ÷ one node {rb3['med'] / one['med']:.2f}×"
            # each round's own ratio beside the ratio of the medians: both sides ran once a round, one after
            # the other, so these pairs share a moment of this machine's drift (values are in round order)
            a, b = rb3.get("values") or [], one.get("values") or []
            if len(a) == len(b) > 1 and all(b):
                per_round = [x / y for x, y in zip(a, b)]
        judged = []
        for against, op, target in goals:
            other = one if against == "single" else nats
            r = rb3["med"] / other["med"] if rb3 and other and other["med"] else None
            ok = None if r is None else (r >= target if op == ">=" else r > target if op == ">" else r <= target)
            judged.append({"against": against, "op": op, "target": target, "ratio": r, "ok": ok})
            what = "one node" if against == "single" else "NATS R3"
            text += (f"; goal {op}{target:g}× {what}: "
                     + ("? (not run)" if ok is None else f"{'met' if ok else 'MISSED'} ({r:.2f}×)"))
        if per_round:
            text += "; each round ÷ one node: " + ", ".join(f"{x:.2f}" for x in per_round)
        out.append({"workload": wname, "metric": key, "cluster": rb3 and rb3["med"], "one_node": one and one["med"],
                    "nats_r3": nats and nats["med"], "goals": judged, "per_round": per_round, "text": text})
    return out


def _short_version(meta, peer):
    v = (meta.get("brokers") or {}).get(peer, {}).get("version") or ""
    parts = v.split()
    return parts[1].split("-")[0].split(":")[-1] if len(parts) > 1 else ""


def _cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


class _Profiler:
    """py-spy on the Riverbed server over one run's timed window (from GO to the last RESULT)."""

    def __init__(self, args, broker, wname, rnd):
        self.args, self.broker = args, broker
        self.path = os.path.join(args.profile, f"{wname}-{broker.name}-r{rnd}.txt")
        self.proc = None
        self.out = None

    def __call__(self, stop=False):
        if not stop:
            os.makedirs(self.args.profile, exist_ok=True)
            pyspy = os.path.join(os.path.dirname(sys.executable), "py-spy")
            cmd = [pyspy, "record", "-p", str(self.broker.pid), "-r", "250", "-f", "raw", "--threads",
                   "-o", self.path] + (["--native"] if self.args.profile_native else [])
            self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                         start_new_session=True)
            ACTIVE.add(_Killable(self.proc))
            time.sleep(0.3)   # py-spy attaches
        elif self.proc is not None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(30)
                self.out = self.path
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


class _Killable:
    def __init__(self, p):
        self.p = p

    def kill(self):
        if self.p.poll() is None:
            self.p.kill()
            self.p.wait()


if __name__ == "__main__":
    sys.exit(main())
