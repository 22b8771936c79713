"""Both backends (SQLite files, a real PostgreSQL): order, exactly once, failures,
digests, reads."""

from __future__ import annotations

import datetime as dt
import json
import sqlite3
import sys
import uuid
from decimal import Decimal
from pathlib import Path

import pytest

from tests.worker.conftest import BackendFactory
from txsync.dbapi import adapt
from txsync.worker import backend as backend_module
from txsync.worker.backend import ApplyOrderError, QueryRefused, ToApply
from txsync.worker.outcomes import GENESIS_DIGEST, Outcome
from txsync.worker.sqlite_backend import SqliteBackend
from txsync.worker.transactions import Statement, Transaction

SCHEMA = "CREATE TABLE accounts (id INTEGER PRIMARY KEY, balance INTEGER NOT NULL)"


def _body(*statements: tuple[str, tuple[int | str, ...]]) -> Transaction:
    return Transaction(tuple(Statement(sql, params) for sql, params in statements))


INSERT = "INSERT INTO accounts VALUES (?, ?)"


def _history() -> list[Transaction]:
    return [
        _body((SCHEMA, ())),
        _body((INSERT, (1, 100)), (INSERT, (2, 5))),
        _body(("UPDATE accounts SET balance = balance - ? WHERE id = ?", (10, 1))),
        # Fails on its second statement: its first must leave no trace.
        _body(("UPDATE accounts SET balance = 0 WHERE id = 2", ()), (INSERT, (1, 1))),
        _body(("UPDATE accounts SET balance = balance + 1", ())),
    ]


def test_applies_in_order_once_with_outcomes_and_a_digest_chain(
    open_backend: BackendFactory,
) -> None:
    backend = open_backend("a")
    assert backend.applied().position == 0 and backend.applied().state_digest == GENESIS_DIGEST
    outcomes = [backend.apply(n, f"tx{n}", body) for n, body in enumerate(_history(), start=1)]
    assert [o.ok for o in outcomes] == [True, True, True, False, True]
    assert [o.rows_affected for o in outcomes] == [(0,), (1, 1), (1,), (), (2,)]
    assert outcomes[3].error  # the database's own words for a duplicate key
    assert len({o.state_digest for o in outcomes}) == 5
    read = backend.query(Statement("SELECT id, balance FROM accounts ORDER BY id"), 10)
    assert read.rows == ((1, 91), (2, 6)) and read.position == 5
    # A second worker applying the same history holds the same digest at every position.
    twin = open_backend("b")
    twins = [twin.apply(n, f"tx{n}", body) for n, body in enumerate(_history(), start=1)]
    assert [o.state_digest for o in twins] == [o.state_digest for o in outcomes]
    # The same statements under another id are another history.
    other = open_backend("c")
    assert other.apply(1, "other", _history()[0]).state_digest != outcomes[0].state_digest


def _items(bodies: list[Transaction], first: int = 1) -> list[ToApply]:
    return [ToApply(n, f"tx{n}", body) for n, body in enumerate(bodies, start=first)]


def test_a_batch_applies_as_one_at_a_time_would(open_backend: BackendFactory) -> None:
    """``apply_many`` (one database transaction for what queued up at a worker) gives the
    outcomes and digests of applying one at a time, answers re-delivered positions from
    their record, and stops at a gap with everything before it committed."""
    single = open_backend("single")
    one_by_one = [single.apply(n, f"tx{n}", body) for n, body in enumerate(_history(), start=1)]
    batched = open_backend("batched")
    outcomes, stopped = batched.apply_many(_items(_history()[:2]))
    assert stopped is None and outcomes == one_by_one[:2]
    # Positions 1 and 2 again (a reconnect re-sends them), 3 to 5 new, then a gap.
    again = [*_items(_history()), *_items(_history()[:1], first=7)]
    outcomes, stopped = batched.apply_many(again)
    assert outcomes == one_by_one  # the failing transaction (4) included, as FAILED
    assert isinstance(stopped, ApplyOrderError) and "gap" in str(stopped)
    batched.close()
    reopened = open_backend("batched")  # committed: the gap undid nothing before it
    assert reopened.applied().position == 5
    assert reopened.applied().state_digest == one_by_one[-1].state_digest
    read = reopened.query(Statement("SELECT id, balance FROM accounts"), 10)
    assert sorted(read.rows) == [(1, 91), (2, 6)]


