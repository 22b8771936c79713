"""Worker tests run against both backends: SQLite files and a real PostgreSQL server."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from tests.support.postgres import PostgresServer
from txsync.worker.backend import Backend
from txsync.worker.postgres_backend import PostgresBackend
from txsync.worker.sqlite_backend import SqliteBackend

BackendFactory = Callable[[str], Backend]
"""Open (or reopen) the backend called ``name``."""


@pytest.fixture(params=["sqlite", "postgresql"])
def open_backend(request: pytest.FixtureRequest, tmp_path: Path) -> BackendFactory:
    if request.param == "sqlite":
        return lambda name: SqliteBackend(tmp_path / f"{name}.db")
    server: PostgresServer = request.getfixturevalue("postgres")
    databases: dict[str, str] = {}

    def open_postgres(name: str) -> Backend:
        if name not in databases:
            databases[name] = server.new_database()
        return PostgresBackend(databases[name])

    return open_postgres
