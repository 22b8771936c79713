"""``txsync top``'s lines: rates between two refreshes of a DC (the live view against a
running cluster: tests/dev_cluster/test_end_to_end.py)."""

from __future__ import annotations

import subprocess
import sys

from txsync.cli.top_command import DcSample, dc_line


def _sample(at: float, synced: int, newest_round: int) -> DcSample:
    return DcSample("dc1", at, "MAJORITY", synced, 3, newest_round, 2, 2, (synced - 1, synced))


def test_rates_are_what_changed_over_the_time_between_refreshes() -> None:
    first = dc_line(_sample(10.0, 100, 40), None)
    assert first.rounds_per_s is None and first.tx_per_s is None  # nothing to compare yet
    assert (first.workers, first.positions, first.lag) == ("2/2", "99-100", 3)
    later = dc_line(_sample(12.0, 700, 90), _sample(10.0, 100, 40))
    assert (later.rounds_per_s, later.tx_per_s) == (25.0, 300.0)


def test_a_dc_that_restarted_shows_no_negative_rate() -> None:
    # A restarted coordinator numbers its rounds from 1 again.
    line = dc_line(_sample(12.0, 100, 3), _sample(10.0, 100, 5000))
    assert line.rounds_per_s == 0.0 and line.tx_per_s == 0.0


def test_refreshing_faster_than_the_stores_should_be_asked_is_refused() -> None:
    ran = subprocess.run(
        [sys.executable, "-m", "txsync.cli.main", "top", "--interval", "0.05",
         "--endpoints", "127.0.0.1:1"],
        capture_output=True, text=True, check=False, timeout=60,
    )  # fmt: skip
    assert ran.returncode == 2 and "--interval: at least 0.2 s" in ran.stderr
