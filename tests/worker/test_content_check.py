"""The state digest covers the data every ``content_check_every`` positions (issue 17):
two replicas with the same history but different rows (an edit behind one's back, or
anything nondeterministic the guards missed) have different digests there, on both
backends, and the same digests when their data agree."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from pathlib import Path

import psycopg
import pytest

from tests.support.postgres import PostgresServer
from txsync.worker.backend import Backend
from txsync.worker.postgres_backend import PostgresBackend
from txsync.worker.sqlite_backend import SqliteBackend
from txsync.worker.transactions import transaction

EVERY = 3
HISTORY = [
    "CREATE TABLE t (k INTEGER PRIMARY KEY, v TEXT)",
    "INSERT INTO t VALUES (1, 'a'), (2, 'b')",
    "UPDATE t SET v = v || '!' WHERE k = 1",  # position 3: a content check
    "INSERT INTO t VALUES (3, 'c')",
]

Replica = tuple[Backend, Callable[[str], None]]
"""A backend, and a way to change its data behind its back."""


def _sqlite(tmp_path: Path, name: str) -> Replica:
    path = tmp_path / f"{name}.db"
    backend = SqliteBackend(path, content_check_every=EVERY)

    def edit(sql: str) -> None:
        with sqlite3.connect(path) as conn:
            conn.execute(sql)

    return backend, edit


def _postgres(server: PostgresServer) -> Replica:
    conninfo = server.new_database()
    backend = PostgresBackend(conninfo, content_check_every=EVERY)

    def edit(sql: str) -> None:
        with psycopg.connect(conninfo, autocommit=True) as conn:
            conn.execute(sql.encode())

    return backend, edit


@pytest.fixture(params=["sqlite", "postgresql"])
def replicas(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[Replica, Replica]:
    if request.param == "sqlite":
        return _sqlite(tmp_path, "a"), _sqlite(tmp_path, "b")
    server: PostgresServer = request.getfixturevalue("postgres")
    return _postgres(server), _postgres(server)


def _apply(backend: Backend, first: int, last: int) -> list[bytes]:
    return [
        backend.apply(n, f"tx{n}", transaction(HISTORY[n - 1])).state_digest
        for n in range(first, last + 1)
    ]


def test_data_that_went_apart_is_caught_at_the_next_content_check(
    replicas: tuple[Replica, Replica],
) -> None:
    (first, _), (second, edit_second) = replicas
    assert _apply(first, 1, 2) == _apply(second, 1, 2)
    edit_second("UPDATE t SET v = 'z' WHERE k = 2")  # the history does not show it
    before, at_check = _apply(first, 3, 3), _apply(second, 3, 3)
    assert before != at_check, "the content check at position 3 tells them apart"


def test_replicas_that_agree_have_one_digest_at_the_check(
    replicas: tuple[Replica, Replica],
) -> None:
    (first, _), (second, _) = replicas
    assert _apply(first, 1, 4) == _apply(second, 1, 4)


def test_the_content_check_is_not_under_the_transactions_time_limit(
    postgres: PostgresServer,
) -> None:
    """Issue 48: the content check and the bookkeeping ran under what was left of the
    transaction's ``statement_timeout``; a check that took longer (a large table) was
    cancelled at every retry, and every DC stopped applying there. The limit is the
    user's statements' only."""
    conninfo = postgres.new_database()
    backend = PostgresBackend(conninfo, content_check_every=2, statement_timeout_ms=200)
    assert backend.apply(1, "tx1", transaction("CREATE TABLE t (v int)")).ok
    with psycopg.connect(conninfo, autocommit=True) as conn:  # seconds to hash, not 200 ms
        conn.execute("INSERT INTO t SELECT g FROM generate_series(1, 2000000) g")
    checked = backend.apply(2, "tx2", transaction("INSERT INTO t VALUES (0)"))
    assert checked.ok, checked.error
    assert backend.applied().position == 2
