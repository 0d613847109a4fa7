"""Riverbed against RabbitMQ Streams: the same workloads, through the same real clients, in one run.

    python -m bench.compare [--n 1000000] [--rounds 3] [--workloads a,b,...] [--keep-rabbitmq]
    make bench-compare ARGS='--n 200000 --rounds 1'

What it does:
1. starts the real RabbitMQ Streams server on this machine (``ci/rabbitmq.sh start``: installs Debian's
   rabbitmq-server if missing, enables rabbitmq_stream, binds 127.0.0.1 only, stream port 5552);
2. starts ``riverbed serve`` on a fresh data directory and a free port, with the fsync policy that
   matches RabbitMQ's durability (``never``: RabbitMQ/Osiris does not fsync per chunk, a confirm means
   "in the page cache"), and a second one with ``--durable-fsync`` (default ``batch``) for the
   separately labelled durable rows;
3. runs every workload against each broker, interleaved (RabbitMQ, Riverbed, RabbitMQ, Riverbed …),
   ``--rounds`` rounds, each run in its own client process (``bench._client``) on a fresh stream that is
   deleted afterwards; a run during which other processes kept more than ``--max-other`` of a core busy
   is repeated (up to ``--max-tries``), and the runs it replaced stay in the JSON marked discarded;
4. stops everything it started (also on Ctrl-C or an error) and prints the table: medians with min–max,
   and Riverbed ÷ RabbitMQ;
5. writes ``bench/results/<date>-<host>.json`` (every raw run) and ``.png`` (bar chart of the ratios,
   error bars from the min–max).

Per run it measures msgs/s and MB/s (bodies), the server's CPU seconds per million messages
(utime+stime of the server's process tree from /proc over the timed window), the client's CPU, the
server's peak RSS (VmRSS sampled every 50 ms during the run) and the machine's other busy CPU
(/proc/stat busy minus server, client and harness).
"""

import argparse
import datetime as dt
import json
import os
import platform
import queue
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time

from bench import _procs
from bench._client import machine_stat

HERE = os.path.dirname(os.path.abspath(__file__))
RESULTS = os.path.join(HERE, "results")

# --------------------------------------------------------------------------------------------------
# workloads: name -> how to run it

W = {
    "publish-rstream-raw": dict(
        label="publish rstream raw send_batch 5k×16", client="rstream-raw", kind="publish"),
    "publish-rbfly-raw-1": dict(
        label="publish rbfly raw, 1 publisher", client="rbfly-raw", kind="publish", publishers=1),
    "publish-rbfly-raw-4": dict(
        label="publish rbfly raw, 4 publishers", client="rbfly-raw", kind="publish", publishers=4),
    "publish-rbfly-amqp-1": dict(
        label="publish rbfly AMQP, 1 publisher", client="rbfly-amqp", kind="publish", publishers=1),
    "publish-rbfly-amqp-4": dict(
        label="publish rbfly AMQP, 4 publishers", client="rbfly-amqp", kind="publish", publishers=4),
    "publish-rbfly-amqp-batch": dict(
        label="publish rbfly AMQP batch publisher", client="rbfly-amqp-batch", kind="publish"),
    "publish-2streams": dict(
        label="publish 2 clients × 2 streams (rstream raw), aggregate", client="rstream-raw", kind="publish",
        procs=2),
    "consume-rstream": dict(label="consume from first, rstream", client="consume-rstream", kind="consume"),
    "consume-rbfly-raw": dict(label="consume from first, rbfly raw", client="consume-rbfly-raw", kind="consume"),
    "consume-rbfly-amqp": dict(
        label="consume from first, rbfly AMQP", client="consume-rbfly-amqp", kind="consume"),
    "latency-rstream": dict(label="confirm latency, rstream send_wait", client="latency-rstream", kind="latency"),
    "latency-rbfly": dict(label="confirm latency, rbfly send", client="latency-rbfly", kind="latency"),
}
DEFAULT_DURABLE = ("publish-rstream-raw", "latency-rstream")

