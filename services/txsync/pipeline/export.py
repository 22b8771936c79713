"""``export``: DCs' txlogs -> Parquet datasets with explicit schemas.

Each DC's log is parsed by an executor (``txlog_rows``), so many DCs (or many machines'
copies) are read in parallel; nothing is collected to the driver. Written under OUT:
``synced/`` (partitioned by dc), ``transactions/`` (by dc), ``transitions/`` (by dc and
state).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.types import (
    BooleanType,
    LongType,
    StringType,
    StructField,
    StructType,
)

from txsync.pipeline.txlog_rows import Row, rows_of_dc

SCHEMAS = {
    "synced": StructType([
        StructField("dc", StringType(), False),
        StructField("position", LongType(), False),
        StructField("tx_id", StringType(), False),
        StructField("origin", StringType(), False),
        StructField("ts", LongType(), False),
    ]),
    "transactions": StructType([
        StructField("dc", StringType(), False),
        StructField("tx_id", StringType(), False),
        StructField("origin", StringType(), False),
        StructField("ts", LongType(), False),
        StructField("local", BooleanType(), False),
        StructField("body_bytes", LongType(), False),
    ]),
    "transitions": StructType([
        StructField("dc", StringType(), False),
        StructField("tx_id", StringType(), False),
        StructField("state", StringType(), False),
        StructField("at_unix_ms", LongType(), False),
        StructField("service", StringType(), False),
    ]),
}  # fmt: skip
PARTITIONS = {"synced": ["dc"], "transactions": ["dc"], "transitions": ["dc", "state"]}


def _parse(dc_dir: tuple[str, str]) -> Iterator[tuple[str, Row]]:
    dc, path = dc_dir
    yield from rows_of_dc(dc, Path(path))


def read_txlogs(spark: SparkSession, dcs: dict[str, Path]) -> dict[str, DataFrame]:
    """The three datasets of the given DCs' data directories (``{dc: data dir}``)."""
    sources = sorted((dc, str(path)) for dc, path in dcs.items())
    tagged = spark.sparkContext.parallelize(sources, len(sources)).flatMap(_parse).cache()
    return {
        name: spark.createDataFrame(tagged.filter(_tagged(name)).map(_untagged), schema)
        for name, schema in SCHEMAS.items()
    }


def _tagged(name: str) -> Callable[[tuple[str, Row]], bool]:
    def test(row: tuple[str, Row]) -> bool:
        return row[0] == name

    return test


def _untagged(row: tuple[str, Row]) -> Row:
    return row[1]


def export(spark: SparkSession, dcs: dict[str, Path], out: Path) -> dict[str, int]:
    """Write the datasets under ``out``; returns the rows written per dataset."""
    counts = {}
    for name, frame in read_txlogs(spark, dcs).items():
        frame.write.mode("overwrite").partitionBy(*PARTITIONS[name]).parquet(str(out / name))
        counts[name] = frame.count()
    return counts
