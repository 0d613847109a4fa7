"""One local[2] SparkSession for every Spark test (a session takes ~15 s to start on this machine).

The session binds to 127.0.0.1, runs its Python workers with this interpreter, has no UI and 2 shuffle
partitions. Tests that change a SQL conf restore it (``spark_conf``).
"""

import contextlib
import os
import sys

import pytest

pytest.importorskip("pyspark")
pytest.importorskip("pyarrow")


@pytest.fixture(scope="session")
def spark():
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    from riverbed.spark import RiverbedDataSource

    session = (SparkSession.builder.master("local[2]").appName("riverbed-tests")
               .config("spark.ui.enabled", "false")
               .config("spark.sql.shuffle.partitions", "2")
               .config("spark.default.parallelism", "2")
               .config("spark.driver.host", "127.0.0.1")
               .config("spark.driver.bindAddress", "127.0.0.1")
               .config("spark.sql.session.timeZone", "UTC")
               .getOrCreate())
    session.sparkContext.setLogLevel("ERROR")
    session.dataSource.register(RiverbedDataSource)
    yield session
    session.stop()


@pytest.fixture
def spark_conf(spark):
    """``with spark_conf({key: value}): ...`` sets SQL confs for the block and restores them after."""
    @contextlib.contextmanager
    def setter(confs):
        old = {k: spark.conf.get(k, None) for k in confs}
        for k, v in confs.items():
            spark.conf.set(k, v)
        try:
            yield
        finally:
            for k, v in old.items():
                if v is None:
                    spark.conf.unset(k)
                else:
                    spark.conf.set(k, v)
    return setter