# Goals the ratios are judged against (from the issue).
GOALS = {
    ("publish-rstream-raw", "msgs_per_s"): ("ratio", ">=", 1.3),
    ("publish-rbfly-raw-4", "msgs_per_s"): ("ratio", ">=", 1.3),
    ("consume-rstream", "msgs_per_s"): ("ratio", ">=", 1.0),
    ("consume-rbfly-raw", "msgs_per_s"): ("ratio", ">=", 1.0),
    ("consume-rbfly-amqp", "msgs_per_s"): ("ratio", ">=", 1.0),
    ("latency-rstream", "lat_p50_us"): ("abs", "<=", 150.0),
    ("latency-rstream", "lat_p99_us"): ("abs", "<=", 500.0),
    ("latency-rbfly", "lat_p50_us"): ("abs", "<=", 150.0),
    ("latency-rbfly", "lat_p99_us"): ("abs", "<=", 500.0),
}
for _w, _spec in W.items():
    if _spec["kind"] == "publish":
        GOALS[(_w, "server_us_per_msg")] = ("ratio", "<=", 0.2)

# metric key -> (label, format, higher is better)
METRICS = {
    "msgs_per_s": ("msgs/s", "{:,.0f}", True),
    "mb_per_s": ("MB/s", "{:,.1f}", True),
    "server_us_per_msg": ("server CPU s/M msgs", "{:.2f}", False),
    "client_us_per_msg": ("client CPU s/M msgs", "{:.2f}", False),
    "server_cores": ("server cores busy", "{:.2f}", False),
    "server_peak_rss_mb": ("server peak RSS MB", "{:,.0f}", False),
    "server_peak_anon_mb": ("  of which anon MB", "{:,.0f}", False),
    "lat_p50_us": ("confirm p50 µs", "{:,.0f}", False),
    "lat_p99_us": ("confirm p99 µs", "{:,.0f}", False),
    "lat_max_us": ("confirm max µs", "{:,.0f}", False),
    "other_cores": ("other busy cores", "{:.2f}", False),
}
KIND_METRICS = {
    "publish": ["msgs_per_s", "mb_per_s", "server_us_per_msg", "client_us_per_msg", "server_peak_rss_mb",
                "server_peak_anon_mb"],
    "consume": ["msgs_per_s", "mb_per_s", "server_us_per_msg", "client_us_per_msg", "server_peak_rss_mb",
                "server_peak_anon_mb"],
    "latency": ["lat_p50_us", "lat_p99_us", "lat_max_us", "server_us_per_msg", "server_peak_rss_mb",
                "server_peak_anon_mb"],
}
# the metrics drawn in the chart
CHART = {"publish": ["msgs_per_s", "server_us_per_msg"], "consume": ["msgs_per_s", "server_us_per_msg"],
         "latency": ["lat_p50_us", "lat_p99_us"]}


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
    def __init__(self, pid, every=0.05):
        super().__init__(daemon=True)
        self.pid, self.every = pid, every
        self.peak_kb = 0
        self.peak_anon_kb = 0
        self.halt = threading.Event()

    def sample(self):
        self.peak_kb = max(self.peak_kb, _procs.rss_kb(self.pid))
        # RssAnon: heap and buffers only; VmRSS also counts file pages the server has mapped (Riverbed's
        # LMDB map), which RabbitMQ, reading its segment files with read/sendfile, never has.
        self.peak_anon_kb = max(self.peak_anon_kb, _procs.rss_kb(self.pid, "RssAnon"))

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
    spec = W[wname]
    nprocs = spec.get("procs", 1)
    n = args.n_send if (args.n_send and spec["client"] in ("rbfly-raw", "rbfly-amqp")) else args.n
    tag = f"{os.getpid()}-{rnd}-{attempt}-{int(time.time() * 1000) % 10**8}"
    clients = []
    rec = {"workload": wname, "broker": broker.name, "round": rnd, "attempt": attempt, "n_per_client": n,
           "clients": nprocs, "size": args.size, "started": dt.datetime.now().isoformat(timespec="seconds")}
    try:
        for i in range(nprocs):
            argv = [sys.executable, "-m", "bench._client", spec["client"], "--host", "127.0.0.1",
                    "--port", str(broker.port), "--stream", f"bench-{wname}-{broker.name}-{tag}-{i}",
                    "--n", str(n), "--size", str(args.size), "--batch", str(args.batch),
                    "--inflight", str(args.inflight), "--publishers", str(spec.get("publishers", 1)),
                    "--warmup", str(args.warmup), "--timed", str(args.timed), "--server-pid", str(broker.pid)]
            for o in others:
                argv += ["--idle-pid", str(o.pid)]
            c = ClientProc(argv)
            clients.append(c)
            ACTIVE.add(c)
        # Setup (connect, create, fill) is untimed; every client says READY, then all GO at once.
        setup_deadline = time.monotonic() + 120 + (n / 20_000 if spec["kind"] == "consume" else 0)
        for c in clients:
            c.expect("READY", setup_deadline)
        sampler = RssSampler(broker.pid)
        sampler.start()
        hwm0 = _procs.rss_kb(broker.pid, "VmHWM")
        if on_go is not None:
            on_go()
        for c in clients:
            c.go()
        run_deadline = time.monotonic() + args.run_timeout + n / 1000
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
        rec.update(derive(results, spec["kind"], args.size, peak))
        rec["server_peak_anon_mb"] = sampler.peak_anon_kb / 1024
        rec["ok"] = True
    except Exception as e:   # a failed run is recorded, and the bench goes on
        rec["ok"] = False
        rec["error"] = f"{type(e).__name__}: {e}"
        rec["client_stderr"] = [line for c in clients for line in c.err[-20:]]
    finally:
        for c in clients:
            c.kill()
            ACTIVE.discard(c)
    return rec


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
    }
    if kind == "latency":
        r = results[0]
        m.update({k: r[k] for k in ("lat_p50_us", "lat_p99_us", "lat_max_us", "lat_mean_us")})
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
# summary, table, chart

