"""``riverbed streams ls | create | rm | stats`` and ``riverbed consumers``.

Create and delete go over RabbitMQ Stream through rstream (Create, CreateSuperStream, Delete,
DeleteSuperStream). Listing and the numbers come from the server's HTTP JSON API, since the RabbitMQ
Stream protocol has no list command and rstream 1.1.1 has no StreamStats call; with ``--data-dir``,
``ls`` and ``stats`` read the data directory through a read-only :class:`riverbed.engine.Engine`
instead (it takes no writer lock, so it works beside a running server).
"""

import re

from riverbed.shells.admin import render
from riverbed.shells.admin.client import (
    EXIT_OK, EXIT_USAGE, AdminError, consumer, http_get, producer, server_error, stream_path,
)

# RabbitMQ's information units: kB/MB/GB/TB are powers of 1000, KiB/MiB/GiB/TiB powers of 1024.
_SIZE_RE = re.compile(r"^\s*(\d+)\s*([kmgtp]i?b?|b)?\s*$", re.IGNORECASE)
_SIZE_UNITS = {"": 1, "b": 1}
for _i, _p in enumerate("kmgtp", 1):
    _SIZE_UNITS[_p + "b"] = 1000 ** _i
    _SIZE_UNITS[_p + "ib"] = 1024 ** _i
    _SIZE_UNITS[_p + "i"] = 1024 ** _i
    _SIZE_UNITS[_p] = 1000 ** _i
MAX_PARTITIONS = 1000

STREAM_COLUMNS = [("NAME", "name"), ("RECORDS", "records"), ("BYTES", "bytes"), ("CHUNKS", "chunks"),
                  ("FIRST", "first_offset"), ("LAST", "last_offset"), ("CONSUMERS", "consumers"),
                  ("PUBLISHERS", "publishers")]
CONSUMER_COLUMNS = [("PROTOCOL", "protocol"), ("CONNECTION", "connection"), ("ID", "subscription_id"),
                    ("REFERENCE", "reference"), ("OFFSET", "offset"), ("LAG", "lag"), ("CREDITS", "credits")]


def parse_size(text):
    """Bytes from ``20GB``, ``512MiB``, ``1000`` (RabbitMQ units: kB..PB powers of 1000, KiB..PiB powers
    of 1024, case-insensitive). Raises AdminError (EXIT_USAGE) for anything else or zero."""
    m = _SIZE_RE.match(str(text))
    if not m:
        raise AdminError(f"bad size {text!r}: expected <number>[B|kB|MB|GB|TB|KiB|MiB|GiB|TiB], e.g. 20GB",
                         EXIT_USAGE)
    n = int(m.group(1)) * _SIZE_UNITS[(m.group(2) or "").lower()]
    if n <= 0:
        raise AdminError(f"bad size {text!r}: must be positive", EXIT_USAGE)
    return n


def stream_arguments(max_age=None, max_length_bytes=None):
    """The RabbitMQ stream arguments (``x-max-age``, ``x-max-length-bytes``) for the create flags,
    checked as the server checks them (``normalize_arguments``). Raises AdminError (EXIT_USAGE)."""
    from riverbed.engine.errors import InvalidArgument
    from riverbed.engine.layout import normalize_arguments
    args = {}
    if max_age is not None:
        args["x-max-age"] = max_age.strip()
    if max_length_bytes is not None:
        args["x-max-length-bytes"] = str(parse_size(max_length_bytes))
    try:
        normalize_arguments(args)
    except InvalidArgument as e:
        raise AdminError(str(e), EXIT_USAGE) from None
    return args


def partition_names(name, count):
    """``(partitions, binding keys)`` of a super stream: ``NAME-0..NAME-(N-1)`` and ``"0".."N-1"``."""
    if not 1 <= count <= MAX_PARTITIONS:
        raise AdminError(f"--partitions must be 1..{MAX_PARTITIONS}, not {count}", EXIT_USAGE)
    return [f"{name}-{i}" for i in range(count)], [str(i) for i in range(count)]


# ---- over the network ------------------------------------------------------------------------------------

