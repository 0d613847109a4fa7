"""The ``riverbed`` command: ``serve`` (the broker), ``users`` (the users file), ``dump`` (a data dir).

``riverbed serve`` opens the engine on the data directory, starts one listener per enabled protocol,
logs ``listening <protocol> <host>:<port>`` for each and then ``ready``. SIGTERM or SIGINT stops it:
no new connections, in-flight writes commit and are confirmed, every client gets a Close, the engine
flushes, and the process exits 0. Exit status 2 for a configuration or start-up error.

Every protocol shell plugs in the same way: its package (see ``SHELLS``) provides ``async serve(broker,
*, host, port, config)``, where ``broker`` is the one :class:`riverbed.shells.broker.Broker` of the
process (engine, auth, sessions), and returns an object with ``port``, ``stop_accepting()`` and
``async shutdown()``.
"""

import argparse
import asyncio
import getpass
import importlib
import logging
import os
import signal
import sys

from riverbed.shells import config as _config
from riverbed.shells import protocols as _protocols

log = logging.getLogger("riverbed")

# (port setting, protocol name: in the log, the metrics, the API; module): one name per protocol
SHELLS = [(_protocols.port_setting(name), name, module) for name, module in _protocols.LISTENERS]
DEFAULT_USERS_FILE = "riverbed-users.toml"


def _setup_logging(level):
    logging.basicConfig(level=getattr(logging, level.upper()), stream=sys.stderr,
                        format="%(asctime)s %(levelname)-7s %(message)s")


def _fmt_addr(host, port):
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _import_shell(name, module):
    try:
        return importlib.import_module(module)
    except ImportError as e:
        if e.name is not None and module.startswith(e.name):
            raise RuntimeError(f"the {name} protocol is not available in this build ({module})") from None
        raise


def _flag(key):
    return "--" + key.replace("_", "-")


def check_listeners(cfg, auth):
    """The ``[(key, name, module)]`` of the listeners to start, after every setting of every one is
    checked: nothing is bound (or opened) until all of them pass, so a bad setting of the fifth listener
    never leaves four bound. A shell module may provide ``check_config(config, auth)``: it raises for a
    bad setting and returns False to leave its listener off (it logs why). Raises RuntimeError or
    ValueError (exit status 2)."""
    enabled, by_port = [], {}
    for key, name, module in SHELLS:
        port = cfg[key]
        if port is None:
            continue
        mod = _import_shell(name, module)
        check = getattr(mod, "check_config", None)
        if check is not None and not check(cfg, auth):
            continue
        if port and port in by_port:
            raise ValueError(f"{_flag(by_port[port])} and {_flag(key)} both name port {port}")
        by_port[port] = key
        enabled.append((key, name, module))
    tls_port = cfg.stream_tls_port
    if cfg.tls_cert and tls_port and tls_port in by_port:
        raise ValueError(f"{_flag(by_port[tls_port])} and --stream-tls-port both name port {tls_port}")
    return enabled


def warn_deprecated(cfg):
    """Log one warning per setting ``cfg`` took under an old name (``--text-port``: use ``--ream-port``)."""
    for given, use in getattr(cfg, "deprecated", ()):
        log.warning("%s is deprecated: use %s (one name per protocol; README, \"Running the broker\")",
                    given, use)


async def _start_listener(name, module, broker, cfg, port):
    return await _import_shell(name, module).serve(broker, host=cfg.host, port=port, config=cfg)


