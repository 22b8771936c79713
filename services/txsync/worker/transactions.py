"""What a worker applies, as plain values: the protobuf messages stop at the service's
edge (``service.py`` converts each request once), so the backends, the digest and their
tests speak Python.

A parameter keeps its protobuf kind as its Python type: no value is ``None``, and bool,
int, float, str and bytes stand for the bool, int, real, text and blob kinds. The digest
encodes by kind (``outcomes.encode_statement``), so a bool stays a bool here and becomes
an integer only when bound to a database (``Statement.bound``), as SQLite and PostgreSQL
both take it.
"""

from __future__ import annotations

from dataclasses import dataclass

from txsync.client.results import value_to_proto
from txsync.v1 import common_pb2

SqlParam = None | bool | int | float | str | bytes


@dataclass(frozen=True, slots=True)
class Statement:
    sql: str
    params: tuple[SqlParam, ...] = ()

    def bound(self) -> list[object]:
        """The parameters as the database drivers take them (a bool as 0 or 1)."""
        return [int(p) if isinstance(p, bool) else p for p in self.params]


@dataclass(frozen=True, slots=True)
class Transaction:
    statements: tuple[Statement, ...]
    idempotency_key: str = ""
    """The submit's key: the first transaction with a key in the agreed order runs, a
    later one with the same key is recorded as its duplicate (``KeyedApply``)."""
    now_unix_us: int = 0
    """The transaction's current time for SQL (``TxBody.now_unix_us``; 0: none)."""
    key_window_ms: int = 0
    """How long after ``key_taken_unix_ms`` its key is remembered, besides the positions
    (``TxBody.key_window_ms``, set by the store that took it; 0: positions only)..."""
    key_taken_unix_ms: int = 0
    """...and when that store took it (``backend.KeyWindow``)."""


def param_from_proto(value: common_pb2.SqlValue) -> SqlParam:
    kind = value.WhichOneof("value")
    if kind is None:
        return None
    param: SqlParam = getattr(value, kind)
    return param


def statement_from_proto(statement: common_pb2.Statement) -> Statement:
    return Statement(statement.sql, tuple(param_from_proto(p) for p in statement.params))


def transaction_from_proto(body: common_pb2.TxBody) -> Transaction:
    return Transaction(
        tuple(statement_from_proto(s) for s in body.statements),
        body.idempotency_key,
        body.now_unix_us,
        body.key_window_ms,
        body.key_taken_unix_ms,
    )


def param_to_proto(value: object) -> common_pb2.SqlValue:
    """A value read from a database, for an answer (a query's rows, a bulk load): as the
    client library sends a parameter, anything it has no kind for as text."""
    if value is None or isinstance(value, bool | int | float | str | bytes | bytearray):
        return value_to_proto(value)
    return value_to_proto(str(value))


def transaction_to_proto(transaction: Transaction) -> common_pb2.TxBody:
    return common_pb2.TxBody(
        statements=[
            common_pb2.Statement(sql=s.sql, params=[param_to_proto(p) for p in s.params])
            for s in transaction.statements
        ],
        idempotency_key=transaction.idempotency_key,
        now_unix_us=transaction.now_unix_us,
        key_window_ms=transaction.key_window_ms,
        key_taken_unix_ms=transaction.key_taken_unix_ms,
    )


def transaction(*statements: str | Statement) -> Transaction:
    """A transaction of ``statements`` (SQL text alone, or a ``Statement``): for tests,
    benchmarks and scripts that apply without a request."""
    return Transaction(tuple(s if isinstance(s, Statement) else Statement(s) for s in statements))
