"""The SQLite guard (issue 17): no route from a user's statement reaches the worker's
bookkeeping or a value that could differ between replicas. Each probe is a transaction
of its own on a real worker database; each must end FAILED with the guard's reason,
leave the bookkeeping and the data as they were, and let the next transaction apply."""

from __future__ import annotations

import re
import sqlite3
from pathlib import Path

import pytest

from txsync.worker.backend import QueryRefused, ToApply
from txsync.worker.outcomes import Outcome
from txsync.worker.sqlite_backend import SqliteBackend
from txsync.worker.transactions import Statement, Transaction, transaction


def _body(*sql: str) -> Transaction:
    return transaction(*sql)


SETUP = (
    "CREATE TABLE t (k INTEGER PRIMARY KEY, v)",
    "CREATE TABLE stamped (k, at DEFAULT CURRENT_TIMESTAMP)",
    "CREATE TABLE chance (k, r DEFAULT (random()))",
    "CREATE TABLE timed (k, at DEFAULT (datetime('now')))",
    "CREATE TABLE blob_timed (k, at DEFAULT (strftime('%H:%M:%f', X'6E6F77')))",
)

BOOKKEEPING = [
    "CREATE TRIGGER skipper AFTER UPDATE ON _txsync_applied WHEN NEW.position=3 "
    "BEGIN UPDATE _txsync_applied SET position=position+2; END",
    "ALTER TABLE _txsync_outcomes ADD COLUMN z",
    "ALTER TABLE main._TXSYNC_OUTCOMES RENAME TO gone",
    "CREATE INDEX i ON _txsync_outcomes (tx_id)",
    "CREATE UNIQUE INDEX i ON _txsync_applied (position)",
    'UPDATE "_txsync_applied" SET position = 99',
    "UPDATE main.[_txsync_applied] SET position = 99",
    "UPDATE `_TxSync_Applied` SET position = 99",
    "DELETE FROM _txsync_outcomes",
    "DELETE FROM _txsync_keys",
    "UPDATE _txsync_key_windows SET kept_until_ms = 0",
    "INSERT INTO _txsync_outcomes VALUES (99, 'x', 1, '', x'00', '')",
    "DROP TABLE _txsync_outcomes",
    "INSERT INTO t (v) SELECT error FROM _txsync_outcomes",  # differs between replicas
    "CREATE TABLE _txsync_mine (a)",
    "REPLACE INTO _txsync_applied VALUES (1, 0, '', zeroblob(32))",
]
CONTROL = [
    "COMMIT",
    "/* x */ COMMIT",
    "ROLLBACK",
    "BEGIN",
    "SAVEPOINT s",
    "RELEASE tx",
    "ATTACH DATABASE ':memory:' AS other",
    "VACUUM INTO '/tmp/txsync-guard-copy.db' -- SQLite refuses it in a transaction too",
    "PRAGMA synchronous=OFF",
    "PRAGMA writable_schema=ON",
    "CREATE TEMP TABLE scratch (a)",
    "CREATE TEMP TRIGGER tt AFTER INSERT ON t BEGIN SELECT 1; END",
    "CREATE TEMP VIEW tv AS SELECT 1",
    "SELECT load_extension('libevil')",
]
NONDETERMINISTIC = [
    "INSERT INTO t (v) VALUES (random())",
    "INSERT INTO t (v) VALUES (random/**/())",
    "INSERT INTO t (v) VALUES (RANDOM())",
    "INSERT INTO t (v) VALUES (randomblob(8))",
    "INSERT INTO t (v) VALUES (CURRENT_TIMESTAMP)",
    "INSERT INTO t (v) VALUES (current_date)",
    "INSERT INTO t (v) VALUES (strftime('%f'))",
    "INSERT INTO t (v) VALUES (strftime('%s', 'now'))",
    "INSERT INTO t (v) VALUES (date())",
    "INSERT INTO t (v) VALUES (date('NOW '))",
    "INSERT INTO t (v) VALUES (unixepoch())",
    "INSERT INTO t (v) VALUES (julianday('now'))",
    "INSERT INTO t (v) VALUES (datetime('2024-01-01', 'localtime'))",
    "INSERT INTO t (v) VALUES (datetime(0, 'unixepoch', 'utc'))",
    "INSERT INTO t (v) VALUES (total_changes())",
    "INSERT INTO t (v) VALUES (sqlite_version())",
    "INSERT INTO t (v) SELECT abs(random()) FROM t",
    "INSERT INTO stamped (k) VALUES (1)",  # DEFAULT CURRENT_TIMESTAMP
    "INSERT INTO chance (k) VALUES (1)",  # DEFAULT (random())
    "INSERT INTO timed (k) VALUES (1)",  # DEFAULT (datetime('now'))
    # 'now' and the zone modifiers as SQLite reads them, not as they are spelled (issue 48)
    "INSERT INTO t (v) VALUES (strftime('%Y-%m-%d %H:%M:%f', X'6E6F77'))",
    "INSERT INTO t (v) VALUES (date('no' || 'w' || char(0)))",
    "INSERT INTO t (v) VALUES (datetime('2024-01-01', X'6C6F63616C74696D65'))",
    "INSERT INTO t (v) VALUES (datetime(0, 'unixepoch', 'utc' || char(0) || 'x'))",
    "INSERT INTO blob_timed (k) VALUES (1)",  # DEFAULT (strftime(..., X'6E6F77'))
    "INSERT INTO t (v) SELECT count(*) FROM sqlite_stmt",
    "INSERT INTO t (v) SELECT sum(pgsize) FROM dbstat",
]


