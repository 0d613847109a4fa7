"""Crash recovery, corruption detection, map growth and multi-process use of a data directory.

Everything here uses real LMDB environments in tmp_path and real child processes (tests/engine/
_crash_child.py, run with this interpreter and environment). LMDB must never be open twice in one
process, so the parent opens its Engine only while no child is writing, or read-only.
"""

import concurrent.futures
import importlib.util
import mmap
import os
import queue
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from riverbed.engine import ChunkError, Engine, InvalidArgument, RiverbedError
from riverbed.engine.format import LEN_CHUNK_HEADER

HELPER = Path(__file__).with_name("_crash_child.py")
_spec = importlib.util.spec_from_file_location("riverbed_tests_crash_child", HELPER)
child_lib = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(child_lib)
check_record = child_lib.check_record
make_record = child_lib.make_record


# --------------------------------------------------------------------------------------------------------
# child processes


class Child:
    """A helper process whose stdout lines are collected by a thread (so its pipe never fills)."""

    def __init__(self, tmp_path, *args):
        self.stderr_path = tmp_path / f"child-{time.monotonic_ns()}.stderr"
        self._stderr = open(self.stderr_path, "wb")
        self.proc = subprocess.Popen(
            [sys.executable, str(HELPER), *map(str, args)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=self._stderr, env=dict(os.environ), text=True, bufsize=1)
        self.lines = queue.Queue()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self):
        for line in self.proc.stdout:
            if line.endswith("\n"):          # a line cut by SIGKILL is not an acknowledgement
                self.lines.put(line.rstrip("\n"))
        self.lines.put(None)

    def stderr(self):
        self._stderr.flush()
        return self.stderr_path.read_text(errors="replace")

    def expect(self, prefix, timeout=60):
        """The next stdout line, which must start with ``prefix``."""
        try:
            line = self.lines.get(timeout=timeout)
        except queue.Empty:
            pytest.fail(f"child said nothing for {timeout} s (waiting for {prefix!r}); stderr:\n{self.stderr()}")
        if line is None or not line.startswith(prefix):
            pytest.fail(f"child said {line!r}, expected {prefix!r}; exit {self.proc.poll()}; stderr:\n"
                        f"{self.stderr()}")
        return line.split()

    def send(self, text):
        self.proc.stdin.write(text + "\n")
        self.proc.stdin.flush()

    def finish(self, timeout=60):
        """Close stdin (the child's signal to stop) and wait for a clean exit."""
        try:
            self.proc.stdin.close()
        except BrokenPipeError:
            pass
        try:
            rc = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.stop()
            pytest.fail(f"child did not exit within {timeout} s; stderr:\n{self.stderr()}")
        assert rc == 0, f"child exited {rc}; stderr:\n{self.stderr()}"

    def stop(self):
        """Kill the child if it still runs and reap it. Idempotent."""
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        self._reader.join(10)
        for f in (self.proc.stdin, self.proc.stdout):
            try:
                f.close()
            except OSError:
                pass
        self._stderr.close()


@pytest.fixture
def children(tmp_path):
    """Start helper processes with ``children(*args)``; every one is stopped at teardown."""
    started = []

    def start(*args):
        c = Child(tmp_path, *args)
        started.append(c)
        return c

    yield start
    for c in started:
        c.stop()


# --------------------------------------------------------------------------------------------------------
# 1. SIGKILL while appending with fsync=always


def _verify_crash_dir(path, acked):
    """Open the directory read-write (recovery), check stream "s" record by record, close. Returns the
    number of records stored."""
    with Engine(path) as eng:
        info = eng.stream_info("s")
        n = 0
        for offset, rec in eng.scan("s"):
            assert offset == n, f"offset {offset} where {n} was expected (gap or reordering)"
            try:
                seq = check_record(rec)
            except ValueError as e:
                pytest.fail(f"record at offset {offset} is damaged: {e}")
            assert seq == offset + 1, f"record at offset {offset} holds sequence {seq}, expected {offset + 1}"
            n += 1
        assert n >= acked, f"acknowledged sequence {acked} but only {n} records survived"
        assert info.next_offset == n and info.records == n
        assert eng.query_publisher_sequence("s", "p") == n, "publisher sequence disagrees with the records"
    return n


