"""Where one confirm's time goes, hop by hop, with a real client over loopback (issue 26's durable row).

Starts ``riverbed serve`` in this process with timestamps hooked into the path of a publish (the
session's read, the hand-off to the writer thread, the staging of the write transaction, LMDB's commit
with its sync, the completion posted to the loop, the loop's drain, the confirm's write), runs
``bench._client latency-rstream`` (rstream ``send_wait``, one message at a time) against it, and prints
each hop's p50/p90 in µs. Stop-and-wait, so each confirm is alone in its group commit.

    .venv/bin/python -m bench.confirm_hops [--fsync batch] [--timed 2000] [--port 23460]

The hooks wrap methods of the classes (nothing in the product changes); they cost a few µs per hop,
so compare runs of this tool with each other, not with ``make bench-compare``. On a busy machine run it
under ``chrt -f 20`` (root) so that CPU contention does not swamp the hops; the disk's noise stays.

Last figures (2026-11-26, load 14-17 under chrt, 1,000-1,500 confirms, floor p50 266-307 µs):
read->submit 46-54, submit->dequeued 54-61, staging 88-106 with WRITEMAP / 57-61 without,
commit+sync 480-560, commit->post 27-34, post->drain 45-55, drain->write 27-30; total p50 1.0-1.3 ms.
Since engine/sparse.py (a lone append committed by _commit_alone, ~4.4 disk requests instead of ~7.6):
bench/results/2026-11-26-fsyncpages.md (not quiet: staging 59-77 µs against 72-99 before, same run).
"""

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time

HOPS = [("read", "submit"), ("submit", "dequeued"), ("dequeued", "applied"), ("applied", "committed"),
        ("committed", "posted"), ("posted", "drained"), ("drained", "written"), ("read", "written")]
LABELS = {"applied": "staged", "committed": "commit+sync", "posted": "post", "drained": "drain",
          "written": "write"}
WARMUP_ROWS = 200


class Hooks:
    """Timestamps (perf_counter ns) of the current confirm; a row per confirm written."""

    def __init__(self):
        self.cur = {}
        self.rows = []

    def install(self):
        from riverbed.engine import stats as engine_stats
        from riverbed.engine import writer
        from riverbed.shells.broker import core, listener
        ns = time.perf_counter_ns
        cur = self.cur

        def stamp(cls, name, key, first=False):
            orig = getattr(cls, name)

            def hooked(obj, *a, **k):
                if first:
                    cur.clear()
                cur.setdefault(key, ns())
                return orig(obj, *a, **k)
            setattr(cls, name, hooked)

        stamp(listener.SessionProtocol, "data_received", "read", first=True)
        stamp(writer._Writer, "submit", "submit")
        stamp(writer._Writer, "_commit_group", "dequeued")   # what the thread does with what it dequeued
        stamp(core.Broker, "_drain", "drained")
        commit_done = engine_stats.EngineStats.commit_done

        def hooked_commit_done(obj, started, applied, committed, operations, nbytes):
            cur["applied"], cur["committed"] = int(applied * 1e9), int(committed * 1e9)
            return commit_done(obj, started, applied, committed, operations, nbytes)
        engine_stats.EngineStats.commit_done = hooked_commit_done
        post = core.Broker._post

        def hooked_post(obj, fn, *args):
            if threading.get_ident() != obj._loop_thread:
                cur.setdefault("posted", ns())
            return post(obj, fn, *args)
        core.Broker._post = hooked_post
        rows = self.rows
        for name in ("write", "writelines"):
            orig = getattr(listener.SessionProtocol, name)

            def hooked_write(obj, *a, _orig=orig):
                if "read" in cur:
                    cur["written"] = ns()
                    rows.append(dict(cur))
                    cur.clear()
                return _orig(obj, *a)
            setattr(listener.SessionProtocol, name, hooked_write)

    def table(self):
        rows = self.rows[WARMUP_ROWS:]
        out = [f"confirms traced: {len(rows)}"]
        for a, b in HOPS:
            d = sorted((r[b] - r[a]) / 1000 for r in rows if a in r and b in r)
            if d:
                out.append(f"  {LABELS.get(a, a):>11} -> {LABELS.get(b, b):<11} p50 {d[len(d) // 2]:8.1f} µs"
                           f"  p90 {d[int(len(d) * 0.9)]:8.1f}  n {len(d)}")
        return "\n".join(out)


def _drive(a, hooks, tmp):
    """The client side, on a thread: wait for the listener, run the client, print, end the process."""
    code = 1
    try:
        for _ in range(300):
            try:
                socket.create_connection(("127.0.0.1", a.port), timeout=1).close()
                break
            except OSError:
                time.sleep(0.1)
        client = [sys.executable, "-m", "bench._client", "latency-rstream", "--port", str(a.port),
                  "--stream", "hops", "--no-sync", "--timed", str(a.timed), "--warmup", str(WARMUP_ROWS)]
        out = subprocess.run(client, capture_output=True, text=True, check=True).stdout
        res = json.loads(out.split("RESULT", 1)[1])
        print(f"fsync={a.fsync}: client confirm p50 {res['lat_p50_us']:.0f} µs, p99 {res['lat_p99_us']:.0f} µs "
              f"(load {os.getloadavg()[0]:.1f})")
        print(hooks.table(), flush=True)
        code = 0
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        os._exit(code)     # the server's loop runs on the main thread until the process ends


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--fsync", default="batch")
    ap.add_argument("--timed", type=int, default=2000)
    ap.add_argument("--port", type=int, default=23460)
    a = ap.parse_args(argv)
    hooks = Hooks()
    hooks.install()
    from riverbed.shells.cli import main as cli_main
    tmp = tempfile.mkdtemp(prefix="rb-confirm-hops-")
    threading.Thread(target=_drive, args=(a, hooks, tmp), daemon=True).start()
    cli_main(["serve", "--data-dir", os.path.join(tmp, "data"), "--host", "127.0.0.1", "--stream-port",
              str(a.port), "--bson-port", "off", "--zmq-port", "off", "--ws-port", "off", "--ream-port", "off",
              "--http-port", "off", "--kafka-port", "off", "--fsync", a.fsync])


if __name__ == "__main__":
    main()
