"""The images the Docker tests run, built once per test run: this tree's, and the
previous release's (for the upgrade in the guide's test)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.docker_pods import ensure_image
from tests.support.releases import previous_release


@pytest.fixture(scope="session")
def image() -> str:
    ensure_image()
    return "txsync:dev"


@pytest.fixture(scope="session")
def previous_image(tmp_path_factory: pytest.TempPathFactory) -> str:
    return previous_release().image(Path(tmp_path_factory.mktemp("previous-release")))
