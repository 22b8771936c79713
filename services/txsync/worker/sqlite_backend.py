"""The SQLite backend (the embedded default): one database file in WAL mode.

Exactly once: a transaction's statements and the worker's applied position (plus the
running digest and the outcome) are written in **one** SQLite transaction, so a crash at
any point leaves either all of it or none of it, and the worker resumes from the position
its database records. A failing statement rolls its transaction's statements back (a
savepoint) and the position still advances, with the outcome FAILED: the failure is part
of the agreed history, like a success.

``synchronous=NORMAL`` in WAL mode keeps every commit atomic; a power loss may drop the
last commits, and then the position drops with them, so the worker re-applies them: still
exactly once for its database. The data and the bookkeeping live in the same file, so a
snapshot (the online backup API) carries its own position.

What a transaction's statements may do is enforced by SQLite itself (``sqlite_guard``):
they cannot name the ``_txsync_`` tables by any route, control the transaction, attach,
set pragmas, make temporary objects, or call a function whose answer could differ between
replicas. Reads run on their own connections with ``query_only`` and an authorizer that
refuses writes.

Every transaction (and every read) has a budget of ``steps_max`` virtual-machine steps,
counted through SQLite's progress handler, and the work of string functions inside one
step charged to it (``sqlite_work``): a statement that never ends, or runs for minutes,
fails with an error naming the limit, and since the count depends only on the
statements, the data and the SQLite version, every replica reaches the same verdict.
Strings and blobs are capped at ``value_bytes_max`` (SQLITE_LIMIT_LENGTH) for the same
reason, and SQLite's memory in the worker process at ``heap_bytes_max``
(``PRAGMA hard_heap_limit``: shared by the process's connections, reads included, so a
replica may run out where another did not; its digest then differs and it is recovered
from a snapshot). ``interrupt`` (SIGTERM) abandons a running apply without a verdict.
"""

from __future__ import annotations

import hashlib
import shutil
import sqlite3
import threading
from collections.abc import Sequence
from pathlib import Path

from txsync.telemetry import work
from txsync.worker.backend import (
    APPLY_BATCH_MAX,
    CONTENT_CHECK_EVERY_DEFAULT,
    GROWTH_BYTES_MAX_DEFAULT,
    HEAP_BYTES_MAX_DEFAULT,
    KEYS_PRUNE_EVERY,
    STEPS_MAX_DEFAULT,
    VALUE_BYTES_MAX_DEFAULT,
    ApplyInterrupted,
    ApplyOrderError,
    BatchApplied,
    QueryRefused,
    QueryResult,
    Storage,
    ToApply,
    collect_rows,
    recorded_outcome,
)
from txsync.worker.keys import KeyBook, windows_table_sql
from txsync.worker.ledger import Ledger, LedgerSql
from txsync.worker.outcomes import (
    GENESIS_DIGEST,
    Applied,
    Outcome,
    is_content_check,
    next_digest,
)
from txsync.worker.sqlite_guard import ReadGuard, SqliteGuard, user_sql
from txsync.worker.sqlite_touched import TouchedRows, make_triggers
from txsync.worker.sqlite_work import PROGRESS_EVERY_STEPS, CostedFunctions, StepBudget
from txsync.worker.transactions import Statement, Transaction

BUSY_TIMEOUT_S = 10.0
WAL_BYTES_KEPT = 64 * 1024 * 1024
UNLIMITED_PAGES = "PRAGMA max_page_count = 4294967294"
"""SQLite's own ceiling, for the worker's bookkeeping after a transaction's statements."""
DRAINED_ROWS_PER_FETCH = 256
"""Rows of a statement's result read (and dropped) at a time while it is applied."""

_SCHEMA = """
CREATE TABLE IF NOT EXISTS _txsync_applied (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    position INTEGER NOT NULL,
    tx_id TEXT NOT NULL,
    state_digest BLOB NOT NULL
);
INSERT OR IGNORE INTO _txsync_applied (id, position, tx_id, state_digest)
    VALUES (1, 0, '', zeroblob(32));
CREATE TABLE IF NOT EXISTS _txsync_outcomes (
    position INTEGER PRIMARY KEY,
    tx_id TEXT NOT NULL,
    ok INTEGER NOT NULL,
    rows_affected TEXT NOT NULL,
    state_digest BLOB NOT NULL,
    error TEXT NOT NULL,
    duplicate_of TEXT NOT NULL DEFAULT ''
);
CREATE TABLE IF NOT EXISTS _txsync_keys (
    key TEXT PRIMARY KEY,
    tx_id TEXT NOT NULL,
    position INTEGER NOT NULL,
    ok INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS _txsync_keys_position ON _txsync_keys (position);
"""
_OUTCOMES_BEFORE_KEYS = (
    "ALTER TABLE _txsync_outcomes ADD COLUMN duplicate_of TEXT NOT NULL DEFAULT ''"
)
"""A database made before keys travelled lacks the outcome's ``duplicate_of``."""
_KEY_WINDOWS = windows_table_sql("_txsync_key_windows", bigint="INTEGER", options="WITHOUT ROWID")
_KEYS = KeyBook.for_tables("_txsync_keys", "_txsync_key_windows", "?")
_LEDGER = LedgerSql.for_tables("_txsync_applied", "_txsync_outcomes", "?")


