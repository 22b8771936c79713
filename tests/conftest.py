"""Fixtures more than one test package uses."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.postgres import PostgresServer


@pytest.fixture(scope="session")
def postgres() -> Iterator[PostgresServer]:
    """One real PostgreSQL server for the whole run (each test takes its own database)."""
    server = PostgresServer()
    yield server
    server.stop()