def summarise(runs, pairs):
    """{(workload, variant): {metric: {med, min, max, values}}} over the kept runs."""
    out = {}
    for wname, bname in pairs:
        kept = [r for r in runs if r["workload"] == wname and r["broker"] == bname and r.get("kept")]
        if not kept:
            continue
        d = {}
        for key in METRICS:
            vals = [r[key] for r in kept if r.get(key) is not None]
            if vals:
                d[key] = {"med": statistics.median(vals), "min": min(vals), "max": max(vals), "values": vals}
        d["noisy_rounds"] = sum(1 for r in kept if r.get("noisy"))
        d["rounds"] = len(kept)
        out[(wname, bname)] = d
    return out


def ratio(a, b):
    """Riverbed ÷ RabbitMQ: ratio of medians, range from min/max to max/min."""
    if not a or not b or a["med"] == 0 or a["min"] == 0:
        return None
    return {"med": b["med"] / a["med"], "min": b["min"] / a["max"], "max": b["max"] / a["min"]}


def goal_check(wname, key, ratio_d, rb):
    g = GOALS.get((wname, key))
    if not g:
        return ""
    how, op, target = g
    val = (ratio_d or {}).get("med") if how == "ratio" else (rb or {}).get("med")
    if val is None:
        return "?"
    ok = val >= target if op == ">=" else val <= target
    text = (f"{op}{target:g}×" if how == "ratio" else f"{op}{target:g}")
    return f"{'met' if ok else 'MISSED'} ({text})"


def fmt_stat(d, fmt):
    if not d:
        return "—"
    if d["min"] == d["max"]:
        return fmt.format(d["med"])
    return f"{fmt.format(d['med'])} ({fmt.format(d['min'])}–{fmt.format(d['max'])})"