class _BatchRolledBack(Exception):
    """A statement ended the whole database transaction of a batch (not just its own
    savepoint), undoing the transactions applied before it in the batch; or the batch
    took a table's largest rowid (``SqliteGuard.largest_rowid_taken``)."""


class SqliteBackend:
    name = "sqlite"

    def __init__(
        self,
        path: Path,
        *,
        steps_max: int = STEPS_MAX_DEFAULT,
        value_bytes_max: int = VALUE_BYTES_MAX_DEFAULT,
        growth_bytes_max: int = GROWTH_BYTES_MAX_DEFAULT,
        touched_digest: bool = True,
        heap_bytes_max: int = HEAP_BYTES_MAX_DEFAULT,
        content_check_every: int = CONTENT_CHECK_EVERY_DEFAULT,
    ) -> None:
        self.path = path
        self.content_check_every = content_check_every
        self.steps_max = steps_max
        self.value_bytes_max = value_bytes_max
        self.growth_bytes_max = growth_bytes_max
        self.touched_digest = touched_digest
        self.heap_bytes_max = heap_bytes_max
        self._guard = SqliteGuard()
        self._costed = CostedFunctions(value_bytes_max)
        self._touched = TouchedRows()
        self._touched_digest = b""
        """Of the rows the last transaction run touched (``sqlite_touched``)."""
        self._batching = False
        """Applying a batch in one database transaction: the largest-rowid check runs once
        at its end (one lookup per table per batch, not per transaction: 35 us of ~190
        per transaction, measured), and a batch that fails it is applied one by one."""
        self._stopping = threading.Event()
        path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()  # one writer; calls come from worker threads
        self._read_costed = threading.local()
        self._conn = self._open()

    def _open(self) -> sqlite3.Connection:
        conn = sqlite3.connect(
            self.path, isolation_level=None, check_same_thread=False, timeout=BUSY_TIMEOUT_S
        )
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=NORMAL")
        # A checkpoint truncates the WAL back to this: a big transaction (or a rolled-back
        # one) would otherwise leave the file at its largest for good.
        conn.execute(f"PRAGMA journal_size_limit={WAL_BYTES_KEPT}")
        conn.executescript(_SCHEMA)
        columns = {row[1] for row in conn.execute("PRAGMA table_info(_txsync_outcomes)")}
        if "duplicate_of" not in columns:
            conn.execute(_OUTCOMES_BEFORE_KEYS)
        for statement in _KEY_WINDOWS:
            conn.execute(statement)
        conn.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, self.value_bytes_max)
        conn.execute(f"PRAGMA hard_heap_limit={int(self.heap_bytes_max)}")
        (page_size,) = conn.execute("PRAGMA page_size").fetchone()
        self._growth_pages = max(1, self.growth_bytes_max // int(page_size))
        self._guard.install(conn)
        self._costed.install(conn)
        if self.touched_digest:
            self._touched.install(conn)
            make_triggers(conn)
        return conn

    def interrupt(self) -> None:
        self._stopping.set()
        self._conn.interrupt()

    def close(self) -> None:
        with self._lock:
            self._conn.close()

    def export_snapshot(self, target: Path) -> Applied:
        """A consistent copy of the whole database (the online backup API: writers wait
        only for the copy's pages), which carries its own applied position."""
        target.unlink(missing_ok=True)
        with self._lock:
            copy = sqlite3.connect(target)
            try:
                self._conn.backup(copy)
                row = copy.execute(
                    "SELECT position, tx_id, state_digest FROM _txsync_applied"
                ).fetchone()
                copy.execute("PRAGMA journal_mode=DELETE")  # one self-contained file
            finally:
                copy.close()
        return Applied(int(row[0]), str(row[1]), bytes(row[2]))

    def replace_with(self, snapshot: Path) -> Applied:
        """Make ``snapshot`` (checked already) this worker's database, atomically: until
        the rename the old database stays in place."""
        with self._lock:
            # Fold the log into the file first: a crash before the rename then leaves the
            # old database whole.
            self._conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            self._conn.close()
            for suffix in ("-wal", "-shm"):
                Path(f"{self.path}{suffix}").unlink(missing_ok=True)
            snapshot.replace(self.path)
            self._conn = self._open()
        return self.applied()

    def applied(self) -> Applied:
        """The committed position, read on a connection of its own: it never waits for a
        transaction being applied (WAL readers do not wait for the writer)."""
        conn = sqlite3.connect(
            f"file:{self.path}?mode=ro", uri=True, check_same_thread=False, timeout=BUSY_TIMEOUT_S
        )
        try:
            row = conn.execute(
                "SELECT position, tx_id, state_digest FROM _txsync_applied"
            ).fetchone()
        finally:
            conn.close()
        return Applied(int(row[0]), str(row[1]), bytes(row[2]) or GENESIS_DIGEST)

    def storage(self) -> Storage:
        sizes = [
            path.stat().st_size
            for path in (self.path, self.path.with_name(self.path.name + "-wal"))
            if path.exists()
        ]
        disk = shutil.disk_usage(self.path.parent)
        return Storage(sum(sizes), disk.free, disk.total)

    def apply(self, position: int, tx_id: str, body: Transaction, *, run: bool = True) -> Outcome:
        """Apply the transaction at ``position`` (which must be the next one), or return
        its recorded outcome if it was applied already. ``run=False`` records it FAILED
        without running it (the DC's testing worker failed it)."""
        with self._lock:
            conn = self._conn
            conn.execute("BEGIN IMMEDIATE")
            ledger = Ledger(_LEDGER, _KEYS, conn.execute, conn.executemany)
            try:
                outcome = self._apply_in_transaction(
                    conn, position, tx_id, body, run, ledger=ledger
                )
                ledger.write()
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            if outcome is None:  # applied earlier: nothing to write
                conn.execute("ROLLBACK")
                return self._recorded(position, tx_id)
            conn.execute("COMMIT")
            work.count(work.DB_COMMITS)
            return outcome

    def apply_many(self, batch: Sequence[ToApply]) -> BatchApplied:
        assert 0 < len(batch) <= APPLY_BATCH_MAX
        try:
            return self._apply_batch(batch)
        except _BatchRolledBack:
            # A statement rolled back the whole transaction, and with it the batch's
            # earlier transactions: apply them one by one instead (nothing was committed).
            outcomes: list[Outcome] = []
            for item in batch:
                try:
                    outcomes.append(self.apply(item.position, item.tx_id, item.body, run=item.run))
                except ApplyOrderError as error:
                    return outcomes, error
            return outcomes, None

    def _apply_batch(self, batch: Sequence[ToApply]) -> BatchApplied:
        outcomes: list[Outcome] = []
        failure: ApplyOrderError | None = None
        with self._lock:
            conn = self._conn
            conn.execute("BEGIN IMMEDIATE")
            self._batching = True
            ledger = Ledger(_LEDGER, _KEYS, conn.execute, conn.executemany)
            try:
                for item in batch:
                    try:
                        outcome = self._apply_in_transaction(
                            conn, item.position, item.tx_id, item.body, item.run,
                            ledger=ledger, alone=not outcomes,
                        )  # fmt: skip
                        if outcome is None:  # applied earlier: answered from its record
                            outcome = ledger.outcomes.get(item.position) or self._recorded(
                                item.position, item.tx_id
                            )
                    except ApplyOrderError as error:
                        failure = error
                        break
                    outcomes.append(outcome)
                if self._guard.largest_rowid_taken(conn):
                    raise _BatchRolledBack  # one by one, each checked: the culprit FAILED
                ledger.write()
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise
            finally:
                self._batching = False
            conn.execute("COMMIT")
            work.count(work.DB_COMMITS)
        return outcomes, failure

    def _apply_in_transaction(
        self,
        conn: sqlite3.Connection,
        position: int,
        tx_id: str,
        body: Transaction,
        run: bool,
        *,
        ledger: Ledger,
        alone: bool = True,
    ) -> Outcome | None:
        """``alone``: nothing else in this database transaction yet (a batch's first)."""
        last, digest = ledger.position, ledger.digest
        if position <= last:
            return None
        if position != last + 1:
            raise ApplyOrderError(f"position {position} after {last}: a gap")
        ok, error = False, "not run: the DC's testing worker failed it"
        rows: tuple[int, ...] = ()
        key = body.idempotency_key
        keys = ledger.keys
        first = keys.holder(position, body) if key else None
        if first is not None:
            ok, error = first.ok, first.error()
        elif run:
            ok, rows, error = self._run(conn, body)
            if not conn.in_transaction:
                # Some errors (a full disk, an ON CONFLICT ROLLBACK clause) roll back the
                # whole transaction, not just the savepoint; we still hold the writer lock.
                if not alone:
                    raise _BatchRolledBack
                conn.execute("BEGIN IMMEDIATE")
        content = (
            _content_digest(conn) if is_content_check(position, self.content_check_every) else b""
        )
        duplicate_of = first.tx_id if first is not None else ""
        digest = next_digest(
            digest, position, tx_id, body, ok=ok, rows_affected=rows, content=content,
            duplicate_of=duplicate_of,
        )  # fmt: skip
        if key and first is None:  # an expired holder of the key is replaced
            keys.record(tx_id, position, ok, body)
        if position % KEYS_PRUNE_EVERY == 0:
            keys.prune(position, body)
        touched = self._touched_digest if ok and run and first is None else b""
        outcome = Outcome(position, tx_id, ok, rows, digest, error, duplicate_of, touched)
        ledger.add(outcome)
        return outcome

    def _run(
        self, conn: sqlite3.Connection, body: Transaction
    ) -> tuple[bool, tuple[int, ...], str]:
        conn.execute("SAVEPOINT tx")
        # SQLite stops a write that would take the file past max_page_count (SQLITE_FULL):
        # the transaction's growth is bounded while it runs, not found after the fact.
        (pages,) = conn.execute("PRAGMA page_count").fetchone()
        conn.execute(f"PRAGMA max_page_count = {pages + self._growth_pages}")
        budget = StepBudget(self.steps_max, self._stopping)
        guard = self._guard
        guard.start(conn, body.now_unix_us)
        self._touched.clear()
        self._touched_digest = b""
        costed = self._costed
        costed.budget, costed.failure = budget, ""
        conn.set_progress_handler(budget, PROGRESS_EVERY_STEPS)
        rows: list[int] = []
        cursor: sqlite3.Cursor | None = None
        try:
            for statement in body.statements:
                cursor = conn.execute(user_sql(statement.sql), statement.bound())
                # A statement with rows (INSERT ... RETURNING, a SELECT) is not finished
                # until they are read: unread, it kept the savepoint from being released
                # and every DC's pipeline restarted for ever. Read and dropped a page at
                # a time (the step budget counts this too); the count is then final.
                while cursor.fetchmany(DRAINED_ROWS_PER_FETCH):
                    pass
                rows.append(max(cursor.rowcount, 0))
                cursor.close()
        except Exception as error:
            # Every replica runs the same statements on the same data with the same code,
            # so whatever they raise, they raise alike: a FAILED verdict, never an error
            # that escapes the apply and restarts the pipeline (issue 48).
            if cursor is not None:
                cursor.close()  # a statement cut short mid-rows must not outlive it
            self._end_user_statements(conn)
            if self._stopping.is_set():
                raise ApplyInterrupted("the worker is stopping") from error
            if conn.in_transaction:
                conn.execute("ROLLBACK TO tx")
                conn.execute("RELEASE tx")
            if budget.exceeded:
                return False, (), budget.refusal("the transaction")
            if guard.refusal:
                return False, (), f"refused: {guard.refusal}"
            if costed.failure:
                return False, (), costed.failure
            if getattr(error, "sqlite_errorcode", None) == sqlite3.SQLITE_FULL:
                return (
                    False,
                    (),
                    (
                        f"the transaction would grow the database by more than "
                        f"{self.growth_bytes_max:,} bytes (worker --growth-bytes-max), or "
                        "the worker's disk is full"
                    ),
                )
            if isinstance(error, MemoryError):
                return (
                    False,
                    (),
                    (
                        f"the transaction ran out of the worker's SQLite memory ceiling of "
                        f"{self.heap_bytes_max:,} bytes (worker --heap-bytes-max)"
                    ),
                )
            return False, (), f"{type(error).__name__}: {error}"
        self._end_user_statements(conn)
        problem = guard.largest_rowid_taken(conn) if not self._batching else ""
        if problem:
            conn.execute("ROLLBACK TO tx")
            conn.execute("RELEASE tx")
            return False, (), f"refused: {problem}"
        if self.touched_digest:
            if guard.schema_changed:
                make_triggers(conn)
            self._touched_digest = self._touched.digest(conn)
        conn.execute("RELEASE tx")
        return True, tuple(rows), ""

    def _end_user_statements(self, conn: sqlite3.Connection) -> None:
        """After a transaction's statements, ended or failed: the worker's own statements
        that follow run without the guard, the budget and the growth limit."""
        conn.set_progress_handler(None, 0)
        self._guard.end()
        self._costed.budget = None
        conn.execute(UNLIMITED_PAGES)

    def applied_ok(self, position: int) -> bool | None:
        with self._lock:
            row = self._conn.execute(
                "SELECT ok FROM _txsync_outcomes WHERE position = ?", (position,)
            ).fetchone()
        return None if row is None else bool(row[0])

    def position_of(self, tx_id: str) -> int | None:
        with self._lock:
            row = self._conn.execute(
                "SELECT position FROM _txsync_outcomes WHERE tx_id = ?", (tx_id,)
            ).fetchone()
        return None if row is None else int(row[0])

    def _recorded(self, position: int, tx_id: str) -> Outcome:
        row = self._conn.execute(
            "SELECT tx_id, ok, rows_affected, state_digest, error, duplicate_of "
            "FROM _txsync_outcomes "
            "WHERE position = ?",
            (position,),
        ).fetchone()
        return recorded_outcome(position, tx_id, row)

    def query(self, statement: Statement, max_rows: int) -> QueryResult:
        """Run a read-only statement on its own connection (reads never wait on writes in
        WAL mode); the applied position is read in the same snapshot as the rows."""
        conn = sqlite3.connect(
            f"file:{self.path}?mode=ro", uri=True, check_same_thread=False, timeout=BUSY_TIMEOUT_S
        )
        costed = self._read_functions()
        costed.failure = ""
        try:
            conn.execute("PRAGMA query_only=ON")
            conn.execute("BEGIN")
            position = int(conn.execute("SELECT position FROM _txsync_applied").fetchone()[0])
            guard = ReadGuard()
            conn.set_authorizer(guard)
            conn.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, self.value_bytes_max)
            costed.install(conn)
            budget = costed.budget = StepBudget(self.steps_max, self._stopping)
            conn.set_progress_handler(budget, PROGRESS_EVERY_STEPS)
            try:
                cursor = conn.execute(statement.sql, statement.bound())
                columns = tuple(d[0] for d in cursor.description or ())
                rows, truncated = collect_rows(cursor, max_rows)
            except sqlite3.DatabaseError as error:
                if budget.exceeded:
                    raise QueryRefused(budget.refusal("the query")) from None
                if guard.refusal:
                    raise QueryRefused(f"refused: {guard.refusal}") from None
                if costed.failure:
                    raise QueryRefused(costed.failure) from None
                raise QueryRefused(f"{type(error).__name__}: {error}") from None
            return QueryResult(columns, rows, truncated, position)
        finally:
            conn.close()
            costed.budget = None

    def _read_functions(self) -> CostedFunctions:
        """The read thread's own ``CostedFunctions`` (a thread runs one read at a time):
        its side connection is made once per thread, not once per read."""
        costed: CostedFunctions | None = getattr(self._read_costed, "functions", None)
        if costed is None:
            costed = self._read_costed.functions = CostedFunctions(self.value_bytes_max)
        return costed


