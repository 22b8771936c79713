"""``verify-replicas``: compare every table of every replica by primary key.

Each replica is a worker's SQLite database. The work is split by table and by key range
(rowid ranges of ``RANGE_ROWS``), so executors read the files in parallel and the driver
only plans ranges and receives the differences. Each row becomes ``(table, key, hash)``
where ``key`` is the primary key (or rowid) as JSON and ``hash`` a SHA-256 over the row's
values with their types; then every replica is compared with the reference (the first)
by ``(table, key)``: a row only the reference has is *missing* from the other, one only the
other has is *extra*, equal keys with other hashes *differ*. All replicas are compared in
one shuffle: a group-by on ``(table, key)`` puts every replica's hash of a key side by
side.

Workers' own bookkeeping (``_txsync_*``) is left out: it records positions and digests,
not data. (PostgreSQL workers: export them to SQLite, or read them with a JDBC source on
a cluster that has the driver; no JDBC driver can be fetched on these machines.)
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F  # noqa: N812 - Spark's usual name
from pyspark.sql.types import StringType, StructField, StructType

RANGE_ROWS = 200_000
"""Rows per task: small enough to spread a table over every core, large enough that a
task's start costs little beside its reading."""

ROW_SCHEMA = StructType([
    StructField("replica", StringType(), False),
    StructField("table", StringType(), False),
    StructField("key", StringType(), False),
    StructField("hash", StringType(), False),
])  # fmt: skip


@dataclass(frozen=True)
class Task:
    replica: str
    path: str
    table: str
    key_columns: tuple[str, ...]
    low: int | None
    high: int | None
    """Rowid range [low, high]; None: the whole table (WITHOUT ROWID tables)."""


def _connect(path: str) -> sqlite3.Connection:
    return sqlite3.connect(f"file:{path}?mode=ro", uri=True)


def user_tables(path: str) -> dict[str, tuple[str, ...]]:
    """Each user table and its primary key columns (empty: it has none; rowid is used)."""
    with _connect(path) as db:
        names = [
            row[0]
            for row in db.execute(
                "SELECT name FROM sqlite_schema WHERE type = 'table' "
                "AND name NOT LIKE 'sqlite_%' AND name NOT LIKE '\\_txsync\\_%' ESCAPE '\\'"
            )
        ]
        tables = {}
        for name in names:
            info = db.execute(f'PRAGMA table_info("{name}")').fetchall()
            keyed = sorted((row[5], row[1]) for row in info if row[5] > 0)
            tables[name] = tuple(column for _, column in keyed)
        return tables


def plan(replicas: dict[str, Path]) -> list[Task]:
    """Tasks covering every table of every replica by rowid range."""
    tasks = []
    for replica, path in sorted(replicas.items()):
        with _connect(str(path)) as db:
            for table, keys in user_tables(str(path)).items():
                try:
                    low, high = db.execute(
                        f'SELECT min(rowid), max(rowid) FROM "{table}"'
                    ).fetchone()
                except sqlite3.OperationalError:  # WITHOUT ROWID: one task for the table
                    tasks.append(Task(replica, str(path), table, keys, None, None))
                    continue
                if low is None:
                    continue
                for start in range(low, high + 1, RANGE_ROWS):
                    end = min(start + RANGE_ROWS - 1, high)
                    tasks.append(Task(replica, str(path), table, keys, start, end))
    return tasks


def _hash(values: tuple[Any, ...]) -> str:
    sha = hashlib.sha256()
    for value in values:
        sha.update(type(value).__name__.encode())
        sha.update(value if isinstance(value, bytes) else repr(value).encode())
        sha.update(b"\x00")
    return sha.hexdigest()


def read_task(task: Task) -> Iterator[tuple[str, str, str, str]]:
    """Run on an executor: ``(replica, table, key, hash)`` for each row of the range."""
    with _connect(task.path) as db:
        columns = [row[1] for row in db.execute(f'PRAGMA table_info("{task.table}")')]
        keys = list(task.key_columns) or ["rowid"]
        selected = ", ".join(f'"{c}"' for c in keys) + ", " + ", ".join(f'"{c}"' for c in columns)
        query = f'SELECT {selected} FROM "{task.table}"'
        arguments: tuple[int, ...] = ()
        if task.low is not None and task.high is not None:
            query += " WHERE rowid BETWEEN ? AND ?"
            arguments = (task.low, task.high)
        for row in db.execute(query, arguments):
            key = json.dumps(list(row[: len(keys)]), default=repr)
            yield task.replica, task.table, key, _hash(tuple(row[len(keys) :]))


@dataclass(frozen=True)
class ReplicaReport:
    reference: str
    rows: dict[str, int]
    """Rows read per replica."""
    differences: DataFrame
    """``(replica, table, key, kind)``: kind missing, extra or differs (vs the reference)."""
    counts: dict[tuple[str, str, str], int]
    """(replica, table, kind) -> how many."""

    @property
    def equal(self) -> bool:
        return not self.counts


def verify_replicas(spark: SparkSession, replicas: dict[str, Path]) -> ReplicaReport:
    tasks = plan(replicas)
    slices = max(1, len(tasks))
    rows = spark.createDataFrame(
        spark.sparkContext.parallelize(tasks, slices).flatMap(read_task), ROW_SCHEMA
    ).cache()
    reference, *others = sorted(replicas)
    # One shuffle for all replicas: every key's hash in each replica, side by side.
    hashes = rows.groupBy("table", "key").agg(
        F.map_from_entries(F.collect_list(F.struct("replica", "hash"))).alias("hashes")
    )
    expected = F.col("hashes")[reference]

    def kind(replica: str) -> Column:
        found = F.col("hashes")[replica]
        return (
            F.when(found.isNull() & expected.isNotNull(), "missing")
            .when(expected.isNull() & found.isNotNull(), "extra")
            .when(found != expected, "differs")
        )

    compared = F.array(
        *(F.struct(F.lit(r).alias("replica"), kind(r).alias("kind")) for r in others)
    )
    differences = (
        hashes.select("table", "key", F.explode(compared).alias("d"))
        .select(F.col("d.replica").alias("replica"), "table", "key", F.col("d.kind").alias("kind"))
        .filter(F.col("kind").isNotNull())
    )
    differences = differences.cache()
    counts = {
        (row["replica"], row["table"], row["kind"]): int(row["count"])
        for row in differences.groupBy("replica", "table", "kind").count().collect()
    }
    read = {row["replica"]: int(row["count"]) for row in rows.groupBy("replica").count().collect()}
    return ReplicaReport(reference, read, differences, counts)


def replicas_of_cluster(data: Path) -> dict[str, Path]:
    """Every worker database of a `txsync dev up` data directory, as ``dc/worker``."""
    found = {}
    for database in sorted(data.glob("*/*/worker.sqlite")):
        found[f"{database.parent.parent.name}/{database.parent.name}"] = database
    return found
