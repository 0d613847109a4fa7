"""Where one cluster confirm's time goes, hop by hop, across the three nodes (issue 23's confirm latency row).

Starts a private etcd and three ``riverbed serve`` nodes (``--fsync never``, as the bench's cluster rows),
each under this file as a wrapper that hooks timestamps (CLOCK_MONOTONIC, one clock for every process
here) into the path of a publish, then runs ``bench._client latency-rstream`` (rstream ``send_wait``, one
message at a time) against n1, which leads the stream (``queue-leader-locator=client-local``). Prints each
hop's p50/p90 in µs from the leader's read of the publish:

    leader: read (the session's data_received) -> appended (the engine's completion of the append) ->
    sent (the chunk written to a member connection) ... member: arrived (its data_received of the
    chunk) -> acked (its ACK written, after its store) ... leader: ack in (the data_received that
    carried the ACK) -> committed (the committed offset moved) -> confirm (written to the client)

    .venv/bin/python -m bench.cluster_hops [--timed 2000] [--warmup 200]

The hooks wrap methods of classes that exist before and after issue 23's confirm-path work (nothing in the
product changes), so the same tool measures both; they cost a few µs per hop: compare runs of this tool
with each other, not with ``make bench-compare``. Say the load (printed) beside any figure.
"""

import argparse
import atexit
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

HOPS = ["read", "appended", "sent", "arrived", "acked", "ack_in", "committed", "confirm"]
ROWS_ENV = "RIVERBED_HOPS_FILE"


# ------------------------------------------------------------------------------------ inside a node

def install_hooks(path):
    """Timestamp the publish path in this process; rows go to ``path`` (JSON) every 0.5 s and at exit."""
    import asyncio

    from riverbed.shells.broker import core, listener
    from riverbed.shells.cluster import replication, wire
    ns = time.monotonic_ns
    cur = {}
    leader_rows, member_rows = [], []

    def wrap(cls, name, before=None, after=None):
        orig = getattr(cls, name)
        static = isinstance(cls.__dict__.get(name), staticmethod)

        def hooked(*a, **k):
            if before is not None:
                before(*a)
            out = orig(*a, **k)
            if after is not None:
                after(out, *a)
            return out
        setattr(cls, name, staticmethod(hooked) if static else hooked)

    # leader: the publish read, its append completed, the chunk written, the ACK in, the commit, the confirm
    def on_read(obj, data):
        cur.clear()
        cur["read"] = ns()
    wrap(listener.SessionProtocol, "data_received", before=on_read)

    def on_done_made(done, obj, cb):
        def stamped(res, exc, _done=done):
            if "read" in cur and "appended" not in cur:
                cur["appended"] = ns()
                if res is not None and getattr(res, "last_offset", -1) >= 0:
                    cur["end"] = res.last_offset + 1
            return _done(res, exc)
        return stamped
    orig_done = core.Broker._done
    core.Broker._done = lambda obj, cb: on_done_made(orig_done(obj, cb), obj, cb)

    def on_held(obj, stream, publisher, res, cb):
        # the one-message path on a leader (Broker.append_chunk_now, replicated): committed, now held
        if "read" in cur and "appended" not in cur:
            cur["appended"] = ns()
            if getattr(res, "last_offset", -1) >= 0:
                cur["end"] = res.last_offset + 1
    if hasattr(core.Broker, "hold_replicated"):
        wrap(core.Broker, "hold_replicated", before=on_held)

    def on_writelines(obj, parts):
        if "read" in cur and "sent" not in cur:
            for p in parts:
                if len(p) == wire.LEN_FRAME_HEADER and p[4] == wire.CHUNK:
                    cur["sent"] = ns()
                    break
    wrap(asyncio.StreamWriter, "writelines", before=on_writelines)

    def on_ack_in(obj, data):
        if "sent" in cur and "ack_in" not in cur and len(data) >= 5 and data[4] == wire.ACK:
            cur["ack_in"] = ns()
    wrap(asyncio.StreamReaderProtocol, "data_received", before=on_ack_in)
    try:
        from riverbed.shells.cluster import leader_path
        wrap(leader_path.AckReader, "data_received", before=on_ack_in)
    except (ImportError, AttributeError):
        pass

    def on_release(st):
        # the committed offset moved (recompute releases the confirms it completes, which write them)
        if "sent" in cur and "committed" not in cur and st.waiting and st.waiting[0][0] <= st.committed:
            cur["committed"] = ns()
    wrap(replication.Leading, "release", before=on_release)

    def on_write(obj, *a):
        if "committed" in cur:
            cur["confirm"] = ns()
            leader_rows.append({k: v for k, v in cur.items() if not k.startswith("_")})
            cur.clear()
    for name in ("write", "writelines"):
        wrap(listener.SessionProtocol, name, before=on_write)

    # member: the chunk arrived, the ACK written (after the store)
    arrived = [0]

    def on_arrive(obj, data):
        arrived[0] = ns()
    # a BufferedProtocol since repcpu (buffer_updated), a Protocol before (data_received)
    wrap(replication._Following, "buffer_updated" if hasattr(replication._Following, "buffer_updated")
         else "data_received", before=on_arrive)

    def on_ack(writer, offset, durable):
        if arrived[0]:
            member_rows.append({"end": offset, "arrived": arrived[0], "acked": ns()})
            arrived[0] = 0
    wrap(replication.ReplicationPlane, "_ack", before=on_ack)

    def dump():
        tmp = path + ".tmp"
        with open(tmp, "w") as f:
            json.dump({"leader": leader_rows[:], "member": member_rows[:]}, f)
        os.replace(tmp, path)

    def dumper():
        while True:
            time.sleep(0.5)
            try:
                dump()
            except Exception:   # noqa: BLE001 - a diagnostic: the next pass writes it again
                pass
    threading.Thread(target=dumper, daemon=True).start()
    atexit.register(dump)


