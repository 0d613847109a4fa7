"""What a one-message commit writes besides its chunk (engine/sparse.py, issue 26's fsync=batch row).

Under a sync policy each page a commit dirties is a disk write before the confirm. A one-message commit
used to copy the paths of three trees (chunks, timestamp index, stream states); now the timestamp index
is sparse and the state record is saved every STATE_SAVE_EVERY chunks, rolled forward over the chunks
after it when read. Seen here through which trees' roots a commit moves (LMDB copies a tree's path to
its root on every write to it), seek results against a dense index on the same records, the state after
a kill -9 between two saves, and a directory written the old way (dense index, a state per commit).
"""

import bisect
import os
import signal
import struct
import subprocess
import sys
import textwrap

import pytest

from riverbed.engine import Engine, OffsetSpec, sparse, staged, writer
from riverbed.engine.layout import _CHUNK_KEY, _Stream

_ROOT = struct.Struct("<Q")     # md_root of LMDB's MDB_db record (the value of a named db's key), at 40


class Clock:
    def __init__(self, now=1_700_000_000_000):
        self.now = now

    def __call__(self):
        return self.now


def _roots(eng):
    with eng.env.begin() as txn:
        return {name: _ROOT.unpack_from(txn.get(name), 40)[0] for name in (b"chunks", b"timeidx", b"streams")}


def _saved_state(eng, name):
    with eng.env.begin() as txn:
        return _Stream.decode(name, txn.get(name.encode(), db=eng._db_streams))


def _info(eng, name):
    i = eng.stream_info(name)
    return (i.first_chunk_id, i.last_chunk_id, i.next_offset, i.bytes, i.records, i.chunks, i.first_timestamp,
            i.last_timestamp)


@pytest.mark.parametrize("fsync", ["batch", "never"])
def test_a_one_message_commit_copies_the_chunks_tree_alone(tmp_path, fsync):
    eng = Engine(tmp_path / "d", fsync=fsync, retention_interval=0)
    try:
        eng.create_stream("s").result(10)
        for _ in range(10):
            eng.append("s", [b"x" * 100]).result(10)
        moved = dict.fromkeys((b"chunks", b"timeidx", b"streams"), 0)
        before = _roots(eng)
        for _ in range(256):
            eng.append("s", [b"x" * 100]).result(10)
            after = _roots(eng)
            for k in moved:
                moved[k] += after[k] != before[k]
            before = after
        assert moved[b"chunks"] == 256
        # one in TIME_INDEX_EVERY offsets and one in STATE_SAVE_EVERY chunks (64 each): 4, give or take one
        assert moved[b"timeidx"] <= 5 and moved[b"streams"] <= 5, moved
        assert eng.stream_info("s").next_offset == 266
    finally:
        eng.close()


def _build(path, clock, plan):
    """Append ``plan`` ([(records per append, ms the clock moves before it)]) to stream "t" one append at a
    time; trim the head once on the way. Returns the open Engine."""
    eng = Engine(path, fsync="never", retention_interval=0, clock=clock)
    eng.create_stream("t").result(10)
    for i, (n, step) in enumerate(plan):
        clock.now += step
        eng.append("t", [b"r%d" % i] * n).result(10)
        if i == len(plan) // 3:
            eng.trim_head("t", 150).result(10)      # the head's index entries go with their chunks
    return eng


class DenseAnswers:
    """What a seek by time must find: the first chunk whose header's timestamp is at or after ``ms``,
    from every chunk's header (the writer's timestamps never go back), else the next offset."""

    def __init__(self, eng, name):
        s = eng._streams[name]
        self.next_offset = s.next_offset
        self.ids, self.times = [], []
        with eng.read_txn() as txn:
            cur = txn.cursor(db=eng._db_chunks)
            ok = cur.set_range(_CHUNK_KEY.pack(s.sid, 0))
            while ok:
                sid, cid = _CHUNK_KEY.unpack(cur.key())
                if sid != s.sid:
                    break
                self.ids.append(cid)
                self.times.append(struct.unpack_from(">q", cur.value(), 8)[0])
                ok = cur.next()
        assert self.times == sorted(self.times)

    def __call__(self, ms):
        i = bisect.bisect_left(self.times, ms)
        return self.ids[i] if i < len(self.ids) else self.next_offset


