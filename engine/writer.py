"""The writer thread: every write of a data directory, applied in group commits.

One thread per environment takes operations from a queue, applies everything that is pending in ONE
write transaction, commits, syncs according to the fsync policy, and only then completes the callers'
futures and wakes tailing readers. Appends to the same stream that meet in one transaction share one
chunk (up to the stream's bytes and records per chunk; a commit's last chunk of a stream is kept small,
see CHUNK_BODY_RECORDS). Tracking state (publisher sequences, consumer offsets) is written in the same
transaction as the records it belongs to; ``Engine.transact`` lets a caller stage its own writes
(documents, positions) in it. py-lmdb releases the GIL during commit, so the
thread does not stall an asyncio loop. Only this thread writes to the environment.

This module holds the thread, its queue, the requests it takes, the group commit and the one-message
commits that skip it (inline on the caller's thread, ``_commit_alone``). What one group commit stages, and
the chunk shape, are in staged.py; retention and the purge of deleted streams in housekeeping.py.
"""

import json
import logging
import queue
import threading
import time

import lmdb

from riverbed.engine import core
from riverbed.engine.errors import InvalidArgument, RiverbedError, StorageFull, StreamNotFound
from riverbed.engine.format import LEN_CHUNK_HEADER, TRACKING_OFFSET, TRACKING_SEQUENCE
# retention and purging; PURGE_KEYS is read here by tests
from riverbed.engine.housekeeping import PURGE_KEYS, Housekeeping  # noqa: F401
from riverbed.engine.layout import (
    _U64, CHUNK_EPOCH, FSYNC_RANK, AppendResult, PublishingIds, _check_name, _tracking_key,
)
from riverbed.engine.replica_alone import replicate_alone
from riverbed.engine.sparse import STATE_SAVE_EVERY, put_chunk
# the staging of a group commit and the chunk shape; CHUNK_BODY_RECORDS is read here by tests and benches
from riverbed.engine.staged import CHUNK_BODY_RECORDS, NO_SEQUENCE, _Deferred, _Staged, _wants_sync  # noqa: F401

log = logging.getLogger("riverbed.engine")

SEQ_KEYS_MAX = 4096             # publisher tracking keys the one-message commit keeps built
_tuple_new = tuple.__new__

# --------------------------------------------------------------------------------------------------------
# requests queued to the writer

(_OP_APPEND, _OP_OFFSET, _OP_CREATE, _OP_DELETE, _OP_SYNC, _OP_STOP, _OP_RETENTION, _OP_TXN, _OP_SUPER_CREATE,
 _OP_SUPER_DELETE, _OP_REPLICA, _OP_TRUNCATE, _OP_TRIM) = range(13)


class _Append:
    __slots__ = ("stream", "data", "ids", "publisher", "filters", "entries", "records", "sealed", "crc_pending")

    def __init__(self, stream, data, ids, publisher, filters, entries, records, sealed=False, crc_pending=False):
        self.sealed = sealed    # data is a whole chunk (bytearray) with its CRC, from encode_chunk_buffer
        self.crc_pending = crc_pending   # ... but its header CRC is still to be computed (0 in the header)
        self.stream = stream
        self.data = data
        self.ids = ids
        self.publisher = publisher
        self.filters = filters
        self.entries = entries
        self.records = records

    @staticmethod
    def sealed_chunk(stream, chunk, ids, publisher, entries, records, crc_pending):
        """``_Append(stream, chunk, ids, publisher, None, entries, records, True, crc_pending)`` made
        without the class call (type_call -> slot_tp_init -> the Python __init__), which costs more than
        the object itself on the one-message path (Engine.append_chunk_now)."""
        req = _new_object(_Append)
        req.stream, req.data, req.ids, req.publisher, req.filters = stream, chunk, ids, publisher, None
        req.entries, req.records, req.sealed, req.crc_pending = entries, records, True, crc_pending
        return req


_new_object = object.__new__


