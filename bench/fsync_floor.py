"""The floor under every durable (fsync=batch) row: a bare LMDB commit with a sync, nothing else.

One process opens an LMDB environment with the engine's batch flags (``engine.log.lmdb_flags("batch")``:
``sync=True, metasync=False``, the engine's ``writemap`` setting for batch) in a temp dir on the data
directory's filesystem, and commits N write transactions one after another, each putting one 100-byte value under a new key. It prints the commit
latency p50/p99 (µs): what the disk's flush costs before a broker does any work. A confirm with
fsync=batch cannot be faster than one such commit, so issue 26's goal for the fsync=batch confirm p50 is
set against it (<= 2x this floor, measured in the same run).

    .venv/bin/python -m bench.fsync_floor [--commits 2000] [--dir PATH]
"""

import argparse
import os
import shutil
import tempfile
import time

import lmdb

from riverbed.engine.log import lmdb_flags


def measure(commits=2000, where=None, warmup=50):
    """``{"commits", "p50_us", "p99_us"}`` of ``commits`` synced LMDB commits of one 100-byte put each.

    ``where``: the directory to make the temp environment in (default: the system temp dir). Blocking;
    takes about commits x the disk's flush time. Removes what it made."""
    tmp = tempfile.mkdtemp(prefix="rb-fsync-floor-", dir=where)
    env = lmdb.open(tmp, map_size=64 << 20, **lmdb_flags("batch"))
    try:
        value = b"v" * 100
        lat = []
        for i in range(commits + warmup):
            t0 = time.perf_counter_ns()
            with env.begin(write=True) as txn:
                txn.put(i.to_bytes(8, "big"), value)
            lat.append(time.perf_counter_ns() - t0)
        lat = sorted(lat[warmup:])
        return {"commits": commits, "p50_us": lat[len(lat) // 2] / 1000,
                "p99_us": lat[min(len(lat) - 1, int(len(lat) * 0.99))] / 1000}
    finally:
        env.close()
        shutil.rmtree(tmp, ignore_errors=True)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--commits", type=int, default=2000)
    ap.add_argument("--dir", help="directory to measure in (default: the system temp dir)")
    a = ap.parse_args(argv)
    r = measure(a.commits, a.dir)
    print(f"fsync floor (bare LMDB commit with sync, {r['commits']:,} commits): "
          f"p50 {r['p50_us']:.1f} µs, p99 {r['p99_us']:.1f} µs")


if __name__ == "__main__":
    main()
