"""``riverbed dump DATA_DIR [--stream NAME]`` run as a real child process (``python -m
riverbed.engine.dump``) against real data directories, also while this process holds one open
read-write."""

import datetime
import mmap
import os
import re
import subprocess
import sys

import pytest

from riverbed.engine import Engine
from riverbed.engine.format import LEN_CHUNK_HEADER

T0 = 1_700_000_000_123          # ms; every chunk written through clock() below gets this timestamp
T0_TEXT = datetime.datetime.fromtimestamp(T0 / 1000, datetime.timezone.utc).isoformat(timespec="milliseconds")

CHUNK_LINE = re.compile(
    r"^\s+(?P<id>\d+)\s+(?P<type>\d+)\s+(?P<entries>\d+)\s+(?P<records>\d+)\s+(?P<ts>\S+)\s+(?P<size>\d+)\s+"
    r"(?P<epoch>\d+)\s+(?P<crc>[0-9a-f]{8})\s+(?P<status>.+)$")
BAD_HEADER_LINE = re.compile(r"^\s+(?P<id>\d+) BAD HEADER \((?P<reason>.*)\) size=(?P<size>\d+)$")


def clock():
    return T0


def run_dump(*args):
    """Run the dump in a child process with this interpreter and environment; CompletedProcess."""
    return subprocess.run([sys.executable, "-m", "riverbed.engine.dump", *map(str, args)],
                          capture_output=True, text=True, timeout=120, env=dict(os.environ))


def parse(stdout):
    """``{stream: (header line, [chunk lines])}`` of a dump's output."""
    out = {}
    current = None
    for line in stdout.splitlines():
        if line.startswith("stream "):
            current = line.split()[1]
            assert current not in out, f"stream {current} printed twice"
            out[current] = (line, [])
        elif line.strip().startswith("chunk_id"):
            continue
        elif line.strip():
            assert current is not None, f"chunk line before any stream: {line!r}"
            out[current][1].append(line)
    return out


def chunk_fields(line):
    m = CHUNK_LINE.match(line)
    assert m, f"not a chunk line: {line!r}"
    return m


def make_dir(path):
    """alpha: 3 chunks (2, 3 and 1 records), beta: 2 chunks, empty: none. Returns
    ``{stream: [(chunk_id, records, stored size, raw chunk)]}``."""
    layout = {"alpha": [2, 3, 1], "beta": [4, 2], "empty": []}
    chunks = {}
    with Engine(path, clock=clock, map_size=16 << 20) as eng:     # small data.mdb to search in flip()
        for name, sizes in layout.items():
            eng.create_stream(name, {"max-age": "7D"} if name == "beta" else None).result()
            for c, n in enumerate(sizes):
                eng.append(name, [f"{name}-chunk-{c}-record-{r}-".encode() * 3 for r in range(n)]).result()
            chunks[name] = [(cid, sizes[k], len(raw), raw)
                            for k, (cid, raw) in enumerate(eng.read_chunks(name, 0, max_chunks=100))]
            assert len(chunks[name]) == len(sizes)
    return chunks


def flip(data_mdb, raw, delta):
    """XOR 0xFF into byte ``delta`` of every copy of the chunk ``raw`` in data.mdb, in place (mmap:
    with a write map the file is as large as the map)."""
    found = 0
    with open(data_mdb, "r+b") as f, mmap.mmap(f.fileno(), 0) as m:
        pos = m.find(raw)
        while pos >= 0:
            m[pos + delta] ^= 0xFF
            found += 1
            pos = m.find(raw, pos + 1)
        m.flush()
    assert found, "chunk not found in data.mdb"