async def run_server(cfg, stop=None, started=None):
    """Run the broker until ``stop`` (an asyncio.Event; default: SIGTERM/SIGINT) is set. Returns 0.
    ``started(broker)``, when given, is called once every listener is up (in-process tests use it)."""
    from riverbed.engine import Engine
    from riverbed.shells.auth import Authenticator
    from riverbed.shells.broker import Broker
    from riverbed.shells.broker import limits as _limits
    from riverbed.shells.broker.disk import DiskMonitor
    from riverbed.shells import tls as _tls

    from riverbed.engine.record import set_max_depth

    warn_deprecated(cfg)
    tls_context = _tls.context_for(cfg)   # bad TLS files fail here, before anything is opened or bound
    set_max_depth(cfg.max_depth)          # one nesting limit for every publish and every render
    loop = asyncio.get_running_loop()
    if stop is None:
        stop = asyncio.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
    auth = Authenticator(cfg.users, anonymous=cfg.anonymous, anonymous_user=cfg.anonymous_user)
    enabled = check_listeners(cfg, auth)
    engine = Engine(cfg.data_dir, fsync=cfg.fsync, max_size=cfg.max_disk)
    # one broker layer for every listener: a deletion through one protocol is heard by all of them
    limits = _limits.configure(_limits.Limits.from_config(cfg))   # before the broker: it reads them
    broker = Broker(engine, post=loop.call_soon_threadsafe, post_local=loop.call_soon, auth=auth,
                    data_dir=cfg.data_dir)
    broker.set_limits(limits)
    # the disk alarm (broker/disk.py): publishes refused below --disk-free-limit or at --max-disk
    broker.disk = DiskMonitor(engine, free_limit=cfg.disk_free_limit, max_disk=cfg.max_disk)
    broker.disk.start(loop)
    listeners = []
    cluster = None
    try:
        if cfg.etcd:
            # a cluster member (shells/cluster): imported only with --etcd, so a lone node pays nothing
            from riverbed.shells.cluster.node import ClusterNode
            cluster = ClusterNode(broker, cfg)
            await cluster.start()
            # documents and transactions through the replicated changelog (before the listeners: the
            # shells take broker.docs when they start)
            from riverbed.shells.cluster.docs import DocLog
            doclog = DocLog(broker, cluster, snapshot_every=cfg.docs_snapshot_every)
            doclog.start()
        for key, name, module in enabled:
            server = await _start_listener(name, module, broker, cfg, cfg[key])
            listeners.append(server)
            log.info("listening %s %s", name, _fmt_addr(cfg.host, server.port))
        if tls_context is not None and cfg.stream_tls_port is not None:
            # RabbitMQ Stream has a TLS port beside the plain one (the other TCP shells switch theirs)
            from riverbed.shells.rmq_stream.server import serve_tls
            server = await serve_tls(broker, host=cfg.host, port=cfg.stream_tls_port, config=cfg)
            listeners.append(server)
            log.info("listening %s %s", server.name, _fmt_addr(cfg.host, server.port))
        # GET /healthz checks each listener started above; GET /readyz is 200 from here until stopping
        broker.listeners.extend((getattr(s, "name", type(s).__name__), s) for s in listeners)
        if cluster is not None:
            ports = {key: server.port for (key, _, _), server in zip(enabled, listeners)}
            await cluster.register({"stream_port": cfg.advertised_port or ports.get("stream_port"),
                                    "http_port": ports.get("http_port"), "kafka_port": ports.get("kafka_port")})
        broker.ready = True
        log.info("ready")
        if started is not None:
            started(broker)
        await stop.wait()
        broker.ready = False
        log.info("stopping")
    finally:
        for server in listeners:
            server.stop_accepting()
        for server in listeners:
            try:
                await server.shutdown()
            except Exception:
                log.exception("error while stopping a listener")
        if cluster is not None:
            # after the listeners: their last publishes may still wait for a majority
            if broker.transactions is not None:
                await broker.transactions.stop()
            await cluster.stop()
        broker.disk.stop()
        broker.close()
        await loop.run_in_executor(None, engine.close)
    log.info("stopped")
    return 0


def _run(coro):
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency on POSIX
        return asyncio.run(coro)
    return uvloop.run(coro)


def cmd_serve(args):
    flags = {o.name: getattr(args, o.name) for o in _config.OPTIONS}
    flags[_config.DEPRECATED_FLAGS] = getattr(args, _config.DEPRECATED_FLAGS, None)
    flags["config"] = args.config
    try:
        cfg = _config.load(flags)
    except _config.ConfigError as e:
        print(f"riverbed serve: {e}", file=sys.stderr)
        return 2
    _setup_logging(cfg.log_level)
    try:
        return _run(run_server(cfg))
    except (OSError, RuntimeError, ValueError) as e:
        log.error("cannot start: %s", e)
        return 2
    except Exception as e:
        from riverbed.engine.errors import RiverbedError
        if isinstance(e, RiverbedError):
            log.error("cannot start: %s", e)
            return 2
        raise


def _users_file(args):
    if args.users:
        return args.users
    try:
        cfg = _config.load({"config": args.config})
    except _config.ConfigError as e:
        raise SystemExit(f"riverbed users: {e}")
    return cfg.users or DEFAULT_USERS_FILE


