"""``load``: rows of CSV or Parquet files become transactions, submitted through the
client library (``txsync.client``) from the executors.

Each row fills the ``?`` of a SQL template from the columns named (in that order);
``rows_per_transaction`` consecutive rows go into one transaction (one statement each, at
most 1000). Every transaction gets an idempotency key made of ``key_prefix`` (by
default from the input files' names, sizes and times: ``default_key_prefix``) and the
index of its first row (``zipWithIndex``: stable for the same input files), so running
the same load again, after a failure half-way, applies only what is missing: the rest
are answered from their keys by the store that took them, or, sent to another DC, are
ordered but run nothing (keys count across the cluster, docs/client.md). Transactions are
dealt to the endpoints by their first row, so a rerun with the same endpoints sends each
to the same DC again and is answered at once.

Each task (a slice of consecutive rows) hands its transactions to one client per
endpoint ``batch`` at a time; the library gathers them into ``SubmitBatch`` calls, waits
out back-pressure and fails over to another DC when one does not answer, each
transaction within ``SUBMIT_TIMEOUT_S``. Progress is printed as tasks finish; the result
counts transactions created, already present, and refused (with the first refusals'
reasons).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from pyspark.sql import DataFrame, SparkSession

from txsync.client import Client, Statement, Submitted, Tls
from txsync.client.results import SqlValue

Counts = tuple[int, int, int, int, str]
SUBMIT_TIMEOUT_S = 600.0
"""A transaction's whole deadline, back-pressure and failovers included."""
STATEMENTS_MAX = 1000


KEY_PREFIX_HEX = 16
"""Hex digits of the inputs' digest in a default key prefix (``default_key_prefix``)."""


def default_key_prefix(spark: SparkSession, frame: DataFrame) -> str:
    """``load-`` and 16 hex digits of SHA-256 over every input file's URI, size and
    modification time, through Hadoop's file systems (``file://``, ``s3a://``,
    ``hdfs://`` alike): the same unchanged input resumes, and a file rewritten at the
    same path (a daily export) is a new load. Keys stay short, however many and long
    the paths: ``load-1f0c...:ROW``."""
    context = spark.sparkContext
    jvm, hadoop = context._jvm, context._jsc.hadoopConfiguration()
    assert jvm is not None, "a classic (not Connect) session"
    described = []
    for uri in sorted(frame.inputFiles()):
        path = jvm.org.apache.hadoop.fs.Path(uri)
        status = path.getFileSystem(hadoop).getFileStatus(path)
        described.append(f"{uri}\0{status.getLen()}\0{status.getModificationTime()}")
    digest = hashlib.sha256("\n".join(described).encode()).hexdigest()
    return f"load-{digest[:KEY_PREFIX_HEX]}"


@dataclass(frozen=True)
class LoadPlan:
    sql: str
    columns: tuple[str, ...]
    endpoints: tuple[str, ...]
    key_prefix: str
    rows_per_transaction: int = 1
    batch: int = 100
    token: str = ""
    tls: Tls | None = None
    """TLS to the stores, its PEM as bytes: the plan travels to the executors, which
    need not hold the driver's files (None: as ``Client`` finds it there)."""


@dataclass
class LoadResult:
    created: int = 0
    existing: int = 0
    refused: int = 0
    rows: int = 0
    errors: list[str] = field(default_factory=list)


def _submit_slice(plan: LoadPlan, rows: Iterable[tuple[int, Any]]) -> Iterator[Counts]:
    """Run on an executor: ``(created, existing, refused, rows, first error)``."""
    endpoints = sorted(plan.endpoints)
    counts = [0, 0, 0, 0]
    errors: list[str] = []
    clients = [
        # Preferred by address: an endpoint may name its DC (dc1=HOST:PORT) for TLS.
        Client(endpoints, dc=endpoint.rpartition("=")[2], token=plan.token, tls=plan.tls,
               timeout=SUBMIT_TIMEOUT_S,
               batch_max=max(1, min(plan.batch, 1_000)))
        for endpoint in endpoints
    ]  # fmt: skip
    pending: list[tuple[list[list[Statement]], list[str]]] = [([], []) for _ in endpoints]

    def flush(target: int) -> None:
        transactions, keys = pending[target]
        if not transactions:
            return
        answers = clients[target].submit_many(
            transactions, keys=keys, wait=None, raise_errors=False
        )
        for answer in answers:
            if isinstance(answer, Submitted):
                counts[0 if answer.created else 1] += 1
            else:
                counts[2] += 1
                errors.append(str(answer))
        transactions.clear()
        keys.clear()

    statements: list[Statement] = []
    first_row = 0

    def close_transaction() -> None:
        if not statements:
            return
        # The transaction's DC follows from its first row alone, so every run (however
        # the input is sliced) sends it to the same DC, which answers it from its key.
        target = (first_row // plan.rows_per_transaction) % len(endpoints)
        pending[target][0].append(list(statements))
        pending[target][1].append(f"{plan.key_prefix}:{first_row}")
        statements.clear()
        if len(pending[target][0]) >= plan.batch:
            flush(target)

    try:
        for position, row in rows:  # in position order: see load()
            if statements and position % plan.rows_per_transaction == 0:
                close_transaction()
            if not statements:
                first_row = position
            statements.append(Statement(plan.sql, tuple(_plain(row[c]) for c in plan.columns)))
            counts[3] += 1
        close_transaction()
        for target in range(len(endpoints)):
            flush(target)
    finally:
        for client in clients:
            client.close()
    yield counts[0], counts[1], counts[2], counts[3], errors[0] if errors else ""


def _plain(value: object) -> SqlValue:
    """A column's value as a statement takes it: dates, decimals and the like as text."""
    if value is None or isinstance(value, bool | int | float | str | bytes):
        return value
    if isinstance(value, bytearray):
        return bytes(value)
    return str(value)


def load(
    spark: SparkSession, frame: DataFrame, plan: LoadPlan, slice_rows: int = 20_000
) -> LoadResult:
    """Submit every row of ``frame``; ``slice_rows`` rows per task."""
    missing = [c for c in plan.columns if c not in frame.columns]
    if missing:
        raise ValueError(f"no column {', '.join(missing)} in the input ({frame.columns})")
    if not 1 <= plan.rows_per_transaction <= STATEMENTS_MAX:
        raise ValueError(f"rows per transaction must be 1..{STATEMENTS_MAX}")
    total = frame.count()
    slices = max(1, -(-total // slice_rows))
    # Slices start at a transaction boundary, so keys do not depend on the slicing.
    per_slice = -(-slice_rows // plan.rows_per_transaction) * plan.rows_per_transaction
    # (position, row), each slice holding consecutive positions in order: a transaction's
    # rows are together, and its key is the same however the input was read.
    sliced = (
        frame.rdd.zipWithIndex()
        .map(lambda pair: (pair[1], pair[0]))
        .repartitionAndSortWithinPartitions(slices, lambda position: position // per_slice)
    )
    result = LoadResult()
    for created, existing, refused, rows, error in sliced.mapPartitions(
        lambda rows: _submit_slice(plan, rows)
    ).toLocalIterator():
        result.created += created
        result.existing += existing
        result.refused += refused
        result.rows += rows
        if error and len(result.errors) < 5:
            result.errors.append(error)
        print(f"  {result.rows:,}/{total:,} rows submitted", flush=True)
    return result
