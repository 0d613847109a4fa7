"""Riverbed streams in Spark: the ``riverbed`` PySpark data source (batch, remote and streaming reads)
and the ``riverbed spark-load`` bulk-load command.

    from riverbed.spark import RiverbedDataSource
    spark.dataSource.register(RiverbedDataSource)
    df = spark.read.format("riverbed").option("path", DATA_DIR).option("stream", "orders").load()

Needs the ``spark`` extra (pyspark 4, pyarrow). Options and columns: :mod:`riverbed.spark.source`.
"""

from riverbed.spark.source import RiverbedDataSource

__all__ = ["RiverbedDataSource"]
