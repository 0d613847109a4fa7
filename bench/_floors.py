"""The floors of ``bench.compare``: what this machine costs before a broker does any work, measured in the
same run as the rows they judge (issue 26 sets its goals against them, not against a peer).

Three floors, each measured once per round (before the round's first run, when no broker is busy):

* ``loop``: a bare uvloop echo server driven stop-and-wait (``bench.loop_floor``): the server's CPU per
  round trip (µs) and the round trip's p50/p99 (µs). Under every one-message-per-frame row and every
  confirm-latency row.
* ``fsync``: a bare LMDB commit with sync on the data directories' filesystem (``bench.fsync_floor``):
  p50/p99 (µs). Under the fsync=batch confirm latency.
* ``append``: the engine's own append, in process, of ``--floor-records`` 100-byte records in batches
  of 5,000 with fsync=never: CPU per record (µs, this process's user+system time, the writer thread
  included). Under the server CPU of a batched publish.

``FLOOR_GOALS`` maps (workload, metric, durable row?) to (floor, floor metric, factor): the row's median
must be <= factor × the floor's median. ``floor_goal_lines`` judges them; the Redis XADD round trip of
the same run is a fourth reference for the confirm p50 (issue 26: "at or below Redis's XADD p50").
"""

import os
import shutil
import statistics
import tempfile
import time

from bench import fsync_floor, loop_floor

# (workload, metric, durable) -> [(floor, floor metric, factor)]; durable: the fsync=batch Riverbed row
FLOOR_GOALS = {
    ("publish-rbfly-raw-1", "server_us_per_msg", False): [("loop", "cpu_us", 1.5)],
    ("publish-rbfly-raw-4", "server_us_per_msg", False): [("loop", "cpu_us", 1.5)],
    ("publish-rbfly-amqp-1", "server_us_per_msg", False): [("loop", "cpu_us", 1.5)],
    ("publish-rbfly-amqp-4", "server_us_per_msg", False): [("loop", "cpu_us", 1.5)],
    ("latency-rstream", "lat_p50_us", False): [("loop", "p50_us", 1.5), ("redis", "lat_p50_us", 1.0)],
    ("latency-rstream", "lat_p99_us", False): [("loop", "p99_us", 3.0)],
    ("latency-rbfly", "lat_p50_us", False): [("loop", "p50_us", 1.5), ("redis", "lat_p50_us", 1.0)],
    ("latency-rbfly", "lat_p99_us", False): [("loop", "p99_us", 3.0)],
    # the load generator's stop-and-wait client (bench._loadgen) costs what the echo floor's client does
    ("loadgen-latency", "lat_p50_us", False): [("loop", "p50_us", 1.5), ("redis", "lat_p50_us", 1.0)],
    ("loadgen-latency", "lat_p99_us", False): [("loop", "p99_us", 3.0)],
    ("loadgen-latency", "server_us_per_msg", False): [("loop", "cpu_us", 1.5)],
    ("latency-rstream", "lat_p50_us", True): [("fsync", "p50_us", 2.0)],
    ("publish-rstream-raw", "server_us_per_msg", False): [("append", "cpu_us", 3.0)],
    ("publish-rbfly-amqp-batch", "server_us_per_msg", False): [("append", "cpu_us", 3.0)],
}
FLOOR_LABELS = {"loop": "uvloop echo floor", "fsync": "LMDB fsync floor", "append": "engine append floor",
                "redis": "Redis XADD round trip"}


def append_floor(records=1_000_000, batch=5000, size=100):
    """``{"records", "cpu_us"}``: this process's CPU per record appending ``records`` × ``size`` B in
    batches of ``batch`` to a fresh engine (fsync=never) in a temp dir, which it removes. Blocking."""
    from riverbed.engine import Engine
    d = tempfile.mkdtemp(prefix="rb-append-floor-")
    try:
        eng = Engine(d, fsync="never", retention_interval=0)
        eng.create_stream("floor").result()
        body = [b"r" * size] * batch
        n = max(records // batch, 1)
        eng.append("floor", body).result()      # warm: the stream's first pages
        t0 = time.process_time()
        for f in [eng.append("floor", body) for _ in range(n)]:
            f.result()
        cpu = time.process_time() - t0
        eng.close()
        return {"records": n * batch, "cpu_us": cpu / (n * batch) * 1e6}
    finally:
        shutil.rmtree(d, ignore_errors=True)


def measure(round_no, loop_messages=20000, fsync_commits=2000, append_records=1_000_000, where=None):
    """One sample of every floor: ``{"round", "loop": {...}, "fsync": {...}, "append": {...}}``.
    ``where``: the directory whose filesystem the fsync floor is measured on. Blocking, a few seconds."""
    cpu, p50, p99 = loop_floor.run(loop_messages)
    return {"round": round_no,
            "loop": {"messages": loop_messages, "cpu_us": cpu, "p50_us": p50, "p99_us": p99},
            "fsync": fsync_floor.measure(fsync_commits, where),
            "append": append_floor(append_records)}


def medians(samples):
    """{floor: {metric: {"med", "min", "max"}}} over the samples of :func:`measure`."""
    out = {}
    for floor in ("loop", "fsync", "append"):
        keys = [k for k in samples[0][floor] if k.endswith("_us")] if samples else []
        out[floor] = {k: {"med": statistics.median(s[floor][k] for s in samples),
                          "min": min(s[floor][k] for s in samples),
                          "max": max(s[floor][k] for s in samples)} for k in keys}
    return out


def floor_goal_lines(summary, floors, durable_name):
    """Issue 26's floor goals judged on medians: one dict per (workload, metric, durable, floor) that ran,
    with ``ratio`` (row ÷ floor), ``target``, ``ok`` and a printable ``text``."""
    out = []
    for (wname, key, durable), goals in FLOOR_GOALS.items():
        row = summary.get((wname, durable_name if durable else "riverbed"), {}).get(key)
        if not row:
            continue
        for floor, fkey, factor in goals:
            if floor == "redis":
                ref = summary.get(("redis-latency", "redis"), {}).get(fkey)
                ref = ref and ref["med"]
            else:
                ref = floors.get(floor, {}).get(fkey, {}).get("med")
            if not ref:
                continue
            r = row["med"] / ref
            ok = r <= factor
            label = f"{wname}{' [' + durable_name + ']' if durable else ''} {key}"
            out.append({"workload": wname, "metric": key, "durable": durable, "floor": floor, "floor_metric": fkey,
                        "value": row["med"], "floor_value": ref, "ratio": r, "target": factor, "ok": ok,
                        "text": f"{label} {row['med']:,.1f} ÷ {FLOOR_LABELS[floor]} {fkey} {ref:,.1f} = {r:.2f}× "
                                f"(goal <= {factor:g}×: {'met' if ok else 'MISSED'})"})
    return out


def floor_text(floors):
    """The floors' medians (min–max) as printable lines."""
    lines = []
    for floor in ("loop", "fsync", "append"):
        parts = [f"{k} {d['med']:,.2f} ({d['min']:,.2f}–{d['max']:,.2f})" for k, d in floors.get(floor, {}).items()]
        if parts:
            lines.append(f"{FLOOR_LABELS[floor]}: " + ", ".join(parts))
    return lines


def data_fs_dir():
    """A directory on the filesystem the bench's Riverbed data directories are made on (the temp dir)."""
    return os.environ.get("TMPDIR") or tempfile.gettempdir()
