"""Streams the writer does not touch cost it nothing per commit or tick (issue 26: the bench's 2 × 2 publish
row cost twice as much per message on a broker that had just deleted the memory row's 10,000 streams).

Counted, not timed: purge transactions for many deleted streams, and the streams a retention pass looks at.
"""

import time

import pytest

from riverbed.engine.errors import StreamNotFound
from riverbed.engine.log import Engine
from riverbed.engine.writer import PURGE_KEYS

IDLE = 2_000
RECORDS = 10
LIVE_KEYS = 2       # the live stream's: one chunk and its index entry (offset 0)


def _fill(engine, k, prefix="idle", arguments=None):
    for f in [engine.create_stream(f"{prefix}-{i}", arguments) for i in range(k)]:
        f.result(60)
    for f in [engine.append(f"{prefix}-{i}", [b"x" * 100] * RECORDS) for i in range(k)]:
        f.result(60)


def _keys(engine):
    with engine.read_txn() as txn:
        return sum(txn.stat(db)["entries"] for db in (engine._db_chunks, engine._db_time, engine._db_tracking))


def _wait_purged(engine, timeout=60):
    engine.sync().result(timeout)       # the writer lists orphans (a killed purge's) before it takes any op
    end = time.monotonic() + timeout
    while engine._writer._purge:
        assert time.monotonic() < end, f"{len(engine._writer._purge)} deleted streams still to purge"
        time.sleep(0.005)


@pytest.fixture
def engine(tmp_path):
    e = Engine(tmp_path / "data", fsync="never", retention_interval=3600)
    yield e
    e.close()


