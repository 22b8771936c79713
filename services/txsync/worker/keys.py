"""The idempotency keys a worker remembers, one rule for SQLite and PostgreSQL.

Two tables, written in the apply's own database transaction (so a crash, a snapshot
and a replay keep them):

* ``keys``: which transaction holds each key, at which position, and its verdict. Its
  shape is the one the previous release reads and writes: a worker rolled back to it
  opens this database and goes on (tests/upgrade).
* ``key_windows``: for a holder whose store gave its key a time window
  (``TxBody.key_window_ms``), when that store took it and until when it is remembered
  (``backend.KeyWindow``). A row counts only while it names the key's holder, so a row
  left by a holder the previous release replaced is ignored.

The order's clock is the latest ``taken_ms`` in ``key_windows``: the newest row is
never pruned (its window ends after the clock), so the clock never goes back, and it is
read from the database, never kept apart from it, so a rolled-back batch or a snapshot
copied in cannot leave it wrong.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from txsync.worker.backend import FirstWithKey, KeyWindow, key_kept_until_ms
from txsync.worker.transactions import Transaction

Execute = Callable[[str, tuple[object, ...]], Any]
"""A connection's ``execute(sql, params)``: a cursor with ``fetchone``."""
ExecuteMany = Callable[[str, list[tuple[object, ...]]], Any]
"""``executemany(sql, rows)`` on the same connection."""


def windows_table_sql(table: str, *, bigint: str, options: str = "") -> tuple[str, str]:
    """The ``key_windows`` table and its index on ``taken_ms`` (the clock's lookup);
    ``options`` after the table's definition (SQLite's ``WITHOUT ROWID``: one B-tree
    less to write per row)."""
    return (
        f"""CREATE TABLE IF NOT EXISTS {table} (
            key TEXT PRIMARY KEY,
            tx_id TEXT NOT NULL,
            taken_ms {bigint} NOT NULL,
            kept_until_ms {bigint} NOT NULL) {options}""",
        f"CREATE INDEX IF NOT EXISTS {table.replace('.', '_')}_taken ON {table} (taken_ms)",
    )


@dataclass(frozen=True, slots=True)
class KeyBook:
    """The statements of the rule for one database's tables and placeholder."""

    clock_sql: str
    holder_sql: str
    window_sql: str
    record_key_sql: str
    record_window_sql: str
    prune_windows_sql: str
    prune_keys_sql: str

    @classmethod
    def for_tables(cls, keys: str, windows: str, mark: str) -> KeyBook:
        return cls(
            clock_sql=f"SELECT coalesce(max(taken_ms), 0) FROM {windows}",
            holder_sql=f"SELECT tx_id, ok, position FROM {keys} WHERE key = {mark}",
            window_sql=(
                f"SELECT kept_until_ms FROM {windows} WHERE key = {mark} AND tx_id = {mark}"
            ),
            record_key_sql=(
                f"INSERT INTO {keys} (key, tx_id, position, ok) "
                f"VALUES ({mark}, {mark}, {mark}, {mark}) ON CONFLICT (key) DO UPDATE "
                "SET tx_id = excluded.tx_id, position = excluded.position, ok = excluded.ok"
            ),
            record_window_sql=(
                f"INSERT INTO {windows} (key, tx_id, taken_ms, kept_until_ms) "
                f"VALUES ({mark}, {mark}, {mark}, {mark}) ON CONFLICT (key) DO UPDATE "
                "SET tx_id = excluded.tx_id, taken_ms = excluded.taken_ms, "
                "kept_until_ms = excluded.kept_until_ms"
            ),
            prune_windows_sql=f"DELETE FROM {windows} WHERE kept_until_ms < {mark}",
            prune_keys_sql=(
                f"DELETE FROM {keys} WHERE position <= {mark} AND NOT EXISTS ("
                f"SELECT 1 FROM {windows} w WHERE w.key = {keys}.key AND w.tx_id = {keys}.tx_id)"
            ),
        )

    def batch(self, execute: Execute, execute_many: ExecuteMany) -> KeyBatch:
        """The keys' part of one database transaction on ``execute``'s connection."""
        return KeyBatch(self, execute, execute_many)


class KeyBatch:
    """Keys looked up and recorded in one database transaction (a batch of applies).

    A new key, the common case (every client submit has one), costs one lookup and one
    upsert, as before windows. The order's clock is read once per transaction and only
    when a holder is past its positions (or at a pruning position), and the windows of
    the batch's transactions are written together before it commits (``flush``): the
    batch's own rows are within the positions window of every later lookup in it, so
    no lookup needs them, and the clock counts them from memory. Dropped with the
    transaction if it rolls back (nothing is kept apart from the database)."""

    def __init__(self, book: KeyBook, execute: Execute, execute_many: ExecuteMany) -> None:
        self._book, self._execute, self._execute_many = book, execute, execute_many
        self._stored_clock_ms: int | None = None
        self._pending: list[tuple[object, ...]] = []
        self._pending_clock_ms = 0

    def _clock_ms(self, transaction: Transaction) -> int:
        """The order's clock at ``transaction``: the latest time of a key with a window
        ordered so far, its own included."""
        if self._stored_clock_ms is None:
            (stored,) = self._execute(self._book.clock_sql, ()).fetchone()
            self._stored_clock_ms = int(stored)
        own = transaction.key_taken_unix_ms if key_kept_until_ms(transaction) else 0
        return max(self._stored_clock_ms, self._pending_clock_ms, own)

    def holder(self, position: int, transaction: Transaction) -> FirstWithKey | None:
        """The transaction that holds the key of ``transaction`` at ``position``, if one
        does (``KeyWindow``)."""
        row = self._execute(self._book.holder_sql, (transaction.idempotency_key,)).fetchone()
        if row is None:
            return None
        holder = FirstWithKey(str(row[0]), bool(row[1]))
        window = KeyWindow.at(position, self._clock_ms(transaction))
        if int(row[2]) > window.above_position:
            return holder
        kept = self._execute(self._book.window_sql, (transaction.idempotency_key, holder.tx_id))
        kept_row = kept.fetchone()
        return holder if kept_row is not None and int(kept_row[0]) >= window.clock_ms else None

    def record(self, tx_id: str, position: int, ok: bool, transaction: Transaction) -> None:
        """``tx_id`` holds its key from here on (no transaction held it)."""
        key = transaction.idempotency_key
        self._execute(self._book.record_key_sql, (key, tx_id, position, ok))
        kept_until_ms = key_kept_until_ms(transaction)
        if kept_until_ms:
            self._pending.append((key, tx_id, transaction.key_taken_unix_ms, kept_until_ms))
            self._pending_clock_ms = max(self._pending_clock_ms, transaction.key_taken_unix_ms)

    def prune(self, position: int, transaction: Transaction) -> None:
        """Forget what is past both windows at ``position`` (no verdict changes by it)."""
        self.flush()
        window = KeyWindow.at(position, self._clock_ms(transaction))
        self._execute(self._book.prune_windows_sql, (window.clock_ms,))
        self._execute(self._book.prune_keys_sql, (window.above_position,))

    def flush(self) -> None:
        """Write the windows recorded so far (before the transaction commits)."""
        if self._pending:
            self._execute_many(self._book.record_window_sql, self._pending)
            self._pending = []
