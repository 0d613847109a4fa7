"""The cluster fixtures, importable by test folders other than tests/cluster (the Spark cluster tests):
a private etcd per test (etcdproc.py) and three ``riverbed serve`` nodes joined to it. Every process
started here is stopped at teardown."""

import contextlib
import shutil

import pytest

from clusterproc import Cluster
from etcdproc import EtcdProcess


@pytest.fixture
def etcd(tmp_path):
    """A running etcd of this test alone (Debian's etcd-server: ci/ensure-etcd.sh); skips without it."""
    if shutil.which("etcd") is None:
        pytest.skip("etcd is not installed (ci/ensure-etcd.sh installs Debian's etcd-server)")
    proc = EtcdProcess(tmp_path / "etcd").start()
    yield proc
    proc.stop()


@contextlib.contextmanager
def running_cluster(tmp_path, etcd, **kwargs):
    """A started :class:`Cluster` (``kwargs`` as its constructor's: ``n``, ``lease_ttl``, ``extra``,
    ``node_extra``) on ``etcd``; every node is stopped when the block ends, however it ends."""
    c = Cluster(tmp_path, etcd, **kwargs)
    try:
        c.start()
        yield c
    finally:
        c.stop()


@contextlib.contextmanager
def module_cluster(tmp_path_factory, name, **kwargs):
    """A private etcd and a started :class:`Cluster` (``kwargs`` as for :func:`running_cluster`) for a whole
    test module (a ``scope="module"`` fixture yields it); skips without etcd; everything stopped at the end."""
    if shutil.which("etcd") is None:
        pytest.skip("etcd is not installed (ci/ensure-etcd.sh installs Debian's etcd-server)")
    tmp = tmp_path_factory.mktemp(name)
    proc = EtcdProcess(tmp / "etcd").start()
    try:
        with running_cluster(tmp, proc, **kwargs) as c:
            yield c
    finally:
        proc.stop()


@pytest.fixture
def cluster3(tmp_path, etcd):
    """etcd and three nodes (lease TTL 1 s), all stopped at teardown."""
    with running_cluster(tmp_path, etcd) as c:
        yield c
