"""The staging of one group commit: what a write transaction changes, kept aside until it commits.

The writer thread (writer.py) applies a batch of queued operations in one LMDB write transaction through a
:class:`_Staged`: each touched stream's state is a staged copy, each stream's appends collect in a pending
chunk (:class:`_Pending`) and become chunks of the shape below, and the publisher sequences, stream
creations and deletions, replica stores, trims and truncations of the batch go in the same transaction.
Nothing here is visible until the writer publishes it after the commit; a MapFullError redo starts again
from a new ``_Staged`` over the committed state. It owns the chunk shape (the rules and THE INVARIANT
below, and the code that keeps them: ``_cuts``, ``_body_records``, the pending slot), so they live apart
from the thread's queueing and completion logic. Writer thread only (or the caller holding its ``_claim``).
"""

import bisect
import itertools
import json
import struct

from riverbed.engine import core
from riverbed.engine.errors import ChunkError, InvalidArgument, StreamExists, StreamNotFound
from riverbed.engine.format import (
    CHUNK_MAGIC_VERSION, CHUNK_USER, H_CHUNK_ID, H_RECORDS, H_TIMESTAMP, HEADER_STRUCT, LEN_CHUNK_HEADER,
    TRACKING_SEQUENCE,
)
from riverbed.engine.layout import (
    _CHUNK_KEY, _SID, _TIME_KEY, _U64, CHUNK_EPOCH, FORMAT_VERSION, FSYNC_RANK, MAX_CHUNK_ENTRIES, STATE_FORCE,
    TS_BIAS, AppendResult, PublishingIds, _Stream, _tracking_key,
)
from riverbed.engine.sparse import STATE_SAVE_EVERY, put_chunk

_STAMP_TS = struct.Struct(">q")
_STAMP_ID = struct.Struct(">Q")
_CRC = struct.Struct(">I")
H_CRC_OFFSET = 32            # the data CRC's place in the chunk header (format.py)
# What a publisher reference with no stored sequence counts as having stored: below every u64 id, so
# its first id (0 included) is new. Never written to LMDB; absence of the key is what says it.
NO_SEQUENCE = -1
OWN_CHUNK_MIN = 16 << 10        # a caller-built chunk at least this big is stored as it is, not merged
# The chunk shape (issue 26): a commit's chunks of a stream hold up to CHUNK_BODY_RECORDS records each (and the
# stream's bytes per chunk), except its closing chunk, the last one of the stream in that commit, which holds
# at most the stream's chunk-max-records (1,000). Offset spec LAST delivers the last chunk, and the last chunk
# is always a commit's closing one, so LAST stays within the last 1,000 records, while a reader from the start
# gets several thousand per Deliver (RabbitMQ's writer makes chunks of up to ~8k messages; clients pay per
# chunk). A stream that sets chunk-max-records gets that bound for every chunk.
# THE INVARIANT: after every commit, a stream's last chunk holds at most its chunk-max-records records (one
# entry that alone holds more excepted). Which append closes is only a guess made before the appends run (the
# stream's last append of the batch), and that append may add nothing (all duplicates) or fail, so no chunk
# over the closing bound is stored while it could still end up last: a non-closing append's piece over it is
# held in the pending slot (_Pending.whole, a view of the caller's buffer, no copy) and stored as it is when
# anything more comes for the stream, or cut at the close (_Staged.flush_all); a trim, truncate or replica
# store in the commit closes the pending entries. tests/engine/test_chunk_shape_close.py checks it after
# random commit shapes.
CHUNK_BODY_RECORDS = 8192


