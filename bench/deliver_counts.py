"""What the server does per message delivered from the start of a stream (issue 26's consume rows), counted
by callgrind, so the figure does not move with the machine's load.

``riverbed serve --fsync never`` (only the RabbitMQ Stream listener) runs under ``valgrind --tool=callgrind
--instr-atstart=no``; the load generator (``bench._loadgen``) fills a stream with ``--n`` messages in Publish
frames of ``--batch`` (16 in flight, as the bench's fills), then reads it from the first offset with its
chunk-counting reader (credit 16, bodies dropped in the kernel) while collection is on. With
``--chunk-max-records R`` the stream is created with that argument, so every chunk holds at most R records
(``1000``: the shape before the closing-chunk rule); without it the default shape.

    .venv/bin/python -m bench.deliver_counts --n 200000
    .venv/bin/python -m bench.deliver_counts --n 200000 --chunk-max-records 1000
"""

import argparse
import os
import subprocess
import tempfile
import time
import types

from bench import _loadgen
from bench.onemsg_profile import Server, callgrind_total


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=200_000, help="messages in the stream (default 200,000)")
    ap.add_argument("--size", type=int, default=100, help="message body, bytes (default 100)")
    ap.add_argument("--batch", type=int, default=5000, help="messages per Publish frame of the fill (default 5,000)")
    ap.add_argument("--chunk-max-records", type=int, help="the stream argument (default: none)")
    ap.add_argument("--out", help="the callgrind profile (default: a temporary file)")
    a = ap.parse_args(argv)
    out = a.out or os.path.join(tempfile.gettempdir(), f"consume-counts-{os.getpid()}")
    srv = Server("riverbed", ["valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={out}"],
                 600)
    try:
        args = types.SimpleNamespace(host="127.0.0.1", port=srv.port, stream="counts", stream_arg=(
            [f"chunk-max-records={a.chunk_max_records}"] if a.chunk_max_records else []))
        conn = _loadgen._setup(args)
        _loadgen.publish(conn, a.n, a.batch, b"x" * a.size, 16)
        conn.close()
        conn = _loadgen.Conn("127.0.0.1", srv.port)
        subprocess.run(["callgrind_control", "-i", "on", str(srv.pid)], check=True, capture_output=True)
        t0 = time.perf_counter()
        records, chunks, shape = _loadgen.consume(conn, "counts", a.n, 16)
        wall = time.perf_counter() - t0
        subprocess.run(["callgrind_control", "-d", str(srv.pid)], check=True, capture_output=True)
        time.sleep(wall)    # an idle window as long: what the server does by the clock
        subprocess.run(["callgrind_control", "-d", str(srv.pid)], check=True, capture_output=True)
        subprocess.run(["callgrind_control", "-i", "off", str(srv.pid)], check=True, capture_output=True)
        conn.close()
    finally:
        srv.stop()
    timed, idle = callgrind_total(out + ".1"), callgrind_total(out + ".2")
    s = shape.as_dict()
    print(f"riverbed consume from first under callgrind: {records:,} messages of {a.size} B in {chunks:,} chunks "
          f"({s['records_per_chunk']:,.0f} records, {s['bytes_per_chunk']:,.0f} bytes per chunk on average, "
          f"the last {s['last_chunk_records']:,}), chunk-max-records {a.chunk_max_records or 'default'}; "
          f"load {os.getloadavg()[0]:.2f}")
    print(f"  {timed:,} instructions, {timed / records:,.1f} per message, {timed / chunks:,.0f} per chunk; "
          f"an idle window as long: {idle:,} (profiles: {out}.1, {out}.2)")


if __name__ == "__main__":
    main()
