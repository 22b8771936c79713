"""Applies positions 1..N of a fixed history to one SQLite worker database, resuming from
whatever the database records; the kill test SIGKILLs it at random moments.

    python tests/worker/apply_driver.py DB N
"""

from __future__ import annotations

import sys
from pathlib import Path

from txsync.v1 import common_pb2
from txsync.worker.sqlite_backend import SqliteBackend
from txsync.worker.transactions import (
    Statement,
    Transaction,
    transaction,
    transaction_to_proto,
)

SETUP = (
    "CREATE TABLE IF NOT EXISTS applied_log (position INTEGER PRIMARY KEY)",
    "CREATE TABLE IF NOT EXISTS counter (id INTEGER PRIMARY KEY, n INTEGER NOT NULL)",
    "INSERT INTO counter VALUES (1, 0)",  # portable SQL: PostgreSQL workers run it too
)


def request_body_at(position: int) -> common_pb2.TxBody:
    """``body_at`` as an ApplyRequest carries it."""
    return transaction_to_proto(body_at(position))


def body_at(position: int) -> Transaction:
    if position == 1:
        return transaction(*SETUP)
    return transaction(
        Statement("INSERT INTO applied_log VALUES (?)", (position,)),
        "UPDATE counter SET n = n + 1 WHERE id = 1",
    )


def main() -> None:
    path, count = Path(sys.argv[1]), int(sys.argv[2])
    backend = SqliteBackend(path)
    for position in range(backend.applied().position + 1, count + 1):
        outcome = backend.apply(position, f"tx-{position}", body_at(position))
        assert outcome.ok, outcome.error
        print(position, flush=True)


if __name__ == "__main__":
    main()
