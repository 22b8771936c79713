"""The client alone (issue 50): ``pip install txsync`` without extras brings the library
and the CLI's client commands with grpcio and protobuf, and none of the server stack
(kubernetes, psycopg, pglast, uvloop, OpenTelemetry, exact gRPC pins). Installed into a
fresh virtual environment from PyPI, as an application would, it runs the documented
quick start against a real cluster; a service command names the extra it needs."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.dev_up import down, up

REPO = Path(__file__).resolve().parents[2]
SERVER_ONLY = {
    "kubernetes", "psycopg", "psycopg-binary", "pglast", "uvloop", "opentelemetry-sdk",
    "opentelemetry-api", "grpcio-health-checking", "grpcio-reflection",
}  # fmt: skip
QUICK_START = re.compile(r"## Quick start\n\n```python\n(.*?)^```", re.MULTILINE | re.DOTALL)
INSTALL_TIMEOUT_S = 900

pytestmark = [pytest.mark.network, pytest.mark.slow]


def _run(*args: str | Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(a) for a in args], capture_output=True, text=True, check=False,
        timeout=INSTALL_TIMEOUT_S, env=env,
    )  # fmt: skip


@pytest.fixture(scope="module")
def slim_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A new virtual environment with this checkout installed without extras. The
    project is copied first, so that building it leaves nothing in the checkout."""
    root = tmp_path_factory.mktemp("slim")
    source = root / "txsync"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, source / name)
    shutil.copytree(
        REPO / "services", source / "services",
        ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"),
    )  # fmt: skip
    venv = root / "venv"
    made = _run(sys.executable, "-m", "venv", venv)
    assert made.returncode == 0, made.stderr
    installed = _run(venv / "bin" / "python", "-m", "pip", "install", "--quiet", source)
    assert installed.returncode == 0, installed.stdout + installed.stderr
    return venv


def test_the_client_alone_installs_without_the_server_stack_and_runs_the_quick_start(
    slim_venv: Path, tmp_path: Path
) -> None:
    listed = _run(slim_venv / "bin" / "python", "-m", "pip", "list", "--format", "json")
    names = {p["name"].lower() for p in json.loads(listed.stdout)}
    assert {"txsync", "grpcio", "protobuf"} <= names, names
    assert not names & SERVER_ONLY, f"the client install pulled {sorted(names & SERVER_ONLY)}"
    quick_start = QUICK_START.search((REPO / "docs" / "client.md").read_text())
    assert quick_start is not None, "docs/client.md lost its quick start"
    cluster = up(tmp_path / "cluster")  # the services, from this checkout's full install
    try:
        env = {**os.environ, "TXSYNC_ENDPOINTS": str(tmp_path / "cluster" / "cluster.json")}
        env.pop("PYTHONPATH", None)
        ran = _run(slim_venv / "bin" / "python", "-c", quick_start.group(1), env=env)
        assert ran.returncode == 0, ran.stdout + ran.stderr
        assert "State.OK (1,)" in ran.stdout, ran.stdout
        read = _run(slim_venv / "bin" / "txsync", "query", "--sql",
                    "SELECT balance FROM accounts", "-o", "json", env=env)  # fmt: skip
        assert read.returncode == 0 and json.loads(read.stdout)["rows"] == [[100]], read.stderr
    finally:
        down(cluster)
    service = _run(slim_venv / "bin" / "txsync", "transaction-store", "--help")
    assert service.returncode == 2, service.stdout + service.stderr
    assert "pip install 'txsync[server]'" in service.stderr, service.stderr
