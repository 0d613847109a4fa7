"""Engine micro-benchmarks (pytest-benchmark). Run with ``make bench``.

Prints, in one run on this machine:
- append rec/s for 1M x 100-byte records in batches of 1,000, with fsync=never and fsync=batch
  (every batch is submitted at once; the writer group-commits them);
- full-scan rec/s with every record materialised as ``bytes``;
- chunk encode and decode MB/s (1,000 x 100-byte records per chunk);
- seek latency by offset and by timestamp, in a stream of 1M records.

Targets (2 cores): append >= 3M rec/s with fsync=never, scan >= 10M rec/s, encode >= 1 GB/s.
"""

import os
import random
import shutil
import tempfile

import pytest

from riverbed.engine import Engine, OffsetSpec, core

N_RECORDS = int(os.environ.get("RIVERBED_BENCH_RECORDS", 1_000_000))
BATCH = 1000
RECORD = b"r" * 100

_REPORT = []


def report(line):
    _REPORT.append(line)
    print("\n" + line)


@pytest.fixture(scope="module")
def batches():
    return [[RECORD] * BATCH for _ in range(N_RECORDS // BATCH)]


@pytest.fixture(scope="module")
def filled(tmp_path_factory, batches):
    """One stream of N_RECORDS records, shared by the read benchmarks."""
    path = tmp_path_factory.mktemp("filled")
    eng = Engine(path, fsync="never", retention_interval=0)
    eng.create_stream("s").result()
    for f in [eng.append("s", b) for b in batches]:
        f.result()
    yield eng
    eng.close()


@pytest.mark.parametrize("fsync", ["never", "batch"])
def test_append_1m_records(benchmark, batches, fsync):
    dirs = []

    def setup():
        d = tempfile.mkdtemp(prefix="rb-bench-")
        dirs.append(d)
        eng = Engine(d, fsync=fsync, retention_interval=0)
        eng.create_stream("s").result()
        return (eng,), {}

    def run(eng):
        futs = [eng.append("s", b) for b in batches]
        for f in futs:
            f.result()
        eng.close()

    benchmark.pedantic(run, setup=setup, rounds=3, iterations=1)
    for d in dirs:
        shutil.rmtree(d, ignore_errors=True)
    rate = N_RECORDS / benchmark.stats.stats.median
    benchmark.extra_info["rec_per_s"] = rate
    report(f"append fsync={fsync}: {rate / 1e6:.2f}M rec/s ({N_RECORDS} x {len(RECORD)} B, "
           f"batches of {BATCH}; median of 3)")


def test_full_scan(benchmark, filled):
    def run():
        n = 0
        for _, records in filled.scan_chunks("s"):
            n += len(records)
        assert n == N_RECORDS
    benchmark.pedantic(run, rounds=5, iterations=1)
    rate = N_RECORDS / benchmark.stats.stats.median
    benchmark.extra_info["rec_per_s"] = rate
    report(f"full scan (records as bytes, CRC checked): {rate / 1e6:.2f}M rec/s")


def test_full_scan_per_record_iterator(benchmark, filled):
    def run():
        n = 0
        for _ in filled.scan("s"):
            n += 1
        assert n == N_RECORDS
    benchmark.pedantic(run, rounds=3, iterations=1)
    rate = N_RECORDS / benchmark.stats.stats.median
    report(f"full scan via scan() (offset, bytes) tuples: {rate / 1e6:.2f}M rec/s")


def test_chunk_encode(benchmark):
    records = [RECORD] * BATCH
    benchmark(core.encode_chunk, records, 0, 0)
    mb = BATCH * (len(RECORD) + 4) / benchmark.stats.stats.median / 1e6
    report(f"chunk encode: {mb:.0f} MB/s ({BATCH} x {len(RECORD)} B per chunk)")


def test_chunk_decode(benchmark):
    chunk = core.encode_chunk([RECORD] * BATCH, 0, 0)
    benchmark(core.chunk_records, chunk)
    mb = len(chunk) / benchmark.stats.stats.median / 1e6
    report(f"chunk decode (CRC + records as bytes): {mb:.0f} MB/s, "
           f"{BATCH / benchmark.stats.stats.median / 1e6:.1f}M rec/s")


def test_seek_by_offset(benchmark, filled):
    rnd = random.Random(1)
    offsets = [rnd.randrange(N_RECORDS) for _ in range(1000)]

    def run():
        for o in offsets:
            filled.read_chunks("s", o, 1)
    benchmark(run)
    us = benchmark.stats.stats.median / len(offsets) * 1e6
    report(f"seek by offset + read chunk: {us:.1f} us")


def test_seek_by_timestamp(benchmark, filled):
    info = filled.stream_info("s")
    rnd = random.Random(2)
    stamps = [rnd.randint(info.first_timestamp, info.last_timestamp) for _ in range(1000)]

    def run():
        for t in stamps:
            filled.resolve("s", OffsetSpec.timestamp(t))
    benchmark(run)
    us = benchmark.stats.stats.median / len(stamps) * 1e6
    report(f"seek by timestamp: {us:.1f} us")


def teardown_module():
    print("\n=== engine benchmark summary ===")
    for line in _REPORT:
        print(line)
