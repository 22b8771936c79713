"""``txsync.dbapi`` (PEP 249) against a real 3-DC cluster: a transaction of the
statements since the last commit, reads that see the commit, the PEP's error classes for
the database's errors, and the documented type adaptation."""

from __future__ import annotations

import datetime as dt
import uuid
from decimal import Decimal
from pathlib import Path

import pytest

from txsync import dbapi


def _table(connection: dbapi.Connection, columns: str = "k INTEGER PRIMARY KEY, v") -> str:
    name = f"t_{uuid.uuid4().hex[:8]}"
    connection.cursor().execute(f"CREATE TABLE {name} ({columns})")
    connection.commit()
    return name


def test_writes_commit_as_one_transaction_and_reads_see_them(cluster_file: Path) -> None:
    assert (dbapi.apilevel, dbapi.paramstyle, dbapi.threadsafety) == ("2.0", "qmark", 1)
    connection = dbapi.connect(str(cluster_file), dc="dc2")
    try:
        table = _table(connection)
        cursor = connection.cursor()
        cursor.execute(f"INSERT INTO {table} VALUES (?, ?)", (1, "one"))
        many = connection.cursor()
        many.executemany(f"INSERT INTO {table} VALUES (?, ?)", [(2, "two"), (3, "three")])
        update = connection.cursor().execute(f"UPDATE {table} SET v = upper(v) WHERE k > ?", (1,))
        assert update.rowcount == -1, "a write's count is known once committed"
        reader = connection.cursor()
        reader.execute(f"SELECT count(*) FROM {table}")
        assert reader.fetchone() == (0,), "uncommitted writes are not there yet"
        connection.commit()
        assert update.rowcount == 2 and cursor.rowcount == 1
        reader.execute(f"SELECT k, v FROM {table} WHERE k >= ? ORDER BY k", (1,))
        assert [d[0] for d in reader.description or []] == ["k", "v"]
        assert reader.rowcount == 3 and reader.fetchone() == (1, "one")
        assert reader.fetchmany(1) == [(2, "TWO")] and reader.fetchall() == [(3, "THREE")]
        assert reader.fetchone() is None
        reader.execute(f"WITH c AS (SELECT k FROM {table}) SELECT max(k) FROM c")
        assert list(reader) == [(3,)]
        connection.cursor().execute(f"DELETE FROM {table}")
        connection.rollback()
        with connection:  # commits at the end of the block
            connection.cursor().execute(f"INSERT INTO {table} VALUES (4, 'four')")
        with pytest.raises(ZeroDivisionError), connection:  # rolls back on an exception
            connection.cursor().execute(f"INSERT INTO {table} VALUES (5, 'five')")
            raise ZeroDivisionError
        assert reader.execute(f"SELECT count(*) FROM {table}").fetchall() == [(4,)]
    finally:
        connection.close()
    with pytest.raises(dbapi.InterfaceError, match="closed"):
        connection.cursor()
    reader.close()
    with pytest.raises(dbapi.InterfaceError, match="closed"):
        reader.fetchall()


