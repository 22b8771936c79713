"""Every timing and limit of the protocol core can be set on the sync-coordinator's
command line, and the defaults pass the flag checks (a field added to ``Timing`` without
a flag once made every coordinator fail at start)."""

from __future__ import annotations

import dataclasses

from txsync.cli.main import build_parser
from txsync.protocol import Limits, Timing
from txsync.sync_coordinator.server import _tuning_problem

BASE = ("sync-coordinator", "--node-id", "dc1", "--store", "127.0.0.1:1", "--plaintext")


def test_every_timing_has_a_flag_and_the_defaults_are_accepted() -> None:
    options = build_parser(every=True).parse_args([*BASE])
    for field in dataclasses.fields(Timing):
        assert getattr(options, field.name) == getattr(Timing(), field.name), field.name
    for name in ("incoming_txs_max", "post_txs_max", "catchup_entries_max", "synced_window_max"):
        assert getattr(options, name) == getattr(Limits(), name), name
    assert _tuning_problem(options) is None


def test_a_timing_that_cannot_work_is_named() -> None:
    options = build_parser(every=True).parse_args([*BASE, "--round-timeout-ms", "0"])
    assert _tuning_problem(options) == "--round-timeout-ms must be positive"