@pytest.fixture
def backend(tmp_path: Path) -> SqliteBackend:
    backend = SqliteBackend(tmp_path / "w.db")
    assert backend.apply(1, "tx1", _body(*SETUP)).ok
    assert backend.apply(2, "tx2", _body("INSERT INTO t (v) VALUES ('before')")).ok
    return backend


def _probe(backend: SqliteBackend, sql: str) -> Outcome:
    """Apply ``sql`` after a harmless insert (which must be rolled back with it), then
    check that nothing changed and the next transaction applies."""
    before = backend.applied()
    outcome = backend.apply(
        before.position + 1, "probe", _body("INSERT INTO t (v) VALUES (1)", sql)
    )
    assert not outcome.ok, f"{sql!r} was applied"
    if "VACUUM" not in sql:
        assert outcome.error.startswith("refused: "), outcome.error
    after = backend.applied()
    assert after.position == before.position + 1, "the failure still advances the position"
    rows = backend.query(Statement("SELECT v FROM t ORDER BY k"), 10).rows
    assert rows == (("before",),), "the refused transaction left no trace"
    tables = backend.query(
        Statement("SELECT name FROM sqlite_master WHERE name LIKE '%txsync%'"),
        10,
    ).rows
    assert sorted(tables) == [
        ("_txsync_applied",), ("_txsync_key_windows",), ("_txsync_key_windows_taken",),
        ("_txsync_keys",), ("_txsync_keys_position",), ("_txsync_outcomes",),
        ("sqlite_autoindex__txsync_keys_1",),
    ]  # fmt: skip
    following = backend.apply(after.position + 1, "next", _body("DELETE FROM t WHERE v = 'x'"))
    assert following.ok, following.error
    return outcome


@pytest.mark.parametrize("sql", BOOKKEEPING)
def test_no_statement_reaches_the_bookkeeping(backend: SqliteBackend, sql: str) -> None:
    outcome = _probe(backend, sql)
    assert "bookkeeping" in outcome.error


@pytest.mark.parametrize("sql", CONTROL)
def test_no_statement_controls_the_transaction_or_the_connection(
    backend: SqliteBackend, sql: str
) -> None:
    outcome = _probe(backend, sql)
    assert "not allowed" in outcome.error or "VACUUM" in sql
    assert not Path("/tmp/txsync-guard-copy.db").exists()


