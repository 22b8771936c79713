"""``verify-replicas``: compare every table of every replica by primary key.

Each replica is a worker's database: a SQLite file, or a PostgreSQL database given by
its URI (``postgresql://...``), read with psycopg from the executors (no JDBC driver
needed). The work is split by table and by key range (SQLite rowid ranges, PostgreSQL
integer-key ranges or hash buckets of the key, ``RANGE_ROWS`` rows each), so executors
read the replicas in parallel and the driver only plans ranges and receives the
differences. Each row becomes ``(table, key, hash)`` where ``key`` is the primary key (or
rowid) as JSON and ``hash`` a SHA-256 over the row's values with their types; then every
replica is compared with the reference (the first) by ``(table, key)``: a row only the
reference has is *missing* from the other, one only the other has is *extra*, equal keys
with other hashes *differ*. All replicas are compared in one shuffle: a group-by on
``(table, key)`` puts every replica's hash of a key side by side.

Values are hashed in one canonical form so that a SQLite and a PostgreSQL replica of the
same cluster compare equal: booleans as integers, integral decimals as integers, other
decimals as floats, byte views as bytes, and anything else (dates, UUIDs, JSON) as text.
A PostgreSQL table without a primary key is compared as a multiset: each distinct row is
its own key and its count the hashed value.

Workers' own bookkeeping (``_txsync_*``) is left out: it records positions and digests,
not data.
"""

from __future__ import annotations

import hashlib
import json
import math
import sqlite3
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from decimal import Decimal
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


POSTGRES_SCHEMES = ("postgresql://", "postgres://")


def is_postgres(location: str) -> bool:
    return location.startswith(POSTGRES_SCHEMES)


@dataclass(frozen=True)
class Task:
    replica: str
    path: str
    """A SQLite file, or a PostgreSQL URI."""
    table: str
    key_columns: tuple[str, ...]
    low: int | None
    high: int | None
    """Key range [low, high] (SQLite: rowid; PostgreSQL: the integer key); None: the
    whole table, or a hash bucket."""
    bucket: int = 0
    buckets: int = 1
    """PostgreSQL keys without an integer range: rows whose key hashes to ``bucket``
    modulo ``buckets``."""


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


def plan(replicas: dict[str, str]) -> list[Task]:
    """Tasks covering every table of every replica by key range."""
    tasks = []
    for replica, path in sorted(replicas.items()):
        if is_postgres(path):
            tasks += _plan_postgres(replica, path)
            continue
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


def _canonical(value: Any) -> Any:
    """One form per value whichever backend returned it (see the module's docstring)."""
    if isinstance(value, bool):
        return int(value)
    if value is None or isinstance(value, int | float | str | bytes):
        return value
    if isinstance(value, Decimal):
        return int(value) if value == value.to_integral_value() else float(value)
    if isinstance(value, memoryview | bytearray):
        return bytes(value)
    return str(value)


def _key(values: tuple[Any, ...]) -> str:
    return json.dumps([_canonical(v) for v in values], default=repr)


def _hash(values: tuple[Any, ...]) -> str:
    sha = hashlib.sha256()
    for value in map(_canonical, values):
        sha.update(type(value).__name__.encode())
        sha.update(value if isinstance(value, bytes) else repr(value).encode())
        sha.update(b"\x00")
    return sha.hexdigest()


def read_task(task: Task) -> Iterator[tuple[str, str, str, str]]:
    """Run on an executor: ``(replica, table, key, hash)`` for each row of the range."""
    if is_postgres(task.path):
        yield from _read_postgres(task)
        return
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
            yield task.replica, task.table, _key(row[: len(keys)]), _hash(row[len(keys) :])


_INTEGER_TYPES = ("smallint", "integer", "bigint")


