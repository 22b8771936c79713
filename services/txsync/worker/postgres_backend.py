"""The PostgreSQL backend (psycopg 3): the same contract as ``SqliteBackend``.

A transaction's statements and the ``_txsync_applied`` row (position, tx id, running
digest) change in one PostgreSQL transaction, with the row locked ``FOR UPDATE`` so that
two writers can never interleave; a failing statement rolls back to a savepoint and the
position advances with the outcome FAILED. Statements use ``?`` placeholders as on
SQLite (a transaction is applied by every DC's workers, so it has one text); they are
rewritten to psycopg's ``%s`` outside string literals.

User statements may not control transactions or write the ``_txsync_`` tables (checked on
the text: PostgreSQL has no per-statement authorizer). Reads run in a read-only,
repeatable-read transaction that also reads the applied position, so rows and position
come from one snapshot.
"""

from __future__ import annotations

import glob
import re
import shutil
import subprocess
import threading
from collections.abc import Sequence
from decimal import Decimal
from pathlib import Path

import psycopg
from psycopg import sql as psql

from txsync.v1 import common_pb2
from txsync.worker.backend import (
    APPLY_BATCH_MAX,
    OUTCOMES_KEPT,
    ApplyInterrupted,
    ApplyOrderError,
    BatchApplied,
    QueryRefused,
    QueryResult,
    ToApply,
    collect_rows,
    recorded_outcome,
    to_python,
)
from txsync.worker.outcomes import GENESIS_DIGEST, Applied, Outcome, next_digest

_SCHEMA = (
    """CREATE TABLE IF NOT EXISTS _txsync_applied (
        id INTEGER PRIMARY KEY CHECK (id = 1),
        position BIGINT NOT NULL,
        tx_id TEXT NOT NULL,
        state_digest BYTEA NOT NULL)""",
    """INSERT INTO _txsync_applied VALUES (1, 0, '', %s) ON CONFLICT (id) DO NOTHING""",
    """CREATE TABLE IF NOT EXISTS _txsync_outcomes (
        position BIGINT PRIMARY KEY,
        tx_id TEXT NOT NULL,
        ok BOOLEAN NOT NULL,
        rows_affected TEXT NOT NULL,
        state_digest BYTEA NOT NULL,
        error TEXT NOT NULL)""",
)
_TRANSACTION_CONTROL = re.compile(
    r"^\s*(begin|start\s+transaction|commit|end|rollback|abort|savepoint|release|"
    r"prepare\s+transaction|set\s+(session\s+)?transaction|set\s+session\s+characteristics)\b",
    re.IGNORECASE,
)
_BOOKKEEPING = re.compile(r"\b_txsync_\w+", re.IGNORECASE)
_LITERAL_OR_PLACEHOLDER = re.compile(r"'(?:[^']|'')*'|\"(?:[^\"]|\"\")*\"|\?|%")


def to_psycopg(sql: str) -> str:
    """``?`` placeholders become ``%s`` and a literal ``%`` becomes ``%%``, outside quotes."""

    def replace(match: re.Match[str]) -> str:
        token = match.group(0)
        return {"?": "%s", "%": "%%"}.get(token, token)

    return _LITERAL_OR_PLACEHOLDER.sub(replace, sql)


def _refusal(sql: str) -> str | None:
    if _TRANSACTION_CONTROL.match(sql):
        return "not authorized: transaction control belongs to the worker"
    code = re.sub(r"'(?:[^']|'')*'", "''", sql)
    if _BOOKKEEPING.search(code):
        return "not authorized: the _txsync_ tables are the worker's bookkeeping"
    return None


