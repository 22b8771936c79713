"""The digest of the rows each transaction touched (``sqlite_touched``): equal at
replicas whose data agree, different at the first transaction that touches a row that
differs, and out of the way of the user's schema."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from txsync.worker.sqlite_backend import SqliteBackend
from txsync.worker.transactions import Statement, transaction

HISTORY = [
    transaction(
        "CREATE TABLE t (k INTEGER PRIMARY KEY, n)",
        "CREATE TABLE w (k PRIMARY KEY, n) WITHOUT ROWID",
    ),
    transaction("INSERT INTO t VALUES (1, 10), (2, 20)", "INSERT INTO w VALUES ('a', 1)"),
    transaction("UPDATE t SET n = n + 1", "DELETE FROM t WHERE k = 2"),
    transaction("INSERT INTO t VALUES (3, 'x')", "INSERT INTO t VALUES (3, 'duplicate')"),
    transaction("ALTER TABLE t RENAME TO renamed"),
    transaction("INSERT INTO renamed VALUES (4, 40)", "ALTER TABLE renamed DROP COLUMN n"),
    transaction("DROP TABLE renamed"),
]


def test_replicas_agree_and_the_first_differing_row_shows(tmp_path: Path) -> None:
    first, second = (
        SqliteBackend(tmp_path / "a.db", touched_digest=True),
        SqliteBackend(tmp_path / "b.db", touched_digest=True),
    )
    ones = [first.apply(n, f"tx{n}", body) for n, body in enumerate(HISTORY[:3], start=1)]
    twos = [second.apply(n, f"tx{n}", body) for n, body in enumerate(HISTORY[:3], start=1)]
    assert [o.touched_digest for o in ones] == [o.touched_digest for o in twos]
    assert all(o.ok and len(o.touched_digest) == 32 for o in ones)
    assert len({o.touched_digest for o in ones}) == 3

    # A row changed behind one replica's back (another connection: no triggers there).
    with sqlite3.connect(tmp_path / "b.db") as behind_its_back:
        behind_its_back.execute("UPDATE t SET n = 99 WHERE k = 1")
    touch = transaction("UPDATE t SET n = n * 2 WHERE k = 1")
    one, two = first.apply(4, "tx4", touch), second.apply(4, "tx4", touch)
    assert one.state_digest == two.state_digest  # rows affected alike: values unseen
    assert one.touched_digest != two.touched_digest


def test_schema_changes_keep_working_and_stay_tracked(tmp_path: Path) -> None:
    backend = SqliteBackend(tmp_path / "w.db", touched_digest=True)
    outcomes = [backend.apply(n, f"tx{n}", body) for n, body in enumerate(HISTORY, start=1)]
    assert [o.ok for o in outcomes] == [True, True, True, False, True, True, True]
    assert outcomes[3].touched_digest == b""  # FAILED: nothing to compare
    reopened = SqliteBackend(tmp_path / "other.db", touched_digest=True)
    again = [reopened.apply(n, f"tx{n}", body) for n, body in enumerate(HISTORY, start=1)]
    assert [o.touched_digest for o in again] == [o.touched_digest for o in outcomes]
    # The triggers are the worker connection's own: the database file has none.
    schema = backend.query(Statement("SELECT type, name FROM sqlite_master"), 100).rows
    assert ("table", "w") in schema and not any(kind == "trigger" for kind, _ in schema)


def test_a_user_cannot_reach_the_triggers_or_their_function(tmp_path: Path) -> None:
    backend = SqliteBackend(tmp_path / "w.db", touched_digest=True)
    assert backend.apply(1, "tx1", transaction("CREATE TABLE t (n)")).ok
    for position, sql in enumerate(
        ["SELECT _txsync_touched('t', 1)", "DROP TRIGGER _txsync_touch_ins_t"], start=2
    ):
        outcome = backend.apply(position, f"tx{position}", transaction(sql))
        assert not outcome.ok and outcome.error.startswith("refused: "), outcome.error


def test_on_by_default_and_nothing_measured_when_off(tmp_path: Path) -> None:
    """``--touched-digest`` is 1 by default; with 0 nothing is hashed."""
    assert SqliteBackend(tmp_path / "default.db").apply(1, "tx1", HISTORY[0]).touched_digest
    backend = SqliteBackend(tmp_path / "w.db", touched_digest=False)
    outcomes = [backend.apply(n, f"tx{n}", body) for n, body in enumerate(HISTORY[:3], 1)]
    assert all(o.ok and o.touched_digest == b"" for o in outcomes)
