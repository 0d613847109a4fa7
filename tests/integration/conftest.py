"""Fixtures that run the real ``riverbed serve`` (a subprocess on 127.0.0.1, port 0, temp data dir).

Every process started here is stopped at teardown. The server's port is read from its
``listening stream HOST:PORT`` log line.
"""

import os
import shutil
import subprocess
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))   # for procs and rawwire (--import-mode=importlib)

from procs import ServerProcess  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """One broker per test module, guest/guest from loopback, small handshake timeout."""
    srv = ServerProcess(tmp_path_factory.mktemp("rmq") / "data", "--handshake-timeout", "3").start()
    yield srv
    code = srv.stop()
    assert code == 0, srv.log()


@pytest.fixture(scope="module")
def kafka_server(request, tmp_path_factory):
    """One broker with its Kafka listener per test module; the module's ``KAFKA_SERVER_ARGS`` (a
    tuple of flags, default none) turns on more listeners."""
    srv = ServerProcess(tmp_path_factory.mktemp("kafka") / "data", "--kafka-port", "0",
                        *getattr(request.module, "KAFKA_SERVER_ARGS", ())).start()
    yield srv
    assert srv.stop() == 0, srv.log()


@pytest.fixture(scope="module")
def bootstrap(kafka_server):
    """``host:port`` of ``kafka_server``'s Kafka listener, as clients' bootstrap servers."""
    return f"127.0.0.1:{kafka_server.ports['kafka']}"


@pytest.fixture
def fresh_server(tmp_path):
    """A broker of its own for tests that kill or restart it."""
    srv = ServerProcess(tmp_path / "data")
    yield srv
    srv.kill()


@pytest.fixture(scope="module")
def node_modules():
    """The node_modules folder with streamr-client@0.12.2 and ws (ci/npm-test-deps.sh installs them
    into ~/.cache/riverbed-test once); skips when node or npm is missing."""
    if shutil.which("node") is None or shutil.which("npm") is None:
        pytest.skip("node/npm not installed")
    out = subprocess.run([os.path.join(ROOT, "ci", "npm-test-deps.sh")], capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip().splitlines()[-1]