@pytest.mark.slow
def test_sigkill_during_fsync_always_appends_loses_no_acknowledged_record(tmp_path, children):
    seed = random.randrange(1 << 30)
    rnd = random.Random(seed)
    path = tmp_path / "data"
    stored = 0
    kills_while_acking = 0
    for round_ in range(20):
        child = children("crash", path, rnd.randrange(1 << 30))
        start = int(child.expect("start")[1])
        assert start == stored, f"round {round_} (seed {seed}): child resumes after {start}, {stored} stored"
        first_ack = int(child.expect("")[0])
        assert first_ack > start
        time.sleep(rnd.uniform(0.05, 0.5))
        child.proc.send_signal(signal.SIGKILL)
        child.proc.wait(30)
        child.stop()
        assert child.proc.returncode == -signal.SIGKILL, \
            f"round {round_} (seed {seed}): child exited {child.proc.returncode} before the kill:\n{child.stderr()}"
        acked = first_ack
        while True:
            line = child.lines.get(timeout=10)
            if line is None:
                break
            acked = max(acked, int(line))
        kills_while_acking += acked > first_ack
        stored = _verify_crash_dir(path, acked)
        assert stored >= acked, f"round {round_} (seed {seed})"
    assert kills_while_acking >= 10, "the children hardly acknowledged anything before being killed"


# --------------------------------------------------------------------------------------------------------
# 2. a flipped byte in data.mdb


def _flip_in_file(path, needle, delta):
    """XOR 0xFF into byte ``delta`` of every occurrence of ``needle`` in ``path`` (LMDB may keep stale
    copies of a page, so every copy is damaged), in place through mmap: with a write map data.mdb is as
    large as the map. Returns how many were flipped."""
    found = 0
    with open(path, "r+b") as f, mmap.mmap(f.fileno(), 0) as m:
        pos = m.find(needle)
        while pos >= 0:
            m[pos + delta] ^= 0xFF
            found += 1
            pos = m.find(needle, pos + 1)
        m.flush()
    assert found, "chunk bytes not found in data.mdb"
    return found


def _write_distinct_chunks(path, count=5, per_chunk=4):
    """``count`` chunks of ``per_chunk`` records each in stream "s" (one append, one commit, one chunk
    each); returns ``(chunk ids, stored chunk bytes, records per chunk)``."""
    records = [[f"chunk-{c}-record-{r}-".encode() + bytes([65 + c]) * (40 + r) for r in range(per_chunk)]
               for c in range(count)]
    with Engine(path, map_size=16 << 20) as eng:     # a small data.mdb to search (with a write map the
        eng.create_stream("s").result()              # file is as large as the map)
        for recs in records:
            eng.append("s", recs).result()
        chunks = eng.read_chunks("s", 0, max_chunks=100)
    ids = [cid for cid, _ in chunks]
    assert ids == [c * per_chunk for c in range(count)]
    return ids, [raw for _, raw in chunks], records


def _expect_chunk_error(fn, chunk_id):
    with pytest.raises(ChunkError) as ei:
        fn()
    e = ei.value
    assert e.stream == "s" and e.chunk_id == chunk_id, f"ChunkError names {e.stream!r}/{e.chunk_id}: {e}"
    assert "'s'" in str(e) and f"chunk {chunk_id}" in str(e)
    return e


