"""The writer thread's housekeeping: retention and the purge of deleted streams, between commits.

A mixin of ``_Writer`` (writer.py): the thread runs it when its queue is idle and after each group commit,
holding ``_claim`` as a commit does, so it never runs beside a write. It owns the state of that work
(the deleted streams' ids still to purge, the streams with a retention limit, when each head is due) and
its counters, which tests hold against the number of streams (issue 26). The commit path touches it in
two places only: ``_publish`` queues a deleted stream's id in ``_purge`` and, after a creation or deletion,
sets ``_limited`` to None (list the limited streams again). It uses the writer's ``engine``, ``_grow``,
``_storage_full`` and ``_seq_cache``. Kept apart from the thread's queue and commits: none of it is on the
path of a message, and its rules (small transactions, nothing per idle stream) are its own.
"""

import logging
import time

import lmdb

from riverbed.engine import core
from riverbed.engine.errors import StorageFull
from riverbed.engine.format import H_RECORDS, H_TIMESTAMP
from riverbed.engine.layout import _CHUNK_KEY, _SID, _TIME_KEY, _U64, TS_BIAS

log = logging.getLogger("riverbed.engine")

PURGE_KEYS = 1000               # keys (and finished streams) of deleted streams one purge transaction takes, at most


class Housekeeping:
    """Retention and purging for ``_Writer``: see the module docstring for what it shares with the writer."""

    def _init_housekeeping(self, retention_interval):
        self.retention_interval = retention_interval
        self._next_retention = time.monotonic() + retention_interval
        self._purge = []          # sids of deleted streams whose keys are still to be removed
        # names of the streams with a retention limit, or None to list them again (_retention); counters
        # of the work the housekeeping did, which tests hold against the number of streams (issue 26)
        self._limited = None
        self._head_due = {}           # sid -> time (ms) until which its first chunk is within max-age
        self.retention_visits = 0     # streams _retention looked at, summed over its ticks
        self.retention_trims = 0      # streams it read in a write transaction (_trim)
        self.purge_steps = 0          # purge transactions

    def _idle_timeout(self):
        """How long the thread's queue wait may block: it wakes for the next purge step or retention tick."""
        if self._purge:
            return 0.001
        return max(0.01, self._next_retention - time.monotonic()) if self.retention_interval else None

    def _housekeeping(self, force_retention=False):
        try:
            if self._purge:
                self._purge_step()
            if force_retention or (self.retention_interval and time.monotonic() >= self._next_retention):
                self._next_retention = time.monotonic() + self.retention_interval
                self._retention()
        except lmdb.MapFullError:
            # a purge or trim transaction needs a page more than the map has: grow it, or (no space) try
            # again at the next pass; what they free is what a full disk waits for
            try:
                self._grow(0)
            except StorageFull as e:
                self._storage_full(e)

    def _retention(self):
        """Trim every stream over its retention limit. Only streams that have a limit are looked at: their
        names are listed again after a creation or deletion (``_limited``), not walked from all streams at
        every tick, so a broker holding 10,000 streams without limits pays nothing per stream and second
        (issue 26). A stream within its bytes is read (a write transaction, ``_trim``) only once its first
        chunk may be over ``max-age``: not every stream with a limit every second. Runs under ``_claim``,
        as ``_publish`` does."""
        eng = self.engine
        limited = self._limited
        if limited is None:
            states = [s for s in list(eng._streams.values()) if s.max_bytes is not None or s.max_age_ms is not None]
            limited = self._limited = [s.name for s in states]
            live = {s.sid for s in states}
            self._head_due = {sid: due for sid, due in self._head_due.items() if sid in live}
        self.retention_visits += len(limited)
        now = eng.clock()
        streams = eng._streams
        head_due = self._head_due
        for name in limited:
            s = streams.get(name)
            if s is None or s.chunks <= 1:
                continue
            if s.max_bytes is None or s.bytes <= s.max_bytes:
                # within its bytes: only its age can trim it, and not before its first chunk is too old
                # (a head only moves forward, so the time noted at the last pass is never too late)
                if s.max_age_ms is None or now <= head_due.get(s.sid, now - 1):
                    continue
            self._trim(name, s, now)

    def _trim(self, name, s, now):
        """Remove whole chunks from the head of ``s`` until it is within its limits, keeping the last
        chunk, in transactions of at most 1,000 chunks so appends are not held up for long."""
        eng = self.engine
        self.retention_trims += 1
        while True:
            new = s.copy()
            removed = 0
            eng._gate.enter()
            try:
                with eng.env.begin(write=True, buffers=True) as txn:
                    cur = txn.cursor(db=eng._db_chunks)
                    ok = cur.set_range(_CHUNK_KEY.pack(s.sid, 0))
                    while ok and removed < 1000 and new.chunks > 1:
                        sid, chunk_id = _CHUNK_KEY.unpack(cur.key())
                        if sid != s.sid:
                            break
                        h = core.read_header(cur.value())
                        size = len(cur.value())
                        too_big = new.max_bytes is not None and new.bytes > new.max_bytes
                        too_old = new.max_age_ms is not None and h[H_TIMESTAMP] < now - new.max_age_ms
                        if not (too_big or too_old):
                            if new.max_age_ms is not None:   # the head stays until then (_retention)
                                self._head_due[s.sid] = h[H_TIMESTAMP] + new.max_age_ms
                            break
                        txn.delete(_TIME_KEY.pack(sid, h[H_TIMESTAMP] + TS_BIAS, chunk_id), db=eng._db_time)
                        ok = cur.delete()
                        new.bytes -= size
                        new.records -= h[H_RECORDS]
                        new.chunks -= 1
                        removed += 1
                    if removed:
                        new.first_chunk = _CHUNK_KEY.unpack(cur.key())[1] if ok else new.last_chunk
                        txn.put(name.encode(), new.encode(), db=eng._db_streams)
            finally:
                eng._gate.leave()
            if not removed:
                return
            with eng._lock:
                cur_s = eng._streams.get(name)
                if cur_s is None or cur_s.sid != s.sid:
                    return
                # appends may have committed meanwhile; only the head moved here
                merged = cur_s.copy()
                merged.first_chunk = new.first_chunk
                merged.bytes -= s.bytes - new.bytes
                merged.records -= s.records - new.records
                merged.chunks -= s.chunks - new.chunks
                eng._streams[name] = merged
            log.debug("retention removed %d chunks from %s; first chunk now %d", removed, name,
                      new.first_chunk)
            s = merged
            if removed < 1000:
                self._release()
                return

    def _find_orphans(self):
        """Stream ids with keys but no stream (a delete interrupted by a crash) are purged again."""
        eng = self.engine
        live = {s.sid for s in eng._streams.values()}
        found = set()
        with eng.read_txn() as txn:
            for db in (eng._db_chunks, eng._db_tracking, eng._db_time):
                cur = txn.cursor(db=db)
                ok = cur.first()
                while ok:
                    sid = _SID.unpack_from(cur.key())[0]
                    if sid not in live:
                        found.add(sid)
                    ok = cur.set_range(_SID.pack(sid + 1)) if sid < 0xFFFFFFFF else False
        self._purge.extend(sorted(found))

    def _purge_step(self):
        """Remove up to PURGE_KEYS keys of deleted streams in one transaction, of as many streams as they
        span. One transaction per deleted stream made 10,000 deleted streams (the bench's memory row)
        10,000 transactions, one after each commit of the appends going on meanwhile, which doubled what
        a published message cost until they were done (issue 26); a few chunks each, they are now a few
        dozen. Returns the keys removed plus the streams finished (the step's work)."""
        eng = self.engine
        purge = self._purge
        removed = finished = 0
        self.purge_steps += 1
        eng._gate.enter()
        try:
            with eng.env.begin(write=True, buffers=True) as txn:
                cursors = [txn.cursor(db=db) for db in (eng._db_chunks, eng._db_time, eng._db_tracking)]
                for sid in purge:
                    prefix = _SID.pack(sid)
                    for cur in cursors:
                        ok = cur.set_range(prefix)
                        while ok and removed < PURGE_KEYS and bytes(cur.key()[:4]) == prefix:
                            ok = cur.delete()
                            removed += 1
                    if removed >= PURGE_KEYS:
                        break       # this stream may have keys left: the next step looks again
                    finished += 1
                    removed += 1    # a stream with no keys left costs its three seeks: bound them too
        finally:
            eng._gate.leave()
        gone = set(purge[:finished + 1])
        del purge[:finished]
        if finished:
            self._release()
        if self._seq_cache:
            self._seq_cache = {k: v for k, v in self._seq_cache.items() if k[0] not in gone}
        return removed

    def _release(self):
        """After a purge or a trim while space is short (a growth was refused): commit one tiny write, so
        that the pages just freed can be reused at once. LMDB gives a transaction only the pages freed
        before the last commit, and refused appends commit nothing."""
        eng = self.engine
        if eng._space is None or eng._space.refused is None:
            return
        eng._gate.enter()
        try:
            with eng.env.begin(write=True) as txn:
                txn.put(b"released", _U64.pack(time.time_ns()), db=eng._db_meta)
        finally:
            eng._gate.leave()