def test_deleted_streams_are_purged_many_per_transaction(engine):
    _fill(engine, IDLE)
    engine.create_stream("live").result()
    engine.append("live", [b"y"] * 3).result()
    idle_keys = _keys(engine) - LIVE_KEYS
    steps = engine._writer.purge_steps
    with engine._writer._claim:     # the deletions in one commit, so the steps do not depend on its batching
        futures = [engine.delete_stream(f"idle-{i}") for i in range(IDLE)]
    for f in futures:
        f.result(60)
    _wait_purged(engine)
    used = engine._writer.purge_steps - steps
    # a step takes PURGE_KEYS keys and finished streams (one each): 2,000 streams of a chunk and an index
    # entry are 6 steps; one transaction per stream made them 2,000, each after a commit of live appends
    bound = -(-(idle_keys + IDLE) // PURGE_KEYS) + 1
    assert used <= bound, f"{used} purge transactions for {IDLE} deleted streams ({idle_keys} keys), bound {bound}"
    assert _keys(engine) == LIVE_KEYS                      # every key of the deleted streams is gone
    assert engine.stream_info("live").records == 3


def test_purge_of_a_long_stream_keeps_to_the_bound_per_transaction(engine):
    # one stream of more keys than a step takes, then small ones: every key goes, in steps of PURGE_KEYS
    engine.create_stream("long", {"chunk-max-records": 1}).result()
    for f in [engine.append("long", [b"z"]) for _ in range(PURGE_KEYS + 500)]:
        f.result(60)
    _fill(engine, 50, "small")
    keys = _keys(engine)
    steps = engine._writer.purge_steps
    with engine._writer._claim:     # one commit deletes them all (see above)
        futures = [engine.delete_stream("long")] + [engine.delete_stream(f"small-{i}") for i in range(50)]
    for f in futures:
        f.result(60)
    _wait_purged(engine)
    assert _keys(engine) == 0
    used = engine._writer.purge_steps - steps
    assert -(-keys // PURGE_KEYS) <= used <= -(-(keys + 51) // PURGE_KEYS) + 2


def test_retention_looks_only_at_streams_with_a_limit(engine):
    _fill(engine, IDLE)
    engine.create_stream("aged", {"max-age": "1s"}).result()
    engine.create_stream("capped", {"max-length-bytes": 10_000}).result()
    w = engine._writer
    engine.run_retention().result()
    before = w.retention_visits
    for _ in range(5):
        engine.run_retention().result()
    assert w.retention_visits - before == 5 * 2      # was 5 × 2,002: every stream at every tick
    # a deletion or a creation lists them again
    engine.delete_stream("aged").result()
    engine.create_stream("aged-2", {"max-age": "1s"}).result()
    engine.create_stream("plain").result()
    before = w.retention_visits
    engine.run_retention().result()
    assert w.retention_visits - before == 2


def test_retention_still_trims_a_limited_stream_among_idle_ones(engine):
    _fill(engine, 200)
    engine.create_stream("capped", {"max-length-bytes": 2_000, "chunk-max-records": 1}).result()
    for f in [engine.append("capped", [b"c" * 100]) for _ in range(100)]:
        f.result(60)
    engine.run_retention().result()
    info = engine.stream_info("capped")
    assert info.chunks < 100 and info.bytes <= 2_000 + 200
    assert info.last_offset == 99


# kill -9 in the middle of a purge: the keys of the deleted streams that were not removed yet are found
# again at the next open (Writer._find_orphans) and purged; the live streams keep every record
_PURGE_CHILD = r"""
import sys, time
from riverbed.engine.log import Engine
path, fsync, k = sys.argv[1], sys.argv[2], int(sys.argv[3])
e = Engine(path, fsync=fsync)
e.create_stream("live").result()
for f in [e.create_stream(f"gone-{i}", {"chunk-max-records": 1}) for i in range(k)]:
    f.result()
for f in [e.append(f"gone-{i}", [b"g" * 50] * 8) for i in range(k)]:     # 8 chunks each
    f.result()
e.append("live", [b"live-%d" % i for i in range(100)]).result()
for f in [e.delete_stream(f"gone-{i}") for i in range(k)]:
    f.result()
print("deleted", flush=True)
n = 100
while True:                 # live appends meanwhile, each acknowledged on stdout
    e.append("live", [b"live-%d" % n]).result()
    print(n, flush=True)
    n += 1
"""


def _sids(engine):
    """The stream ids that have keys in chunks, timeidx or tracking."""
    found = set()
    with engine.read_txn() as txn:
        for db in (engine._db_chunks, engine._db_time, engine._db_tracking):
            for key in txn.cursor(db=db).iternext(values=False):
                found.add(int.from_bytes(bytes(key[:4]), "big"))
    return found


def _raw_keys(path):
    import lmdb
    env = lmdb.open(str(path), max_dbs=32, readonly=True, lock=False, subdir=True)
    try:
        with env.begin() as txn:
            return sum(txn.stat(env.open_db(name, txn=txn, create=False))["entries"]
                       for name in (b"chunks", b"timeidx", b"tracking"))
    finally:
        env.close()


@pytest.mark.parametrize("fsync", ["never", pytest.param("batch", marks=pytest.mark.slow)])
def test_kill_9_during_the_purge_keeps_live_records_and_purges_the_rest_at_the_next_open(tmp_path, fsync):
    import signal
    import subprocess
    import sys
    k = 1000
    cut_short = 0
    for round_, delay in enumerate((0.0, 0.01, 0.03)):
        path = tmp_path / f"data-{round_}"
        child = subprocess.Popen([sys.executable, "-c", _PURGE_CHILD, str(path), fsync, str(k)],
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            assert child.stdout.readline() == "deleted\n", child.stderr.read()
            time.sleep(delay)
            child.send_signal(signal.SIGKILL)
            out = child.stdout.read()
        finally:
            child.kill()
            child.wait(30)
        acked = [int(x) for x in out.split("\n")[:-1]]      # a line cut by the kill is no acknowledgement
        last = max(acked, default=99)
        left = _raw_keys(path)
        cut_short += left > 2 + len(acked)                  # the kill left deleted streams' keys behind
        with Engine(path, fsync=fsync) as e:
            assert e.list_streams() == ["live"]
            _wait_purged(e)
            info = e.stream_info("live")
            assert info.records >= last + 1, f"round {round_}: {info.records} records, {last} acknowledged"
            assert _sids(e) == {e._streams["live"].sid}, f"round {round_}: keys of deleted streams left"
        with Engine(path, fsync=fsync) as e:                 # nothing left to find at the open after
            assert not e._writer._purge
    assert cut_short >= 1, "no kill landed inside a purge"


def test_retention_reads_a_stream_with_max_age_only_once_its_head_may_be_too_old(tmp_path):
    clock = [1_000_000]
    e = Engine(tmp_path / "data", fsync="never", retention_interval=3600, clock=lambda: clock[0])
    try:
        k = 300
        _fill(e, k, "aged", {"max-age": "10s", "chunk-max-records": 5})     # two chunks each
        w = e._writer
        e.run_retention().result()
        trims = w.retention_trims
        clock[0] += 5_000
        for _ in range(3):
            e.run_retention().result()
        assert w.retention_trims == trims, "streams within max-age were read again (was 300 per pass)"
        assert e.stream_info("aged-0").chunks == 2
        clock[0] += 5_001                  # now every first chunk is over 10 s old
        e.run_retention().result()
        assert w.retention_trims == trims + k
        assert all(e.stream_info(f"aged-{i}").chunks == 1 for i in range(0, k, 37))
    finally:
        e.close()


def test_a_stream_deleted_and_created_again_in_one_commit_leaves_no_keys_or_waiters_behind(engine):
    engine.create_stream("x").result()
    engine.append("x", [b"old"] * 10).result()
    old_sid = engine._streams["x"].sid
    woken = []
    engine.watch("x", 10, woken.append)              # a reader waiting at the old stream's end
    deleted = []
    engine.add_delete_listener(deleted.append)
    w = engine._writer
    with w._claim:      # the writer waits here with the deletion taken: the creation joins its commit
        f1 = engine.delete_stream("x")
        f2 = engine.create_stream("x")
        time.sleep(0.05)
    f1.result(10)
    f2.result(10)
    _wait_purged(engine)
    new_sid = engine._streams["x"].sid
    assert new_sid != old_sid and engine.stream_info("x").records == 0
    assert _sids(engine) == set(), "the old stream's keys were left (until the next open)"
    assert len(woken) == 1 and isinstance(woken[0], StreamNotFound)    # was never woken
    assert deleted == ["x"]
    assert old_sid not in engine._waiters
