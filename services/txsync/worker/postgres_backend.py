"""The PostgreSQL backend (psycopg 3): the same contract as ``SqliteBackend``.

A transaction's statements and the ``_txsync_applied`` row (position, tx id, running
digest) change in one PostgreSQL transaction, with the row locked ``FOR UPDATE`` so that
two writers can never interleave; a failing statement rolls back to a savepoint and the
position advances with the outcome FAILED. Statements use ``?`` placeholders as on
SQLite (a transaction is applied by every DC's workers, so it has one text); they are
rewritten to psycopg's ``%s`` outside string literals.

The bookkeeping lives in schema ``_txsync`` (``applied``, ``outcomes``) and user
statements run as a role without rights on it, checked first by PostgreSQL's own parser
(``postgres_guard``); each statement has ``statement_timeout_ms`` (``SET LOCAL``).
Reads run in a read-only, repeatable-read transaction, as the same role, that also
reads the applied position, so rows and position come from one snapshot.

The worker's own connection (the conninfo it is given) must be able to create the
schema and the role (``CREATEROLE``) at start-up; it owns the bookkeeping, and hands the
user tables to the role (once, for tables made before the role existed).
"""

from __future__ import annotations

import glob
import hashlib
import re
import shutil
import subprocess
import threading
import time
from collections.abc import Sequence
from decimal import Decimal
from pathlib import Path

import psycopg
from psycopg import sql as psql

