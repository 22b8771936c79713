"""Our own fault injection over real processes (tests/support/nemesis.py): a seeded
schedule of kills, pauses, cut-off DCs and one whole-cluster crash under load, while the
stores truncate and rotate, then the checks of PROTOCOL.md section 4 on what the clients
were told. ``make nemesis`` runs it
for ten minutes; CI for ``TXSYNC_NEMESIS_S`` (60 s by default)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.nemesis import NemesisRun, settings_from_environment

pytestmark = pytest.mark.under_load  # a busy machine: see tests/conftest.py


@pytest.mark.slow
def test_faults_under_load_lose_nothing_and_duplicate_nothing(tmp_path: Path) -> None:
    seed, duration_s = settings_from_environment()
    run = NemesisRun(seed, duration_s, tmp_path / "cluster")
    report = run.run()
    print(report.summary())  # the figures, with -s or in the failure output
    (tmp_path / "nemesis.log").write_text("\n".join(run.log_lines) + "\n")
    replay = f"(replay: TXSYNC_NEMESIS_SEED={seed} TXSYNC_NEMESIS_S={duration_s:g})"
    failure = f"{report.summary()}: {report.problems[:5]} {replay}\n{report.evidence}"
    assert not report.problems, failure
    assert report.lost == 0 and report.duplicated == 0, report.summary()
    assert report.acknowledged > 0 and report.ordered >= report.acknowledged, report.summary()
    assert report.faults["crash"] == 1 and report.faults["kill"] >= 1, report.summary()
    # The faults met truncations and rotations: every store dropped history meanwhile.
    assert report.truncated > 0 and report.rotations >= 3, report.summary()
