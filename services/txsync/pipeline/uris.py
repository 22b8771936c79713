"""Where the jobs' datasets are: a local path or a URI Spark's file systems read and
write (``file://``, ``s3a://``, ``hdfs://``...), never through ``pathlib``, which turns
``s3a://bucket/key`` into ``s3a:/bucket/key``.

What Spark reads and writes (Parquet exports, ``load``'s inputs, ``verify-replicas``'s
differences) takes either. What Python reads itself stays a local path: a DC's data
directory (``--dc``, ``--data``), which each executor reads at the same path, and the
report's HTML, which the driver writes.
"""

from __future__ import annotations

from pathlib import Path

from pyspark.sql import SparkSession


def joined(base: str | Path, name: str) -> str:
    """``base``/``name``, a path or a URI alike."""
    return f"{str(base).rstrip('/')}/{name}"


def exists(spark: SparkSession, location: str) -> bool:
    """Whether ``location`` (a path or a URI) exists, asked of Hadoop's file system for
    its scheme, as Spark would read it."""
    context = spark.sparkContext
    jvm = context._jvm
    assert jvm is not None, "a classic (not Connect) session"
    path = jvm.org.apache.hadoop.fs.Path(location)
    return bool(path.getFileSystem(context._jsc.hadoopConfiguration()).exists(path))
