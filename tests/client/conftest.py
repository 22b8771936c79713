"""One `txsync dev up` cluster (3 DCs of real processes, two SQLite workers each) shared
by the client library's tests: starting one takes longer than most of the tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.dev_up import down, up


@pytest.fixture(scope="package")
def cluster_file(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    data = tmp_path_factory.mktemp("client-cluster")
    process = up(data)
    try:
        yield data / "cluster.json"
    finally:
        down(process)
