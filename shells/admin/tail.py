"""``riverbed tail NAME [--from first|last|next|OFFSET|TIME] [--follow] [--format json|raw]``.

Over the network, an rstream Consumer subscribes with the offset specification. Without ``--follow`` the
command stops at the stream's last offset as it was when it started (read from the HTTP JSON API); when
that API cannot be reached, or nothing at all arrives (``--from`` a time after the last record), it stops
after ``IDLE_STOP`` seconds without a delivery. With ``--data-dir`` the records are read from the data
directory through a read-only Engine.
"""

import asyncio
import re
import sys
import time
from datetime import datetime

from riverbed.shells.admin import render
from riverbed.shells.admin.client import (
    EXIT_CONNECT, EXIT_OK, EXIT_SERVER, EXIT_USAGE, AdminError, NoApiError, close_quietly, consumer, http_get,
    server_error, start, stream_path,
)

SPEC_FIRST = "first"
SPEC_LAST = "last"
SPEC_NEXT = "next"
SPEC_OFFSET = "offset"
SPEC_TIMESTAMP = "timestamp"
IDLE_STOP = 2.0           # seconds without a delivery after which a tail without --follow ends
INITIAL_CREDIT = 10       # chunks in flight; rstream grants one more per chunk delivered
READ_CHUNKS = 16          # chunks a --data-dir tail reads at a time
_RELATIVE_RE = re.compile(r"^-(\d+(?:\.\d+)?)(ms|s|m|h|d|w)$")
_RELATIVE_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000, "w": 604_800_000}


def parse_from(text, now_ms=None):
    """``(kind, value)`` for ``--from``: ``first``/``last``/``next`` (value None), a non-negative integer
    offset, a relative time ``-10m`` (ms, s, m, h, d, w before now) or an ISO-8601 time (a time without
    a UTC offset is local time); times become ms since the epoch. Raises AdminError (EXIT_USAGE)."""
    t = text.strip()
    if t in (SPEC_FIRST, SPEC_LAST, SPEC_NEXT):
        return t, None
    if t.isdigit():
        return SPEC_OFFSET, int(t)
    now_ms = int(time.time() * 1000) if now_ms is None else now_ms
    m = _RELATIVE_RE.match(t)
    if m:
        return SPEC_TIMESTAMP, now_ms - int(float(m.group(1)) * _RELATIVE_MS[m.group(2)])
    try:
        when = datetime.fromisoformat(t.replace("z", "Z"))
    except ValueError:
        raise AdminError(f"bad --from {text!r}: expected first, last, next, an offset, an ISO-8601 time "
                         f"or a relative time like -10m", EXIT_USAGE) from None
    return SPEC_TIMESTAMP, int(when.timestamp() * 1000)


def _rstream_spec(kind, value):
    from rstream import ConsumerOffsetSpecification, OffsetType
    types = {SPEC_FIRST: OffsetType.FIRST, SPEC_LAST: OffsetType.LAST, SPEC_NEXT: OffsetType.NEXT,
             SPEC_OFFSET: OffsetType.OFFSET, SPEC_TIMESTAMP: OffsetType.TIMESTAMP}
    return ConsumerOffsetSpecification(types[kind], value)


def _is_text(payload):
    """Whether ``payload`` (bytes) is safe to write to a terminal as it is: UTF-8 without control
    characters (tab excepted), so no escape sequence can reach the terminal."""
    try:
        text = payload.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return all(c == "\t" or (c >= " " and c != "\x7f" and not "\x80" <= c <= "\x9f") for c in text)


class _Printer:
    """Writes records to stdout in one format; flushes per record when following. With ``raw`` on a
    terminal, a payload that is not plain text (BSON, binary) is written as hex (one note on stderr
    says so): binary bytes would garble the terminal. A pipe or file gets the bytes."""

    def __init__(self, fmt, flush):
        self.fmt = fmt
        self.flush = flush
        self.count = 0
        self.tty = fmt == render.FMT_RAW and sys.stdout.isatty()
        self._noted = False

    def write(self, offset, raw, chunk_ms=None):
        if self.fmt == render.FMT_RAW:
            out = sys.stdout.buffer
            payload = render.record_raw(raw)
            if self.tty and not _is_text(payload):
                if not self._noted:
                    self._noted = True
                    print(f"riverbed tail: record {offset} is binary: shown as hex on a terminal (pipe the "
                          f"output for the bytes, or use --format json)", file=sys.stderr)
                payload = payload.hex().encode("ascii")
            out.write(payload)
            out.write(b"\n")
            if self.flush:
                out.flush()
        else:
            sys.stdout.write(render.to_json(render.record_json(offset, raw, chunk_ms)) + "\n")
            if self.flush:
                sys.stdout.flush()
        self.count += 1


