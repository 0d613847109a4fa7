"""``riverbed dump DATA_DIR [--stream NAME]``: the streams of a data directory and their chunks.

Opens the environment read-only, so it is safe while ``riverbed serve`` writes to it. For each stream
it prints the statistics, then one line per chunk: id, type, entries, records, timestamp, stored size,
leader epoch, the data CRC the header holds (8 hex digits) and whether it checks out (like osiris's dump
tools). Two members of a cluster hold the same chunks, so their dumps agree line for line up to the
committed offset. Exit status 1 when any chunk is corrupt.

Then (unless ``--stream`` picks one stream) the super streams, one line each with their partitions and
binding keys in order::

    superstream orders  partitions=orders-0,orders-1 binding_keys=0,1 args={}

and the document store: one line per collection, with its document count and key field, and one line
per index with its entry count::

    collection users  cid=1 documents=120 key_field=uid
      index email unique entries=120
      index age entries=118
"""

import argparse
import datetime
import sys

from riverbed.engine import core
from riverbed.engine.docstore import DocStore
from riverbed.engine.errors import ChunkError
from riverbed.engine.format import H_CRC, H_ENTRIES, H_EPOCH, H_RECORDS, H_TIMESTAMP, H_TYPE
from riverbed.engine.log import _CHUNK_KEY, Engine


def _ts(ms):
    if ms < 0:
        return "-"
    return datetime.datetime.fromtimestamp(ms / 1000, datetime.timezone.utc).isoformat(timespec="milliseconds")


def dump(path, stream=None, out=sys.stdout, chunks=True):
    """Write the dump of ``path`` to ``out``; returns the number of corrupt chunks found."""
    eng = Engine(path, readonly=True)
    bad = 0
    try:
        names = [stream] if stream else eng.list_streams()
        for name in names:
            try:
                info = eng.stream_info(name)
            except ChunkError:
                # the first chunk's header is bad: say what the stream state says, the chunk lines
                # below report the damage
                info = eng._current(name).info(-1)
            print(f"stream {name}  chunks={info.chunks} records={info.records} bytes={info.bytes} "
                  f"first_chunk_id={info.first_chunk_id} last_chunk_id={info.last_chunk_id} "
                  f"next_offset={info.next_offset} args={info.arguments}", file=out)
            if not chunks:
                continue
            print(f"  {'chunk_id':>12} {'type':>4} {'entries':>7} {'records':>7} {'timestamp':<29} "
                  f"{'size':>9} {'epoch':>5} {'crc':<8} check", file=out)
            sid = eng._current(name).sid
            with eng.read_txn() as txn:
                cur = txn.cursor(db=eng._db_chunks)
                ok = cur.set_range(_CHUNK_KEY.pack(sid, 0))
                while ok:
                    ksid, chunk_id = _CHUNK_KEY.unpack(cur.key())
                    if ksid != sid:
                        break
                    raw = cur.value()
                    try:
                        h = core.read_header(raw)
                        try:
                            core.check_chunk(raw)
                            status = "ok"
                        except ChunkError as e:
                            status, bad = f"BAD ({e.reason})", bad + 1
                        print(f"  {chunk_id:>12} {h[H_TYPE]:>4} {h[H_ENTRIES]:>7} {h[H_RECORDS]:>7} "
                              f"{_ts(h[H_TIMESTAMP]):<29} {len(raw):>9} {h[H_EPOCH]:>5} {h[H_CRC]:08x} {status}", file=out)
                    except ChunkError as e:
                        bad += 1
                        print(f"  {chunk_id:>12} BAD HEADER ({e.reason}) size={len(raw)}", file=out)
                    ok = cur.next()
        if not stream:
            dump_super_streams(eng, out)
            dump_collections(eng, out)
    finally:
        eng.close()
    return bad


def dump_super_streams(eng, out=sys.stdout):
    """Write the super stream definitions of the open engine ``eng`` to ``out``."""
    for name in eng.list_super_streams():
        d = eng.super_stream(name)
        if d is not None:
            print(f"superstream {name}  partitions={','.join(d['partitions'])} "
                  f"binding_keys={','.join(d['binding_keys'])} args={d['arguments']}", file=out)


def dump_collections(eng, out=sys.stdout):
    """Write the document store's collections and indexes of the open engine ``eng`` to ``out``."""
    ds = DocStore(eng)
    for name in ds.list_collections():
        with eng.read_txn() as txn:
            c = ds._coll_r(txn, name)
            if c is None:
                continue
            count = ds._count_in(txn, c)
            entries = [ds.index_entries(txn, c, ix) for ix in c.indexes]
        key = f" key_field={c.key_field}" if c.key_field is not None else ""
        print(f"collection {name}  cid={c.cid} documents={count}{key}", file=out)
        for ix, n in zip(c.indexes, entries):
            print(f"  index {ix.field}{' unique' if ix.unique else ''} entries={n}", file=out)


def main(argv=None):
    p = argparse.ArgumentParser(prog="riverbed dump", description=__doc__.splitlines()[0])
    p.add_argument("data_dir")
    p.add_argument("--stream", help="only this stream")
    p.add_argument("--summary", action="store_true", help="stream statistics only, no chunk lines")
    args = p.parse_args(argv)
    try:
        bad = dump(args.data_dir, args.stream, chunks=not args.summary)
    except KeyError as e:
        print(f"riverbed dump: {e}", file=sys.stderr)
        return 2
    except Exception as e:  # lmdb errors: missing directory, not an environment
        print(f"riverbed dump: cannot read {args.data_dir}: {e}", file=sys.stderr)
        return 2
    if bad:
        print(f"{bad} corrupt chunk(s)", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
