"""What a three-node cluster costs per published message and at rest, counted (issue 23's CPU goal).

etcd and three ``riverbed serve --node`` processes on loopback (the cluster tests' helpers, as
``bench._cluster`` starts them: ``--fsync never``, lease TTL 2 s), n1 leading one stream
(``queue-leader-locator=client-local``), published through n1 with rstream ``send_batch`` (5,000 x 100 B
per call, 16 calls in flight, as the bench's cluster rows). The client runs in this process; its CPU is
not counted.

    python -m bench.cluster_cost publish --n 20000 [--callgrind DIR]  # per node: instructions (or CPU) per message
    python -m bench.cluster_cost idle --seconds 30 [--callgrind DIR]  # per node: CPU (or instructions) at rest
    python -m bench.cluster_cost single --n 20000 [--callgrind DIR]   # the same client against one lone node
    python -m bench.cluster_cost single-idle --seconds 30             # one lone node at rest

With ``--callgrind DIR`` every server runs under ``valgrind --tool=callgrind --instr-atstart=no``;
collection is switched on (``callgrind_control -i on``) just before the timed part and off one second
after its last confirm, so start-up and stream creation are not counted but everything time-driven
during the window is (valgrind stretches the window some 30-50x: a clock-driven cost weighs far more
per message here than at full speed). ``--py-spy DIR`` records each node with py-spy during the timed
part (raw collapsed stacks); ``--strace DIR`` counts each node's system calls (``strace -c``, every thread)
during it (strace slows the nodes: read its counts, not the CPU figures of that run); ``--perf DIR`` samples
each node with ``perf record -e cpu-clock`` (kernel and native frames: copies, page faults). Prints one JSON
document, with each node's user and system CPU apart (``user_sys_us_per_msg``) and its minor page faults
(``minor_faults_per_kmsg``: on this VM a fresh page of LMDB's map costs ~6.5 µs to fault in and zero), and
each node's anonymous memory at the end (``rss_anon_mb``).
"""

import argparse
import asyncio
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench._client import publish_rstream_batches

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STREAM = "cost"
LEASE_TTL = 2.0
# under valgrind (30-50x slower) a 2 s lease runs out before its keep-alive: the leader steps down mid-run
CALLGRIND_LEASE_TTL = 30.0
SPY_RATE = 1000
SPY_NATIVE = os.environ.get("SPY_NATIVE") == "1"     # py-spy --native: C frames too (slower to record)             # py-spy samples per second


def _helpers():
    from bench._cluster import _cluster_helpers
    EtcdProcess, _ = _cluster_helpers()
    from procs import ServerProcess
    return EtcdProcess, ServerProcess


def _cpu(pid):
    """``(user, system)`` CPU seconds of process ``pid`` so far (/proc/PID/stat utime, stime)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    tck = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / tck, int(fields[12]) / tck


def _rss_anon_mb(pid):
    """Anonymous resident memory of process ``pid`` (/proc/PID/status RssAnon), MB."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("RssAnon:"):
                return round(int(line.split()[1]) / 1024, 1)
    return None


def _minflt(pid):
    """Minor page faults of process ``pid`` so far (/proc/PID/stat minflt): on this VM each fault on a fresh
    page of LMDB's map also zeroes it (the kernel's memset under filemap_fault), the bulk of a member's CPU."""
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[7])


def _run_ns(pid):
    """CPU nanoseconds process ``pid`` has run so far, every thread (/proc/PID/task/*/schedstat): exact, where
    /proc/PID/stat counts 10 ms ticks (an idle node's 30 s window holds only a handful of them)."""
    total = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                total += int(f.read().split()[0])
        except (OSError, ValueError, IndexError):
            pass        # a thread that ended meanwhile
    return total


def _total_ir(path):
    text = Path(path).read_text(errors="replace")
    m = re.search(r"^totals:\s+(\d+)", text, re.M) or re.search(r"^summary:\s+(\d+)", text, re.M)
    return int(m.group(1)) if m else 0


