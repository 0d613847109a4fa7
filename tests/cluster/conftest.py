"""Cluster fixtures: a private etcd per test (etcdproc.py) and ``riverbed serve`` nodes joined to it.
Every process started here is stopped at teardown."""

import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(__file__)), "integration"))

from clusterfixtures import cluster3, etcd  # noqa: E402,F401  (fixtures)
