"""The in-process and one-store benchmarks keep working, and keep reading what the
services log (a rotation's line): each run small, figures printed, none asserted."""

from __future__ import annotations

import pytest

from bench import apply_cost, rotation_stall


def test_apply_cost_prints_both_settings(capsys: pytest.CaptureFixture[str]) -> None:
    assert apply_cost.main(["--txs", "100", "--batch", "50", "--rounds", "1"]) == 0
    printed = capsys.readouterr().out
    assert "touched digest off   median" in printed and "touched digest on    median" in printed


def test_rotation_stall_reads_the_rotations_a_store_logs(
    capsys: pytest.CaptureFixture[str],
) -> None:
    arguments = ["--seconds", "6", "--rate", "200", "--log-file-bytes-max", "65536"]
    assert rotation_stall.main(arguments) == 0
    printed = capsys.readouterr().out
    assert "rotated in" in printed and "lock held median" in printed, printed
    assert "submits overlapping a rotation" in printed, printed
