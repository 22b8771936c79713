"""PEP 249 (DB-API 2.0) over the TxSync client: for code that speaks DB-API.

    import txsync.dbapi

    connection = txsync.dbapi.connect("data/cluster.json")
    cursor = connection.cursor()
    cursor.execute("INSERT INTO t (k, v) VALUES (?, ?)", (1, "one"))
    cursor.executemany("INSERT INTO t (k, v) VALUES (?, ?)", [(2, "two"), (3, "three")])
    connection.commit()  # one transaction of the three statements, applied ("ok")
    cursor.execute("SELECT v FROM t ORDER BY k")
    cursor.fetchall()  # [('one',), ('two',), ('three',)]: reads see what was committed

How TxSync shapes it (docs/client.md, "DB-API"):

- **Writes wait for ``commit()``.** TxSync applies a transaction's statements together,
  in the agreed order, at every worker of every DC; nothing of it exists before. So
  ``execute`` of a write only collects the statement; ``commit()`` submits all of them
  as one transaction and waits until it is applied (``rowcount`` of each write is known
  then); ``rollback()`` drops them. A read inside the transaction does not see its own
  uncommitted writes.
- **Reads run at once**, on a worker of the DC in use, never older than what this
  connection has seen (session consistency), so a read after ``commit()`` sees it.
- **A failed commit** raises the PEP's error class for the database's error
  (``IntegrityError`` for a UNIQUE constraint, on SQLite and PostgreSQL workers alike);
  the transaction is FAILED everywhere and changed nothing. A commit that could not be
  confirmed (``OperationalError`` from ``Unavailable``, ``Timeout``, ``Backpressure``)
  keeps its statements and idempotency key: calling ``commit()`` again is safe.
- **Types**: ``None``, ``bool``, ``int``, ``float``, ``str``, ``bytes`` as they are;
  ``datetime`` as ISO 8601 text (``YYYY-MM-DD HH:MM:SS[.ffffff]``; an aware one in UTC),
  ``date`` and ``time`` likewise, ``Decimal`` and ``UUID`` as their text, ``dict`` and
  ``list`` as JSON text. The same text reaches SQLite and PostgreSQL workers, so every
  replica stores the same; reads return what the database returns (text on SQLite).
"""

from __future__ import annotations

import datetime as dt
import json
import re
import uuid
from collections.abc import Iterator, Mapping, Sequence
from decimal import Decimal
from typing import Any

from txsync.client import (
    AccessDenied,
    Backpressure,
    Client,
    InvalidRequest,
    KeyConflict,
    Statement,
    Timeout,
    TransactionFailed,
    TxSyncError,
    Unavailable,
)
from txsync.client.results import SqlValue

apilevel = "2.0"
threadsafety = 1
"""Threads may share the module, not connections."""
paramstyle = "qmark"

STATEMENTS_MAX = 1_000
"""Statements in one transaction (what a DC takes)."""
ROWS_MAX = 10_000
"""Rows one read returns (what a worker answers); a read with more raises, it never
silently drops rows."""


class Warning(Exception):
    pass


class Error(Exception):
    """Every error of this module. ``tx_id`` and ``key`` name the transaction, when one
    was submitted."""

    tx_id: str = ""
    key: str = ""


class InterfaceError(Error):
    pass


class DatabaseError(Error):
    pass


class DataError(DatabaseError):
    pass


class OperationalError(DatabaseError):
    pass


class IntegrityError(DatabaseError):
    pass


class InternalError(DatabaseError):
    pass


class ProgrammingError(DatabaseError):
    pass


class NotSupportedError(DatabaseError):
    pass


_DATABASE_CLASSES: dict[str, type[DatabaseError]] = {
    # SQLite (sqlite3's names) and PostgreSQL (psycopg's SQLSTATE classes), as the
    # workers report them ("Name: message").
    "IntegrityError": IntegrityError, "UniqueViolation": IntegrityError,
    "ForeignKeyViolation": IntegrityError, "NotNullViolation": IntegrityError,
    "CheckViolation": IntegrityError, "ExclusionViolation": IntegrityError,
    "RestrictViolation": IntegrityError,
    "DataError": DataError, "NumericValueOutOfRange": DataError,
    "InvalidTextRepresentation": DataError, "DivisionByZero": DataError,
    "StringDataRightTruncation": DataError, "InvalidDatetimeFormat": DataError,
    "DatetimeFieldOverflow": DataError,
    "ProgrammingError": ProgrammingError, "SyntaxError": ProgrammingError,
    "UndefinedTable": ProgrammingError, "UndefinedColumn": ProgrammingError,
    "UndefinedFunction": ProgrammingError, "DuplicateTable": ProgrammingError,
    "DuplicateColumn": ProgrammingError,
    "OperationalError": OperationalError, "QueryCanceled": OperationalError,
    "NotSupportedError": NotSupportedError, "FeatureNotSupported": NotSupportedError,
    "InternalError": InternalError,
}  # fmt: skip


