"""The SparkSession every job uses, on the master it is given, else the one
``spark-submit`` was given, else ``local[*]``.

Run by ``spark-submit`` (``spark-submit --master spark://... txsync/pipeline/command.py
export ...``), the driver's Python talks to the JVM spark-submit started, whose
configuration holds ``--master`` and ``spark-defaults.conf``: the session then sets no
master of its own, since a value set in code would win over spark-submit's and run the
job in the driver alone. A ``--master`` given to the job itself still wins.
"""

from __future__ import annotations

import os
import sys

from pyspark.sql import SparkSession

LOCAL_MASTER = "local[*]"
"""This machine's cores: the master of a job run outside spark-submit with none given."""
SHUFFLE_PARTITIONS_LOCAL = 8
"""Spark's default of 200 shuffle partitions is made for clusters; on one machine a few
suffice and every tiny task would cost more than its work."""
_SUBMITTED = "PYSPARK_GATEWAY_PORT"
"""Set by spark-submit for the driver's Python (the JVM it is to use)."""


def submitted_by_spark_submit() -> bool:
    return _SUBMITTED in os.environ


def spark_session(master: str | None = None, app: str = "txsync-pipeline") -> SparkSession:
    builder = (
        SparkSession.builder.appName(app)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")  # jobs print their own progress
        .config("spark.sql.session.timeZone", "UTC")
    )
    if master or not submitted_by_spark_submit():
        master = master or LOCAL_MASTER
        builder = builder.master(master)
        if master.startswith("local"):
            # Executors' Python workers run this interpreter (the one with txsync
            # installed), not whatever `python3` is first on the PATH. On a cluster,
            # ship an environment (docs/pipeline.md) and set PYSPARK_PYTHON as usual.
            os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    session = builder.getOrCreate()
    context = session.sparkContext
    if (context.master or "").startswith("local") and not context.getConf().contains(
        "spark.sql.shuffle.partitions"
    ):
        session.conf.set("spark.sql.shuffle.partitions", SHUFFLE_PARTITIONS_LOCAL)
    return session
