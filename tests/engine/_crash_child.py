"""Child-process side of the recovery and dump tests (run as a script with the parent's interpreter).

    python _crash_child.py crash DATA_DIR SEED       append self-checking records until killed
    python _crash_child.py grow DATA_DIR MIB         create stream "s" in a small map, wait, grow it
    python _crash_child.py hold DATA_DIR             hold the directory open read-write until stdin closes
    python _crash_child.py try-writer DATA_DIR       try to open a second read-write Engine
    python _crash_child.py split DATA_DIR            appends over chunk-max-bytes in one commit
    python _crash_child.py disk-full DATA_DIR        appends until the file size limit is hit

Every mode talks to the parent in lines on stdout (flushed at once) and reads commands from stdin.
Records are self-checking: ``seq u64 BE | padding | crc32(seq + padding) u32 BE``.
"""

import os
import random
import struct
import sys
import zlib

from riverbed.engine import Engine, RiverbedError

_SEQ = struct.Struct(">Q")
_CRC = struct.Struct(">I")


def make_record(seq, padding):
    body = _SEQ.pack(seq) + padding
    return body + _CRC.pack(zlib.crc32(body))


def check_record(rec):
    """The sequence number of a self-checking record; ValueError when the record is damaged."""
    rec = bytes(rec)
    if len(rec) < _SEQ.size + _CRC.size:
        raise ValueError(f"record of {len(rec)} bytes is too short")
    body, crc = rec[:-4], _CRC.unpack(rec[-4:])[0]
    if zlib.crc32(body) != crc:
        raise ValueError(f"record crc mismatch: {rec[:16].hex()}...")
    return _SEQ.unpack_from(body)[0]


def say(*words):
    sys.stdout.write(" ".join(str(w) for w in words) + "\n")
    sys.stdout.flush()


def fail(msg):
    sys.stderr.write(f"child error: {msg}\n")
    sys.stderr.flush()
    os._exit(3)


def crash(path, seed):
    """fsync=always appends by a named publisher (publishing id = sequence number = offset + 1); print
    the last sequence number of every acknowledged append. Runs until it is killed."""
    rnd = random.Random(seed)
    eng = Engine(path, fsync="always")
    if not eng.has_stream("s"):
        eng.create_stream("s").result()
    seq = eng.query_publisher_sequence("s", "p")
    next_offset = eng.stream_info("s").next_offset
    if next_offset != seq:
        fail(f"publisher sequence {seq} but next offset {next_offset}")
    say("start", seq)
    while True:
        n = rnd.randint(1, 200)
        ids = list(range(seq + 1, seq + n + 1))
        records = [make_record(i, rnd.randbytes(rnd.randint(0, 100))) for i in ids]
        res = eng.append("s", records, publishing_ids=ids, publisher="p").result()
        if res.duplicates or res.first_offset != ids[0] - 1 or res.last_offset != ids[-1] - 1:
            fail(f"append of ids {ids[0]}..{ids[-1]} gave {res}")
        seq = ids[-1]
        say(seq)


def grow(path, mib):
    """Create stream "s" with 10 records in a 1 MiB map, say "ready", wait for "go", append about
    ``mib`` MiB (record i = make_record(i, 1000 bytes)), say "done RECORDS MAP_SIZE", wait for EOF."""
    eng = Engine(path, map_size=1 << 20)
    eng.create_stream("s").result()
    seq = 0

    def batch(n, size):
        nonlocal seq
        ids = range(seq + 1, seq + n + 1)
        eng.append("s", [make_record(i, bytes([i % 251]) * size) for i in ids]).result()
        seq += n

    batch(10, 100)
    eng.sync().result()
    say("ready", eng.env.info()["map_size"])
    if sys.stdin.readline().strip() != "go":
        fail("expected go")
    total = mib << 20
    while total > 0:
        batch(200, 1000)
        total -= 200 * 1000
    eng.sync().result()
    say("done", seq, eng.env.info()["map_size"])
    sys.stdin.read()
    eng.close()


def hold(path):
    eng = Engine(path)
    say("ready")
    sys.stdin.read()
    eng.close()


