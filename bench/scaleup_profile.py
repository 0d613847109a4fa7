"""Where the scale-up row's CPU goes (issue 26, one node per core): ``python -m bench.scaleup_profile``.

Runs ``bench.compare``'s ``scaleup-publish`` row (the same ``run_once``: a super stream, one partition per
load-generator process, each process on its partition's leader) against a fresh single node and a fresh
pair of nodes, ``--runs`` times each, and prints beside the row's figures the CPU of every thread of every
server process over the timed window (from /proc: the event loop's thread is the process's main thread,
``riverbed-writer`` the LMDB writer), the clients', and the whole machine's busy cores, so one can see
which thread is at a core's limit and what is idle. ``--perf DIR`` records ``perf record -g`` of each
server during the window (flame graphs need the kernel symbols perf can read here).

Options: ``--n`` messages per process (default 8,000,000, the row's 8 × 1M), ``--which one|pair|both``.
Writes nothing but what it prints (and the perf files); say the machine's load beside the figures.
"""

import argparse
import json
import os
import subprocess
import sys
import time

from bench import _procs
from bench._client import CLK_TCK, machine_stat
from bench._scaleup import RiverbedPair
from bench.compare import parse_args as compare_args
from bench.compare import run_once


def thread_cpu(pid):
    """``{thread name/tid: utime+stime seconds}`` of every thread of ``pid``."""
    out = {}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                raw = f.read()
        except OSError:
            continue
        name = raw[raw.index("(") + 1:raw.rindex(")")]
        fields = raw.rsplit(")", 1)[1].split()
        key = "main" if tid == str(pid) else f"{name}/{tid}"
        out[key] = (int(fields[11]) + int(fields[12])) / CLK_TCK
    return out


class Sampler:
    """The row's ``on_go`` hook: per-thread CPU of the servers at GO and at the end (and perf, if asked)."""

    def __init__(self, pids, perf_dir=None, tag=""):
        self.pids = pids
        self.perf_dir = perf_dir
        self.tag = tag
        self.perfs = []
        self.out = None

    def __call__(self, stop=False):
        if not stop:
            self.t0, self.m0 = time.monotonic(), machine_stat()
            self.c0 = {p: thread_cpu(p) for p in self.pids}
            if self.perf_dir:
                for p in self.pids:
                    path = os.path.join(self.perf_dir, f"{self.tag}-{p}.data")
                    self.perfs.append(subprocess.Popen(["perf", "record", "-g", "-p", str(p), "-o", path],
                                                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
            return
        wall = time.monotonic() - self.t0
        m1 = machine_stat()
        for pr in self.perfs:
            pr.send_signal(2)
        for pr in self.perfs:
            pr.wait(30)
        threads = {}
        for p in self.pids:
            c1 = thread_cpu(p)
            threads[p] = {k: round((v - self.c0[p].get(k, 0.0)) / wall, 3) for k, v in c1.items()
                          if v - self.c0[p].get(k, 0.0) > 0}
        self.out = {"wall_s": wall, "machine_busy_cores": (m1["busy"] - self.m0["busy"]) / wall,
                    "irq_cores": (m1["irq"] - self.m0["irq"]) / wall, "server_thread_cores": threads}


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m bench.scaleup_profile", description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=8_000_000, help="messages per process (default 8,000,000)")
    ap.add_argument("--which", choices=("one", "pair", "both"), default="both")
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--perf", metavar="DIR", help="perf record -g each server over the timed window")
    a = ap.parse_args(argv)
    args = compare_args(["--n", str(a.n // 8), "--peers", "none"])
    if a.perf:
        os.makedirs(a.perf, exist_ok=True)
    brokers = []
    if a.which in ("one", "both"):
        brokers.append(_procs.Riverbed(log=lambda m: print(m, file=sys.stderr)))
    if a.which in ("pair", "both"):
        brokers.append(RiverbedPair(log=lambda m: print(m, file=sys.stderr)))
    print(f"load average {os.getloadavg()}", flush=True)
    for b in brokers:
        b.start()
        try:
            for run in range(1, a.runs + 1):
                pids = getattr(b, "pids", None) or [b.pid]
                s = Sampler(pids, a.perf, f"{b.name}-{run}")
                rec = run_once(args, "scaleup-publish", b, [], 1, run, on_go=s)
                keep = {k: rec.get(k) for k in ("ok", "error", "msgs_per_s", "server_us_per_msg", "server_cores",
                                                "client_cores", "server_node_cpu_s", "partition_ports",
                                                "other_cores", "server_log")}
                if not rec.get("ok"):
                    keep["client_stderr"] = rec.get("client_stderr")
                print(json.dumps({"broker": b.name, "run": run, **keep, "threads": s.out}, indent=1), flush=True)
        finally:
            b.stop()
    print(f"load average {os.getloadavg()}", flush=True)


if __name__ == "__main__":
    main()
