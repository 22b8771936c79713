"""Fixtures more than one test package uses."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator

import pytest

from tests.support.postgres import PostgresServer
from txsync.parent_watch import child_environment


@pytest.fixture(scope="session")
def postgres() -> Iterator[PostgresServer]:
    """One real PostgreSQL server for the whole run (each test takes its own database)."""
    server = PostgresServer()
    yield server
    server.stop()


HOG_PROGRAM = (
    "from txsync.parent_watch import die_with_parent\ndie_with_parent()\nwhile True:\n    pass\n"
)


@pytest.fixture(autouse=True)
def _cpu_hog(request: pytest.FixtureRequest) -> Iterator[None]:
    """Tests marked ``under_load`` run while another process saturates one core, as on a
    busy CI machine or laptop: nothing they check may depend on an idle machine. The hog
    dies with the test run whatever ends it (parent_watch)."""
    if request.node.get_closest_marker("under_load") is None:
        yield
        return
    hog = subprocess.Popen(
        [sys.executable, "-c", HOG_PROGRAM], env=child_environment(), stdin=subprocess.DEVNULL
    )
    try:
        yield
    finally:
        hog.kill()
        hog.wait()
