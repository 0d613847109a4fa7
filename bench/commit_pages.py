"""Pages one one-message commit writes, counted, not timed (issue 26: the fsync=batch confirm).

Under a sync policy LMDB writes a commit's dirty pages with pwrite, fdatasyncs, then writes the meta
page; each run of adjacent pages is one disk request, and on the VM of bench/results/2026-11-26-vm.md
each request costs about as much as a small commit. This tool opens an Engine (fsync=batch by default,
without WRITEMAP, as the server does) on a temp dir, fills one stream with ``--fill`` one-message
chunks (the tree gets the depth a benchmark's stream has), then commits ``--commits`` more one at a
time and, after each, compares data.mdb page by page with the copy before it: pages changed (the two
meta pages apart), runs of adjacent changed pages, and which named databases' roots moved (each moved
root is a tree that copied its path). ``--floor`` counts the same for bench.fsync_floor's bare commit
(one 100-byte put in LMDB's main database); ``--dense`` writes as the engine did before engine/sparse.py
(an index entry and a state record per commit).

    .venv/bin/python -m bench.commit_pages [--fill 20000] [--commits 200] [--dense | --floor]
"""

import argparse
import os
import shutil
import struct
import tempfile

_ROOT = struct.Struct("<Q")
_ROOT_AT = 40           # md_root in LMDB's MDB_db record (64-bit build), the value of a named db's key
NAMED = (b"chunks", b"timeidx", b"streams", b"tracking", b"meta")


def _pages(path, psize, npages):
    with open(os.path.join(path, "data.mdb"), "rb") as f:
        data = f.read(npages * psize)
    return [data[i:i + psize] for i in range(0, len(data), psize)]


def _roots(env):
    out = {}
    with env.begin() as txn:
        for name in NAMED:
            raw = txn.get(name)
            if raw is not None and len(raw) >= _ROOT_AT + 8:
                out[name.decode()] = _ROOT.unpack_from(raw, _ROOT_AT)[0]
    return out


def count(env, path, commit, commits):
    """Commit ``commit()`` ``commits`` times; ``{"pages", "runs", "roots"}``: changed data pages and runs
    of adjacent ones per commit (sorted lists), and how often each named db's root moved."""
    psize = env.stat()["psize"]
    pages, runs, moved = [], [], {}
    before = _pages(path, psize, env.info()["last_pgno"] + 1)
    roots = _roots(env)
    for _ in range(commits):
        commit()
        after = _pages(path, psize, env.info()["last_pgno"] + 1)
        changed = [i for i in range(2, len(after)) if i >= len(before) or after[i] != before[i]]
        pages.append(len(changed))
        runs.append(sum(1 for k, p in enumerate(changed) if k == 0 or changed[k - 1] != p - 1))
        now = _roots(env)
        for name, root in now.items():
            if roots.get(name) != root:
                moved[name] = moved.get(name, 0) + 1
        before, roots = after, now
    return {"pages": sorted(pages), "runs": sorted(runs), "roots": moved}


def engine_counts(fill, commits, fsync="batch", dense=False):
    from riverbed.engine import Engine, sparse, staged, writer
    if dense:       # what every commit wrote before sparse.py: an index entry and the state record
        sparse.TIME_INDEX_EVERY = 1
        writer.STATE_SAVE_EVERY = staged.STATE_SAVE_EVERY = 1     # the one-message and group commits'
    tmp = tempfile.mkdtemp(prefix="rb-commit-pages-")
    eng = Engine(os.path.join(tmp, "d"), fsync=fsync, retention_interval=0)
    try:
        eng.create_stream("s").result(30)
        body = [b"x" * 100]
        for _ in range(fill):
            eng.append("s", body).result(30)
        return count(eng.env, eng.path, lambda: eng.append("s", body).result(30), commits)
    finally:
        eng.close()
        shutil.rmtree(tmp, ignore_errors=True)


def floor_counts(fill, commits):
    import lmdb

    from riverbed.engine.log import lmdb_flags
    tmp = tempfile.mkdtemp(prefix="rb-commit-pages-")
    env = lmdb.open(tmp, map_size=64 << 20, **lmdb_flags("batch"))
    try:
        value = b"v" * 100
        i = 0

        def put():
            nonlocal i
            with env.begin(write=True) as txn:
                txn.put(i.to_bytes(8, "big"), value)
            i += 1
        for _ in range(fill):
            put()
        return count(env, tmp, put, commits)
    finally:
        env.close()
        shutil.rmtree(tmp, ignore_errors=True)


def summary(r):
    p, n = r["pages"], r["runs"]
    mean = sum(p) / len(p)
    return (f"pages/commit mean {mean:.2f} p50 {p[len(p) // 2]} max {p[-1]}; runs (disk requests) mean "
            f"{sum(n) / len(n):.2f} p50 {n[len(n) // 2]}; roots moved per {len(p)} commits: "
            + ", ".join(f"{k} {v}" for k, v in sorted(r["roots"].items())))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--fill", type=int, default=20000, help="one-message chunks stored first (default 20,000)")
    ap.add_argument("--commits", type=int, default=200)
    ap.add_argument("--fsync", default="batch")
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--dense", action="store_true", help="write as before engine/sparse.py")
    mode.add_argument("--floor", action="store_true", help="bench.fsync_floor's bare commit instead")
    a = ap.parse_args(argv)
    if a.floor:
        r = floor_counts(a.fill, a.commits)
        what = "fsync floor (one put in LMDB's main db)"
    else:
        r = engine_counts(a.fill, a.commits, a.fsync, a.dense)
        what = f"engine one-message commit, fsync={a.fsync}{', dense (before)' if a.dense else ''}"
    print(f"{what}, fill {a.fill:,}: {summary(r)}")


if __name__ == "__main__":
    main()
