"""A cluster member's store of what one read of its leader's connection brought, cut to what it stores.

``Engine.replicate_chunks`` with a single batch of leader chunks (one chunk, one publish at a time: issue 23's
confirm latency row) went through the writer's general group commit: a staged copy of every touched stream,
pending-entry bookkeeping, the closing pass, the state pass, the publish pass. :func:`replicate_alone` stores
the same keys in one transaction of its own (each publisher sequence, each chunk with its index entry when
sparse.py says it is due, the stream's state record when due) and swaps the new stream state in, as
``_Writer._commit_alone`` does for a one-message append. Anything but the plain case returns None with
nothing stored, and the general path runs it (a gap or overlap and its ChunkError, a stream asking for a
stronger sync than the environment's, a full map, any LMDB error).

Called by the writer holding ``_claim`` (inline on the member's loop thread under fsync=never, or on the
writer thread for a lone operation), so nothing else writes meanwhile.
"""

import time

from riverbed.engine.format import H_CHUNK_ID, H_RECORDS, H_TIMESTAMP
from riverbed.engine.layout import _U64, FSYNC_RANK
from riverbed.engine.sparse import STATE_SAVE_EVERY, put_chunk


def replicate_alone(writer, name, chunks, sequences, start):
    """Store ``chunks`` (``[(bytes-like, header)]``, CRCs checked, consecutive) of stream ``name`` with
    ``sequences`` ({publisher: last id}) in one transaction, as ``_Staged.replicate`` would. Returns the
    stream's next offset after them once committed, or None (nothing stored) when the general path must run
    it. ``writer`` is the engine's ``_Writer``; the caller holds its ``_claim``."""
    eng = writer.engine
    s = eng._streams.get(name)
    if s is None or not chunks or (s.args and FSYNC_RANK.get(s.args.get("fsync"), 0) > eng.fsync_rank):
        return None
    expect = s.next_offset
    if start and s.chunks == 0 and s.last_chunk < 0:
        expect = chunks[0][1][H_CHUNK_ID]     # an empty copy starts where its leader's log starts now
    for _, h in chunks:
        if h[H_CHUNK_ID] != expect:
            return None          # a gap or an overlap: the general path refuses it (ChunkError)
        expect += h[H_RECORDS]
    started = time.perf_counter()
    new = s.copy()
    if new.next_offset != chunks[0][1][H_CHUNK_ID]:
        new.next_offset = chunks[0][1][H_CHUNK_ID]
    sid = new.sid
    seqs = {}
    size = 0
    gate = eng._gate
    gate.enter()
    try:
        # begin(db, parent, write, buffers), positional as in _commit_alone
        with eng.env.begin(None, None, True, True) as txn:
            if sequences:
                db_tracking = eng._db_tracking
                keys = writer._seq_keys
                for publisher, seq in sequences.items():
                    key = keys.get((sid, publisher)) or writer._seq_key(sid, publisher)
                    txn.put(key, _U64.pack(seq), db=db_tracking)
                    seqs[(sid, publisher)] = seq
            db_chunks, db_time = eng._db_chunks, eng._db_time
            for chunk, h in chunks:
                chunk_id, records, ts = h[H_CHUNK_ID], h[H_RECORDS], h[H_TIMESTAMP]
                if ts < new.last_ts:
                    ts = new.last_ts
                put_chunk(txn, db_chunks, db_time, sid, chunk_id, chunk, records, ts)
                size += len(chunk)
                new.advance(chunk_id, records, len(chunk), ts)
            if new.unsaved >= STATE_SAVE_EVERY:
                new.unsaved = 0
                txn.put(name.encode(), new.encode(), db=eng._db_streams)
            applied = time.perf_counter()
    except Exception:  # noqa: BLE001 - not committed (the transaction aborted): the general path decides
        return None
    finally:
        gate.leave()
    eng.stats.commit_done(started, applied, time.perf_counter(), 1, size)
    if seqs:
        writer._seq_cache.update(seqs)
    lock = eng._lock
    lock.acquire()
    try:
        quiet = not eng._waiters.get(sid)
        if quiet:       # no reader waits on this stream: swap the state in, done
            eng._streams[name] = new
    finally:
        lock.release()
    if not quiet:
        writer._publish(_Replicated(name, new, seqs))
    return new.next_offset


class _Replicated:
    """What ``_Writer._publish`` reads of this commit: one stream's new state and the sequences stored."""

    __slots__ = ("streams", "seqs")
    deleted = ()
    created = ()

    def __init__(self, name, state, seqs):
        self.streams = {name: state}
        self.seqs = seqs