def _plan():
    import random
    rnd = random.Random(26)
    plan = []
    for _ in range(900):
        n = rnd.choice([1] * 12 + [2, 3, 70, 200])
        plan.append((n, rnd.choice([0, 0, 1, 1, 2, 5, 40])))      # often the same ms, sometimes a gap
    return plan


def test_seek_by_timestamp_on_the_sparse_index_finds_what_a_dense_index_finds(tmp_path, monkeypatch):
    plan = _plan()
    sparse_eng = _build(tmp_path / "sparse", Clock(), plan)
    with monkeypatch.context() as m:
        m.setattr(sparse, "TIME_INDEX_EVERY", 1)        # an entry per chunk: the index as it was
        dense_eng = _build(tmp_path / "dense", Clock(), plan)
    try:
        for eng in (sparse_eng, dense_eng):
            with eng.read_txn() as txn:
                entries = txn.stat(eng._db_time)["entries"]
            assert _info(eng, "t") == _info(sparse_eng, "t")
            chunks = eng.stream_info("t").chunks
            if eng is dense_eng:
                assert entries == chunks
            else:
                assert entries < chunks // 3, (entries, chunks)
        answer = DenseAnswers(dense_eng, "t")
        lo = sparse_eng.stream_info("t").first_timestamp - 3
        hi = sparse_eng.stream_info("t").last_timestamp + 3
        for ms in range(lo, hi + 1):
            want = answer(ms)
            assert dense_eng.resolve("t", OffsetSpec.timestamp(ms)) == want, ms
            assert sparse_eng.resolve("t", OffsetSpec.timestamp(ms)) == want, ms
        assert sparse_eng.resolve("t", OffsetSpec.timestamp(-(1 << 62))) == sparse_eng.resolve("t", OffsetSpec.first())
        assert sparse_eng.resolve("t", OffsetSpec.timestamp(1 << 63)) == sparse_eng.stream_info("t").next_offset
        assert sparse_eng.chunk_index("t") == dense_eng.chunk_index("t")
    finally:
        sparse_eng.close()
        dense_eng.close()


_READER = textwrap.dedent("""
    import sys
    from riverbed.engine import Engine, OffsetSpec
    ro = Engine(sys.argv[1], readonly=True)
    i = ro.stream_info("s")
    print(i.first_chunk_id, i.last_chunk_id, i.next_offset, i.bytes, i.records, i.chunks, i.first_timestamp,
          i.last_timestamp, ro.resolve("s", OffsetSpec.next()))
    ro.close()
""")


def test_a_read_only_engine_rolls_the_unsaved_state_forward(tmp_path):
    eng = Engine(tmp_path / "d", fsync="batch", retention_interval=0)
    try:
        eng.create_stream("s").result(10)
        for i in range(100):
            eng.append("s", [b"m%d" % i]).result(10)
        assert _saved_state(eng, "s").next_offset == 64      # saved at the 64th chunk, 36 since
        # another process (LMDB must not be opened twice in one): a read-only Engine reads the record
        out = subprocess.run([sys.executable, "-c", _READER, str(tmp_path / "d")], capture_output=True, text=True,
                             check=True, timeout=60).stdout.split()
        assert [int(x) for x in out] == [*_info(eng, "s"), 100]
    finally:
        eng.close()
    eng = Engine(tmp_path / "d", fsync="batch", retention_interval=0)
    try:
        assert _saved_state(eng, "s").next_offset == 100     # a clean stop saves what was due
    finally:
        eng.close()