class Done:
    """A completion callback in a Future's place: ``cb(result, None)`` or ``cb(None, exc)``, once, on the
    thread that committed (the writer's, or the caller's for an inline commit). Cheaper than a Future
    and its done-callback for the one-message path."""

    __slots__ = ("cb",)

    def __init__(self, cb):
        self.cb = cb

    def done(self):
        return self.cb is None

    def set_result(self, res):
        self._run(res, None)

    def set_exception(self, exc):
        self._run(None, exc)

    def _run(self, res, exc):
        cb, self.cb = self.cb, None
        try:
            cb(res, exc)
        except Exception:  # a broken callback must not take the writer down
            log.exception("append completion failed")


# --------------------------------------------------------------------------------------------------------
# the writer thread


class _Writer(Housekeeping, threading.Thread):
    """Applies queued operations in group commits. Only this thread writes to the environment."""

    def __init__(self, engine, retention_interval, max_batch_bytes):
        super().__init__(name="riverbed-writer", daemon=True)
        self.engine = engine
        self.queue = queue.SimpleQueue()
        self.stopping = False
        self.max_batch_bytes = max_batch_bytes
        self._init_housekeeping(retention_interval)     # retention and purging (housekeeping.py)
        self._seq_cache = {}      # (sid, publisher) -> last publishing id, committed
        # (sid, publisher) -> its tracking key, built once for _commit_alone (stream ids are never reused,
        # so an entry never goes stale; _seq_key empties the dict when it reaches SEQ_KEYS_MAX)
        self._seq_keys = {}
        self._stopped = threading.Event()
        # Who writes: every write transaction runs holding _claim, on this thread or, for a small
        # operation that finds nothing queued, on the caller's thread (commit_inline). _outstanding
        # counts operations submitted and not yet finished (under _mutex): an inline commit only runs
        # when it is 0, so it can never overtake an operation queued before it.
        self._claim = threading.Lock()
        self._mutex = threading.Lock()
        self._outstanding = 0
        self._full_logged = float("-inf")    # when a refused write (StorageFull) was last logged

    def submit(self, item):
        """Queue ``(op, args, done)`` for the thread; ``done`` is a Future or a :class:`Done`."""
        with self._mutex:
            self._outstanding += 1
        self.queue.put(item)

    def append_alone(self, req):
        """Engine.append_chunk_now's commit: the sealed append ``req`` committed now, on the caller's
        thread, when nothing is queued or being written (:meth:`commit_inline`'s rule). Returns
        ``(AppendResult, None)``, ``(None, exc)`` when the append failed, or None when the writer is
        busy (nothing done). The one-message path: a commit that :meth:`_commit_alone` takes costs no
        completion object or callback here."""
        # acquire/release, not ``with``: a with statement looks up and binds __enter__ and __exit__, which
        # on this path (a message) costs more than the lock itself
        mutex = self._mutex
        mutex.acquire()
        try:
            if self._outstanding or self.stopping:
                return None
            self._outstanding = 1
        finally:
            mutex.release()
        try:
            if not self._claim.acquire(False):  # the thread is purging or applying retention
                return None
            got = []
            try:
                res = self._commit_alone(req)
                if type(res) is AppendResult:
                    return res, None
                # anything else as commit_inline completes it: the general path for one append (a
                # duplicate, a chunk to cut, a full map, ...), or the error _commit_alone gave
                done = Done(lambda r, e: got.append((r, e)))
                if res is None:
                    self._commit_batch([(_OP_APPEND, (req,), done)])
                else:
                    done.set_exception(res)
            except BaseException:  # the completion has the error; the engine is stopped (see commit_inline)
                log.exception("inline commit failed; the engine is stopped")
            finally:
                self._claim.release()
            return got[0] if got else (None, RiverbedError("the append was not completed; see the log"))
        finally:
            mutex.acquire()
            try:
                self._outstanding -= 1
            finally:
                mutex.release()

    def _seq_key(self, sid, publisher):
        """The tracking key of ``publisher``'s sequence on stream ``sid``, built once (``_seq_keys``)."""
        keys = self._seq_keys
        if len(keys) >= SEQ_KEYS_MAX:
            keys.clear()
        key = keys[(sid, publisher)] = _tracking_key(sid, TRACKING_SEQUENCE, publisher)
        return key

    def commit_inline(self, item):
        """Commit ``item`` now, on the caller's thread, if nothing is queued or being written; returns
        False (and does nothing) otherwise. Its completion runs before this returns. Skipping the queue
        saves two thread hand-offs, which are most of a small append's cost with fsync=never."""
        with self._mutex:
            if self._outstanding or self.stopping:
                return False
            self._outstanding = 1
        try:
            if not self._claim.acquire(False):  # the thread is purging or applying retention
                return False
            try:
                op, args, fut = item
                if op == _OP_APPEND:
                    res = self._commit_alone(args[0]) if args[0].sealed else None
                else:   # a member's store of one read of its leader (replica_alone.py), else the general path
                    res = replicate_alone(self, *args) if op == _OP_REPLICA else None
                if res is None:
                    self._commit_batch([item])
                elif isinstance(res, BaseException):
                    fut.set_exception(res)
                else:
                    fut.set_result(res)
            except BaseException:  # the completion has the error; the engine is stopped (see above)
                log.exception("inline commit failed; the engine is stopped")
            finally:
                self._claim.release()
            return True
        finally:
            with self._mutex:
                self._outstanding -= 1

    def _commit_alone(self, req):
        """Commit one sealed chunk (a caller-built ``bytearray``: a whole small Publish frame) in a
        transaction of its own: the inline commit of the one-message path (fsync=never), or the writer
        thread's for a lone append under a sync policy (_commit_group). It stores what ``_commit`` stores
        for it (the chunk, its timestamp index entry and the stream's state record when sparse.py says
        they are due and, for a named publisher, its sequence), but without the general batch's
        bookkeeping, which is most of a one-message commit's cost. Returns the AppendResult once committed, or None when the general
        path must run it: anything but the plain case (filter values, a publisher with ids that are not
        all new, a chunk over the stream's bounds or asking for a sync) and any error before the commit
        (a full map, a map another process grew, an LMDB error: the general path grows and retries, or
        reports it). Nothing is stored when it returns None. The caller holds ``_claim``.

        A cluster leader (``Engine.replica_feed``) gets the stamped chunk after it is staged and before
        LMDB commits it: its members store it while this node commits. Should that commit then fail, the
        feed hears of it (``unsealed``), the append fails with a RiverbedError and the engine stops, as
        after any failed commit, instead of the general path stamping it again (the members must never
        hold another version of it)."""
        eng = self.engine
        name = req.stream
        s = eng._streams.get(name)
        chunk = req.data
        records = req.records
        size = len(chunk) - LEN_CHUNK_HEADER
        if (s is None or req.filters is not None or size <= 0 or size > s.chunk_max or records > s.chunk_max_records
                or (s.args and FSYNC_RANK.get(s.args.get("fsync"), 0) > eng.fsync_rank)):
            return None
        ids = req.ids
        publisher = req.publisher if ids is not None else None
        if publisher is not None and (not isinstance(ids, PublishingIds) or not ids.increasing or not len(ids)):
            return None
        started = time.perf_counter()
        now = eng.clock()
        ts = now if now > s.last_ts else s.last_ts
        chunk_id = s.next_offset
        # the byte work in one compiled call: the data CRC when the caller left it, then the stamps
        core.stamp_chunk(chunk, chunk_id, ts, eng.epochs.get(name, CHUNK_EPOCH), req.crc_pending)
        req.crc_pending = False
        new = s.copy()
        new.advance(chunk_id, records, len(chunk), ts)
        sid = s.sid
        seqs = {}
        feed = eng.replica_feed
        sent = False
        gate = eng._gate
        gate.enter()
        try:
            # begin(db, parent, write, buffers), positional: py-lmdb builds no keyword dict for it
            with eng.env.begin(None, None, True, True) as txn:
                if publisher is not None:
                    key = self._seq_keys.get((sid, publisher)) or self._seq_key(sid, publisher)
                    last = self._seq_cache.get((sid, publisher))
                    if last is None:
                        raw = txn.get(key, db=eng._db_tracking)
                        last = _U64.unpack(raw)[0] if raw is not None else NO_SEQUENCE
                    if ids.first <= last:
                        raise _NotAlone     # a duplicate among them: the general path drops it
                    txn.put(key, _U64.pack(ids.last), db=eng._db_tracking)
                    seqs[(sid, publisher)] = ids.last
                # the chunk's leaf and LMDB's own pages: the index entry and the state record only
                # now and then (sparse.py), as each page is a disk request under a sync policy
                put_chunk(txn, eng._db_chunks, eng._db_time, sid, chunk_id, chunk, records, ts)
                if new.unsaved >= STATE_SAVE_EVERY:
                    new.unsaved = 0
                    txn.put(name.encode(), new.encode(), db=eng._db_streams)
                applied = time.perf_counter()
                if feed is not None:
                    sent = feed.sealed(name, chunk_id, records, chunk,
                                       {} if publisher is None else {publisher: ids.last})
        except Exception as e:  # noqa: BLE001 - not committed (the transaction aborted): the general path decides
            if not sent:
                return None
            # LMDB refused the commit itself (an I/O error): the engine stops, as the general path does,
            # so this node never stores another chunk at that id than the one its members were sent
            self.stopping = True
            feed.unsealed(name, chunk_id)
            return RiverbedError(f"write failed, engine stopped: the commit of a chunk of {name!r} failed after "
                                 f"it went to the members: {type(e).__name__}: {e}")
        finally:
            gate.leave()
        eng.stats.commit_done(started, applied, time.perf_counter(), 1, len(chunk))
        if seqs:
            self._seq_cache.update(seqs)
        lock = eng._lock        # acquired, not ``with``: see append_alone
        lock.acquire()
        try:
            quiet = not eng._waiters.get(sid)
            if quiet:       # no reader waits on this stream (a publisher alone): swap the state in, done
                eng._streams[name] = new
        finally:
            lock.release()
        if not quiet:
            self._publish(_Alone(name, new, seqs))
        # AppendResult(...) without the namedtuple's Python-level __new__: one frame less per message
        return _tuple_new(AppendResult, (chunk_id, chunk_id + records - 1, []))

    def stop(self):
        self.stopping = True
        self.submit((_OP_STOP, (), None))
        self._stopped.wait()
        self.join()

    # ------------------------------------------------------------------------------------------ the loop

    def run(self):
        eng = self.engine
        try:
            self._find_orphans()
            stop = False
            while not stop:
                try:
                    first = self.queue.get(timeout=self._idle_timeout())
                except queue.Empty:
                    with self._claim:
                        self._housekeeping()
                    continue
                batch = [first]
                with self._claim:
                    size = 0
                    while len(batch) < 100000 and size < self.max_batch_bytes:
                        try:
                            item = self.queue.get_nowait()
                        except queue.Empty:
                            break
                        batch.append(item)
                        if item[0] == _OP_APPEND:
                            size += len(item[1][0].data)
                    stop = any(op == _OP_STOP for op, _, _ in batch)
                    if any(op == _OP_RETENTION for op, _, _ in batch):
                        self._commit_batch([b for b in batch if b[0] != _OP_RETENTION])
                        self._housekeeping(force_retention=True)
                        for op, _, fut in batch:
                            if op == _OP_RETENTION:
                                fut.set_result(None)
                    else:
                        self._commit_group(batch)
                        self._housekeeping()
                with self._mutex:
                    self._outstanding -= len(batch)
            self._save_states()
            eng.env.sync(True)
        except BaseException:
            log.exception("writer thread stopped by an error")
            self.stopping = True
            self._fail_pending(RiverbedError("the writer stopped after an error; see the log"))
        finally:
            self._stopped.set()

    def _commit_group(self, batch):
        """Commit what the thread dequeued: one sealed append alone (a one-message publish under a sync
        policy, stop-and-wait) through :meth:`_commit_alone`, anything else as a group commit."""
        if len(batch) == 1:
            op, args, fut = batch[0]
            if op == _OP_APPEND and args[0].sealed:
                res = self._commit_alone(args[0])
                if res is not None:
                    fut.set_result(res)
                    return
            elif op == _OP_REPLICA:
                res = replicate_alone(self, *args)
                if res is not None:
                    fut.set_result(res)
                    return
        self._commit_batch(batch)

    def _save_states(self):
        """At a clean stop: write the state records not saved since their last chunks (sparse.py), so
        the next open has nothing to roll forward. Best effort: a failure only leaves that to the open."""
        eng = self.engine
        due = [(name, s) for name, s in list(eng._streams.items()) if s.unsaved]
        if not due:
            return
        try:
            eng._gate.enter()
            try:
                with eng.env.begin(write=True) as txn:
                    for name, s in due:
                        txn.put(name.encode(), s.encode(), db=eng._db_streams)
            finally:
                eng._gate.leave()
        except lmdb.Error:
            log.warning("stream states not saved at stop; the next open rolls them forward", exc_info=True)

    def _fail_pending(self, exc):
        while True:
            try:
                _, _, fut = self.queue.get_nowait()
            except queue.Empty:
                return
            if fut is not None and not fut.done():
                fut.set_exception(exc)

    def _storage_full(self, exc):
        now = time.monotonic()
        if now >= self._full_logged + 10:      # one line per 10 s, however many writes are refused
            self._full_logged = now
            log.warning("write refused: %s", exc)

    # ----------------------------------------------------------------------------------- group commit

    def _commit_batch(self, batch):
        try:
            staged, results = self._commit(batch)
        except StorageFull as exc:
            # no room for this batch (disk full, --max-disk): its appends and transact functions fail with
            # the error and the engine goes on. The small operations (offsets, creations, deletions: a
            # deletion is how space comes back) are redone without them, in the room the map still has.
            small = [b for b in batch if b[0] not in (_OP_APPEND, _OP_TXN)]
            if len(small) == len(batch):
                small = []
            for op, _, fut in batch:
                if (op in (_OP_APPEND, _OP_TXN) or not small) and fut is not None and not fut.done():
                    fut.set_exception(exc)
            self._storage_full(exc)
            if small:
                self._commit_batch(small)
            return
        except BaseException as exc:
            # an LMDB failure we cannot recover from (disk full, I/O error): fail this batch, and
            # (stopping) everything after it, rather than leave any caller waiting
            self.stopping = True
            err = RiverbedError(f"write failed, engine stopped: {type(exc).__name__}: {exc}")
            for _, _, fut in batch:
                if fut is not None and not fut.done():
                    fut.set_exception(err)
            raise
        self._publish(staged)
        for cb in staged.on_commit:
            try:
                cb()
            except Exception:  # a broken callback must not take the writer down
                log.exception("on_commit callback failed")
        for (op, args, fut), res in zip(batch, results):
            if fut is None:
                continue
            if isinstance(res, _Deferred):
                res = res.resolve()
            if isinstance(res, BaseException):
                fut.set_exception(res)
            else:
                fut.set_result(res)

    def _commit(self, batch):
        """Apply ``batch`` in one write transaction, growing the map and retrying when it is full. A
        ``transact`` function that raises is taken out and the transaction redone without it (LMDB has
        no nested transactions under WRITEMAP, so this is how its partial writes are undone)."""
        eng = self.engine
        failed = {}     # batch index -> exception of a transact function, kept across the redo
        started = time.perf_counter()   # metrics (engine/stats.py): the group commit's latency, redos included
        later = {}      # stream -> appends of this batch to it (CHUNK_BODY_RECORDS: which one closes)
        for op, args, _ in batch:
            if op == _OP_APPEND:
                later[args[0].stream] = later.get(args[0].stream, 0) + 1
        while True:
            staged = _Staged(eng, self)
            staged.alone = len(batch) == 1
            staged.later = dict(later)
            results = []
            try:
                eng._gate.enter()
                try:
                    with eng.env.begin(write=True, buffers=True) as txn:
                        staged.txn = txn
                        for i, (op, args, fut) in enumerate(batch):
                            if i in failed:
                                results.append(failed[i])
                            elif op == _OP_TXN:
                                results.append(self._run_txn(staged, i, args[0]))
                            else:
                                results.append(self._apply(staged, op, args))
                        staged.flush_all()
                        staged.write_states()
                        applied = time.perf_counter()   # metrics: the rest is LMDB's commit (and fsync)
                    if eng.fsync_rank < 2 and _wants_sync(staged, eng.fsync_rank):
                        # a stream's own fsync argument asks for more than the environment's policy:
                        # sync before any of this commit is acknowledged (one LMDB environment syncs
                        # as a whole, so this commit's other streams get it too)
                        eng.env.sync(True)
                        eng.stats.stream_syncs += 1
                finally:
                    eng._gate.leave()
            except _TxnFailed as f:
                failed[f.index] = f.exc
                continue
            except lmdb.MapFullError:
                self._grow(staged.bytes_written, any(op in (_OP_APPEND, _OP_TXN) for op, _, _ in batch))
                continue
            except lmdb.MapResizedError:
                eng._gate.exclusive(lambda: eng.env.set_mapsize(0))
                continue
            if staged.offsets_changed:
                # after the commit, so a reader that sees the new version reads the new offsets
                eng.offsets_version += 1
            # metrics (engine/stats.py): a few integer updates; _commit runs under _claim, one at a time
            eng.stats.commit_done(started, applied, time.perf_counter(), len(batch), staged.bytes_written)
            return staged, results

    @staticmethod
    def _run_txn(staged, index, fn):
        try:
            return fn(WriteContext(staged))
        except (lmdb.MapFullError, lmdb.MapResizedError):
            raise
        except RiverbedError as e:
            raise _TxnFailed(index, e) from None
        except Exception as e:  # noqa: BLE001 - the caller's bug fails the caller, not the batch
            log.debug("transact function failed", exc_info=True)
            raise _TxnFailed(index, e) from None

    def _grow(self, need, bulk=False):
        """Grow the map (reserved on disk first, space.py); StorageFull when the disk or --max-disk says no.
        ``bulk``: for appends or transact functions, which leave the last bit of space to deletions."""
        self.engine._space.grow(need, bulk)

    def _apply(self, staged, op, args):
        try:
            if op == _OP_APPEND:
                return staged.append(args[0], True)
            if op == _OP_OFFSET:
                stream, reference, offset = args
                s = staged.stream(stream)
                staged.txn.put(_tracking_key(s.sid, TRACKING_OFFSET, reference), _U64.pack(offset),
                               db=self.engine._db_tracking)
                staged.dirty = True
                staged.offsets_changed = True
                return None
            if op == _OP_CREATE:
                return staged.create(*args)
            if op == _OP_DELETE:
                return staged.delete(*args)
            if op == _OP_SUPER_CREATE:
                return staged.create_super(*args)
            if op == _OP_SUPER_DELETE:
                return staged.delete_super(args[0])
            if op == _OP_REPLICA:
                return staged.replicate(*args)
            if op == _OP_TRUNCATE:
                return staged.truncate(*args)
            if op == _OP_TRIM:
                return staged.trim_head(*args)
            return None  # SYNC and STOP: completing after this commit is their whole job
        except RiverbedError as e:
            return e
        except lmdb.Error:
            raise   # MapFullError & co. concern the whole transaction: _commit_batch handles them
        except Exception as e:  # noqa: BLE001 - one bad request fails alone; the writer goes on
            return InvalidArgument(f"{type(e).__name__}: {e}")

    def _publish(self, staged):
        """Make the commit visible: swap in the new stream states, complete waiters, fire listeners."""
        eng = self.engine
        self._seq_cache.update(staged.seqs)
        wake = []
        with eng._lock:
            for name in dict.fromkeys(staged.deleted):
                old = eng._streams.pop(name, None)
                if old is not None:
                    self._purge.append(old.sid)
                    for entry in eng._waiters.pop(old.sid, ()):
                        wake.append((entry[1], StreamNotFound(f"stream {name!r} was deleted")))
            # a deleted stream is not in staged.streams unless this commit created it again (a new sid)
            for name, s in staged.streams.items():
                eng._streams[name] = s
                items = eng._waiters.get(s.sid)
                if items:
                    keep = []
                    limit = eng._read_limits.get(name)
                    for entry in items:
                        if entry[0] < s.next_offset and (limit is None or entry[0] < limit or not entry[2]):
                            wake.append((entry[1], None))
                        else:
                            keep.append(entry)
                    if keep:
                        eng._waiters[s.sid] = keep
                    else:    # an idle stream keeps no empty list (10,000 streams: issue 26)
                        del eng._waiters[s.sid]
            if staged.deleted or staged.created:
                self._limited = None
            listeners = list(eng._delete_listeners) if staged.deleted else ()
            created = [n for n in staged.created if n in eng._streams] if staged.created else ()
            create_listeners = list(eng._create_listeners) if created else ()
        for cb, exc in wake:
            try:
                cb(exc)
            except Exception:  # a broken callback must not take the writer down
                log.exception("commit waiter failed")
        for name in dict.fromkeys(staged.deleted):
            for cb in listeners:
                try:
                    cb(name)
                except Exception:
                    log.exception("delete listener failed")
        for name in created:
            for cb in create_listeners:
                try:
                    cb(name)
                except Exception:
                    log.exception("create listener failed")