def cmd_users(args):
    from riverbed.shells import auth
    path = _users_file(args)
    if args.action == "add":
        if args.password is not None:
            password = args.password
        elif args.api_key and not args.password_stdin and sys.stdin.isatty():
            password = None     # an API-key-only user: no password login (it is said below)
        elif args.api_key and not args.password_stdin:
            # a password piped in is taken along with the new key; nothing piped (EOF): key only
            password = sys.stdin.readline().rstrip("\r\n") or None
        elif args.password_stdin or not sys.stdin.isatty():
            password = sys.stdin.readline().rstrip("\r\n")
        else:
            password = getpass.getpass(f"password for {args.name}: ")
            if getpass.getpass("again: ") != password:
                print("riverbed users: the passwords differ", file=sys.stderr)
                return 1
        if password is not None and not password:
            print("riverbed users: empty password", file=sys.stderr)
            return 1
        api_key = auth.new_api_key() if args.api_key else None
        try:
            auth.add_user(path, args.name, password, configure=args.configure, write=args.write, read=args.read,
                          loopback_only=args.loopback_only, api_key=api_key)
        except (ValueError, OSError) as e:
            print(f"riverbed users: {e}", file=sys.stderr)
            return 1
        print(f"user {args.name!r} written to {path}"
              + (" with a password and an API key" if api_key is not None and password is not None else
                 " with an API key only (no password login; --password-stdin sets one too)"
                 if api_key is not None else ""))
        if api_key is not None:
            print(api_key)      # alone on the last line, for scripts; only its hash is stored
        return 0
    if args.action == "delete":
        try:
            found = auth.delete_user(path, args.name)
        except (OSError, ValueError) as e:
            print(f"riverbed users: {e}", file=sys.stderr)
            return 1
        if not found:
            print(f"riverbed users: no user {args.name!r} in {path}", file=sys.stderr)
            return 1
        return 0
    try:
        users = auth.load_users(path)
    except (OSError, ValueError) as e:
        print(f"riverbed users: {e}", file=sys.stderr)
        return 1
    for name, u in sorted(users.items()):
        perms = " ".join(f"{k}={v.pattern if v else ''!r}" for k, v in u.patterns.items())
        print(f"{name}\t{perms}{' loopback-only' if u.loopback_only else ''}")
    return 0


def cmd_zmq_keygen(args):
    from riverbed.shells.zmq_mc0 import keys
    try:
        public_path, secret_path, public = keys.generate_key_pair(args.prefix)
    except OSError as e:
        print(f"riverbed zmq-keygen: {args.prefix}.key: {e.strerror}", file=sys.stderr)
        return 1
    print(f"secret key written to {secret_path}, public key to {public_path}: {public}")
    return 0


def cmd_dump(argv):
    from riverbed.engine import dump   # written by the engine side; imported only when asked for
    return dump.main(argv)


def _version_text():
    from riverbed.shells.rmq_stream.constants import RABBITMQ_VERSION
    from riverbed.shells.version import VERSION
    return f"riverbed {VERSION} (RabbitMQ Stream protocol of RabbitMQ {RABBITMQ_VERSION})"


