"""The commit path under the sync policies (issue 26: fsync=batch confirm latency near the fsync floor).

A commit that syncs leaves every page it wrote clean. Written through a shared map (MDB_WRITEMAP), the
next commit's puts would then take one page fault per page they touch, on the writer thread, before its
sync even starts (~7.6 per one-message commit, ~45 µs on the issue's VM). So the sync policies open LMDB
without WRITEMAP (dirty pages built in memory, written with pwrite, then fdatasync); ``never``, which
never syncs, keeps it. Counted with the writer thread's minor faults (Linux /proc), not with a clock.
"""

import os
import sys

import pytest

from riverbed.engine import Engine
from riverbed.engine.log import lmdb_flags

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="counts faults in /proc")

COMMITS = 200


def _minor_faults(tid):
    fields = open(f"/proc/self/task/{tid}/stat").read().rsplit(")", 1)[1].split()
    return int(fields[7])     # minflt: field 10 of stat, the 8th after the command name


def _faults_per_commit(eng):
    eng.create_stream("s").result(10)
    for _ in range(50):           # the tree and the free list settle into their steady state
        eng.append("s", [b"x" * 100]).result(10)
    tid = eng._writer.native_id
    before = _minor_faults(tid)
    for _ in range(COMMITS):      # one at a time: each append is a group commit of its own
        eng.append("s", [b"x" * 100]).result(10)
    return (_minor_faults(tid) - before) / COMMITS


@pytest.mark.parametrize("fsync", ["batch", "always"])
def test_a_synced_commit_takes_no_page_fault_per_page_it_writes(tmp_path, fsync, monkeypatch):
    monkeypatch.setattr("riverbed.engine.log.WRITEMAP", None)    # the default, whatever the environment
    eng = Engine(tmp_path / "d", fsync=fsync, retention_interval=0)
    try:
        assert eng.env.flags()["writemap"] is False
        assert _faults_per_commit(eng) < 1.0
    finally:
        eng.close()


def test_fsync_never_keeps_writing_through_the_map(tmp_path, monkeypatch):
    monkeypatch.setattr("riverbed.engine.log.WRITEMAP", None)
    eng = Engine(tmp_path / "d", fsync="never", retention_interval=0)
    try:
        assert eng.env.flags()["writemap"] is True
        assert eng.env.flags()["sync"] is False
    finally:
        eng.close()


def test_the_flags_of_each_policy_and_the_override(monkeypatch):
    monkeypatch.setattr("riverbed.engine.log.WRITEMAP", None)
    assert lmdb_flags("batch") == {"sync": True, "metasync": False, "writemap": False}
    assert lmdb_flags("always") == {"sync": True, "metasync": True, "writemap": False}
    assert lmdb_flags("never") == {"sync": False, "metasync": False, "writemap": True}
    monkeypatch.setattr("riverbed.engine.log.WRITEMAP", "1")    # RIVERBED_WRITEMAP=1 forces it
    assert lmdb_flags("batch")["writemap"] is True
    monkeypatch.setattr("riverbed.engine.log.WRITEMAP", "0")
    assert lmdb_flags("never")["writemap"] is False


def test_the_fsync_floor_opens_lmdb_with_the_engines_batch_flags(tmp_path, monkeypatch):
    """The floor that fsync=batch's confirm p50 is judged against commits the way the engine does."""
    import lmdb

    from bench import fsync_floor
    seen = []
    real_open = lmdb.open

    def spy(path, **kw):
        seen.append({k: kw.get(k) for k in ("sync", "metasync", "writemap")})
        return real_open(path, **kw)
    monkeypatch.setattr(fsync_floor.lmdb, "open", spy)
    r = fsync_floor.measure(commits=5, where=os.fspath(tmp_path), warmup=1)
    assert r["commits"] == 5 and seen == [lmdb_flags("batch")]