def table_rows(summary, rows):
    """rows: [(workload, rabbit variant, riverbed variant, row label)] -> list of table lines."""
    header = ("workload", "metric", "RabbitMQ", "Riverbed", "Riverbed ÷ RabbitMQ", "goal")
    lines = [header]
    for wname, a_name, b_name, label in rows:
        a_all, b_all = summary.get((wname, a_name), {}), summary.get((wname, b_name), {})
        if not a_all and not b_all:
            continue
        first = True
        for key in KIND_METRICS[W[wname]["kind"]]:
            mlabel, fmt, _ = METRICS[key]
            a, b = a_all.get(key), b_all.get(key)
            r = ratio(a, b)
            rtxt = "—" if r is None else (f"{r['med']:.2f} ({r['min']:.2f}–{r['max']:.2f})"
                                          if len(a["values"]) > 1 or len(b["values"]) > 1 else f"{r['med']:.2f}")
            noisy = "*" if (a_all.get("noisy_rounds") or b_all.get("noisy_rounds")) and first else ""
            lines.append((label + noisy if first else "", mlabel, fmt_stat(a, fmt), fmt_stat(b, fmt), rtxt,
                          goal_check(wname, key, r, b) if b_name == "riverbed" else ""))
            first = False
    return lines


def print_table(lines, out=sys.stdout):
    widths = [max(len(str(r[i])) for r in lines) for i in range(len(lines[0]))]
    for j, row in enumerate(lines):
        cells = []
        for i, c in enumerate(row):
            c = str(c)
            cells.append(c.ljust(widths[i]) if i < 2 or i == 5 else c.rjust(widths[i]))
        print("  ".join(cells).rstrip(), file=out)
        if j == 0:
            print("  ".join("-" * w for w in widths), file=out)


