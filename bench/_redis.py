"""Redis 7 Streams as a peer of ``bench.compare``: the server (``ci/redis.sh``) and its client workloads.

Server: Debian's redis-server, started by the bench on 127.0.0.1 and a free port in a temporary directory
with ``appendonly yes`` and ``appendfsync everysec`` (an acknowledged XADD is in the page cache and on disk
within about a second), RDB snapshots and automatic AOF rewrites off (no background fork in a timed run).

Before each run, untimed, the AOF is rewritten (BGREWRITEAOF, waited for) so that it does not keep
every earlier run's entries.

Client: redis-py with hiredis (the synchronous client: one connection, no event loop in the way). A
stream entry is one field ``d`` holding the body. The workloads (run by ``bench._client``; setup untimed):

- ``redis-publish``: XADD pipelined, ``--batch`` (5,000) commands per pipeline round trip (no MULTI).
- ``redis-consume``: the stream filled first (pipelined XADD), then XREAD from ``0`` with COUNT ``--batch``
  until every entry has been read.
- ``redis-latency``: one XADD at a time, each from the call to its reply: ``--warmup`` untimed, then
  ``--timed`` timed.
"""

from bench._procs import ScriptServer

FIELD = b"d"


class Redis(ScriptServer):
    name = "redis"
    label = "Redis"
    script = "redis.sh"
    package = "redis-server"
    port_env = "REDIS_PORT"
    dir_env = "REDIS_DIR"


# --------------------------------------------------------------------------------------------------
# client side (inside a bench._client process)

def _connect(a):
    import redis
    r = redis.Redis(host=a.host, port=a.port, socket_timeout=300)
    r.ping()
    return r


def _xadd_pipelined(r, key, n, body, batch):
    left = n
    entry = {FIELD: body}
    while left:
        k = min(batch, left)
        pipe = r.pipeline(transaction=False)
        for _ in range(k):
            pipe.xadd(key, entry)
        pipe.execute()
        left -= k


async def run(runner):
    """Run ``runner.a.workload`` (one of redis-publish, redis-consume, redis-latency) against the
    Redis at ``--host``/``--port``; the stream key is ``--stream``, deleted at the end."""
    a = runner.a
    r = _connect(a)
    key = a.stream
    r.delete(key)
    _compact_aof(r)
    try:
        if a.workload == "redis-publish":
            runner.wait_go()
            runner.start()
            _xadd_pipelined(r, key, a.n, runner.body, a.batch)
            runner.stop()
            _check_len(r, key, a.n)
        elif a.workload == "redis-consume":
            _xadd_pipelined(r, key, a.n, runner.body, a.batch)
            runner.wait_go()
            runner.start()
            got = nbytes = 0
            last = b"0"
            while got < a.n:
                reply = r.xread({key: last}, count=a.batch)
                if not reply:
                    raise RuntimeError(f"XREAD returned nothing after {got} of {a.n} entries")
                entries = reply[0][1]
                for _id, fields in entries:
                    nbytes += len(fields[FIELD])
                got += len(entries)
                last = entries[-1][0]
            runner.stop()
            runner.result["received"] = got
            runner.result["received_bytes"] = nbytes
        elif a.workload == "redis-latency":
            import time
            entry = {FIELD: runner.body}
            runner.wait_go()
            for _ in range(a.warmup):
                r.xadd(key, entry)
            runner.start()
            clock = time.perf_counter_ns
            lat = []
            for _ in range(a.timed):
                t = clock()
                r.xadd(key, entry)
                lat.append(clock() - t)
            runner.stop()
            runner.latency(lat)
            _check_len(r, key, a.warmup + a.timed)
        else:
            raise ValueError(f"not a Redis workload: {a.workload}")
    finally:
        if not a.keep_stream:
            r.delete(key)
        r.close()


def _compact_aof(r, timeout=120):
    """Rewrite the append-only file now, untimed, and wait for it: automatic rewrites are off (no fork in a
    timed run), and without this the AOF would keep every earlier run's entries (gigabytes in a full
    run). The data set is the streams of runs going on now (normally none), so it is quick."""
    import time

    import redis
    try:
        r.bgrewriteaof()
    except redis.ResponseError as e:   # the other client of a two-client run asked first: wait for that one
        if "already in progress" not in str(e):
            raise
    deadline = time.monotonic() + timeout
    while True:
        info = r.info("persistence")
        if not info.get("aof_rewrite_in_progress") and not info.get("aof_rewrite_scheduled"):
            return
        if time.monotonic() > deadline:
            raise RuntimeError("Redis AOF rewrite did not finish")
        time.sleep(0.05)


def _check_len(r, key, n):
    have = r.xlen(key)
    if have != n:
        raise RuntimeError(f"stream {key} has {have} entries, expected {n}")
