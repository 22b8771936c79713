"""One real local SparkSession for the pipeline tests (Java 17 is on these machines)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from pyspark.sql import SparkSession

from txsync.pipeline.session import spark_session


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    session = spark_session("local[2]", "txsync-tests")
    yield session
    session.stop()
