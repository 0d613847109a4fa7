"""The admin commands of ``riverbed``: ``streams ls|create|rm|stats``, ``tail``, ``publish``, ``consumers``.

They talk to a running server (``--uri rabbitmq-stream://user:pass@host:port`` or
``rabbitmq-stream+tls://...`` with ``--tls-ca FILE``, default ``rabbitmq-stream://localhost:5552`` as
guest; the HTTP JSON API at ``--http-uri``, default the same host on the port the server names in
PeerProperties) or read a data directory read-only (``--data-dir DIR``: ``streams ls``, ``streams stats``
and ``tail``). Every failure is one line on stderr and an exit status (:data:`EXIT_CODES`); ``--json``
prints one JSON document on stdout instead of a table.

:func:`add_parsers` registers the subcommands on ``riverbed``'s argparse subparsers; :func:`run` runs one.
Importing this package is cheap: rstream and aiohttp are imported when a command runs.
"""

import argparse
import asyncio
import os
import sys

from riverbed.shells.admin.client import (
    DEFAULT_URI, EXIT_CONNECT, EXIT_OK, EXIT_SERVER, EXIT_USAGE, AdminError, parse_uri,
)

COMMANDS = ("streams", "tail", "publish", "consumers")
EXIT_CODES = {EXIT_OK: "ok", EXIT_SERVER: "the server refused (no such stream, exists, access refused)",
              EXIT_USAGE: "usage or configuration error", EXIT_CONNECT: "cannot connect to the server"}
ENV_URI = "RIVERBED_URI"
ENV_HTTP_URI = "RIVERBED_HTTP_URI"
ENV_TLS_CA = "RIVERBED_TLS_CA"
DEFAULT_TIMEOUT = 30.0      # seconds for one request/command step (not for tail --follow)

EPILOG = ("exit status: 0 ok, 1 the server refused (no such stream, already exists, access refused), "
          "2 usage or configuration error, 3 cannot connect to the server.")


def _common(p, data_dir=False, json_flag=True):
    g = p.add_argument_group("server")
    g.add_argument("--uri", default=os.environ.get(ENV_URI, DEFAULT_URI),
                   help=f"rabbitmq-stream://user:pass@host:port[/vhost], or rabbitmq-stream+tls://... for TLS "
                        f"(default ${ENV_URI} or {DEFAULT_URI}, user guest)")
    g.add_argument("--http-uri", default=os.environ.get(ENV_HTTP_URI),
                   help="the server's HTTP JSON API, http(s)://host:port (default: the --uri host, on the port "
                        "the server names when asked)")
    g.add_argument("--tls-ca", default=os.environ.get(ENV_TLS_CA), metavar="FILE",
                   help=f"PEM CA file to trust for rabbitmq-stream+tls:// and https:// (default ${ENV_TLS_CA}, "
                        "else the system's CAs)")
    g.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT, metavar="SECONDS",
                   help=f"give up on a step after this long (default {DEFAULT_TIMEOUT:g})")
    if data_dir:
        g.add_argument("--data-dir", metavar="DIR",
                       help="read this data directory (read-only, works beside a running server) instead")
    if json_flag:
        p.add_argument("--json", action="store_true", help="print JSON for scripts instead of a table")


def add_parsers(sub):
    """Add ``streams``, ``tail``, ``publish`` and ``consumers`` to argparse subparsers ``sub``."""
    kw = dict(epilog=EPILOG)
    s = sub.add_parser("streams", help="list, create, delete and inspect streams", **kw)
    ss = s.add_subparsers(dest="action", required=True)
    ls = ss.add_parser("ls", help="list streams with their sizes", **kw)
    _common(ls, data_dir=True)
    c = ss.add_parser("create", help="create a stream, or a super stream with --partitions", **kw)
    c.add_argument("stream", metavar="NAME")
    c.add_argument("--max-age", metavar="AGE", help="retention by age: 7D, 12h, 30m, 1Y (x-max-age)")
    c.add_argument("--max-length-bytes", metavar="SIZE",
                   help="retention by size: 20GB, 512MiB, 1000000 (x-max-length-bytes)")
    c.add_argument("--partitions", type=int, metavar="N",
                   help="make a super stream of N partitions NAME-0..NAME-(N-1), binding keys 0..N-1")
    _common(c)
    r = ss.add_parser("rm", help="delete a stream or super stream (no prompt)", **kw)
    r.add_argument("stream", metavar="NAME")
    _common(r)
    st = ss.add_parser("stats", help="a stream's offsets, sizes and arguments", **kw)
    st.add_argument("stream", metavar="NAME")
    _common(st, data_dir=True)

    t = sub.add_parser("tail", help="print a stream's records", **kw)
    t.add_argument("stream", metavar="NAME")
    t.add_argument("--from", dest="start", default="last", metavar="WHERE",
                   help="first, last (default; the last chunk), next, an OFFSET, an ISO-8601 TIME or a relative "
                        "time: --from=-10m (ms, s, m, h, d, w)")
    t.add_argument("--follow", "-f", action="store_true", help="keep printing new records until interrupted")
    t.add_argument("--format", choices=("json", "raw"), default="json",
                   help="json: one object per record (offset, times, content type, value); raw: the payload")
    _common(t, data_dir=True, json_flag=False)     # its output is JSON lines already (--format)

    p = sub.add_parser("publish", help="publish stdin, one record per line, confirmed", **kw)
    p.add_argument("stream", metavar="NAME")
    p.add_argument("--content-type", metavar="TYPE",
                   help="application/octet-stream (default), application/json (each line checked), text/plain, ...")
    p.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                   help="a progress bar on stderr (default: when stdin is piped and stderr is a terminal)")
    _common(p)

    cs = sub.add_parser("consumers", help="a stream's consumers with their offsets and lag", **kw)
    cs.add_argument("stream", metavar="NAME")
    _common(cs)