def _pg_tool(name: str, *args: str) -> None:
    """Run ``pg_dump``/``pg_restore`` (from PATH, else Debian's versioned directory)."""
    found = shutil.which(name) or next(
        iter(sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"), reverse=True)), None
    )
    if found is None:
        raise OSError(f"{name} not found: install PostgreSQL's client programs")
    done = subprocess.run([found, *args], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise OSError(f"{name} failed ({done.returncode}): {done.stderr.strip()[:500]}")


def _plain(value: object) -> object:
    """psycopg's richer types as the values a ``SqlValue`` carries."""
    if isinstance(value, Decimal):
        return float(value) if value % 1 else int(value)
    if isinstance(value, memoryview):
        return bytes(value)
    if value is None or isinstance(value, bool | int | float | str | bytes):
        return value
    return str(value)


class PostgresBackend:
    name = "postgresql"

    def __init__(self, conninfo: str) -> None:
        self._conninfo = conninfo
        self._stopping = threading.Event()
        self._lock = threading.Lock()
        self._conn = psycopg.connect(conninfo, autocommit=True)
        with self._conn.transaction():
            for statement in _SCHEMA:
                params = (GENESIS_DIGEST,) if "%s" in statement else None
                self._conn.execute(statement, params)

    def close(self) -> None:
        with self._lock:
            self._conn.close()

    def interrupt(self) -> None:
        """Cancel the statement running now on the server (the worker is stopping)."""
        self._stopping.set()
        self._conn.cancel_safe(timeout=5)

    def export_snapshot(self, target: Path) -> Applied:
        """A consistent dump (``pg_dump`` custom format) taken in the snapshot of a
        repeatable-read transaction that also reads the applied row, so the dump holds
        exactly the position it reports."""
        target.unlink(missing_ok=True)
        with psycopg.connect(self._conninfo, autocommit=True) as conn:
            conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
            exported = conn.execute("SELECT pg_export_snapshot()").fetchone()
            row = conn.execute(
                "SELECT position, tx_id, state_digest FROM _txsync_applied"
            ).fetchone()
            assert exported is not None and row is not None
            _pg_tool("pg_dump", f"--snapshot={exported[0]}", "--format=custom",
                     f"--file={target}", self._conninfo)  # fmt: skip
            conn.execute("ROLLBACK")
        return Applied(int(row[0]), str(row[1]), bytes(row[2]))

    def replace_with(self, snapshot: Path) -> Applied:
        """Empty the database and restore the dump in one transaction. If the restore
        fails, the database is left empty (position 0): dispatch copies again or replays."""
        with self._lock:
            self._conn.close()
            with psycopg.connect(self._conninfo, autocommit=True) as conn:
                conn.execute("DROP SCHEMA public CASCADE")
                conn.execute("CREATE SCHEMA public")
            _pg_tool("pg_restore", "--single-transaction", "--exit-on-error", "--no-owner",
                     f"--dbname={self._conninfo}", str(snapshot))  # fmt: skip
            self._conn = psycopg.connect(self._conninfo, autocommit=True)
        return self.applied()

    def applied(self) -> Applied:
        """The committed position, on a connection of its own (never waits for an apply)."""
        with psycopg.connect(self._conninfo, autocommit=True) as conn:
            row = conn.execute(
                "SELECT position, tx_id, state_digest FROM _txsync_applied"
            ).fetchone()
        assert row is not None
        return Applied(int(row[0]), str(row[1]), bytes(row[2]))

    def apply(
        self, position: int, tx_id: str, body: common_pb2.TxBody, *, run: bool = True
    ) -> Outcome:
        with self._lock, self._conn.transaction():
            return self._apply_in_transaction(ToApply(position, tx_id, body, run))

    def apply_many(self, batch: Sequence[ToApply]) -> BatchApplied:
        assert 0 < len(batch) <= APPLY_BATCH_MAX
        outcomes: list[Outcome] = []
        with self._lock, self._conn.transaction():
            for item in batch:
                try:
                    outcomes.append(self._apply_in_transaction(item))
                except ApplyOrderError as error:  # raised before it wrote anything
                    return outcomes, error
        return outcomes, None

    def _apply_in_transaction(self, item: ToApply) -> Outcome:
        """Under the lock, inside a database transaction: a user statement's error stays
        inside its own savepoint (``_run``), so a batch's transactions never undo each
        other."""
        position, tx_id, body, run = item.position, item.tx_id, item.body, item.run
        conn = self._conn
        row = conn.execute(
            "SELECT position, tx_id, state_digest FROM _txsync_applied FOR UPDATE"
        ).fetchone()
        assert row is not None
        last, digest = int(row[0]), bytes(row[2])
        if position <= last:
            return self._recorded(position, tx_id)
        if position != last + 1:
            raise ApplyOrderError(f"position {position} after {last}: a gap")
        ok, error = False, "not run: the DC's testing worker failed it"
        rows: tuple[int, ...] = ()
        if run:
            ok, rows, error = self._run(conn, body)
        digest = next_digest(digest, position, tx_id, body, ok=ok, rows_affected=rows)
        conn.execute(
            "UPDATE _txsync_applied SET position = %s, tx_id = %s, state_digest = %s",
            (position, tx_id, digest),
        )
        conn.execute(
            "INSERT INTO _txsync_outcomes VALUES (%s, %s, %s, %s, %s, %s)",
            (position, tx_id, ok, ",".join(map(str, rows)), digest, error),
        )
        conn.execute(
            "DELETE FROM _txsync_outcomes WHERE position <= %s", (position - OUTCOMES_KEPT,)
        )
        return Outcome(position, tx_id, ok, rows, digest, error)

    def _run(
        self, conn: psycopg.Connection[tuple[object, ...]], body: common_pb2.TxBody
    ) -> tuple[bool, tuple[int, ...], str]:
        rows: list[int] = []
        try:
            with conn.transaction():  # a savepoint inside the apply transaction
                for statement in body.statements:
                    refusal = _refusal(statement.sql)
                    if refusal is not None:
                        raise psycopg.errors.InsufficientPrivilege(refusal)
                    params = [to_python(p) for p in statement.params]
                    cursor = conn.execute(psql.SQL(to_psycopg(statement.sql)), params)
                    rows.append(max(cursor.rowcount, 0))
        except psycopg.Error as error:
            if self._stopping.is_set():
                raise ApplyInterrupted("the worker is stopping") from error
            return False, (), f"{type(error).__name__}: {error}".strip()
        return True, tuple(rows), ""

    def position_of(self, tx_id: str) -> int | None:
        with self._lock:
            row = self._conn.execute(
                "SELECT position FROM _txsync_outcomes WHERE tx_id = %s", (tx_id,)
            ).fetchone()
        return None if row is None else int(row[0])

    def _recorded(self, position: int, tx_id: str) -> Outcome:
        row = self._conn.execute(
            "SELECT tx_id, ok, rows_affected, state_digest, error FROM _txsync_outcomes "
            "WHERE position = %s",
            (position,),
        ).fetchone()
        return recorded_outcome(position, tx_id, row)

    def query(self, statement: common_pb2.Statement, max_rows: int) -> QueryResult:
        refusal = _refusal(statement.sql)
        if refusal is not None:
            raise QueryRefused(refusal)
        with psycopg.connect(self._conninfo, autocommit=True) as conn:
            conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
            try:
                row = conn.execute("SELECT position FROM _txsync_applied").fetchone()
                assert row is not None
                params = [to_python(p) for p in statement.params]
                cursor = conn.execute(psql.SQL(to_psycopg(statement.sql)), params)
            except psycopg.Error as error:
                raise QueryRefused(f"{type(error).__name__}: {error}".strip()) from None
            columns = tuple(d.name for d in cursor.description or ())
            found = cursor if cursor.description else ()
            result, truncated = collect_rows(found, max_rows, _plain)
            conn.execute("ROLLBACK")
            return QueryResult(columns, result, truncated, int(row[0]))
