"""``load``: rows of CSV or Parquet files become transactions, submitted through the
client API from the executors.

Each row fills the ``?`` of a SQL template from the columns named (in that order);
``rows_per_transaction`` consecutive rows go into one transaction (one statement each, at
most 1000). Every transaction gets an idempotency key made of ``key_prefix`` and the
index of its first row (``zipWithIndex``: stable for the same input files), so running
the same load again, after a failure half-way, submits only what is missing: the store
answers the rest from their keys. A store knows the keys submitted to it, not those
submitted to other DCs, so each transaction always goes to the same store (transactions
are dealt to the endpoints, sorted, by their first row): resume a load with the same
endpoints, in any order.

Each task (a slice of consecutive rows) submits its transactions to the DCs' stores in
batches of ``batch`` transactions per store, waiting out back-pressure: a refused
batch (RESOURCE_EXHAUSTED while the DC's incoming queue is full, UNAVAILABLE) is retried
with exponential backoff, up to ``RETRIES_MAX`` times. Progress is printed as tasks
finish; the result counts transactions created, already present, and refused (with the
first refusals' reasons).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import grpc
from pyspark.sql import DataFrame, SparkSession

from txsync.v1 import client_pb2, client_pb2_grpc, common_pb2
from txsync.worker.transactions import param_to_proto

Counts = tuple[int, int, int, int, str]
RETRIES_MAX = 40
BACKOFF_MAX_S = 5.0
STATEMENTS_MAX = 1000


@dataclass(frozen=True)
class LoadPlan:
    sql: str
    columns: tuple[str, ...]
    endpoints: tuple[str, ...]
    key_prefix: str
    rows_per_transaction: int = 1
    batch: int = 100
    token: str = ""


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
    metadata = (("authorization", f"Bearer {plan.token}"),) if plan.token else ()
    counts = [0, 0, 0, 0]
    errors: list[str] = []
    channels = [grpc.insecure_channel(endpoint) for endpoint in endpoints]
    stubs = [client_pb2_grpc.ClientServiceStub(channel) for channel in channels]
    pending: list[list[client_pb2.SubmitRequest]] = [[] for _ in endpoints]

    def flush(target: int) -> None:
        if not pending[target]:
            return
        request = client_pb2.SubmitBatchRequest(submits=pending[target])
        for result in _send(stubs[target], request, metadata):
            if result.HasField("accepted"):
                counts[0 if result.accepted.created else 1] += 1
            else:
                counts[2] += 1
                errors.append(result.error)
        pending[target].clear()

    statements: list[common_pb2.Statement] = []
    first_row = 0

    def close_transaction() -> None:
        if not statements:
            return
        # The transaction's store follows from its first row alone, so every run (however
        # the input is sliced) sends it to the same DC, which knows its key.
        target = (first_row // plan.rows_per_transaction) % len(endpoints)
        body = common_pb2.TxBody(statements=list(statements))
        key = f"{plan.key_prefix}:{first_row}"
        pending[target].append(client_pb2.SubmitRequest(body=body, idempotency_key=key))
        statements.clear()
        if len(pending[target]) >= plan.batch:
            flush(target)

    try:
        for position, row in rows:  # in position order: see load()
            if statements and position % plan.rows_per_transaction == 0:
                close_transaction()
            if not statements:
                first_row = position
            params = [param_to_proto(row[column]) for column in plan.columns]
            statements.append(common_pb2.Statement(sql=plan.sql, params=params))
            counts[3] += 1
        close_transaction()
        for target in range(len(endpoints)):
            flush(target)
    finally:
        for channel in channels:
            channel.close()
    yield counts[0], counts[1], counts[2], counts[3], errors[0] if errors else ""


def _send(
    stub: client_pb2_grpc.ClientServiceStub,
    request: client_pb2.SubmitBatchRequest,
    metadata: tuple[tuple[str, str], ...],
) -> list[client_pb2.SubmitResult]:
    """One batch, retried through back-pressure and brief unavailability."""
    pause_s = 0.1
    for attempt in range(RETRIES_MAX):
        try:
            answer = stub.SubmitBatch(request, timeout=30, metadata=metadata)
        except grpc.RpcError as error:
            code = error.code() if isinstance(error, grpc.Call) else None
            retryable = code in (grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.UNAVAILABLE)
            if not retryable or attempt == RETRIES_MAX - 1:
                raise
            time.sleep(pause_s)
            pause_s = min(pause_s * 2, BACKOFF_MAX_S)
            continue
        busy = [r for r in answer.results if r.error.startswith("RESOURCE_EXHAUSTED")]
        if not busy or attempt == RETRIES_MAX - 1:
            return list(answer.results)
        # Some submits of the batch met a full queue: send the batch again (the ones that
        # went in are answered from their idempotency keys).
        time.sleep(pause_s)
        pause_s = min(pause_s * 2, BACKOFF_MAX_S)
    raise AssertionError("unreachable")


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
