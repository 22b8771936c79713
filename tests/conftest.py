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


ONE_WORKER_GROUP = "docker-and-spark"
"""`make test` runs two pytest-xdist workers (``--dist loadgroup``). The Docker and Spark
tests all go to one of them: they share what is costly to make twice (the images, each
built once per run from one debootstrap base; the Spark session and its `dev up` run)
and what cannot exist twice at once (the containers' names). Split in two units (Spark,
Docker), the fresh-clone suite took 31:39 on a quiet machine against 27:18 as one: the
image builds then ran beside the Spark jobs and slowed both."""
PACKAGES_SHARING_A_FIXTURE = ("tests/client/",)
"""Packages whose tests share a package-scoped fixture (a running cluster): one worker."""


def _xdist_group(item: pytest.Item) -> str:
    """The unit of work a test goes to a worker in: its module, so that module-scoped
    fixtures are made once and a module's tests keep their order; wider where tests
    share more."""
    module = item.nodeid.split("::")[0]
    if module.startswith("tests/deploy/") or any(
        item.get_closest_marker(shared) for shared in ("docker", "spark")
    ):
        return ONE_WORKER_GROUP
    return next((p for p in PACKAGES_SHARING_A_FIXTURE if module.startswith(p)), module)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not config.pluginmanager.has_plugin("xdist"):  # the oldest PySpark's venv has none
        return
    for item in items:
        item.add_marker(pytest.mark.xdist_group(_xdist_group(item)))


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