from txsync.telemetry import work
from txsync.worker.backend import (
    APPLY_BATCH_MAX,
    CONTENT_CHECK_EVERY_DEFAULT,
    KEYS_PRUNE_EVERY,
    STATEMENT_TIMEOUT_MS_DEFAULT,
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
from txsync.worker.postgres_guard import (
    BOOKKEEPING_SCHEMA,
    USER_ROLE,
    Refused,
    check_parameter,
    check_statement,
)
from txsync.worker.transactions import Statement, Transaction

_GENESIS_ROW = f"""INSERT INTO {BOOKKEEPING_SCHEMA}.applied (id, position, tx_id, state_digest)
    VALUES (1, 0, '', %s)
    ON CONFLICT (id) DO NOTHING"""
_SETUP = (
    f"CREATE SCHEMA IF NOT EXISTS {BOOKKEEPING_SCHEMA}",
    # Before the schema existed the bookkeeping lived in public, where users could reach it.
    f"""DO $$ BEGIN
        IF to_regclass('public._txsync_applied') IS NOT NULL
           AND to_regclass('{BOOKKEEPING_SCHEMA}.applied') IS NULL THEN
            ALTER TABLE public._txsync_applied SET SCHEMA {BOOKKEEPING_SCHEMA};
            ALTER TABLE {BOOKKEEPING_SCHEMA}._txsync_applied RENAME TO applied;
            ALTER TABLE public._txsync_outcomes SET SCHEMA {BOOKKEEPING_SCHEMA};
            ALTER TABLE {BOOKKEEPING_SCHEMA}._txsync_outcomes RENAME TO outcomes;
        END IF;
    END $$""",
    f"""CREATE TABLE IF NOT EXISTS {BOOKKEEPING_SCHEMA}.applied (
        id INTEGER PRIMARY KEY CHECK (id = 1),
        position BIGINT NOT NULL,
        tx_id TEXT NOT NULL,
        state_digest BYTEA NOT NULL)""",
    _GENESIS_ROW,
    f"""CREATE TABLE IF NOT EXISTS {BOOKKEEPING_SCHEMA}.outcomes (
        position BIGINT PRIMARY KEY,
        tx_id TEXT NOT NULL,
        ok BOOLEAN NOT NULL,
        rows_affected TEXT NOT NULL,
        state_digest BYTEA NOT NULL,
        error TEXT NOT NULL)""",
    # Made before keys travelled: no duplicate_of.
    f"""ALTER TABLE {BOOKKEEPING_SCHEMA}.outcomes
        ADD COLUMN IF NOT EXISTS duplicate_of TEXT NOT NULL DEFAULT ''""",
    f"""CREATE TABLE IF NOT EXISTS {BOOKKEEPING_SCHEMA}.keys (
        key TEXT PRIMARY KEY,
        tx_id TEXT NOT NULL,
        position BIGINT NOT NULL,
        ok BOOLEAN NOT NULL)""",
    f"CREATE INDEX IF NOT EXISTS keys_position ON {BOOKKEEPING_SCHEMA}.keys (position)",
    *windows_table_sql(f"{BOOKKEEPING_SCHEMA}.key_windows", bigint="BIGINT"),
    f"""DO $$ BEGIN
        IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = '{USER_ROLE}') THEN
            CREATE ROLE {USER_ROLE} NOLOGIN;
        END IF;
    END $$""",
    f"REVOKE ALL ON SCHEMA {BOOKKEEPING_SCHEMA} FROM PUBLIC",
    "REVOKE CREATE ON SCHEMA public FROM PUBLIC",
    f"GRANT USAGE, CREATE ON SCHEMA public TO {USER_ROLE}",
    "REVOKE USAGE ON LANGUAGE sql, plpgsql FROM PUBLIC",
    # The user tables belong to the role (those made before it existed, or restored from
    # a snapshot, belong to the worker's own user): their DDL needs ownership.
    f"""DO $$ DECLARE item record; BEGIN
        FOR item IN SELECT c.relname, c.relkind FROM pg_class c
                JOIN pg_namespace n ON n.oid = c.relnamespace
                WHERE n.nspname = 'public' AND c.relkind IN ('r', 'p', 'v', 'm', 'S')
                AND pg_get_userbyid(c.relowner) <> '{USER_ROLE}' LOOP
            EXECUTE format('ALTER %s public.%I OWNER TO {USER_ROLE}',
                CASE item.relkind WHEN 'v' THEN 'VIEW' WHEN 'm' THEN 'MATERIALIZED VIEW'
                    WHEN 'S' THEN 'SEQUENCE' ELSE 'TABLE' END, item.relname);
        END LOOP;
    END $$""",
)
READ_PAGE_ROWS = 256
"""Rows a read's server-side cursor fetches at a time (``query``)."""
_APPLIED = f"{BOOKKEEPING_SCHEMA}.applied"
_OUTCOMES = f"{BOOKKEEPING_SCHEMA}.outcomes"
_LEDGER = LedgerSql.for_tables(_APPLIED, _OUTCOMES, "%s", lock="FOR UPDATE")
_KEY_BOOK = KeyBook.for_tables(
    f"{BOOKKEEPING_SCHEMA}.keys", f"{BOOKKEEPING_SCHEMA}.key_windows", "%s"
)
_LITERAL_OR_PLACEHOLDER = re.compile(r"'(?:[^']|'')*'|\"(?:[^\"]|\"\")*\"|\?|%")


def to_numbered(sql: str) -> str:
    """``?`` placeholders as PostgreSQL's own ``$1, $2, ...`` (what its parser reads)."""
    numbers = iter(range(1, 100_000))

    def replace(match: re.Match[str]) -> str:
        token = match.group(0)
        return f"${next(numbers)}" if token == "?" else token

    return _LITERAL_OR_PLACEHOLDER.sub(replace, sql)


def to_psycopg(sql: str) -> str:
    """``?`` placeholders become ``%s`` and a literal ``%`` becomes ``%%``, outside quotes."""

    def replace(match: re.Match[str]) -> str:
        token = match.group(0)
        return {"?": "%s", "%": "%%"}.get(token, token)

    return _LITERAL_OR_PLACEHOLDER.sub(replace, sql)


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

    def __init__(
        self,
        conninfo: str,
        *,
        statement_timeout_ms: int = STATEMENT_TIMEOUT_MS_DEFAULT,
        content_check_every: int = CONTENT_CHECK_EVERY_DEFAULT,
    ) -> None:
        self._conninfo = conninfo
        self.statement_timeout_ms = statement_timeout_ms
        self.content_check_every = content_check_every
        self._stopping = threading.Event()
        self._lock = threading.Lock()
        self._conn = psycopg.connect(conninfo, autocommit=True)
        self._set_up(self._conn)

    @staticmethod
    def _set_up(conn: psycopg.Connection[tuple[object, ...]]) -> None:
        # Serialised: workers of one cluster creating the role at once would collide.
        with conn.transaction():
            conn.execute("SELECT pg_advisory_xact_lock(hashtext('txsync worker set-up'))")
            for statement in _SETUP:
                params = (GENESIS_DIGEST,) if statement is _GENESIS_ROW else None
                conn.execute(statement, params)

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
            row = conn.execute(f"SELECT position, tx_id, state_digest FROM {_APPLIED}").fetchone()
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
                conn.execute(f"DROP SCHEMA IF EXISTS {BOOKKEEPING_SCHEMA} CASCADE")
                conn.execute("CREATE SCHEMA public")
            _pg_tool("pg_restore", "--single-transaction", "--exit-on-error", "--no-owner",
                     "--clean", "--if-exists",
                     f"--dbname={self._conninfo}", str(snapshot))  # fmt: skip
            self._conn = psycopg.connect(self._conninfo, autocommit=True)
            self._set_up(self._conn)
        return self.applied()

    def storage(self) -> Storage:
        """The database's size; the server's disk is not visible from here."""
        with psycopg.connect(self._conninfo, autocommit=True) as conn:
            row = conn.execute("SELECT pg_database_size(current_database())").fetchone()
        assert row is not None
        return Storage(int(row[0]))

    def applied(self) -> Applied:
        """The committed position, on a connection of its own (never waits for an apply)."""
        with psycopg.connect(self._conninfo, autocommit=True) as conn:
            row = conn.execute(f"SELECT position, tx_id, state_digest FROM {_APPLIED}").fetchone()
        assert row is not None
        return Applied(int(row[0]), str(row[1]), bytes(row[2]))

    def apply(self, position: int, tx_id: str, body: Transaction, *, run: bool = True) -> Outcome:
        with self._lock, self._conn.transaction():
            work.count(work.DB_COMMITS)
            ledger = self._ledger()
            outcome = self._apply_in_transaction(ledger, ToApply(position, tx_id, body, run))
            ledger.write()
            return outcome

    def apply_many(self, batch: Sequence[ToApply]) -> BatchApplied:
        assert 0 < len(batch) <= APPLY_BATCH_MAX
        outcomes: list[Outcome] = []
        with self._lock, self._conn.transaction():
            work.count(work.DB_COMMITS)
            ledger = self._ledger()
            failure: ApplyOrderError | None = None
            for item in batch:
                try:
                    outcomes.append(self._apply_in_transaction(ledger, item))
                except ApplyOrderError as error:  # raised before it wrote anything
                    failure = error  # the outcomes before it commit
                    break
            ledger.write()
        return outcomes, failure

    def _ledger(self) -> Ledger:
        """The bookkeeping of the database transaction just begun."""
        conn = self._conn

        def execute_many(sql: str, rows: list[tuple[object, ...]]) -> None:
            conn.cursor().executemany(sql, rows)

        return Ledger(_LEDGER, _KEY_BOOK, conn.execute, execute_many)

    def _apply_in_transaction(self, ledger: Ledger, item: ToApply) -> Outcome:
        """Under the lock, inside a database transaction: a user statement's error stays
        inside its own savepoint (``_run``), so a batch's transactions never undo each
        other."""
        position, tx_id, body, run = item.position, item.tx_id, item.body, item.run
        conn = self._conn
        last, digest = ledger.position, ledger.digest
        if position <= last:
            return ledger.outcomes.get(position) or self._recorded(position, tx_id)
        if position != last + 1:
            raise ApplyOrderError(f"position {position} after {last}: a gap")
        ok, error = False, "not run: the DC's testing worker failed it"
        rows: tuple[int, ...] = ()
        key = body.idempotency_key
        if "\0" in key:  # the store refuses it; PostgreSQL text cannot hold it
            key, run, error = "", False, "refused: the idempotency key contains NUL"
        keys = ledger.keys
        first = keys.holder(position, body) if key else None
        if first is not None:
            ok, error = first.ok, first.error()
        elif run:
            ok, rows, error = self._run(conn, body)
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
        outcome = Outcome(position, tx_id, ok, rows, digest, error, duplicate_of)
        ledger.add(outcome)
        return outcome

    def _run(
        self, conn: psycopg.Connection[tuple[object, ...]], body: Transaction
    ) -> tuple[bool, tuple[int, ...], str]:
        """The statements, as ``USER_ROLE`` under the statement timeout, in a savepoint."""
        rows: list[int] = []
        try:
            for statement in body.statements:
                check_statement(to_numbered(statement.sql))
                for param in statement.bound():
                    check_parameter(param)
        except Refused as refused:
            return False, (), f"refused: {refused}"
        conn.execute(f"SET LOCAL statement_timeout = {int(self.statement_timeout_ms)}")
        conn.execute("SET LOCAL search_path = public")
        conn.execute(f"SET LOCAL ROLE {USER_ROLE}")
        # The limit covers the whole transaction: each statement after the first may
        # take what the ones before it left (a thousand statements of 9 s each passed a
        # per-statement limit of 10 s while holding every worker for hours).
        deadline = time.monotonic() + self.statement_timeout_ms / 1000
        try:
            with conn.transaction():  # a savepoint inside the apply transaction
                for index, statement in enumerate(body.statements):
                    if index:
                        left_ms = int((deadline - time.monotonic()) * 1000)
                        if left_ms <= 0:
                            raise psycopg.errors.QueryCanceled("out of time")
                        conn.execute(f"SET LOCAL statement_timeout = {left_ms}")
                    params = statement.bound()
                    cursor = conn.execute(psql.SQL(to_psycopg(statement.sql)), params)
                    rows.append(max(cursor.rowcount, 0))
                    _still_in_the_transaction(conn)
        except psycopg.errors.QueryCanceled as error:
            if self._stopping.is_set():
                raise ApplyInterrupted("the worker is stopping") from error
            return (
                False,
                (),
                (
                    f"the transaction ran past the limit of {self.statement_timeout_ms:,} ms "
                    "(worker --statement-timeout-ms, for all its statements together)"
                ),
            )
        except (psycopg.Error, TypeError, ValueError) as error:
            # psycopg reads the statement and its parameters before sending them: a
            # placeholder it cannot fill ('%(x)s' with a list) raises TypeError there,
            # alike at every replica. Once it escaped the apply and every DC's pipeline
            # restarted for ever (issue 48). A lost connection is not a verdict: the
            # check below raises it.
            if self._stopping.is_set():
                raise ApplyInterrupted("the worker is stopping") from error
            return False, (), f"{type(error).__name__}: {error}".strip()
        finally:
            self._back_to_the_worker(conn)
        return True, tuple(rows), ""

    @staticmethod
    def _back_to_the_worker(conn: psycopg.Connection[tuple[object, ...]]) -> None:
        """Check, at the protocol level, that the user's statements left the worker's
        transaction open and the role as it was set (the guard refuses what could change
        either; this is the proof), then take the role back for the bookkeeping, and
        lift the time limit: the content check and the bookkeeping once ran under what
        the user's statements left of it, and a check cancelled at every retry stopped
        every DC (issue 48)."""
        _still_in_the_transaction(conn)
        row = conn.execute("SELECT current_user").fetchone()
        if row is None or row[0] != USER_ROLE:
            raise RuntimeError(f"a user statement changed the role to {row}")
        conn.execute("RESET ROLE")
        conn.execute("SET LOCAL statement_timeout = 0")

    def applied_ok(self, position: int) -> bool | None:
        with self._lock:
            row = self._conn.execute(
                f"SELECT ok FROM {_OUTCOMES} WHERE position = %s", (position,)
            ).fetchone()
        return None if row is None else bool(row[0])

    def position_of(self, tx_id: str) -> int | None:
        with self._lock:
            row = self._conn.execute(
                f"SELECT position FROM {_OUTCOMES} WHERE tx_id = %s", (tx_id,)
            ).fetchone()
        return None if row is None else int(row[0])

    def _recorded(self, position: int, tx_id: str) -> Outcome:
        row = self._conn.execute(
            "SELECT tx_id, ok, rows_affected, state_digest, error, duplicate_of "
            f"FROM {_OUTCOMES} "
            "WHERE position = %s",
            (position,),
        ).fetchone()
        return recorded_outcome(position, tx_id, row)

    def query(self, statement: Statement, max_rows: int) -> QueryResult:
        try:
            check_statement(to_numbered(statement.sql), read=True)
        except Refused as refused:
            raise QueryRefused(f"refused: {refused}") from None
        with psycopg.connect(self._conninfo, autocommit=True) as conn:
            conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
            try:
                row = conn.execute(f"SELECT position FROM {_APPLIED}").fetchone()
                assert row is not None
                conn.execute(f"SET LOCAL statement_timeout = {int(self.statement_timeout_ms)}")
                conn.execute("SET LOCAL search_path = public")
                conn.execute(f"SET LOCAL ROLE {USER_ROLE}")
                params = statement.bound()
                # A server-side cursor: rows come a page at a time while the answer is
                # built, and stop at its limits. A plain execute fetched the whole result
                # first (issue 48: 66 -> 1,243 MB for an answer cut to 8 MiB).
                cursor = conn.cursor(name="txsync_read")
                cursor.itersize = READ_PAGE_ROWS
                cursor.execute(psql.SQL(to_psycopg(statement.sql)), params)
                columns = tuple(d.name for d in cursor.description or ())
                result, truncated = collect_rows(cursor, max_rows, _plain)
            except psycopg.errors.QueryCanceled:
                raise QueryRefused(
                    f"the query ran past the limit of {self.statement_timeout_ms:,} ms "
                    "(worker --statement-timeout-ms)"
                ) from None
            except (psycopg.Error, TypeError, ValueError) as error:
                raise QueryRefused(f"{type(error).__name__}: {error}".strip()) from None
            conn.execute("ROLLBACK")
            return QueryResult(columns, result, truncated, int(row[0]))


def _still_in_the_transaction(conn: psycopg.Connection[tuple[object, ...]]) -> None:
    """The connection's transaction status, as the server last reported it (no round
    trip): a user statement must never end the worker's transaction."""
    status = conn.info.transaction_status
    if status not in (psycopg.pq.TransactionStatus.INTRANS, psycopg.pq.TransactionStatus.INERROR):
        raise RuntimeError(f"a user statement ended the worker's transaction ({status.name})")


def _content_digest(conn: psycopg.Connection[tuple[object, ...]]) -> bytes:
    """SHA-256 over every user table's rows, tables by name and rows in the order of
    their text form (computed by the server: md5 of each table's sorted rows)."""
    sha = hashlib.sha256()
    tables = conn.execute(
        "SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
        "WHERE n.nspname = 'public' AND c.relkind IN ('r', 'p') ORDER BY c.relname"
    ).fetchall()
    for (name,) in tables:
        query = psql.SQL(
            "SELECT coalesce(md5(string_agg(r::text, E'\\n' ORDER BY r::text)), '') "
            "FROM public.{} r"
        ).format(psql.Identifier(str(name)))
        row = conn.execute(query).fetchone()
        sha.update(f"{name}\n{row[0] if row else ''}\n".encode())
    return sha.digest()