_CHILD = textwrap.dedent("""
    import sys
    from riverbed.engine import Engine
    eng = Engine(sys.argv[1], fsync="batch", retention_interval=0, clock=lambda: 1_700_000_000_000)
    eng.create_stream("s").result(10)
    for i in range(100):
        eng.append("s", [b"m%d" % i]).result(10)
    print("done", flush=True)
    sys.stdin.read()
""")


def test_a_kill_between_two_state_saves_loses_nothing_confirmed(tmp_path):
    path = tmp_path / "d"
    child = subprocess.Popen([sys.executable, "-c", _CHILD, str(path)], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "done"
    finally:
        os.kill(child.pid, signal.SIGKILL)
        child.wait(10)
    eng = Engine(path, fsync="batch", retention_interval=0)
    try:
        assert _saved_state(eng, "s").next_offset == 64       # the record the kill left behind
        info = eng.stream_info("s")
        assert (info.next_offset, info.records, info.chunks, info.last_chunk_id) == (100, 100, 100, 99)
        assert [bytes(r) for _, r in eng.scan("s")] == [b"m%d" % i for i in range(100)]
        assert eng.append("s", [b"after"]).result(10).first_offset == 100
        assert eng.resolve("s", OffsetSpec.timestamp(1_700_000_000_000)) == 0
    finally:
        eng.close()


def test_a_directory_written_with_a_state_per_commit_and_a_dense_index_opens_and_seeks_the_same(tmp_path,
                                                                                                  monkeypatch):
    clock = Clock()
    plan = _plan()[:300]
    with monkeypatch.context() as m:
        m.setattr(sparse, "TIME_INDEX_EVERY", 1)
        m.setattr(writer, "STATE_SAVE_EVERY", 1)     # the one-message commit's
        m.setattr(staged, "STATE_SAVE_EVERY", 1)     # the group commit's
        old = _build(tmp_path / "d", clock, plan)
        want = _info(old, "t")
        old.close()
    _set_format(tmp_path / "d", 1)                    # as the versions before sparse.py marked it
    eng = Engine(tmp_path / "d", fsync="never", retention_interval=0, clock=clock)
    try:
        with eng.read_txn() as txn:                   # marked 2 at once: older versions now refuse it
            assert bytes(txn.get(b"format", db=eng._db_meta)) == struct.pack(">I", 2)
        assert _info(eng, "t") == want
        lo, hi = want[6] - 2, want[7] + 2
        answer = DenseAnswers(eng, "t")
        for ms in range(lo, hi):
            assert eng.resolve("t", OffsetSpec.timestamp(ms)) == answer(ms), ms
        for i in range(100):                          # the new rules from here on, in the same stream
            clock.now += i % 3
            eng.append("t", [b"new%d" % i]).result(10)
        answer = DenseAnswers(eng, "t")
        for ms in range(lo, clock.now + 2):
            assert eng.resolve("t", OffsetSpec.timestamp(ms)) == answer(ms), ms
        assert eng.stream_info("t").next_offset == want[2] + 100
    finally:
        eng.close()


def _set_format(path, version):
    import lmdb
    env = lmdb.open(str(path), max_dbs=32, map_size=64 << 20)
    try:
        with env.begin(write=True) as txn:
            txn.put(b"format", struct.pack(">I", version), db=env.open_db(b"meta", txn=txn))
    finally:
        env.close()


def test_a_directory_of_an_unknown_format_is_refused(tmp_path):
    from riverbed.engine import RiverbedError
    Engine(tmp_path / "d", fsync="never").close()
    eng = Engine(tmp_path / "d", fsync="never")
    eng.create_stream("s").result(10)
    eng.close()
    _set_format(tmp_path / "d", 3)
    with pytest.raises(RiverbedError, match="unknown data format"):
        Engine(tmp_path / "d", fsync="never", readonly=True)