_SQLITE_PROGRAMMING = re.compile(
    r"^(no such (table|column|function)|.* has no column named|.*syntax error|"
    r"(table|index|view|trigger) .* already exists)",
    re.IGNORECASE,
)
"""SQLite's OperationalErrors that PostgreSQL reports as ProgrammingErrors (an unknown
table, a syntax error...): the same class from either worker."""


def database_error_class(error: str) -> type[DatabaseError]:
    """The PEP 249 class for a worker's error text ("UniqueViolation: duplicate key ...",
    "IntegrityError: UNIQUE constraint failed: ..."); ``DatabaseError`` if unknown."""
    name, _, message = error.partition(":")
    kind = _DATABASE_CLASSES.get(name.strip(), DatabaseError)
    if kind is OperationalError and _SQLITE_PROGRAMMING.match(message.strip()):
        return ProgrammingError
    return kind


def _translated(error: TxSyncError) -> Error:
    """The PEP 249 error for a client error, with its transaction and key."""
    kind: type[Error]
    if isinstance(error, TransactionFailed):
        kind = database_error_class(error.error)
    elif isinstance(error, InvalidRequest | KeyConflict):
        kind = ProgrammingError
    elif isinstance(error, Unavailable | Timeout | Backpressure | AccessDenied):
        kind = OperationalError
    else:
        kind = DatabaseError
    translated = kind(str(error))
    translated.tx_id, translated.key = error.tx_id, error.key
    return translated


def adapt(value: object) -> SqlValue:
    """A parameter as the client sends it (module docstring, "Types")."""
    if value is None or isinstance(value, bool | int | float | str | bytes):
        return value
    if isinstance(value, bytearray | memoryview):
        return bytes(value)
    if isinstance(value, dt.datetime):
        if value.tzinfo is not None:
            value = value.astimezone(dt.UTC).replace(tzinfo=None)
        return value.isoformat(sep=" ")
    if isinstance(value, dt.date | dt.time):
        return value.isoformat()
    if isinstance(value, Decimal | uuid.UUID):
        return str(value)
    if isinstance(value, Mapping | list):
        return json.dumps(value, separators=(",", ":"), default=str)
    raise ProgrammingError(f"parameters of type {type(value).__name__} are not supported")


_READ_FIRST_WORDS = frozenset({"SELECT", "VALUES", "EXPLAIN"})
_WRITE_WORDS = re.compile(r"\b(INSERT|UPDATE|DELETE|REPLACE|UPSERT|MERGE)\b", re.IGNORECASE)
_QUOTED = re.compile(r"'(?:[^']|'')*'|\"(?:[^\"]|\"\")*\"|--[^\n]*|/\*.*?\*/", re.DOTALL)


def is_read(sql: str) -> bool:
    """Whether ``sql`` only reads: SELECT, VALUES, EXPLAIN, or a WITH whose body writes
    nothing (strings, quoted names and comments ignored)."""
    bare = _QUOTED.sub(" ", sql).strip().lstrip("(").lstrip()
    first = bare.split(None, 1)[0].upper() if bare else ""
    if first == "WITH":
        return _WRITE_WORDS.search(bare) is None
    return first in _READ_FIRST_WORDS