def build_parser():
    p = argparse.ArgumentParser(prog="riverbed", description="One durable event log, many wire protocols.")
    p.add_argument("--version", action="version", version=_version_text())
    sub = p.add_subparsers(dest="command", required=True)
    s = sub.add_parser("serve", help="run the broker",
                       description="Run the broker. Every flag can also be set as RIVERBED_<FLAG> in the "
                                   "environment or as a key in the --config TOML file.")
    _config.add_arguments(s)
    u = sub.add_parser("users", help="manage the users file")
    u.add_argument("--users", metavar="FILE", help=f"users file (default: from config, else {DEFAULT_USERS_FILE})")
    u.add_argument("--config", metavar="FILE", help="TOML config file whose `users` setting to use")
    us = u.add_subparsers(dest="action", required=True)
    a = us.add_parser("add", help="add or replace a user")
    a.add_argument("name")
    a.add_argument("--password", help="the password (default: prompt, or one line from stdin)")
    a.add_argument("--password-stdin", action="store_true", help="read the password from stdin")
    a.add_argument("--configure", default=".*", metavar="REGEX", help="streams it may create/delete (.*)")
    a.add_argument("--write", default=".*", metavar="REGEX", help="streams it may publish to (.*)")
    a.add_argument("--read", default=".*", metavar="REGEX", help="streams it may consume (.*)")
    a.add_argument("--loopback-only", action="store_true", help="allow connections from loopback only")
    a.add_argument("--api-key", action="store_true",
                   help="also make a new API key (WebSocket authKey); printed alone on the last line. A "
                        "password given too (--password, or piped on stdin) is kept as well; without one "
                        "the user logs in by key only")
    d = us.add_parser("delete", help="remove a user")
    d.add_argument("name")
    us.add_parser("list", help="list users and permissions")
    k = sub.add_parser("zmq-keygen", help="write a CURVE key pair for the ZeroMQ listener or a client",
                       description="Write PREFIX.key (Z85 secret key, mode 0600; for --zmq-curve-secret) and "
                                   "PREFIX.pub (Z85 public key; for clients, or a --zmq-curve-clients dir).")
    k.add_argument("prefix", nargs="?", default="riverbed-zmq", help="output path prefix (default riverbed-zmq)")
    from riverbed.shells import admin    # streams, tail, publish, consumers
    admin.add_parsers(sub)
    sub.add_parser("dump", help="print the streams and chunks of a data directory", add_help=False)
    c = sub.add_parser("cluster", help="the cluster's nodes and streams (etcd)")
    cs = c.add_subparsers(dest="action", required=True)
    st = cs.add_parser("status", help="nodes (up/down, addresses, streams led) and, per stream, epoch, leader "
                                      "and each member's committed offset and lag")
    st.add_argument("--etcd", default=os.environ.get("RIVERBED_ETCD"), metavar="URL[,URL]",
                    help="etcd client URL(s) (also RIVERBED_ETCD)")
    st.add_argument("--cluster", default=os.environ.get("RIVERBED_CLUSTER", "riverbed"), metavar="NAME",
                    help="cluster name (also RIVERBED_CLUSTER; default riverbed)")
    st.add_argument("--json", action="store_true", help="print the status as JSON")
    for action, text in (("add-replica", "make NODE a member of STREAM: it copies the leader's log, then "
                                         "follows it (a member once it holds the committed offset)"),
                         ("delete-replica", "take NODE off STREAM and delete its copy there (a leader hands "
                                            "leadership to another member first; the last member stays)")):
        r = cs.add_parser(action, help=text, description=text + ". Exit 0 done, 1 refused, 2 etcd unreachable.")
        r.add_argument("stream")
        r.add_argument("node")
        r.add_argument("--etcd", default=os.environ.get("RIVERBED_ETCD"), metavar="URL[,URL]",
                       help="etcd client URL(s) (also RIVERBED_ETCD)")
        r.add_argument("--cluster", default=os.environ.get("RIVERBED_CLUSTER", "riverbed"), metavar="NAME",
                       help="cluster name (also RIVERBED_CLUSTER; default riverbed)")
        r.add_argument("--timeout", type=float, default=60.0, metavar="SECONDS",
                       help="how long to wait for the change to complete (default 60)")
    sub.add_parser("spark-load", help="bulk-load streams into parquet, delta or a table (spark extra)",
                   add_help=False)
    return p


def main(argv=None):
    """Entry point of the ``riverbed`` console script. Returns the exit status."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and argv[0] == "dump":
        return cmd_dump(argv[1:])
    if argv and argv[0] == "spark-load":
        from riverbed.spark import load   # needs the spark extra; imported only when asked for
        return load.main(argv[1:])
    args = build_parser().parse_args(argv)
    if args.command == "serve":
        return cmd_serve(args)
    if args.command == "users":
        return cmd_users(args)
    if args.command in ("streams", "tail", "publish", "consumers"):
        from riverbed.shells import admin
        return admin.run(args)
    if args.command == "zmq-keygen":
        return cmd_zmq_keygen(args)
    if args.command == "cluster":
        if not args.etcd:
            print("riverbed cluster: give --etcd URL (or RIVERBED_ETCD)", file=sys.stderr)
            return 2
        if args.action in ("add-replica", "delete-replica"):
            from riverbed.shells.cluster.membership import main_change
            return main_change(args)
        from riverbed.shells.cluster.status import main_status
        return main_status(args)
    return 2


if __name__ == "__main__":
    sys.exit(main())