def _plan_postgres(replica: str, uri: str) -> list[Task]:
    """A task per integer-key range of ``RANGE_ROWS`` keys, or per hash bucket of about
    ``RANGE_ROWS`` rows when the key is not one integer column."""
    import psycopg  # noqa: PLC0415 - only PostgreSQL replicas need it
    from psycopg import sql  # noqa: PLC0415

    tasks = []
    with psycopg.connect(uri) as conn:
        tables = conn.execute(
            "SELECT c.relname, COALESCE(array_agg(a.attname ORDER BY k.n) "
            "  FILTER (WHERE a.attname IS NOT NULL), '{}'), "
            "  COALESCE(array_agg(format_type(a.atttypid, NULL) ORDER BY k.n) "
            "  FILTER (WHERE a.attname IS NOT NULL), '{}') "
            "FROM pg_class c JOIN pg_namespace s ON s.oid = c.relnamespace "
            "LEFT JOIN pg_index i ON i.indrelid = c.oid AND i.indisprimary "
            "LEFT JOIN LATERAL unnest(i.indkey) WITH ORDINALITY AS k(attnum, n) ON true "
            "LEFT JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum = k.attnum "
            "WHERE c.relkind IN ('r', 'p') AND s.nspname = current_schema() "
            "  AND c.relname NOT LIKE '\\_txsync\\_%' "
            "GROUP BY c.relname ORDER BY c.relname"
        ).fetchall()
        for table, keys, types in tables:
            name = sql.Identifier(table)
            if len(keys) == 1 and types[0] in _INTEGER_TYPES:
                low, high = conn.execute(
                    sql.SQL("SELECT min({k}), max({k}) FROM {t}").format(
                        k=sql.Identifier(keys[0]), t=name
                    )
                ).fetchone() or (None, None)
                if low is None:
                    continue
                for start in range(low, high + 1, RANGE_ROWS):
                    end = min(start + RANGE_ROWS - 1, high)
                    tasks.append(Task(replica, uri, table, tuple(keys), start, end))
                continue
            rows = conn.execute(sql.SQL("SELECT count(*) FROM {}").format(name)).fetchone()
            buckets = max(1, math.ceil((rows[0] if rows else 0) / RANGE_ROWS))
            for bucket in range(buckets):
                tasks.append(Task(replica, uri, table, tuple(keys), None, None, bucket, buckets))
    return tasks


def _read_postgres(task: Task) -> Iterator[tuple[str, str, str, str]]:
    import psycopg  # noqa: PLC0415 - only PostgreSQL replicas need it
    from psycopg import sql  # noqa: PLC0415

    table = sql.Identifier(task.table)
    with psycopg.connect(task.path) as conn:
        conn.read_only = True
        columns = [
            row[0]
            for row in conn.execute(
                "SELECT attname FROM pg_attribute WHERE attrelid = %s::regclass "
                "AND attnum > 0 AND NOT attisdropped ORDER BY attnum",
                (sql.Identifier(task.table).as_string(conn),),
            )
        ]
        listed = sql.SQL(", ").join(map(sql.Identifier, columns))
        if not task.key_columns:  # a multiset: each distinct row, and how many times
            query = sql.SQL("SELECT {c}, count(*) FROM {t} GROUP BY {c}").format(c=listed, t=table)
            bucket_of = sql.SQL("hashtext(ROW({c})::text)").format(c=listed)
        else:
            keys = sql.SQL(", ").join(map(sql.Identifier, task.key_columns))
            query = sql.SQL("SELECT {k}, {c} FROM {t}").format(k=keys, c=listed, t=table)
            bucket_of = sql.SQL("hashtext(ROW({k})::text)").format(k=keys)
        arguments: tuple[int, ...] = ()
        if task.low is not None and task.high is not None:
            query += sql.SQL(" WHERE {k} BETWEEN %s AND %s").format(
                k=sql.Identifier(task.key_columns[0])
            )
            arguments = (task.low, task.high)
        elif task.buckets > 1:
            where = sql.SQL(" WHERE ({b} & 2147483647) % %s = %s").format(b=bucket_of)
            if not task.key_columns:
                query = sql.SQL("SELECT {c}, count(*) FROM {t}").format(c=listed, t=table)
                query += where + sql.SQL(" GROUP BY {c}").format(c=listed)
            else:
                query += where
            arguments = (task.buckets, task.bucket)
        # A server-side cursor: a range's rows stream instead of sitting in memory.
        with conn.cursor(name=f"verify_{task.bucket}") as cursor:
            cursor.execute(query, arguments)
            for row in cursor:
                if task.key_columns:
                    n = len(task.key_columns)
                    yield task.replica, task.table, _key(row[:n]), _hash(row[n:])
                else:
                    yield task.replica, task.table, _key(row[:-1]), _hash(("count", row[-1]))


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


def verify_replicas(spark: SparkSession, replicas: Mapping[str, Path | str]) -> ReplicaReport:
    """Compare every replica (SQLite file or PostgreSQL URI) with the first by name."""
    tasks = plan({name: str(location) for name, location in replicas.items()})
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
