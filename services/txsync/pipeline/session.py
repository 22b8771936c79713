"""The SparkSession every job uses: ``local[*]`` unless told otherwise."""

from __future__ import annotations

import os
import sys

from pyspark.sql import SparkSession

SHUFFLE_PARTITIONS_LOCAL = 8
"""Spark's default of 200 shuffle partitions is made for clusters; on one machine a few
suffice and every tiny task would cost more than its work."""


def spark_session(master: str = "local[*]", app: str = "txsync-pipeline") -> SparkSession:
    builder = (
        SparkSession.builder.master(master)
        .appName(app)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")  # jobs print their own progress
        .config("spark.sql.session.timeZone", "UTC")
    )
    if master.startswith("local"):
        # Executors' Python workers run this interpreter (the one with txsync installed),
        # not whatever `python3` is first on the PATH. On a cluster, install txsync there
        # (or ship it with --py-files) and set PYSPARK_PYTHON as usual.
        builder = builder.config("spark.sql.shuffle.partitions", SHUFFLE_PARTITIONS_LOCAL)
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    return builder.getOrCreate()
