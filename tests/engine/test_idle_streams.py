"""Streams the writer does not touch cost it nothing per commit or tick (issue 26: the bench's 2 × 2 publish
row cost twice as much per message on a broker that had just deleted the memory row's 10,000 streams).

Counted, not timed: purge transactions for many deleted streams, and the streams a retention pass looks at.
"""

import time

import pytest

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
    for f in [engine.delete_stream(f"idle-{i}") for i in range(IDLE)]:
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
    engine.delete_stream("long").result()
    for f in [engine.delete_stream(f"small-{i}") for i in range(50)]:
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
