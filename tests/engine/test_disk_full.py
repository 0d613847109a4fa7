"""A full disk and a capped data file: the engine refuses the write that does not fit (StorageFull), never
dies of SIGBUS, keeps every record it confirmed, and takes writes again once space returns.

The disk is a real small tmpfs the test mounts (tests/smallfs.py; skipped without permission to mount).
The engine that fills it runs in a child process, so that a SIGBUS (what a write through LMDB's map into
a sparse file on a full filesystem used to raise) fails the test instead of killing pytest.
"""

import os
import signal
import subprocess
import sys

import pytest

from riverbed.engine import Engine, StorageFull

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from smallfs import MIB, small_tmpfs  # noqa: E402

RECORD = 1024

# Appends 64 x 1 KiB records per call until one is refused, reports, waits for the parent to free space,
# appends again. Each record starts with its own index, so the parent can check every offset's content.
CHILD = r"""
import sys
from riverbed.engine import Engine, OffsetSpec, StorageFull

path, fsync = sys.argv[1], sys.argv[2]
eng = Engine(path, fsync=fsync)
eng.create_stream("s").result(timeout=60)
n = 0

def batch():
    return [b"%08d" % (n + i) + b"x" * (1024 - 8) for i in range(64)]

def append_until_full(limit):
    global n
    for _ in range(limit):
        try:
            eng.append("s", batch()).result(timeout=60)
        except StorageFull as e:
            return e
        n += 64
    return None

err = append_until_full(100000)
assert err is not None
# the engine is alive: a read sees every confirmed record, a consumer offset still commits (small writes
# fit in the map's free pages), and a second refusal is the same clean error
assert sum(1 for _ in eng.scan("s")) == n
assert isinstance(append_until_full(1), StorageFull)
print("full", n, str(err).replace("\n", " "), flush=True)
sys.stdin.readline()                  # the parent frees space
again = append_until_full(20)
assert again is None, again
print("done", n, flush=True)
eng.close()
"""


def _run_child(fs, data, fsync, free_space):
    proc = subprocess.Popen([sys.executable, "-c", CHILD, data, fsync], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        if not line.startswith("full "):
            proc.wait(timeout=60)
            assert proc.returncode != -signal.SIGBUS, "the engine died of SIGBUS on the full disk"
            pytest.fail(f"child exited {proc.returncode} before the disk was full: {line}{proc.stderr.read()}")
        full_at = int(line.split()[1])
        assert "disk full" in line or "cap" in line, line
        free_space()
        proc.stdin.write("go\n")
        proc.stdin.flush()
        line = proc.stdout.readline()
        proc.wait(timeout=60)
        assert proc.returncode == 0, f"exit {proc.returncode}: {line}{proc.stderr.read()}"
        return full_at, int(line.split()[1])
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _check_records(data, expected):
    with Engine(data, readonly=True) as eng:
        got = 0
        for offset, rec in eng.scan("s"):
            assert bytes(rec[:8]) == b"%08d" % offset and len(rec) == RECORD
            got += 1
    assert got == expected


@pytest.mark.parametrize("fsync", ["batch", "never"])
def test_engine_filling_a_small_disk_refuses_the_write_keeps_the_data_and_recovers_when_space_is_freed(fsync):
    with small_tmpfs("24m") as fs:
        data = os.path.join(fs.path, "data")
        fs.fill(leave=14 * MIB)               # the engine gets ~14 MiB; deleting the filler gives 10 more
        full_at, done_at = _run_child(fs, data, fsync, fs.unfill)
        assert full_at > 4000                 # most of the 14 MiB held records before the refusal
        assert done_at == full_at + 20 * 64
        _check_records(data, done_at)


def test_engine_on_a_full_disk_recovers_when_the_filesystem_grows():
    with small_tmpfs("16m") as fs:
        data = os.path.join(fs.path, "data")
        full_at, done_at = _run_child(fs, data, "batch", lambda: fs.resize("48m"))
        _check_records(data, done_at)
        assert done_at == full_at + 20 * 64


def test_engine_opens_on_a_nearly_full_disk_with_a_smaller_map():
    with small_tmpfs("8m") as fs:
        data = os.path.join(fs.path, "data")
        with Engine(data) as eng:             # a 64 MiB map cannot be reserved on 8 MiB: it starts smaller
            assert eng.env.info()["map_size"] <= 8 * MIB
            eng.create_stream("s").result(timeout=10)
            eng.append("s", [b"x" * RECORD] * 10).result(timeout=10)


def test_engine_refuses_appends_past_max_size_and_takes_them_again_after_a_deletion(tmp_path):
    cap = 8 * MIB
    with Engine(tmp_path / "d", max_size=cap) as eng:
        eng.create_stream("a").result(timeout=10)
        eng.create_stream("b").result(timeout=10)
        stored = 0
        with pytest.raises(StorageFull, match="max-disk") as info:
            for _ in range(10000):
                eng.append("a", [b"r" * RECORD] * 64).result(timeout=10)
                stored += 64
        assert info.value.limit == cap
        assert eng.env.info()["map_size"] <= cap
        assert os.path.getsize(tmp_path / "d" / "data.mdb") <= cap
        assert eng.stream_info("a").records == stored
        eng.store_offset("b", "reader", 5).result(timeout=10)     # small writes still fit
        eng.delete_stream("a").result(timeout=10)
        eng.sync().result(timeout=10)
        for _ in range(40):                  # the deleted stream's pages are purged in the background
            try:
                eng.append("b", [b"r" * RECORD] * 64).result(timeout=10)
                break
            except StorageFull:
                import time
                time.sleep(0.05)
        else:
            pytest.fail("appends were still refused after the stream that filled the cap was deleted")
    with Engine(tmp_path / "d", max_size=cap) as eng:
        assert eng.stream_info("b").records == 64
        assert eng.query_offset("b", "reader") == 5