def _run_async(coro, timeout=None):
    async def bounded():
        if timeout is None:
            return await coro
        try:
            return await asyncio.wait_for(coro, timeout)
        except asyncio.TimeoutError:
            raise AdminError(f"no answer within {timeout:g} s", EXIT_CONNECT) from None
    return asyncio.run(bounded())


def _dispatch(args):
    from riverbed.shells.admin import streams, tail
    as_json = getattr(args, "json", False)
    data_dir = getattr(args, "data_dir", None)
    if data_dir is not None:
        if args.command == "streams" and args.action == "ls":
            return streams.print_streams(streams.local_list(data_dir), as_json)
        if args.command == "streams" and args.action == "stats":
            return streams.print_stats(streams.local_stats(data_dir, args.stream), as_json)
        return tail.tail_local(data_dir, args.stream, tail.parse_from(args.start), args.follow, args.format)
    target = parse_uri(args.uri, args.http_uri, args.tls_ca)
    timeout = args.timeout
    if args.command == "streams":
        if args.action == "ls":
            return streams.print_streams(_run_async(streams.list_streams(target, timeout), timeout), as_json)
        if args.action == "stats":
            return streams.print_stats(_run_async(streams.stats(target, args.stream, timeout), timeout), as_json)
        if args.action == "create":
            arguments = streams.stream_arguments(args.max_age, args.max_length_bytes)
            if args.partitions is not None:
                streams.partition_names(args.stream, args.partitions)     # checked before connecting
            result = _run_async(streams.create(target, args.stream, arguments, args.partitions), timeout)
            if as_json:
                print(streams.render.to_json(result))
            else:
                parts = result.get("partitions")
                print(f"created {'super stream' if parts else 'stream'} {args.stream}"
                      + (f" ({len(parts)} partitions)" if parts else ""))
            return EXIT_OK
        result = _run_async(streams.remove(target, args.stream), timeout)
        if as_json:
            print(streams.render.to_json(result))
        else:
            print(f"deleted {'super stream' if result.get('super_stream') else 'stream'} {args.stream}")
        return EXIT_OK
    if args.command == "consumers":
        return streams.print_consumers(_run_async(streams.consumers(target, args.stream, timeout), timeout),
                                       as_json)
    if args.command == "tail":
        spec = tail.parse_from(args.start)
        return _run_async(tail.tail_remote(target, args.stream, spec, args.follow, args.format, timeout))
    from riverbed.shells.admin import publish
    return publish.run(target, args, as_json, _run_async, timeout)


def run(args):
    """Run the admin command parsed into ``args``; returns the exit status. Errors are printed as one line
    on stderr (``riverbed COMMAND: message``), never as a traceback."""
    name = f"riverbed {args.command}" + (f" {args.action}" if args.command == "streams" else "")
    try:
        return _dispatch(args)
    except AdminError as e:
        print(f"{name}: {e}", file=sys.stderr)
        return e.code
    except KeyboardInterrupt:
        return EXIT_OK if args.command == "tail" else 130
    except BrokenPipeError:
        # the reader went away (``| head``): stop quietly, and keep Python from complaining at exit
        try:
            # Python's recipe: what is still buffered for stdout goes to /dev/null at exit
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        except (OSError, ValueError):
            pass
        return EXIT_OK
    except Exception as e:
        from riverbed.shells.admin.client import server_error
        mapped = server_error(e, getattr(args, "stream", None))
        if mapped is None:
            raise
        print(f"{name}: {mapped}", file=sys.stderr)
        return mapped.code
