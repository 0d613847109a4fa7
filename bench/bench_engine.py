"""Engine micro-benchmarks (pytest-benchmark). Run with ``make bench``.

Prints, in one run on this machine:
- append rec/s for 1M x 100-byte records in batches of 1,000, with fsync=never and fsync=batch
  (every batch is submitted at once; the writer group-commits them);
- full-scan rec/s with every record materialised as ``bytes``;
- chunk encode and decode MB/s (1,000 x 100-byte records per chunk);
- seek latency by offset and by timestamp, in a stream of 1M records.

Targets (2 cores): append >= 3M rec/s with fsync=never, scan >= 10M rec/s, encode >= 1 GB/s.

Document store (100k documents of ~200 B, ``RIVERBED_BENCH_DOCS``), each row printing its target and
whether this run met it (the summary repeats them):
- put_many in batches of 1,000 >= 150k docs/s (no secondary index; also shown with one);
- get by id >= 300k/s (one ``get`` per id, random ids; ``get_many`` shown too);
- an indexed equality query returning 100 rows <= 1 ms;
- a predicate over a full scan >= 500k docs/s (compiled raw-BSON matcher; 1% of the documents match).
"""

import os
import random
import shutil
import tempfile

import pytest

from riverbed.engine import DocStore, Engine, OffsetSpec, core
from riverbed.engine.predicate import And, Eq, Gt

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


# ---------------------------------------------------------------------------------------- document store

N_DOCS = int(os.environ.get("RIVERBED_BENCH_DOCS", 100_000))
DOC_BATCH = 1000
_TARGETS = []


def make_doc(i):
    """~200 bytes of BSON: 9 fields, one embedded document."""
    return {"name": f"user-{i:06d}", "age": i % 90, "score": (i * 7919 % 10007) / 10.0, "active": i % 3 == 0,
            "city": ("Amsterdam", "Berlin", "Paris", "Rome", "Oslo")[i % 5], "group": i % (N_DOCS // 100),
            "address": {"street": f"Main Street {i}", "zip": f"{i % 9999:04d}AB"}, "note": "x" * 30}


def target(what, value, unit, goal, higher_is_better=True):
    met = value >= goal if higher_is_better else value <= goal
    ratio = value / goal if higher_is_better else goal / value
    shown = f"{value:,.3f}" if value < 100 else f"{value:,.0f}"
    line = (f"target {what}: {shown} {unit} vs {'>=' if higher_is_better else '<='} {goal:,} {unit}: "
            f"{'met' if met else 'NOT met'} ({ratio:.2f}x)")
    _TARGETS.append(line)
    report(line)


@pytest.fixture(scope="module")
def doc_rows():
    return [(i, make_doc(i)) for i in range(N_DOCS)]


@pytest.fixture(scope="module")
def docs_filled(tmp_path_factory, doc_rows):
    """Collection "c" of N_DOCS documents with an index on "group" (100 documents per value)."""
    path = tmp_path_factory.mktemp("docs")
    eng = Engine(path, fsync="never", retention_interval=0)
    ds = DocStore(eng)
    ds.create_collection("c", ["group"]).result()
    for f in [ds.put_many("c", doc_rows[i:i + DOC_BATCH]) for i in range(0, N_DOCS, DOC_BATCH)]:
        f.result()
    yield ds
    eng.close()


@pytest.mark.parametrize("indexes", [(), ("group",)], ids=["no-index", "one-index"])
def test_docs_put_many(benchmark, doc_rows, indexes):
    dirs = []

    def setup():
        d = tempfile.mkdtemp(prefix="rb-bench-docs-")
        dirs.append(d)
        eng = Engine(d, fsync="never", retention_interval=0)
        ds = DocStore(eng)
        ds.create_collection("c", indexes).result()
        return (eng, ds), {}

    def run(eng, ds):
        futs = [ds.put_many("c", doc_rows[i:i + DOC_BATCH]) for i in range(0, N_DOCS, DOC_BATCH)]
        for f in futs:
            f.result()
        eng.close()

    benchmark.pedantic(run, setup=setup, rounds=3, iterations=1)
    for d in dirs:
        shutil.rmtree(d, ignore_errors=True)
    rate = N_DOCS / benchmark.stats.stats.median
    benchmark.extra_info["docs_per_s"] = rate
    report(f"docs put_many ({', '.join(indexes) or 'no'} secondary index): {rate / 1e3:.0f}k docs/s "
           f"({N_DOCS} docs, batches of {DOC_BATCH}, BSON encoding included; median of 3)")
    if not indexes:
        target("put_many", rate, "docs/s", 150_000)


def _random_gets(benchmark, get, seed):
    """Gets per second of ``get("c", id)`` over 20,000 random ids (median of 5 rounds)."""
    rnd = random.Random(seed)
    ids = [rnd.randrange(N_DOCS) for _ in range(20_000)]

    def run():
        for i in ids:
            get("c", i)
    benchmark.pedantic(run, rounds=5, iterations=1)
    return len(ids) / benchmark.stats.stats.median


def test_docs_get_by_id(benchmark, docs_filled):
    rate = _random_gets(benchmark, docs_filled.get, 3)
    benchmark.extra_info["gets_per_s"] = rate
    report(f"docs get by id (random ids, one get() each, decoded): {rate / 1e3:.0f}k/s")
    target("get by id", rate, "gets/s", 300_000)


def test_docs_get_raw_by_id(benchmark, docs_filled):
    rate = _random_gets(benchmark, docs_filled.get_raw, 5)
    report(f"docs get_raw by id (random ids, BSON bytes, not decoded): {rate / 1e3:.0f}k/s")


def test_docs_get_many(benchmark, docs_filled):
    rnd = random.Random(4)
    ids = [rnd.randrange(N_DOCS) for _ in range(20_000)]
    benchmark.pedantic(lambda: docs_filled.get_many("c", ids), rounds=5, iterations=1)
    rate = len(ids) / benchmark.stats.stats.median
    report(f"docs get_many (20k random ids, one read transaction): {rate / 1e3:.0f}k docs/s")


def test_docs_indexed_equality_100_rows(benchmark, docs_filled):
    q = Eq("group", 42)
    assert docs_filled.explain("c", q)["plan"] == "index"
    rows = benchmark(docs_filled.find, "c", q)
    assert len(rows) == 100
    ms = benchmark.stats.stats.median * 1e3
    report(f"docs indexed equality query returning 100 rows: {ms:.3f} ms")
    target("indexed equality, 100 rows", ms, "ms", 1, higher_is_better=False)


def test_docs_full_scan_predicate(benchmark, docs_filled):
    q = And([Eq("city", "Paris"), Gt("age", 85)])           # 1 in 5 x 4 in 90: ~0.9% of the documents
    assert docs_filled.explain("c", q)["plan"] == "scan"
    rows = benchmark.pedantic(docs_filled.find, args=("c", q), rounds=5, iterations=1)
    assert rows and all(d["city"] == "Paris" and d["age"] > 85 for _, d in rows)
    rate = N_DOCS / benchmark.stats.stats.median
    benchmark.extra_info["docs_per_s"] = rate
    report(f"docs full-scan predicate ({len(rows)} of {N_DOCS} match, "
           f"{'compiled' if core.COMPILED else 'pure-Python'} matcher): {rate / 1e6:.2f}M docs/s")
    target("full-scan predicate", rate, "docs/s", 500_000)


def teardown_module():
    print("\n=== engine benchmark summary ===")
    for line in _REPORT:
        print(line)
    if _TARGETS:
        print("=== document store targets ===")
        for line in _TARGETS:
            print(line)
