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

from txsync.worker.backend import (
    FirstWithKey,
    KeyWindow,
    key_kept_until_ms,
)
from txsync.worker.transactions import Transaction

Execute = Callable[[str, tuple[object, ...]], Any]
"""A connection's ``execute(sql, params)``: a cursor with ``fetchone``."""


def windows_table_sql(table: str, *, bigint: str) -> tuple[str, str]:
    """The ``key_windows`` table and its index on ``taken_ms`` (the clock's lookup)."""
    return (
        f"""CREATE TABLE IF NOT EXISTS {table} (
            key TEXT PRIMARY KEY,
            tx_id TEXT NOT NULL,
            taken_ms {bigint} NOT NULL,
            kept_until_ms {bigint} NOT NULL)""",
        f"CREATE INDEX IF NOT EXISTS {table.replace('.', '_')}_taken ON {table} (taken_ms)",
    )


@dataclass(frozen=True, slots=True)
class KeyBook:
    """The statements of the rule for one database's tables and placeholder."""

    clock_sql: str
    holder_sql: str
    record_key_sql: str
    record_window_sql: str
    prune_windows_sql: str
    prune_keys_sql: str

    @classmethod
    def for_tables(cls, keys: str, windows: str, mark: str) -> KeyBook:
        held_by_window = (
            f"EXISTS (SELECT 1 FROM {windows} w WHERE w.key = {keys}.key "
            f"AND w.tx_id = {keys}.tx_id AND w.kept_until_ms >= {mark})"
        )
        return cls(
            clock_sql=f"SELECT coalesce(max(taken_ms), 0) FROM {windows}",
            holder_sql=(
                f"SELECT tx_id, ok FROM {keys} WHERE key = {mark} "
                f"AND (position > {mark} OR {held_by_window})"
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
            prune_keys_sql=f"DELETE FROM {keys} WHERE position <= {mark} AND NOT {held_by_window}",
        )

    def window_at(self, execute: Execute, position: int, transaction: Transaction) -> KeyWindow:
        """What is remembered while ``transaction`` is applied at ``position``: the
        order's clock counts its own time (its key's, if it has a window)."""
        (clock_ms,) = execute(self.clock_sql, ()).fetchone()
        if key_kept_until_ms(transaction):
            clock_ms = max(int(clock_ms), transaction.key_taken_unix_ms)
        return KeyWindow.at(position, int(clock_ms))

    def holder(self, execute: Execute, key: str, window: KeyWindow) -> FirstWithKey | None:
        """The transaction that holds ``key`` within ``window``, if one does."""
        row = execute(self.holder_sql, (key, window.above_position, window.clock_ms)).fetchone()
        return None if row is None else FirstWithKey(str(row[0]), bool(row[1]))

    def record(
        self, execute: Execute, tx_id: str, position: int, ok: bool, transaction: Transaction
    ) -> None:
        """``tx_id`` holds its key from here on (no transaction held it)."""
        key = transaction.idempotency_key
        execute(self.record_key_sql, (key, tx_id, position, ok))
        kept_until_ms = key_kept_until_ms(transaction)
        if kept_until_ms:
            execute(
                self.record_window_sql,
                (key, tx_id, transaction.key_taken_unix_ms, kept_until_ms),
            )

    def prune(self, execute: Execute, window: KeyWindow) -> None:
        """Forget what is past both windows (a verdict never changes by it)."""
        execute(self.prune_windows_sql, (window.clock_ms,))
        execute(self.prune_keys_sql, (window.above_position, window.clock_ms))
