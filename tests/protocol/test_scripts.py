"""Runs every script in ``tests/protocol/scripts``; see ``script_runner`` for the format."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.protocol.script_runner import run_script_file

SCRIPTS = sorted((Path(__file__).parent / "scripts").glob("*.txt"))


def test_there_are_scripts() -> None:
    assert len(SCRIPTS) >= 5


@pytest.mark.parametrize("path", SCRIPTS, ids=[p.stem for p in SCRIPTS])
def test_script(path: Path) -> None:
    expected, actual = run_script_file(path)
    for want, got in zip(expected, actual, strict=True):
        assert got.expected == want.expected, (
            f"{path.name}:{want.line_no}: {want.command}\n"
            "expected:\n  " + "\n  ".join(want.expected) + "\n"
            "actual:\n  " + "\n  ".join(got.expected)
        )