async def _end_offset(target, name, timeout):
    """The stream's last offset now (-1 when empty), or None when the HTTP API cannot be reached."""
    try:
        info = await http_get(target, stream_path(name), timeout=timeout, stream=name)
    except AdminError as e:
        if e.code != EXIT_CONNECT and not isinstance(e, NoApiError):
            raise
        print(f"riverbed tail: {e}; stopping after {IDLE_STOP:g} s without records", file=sys.stderr)
        return None
    last = info.get("last_offset") if isinstance(info, dict) else None
    return last if isinstance(last, int) else None


async def tail_remote(target, name, spec, follow, fmt, timeout):
    """Print the stream's records from ``spec`` (``parse_from``'s pair). Returns the exit status.

    Records are printed inside rstream's delivery callback: rstream grants the next chunk only as it
    starts on one, so a slow stdout holds the server back instead of filling memory."""
    kind, value = spec
    printer = _Printer(fmt, flush=follow)
    loop = asyncio.get_running_loop()
    ended = loop.create_future()           # set to an exit status, or to an AdminError
    last_delivery = [loop.time()]
    end = None

    def finish(outcome):
        if not ended.done():
            ended.set_result(outcome)

    def on_close(info):
        # the connection dropped or the stream changed (deleted): end the tail instead of reconnecting
        reason = getattr(info, "reason", None)
        if reason == "Metadata Update":
            finish(AdminError(f"stream {name!r} was deleted", EXIT_SERVER))
        else:
            finish(AdminError(f"lost the connection to the server ({reason or 'closed'})", EXIT_CONNECT))

    def on_message(msg, ctx):
        if ended.done():
            return
        last_delivery[0] = loop.time()
        offset = ctx.offset
        if end is not None and offset > end:
            finish(EXIT_OK)
            return
        try:
            printer.write(offset, msg, ctx.timestamp)
        except BrokenPipeError as e:
            finish(e)
            return
        if end is not None and offset >= end:
            finish(EXIT_OK)

    c = consumer(target, on_close_handler=on_close)
    try:
        async def subscribe():
            nonlocal end
            await start(c, timeout)
            if not await c.stream_exists(name):
                raise AdminError(f"stream {name!r} does not exist")
            if not follow:
                end = await _end_offset(target, name, timeout)
                if kind == SPEC_NEXT or end is not None and (end < 0 or kind == SPEC_OFFSET and value > end):
                    return False
            await c.subscribe(name, on_message, decoder=bytes, offset_specification=_rstream_spec(kind, value),
                              initial_credit=INITIAL_CREDIT)
            return True

        try:
            if not await asyncio.wait_for(subscribe(), timeout):
                return EXIT_OK
        except asyncio.TimeoutError:
            raise AdminError(f"no answer from the server within {timeout:g} s", EXIT_CONNECT) from None
        except Exception as e:
            raise server_error(e, name) or e
        # the idle clock starts once subscribed: connecting, asking the HTTP API for the end and (on a
        # cluster) opening a second connection to a replica can take longer than IDLE_STOP on a busy
        # machine, and a tail that counted that time stopped before its first delivery, printing nothing
        last_delivery[0] = loop.time()
        while not ended.done():
            if follow:
                await asyncio.wait([ended])
                break
            idle = loop.time() - last_delivery[0]
            if idle >= IDLE_STOP:
                return EXIT_OK
            await asyncio.wait([ended], timeout=IDLE_STOP - idle)
        outcome = ended.result()
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome
    finally:
        await close_quietly(c)


def tail_local(path, name, spec, follow, fmt):
    """The same from a data directory (read-only), up to its end when the command started."""
    from riverbed.engine import OffsetSpec, StreamNotFound
    from riverbed.shells.admin.streams import open_data_dir
    from riverbed.shells.broker.records import read_records
    if follow:
        raise AdminError("--follow needs a running server, not --data-dir", EXIT_USAGE)
    kind, value = spec
    engine = open_data_dir(path)
    printer = _Printer(fmt, flush=False)
    try:
        try:
            offset_spec = OffsetSpec(kind, value)
            start = engine.resolve(name, offset_spec)
            end = engine.stream_info(name).next_offset
        except StreamNotFound:
            raise AdminError(f"stream {name!r} does not exist") from None
        offset = start
        while offset < end:
            batches, nxt = read_records(engine, name, offset, READ_CHUNKS, end)
            for batch in batches:
                for at, raw in batch:
                    if at >= end:
                        break
                    printer.write(at, raw, batch.chunk_timestamp)
            if nxt == offset:
                break
            offset = nxt
    finally:
        engine.close()
    return EXIT_OK
