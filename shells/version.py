"""Riverbed's own version, from one source: the installed package's metadata (``version`` in
pyproject.toml's ``[project]`` table). ``riverbed --version``, the RabbitMQ Stream server property
``riverbed-version``, the dashboard and ``GET /api/overview`` all read :data:`VERSION`."""

from importlib.metadata import PackageNotFoundError, version as _package_version

try:
    VERSION = _package_version("riverbed")
except PackageNotFoundError:  # pragma: no cover - a source tree that was never installed
    VERSION = "0+unknown"
