"""What a commit writes besides its chunks, kept to few pages: the sparse timestamp index and the
lazily saved stream state (issue 26, the fsync=batch confirm).

Under a sync policy every B-tree page a commit dirties is written and fdatasynced before the commit is
acknowledged, and on the disks this was measured on each page that is not next to another is its own
disk request (bench/results/2026-11-26-fsyncbatch.md). A one-chunk commit used to dirty the chunks
tree, the timestamp index tree, the ``streams`` record and LMDB's own main and free-list pages; it now
dirties the chunks tree and LMDB's pages, and the other two once in a while:

* **The timestamp index is sparse.** A chunk gets a ``timeidx`` entry only when its offsets
  ``[chunk_id, chunk_id + records)`` hold a multiple of :data:`TIME_INDEX_EVERY` (:func:`indexed`): the
  first chunk of a stream always does, and so does every chunk of that many records or more, so
  batched appends index every chunk as before. Fewer than TIME_INDEX_EVERY chunks lie between two
  entries; :func:`seek_timestamp` takes the entries on either side of a time and reads the headers of
  the chunks between them. A directory written with one entry per chunk (before this rule) is a sparse
  index whose gaps are empty, and seeks the same.
* **The stream state is saved lazily.** The ``streams`` record (next offset, first and last chunk,
  bytes, records, chunks, last timestamp) is written when it changes in a way its chunks cannot tell
  (creation, retention, trim, truncation: :data:`STATE_FORCE`) and otherwise once every
  :data:`STATE_SAVE_EVERY` chunks. What a saved record lacks is exactly the chunks stored at or after
  its next offset, so whoever reads it from LMDB (the engine opening, a read-only engine)
  :func:`roll_forward`\\ s it over them. Nothing acknowledged depends on the record: the chunks commit
  in the same transaction as always, and a crash between two saves loses nothing.

Chunk timestamps as indexed: a chunk's index time is ``max(its header's timestamp, the index time of
the chunk before it)`` (the writer's rule in ``_Staged._store``); the scans below recompute it the same
way, so seeks agree with a dense index also on a cluster member whose leader's clock went back.

Thread safety: pure functions over a caller's LMDB transaction.
"""

import struct

from riverbed.engine import core
from riverbed.engine.errors import ChunkError
from riverbed.engine.format import H_RECORDS, H_TIMESTAMP
from riverbed.engine.layout import _CHUNK_KEY, _TIME_KEY, STATE_FORCE, TS_BIAS  # noqa: F401 - STATE_FORCE: see above

# offsets: a chunk holding a multiple of this gets an index entry; a timestamp seek reads at most this
# many chunk headers (a few µs each)
TIME_INDEX_EVERY = 64
# chunks stored between two saves of a stream's state record; a read-only engine rolls a state forward
# over at most this many chunk headers
STATE_SAVE_EVERY = 64

_U64_MAX = (1 << 64) - 1
_TS = struct.Struct(">q")
_TS_AT = 8      # the timestamp's place in a chunk header (format.py)


def indexed(chunk_id, records):
    """Whether the chunk of ``records`` records at ``chunk_id`` gets a timestamp index entry."""
    return (chunk_id + (records if records > 0 else 1) - 1) // TIME_INDEX_EVERY != (chunk_id - 1) // TIME_INDEX_EVERY


def put_chunk(txn, db_chunks, db_time, sid, chunk_id, chunk, records, ts):
    """Put a stamped chunk and, when :func:`indexed`, its index entry at index time ``ts``."""
    txn.put(_CHUNK_KEY.pack(sid, chunk_id), chunk, db=db_chunks)
    if indexed(chunk_id, records):
        txn.put(_TIME_KEY.pack(sid, ts + TS_BIAS, chunk_id), b"", db=db_time)


def _time_key(sid, ms):
    return _TIME_KEY.pack(sid, min(max(ms + TS_BIAS, 0), _U64_MAX), 0)


def seek_timestamp(txn, db_time, db_chunks, sid, ms):
    """The id of the first chunk of stream ``sid`` whose index time is at or after ``ms`` (ms since the
    epoch), or None when there is none. Reads the index entries on either side of ``ms`` and the
    headers of the (fewer than TIME_INDEX_EVERY) chunks between them. Raises ChunkError (stream name
    unset) for an unreadable header."""
    cur = txn.cursor(db=db_time)
    upper = None
    if cur.set_range(_time_key(sid, ms)):
        ksid, _, kcid = _TIME_KEY.unpack(cur.key())
        if ksid == sid:
            upper = kcid
        ok = cur.prev()
    else:
        ok = cur.last()
    start, prev_ts = 0, None
    if ok:
        ksid, kts, kcid = _TIME_KEY.unpack(cur.key())
        if ksid == sid:     # the last entry before ms: every chunk up to it is earlier than ms
            start, prev_ts = kcid, kts - TS_BIAS
    ccur = txn.cursor(db=db_chunks)
    ok = ccur.set_range(_CHUNK_KEY.pack(sid, start))
    while ok:
        ksid, cid = _CHUNK_KEY.unpack(ccur.key())
        if ksid != sid or (upper is not None and cid >= upper):
            break
        raw = ccur.value()
        if len(raw) < _TS_AT + 8:
            raise ChunkError("chunk shorter than its header", None, cid)
        ts = _TS.unpack_from(raw, _TS_AT)[0]
        if prev_ts is not None and ts < prev_ts:
            ts = prev_ts
        if ts >= ms:
            return cid
        prev_ts = ts
        ok = ccur.next()
    return upper


def chunk_times(txn, db_chunks, sid, from_offset=0, to_offset=None):
    """``[(chunk_id, index time ms), ...]`` of the stored chunks of ``sid`` whose ids are in
    ``[from_offset, to_offset)``, in id order, from the chunks' headers (the index no longer names every
    chunk). The first one's time is its header's."""
    out = []
    cur = txn.cursor(db=db_chunks)
    ok = cur.set_range(_CHUNK_KEY.pack(sid, max(int(from_offset), 0)))
    prev_ts = None
    while ok:
        ksid, cid = _CHUNK_KEY.unpack(cur.key())
        if ksid != sid or (to_offset is not None and cid >= to_offset):
            break
        raw = cur.value()
        if len(raw) < _TS_AT + 8:
            raise ChunkError("chunk shorter than its header", None, cid)
        ts = _TS.unpack_from(raw, _TS_AT)[0]
        if prev_ts is not None and ts < prev_ts:
            ts = prev_ts
        out.append((cid, ts))
        prev_ts = ts
        ok = cur.next()
    return out


def roll_forward(txn, db_chunks, s):
    """Advance stream state ``s`` (as read from its ``streams`` record) over the chunks stored at or
    after its next offset: the commits since the record was last saved. Returns ``s`` (changed in place).
    Raises ChunkError naming the stream and chunk for a header that does not read."""
    cur = txn.cursor(db=db_chunks)
    sid = s.sid
    ok = cur.set_range(_CHUNK_KEY.pack(sid, max(s.next_offset, 0)))
    while ok:
        ksid, cid = _CHUNK_KEY.unpack(cur.key())
        if ksid != sid:
            break
        raw = cur.value()
        try:
            h = core.read_header(raw)
        except ChunkError as e:
            raise ChunkError(e.reason, s.name, cid) from None
        ts = h[H_TIMESTAMP]
        s.advance(cid, h[H_RECORDS], len(raw), ts if ts > s.last_ts else s.last_ts)
        ok = cur.next()
    return s
