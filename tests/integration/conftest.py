"""Fixtures that run the real ``riverbed serve`` (a subprocess on 127.0.0.1, port 0, temp data dir).

Every process started here is stopped at teardown. The server's port is read from its
``listening rabbitmq-stream HOST:PORT`` log line.
"""

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))   # for procs and rawwire (--import-mode=importlib)

from procs import ServerProcess  # noqa: E402


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """One broker per test module, guest/guest from loopback, small handshake timeout."""
    srv = ServerProcess(tmp_path_factory.mktemp("rmq") / "data", "--handshake-timeout", "3").start()
    yield srv
    code = srv.stop()
    assert code == 0, srv.log()


@pytest.fixture
def fresh_server(tmp_path):
    """A broker of its own for tests that kill or restart it."""
    srv = ServerProcess(tmp_path / "data")
    yield srv
    srv.kill()