def try_writer(path):
    try:
        eng = Engine(path)
    except RiverbedError as e:
        say("refused", type(e).__name__, e)
        return
    say("opened")
    eng.close()


def split(path):
    """Say "ok ..." when appends holding more than chunk-max-bytes of data in one commit are split into
    chunks holding every record exactly once; otherwise say what went wrong. Memory is capped at 1 GiB
    of address space and the appends get 10 s, so a runaway writer cannot take the machine down."""
    import resource
    limit = 1 << 30
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    try:
        eng = Engine(path, map_size=1 << 20)
        eng.create_stream("s", {"chunk-max-bytes": 10000}).result(30)
        expected = []
        # one append of ~100 kB (ten chunks' worth), then 30 appends of ~3 kB submitted together so
        # that several of them meet in one commit
        ids = range(1, 101)
        expected += [make_record(i, bytes([i]) * 1000) for i in ids]
        res = eng.append("s", expected).result(10)
        if (res.first_offset, res.last_offset) != (0, 99):
            fail(f"append of 100 records gave {res}")
        futs = []
        for k in range(30):
            batch = [make_record(len(expected) + i + 1, bytes([k]) * 1000) for i in range(3)]
            futs.append((len(expected), eng.append("s", batch)))
            expected += batch
        for first, fut in futs:
            res = fut.result(10)
            if (res.first_offset, res.last_offset) != (first, first + 2):
                say("bad-result", first, res)
                os._exit(0)
    except TimeoutError:
        say("timeout: the append did not complete within 10 s")
        os._exit(0)
    except BaseException as e:  # noqa: BLE001 - reported to the parent
        say("error", repr(e)[:500])
        os._exit(0)
    info = eng.stream_info("s")
    got = [rec for _, rec in eng.scan("s")]
    chunks = eng.read_chunks("s", 0, max_chunks=1 << 20)
    sizes = [len(raw) - 48 for _, raw in chunks]
    if info.records != len(expected) or got != expected:
        say("bad-records", info.records, len(got), len(expected))
    elif max(sizes) > 10000 or len(chunks) < 10:
        say("bad-chunks", sizes)
    else:
        say("ok", info.records, len(chunks))
    sys.stdout.flush()
    eng.close()


def disk_full(path):
    """Append ~200 kB at a time with the file size capped at 8 MiB (SIGXFSZ ignored, so writes fail
    with EFBIG). Say "ok ERROR" when an append fails with ERROR within 10 s and a later append also
    completes (either way) within 10 s; "hang ..." or "no-error" otherwise."""
    import concurrent.futures
    import resource
    import signal
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    limit = 8 << 20
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    eng = Engine(path, map_size=1 << 20)
    eng.create_stream("s").result(10)
    failure = None
    for k in range(200):                       # up to ~40 MB, far past the limit
        fut = eng.append("s", [bytes([k % 256]) * 1000] * 200)
        try:
            fut.result(10)
        except concurrent.futures.TimeoutError:
            say("hang: append", k, "never completed")
            os._exit(0)
        except Exception as e:  # noqa: BLE001 - the expected failure
            failure = e
            break
    if failure is None:
        say("no-error: 40 MB appended under an 8 MiB file size limit")
        os._exit(0)
    try:
        eng.append("s", [b"later"]).result(10)
    except concurrent.futures.TimeoutError:
        say("hang: the append after the failure never completed; failure was", repr(failure)[:300])
        os._exit(0)
    except Exception:  # noqa: BLE001 - failing is fine, hanging is not
        pass
    say("ok", type(failure).__name__)
    os._exit(0)


def main(argv):
    mode, path = argv[0], argv[1]
    if mode == "crash":
        crash(path, int(argv[2]))
    elif mode == "grow":
        grow(path, int(argv[2]))
    elif mode == "hold":
        hold(path)
    elif mode == "try-writer":
        try_writer(path)
    elif mode == "split":
        split(path)
    elif mode == "disk-full":
        disk_full(path)
    else:
        fail(f"unknown mode {mode!r}")


if __name__ == "__main__":
    main(sys.argv[1:])