def test_a_failed_commit_raises_the_peps_class_and_changes_nothing(cluster_file: Path) -> None:
    connection = dbapi.connect(str(cluster_file))
    try:
        table = _table(connection)
        cursor = connection.cursor()
        cursor.execute(f"INSERT INTO {table} VALUES (1, 'a')")
        connection.commit()
        cursor.execute(f"INSERT INTO {table} VALUES (2, 'b')")
        cursor.execute(f"INSERT INTO {table} VALUES (1, 'again')")
        with pytest.raises(dbapi.IntegrityError, match="UNIQUE") as failed:
            connection.commit()
        assert failed.value.tx_id and isinstance(failed.value, dbapi.DatabaseError)
        connection.commit()  # nothing left to commit: the failed transaction is gone
        assert cursor.execute(f"SELECT k FROM {table}").fetchall() == [(1,)]
        cursor.execute("INSERT INTO no_such_table VALUES (1)")
        with pytest.raises(dbapi.ProgrammingError, match="no such table"):
            connection.commit()
        cursor.execute("SELEC 1 FROM x")  # not a read: collected, refused at commit
        with pytest.raises(dbapi.DatabaseError):
            connection.commit()
        with pytest.raises(dbapi.ProgrammingError, match="not supported"):
            cursor.execute(f"INSERT INTO {table} VALUES (?, ?)", (3, object()))
        with pytest.raises(dbapi.ProgrammingError, match="qmark"):
            cursor.execute(f"INSERT INTO {table} VALUES (:k)", {"k": 1})  # type: ignore[arg-type]
        cursor.executemany(f"INSERT INTO {table} VALUES (?, 'x')", [(n,) for n in range(1000)])
        with pytest.raises(dbapi.ProgrammingError, match="at most 1000 statements"):
            cursor.execute(f"INSERT INTO {table} VALUES (5000, 'x')")
        connection.rollback()
    finally:
        connection.close()


def test_types_are_adapted_to_the_same_text_on_every_worker(cluster_file: Path) -> None:
    at = dt.datetime(2026, 11, 27, 10, 30, 5, 123456)
    aware = dt.datetime(2026, 11, 27, 12, 0, tzinfo=dt.timezone(dt.timedelta(hours=2)))
    token = uuid.UUID("12345678-1234-5678-1234-567812345678")
    values = (at, aware, dt.date(2026, 11, 27), dt.time(9, 15), Decimal("10.25"), token,
              {"a": [1, 2]}, [1, "x"], bytearray(b"\x00\x01"), True)  # fmt: skip
    expected = ("2026-11-27 10:30:05.123456", "2026-11-27 10:00:00", "2026-11-27", "09:15:00",
                "10.25", "12345678-1234-5678-1234-567812345678", '{"a":[1,2]}', '[1,"x"]',
                b"\x00\x01", 1)  # fmt: skip
    assert tuple(dbapi.adapt(v) for v in values[:-1]) == expected[:-1]
    connection = dbapi.connect(str(cluster_file))
    try:
        table = _table(connection, "a, b, c, d, e, f, g, h, i, j")
        connection.cursor().execute(f"INSERT INTO {table} VALUES ({', '.join('?' * 10)})", values)
        connection.commit()
        row = connection.cursor().execute(f"SELECT * FROM {table}").fetchone()
        assert row == expected
    finally:
        connection.close()


def test_reads_and_writes_are_told_apart_as_sqlite_would_run_them() -> None:
    assert dbapi.is_read("SELECT 1") and dbapi.is_read("  (SELECT 1)")
    assert dbapi.is_read("-- a note\nVALUES (1)") and dbapi.is_read("explain select 1")
    assert dbapi.is_read("WITH c AS (SELECT 'INSERT') SELECT * FROM c")
    assert not dbapi.is_read("WITH c AS (SELECT 1) INSERT INTO t SELECT * FROM c")
    assert not dbapi.is_read("INSERT INTO t VALUES ('SELECT')")
    assert not dbapi.is_read("CREATE TABLE t (a)") and not dbapi.is_read("")


def test_worker_errors_map_to_the_peps_classes_on_both_databases() -> None:
    cases = {
        "IntegrityError: UNIQUE constraint failed: t.k": dbapi.IntegrityError,
        "UniqueViolation: duplicate key value violates unique constraint": dbapi.IntegrityError,
        "OperationalError: no such table: x": dbapi.ProgrammingError,
        'OperationalError: near "SELEC": syntax error': dbapi.ProgrammingError,
        "OperationalError: database is locked": dbapi.OperationalError,
        'UndefinedTable: relation "x" does not exist': dbapi.ProgrammingError,
        "DivisionByZero: division by zero": dbapi.DataError,
        "something else entirely": dbapi.DatabaseError,
    }
    for text, kind in cases.items():
        assert dbapi.database_error_class(text) is kind, text
