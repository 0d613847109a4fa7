"""An idempotent producer's sequences reach the engine summarised (first, last, rising, count): a fresh
batch costs the writer nothing per record, and the ids are packed only for a retry's duplicate check."""

from riverbed.engine import Engine, core
from riverbed.engine.layout import PublishingIds
from riverbed.shells.kafka.session import _sequence_ids


def _chunk(n):
    return core.encode_chunk_buffer([b"r%d" % i for i in range(n)])


def test_fresh_batches_never_pack_the_ids(tmp_path):
    with Engine(tmp_path / "d", fsync="never", retention_interval=0) as eng:
        eng.create_stream("s").result()
        first = _sequence_ids([(0, 3000)])
        assert isinstance(first, PublishingIds) and len(first) == 3000 and (first.first, first.last) == (0, 2999)
        eng.append_chunk("s", _chunk(3000), num_entries=3000, num_records=3000, publishing_ids=first,
                         publisher="kafka-7-0").result()
        assert first._raw is None          # the writer took the summary: no id was packed
        # a retry of the same batch and a new one in one append: the duplicate check packs and drops
        again = _sequence_ids([(0, 3000), (3000, 2)])
        res = eng.append_chunk("s", _chunk(3002), num_entries=3002, num_records=3002, publishing_ids=again,
                               publisher="kafka-7-0").result()
        assert again._raw is not None and list(again)[:2] == [0, 1]
        assert len(res.duplicates) == 3000
        assert eng.stream_info("s").next_offset == 3002
