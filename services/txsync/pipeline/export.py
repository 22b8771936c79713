"""``export``: DCs' txlogs -> Parquet datasets with explicit schemas.

Each DC's log is parsed by an executor, so many DCs (or many machines' copies) are read
in parallel; nothing is collected to the driver. A DC's log comes from its data
directory (``txlog_rows``) or, while it runs, from its transaction-store's admin API
(``admin_rows``: the log's stream and, only there, the coordinator's recent rounds).
Written under OUT: ``synced/`` (partitioned by dc), ``transactions/`` (by dc),
``transitions/`` (by dc and state), ``rounds/`` (by dc; empty when every log came from
files).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.types import (
    BooleanType,
    DoubleType,
    LongType,
    StringType,
    StructField,
    StructType,
)

from txsync.client.connection import Tls
from txsync.pipeline.admin_rows import rows_of_store
from txsync.pipeline.txlog_rows import Row, rows_of_dc
from txsync.pipeline.uris import joined

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
    "rounds": StructType([
        StructField("dc", StringType(), False),
        StructField("round_no", LongType(), False),
        StructField("started_unix_ms", LongType(), False),
        StructField("duration_ms", DoubleType(), False),
        StructField("posts_sent", LongType(), False),
        StructField("posts_received", LongType(), False),
        StructField("added", LongType(), False),
        StructField("empty", BooleanType(), False),
        StructField("idle", BooleanType(), False),
        StructField("outcome", StringType(), False),
    ]),
}  # fmt: skip
PARTITIONS = {
    "synced": ["dc"], "transactions": ["dc"], "transitions": ["dc", "state"], "rounds": ["dc"]
}  # fmt: skip


@dataclass(frozen=True)
class LogSource:
    """Where one DC's log is read: its data ``directory``, or else its transaction-store
    at ``store`` (HOST:PORT; the DC then names itself; ``dc``, when known, fills a TLS
    name template), with a bearer ``token`` and ``tls`` (PEM bytes, which travel to the
    executor with the source) when the cluster asks for them."""

    dc: str = ""
    directory: str = ""
    store: str = ""
    token: str = ""
    tls: Tls | None = None


def _parse(source: LogSource) -> Iterator[tuple[str, Row]]:
    if source.directory:
        yield from rows_of_dc(source.dc, Path(source.directory))
    else:
        yield from rows_of_store(source.store, source.token, source.tls, source.dc)


def read_txlogs(spark: SparkSession, dcs: dict[str, Path]) -> dict[str, DataFrame]:
    """The datasets of the given DCs' data directories (``{dc: data dir}``)."""
    return read_logs(spark, [LogSource(dc, directory=str(path)) for dc, path in dcs.items()])


def read_stores(spark: SparkSession, stores: list[str], token: str = "") -> dict[str, DataFrame]:
    """The datasets of running DCs, through their stores' admin API (rounds included)."""
    return read_logs(spark, [LogSource(store=address, token=token) for address in stores])


def read_logs(spark: SparkSession, sources: list[LogSource]) -> dict[str, DataFrame]:
    """Every dataset of ``sources``, one executor task per DC."""
    ordered = sorted(sources, key=lambda source: (source.dc, source.store))
    tagged = spark.sparkContext.parallelize(ordered, len(ordered)).flatMap(_parse).cache()
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


def export(spark: SparkSession, sources: list[LogSource], out: str | Path) -> dict[str, int]:
    """Write the datasets under ``out`` (a path or a URI: ``pipeline.uris``); returns
    the rows written per dataset."""
    counts = {}
    for name, frame in read_logs(spark, sources).items():
        frame.write.mode("overwrite").partitionBy(*PARTITIONS[name]).parquet(joined(out, name))
        counts[name] = frame.count()
    return counts