def draw_chart(summary, rows, path, title):
    """Two panels of horizontal bars, Riverbed ÷ RabbitMQ (median, whiskers = min–max): throughput
    (higher is better) and server CPU per message / confirm latency (lower is better). Green = goal
    met (or, without a goal, better than parity), orange = better than parity but short of the goal,
    red = worse than parity. Each bar is annotated with the two medians."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [("higher is better — throughput (msgs/s)", ["msgs_per_s"], True),
              ("lower is better — server CPU per message, confirm latency", ["server_us_per_msg", "lat_p50_us",
                                                                              "lat_p99_us"], False)]
    data = []
    for ptitle, keys, higher in panels:
        items = []
        for wname, a_name, b_name, label in rows:
            for key in keys:
                if key not in CHART[W[wname]["kind"]]:
                    continue
                a = summary.get((wname, a_name), {}).get(key)
                b = summary.get((wname, b_name), {}).get(key)
                r = ratio(a, b)
                if r is None:
                    continue
                g = GOALS.get((wname, key)) if b_name == "riverbed" else None
                if g and g[0] == "ratio":
                    goal_ratio, met = g[2], (r["med"] >= g[2] if g[1] == ">=" else r["med"] <= g[2])
                elif g:   # an absolute goal, drawn where it falls relative to RabbitMQ's median
                    goal_ratio, met = g[2] / a["med"], (b["med"] >= g[2] if g[1] == ">=" else b["med"] <= g[2])
                else:
                    goal_ratio, met = None, None
                noisy = summary[(wname, a_name)].get("noisy_rounds") or summary[(wname, b_name)].get("noisy_rounds")
                name = (label if key == "msgs_per_s" else f"{label} — {METRICS[key][0]}") + (" *" if noisy else "")
                fmt = METRICS[key][1]
                note = f"{r['med']:.2f}×  ({fmt.format(b['med'])} vs {fmt.format(a['med'])}"
                if g and g[0] == "abs":
                    note += f"; goal {g[1]}{g[2]:g}"
                note += ")"
                items.append((name, r, goal_ratio, met, note))
        data.append((ptitle, items, higher))
    data = [d for d in data if d[1]]
    if not data:
        return
    heights = [0.42 * len(items) + 1.2 for _, items, _ in data]
    fig, axes = plt.subplots(len(data), 1, figsize=(13, sum(heights) + 1.3),
                             gridspec_kw={"height_ratios": heights}, squeeze=False)
    for ax, (ptitle, items, higher) in zip(axes[:, 0], data):
        ys = list(range(len(items)))[::-1]
        meds = [it[1]["med"] for it in items]
        lo = [max(0.0, it[1]["med"] - it[1]["min"]) for it in items]
        hi = [max(0.0, it[1]["max"] - it[1]["med"]) for it in items]
        colours = []
        for _, r, _, met, _ in items:
            better = r["med"] >= 1.0 if higher else r["med"] <= 1.0
            colours.append("#2b8a3e" if (met if met is not None else better) else
                           ("#e8590c" if better else "#c92a2a"))
        ax.barh(ys, meds, xerr=[lo, hi], color=colours, alpha=0.85, capsize=4, ecolor="#333", height=0.7)
        ax.axvline(1.0, color="black", linewidth=1.2)
        xmax = max(2.0, max(max(it[1]["max"], it[2] or 0) for it in items) * 1.45)
        for y, (_, r, goal, _, note) in zip(ys, items):
            ax.text(r["max"] + xmax * 0.01, y, note, va="center", fontsize=7.5)
            if goal is not None:
                ax.plot([goal, goal], [y - 0.42, y + 0.42], color="#1c7ed6", linewidth=2.5)
        ax.set_yticks(ys)
        ax.set_yticklabels([it[0] for it in items], fontsize=8)
        ax.set_xlim(0, xmax)
        ax.set_title(ptitle, fontsize=10)
        ax.grid(axis="x", alpha=0.3)
    axes[-1, 0].set_xlabel("Riverbed ÷ RabbitMQ — bar: median; whiskers: min–max; black line: parity; blue tick: goal\n"
                           "green: goal met (no goal: better than RabbitMQ); orange: better than RabbitMQ but short "
                           "of the goal; red: worse; * = a kept run was noisy", fontsize=7.5)
    fig.suptitle(title, fontsize=10.5)
    fig.tight_layout(rect=(0, 0, 1, 1 - 0.45 / fig.get_figheight()))
    fig.savefig(path, dpi=110)
    plt.close(fig)


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

    rabbit = _procs.RabbitMQ(port=args.rabbitmq_port, keep=args.keep_rabbitmq, log=log)
    headline = _procs.Riverbed(args.riverbed_fsync, name="riverbed", label=f"Riverbed fsync={args.riverbed_fsync}",
                               log=log)
    durable = (_procs.Riverbed(args.durable_fsync, name=f"riverbed-{args.durable_fsync}",
                               label=f"Riverbed fsync={args.durable_fsync}", log=log)
               if args.durable_list else None)
    started = []
    runs = []
    json_path, png_path = out_paths(args)
    meta = {
        "date": dt.datetime.now().isoformat(timespec="seconds"), "host": socket.gethostname(),
        "cpus": os.cpu_count(), "cpu_model": _cpu_model(), "kernel": platform.release(),
        "loadavg_start": os.getloadavg(), "args": {k: v for k, v in vars(args).items()},
        "clients": versions(),
    }
    bar = None
    try:
        for srv in (rabbit, headline, durable):
            if srv is not None:
                srv.start()
                started.append(srv)
        brokers = [rabbit, headline] + ([durable] if durable else [])
        meta["brokers"] = {b.name: {"label": b.label, "port": b.port, "pid": b.pid, "version": b.version}
                           for b in brokers}
        plan = []
        for rnd in range(1, args.rounds + 1):
            for wname in args.workload_list:
                for b in brokers:
                    if b is durable and wname not in args.durable_list:
                        continue
                    plan.append((rnd, wname, b))
        log(f"{len(plan)} runs: {len(args.workload_list)} workloads × brokers × {args.rounds} rounds, "
            f"N = {args.n:,} × {args.size} B; load average now {os.getloadavg()[0]:.2f}")
        bar = tqdm(total=len(plan), unit="run", dynamic_ncols=True, file=sys.stderr)
        for rnd, wname, b in plan:
            bar.set_postfix_str(f"round {rnd} {wname} @ {b.label}")
            others = [o for o in brokers if o is not b]
            tries = []
            for attempt in range(1, (1 if args.profile else args.max_tries) + 1):
                pre = wait_quiet(args, args.quiet_wait)
                prof = _Profiler(args, b, wname, rnd) if args.profile and b is not rabbit else None
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
    rows = []
    for wname in args.workload_list:
        rows.append((wname, "rabbitmq", "riverbed", W[wname]["label"]))
    for wname in args.durable_list:
        rows.append((wname, "rabbitmq", durable.name, f"{W[wname]['label']} [Riverbed fsync={args.durable_fsync}]"))
    pairs = {(w, b) for w, a_, b_, _ in rows for b in (a_, b_)}
    summary = summarise(runs, pairs)
    lines = table_rows(summary, rows)
    doc = {"meta": meta, "runs": runs,
           "summary": [{"workload": w, "broker": b, **{k: v for k, v in d.items()}}
                       for (w, b), d in sorted(summary.items())],
           "rows": [{"workload": w, "rabbitmq": a_, "riverbed": b_, "label": label,
                     "ratios": {k: ratio(summary.get((w, a_), {}).get(k), summary.get((w, b_), {}).get(k))
                                for k in KIND_METRICS[W[w]["kind"]]}}
                    for w, a_, b_, label in rows],
           "table": [list(r) for r in lines]}
    if runs and meta.get("interrupted") and not args.out:
        json_path = json_path[:-5] + "-interrupted.json"
        png_path = png_path[:-4] + "-interrupted.png"
    if runs:
        os.makedirs(os.path.dirname(os.path.abspath(json_path)), exist_ok=True)
        with open(json_path, "w") as f:
            json.dump(doc, f, indent=1)
        if not args.no_chart and summary:
            title = (f"Riverbed (fsync={args.riverbed_fsync}) ÷ RabbitMQ "
                     f"{(meta.get('brokers') or {}).get('rabbitmq', {}).get('version', '')}\n"
                     f"N = {args.n:,} × {args.size} B"
                     + (f" (rbfly send rows {args.n_send:,})" if args.n_send else "")
                     + f", {args.rounds} round(s), same clients, "
                     f"{meta['host']} ({meta['cpus']} cores), {meta['date'][:10]}")
            draw_chart(summary, rows, png_path, title)
    print()
    print(f"Riverbed (fsync={args.riverbed_fsync}, headline rows) vs RabbitMQ: N = {args.n:,} × {args.size} B"
          + (f" (rbfly one-message-per-frame send rows: {args.n_send:,})" if args.n_send else "")
          + f", {args.rounds} round(s); median (min–max)")
    print_table(lines)
    kept = [r for r in runs if r.get("kept")]
    noisy = [r for r in kept if r.get("noisy")]
    failed = [r for r in runs if not r["ok"]]
    print()
    print(f"{len(runs)} runs, {len(kept)} kept, {len(runs) - len(kept) - len(failed)} repeated for noise, "
          f"{len(failed)} failed" + (f"; * = {len(noisy)} kept run(s) still had other processes above "
                                     f"{args.max_other} of a core" if noisy else ""))
    if runs:
        print(f"raw runs: {os.path.relpath(json_path)}" +
              ("" if args.no_chart or not summary else f"   chart: {os.path.relpath(png_path)}"))
    return 1 if meta.get("interrupted") else 0


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
