"""Settings of ``riverbed serve``: command-line flags > ``RIVERBED_*`` environment variables > a TOML
config file (``--config FILE`` or ``RIVERBED_CONFIG``) > defaults.

Every setting has one name used everywhere: flag ``--stream-port``, environment variable
``RIVERBED_STREAM_PORT``, TOML key ``stream_port`` (or ``stream-port``)::

    # riverbed.toml
    data_dir = "/var/lib/riverbed"
    host = "0.0.0.0"
    stream_port = 5552
    advertised_host = "broker.example.com"
    users = "/etc/riverbed/users.toml"
    fsync = "batch"

Ports take a number (0 = any free port; the log line says which) or ``off`` to disable that listener.
A listener's settings carry its protocol's one name (:mod:`riverbed.shells.protocols`): ``--ream-port``,
``--ream-user``, ... Settings under an old name (:data:`~riverbed.shells.protocols.DEPRECATED_SETTINGS`,
e.g. ``--text-port``) are still taken, as flag, environment variable or TOML key, and
:attr:`Config.deprecated` lists them so that ``riverbed serve`` warns.
"""

import argparse
import os
try:
    import tomllib
except ImportError:  # Python 3.10
    import tomli as tomllib
from dataclasses import dataclass, field

from riverbed.shells.protocols import DEPRECATED_SETTINGS

PORT_OFF = None
DEPRECATED_FLAGS = "deprecated_flags"   # key of ``load``'s flags: the old flags given (see add_arguments)


class ConfigError(ValueError):
    """A setting has a bad value or the config file is unreadable; the message names the setting and
    where it came from."""


def _whole_number(value, what="a whole number"):
    """``value`` (an int or its decimal text) as an int; ValueError says what was expected, in words
    (never Python's "invalid literal for int()")."""
    if isinstance(value, bool) or isinstance(value, float) and not value.is_integer():
        raise ValueError(f"expected {what}")
    try:
        return int(value.strip(), 10) if isinstance(value, str) else int(value)
    except (ValueError, TypeError):
        raise ValueError(f"expected {what}") from None


def _number(value, what="a number"):
    if isinstance(value, bool):
        raise ValueError(f"expected {what}")
    try:
        return float(value)
    except (ValueError, TypeError):
        raise ValueError(f"expected {what}") from None


PORT_WORDS = "a port number 0..65535 (0 = any free port) or off"


def parse_port(value):
    """``off`` -> None; otherwise an int 0..65535. Raises ValueError in words."""
    if value is None:
        return None
    if isinstance(value, str) and value.strip().lower() in ("off", "none", "disabled", "false", ""):
        return None
    value = _whole_number(value, PORT_WORDS)
    if not 0 <= value <= 65535:
        raise ValueError(f"port {value} is out of range: expected {PORT_WORDS}")
    return value


def parse_bool(value):
    if isinstance(value, bool):
        return value
    v = str(value).strip().lower()
    if v in ("1", "true", "yes", "on"):
        return True
    if v in ("0", "false", "no", "off", ""):
        return False
    raise ValueError(f"{value!r} is not a boolean")


def _opt_str(value):
    return None if value is None or str(value) == "" else str(value)


def _opt_port(value):
    p = parse_port(value)
    if p == 0:
        raise ValueError("an advertised port cannot be 0")
    return p


def _positive_float(value):
    v = _number(value, "a number > 0")
    if v <= 0:
        raise ValueError("must be > 0")
    return v


def _positive_int(value):
    v = _whole_number(value, "a whole number > 0")
    if v <= 0:
        raise ValueError("must be > 0")
    return v


def _depth(value):
    from riverbed.engine.record import MAX_DEPTH_CAP
    v = _whole_number(value, f"a whole number 1..{MAX_DEPTH_CAP}")
    if not 1 <= v <= MAX_DEPTH_CAP:
        raise ValueError(f"must be 1..{MAX_DEPTH_CAP}")
    return v


def _positive_float_or_off(value):
    if value is None or str(value).strip().lower() in ("off", "none", "0", ""):
        return None
    return _positive_float(value)


