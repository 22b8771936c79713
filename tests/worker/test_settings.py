"""The workers' and the store's limits and worker-dispatch's feed are declared once
(``txsync.settings``): the flags, their checks and the docs tables all come from the
declarations (issue 18)."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from txsync.cli.main import build_parser
from txsync.settings import DISPATCH_SETTINGS, STORE_LIMITS, WORKER_LIMITS, docs_rows

DOCS = Path(__file__).resolve().parents[2] / "docs" / "operations.md"


def test_the_docs_table_is_the_declarations() -> None:
    text = DOCS.read_text()
    for row in docs_rows([*WORKER_LIMITS, *STORE_LIMITS, *DISPATCH_SETTINGS]):
        assert row in text, f"docs/operations.md lacks (or has another text for):\n{row}"


def test_every_limit_is_a_flag_with_its_default_and_bound() -> None:
    base = ["worker", "--worker-id", "w1", "--data", "/tmp/unused"]
    options = build_parser(every=True).parse_args(base)
    for setting in WORKER_LIMITS:
        assert getattr(options, setting.name) == setting.default
        with pytest.raises(argparse.ArgumentTypeError, match=f"at least {setting.least}"):
            setting.parse(str(setting.least - 1))
        with pytest.raises(argparse.ArgumentTypeError, match="not a whole number"):
            setting.parse("1e9")
    parsed = build_parser(every=True).parse_args([*base, "--content-check-every", "0"])
    assert parsed.content_check_every == 0


def test_every_store_limit_is_a_flag_with_its_default() -> None:
    base = ["transaction-store", "--node-id", "dc1", "--data", "/tmp/unused"]
    options = build_parser(every=True).parse_args(base)
    for setting in STORE_LIMITS:
        assert getattr(options, setting.name) == setting.default
    with pytest.raises(SystemExit):  # argparse names the flag and exits 2
        build_parser(every=True).parse_args([*base, "--incoming-max", "0"])


def test_the_dispatch_s_feed_pause_is_a_flag_bounded_by_what_the_store_allows() -> None:
    """The store takes a pause of at most 1,000 ms (``FollowEnqueuedRequest.gather_ms``):
    a longer one would have every feed refused, so the flag names the bound instead."""
    base = ["worker-dispatch", "--store", "127.0.0.1:1"]
    options = build_parser(every=True).parse_args(base)
    for setting in DISPATCH_SETTINGS:
        assert getattr(options, setting.name) == setting.default
    assert build_parser(every=True).parse_args([*base, "--feed-gather-ms", "0"]).feed_gather_ms == 0
    with pytest.raises(SystemExit):  # argparse names the flag and exits 2
        build_parser(every=True).parse_args([*base, "--feed-gather-ms", "1001"])