class _Pending:
    """Entries of one stream collected for the chunk being built in this transaction: ``parts`` to join,
    or (``whole`` set, ``parts`` empty) one piece of a caller's sealed chunk held as it is: its data at
    ``whole[LEN_CHUNK_HEADER + at:][:size]``, ``own`` when it is the caller's whole chunk (see
    CHUNK_BODY_RECORDS's invariant)."""

    __slots__ = ("parts", "size", "entries", "records", "filters", "unfiltered", "whole", "at", "own")

    def __init__(self):
        self.parts = []
        self.size = 0
        self.entries = 0
        self.records = 0
        self.filters = set()
        self.unfiltered = False
        self.whole = None
        self.at = 0
        self.own = False

    def hold(self, whole, at, size, entries, records, own):
        """Hold a piece of the caller's sealed chunk ``whole`` (the pending slot is empty)."""
        self.whole, self.at, self.size, self.entries, self.records, self.own = whole, at, size, entries, records, own
        self.unfiltered = True



class _Deferred:
    """An append result whose offsets are known only once its chunk is flushed."""

    __slots__ = ("first", "last", "duplicates")

    def __init__(self, duplicates):
        self.first = -1
        self.last = -1
        self.duplicates = duplicates

    def resolve(self):
        return AppendResult(self.first, self.last, self.duplicates)


def _body_records(s):
    """Records per chunk of ``s`` before a commit's closing chunk: its chunk-max-records when it sets one
    (then every chunk keeps to it), else CHUNK_BODY_RECORDS."""
    return s.chunk_max_records if "chunk-max-records" in s.args else CHUNK_BODY_RECORDS


def _cuts(s, data, closing):
    """Where to cut the data section ``data`` of stream ``s`` into chunks (``(end, entries, records)`` per
    piece, as core.cut_entries): pieces of up to the body bound and the stream's bytes; with ``closing``,
    the last piece holds at most the stream's chunk-max-records (an entry over it by itself excepted):
    the piece the body cut left last is split into a head and such a tail."""
    cuts = core.cut_entries(data, s.chunk_max, MAX_CHUNK_ENTRIES, _body_records(s))
    tail_max = s.chunk_max_records
    if closing and cuts and cuts[-1][2] > tail_max:
        end, _, records = cuts.pop()
        start = cuts[-1][0] if cuts else 0
        piece = memoryview(data)[start:end]
        # the head: the longest run of entries that leaves at least tail_max records behind it
        head_end, head_entries, head_records = core.cut_entries(piece, s.chunk_max, MAX_CHUNK_ENTRIES,
                                                                records - tail_max)[0]
        cuts.append((start + head_end, head_entries, head_records))
        if head_end < len(piece):
            base = start + head_end
            cuts.extend((base + e, n, r) for e, n, r in
                        core.cut_entries(piece[head_end:], s.chunk_max, MAX_CHUNK_ENTRIES, tail_max))
    return cuts


def _wants_sync(staged, rank):
    """Whether a stream this commit touched has an ``fsync`` argument stronger than ``rank``."""
    for st in staged.streams.values():
        if FSYNC_RANK.get(st.args.get("fsync"), 0) > rank:
            return True
    return False