def test_a_statement_that_ends_the_whole_batch_is_applied_again_alone(tmp_path: Path) -> None:
    """SQLite's ``OR ROLLBACK`` undoes the whole database transaction on a conflict, not
    just the statement's savepoint: in a batch that also undoes the transactions before
    it, which are then applied one by one (same outcomes, same digests)."""
    history = [*_history()[:3], _body(("INSERT OR ROLLBACK INTO accounts VALUES (1, 0)", ())),
               _history()[4]]  # fmt: skip
    single = SqliteBackend(tmp_path / "single.db")
    one_by_one = [single.apply(n, f"tx{n}", body) for n, body in enumerate(history, start=1)]
    assert [o.ok for o in one_by_one] == [True, True, True, False, True]
    batched = SqliteBackend(tmp_path / "batched.db")
    outcomes, stopped = batched.apply_many(_items(history))
    assert stopped is None and outcomes == one_by_one
    assert batched.applied().position == 5


def test_redelivery_returns_the_recorded_outcome_and_gaps_are_refused(
    open_backend: BackendFactory,
) -> None:
    backend = open_backend("w")
    first = backend.apply(1, "tx1", _history()[0])
    assert backend.apply(1, "tx1", _history()[0]) == first  # not run twice
    with pytest.raises(ApplyOrderError, match="holds tx1"):
        backend.apply(1, "someone-else", _history()[0])
    with pytest.raises(ApplyOrderError, match="gap"):
        backend.apply(3, "tx3", _history()[2])
    backend.close()
    reopened = open_backend("w")
    assert reopened.applied().position == 1 and reopened.applied().tx_id == "tx1"


def test_a_transaction_the_testing_worker_failed_is_recorded_without_running(
    open_backend: BackendFactory,
) -> None:
    tester, follower = open_backend("t"), open_backend("f")
    for n, body in enumerate(_history()[:3], start=1):
        tester.apply(n, f"tx{n}", body)
        follower.apply(n, f"tx{n}", body)
    failed = tester.apply(4, "tx4", _history()[3])
    skipped = follower.apply(4, "tx4", _history()[3], run=False)
    assert not failed.ok and not skipped.ok
    assert failed.state_digest == skipped.state_digest, "same verdict, same history"


@pytest.mark.parametrize(
    "sql",
    [
        "UPDATE _txsync_applied SET position = 99",
        "DELETE FROM _txsync_outcomes",
        "COMMIT",
        "PRAGMA synchronous=OFF",
        "ATTACH DATABASE ':memory:' AS other",
    ],
)
def test_user_statements_cannot_touch_the_bookkeeping(
    open_backend: BackendFactory, sql: str
) -> None:
    backend = open_backend("w")
    backend.apply(1, "tx1", _history()[0])
    outcome = backend.apply(2, "tx2", _body(("INSERT INTO accounts VALUES (7, 7)", ()), (sql, ())))
    assert not outcome.ok and outcome.error
    assert backend.applied().position == 2
    read = backend.query(Statement("SELECT count(*) FROM accounts"), 1)
    assert read.rows == ((0,),), "the failed transaction's first statement was rolled back"


def test_queries_are_read_only_and_cut_at_max_rows(open_backend: BackendFactory) -> None:
    backend = open_backend("w")
    backend.apply(1, "tx1", _history()[0])
    inserts = [("INSERT INTO accounts VALUES (?, ?)", (n, n)) for n in range(50)]
    backend.apply(2, "tx2", _body(*inserts))
    result = backend.query(Statement("SELECT * FROM accounts"), 20)
    assert len(result.rows) == 20 and result.truncated and result.columns == ("id", "balance")
    for write in ("DELETE FROM accounts", "CREATE TABLE x (a)", "PRAGMA journal_mode=DELETE"):
        with pytest.raises(QueryRefused):
            backend.query(Statement(write), 10)
    with pytest.raises(QueryRefused, match="syntax"):
        backend.query(Statement("SELEKT 1"), 10)
    # Nothing above wrote anything.
    count = backend.query(Statement("SELECT count(*) FROM accounts"), 1)
    assert count.rows == ((50,),)