def node_main():
    """As ``ServerProcess(wrap=[python, this file, "--node"])``: hooks, then ``riverbed serve``."""
    argv = sys.argv[2:]
    serve_args = argv[argv.index("riverbed.shells.cli") + 1:]
    install_hooks(os.environ[ROWS_ENV])
    from riverbed.shells.cli import main as cli_main
    sys.exit(cli_main(serve_args))


# ------------------------------------------------------------------------------------------- driver

def table(rows_by_node, leader="n1", warmup=200):
    lead = rows_by_node[leader]["leader"][warmup:]
    members = {}
    for name, doc in rows_by_node.items():
        if name != leader:
            for r in doc["member"]:
                members.setdefault(r["end"], []).append(r)
    rows = []
    for r in lead:
        ms = members.get(r.get("end"), [])
        if not ms:
            continue
        first = min(ms, key=lambda m: m["acked"])     # the ACK that made the majority
        rows.append(dict(r, arrived=first["arrived"], acked=first["acked"]))
    out = [f"confirms traced: {len(rows)} (of {len(lead)} after the warm-up)"]
    for name in HOPS[1:]:
        d = sorted((r[name] - r["read"]) / 1000 for r in rows if name in r)
        if d:
            out.append(f"  read -> {name:<9} p50 {d[len(d) // 2]:8.1f} µs  p90 {d[int(len(d) * 0.9)]:8.1f}  n {len(d)}")
    return "\n".join(out), rows


def main(argv=None):
    if len(sys.argv) > 1 and sys.argv[1] == "--node":
        node_main()
        return
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--timed", type=int, default=2000)
    ap.add_argument("--warmup", type=int, default=200)
    ap.add_argument("--json", help="write the merged rows here")
    a = ap.parse_args(argv)
    root = Path(__file__).resolve().parent.parent
    for p in (root / "tests" / "cluster", root / "tests" / "integration"):
        sys.path.insert(0, str(p))
    from clusterproc import Cluster
    from etcdproc import EtcdProcess
    tmp = Path(tempfile.mkdtemp(prefix="rb-cluster-hops-"))
    etcd = EtcdProcess(tmp / "etcd").start()
    c = None
    try:
        c = Cluster(tmp, etcd, n=3, lease_ttl=2.0, extra=("--host", "127.0.0.1"))
        files = {}
        for name, srv in c.nodes.items():
            files[name] = str(tmp / f"hops-{name}.json")
            srv.wrap = [sys.executable, str(Path(__file__).resolve()), "--node"]
            srv.env = {ROWS_ENV: files[name]}
        c.start()
        load0 = os.getloadavg()[0]
        client = [sys.executable, "-m", "bench._client", "latency-rstream", "--port", str(c.nodes["n1"].port),
                  "--stream", "hops", "--no-sync", "--timed", str(a.timed), "--warmup", str(a.warmup),
                  "--stream-arg", "queue-leader-locator=client-local"]
        out = subprocess.run(client, capture_output=True, text=True, check=True, cwd=root).stdout
        res = json.loads(out.split("RESULT", 1)[1])
        time.sleep(1.2)     # the nodes' dumpers write their rows
        rows_by_node = {name: json.load(open(f)) for name, f in files.items()}
        print("rows per node: " + ", ".join(f"{n} leader {len(d['leader'])} member {len(d['member'])}"
                                            for n, d in rows_by_node.items()))
        text, rows = table(rows_by_node, warmup=a.warmup)
        print(f"client confirm p50 {res['lat_p50_us']:.0f} µs, p99 {res['lat_p99_us']:.0f} µs "
              f"(load {load0:.1f} -> {os.getloadavg()[0]:.1f})")
        print(text, flush=True)
        if a.json:
            with open(a.json, "w") as f:
                json.dump({"client": res, "rows": rows}, f)
    finally:
        if c is not None:
            c.stop()
        etcd.stop()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
