"""``riverbed tail --data-dir``: records read through the broker's record reads, each with its offset and
its timestamp by the one rule (creation-time, else the chunk's)."""

import json

from riverbed.engine import Engine
from riverbed.engine.record import CT_JSON, encode_record
from riverbed.shells.admin import render
from riverbed.shells.admin.tail import SPEC_FIRST, SPEC_OFFSET, tail_local


def test_tail_of_a_data_dir_gives_offsets_and_timestamps_by_the_rule(tmp_path, capsys):
    eng = Engine(str(tmp_path))
    eng.create_stream("s").result()
    eng.append("s", [encode_record(b'{"a":1}', CT_JSON, 1000), b"raw"]).result()
    eng.append("s", [b'{"b":2}']).result()
    eng.close()
    assert tail_local(str(tmp_path), "s", (SPEC_FIRST, None), False, render.FMT_JSON) == 0
    recs = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["offset"] for r in recs] == [0, 1, 2]
    assert recs[0]["timestamp"] == "1970-01-01T00:00:01.000Z"          # its creation-time
    assert recs[1]["timestamp"].startswith("20") and recs[2]["timestamp"].endswith("Z")   # its chunk's
    assert tail_local(str(tmp_path), "s", (SPEC_OFFSET, 1), False, render.FMT_JSON) == 0
    assert [json.loads(x)["offset"] for x in capsys.readouterr().out.splitlines()] == [1, 2]