def _content_digest(conn: sqlite3.Connection) -> bytes:
    """SHA-256 over every user table's definition and rows, tables by name and rows in
    rowid order (primary-key order for tables without rowids). A table that cannot be
    read whole (a generated column whose expression fails on a stored row: issue 48's
    time bomb) adds its error instead of its rows, alike at every replica."""
    sha = hashlib.sha256()
    tables = conn.execute(
        "SELECT name, sql FROM sqlite_master WHERE type = 'table' "
        "AND name NOT LIKE 'sqlite\\_%' ESCAPE '\\' "
        "AND name NOT LIKE '\\_txsync\\_%' ESCAPE '\\' ORDER BY name"
    ).fetchall()
    for name, definition in tables:
        sha.update(f"{name}\n{definition}\n".encode())
        quoted = '"' + str(name).replace('"', '""') + '"'
        try:
            try:
                rows = conn.execute(f"SELECT * FROM {quoted} ORDER BY rowid")
            except sqlite3.OperationalError:  # WITHOUT ROWID: its primary key orders it
                rows = conn.execute(f"SELECT * FROM {quoted} ORDER BY 1")
            for row in rows:
                sha.update(repr(row).encode())
        except sqlite3.Error as error:
            sha.update(f"unreadable: {type(error).__name__}: {error}\n".encode())
    return sha.digest()
