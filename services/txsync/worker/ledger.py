"""A worker's own record of what it applied (the applied row and the outcomes), kept
for one database transaction and written once before it commits: one rule for SQLite
and PostgreSQL.

Written per transaction, the applied row's read and update, the outcome's insert and
the pruning of old outcomes were four statements of every transaction applied (four
round trips on PostgreSQL); now they are four per batch of up to 64. No user statement
can read them (the guards refuse ``_txsync`` objects), so writing them last changes
nothing a transaction sees, and a transaction rolled back drops them with it.
"""

from __future__ import annotations

from dataclasses import dataclass

from txsync.worker.backend import OUTCOMES_KEPT
from txsync.worker.keys import Execute, ExecuteMany, KeyBook
from txsync.worker.outcomes import Outcome


@dataclass(frozen=True, slots=True)
class LedgerSql:
    read_sql: str
    update_sql: str
    insert_sql: str
    prune_sql: str

    @classmethod
    def for_tables(cls, applied: str, outcomes: str, mark: str, *, lock: str = "") -> LedgerSql:
        """``lock``: after the read of the applied row (PostgreSQL's ``FOR UPDATE``)."""
        return cls(
            read_sql=f"SELECT position, tx_id, state_digest FROM {applied} {lock}",
            update_sql=(
                f"UPDATE {applied} SET position = {mark}, tx_id = {mark}, state_digest = {mark}"
            ),
            insert_sql=f"INSERT INTO {outcomes} VALUES ({', '.join([mark] * 7)})",
            prune_sql=f"DELETE FROM {outcomes} WHERE position <= {mark}",
        )


class Ledger:
    """The applied row as of the last transaction of this database transaction, the
    outcomes it added (``outcomes``, by position: a re-delivered one is answered from
    here before it is written), and its idempotency keys (``keys``): all of its
    bookkeeping, written by one ``write``."""

    def __init__(
        self, sql: LedgerSql, keys: KeyBook, execute: Execute, execute_many: ExecuteMany
    ) -> None:
        self._sql, self._execute, self._execute_many = sql, execute, execute_many
        self.keys = keys.batch(execute, execute_many)
        row = execute(sql.read_sql, ()).fetchone()
        assert row is not None, "the applied row is made at set-up"
        self.position, self.tx_id, self.digest = int(row[0]), str(row[1]), bytes(row[2])
        self.outcomes: dict[int, Outcome] = {}

    def add(self, outcome: Outcome) -> None:
        self.position, self.tx_id = outcome.position, outcome.tx_id
        self.digest = outcome.state_digest
        self.outcomes[outcome.position] = outcome

    def write(self) -> None:
        """Before the database transaction commits."""
        self.keys.flush()
        if not self.outcomes:
            return
        self._execute(self._sql.update_sql, (self.position, self.tx_id, self.digest))
        self._execute_many(
            self._sql.insert_sql,
            [
                (o.position, o.tx_id, o.ok, ",".join(map(str, o.rows_affected)),
                 o.state_digest, o.error, o.duplicate_of)
                for o in self.outcomes.values()
            ],
        )  # fmt: skip
        self._execute(self._sql.prune_sql, (self.position - OUTCOMES_KEPT,))
        self.outcomes = {}
