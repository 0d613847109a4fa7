"""The HTTP listener of ``riverbed serve`` (``--http-port``; aiohttp).

One aiohttp application serves every HTTP feature. Each feature is a module of this package with a
``setup(app)`` that adds its routes (see ``FEATURES`` in :mod:`.server`); today that is :mod:`.mgmt`,
the connection part of RabbitMQ's management API. Routes reach the broker through ``app[BROKER]`` and
authenticate with :func:`.auth.require_user` (HTTP basic auth against the broker's Authenticator).

Entry point: :func:`serve`, called by the CLI as ``await serve(broker, host=..., port=..., config=cfg)``.
"""

from riverbed.shells.http.server import BROKER, CONFIG, FEATURES, HttpServer, serve

__all__ = ["BROKER", "CONFIG", "FEATURES", "HttpServer", "serve"]