def test_flipped_byte_in_stored_chunk_raises_chunk_error_naming_stream_and_chunk(tmp_path):
    path = tmp_path / "data"
    ids, raws, records = _write_distinct_chunks(path)
    data_mdb = path / "data.mdb"
    bad_data, bad_magic = ids[2], ids[3]
    assert raws[3][0] == 0x50
    _flip_in_file(data_mdb, raws[2], LEN_CHUNK_HEADER + 10)   # a byte inside the first record's body
    _flip_in_file(data_mdb, raws[3], 0)                      # the magic/version byte

    with Engine(path) as eng:
        # chunks before the damaged ones still read fine
        assert eng.read_chunks("s", 0, max_chunks=2) == [(ids[0], raws[0]), (ids[1], raws[1])]
        # (scans decode chunks_per_txn chunks before yielding any, so only one chunk per transaction
        # yields the good chunks in front of the bad one)
        got = []
        with pytest.raises(ChunkError):
            for offset, rec in eng.scan("s", 0, chunks_per_txn=1):
                got.append(rec)
        assert got == records[0] + records[1]
        got = []
        with pytest.raises(ChunkError):
            for chunk_id, recs in eng.scan_chunks("s", 0, chunks_per_txn=1):
                got.append((chunk_id, recs))
        assert got == [(ids[0], records[0]), (ids[1], records[1])]

        # the chunk with a flipped data byte (CRC mismatch), read from its start and from inside it
        for start in (bad_data, bad_data + 1):
            e = _expect_chunk_error(lambda: eng.read_chunks("s", start, max_chunks=5), bad_data)
            assert "CRC" in e.reason
            _expect_chunk_error(lambda: list(eng.scan("s", start)), bad_data)
            _expect_chunk_error(lambda: list(eng.scan_chunks("s", start)), bad_data)
        _expect_chunk_error(lambda: list(eng.scan("s", 0)), bad_data)
        _expect_chunk_error(lambda: eng.read_chunks("s", 0, max_chunks=5), bad_data)

        # the chunk with a flipped magic byte
        e = _expect_chunk_error(lambda: eng.read_chunks("s", bad_magic), bad_magic)
        assert "magic" in e.reason
        _expect_chunk_error(lambda: list(eng.scan("s", bad_magic)), bad_magic)
        _expect_chunk_error(lambda: list(eng.scan_chunks("s", bad_magic)), bad_magic)

        # the chunk after both still reads fine
        assert eng.read_chunks("s", ids[4]) == [(ids[4], raws[4])]
        assert [r for _, r in eng.scan("s", ids[4])] == records[4]


def test_reading_from_inside_a_chunk_with_a_corrupt_header_names_stream_and_chunk(tmp_path):
    """Seeking to an offset inside a chunk reads that chunk's header (Engine._seek); a bad header found
    there must be reported like any other corrupt chunk, with the stream and the chunk id."""
    path = tmp_path / "data"
    ids, raws, records = _write_distinct_chunks(path)
    _flip_in_file(path / "data.mdb", raws[2], 0)
    _flip_in_file(path / "data.mdb", raws[4], 0)                 # the last chunk: seek uses cursor.last()
    with Engine(path) as eng:
        for bad in (ids[2], ids[4]):
            _expect_chunk_error(lambda: eng.read_chunks("s", bad + 1), bad)
            _expect_chunk_error(lambda: list(eng.scan("s", bad + 1)), bad)
            _expect_chunk_error(lambda: list(eng.scan_chunks("s", bad + 1)), bad)


def test_stream_info_with_a_corrupt_first_chunk_header_names_stream_and_chunk(tmp_path):
    """stream_info reads the first chunk's header for its timestamp; a bad header there must raise a
    ChunkError naming the stream and the chunk like every other read."""
    path = tmp_path / "data"
    ids, raws, records = _write_distinct_chunks(path)
    _flip_in_file(path / "data.mdb", raws[0], 0)
    with Engine(path) as eng:
        _expect_chunk_error(lambda: eng.stream_info("s"), ids[0])


# --------------------------------------------------------------------------------------------------------
# 3. map growth in the writer