_SIZE_UNITS = {"": 1, "b": 1, "k": 1 << 10, "kb": 1 << 10, "kib": 1 << 10, "m": 1 << 20, "mb": 1 << 20,
               "mib": 1 << 20, "g": 1 << 30, "gb": 1 << 30, "gib": 1 << 30}


def parse_size(value):
    """A positive byte count: an int, or a string such as ``65536``, ``64KiB``, ``16MiB``, ``1GiB``
    (k/m/g and kb/mb/gb are binary units too)."""
    if isinstance(value, bool):
        raise ValueError("not a size")
    if isinstance(value, str):
        v = value.strip().lower().replace("_", "")
        num = v.rstrip("abcdefghijklmnopqrstuvwxyz ")
        unit = v[len(num):].strip()
        if unit not in _SIZE_UNITS or not num:
            raise ValueError(f"{value!r} is not a size (bytes, or with KiB/MiB/GiB)")
        value = int(float(num) * _SIZE_UNITS[unit])
    return _positive_int(value)


def _non_negative_int(value):
    v = _whole_number(value, "a whole number >= 0")
    if v < 0:
        raise ValueError("must be >= 0")
    return v


def _size_or_zero(value):
    if str(value).strip() == "0":
        return 0
    return parse_size(value)


def _size_or_off(value):
    if value is None or str(value).strip().lower() in ("off", "none", ""):
        return None
    return parse_size(value)


@dataclass(frozen=True)
class Option:
    name: str
    parse: object
    default: object
    help: str
    metavar: str = None
    flag: bool = False        # a boolean switch on the command line


