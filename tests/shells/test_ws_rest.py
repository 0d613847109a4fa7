"""The WebSocket listener's REST reads, sans HTTP: a real Engine and Broker (the harness), the read walk
of :class:`~riverbed.shells.ws_json.rest.RestApi` run on a fresh event loop."""

import asyncio

import pytest

from riverbed.engine import record as rec
from riverbed.shells.ws_json import codec, rest

from .harness import Loop


@pytest.fixture
def h(tmp_path):
    harness = Loop(tmp_path)
    yield harness
    harness.close()


def _fill(h, n, size):
    h.eng.create_stream("s", {}).result(10)
    for i in range(n):
        h.eng.append("s", [rec.from_json_text('{"v":"%s"}' % ("x" * size), 1000 + i, None)]).result(10)


def _collect(h, lo, hi, **kw):
    async def go():
        return await rest.RestApi(h.broker, asyncio.get_running_loop())._collect("s", codec.msg_prefix("s", 0),
                                                                               lo, hi, **kw)
    return asyncio.run(go())


def test_collect_refuses_an_answer_over_the_byte_bound(h, monkeypatch):
    _fill(h, 5, 100)
    assert [m.split(",")[5] for m in _collect(h, 0, 4)] == ["0", "1", "2", "3", "4"]
    monkeypatch.setattr(rest, "REST_MAX_BYTES", 300)       # two messages of ~140 bytes fit, three do not
    assert len(_collect(h, 0, 1)) == 2
    with pytest.raises(rest.RestError) as e:
        _collect(h, 0, 4)
    assert e.value.status == 400 and e.value.text.startswith("The answer would be larger than 300 bytes")


def test_collect_refuses_more_matches_than_the_record_bound(h, monkeypatch):
    _fill(h, 5, 1)
    monkeypatch.setattr(rest, "REST_MAX_RECORDS", 3)
    assert len(_collect(h, 0, 4, min_ts=1002)) == 3          # filtered down to the bound: answered
    with pytest.raises(rest.RestError) as e:
        _collect(h, 0, 4, min_ts=1001)
    assert e.value.status == 400