def test_map_grows_by_itself_when_full(tmp_path):
    rnd = random.Random(7)
    path = tmp_path / "data"
    eng = Engine(path, map_size=1 << 20)
    try:
        initial = eng.env.info()["map_size"]
        assert initial <= 1 << 20
        eng.create_stream("s").result()

        # a reader thread in the same process keeps read transactions open while the map is remapped
        stop = threading.Event()
        reader_errors = []
        reads = [0]

        def reader():
            try:
                while not stop.is_set():
                    info = eng.stream_info("s")
                    if info.chunks:
                        eng.read_chunks("s", info.last_chunk_id)
                    reads[0] += 1
            except BaseException as e:  # noqa: BLE001 - reported below
                reader_errors.append(e)

        t = threading.Thread(target=reader)
        t.start()
        expected = []
        try:
            # ~20 MB in appends of up to ~600 kB, each its own commit (a commit holding more than one
            # chunk's worth for a stream is test_append_over_chunk_max_in_one_commit_is_split_into_chunks)
            while sum(map(len, expected)) < 20 << 20:
                batch = [make_record(len(expected) + i + 1, rnd.randbytes(rnd.randint(0, 2000)))
                         for i in range(rnd.randint(1, 500))]
                first = len(expected)
                expected += batch
                try:
                    res = eng.append("s", batch).result(30)
                except concurrent.futures.TimeoutError:
                    pytest.fail(f"append at offset {first} (map {eng.env.info()['map_size']} bytes) never "
                                f"completed")
                assert (res.first_offset, res.last_offset, res.duplicates) == (first, len(expected) - 1, [])
        finally:
            stop.set()
            t.join(60)
        assert not reader_errors, f"reader failed during map growth: {reader_errors[0]!r}"
        assert reads[0] > 0

        grown = eng.env.info()["map_size"]
        assert grown > initial and grown >= 20 << 20
        info = eng.stream_info("s")
        assert info.records == info.next_offset == len(expected)
        got = [rec for _, rec in eng.scan("s")]
        assert len(got) == len(expected)
        assert got == expected
    finally:
        eng.close()
    # the grown environment reopens with its data although the reopen asks for the small map_size
    # (LMDB maps at least the used size) and grows again when needed
    with Engine(path, map_size=1 << 20) as eng:
        assert eng.stream_info("s").records == len(expected)
        assert sum(1 for _ in eng.scan("s")) == len(expected)
        for i in range(20):
            eng.append("s", [rnd.randbytes(100_000)]).result(60)
        assert eng.stream_info("s").records == len(expected) + 20


def test_append_over_chunk_max_in_one_commit_is_split_into_chunks(tmp_path, children):
    """Entries that do not fit in the chunk being built start a new chunk: every record is stored
    once, in order, in chunks of at most chunk-max-bytes of data (one oversized entry excepted).

    Runs in a child process with a 1 GiB address-space limit and a deadline, because an engine that
    repeats chunks here never finishes the commit: it grows the map and its memory without bound."""
    child = children("split", tmp_path / "data")
    line = child.expect("", timeout=120)
    assert line[0] == "ok", f"child reported: {' '.join(line)}; stderr:\n{child.stderr()[-3000:]}"
    child.finish()


def test_unstorable_consumer_offset_is_refused_and_the_writer_keeps_working(tmp_path):
    """A consumer offset no 64-bit field holds fails that one operation with InvalidArgument (directly
    or through its future), and the writer goes on completing operations."""
    with Engine(tmp_path / "data") as eng:
        eng.create_stream("s").result(10)
        for bad in (1 << 64, -1):
            try:
                fut = eng.store_offset("s", "consumer", bad)
            except InvalidArgument:
                continue
            try:
                fut.result(5)
            except InvalidArgument:
                pass
            except concurrent.futures.TimeoutError:
                pytest.fail(f"store_offset({bad}) never completed: the writer thread died on it")
            else:
                pytest.fail(f"store_offset({bad}) was accepted")
        try:
            res = eng.append("s", [b"after"]).result(5)
        except concurrent.futures.TimeoutError:
            pytest.fail("the writer no longer completes anything")
        assert res.first_offset == 0
        eng.store_offset("s", "consumer", (1 << 63) - 1).result(5)
        assert eng.query_offset("s", "consumer") == (1 << 63) - 1