@pytest.mark.parametrize("sql", NONDETERMINISTIC)
def test_values_that_could_differ_between_replicas_are_refused(
    backend: SqliteBackend, sql: str
) -> None:
    outcome = _probe(backend, sql)
    assert "every replica" in outcome.error or "replicas apply it" in outcome.error


def test_triggers_and_views_cannot_reach_the_bookkeeping_when_used(
    backend: SqliteBackend,
) -> None:
    """A trigger or view whose body names the bookkeeping may be created on user tables:
    its body is checked where it is used, inside every later statement that fires or
    reads it."""
    created = backend.apply(3, "tx3", _body(
        "CREATE TRIGGER later AFTER INSERT ON t BEGIN UPDATE _txsync_applied SET position = 9; END"
    ))  # fmt: skip
    assert created.ok, created.error
    fired = backend.apply(4, "tx4", _body("INSERT INTO t (v) VALUES ('fires')"))
    assert not fired.ok and "bookkeeping" in fired.error
    assert backend.applied().position == 4
    assert backend.apply(5, "tx5", _body("DROP TRIGGER later")).ok
    assert backend.apply(6, "tx6", _body("INSERT INTO t (v) VALUES ('after')")).ok
    assert backend.apply(7, "tx7", _body("CREATE VIEW peek AS SELECT * FROM _txsync_outcomes")).ok
    peeked = backend.apply(8, "tx8", _body("INSERT INTO t (v) SELECT error FROM peek"))
    assert not peeked.ok and "bookkeeping" in peeked.error


def test_deterministic_time_arithmetic_and_counters_are_allowed_and_agree(
    tmp_path: Path,
) -> None:
    """Date arithmetic on given times answers as SQLite's own; ``last_insert_rowid()``
    and ``changes()`` start every transaction alike, on a restarted worker too."""
    statements = _body(
        "INSERT INTO t (v) VALUES (date('2024-02-28', '+1 day'))",
        "INSERT INTO t (v) VALUES (strftime('%Y-%m-%d %H:%M:%f', 1700000000.5, 'unixepoch'))",
        "INSERT INTO t (v) VALUES (unixepoch('2024-01-01 00:00:00'))",
        "INSERT INTO t (v) VALUES (julianday('2000-01-01'))",
        "INSERT INTO t (v) VALUES (last_insert_rowid())",
    )
    first = SqliteBackend(tmp_path / "a.db")
    second = SqliteBackend(tmp_path / "b.db")
    history = [
        _body(SETUP[0]),
        _body("INSERT INTO t (v) VALUES (changes()), (last_insert_rowid())"),
        statements,
    ]
    outcomes_first = [first.apply(n, f"tx{n}", b) for n, b in enumerate(history, start=1)]
    second.apply(1, "tx1", history[0])
    second.close()
    second = SqliteBackend(tmp_path / "b.db")  # a restart: a fresh connection
    outcomes_second = [second.apply(n, f"tx{n}", b) for n, b in enumerate(history[1:], 2)]
    assert all(o.ok for o in outcomes_first), [o.error for o in outcomes_first]
    assert outcomes_first[-1].state_digest == outcomes_second[-1].state_digest
    sql = Statement("SELECT v FROM t ORDER BY k")
    rows = first.query(sql, 10).rows
    assert rows == second.query(sql, 10).rows
    # changes() is 1 and last_insert_rowid() 0 at the start of every transaction; the
    # second row reads 0 too because the touch triggers (on by default) make SQLite
    # compute every row of a multi-row VALUES before inserting the first.
    assert rows == (
        (1,), (0,), ("2024-02-29",), ("2023-11-14 22:13:20.500",), (1704067200,),
        (2451544.5,), (6,),
    )  # fmt: skip