OPTIONS = [
    Option("data_dir", str, "riverbed-data", "data directory (created if missing; default ./riverbed-data)", "DIR"),
    Option("host", str, "127.0.0.1", "address every listener binds (default 127.0.0.1)", "HOST"),
    Option("stream_port", parse_port, 5552, "RabbitMQ Stream port (default 5552; 0 = any free; off)", "PORT"),
    Option("bson_port", parse_port, 7451, "BSON/TCP (mewbase) port (default 7451; 0 = any free; off)", "PORT"),
    Option("bson_idle_timeout", _positive_float, 60.0, "seconds a BSON/TCP connection may send nothing (PING) "
           "before it is closed (default 60)", "SECONDS"),
    Option("zmq_port", parse_port, 61616, "ZeroMQ mc0 ROUTER port (default 61616; 0 = any free; off)", "PORT"),
    Option("zmq_curve_secret", _opt_str, None,
           "ZeroMQ: file with the server's CURVE secret key (Z85); makes the ROUTER refuse plaintext clients",
           "FILE"),
    Option("zmq_curve_clients", _opt_str, None,
           "ZeroMQ: directory of allowed CURVE client public keys (Z85, one per file; re-read on change)", "DIR"),
    Option("zmq_hwm", _non_negative_int, 1000, "ZeroMQ: high-water mark, messages queued per peer and direction",
           "MESSAGES"),
    Option("ws_port", parse_port, 8890, "WebSocket JSON (Streamr v28) port (default 8890; 0 = any free; off)", "PORT"),
    Option("ws_max_frame", parse_size, 1 << 20,
           "WebSocket JSON: largest client frame, bytes; bigger ones close the connection (1009)", "BYTES"),
    Option("ws_send_buffer", _positive_int, 16 << 20,
           "WebSocket JSON: unsent bytes a connection may hold before it is dropped", "BYTES"),
    Option("ream_port", parse_port, 7461, "REAM text port (default 7461; 0 = any free; off)", "PORT"),
    Option("ream_user", _opt_str, None, "user the REAM listener acts as with --users (REAM has no "
           "credentials; without it the REAM listener stays off when a users file is given)", "NAME"),
    Option("ream_keepalive", _positive_float_or_off, None,
           "REAM: seconds of client silence before the server sends PING (default off)", "SECONDS"),
    Option("ream_max_payload", parse_size, 4 << 20, "REAM: largest payload a request may declare, bytes "
           "(default 4 MiB)", "BYTES"),
    Option("kafka_port", parse_port, 9092, "Kafka port (default 9092; 0 = any free; off)", "PORT"),
    Option("kafka_group_session_timeout_ms", _positive_int, 45000, "Kafka KIP-848 consumer groups: a member "
           "silent this long is removed (Kafka's group.consumer.session.timeout.ms; default 45000)", "MS"),
    Option("kafka_group_heartbeat_interval_ms", _positive_int, 5000, "Kafka KIP-848 consumer groups: the "
           "heartbeat interval members are told (group.consumer.heartbeat.interval.ms; default 5000)", "MS"),
    Option("http_port", parse_port, 15692, "HTTP port: management API (default 15692; 0 = any free; off)", "PORT"),
    Option("stream_tls_port", parse_port, 5551, "RabbitMQ Stream TLS port, beside the plain one; only with "
           "--tls-cert (default 5551; 0 = any free; off)", "PORT"),
    Option("tls_cert", _opt_str, None, "PEM certificate chain: TLS on the RabbitMQ Stream TLS port, and the "
           "BSON, REAM text, WebSocket (wss) and HTTP (https) ports switch to TLS; ZeroMQ keeps CURVE", "FILE"),
    Option("tls_key", _opt_str, None, "PEM private key (unencrypted) of --tls-cert", "FILE"),
    Option("tls_ca", _opt_str, None, "PEM CA bundle: TLS clients must present a certificate it signed", "FILE"),
    Option("advertised_host", _opt_str, None,
           "host clients are told to dial (Metadata/OpenResponse; default: the address they connected to)",
           "HOST"),
    Option("advertised_port", _opt_port, None, "port clients are told to dial (default: the bound port)", "PORT"),
    Option("fsync", str, "batch", "durability policy: always, batch (default) or never", "POLICY"),
    Option("disk_free_limit", _size_or_zero, 50 << 20,
           "refuse publishes (every protocol) while the data directory's disk has less free than this, "
           "bytes or with a unit: 16MB, 1GB (default 50MB; 0 = never)", "SIZE"),
    Option("max_disk", _size_or_off, None, "cap on the data file: refuse publishes when the data reaches it, "
           "bytes or with a unit: 500MB, 20GB (default off)", "SIZE"),
    Option("users", _opt_str, None,
           "users file (see `riverbed users add`); without one guest/guest works from loopback only", "FILE"),
    Option("anonymous", parse_bool, False, "also offer SASL ANONYMOUS (logs in as the anonymous user)",
           flag=True),
    Option("anonymous_user", str, "guest", "user that ANONYMOUS logs in as (default guest)", "NAME"),
    Option("heartbeat", _non_negative_int, 60, "heartbeat offered to clients, seconds (0 = none)", "SECONDS"),
    Option("frame_max", _non_negative_int, 1048576, "frame_max offered to clients, bytes", "BYTES"),
    Option("handshake_timeout", _positive_float, 10.0, "seconds a new connection has to complete Open",
           "SECONDS"),
    Option("max_depth", _depth, 64, "deepest nesting of BSON documents / JSON values a publish may carry "
           "(refused with each protocol's error) and a reader is given converted (deeper stored records "
           "arrive raw), 1..256 (default 64)", "LEVELS"),
    Option("log_level", str, "info", "debug, info, warning or error", "LEVEL"),
    # the named limits (riverbed.shells.broker.limits.Limits; README "Limits"): sizes take 64KiB, 16MiB, ...
    Option("max_frame_size", parse_size, 64 << 20, "RabbitMQ Stream: largest Publish frame, bytes (default "
           "64MiB; other commands are held to the negotiated frame_max)", "BYTES"),
    Option("max_decompressed_size", parse_size, 64 << 20, "RabbitMQ Stream: largest uncompressed size of a "
           "sub-batch; decompression stops there (default 64MiB)", "BYTES"),
    Option("max_decompression_ratio", _positive_int, 200, "RabbitMQ Stream: a sub-batch may declare at most "
           "this many times its compressed size, above 1MiB (default 200)", "RATIO"),
    Option("max_entries_per_frame", _positive_int, 65536, "RabbitMQ Stream: messages in one Publish frame "
           "(default 65536)", "COUNT"),
    Option("max_pending_bytes", parse_size, 32 << 20, "per connection: uncommitted published bytes before "
           "the server stops reading it (default 32MiB)", "BYTES"),
    Option("max_inflight_bytes", parse_size, 256 << 20, "broker-wide: uncommitted published bytes of every "
           "connection together before publishers are paused (default 256MiB)", "BYTES"),
    Option("bson_max_frame", parse_size, 16 << 20, "BSON/TCP: largest frame, bytes (default 16MiB)", "BYTES"),
    Option("zmq_max_message", parse_size, 16 << 20, "ZeroMQ: largest message part, bytes (ZMQ_MAXMSGSIZE; "
           "default 16MiB)", "BYTES"),
    Option("zmq_max_parts", _positive_int, 64, "ZeroMQ: parts of one multipart message (default 64)", "COUNT"),
    Option("http_max_body", parse_size, 16 << 20, "HTTP and WebSocket REST: largest request body (default 16MiB)",
           "BYTES"),
    Option("ream_max_line", parse_size, 64 << 10, "REAM: longest request line (default 64KiB)", "BYTES"),
    # the cluster (shells/cluster): all off without --etcd
    Option("etcd", _opt_str, None, "etcd client URL(s), comma-separated: join a cluster (default: run alone)",
           "URL[,URL]"),
    Option("node", _opt_str, None, "this node's name in the cluster (required with --etcd)", "NAME"),
    Option("cluster", str, "riverbed", "cluster name: the etcd key prefix (default riverbed)", "NAME"),
    Option("replication_port", parse_port, 5553, "cluster: port members copy chunks over (default 5553; "
           "0 = any free)", "PORT"),
    Option("advertised_replication_port", _opt_port, None, "cluster: replication port members are told to dial "
           "(default: the bound one; a proxy or NAT in between)", "PORT"),
    Option("lease_ttl", _positive_float, 3.0, "cluster: etcd lease TTL, seconds (default 3)", "SECONDS"),
    Option("replication_timeout", _positive_float, 10.0, "cluster: seconds a publish waits for a majority "
           "before it is refused (default 10)", "SECONDS"),
    Option("tombstone_max_age", _positive_float, 7 * 24 * 3600.0, "cluster: seconds a deleted stream's tombstone "
           "waits for a node that held a copy and is away (default 604800, 7 days)", "SECONDS"),
    Option("docs_snapshot_every", _non_negative_int, 10_000, "cluster: document changelog records between two "
           "snapshots, after which its head is dropped (default 10000; 0 = never compact)", "RECORDS"),
]
BY_NAME = {o.name: o for o in OPTIONS}
ENV_PREFIX = "RIVERBED_"