def check_stream(parsed, name, chunks):
    header, lines = parsed[name]
    records = sum(n for _, n, _, _ in chunks)
    assert f"chunks={len(chunks)} " in header and f"records={records} " in header, header
    if chunks:
        assert f"first_chunk_id={chunks[0][0]} last_chunk_id={chunks[-1][0]} " in header, header
    assert f"next_offset={records} " in header, header
    assert len(lines) == len(chunks), lines
    for line, (cid, n, size, _) in zip(lines, chunks):
        m = chunk_fields(line)
        assert (int(m["id"]), int(m["type"]), int(m["entries"]), int(m["records"])) == (cid, 0, n, n), line
        assert m["ts"] == T0_TEXT, line
        assert int(m["size"]) == size, line
        assert m["status"] == "ok", line


@pytest.fixture
def data_dir(tmp_path):
    path = tmp_path / "data"
    return path, make_dir(path)


def test_dump_prints_each_stream_and_one_line_per_chunk(data_dir):
    path, chunks = data_dir
    r = run_dump(path)
    assert r.returncode == 0, r.stderr
    parsed = parse(r.stdout)
    assert list(parsed) == ["alpha", "beta", "empty"]
    for name, cs in chunks.items():
        check_stream(parsed, name, cs)
    assert "args={'max-age': '7D'}" in parsed["beta"][0]
    assert r.stderr == ""


def test_dump_summary_prints_no_chunk_lines(data_dir):
    path, chunks = data_dir
    r = run_dump(path, "--summary")
    assert r.returncode == 0, r.stderr
    assert [line.split()[1] for line in r.stdout.splitlines()] == ["alpha", "beta", "empty"]


def test_dump_with_stream_option_prints_only_that_stream(data_dir):
    path, chunks = data_dir
    r = run_dump(path, "--stream", "beta")
    assert r.returncode == 0, r.stderr
    parsed = parse(r.stdout)
    assert list(parsed) == ["beta"]
    check_stream(parsed, "beta", chunks["beta"])


def test_dump_of_missing_stream_exits_2_with_clear_message(data_dir):
    path, _ = data_dir
    r = run_dump(path, "--stream", "nope")
    assert r.returncode == 2
    assert r.stdout == ""
    assert "riverbed dump:" in r.stderr and "'nope'" in r.stderr and "does not exist" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr


def test_dump_of_missing_directory_exits_2_with_clear_message(tmp_path):
    r = run_dump(tmp_path / "nowhere")
    assert r.returncode == 2
    assert "riverbed dump: cannot read" in r.stderr and "nowhere" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr
    assert not (tmp_path / "nowhere").exists(), "the read-only dump created the directory"


def test_dump_marks_chunk_with_bad_crc_and_exits_1(data_dir):
    path, chunks = data_dir
    cid, _, _, raw = chunks["alpha"][1]
    flip(path / "data.mdb", raw, LEN_CHUNK_HEADER + 7)
    r = run_dump(path)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "1 corrupt chunk(s)" in r.stderr
    parsed = parse(r.stdout)
    assert list(parsed) == ["alpha", "beta", "empty"]
    lines = parsed["alpha"][1]
    assert len(lines) == 3
    for line, (other, *_rest) in zip(lines, chunks["alpha"]):
        m = chunk_fields(line)
        assert int(m["id"]) == other
        if other == cid:
            assert m["status"].startswith("BAD") and "CRC" in m["status"], line
        else:
            assert m["status"] == "ok", line
    check_stream(parsed, "beta", chunks["beta"])


def test_dump_marks_chunk_with_bad_header_and_exits_1(data_dir):
    path, chunks = data_dir
    cid, _, size, raw = chunks["alpha"][2]
    flip(path / "data.mdb", raw, 0)
    r = run_dump(path, "--stream", "alpha")
    assert r.returncode == 1, r.stdout + r.stderr
    lines = parse(r.stdout)["alpha"][1]
    assert [chunk_fields(line)["status"] for line in lines[:2]] == ["ok", "ok"]
    m = BAD_HEADER_LINE.match(lines[2])
    assert m and int(m["id"]) == cid and int(m["size"]) == size and "magic" in m["reason"], lines[2]