@pytest.mark.parametrize(
    ("sql", "words"),
    [
        ("SELECT fts3_tokenizer('simple')", "fts3_tokenizer() is not allowed"),
        ("SELECT fts3_tokenizer('x', X'4141414141414141')", "fts3_tokenizer() is not allowed"),
        ("SELECT load_extension('libevil')", "load_extension() is not allowed"),
        ("SELECT * FROM _txsync_keys", "bookkeeping"),
        ("SELECT error FROM main._TXSYNC_OUTCOMES", "bookkeeping"),
    ],
)
def test_reads_reach_no_pointer_and_no_bookkeeping(
    backend: SqliteBackend, sql: str, words: str
) -> None:
    """A read may leak no address nor register one (fts3_tokenizer), and may not see
    other clients' idempotency keys and errors (issue 48)."""
    with pytest.raises(QueryRefused, match=re.escape(words)):
        backend.query(Statement(sql), 10)


def test_reads_may_use_any_function(backend: SqliteBackend) -> None:
    """Reads are answered by one worker and never replicated."""
    result = backend.query(Statement("SELECT random() IS NOT NULL, date()"), 1)
    assert result.rows[0][0] == 1


def test_memory_past_the_ceiling_fails_naming_the_limit(tmp_path: Path) -> None:
    backend = SqliteBackend(tmp_path / "w.db", heap_bytes_max=24 * 1024 * 1024)
    try:
        assert backend.apply(1, "tx1", _body("CREATE TABLE b (v)")).ok
        outcome = backend.apply(2, "tx2", _body("INSERT INTO b VALUES (hex(zeroblob(30000000)))"))
        assert not outcome.ok
        assert "memory ceiling of 25,165,824 bytes (worker --heap-bytes-max)" in outcome.error
        assert backend.apply(3, "tx3", _body("INSERT INTO b VALUES (hex(zeroblob(1000)))")).ok
    finally:
        # The ceiling is the whole process's: lift it for the tests that run after.
        backend.close()
        with sqlite3.connect(":memory:") as conn:
            conn.execute("PRAGMA hard_heap_limit=0")


def test_the_largest_rowid_is_never_committed_batched_or_not(backend: SqliteBackend) -> None:
    """Once a table holds rowid 2**63-1, SQLite picks random rowids for the next inserts,
    different at every replica. The transaction that takes it fails, alone (a batch is
    checked once at its end and, if it took it, applied again one by one), and the
    inserts after it get the usual next rowid everywhere."""
    largest = "INSERT INTO t (k, v) VALUES (9223372036854775807, 'last')"
    outcome = _probe(backend, largest)
    assert "random rowids" in outcome.error
    position = backend.applied().position
    batch = [
        ToApply(position + 1, "a", _body("INSERT INTO t (v) VALUES ('a')")),
        ToApply(position + 2, "b", _body("INSERT INTO t (v) VALUES ('b')", largest)),
        ToApply(position + 3, "c", _body("INSERT INTO t (v) VALUES ('c')")),
        ToApply(position + 4, "d", _body("UPDATE t SET k = 9223372036854775807 WHERE v = 'c'")),
    ]
    outcomes, failure = backend.apply_many(batch)
    assert failure is None
    assert [o.ok for o in outcomes] == [True, False, True, False]
    assert all("random rowids" in o.error for o in outcomes if not o.ok)
    rows = backend.query(Statement("SELECT k, v FROM t ORDER BY k"), 10).rows
    assert rows == ((1, "before"), (2, "a"), (3, "c"))


NOW_UNIX_US = 1_700_000_000_123_456
NOW_TEXT = "2023-11-14 22:13:20.123"
"""``NOW_UNIX_US`` as SQLite writes a time value: to the millisecond, as its 'now'."""
CLOCK_READS = (
    "CURRENT_TIMESTAMP", "current_date", "CURRENT_TIME", "datetime('now')", "date()",
    "strftime('%Y-%m-%d %H:%M:%f', X'6E6F77')", "time('no' || 'w' || char(0))",
    "unixepoch()", "strftime('%s')", "julianday('now')", "unixepoch('now', 'subsec')",
    "datetime('now', '+1 day', 'start of day')",
)  # fmt: skip
"""Every way SQL reads the clock, and what each answers at ``NOW_TEXT``."""
CLOCK_ANSWERS = (
    "2023-11-14 22:13:20", "2023-11-14", "22:13:20", "datetime(?)", "date(?)",
    "strftime('%Y-%m-%d %H:%M:%f', ?)", "time(?)", "unixepoch(?)", "strftime('%s', ?)",
    "julianday(?)", "unixepoch(?, 'subsec')", "datetime(?, '+1 day', 'start of day')",
)  # fmt: skip


