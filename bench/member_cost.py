"""A cluster member's CPU per replicated message, alone (issue 23's CPU goal, the follower's store path).

The member is the real follow code (``ReplicationPlane._follow_once``, shells/cluster/replication.py) on a
real engine (fsync never) in this process; the leader is a forked child that serves one member
connection with the chunks a real leader engine made (batches of ``--batch`` x 100 B records, chunks of
as the engine cuts them, SEQS before each batch's last chunk, a COMMIT after it) and sends
each batch once the member acknowledged the one before. No etcd, no control plane, no clock-driven
work: the figure is the data path only, so it holds at any load (CPU time, not wall time).

    python -m bench.member_cost --n 1000000 [--batch 5000]
    valgrind --tool=callgrind --instr-atstart=no --callgrind-out-file=DIR/m.%p.out \
        python -m bench.member_cost --n 200000 --under-callgrind      # instructions of the follow only
    python -m bench.member_cost --n 2000000 --perf FILE                # perf samples of the follow only

Prints one JSON document: the member process's user and system CPU per message (getrusage).
"""

import argparse
import asyncio
import json
import os
import resource
import shutil
import signal
import socket
import subprocess
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _frames(tmp, n, batch):
    from riverbed.engine import Engine, core
    from riverbed.engine.format import H_CHUNK_ID, H_RECORDS
    from riverbed.shells.cluster import wire
    eng = Engine(os.path.join(tmp, "leader"), fsync="never", retention_interval=0)
    try:
        eng.create_stream("s").result()
        body = b"x" * 100
        for i in range(0, n, batch):
            k = min(batch, n - i)
            eng.append("s", [body] * k, publishing_ids=list(range(i, i + k)), publisher="p").result()
        chunks = [raw for _, raw in eng.read_chunks("s", 0, 1 << 30, limited=False)]
    finally:
        eng.close()
    # a batch is the chunks of one publish (``batch`` records: one chunk since the engine cuts up to 8,192
    # records per chunk inside one commit, several of 1,000 before)
    groups, part, records = [], [], 0
    for raw in chunks:
        part.append(raw)
        records += core.read_header(raw)[H_RECORDS]
        if records >= batch:
            groups.append(part)
            part, records = [], 0
    if part:
        groups.append(part)
    out = []
    for part in groups:
        last = core.read_header(part[-1])
        end = last[H_CHUNK_ID] + last[H_RECORDS]
        frames = []
        for j, raw in enumerate(part):
            if j == len(part) - 1:
                frames.append(wire.json_frame(wire.SEQS, {"p": end - 1}))
            frames += [wire.head(wire.CHUNK, len(raw)), raw]
        frames.append(wire.u64_frame(wire.COMMIT, end))
        out.append((frames, end))
    return out


def _serve(sock, batches, gap=0.0):
    """The leader: one member connection, batch after batch, each after the ACK of the one before (and
    ``gap`` seconds more: the pace of a real leader's batches, whose member wakes once per batch)."""
    from riverbed.shells.cluster import wire
    conn, _ = sock.accept()
    f = conn.makefile("rb")

    def frame():
        head = f.read(5)
        length, kind = wire._HEAD.unpack(head)
        return kind, f.read(length - 1)
    kind, _ = frame()
    assert kind == wire.HELLO
    for frames, end in batches:
        if gap:
            time.sleep(gap)
        conn.sendmsg(frames)
        while True:
            kind, payload = frame()
            if kind == wire.ACK and wire.u64(payload) >= end:
                break
    conn.sendall(wire.json_frame(wire.REFUSE, {"reason": "done"}))
    conn.close()


def run(a):
    from riverbed.engine import Engine
    from riverbed.shells.cluster.remote_read import Observers
    from riverbed.shells.cluster.replication import ReplicationPlane

    class Member(ReplicationPlane):
        class _NoDeletes:
            def on_stream_deleted(self, fn):
                pass

        def __init__(self, engine):
            self.engine = engine
            self.name = "member"
            self.max_epoch = {}
            self.broker = self._NoDeletes()
            self.observers = Observers(self)

    tmp = tempfile.mkdtemp(prefix="riverbed-member-cost-")
    try:
        batches = _frames(tmp, a.n, a.batch)
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        sock.listen(1)
        port = sock.getsockname()[1]
        pid = os.fork()
        if pid == 0:
            try:
                _serve(sock, batches, a.gap)
            finally:
                os._exit(0)
        sock.close()
        import uvloop       # the loop `riverbed serve` runs (imported here: its import is no part of the follow)
        member = Engine(os.path.join(tmp, "member"), fsync="never", retention_interval=0)
        try:
            member.create_stream("s").result()
            if a.under_callgrind:
                subprocess.run(["callgrind_control", "-i", "on", str(os.getpid())], capture_output=True)
            perf = None
            if a.perf:
                perf = subprocess.Popen(["perf", "record", "-F", "4999", "-g", "-e", "cpu-clock", "-p",
                                         str(os.getpid()), "-o", a.perf], stdout=subprocess.DEVNULL,
                                        stderr=subprocess.DEVNULL)
                time.sleep(1.0)     # perf attaches
            r0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.monotonic()

            async def follow():
                await Member(member)._follow_once("s", "leader", 1, {"advertised_host": "127.0.0.1",
                                                                    "replication_port": port})
            uvloop.run(follow())
            r1, t1 = resource.getrusage(resource.RUSAGE_SELF), time.monotonic()
            if perf is not None:
                perf.send_signal(signal.SIGINT)
                perf.wait()
            if a.under_callgrind:
                subprocess.run(["callgrind_control", "-i", "off", str(os.getpid())], capture_output=True)
            got = member._current("s").next_offset
        finally:
            member.close()
        os.waitpid(pid, 0)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    user, sys_ = r1.ru_utime - r0.ru_utime, r1.ru_stime - r0.ru_stime
    out = {"messages": a.n, "stored": got, "batch": a.batch, "elapsed_s": round(t1 - t0, 2),
           "load": round(os.getloadavg()[0], 2),
           "user_us_per_msg": round(1e6 * user / a.n, 3), "sys_us_per_msg": round(1e6 * sys_ / a.n, 3),
           "cpu_us_per_msg": round(1e6 * (user + sys_) / a.n, 3),
           "minor_faults": r1.ru_minflt - r0.ru_minflt,
           "voluntary_switches": r1.ru_nvcsw - r0.ru_nvcsw}
    try:
        out["git"] = subprocess.run(["git", "-C", ROOT, "describe", "--always", "--dirty"], capture_output=True,
                                    text=True).stdout.strip()
    except OSError:
        pass
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=1_000_000, help="messages (100 B each)")
    ap.add_argument("--batch", type=int, default=5000, help="records per publish (the bench's send_batch)")
    ap.add_argument("--gap", type=float, default=0.0, help="seconds the leader waits before each batch")
    ap.add_argument("--perf", metavar="FILE", help="perf record (cpu-clock, call graphs) of this process while "
                                                  "the member follows, into FILE")
    ap.add_argument("--under-callgrind", action="store_true",
                    help="this process runs under valgrind --tool=callgrind --instr-atstart=no: collect only "
                         "while the member follows")
    print(json.dumps(run(ap.parse_args(argv))))


if __name__ == "__main__":
    main()
