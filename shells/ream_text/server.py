"""The REAM text listener: a broker-layer TcpListener whose sessions are ReamSessions (its shell keeps a
small thread pool for document-store reads that may scan many rows, PROJECTION SELECT)."""

import logging

from riverbed.shells import tls as _tls
from riverbed.shells.broker import TcpListener
from riverbed.shells.ream_text.codec import DEFAULT_MAX_PAYLOAD
from riverbed.shells.ream_text.session import ReamSession
from riverbed.shells.ream_text.shell import READ_WORKERS, ReamShell
from riverbed.shells.protocols import REAM

log = logging.getLogger("riverbed.ream")


class ConfigError(ValueError):
    """The REAM listener cannot start with these settings (a users file without ``--ream-user``)."""


class ReamServer(TcpListener):
    """A REAM 1.0 listener over the shared broker. Create it with :func:`serve`. ``port`` is the bound
    port; ``shell`` the listener's :class:`ReamShell`. Loop-thread only."""

    name = REAM
    session_class = ReamSession

    def __init__(self, broker, *, host="127.0.0.1", port=7461, keepalive=None, max_payload=DEFAULT_MAX_PAYLOAD,
                 text_user=None, ssl=None):
        shell = ReamShell(broker, keepalive=keepalive, max_payload=max_payload, text_user=text_user,
                          read_threads=READ_WORKERS)
        super().__init__(broker, shell=shell, host=host, port=port, ssl=ssl)


def check_config(config, auth):
    """Whether ``riverbed serve`` should start this listener, decided before any listener is bound.

    REAM has no credentials, so with a users file its connections act as ``--ream-user``. Without that
    setting the listener stays off (logged) when its port is the default, so that ``riverbed serve
    --users FILE`` starts every other listener; a ``--ream-port`` set explicitly makes the missing user
    an error. Raises ConfigError for a missing or unknown REAM user that cannot be defaulted."""
    if auth.open_to_loopback:
        return True
    text_user = getattr(config, "ream_user", None)
    if not text_user:
        if config.sources.get("ream_port", "default") == "default":
            log.warning("%s listener off: REAM has no credentials, so with a users file it needs "
                        "--ream-user NAME (the user its connections act as)", REAM)
            return False
        raise ConfigError(f"the {REAM} listener needs --ream-user when a users file is given "
                          "(or --ream-port off)")
    if auth.user(text_user) is None:
        raise ConfigError(f"--ream-user {text_user!r} is not in the users file")
    return True


async def serve(broker, *, host="127.0.0.1", port=7461, config=None, keepalive=None,
                max_payload=DEFAULT_MAX_PAYLOAD, text_user=None):
    """Start a REAM text listener on ``host:port`` (0 = any free port) over ``broker``.

    ``config`` (a :mod:`riverbed.shells.config` Config), when given, supplies ``ream_keepalive``
    (seconds of client silence before a PING; None = off), ``ream_max_payload`` (bytes) and
    ``ream_user`` (the user connections act as when there is a users file: required then).
    Returns the started :class:`ReamServer`; stop it with ``await server.shutdown()``. Raises
    ConfigError for a users file without a REAM user, OSError when the address cannot be bound.
    """
    if config is not None:
        keepalive = getattr(config, "ream_keepalive", keepalive)
        max_payload = getattr(config, "ream_max_payload", max_payload)
        text_user = getattr(config, "ream_user", text_user)
    auth = broker.auth
    if not auth.open_to_loopback:
        if not text_user:
            raise ConfigError(f"the {REAM} listener needs --ream-user when a users file is given")
        if auth.user(text_user) is None:
            raise ConfigError(f"--ream-user {text_user!r} is not in the users file")
    server = ReamServer(broker, host=host, port=port, keepalive=keepalive, max_payload=max_payload,
                        text_user=text_user, ssl=_tls.context_for(config))   # with tls_cert: TLS-only
    return await server.start()
