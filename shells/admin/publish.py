"""``riverbed publish NAME [--content-type TYPE] < lines``: one record per input line, each confirmed.

Each line (its ``\\n`` or ``\\r\\n`` removed) becomes an AMQP 1.0 bare message with that content type and
one data section (:func:`riverbed.engine.record.encode_record`, what every other shell stores), sent
by an rstream Producer as they arrive (in batches of up to ``BATCH_LINES`` when the input is fast, at
once when it is a slow pipe); the command waits for every confirm before it reports the count. With
``application/json`` each line must be one JSON value. A regular file on stdin is checked whole before
anything is sent, so a bad line publishes nothing; a pipe is published as it arrives, so the first bad
line stops the command there and the error says how far it got (the lines before it stay published
and are counted). A tqdm progress bar on stderr shows the lines sent
when stdin is not a terminal and stderr is (or with ``--progress``).
"""

import asyncio
import json
import os
import stat
import sys
import threading

from riverbed.shells.admin.client import (
    EXIT_OK, EXIT_SERVER, EXIT_USAGE, AdminError, close_quietly, producer, server_error, start,
)

CONTENT_TYPES = ("application/octet-stream", "application/json", "text/plain", "application/bson")
DEFAULT_CONTENT_TYPE = "application/octet-stream"
BATCH_LINES = 500            # lines per send_batch: one Publish frame each, well under the frame max
CONFIRM_TIMEOUT = 60.0       # seconds to wait for the last confirms
BLOCK_BYTES = 64 << 10       # stdin is read in blocks of up to this many bytes
MAX_IN_FLIGHT = 20_000       # records sent but not yet confirmed
READ_AHEAD = 64              # blocks read but not yet sent (4 MiB): a fast input waits for the network


def encode_line(line, content_type, lineno):
    """The stored record for one input line (bytes without its line end). Raises AdminError
    (EXIT_USAGE) for a line that is not JSON under ``application/json``."""
    from riverbed.engine.record import encode_record
    if content_type.split(";", 1)[0].strip().lower() == "application/json":
        try:
            json.loads(line)
        except ValueError as e:
            raise AdminError(f"line {lineno} is not JSON: {e}", EXIT_USAGE) from None
    return encode_record(line, content_type)


class _Progress:
    """A tqdm bar on stderr: bytes of a regular file (its size is known), else records."""

    def __init__(self, stream):
        from tqdm import tqdm
        total = None
        try:
            st = os.fstat(stream.fileno())
            if stat.S_ISREG(st.st_mode):
                total = st.st_size - stream.tell()
        except (OSError, ValueError):
            pass
        self.by_bytes = total is not None
        self.bar = tqdm(total=total, unit="B" if self.by_bytes else " rec", unit_scale=True, file=sys.stderr,
                        desc="publish", mininterval=0.2)

    def update(self, records, nbytes):
        self.bar.update(nbytes if self.by_bytes else records)

    def close(self):
        self.bar.close()


def _progress(stream, want):
    """A :class:`_Progress` when ``want`` (True, False or None: stdin piped and stderr a terminal)."""
    if want is None:
        want = not stream.isatty() and sys.stderr.isatty()
    return _Progress(stream) if want else None


class _Reader:
    """Reads ``source`` on a daemon thread in blocks of what is available (``read1``), so a slow pipe's
    lines go out as they come while a fast one is sent in full batches; at most ``READ_AHEAD`` blocks
    wait in memory. ``await next_blocks()`` returns the blocks read so far (waiting for one), ``None``
    at end of input. One consumer coroutine only."""

    def __init__(self, source, loop):
        self.source = source
        self.loop = loop
        self.queue = asyncio.Queue()
        self.room = threading.Semaphore(READ_AHEAD)
        threading.Thread(target=self._run, name="riverbed-publish-stdin", daemon=True).start()

    def _run(self):
        read = getattr(self.source, "read1", self.source.read)
        while True:
            self.room.acquire()
            try:
                block = read(BLOCK_BYTES)
            except (OSError, ValueError) as e:
                block = e
            self.loop.call_soon_threadsafe(self.queue.put_nowait, block or None)
            if not block or isinstance(block, Exception):
                return

    async def next_blocks(self):
        blocks = [await self.queue.get()]
        while not self.queue.empty() and blocks[-1] is not None:
            blocks.append(self.queue.get_nowait())
        for _ in blocks:
            self.room.release()
        for b in blocks:
            if isinstance(b, Exception):
                raise AdminError(f"cannot read the input: {b}", EXIT_USAGE)
        return blocks


