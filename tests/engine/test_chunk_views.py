"""Engine.read_chunk_views: the chunks read_chunks gives, handed to a callback in place (memoryviews into
LMDB's map) inside one read transaction; the same bounds, read limit and checks (header, chunk id, CRC at
first read), and a bad chunk ends the list before it."""

import mmap

import pytest

from riverbed.engine import ChunkError, Engine, StreamNotFound
from riverbed.engine.format import LEN_CHUNK_HEADER


def _fill(path, count=6, per_chunk=3):
    """``count`` chunks of ``per_chunk`` distinct records in stream "s"; returns read_chunks' pairs."""
    with Engine(path, map_size=16 << 20) as eng:
        eng.create_stream("s").result()
        for c in range(count):
            eng.append("s", [f"chunk-{c}-record-{r}-".encode() + bytes([65 + c]) * (30 + r)
                             for r in range(per_chunk)]).result()
        return eng.read_chunks("s", 0, max_chunks=100)


def _copied(chunks):
    # what a callback may keep: copies, made while the views are valid
    return [(cid, bytes(view)) for cid, view in chunks]


def test_views_are_the_chunks_read_chunks_gives_within_the_same_bounds(tmp_path):
    path = tmp_path / "data"
    chunks = _fill(path)
    ids = [cid for cid, _ in chunks]
    with Engine(path) as eng:       # reopened: every chunk is CRC-checked at its first read
        seen = []

        def fn(views):
            assert all(type(v) is not bytes for _, v in views)      # in place: no copy
            seen.append(_copied(views))
            return "result"
        assert eng.read_chunk_views("s", 0, fn, 100) == "result"
        assert seen == [chunks]
        for start, n in ((0, 1), (ids[2], 2), (ids[2] + 1, 3), (ids[-1], 10), (ids[-1] + 3, 10)):
            assert eng.read_chunk_views("s", start, _copied, n) == eng.read_chunks("s", start, n), (start, n)
        # max_bytes: no chunk after the one that brings the stored bytes to it
        size = len(chunks[0][1])
        assert eng.read_chunk_views("s", 0, _copied, 100, 1) == chunks[:1]
        assert eng.read_chunk_views("s", 0, _copied, 100, size) == chunks[:1]
        assert eng.read_chunk_views("s", 0, _copied, 100, size + 1) == chunks[:2]
        assert eng.read_chunk_views("s", ids[1], _copied, 100, 2 * size + 1) == chunks[1:4]
        # the read limit of replication, and limited=False past it
        eng.set_read_limit("s", ids[3])
        assert eng.read_chunk_views("s", 0, _copied, 100) == chunks[:3]
        assert eng.read_chunk_views("s", 0, _copied, 100, limited=False) == chunks


def test_a_stream_that_does_not_exist_never_calls_back(tmp_path):
    with Engine(tmp_path / "data") as eng:
        with pytest.raises(StreamNotFound):
            eng.read_chunk_views("nope", 0, lambda views: pytest.fail("called"), 10)


def _flip(path, needle, delta):
    """XOR 0xFF into byte ``delta`` of every copy of ``needle`` in the file ``path``."""
    found = 0
    with open(path, "r+b") as f, mmap.mmap(f.fileno(), 0) as m:
        pos = m.find(needle)
        while pos >= 0:
            m[pos + delta] ^= 0xFF
            found += 1
            pos = m.find(needle, pos + 1)
        m.flush()
    assert found
    return found


def test_a_corrupt_chunk_ends_the_views_before_it_and_raises_naming_it(tmp_path):
    path = tmp_path / "data"
    chunks = _fill(path)
    ids = [cid for cid, _ in chunks]
    _flip(path / "data.mdb", chunks[3][1], LEN_CHUNK_HEADER + 5)     # a data byte: the CRC no longer matches
    with Engine(path) as eng:
        got = []
        with pytest.raises(ChunkError) as ei:
            eng.read_chunk_views("s", 0, lambda views: got.append(_copied(views)), 100)
        assert got == [chunks[:3]]                      # the good chunks before it, then the error
        assert (ei.value.stream, ei.value.chunk_id) == ("s", ids[3]) and "CRC" in ei.value.reason
        # read from the bad chunk (or inside it): nothing, the same error, every time (never trusted)
        for start in (ids[3], ids[3] + 1, ids[3]):
            got = []
            with pytest.raises(ChunkError) as ei:
                eng.read_chunk_views("s", start, lambda views: got.append(_copied(views)), 100)
            assert got == [[]] and ei.value.chunk_id == ids[3]
            with pytest.raises(ChunkError):
                eng.read_chunks("s", start, 100)
        # past it, the log reads on
        assert eng.read_chunk_views("s", ids[4], _copied, 100) == chunks[4:]
