"""Cluster fixtures: a private etcd per test (etcdproc.py) and ``riverbed serve`` nodes joined to it.
Every process started here is stopped at teardown."""

import os
import shutil
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(__file__)), "integration"))

from clusterproc import Cluster  # noqa: E402
from etcdproc import EtcdProcess  # noqa: E402


@pytest.fixture
def etcd(tmp_path):
    """A running etcd of this test alone (Debian's etcd-server: ci/ensure-etcd.sh); skips without it."""
    if shutil.which("etcd") is None:
        pytest.skip("etcd is not installed (ci/ensure-etcd.sh installs Debian's etcd-server)")
    proc = EtcdProcess(tmp_path / "etcd").start()
    yield proc
    proc.stop()


@pytest.fixture
def cluster3(tmp_path, etcd):
    """etcd and three nodes (lease TTL 1 s), all stopped at teardown."""
    c = Cluster(tmp_path, etcd)
    try:
        c.start()
        yield c
    finally:
        c.stop()
