"""Every timing and limit of the protocol core can be set on the sync-coordinator's
command line, and the defaults pass the flag checks (a field added to ``Timing`` without
a flag once made every coordinator fail at start)."""

from __future__ import annotations

import dataclasses
import subprocess
import sys

import pytest

from txsync.cli.main import build_parser
from txsync.protocol import Limits, Timing
from txsync.sync_coordinator.server import protocol_settings

BASE = ("sync-coordinator", "--node-id", "dc1", "--store", "127.0.0.1:1", "--plaintext")


def test_every_timing_has_a_flag_and_the_defaults_are_accepted() -> None:
    options = build_parser(every=True).parse_args([*BASE])
    for field in dataclasses.fields(Timing):
        assert getattr(options, field.name) == getattr(Timing(), field.name), field.name
    for name in ("incoming_txs_max", "post_txs_max", "catchup_entries_max", "synced_window_max"):
        assert getattr(options, name) == getattr(Limits(), name), name
    assert protocol_settings(options) == (Timing(), Limits())


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (("--round-timeout-ms", "0"), "--round-timeout-ms must be positive"),
        (("--repost-gap-ms", "-1"), "--repost-gap-ms must be at least 0"),
        (("--body-fetch-retry-ms", "9000"),
         "--body-fetch-retry-ms must not exceed --body-fetch-retry-max-ms"),
        (("--synced-window-max", "10"),
         "--synced-window-max must be at least --catchup-entries-max"),
    ],
)  # fmt: skip
def test_a_setting_that_cannot_work_is_named(flags: tuple[str, ...], message: str) -> None:
    options = build_parser(every=True).parse_args([*BASE, *flags])
    with pytest.raises(ValueError, match=f"^{message}$"):
        protocol_settings(options)


def test_the_bounds_hold_under_python_dash_o() -> None:
    """They were asserts, which ``python -O`` drops."""
    checked = subprocess.run(
        [sys.executable, "-O", "-c",
         "from txsync.protocol import Timing\nTiming(round_timeout_ms=0)"],
        capture_output=True, text=True, check=False, timeout=60,
    )  # fmt: skip
    assert checked.returncode == 1
    assert "SettingError: round_timeout_ms must be positive" in checked.stderr