class Servers:
    """The servers of one measurement: a cluster of ``n`` nodes (with etcd) or one lone node."""

    def __init__(self, tmp, nodes, callgrind=None, lease_ttl=LEASE_TTL, cprofile=None):
        EtcdProcess, ServerProcess = _helpers()
        self.tmp = Path(tmp)
        self.callgrind = callgrind
        self.etcd = EtcdProcess(self.tmp / "etcd").start() if nodes > 1 else None
        self.nodes = {}
        for i in range(1, nodes + 1):
            name = f"n{i}"
            wrap = []
            if callgrind:
                wrap = ["nice", "-n", "19", "valgrind", "--tool=callgrind", "--instr-atstart=no",
                        f"--callgrind-out-file={callgrind}/{name}.%p.out"]
            elif cprofile:
                # the loop thread's Python calls, counted (python -m cProfile before -m riverbed...)
                wrap = ["bash", "-c", f'exe=$1; shift; exec "$exe" -m cProfile -o {cprofile}/{name}.prof "$@"', "-"]
            args = ["--fsync", "never", "--host", "127.0.0.1"]
            if self.etcd is not None:
                args += ["--node", name, "--etcd", self.etcd.url, "--cluster", "cost", "--replication-port", "0",
                         "--lease-ttl", str(lease_ttl)]
                if callgrind:
                    # at valgrind's speed a batch can wait longer than the default 10 s for its majority:
                    # a refused publish would be counted (and its PublishError encoded) instead of a confirm
                    args += ["--replication-timeout", "600"]
            self.nodes[name] = ServerProcess(self.tmp / name, *args, wrap=wrap)
        try:
            for srv in self.nodes.values():
                srv.start(timeout=600)
        except BaseException:
            self.stop()
            raise

    def collect(self, on):
        if self.callgrind:
            for srv in self.nodes.values():
                subprocess.run(["callgrind_control", "-i", "on" if on else "off", str(srv.pid)],
                               capture_output=True, timeout=120)

    def cpu(self):
        return {name: _cpu(srv.pid) for name, srv in self.nodes.items()}

    def minflt(self):
        return {name: _minflt(srv.pid) for name, srv in self.nodes.items()}

    def run_ns(self):
        return {name: _run_ns(srv.pid) for name, srv in self.nodes.items()}

    def stop(self):
        out = {}
        for name, srv in self.nodes.items():
            if srv.proc is None:
                continue
            try:
                srv.stop(signal.SIGTERM, timeout=300)
            except AssertionError:
                pass
            if self.callgrind:
                files = sorted(Path(self.callgrind).glob(f"{name}.{srv.pid}.out*"))
                out[name] = sum(_total_ir(f) for f in files)
        if self.etcd is not None:
            self.etcd.stop()
        return out


async def _create_and_warm(port, warm):
    from rstream import Producer
    async with Producer("127.0.0.1", port, username="guest", password="guest") as p:
        await p.create_stream(STREAM, arguments={"queue-leader-locator": "client-local"}, exists_ok=True)
        if warm:
            await publish_rstream_batches(p, STREAM, warm, b"w" * 100, 1000, 4)


async def _publish(port, n, repeat):
    from rstream import Producer
    async with Producer("127.0.0.1", port, username="guest", password="guest") as p:
        for _ in range(repeat):
            await publish_rstream_batches(p, STREAM, n, b"x" * 100, 5000, 16)


