"""Shared limits with a share per caller (``txsync.shares``): one caller cannot take the
room the others need."""

from __future__ import annotations

import pytest

from txsync.refusals import Refusal, Refused
from txsync.shares import Shares


def test_one_caller_takes_three_quarters_and_the_others_still_get_in() -> None:
    waits = Shares("waits", 100, retry_after_ms=50)
    waits.take("hog", 75)
    with pytest.raises(Refusal) as refused:
        waits.take("hog")
    assert refused.value.kind is Refused.OVERLOADED
    assert "hog holds 75 waits here, the most one caller may" in refused.value.message
    assert refused.value.retry_after_ms == 50
    waits.take("app", 25)  # the quarter kept for others
    with pytest.raises(Refusal) as full:
        waits.take("third")
    assert "100 waits are in use here (at most 100)" in full.value.message
    waits.give_back("hog", 75)
    waits.take("third", 10)
    assert (waits.used, waits.holding("hog"), waits.holding("app")) == (35, 0, 25)