@dataclass
class Config:
    """Resolved settings; ``sources`` tells where each value came from (flag, env, file, default);
    ``deprecated`` the settings given under an old name, as ``(what was given, the name to use)``
    (``("--text-port", "--ream-port")``), for the server to warn about. An old name also reads its
    setting (``cfg.text_port`` is ``cfg.ream_port``)."""
    values: dict
    sources: dict = field(default_factory=dict)
    deprecated: list = field(default_factory=list)

    def __getattr__(self, name):
        try:
            return self.values[DEPRECATED_SETTINGS.get(name, name)]
        except KeyError:
            raise AttributeError(name) from None

    def __getitem__(self, name):
        return self.values[DEPRECATED_SETTINGS.get(name, name)]


def env_name(name):
    return ENV_PREFIX + name.upper()


def read_file(path):
    """The settings in a TOML config file as ``{name: raw value}``. Raises ConfigError."""
    try:
        with open(path, "rb") as f:
            doc = tomllib.load(f)
    except OSError as e:
        raise ConfigError(f"cannot read config file {path}: {e.strerror}") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"config file {path}: {e}") from None
    out = {}
    for key, value in doc.items():
        name = key.replace("-", "_")
        if name not in BY_NAME and name not in DEPRECATED_SETTINGS:
            raise ConfigError(f"config file {path}: unknown setting {key!r}")
        out[name] = value
    return out


def _flag_name(name):
    return "--" + name.replace("_", "-")


