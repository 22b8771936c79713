"""`make bench` names the build it measured, and notices services edited during the run
(whose clusters then ran a mix of builds): on a real git checkout and real files."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from bench.suite import build_of, services_fingerprint


def _git(repo: Path, *args: str) -> str:
    who = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t"}
    env = os.environ | who | {"GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"}
    done = subprocess.run(
        ["git", "-C", str(repo), *args], capture_output=True, text=True, check=True, env=env
    )
    return done.stdout.strip()


def test_the_build_is_the_commit_and_says_when_the_files_differ(tmp_path: Path) -> None:
    services = tmp_path / "services" / "txsync"
    services.mkdir(parents=True)
    assert build_of(services) == "unknown"  # not a git checkout
    (services / "store.py").write_text("x = 1\n")
    _git(tmp_path, "init", "-q")
    _git(tmp_path, "add", ".")
    _git(tmp_path, "commit", "-q", "-m", "one")
    commit = _git(tmp_path, "rev-parse", "--short", "HEAD")
    assert build_of(services) == commit
    (tmp_path / "README").write_text("outside the services: not theirs\n")
    assert build_of(services) == commit
    (services / "store.py").write_text("x = 2\n")
    assert build_of(services) == f"{commit} + local changes"


def test_the_fingerprint_moves_with_any_source_file_and_not_with_bytecode(
    tmp_path: Path,
) -> None:
    (tmp_path / "a.py").write_text("a = 1\n")
    before = services_fingerprint(tmp_path)
    (tmp_path / "__pycache__").mkdir()
    (tmp_path / "__pycache__" / "a.cpython-311.pyc").write_bytes(b"\0" * 16)
    assert services_fingerprint(tmp_path) == before  # a service starting compiles
    (tmp_path / "a.py").write_text("a = 22\n")
    edited = services_fingerprint(tmp_path)
    assert edited != before
    (tmp_path / "b.py").write_text("")
    assert services_fingerprint(tmp_path) != edited