def _keyed(key: str, *statements: tuple[str, tuple[int | str, ...]]) -> Transaction:
    return Transaction(tuple(Statement(sql, params) for sql, params in statements), key)


def test_a_later_transaction_with_a_key_runs_nothing_and_names_the_first(
    open_backend: BackendFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Cluster-wide idempotency: the first transaction with a key in the order runs, a
    later one with it (a retry made at another DC) repeats its verdict without running,
    at every worker alike, until the key is ``KEYS_REMEMBERED`` positions old."""
    monkeypatch.setattr(backend_module, "KEYS_REMEMBERED", 3)
    tester, follower = open_backend("t"), open_backend("f")
    deposit = ("UPDATE accounts SET balance = balance + 1 WHERE id = 1", ())
    history = [
        _body((SCHEMA, ())),
        _keyed("k1", (INSERT, (1, 100))),
        _keyed("k1", (INSERT, (1, 100))),  # a retry: ordered, not run
        _keyed("k2", (INSERT, (1, 5))),  # fails (a duplicate id)...
        _keyed("k2", (INSERT, (1, 5))),  # ...and so does its retry, without running
        _keyed("k3", deposit),
        _keyed("k3", deposit),  # another body: the key decides
        _body(deposit),
        _body(deposit),
        _keyed("k3", deposit),  # 4 positions after k3's first: runs again
    ]
    outcomes = [tester.apply(n, f"tx{n}", body) for n, body in enumerate(history, start=1)]
    assert [o.ok for o in outcomes] == [True, True, True, False, False, True, True, True, True,
                                        True]  # fmt: skip
    assert [o.duplicate_of for o in outcomes] == ["", "", "tx2", "", "tx4", "", "tx6", "", "",
                                                  ""]  # fmt: skip
    assert outcomes[2].rows_affected == () and outcomes[4].error.endswith("which failed")
    read = tester.query(Statement("SELECT balance FROM accounts WHERE id = 1"), 10)
    assert read.rows == ((104,),), "k1 once, k3's deposit three times (once past its window)"
    # A worker told that the testing worker failed a transaction still tells a duplicate
    # from a failure: the same verdicts, the same digests.
    twins = [
        follower.apply(n, f"tx{n}", body, run=outcome.ok)
        for (n, body), outcome in zip(enumerate(history, start=1), outcomes, strict=True)
    ]

    def verdicts(applied: list[Outcome]) -> list[tuple[bool, str, bytes]]:
        return [(o.ok, o.duplicate_of, o.state_digest) for o in applied]

    assert verdicts(twins) == verdicts(outcomes)
    # Re-delivered after a reconnect: answered from the record, duplicate_of included.
    assert tester.apply(3, "tx3", history[2]) == outcomes[2]
    # The digest tells a duplicate from the same statements run.
    plain = open_backend("plain")
    ran = [plain.apply(n, f"tx{n}", Transaction(b.statements)) for n, b in enumerate(history, 1)]
    assert ran[1].state_digest == outcomes[1].state_digest, "a key alone changes nothing"
    assert ran[2].state_digest != outcomes[2].state_digest


def test_a_key_is_remembered_for_its_time_window_when_that_is_longer(
    open_backend: BackendFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A key is remembered for ``KEYS_REMEMBERED`` positions or until the order's clock
    (the latest key time applied) passes the time its store took it plus its window,
    whichever is longer (issue 50): a queue redelivering after many positions but
    within the window applies nothing twice. The clock never goes back, a key without a
    window goes by positions only, and pruning at every other position changes no
    verdict."""
    tester, follower = open_backend("t"), open_backend("f")
    monkeypatch.setattr(backend_module, "KEYS_REMEMBERED", 2)
    monkeypatch.setattr(sys.modules[type(tester).__module__], "KEYS_PRUNE_EVERY", 2)
    start_ms = 1_800_000_000_000

    def at(seconds: int, key: str = "", window_s: int = 0) -> Transaction:
        """A deposit with ``key``, taken by a store at ``seconds`` (a key's time)."""
        deposit = Statement("UPDATE accounts SET balance = balance + 1 WHERE id = 1")
        return Transaction((deposit,), key, 0, window_s * 1000, start_ms + seconds * 1000)

    order = [
        ("schema", Transaction((Statement(SCHEMA), Statement(INSERT, (1, 0))))),
        ("a", at(0, "a", window_s=60)),
        ("", at(10)),
        ("", at(20)),
        ("a again", at(30, "a", window_s=60)),  # 3 positions on, within 60 s: a duplicate
        ("", at(61, "c", window_s=60)),  # the clock passes a's window...
        ("", at(1, "d", window_s=60)),  # ...and an older time does not take it back
        ("a late", at(0, "a", window_s=60)),  # past both: runs, and holds the key now
        ("a at once", at(0, "a", window_s=60)),  # by positions: a duplicate of "a late"
        ("b", at(62, "b")),  # no window: positions only
        ("", at(63)),
        ("", at(64)),
        ("b again", at(62, "b")),
    ]
    outcomes = [tester.apply(n, f"tx{n}", body) for n, (_, body) in enumerate(order, start=1)]
    duplicates = {label: o.duplicate_of for (label, _), o in zip(order, outcomes, strict=True)}
    assert duplicates["a again"] == "tx2"
    assert duplicates["a late"] == "" and duplicates["a at once"] == "tx8"
    assert duplicates["b again"] == ""
    read = tester.query(Statement("SELECT balance FROM accounts WHERE id = 1"), 20)
    assert read.rows == ((len(order) - 1 - 2,),), "every deposit but the two duplicates"
    twins = [
        follower.apply(n, f"tx{n}", body, run=outcome.ok)
        for (n, (_, body)), outcome in zip(enumerate(order, start=1), outcomes, strict=True)
    ]
    assert [(o.duplicate_of, o.state_digest) for o in twins] == [
        (o.duplicate_of, o.state_digest) for o in outcomes
    ]


_SQLITE_BOOKKEEPING_BEFORE_KEY_WINDOWS = """
CREATE TABLE IF NOT EXISTS _txsync_applied (id INTEGER PRIMARY KEY CHECK (id = 1),
    position INTEGER NOT NULL, tx_id TEXT NOT NULL, state_digest BLOB NOT NULL);
INSERT OR IGNORE INTO _txsync_applied VALUES (1, 0, '', zeroblob(32));
CREATE TABLE IF NOT EXISTS _txsync_outcomes (position INTEGER PRIMARY KEY,
    tx_id TEXT NOT NULL, ok INTEGER NOT NULL, rows_affected TEXT NOT NULL,
    state_digest BLOB NOT NULL, error TEXT NOT NULL, duplicate_of TEXT NOT NULL DEFAULT '');
CREATE TABLE IF NOT EXISTS _txsync_keys (key TEXT PRIMARY KEY, tx_id TEXT NOT NULL,
    position INTEGER NOT NULL, ok INTEGER NOT NULL);
CREATE INDEX IF NOT EXISTS _txsync_keys_position ON _txsync_keys (position);
"""
"""What the previous release runs at every opening of its database (its ``_SCHEMA``)."""


def test_the_previous_release_and_this_one_open_each_others_sqlite_bookkeeping(
    tmp_path: Path,
) -> None:
    """Upgrades DC by DC roll back too (tests/upgrade): the previous release opens a
    database this one wrote (its schema script and its 4-column key rows still fit:
    key windows live in a table of their own), and this one opens the previous one's
    and keeps its keys."""
    path = tmp_path / "worker.db"
    with sqlite3.connect(path) as conn:  # made by the previous release
        conn.executescript(_SQLITE_BOOKKEEPING_BEFORE_KEY_WINDOWS)
        conn.execute("UPDATE _txsync_applied SET position = 1, tx_id = 'tx1'")
        conn.execute("INSERT OR REPLACE INTO _txsync_keys VALUES ('k', 'tx1', 1, 1)")
    upgraded = SqliteBackend(path)
    retry = upgraded.apply(2, "tx2", Transaction((Statement("SELECT 1"),), "k", 0, 60_000, 5))
    assert retry.duplicate_of == "tx1" and retry.ok
    windowed = Transaction((Statement("SELECT 2"),), "w", 0, 60_000, 1_800_000_000_000)
    assert upgraded.apply(3, "tx3", windowed).duplicate_of == ""
    upgraded.close()
    with sqlite3.connect(path) as conn:  # rolled back: the previous release opens it
        conn.executescript(_SQLITE_BOOKKEEPING_BEFORE_KEY_WINDOWS)
        conn.execute("INSERT OR REPLACE INTO _txsync_keys VALUES ('w', 'tx4', 4, 1)")
        conn.execute("UPDATE _txsync_applied SET position = 4, tx_id = 'tx4'")
    again = SqliteBackend(path)
    assert again.applied().position == 4
    later = again.apply(5, "tx5", windowed)
    assert later.duplicate_of == "tx4", "the key's holder is the previous release's row"
    again.close()


def test_values_the_dbapi_adapts_go_into_typed_columns_of_either_database(
    open_backend: BackendFactory,
) -> None:
    """``txsync.dbapi`` sends datetime, date, time, Decimal, UUID and JSON as text (issue
    50): PostgreSQL casts that text into timestamp, date, time, numeric, uuid and jsonb
    columns, SQLite keeps it by its affinity, and both read back the same values."""
    moment = dt.datetime(2026, 11, 27, 10, 30, 5, 123456)
    key = uuid.UUID("6f1c9a52-1d1e-4f0e-9a53-3b2c8c1f7e21")
    values = (moment, moment.date(), moment.time(), Decimal("12.50"), key, {"tags": ["a"], "n": 1})
    backend = open_backend("typed")
    schema = Transaction((Statement(
        "CREATE TABLE typed (at TIMESTAMP, day DATE, clock TIME, price NUMERIC(10, 2), "
        "id UUID, doc JSONB)"
    ),))  # fmt: skip
    insert = Transaction((Statement(
        "INSERT INTO typed VALUES (?, ?, ?, ?, ?, ?)", tuple(adapt(v) for v in values)
    ),))  # fmt: skip
    assert backend.apply(1, "tx1", schema).ok
    inserted = backend.apply(2, "tx2", insert)
    assert inserted.ok and inserted.rows_affected == (1,), inserted.error
    read = backend.query(Statement(
        "SELECT CAST(at AS TEXT), CAST(day AS TEXT), CAST(clock AS TEXT), CAST(price AS TEXT), "
        "CAST(id AS TEXT), CAST(doc AS TEXT) FROM typed"
    ), 1)  # fmt: skip
    ((at, day, clock, price, id_, doc),) = read.rows
    assert (dt.datetime.fromisoformat(str(at)), dt.date.fromisoformat(str(day)),
            dt.time.fromisoformat(str(clock)), Decimal(str(price)), uuid.UUID(str(id_)),
            json.loads(str(doc))) == values  # fmt: skip


def test_statements_with_rows_apply_and_count_their_rows(open_backend: BackendFactory) -> None:
    """INSERT ... RETURNING (what ORMs emit) and a SELECT inside a transaction apply like
    any statement: unread rows once kept SQLite's savepoint from being released and
    every DC's pipeline restarted for ever (issue 48). Their rows are read and dropped,
    the count is what they changed, and two replicas agree."""
    bodies = [
        _body((SCHEMA, ())),
        _body((INSERT + " RETURNING id", (1, 10)), ("SELECT * FROM accounts", ())),
        _body(
            ("INSERT INTO accounts SELECT id + 1, balance FROM accounts RETURNING *", ()),
            ("UPDATE accounts SET balance = balance + 1 RETURNING balance", ()),
        ),
    ]
    first, second = open_backend("a"), open_backend("b")
    outcomes = [first.apply(n, f"tx{n}", body) for n, body in enumerate(bodies, start=1)]
    assert [o.ok for o in outcomes] == [True] * 3, [o.error for o in outcomes]
    assert outcomes[2].rows_affected == (1, 2)
    twins = [second.apply(n, f"tx{n}", body) for n, body in enumerate(bodies, start=1)]
    assert [o.state_digest for o in twins] == [o.state_digest for o in outcomes]
    read = first.query(Statement("SELECT id, balance FROM accounts ORDER BY id"), 10)
    assert read.rows == ((1, 11), (2, 11))