class _NotAlone(Exception):
    """_commit_alone cannot store this append by itself: abort its transaction, use the general path."""


class _Alone:
    """What ``_publish`` reads of a commit: for ``_commit_alone``, one stream's new state and the
    publisher sequence (if any) it stored."""

    __slots__ = ("streams", "seqs")
    deleted = ()
    created = ()

    def __init__(self, name, state, seqs):
        self.streams = {name: state}
        self.seqs = seqs


class _TxnFailed(Exception):
    def __init__(self, index, exc):
        super().__init__(index, exc)
        self.index = index
        self.exc = exc


class WriteContext:
    """What a :meth:`Engine.transact` function gets: the writer's transaction for this group commit.

    ``txn`` is the LMDB write transaction (buffers=True: values read are memoryviews valid only inside
    it); ``db_docs``, ``db_docidx`` and ``db_collections`` are the document store's databases. Writer
    thread only, and only during the call."""

    __slots__ = ("txn", "engine", "_staged")

    def __init__(self, staged):
        self._staged = staged
        self.txn = staged.txn
        self.engine = staged.engine

    @property
    def db_docs(self):
        return self.engine._db_docs

    @property
    def db_docidx(self):
        return self.engine._db_docidx

    @property
    def db_collections(self):
        return self.engine._db_collections

    def has_stream(self, name):
        """Whether ``name`` exists as staged in this transaction."""
        st = self._staged
        return name in st.streams or (name in self.engine._streams and name not in st.deleted)

    def store_offset(self, stream, reference, offset):
        """Stage consumer/position ``offset`` of ``reference`` on ``stream`` (StreamNotFound)."""
        _check_name(reference, "consumer reference")
        s = self._staged.stream(stream)
        self.txn.put(_tracking_key(s.sid, TRACKING_OFFSET, reference), _U64.pack(int(offset)),
                     db=self.engine._db_tracking)
        self._staged.dirty = True
        self._staged.offsets_changed = True

    def query_offset(self, stream, reference):
        """The offset of ``reference`` as staged in this transaction, or None."""
        s = self._staged.stream(stream)
        raw = self.txn.get(_tracking_key(s.sid, TRACKING_OFFSET, reference), db=self.engine._db_tracking)
        return None if raw is None else _U64.unpack(raw)[0]

    def delete_offset(self, stream, reference):
        """Remove the stored offset of ``reference`` (no error when there is none)."""
        s = self._staged.stream(stream)
        self.txn.delete(_tracking_key(s.sid, TRACKING_OFFSET, reference), db=self.engine._db_tracking)
        self._staged.offsets_changed = True

    def append(self, stream, records):
        """Stage ``records`` (bytes-like) for ``stream``, contiguous and in order. Returns an object
        whose ``first`` and ``last`` offsets are set once the transaction's chunks are built (read them
        in an ``on_commit`` callback). Raises StreamNotFound."""
        records = list(records)
        req = _Append(stream, core.encode_entries(records), None, None, None, len(records), len(records))
        return self._staged.append(req)

    def on_commit(self, cb):
        """Call ``cb()`` on the writer thread once this transaction has committed (not on a redo)."""
        self._staged.on_commit.append(cb)

    def super_stream(self, name):
        """The definition of super stream ``name`` as staged in this transaction (a dict, see
        :meth:`Engine.super_stream`), or None."""
        raw = self.txn.get(name.encode("utf-8"), db=self.engine._db_supers)
        return None if raw is None else json.loads(bytes(raw))

    def put_super_stream(self, name, definition):
        """Stage ``definition`` (``partitions``, ``binding_keys``, ``arguments``, optional ``orders``) as
        super stream ``name``."""
        self.txn.put(name.encode("utf-8"), json.dumps(definition).encode(), db=self.engine._db_supers)
        self._staged.dirty = True

    def drop_super_stream(self, name):
        """Stage the removal of super stream ``name``'s definition (its partitions stay)."""
        self.txn.delete(name.encode("utf-8"), db=self.engine._db_supers)
        self._staged.dirty = True