async def publish(target, name, source, content_type, progress=None, timeout=30.0):
    """Publish every line of the binary file ``source``; returns ``(confirmed, error)`` where ``error`` is
    an AdminError that stopped it early (a line that is not JSON, records the server refused) or None.
    Raises AdminError when the stream or server refuses the publisher, or confirms do not come."""
    confirmed = 0
    failed = []
    sent = 0
    sent_final = False
    all_done = asyncio.Event()
    room = asyncio.Event()
    bar = _progress(source, progress)
    stop_error = None

    def on_confirm(status):
        nonlocal confirmed
        if status.is_confirmed:
            confirmed += 1
        else:
            failed.append(status.response_code)
        if sent_final and confirmed + len(failed) >= sent:
            all_done.set()
        if sent - confirmed - len(failed) <= MAX_IN_FLIGHT // 2:
            room.set()

    async def send(batch):
        nonlocal sent
        for i in range(0, len(batch), BATCH_LINES):
            part = batch[i:i + BATCH_LINES]
            while sent - confirmed - len(failed) > MAX_IN_FLIGHT:
                # rstream keeps every unconfirmed id; a window keeps that (and the server's queue) small
                room.clear()
                await asyncio.wait_for(room.wait(), CONFIRM_TIMEOUT)
            sent += len(part)
            await p.send_batch(name, part, on_publish_confirm=on_confirm)

    p = producer(target)
    try:
        await start(p, timeout)
        try:
            reader = _Reader(source, asyncio.get_running_loop())
            lineno = 0
            rest = b""
            eof = False
            while not eof and stop_error is None:
                blocks = await reader.next_blocks()
                eof = blocks[-1] is None
                data = rest + b"".join(b for b in blocks if b is not None)
                lines = data.split(b"\n")
                rest = lines.pop()           # the unfinished line (empty after a final newline)
                if eof and rest:
                    lines.append(rest)       # a last line without a newline still counts
                batch = []
                for line in lines:
                    lineno += 1
                    try:
                        batch.append(encode_line(line[:-1] if line.endswith(b"\r") else line, content_type,
                                                 lineno))
                    except AdminError as e:
                        done = f"lines 1-{lineno - 1} are" if lineno > 2 else (
                            "line 1 is" if lineno == 2 else "nothing is")
                        stop_error = AdminError(f"{e}; stopped there: {done} published, nothing from line "
                                                f"{lineno} on", e.code)
                        break
                if batch:
                    await send(batch)
                if bar is not None:
                    bar.update(len(batch), len(data) - len(rest))
            sent_final = True
            if confirmed + len(failed) >= sent:
                all_done.set()
            await asyncio.wait_for(all_done.wait(), CONFIRM_TIMEOUT)
        except asyncio.TimeoutError:
            raise AdminError(f"{sent - confirmed - len(failed)} of {sent} records unconfirmed after "
                             f"{CONFIRM_TIMEOUT:g} s", EXIT_SERVER) from None
        except Exception as e:
            raise server_error(e, name) or e
    finally:
        await close_quietly(p)
        if bar is not None:
            bar.close()
    if failed and stop_error is None:
        stop_error = AdminError(f"{len(failed)} records were refused by the server (codes "
                                f"{sorted(set(failed))})", EXIT_SERVER)
    return confirmed, stop_error


def check_file(source, content_type):
    """When ``source`` is a regular file, check every line of it (from where it stands) as
    :func:`encode_line` would, then go back: a bad line then publishes nothing. Pipes and terminals are
    left alone (they are published as they arrive). Raises AdminError (EXIT_USAGE) naming the line."""
    if content_type.split(";", 1)[0].strip().lower() != "application/json":
        return      # only JSON lines can be refused
    try:
        if not stat.S_ISREG(os.fstat(source.fileno()).st_mode):
            return
        start_at = source.tell()
    except (OSError, ValueError, AttributeError):
        return
    for lineno, line in enumerate(source, 1):
        line = line.rstrip(b"\n")
        try:
            json.loads(line[:-1] if line.endswith(b"\r") else line)
        except ValueError as e:
            raise AdminError(f"line {lineno} is not JSON: {e}; nothing was published (the input is checked "
                             f"before anything is sent)", EXIT_USAGE) from None
    source.seek(start_at)


def run(target, args, as_json, runner, timeout):
    """The ``publish`` command; ``runner`` runs a coroutine to completion. Returns the exit status."""
    from riverbed.shells.admin import render
    if args.content_type is not None and (not args.content_type.isascii() or not args.content_type.strip()):
        raise AdminError(f"bad --content-type {args.content_type!r}", EXIT_USAGE)
    content_type = args.content_type or DEFAULT_CONTENT_TYPE
    check_file(sys.stdin.buffer, content_type)
    confirmed, error = runner(publish(target, args.stream, sys.stdin.buffer, content_type, args.progress, timeout))
    if as_json:
        print(render.to_json({"stream": args.stream, "published": confirmed,
                              **({"error": str(error)} if error else {})}))
    else:
        print(f"published {confirmed} record{'' if confirmed == 1 else 's'} to {args.stream}")
    if error is not None:
        raise error
    return EXIT_OK