async def create(target, name, arguments, partitions=None):
    """Create a stream, or a super stream of ``partitions`` partitions. Returns a result dict."""
    async with producer(target) as p:
        try:
            if partitions is None:
                await p.create_stream(name, arguments)
                return {"stream": name, "created": True, "arguments": arguments}
            parts, keys = partition_names(name, partitions)
            client = await p.default_client
            await client.create_super_stream(name, parts, keys, arguments)
            return {"stream": name, "created": True, "arguments": arguments, "partitions": parts}
        except Exception as e:
            raise server_error(e, name) or e


async def remove(target, name):
    """Delete a stream, or else the super stream of that name (with its partitions)."""
    from rstream.exceptions import StreamDoesNotExist
    async with producer(target) as p:
        try:
            try:
                await p.delete_stream(name)
                return {"stream": name, "deleted": True}
            except StreamDoesNotExist:
                client = await p.default_client
                await client.delete_super_stream(name)
                return {"stream": name, "deleted": True, "super_stream": True}
        except Exception as e:
            raise server_error(e, name) or e


async def exists(target, name):
    """Whether ``name`` is a stream (RabbitMQ Stream Metadata, through rstream)."""
    async with consumer(target) as c:
        try:
            return await c.stream_exists(name)
        except Exception as e:
            raise server_error(e, name) or e


async def list_streams(target, timeout):
    return await http_get(target, "/api/streams", timeout=timeout)


async def stats(target, name, timeout):
    """The stream's statistics: existence checked over RabbitMQ Stream, the numbers from the JSON API
    (``first_offset`` and ``committed_chunk_id`` are RabbitMQ's StreamStats figures)."""
    if not await exists(target, name):
        raise AdminError(f"stream {name!r} does not exist")
    return await http_get(target, stream_path(name), timeout=timeout, stream=name)


async def consumers(target, name, timeout):
    return await http_get(target, "/api/stream/consumers", params={"stream": name}, timeout=timeout,
                          stream=name)


# ---- a data directory, read-only -------------------------------------------------------------------------

def open_data_dir(path):
    """A read-only Engine on ``path``. Raises AdminError (EXIT_USAGE) when it is not a data directory."""
    import os

    from riverbed.engine import Engine
    if not os.path.isfile(os.path.join(path, "data.mdb")):
        raise AdminError(f"{path}: not a Riverbed data directory (no data.mdb)", EXIT_USAGE)
    try:
        return Engine(path, readonly=True)
    except Exception as e:      # lmdb.Error and RiverbedError: both one-line messages
        raise AdminError(f"{path}: cannot open read-only: {e}", EXIT_USAGE) from None


def info_dict(engine, name):
    """One stream of a read-only engine in the JSON API's shape (consumers and publishers unknown)."""
    from riverbed.engine import StreamNotFound
    try:
        i = engine.stream_info(name)
    except StreamNotFound:
        raise AdminError(f"stream {name!r} does not exist") from None
    return {"name": name, "records": i.records, "bytes": i.bytes, "chunks": i.chunks,
            # -1 (the engine's "none") as the JSON API shows it: null
            "first_offset": _none_if_negative(i.first_offset), "last_offset": _none_if_negative(i.last_offset),
            "committed_chunk_id": i.committed_chunk_id, "arguments": i.arguments,
            "first_timestamp": render.iso_ms(i.first_timestamp), "last_timestamp": render.iso_ms(i.last_timestamp),
            "consumers": None, "publishers": None}


def _none_if_negative(n):
    return None if n < 0 else n


def local_list(path):
    engine = open_data_dir(path)
    try:
        from riverbed.shells.broker.internal import is_internal
        return [info_dict(engine, n) for n in engine.list_streams() if not is_internal(n)]
    finally:
        engine.close()


def local_stats(path, name):
    engine = open_data_dir(path)
    try:
        return info_dict(engine, name)
    finally:
        engine.close()


# ---- output ----------------------------------------------------------------------------------------------

def print_streams(rows, as_json):
    if as_json:
        print(render.to_json(rows))
    else:
        print(render.table(rows, STREAM_COLUMNS))
    return EXIT_OK


def print_stats(info, as_json):
    if as_json:
        print(render.to_json(info))
    else:
        print(render.key_values(info.items()))
    return EXIT_OK


def print_consumers(rows, as_json):
    if as_json:
        print(render.to_json(rows))
    else:
        print(render.table(rows, CONSUMER_COLUMNS))
    return EXIT_OK
