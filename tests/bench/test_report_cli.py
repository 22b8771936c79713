"""`python -m bench.report` re-renders the benchmarks page from a run's results: its
command line teaches, and a missing or broken results file is an error, not a traceback."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.report import main


def test_help_names_the_defaults(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["--help"])
    assert exited.value.code == 0
    assert "build/bench/results.json" in capsys.readouterr().out


@pytest.mark.parametrize("content", [None, "{not json"])
def test_an_unreadable_results_file_is_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: str | None
) -> None:
    results = tmp_path / "results.json"
    if content is not None:
        results.write_text(content)
    page = tmp_path / "benchmarks.md"
    with pytest.raises(SystemExit) as exited:
        main([str(results), str(page)])
    assert exited.value.code == 2
    assert f"cannot read {results}" in capsys.readouterr().err
    assert not page.exists()