def test_dump_marks_corrupt_first_chunk_header_bad_and_exits_1(data_dir):
    """The first chunk is the one stream_info reads (for the first timestamp); a bad header there must
    still give the per-chunk report, not abort the dump as an unreadable directory."""
    path, chunks = data_dir
    cid, _, size, raw = chunks["beta"][0]
    flip(path / "data.mdb", raw, 0)
    r = run_dump(path)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "cannot read" not in r.stderr, r.stderr
    parsed = parse(r.stdout)
    assert list(parsed) == ["alpha", "beta", "empty"]
    lines = parsed["beta"][1]
    assert len(lines) == 2, lines
    assert "BAD" in lines[0] and lines[0].split()[0] == str(cid), lines[0]
    assert chunk_fields(lines[1])["status"] == "ok"
    check_stream(parsed, "alpha", chunks["alpha"])


def test_dump_works_while_another_process_holds_the_directory_read_write(tmp_path):
    path = tmp_path / "data"
    with Engine(path, clock=clock) as eng:
        eng.create_stream("live").result()
        eng.append("live", [b"one", b"two"]).result()
        r = run_dump(path)
        assert r.returncode == 0, r.stderr
        lines = parse(r.stdout)["live"][1]
        assert [(int(chunk_fields(x)["id"]), chunk_fields(x)["status"]) for x in lines] == [(0, "ok")]

        # the dump sees what the writer commits next, and the writer is unaffected by the dump
        eng.append("live", [b"three"]).result()
        eng.create_stream("later").result()
        r = run_dump(path)
        assert r.returncode == 0, r.stderr
        parsed = parse(r.stdout)
        assert list(parsed) == ["later", "live"]
        assert [int(chunk_fields(x)["id"]) for x in parsed["live"][1]] == [0, 2]
        assert "records=3 " in parsed["live"][0]
        res = eng.append("live", [b"four"]).result()
        assert res.first_offset == 3
        assert [rec for _, rec in eng.scan("live")] == [b"one", b"two", b"three", b"four"]


def test_dump_shows_collections_with_their_indexes_and_counts(data_dir):
    """The document store's section: after the streams, one line per collection and one per index; not
    with --stream; the stream lines and --summary stay as they were."""
    from riverbed.engine import DocStore
    path, chunks = data_dir
    with Engine(path, clock=clock) as eng:
        ds = DocStore(eng)
        ds.create_collection("users", [("email", True), "age"], key_field="uid").result()
        ds.put_many("users", [(None, {"uid": i, "email": f"{i}@x", **({"age": i} if i % 4 else {})})
                              for i in range(12)]).result()
        ds.put("binder", "k", {"v": 1}).result()
    r = run_dump(path)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    first = next(i for i, line in enumerate(lines) if line.startswith("collection "))
    assert lines[first:] == [
        "collection binder  cid=2 documents=1",
        "collection users  cid=1 documents=12 key_field=uid",
        "  index email unique entries=12",
        "  index age entries=9",
    ]
    parsed = parse("\n".join(lines[:first]))
    assert list(parsed) == ["alpha", "beta", "empty"]
    for name, cs in chunks.items():
        check_stream(parsed, name, cs)
    r = run_dump(path, "--summary")
    assert [line.split()[:2] for line in r.stdout.splitlines()] == [
        ["stream", "alpha"], ["stream", "beta"], ["stream", "empty"], ["collection", "binder"],
        ["collection", "users"], ["index", "email"], ["index", "age"]]
    r = run_dump(path, "--stream", "beta")
    assert r.returncode == 0 and "collection" not in r.stdout


def test_dump_shows_super_streams_committed_with_their_partitions(tmp_path):
    path = str(tmp_path / "data")
    with Engine(path) as eng:
        eng.create_super_stream("orders", ["orders-eu", "orders-us"], ["eu", "us"], {"max-age": "7D"}).result()
    r = run_dump(path)
    assert r.returncode == 0, r.stderr
    assert "superstream orders  partitions=orders-eu,orders-us binding_keys=eu,us args={'max-age': '7D'}" \
        in r.stdout.splitlines()
    assert "stream orders-eu " in r.stdout and "stream orders-us " in r.stdout