class Connection:
    """One DB-API connection: a ``txsync.client.Client`` and the statements of the
    transaction being built."""

    def __init__(self, client: Client, *, commit_timeout: float | None = None) -> None:
        self._client: Client | None = client
        self._pending: list[Statement] = []
        self._pending_cursors: list[tuple[Cursor, int]] = []
        self._key: str | None = None
        """The idempotency key of a commit not confirmed: the retry sends it again."""
        self._commit_timeout = commit_timeout

    @property
    def client(self) -> Client:
        if self._client is None:
            raise InterfaceError("the connection is closed")
        return self._client

    def cursor(self) -> Cursor:
        self.client  # noqa: B018 - raises on a closed connection
        return Cursor(self)

    def commit(self) -> None:
        """Submit the statements collected since the last commit as one transaction and
        wait until it is applied. Nothing collected: nothing to do."""
        if not self._pending:
            return
        try:
            done = self.client.submit(
                list(self._pending), key=self._key, wait="ok", timeout=self._commit_timeout
            )
        except TransactionFailed as failed:
            self._clear()  # FAILED everywhere: nothing of it applied
            raise _translated(failed) from failed
        except (Unavailable, Timeout, Backpressure) as unsure:
            self._key = unsure.key  # commit() again sends the same transaction
            raise _translated(unsure) from unsure
        except TxSyncError as error:
            self._clear()
            raise _translated(error) from error
        rows = done.outcome.rows_affected if done.outcome is not None else ()
        for cursor, index in self._pending_cursors:
            cursor.rowcount = rows[index] if index < len(rows) else -1
        self._clear()

    def rollback(self) -> None:
        """Drop the statements collected since the last commit (nothing was sent)."""
        self._clear()

    def _clear(self) -> None:
        self._pending, self._pending_cursors, self._key = [], [], None

    def close(self) -> None:
        """Close the client; statements not committed are dropped, as PEP 249 asks."""
        if self._client is not None:
            self._clear()
            self._client.close()
            self._client = None

    def __enter__(self) -> Connection:
        return self

    def __exit__(self, kind: type[BaseException] | None, *rest: object) -> None:
        """Commit when the block ends normally, roll back when it raises (as sqlite3);
        the connection stays open."""
        if kind is None:
            self.commit()
        else:
            self.rollback()

    def _collect(self, cursor: Cursor, statement: Statement) -> None:
        if len(self._pending) >= STATEMENTS_MAX:
            raise ProgrammingError(
                f"a transaction holds at most {STATEMENTS_MAX} statements: commit() first"
            )
        self._pending_cursors.append((cursor, len(self._pending)))
        self._pending.append(statement)


Description = tuple[str, None, None, None, None, None, None]


class Cursor:
    arraysize = 1

    def __init__(self, connection: Connection) -> None:
        self.connection: Connection | None = connection
        self.description: list[Description] | None = None
        self.rowcount = -1
        """Rows a read returned; for a write, -1 until ``commit()`` (then its count)."""
        self.lastrowid: int | None = None
        self._rows: list[tuple[Any, ...]] = []

    def _open(self) -> Connection:
        if self.connection is None:
            raise InterfaceError("the cursor is closed")
        return self.connection

    def execute(self, operation: str, parameters: Sequence[object] = ()) -> Cursor:
        connection = self._open()
        if isinstance(parameters, Mapping | str | bytes):
            raise ProgrammingError("parameters are a sequence filling '?' in order (qmark)")
        values = tuple(adapt(p) for p in parameters)
        self.description, self._rows, self.rowcount = None, [], -1
        if not is_read(operation):
            connection._collect(self, Statement(operation, values))
            return self
        try:
            answer = connection.client.query(operation, *values, max_rows=ROWS_MAX)
        except TxSyncError as error:
            if isinstance(error, InvalidRequest) and "write" in str(error).lower():
                raise NotSupportedError(
                    f"{error}: this statement was taken for a read; a write is committed "
                    "with its transaction"
                ) from error
            raise _translated(error) from error
        if answer.truncated:
            raise OperationalError(
                f"the read returned more than {ROWS_MAX} rows (or 4 MiB): narrow it "
                "(WHERE, LIMIT and OFFSET)"
            )
        self.description = [(name, None, None, None, None, None, None) for name in answer.columns]
        self._rows = [tuple(row) for row in answer.rows]
        self.rowcount = len(self._rows)
        return self

    def executemany(self, operation: str, seq_of_parameters: Sequence[Sequence[object]]) -> Cursor:
        for parameters in seq_of_parameters:
            self.execute(operation, parameters)
        return self

    def fetchone(self) -> tuple[Any, ...] | None:
        self._open()
        return self._rows.pop(0) if self._rows else None

    def fetchmany(self, size: int | None = None) -> list[tuple[Any, ...]]:
        self._open()
        count = self.arraysize if size is None else size
        taken, self._rows = self._rows[:count], self._rows[count:]
        return taken

    def fetchall(self) -> list[tuple[Any, ...]]:
        self._open()
        taken, self._rows = self._rows, []
        return taken

    def __iter__(self) -> Iterator[tuple[Any, ...]]:
        while (row := self.fetchone()) is not None:
            yield row

    def setinputsizes(self, sizes: object) -> None:
        pass

    def setoutputsize(self, size: int, column: int | None = None) -> None:
        pass

    def close(self) -> None:
        self.connection, self._rows = None, []


def connect(
    endpoints: str | Sequence[str] | None = None,
    *,
    commit_timeout: float | None = None,
    **client_options: Any,
) -> Connection:
    """A connection through ``txsync.client.Client(endpoints, **client_options)`` (its
    ``dc``, ``token``, ``tls``, ``timeout``...); ``commit_timeout`` bounds each commit
    (default: the client's timeout)."""
    return Connection(Client(endpoints, **client_options), commit_timeout=commit_timeout)
