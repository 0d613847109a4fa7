"""HTTP basic authentication against the broker's users (the same Authenticator as every listener).

Without a users file every listener serves loopback clients without credentials (DESIGN.md, "Auth"):
a loopback request with no ``Authorization`` header acts as guest, so a browser opening the dashboard
sees it at once; guest/guest is still accepted from loopback, and other peers are refused. With a
users file, its users and passwords. A route calls ``user = await require_user(request)``; a missing
(where one is needed), malformed or wrong ``Authorization`` header, an unknown user, or a
loopback-only user from elsewhere gets 401 with ``WWW-Authenticate: Basic``.

Administrators: the management API has no user tags, so a user is an administrator when its
``configure`` permission covers every name (the pattern is ``.*``, optionally anchored: ``^.*``,
``.*$``, ``^.*$``). That is what ``riverbed users add`` grants by default, and the built-in guest has
it, as RabbitMQ's guest is an administrator.
"""

import asyncio

from aiohttp import BasicAuth, hdrs, web

from riverbed.shells import auth as _auth
from riverbed.shells.http.server import BROKER, json_error

REALM = "Riverbed"
EVERYTHING = frozenset({".*", "^.*", ".*$", "^.*$"})


def _unauthorized(reason):
    return json_error(web.HTTPUnauthorized, "not_authorized", reason,
                      headers={hdrs.WWW_AUTHENTICATE: f'Basic realm="{REALM}"'})


async def require_user(request):
    """The authenticated :class:`riverbed.shells.auth.User` of ``request``; raises 401 otherwise.

    Password hashes are checked off the loop thread (scrypt costs tens of milliseconds the first time;
    the Authenticator remembers successes)."""
    header = request.headers.get(hdrs.AUTHORIZATION)
    if not header:
        # no users file and a loopback peer: guest, as on every other listener; else a login
        user = request.app[BROKER].auth.implicit_user(_auth.is_loopback(request.remote or ""))
        if user is not None:
            return user
        raise _unauthorized("Login required")
    try:
        creds = BasicAuth.decode(header)
    except ValueError:
        raise _unauthorized("Malformed credentials") from None
    loopback = _auth.is_loopback(request.remote or "")
    authenticator = request.app[BROKER].auth
    result = await asyncio.get_running_loop().run_in_executor(
        None, authenticator.check_password, creds.login, creds.password, loopback)
    if result.outcome == _auth.LOOPBACK_ONLY:
        raise _unauthorized("User can only log in via localhost")
    if result.outcome != _auth.OK or result.user is None:
        raise _unauthorized("Login failed")
    return result.user


def is_admin(user):
    """Whether ``user`` may see and close every connection (its ``configure`` pattern covers every
    name; see the module docstring)."""
    pattern = user.patterns.get("configure")
    return pattern is not None and pattern.pattern in EVERYTHING