def _renamed(layer, source, deprecated):
    """``layer`` with its old setting names replaced by the new ones (a new name given beside its old one
    wins); each old name found is added to ``deprecated`` in the words of ``source``."""
    out = {k: v for k, v in layer.items() if k not in DEPRECATED_SETTINGS}
    for old, new in DEPRECATED_SETTINGS.items():
        if old not in layer:
            continue
        if source == "environment":
            deprecated.append((env_name(old), env_name(new)))
        elif source == "flag":
            deprecated.append((_flag_name(old), _flag_name(new)))
        else:
            deprecated.append((f"{old} in {source}", new))
        out.setdefault(new, layer[old])
    return out


def load(flags=None, env=None, config_file=None):
    """Resolve every option. ``flags`` holds command-line values (None = not given), ``env`` defaults
    to ``os.environ``, ``config_file`` to ``flags['config']`` or ``$RIVERBED_CONFIG``.

    Returns a Config. Raises ConfigError naming the bad setting and its source.
    """
    flags = {k: v for k, v in (flags or {}).items() if v is not None}
    env = os.environ if env is None else env
    config_file = config_file or flags.pop("config", None) or env.get(ENV_PREFIX + "CONFIG")
    flags.pop("config", None)
    deprecated = [(old, new) for old, new in flags.pop(DEPRECATED_FLAGS, ())]
    layers = [("file " + str(config_file), read_file(config_file))] if config_file else []
    names = list(BY_NAME) + list(DEPRECATED_SETTINGS)
    layers.append(("environment", {n: env[env_name(n)] for n in names if env_name(n) in env}))
    layers.append(("flag", {k: v for k, v in flags.items() if k in BY_NAME or k in DEPRECATED_SETTINGS}))
    layers = [(source, _renamed(layer, source, deprecated)) for source, layer in layers]
    values = {o.name: o.default for o in OPTIONS}
    sources = {o.name: "default" for o in OPTIONS}
    for source, layer in layers:
        for name, raw in layer.items():
            opt = BY_NAME[name]
            try:
                values[name] = opt.parse(raw)
            except (ValueError, TypeError) as e:
                if source == "flag":
                    where = f"--{name.replace('_', '-')}"
                elif source == "environment":
                    where = env_name(name)
                else:
                    where = f"{name} in {source}"
                raise ConfigError(f"bad value {raw!r} for {where}: {e}") from None
            sources[name] = source
    if values["fsync"] not in ("always", "batch", "never"):
        raise ConfigError(f"fsync must be always, batch or never, not {values['fsync']!r} ({sources['fsync']})")
    if values["log_level"].lower() not in ("debug", "info", "warning", "error"):
        raise ConfigError(f"log_level must be debug, info, warning or error, not {values['log_level']!r}")
    if values["etcd"] and not values["node"]:
        raise ConfigError("--etcd needs --node NAME (this node's name in the cluster)")
    return Config(values, sources, deprecated)


class _DeprecatedFlag(argparse.Action):
    """An old flag: stores into the new setting (so that, given beside the new flag, the last one wins)
    and notes itself under :data:`DEPRECATED_FLAGS` for :func:`load`."""

    def __call__(self, parser, namespace, values, option_string=None):
        setattr(namespace, self.dest, values)
        used = list(getattr(namespace, DEPRECATED_FLAGS, None) or ())
        used.append((option_string, _flag_name(self.dest)))
        setattr(namespace, DEPRECATED_FLAGS, used)


def add_arguments(parser):
    """Add one ``--flag`` per option to an argparse parser (defaults None: unset flags do not
    override lower layers), and each old flag of :data:`DEPRECATED_SETTINGS` as an alias of its new
    one (the parsed namespace's ``deprecated_flags`` lists those given; pass it on to :func:`load`)."""
    parser.add_argument("--config", metavar="FILE", help="TOML config file (also $RIVERBED_CONFIG)")
    for o in OPTIONS:
        flag = _flag_name(o.name)
        if o.flag:
            parser.add_argument(flag, dest=o.name, action="store_const", const=True, default=None, help=o.help)
        else:
            parser.add_argument(flag, dest=o.name, metavar=o.metavar, default=None, help=o.help)
    for old, new in DEPRECATED_SETTINGS.items():
        parser.add_argument(_flag_name(old), dest=new, action=_DeprecatedFlag, metavar=BY_NAME[new].metavar,
                            default=None, help=f"deprecated: use {_flag_name(new)}")