class _Staged:
    """Everything one write transaction changes, kept aside until it commits: a MapFullError retry
    starts again from the committed state."""

    def __init__(self, engine, writer):
        self.engine = engine
        self.writer = writer
        self.txn = None
        self.streams = {}         # name -> staged _Stream copy
        self.pending = {}         # name -> _Pending
        self.seqs = {}            # (sid, publisher) -> staged sequence
        self.deleted = []
        self.dirty = False
        self.bytes_written = 0
        self.next_sid = None
        self.on_commit = []
        self.created = []
        self.alone = False        # the transaction holds one operation (see append)
        self.later = {}           # stream -> appends of the batch still to apply (see append)
        self.offsets_changed = False   # a consumer offset was stored or deleted (Engine.offsets_version)

    def stream(self, name):
        s = self.streams.get(name)
        if s is None:
            if name in self.deleted:
                raise StreamNotFound(f"stream {name!r} does not exist")
            s = self.engine._get_stream(name).copy()
            self.streams[name] = s
        return s

    # ------------------------------------------------------------------------------------------ admin

    def create(self, name, args):
        eng = self.engine
        if (name in eng._streams and name not in self.deleted) or (name in self.streams):
            raise StreamExists(f"stream {name!r} already exists")
        if self.next_sid is None:
            raw = self.txn.get(b"next-sid", db=eng._db_meta)
            self.next_sid = _SID.unpack(raw)[0] if raw is not None else 1
            self.txn.put(b"format", _SID.pack(FORMAT_VERSION), db=eng._db_meta)
        s = _Stream(name, self.next_sid, args)
        self.next_sid += 1
        self.txn.put(b"next-sid", _SID.pack(self.next_sid), db=eng._db_meta)
        # a name deleted earlier in this commit stays in ``deleted``: _publish purges the old stream's keys
        # and tells its waiters and listeners, then installs this one
        self.streams[name] = s
        self.created.append(name)
        self.dirty = True
        return None

    def delete(self, name, keep_bindings=False):
        self.stream(name)                     # StreamNotFound when there is no such stream
        self.pending.pop(name, None)
        self.txn.delete(name.encode(), db=self.engine._db_streams)
        if not keep_bindings:
            self._unbind_everywhere(name)
        del self.streams[name]
        self.deleted.append(name)
        self.dirty = True
        # the stream's keys are purged after the commit in small transactions; its sid is never reused
        return None

    def _unbind_everywhere(self, name):
        """A deleted stream leaves every super stream it is a partition of, in the same transaction (as a
        deleted queue's bindings go with it on RabbitMQ), so Partitions and Route never name it after."""
        db = self.engine._db_supers
        if db is None:
            return
        bound = [(bytes(k), json.loads(bytes(v))) for k, v in self.txn.cursor(db=db)]
        for key, d in bound:
            if name not in d["partitions"]:
                continue
            orders = d.get("orders") or list(range(len(d["partitions"])))
            kept = [r for r in zip(d["partitions"], d["binding_keys"], orders) if r[0] != name]
            d["partitions"], d["binding_keys"], d["orders"] = ([r[0] for r in kept], [r[1] for r in kept],
                                                               [r[2] for r in kept])
            self.txn.put(key, json.dumps(d).encode(), db=db)

    def _exists(self, name):
        return (name in self.engine._streams and name not in self.deleted) or name in self.streams

    def create_super(self, name, partitions, binding_keys, args, adopt):
        eng = self.engine
        key = name.encode("utf-8")
        if self.txn.get(key, db=eng._db_supers) is not None:
            raise StreamExists(f"super stream {name!r} already exists")
        if not adopt:
            for p in partitions:
                if self._exists(p):
                    raise StreamExists(f"stream {p!r} already exists")
        for p in partitions:
            if not self._exists(p):
                self.create(p, args)
        self.txn.put(key, json.dumps({"partitions": partitions, "binding_keys": binding_keys,
                                      "arguments": args}).encode(), db=eng._db_supers)
        return None

    def delete_super(self, name):
        eng = self.engine
        key = name.encode("utf-8")
        raw = self.txn.get(key, db=eng._db_supers)
        if raw is None:
            raise StreamNotFound(f"super stream {name!r} does not exist")
        for p in json.loads(bytes(raw))["partitions"]:
            if self._exists(p):
                self.delete(p)
        self.txn.delete(key, db=eng._db_supers)
        self.dirty = True
        return None

    # ----------------------------------------------------------------------------------------- append

    def seq(self, sid, publisher):
        """The highest publishing id stored for ``publisher``, or NO_SEQUENCE (-1) when it stored none:
        a reference that stored nothing has seen nothing, so every id, 0 included, is above it (Osiris
        keeps a first id 0; only QueryPublisherSequence reports 0 for such a reference)."""
        key = (sid, publisher)
        v = self.seqs.get(key)
        if v is None:
            v = self.writer._seq_cache.get(key)
            if v is None:
                raw = self.txn.get(_tracking_key(sid, TRACKING_SEQUENCE, publisher), db=self.engine._db_tracking)
                v = _U64.unpack(raw)[0] if raw is not None else NO_SEQUENCE
        return v

    def append(self, req, counted=False):
        """Stage one append. ``counted``: an append of the batch being committed, counted in ``later``
        (then chunks stored as they come may be body-sized while more appends to the stream follow);
        an append from a transact function always closes (see CHUNK_BODY_RECORDS)."""
        s = self.stream(req.stream)
        closing = True
        if counted:
            left = self.later.get(req.stream, 1) - 1
            self.later[req.stream] = left
            closing = left <= 0
        body = _body_records(s)
        direct = s.chunk_max_records if closing else body    # records of a chunk stored as it comes
        data = req.data
        sealed = req.sealed
        if sealed:
            # a whole chunk built by the caller; its data section starts after the header
            data = memoryview(data)[LEN_CHUNK_HEADER:]
        ids = req.ids
        filters = req.filters
        entries, records = req.entries, req.records
        dups = []
        ends = counts = None
        if req.publisher is not None and ids is not None:
            last = self.seq(s.sid, req.publisher)
            if isinstance(ids, PublishingIds):
                # summarised by the caller: no per-id work unless some entry is a duplicate
                fresh = ids.increasing and len(ids) > 0 and ids.first > last
            else:
                fresh = ids and ids[0] > last and all(ids[i] < ids[i + 1] for i in range(len(ids) - 1))
            if fresh:
                new_last = ids.last if isinstance(ids, PublishingIds) else ids[-1]
            else:
                data, ends, counts, filters, dups, new_last = self._drop_duplicates(data, ids, filters, last)
                sealed = False
                entries = records = None
            if new_last != last:
                self.seqs[(s.sid, req.publisher)] = new_last
                self.txn.put(_tracking_key(s.sid, TRACKING_SEQUENCE, req.publisher), _U64.pack(new_last),
                             db=self.engine._db_tracking)
        res = _Deferred(dups)
        if not data:
            return res
        p = self.pending.get(s.name)
        if p is None:
            p = self.pending[s.name] = _Pending()
        if (sealed and filters is None and (OWN_CHUNK_MIN <= len(data) or self.alone) and len(data) <= s.chunk_max
                and records <= direct):
            # big enough to be a chunk of its own, or alone in its transaction (nothing to merge it
            # with): stamp the caller's buffer, no copy
            self._flush(s, p)
            res.first = s.next_offset
            res.last = s.next_offset + records - 1
            if req.crc_pending:
                _CRC.pack_into(req.data, H_CRC_OFFSET, core.crc32(data))
            if closing or records <= s.chunk_max_records:
                self._write(s, req.data, records)
            else:       # over the closing bound, and this append may turn out last: held (CHUNK_BODY_RECORDS)
                p.hold(req.data, 0, len(data), entries, records, True)
            return res
        if sealed and filters is None and (len(data) > s.chunk_max or records > direct):
            # a big Publish or Produce over the stream's bounds: cut where the core says, no copy
            self._cut_in_place(s, p, req.data, res, closing)
            return res
        if ends is None and entries is not None and entries <= MAX_CHUNK_ENTRIES:
            # the common case: the caller counted the entries and they fit in one chunk
            if filters is not None and len(filters) != entries:
                raise ChunkError(f"{len(filters)} filter values for {entries} entries")
            if p.whole is None and p.entries and (p.size + len(data) > s.chunk_max
                                                  or p.entries + entries > MAX_CHUNK_ENTRIES or p.records + records > body):
                self._flush(s, p)
            if (len(data) <= s.chunk_max and records <= body) or entries == 1:
                if p.whole is not None:
                    self._flush(s, p)
                p.parts.append(data)
                p.size += len(data)
                p.entries += entries
                res.first = s.next_offset + p.records
                p.records += records
                res.last = s.next_offset + p.records - 1
                self._note_filters(p, filters)
                return res
        if ends is None and filters is None and (not p.entries or p.whole is not None):
            # the common split (one big Publish frame over the chunk bounds): the core finds the cuts
            self._add_cut(s, p, data, res)
            return res
        if ends is None:
            ends, counts = core.scan_entries(data)
        if filters is not None and len(filters) != len(ends):
            raise ChunkError(f"{len(filters)} filter values for {len(ends)} entries")
        self._add(s, p, data, ends, counts, filters, res)
        return res

    @staticmethod
    def _drop_duplicates(data, ids, filters, last):
        """Keep the entries whose publishing id is above ``last`` (and above every id kept before it);
        ``last`` is NO_SEQUENCE when the reference stored nothing, so then an id 0 is kept too."""
        ends, counts = core.scan_entries(data)
        if len(ends) != len(ids):
            raise ChunkError(f"{len(ids)} publishing ids for {len(ends)} entries")
        mv = memoryview(data)
        keep_parts, keep_ends, keep_counts, keep_filters, dups = [], [], [], [], []
        pos = start = 0
        for i, end in enumerate(ends):
            if ids[i] > last:
                last = ids[i]
                keep_parts.append(mv[start:end])
                pos += end - start
                keep_ends.append(pos)
                keep_counts.append(counts[i])
                if filters is not None:
                    keep_filters.append(filters[i])
            else:
                dups.append(ids[i])
            start = end
        return (b"".join(keep_parts), keep_ends, keep_counts, keep_filters if filters is not None else None,
                dups, last)

    @staticmethod
    def _note_filters(p, filters):
        if filters is None:
            p.unfiltered = True
            return
        for f in filters:
            if f is None:
                p.unfiltered = True
            else:
                p.filters.add(bytes(f))

    def _add(self, s, p, data, ends, counts, filters, res):
        """Add entries that may need splitting over several chunks (by bytes, entries or records)."""
        if p.whole is not None:
            self._flush(s, p)
        start = 0
        n = len(ends)
        i = 0
        mv = memoryview(data)
        # records before entry k: cum[k]; so entries i..j-1 hold cum[j] - cum[i] records
        cum = list(itertools.accumulate(counts, initial=0))
        while i < n:
            j = bisect.bisect_right(ends, start + s.chunk_max - p.size, i)
            j = min(j, i + MAX_CHUNK_ENTRIES - p.entries)
            j = min(j, max(bisect.bisect_right(cum, cum[i] + _body_records(s) - p.records, i) - 1, i))
            if j == i and p.entries == 0:
                j = i + 1   # an entry larger than a whole chunk gets a chunk of its own
            if j == i:
                self._flush(s, p)
                continue
            end = ends[j - 1]
            p.parts.append(mv[start:end])
            p.size += end - start
            p.entries += j - i
            if res.first < 0:
                res.first = s.next_offset + p.records
            p.records += sum(counts[i:j])
            res.last = s.next_offset + p.records - 1
            self._note_filters(p, filters[i:j] if filters is not None else None)
            start = end
            i = j

    def _add_cut(self, s, p, data, res):
        """Entries of one append into an empty pending chunk, cut where the core says; every piece but the
        last becomes a chunk now, the last stays pending (later appends of this commit may join it)."""
        cuts = _cuts(s, data, False)    # the last piece stays pending: flush_all closes it
        self._flush(s, p)               # a held piece, once the cut found ``data`` well formed
        mv = memoryview(data)
        start = 0
        res.first = s.next_offset
        for k, (end, entries, records) in enumerate(cuts):
            if k:
                self._flush(s, p)
            p.parts.append(mv[start:end])
            p.size = end - start
            p.entries = entries
            p.records = records
            start = end
        p.unfiltered = True
        res.last = s.next_offset + p.records - 1

    def _cut_in_place(self, s, p, chunk, res, closing=True):
        """Store a caller's sealed ``chunk`` (a bytearray) that is over the stream's bytes or records per
        chunk as several chunks, each a view of the caller's buffer: its header is written over the 48
        bytes before its data (the end of the piece before, which its put has copied into the map) and
        those bytes are put back after its own put, so the buffer is as it came should the transaction be
        redone (MapFullError). A small last piece stays pending, as _add_cut leaves it, when other appends
        of this commit may join it. ``closing``: no other append to the stream follows in this commit, so
        the last piece keeps to the closing chunk's bound (see CHUNK_BODY_RECORDS); without it, a last
        piece over that bound is held, not stored (it may yet be the commit's last chunk)."""
        whole = memoryview(chunk)
        data = whole[LEN_CHUNK_HEADER:]
        cuts = _cuts(s, data, closing)
        self._flush(s, p)
        res.first = s.next_offset
        start = 0
        for k, (end, entries, records) in enumerate(cuts):
            if k == len(cuts) - 1:
                if end - start < OWN_CHUNK_MIN and not self.alone:
                    p.parts.append(data[start:end])
                    p.size, p.entries, p.records, p.unfiltered = end - start, entries, records, True
                    break
                if not closing and records > s.chunk_max_records:
                    p.hold(chunk, start, end - start, entries, records, False)
                    break
            self._put_piece(s, whole, start, end, entries, records)
            start = end
        res.last = s.next_offset + p.records - 1

    def _put_piece(self, s, whole, start, end, entries, records):
        """Store the data ``start:end`` of the caller's sealed chunk ``whole`` (a memoryview; offsets into
        its data section) as a chunk, its header written over the 48 bytes before that data (the caller's
        own header, or the end of the piece before, which its put has copied into the map). Those bytes
        are put back after the put, so the buffer is as it came should the transaction be redone
        (MapFullError)."""
        ts, chunk_id = self._stamp(s)
        crc = core.crc32(whole[LEN_CHUNK_HEADER + start:LEN_CHUNK_HEADER + end])
        saved = bytes(whole[start:start + LEN_CHUNK_HEADER])
        HEADER_STRUCT.pack_into(whole, start, CHUNK_MAGIC_VERSION, CHUNK_USER, entries, records, ts,
                                self.engine.epochs.get(s.name, CHUNK_EPOCH), chunk_id, crc, end - start, 0, 0)
        try:
            self._store(s, whole[start:LEN_CHUNK_HEADER + end], records, ts, chunk_id)
        finally:        # also when the put fails (MapFullError): the redo reads these bytes again
            whole[start:start + LEN_CHUNK_HEADER] = saved

    def _flush_held(self, s, p, closing):
        """Store the piece ``p`` holds: as it is, or (``closing`` and over the closing bound) cut into a
        head and a closing chunk in place."""
        whole = memoryview(p.whole)
        at, size, records = p.at, p.size, p.records
        if closing and records > s.chunk_max_records:
            start = at
            for end, entries, n in _cuts(s, whole[LEN_CHUNK_HEADER + at:LEN_CHUNK_HEADER + at + size], True):
                self._put_piece(s, whole, start, at + end, entries, n)
                start = at + end
        elif p.own:
            self._write(s, p.whole, records)
        else:
            self._put_piece(s, whole, at, at + size, p.entries, records)
        p.__init__()

    def _flush(self, s, p, closing=False):
        """Turn the pending entries of ``s`` into one chunk; ``closing`` (the commit's last chunk of
        ``s``, flush_all): into a body chunk and a closing one when they are over the closing bound."""
        if not p.entries:
            return
        if p.whole is not None:
            self._flush_held(s, p, closing)
            return
        data = p.parts[0] if len(p.parts) == 1 else b"".join(p.parts)
        bloom = core.build_bloom(list(p.filters), p.unfiltered, s.bloom_size) if p.filters else b""
        epoch = self.engine.epochs.get(s.name, CHUNK_EPOCH)
        if closing and p.records > s.chunk_max_records:
            # each piece keeps the whole bloom: a superset only lets a filtering reader see more, never less
            mv = memoryview(data)
            start = 0
            for end, entries, records in _cuts(s, data, True):
                ts, chunk_id = self._stamp(s)
                self._store(s, core.build_chunk(mv[start:end], entries, records, ts, chunk_id, epoch, 0, bloom, b""),
                            records, ts, chunk_id)
                start = end
            p.__init__()
            return
        ts, chunk_id = self._stamp(s)
        # built with its final header, so it needs no writable copy to be stamped
        chunk = core.build_chunk(data, p.entries, p.records, ts, chunk_id, epoch, 0, bloom, b"")
        self._store(s, chunk, p.records, ts, chunk_id)
        p.__init__()   # callers keep using the same object for the next chunk

    def _stamp(self, s):
        """Timestamp (ms, never below the stream's last) and id of the next chunk of ``s``."""
        now = self.engine.clock()
        return (now if now > s.last_ts else s.last_ts), s.next_offset

    def _write(self, s, chunk, records):
        """Stamp chunk id, epoch and timestamp into the caller's sealed ``chunk`` (a bytearray) and store it."""
        ts, chunk_id = self._stamp(s)
        _STAMP_TS.pack_into(chunk, 8, ts)
        _STAMP_ID.pack_into(chunk, 16, self.engine.epochs.get(s.name, CHUNK_EPOCH))
        _STAMP_ID.pack_into(chunk, 24, chunk_id)
        self._store(s, chunk, records, ts, chunk_id)

    def _store(self, s, chunk, records, ts, chunk_id):
        """Put a stamped chunk and its index entry, and advance the staged stream state."""
        eng = self.engine
        txn = self.txn
        put_chunk(txn, eng._db_chunks, eng._db_time, s.sid, chunk_id, chunk, records, ts)
        self.bytes_written += len(chunk)
        s.advance(chunk_id, records, len(chunk), ts)
        self.dirty = True

    def replicate(self, name, chunks, sequences, start=False):
        """Store leader chunks unchanged at their own ids (Engine.replicate_chunks): ``chunks`` is a list
        of ``(bytes, header)`` whose CRCs were checked; ``sequences`` (the publisher sequences that cover
        them) go in the same transaction. Every chunk id is checked against the log's end BEFORE any is
        staged, so a refused batch stores nothing (none of its chunks without its sequences). With
        ``start``, an empty copy begins at the first chunk's id. Returns the stream's next offset after
        them."""
        s = self.stream(name)
        p = self.pending.get(name)
        if p is not None:
            self._flush(s, p, True)     # the stream's last chunk for now: the closing bound (CHUNK_BODY_RECORDS)
        expect = s.next_offset
        if start and chunks and s.chunks == 0 and s.last_chunk < 0:
            # an empty copy starts wherever its leader's log starts now (retention or compaction may
            # have removed the leader's first chunks): it holds a suffix of the leader's log, never a gap
            expect = chunks[0][1][H_CHUNK_ID]
        first = expect
        for _, h in chunks:
            if h[H_CHUNK_ID] != expect:
                raise ChunkError(f"replicated chunk {h[H_CHUNK_ID]} is not at the stream's end {expect}", name,
                                 h[H_CHUNK_ID])
            expect += h[H_RECORDS]
        s.next_offset = first
        for publisher, seq in sequences.items():
            self.seqs[(s.sid, publisher)] = seq
            self.txn.put(_tracking_key(s.sid, TRACKING_SEQUENCE, publisher), _U64.pack(seq),
                         db=self.engine._db_tracking)
        for chunk, h in chunks:
            ts = h[H_TIMESTAMP]
            self._store(s, chunk, h[H_RECORDS], ts if ts > s.last_ts else s.last_ts, h[H_CHUNK_ID])
        return s.next_offset

    def _closed(self, name):
        """The staged state of ``name`` with its pending entries stored: the stream's last chunk for now, so
        they keep to the closing bound (CHUNK_BODY_RECORDS) before a trim or truncate reads its chunks."""
        s = self.stream(name)
        p = self.pending.get(name)
        if p is not None:
            self._flush(s, p, True)
        return s

    def trim_head(self, name, offset):
        """Delete the chunks of ``name`` that end at or before ``offset``, keeping the last chunk
        (Engine.trim_head); the stream's first offset after it."""
        s = self._closed(name)
        eng = self.engine
        txn = self.txn
        cur = txn.cursor(db=eng._db_chunks)
        ok = cur.set_range(_CHUNK_KEY.pack(s.sid, 0))
        removed = 0
        while ok and s.chunks > 1:
            ksid, chunk_id = _CHUNK_KEY.unpack(cur.key())
            if ksid != s.sid:
                break
            h = core.read_header(cur.value())
            if chunk_id + max(h[H_RECORDS], 1) > offset:
                break
            size = len(cur.value())
            txn.delete(_TIME_KEY.pack(s.sid, h[H_TIMESTAMP] + TS_BIAS, chunk_id), db=eng._db_time)
            ok = cur.delete()
            s.records -= h[H_RECORDS]
            s.bytes -= size
            s.chunks -= 1
            removed += 1
        if removed:
            s.first_chunk = _CHUNK_KEY.unpack(cur.key())[1] if ok else s.last_chunk
            s.unsaved = STATE_FORCE     # the chunks cannot tell that the head moved
            self.dirty = True
        return s.first_chunk

    def truncate(self, name, offset):
        """Delete the chunks of ``name`` at or after ``offset`` (Engine.truncate); the next offset."""
        s = self._closed(name)
        eng = self.engine
        txn = self.txn
        cur = txn.cursor(db=eng._db_chunks)
        doomed = []
        ok = cur.set_range(_CHUNK_KEY.pack(s.sid, offset))
        while ok:
            ksid, chunk_id = _CHUNK_KEY.unpack(cur.key())
            if ksid != s.sid:
                break
            h = core.read_header(cur.value())
            doomed.append((chunk_id, h[H_RECORDS], h[H_TIMESTAMP], len(cur.value())))
            ok = cur.next()
        if not doomed and offset >= s.next_offset:
            return s.next_offset
        if not doomed or doomed[0][0] != offset:
            raise InvalidArgument(f"offset {offset} is not a chunk boundary of {name!r}")
        for chunk_id, records, ts, size in doomed:
            txn.delete(_CHUNK_KEY.pack(s.sid, chunk_id), db=eng._db_chunks)
            txn.delete(_TIME_KEY.pack(s.sid, ts + TS_BIAS, chunk_id), db=eng._db_time)
            s.records -= records
            s.bytes -= size
            s.chunks -= 1
        s.next_offset = offset
        last, last_ts = -1, -1
        if cur.set_range(_CHUNK_KEY.pack(s.sid, offset)) and cur.prev() or cur.last():
            ksid, chunk_id = _CHUNK_KEY.unpack(cur.key())
            if ksid == s.sid and chunk_id < offset:
                last, last_ts = chunk_id, core.read_header(cur.value())[H_TIMESTAMP]
        s.last_chunk = last
        if last < 0:
            s.first_chunk = -1
        s.last_ts = max(last_ts, 0) if last >= 0 else s.last_ts
        # the publisher sequences may count ids of the removed chunks: dropping them risks a duplicate
        # when those are published again, keeping them would drop (and confirm) what is not stored
        prefix = _SID.pack(s.sid) + bytes((TRACKING_SEQUENCE,))
        tcur = txn.cursor(db=eng._db_tracking)
        ok = tcur.set_range(prefix)
        while ok and bytes(tcur.key()).startswith(prefix):
            ok = tcur.delete()
        self.seqs = {k: v for k, v in self.seqs.items() if k[0] != s.sid}
        self.writer._seq_cache = {k: v for k, v in self.writer._seq_cache.items() if k[0] != s.sid}
        s.unsaved = STATE_FORCE     # the chunks cannot tell that the tail went
        self.dirty = True
        return s.next_offset

    def flush_all(self):
        """Close the commit: each stream's pending entries become its last chunks (the closing bound)."""
        for name, p in list(self.pending.items()):
            self._flush(self.streams[name], p, True)

    def write_states(self):
        """Write the state records that are due: a stream's record is saved when something its chunks do
        not tell changed (STATE_FORCE) and otherwise every STATE_SAVE_EVERY chunks (sparse.py)."""
        for name, s in self.streams.items():
            if s.unsaved >= STATE_SAVE_EVERY:
                s.unsaved = 0
                self.txn.put(name.encode(), s.encode(), db=self.engine._db_streams)
