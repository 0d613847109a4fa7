"""A caller's sealed chunk over the stream's bounds (a 5,000-record Publish or Produce, alone in its commit,
whose closing chunk may hold 1,000 records) is stored as several chunks cut in place: views of the caller's
buffer, each with its own header and CRC, no copy of the data (staged._Staged._cut_in_place)."""

import pytest

from riverbed.engine import Engine, core
from riverbed.engine.format import H_CHUNK_ID, H_CRC, H_DATA_LEN, H_ENTRIES, H_RECORDS, H_TIMESTAMP
from riverbed.engine.writer import CHUNK_BODY_RECORDS


def rec(i, size=100):
    return i.to_bytes(8, "big") + bytes([i & 0xFF]) * (size - 8)


def sealed(records, crc_done):
    chunk = core.encode_chunk_buffer(records)
    if not crc_done:
        chunk[32:36] = b"\0\0\0\0"     # as wire.publish_chunk(..., crc=False) and the Kafka shell leave it
    return chunk


def check_chunks(eng, stream, records, per_chunk, closing=None):
    """The chunks of ``stream`` hold ``records`` in order, each at most ``per_chunk`` records and the last
    at most ``closing`` (default: ``per_chunk``)."""
    chunks = eng.read_chunks(stream, 0, 1000)
    offset = 0
    for i, (_, raw) in enumerate(chunks):
        h = core.check_chunk(raw)        # lengths add up and the data CRC is right
        assert h[H_CHUNK_ID] == offset
        bound = closing if closing is not None and i == len(chunks) - 1 else per_chunk
        assert h[H_ENTRIES] == h[H_RECORDS] <= bound
        assert h[H_CRC] == core.crc32(raw[48:48 + h[H_DATA_LEN]])
        offset += h[H_RECORDS]
    assert offset == len(records)
    assert [r for _, r in eng.scan(stream)] == records
    return chunks


@pytest.mark.parametrize("crc_done", [False, True])
def test_a_big_sealed_chunk_is_cut_into_whole_chunks(tmp_path, crc_done):
    with Engine(tmp_path / "d", fsync="never", retention_interval=0) as eng:
        eng.create_stream("s").result()
        records = [rec(i, 100 + i % 13) for i in range(5000)]
        chunk = sealed(records, crc_done)
        before = bytes(chunk)
        res = eng.append_chunk("s", chunk, num_entries=5000, num_records=5000, crc_done=crc_done).result()
        assert (res.first_offset, res.last_offset) == (0, 4999)
        chunks = check_chunks(eng, "s", records, CHUNK_BODY_RECORDS, 1000)
        # a head and a closing chunk of 1,000 (LAST reaches back that far), not five of 1,000
        assert [core.read_header(raw)[H_RECORDS] for _, raw in chunks] == [4000, 1000]
        assert [core.read_header(raw)[H_TIMESTAMP] for _, raw in chunks] == sorted(
            core.read_header(raw)[H_TIMESTAMP] for _, raw in chunks)
        # the data section is as the caller handed it: every header written over it was put back
        assert bytes(chunk)[48:] == before[48:]
        # and the next append goes on after it
        eng.append("s", [b"after"]).result()
        assert eng.stream_info("s").next_offset == 5001


def test_cut_by_bytes_and_records_at_the_streams_own_bounds(tmp_path):
    with Engine(tmp_path / "d", fsync="never", retention_interval=0) as eng:
        eng.create_stream("s", {"chunk-max-records": "300", "chunk-max-bytes": "20000"}).result()
        records = [rec(i, 30 + (i * 37) % 400) for i in range(2000)]
        eng.append_chunk("s", sealed(records, False), num_entries=2000, num_records=2000, crc_done=False).result()
        chunks = check_chunks(eng, "s", records, 300)
        assert all(core.read_header(raw)[H_DATA_LEN] <= 20000 for _, raw in chunks)
        # tiny pieces: each header is written over less than one record of the piece before
        eng.create_stream("t", {"chunk-max-records": "1"}).result()
        small = [b"%d" % i for i in range(50)]
        eng.append("t", small).result()
        assert len(check_chunks(eng, "t", small, 1)) == 50


def test_the_pieces_are_not_copied(tmp_path, monkeypatch):
    # the cut stores views of the caller's buffer: the copying chunk builder is never called for them
    with Engine(tmp_path / "d", fsync="never", retention_interval=0) as eng:
        eng.create_stream("s").result()
        records = [rec(i) for i in range(3000)]

        def no_copy(*args, **kwargs):
            raise AssertionError("a piece was copied into a new chunk")
        monkeypatch.setattr(core, "build_chunk", no_copy)
        eng.append_chunk("s", sealed(records, False), num_entries=3000, num_records=3000, crc_done=False).result()
        monkeypatch.undo()
        assert [core.read_header(raw)[H_RECORDS] for _, raw in check_chunks(eng, "s", records, 2000, 1000)] == [
            2000, 1000]


def test_a_redone_transaction_cuts_the_same_bytes(tmp_path):
    # a 1 MiB map: the 1.6 MB append fills it, the writer grows the map and redoes the transaction from the
    # same caller buffer, which the first try's headers must not have changed
    with Engine(tmp_path / "d", fsync="never", retention_interval=0, map_size=1 << 20) as eng:
        eng.create_stream("s").result()
        records = [rec(i, 300) for i in range(5200)]
        eng.append_chunk("s", sealed(records, False), num_entries=5200, num_records=5200, crc_done=False).result()
        assert eng.env.info()["map_size"] > 1 << 20
        # cut by bytes first (1 MiB holds 3,445 of these entries), then the closing 1,000
        assert [core.read_header(raw)[H_RECORDS] for _, raw in check_chunks(eng, "s", records, 3445, 1000)] == [
            3445, 755, 1000]
