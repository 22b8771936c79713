"""The image every Docker test runs, built once per test run from this tree."""

from __future__ import annotations

import pytest

from tests.support.docker_pods import ensure_image


@pytest.fixture(scope="session")
def image() -> str:
    ensure_image()
    return "txsync:dev"