def test_disk_full_fails_appends_instead_of_hanging(tmp_path, children):
    """When the data file cannot grow (here: RLIMIT_FSIZE in a child, so writes past 8 MiB fail with
    EFBIG, as on a full disk), the append that hits it and the ones after it complete with an error:
    no caller waits forever on a writer that has given up."""
    child = children("disk-full", tmp_path / "data")
    line = child.expect("", timeout=120)
    assert line[0] == "ok", f"child reported: {' '.join(line)}; stderr:\n{child.stderr()[-3000:]}"
    child.finish()


# --------------------------------------------------------------------------------------------------------
# 4. a read-only reader while another process grows the map


def test_reader_survives_map_resize_by_another_process(tmp_path, children):
    path = tmp_path / "data"
    child = children("grow", path, 40)
    child.expect("ready")
    # The reader's own map must be smaller than what the writer grows to, or LMDB never reports
    # MDB_MAP_RESIZED: the default map_size (64 MiB) would simply cover all of it.
    eng = Engine(path, readonly=True, map_size=1 << 20)
    try:
        initial = eng.env.info()["map_size"]
        info = eng.stream_info("s")
        assert info.records == 10
        assert [check_record(r) for _, r in eng.scan("s")] == list(range(1, 11))

        child.send("go")
        # read all the time while the child writes and grows the map
        seen = 10
        polls = 0
        deadline = time.monotonic() + 30
        while True:
            try:
                done = child.lines.get_nowait()
                break
            except queue.Empty:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"the writer child did not finish growing within 30 s; stderr:\n"
                            f"{child.stderr()[-3000:]}")
            info = eng.stream_info("s")
            assert info.records >= seen
            chunks = eng.read_chunks("s", seen - 1, max_chunks=4)
            assert chunks and chunks[0][0] <= seen - 1
            seen = info.records
            polls += 1
            time.sleep(0.001)
        assert polls > 0
        assert done is not None and done.startswith("done"), f"child said {done!r}:\n{child.stderr()}"
        _, total, child_map = done.split()
        total = int(total)
        assert int(child_map) >= 40 << 20

        info = eng.stream_info("s")
        assert info.records == info.next_offset == total
        chunks = eng.read_chunks("s", 0, max_chunks=1 << 20)
        assert chunks[0][0] == 0 and chunks[-1][0] == info.last_chunk_id
        n = 0
        for offset, rec in eng.scan("s"):
            assert offset == n and check_record(rec) == n + 1
            n += 1
        assert n == total
        assert eng.env.info()["map_size"] > initial, "the reader never adopted the grown map"
    finally:
        eng.close()
    child.finish()


# --------------------------------------------------------------------------------------------------------
# 5. one writer per directory


def test_second_writer_on_same_directory_is_refused(tmp_path, children):
    path = tmp_path / "data"
    with Engine(path) as eng:
        eng.create_stream("s").result()
        eng.append("s", [b"first"]).result()
        second = children("try-writer", path)
        words = second.expect("refused")
        second.finish()
        assert words[1] == "RiverbedError"
        message = " ".join(words[2:])
        assert "lock" in message and str(path) in message, message
        # the refused writer changed nothing
        assert [r for _, r in eng.scan("s")] == [b"first"]
        eng.append("s", [b"second"]).result()

    # a child holding the directory refuses this process too, before LMDB is opened here
    holder = children("hold", path)
    holder.expect("ready")
    with pytest.raises(RiverbedError, match="lock"):
        Engine(path)
    holder.finish()

    # once the writer is gone, the directory opens again
    with Engine(path) as eng:
        assert [r for _, r in eng.scan("s")] == [b"first", b"second"]


# --------------------------------------------------------------------------------------------------------
# 6. close and reopen