def _spy(servers, directory, seconds):
    spy = shutil.which("py-spy") or os.path.join(os.path.dirname(sys.executable), "py-spy")
    return [subprocess.Popen([spy, "record", "--pid", str(srv.pid), "--duration", str(int(seconds)), "--rate", str(SPY_RATE),
                              "--format", "raw", "--nonblocking", *(["--native"] if SPY_NATIVE else []), "--output", f"{directory}/{name}.txt"],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            for name, srv in servers.nodes.items()]


def _strace(servers, directory):
    """``strace -c`` attached to every thread of every node (syscall counts of the timed part)."""
    procs = []
    for name, srv in servers.nodes.items():
        tids = sorted(os.listdir(f"/proc/{srv.pid}/task"))
        cmd = ["strace", "-c", "-f", "-o", f"{directory}/{name}.txt"]
        for tid in tids:
            cmd += ["-p", tid]
        procs.append(subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    time.sleep(0.5)      # attached before the timed part starts
    return procs


def _perf(servers, directory):
    """``perf record`` (software cpu-clock samples: this VM has no hardware counters) of every node."""
    procs = [subprocess.Popen(["perf", "record", "-F", "1999", "-g", "-e", "cpu-clock", "-p", str(srv.pid), "-o",
                               f"{directory}/{name}.data"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
             for name, srv in servers.nodes.items()]
    time.sleep(0.5)
    return procs


def _strace_stop(procs):
    for p in procs:
        p.send_signal(signal.SIGINT)
    for p in procs:
        p.wait(60)


def run(a):
    tmp = tempfile.mkdtemp(prefix="riverbed-cluster-cost-")
    nodes = 1 if a.mode in ("single", "single-idle") else 3
    ttl = a.lease_ttl or (CALLGRIND_LEASE_TTL if a.callgrind else LEASE_TTL)
    servers = Servers(tmp, nodes, a.callgrind, ttl, a.cprofile)
    result = {"mode": a.mode, "nodes": nodes, "lease_ttl": ttl if nodes > 1 else None,
              "callgrind": bool(a.callgrind)}
    try:
        port = servers.nodes["n1"].port
        asyncio.run(_create_and_warm(port, 2000))
        time.sleep(2 * min(ttl, LEASE_TTL) if nodes > 1 else 0.5)       # members connected and caught up, progress written
        spies = []
        straces = _strace(servers, a.strace) if a.strace else []
        straces += _perf(servers, a.perf) if a.perf else []
        servers.collect(True)
        cpu0, ns0, t0, load0 = servers.cpu(), servers.run_ns(), time.monotonic(), os.getloadavg()[0]
        flt0 = servers.minflt()
        if a.mode in ("idle", "single-idle"):
            if a.py_spy:
                spies = _spy(servers, a.py_spy, a.seconds)
            time.sleep(a.seconds)
            elapsed = time.monotonic() - t0
        else:
            if a.py_spy:
                spies = _spy(servers, a.py_spy, a.spy_seconds)
            asyncio.run(_publish(port, a.n, a.repeat))
            elapsed = time.monotonic() - t0
            time.sleep(1.0)
        cpu1, ns1, flt1 = servers.cpu(), servers.run_ns(), servers.minflt()
        result["rss_anon_mb"] = {k: _rss_anon_mb(srv.pid) for k, srv in servers.nodes.items()}
        servers.collect(False)
        _strace_stop(straces)
        for s in spies:
            s.wait(120)
        result.update(elapsed_s=round(elapsed, 2), load=[round(load0, 2), round(os.getloadavg()[0], 2)],
                      cpu_s={k: round(sum(cpu1[k]) - sum(cpu0[k]), 3) for k in cpu0})
        msgs = a.n * a.repeat if a.mode not in ("idle", "single-idle") else 0
        if msgs:
            result["messages"] = msgs
            result["cpu_us_per_msg"] = {k: round(1e6 * (sum(cpu1[k]) - sum(cpu0[k])) / msgs, 3) for k in cpu0}
            # user and system time apart: the kernel's share (socket copies, page faults) vs Python's
            result["user_sys_us_per_msg"] = {k: [round(1e6 * (cpu1[k][i] - cpu0[k][i]) / msgs, 3) for i in (0, 1)]
                                             for k in cpu0}
            result["cpu_us_per_msg_total"] = round(sum(result["cpu_us_per_msg"].values()), 3)
            result["minor_faults_per_kmsg"] = {k: round(1000 * (flt1[k] - flt0[k]) / msgs, 2) for k in flt0}
        else:
            result["cpu_percent"] = {k: round(100 * (sum(cpu1[k]) - sum(cpu0[k])) / elapsed, 2) for k in cpu0}
            # the same from the scheduler's nanoseconds (schedstat): what to compare at rest
            result["cpu_percent_exact"] = {k: round(100 * (ns1[k] - ns0[k]) / 1e9 / elapsed, 3) for k in ns0}
    finally:
        irs = servers.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    if a.callgrind:
        result["ir"] = irs
        if result.get("messages"):
            result["ir_per_msg"] = {k: round(v / result["messages"]) for k, v in irs.items()}
            result["ir_per_msg_total"] = round(sum(irs.values()) / result["messages"])
        else:
            result["ir_per_s"] = {k: round(v / result["elapsed_s"]) for k, v in irs.items()}
    try:
        result["git"] = subprocess.run(["git", "-C", ROOT, "describe", "--always", "--dirty"], capture_output=True,
                                       text=True).stdout.strip()
    except OSError:
        pass
    return result


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("mode", choices=("publish", "idle", "single", "single-idle"))
    ap.add_argument("--n", type=int, default=20000, help="messages per timed publish (100 B each)")
    ap.add_argument("--repeat", type=int, default=1, help="timed publishes of --n, one after the other")
    ap.add_argument("--lease-ttl", type=float, default=None,
                    help=f"seconds (default {LEASE_TTL}, {CALLGRIND_LEASE_TTL} with --callgrind)")
    ap.add_argument("--seconds", type=float, default=30.0, help="idle: the measured window")
    ap.add_argument("--callgrind", metavar="DIR", help="run the servers under callgrind, its files in DIR")
    ap.add_argument("--cprofile", metavar="DIR", help="run the servers under cProfile (the loop thread's calls, "
                    "whole life: compare two --n), its files in DIR")
    ap.add_argument("--py-spy", metavar="DIR", help="record each node with py-spy during the timed part")
    ap.add_argument("--spy-seconds", type=float, default=10.0)
    ap.add_argument("--strace", metavar="DIR", help="count each node's syscalls (strace -c) during the timed part")
    ap.add_argument("--perf", metavar="DIR", help="perf record (cpu-clock) each node during the timed part")
    a = ap.parse_args(argv)
    for d in (a.callgrind, a.cprofile, a.py_spy, a.strace, a.perf):
        if d:
            os.makedirs(d, exist_ok=True)
    print(json.dumps(run(a)))


if __name__ == "__main__":
    main()