def _clock_reads(now_unix_us: int) -> Transaction:
    return Transaction(
        (
            Statement("INSERT INTO stamped (k) VALUES (1)"),  # DEFAULT CURRENT_TIMESTAMP
            Statement("INSERT INTO blob_timed (k) VALUES (1)"),  # DEFAULT (... X'6E6F77')
            *(Statement(f"INSERT INTO t (v) VALUES ({sql})") for sql in CLOCK_READS),
        ),
        now_unix_us=now_unix_us,
    )


def test_the_current_time_is_the_transactions_own_at_every_replica(tmp_path: Path) -> None:
    """Issue 48: 'now' in every spelling, and the no-time forms, read the time the body
    carries (``TxBody.now_unix_us``): two replicas write the same values, those SQLite
    itself computes at that time, and a body with another time writes other values."""
    plain = sqlite3.connect(":memory:")
    expected = [
        plain.execute(f"SELECT {answer}", (NOW_TEXT,)).fetchone()[0] if "(" in answer else answer
        for answer in CLOCK_ANSWERS
    ]
    tables = "SELECT v FROM t ORDER BY k", "SELECT at FROM stamped", "SELECT at FROM blob_timed"
    written = []
    for name in ("a", "b"):
        replica = SqliteBackend(tmp_path / f"{name}.db")
        assert replica.apply(1, "tx1", _body(*SETUP)).ok
        outcome = replica.apply(2, "tx2", _clock_reads(NOW_UNIX_US))
        assert outcome.ok, outcome.error
        written.append([replica.query(Statement(sql), 100).rows for sql in tables])
        later = replica.apply(3, "tx3", _clock_reads(NOW_UNIX_US + 86_400_000_000))
        assert later.ok, later.error
        assert replica.query(Statement("SELECT at FROM stamped"), 10).rows == (
            ("2023-11-14 22:13:20",),
            ("2023-11-15 22:13:20",),
        )
        replica.close()
    assert written[0] == written[1]
    values, stamped, blob_timed = written[0]
    assert [v for (v,) in values] == expected
    assert stamped == (("2023-11-14 22:13:20",),)
    assert blob_timed == (("22:13:20.123",),)


def test_a_body_without_a_time_cannot_read_the_clock(backend: SqliteBackend) -> None:
    outcome = _probe(backend, "INSERT INTO stamped (k) VALUES (1)")
    assert "carries none (TxBody.now_unix_us" in outcome.error


WORKER_STATEMENTS = [
    Statement("SELECT position, tx_id, state_digest FROM _txsync_applied"),
    Statement(
        "UPDATE _txsync_applied SET position = ?, tx_id = ?, state_digest = ?", (99, "x", b"")
    ),
    Statement("DELETE FROM _txsync_outcomes WHERE position <= ?", (10**9,)),
    Statement("INSERT OR REPLACE INTO _txsync_keys VALUES (?, ?, ?, ?)", ("k", "x", 1, 1)),
    Statement("PRAGMA page_count"),
]
"""The worker's own statements, word for word: SQLite prepared (and cached) them while
the guard did not judge (it judges a statement when it is prepared)."""


@pytest.mark.parametrize("statement", WORKER_STATEMENTS, ids=lambda s: s.sql[:40])
def test_a_users_statement_is_never_a_cached_statement_of_the_workers(
    backend: SqliteBackend, statement: Statement
) -> None:
    for _ in range(2):  # each of the worker's statements has run, and is cached
        backend.apply(
            backend.applied().position + 1, "warm", _body("INSERT INTO t (v) VALUES ('x')")
        )
    before = backend.applied()
    outcome = backend.apply(before.position + 1, "probe", Transaction((statement,)))
    assert not outcome.ok and outcome.error.startswith("refused: "), outcome.error
    assert backend.applied().position == before.position + 1
