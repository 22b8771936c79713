"""What every worker backend provides (``Backend``) and the pieces they share: errors,
query results, value conversions and the limits on what is kept and returned."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from txsync.worker.outcomes import Applied, Outcome
from txsync.worker.transactions import Statement, Transaction

OUTCOMES_KEPT = 4_096
"""Outcomes kept for re-delivery after a reconnect (older ones are pruned)."""
KEYS_REMEMBERED = 262_144
"""Positions for which a transaction's idempotency key is remembered after its own: a
keyed transaction within this many positions of an earlier one with the same key is its
duplicate and runs nothing. At most about 60 MB of keys per database (a key is at most
128 bytes). A key is also remembered by time (``KeyWindow``); the longer wins."""
KEY_WINDOW_S_MOST = 7 * 86_400
"""The longest time window a body may ask for its key (``TxBody.key_window_ms``; the
store's ``--idempotency-window-s`` is held to it, and a longer one read is cut to it)."""
KEYS_PRUNE_EVERY = 4_096
"""Keys past both windows are deleted at every position divisible by this (the lookup
checks both windows itself, so pruning late changes no verdict)."""
RESULT_BYTES_MAX = 4 * 1024 * 1024
"""A query's rows are cut (``truncated``) past this many bytes of values."""
APPLY_BATCH_MAX = 64
"""Transactions applied in one database transaction (``apply_many``)."""
STEPS_MAX_DEFAULT = 100_000_000
"""SQLite virtual-machine steps one transaction (or one read) may take: about 2 s of one
core here (48M steps/s), room for a transaction that changes ~10M rows. Counted, not
timed, so every replica reaches the same verdict on the same data (docs/workers.md)."""
VALUE_BYTES_MAX_DEFAULT = 64 * 1024 * 1024
"""The largest string or blob a statement may make (SQLite's SQLITE_LIMIT_LENGTH)."""
GROWTH_BYTES_MAX_DEFAULT = 128 * 1024 * 1024
"""How much one SQLite transaction may grow the database (two values of the largest size):
without it, 100 rows of 60 MB zeroblobs in one transaction wrote 6 GB at every worker."""
STATEMENT_TIMEOUT_MS_DEFAULT = 10_000
"""PostgreSQL workers: one transaction's statements together (``statement_timeout``).
Timed, not counted: on a busy replica a transaction may pass it where the testing worker
did not, and that replica is then out of sync and recovered from a snapshot
(docs/workers.md)."""
CONTENT_CHECK_EVERY_DEFAULT = 10_000
"""Every this many positions the state digest also covers every user table's rows: a
replica whose data went apart while its history matched (something nondeterministic that
the guards missed, an edit behind the worker's back) is caught there as out of sync, and
between DCs as a divergence. It reads the whole database, so it is not done every time
(~1 s per million rows here). Every worker of a cluster must use the same value."""
HEAP_BYTES_MAX_DEFAULT = 512 * 1024 * 1024
"""SQLite's memory in one worker process (PRAGMA hard_heap_limit): room for the largest
value several times over, and six workers of a laptop's ``dev up`` stay within 3 GiB."""


BatchApplied = tuple[list[Outcome], "ApplyOrderError | None"]
"""What ``apply_many`` did: the outcomes, in order, and the error that stopped it early."""


@dataclass(frozen=True, slots=True)
class ToApply:
    position: int
    tx_id: str
    body: Transaction
    run: bool = True
    """False: record it FAILED without running it (the DC's testing worker failed it)."""


@dataclass(frozen=True, slots=True)
class Storage:
    database_bytes: int
    disk_free_bytes: int = 0
    """0 with disk_total_bytes: not known here (a PostgreSQL server's own disk)."""
    disk_total_bytes: int = 0


class Backend(Protocol):
    name: str

    def applied(self) -> Applied: ...

    def apply(
        self, position: int, tx_id: str, body: Transaction, *, run: bool = True
    ) -> Outcome: ...

    def apply_many(self, batch: Sequence[ToApply]) -> BatchApplied:
        """Apply ``batch`` in order, as ``apply`` would each, in one database transaction
        (one commit: what batching buys). Returns the outcomes of those applied (or
        answered from their record), and the ApplyOrderError of the first that is not
        next, if one is: everything before it is committed, nothing after it is tried."""
        ...

    def query(self, statement: Statement, max_rows: int) -> QueryResult: ...

    def position_of(self, tx_id: str) -> int | None:
        """Where ``tx_id`` was applied, if among the recorded outcomes."""
        ...

    def interrupt(self) -> None:
        """Stop whatever runs now, from any thread (the worker is stopping): an apply
        under way raises ApplyInterrupted and commits nothing."""
        ...

    def storage(self) -> Storage:
        """How big the database is, and how full its disk (for the size alarms)."""
        ...

    def close(self) -> None: ...


class SnapshotBackend(Backend, Protocol):
    def export_snapshot(self, target: Path) -> Applied: ...

    def applied_ok(self, position: int) -> bool | None:
        """Whether the transaction at ``position`` applied OK (False: FAILED), from its
        recorded outcome; None if none is recorded (position 0, or one long past)."""
        ...

    def replace_with(self, snapshot: Path) -> Applied: ...


class ApplyInterrupted(Exception):
    """The worker is stopping (``interrupt``): the apply was abandoned, nothing of it
    committed, and it is no verdict: the transaction is applied again after a restart."""


class ApplyOrderError(Exception):
    """A transaction that is not the next one (a gap, or one applied so long ago that
    its outcome is gone)."""


class QueryRefused(Exception):
    """A query that writes, or that the database refuses to prepare."""


@dataclass(frozen=True, slots=True)
class QueryResult:
    columns: tuple[str, ...]
    rows: tuple[tuple[object, ...], ...]
    truncated: bool
    position: int
    """The applied position the rows were read at."""


def recorded_outcome(position: int, tx_id: str, row: tuple[object, ...] | None) -> Outcome:
    """An outcome as ``_txsync_outcomes`` keeps it: ``(tx_id, ok, rows_affected, digest,
    error, duplicate_of)``; refuses a position pruned already or holding another
    transaction."""
    if row is None:
        raise ApplyOrderError(f"position {position} was applied long ago; outcome pruned")
    if row[0] != tx_id:
        raise ApplyOrderError(f"position {position} holds {row[0]}, not {tx_id}")
    rows = tuple(int(n) for n in str(row[2]).split(",") if n)
    digest = row[3]
    assert isinstance(digest, bytes | bytearray | memoryview)
    return Outcome(position, tx_id, bool(row[1]), rows, bytes(digest), str(row[4]), str(row[5]))


@dataclass(frozen=True, slots=True)
class FirstWithKey:
    """The transaction that holds an idempotency key: a later one with the key repeats
    its verdict and runs nothing."""

    tx_id: str
    ok: bool

    def error(self) -> str:
        """The duplicate's error text (empty when the first succeeded)."""
        return "" if self.ok else f"not run: a duplicate of {self.tx_id}, which failed"


@dataclass(frozen=True, slots=True)
class KeyWindow:
    """Which recorded keys still make duplicates at one position of the agreed order.

    A key is remembered for ``KEYS_REMEMBERED`` positions after its transaction's, and
    until the order's clock passes the time the store took it plus its window
    (``TxBody.key_taken_unix_ms`` + ``key_window_ms``, recorded as ``kept_until_ms``),
    whichever is longer. The order's clock is the latest ``key_taken_unix_ms`` of a key
    with a window applied so far (a retry made elsewhere carries its own, so it moves
    the clock to its time; ``worker.keys``).
    Every input comes from the agreed order, so every worker of every DC draws the line
    at the same transaction; and the clock never goes back, so a key past both windows
    stays past them (pruning it late changes no verdict). The times are the stores'
    clocks: the window assumes DCs whose clocks agree within seconds (NTP), and a DC
    whose clock ran ahead would end other keys' windows early, never the positions."""

    above_position: int
    """A key recorded at a position above this is remembered..."""
    clock_ms: int
    """...and so is one kept until this time or later (at least 1: a key kept by
    positions only, recorded as 0, is never kept by time)."""

    @classmethod
    def at(cls, position: int, clock_ms: int) -> KeyWindow:
        return cls(position - KEYS_REMEMBERED - 1, max(clock_ms, 1))


def key_kept_until_ms(transaction: Transaction) -> int:
    """Until when (the order's clock) the key of ``transaction`` is remembered by time;
    0: by positions only (no time, or no window)."""
    if transaction.key_taken_unix_ms <= 0 or transaction.key_window_ms <= 0:
        return 0
    return transaction.key_taken_unix_ms + min(transaction.key_window_ms, KEY_WINDOW_S_MOST * 1000)


def collect_rows(
    rows: Iterable[Iterable[object]], max_rows: int, plain: Callable[[object], object] = lambda v: v
) -> tuple[tuple[tuple[object, ...], ...], bool]:
    """At most ``max_rows`` rows and ``RESULT_BYTES_MAX`` bytes of values; true if cut."""
    kept: list[tuple[object, ...]] = []
    size = 0
    for row in rows:
        values = tuple(plain(v) for v in row)
        size += sum(len(v) if isinstance(v, str | bytes) else 8 for v in values)
        if len(kept) >= max_rows or size > RESULT_BYTES_MAX:
            return tuple(kept), True
        kept.append(values)
    return tuple(kept), False
