"""The disk alarm in the broker layer (broker/disk.py) over a real engine, and the size settings of
``--disk-free-limit`` / ``--max-disk``. The full-disk runs on a real small filesystem are in
tests/integration/test_disk_full.py and tests/engine/test_disk_full.py."""

import logging

import pytest

from riverbed.engine.errors import StorageFull
from riverbed.shells import config
from riverbed.shells.broker.disk import DiskMonitor

from .harness import Loop


@pytest.fixture
def lp(tmp_path):
    loop = Loop(tmp_path)
    yield loop
    loop.close()


@pytest.mark.parametrize("text,size", [("0", 0), ("123", 123), ("16MB", 16 << 20), ("1GB", 1 << 30),
                                       ("1.5gb", 3 << 29), ("512MiB", 512 << 20), ("50mb", 50 << 20),
                                       ("10kB", 10 << 10), (4096, 4096)])
def test_disk_sizes_take_bytes_or_a_unit(text, size):
    cfg = config.load({"disk_free_limit": str(text), "max_disk": str(text) if size else "off"}, env={})
    assert cfg.disk_free_limit == size and cfg.max_disk == (size or None)


@pytest.mark.parametrize("text", ["", "MB", "12XB", "-1MB", "lots"])
def test_a_bad_disk_size_is_refused_naming_the_flag(text):
    with pytest.raises(config.ConfigError, match="--disk-free-limit"):
        config.load({"disk_free_limit": text}, env={})


def test_disk_settings_defaults():
    cfg = config.load({}, env={})
    assert cfg.disk_free_limit == 50 << 20 and cfg.max_disk is None
    assert config.load({}, env={"RIVERBED_MAX_DISK": "off"}).max_disk is None
    assert config.load({}, env={"RIVERBED_DISK_FREE_LIMIT": "1GiB"}).disk_free_limit == 1 << 30


def _append(lp, stream, n=1):
    out = []
    lp.broker.append_records(stream, [b"r"] * n, lambda res, exc: out.append((res, exc)))
    lp.settle()
    return out[0]


def test_below_the_free_limit_publishes_are_refused_reads_go_on_and_it_clears_by_itself(lp, caplog):
    lp.eng.create_stream("s").result()
    assert _append(lp, "s")[1] is None
    monitor = DiskMonitor(lp.eng, free_limit=1 << 60)        # more than any disk has: the alarm is on
    lp.broker.disk = monitor
    with caplog.at_level(logging.WARNING, "riverbed.broker"):
        assert monitor.check() is True
    assert "disk alarm set: disk space low" in caplog.text
    res, exc = _append(lp, "s")
    assert res is None and isinstance(exc, StorageFull) and "--disk-free-limit" in str(exc)
    assert exc.limit == 1 << 60 and exc.free == monitor.free
    assert isinstance(lp.broker.write_refusal(), StorageFull)
    assert monitor.refused == 1
    assert lp.eng.stream_info("s").records == 1             # nothing of the refused publish was stored
    assert [bytes(r) for _, r in lp.eng.scan("s")] == [b"r"]
    done = []
    lp.broker.store_offset("s", "reader", 0, done.append)   # consumer offsets still commit
    lp.settle()
    assert done == [None]
    monitor.free_limit = 0                                   # space "returns"
    with caplog.at_level(logging.WARNING, "riverbed.broker"):
        assert monitor.check() is False
    assert "disk alarm cleared" in caplog.text
    assert lp.broker.write_refusal() is None
    assert _append(lp, "s")[1] is None


def test_at_max_disk_publishes_are_refused(lp):
    lp.eng.create_stream("s").result()
    monitor = DiskMonitor(lp.eng, free_limit=0, max_disk=1 << 30)
    lp.broker.disk = monitor
    assert monitor.check() is False and monitor.data_bytes > 0
    monitor.max_disk = monitor.data_bytes       # the data is at the cap
    assert monitor.check() is True and monitor.reason.startswith("data at its cap")
    res, exc = _append(lp, "s")
    assert isinstance(exc, StorageFull) and "--max-disk" in str(exc) and exc.limit == monitor.max_disk
