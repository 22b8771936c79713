"""Every timing and limit of the protocol core can be set on the sync-coordinator's
command line, and the defaults pass the flag checks (a field added to ``Timing`` without
a flag once made every coordinator fail at start). The flags, their least values and the
docs table come from one declaration (``txsync.settings.COORDINATOR_SETTINGS``)."""

from __future__ import annotations

import argparse
import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest

from txsync.cli.main import build_parser
from txsync.protocol import Limits, Timing
from txsync.protocol.limits import EVENT_METAS_MOST, INCOMING_TXS_MOST, SettingError
from txsync.settings import COORDINATOR_SETTINGS, docs_rows
from txsync.sync_coordinator.server import protocol_settings
from txsync.sync_coordinator.shell import FLUSH_METAS
from txsync.transaction_store.validation import FORGOTTEN_METAS_MAX, PERSIST_METAS_MAX

BASE = ("sync-coordinator", "--node-id", "dc1", "--store", "127.0.0.1:1", "--plaintext")


def test_every_timing_has_a_flag_and_the_defaults_are_accepted() -> None:
    options = build_parser(every=True).parse_args([*BASE])
    for field in dataclasses.fields(Timing):
        assert getattr(options, field.name) == getattr(Timing(), field.name), field.name
    for name in ("incoming_txs_max", "post_txs_max", "catchup_entries_max", "synced_window_max"):
        assert getattr(options, name) == getattr(Limits(), name), name
    assert protocol_settings(options) == (Timing(), Limits())


def test_the_docs_table_is_the_declarations() -> None:
    docs = Path(__file__).resolve().parents[2] / "docs" / "sync-coordinator.md"
    text = docs.read_text()
    for row in docs_rows(COORDINATOR_SETTINGS):
        assert row in text, f"docs/sync-coordinator.md lacks (or has another text for):\n{row}"


def test_each_flag_refuses_what_its_field_refuses() -> None:
    """A flag's least value is the core's: what argparse lets through, Timing and Limits
    take, and one less is refused with the flag's name."""
    for setting in COORDINATOR_SETTINGS:
        options = build_parser(every=True).parse_args([*BASE, setting.flag, str(setting.least)])
        try:
            protocol_settings(options)
        except ValueError as error:  # only a rule across fields may refuse it
            assert "--" in str(error).split(" must ", 1)[1], error
        with pytest.raises(argparse.ArgumentTypeError, match=f"at least {setting.least}"):
            setting.parse(str(setting.least - 1))


def test_limits_the_store_bounds_have_a_largest_value_on_flag_and_field() -> None:
    """The store takes a view install's forgotten metas, and a step's metas, only up to
    fixed maxima (``transaction_store.validation``): a limit set past what the store takes
    would stop the coordinator at the first large install, and at every restart after."""
    mosts = {s.name: s.most for s in COORDINATOR_SETTINGS if s.most is not None}
    assert mosts == {
        "incoming_txs_max": INCOMING_TXS_MOST,
        "post_txs_max": EVENT_METAS_MOST,
        "catchup_entries_max": EVENT_METAS_MOST,
    }
    assert FORGOTTEN_METAS_MAX >= INCOMING_TXS_MOST
    assert FLUSH_METAS + 2 * EVENT_METAS_MOST <= PERSIST_METAS_MAX
    for setting in COORDINATOR_SETTINGS:
        if setting.most is None:
            continue
        options = build_parser(every=True).parse_args([*BASE, setting.flag, str(setting.most)])
        protocol_settings(options)  # the largest is taken
        with pytest.raises(argparse.ArgumentTypeError, match=f"at most {setting.most:,}"):
            setting.parse(str(setting.most + 1))
        with pytest.raises(SettingError, match=f"^{setting.name} must not exceed"):
            Limits(**{setting.name: setting.most + 1})


@pytest.mark.parametrize(
    ("flags", "message"),
    [
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