def test_restart_keeps_streams_offsets_and_sequences(tmp_path):
    path = tmp_path / "data"
    args_a = {"x-max-length-bytes": 10_000_000, "x-max-age": "7D", "x-stream-max-segment-size-bytes": 500000}
    with Engine(path) as eng:
        eng.create_stream("a", args_a).result()
        eng.create_stream("b", {"stream-filter-size-bytes": 32}).result()
        eng.create_stream("empty").result()
        eng.create_stream("gone").result()
        eng.append("gone", [b"x"]).result()
        eng.delete_stream("gone").result()
        res = eng.append("a", [b"a0", b"a1", b"a2"], publishing_ids=[1, 2, 3], publisher="pub").result()
        assert (res.first_offset, res.last_offset) == (0, 2)
        eng.append("a", [b"a3", b"a4"], publishing_ids=[7, 9], publisher="pub").result()
        eng.append("a", [b"a5"], publishing_ids=[1], publisher="other").result()
        eng.append("b", [b"b0", b"b1"], filter_values=[b"red", b"blue"]).result()
        eng.store_offset("a", "consumer-1", 3).result()
        eng.store_offset("a", "consumer-2", 5).result()
        eng.store_offset("b", "consumer-1", 1).result()
        before = {name: eng.stream_info(name) for name in ("a", "b", "empty")}

    with Engine(path) as eng:
        assert eng.list_streams() == ["a", "b", "empty"]
        assert not eng.has_stream("gone")
        for name, old in before.items():
            assert eng.stream_info(name) == old
        assert eng.stream_info("a").arguments == {"max-length-bytes": "10000000", "max-age": "7D",
                                                  "stream-max-segment-size-bytes": "500000"}
        assert eng.stream_info("b").arguments == {"stream-filter-size-bytes": "32"}
        assert eng.stream_info("empty").next_offset == 0
        assert [r for _, r in eng.scan("a")] == [b"a0", b"a1", b"a2", b"a3", b"a4", b"a5"]
        assert [r for _, r in eng.scan("b")] == [b"b0", b"b1"]
        assert eng.query_offset("a", "consumer-1") == 3
        assert eng.query_offset("a", "consumer-2") == 5
        assert eng.query_offset("b", "consumer-1") == 1
        assert eng.query_offset("b", "consumer-2") is None
        assert eng.query_publisher_sequence("a", "pub") == 9
        assert eng.query_publisher_sequence("a", "other") == 1
        assert eng.query_publisher_sequence("b", "pub") == 0

        # deduplication continues from the stored sequence; appends continue at the stored offset
        res = eng.append("a", [b"dup", b"a6"], publishing_ids=[9, 10], publisher="pub").result()
        assert (res.first_offset, res.last_offset, res.duplicates) == (6, 6, [9])
        res = eng.append("b", [b"b2"]).result()
        assert (res.first_offset, res.last_offset) == (2, 2)
        assert eng.read_chunks("b", 2)[0][0] == 2
        res = eng.append("empty", [b"e0"]).result()
        assert (res.first_offset, res.last_offset) == (0, 0)
        eng.store_offset("a", "consumer-1", 6).result()
        # a stream re-created under a deleted name starts empty, without the old one's records
        eng.create_stream("gone").result()
        assert eng.stream_info("gone").records == 0
        eng.append("gone", [b"new"]).result()

    with Engine(path) as eng:
        assert [r for _, r in eng.scan("a")] == [b"a0", b"a1", b"a2", b"a3", b"a4", b"a5", b"a6"]
        assert eng.stream_info("a").next_offset == 7
        assert [r for _, r in eng.scan("b")] == [b"b0", b"b1", b"b2"]
        assert [r for _, r in eng.scan("empty")] == [b"e0"]
        assert [r for _, r in eng.scan("gone")] == [b"new"]
        assert eng.query_offset("a", "consumer-1") == 6
        assert eng.query_publisher_sequence("a", "pub") == 10
        res = eng.append("a", [b"a7"]).result()
        assert (res.first_offset, res.last_offset) == (7, 7)
